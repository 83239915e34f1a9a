#!/usr/bin/env bash
# tests/deploy/test_dashboard_metrics.sh SOURCE_DIR KVLD KVLINGO_ROUTER KVLINGO WORK_DIR
#
# Starts kvld (qwen3-a, qwen3-b) and kvlingo-router on loopback with the shipped fleet.yaml,
# drives a session with a translated switch, a fallback and an error, and checks that every
# metric the dashboard and the alert rules use is exported (tests/deploy/dashboard_metrics.py).
# Exit 77 (skipped) when the binaries were not built (the server components need gRPC, UCX,
# SQLite, ...: scripts/setup.sh installs them) or Debian's python3-grpcio / python3-grpc-tools /
# python3-yaml are missing.
set -uo pipefail
src=${1:?usage: test_dashboard_metrics.sh SOURCE_DIR KVLD KVLINGO_ROUTER KVLINGO WORK_DIR}
kvld=${2:-}; router=${3:-}; cli=${4:-}; work=${5:-$(mktemp -d)}
here="$src/tests/deploy"
. "$here/common.sh"
for b in "$kvld" "$router" "$cli"; do
  [ -n "$b" ] && [ -x "$b" ] || skip "kvld / kvlingo-router / kvlingo not built (server components need the packages scripts/setup.sh installs)"
done
# Debian's python3 carries grpcio and grpc_tools (python3-grpcio, python3-grpc-tools)
py=""
for cand in /usr/bin/python3 "${KVL_PYTHON:-}" "$(command -v python3)"; do
  [ -n "$cand" ] && [ -x "$cand" ] && "$cand" -c 'import grpc, grpc_tools, yaml' 2>/dev/null && { py=$cand; break; }
done
[ -n "$py" ] || skip "no Python with grpcio, grpc_tools and yaml (Debian: python3-grpcio python3-grpc-tools python3-yaml)"
KVL_PROMTOOL=$(find_promtool) KVL_PROMETHEUS=$(find_prometheus) exec "$py" "$here/dashboard_metrics.py" --source "$src" --kvld "$kvld" --router "$router" \
  --kvlingo "$cli" --work "$work"
