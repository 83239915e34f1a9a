#!/usr/bin/env bash
# bench/bench_router_overhead.sh BUILD_DIR [SESSIONS_PER_REPLICA TURNS]
# The router's own work per turn (ledger + policy + lease, no nodes) on SQLite and on
# PostgreSQL (a server started here with tests/router/pgtest.py, on loopback, as an unprivileged
# user), with 1 and 3 replicas; one table.  Without the PostgreSQL server binaries only the
# SQLite rows are printed, and the script says so.
set -uo pipefail
build=${1:?usage: bench_router_overhead.sh BUILD_DIR [SESSIONS TURNS]}
sessions=${2:-16}
turns=${3:-30}
src=$(cd "$(dirname "$0")/.." && pwd)
bin="$build/bench_router_overhead"
[ -x "$bin" ] || { echo "no $bin (the router is not built)"; exit 77; }
tmp=$(mktemp -d)
state="$tmp/pg"
cleanup() { /usr/bin/python3 "$src/tests/router/pgtest.py" stop "$state" >/dev/null 2>&1; rm -rf "$tmp"; }
trap cleanup EXIT
header=""
for r in 1 3; do
  "$bin" --ledger "sqlite:$tmp/bench.db" --replicas "$r" --sessions "$sessions" --turns "$turns" $header || exit 1
  header="--no-header"
done
/usr/bin/python3 "$src/tests/router/pgtest.py" start "$state" >/dev/null
if [ -f "$state/skip" ]; then
  echo "(PostgreSQL rows skipped: $(cat "$state/skip"))"
  exit 0
fi
uri=$(cat "$state/conninfo")
for r in 1 3; do
  "$bin" --ledger "$uri" --replicas "$r" --sessions "$sessions" --turns "$turns" --no-header || exit 1
done
