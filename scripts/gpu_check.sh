#!/usr/bin/env bash
# scripts/gpu_check.sh: the GPU check in one run, on a machine with an NVIDIA GPU, the
# CUDA toolkit and CMake, and no package registry (the device tool's H200).  Under 10 minutes.
#
#   here, once:   scripts/gpu_pack_deps.sh          (writes .gpu-deps/sysroot.tar.gz, ~0.6 MB)
#   device tool:  run(command="bash scripts/gpu_check.sh", carry=[".gpu-deps"], timeout_s=590)
#
# Steps: unpack the carried libraries (cJSON, PCRE2, utf8proc, xxhash, cmocka, pkgconf) into
# /tmp/kvdeps; build scripts/gpu_shim (naive CBLAS/LAPACKE subset, stands in for OpenBLAS,
# which is too large to carry) and describe it as openblas.pc / lapacke.pc; configure with
# KVL_CUDA=ON, KVL_SERVER=OFF (no gRPC/UCX/libuv/SQLite); build the CLI and the CUDA tests;
# run test_cuda_api, test_cuda_parity (CUDA vs CPU on the shipped models), the backend
# conformance suite on both backends, the CLI with --device cpu|cuda (greedy tokens, eval-ppl,
# translated KL of every shipped translator), two kvld --device cuda + the router (where the
# server components are built), the switch bench for qwen2.5-0.5b -> qwen2.5-1.5b and back at
# 64/1024/8192/32752 tokens (with the turn's 9 new ones, within Qwen2.5's 32,768 positions); then, time permitting, compute-sanitizer memcheck on the parity
# test.  Logs go to $OUT (or build-gpu/out).
# Where the system already has the libraries (a full Debian dev machine with a GPU), set
# KVL_GPU_SYSTEM_DEPS=1 to use them (and OpenBLAS) instead.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
OUT=${OUT:-$root/build-gpu/out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
step() { echo; echo "== [$(el)s] $*"; }
BUDGET=${KVL_GPU_BUDGET_S:-540}   # stop optional steps past this many seconds

# nvcc may sit outside PATH on a bare toolkit image
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 || echo "nvidia-smi failed"
command -v nvcc && nvcc --version | tail -2
cmake --version | head -1; gcc --version | head -1; nproc

server=OFF; [ "${KVL_GPU_SYSTEM_DEPS:-0}" = 1 ] && server=ON
cmake_args=(-DCMAKE_BUILD_TYPE=Release -DKVL_CUDA=ON -DKVL_SERVER=$server -DKVL_BENCH=OFF
            -DCMAKE_CUDA_ARCHITECTURES=${KVL_CUDA_ARCH:-90})
command -v nvcc >/dev/null && cmake_args+=(-DCMAKE_CUDA_COMPILER="$(command -v nvcc)")
if [ "${KVL_GPU_SYSTEM_DEPS:-0}" != 1 ]; then
    step "dependencies: carried sysroot + BLAS/LAPACKE shim"
    DEPS=/tmp/kvdeps
    rm -rf "$DEPS"; mkdir -p "$DEPS"
    if [ -f .gpu-deps/sysroot.tar.gz ]; then
        tar -C "$DEPS" -xzf .gpu-deps/sysroot.tar.gz || { echo "cannot unpack .gpu-deps/sysroot.tar.gz"; exit 1; }
    else
        echo "WARNING: .gpu-deps/sysroot.tar.gz not carried (run scripts/gpu_pack_deps.sh here and carry .gpu-deps)"
    fi
    shim="$DEPS/usr/lib/kvlshim"
    mkdir -p "$shim/pkgconfig" "$DEPS/usr/include/kvlshim"
    cp scripts/gpu_shim/cblas.h scripts/gpu_shim/lapacke.h "$DEPS/usr/include/kvlshim/"
    gcc -O2 -fPIC -std=gnu11 -c scripts/gpu_shim/minblas.c -Iscripts/gpu_shim -o "$shim/minblas.o" &&
        ar rcs "$shim/libkvlminblas.a" "$shim/minblas.o" || { echo "shim build failed"; exit 1; }
    for name in openblas lapacke; do
        # paths are sysroot-relative: pkgconf prefixes them with PKG_CONFIG_SYSROOT_DIR
        printf '%s\n' "libdir=/usr/lib/kvlshim" "includedir=/usr/include/kvlshim" "" "Name: $name" \
            "Description: kvlingo GPU-machine shim (scripts/gpu_shim): naive CBLAS/LAPACKE subset" \
            "Version: 0.0.0" 'Libs: -L${libdir} -lkvlminblas -lm' 'Cflags: -I${includedir}' > "$shim/pkgconfig/$name.pc"
    done
    export PKG_CONFIG_LIBDIR="$shim/pkgconfig:$DEPS/usr/lib/x86_64-linux-gnu/pkgconfig:$DEPS/usr/share/pkgconfig"
    export PKG_CONFIG_SYSROOT_DIR="$DEPS"
    export PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 PKG_CONFIG_ALLOW_SYSTEM_LIBS=1
    export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    pkgconf="$DEPS/usr/bin/pkgconf"
    if ! "$pkgconf" --version >/dev/null 2>&1; then pkgconf=$(command -v pkg-config || command -v pkgconf || echo pkg-config); fi
    echo "pkg-config: $pkgconf ($("$pkgconf" --version 2>&1))"
    "$pkgconf" --cflags --libs openblas lapacke libcjson libpcre2-8 libutf8proc libxxhash cmocka || echo "pkg-config lookup failed"
    cmake_args+=(-DPKG_CONFIG_EXECUTABLE="$pkgconf")
fi

step "configure"
cmake -S . -B build-gpu "${cmake_args[@]}" > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
grep -E "kvlingo:|CUDA" "$OUT/build.log" | head
step "build"
targets=(kvlingo_cli test_cuda_api test_cuda_parity test_backend test_golden)
[ "$server" = ON ] && targets+=(kvld kvlingo_router)
cmake --build build-gpu -j"$(nproc)" --target "${targets[@]}" >> "$OUT/build.log" 2>&1 ||
    { grep -E "error|Error" "$OUT/build.log" | head -40; tail -20 "$OUT/build.log"; exit 1; }
echo "built in $(el)s"
if command -v cuobjdump >/dev/null; then
    echo "tensor-core instructions in libkvlingo.a (HMMA = mma.sync): $(cuobjdump -sass build-gpu/libkvlingo.a 2>/dev/null | grep -c HMMA)"
fi

rc=0
step "test_cuda_api"
timeout 120 ./build-gpu/tests/unit/test_cuda_api || rc=1
step "test_cuda_parity (CUDA vs CPU, shipped models, bf16 and f32; default mma.sync flash kernel)"
timeout 150 ./build-gpu/tests/unit/test_cuda_parity 2>&1 | tee "$OUT/parity.log"
mma_ok=${PIPESTATUS[0]}
[ "$mma_ok" = 0 ] || rc=1
step "test_cuda_parity with KVL_FLASH=wmma (the wmma flash kernel)"
KVL_FLASH=wmma timeout 150 ./build-gpu/tests/unit/test_cuda_parity 2>&1 | sed 's/^/[wmma] /' | tee -a "$OUT/parity.log"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1

step "backend conformance suite (tests/unit/test_backend.c: the same checks on cpu and cuda)"
timeout 180 ./build-gpu/tests/unit/test_backend 2>&1 | tee "$OUT/backend.log"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1

step "the CLI on the CUDA backend: greedy tokens and eval-ppl against the CPU, translated KL"
for m in qwen3-a qwen3-b qwen2-c; do
    [ "$(el)" -gt "$BUDGET" ] && { echo "skipped $m: past the time budget"; continue; }
    for dev in cpu cuda; do
        timeout 60 ./build-gpu/kvlingo generate --model "models/$m" --prompt-ids 725,732,1553,623 \
            --max-tokens 32 --device "$dev" --json > "$OUT/gen_${m}_$dev.json" 2>&1 || rc=1
        timeout 120 ./build-gpu/kvlingo eval-ppl --model "models/$m" --text-file testdata/corpus/valid.txt \
            --max-windows 50 --device "$dev" --json > "$OUT/ppl_${m}_$dev.json" 2>&1 || rc=1
    done
    if cmp -s "$OUT/gen_${m}_cpu.json" "$OUT/gen_${m}_cuda.json"; then echo "$m greedy32: identical"
    else echo "$m greedy32: DIFFERENT"; rc=1; fi
    echo "$m eval-ppl cpu / cuda: $(cat "$OUT/ppl_${m}_cpu.json") / $(cat "$OUT/ppl_${m}_cuda.json")"
done
for f in models/translators/*.safetensors; do
    [ "$(el)" -gt "$BUDGET" ] && { echo "skipped $f: past the time budget"; continue; }
    pair=$(basename "$f" .safetensors); src=${pair%%_to_*}; dst=${pair##*_to_}
    for dev in cpu cuda; do
        timeout 120 ./build-gpu/kvlingo translator eval --translator "$f" --source "models/$src" \
            --target "models/$dst" --text-file testdata/corpus/valid.txt --samples 40 --device "$dev" \
            --json > "$OUT/tr_${pair}_$dev.json" 2>&1 || rc=1
    done
    echo "$pair translated KL cpu / cuda: $(grep -o '"kl[^,]*' "$OUT/tr_${pair}_cpu.json" | head -1) / $(grep -o '"kl[^,]*' "$OUT/tr_${pair}_cuda.json" | head -1)"
done

step "two kvld --device cuda on one GPU + the router (needs the server components)"
if [ -x build-gpu/daemon/kvld ] && [ -x build-gpu/kvlingo-router ] && /usr/bin/python3 -c 'import grpc' 2>/dev/null; then
    timeout 180 /usr/bin/python3 scripts/demo.py --build build-gpu --device cuda 2>&1 | tee "$OUT/demo.log" || rc=1
else
    echo "skipped: this build has no kvld/kvlingo-router (KVL_SERVER=OFF: gRPC, UCX and libuv are not"
    echo "carried to this machine) or no python3-grpcio; run with KVL_GPU_SYSTEM_DEPS=1 on a full machine"
fi

step "switch bench"
# the default (mma) kernel first when it passed parity, else wmma first; the other one after
if [ "$mma_ok" = 0 ]; then
    runs=("mma qwen2.5-0.5b qwen2.5-1.5b" "mma qwen2.5-1.5b qwen2.5-0.5b" "wmma qwen2.5-0.5b qwen2.5-1.5b")
else
    runs=("wmma qwen2.5-0.5b qwen2.5-1.5b" "wmma qwen2.5-1.5b qwen2.5-0.5b" "mma qwen2.5-0.5b qwen2.5-1.5b")
fi
for run in "${runs[@]}"; do
    set -- $run
    if [ "$(el)" -gt "$BUDGET" ]; then echo "skipped $2 -> $3 ($1): past the time budget"; continue; fi
    echo "-- flash kernel: $1" | tee -a "$OUT/bench.txt"
    KVL_FLASH=$1 timeout 150 ./build-gpu/kvlingo bench switch --device cuda --source "$2" --target "$3" \
        --lengths 64,1024,8192,32752 --reps 3 2>&1 | tee -a "$OUT/bench.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
done

step "test_golden (CPU path, shim BLAS: the engine itself on this machine)"
if [ "$(el)" -lt "$BUDGET" ]; then timeout 90 ./build-gpu/tests/unit/test_golden > "$OUT/golden.log" 2>&1 && echo "golden: ok" || { echo "golden: FAILED (see golden.log)"; tail -5 "$OUT/golden.log"; }; fi

step "compute-sanitizer memcheck (parity test)"
if command -v compute-sanitizer >/dev/null && [ "$(el)" -lt $((BUDGET - 60)) ]; then
    left=$(( BUDGET + 40 - $(el) ))
    timeout "$left" compute-sanitizer --tool memcheck --leak-check no ./build-gpu/tests/unit/test_cuda_parity > "$OUT/memcheck.log" 2>&1
    echo "memcheck exit $? ($(grep -c "Invalid\|ERROR SUMMARY" "$OUT/memcheck.log") report lines)"; grep "ERROR SUMMARY" "$OUT/memcheck.log" | tail -2
else
    echo "skipped (no compute-sanitizer or no time left)"
fi
step "done: rc=$rc; logs in $OUT"
exit $rc
