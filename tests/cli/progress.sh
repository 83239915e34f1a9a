#!/usr/bin/env bash
# Progress lines on stderr for the long commands (translator train / eval, eval-ppl), none with
# --quiet, stdout unchanged; translator train writes its loss curve as CSV (step, loss, kl_ema,
# lr, tokens_per_s) following the warm-up + cosine schedule; a resumed run appends to it.
set -uo pipefail
KVL=$1; SRC=$2
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
fail=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }
A="$SRC/models/qwen3-b"; B="$SRC/models/qwen3-a"; SLICE="$SRC/testdata/corpus/train_slice.txt"
VALID="$SRC/testdata/corpus/valid.txt"
"$KVL" translator train --source "$A" --target "$B" --corpus "$SLICE" --out "$T/s1.safetensors" \
    --stage1-only --ridge-tokens 4096 2>"$T/log" || { cat "$T/log"; bad stage1; exit 1; }
TR=(translator train --source "$A" --target "$B" --corpus "$SLICE" --init "$T/s1.safetensors"
    --steps 6 --batch 2 --prefix-min 16 --prefix-max 32 --cont-len 8 --warmup 2 --lr 1e-3)
"$KVL" "${TR[@]}" --out "$T/s2.safetensors" --checkpoint "$T/ck.safetensors" --checkpoint-every 3 2>"$T/log" \
  && grep -q "stage 2: step 6/6" "$T/log" && ok "train: progress lines" || { cat "$T/log"; bad "train progress"; }
python3 - "$T/s2.csv" <<'PYEOF' && ok "train: loss curve CSV next to the output" || bad "train csv: $(cat "$T/s2.csv")"
import csv, math, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert [int(r["step"]) for r in rows] == [1, 2, 3, 4, 5, 6], rows
lr = [float(r["lr"]) for r in rows]
# warm-up 2 steps to 1e-3, then cosine from 1e-3 towards 1e-4 over the remaining 4
want = [5e-4, 1e-3] + [1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * k / 4))) for k in range(0, 4)]
assert all(abs(a - b) < 1e-9 for a, b in zip(lr, want)), (lr, want)
for r in rows:
    assert float(r["loss"]) >= 0 and float(r["kl_ema"]) >= 0 and float(r["tokens_per_s"]) > 0, r
PYEOF
"$KVL" "${TR[@]}" --out "$T/q.safetensors" --loss-csv "$T/q.csv" --quiet 2>"$T/log"
! grep -q "step " "$T/log" && [ "$(wc -l < "$T/q.csv")" = 7 ] && ok "train --quiet: no step lines, --loss-csv honoured" || { cat "$T/log"; bad "train quiet"; }
# a run interrupted after its last checkpoint (step 6) had written steps 7 and 8 to the curve:
# resumed, it runs them again, and each step is in the curve once
cp "$T/s2.csv" "$T/r.csv"
printf '7,0.5,0.5,0.0001,100.0\n8,0.5,0.5,0.0001,100.0\n' >> "$T/r.csv"
"$KVL" "${TR[@]/#6/8}" --out "$T/r.safetensors" --loss-csv "$T/r.csv" --resume "$T/ck.safetensors" \
    --quiet 2>"$T/log" || { cat "$T/log"; bad "resume"; }
python3 - "$T/r.csv" "$T/s2.csv" <<'PYEOF' && ok "train --resume: the steps past the checkpoint are in the curve once" || bad "resume csv: $(cat "$T/r.csv")"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert [int(r["step"]) for r in rows] == [1, 2, 3, 4, 5, 6, 7, 8], rows
assert open(sys.argv[1]).read().startswith(open(sys.argv[2]).read()), "steps 1-6 kept as they were"
assert all(float(r["loss"]) != 0.5 for r in rows[6:]), rows[6:]
PYEOF
EV=(translator eval --translator "$T/s2.safetensors" --source "$A" --target "$B" --text-file "$VALID"
    --prefix-len 32 --cont-len 8 --samples 5 --turns 2 --turn-len 8 --sessions 2 --json)
out=$("$KVL" "${EV[@]}" 2>"$T/log")
grep -q "translator eval: samples 5/5 (100%)" "$T/log" && grep -q "translator eval: sessions 2/2 (100%)" "$T/log" \
  && python3 -c 'import json,sys; json.loads(sys.argv[1])' "$out" && ok "eval: progress on stderr, JSON on stdout" || { cat "$T/log"; bad "eval progress"; }
out=$("$KVL" "${EV[@]}" --quiet 2>"$T/log")
[ ! -s "$T/log" ] && python3 -c 'import json,sys; json.loads(sys.argv[1])' "$out" && ok "eval --quiet" || { cat "$T/log"; bad "eval quiet"; }
out=$("$KVL" eval-ppl --model "$B" --text-file "$VALID" --window 32 --max-windows 6 --json 2>"$T/log")
grep -q "eval-ppl: windows 6/6 (100%)" "$T/log" && ok "eval-ppl: progress" || { cat "$T/log"; bad "eval-ppl progress"; }
"$KVL" eval-ppl --model "$B" --text-file "$VALID" --window 32 --max-windows 6 --json --quiet 2>"$T/log" >/dev/null
[ ! -s "$T/log" ] && ok "eval-ppl --quiet" || { cat "$T/log"; bad "eval-ppl quiet"; }
exit $fail
