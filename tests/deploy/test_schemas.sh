#!/usr/bin/env bash
# tests/deploy/test_schemas.sh SOURCE_DIR
#
# Renders every overlay under deploy/k8s/overlays (kubectl kustomize) and validates each object
# against the Kubernetes schemas (PyPI kubernetes-validate, strict) and the ServiceMonitor
# against the Prometheus Operator's CRD schema (tests/deploy/validate_schemas.py).
# Exit 77 (CTest: skipped) when kubectl or the validator is not installed: scripts/test.sh
# installs the validator into build/venv and says so when PyPI cannot be reached.
set -uo pipefail
src=${1:?usage: test_schemas.sh SOURCE_DIR}
here="$src/tests/deploy"
. "$here/common.sh"

kubectl=$(find_kubectls | head -n1)
[ -n "$kubectl" ] || skip "no kubectl (Debian 12: apt-get install kubernetes-client)"
py=$(find_python yaml kubernetes_validate) \
  || skip "no Python with kubernetes-validate (scripts/test.sh installs it into build/venv from PyPI)"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
files=()
for o in $(find "$src/deploy/k8s/overlays" -mindepth 1 -maxdepth 1 -type d | sort); do
  out="$tmp/$(basename "$o").yaml"
  "$kubectl" kustomize "$o" > "$out" 2> "$tmp/err" || { echo "FAIL: kubectl kustomize $o:"; cat "$tmp/err"; exit 1; }
  files+=("$out")
done
"$py" "$here/validate_schemas.py" "${files[@]}" || exit 1

# The validator must see faults: an unknown field in a container, a string where Kubernetes wants
# an integer, an unknown field in the ServiceMonitor.
# (planted in an overlay that has a ServiceMonitor: the *-monitoring ones)
mon=$(grep -l '^kind: ServiceMonitor' "${files[@]}" | head -n1)
[ -n "$mon" ] || { echo "FAIL: no overlay renders a ServiceMonitor (deploy/k8s/overlays/*-monitoring)"; exit 1; }
"$py" - "$mon" "$tmp/bad.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
for d in docs:
    if d["kind"] == "Deployment":
        c = d["spec"]["template"]["spec"]["containers"][0]
        c["readinesProbe"] = c.pop("readinessProbe")
    if d["kind"] == "StatefulSet":
        d["spec"]["template"]["spec"]["containers"][0]["startupProbe"]["failureThreshold"] = "often"
    if d["kind"] == "ServiceMonitor":
        ep = d["spec"]["endpoints"][0]
        ep["scrapeTimout"] = ep.pop("scrapeTimeout")
yaml.safe_dump_all(docs, open(sys.argv[2], "w"))
PY
out=$("$py" "$here/validate_schemas.py" "$tmp/bad.yaml")
wants=("'readinesProbe' was unexpected" "'often' is not of type")
"$py" -c 'import cloudcoil.models.prometheus_operator' 2>/dev/null && wants+=("unknown fields: spec.endpoints[0].scrapeTimout")
for want in "${wants[@]}"; do
  grep -qF -- "$want" <<< "$out" || { echo "FAIL: validate_schemas.py missed a planted fault ($want)"; exit 1; }
done
echo "ok: validate_schemas.py finds planted faults"
