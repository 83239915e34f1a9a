#!/usr/bin/env bash
# scripts/setup.sh: install the Debian 12 packages kvlingo needs, then configure and build.
# Idempotent: packages already present are not reinstalled and apt stays quiet.
#   scripts/setup.sh [BUILD_DIR [extra cmake args...]]
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake pkg-config clang libclang-rt-14-dev
  libopenblas-dev liblapacke-dev
  libcjson-dev libpcre2-dev libutf8proc-dev libxxhash-dev
  libcmocka-dev
  libgrpc-dev libprotobuf-c-dev protobuf-c-compiler libuv1-dev libucx-dev ucx-utils
  libmicrohttpd-dev libyaml-dev libsqlite3-dev libpq-dev postgresql libssl-dev openssl
  python3 python3-venv python3-grpcio python3-grpc-tools python3-protobuf python3-yaml
  gnuplot-nox
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup: the ${#PACKAGES[@]} Debian packages are installed"
fi

BUILD_DIR=${1:-build}
shift || true
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
echo "setup: building in $BUILD_DIR (a minute or more the first time; make prints a line per file)"
cmake --build "$BUILD_DIR" -j"$(nproc)"
