#!/usr/bin/env bash
# `kvlingo translator train | eval | info`: stage 1 on a slice of the training text, a short
# stage 2 with a checkpoint and a resume, eval (text and --json keys, --turns, --store), info on
# the shipped translators, and bad input (wrong pair, corrupt file) with a clear message.
set -uo pipefail
KVL=$1; SRC=$2
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
fail=0
A="$SRC/models/qwen3-b"; B="$SRC/models/qwen3-a"; SLICE="$SRC/testdata/corpus/train_slice.txt"
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }

"$KVL" translator train --source "$A" --target "$B" --corpus "$SLICE" --out "$T/s1.safetensors" \
    --stage1-only --ridge-tokens 4096 2>"$T/log" && ok stage1 || { cat "$T/log"; bad stage1; }
"$KVL" translator train --source "$A" --target "$B" --corpus "$SLICE" --out "$T/s2.safetensors" \
    --init "$T/s1.safetensors" --steps 4 --batch 2 --prefix-min 16 --prefix-max 48 --cont-len 16 \
    --checkpoint "$T/ck.safetensors" --checkpoint-every 2 2>"$T/log" && grep -q "step 4/4" "$T/log" \
    && ok stage2 || { cat "$T/log"; bad stage2; }
"$KVL" translator train --source "$A" --target "$B" --corpus "$SLICE" --out "$T/s2r.safetensors" \
    --init "$T/s1.safetensors" --steps 6 --batch 2 --prefix-min 16 --prefix-max 48 --cont-len 16 \
    --resume "$T/ck.safetensors" 2>"$T/log" && grep -q "step 6/6" "$T/log" && ! grep -q "step 1/6" "$T/log" \
    && ok resume || { cat "$T/log"; bad resume; }
# a checkpoint resumes only its own run: another --batch draws other samples
out=$("$KVL" translator train --source "$A" --target "$B" --corpus "$SLICE" --out "$T/s2x.safetensors" \
      --init "$T/s1.safetensors" --steps 8 --batch 4 --prefix-min 16 --prefix-max 48 --cont-len 16 \
      --resume "$T/ck.safetensors" 2>&1); rc=$?
[ $rc -ne 0 ] && [ ! -e "$T/s2x.safetensors" ] && grep -q "sampling is batch 2," <<<"$out" \
    && ok "resume with another --batch refused" || bad "resume with another batch: rc $rc: $out"
out=$("$KVL" translator eval --translator "$T/s2.safetensors" --source "$A" --target "$B" \
      --text-file "$SRC/testdata/corpus/valid.txt" --prefix-len 32 --cont-len 8 --samples 3 --json 2>&1)
for k in kl ppl_native ppl_translated ppl_no_context top1_agreement context_gain_recovered k_rel_err v_rel_err; do
  grep -q "\"$k\"" <<<"$out" || { bad "eval json lacks $k: $out"; }
done
ok "eval json"
out=$("$KVL" translator eval --translator "$T/s2.safetensors" --source "$A" --target "$B" \
      --text-file "$SRC/testdata/corpus/valid.txt" --prefix-len 32 --cont-len 8 --samples 2 \
      --turns 4 --turn-len 8 --sessions 2 --store eval 2>&1)
[ "$(grep -cE '^ +[0-3] +(source|target)' <<<"$out")" = 4 ] && ok turns || bad "turns: $out"
"$KVL" translator info "$T/s2.safetensors" | grep -qE '^  final +[0-9.]+ ' && ok "info shows stored eval" || bad "info eval"
# --store writes the file again in the dtype it had: a bf16 translator stays bf16
"$KVL" translator train --source "$A" --target "$B" --corpus "$SLICE" --out "$T/s1b.safetensors" \
    --stage1-only --ridge-tokens 4096 --bf16 2>/dev/null || bad "stage1 --bf16"
sz0=$(stat -c %s "$T/s1b.safetensors")
"$KVL" translator eval --translator "$T/s1b.safetensors" --source "$A" --target "$B" \
    --text-file "$SRC/testdata/corpus/valid.txt" --prefix-len 32 --cont-len 8 --samples 2 --store ev >/dev/null 2>&1 \
  && sz1=$(stat -c %s "$T/s1b.safetensors") && [ "$sz1" -lt $((sz0 * 3 / 2)) ] \
  && ok "eval --store keeps a bf16 file bf16 ($sz0 -> $sz1 bytes)" || bad "bf16 after --store: $sz0 -> ${sz1:-?}"
"$KVL" translator info "$T/s2.safetensors" | grep -qE '^ +1 +4 +2 ' && ok "info lists the training run" || bad "info run"
"$KVL" translator info "$T/s2.safetensors" --json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["eval"]["samples"] == 2 and d["training"]["steps"] == 4' \
    && ok "info json" || bad "info json"
# multi-layer maps: qwen3-b (6 layers) -> qwen3-a (4): target layer 1 sits at source depth 5/3,
# so its two taps are source layers 1 and 2
"$KVL" translator train --source "$A" --target "$B" --corpus "$SLICE" --out "$T/t2.safetensors" \
    --stage1-only --ridge-tokens 4096 --taps 2 2>"$T/log" && grep -q "layer 1 <- source layer 1+2" "$T/log" \
    && ok "stage1 --taps 2" || { cat "$T/log"; bad "stage1 --taps 2"; }
"$KVL" translator info "$T/t2.safetensors" | grep -q "of \[64, 256\]; layer map (target <- source): 0<-0+1 1<-1+2 2<-3+4 3<-4+5" \
    && ok "info shows the taps" || { "$KVL" translator info "$T/t2.safetensors"; bad "info taps"; }
out=$("$KVL" translator train --source "$A" --target "$B" --corpus "$SLICE" --out "$T/t3.safetensors" \
      --init "$T/t2.safetensors" --taps 3 --steps 1 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "has 2 tap" <<<"$out" && ok "--taps against --init refused" || bad "taps vs init: $out"
# bad input
out=$("$KVL" translator eval --translator "$T/s2.safetensors" --source "$B" --target "$A" \
      --text-file "$SRC/testdata/corpus/valid.txt" --samples 1 2>&1); rc=$?
[ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -q "geometry" <<<"$out" && ok "wrong pair" || bad "wrong pair: $out"
head -c 100 "$T/s2.safetensors" > "$T/cut.safetensors"
out=$("$KVL" translator info "$T/cut.safetensors" 2>&1); rc=$?
[ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -q "cut.safetensors" <<<"$out" && ok "corrupt file" || bad "corrupt: $out"
# the shipped translators load and name their pair
for f in "$SRC"/models/translators/*.safetensors; do
  [ -e "$f" ] || continue
  info=$("$KVL" translator info "$f")
  grep -qE '^  final +[0-9.]+ ' <<<"$info" && grep -q 'worst ' <<<"$info" && ! grep -q '{' <<<"$info" \
    && ok "info $(basename "$f")" || bad "info $f: $info"
done
# every ordered pair of the shipped models has a shipped translator with its stored figures
for s in qwen3-a qwen3-b qwen2-c; do
  for d in qwen3-a qwen3-b qwen2-c; do
    [ "$s" = "$d" ] && continue
    f="$SRC/models/translators/${s}_to_${d}.safetensors"
    "$KVL" translator info "$f" --json 2>/dev/null | python3 -c '
import json, sys; d = json.load(sys.stdin); s, t = sys.argv[1:3]
assert d["source_name"] == s and d["target_name"] == t
assert d["eval"]["samples"] == 200 and d["eval"]["prefix_len"] == 256 and d["eval"]["cont_len"] == 64
assert max(x["ratio"] for x in d["eval_multiturn"]["turns"]) <= 1.05
assert d["eval"]["context_gain_recovered"] >= 0.85, d["eval"]["context_gain_recovered"]' "$s" "$d" \
      && ok "shipped $s -> $d: 200-sample eval recovers >= 0.85 of the context gain, multi-turn within 5%" \
      || bad "shipped translator $f"
  done
done
# the Qwen <-> Llama pair: >= 0.85 of the context gain where llama3-d uses its context (prefix
# 128; at prefix 256 llama3-d gains nothing from its context, so the ratio is undefined there)
for pr in "qwen3-a llama3-d" "llama3-d qwen3-a"; do
  set -- $pr
  f="$SRC/models/translators/${1}_to_${2}.safetensors"
  "$KVL" translator info "$f" --json 2>/dev/null | python3 -c '
import json, sys; d = json.load(sys.stdin); s, t = sys.argv[1:3]
assert d["source_name"] == s and d["target_name"] == t
e = d["eval_prefix128"]
assert e["samples"] == 200 and e["prefix_len"] == 128 and e["context_gain_recovered"] >= 0.85, e
if t == "qwen3-a": assert d["eval"]["context_gain_recovered"] >= 0.85, d["eval"]
assert max(x["ratio"] for x in d["eval_multiturn"]["turns"]) <= 1.05' "$1" "$2" \
    && ok "shipped $1 -> $2: >= 0.85 of the context gain, multi-turn within 5%" || bad "shipped translator $f"
done
exit $fail
