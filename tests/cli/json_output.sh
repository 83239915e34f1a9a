#!/usr/bin/env bash
# Every --json output of kvlingo parses as JSON and carries hostile names verbatim: a model
# folder named q"x\ (quote, backslash, newline-free control byte in the prompt), a text file
# whose name has a quote, text with invalid UTF-8.
set -uo pipefail
KVL=$1; SRC=$2
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
PY=python3
fail=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }
M="$T/q\"x\\"$'\t'"y"
mkdir -p "$M"
cp "$SRC"/models/qwen3-a/config.json "$SRC"/models/qwen3-a/tokenizer.json "$SRC"/models/qwen3-a/*.safetensors "$M/"
[ -f "$SRC/models/qwen3-a/tokenizer_config.json" ] && cp "$SRC/models/qwen3-a/tokenizer_config.json" "$M/"
check() {   # check NAME PYTHON-ASSERTION -- command...
  local name=$1 expr=$2; shift 3
  local out; out=$("$@" 2>"$T/err"); local rc=$?
  if [ $rc -ne 0 ]; then bad "$name: exit $rc: $(cat "$T/err")"; return; fi
  OUT="$out" M="$M" $PY -c "import json, os; d = json.loads(os.environ['OUT']); M = os.environ['M']; assert $expr, d" \
    && ok "$name" || bad "$name: $out"
}
check "info --json, hostile folder name" 'd["name"] == os.path.basename(M) and d["dir"].endswith(os.path.basename(M)) and d["layers"] == 4' \
  -- "$KVL" info --model "$M" --json
check "tokenize --json" 'isinstance(d["ids"], list) and len(d["ids"]) > 0' \
  -- "$KVL" tokenize --model "$M" --text $'a "quoted"\\ \x01 text' --json
check "detokenize --json, a lone byte token (invalid UTF-8 alone)" 'isinstance(d["text"], str)' \
  -- "$KVL" detokenize --model "$M" --ids 160,39 --json
check "generate --json" 'len(d["ids"]) == 4 and isinstance(d["text"], str)' \
  -- "$KVL" generate --model "$M" --prompt $'say "hi"\\\n' --max-tokens 4 --json
head -c 20000 "$SRC/testdata/corpus/valid.txt" > "$T/v\"al.txt"
check "eval-ppl --json, hostile text-file name" 'd["text_file"].endswith("v\"al.txt") and d["ppl"] > 1' \
  -- "$KVL" eval-ppl --model "$M" --text-file "$T/v\"al.txt" --window 32 --max-windows 4 --json
cp "$SRC/models/translators/qwen3-a_to_qwen3-b.safetensors" "$T/t\"r.safetensors"
check "translator eval --json, hostile names" 'd["translator"].endswith("t\"r.safetensors") and d["text_file"].endswith("v\"al.txt") and d["samples"] == 2 and d["kl"] >= 0' \
  -- "$KVL" translator eval --translator "$T/t\"r.safetensors" --source "$SRC/models/qwen3-a" --target "$SRC/models/qwen3-b" \
     --text-file "$T/v\"al.txt" --prefix-len 32 --cont-len 8 --samples 2 --json --quiet
for f in "$SRC"/models/translators/*.safetensors; do
  cp "$f" "$T/t\"r.safetensors"
  check "translator info --json $(basename "$f")" 'd["file"].endswith("t\"r.safetensors") and isinstance(d["eval"], dict) and "continued_from" in d["training"]' \
    -- "$KVL" translator info "$T/t\"r.safetensors" --json
done
exit $fail
