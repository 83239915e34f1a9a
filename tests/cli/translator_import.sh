#!/usr/bin/env bash
# `kvlingo translator import --layout plain`: a plain-layout file written (by Python, as other
# tools write it) from a shipped translator's maps imports into a kvlingo translator whose eval
# figures equal the original's; the plain file itself is refused by `translator info` with a hint;
# bad plain files (wrong pair geometry, short layer_map, a format key) are refused naming the fault.
set -uo pipefail
KVL=$1; SRC=$2
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
fail=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }
plain() {   # plain IN OUT [layer_map-override] [extra-meta-key]
  python3 - "$@" <<'PYEOF'
import json, struct, sys
src, dst = sys.argv[1], sys.argv[2]
b = open(src, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); data = b[8 + n:]
meta = h.pop("__metadata__")
# one tap: "[0, 1, 2]"; several (a kvlingo "0+1,1+2"): nested lists "[[0, 1], [1, 2]]"
lm = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] else "[" + ", ".join(
    ("[" + ", ".join(e.split("+")) + "]") if "+" in e else e for e in meta["layer_map"].split(",")) + "]"
out_meta = {"layer_map": lm}
if len(sys.argv) > 4: out_meta[sys.argv[4]] = "x"
keep = {k: v for k, v in h.items() if k.endswith(".k.weight") or k.endswith(".v.weight")}
hdr, blobs, off = {"__metadata__": out_meta}, [], 0
for k in sorted(keep):
    v = keep[k]; s, e = v["data_offsets"]; blob = data[s:e]
    hdr[k] = {"dtype": v["dtype"], "shape": v["shape"], "data_offsets": [off, off + len(blob)]}
    blobs.append(blob); off += len(blob)
hb = json.dumps(hdr).encode(); hb += b" " * ((8 - len(hb) % 8) % 8)
open(dst, "wb").write(struct.pack("<Q", len(hb)) + hb + b"".join(blobs))
PYEOF
}
EV=(--text-file "$SRC/testdata/corpus/valid.txt" --prefix-len 64 --cont-len 16 --samples 6 --json --quiet)
figures() { python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d.pop("translator"); print(json.dumps(d, sort_keys=True))' "$1"; }
for pair in qwen3-a_to_qwen3-b qwen3-a_to_qwen2-c; do
  S=${pair%%_to_*}; D=${pair##*_to_}; F="$SRC/models/translators/$pair.safetensors"
  plain "$F" "$T/$pair.plain.safetensors"
  out=$("$KVL" translator info "$T/$pair.plain.safetensors" 2>&1); rc=$?
  [ $rc -ne 0 ] && grep -q "translator import --layout plain" <<<"$out" && ok "$pair: plain file refused by info, with the hint" || bad "$pair plain info: $out"
  "$KVL" translator import --layout plain --in "$T/$pair.plain.safetensors" --source "$SRC/models/$S" \
      --target "$SRC/models/$D" --out "$T/$pair.kvl.safetensors" 2>"$T/log" && ok "$pair: import" || { cat "$T/log"; bad "$pair import"; continue; }
  a=$("$KVL" translator eval --translator "$F" --source "$SRC/models/$S" --target "$SRC/models/$D" "${EV[@]}")
  b=$("$KVL" translator eval --translator "$T/$pair.kvl.safetensors" --source "$SRC/models/$S" --target "$SRC/models/$D" "${EV[@]}")
  a=$(figures "$a"); b=$(figures "$b")
  [ -n "$a" ] && [ "$a" = "$b" ] && ok "$pair: imported translator gives the same eval figures" || bad "$pair eval differs: $a vs $b"
  "$KVL" translator info "$T/$pair.kvl.safetensors" --json | python3 -c '
import json, sys; d = json.load(sys.stdin)
assert d["source_name"] == sys.argv[1] and d["target_name"] == sys.argv[2] and d["format"] == "kvlingo-translator-1", d' "$S" "$D" \
    && ok "$pair: imported file names both models" || bad "$pair imported metadata"
done
P="$T/qwen3-a_to_qwen3-b.plain.safetensors"
out=$("$KVL" translator import --layout plain --in "$P" --source "$SRC/models/qwen3-b" --target "$SRC/models/qwen3-b" --out "$T/x.safetensors" 2>&1); rc=$?
[ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -q "layers.0.k.weight" <<<"$out" && ok "wrong source refused: the geometry check names the tensor" || bad "wrong source: $out"
out=$("$KVL" translator import --layout plain --in "$P" --source "$SRC/models/qwen3-a" --target "$SRC/models/qwen2-c" --out "$T/x.safetensors" 2>&1); rc=$?
[ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -q "layer_map" <<<"$out" && ok "wrong target refused (depth: layer_map)" || bad "wrong target: $out"
plain "$SRC/models/translators/qwen3-a_to_qwen3-b.safetensors" "$T/short.safetensors" "0,1,2"
out=$("$KVL" translator import --layout plain --in "$T/short.safetensors" --source "$SRC/models/qwen3-a" --target "$SRC/models/qwen3-b" --out "$T/x.safetensors" 2>&1); rc=$?
[ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -q "layer_map" <<<"$out" && ok "short layer_map refused" || bad "short layer_map: $out"
plain "$SRC/models/translators/qwen3-a_to_qwen2-c.safetensors" "$T/uneven.safetensors" "[[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2]]"
out=$("$KVL" translator import --layout plain --in "$T/uneven.safetensors" --source "$SRC/models/qwen3-a" --target "$SRC/models/qwen2-c" --out "$T/x.safetensors" 2>&1); rc=$?
[ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -q "entry 4 has 3 source layers" <<<"$out" && ok "uneven multi-layer map refused" || bad "uneven taps: $out"
plain "$SRC/models/translators/qwen3-a_to_qwen3-b.safetensors" "$T/fmt.safetensors" "" format
out=$("$KVL" translator import --layout plain --in "$T/fmt.safetensors" --source "$SRC/models/qwen3-a" --target "$SRC/models/qwen3-b" --out "$T/x.safetensors" 2>&1); rc=$?
[ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -q "'format'" <<<"$out" && ok "format key refused" || bad "format key: $out"
out=$("$KVL" translator import --layout npz --in "$P" --source "$SRC/models/qwen3-a" --target "$SRC/models/qwen3-b" --out "$T/x.safetensors" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "npz" <<<"$out" && ok "unknown layout refused" || bad "layout: $out"
exit $fail
