#!/usr/bin/env bash
# `kvlingo translator plot` renders a training CSV (two runs laid end to end) as a PNG with
# gnuplot; a file that is not a loss curve is refused naming file:line.  Skips (77) without
# gnuplot (Debian package gnuplot-nox, installed by scripts/setup.sh).
set -uo pipefail
KVL=$1; SRC=$2
command -v gnuplot >/dev/null || { echo "SKIP: gnuplot not installed (apt-get install gnuplot-nox)"; exit 77; }
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }
python3 - "$T" <<'PYEOF'
import math, sys
for run, (n, lr0) in enumerate(((80, 1e-3), (60, 5e-4))):
    with open("%s/r%d.csv" % (sys.argv[1], run + 1), "w") as f:
        f.write("step,loss,kl_ema,lr,tokens_per_s\n")
        ema = None
        for s in range(1, n + 1):
            loss = 0.05 * math.exp(-s / 40.0) + 0.02 + 0.003 * math.sin(s)
            ema = loss if ema is None else 0.9 * ema + 0.1 * loss
            lr = lr0 * min(1, s / 4) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / n)))
            f.write("%d,%.6f,%.6f,%.6g,%.1f\n" % (s, loss, ema, lr, 2000 + 10 * s))
PYEOF
"$KVL" translator plot --csv "$T/r1.csv,$T/r2.csv" --out "$T/curve.png" --title "a 'quoted' title" 2>"$T/log" \
  && [ "$(head -c 8 "$T/curve.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] \
  && [ "$(stat -c %s "$T/curve.png")" -gt 10000 ] && grep -q "140 steps of 2 run" "$T/log" \
  && ok "plot: a PNG of two runs" || { cat "$T/log"; bad "plot"; }
python3 - "$T/curve.png" <<'PYEOF' && ok "plot: 1100x800" || bad "png size"
import struct, sys
b = open(sys.argv[1], "rb").read(24)
assert struct.unpack(">II", b[16:24]) == (1100, 800), struct.unpack(">II", b[16:24])
PYEOF
printf 'a,b\n1,2\n' > "$T/bad.csv"
out=$("$KVL" translator plot --csv "$T/bad.csv" --out "$T/x.png" 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "bad.csv:1: not a loss curve" <<<"$out" && ok "bad csv refused" || bad "bad csv: $out"
[ ! -e "$T/x.png" ] && ! ls "$T"/x.png.part-* >/dev/null 2>&1 && ok "a refused plot leaves no file" || bad "leftovers: $(ls "$T")"
# a newline in a string gnuplot reads would end its command and run the rest: refused
out=$("$KVL" translator plot --csv "$T/r1.csv" --out "$T/y.png" --title $'T\nsystem "touch '"$T"'/PWNED"' 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "option --title: control characters" <<<"$out" && [ ! -e "$T/PWNED" ] \
  && ok "a --title with a newline is refused, nothing runs" || bad "title injection: $rc $out"
out=$("$KVL" translator plot --csv "$T/r1.csv" --out "$T/nodir/z.png" 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "option --out: cannot write beside $T/nodir/z.png" <<<"$out" \
  && ok "--out in a folder that does not exist is named" || bad "nodir: $rc $out"
exit $fail
