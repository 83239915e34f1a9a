#!/usr/bin/env bash
# --version, --help / -h and --key=value on one of the programs: flags.sh PROGRAM SOURCE_DIR.
# --version names the program, version, git commit, build options and backends; --help and -h
# exit 0 with the options described (kvld: each with its default); --key=value parses as
# --key value; an unknown option fails with exit 2 naming it.
set -uo pipefail
P=$1; SRC=$2
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
fail=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }
name=$(basename "$P")
v=$("$P" --version); rc=$?
[ $rc -eq 0 ] && grep -qE "^$name [0-9]+\.[0-9]+\.[0-9]+ \(git [0-9a-f+dirtyunknown]+\)$" <<<"$v" \
  && grep -q '^build: build=' <<<"$v" && grep -q '^backends: cpu' <<<"$v" && ok "$name --version" || bad "$name --version: $v"
for h in --help -h; do
  out=$("$P" $h); rc=$?
  [ $rc -eq 0 ] && grep -q 'usage:' <<<"$out" && grep -q -- '--version' <<<"$out" && ok "$name $h" || bad "$name $h: $out"
done
out=$("$P" --no-such-flag 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q -- '--no-such-flag' <<<"$out" && ok "$name unknown option refused" || bad "$name unknown: $rc $out"
case $name in
kvlingo)
  out=$("$P" generate --model "$SRC/models/qwen3-a" --prompt-ids 725,732 --max-tokens=3 --json) \
    && python3 -c 'import json,sys; assert len(json.loads(sys.argv[1])["ids"]) == 3' "$out" \
    && ok "kvlingo --max-tokens=3" || bad "kvlingo --max-tokens=3: $out"
  out=$("$P" generate -h) && grep -q 'max-tokens' <<<"$out" && ok "kvlingo generate -h" || bad "generate -h: $out"
  # an option's value that looks like a flag is the value (as getopt takes it), not the flag
  tok="$SRC/models/qwen3-a"
  a=$("$P" tokenize --tokenizer "$tok" --text --json) && b=$("$P" tokenize --tokenizer "$tok/tokenizer.json" --text=--json) \
    && [ "$a" = "$b" ] && ! grep -q '{' <<<"$a" && ok "kvlingo --text --json: the text is '--json' (a folder or file for --tokenizer)" \
    || bad "--text --json: '$a' vs '$b'"
  if "$P" chat -h 2>/dev/null | grep -q -- '--tls-ca'; then   # built with the server components
    out=$("$P" chat --router 127.0.0.1:1 hi 2>&1); rc=$?
    [ $rc -eq 2 ] && grep -qF -- '--tls-ca FILE (the CA that signed the router' <<<"$out" && grep -qF -- '--insecure' <<<"$out" \
      && ok "kvlingo chat without --tls-ca nor --insecure refused" || bad "chat no tls: $rc $out"
    out=$("$P" chat --router 127.0.0.1:1 --tls-ca "$T/nope.pem" hi 2>&1); rc=$?
    [ $rc -ne 0 ] && grep -qF "tls_ca '$T/nope.pem': no such file" <<<"$out" && ok "kvlingo chat --tls-ca missing file named" || bad "chat bad ca: $rc $out"
    # TEXT after a --key=value option is the text (the split form shifted the positions)
    out=$("$P" chat --router=127.0.0.1:9 --insecure --timeout-ms=2000 hello 2>&1); rc=$?
    ! grep -q "unexpected argument" <<<"$out" && [ $rc -eq 1 ] && grep -q "CreateSession: UNAVAILABLE" <<<"$out" \
      && ok "kvlingo chat --router=ADDR TEXT parses TEXT" || bad "chat --key=value TEXT: $rc $out"
  fi
  ;;
kvld)
  out=$("$P" --help)
  [ "$(grep -c '(default: ' <<<"$out")" -ge 10 ] && grep -qE -- '--listen HOST:PORT .*\(default: 127\.0\.0\.1:7070\)' <<<"$out" \
    && ok "kvld --help gives descriptions and defaults" || bad "kvld help: $out"
  out=$("$P" --model="$SRC/models/qwen3-a" --max-sessions=0 2>&1); rc=$?
  [ $rc -eq 2 ] && grep -q "max_sessions = '0'" <<<"$out" && ok "kvld --max-sessions=0 parsed (and refused)" || bad "kvld =: $out"
  head -c 48 /dev/urandom | base64 > "$T/fleet.key"
  out=$("$P" --model="$SRC/models/qwen3-a" --listen=127.0.0.1:0 --insecure --ticket-key-file="$T/fleet.key" --check); rc=$?
  [ $rc -eq 0 ] && grep -q "^model: $SRC/models/qwen3-a" <<<"$out" && grep -q '^listen: 127.0.0.1:0' <<<"$out" \
    && grep -q "^transfer tickets: key $T/fleet.key" <<<"$out" \
    && ok "kvld --check --key=value" || bad "kvld check: $rc $out"
  grep -q '^insecure: yes' <<<"$out" && ok "kvld --insecure shown by --check" || bad "kvld --insecure: $out"
  # a ticket key every local user can read is said at start (not refused: mounted secrets vary)
  chmod 644 "$T/fleet.key"
  out=$("$P" --model="$SRC/models/qwen3-a" --insecure --ticket-key-file="$T/fleet.key" --check 2>&1)
  grep -q "msg=key_file_readable key=ticket_key_file file=\"$T/fleet.key\" mode=644" <<<"$out" \
    && ok "kvld warns of a world-readable ticket key" || bad "no key warning: $out"
  chmod 600 "$T/fleet.key"
  out=$("$P" --model="$SRC/models/qwen3-a" --insecure --ticket-key-file="$T/fleet.key" --check 2>&1)
  ! grep -q "key_file_readable" <<<"$out" && ok "kvld: a 0600 key draws no warning" || bad "0600 warned: $out"
  # a relative path that is not there: read against the working directory, which is named
  out=$(cd "$T" && "$P" --model models/nope --insecure --check 2>&1); rc=$?
  [ $rc -ne 0 ] && grep -qF "model 'models/nope': No such file or directory (relative to the working directory $T" <<<"$out" \
    && ok "kvld names the working directory of a relative model path" || bad "kvld relative path: $rc $out"
  # an address gRPC would take otherwise: a port past 65535 (modulo 65536) or none (443)
  for a in 127.0.0.1:99999 localhost 127.0.0.1:-1; do
    out=$("$P" --model="$SRC/models/qwen3-a" --insecure --listen "$a" --check 2>&1); rc=$?
    [ $rc -eq 2 ] && grep -qE "listen '$a': (expected HOST:PORT|the port must be a number in \[0, 65535\])" <<<"$out" \
      && ok "kvld --listen $a refused" || bad "kvld --listen $a: $rc $out"
  done
  out=$("$P" --model="$SRC/models/qwen3-a" --insecure --advertise 10.0.0.1:0 --check 2>&1); rc=$?
  [ $rc -eq 2 ] && grep -q "advertise '10.0.0.1:0': the port must be a number in \[1, 65535\]" <<<"$out" \
    && ok "kvld --advertise with port 0 refused" || bad "kvld --advertise: $rc $out"
  out=$("$P" --model="$SRC/models/qwen3-a" --check 2>&1); rc=$?
  [ $rc -eq 1 ] && grep -q '^insecure: no' <<<"$out" \
    && grep -qF 'no TLS certificate: set tls_cert/tls_key/tls_ca or pass --insecure to run plaintext' <<<"$out" \
    && ok "kvld --check without TLS files nor --insecure refused" || bad "kvld no tls: $rc $out"
  # transfer tickets: a key, or --insecure; a bad key file is named
  out=$("$P" --model="$SRC/models/qwen3-a" --check 2>&1); rc=$?
  [ $rc -ne 0 ] && grep -q "no transfer-ticket key: give --ticket-key-file" <<<"$out" \
    && ok "kvld --check: no ticket key and not insecure refused" || bad "kvld no key: $rc $out"
  out=$("$P" --model="$SRC/models/qwen3-a" 2>&1); rc=$?
  [ $rc -eq 1 ] && grep -q "no transfer-ticket key" <<<"$out" && grep -qF 'no TLS certificate' <<<"$out" \
    && ok "kvld: no ticket key and no TLS refuses to start, naming both" || bad "kvld start no key: $rc $out"
  out=$("$P" --model="$SRC/models/qwen3-a" --ticket-key-file "$T/none.key" --check 2>&1); rc=$?
  [ $rc -ne 0 ] && grep -q "ticket key file '$T/none.key': missing" <<<"$out" && ok "kvld --check: missing key file named" || bad "kvld missing key: $rc $out"
  printf 'short\n' > "$T/short.key"
  out=$("$P" --model="$SRC/models/qwen3-a" --ticket-key-file "$T/short.key" --check 2>&1); rc=$?
  [ $rc -ne 0 ] && grep -q "ticket key file '$T/short.key': too short" <<<"$out" && ok "kvld --check: short key file named" || bad "kvld short key: $rc $out"
  out=$("$P" --model="$SRC/models/qwen3-a" --ticket-key-file "$T" --check 2>&1); rc=$?
  [ $rc -ne 0 ] && grep -q "ticket key file '$T': unreadable" <<<"$out" && ok "kvld --check: unreadable key file named" || bad "kvld unreadable key: $rc $out"
  grep -q '^insecure: no' <<<"$out" && ok "kvld --check: not insecure by default" || bad "kvld insecure default: $out"
  out=$("$P" --model="$SRC/models/qwen3-a" --insecure --check); rc=$?
  [ $rc -eq 0 ] && grep -q '^insecure: yes' <<<"$out" && ok "kvld --insecure shown by --check" || bad "kvld --insecure: $rc $out"
  out=$("$P" --model="$SRC/models/qwen3-a" --insecure --check 2>&1); rc=$?
  [ $rc -eq 0 ] && grep -q '^transfer tickets: off' <<<"$out" && ok "kvld --insecure without a key: tickets off" || bad "kvld insecure no key: $rc $out"
  printf 'model: %s\ninsecure: true\n' "$SRC/models/qwen3-a" > "$T/kvld.yaml"
  out=$("$P" --config "$T/kvld.yaml" --check); rc=$?
  [ $rc -eq 0 ] && grep -q '^insecure: yes' <<<"$out" && ok "kvld insecure: true (YAML)" || bad "kvld yaml insecure: $rc $out"
  printf 'model: %s\ninsecure: maybe\n' "$SRC/models/qwen3-a" > "$T/kvld2.yaml"
  out=$("$P" --config "$T/kvld2.yaml" --check 2>&1); rc=$?
  [ $rc -eq 2 ] && grep -q "insecure = 'maybe'" <<<"$out" && ok "kvld insecure: maybe refused" || bad "kvld yaml insecure maybe: $rc $out"
  ;;
kvlingo-router)
  printf 'listen: 127.0.0.1:0\ntokenizer: %s\npolicy:\n  name: pinned\nnodes:\n  - {name: a, address: 127.0.0.1:1, model: qwen3-a}\n' "$SRC/models/qwen3-a" > "$T/fleet.yaml"
  head -c 48 /dev/urandom | base64 > "$T/fleet.key"
  out=$("$P" --config="$T/fleet.yaml" --ticket-key-file="$T/fleet.key" --insecure --check); rc=$?
  [ $rc -eq 0 ] && grep -q 'ok' <<<"$out" && grep -q "^transfer tickets: key $T/fleet.key" <<<"$out" \
    && ok "router --config=FILE --ticket-key-file --check" || bad "router check: $rc $out"
  out=$("$P" --config="$T/fleet.yaml" --check 2>&1); rc=$?
  [ $rc -eq 1 ] && grep -q "no transfer-ticket key: give ticket_key_file:" <<<"$out" && grep -q "no api_keys" <<<"$out" \
    && ok "router --check: no ticket key, no TLS, no keys and not insecure refused, naming each" || bad "router no key: $rc $out"
  { cat "$T/fleet.yaml"; echo 'ticket_key_file: missing.key'; } > "$T/fleetk.yaml"
  out=$("$P" --config="$T/fleetk.yaml" --insecure --check 2>&1); rc=$?
  [ $rc -eq 1 ] && grep -q "ticket key file '$T/missing.key': missing" <<<"$out" \
    && ok "router --check: missing key file named (relative to the file)" || bad "router missing key: $rc $out"
  printf 'short\n' > "$T/short.key"
  out=$("$P" --config="$T/fleet.yaml" --ticket-key-file "$T/short.key" --insecure --check 2>&1); rc=$?
  [ $rc -eq 1 ] && grep -q "ticket key file '$T/short.key': too short" <<<"$out" \
    && ok "router --check: short key file named" || bad "router short key: $rc $out"
  out=$("$P" --config="$T/fleet.yaml" --insecure --check); rc=$?
  [ $rc -eq 0 ] && grep -q 'ok' <<<"$out" && ok "router --config=FILE --check" || bad "router check: $rc $out"
  grep -q '^transfer tickets: off' <<<"$out" && ok "router --insecure without a key: tickets off" || bad "router insecure no key: $out"
  grep -q '^insecure: yes' <<<"$out" && ok "router --insecure shown by --check" || bad "router --insecure: $out"
  out=$("$P" --config="$T/fleet.yaml" --check 2>&1); rc=$?
  [ $rc -eq 1 ] && grep -qF 'no TLS certificate: set tls_cert/tls_key/tls_ca or pass --insecure to run plaintext' <<<"$out" \
    && ok "router --check without TLS keys nor --insecure refused" || bad "router no tls: $rc $out"
  { cat "$T/fleet.yaml"; echo 'insecure: true'; } > "$T/fleet2.yaml"
  out=$("$P" --config="$T/fleet2.yaml" --check); rc=$?
  [ $rc -eq 0 ] && grep -q '^insecure: yes' <<<"$out" && ok "router insecure: true (YAML)" || bad "router yaml insecure: $rc $out"
  { cat "$T/fleet.yaml"; echo 'insecure: maybe'; } > "$T/fleet3.yaml"
  out=$("$P" --config="$T/fleet3.yaml" --check 2>&1); rc=$?
  [ $rc -eq 1 ] && grep -q "key 'insecure': expected true or false" <<<"$out" && ok "router insecure: maybe refused" || bad "router yaml insecure maybe: $rc $out"
  ;;
esac
exit $fail
