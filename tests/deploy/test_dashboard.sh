#!/usr/bin/env bash
# tests/deploy/test_dashboard.sh SOURCE_DIR
#
# Static checks of the Grafana dashboard and the Prometheus rules (tests/deploy/check_dashboard.py):
# structure, the panels the fleet needs, metric names present in the exporters' source, and --
# with promtool (Debian package prometheus; scripts/test.sh unpacks it into build/deploy-tools)
# -- PromQL syntax of every query, `promtool check rules` and the alert unit tests in
# tests/deploy/rules_test.yml.
set -uo pipefail
src=${1:?usage: test_dashboard.sh SOURCE_DIR}
here="$src/tests/deploy"
. "$here/common.sh"
py=$(find_python json) || skip "no Python 3"
"$py" "$here/check_dashboard.py" "$src" "$(find_promtool)"
