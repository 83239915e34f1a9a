#!/usr/bin/env bash
# kvlingo-router --check refuses each file a start would refuse, naming file:line, the key and
# the resolved path; strict YAML (aliases, anchors, merge keys, duplicate keys refused) on the
# router and on kvld --config.  check_config.sh ROUTER KVLD SOURCE_DIR
set -uo pipefail
R=$1; K=$2; SRC=$3
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }
good() {   # a fleet file that passes, with one line replaced/added by the caller's sed
  cat <<YAML
listen: 127.0.0.1:0
ledger: ledger.db
tokenizer: $SRC/models/qwen3-a
nodes:
  - {name: a0, address: 127.0.0.1:7100, model: qwen3-a}
  - {name: b0, address: 127.0.0.1:7101, model: qwen3-b}
policy:
  name: cascade
  models: [qwen3-a, qwen3-b]
YAML
}
refuse() {   # refuse NAME FILE PATTERN...
  local name=$1 f=$2; shift 2
  local out; out=$("$R" --insecure --config "$f" --check 2>&1); local rc=$?
  local okp=1
  for p in "$@"; do grep -qF -- "$p" <<<"$out" || okp=0; done
  [ $rc -eq 1 ] && [ $okp = 1 ] && ok "refused: $name" || bad "$name: rc $rc: $out"
}
mkdir -p "$T/conf"
good > "$T/conf/good.yaml"
out=$("$R" --insecure --config "$T/conf/good.yaml" --check); rc=$?
[ $rc -eq 0 ] && grep -q "^tokenizer: $SRC/models/qwen3-a (vocabulary " <<<"$out" \
  && grep -q "^ledger: $T/conf/ledger.db (will be created)" <<<"$out" && grep -q '^  b0  127.0.0.1:7101  model qwen3-b' <<<"$out" \
  && ok "good file passes, resolved paths shown" || bad "good: $rc $out"
# a relative tokenizer that does not exist: the resolved path is named
good | sed 's|^tokenizer: .*|tokenizer: ../models/nope|' > "$T/conf/reltok.yaml"
refuse "relative tokenizer path" "$T/conf/reltok.yaml" "reltok.yaml:3: key 'tokenizer'" "'../models/nope' resolves to" "$T/models/nope" "does not exist"
# the OpenAI HTTP API: a bad address and a body bound out of range are refused; a good one is shown
{ good; echo "http_listen: 8000"; } > "$T/conf/http1.yaml"
refuse "http_listen without host" "$T/conf/http1.yaml" "http1.yaml:10: key 'http_listen'" "not host:port"
good | sed 's|address: 127.0.0.1:7101|address: 127.0.0.1:99999|' > "$T/conf/port.yaml"
refuse "a node port past 65535" "$T/conf/port.yaml" "port.yaml:6: key 'nodes[1].address'" "a port in [1, 65535]"
good | sed 's|address: 127.0.0.1:7101|address: 127.0.0.1:0|' > "$T/conf/port0.yaml"
refuse "a node on port 0" "$T/conf/port0.yaml" "port0.yaml:6: key 'nodes[1].address'" "a port in [1, 65535]"
{ good; echo "http_listen: 127.0.0.1:8000"; echo "http_max_body_bytes: 10"; } > "$T/conf/http2.yaml"
refuse "http_max_body_bytes too small" "$T/conf/http2.yaml" "http2.yaml:11" "http_max_body_bytes"
{ good; echo "http_listen: 127.0.0.1:8000"; } > "$T/conf/http3.yaml"
out=$("$R" --insecure --config "$T/conf/http3.yaml" --check); rc=$?
[ $rc -eq 0 ] && grep -q '^http (OpenAI API): 127.0.0.1:8000 (body <= 1048576 bytes' <<<"$out" \
  && ok "http_listen shown by --check" || bad "http3: $rc $out"
# the chat template: the shipped one renders; one kvlingo does not know is named by --check
# (the chat endpoint then answers 500, a server error, not the client's 400)
grep -q '^chat template: renders' <<<"$out" && ok "chat template renders (--check)" || bad "chat template: $out"
mkdir -p "$T/tok"
cp "$SRC/models/qwen3-a/tokenizer.json" "$T/tok/"
echo '{{ garbage }}' > "$T/tok/chat_template.jinja"
good | sed "s|^tokenizer: .*|tokenizer: $T/tok|" > "$T/conf/badtpl.yaml"
out=$("$R" --insecure --config "$T/conf/badtpl.yaml" --check); rc=$?
[ $rc -eq 0 ] && grep -q '^chat template: none it can render (/v1/chat/completions answers 500' <<<"$out" \
  && grep -q 'chat_template.jinja) is not one kvlingo renders' <<<"$out" \
  && ok "an unknown chat template is named by --check" || bad "badtpl: $rc $out"
out=$("$R" --insecure --config "$T/conf/good.yaml" --http-listen 127.0.0.1:8123 --check); rc=$?
[ $rc -eq 0 ] && grep -q '^http (OpenAI API): 127.0.0.1:8123' <<<"$out" && ok "--http-listen overrides" || bad "flag: $rc $out"
out=$("$R" --insecure --config "$T/conf/good.yaml" --http-listen nonsense --check 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "http-listen 'nonsense' is not host:port" <<<"$out" && ok "bad --http-listen refused" || bad "bad flag: $rc $out"
# 5,001 nodes
{ good | sed '/^  - /d; /^nodes:/d'; echo "nodes:"; for i in $(seq 1 5001); do echo "  - {name: n$i, address: 127.0.0.1:$((10000 + i % 50000)), model: qwen3-a}"; done; } > "$T/conf/many.yaml"
refuse "5,001 nodes" "$T/conf/many.yaml" "many.yaml:" "5001 nodes, at most 32"
long=$(head -c 5000 /dev/zero | tr '\0' x)
good | sed "s|name: a0|name: $long|" > "$T/conf/longname.yaml"
refuse "5,000-character node name" "$T/conf/longname.yaml" "longname.yaml:5: key 'nodes[0].name': 5000 characters, at most 63"
good | sed "s|model: qwen3-b}|model: $long}|" > "$T/conf/longmodel.yaml"
refuse "5,000-character model name" "$T/conf/longmodel.yaml" "longmodel.yaml:6: key 'nodes[1].model': 5000 characters"
good | sed 's|^ledger: .*|ledger: /nonexistent-dir/x/ledger.db|' > "$T/conf/ledger.yaml"
refuse "ledger in a missing directory" "$T/conf/ledger.yaml" "ledger.yaml:2: key 'ledger'" "does not exist"
good | sed 's|^listen: .*|listen: \&l 127.0.0.1:0|; s|address: 127.0.0.1:7100|address: *l|' > "$T/conf/alias.yaml"
refuse "YAML alias/anchor" "$T/conf/alias.yaml" "alias.yaml:1: YAML anchor '&l' refused"
{ good; echo "listen: 127.0.0.1:9"; } > "$T/conf/dup.yaml"
refuse "duplicate top-level key" "$T/conf/dup.yaml" "dup.yaml:10: key 'listen' given twice (first on line 1)"
good | sed 's|^  name: cascade|  name: cascade\n  name: pinned|' > "$T/conf/dup2.yaml"
refuse "duplicate nested key" "$T/conf/dup2.yaml" "dup2.yaml:9: key 'name' given twice (first on line 8)"
good | sed 's|^  models: .*|  models: [qwen3-a, qwen3-z]|' > "$T/conf/model.yaml"
refuse "policy naming a model no node serves" "$T/conf/model.yaml" "model 'qwen3-z' is served by no node"
# ledger forms: sqlite:PATH, a PostgreSQL URI (not contacted, password hidden), env:NAME
good | sed 's|^ledger: .*|ledger: sqlite:l2.db|' > "$T/conf/sq.yaml"
out=$("$R" --insecure --config "$T/conf/sq.yaml" --check 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "^ledger: $T/conf/l2.db (will be created)" <<<"$out" && ok "ledger sqlite:PATH resolved" || bad "sqlite: $rc $out"
good | sed 's|^ledger: .*|ledger: postgresql://kvr:hunter2@127.0.0.1:1/db|' > "$T/conf/pg.yaml"
out=$("$R" --insecure --config "$T/conf/pg.yaml" --check 2>&1); rc=$?
[ $rc -eq 0 ] && grep -qF "ledger: postgresql://kvr:***@127.0.0.1:1/db (postgresql, not contacted by --check)" <<<"$out" \
  && ! grep -q hunter2 <<<"$out" && ok "ledger PostgreSQL URI, password hidden" || bad "pg: $rc $out"
good | sed 's|^ledger: .*|ledger: env:KVR_TEST_NO_SUCH_VAR|' > "$T/conf/env.yaml"
refuse "ledger env:NAME unset" "$T/conf/env.yaml" "env.yaml:2: key 'ledger': environment variable 'KVR_TEST_NO_SUCH_VAR'" "not set"
good | sed 's|^ledger: .*|ledger: env:KVR_TEST_LEDGER_URI|' > "$T/conf/env2.yaml"
out=$(KVR_TEST_LEDGER_URI="postgresql://u:pw@h/db" "$R" --insecure --config "$T/conf/env2.yaml" --check 2>&1); rc=$?
[ $rc -eq 0 ] && grep -qF "ledger: postgresql://u:***@h/db" <<<"$out" && ok "ledger env:NAME read" || bad "env: $rc $out"
good | sed 's|^ledger: .*|ledger: mysql://h/db|' > "$T/conf/my.yaml"
refuse "ledger of an unknown scheme" "$T/conf/my.yaml" "my.yaml:2: key 'ledger'" "neither a path"
{ good; echo "lease_ms: 5"; } > "$T/conf/lease.yaml"
refuse "lease_ms out of range" "$T/conf/lease.yaml" "key 'lease_ms'"
{ good; echo "replica_id: 'a b'"; } > "$T/conf/rep.yaml"
refuse "replica_id with a space" "$T/conf/rep.yaml" "key 'replica_id'"
# api_keys: the key file is checked too (file, line and field named); --api-keys overrides
printf 'tenants:\n  - name: acme\n    keys: ["sk-acme-0123456789abcdef"]\n    max_sessions: 4\n' > "$T/conf/keys.yaml"
{ good; echo "api_keys: keys.yaml"; } > "$T/conf/keys1.yaml"
out=$("$R" --insecure --config "$T/conf/keys1.yaml" --check 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "^api_keys: $T/conf/keys.yaml (1 tenants, 1 keys)" <<<"$out" && ok "api_keys resolved and shown" || bad "api_keys: $rc $out"
out=$("$R" --insecure --config "$T/conf/good.yaml" --check 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q '^api_keys: none: every client is tenant "default"' <<<"$out" \
  && ok "no api_keys, insecure: every client is tenant default" || bad "no api_keys: $rc $out"
out=$("$R" --config "$T/conf/good.yaml" --check 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q 'no api_keys: without a key file every client could read every session' <<<"$out" \
  && ok "no api_keys, not insecure: --check refuses, naming it" || bad "no api_keys refused: $rc $out"
printf 'tenants:\n  - name: acme\n    keys: ["sk-acme-0123456789abcdef"]\n    max_sesions: 4\n' > "$T/conf/keys-typo.yaml"
{ good; echo "api_keys: keys-typo.yaml"; } > "$T/conf/keys2.yaml"
refuse "key file with a typo" "$T/conf/keys2.yaml" "keys2.yaml:10: key 'api_keys'" "keys-typo.yaml:4: unknown key 'tenants[0].max_sesions'"
printf 'tenants:\n  - name: acme\n    keys: [short]\n' > "$T/conf/keys-short.yaml"
out=$("$R" --insecure --config "$T/conf/keys1.yaml" --api-keys "$T/conf/keys-short.yaml" --check 2>&1); rc=$?
[ $rc -eq 1 ] && grep -qF -- "--api-keys: $T/conf/keys-short.yaml:3: key 'tenants[0].keys' [0]: 5 characters" <<<"$out" \
  && ok "--api-keys overrides api_keys, its errors named" || bad "--api-keys: $rc $out"
printf 'tenants:\n  - name: acme\n    keys: ["sk-acme 0123456789abcdef"]\n' > "$T/conf/keys-space.yaml"
{ good; echo "api_keys: keys-space.yaml"; } > "$T/conf/keys4.yaml"
refuse "a key with a space" "$T/conf/keys4.yaml" "keys-space.yaml:3: key 'tenants[0].keys' [0]: character 7 is a space"
good | sed 's|address: 127.0.0.1:7101|address: 127.0.0.1:7100|' > "$T/conf/dupaddr.yaml"
refuse "two nodes at one address" "$T/conf/dupaddr.yaml" "dupaddr.yaml:6: key 'nodes[1].address': 127.0.0.1:7100 is node 'a0''s address too"
{ good; echo "api_keys: nope.yaml"; } > "$T/conf/keys3.yaml"
refuse "missing key file" "$T/conf/keys3.yaml" "keys3.yaml:10: key 'api_keys'" "nope.yaml"
head -c 48 /dev/urandom | base64 > "$T/fleet.key"
out=$("$R" --config "$SRC/router/fleet.example.yaml" --api-keys "$SRC/router/api-keys.example.yaml" --ticket-key-file "$T/fleet.key" --check 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "api-keys.example.yaml (2 tenants, 2 keys)" <<<"$out" && ok "router/api-keys.example.yaml passes --check" \
  || bad "api-keys.example.yaml: $rc $out"
# kvld: the same strict YAML
printf 'model: %s\nmax_sessions: 4\nmax_sessions: 8\n' "$SRC/models/qwen3-a" > "$T/kd.yaml"
out=$("$K" --insecure --config "$T/kd.yaml" --check 2>&1); rc=$?
[ $rc -eq 2 ] && grep -qF "kd.yaml:3: key 'max_sessions' given twice (first on line 2)" <<<"$out" && ok "kvld: duplicate key refused" || bad "kvld dup: $rc $out"
printf 'model: &m %s\ntranslators: *m\n' "$SRC/models/qwen3-a" > "$T/ka.yaml"
out=$("$K" --insecure --config "$T/ka.yaml" --check 2>&1); rc=$?
[ $rc -eq 2 ] && grep -qF "ka.yaml:1: YAML anchor '&m' refused" <<<"$out" && ok "kvld: alias refused" || bad "kvld alias: $rc $out"
printf 'model: %s\nmax_sessions: 4\n' "$SRC/models/qwen3-a" > "$T/kg.yaml"
out=$("$K" --insecure --config "$T/kg.yaml" --check 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q '^max_sessions: 4' <<<"$out" && ok "kvld: good YAML passes --check" || bad "kvld good: $rc $out"
# the sample fleet the README starts by hand passes the check (paths relative to its folder)
head -c 48 /dev/urandom | base64 > "$T/fleet.key"
out=$("$R" --config "$SRC/router/fleet.example.yaml" --ticket-key-file "$T/fleet.key" --check 2>&1) && grep -q "tokenizer: .*models/qwen3-a (vocabulary" <<<"$out" \
    && ok "router/fleet.example.yaml passes --check" || bad "fleet.example.yaml: $out"
# TLS files: each wrong one is named with its key and path (a throw-away CA made here)
P="$T/pki"; mkdir -p "$P"
ossl() { openssl "$@" >/dev/null 2>&1 || bad "openssl $*"; }
ossl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$P/ca-key.pem" -out "$P/ca.pem" -days 2 -subj /CN=test-ca
ossl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$P/other-key.pem" -out "$P/other.pem" -days 2 -subj /CN=other-ca
ossl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$P/r-key.pem" -out "$P/r.csr" -subj /CN=router
ossl x509 -req -in "$P/r.csr" -CA "$P/ca.pem" -CAkey "$P/ca-key.pem" -set_serial 7 -days 2 -out "$P/r.pem"
# the usual web-server recipe: serverAuth only (a fleet member is also a client of the others)
printf 'extendedKeyUsage=serverAuth\n' > "$P/srv.ext"
ossl x509 -req -in "$P/r.csr" -CA "$P/ca.pem" -CAkey "$P/ca-key.pem" -set_serial 8 -days 2 -out "$P/r-srv.pem" -extfile "$P/srv.ext"
# a secure fleet file has TLS, transfer tickets and API keys
tlsgood() { good; printf 'tls_cert: %s\ntls_key: %s\ntls_ca: %s\nticket_key_file: %s\napi_keys: keys.yaml\n' "$1" "$2" "$3" "$T/fleet.key"; }
tlsgood "$P/r.pem" "$P/r-key.pem" "$P/ca.pem" > "$T/conf/tls.yaml"
out=$("$R" --config "$T/conf/tls.yaml" --check 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q '^tls: CN=router (until ' <<<"$out" && grep -q '^insecure: no' <<<"$out" \
  && ok "TLS files pass --check, subject shown" || bad "tls good: $rc $out"
out=$("$R" --config "$T/conf/tls.yaml" --insecure --check 2>&1); rc=$?
[ $rc -eq 1 ] && grep -qF 'insecure is set together with tls_cert' <<<"$out" && ok "refused: --insecure with TLS keys" || bad "tls+insecure: $rc $out"
tlsgood "$P/nope.pem" "$P/r-key.pem" "$P/ca.pem" > "$T/conf/tls1.yaml"
out=$("$R" --config "$T/conf/tls1.yaml" --check 2>&1); rc=$?
[ $rc -eq 1 ] && grep -qF "tls_cert '$P/nope.pem': no such file" <<<"$out" && ok "refused: missing tls_cert" || bad "tls1: $rc $out"
tlsgood "$P/r.pem" "$P/other-key.pem" "$P/ca.pem" > "$T/conf/tls2.yaml"
out=$("$R" --config "$T/conf/tls2.yaml" --check 2>&1); rc=$?
[ $rc -eq 1 ] && grep -qF "tls_key '$P/other-key.pem' is not the key of tls_cert '$P/r.pem'" <<<"$out" && ok "refused: key of another certificate" || bad "tls2: $rc $out"
tlsgood "$P/r.pem" "$P/r-key.pem" "$P/other.pem" > "$T/conf/tls3.yaml"
out=$("$R" --config "$T/conf/tls3.yaml" --check 2>&1); rc=$?
[ $rc -eq 1 ] && grep -qF "tls_cert '$P/r.pem' (CN=router) does not verify against tls_ca '$P/other.pem'" <<<"$out" && ok "refused: certificate of another CA" || bad "tls3: $rc $out"
tlsgood "$P/r-srv.pem" "$P/r-key.pem" "$P/ca.pem" > "$T/conf/tls6.yaml"
out=$("$R" --config "$T/conf/tls6.yaml" --check 2>&1); rc=$?
[ $rc -eq 1 ] && grep -qF "tls_cert '$P/r-srv.pem' (CN=router): its extendedKeyUsage lacks clientAuth" <<<"$out" \
  && ok "refused: a serverAuth-only certificate, clientAuth named" || bad "tls6: $rc $out"
tlsgood "$P/r.csr" "$P/r-key.pem" "$P/ca.pem" > "$T/conf/tls4.yaml"
out=$("$R" --config "$T/conf/tls4.yaml" --check 2>&1); rc=$?
[ $rc -eq 1 ] && grep -qF "tls_cert '$P/r.csr': no PEM certificate" <<<"$out" && ok "refused: a CSR as tls_cert" || bad "tls4: $rc $out"
tlsgood "$P/ca.pem" "$P/ca-key.pem" "$P/ca.pem" > "$T/conf/tls7.yaml"
out=$("$R" --config "$T/conf/tls7.yaml" --check 2>&1); rc=$?
[ $rc -eq 1 ] && grep -qF "tls_cert '$P/ca.pem' (CN=test-ca): a CA certificate" <<<"$out" \
  && ok "refused: the CA's own certificate as tls_cert" || bad "tls7: $rc $out"
chmod 644 "$P/r.pem"
tlsgood "$P/r.pem" "$P/r.pem" "$P/ca.pem" > "$T/conf/tls8.yaml"
out=$("$R" --config "$T/conf/tls8.yaml" --check 2>&1); rc=$?
[ $rc -eq 1 ] && grep -qF "tls_key '$P/r.pem': not an unencrypted PEM private key" <<<"$out" \
  && ! grep -q "readable" <<<"$out" && ok "refused: a certificate as tls_key, with no warning about a readable key" \
  || bad "tls8: $rc $out"
tlsgood "$P/r.pem" "$P/r-key.pem" "$P" > "$T/conf/tls9.yaml"
out=$("$R" --config "$T/conf/tls9.yaml" --check 2>&1); rc=$?
[ $rc -eq 1 ] && grep -qF "tls_ca '$P': " <<<"$out" && grep -qi "directory" <<<"$out" \
  && ok "refused: a directory as tls_ca, named as the other files are" || bad "tls9: $rc $out"
{ good; printf 'tls_cert: %s\ntls_key: %s\nticket_key_file: %s\napi_keys: keys.yaml\n' "$P/r.pem" "$P/r-key.pem" "$T/fleet.key"; } > "$T/conf/tls5.yaml"
out=$("$R" --config "$T/conf/tls5.yaml" --check 2>&1); rc=$?
[ $rc -eq 1 ] && grep -qF "tls_ca is not set" <<<"$out" && ok "refused: tls_ca missing" || bad "tls5: $rc $out"
out=$("$K" --model "$SRC/models/qwen3-a" --tls-cert "$P/r.pem" --tls-key "$P/r-key.pem" --tls-ca "$P/other.pem" --check 2>&1); rc=$?
[ $rc -eq 1 ] && grep -qF "does not verify against tls_ca '$P/other.pem'" <<<"$out" && ok "kvld: certificate of another CA refused" || bad "kvld tls: $rc $out"
out=$("$K" --model "$SRC/models/qwen3-a" --tls-cert "$P/r.pem" --tls-key "$P/r-key.pem" --tls-ca "$P/ca.pem" --ticket-key-file "$T/fleet.key" --check 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q '^tls: CN=router (until .*client certificates required' <<<"$out" && ok "kvld: TLS files pass --check" || bad "kvld tls good: $rc $out"
out=$("$K" --model "$SRC/models/qwen3-a" --tls-cert "$P/r.pem" --check 2>&1); rc=$?
[ $rc -eq 1 ] && grep -qF "TLS needs tls_cert, tls_key and tls_ca; tls_key is not set" <<<"$out" && ok "kvld: tls_key missing refused" || bad "kvld tls partial: $rc $out"
out=$("$K" --model "$SRC/models/qwen3-a" --tls-cert "$P/r.pem" --tls-key "$P/r-key.pem" --tls-ca "$P/ca.pem" --check 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q 'no transfer-ticket key' <<<"$out" && ok "kvld: TLS without a ticket key refused" || bad "kvld tls no key: $rc $out"
grep -v '^ticket_key_file' "$T/conf/tls.yaml" > "$T/conf/tls-nokey.yaml"
out=$("$R" --config "$T/conf/tls-nokey.yaml" --check 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q 'no transfer-ticket key: give ticket_key_file' <<<"$out" && ok "router: TLS without a ticket key refused" || bad "router tls no key: $rc $out"
exit $fail
