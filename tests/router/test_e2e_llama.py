#!/usr/bin/env python3
"""tests/router/test_e2e_llama.py: a session switched across architectures, Qwen -> Llama -> Qwen.

kvld serving qwen3-a (Qwen3, q/k-norm, default RoPE) and kvld serving llama3-d (Llama, no q/k
norm, llama3 RoPE scaling) + kvlingo-router on loopback, the cascade policy between them:
turn 0 on qwen3-a, turn 1 escalated to llama3-d, turns 2-3 back on qwen3-a.  Each switch is
served by translation (the shipped qwen3-a <-> llama3-d translators when models/translators/ has
them, else stage-1 fits made here); every turn's greedy tokens equal an in-process replay of
the same steps (kvr_turn_ref); the ledger holds exactly the turns' tokens.
usage: test_e2e_llama.py --build BUILD_DIR --work WORK_DIR
"""
import argparse
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rtest  # noqa: E402
from rtest import check  # noqa: E402

QWEN, LLAMA = "qwen3-a", "llama3-d"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    fleet = rtest.Fleet(a.build, a.work, models=(QWEN, LLAMA),
                        policy={"name": "cascade", "models": [QWEN, LLAMA],
                                "entropy_threshold": 100, "calm_turns": 1},
                        guardrail={"shadow_fraction": 0.0, "kl_budget": 100})
    try:
        c = fleet.client()
        sid = c.create_session()
        plan = [({}, QWEN, "none"), ({"escalate": True}, LLAMA, "translate"),
                ({}, QWEN, "translate"), ({}, QWEN, "none")]
        steps, outs, ledger = [], [], []
        for i, (kw, want_model, want_mode) in enumerate(plan):
            text = rtest.corpus_text(0, 300) if i == 0 else rtest.corpus_text(2000 + 89 * i, 60)
            ids, out, s = c.send_all(sid, text, max_tokens=10, **kw)
            mode = rtest.MODES[s.switch_mode]
            print("turn %d: %s %s span=%d ttft=%.2fms tokens=%d fallback=%r" % (
                i, s.model, mode, s.span_tokens, s.ttft_seconds * 1e3, s.n_generated,
                s.fallback_reason))
            check(s.model == want_model, "turn %d answered by %s, expected %s" % (i, s.model, want_model))
            check(mode == want_mode, "turn %d switch mode %s, expected %s (%s)" % (
                i, mode, want_mode, s.fallback_reason))
            check(len(ids) == 10 and s.n_generated == 10, "turn %d: %d tokens" % (i, len(ids)))
            user = s.user_tokens
            toks = list(c.get_session(sid, include_tokens=True).tokens)
            check(toks[:len(ledger)] == ledger, "ledger prefix changed at turn %d" % i)
            check(toks[len(ledger) + user:] == ids, "ledger tail != streamed tokens at turn %d" % i)
            steps.append((s.model, "translate" if mode == "translate" else "none",
                          toks[len(ledger):len(ledger) + user]))
            ledger = toks
            outs.append(ids)
        # in-process replay of the same steps
        ref_in = os.path.join(a.work, "steps.txt")
        trdir = os.path.join(a.work, "translators")
        with open(ref_in, "w") as f:
            for m in (QWEN, LLAMA):
                f.write("model %s %s\n" % (m, os.path.join(rtest.SRC, "models", m)))
            for s_, d_ in ((QWEN, LLAMA), (LLAMA, QWEN)):
                f.write("translator %s %s %s\n" % (s_, d_, os.path.join(trdir, "%s_to_%s.safetensors" % (s_, d_))))
            for m, mode, user in steps:
                f.write("turn %s %s 10 %s\n" % (m, mode, ",".join(map(str, user))))
        ref = subprocess.run([os.path.join(a.build, "tests", "router", "kvr_turn_ref"), ref_in],
                             capture_output=True, text=True, check=True,
                             env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
        ref_outs = [list(map(int, l.split())) for l in ref.stdout.strip().split("\n")]
        check(len(ref_outs) == len(outs), "replay gave %d turns" % len(ref_outs))
        for i, (o, r) in enumerate(zip(outs, ref_outs)):
            check(o == r, "turn %d: router %s != in-process %s" % (i, o, r))
        print("  ok: Qwen -> Llama -> Qwen, %d turns identical to the in-process replay" % len(outs))
        check(fleet.router.alive(), "router died")
    finally:
        fleet.stop()
    print("test_e2e_llama: PASS")


if __name__ == "__main__":
    main()
