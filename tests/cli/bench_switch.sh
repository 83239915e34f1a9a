#!/usr/bin/env bash
# `kvlingo bench switch` on the CPU (shipped models and the tiny SHAPE): a table row per length,
# JSON lines with --json; --device cuda without a usable GPU (or without a CUDA build) fails with
# a clear message, and on a GPU machine runs a tiny CUDA bench.
set -uo pipefail
KVL=$1; SRC=$2
fail=0
out=$("$KVL" bench switch --device cpu --source "$SRC/models/qwen3-a" --target "$SRC/models/qwen2-c" \
      --lengths 8,24 --reps 1 2>&1); rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "FAIL cpu bench: exit $rc"; fail=1; }
[ "$(grep -cE '^ +(8|24) ' <<<"$out")" = 2 ] || { echo "FAIL cpu bench: expected rows for 8 and 24 tokens"; fail=1; }
out=$("$KVL" bench switch --source tiny --target tiny --lengths 16 --reps 1 --json 2>&1); rc=$?
echo "$out"
[ $rc -eq 0 ] && grep -q '"switch_ttft_ms"' <<<"$out" || { echo "FAIL tiny json bench"; fail=1; }
out=$("$KVL" bench switch --source nosuchshape --target tiny 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "unknown model shape" <<<"$out" || { echo "FAIL unknown shape: $out"; fail=1; }
out=$("$KVL" bench switch --device cuda --source tiny --target tiny --lengths 16 --reps 1 2>&1); rc=$?
echo "$out"
if [ $rc -ne 0 ]; then
    grep -qE "device error|unsupported" <<<"$out" || { echo "FAIL cuda without GPU: unclear message"; fail=1; }
fi
exit $fail
