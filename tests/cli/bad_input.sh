#!/usr/bin/env bash
# Bad input to the CLI: a clear message naming the file and field, a non-zero exit, no crash.
set -uo pipefail
KVL=$1; SRC=$2
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail=0
expect() {  # expect NAME NEEDLE -- command...
  local name=$1 needle=$2; shift 3
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ $rc -eq 0 ] || [ $rc -ge 128 ]; then echo "FAIL $name: exit $rc"; fail=1; return; fi
  if ! grep -qF -- "$needle" <<<"$out"; then echo "FAIL $name: message lacks '$needle': $out"; fail=1; return; fi
  echo "ok   $name: $out" | head -1
}
mk() { rm -rf "$T/m"; mkdir -p "$T/m"; cp "$SRC/models/qwen3-a/config.json" "$SRC/models/qwen3-a/tokenizer.json" "$T/m/"; }

expect missing-dir "model directory '$T/nope': No such file or directory" -- "$KVL" info --model "$T/nope"
mk; head -c 5 "$SRC/models/qwen3-a/model.safetensors" > "$T/m/model.safetensors"
expect truncated "model.safetensors" -- "$KVL" info --model "$T/m"
mk; printf '\xff\xff\xff\x00\x00\x00\x00\x00{}' > "$T/m/model.safetensors"
expect header-beyond-file "header" -- "$KVL" info --model "$T/m"
mk; python3 - "$SRC/models/qwen3-a/model.safetensors" "$T/m/model.safetensors" <<'PY'
import json, struct, sys
src, dst = sys.argv[1], sys.argv[2]
b = open(src, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
h["model.norm.weight"]["dtype"] = "Q7"
hb = json.dumps(h).encode(); hb += b" " * ((8 - len(hb) % 8) % 8)
open(dst, "wb").write(struct.pack("<Q", len(hb)) + hb + b[8 + n:])
PY
expect unknown-dtype "model.norm.weight" -- "$KVL" info --model "$T/m"
mk; python3 - "$SRC/models/qwen3-a/model.safetensors" "$T/m/model.safetensors" <<'PY'
import json, struct, sys
src, dst = sys.argv[1], sys.argv[2]
b = open(src, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
h["model.norm.weight"]["shape"] = [7]
hb = json.dumps(h).encode(); hb += b" " * ((8 - len(hb) % 8) % 8)
open(dst, "wb").write(struct.pack("<Q", len(hb)) + hb + b[8 + n:])
PY
expect shape-bytes-mismatch "model.norm.weight" -- "$KVL" info --model "$T/m"
mk; head -c 100000 "$SRC/models/qwen3-a/model.safetensors" > "$T/m/model.safetensors"
expect range-outside-file "model.safetensors" -- "$KVL" info --model "$T/m"
mk; sed 's/Qwen3ForCausalLM/MambaForCausalLM/' "$SRC/models/qwen3-a/config.json" > "$T/m/config.json"
cp "$SRC/models/qwen3-a/model.safetensors" "$T/m/"
expect unsupported-arch "architectures" -- "$KVL" info --model "$T/m"
mk; echo '{"architectures": [' > "$T/m/config.json"
expect bad-json "config.json" -- "$KVL" info --model "$T/m"
expect bad-ids "token id list" -- "$KVL" generate --model "$SRC/models/qwen3-a" --prompt-ids 1,x,3
expect id-out-of-range "vocabulary" -- "$KVL" generate --model "$SRC/models/qwen3-a" --prompt-ids 1,99999
expect bad-option "--temperature" -- "$KVL" generate --model "$SRC/models/qwen3-a" --prompt-ids 1 --temperature -3
expect unknown-arg "unexpected argument" -- "$KVL" info --model "$SRC/models/qwen3-a" --bogus
expect missing-text-file "nope.txt" -- "$KVL" eval-ppl --model "$SRC/models/qwen3-a" --text-file "$T/nope.txt"
# devices: a bad name is refused by the parser; CUDA where no GPU is usable (or a build without
# it) is refused by the backend check, before any weight is read
expect device-name "device 'gpu'" -- "$KVL" generate --model "$SRC/models/qwen3-a" --prompt-ids 1,2 --device gpu
expect device-index "device 'cuda:-1'" -- "$KVL" eval-ppl --model "$SRC/models/qwen3-a" --text-file "$SRC/testdata/corpus/valid.txt" --device cuda:-1
if ! "$KVL" generate --model "$SRC/models/qwen3-a" --prompt-ids 1,2 --max-tokens 1 --device cuda >/dev/null 2>&1; then
  expect device-cuda "--device cuda" -- "$KVL" generate --model "$SRC/models/qwen3-a" --prompt-ids 1,2 --device cuda
fi
# windows past the model's context run on positions it never saw: refused, naming the flag
expect eval-window-past-context "option --window: 8000 positions exceed model 'qwen3-a''s context" -- \
  "$KVL" eval-ppl --model "$SRC/models/qwen3-a" --text-file "$SRC/testdata/corpus/train_slice.txt" --window 8000
expect bench-lengths-past-context "options --lengths + --new-tokens: 5009 positions" -- \
  "$KVL" bench switch --source "$SRC/models/qwen3-a" --target "$SRC/models/qwen3-b" --lengths 5000
# training settings and outputs that would fail only after the models loaded and stage 1 ran
TR=(translator train --source "$SRC/models/qwen3-a" --target "$SRC/models/qwen3-b" --corpus "$SRC/testdata/corpus/train_slice.txt")
expect train-out-folder "option --out: $T is a folder" -- "$KVL" "${TR[@]}" --out "$T"
expect train-out-nodir "option --out: cannot write into $T/nodir" -- "$KVL" "${TR[@]}" --out "$T/nodir/x.safetensors"
expect train-prefix-order "--prefix-min 300 is above --prefix-max 200" -- "$KVL" "${TR[@]}" --out "$T/x.safetensors" \
  --prefix-min 300 --prefix-max 200
expect train-per-window "--batch 5 is not a multiple of --per-window 2" -- "$KVL" "${TR[@]}" --out "$T/x.safetensors" \
  --batch 5 --per-window 2
# a corpus line that is not UTF-8 is named by file and line
printf 'good line\nbad \xff line\n' > "$T/bad-utf8.txt"
expect corpus-not-utf8 "$T/bad-utf8.txt:2: kvl_tokenizer_encode: text is not valid UTF-8" -- \
  "$KVL" eval-ppl --model "$SRC/models/qwen3-a" --text-file "$T/bad-utf8.txt" --window 8
# a token id list takes digits and commas only
expect ids-leading-blank "token id list ' 1'" -- "$KVL" detokenize --model "$SRC/models/qwen3-a" --ids " 1"
expect ids-trailing-comma "token id list '1,2,'" -- "$KVL" detokenize --model "$SRC/models/qwen3-a" --ids "1,2,"
expect store-file-missing "option --store-file: $T/nope.safetensors" -- "$KVL" translator eval --translator "$T/x" \
  --source "$SRC/models/qwen3-a" --target "$SRC/models/qwen3-b" --text-file "$SRC/testdata/corpus/train_slice.txt" \
  --store k --store-file "$T/nope.safetensors"
exit $fail
