#!/usr/bin/env python3
"""bench/bench_openai.py: TTFT overhead of the router's OpenAI HTTP front door over gRPC Send
(Python clients -> kvlingo-router -> kvld, loopback, warm fleet).

For each repeat, the same prompt (--prompt-chars of testdata/corpus/valid.txt, one model,
greedy, --max-tokens) as a fresh session through three doors, interleaved:
  grpc Send            CreateSession first (not timed), then Send: request -> first token;
  grpc Create+Send     the same, CreateSession included (the HTTP door creates its session
                       inside the request);
  http /v1/completions stream: true on a kept-alive connection: request -> first data event
                       (the headers and the first event go out at the first token).
Each TTFT is measured by the client and by the router (its turn TTFT: the TurnSummary, or the
`kvlingo.ttft_ms` of the HTTP usage chunk); client - router is what the door and the client
add.  Medians of the repeats; the front-door overhead is the HTTP door's median client-minus-
router time less gRPC Send's.  The load average before and after says how busy the machine was.
usage: bench_openai.py --build BUILD_DIR [--repeats 50] [--prompt-chars 400] [--max-tokens 2]
"""
import argparse
import http.client
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "router"))
import rtest  # noqa: E402


def grpc_turn(c, prompt, model, max_tokens, time_create):
    t0 = time.perf_counter()
    sid = c.create_session()
    if not time_create:
        t0 = time.perf_counter()
    ttft, summary = None, None
    for m in c.stub.Send(c.pb.SendRequest(session_id=sid, text=prompt, model=model, max_tokens=max_tokens,
                                          temperature=0), timeout=120, metadata=c.metadata):
        if m.HasField("summary"):
            summary = m.summary
        elif ttft is None:
            ttft = time.perf_counter() - t0
    c.close_session(sid)
    return ttft, summary.ttft_seconds


def http_turn(conn, prompt, model, max_tokens):
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError("HTTP %d: %s" % (r.status, r.read()[:300]))
    ttft, router_ttft = None, None
    for line in r:
        if not line.startswith(b"data: "):
            continue
        if ttft is None:
            ttft = time.perf_counter() - t0
        if line.startswith(b"data: [DONE]"):
            continue
        j = json.loads(line[6:])
        if j.get("usage"):
            router_ttft = j["kvlingo"]["ttft_ms"] / 1e3
    r.read()
    return ttft, router_ttft


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--prompt-chars", type=int, default=400)
    ap.add_argument("--max-tokens", type=int, default=2)
    ap.add_argument("--model", default="qwen3-a")
    ap.add_argument("--threads", type=int, default=1, help="OPENBLAS_NUM_THREADS of the nodes")
    ap.add_argument("--work", default=None)
    a = ap.parse_args()
    os.environ["OPENBLAS_NUM_THREADS"] = str(a.threads)
    work = a.work or tempfile.mkdtemp(prefix="kvlingo-bench-openai-")
    port = rtest.free_port()
    load0 = os.getloadavg()
    fleet = rtest.Fleet(a.build, work, policy={"name": "pinned", "default_model": a.model},
                        guardrail={"shadow_fraction": 0.0}, translators=False,
                        extra_top={"http_listen": "127.0.0.1:%d" % port})
    try:
        c = fleet.client()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        prompt = rtest.corpus_text(0, a.prompt_chars)
        for _ in range(5):   # warm: caches, connections, thread pools
            grpc_turn(c, prompt, a.model, a.max_tokens, False)
            http_turn(conn, prompt, a.model, a.max_tokens)
        res = {"grpc Send": [], "grpc Create+Send": [], "http /v1/completions": []}
        for _ in range(a.repeats):
            res["grpc Send"].append(grpc_turn(c, prompt, a.model, a.max_tokens, False))
            res["grpc Create+Send"].append(grpc_turn(c, prompt, a.model, a.max_tokens, True))
            res["http /v1/completions"].append(http_turn(conn, prompt, a.model, a.max_tokens))
        load1 = os.getloadavg()
    finally:
        fleet.stop()
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)
    med = {k: (statistics.median(x[0] for x in v) * 1e3, statistics.median(x[1] for x in v) * 1e3,
               statistics.median((x[0] - x[1]) for x in v) * 1e3) for k, v in res.items()}
    print("OpenAI front door vs gRPC Send: model %s, %d-char prompt, %d repeats, loopback, %d CPUs"
          % (a.model, a.prompt_chars, a.repeats, os.cpu_count()))
    print("load average (1/5/15 min): before %.2f %.2f %.2f, after %.2f %.2f %.2f" % (load0 + load1))
    print()
    print("| door | client TTFT ms | router turn TTFT ms | client - router ms |")
    print("|---|---|---|---|")
    for k, (ct, rt, d) in med.items():
        print("| %s | %.3f | %.3f | %.3f |" % (k, ct, rt, d))
    over = med["http /v1/completions"][2] - med["grpc Send"][2]
    over_c = med["http /v1/completions"][2] - med["grpc Create+Send"][2]
    print()
    print("front-door TTFT overhead over gRPC Send: %.3f ms (over Create+Send: %.3f ms); goal < 0.5 ms: %s"
          % (over, over_c, "met" if over < 0.5 else "NOT met"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
