#!/usr/bin/env python3
"""scripts/demo.py: the main job's end-to-end run.

Starts kvld for models/qwen3-a and models/qwen3-b and kvlingo-router (cascade policy) on
loopback, runs a scripted 6-turn conversation from testdata/corpus/valid.txt that moves between
the models (the cascade escalates on a request flag, steps down after calm turns), prints one
line per turn with where a switch's time to first token went (export, transfer, translate,
forward), then compares each switch's time to first token with a re-prefill of the same
context on the same node, timed the same way (a real turn with force_reprefill, router clock),
and stops everything it started.

Translators: the trained ones in models/translators/ when present, else stage-1 (ridge) fits
made on the spot (a few seconds).
usage: demo.py --build BUILD_DIR [--work DIR] [--max-tokens N]
"""
import argparse
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "router"))
import rtest  # noqa: E402

MODE = {0: "none", 1: "translate", 2: "re-prefill"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", default=None)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--device", default="cpu", help="kvld compute backend: cpu, cuda or cuda:N")
    a = ap.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="kvlingo-demo-")
    if a.work and os.path.isdir(a.work) and os.listdir(a.work):
        raise SystemExit("--work %s is not empty: give a new or empty directory" % a.work)
    text = rtest.corpus_text(0, 6000)
    # six user turns: consecutive sentences of the validation text
    sents, cur = [], ""
    for ch in text:
        cur += ch
        if ch in ".!?" and len(cur) > 60:
            sents.append(cur)
            cur = ""
    turns = [" ".join(sents[0:3])] + sents[3:8]
    escalate = [False, True, False, False, False, True]

    print("kvlingo demo: kvld qwen3-a + kvld qwen3-b (device %s) + kvlingo-router (cascade) on "
          "loopback; work dir %s" % (a.device, work))
    print("  plaintext gRPC (--insecure, loopback only); a deployment runs TLS with mutual TLS "
          "between fleet members (deploy/README.md)")
    fleet = rtest.Fleet(a.build, work,
                        policy={"name": "cascade", "models": ["qwen3-a", "qwen3-b"],
                                "entropy_threshold": 6.0, "calm_turns": 2},
                        guardrail={"shadow_fraction": 0.0, "kl_budget": 1.0},
                        kvld_args=("--device", a.device), peers=True)
    try:
        c = fleet.client()
        ln = c.list_nodes()
        for n in ln.nodes:
            print("  node %s %s at %s, translators from: %s" % (
                n.name, n.model, n.address, ", ".join(n.translators_from) or "-"))
        sid = c.create_session()
        print("session %s\n" % sid)
        print("%-4s %-8s %-10s %-12s %6s %9s %7s  %s" % (
            "turn", "model", "switch", "from", "span", "TTFT ms", "tokens", "text"))
        rows = []
        for i, (t, esc) in enumerate(zip(turns, escalate)):
            # every turn generates max_tokens: these small models often answer a document's
            # sentences with EOS at once, and a turn of one EOS shows nothing (clients stop at
            # EOS by default; the demo asks not to, and says so below)
            ids, out, s = c.send_all(sid, t, max_tokens=a.max_tokens, escalate=esc,
                                     compare_reprefill=True, ignore_eos=True)
            rows.append(s)
            print("%-4d %-8s %-10s %-12s %6d %9.2f %7d  %r" % (
                i + 1, s.model, MODE[s.switch_mode], s.from_model or "-", s.span_tokens,
                s.ttft_seconds * 1e3, s.n_generated, (out[:48] + "...") if len(out) > 48 else out))
            if s.fallback_reason:
                print("     fallback: %s" % s.fallback_reason)
            if s.pushed_ahead_tokens:
                print("     pushed ahead: %d tokens were shipped and translated right after the previous "
                      "turn; the span column counts only the tokens beyond them" % s.pushed_ahead_tokens)
        sw = [s for s in rows if s.from_model]
        # the comparison: each switched turn again as a forced re-prefill, a real turn on the same
        # (now warm) node with as many context and input tokens, timed by the same router clock
        g = c.get_session(sid, include_tokens=True)
        toks = list(g.tokens)
        ref = {}
        for s in rows:
            n_ctx = s.context_tokens - s.n_generated - s.user_tokens
            if s.from_model:
                sid_r = c.create_session()
                c.send_all(sid_r, tokens=toks[:n_ctx - 1], max_tokens=1, model=s.from_model)
                _, _, r = c.send_all(sid_r, tokens=toks[n_ctx:n_ctx + s.user_tokens], max_tokens=1,
                                     model=s.model, force_reprefill=True)
                ref[s.turn] = r.ttft_seconds
                c.close_session(sid_r)
        print("(each turn generates %d tokens: the demo sets ignore_eos, since these small models "
              "often end a document's sentence with EOS at once; clients stop at EOS by default.  "
              "span: tokens shipped and translated on a translated turn, tokens prefilled on the "
              "others)" % a.max_tokens)
        print("\nswitches: %d (translated %d); context %d tokens at the end" % (
            len(sw), sum(s.switch_mode == 1 for s in sw), rows[-1].context_tokens))
        print("\n%-4s %-20s %8s %12s %14s %7s %10s   %s" % (
            "turn", "switch", "context", "switch TTFT", "re-prefill TTFT", "ratio", "KL nats",
            "phases (ms): export transfer translate forward"))
        for s in sw:
            rp = ref[s.turn]
            ratio = rp / s.ttft_seconds if s.ttft_seconds > 0 else 0
            print("%-4d %-20s %8d %9.2f ms %11.2f ms %6.1fx %10s   %6.2f %8.2f %9.2f %7.2f" % (
                s.turn + 1, "%s->%s %s" % (s.from_model, s.model, "T" if s.switch_mode == 1 else "P"),
                s.context_tokens - s.n_generated, s.ttft_seconds * 1e3, rp * 1e3, ratio,
                "%.4f" % s.shadow_kl if s.switch_mode == 1 else "-", s.export_seconds * 1e3,
                s.transfer_seconds * 1e3, s.translate_seconds * 1e3, s.forward_seconds * 1e3))
        pushed = any(s.pushed_ahead_tokens for s in sw)
        print("(context: the tokens the target holds for the turn before generating.  %s the "
              "cascade ships the span after a turn when it can foresee the next model, and whether "
              "that lands before the next turn varies from run to run.)" % (
                  "A switch the router pushed ahead (span 0 above) shows export, transfer and "
                  "translate phases of 0:" if pushed else "No switch of this run was pushed ahead:"))
        print("(T: translated span; P: re-prefill.  Re-prefill TTFT: the same turn again, forced to "
              "re-prefill, on the same node after the run, measured by the router like the switch; "
              "ratio = re-prefill TTFT / switch TTFT, above 1 the switch is faster.  "
              "KL(native||translated) of the first token.  Phases: the source reading its cache, the "
              "wire, translate-apply, the target's queue + forward to the first token; the rest of "
              "the TTFT is RPC and router time.)")
        c.close_session(sid)
    finally:
        fleet.stop()
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)   # logs kept only with --work
    print("demo: stopped kvld x2 and kvlingo-router")
    return 0


if __name__ == "__main__":
    sys.exit(main())
