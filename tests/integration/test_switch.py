#!/usr/bin/python3
"""Integration test: two kvld processes on loopback, qwen3-a (node A) and qwen3-b
(node B), driven by an independent grpcio client.
  1. A prefills a session with text from valid.txt; ExportSpan ships [0, N) to B over UCX.
  2. B generates; its first next-token distribution equals (<= 1e-5) the in-process reference
     (span_ref: the same translation with the library API).
  3. Switching back ships only B's new span [N, N+K) to A, whose next-token distribution again
     equals the reference.
  4. Metrics, health, and SIGTERM draining (a running stream finishes, new work is refused,
     exit status 0).
  5. ContinueTurn pull_only (a push-ahead): B pulls A's span of a session it lacks, translates
     it, generates nothing, and says what it holds; a source holding other ids refuses
     (source_state) and B keeps nothing."""
import hashlib
import os
import signal
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvlclient  # noqa: E402
import grpc  # noqa: E402


def main():
    args = kvlclient.parse_args(sys.argv[1:])
    pb, pbg, spb = kvlclient.load_stubs(args.source, os.path.join(args.work, "stubs"))
    trdir = kvlclient.ensure_translators(args)
    t = kvlclient.Checks()
    A = kvlclient.Kvld(args.kvld, os.path.join(args.source, "models/qwen3-a"),
                       os.path.join(args.work, "node_a.log"), translators=trdir)
    B = kvlclient.Kvld(args.kvld, os.path.join(args.source, "models/qwen3-b"),
                       os.path.join(args.work, "node_b.log"), translators=trdir)
    try:
        sa = pbg.NodeStub(grpc.insecure_channel(A.addr))
        sb = pbg.NodeStub(grpc.insecure_channel(B.addr))
        ia, ib = sa.Info(pb.InfoRequest(), timeout=10), sb.Info(pb.InfoRequest(), timeout=10)
        t.check(ia.model.name == "qwen3-a" and ib.model.name == "qwen3-b", "Info names the models")
        t.check(ia.transport == "ucx" and len(ia.transport_address) > 0, "Info gives a UCX address")
        t.check([x.source.name for x in ib.translators] == ["qwen3-a"], "B loaded the a->b translator")

        sid = "conv-1"
        sa.OpenSession(pb.OpenSessionRequest(session_id=sid), timeout=10)
        ar = sa.Append(pb.AppendRequest(session_id=sid, text=kvlclient.corpus_text(args),
                                        prefill=True), timeout=60)
        prompt = list(ar.tokens)
        n = len(prompt)
        t.check(n > 50 and ar.cached_count == n, "A prefilled %d tokens of valid.txt" % n)

        ex = sa.ExportSpan(pb.ExportSpanRequest(session_id=sid, peer=B.addr), timeout=60)
        want = 2 * ia.n_layers * n * ia.n_kv_heads * ia.head_dim * 4 + 4 * n
        t.check(ex.t0 == 0 and ex.t1 == n and ex.payload_bytes == want,
                "A->B shipped [0, %d), %d bytes" % (n, ex.payload_bytes))
        si = sb.SessionInfo(pb.SessionInfoRequest(session_id=sid), timeout=10)
        t.check(si.cached_count == n and si.imported_count == n, "B holds the translated span")

        k = 6
        gen = list(sb.Generate(pb.GenerateRequest(session_id=sid, max_tokens=k, temperature=0,
                                                  return_logprobs=True), timeout=60))
        toks = [m.token for m in gen if not m.done]
        t.check(len(toks) == k and gen[-1].done and gen[-1].finish_reason == "length",
                "B generated %d tokens: %s" % (k, toks))
        first_b = list(gen[0].logprobs)

        ex2 = sb.ExportSpan(pb.ExportSpanRequest(session_id=sid, **{"from": n}, peer=A.addr),
                            timeout=60)
        want2 = 2 * ib.n_layers * k * ib.n_kv_heads * ib.head_dim * 4 + 4 * k
        t.check(ex2.t0 == n and ex2.t1 == n + k and ex2.payload_bytes == want2,
                "B->A shipped only the new span [%d, %d), %d bytes" % (ex2.t0, ex2.t1,
                                                                     ex2.payload_bytes))
        gen2 = list(sa.Generate(pb.GenerateRequest(session_id=sid, max_tokens=3,
                                                   return_logprobs=True), timeout=60))
        first_a = list(gen2[0].logprobs)

        ids_file = os.path.join(args.work, "ids.txt")
        with open(ids_file, "w") as f:
            f.write(" ".join(map(str, prompt)) + "\n" + " ".join(map(str, toks)) + "\n")
        ref_file = os.path.join(args.work, "ref.txt")
        r = subprocess.run([args.span_ref, os.path.join(args.source, "models/qwen3-a"),
                            os.path.join(args.source, "models/qwen3-b"),
                            os.path.join(trdir, "qwen3-a_to_qwen3-b.safetensors"),
                            os.path.join(trdir, "qwen3-b_to_qwen3-a.safetensors"),
                            ids_file, ref_file], capture_output=True, text=True)
        t.check(r.returncode == 0, "span_ref ran " + r.stderr.strip())
        ref = [list(map(float, line.split())) for line in open(ref_file)]
        d1 = max(abs(x - y) for x, y in zip(first_b, ref[0]))
        d2 = max(abs(x - y) for x, y in zip(first_a, ref[1]))
        t.check(len(first_b) == len(ref[0]) and d1 <= 1e-5,
                "B's distribution after import = in-process translation (max |diff| %.2e)" % d1)
        t.check(len(first_a) == len(ref[1]) and d2 <= 1e-5,
                "A's distribution after switching back = reference (max |diff| %.2e)" % d2)
        top_b = max(range(len(first_b)), key=lambda i: first_b[i])
        t.check(top_b == toks[0], "greedy token = argmax of the distribution")


        for node, name in [(A, "A"), (B, "B")]:
            t.check(node.metric("kvlingo_spans_sent_total") == 1 and
                    node.metric("kvlingo_spans_received_total") == 1,
                    "%s metrics count 1 span sent and 1 received" % name)
        t.check(B.metric("kvlingo_tokens_decoded_total") >= k - 1, "B counts decoded tokens")

        # ContinueTurn pull_only (a router's push-ahead): B pulls A's span of a session it does
        # not hold and translates it, generating nothing; the final message says what B holds
        sid2 = "conv-pull"
        rx_before = B.metric("kvlingo_span_bytes_received_total")
        sa.OpenSession(pb.OpenSessionRequest(session_id=sid2), timeout=10)
        sa.Append(pb.AppendRequest(session_id=sid2, tokens=prompt, prefill=True), timeout=60)
        sha = hashlib.sha256(struct.pack("<%di" % n, *prompt)).hexdigest()
        msgs = list(sb.ContinueTurn(pb.ContinueRequest(
            session_id=sid2, pull_only=True,
            pull=pb.SpanPull(source=A.addr, source_tokens=n, source_sha256=sha)), timeout=60))
        t.check(len(msgs) == 1 and msgs[0].done and msgs[0].finish_reason == "pull_only" and
                msgs[0].generated_count == 0, "pull_only: one final message, nothing generated (%d messages)"
                % len(msgs))
        res = msgs[-1].result
        t.check(res.mode == pb.ContinueResult.MODE_TRANSLATE and (res.span_t0, res.span_t1) == (0, n) and
                res.token_count == n and res.tokens_sha256 == sha and not res.fallback,
                "pull_only: B translated [%d, %d) and holds %d tokens of A's ids (%s)" % (
                    res.span_t0, res.span_t1, res.token_count, res.fallback))
        si2 = sb.SessionInfo(pb.SessionInfoRequest(session_id=sid2), timeout=10)
        t.check(si2.token_count == n and si2.cached_count == n and si2.imported_count == n and
                si2.state == "idle" and si2.tokens_sha256 == sha,
                "pull_only: B's session holds the span, idle")
        # the pull asked A for bf16 where B's translator rounds to bf16 before multiplying
        # (an AVX512_BF16 CPU): half the bytes, and the same translation as the float32 span
        # A pushed for conv-1 (B's first distribution on it is the same, bit for bit)
        flags = open("/proc/cpuinfo").read().split()
        bf16 = "avx512f" in flags and "avx512_bf16" in flags and not os.environ.get("KVL_CPU_TRANSLATE")
        got = B.metric("kvlingo_span_bytes_received_total") - rx_before
        want_p = 2 * ia.n_layers * n * ia.n_kv_heads * ia.head_dim * (2 if bf16 else 4) + 4 * n
        t.check(got == want_p, "pull_only: A sent %s, %d bytes (%d)" % ("bf16" if bf16 else "float32",
                                                                       want_p, got))
        g3 = list(sb.Generate(pb.GenerateRequest(session_id=sid2, max_tokens=1, temperature=0,
                                                 return_logprobs=True), timeout=60))
        d3 = max(abs(x - y) for x, y in zip(g3[0].logprobs, first_b))
        t.check(len(g3[0].logprobs) == len(first_b) and d3 == 0,
                "pull_only: B's distribution = the one after A's float32 span (max |diff| %.2e)" % d3)
        # a source that holds other ids than the pull says: refused there (source_state), and B,
        # which did not hold the session, holds nothing of it
        sa.OpenSession(pb.OpenSessionRequest(session_id="conv-pull-ids"), timeout=10)
        sa.Append(pb.AppendRequest(session_id="conv-pull-ids", tokens=prompt, prefill=True), timeout=60)
        msgs = list(sb.ContinueTurn(pb.ContinueRequest(
            session_id="conv-pull-ids", pull_only=True,
            pull=pb.SpanPull(source=A.addr, source_tokens=n, source_sha256="0" * 64)), timeout=60))
        res = msgs[-1].result
        t.check(len(msgs) == 1 and msgs[-1].done and res.mode == pb.ContinueResult.MODE_NONE and
                res.token_count == 0 and res.fallback.startswith("source_state"),
                "pull_only from a source holding other ids: no span, the reason (%s)" % res.fallback)
        e = None
        try:
            sb.SessionInfo(pb.SessionInfoRequest(session_id="conv-pull-ids"), timeout=10)
        except grpc.RpcError as x:
            e = x
        t.check(e is not None and e.code() == grpc.StatusCode.NOT_FOUND,
                "pull_only that failed left no session on B")

        # a source that stops answering (SIGSTOP) during a pull, and a client that gives up:
        # B stops waiting for the source at the cancel, not at the pull's 60 s deadline
        sid3 = "conv-pull-stalled"
        sa.OpenSession(pb.OpenSessionRequest(session_id=sid3), timeout=10)
        sa.Append(pb.AppendRequest(session_id=sid3, tokens=prompt, prefill=True), timeout=60)
        A.freeze()
        try:
            call = sb.ContinueTurn(pb.ContinueRequest(
                session_id=sid3, context=prompt, input=[11, 12], generate=pb.GenerateRequest(max_tokens=4),
                pull=pb.SpanPull(source=A.addr, source_tokens=n, source_sha256=sha, timeout_ms=60000)), timeout=120)
            time.sleep(1.0)
            call.cancel()
            t0 = time.time()
            state = None
            while time.time() - t0 < 10:
                try:
                    state = sb.SessionInfo(pb.SessionInfoRequest(session_id=sid3), timeout=5).state
                except grpc.RpcError as x:
                    state = x.code().name
                if state in ("idle", "NOT_FOUND"):
                    break
                time.sleep(0.05)
            took = time.time() - t0
        finally:
            A.proc.send_signal(signal.SIGCONT)
        t.check(state in ("idle", "NOT_FOUND") and took < 3.0,
                "a client's cancel ends B's pull from a stopped source at once (%s after %.2f s)" % (state, took))

        # a node with a bf16 KV cache ships bf16 spans (half the K/V bytes); B (float32)
        # widens them, and its distribution stays within bf16 rounding of the reference
        C = kvlclient.Kvld(args.kvld, os.path.join(args.source, "models/qwen3-a"),
                           os.path.join(args.work, "node_c.log"), translators=trdir,
                           extra=("--kv-dtype", "bf16"))
        try:
            t.check("kv_dtype=bf16" in open(C.log_path).read(), "C serves with a bf16 KV cache")
            ch_c = grpc.insecure_channel(C.addr)
            sc = pbg.NodeStub(ch_c)
            sc.OpenSession(pb.OpenSessionRequest(session_id="conv-bf16"), timeout=10)
            sc.Append(pb.AppendRequest(session_id="conv-bf16", tokens=prompt, prefill=True), timeout=60)
            ex3 = sc.ExportSpan(pb.ExportSpanRequest(session_id="conv-bf16", peer=B.addr), timeout=60)
            want3 = 2 * ia.n_layers * n * ia.n_kv_heads * ia.head_dim * 2 + 4 * n
            t.check(ex3.t1 == n and ex3.payload_bytes == want3,
                    "C->B shipped [0, %d) as bf16, %d bytes (float32: %d)" % (n, ex3.payload_bytes, want))
            gen3 = list(sb.Generate(pb.GenerateRequest(session_id="conv-bf16", max_tokens=1,
                                                       temperature=0, return_logprobs=True), timeout=60))
            d3 = max(abs(x - y) for x, y in zip(list(gen3[0].logprobs), ref[0]))
            t.check(d3 <= 0.05, "B's distribution after a bf16 span = reference within bf16 rounding "
                    "(max |diff| %.2e)" % d3)
            ch_c.close()
        finally:
            C.stop()

        # health (grpc.health.v1) through a raw call: the generated 'grpc' package would
        # shadow grpcio, so the request/response bytes are written by hand
        hc = grpc.insecure_channel(A.addr).unary_unary("/grpc.health.v1.Health/Check")
        resp = hc(b"", timeout=10)
        t.check(resp == b"\x08\x01", "Health/Check says SERVING")

        # continuous batching: a long prefill does not starve a decoding session.  Next to one
        # decoder the scheduler cuts the prompt into pieces as small as 4 tokens (a step may take
        # only decode_stretch times a decode step), so the prompt is kept to 1024 tokens: a
        # sanitizer build took ~0.2 s a step (measured: 1536 tokens in 87 s)
        sb.OpenSession(pb.OpenSessionRequest(session_id="dec"), timeout=10)
        sb.Append(pb.AppendRequest(session_id="dec", tokens=list(range(100, 110))), timeout=10)
        sb.OpenSession(pb.OpenSessionRequest(session_id="long"), timeout=10)
        arrivals = []
        prefill_done = threading.Event()
        def decoder():
            stream = sb.Generate(pb.GenerateRequest(session_id="dec", max_tokens=3000), timeout=240)
            try:
                for m in stream:
                    arrivals.append(time.time())
                    if prefill_done.is_set():
                        stream.cancel()   # enough: stop decoding once the prefill is over
                        break
            except grpc.RpcError:
                pass
        dth = threading.Thread(target=decoder)
        dth.start()
        while len(arrivals) < 5:
            time.sleep(0.005)
        p0 = time.time()
        n_long = 1024
        sb.Append(pb.AppendRequest(session_id="long", tokens=[(7 * i) % 4000 for i in range(n_long)],
                                   prefill=True), timeout=240)
        p1 = time.time()
        prefill_done.set()
        during = sum(1 for x in arrivals if p0 <= x <= p1)
        chunks = (n_long + 255) // 256
        t.check(during >= chunks - 2, "decoding session got %d tokens during a %d-token prefill "
                "(%d chunks, %.2f s)" % (during, n_long, chunks, p1 - p0))
        dth.join()

        # SIGTERM drains: a running stream completes, new work is refused, exit 0
        got = []
        def long_stream():
            try:
                # long enough to be running when SIGTERM lands, short enough for a
                # sanitizer build on a loaded 2-core machine
                for m in sa.Generate(pb.GenerateRequest(session_id=sid, max_tokens=400),
                                     timeout=300):
                    got.append(m)
            except grpc.RpcError as e:
                got.append(e)
        th = threading.Thread(target=long_stream)
        th.start()
        while not got:
            time.sleep(0.01)
        A.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        try:
            sa.OpenSession(pb.OpenSessionRequest(), timeout=5)
            refused = False
        except grpc.RpcError as e:
            refused = e.code() in (grpc.StatusCode.UNAVAILABLE,)
        th.join()
        t.check(refused, "draining node refuses new work with UNAVAILABLE")
        t.check(not isinstance(got[-1], Exception) and got[-1].done,
                "the running stream finished during the drain (%d messages)" % len(got))
        rc = A.stop(timeout=30)
        t.check(rc == 0, "SIGTERM: kvld exited with status %s" % rc)
    finally:
        A.stop()
        rcb = B.stop()
    t.check(rcb == 0, "node B exited cleanly (%s)" % rcb)
    peer_restarts(args, pb, pbg, trdir, t)
    t.done()


def peer_restarts(args, pb, pbg, trdir, t):
    """A fleet member that restarts at the same address gets a new UCX worker address: its
    first pull names it (by hash), so the source asks its Info again at once and the very first
    pull after the restart moves the span (before, it failed once, until the source's
    background refresh of its members' Info, every 10 s, saw the new address; and before that,
    the source kept sending to the old address for good)."""
    pa, pb_ = kvlclient.free_port(), kvlclient.free_port()
    addr_a, addr_b = "127.0.0.1:%d" % pa, "127.0.0.1:%d" % pb_

    def start(name, model, listen, peer):
        k = kvlclient.Kvld(args.kvld, os.path.join(args.source, "models", model),
                           os.path.join(args.work, "node_%s.log" % name), translators=trdir,
                           extra=["--listen", listen, "--peers", peer])
        k.addr = listen
        return k
    A = start("ra", "qwen3-a", addr_a, addr_b)
    B = start("rb", "qwen3-b", addr_b, addr_a)
    ch_a = grpc.insecure_channel(addr_a)   # plaintext by name: kvlclient.Kvld runs nodes --insecure
    try:
        sa = pbg.NodeStub(ch_a)
        prompt = list(range(400, 440))
        sha = hashlib.sha256(struct.pack("<%di" % len(prompt), *prompt)).hexdigest()

        def pull(sid, timeout_ms):
            sa.OpenSession(pb.OpenSessionRequest(session_id=sid), timeout=10)
            sa.Append(pb.AppendRequest(session_id=sid, tokens=prompt, prefill=True), timeout=60)
            # a channel per pull: one made before B's restart would meet gRPC's reconnect back-off
            with grpc.insecure_channel(addr_b) as ch_b:
                msgs = list(pbg.NodeStub(ch_b).ContinueTurn(pb.ContinueRequest(
                    session_id=sid, pull_only=True,
                    pull=pb.SpanPull(source=addr_a, source_tokens=len(prompt), source_sha256=sha,
                                     timeout_ms=timeout_ms)), timeout=60))
            return msgs[-1].result
        res = pull("before-restart", 5000)
        t.check(res.mode == pb.ContinueResult.MODE_TRANSLATE, "a pull before the restart (%s)" % res.fallback)
        B.stop(sig=signal.SIGKILL)
        B = start("rb2", "qwen3-b", addr_b, addr_a)
        # A asks its members' Info again every 10 s (every second while one is down)
        t0, tries = time.time(), 0
        while True:
            tries += 1
            res = pull("after-restart-%d" % tries, 5000)
            if res.mode == pb.ContinueResult.MODE_TRANSLATE or time.time() - t0 > 25:
                break
            time.sleep(1.0)
        t.check(res.mode == pb.ContinueResult.MODE_TRANSLATE and tries == 1,
                "the first pull after the target restarted at the same address translates: after %.1f s, "
                "%d tries (%s)" % (time.time() - t0, tries, res.fallback))
    finally:
        ch_a.close()
        A.stop()
        B.stop()


if __name__ == "__main__":
    main()
