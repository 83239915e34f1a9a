#!/usr/bin/env bash
# bench/bench_llamacpp.sh: decode tokens/s of kvlingo (bf16 and float32 weights) beside llama.cpp's
# CPU backend (f16 weights) on the same random-weight model, same threads, rounds interleaved.
#
#   bench/bench_llamacpp.sh --llama-bin DIR [--build build] [--shape qwen2.5-1.5b] [--rounds 3]
#                           [--threads 2] [--work DIR]
#
# --llama-bin: the bin/ folder of a llama.cpp build (its llama-bench), built from llama.cpp's own
# source for the CPU backend. The model is `kvlingo model random --shape SHAPE --dtype bf16`;
# bench/gguf_from_random.py writes the same weights as an f16 GGUF (Python packages numpy and
# gguf). Each round runs llama-bench (`-p 0 -n 16 -r 3`: 16 decode steps from an empty cache,
# mean of 3) and `bench_runtime --model DIR --decode-only --repeats 3` (16 decode steps after a
# 64-token prompt, median of 3), in alternating order; the table gives every round and the
# medians. Ours decodes over a 64-token context, llama.cpp's over 0-16 tokens: at these sizes
# the weights, not the context, set the time of a step.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
LLAMA_BIN="" BUILD="$HERE/../build" SHAPE=qwen2.5-1.5b ROUNDS=3 THREADS=2 WORK=""
while [ $# -gt 0 ]; do
    case "$1" in
        --llama-bin) LLAMA_BIN=$2; shift 2 ;;
        --build) BUILD=$2; shift 2 ;;
        --shape) SHAPE=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --threads) THREADS=$2; shift 2 ;;
        --work) WORK=$2; shift 2 ;;
        *) echo "bench_llamacpp.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
[ -x "$LLAMA_BIN/llama-bench" ] || { echo "bench_llamacpp.sh: --llama-bin: no llama-bench in '$LLAMA_BIN'" >&2; exit 2; }
[ -x "$BUILD/bench_runtime" ] || { echo "bench_llamacpp.sh: --build: no bench_runtime in '$BUILD'" >&2; exit 2; }
case "$ROUNDS" in ''|*[!0-9]*) echo "bench_llamacpp.sh: --rounds: '$ROUNDS' is not a count" >&2; exit 2 ;; esac
if [ -z "$WORK" ]; then WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT; fi
mkdir -p "$WORK" || { echo "bench_llamacpp.sh: --work: cannot create '$WORK'" >&2; exit 2; }
MODEL="$WORK/$SHAPE" GGUF="$WORK/$SHAPE-f16.gguf"
[ -f "$MODEL/model.safetensors" ] || "$BUILD/kvlingo" model random --shape "$SHAPE" --dtype bf16 --out "$MODEL"
[ -f "$GGUF" ] || python3 "$HERE/gguf_from_random.py" "$MODEL" "$GGUF" --dtype f16

ours() {   # prints "f32 bf16" decode tokens/s
    OPENBLAS_NUM_THREADS=$THREADS "$BUILD/bench_runtime" --model "$MODEL" --decode-only --repeats 3 \
        --threads "$THREADS" | awk -F'|' '/decode ctx/ { gsub(/ /, "", $4); gsub(/ /, "", $5); print $4, $5 }'
}
theirs() { # prints llama.cpp's decode tokens/s
    "$LLAMA_BIN/llama-bench" -m "$GGUF" -p 0 -n 16 -r 3 -t "$THREADS" -o csv 2>/dev/null |
        python3 -c 'import csv, sys; print(next(csv.DictReader(sys.stdin))["avg_ts"])'
}

echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $SHAPE, $THREADS threads"
echo
echo "| round | llama.cpp f16 tok/s | kvlingo bf16 tok/s | kvlingo f32 tok/s | bf16 / llama.cpp |"
echo "|---|---:|---:|---:|---:|"
L=() B=() F=()
for r in $(seq 1 "$ROUNDS"); do
    if [ $((r % 2)) -eq 1 ]; then t=$(theirs); read -r f b <<<"$(ours)"
    else read -r f b <<<"$(ours)"; t=$(theirs); fi
    L+=("$t") B+=("$b") F+=("$f")
    printf '| %d | %.2f | %s | %s | %.2fx |\n' "$r" "$t" "$b" "$f" "$(python3 -c "print($b / $t)")"
done
python3 - "${L[*]}" "${B[*]}" "${F[*]}" <<'EOF'
import statistics, sys
l, b, f = ([float(x) for x in s.split()] for s in sys.argv[1:4])
ml, mb, mf = statistics.median(l), statistics.median(b), statistics.median(f)
print(f"| median | {ml:.2f} | {mb:.1f} | {mf:.1f} | {mb / ml:.2f}x |")
print(f"\nper decode step: llama.cpp f16 {1000 / ml:.0f} ms, kvlingo bf16 {1000 / mb:.0f} ms, f32 {1000 / mf:.0f} ms")
EOF
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
