# shellcheck shell=bash
# tests/deploy/common.sh: helpers sourced by the deploy tests, after they set src (the source
# directory).
: "${src:?tests/deploy/common.sh: set src before sourcing}"

# Print a SKIPPED line and exit 77 (the tests' SKIP_RETURN_CODE).
skip() {
  echo "SKIPPED: $*"
  exit 77
}

# find_python MODULE...: print a Python interpreter that imports every MODULE: $KVL_PYTHON
# (scripts/test.sh points it at build/venv), then $src/build/venv, then Debian's python3, then
# the python3 on PATH.  Returns 1 when none does.
find_python() {
  local imports cand
  imports=$(printf 'import %s;' "$@")
  for cand in "${KVL_PYTHON:-}" "$src/build/venv/bin/python" /usr/bin/python3 "$(command -v python3)"; do
    [ -n "$cand" ] && [ -x "$cand" ] || continue
    if "$cand" -c "$imports" >/dev/null 2>&1; then
      echo "$cand"
      return 0
    fi
  done
  return 1
}

# Debian packages' programs that scripts/test.sh unpacks (apt-get download + dpkg -x) instead of
# installing: kubernetes-client (kubectl 1.20, whose /usr/bin/kubectl would clash with another
# kubectl package) and prometheus (promtool, without the server and its service).
deploy_tools() {
  echo "${KVL_DEPLOY_TOOLS:-$src/build/deploy-tools}"
}

# kubectl programs to render with, one per line: the one on PATH, then Debian 12's unpacked one.
find_kubectls() {
  local seen="" k r
  for k in "$(command -v kubectl 2>/dev/null)" "$(deploy_tools)/usr/bin/kubectl"; do
    [ -n "$k" ] && [ -x "$k" ] || continue
    r=$(readlink -f "$k")
    case " $seen " in *" $r "*) continue ;; esac
    seen="$seen $r"
    echo "$k"
  done
}

# promtool: on PATH, else the unpacked one; empty when neither.
find_promtool() {
  local p
  for p in "$(command -v promtool 2>/dev/null)" "$(deploy_tools)/usr/bin/promtool"; do
    [ -n "$p" ] && [ -x "$p" ] && { echo "$p"; return 0; }
  done
  return 0
}

# prometheus (the server, for the live dashboard test): on PATH, else the unpacked one.
find_prometheus() {
  local p
  for p in "$(command -v prometheus 2>/dev/null)" "$(deploy_tools)/usr/bin/prometheus"; do
    [ -n "$p" ] && [ -x "$p" ] && { echo "$p"; return 0; }
  done
  return 0
}
