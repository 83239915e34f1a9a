#!/usr/bin/env bash
# `kvlingo model random` and `kvlingo translator random`: a random-weight model directory loads
# with the shape's geometry (f32 and bf16), the same seed writes the same bytes, a random
# translator names both models' hashes, kvld loads it for its target and skips it for a model of
# the same name but other weights, and `bench switch` runs on the directories; bad arguments fail
# naming the option.
set -uo pipefail
KVL=$1; SRC=$2
KVLD="$(dirname "$KVL")/daemon/kvld"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0
bad() { echo "FAIL $*"; fail=1; }
jget() { python3 -c "import json,sys; print(json.load(sys.stdin)[sys.argv[1]])" "$1"; }

"$KVL" model random --shape tiny --out "$T/tiny-a" >/dev/null || bad "model random tiny-a"
"$KVL" model random --shape tiny --out "$T/tiny-b" --seed 2 --dtype bf16 >/dev/null || bad "model random tiny-b"
mkdir -p "$T/again" "$T/other"
"$KVL" model random --shape tiny --out "$T/again/tiny-a" >/dev/null || bad "model random again"
cmp -s "$T/tiny-a/model.safetensors" "$T/again/tiny-a/model.safetensors" || bad "same seed, different weights file"
cmp -s "$T/tiny-a/config.json" "$T/again/tiny-a/config.json" || bad "same seed, different config.json"
# a folder that holds a model is not overwritten unless asked
out=$("$KVL" model random --shape tiny --out "$T/tiny-a" --seed 5 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "option --out: $T/tiny-a holds a model already" <<<"$out" \
  && cmp -s "$T/tiny-a/model.safetensors" "$T/again/tiny-a/model.safetensors" && echo "ok   an existing model is kept" \
  || bad "overwrote an existing model: $rc $out"
cp -r "$T/tiny-a" "$T/forced"
"$KVL" model random --shape tiny --out "$T/forced" --seed 5 --force >/dev/null \
  && ! cmp -s "$T/tiny-a/model.safetensors" "$T/forced/model.safetensors" || bad "--force did not replace"
info=$("$KVL" info --model "$T/tiny-a" --json) || bad "info tiny-a"
for kv in layers=2 hidden_size=64 heads=4 kv_heads=2 head_dim=32 intermediate_size=128 vocab_size=512 \
          dtype=float32 name=tiny-a; do
    [ "$(jget "${kv%%=*}" <<<"$info")" = "${kv#*=}" ] || bad "tiny-a ${kv%%=*}: $info"
done
[ "$(jget dtype <<<"$("$KVL" info --model "$T/tiny-b" --json)")" = bfloat16 ] || bad "tiny-b is not bf16"
ha=$(jget hash <<<"$info")
[ "$ha" = "$(jget hash <<<"$("$KVL" info --model "$T/again/tiny-a" --json)")" ] || bad "same seed, other hash"
hb=$(jget hash <<<"$("$KVL" info --model "$T/tiny-b" --json)")
"$KVL" generate --model "$T/tiny-a" --prompt-ids 1,2,3 --max-tokens 2 >/dev/null || bad "generate on tiny-a"

mkdir -p "$T/tr"
"$KVL" translator random --source "$T/tiny-a" --target "$T/tiny-b" --out "$T/tr/a_to_b.safetensors" >/dev/null \
    || bad "translator random"
ti=$("$KVL" translator info "$T/tr/a_to_b.safetensors" --json) || bad "translator info"
[ "$(jget source_hash <<<"$ti")" = "$ha" ] && [ "$(jget target_hash <<<"$ti")" = "$hb" ] \
    && [ "$(jget target_name <<<"$ti")" = tiny-b ] || bad "translator identity: $ti"

# bench switch on the directories, with the turn's new tokens and the pieces in JSON
out=$("$KVL" bench switch --source "$T/tiny-a" --target "$T/tiny-b" --lengths 16 --reps 1 --new-tokens 5 --json) \
    || bad "bench switch on dirs: $out"
[ "$(jget new_tokens <<<"$out")" = 5 ] && python3 -c "import json,sys; d=json.load(sys.stdin); \
    assert d['forward_ms'] > 0 and d['translate_ms'] > 0 and d['switch_ttft_ms'] >= d['forward_ms']" <<<"$out" \
    || bad "bench switch json: $out"

# kvld: loads the translator for tiny-b; a tiny-b of other weights (seed 9) skips it
if [ -x "$KVLD" ]; then
    "$KVL" model random --shape tiny --out "$T/other/tiny-b" --seed 9 >/dev/null || bad "model random other"
    mkdir -p "$T/alias" && ln -sfn "$T/tiny-b" "$T/alias/mymodel"   # tiny-b's weights under another name
    for m in "$T/tiny-b" "$T/other/tiny-b" "$T/alias/mymodel"; do
        log="$T/kvld-$(basename "$(dirname "$m")").log"
        "$KVLD" --model "$m" --translators "$T/tr" --listen 127.0.0.1:0 --insecure --warmup 1 >"$log" 2>&1 &
        pid=$!
        for _ in $(seq 100); do grep -qE "translator_(loaded|other_target|other_weights|other_name)|listening" "$log" && break; sleep 0.1; done
        sleep 0.3
        kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
        if [ "$m" = "$T/tiny-b" ]; then
            grep -q "msg=translator_loaded .*source=tiny-a target=tiny-b" "$log" || { cat "$log"; bad "kvld did not load the translator"; }
            grep -q "no_tokenizer" "$log" || bad "kvld without tokenizer.json: no warning"
        elif [ "$m" = "$T/alias/mymodel" ]; then
            grep -q "level=warn .*msg=translator_other_name .*target=tiny-b .*named 'mymodel' after its directory" "$log" \
                && ! grep -q "translator_loaded" "$log" \
                || { cat "$log"; bad "kvld named after another directory: no warning that the translator is the same model's"; }
        else
            # said as a warning naming both hashes, and that no translator is left
            grep -q "level=warn .*msg=translator_other_weights .*target=tiny-b" "$log" && ! grep -q "translator_loaded" "$log" \
                && grep -q "level=warn .*msg=no_translators" "$log" \
                || { cat "$log"; bad "kvld loaded a translator for other weights, or did not warn"; }
        fi
    done
fi

out=$("$KVL" model random --shape nosuch --out "$T/x" 2>&1) && bad "unknown shape accepted"
grep -q "unknown model shape 'nosuch'" <<<"$out" || bad "unknown shape message: $out"
out=$("$KVL" model random --shape tiny --out "$T/x" --dtype f16 2>&1) && bad "--dtype f16 accepted"
grep -q -- "--dtype must be f32 or bf16" <<<"$out" || bad "dtype message: $out"
[ ! -e "$T/x/config.json" ] || bad "a refused write left a config.json"
out=$("$KVL" translator random --source "$T/tiny-a" --target "$T/nosuch" --out "$T/y.safetensors" 2>&1) \
    && bad "translator random with a missing target accepted"
grep -q "target" <<<"$out" && grep -q "nosuch" <<<"$out" || bad "missing target message: $out"
out=$("$KVL" bench switch --source tiny --target tiny --new-tokens 0 2>&1) && bad "--new-tokens 0 accepted"
grep -q -- "--new-tokens" <<<"$out" || bad "--new-tokens 0 message: $out"
exit $fail
