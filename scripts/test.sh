#!/usr/bin/env bash
# scripts/test.sh: set up, build and run the whole test suite (what CI runs).
#  1. sanitizer build (clang, ASan + UBSan) with the libFuzzer targets: unit, golden, CLI and
#     integration tests except those labelled heavy, plus every fuzz target for a bounded time;
#  2. the normal optimised build: every test, heavy ones included.
# The last line printed is CTest's summary of the normal build.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=$(nproc)

scripts/setup.sh build

# Hugging Face `tokenizers` for the differential tokenizer test (skipped with a message when
# PyPI cannot be reached).
if [ ! -x build/venv/bin/python ]; then
  python3 -m venv build/venv >/dev/null 2>&1 || true
fi
if [ -x build/venv/bin/python ] && ! build/venv/bin/python -c 'import tokenizers' 2>/dev/null; then
  build/venv/bin/python -m pip install -q --disable-pip-version-check 'tokenizers==0.23.3' \
    || echo "test: could not install tokenizers from PyPI; the differential test will be skipped"
fi
export KVL_PYTHON="$PWD/build/venv/bin/python"

echo "== sanitizer build (ASan + UBSan, clang, fuzz targets) =="
CC=clang cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKVL_SANITIZE=ON -DKVL_FUZZ=ON \
  -DKVL_BENCH=OFF >/dev/null
cmake --build build-asan -j"$JOBS"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
(cd build-asan && ctest -j"$JOBS" -LE heavy --output-on-failure --timeout 900)

echo "== normal build =="
unset ASAN_OPTIONS UBSAN_OPTIONS
(cd build && ctest -j"$JOBS" --output-on-failure --timeout 900)
