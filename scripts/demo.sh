#!/usr/bin/env bash
# scripts/demo.sh: the main job end to end: build, start kvld for qwen3-a and qwen3-b
# and kvlingo-router (cascade policy) on loopback, run a scripted 6-turn conversation from
# testdata/corpus/valid.txt that switches models, print one line per turn and a comparison with
# re-prefill TTFT, stop everything.  Usage: scripts/demo.sh [BUILD_DIR]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$BUILD" -j"$(nproc)" --target kvld kvlingo_router kvr_make_translator >/dev/null
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
exec /usr/bin/python3 scripts/demo.py --build "$BUILD"
