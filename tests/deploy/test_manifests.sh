#!/usr/bin/env bash
# tests/deploy/test_manifests.sh SOURCE_DIR
#
# Renders every kustomize overlay under deploy/k8s/overlays with `kubectl kustomize` and checks
# the objects for consistency (tests/deploy/check_manifests.py: probes on the health port, TLS files from a Secret, resource
# requests/limits, a headless Service and a PodDisruptionBudget per StatefulSet, fleet.yaml's
# nodes = the StatefulSets' pods, GPU requests only in the gpu overlay, ...).
#
# Two kubectl versions are tried when present: the one on PATH, and Debian 12's kubectl 1.20
# (package kubernetes-client, embedded kustomize v2.0) that scripts/test.sh unpacks into
# build/deploy-tools (another package may own /usr/bin/kubectl).  Both must render, and render
# the same objects.
#
# Exit 77 (CTest: skipped) when no kubectl or no Python with PyYAML is available.
set -uo pipefail
src=${1:?usage: test_manifests.sh SOURCE_DIR}
here="$src/tests/deploy"
. "$here/common.sh"

mapfile -t kubectls < <(find_kubectls)
if [ ${#kubectls[@]} -eq 0 ]; then
  skip "no kubectl (Debian 12: apt-get install kubernetes-client)"
fi
py=$(find_python yaml) || skip "no Python with PyYAML (python3-yaml, or build/venv from scripts/test.sh)"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
overlays=$(find "$src/deploy/k8s/overlays" -mindepth 1 -maxdepth 1 -type d | sort)
[ -n "$overlays" ] || { echo "FAIL: no overlays under deploy/k8s/overlays"; exit 1; }

for k in "${kubectls[@]}"; do
  kv="kubectl $("$k" version --client 2>/dev/null | grep -o 'v1\.[0-9]*\.[0-9]*' | head -n1)"
  for o in $overlays; do
    name=$(basename "$o")
    tag=$(echo "$k" | md5sum | cut -c1-8)
    out="$tmp/$name.$tag.yaml"
    if ! "$k" kustomize "$o" > "$out" 2> "$tmp/err"; then
      echo "FAIL: $kv: kubectl kustomize deploy/k8s/overlays/$name:"; sed 's/^/  /' "$tmp/err"
      fail=1; continue
    fi
    echo "ok: $kv renders overlays/$name ($(grep -c '^kind:' "$out") objects)"
    if [ -f "$tmp/$name.first.yaml" ]; then
      if ! "$py" "$here/check_manifests.py" --same "$tmp/$name.first.yaml" "$out"; then
        echo "FAIL: overlays/$name renders differently with $kv"; fail=1
      fi
    else
      cp "$out" "$tmp/$name.first.yaml"
      "$py" "$here/check_manifests.py" --overlay "$name" "$out" || fail=1
    fi
  done
done
[ ${#kubectls[@]} -lt 2 ] && echo "note: only one kubectl found; Debian 12's kubectl 1.20 (kustomize v2.0) not tried"

# the base (one replica, SQLite) renders and passes as well: overlays build on it
"${kubectls[0]}" kustomize "$src/deploy/k8s/base" > "$tmp/base.yaml" 2>/dev/null || { echo "FAIL: base does not render"; fail=1; }

# The checker itself must see faults: a StatefulSet scaled without fleet.yaml, a probe on the
# wrong port, a container without limits.
first=$(ls "$tmp"/*.first.yaml | head -n1)
if [ -n "$first" ]; then
  "$py" - "$first" "$tmp/mut3.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
for d in docs:
    if d["kind"] == "StatefulSet":
        d["spec"]["replicas"] = 5
        d["spec"]["template"]["spec"]["containers"][0]["resources"].pop("limits")
        d["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpc"]["port"] = 7999
        d["spec"]["template"]["spec"]["containers"][0]["args"].append("--insecure")
        a = d["spec"]["template"]["spec"]["containers"][0]["args"]
        a[a.index("--advertise") + 1] = "0.0.0.0:7100"   # tickets would name another node
        a[a.index("--ticket-key-file") + 1] = "/tmp/ticket.key"   # not from the Secret
        for v in d["spec"]["template"]["spec"]["volumes"]:
            if "items" in v.get("secret", {}):   # the TLS Secret (not the ticket key) without the key item
                v["secret"]["items"] = [i for i in v["secret"]["items"] if i["path"] != "tls.key"]
        break
yaml.safe_dump_all(docs, open(sys.argv[2], "w"))
PY
  out=$("$py" "$here/check_manifests.py" --overlay "$(basename "$first" .first.yaml)" "$tmp/mut3.yaml")
  for want in "fleet.yaml does not list it" "readinessProbe probes port 7999" "no resources.limits.cpu" \
              "runs --insecure" "has no item tls.key" "advertise 0.0.0.0:7100 is not" \
              "ticket-key-file /tmp/ticket.key: mount /tmp is not a Secret volume"; do
    if ! grep -q "$want" <<< "$out"; then
      echo "FAIL: check_manifests.py missed a planted fault ($want)"; fail=1
    fi
  done
  # two router replicas on a SQLite file, with Recreate and no PodDisruptionBudget
  "$py" - "$tmp/base.yaml" "$tmp/mut4.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
docs = [d for d in docs if not (d["kind"] == "PodDisruptionBudget" and d["metadata"]["name"] == "kvlingo-router")]
for d in docs:
    if d["kind"] == "Deployment":
        d["spec"]["replicas"] = 2
        d["spec"]["strategy"] = {"type": "Recreate"}
yaml.safe_dump_all(docs, open(sys.argv[2], "w"))
PY
  out=$("$py" "$here/check_manifests.py" --overlay base "$tmp/mut4.yaml")
  for want in "replicas on a SQLite ledger" "with strategy Recreate" "no PodDisruptionBudget selects them"; do
    if ! grep -q "$want" <<< "$out"; then
      echo "FAIL: check_manifests.py missed a planted fault ($want)"; fail=1
    fi
  done
  # the OpenAI port closed by the router's NetworkPolicy, fleet.yaml serving it elsewhere, and
  # its Service without client affinity
  "$py" - "$tmp/base.yaml" "$tmp/mut5.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
for d in docs:
    if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "kvlingo-router-ingress":
        for rule in d["spec"]["ingress"]:
            rule["ports"] = [p for p in rule.get("ports", []) if p.get("port") != 7003]
    if d["kind"] == "ConfigMap" and "fleet.yaml" in d.get("data", {}):
        d["data"]["fleet.yaml"] = d["data"]["fleet.yaml"].replace("http_listen: 0.0.0.0:7003", "http_listen: 0.0.0.0:7999")
    if d["kind"] == "Service" and d["metadata"]["name"] == "kvlingo-router":
        d["spec"].pop("sessionAffinity", None)
yaml.safe_dump_all(docs, open(sys.argv[2], "w"))
PY
  out=$("$py" "$here/check_manifests.py" --overlay base "$tmp/mut5.yaml")
  for want in "client port 7003 (openai) is closed to clients" "http_listen 0.0.0.0:7999 is not the router's openai port" \
              "openai port has no sessionAffinity: ClientIP"; do
    if ! grep -q "$want" <<< "$out"; then
      echo "FAIL: check_manifests.py missed a planted fault ($want)"; fail=1
    fi
  done
  [ "$fail" -eq 0 ] && echo "ok: check_manifests.py finds planted faults"
fi
[ "$fail" -eq 0 ] && echo "PASS: deploy manifests" || echo "FAIL: deploy manifests"
exit "$fail"
