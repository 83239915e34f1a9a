#!/usr/bin/env python3
"""bench/bench_switch.py: switch TTFT vs re-prefill TTFT through the whole stack
(client -> kvlingo-router -> kvld nodes, loopback; the client is Python's grpcio or, with
--client c, bench_send).

For each context length C and each repeat: a fresh session reads C tokens of
testdata/corpus/valid.txt on the source model (one generated token), then the client asks the
target model for the next turn (--new-tokens input tokens, default 8; one generated token):
  switch     the router ships the source's KV span and the target translates it (TRANSLATE);
  re-prefill the same turn with force_reprefill: the target re-reads all C+1+8 tokens.
Both include the target's forward pass over the turn's new tokens and the source's last sampled
token, which the source never ran (9 tokens): that pass bounds the ratio at short contexts.
TTFT is measured by the client (request sent -> first token received) and by the router (its
summary); medians of the repeats (after one warm-up), ratio = re-prefill / switch.

In the same run (unless --no-pieces), the switch's pieces: `kvlingo bench switch --json
--new-tokens 9` on the same pair, lengths and OPENBLAS_NUM_THREADS (in-process translate and
forward; one run of it in each timed repeat, between the repeat's switch and its re-prefill,
so both sides of `stack / sum` come from the same minutes of a host whose speed drifts; all
before the fleet starts with --shapes, whose models hold GBs each, or --pieces-before), and
the wire time the nodes log for each switch (the target's ContinueTurn transfer_ms, the
source's ExportSpan transfer_ms), so `stack / sum` shows what the RPCs, the router and the
client add (the in-process translate includes reading the span from the source's cache, as
the export does).

--cold: the first switch of a freshly started fleet (a new fleet per repeat, --cold-repeats),
against a re-prefill that is the first turn on the target of another fresh fleet.

--shapes SRC:DST[,...]: random-weight models of published geometries (kvlingo/shapes.h, e.g.
qwen2.5-0.5b:qwen2.5-1.5b) made for the run with `kvlingo model random` (--dtype f32|bf16) and
random translators (`kvlingo translator random`); the nodes serve them without a tokenizer
(token ids only), the router tokenizes with the Qwen tokenizer (testdata/tokenizers/qwen3).

usage: bench_switch.py --build BUILD_DIR [--contexts 64,512,2048] [--repeats 5]
                       [--pairs qwen3-a:qwen3-b,qwen3-b:qwen3-a | --shapes A:B[,...] [--dtype f32]]
                       [--threads 1] [--cold [--cold-repeats 3]] [--no-pieces | --pieces-before]
                       [--work DIR] [--push-ahead] [--kvld-args "--span-push 0"] [--client python|c]

--client c: the timed turns go through build/bench_send (bench/bench_send.c), a C client on
the rpc layer kvlingo's processes use, over one channel connected before the first turn; the
client-measured TTFT then holds the router, the nodes and their legs without grpcio's own
per-call work (sessions and source turns still go through the Python client).

--push-ahead: instead, the switch after a push-ahead (router/push_ahead.h): the source turn
carries SendRequest.prefetch_model = the target's model, the bench waits until the router has
shipped the span in the background (GetSession: the target holds it), then times the switch,
which ships 0 tokens; against the plain translated switch and re-prefill of the same turn.  The
"at once" column sends the switched turn as soon as the source turn ends, as a program driving
the session would: the push may still be running, and the turn waits for it.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(SRC, "tests", "router"))
import rtest  # noqa: E402


class CSend:
    """Send over build/bench_send (bench/bench_send.c), a C client of the router on one
    long-lived channel (--client c): the request built and the summary read with the generated
    Python protobuf classes, the call and its timing in C."""

    def __init__(self, build, fleet, pb):
        self.pb = pb
        env = dict(os.environ, KVL_API_KEY=fleet.default_key or "")
        self.proc = subprocess.Popen([os.path.join(build, "bench_send"), "--router", fleet.addr]
                                     + fleet.cli_security(), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)

    def turn(self, sid, **kw):
        """One Send through bench_send: (client TTFT s, TurnSummary); SystemExit when the call
        fails or bench_send is gone (its exit status said)."""
        req = self.pb.SendRequest(session_id=sid, **kw)
        try:
            self.proc.stdin.write(req.SerializeToString().hex() + "\n")
            self.proc.stdin.flush()
            ln = self.proc.stdout.readline()
        except BrokenPipeError:
            ln = ""
        if not ln:
            raise SystemExit("bench_send exited with %s (its message is above)" % self.proc.wait())
        kind, a, rest = (ln.rstrip("\n").split(" ", 2) + [""])[:3]
        if kind != "ok" or not rest:
            raise SystemExit("Send (bench_send): %s" % ln.strip())
        return float(a), self.pb.SendResponse.FromString(bytes.fromhex(rest)).summary

    def close(self):
        """End bench_send (its stdin closed; killed when it is still in a call 5 s later)."""
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


def require_client(a):
    """Refuse --client c before any work when build/bench_send is missing."""
    if a.client == "c" and not os.path.exists(os.path.join(a.build, "bench_send")):
        raise SystemExit("--client c: %s/bench_send is not built (cmake --build %s --target bench_send; it "
                         "needs the server components)" % (a.build, a.build))


def bench_client(a, fleet):
    """The fleet's Python client (sessions, source turns); with --client c its timed turns
    (client_turn) go through bench_send."""
    c = fleet.client(timeout=600)
    c.csend = CSend(a.build, fleet, c.pb) if a.client == "c" else None
    return c


def close_client(c):
    """End what bench_client started beside the Python client (None: nothing)."""
    if c is not None and getattr(c, "csend", None):
        c.csend.close()


def client_turn(c, sid, **kw):
    """One Send; returns (client TTFT s, summary)."""
    if getattr(c, "csend", None):
        return c.csend.turn(sid, **kw)
    req = c.pb.SendRequest(session_id=sid, **kw)
    t0 = time.perf_counter()
    ttft, summary = None, None
    for m in c.stub.Send(req, timeout=600, metadata=c.metadata):
        if ttft is None and not m.HasField("summary"):
            ttft = time.perf_counter() - t0
        if m.HasField("summary"):
            summary = m.summary
    return ttft, summary


def med(v):
    return statistics.median(v) if v else float("nan")


class LogTail:
    """New lines of a node's log since the last call (the node writes a line per request)."""

    def __init__(self, path):
        self.path, self.off = path, 0

    def skip(self):
        self.off = os.path.getsize(self.path) if os.path.exists(self.path) else 0

    def read(self):
        with open(self.path, errors="replace") as f:
            f.seek(self.off)
            text = f.read()
            self.off = f.tell()
        return text.splitlines()


def span_times(tail, method, sid, keys, wait_s=2.0):
    """{key: value (ms)} of `method`'s request line for session sid among the new log lines
    (None for each key when the line did not come within wait_s)."""
    t0 = time.time()
    seen = []
    while True:
        seen += tail.read()
        for ln in seen:
            if "method=%s" % method in ln and sid in ln:
                vals = {}
                for k in keys:
                    m = re.search(r"\b%s=([0-9.]+)" % k, ln)
                    vals[k] = float(m.group(1)) if m else None
                return vals
        if time.time() - t0 > wait_s:
            return {k: None for k in keys}
        time.sleep(0.02)


def config_vocab(d):
    with open(os.path.join(d, "config.json")) as f:
        return int(json.load(f)["vocab_size"])


def make_shapes(build, pairs, work, dtype, env):
    """Model dirs and translators for --shapes: {name: dir}, translators dir."""
    kvl = os.path.join(build, "kvlingo")
    mdir, trdir = os.path.join(work, "models"), os.path.join(work, "translators")
    os.makedirs(mdir, exist_ok=True)
    os.makedirs(trdir, exist_ok=True)
    dirs = {}
    for i, name in enumerate(dict.fromkeys([m for p in pairs for m in p])):
        dirs[name] = os.path.join(mdir, name)
        t0 = time.time()
        subprocess.run([kvl, "model", "random", "--force", "--shape", name, "--out", dirs[name], "--dtype", dtype,
                        "--seed", str(i + 1)], check=True, stdout=subprocess.DEVNULL, env=env)
        print("bench_switch: made %s (%s) in %.0f s" % (dirs[name], dtype, time.time() - t0), flush=True)
    for s, d in pairs:
        subprocess.run([kvl, "translator", "random", "--source", dirs[s], "--target", dirs[d], "--out",
                        os.path.join(trdir, "%s_to_%s.safetensors" % (s, d))], check=True,
                       stdout=subprocess.DEVNULL, env=env)
    return dirs


def pieces(build, src_dir, dst_dir, contexts, reps, new_tokens, env):
    """`kvlingo bench switch --json` rows by context length."""
    out = subprocess.run([os.path.join(build, "kvlingo"), "bench", "switch", "--json", "--source", src_dir,
                          "--target", dst_dir, "--lengths", ",".join(map(str, contexts)), "--reps",
                          str(reps), "--new-tokens", str(new_tokens)], check=True, capture_output=True,
                         text=True, env=env).stdout
    rows = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
    return {int(r["tokens"]): r for r in rows}


def new_fleet(a, work, models, dirs, pairs, tokenizer):
    return rtest.Fleet(a.build, work, models=models, policy={"name": "pinned"},
                       guardrail={"shadow_fraction": 0.0}, model_dirs=dirs, pairs=pairs,
                       tokenizer=tokenizer, start_timeout=600.0 if dirs else 30.0,
                       kvld_args=tuple(a.kvld_args.split()))


def run_pair_warm(fleet, c, src, dst, contexts, corpus, user, repeats, piece=None):
    """Warm switch / re-prefill per context: dict ctx -> measurements.  piece(ctx), when given,
    runs the in-process pieces once per timed repeat (not the warm-up), between its switch and
    its re-prefill, so that both are measured in the same minutes of a host whose speed drifts."""
    tails = {m: LogTail(fleet.nodes[m].log_path) for m in (src, dst)}
    out = {}
    for ctx in contexts:
        prompt = corpus[:ctx]
        res = {"t": [], "p": [], "tr": [], "pr": [], "x": [], "recv": [], "ntr": [], "xfer": [],
               "nttft": [], "pieces": []}
        span = 0
        for r in range(repeats + 1):     # the first repeat warms up both paths
            for mode in ("t", "p"):
                if mode == "p" and piece and r > 0:
                    res["pieces"].append(piece(ctx))
                sid = c.create_session()
                c.send_all(sid, tokens=prompt, max_tokens=1, model=src)
                for t in tails.values():
                    t.skip()
                ttft, s = client_turn(c, sid, tokens=user, max_tokens=1, model=dst,
                                      force_reprefill=(mode == "p"), ignore_eos=True)
                want = 1 if mode == "t" else 2
                if s.switch_mode != want:
                    raise SystemExit("%s -> %s at %d: unexpected switch mode %d (%s)" % (
                        src, dst, ctx, s.switch_mode, s.fallback_reason))
                if mode == "t":
                    span = s.span_tokens
                    # the target's ContinueTurn line: the span's transfer (the source's send,
                    # plus in push mode the wait for its arrival) and its translate-apply
                    # and the target's own TTFT (first_ms: the call's arrival to its first token)
                    imp = span_times(tails[dst], "ContinueTurn", sid, ("transfer_ms", "translate_ms",
                                                                       "first_ms"))
                    recv, ntr, nttft = imp["transfer_ms"], imp["translate_ms"], imp["first_ms"]
                    xfer = span_times(tails[src], "ExportSpan", sid, ("transfer_ms",))["transfer_ms"]
                if r > 0:
                    res[mode].append(ttft)
                    res[mode + "r"].append(s.ttft_seconds)
                    if mode == "t":
                        res["x"].append(s.switch_seconds)
                        for k, v in (("recv", recv), ("ntr", ntr), ("xfer", xfer), ("nttft", nttft)):
                            if v is not None:
                                res[k].append(v / 1e3)
                c.close_session(sid)
        res["span"] = span
        out[ctx] = res
    return out


def run_cold(a, work, models, dirs, pairs, tokenizer, src, dst, contexts, corpus, user):
    """First switch / first re-prefill of a fresh fleet: dict ctx -> {"t": [...], "p": [...]}."""
    out = {}
    k = 0
    for ctx in contexts:
        res = {"t": [], "p": [], "tr": [], "pr": []}
        for r in range(a.cold_repeats):
            for mode in ("t", "p"):
                k += 1
                w = os.path.join(work, "cold-%d" % k)
                fleet = new_fleet(a, w, models, dirs, pairs, tokenizer)
                c = None
                try:
                    c = bench_client(a, fleet)
                    sid = c.create_session()
                    c.send_all(sid, tokens=corpus[:ctx], max_tokens=1, model=src)
                    ttft, s = client_turn(c, sid, tokens=user, max_tokens=1, model=dst,
                                          force_reprefill=(mode == "p"), ignore_eos=True)
                    if s.switch_mode != (1 if mode == "t" else 2):
                        raise SystemExit("cold %s -> %s at %d: unexpected switch mode %d (%s)" % (
                            src, dst, ctx, s.switch_mode, s.fallback_reason))
                    res[mode].append(ttft)
                    res[mode + "r"].append(s.ttft_seconds)
                finally:
                    try:
                        close_client(c)
                    finally:
                        fleet.stop()
                if not a.work:
                    shutil.rmtree(w, ignore_errors=True)
        out[ctx] = res
    return out


def wait_pushed(c, sid, src_node, n, timeout=60.0):
    """Wait until a node other than src_node holds n tokens of sid (the push is recorded)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        for h in c.get_session(sid).holdings:
            if h.node != src_node and h.n_tokens >= n:
                return time.perf_counter() - t0
        time.sleep(0.002)
    raise SystemExit("session %s: no push of %d tokens within %.0f s (see the router's log)" % (sid, n, timeout))


def push_ahead_tables(c, corpus, user, contexts, pairs, a):
    """Per pair and context: median client TTFT of the switched turn after a push-ahead, a plain
    translated switch and a re-prefill; the push's wait (client side, from the source turn's end
    until GetSession shows the target's holding)."""
    print("bench_switch --push-ahead: the switched turn after the router pushed the span ahead")
    for src, dst in pairs:
        print("\n%s -> %s" % (src, dst))
        print("%8s | %12s %6s | %12s %6s | %12s %6s | %12s | %8s %8s | %10s" % (
            "context", "push-ahead", "span", "at once", "span", "switch", "span", "re-prefill", "ratio",
            "ratio_t", "push wait"))
        for ctx in contexts:
            prompt = corpus[:ctx]
            res = {"a": [], "i": [], "t": [], "p": [], "w": [], "si": []}
            spans = {}
            for r in range(a.repeats + 1):     # the first repeat warms up every path
                for mode in ("a", "i", "t", "p"):
                    sid = c.create_session()
                    _, _, s0 = c.send_all(sid, tokens=prompt, max_tokens=1, model=src,
                                          prefetch_model=dst if mode in ("a", "i") else "")
                    if mode == "a":
                        wait = wait_pushed(c, sid, s0.node, s0.context_tokens - 1)
                    ttft, s = client_turn(c, sid, tokens=user, max_tokens=1, model=dst,
                                          force_reprefill=(mode == "p"))
                    want = 2 if mode == "p" else 1
                    if s.switch_mode != want:
                        raise SystemExit("unexpected switch mode %d (%s)" % (s.switch_mode, s.fallback_reason))
                    if mode == "a" and s.pushed_ahead_tokens != s0.context_tokens - 1:
                        raise SystemExit("the switch used %d pushed tokens, expected %d" % (
                            s.pushed_ahead_tokens, s0.context_tokens - 1))
                    spans[mode] = s.span_tokens
                    if r > 0:
                        res[mode].append(ttft)
                        if mode == "a":
                            res["w"].append(wait)
                        if mode == "i":
                            res["si"].append(s.span_tokens)
                    c.close_session(sid)
            ma, mi, mt, mp = (statistics.median(res[k]) for k in ("a", "i", "t", "p"))
            print("%8d | %9.2f ms %6d | %9.2f ms %6d | %9.2f ms %6d | %9.2f ms | %7.1fx %7.1fx | %7.2f ms" % (
                ctx, ma * 1e3, spans["a"], mi * 1e3, statistics.median(res["si"]), mt * 1e3, spans["t"],
                mp * 1e3, mp / ma, mt / ma, statistics.median(res["w"]) * 1e3))
    print("\n(client-measured TTFT of the switched turn; push-ahead = after the router shipped the span "
          "in the background; at once = the switched turn sent as soon as the source turn ended, while the "
          "push may still run (the turn waits for it, or ships the span itself when the push had not "
          "started), span = its median; ratio = re-prefill / push-ahead, ratio_t = switch / push-ahead; "
          "push wait = from the source turn's end until the target's holding was recorded)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", required=True)
    ap.add_argument("--contexts", default="64,512,2048", help="context lengths in tokens (default %(default)s)")
    ap.add_argument("--repeats", type=int, default=None, help="default 5, 3 with --shapes")
    ap.add_argument("--pairs", default="qwen3-a:qwen3-b,qwen3-b:qwen3-a")
    ap.add_argument("--shapes", default=None, help="SRC:DST[,...] of kvlingo/shapes.h names")
    ap.add_argument("--dtype", default="f32", choices=("f32", "bf16"), help="weights of --shapes dirs")
    ap.add_argument("--threads", type=int, default=1, help="OPENBLAS_NUM_THREADS of the nodes")
    ap.add_argument("--new-tokens", type=int, default=8, help="input tokens of the switched turn")
    ap.add_argument("--cold", action="store_true", help="also the first switch of fresh fleets")
    ap.add_argument("--cold-repeats", type=int, default=3)
    ap.add_argument("--no-pieces", action="store_true", help="skip the in-process pieces")
    ap.add_argument("--pieces-before", action="store_true",
                    help="the in-process pieces all before the fleet starts (as --shapes does), not "
                         "once per timed repeat between its turns")
    ap.add_argument("--work", default=None, help="an empty dir for the fleets' files; keeps their logs")
    ap.add_argument("--client", default="python", choices=("python", "c"),
                    help="the timed turns' client: grpcio (default) or build/bench_send, a C client")
    ap.add_argument("--kvld-args", default="", help="more kvld flags for every node, e.g. '--span-push 0'")
    ap.add_argument("--push-ahead", action="store_true",
                    help="time the switch after a push-ahead instead (own table)")
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    require_client(a)
    if a.repeats is None:
        a.repeats = 3 if a.shapes else 5
    os.environ["OPENBLAS_NUM_THREADS"] = str(a.threads)
    env = dict(os.environ)
    if a.work and os.path.isdir(a.work) and os.listdir(a.work):
        raise SystemExit("--work %s is not empty: give a new or empty directory" % a.work)
    work = a.work or tempfile.mkdtemp(prefix="kvlingo-bench-")
    contexts = [int(x) for x in a.contexts.split(",")]
    pairs = [tuple(p.split(":")) for p in (a.shapes or a.pairs).split(",")]
    if any(len(p) != 2 for p in pairs):
        raise SystemExit("--pairs/--shapes: SRC:DST[,SRC:DST...]")
    models = list(dict.fromkeys([m for p in pairs for m in p]))
    try:
        if a.shapes:
            dirs = make_shapes(a.build, pairs, os.path.join(work, "fleet"), a.dtype, env)
            tokenizer = os.path.join(a.build, "testdata", "tokenizers", "qwen3", "tokenizer.json")
            tok_args = ["--tokenizer", tokenizer]
        else:
            dirs = {m: os.path.join(SRC, "models", m) for m in models}
            tokenizer = None   # the fleet's default, models/qwen3-a
            tok_args = ["--model", os.path.join(SRC, "models", "qwen3-a")]
        # the prompt: the corpus as the router's tokenizer reads it, each id folded into the
        # smallest vocabulary of the models (a no-op for the Qwen tokenizer and vocab 151936)
        vocab = min(config_vocab(d) for d in dirs.values())
        out = subprocess.run([os.path.join(a.build, "kvlingo"), "tokenize"] + tok_args +
                             ["--text", rtest.corpus_text(0, 20000), "--json"], check=True,
                             capture_output=True, text=True).stdout
        corpus = [i % vocab for i in json.loads(out)["ids"]]
        u0 = max(2100, max(contexts) + 52)
        if len(corpus) < u0 + a.new_tokens:
            raise SystemExit("the corpus has %d tokens: too few for context %d" % (len(corpus), max(contexts)))
        user = corpus[u0:u0 + a.new_tokens]
        # the in-process pieces: of the shipped models, once per timed repeat between the fleet's turns
        # (run_pair_warm); of --shapes models (GBs each) or with --pieces-before, all first,
        # while no fleet holds memory or cores
        inproc = {}
        before = a.shapes or a.pieces_before
        if not a.no_pieces and not a.push_ahead and before:
            for src, dst in pairs:
                inproc[(src, dst)] = pieces(a.build, dirs[src], dirs[dst], contexts, a.repeats,
                                            a.new_tokens + 1, env)
        load = os.getloadavg()
        print("bench_switch: %s client -> kvlingo-router -> kvld x2 on loopback; OPENBLAS_NUM_THREADS=%d; "
              "median of %d repeats; %d new tokens per switched turn (with the source's last sampled "
              "token the target runs %d); models %s; load %.2f %.2f %.2f" % (
                  "C (bench_send)" if a.client == "c" else "Python (grpcio)", a.threads, a.repeats,
                  a.new_tokens, a.new_tokens + 1,
                  ", ".join("%s (%s)" % (m, dirs[m]) for m in models), *load), flush=True)
        fpairs = tuple(pairs) if a.shapes else None
        if a.push_ahead:
            fleet = new_fleet(a, os.path.join(work, "fleet"), models, dirs, fpairs, tokenizer)
            c = None
            try:
                c = bench_client(a, fleet)
                push_ahead_tables(c, corpus, user, contexts, pairs, a)
            finally:
                try:
                    close_client(c)
                finally:
                    fleet.stop()
            return
        fleet = new_fleet(a, os.path.join(work, "fleet"), models, dirs, fpairs, tokenizer)
        warm = {}
        c = None
        try:
            c = bench_client(a, fleet)
            for src, dst in pairs:
                piece = None
                if not a.no_pieces and not before:
                    def piece(ctx, s=src, d=dst):
                        return pieces(a.build, dirs[s], dirs[d], [ctx], 1, a.new_tokens + 1, env)[ctx]
                warm[(src, dst)] = run_pair_warm(fleet, c, src, dst, contexts, corpus, user, a.repeats, piece)
                if piece:
                    inproc[(src, dst)] = {ctx: {k: med([p[k] for p in r["pieces"]])
                                                for k in ("translate_ms", "forward_ms", "reprefill_ttft_ms")}
                                          for ctx, r in warm[(src, dst)].items()}
        finally:
            try:
                close_client(c)
            finally:
                fleet.stop()
        cold = {}
        if a.cold:
            for src, dst in pairs:
                cold[(src, dst)] = run_cold(a, work, models, dirs, fpairs, tokenizer, src, dst, contexts,
                                            corpus, user)
        for src, dst in pairs:
            print("\n%s -> %s" % (src, dst))
            print("%8s | %12s %12s %8s | %12s %12s %8s | %7s %10s" % (
                "context", "switch", "re-prefill", "ratio", "switch*", "re-prefill*", "ratio*", "span",
                "pull*"))
            for ctx in contexts:
                res = warm[(src, dst)][ctx]
                mt, mp, rt, rp = med(res["t"]), med(res["p"]), med(res["tr"]), med(res["pr"])
                print("%8d | %9.2f ms %9.2f ms %7.1fx | %9.2f ms %9.2f ms %7.1fx | %7d %7.2f ms" % (
                    ctx, mt * 1e3, mp * 1e3, mp / mt, rt * 1e3, rp * 1e3, rp / rt, res["span"],
                    med(res["x"]) * 1e3))
            if a.cold:
                print("%8s | %12s %12s %8s | %12s %12s %8s   (cold: first turn of a fresh fleet, median of %d)" % (
                    "context", "cold switch", "cold re-pf", "ratio", "switch*", "re-prefill*", "ratio*",
                    a.cold_repeats))
                for ctx in contexts:
                    res = cold[(src, dst)][ctx]
                    mt, mp, rt, rp = med(res["t"]), med(res["p"]), med(res["tr"]), med(res["pr"])
                    print("%8d | %9.2f ms %9.2f ms %7.1fx | %9.2f ms %9.2f ms %7.1fx" % (
                        ctx, mt * 1e3, mp * 1e3, mp / mt, rt * 1e3, rp * 1e3, rp / rt))
            if not a.no_pieces:
                print("%8s | %12s | %10s %10s %10s %10s | %11s | %10s %10s | %10s %10s %10s" % (
                    "context", "stack switch", "translate", "forward", "wire", "sum", "stack / sum",
                    "node TTFT", "legs", "in-proc RP", "node transl", "export tx"))
                for ctx in contexts:
                    res, p = warm[(src, dst)][ctx], inproc[(src, dst)].get(ctx)
                    if not p:
                        continue
                    st, wire = med(res["t"]), med(res["recv"])
                    tr_, fw = p["translate_ms"] / 1e3, p["forward_ms"] / 1e3
                    tot = tr_ + fw + (wire if wire == wire else 0.0)
                    nt = med(res["nttft"])
                    print("%8d | %9.2f ms | %7.2f ms %7.2f ms %7.2f ms %7.2f ms | %10.2fx | %7.2f ms %7.2f ms | "
                          "%7.2f ms %7.2f ms %7.2f ms" % (
                              ctx, st * 1e3, tr_ * 1e3, fw * 1e3, wire * 1e3, tot * 1e3, st / tot,
                              nt * 1e3, (st - nt) * 1e3, p["reprefill_ttft_ms"], med(res["ntr"]) * 1e3,
                              med(res["xfer"]) * 1e3))
        print("\n(columns: client-measured TTFT; * = router-measured TTFT from its turn summary; "
              "span = tokens shipped and translated; pull* = the summary's switch_seconds, the "
              "span's move: the source reading its cache, the wire, translate-apply on the target; "
              "the rest of a switch's TTFT is the target's forward pass over the turn's new tokens "
              "and the RPCs)")
        if a.cold:
            print("(cold: each measurement on a fleet started for it: the source turn, untimed, then "
                  "the timed switch or re-prefill, the target's first turn; the same client timing)")
        if not a.no_pieces:
            print("(pieces: stack switch = the client's warm switch TTFT above; translate and forward = "
                  "`kvlingo bench switch --json --new-tokens %d` in one process, same models and "
                  "OPENBLAS_NUM_THREADS, median of %d %s: translate = the C-token span read from the source's "
                  "cache (the export's read) and translated into an empty target cache, forward = the "
                  "target's forward pass over the %d new tokens on it until "
                  "the first token; wire = the target's ContinueTurn transfer_ms from its log: the source's "
                  "send and the wait for the whole span's arrival; sum = translate + forward + wire; "
                  "stack / sum: what the RPCs, the router and the client add; node TTFT = the target's "
                  "ContinueTurn first_ms from its log, the call's arrival to its first token (the pull "
                  "with its request to the source, translate-apply and the forward); legs = stack switch "
                  "- node TTFT, what the client, the router and their gRPC legs add around the target; "
                  "in-proc RP = the in-process re-prefill of C+%d tokens; node transl = the target's "
                  "translate_ms, export tx = the source's ExportSpan transfer_ms, both from the logs)" % (
                      a.new_tokens + 1, a.repeats,
                      "runs, all before the fleet started" if before else
                      "runs, one in each repeat between its switch and its re-prefill",
                      a.new_tokens + 1, a.new_tokens + 1))
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)   # logs kept only with --work


if __name__ == "__main__":
    main()
