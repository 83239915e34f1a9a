#!/usr/bin/env bash
# `kvlingo eval-ppl --weights-dtype bf16` (bf16 weights in memory, float32 accumulation) against
# transformers' valid_ppl_seq256 (golden.json): within 0.1% for qwen3-b (bf16 on disk, so the
# weights are exactly the checkpoint's), within 0.5% for the float32 / float16 checkpoints
# rounded to bf16 at load; and qwen3-b in float32 mode stays within 0.1% too.
set -euo pipefail
KVL=$1; SRC=$2
PY=${PYTHON:-python3}
fail=0
for spec in qwen3-b:bf16:1e-3 qwen3-b:f32:1e-3 qwen3-a:bf16:5e-3 qwen2-c:bf16:5e-3; do
  IFS=: read -r m dt tol <<<"$spec"
  out=$("$KVL" eval-ppl --model "$SRC/models/$m" --text-file "$SRC/testdata/corpus/valid.txt" --window 256 \
        --max-windows 200 --weights-dtype "$dt" --json)
  $PY - "$SRC/models/$m/golden.json" "$out" "$m" "$dt" "$tol" <<'PYEOF' || fail=1
import json, sys
ref = json.load(open(sys.argv[1]))
got = json.loads(sys.argv[2])
tol = float(sys.argv[5])
rel = abs(got["ppl"] - ref["valid_ppl_seq256"]) / ref["valid_ppl_seq256"]
print("%s --weights-dtype %s: ppl %.4f reference %.4f rel err %.2e (limit %.0e)" % (sys.argv[3], sys.argv[4], got["ppl"], ref["valid_ppl_seq256"], rel, tol))
assert got["predictions"] == ref["valid_tokens_scored"], "prediction count differs"
assert rel <= tol, "perplexity differs by more than the limit"
PYEOF
done
exit $fail
