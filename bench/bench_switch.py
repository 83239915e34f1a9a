#!/usr/bin/env python3
"""bench/bench_switch.py: switch TTFT vs re-prefill TTFT through the whole stack
(Python client -> kvlingo-router -> kvld nodes, loopback).

For each context length C and each repeat: a fresh session reads C tokens of
testdata/corpus/valid.txt on the source model (one generated token), then the client asks the
target model for the next turn (--new-tokens input tokens, default 8; one generated token):
  switch     the router ships the source's KV span and the target translates it (TRANSLATE);
  re-prefill the same turn with force_reprefill: the target re-reads all C+8 tokens.
Both include the target's forward pass over the turn's new tokens (and the source's last sampled
token, which it never ran): that pass bounds the ratio at short contexts.
TTFT is measured by the client (request sent -> first token received) and by the router (its
summary); medians of the repeats, ratio = re-prefill / switch.
usage: bench_switch.py --build BUILD_DIR [--contexts 64,512,2048] [--repeats 5]
                       [--pairs qwen3-a:qwen3-b,qwen3-b:qwen3-a] [--threads 1]
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "router"))
import rtest  # noqa: E402


def client_turn(c, sid, **kw):
    """One Send; returns (client TTFT s, summary)."""
    req = c.pb.SendRequest(session_id=sid, **kw)
    t0 = time.perf_counter()
    ttft, summary = None, None
    for m in c.stub.Send(req, timeout=300, metadata=c.metadata):
        if ttft is None and not m.HasField("summary"):
            ttft = time.perf_counter() - t0
        if m.HasField("summary"):
            summary = m.summary
    return ttft, summary


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--contexts", default="64,512,2048")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--pairs", default="qwen3-a:qwen3-b,qwen3-b:qwen3-a")
    ap.add_argument("--threads", type=int, default=1, help="OPENBLAS_NUM_THREADS of the nodes")
    ap.add_argument("--new-tokens", type=int, default=8, help="input tokens of the switched turn")
    ap.add_argument("--work", default=None)
    a = ap.parse_args()
    os.environ["OPENBLAS_NUM_THREADS"] = str(a.threads)
    work = a.work or tempfile.mkdtemp(prefix="kvlingo-bench-")
    if a.work and os.path.isdir(a.work) and os.listdir(a.work):
        raise SystemExit("--work %s is not empty: give a new or empty directory" % a.work)
    contexts = [int(x) for x in a.contexts.split(",")]
    pairs = [tuple(p.split(":")) for p in a.pairs.split(",")]
    fleet = rtest.Fleet(a.build, work, policy={"name": "pinned"},
                        guardrail={"shadow_fraction": 0.0})
    try:
        c = fleet.client(timeout=300)
        import kvlingo.v1.router_pb2  # noqa: F401  (stubs loaded by the client)
        # the prompt: the corpus, tokenized by the router's tokenizer through a throwaway turn
        sid = c.create_session()
        g_ids, _, _ = c.send_all(sid, rtest.corpus_text(0, 12000), max_tokens=1,
                                 model=pairs[0][0])
        corpus = list(c.get_session(sid, include_tokens=True).tokens)[:-1]
        c.close_session(sid)
        user = corpus[2100:2100 + a.new_tokens]
        print("bench_switch: client -> kvlingo-router -> kvld x2 on loopback; OPENBLAS_NUM_THREADS=%d; "
              "median of %d repeats; %d new tokens per switched turn" % (a.threads, a.repeats, a.new_tokens))
        for src, dst in pairs:
            print("\n%s -> %s" % (src, dst))
            print("%8s | %12s %12s %8s | %12s %12s %8s | %7s %10s" % (
                "context", "switch", "re-prefill", "ratio", "switch*", "re-prefill*", "ratio*", "span",
                "export*"))
            for ctx in contexts:
                prompt = corpus[:ctx]
                res = {"t": [], "p": [], "tr": [], "pr": [], "x": []}
                span = 0
                for r in range(a.repeats + 1):     # the first repeat warms up both paths
                    for mode in ("t", "p"):
                        sid = c.create_session()
                        c.send_all(sid, tokens=prompt, max_tokens=1, model=src)
                        ttft, s = client_turn(c, sid, tokens=user, max_tokens=1, model=dst,
                                              force_reprefill=(mode == "p"))
                        want = 1 if mode == "t" else 2
                        if s.switch_mode != want:
                            raise SystemExit("unexpected switch mode %d (%s)" % (s.switch_mode, s.fallback_reason))
                        if r > 0:
                            res[mode].append(ttft)
                            res[mode + "r"].append(s.ttft_seconds)
                            if mode == "t":
                                res["x"].append(s.switch_seconds)
                        if mode == "t":
                            span = s.span_tokens
                        c.close_session(sid)
                mt, mp = statistics.median(res["t"]), statistics.median(res["p"])
                rt, rp = statistics.median(res["tr"]), statistics.median(res["pr"])
                print("%8d | %9.2f ms %9.2f ms %7.1fx | %9.2f ms %9.2f ms %7.1fx | %7d %7.2f ms" % (
                    ctx, mt * 1e3, mp * 1e3, mp / mt, rt * 1e3, rp * 1e3, rp / rt, span,
                    statistics.median(res["x"]) * 1e3))
        print("\n(columns: client-measured TTFT; * = router-measured TTFT from its turn summary; "
              "span = tokens shipped and translated; export* = the router's ExportSpan call: read, "
              "ship, translate on the target; the rest of a switch's TTFT is the target's forward "
              "pass over the turn's new tokens)")
    finally:
        fleet.stop()
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)   # logs kept only with --work


if __name__ == "__main__":
    main()
