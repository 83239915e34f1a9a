#!/usr/bin/env bash
# `kvlingo eval-ppl` matches transformers' valid_ppl_seq256 (golden.json) within 0.1% on every
# shipped model (200 windows of 256 tokens of testdata/corpus/valid.txt).
set -euo pipefail
KVL=$1; SRC=$2
PY=${PYTHON:-python3}
fail=0
for m in qwen3-a qwen3-b qwen2-c llama3-d qwen2-yarn; do
  out=$("$KVL" eval-ppl --model "$SRC/models/$m" --text-file "$SRC/testdata/corpus/valid.txt" --window 256 --max-windows 200 --json)
  $PY - "$SRC/models/$m/golden.json" "$out" "$m" <<'PYEOF' || fail=1
import json, sys
ref = json.load(open(sys.argv[1]))
got = json.loads(sys.argv[2])
rel = abs(got["ppl"] - ref["valid_ppl_seq256"]) / ref["valid_ppl_seq256"]
print("%s: ppl %.4f reference %.4f rel err %.2e predictions %d" % (sys.argv[3], got["ppl"], ref["valid_ppl_seq256"], rel, got["predictions"]))
assert got["predictions"] == ref["valid_tokens_scored"], "prediction count differs"
assert rel <= 1e-3, "perplexity differs by more than 0.1%"
PYEOF
done
exit $fail
