#!/usr/bin/env bash
# deploy/make-tls-secret.sh: a fleet CA and the certificates the manifests mount from the Secret
# kvlingo-tls, made with openssl, then the Secret itself (or its YAML with --dry-run).
# KVL_TLS_REPLICAS (default 8): pods per model the node certificate names.
#
#   deploy/make-tls-secret.sh NAMESPACE OUT_DIR [MODEL ...]      (default models: qwen3-a qwen3-b)
#   deploy/make-tls-secret.sh --dry-run NAMESPACE OUT_DIR ...     print the Secret, create nothing
#
# Keys of the Secret: ca.crt (the fleet CA), router.crt / router.key (the router: its server
# identity for clients and its client certificate towards the nodes), kvld.crt / kvld.key (every
# node: it names the pods' stable DNS names kvld-<model>-<n>.kvld-<model> one by one, since
# gRPC matches a wildcard only over a name with two more labels, and is the nodes' client
# certificate towards each other).  Certificates carry serverAuth and clientAuth and live
# 365 days; the CA key stays in OUT_DIR (keep it offline: it signs new fleet members).  An
# existing OUT_DIR/ca.pem is reused, so re-running adds models without changing the CA.
set -euo pipefail
dry=""
[ "${1:-}" = "--dry-run" ] && { dry="--dry-run=client -o yaml"; shift; }
ns=${1:?usage: make-tls-secret.sh [--dry-run] NAMESPACE OUT_DIR [MODEL ...]}
out=${2:?usage: make-tls-secret.sh [--dry-run] NAMESPACE OUT_DIR [MODEL ...]}
shift 2
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(qwen3-a qwen3-b)
mkdir -p "$out"
cd "$out"
ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
if [ ! -f ca.pem ]; then
  openssl req -x509 "${ec[@]}" -keyout ca-key.pem -out ca.pem -days 3650 -subj "/CN=kvlingo fleet CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi
leaf() {   # leaf NAME CN SAN
  printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n'`
        `'extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=%s\n' "$3" > "$1.ext"
  openssl req "${ec[@]}" -keyout "$1.key" -out "$1.csr" -subj "/CN=$2" 2>/dev/null
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca-key.pem -set_serial "0x$(openssl rand -hex 8)" \
    -days 365 -out "$1.crt" -extfile "$1.ext" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
leaf router kvlingo-router "DNS:kvlingo-router,DNS:kvlingo-router.$ns,DNS:kvlingo-router.$ns.svc,DNS:localhost,IP:127.0.0.1"
san="DNS:localhost,IP:127.0.0.1"
for m in "${models[@]}"; do
  for ((i = 0; i < ${KVL_TLS_REPLICAS:-8}; i++)); do san="$san,DNS:kvld-$m-$i.kvld-$m"; done
  san="$san,DNS:*.kvld-$m.$ns.svc"
done
leaf kvld kvlingo-kvld "$san"
openssl verify -CAfile ca.pem router.crt kvld.crt >/dev/null
# shellcheck disable=SC2086
kubectl -n "$ns" create secret generic kvlingo-tls $dry --from-file=ca.crt=ca.pem \
  --from-file=router.crt --from-file=router.key --from-file=kvld.crt --from-file=kvld.key
