#!/usr/bin/env bash
# `kvlingo generate --json` reproduces Hugging Face's greedy continuations (golden greedy32) on
# every shipped model and prompt (the short prompts 0-2), from ids and from text; `info --json`
# reports the geometry.
set -euo pipefail
KVL=$1; SRC=$2
PY=${PYTHON:-python3}
fail=0
for m in qwen3-a qwen3-b qwen2-c llama3-d qwen2-yarn; do
  g=$SRC/models/$m/golden.safetensors
  for p in 0 1 2; do
    ids=$($PY "$SRC/tests/cli/golden_read.py" "$g" prompt$p.ids)
    want=$($PY "$SRC/tests/cli/golden_read.py" "$g" prompt$p.greedy32)
    got=$("$KVL" generate --model "$SRC/models/$m" --prompt-ids "$ids" --max-tokens 32 --json \
          | $PY -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["ids"])))')
    if [ "$got" != "$want" ]; then echo "FAIL $m prompt$p (ids): got $got want $want"; fail=1; fi
    text=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["prompts"][int(sys.argv[2])]["text"])' \
           "$SRC/models/$m/golden.json" $p)
    got=$("$KVL" generate --model "$SRC/models/$m" --prompt "$text" --max-tokens 32 --json \
          | $PY -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["ids"])))')
    if [ "$got" != "$want" ]; then echo "FAIL $m prompt$p (text): got $got want $want"; fail=1; fi
    # a final EOS is compared without its text: the older golden files decode it, the newer ones
    # (llama3-d, qwen2-yarn) skip special tokens
    want_text=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["prompts"][int(sys.argv[2])]["greedy32_text"].removesuffix("<|endoftext|>"))' \
           "$SRC/models/$m/golden.json" $p)
    got_text=$("$KVL" generate --model "$SRC/models/$m" --prompt "$text" --max-tokens 32 --json \
          | $PY -c 'import json,sys; print(json.load(sys.stdin)["text"].removesuffix("<|endoftext|>"))')
    if [ "$got_text" != "$want_text" ]; then echo "FAIL $m prompt$p text: got '$got_text' want '$want_text'"; fail=1; fi
  done
  "$KVL" info --model "$SRC/models/$m" --json | $PY -c '
import json, sys
info = json.load(sys.stdin); cfg = json.load(open(sys.argv[1]))
assert info["layers"] == cfg["num_hidden_layers"] and info["vocab_size"] == cfg["vocab_size"], info
assert info["kv_bytes_per_token"] > 0 and info["parameters"] > 0' "$SRC/models/$m/config.json" || fail=1
done
[ $fail -eq 0 ] && echo "generate/info golden: all prompts match" 
exit $fail
