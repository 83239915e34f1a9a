#!/usr/bin/python3
"""Bad-input integration tests: every refusal is a gRPC status with a clear message,
and the daemons keep serving other sessions.  Nodes on loopback:
  A  qwen3-a with translators          B  qwen3-b with translators
  C  qwen3-a, max_context 64 from a YAML --config file, no translators
Cases: malformed protobuf, unknown session, ContinueTurn pull_only without a pull or with
context / input / native_only / nothing to pull, text too long for --max-context, header naming
another model, unknown source model (no translator), truncated / oversized payload, checksum
mismatch, peer gone mid-transfer, exporter cancelling, client cancelling a Generate stream,
devices that do not exist (a bad name; CUDA where no GPU is usable) refused at start."""
import hashlib
import os
import re
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvlclient  # noqa: E402
import grpc  # noqa: E402


def rpc_error(fn):
    try:
        fn()
        return None
    except grpc.RpcError as e:
        return e


def main():
    args = kvlclient.parse_args(sys.argv[1:])
    pb, pbg, spb = kvlclient.load_stubs(args.source, os.path.join(args.work, "stubs"))
    trdir = kvlclient.ensure_translators(args)
    t = kvlclient.Checks()
    qa = os.path.join(args.source, "models/qwen3-a")
    qb = os.path.join(args.source, "models/qwen3-b")
    A = kvlclient.Kvld(args.kvld, qa, os.path.join(args.work, "node_a.log"), translators=trdir)
    B = kvlclient.Kvld(args.kvld, qb, os.path.join(args.work, "node_b.log"), translators=trdir,
                       extra=["--stream-stall-ms", "1000"])
    # C is configured through a YAML file (--config), flags still override it
    cfg = os.path.join(args.work, "node_c.yaml")
    with open(cfg, "w") as f:
        f.write("# node C\nmax_context: 64\nmax_sessions: 8\ntransport: ucx\n")
    C = kvlclient.Kvld(args.kvld, qa, os.path.join(args.work, "node_c.log"),
                       extra=["--config", cfg])
    nodes = [A, B, C]
    try:
        sa = pbg.NodeStub(grpc.insecure_channel(A.addr))
        sb = pbg.NodeStub(grpc.insecure_channel(B.addr))
        sc = pbg.NodeStub(grpc.insecure_channel(C.addr))
        ib = sb.Info(pb.InfoRequest(), timeout=10)

        # a healthy session on B that every failure below must leave alone
        sb.OpenSession(pb.OpenSessionRequest(session_id="keep"), timeout=10)
        sb.Append(pb.AppendRequest(session_id="keep", tokens=list(range(100, 140)), prefill=True),
                  timeout=30)

        # 1. malformed protobuf (raw bytes through a byte-level stub)
        ch = grpc.insecure_channel(B.addr)
        for method in ["Append", "OpenSession", "ExportSpan"]:
            raw = ch.unary_unary("/kvlingo.v1.Node/" + method)
            e = rpc_error(lambda: raw(b"\xff\xff\xff\xff", timeout=10))
            t.check(e is not None and e.code() == grpc.StatusCode.INVALID_ARGUMENT and
                    "malformed" in e.details(), "malformed %s -> INVALID_ARGUMENT (%s)" %
                    (method, e and e.details()))
        raws = ch.unary_stream("/kvlingo.v1.Node/ImportSpan")
        e = rpc_error(lambda: list(raws(b"\x12\x03\xff\xff\xff", timeout=10)))
        t.check(e is not None and e.code() == grpc.StatusCode.INVALID_ARGUMENT,
                "malformed ImportSpan -> INVALID_ARGUMENT (%s)" % (e and e.details()))
        e = rpc_error(lambda: ch.unary_unary("/kvlingo.v1.Node/Nope")(b"", timeout=10))
        t.check(e is not None and e.code() == grpc.StatusCode.UNIMPLEMENTED,
                "unknown method -> UNIMPLEMENTED")

        # 2. unknown session
        e = rpc_error(lambda: sb.Append(pb.AppendRequest(session_id="nope", tokens=[1]), timeout=10))
        t.check(e is not None and e.code() == grpc.StatusCode.NOT_FOUND and "nope" in e.details(),
                "Append to an unknown session -> NOT_FOUND (%s)" % (e and e.details()))
        e = rpc_error(lambda: list(sb.Generate(pb.GenerateRequest(session_id="nope", max_tokens=1),
                                               timeout=10)))
        t.check(e is not None and e.code() == grpc.StatusCode.NOT_FOUND, "Generate unknown -> NOT_FOUND")
        e = rpc_error(lambda: sa.ExportSpan(pb.ExportSpanRequest(session_id="nope", peer=B.addr),
                                            timeout=10))
        t.check(e is not None and e.code() == grpc.StatusCode.NOT_FOUND, "ExportSpan unknown -> NOT_FOUND")
        e = rpc_error(lambda: sb.Append(pb.AppendRequest(session_id="keep", tokens=[999999]),
                                        timeout=10))
        t.check(e is not None and e.code() == grpc.StatusCode.INVALID_ARGUMENT,
                "token id outside the vocabulary -> INVALID_ARGUMENT (%s)" % (e and e.details()))

        # 1a. a request whose strings hold newlines cannot forge log lines
        forged = "x\nts=2099-01-01T00:00:00.000Z level=error component=kvld msg=forged"
        e = rpc_error(lambda: sb.Append(pb.AppendRequest(session_id=forged, tokens=[1]), timeout=10))
        t.check(e is not None and e.code() == grpc.StatusCode.NOT_FOUND, "Append to a forged id -> NOT_FOUND")
        time.sleep(0.2)
        with open(B.log_path, errors="replace") as f:
            lines = f.read().split("\n")
        t.check(not any(ln.startswith("ts=2099") for ln in lines) and any("msg=forged" in ln for ln in lines),
                "a newline in a request's session id stays inside its log line")

        # 2a. ContinueTurn pull_only takes a pull and nothing else
        def cont(**kw):
            return list(sb.ContinueTurn(pb.ContinueRequest(session_id="po", pull_only=True, **kw), timeout=10))
        pull = pb.SpanPull(source=A.addr, source_tokens=10, source_sha256="0" * 64)
        for kw, why in (({}, "needs a pull"), ({"pull": pull, "input": [5]}, "no context and no input"),
                        ({"pull": pull, "context": [5]}, "no context and no input"),
                        ({"pull": pull, "held": 10}, "nothing to pull"),
                        ({"pull": pull, "native_only": True}, "native_only cannot go with it")):
            e = rpc_error(lambda: cont(**kw))
            t.check(e is not None and e.code() == grpc.StatusCode.INVALID_ARGUMENT and why in e.details(),
                    "ContinueTurn pull_only %s -> INVALID_ARGUMENT (%s)" % (sorted(kw), e and e.details()))

        # 2b'. a ContinueTurn refused for its sampling or for a full context changes nothing:
        # the session keeps its tokens, and none is made for a refused first turn
        def sha(ids):
            return hashlib.sha256(struct.pack("<%di" % len(ids), *ids)).hexdigest()
        keep_ids = list(range(100, 140))
        for g, why in ((pb.GenerateRequest(max_tokens=0), "max_tokens"),
                       (pb.GenerateRequest(max_tokens=2, temperature=-1), "temperature"),
                       (pb.GenerateRequest(max_tokens=2, temperature=float("nan")), "temperature")):
            for sid, held in (("keep", len(keep_ids)), ("fresh-refused", 0)):
                req = pb.ContinueRequest(session_id=sid, held=held, held_sha256=sha(keep_ids) if held else "",
                                         context=[] if held else [7, 8, 9], input=[5, 6], generate=g)
                e = rpc_error(lambda: list(sb.ContinueTurn(req, timeout=10)))
                t.check(e is not None and e.code() == grpc.StatusCode.INVALID_ARGUMENT and why in e.details(),
                        "ContinueTurn %s with %s -> INVALID_ARGUMENT (%s)" % (sid, why, e and e.details()))
        t.check(sb.SessionInfo(pb.SessionInfoRequest(session_id="keep"), timeout=10).token_count == len(keep_ids),
                "refused ContinueTurns leave the session's tokens as they were")
        e = rpc_error(lambda: sb.SessionInfo(pb.SessionInfoRequest(session_id="fresh-refused"), timeout=10))
        t.check(e is not None and e.code() == grpc.StatusCode.NOT_FOUND, "no session made for a refused first turn")
        # C's max context is 64: 64 tokens leave no room to generate
        e = rpc_error(lambda: list(sc.ContinueTurn(pb.ContinueRequest(
            session_id="full", context=list(range(300, 364)), generate=pb.GenerateRequest(max_tokens=1)), timeout=10)))
        t.check(e is not None and e.code() == grpc.StatusCode.OUT_OF_RANGE and "no room" in e.details(),
                "ContinueTurn filling the context -> OUT_OF_RANGE (%s)" % (e and e.details()))
        e = rpc_error(lambda: sc.SessionInfo(pb.SessionInfoRequest(session_id="full"), timeout=10))
        t.check(e is not None and e.code() == grpc.StatusCode.NOT_FOUND, "no session made for a full-context turn")

        # 2b. stop ids end a generation ("stop"); a ledger cut may drop only uncached tokens
        def gen(sid, **kw):
            toks, fin = [], None
            for m in sb.Generate(pb.GenerateRequest(session_id=sid, temperature=0, **kw), timeout=30):
                if m.done:
                    fin = m.finish_reason
                else:
                    toks.append(m.token)
            return toks, fin
        for sid in ("free", "stops"):
            sb.OpenSession(pb.OpenSessionRequest(session_id=sid), timeout=10)
            sb.Append(pb.AppendRequest(session_id=sid, tokens=list(range(200, 220)), prefill=True), timeout=30)
        free, _ = gen("free", max_tokens=6)
        want = free[:free.index(free[2]) + 1]
        got, fin = gen("stops", max_tokens=6, stop_tokens=[free[2]])
        t.check(got == want and fin == "stop", "stop_tokens: %s (%s), expected %s" % (got, fin, want))
        si = sb.SessionInfo(pb.SessionInfoRequest(session_id="stops"), timeout=10)
        n, cached = si.token_count, si.cached_count
        t.check(n == 20 + len(want) and cached == n - 1, "the last sampled token is not cached (%d/%d)" % (cached, n))
        r = sb.Append(pb.AppendRequest(session_id="stops", truncate=True, truncate_to=n - 1, tokens=[42]), timeout=10)
        t.check(r.token_count == n and r.cached_count == cached, "truncate the uncached tail and append")
        e = rpc_error(lambda: sb.Append(pb.AppendRequest(session_id="stops", truncate=True, truncate_to=cached - 1,
                                                         tokens=[42]), timeout=10))
        t.check(e is not None and e.code() == grpc.StatusCode.FAILED_PRECONDITION and "KV cache" in e.details(),
                "truncate into the KV cache -> FAILED_PRECONDITION (%s)" % (e and e.details()))
        e = rpc_error(lambda: sb.Append(pb.AppendRequest(session_id="stops", truncate=True, truncate_to=n + 5),
                                        timeout=10))
        t.check(e is not None and e.code() == grpc.StatusCode.OUT_OF_RANGE, "truncate past the ledger -> OUT_OF_RANGE")
        e = rpc_error(lambda: sb.Append(pb.AppendRequest(session_id="stops", truncate=True, truncate_to=n - 1,
                                                         tokens=[42] * 5000), timeout=10))
        t.check(e is not None and e.code() == grpc.StatusCode.OUT_OF_RANGE,
                "a cut with too many new tokens -> OUT_OF_RANGE (%s)" % (e and e.details()))
        t.check(sb.SessionInfo(pb.SessionInfoRequest(session_id="stops"), timeout=10).token_count == n,
                "refused cuts leave the ledger as it was")
        for bad in ([1] * 9, [10 ** 6]):
            e = rpc_error(lambda: gen("stops", max_tokens=2, stop_tokens=bad))
            t.check(e is not None and e.code() == grpc.StatusCode.INVALID_ARGUMENT and "stop_tokens" in e.details(),
                    "stop_tokens %s -> INVALID_ARGUMENT" % bad[:2])

        # 2a. an id longer than a node's ids, that starts with one of its sessions: never that session
        long_id = "stops" + "x" * 200
        for what, fn in (("SessionInfo", lambda: sb.SessionInfo(pb.SessionInfoRequest(session_id=long_id), timeout=10)),
                         ("Generate", lambda: gen(long_id, max_tokens=2))):
            e = rpc_error(fn)
            t.check(e is not None and e.code() == grpc.StatusCode.INVALID_ARGUMENT and "session id" in e.details(),
                    "%s with a %d-character id -> INVALID_ARGUMENT (%s)" % (what, len(long_id), e and e.details()))
        sb.OpenSession(pb.OpenSessionRequest(session_id="y" * 127), timeout=10)
        e = rpc_error(lambda: sb.SessionInfo(pb.SessionInfoRequest(session_id="y" * 130), timeout=10))
        t.check(e is not None and e.code() == grpc.StatusCode.INVALID_ARGUMENT,
                "SessionInfo of 130 y's with a session of 127 -> INVALID_ARGUMENT, not that session")
        sb.DropSession(pb.DropSessionRequest(session_id="y" * 127), timeout=10)

        # 3. text too long for --max-context
        sc.OpenSession(pb.OpenSessionRequest(session_id="short"), timeout=10)
        e = rpc_error(lambda: sc.Append(pb.AppendRequest(session_id="short",
                                                         text=kvlclient.corpus_text(args, 2000)),
                                        timeout=30))
        t.check(e is not None and e.code() == grpc.StatusCode.OUT_OF_RANGE and
                "max context" in e.details(),
                "text too long -> OUT_OF_RANGE (%s)" % (e and e.details()))
        si = sc.SessionInfo(pb.SessionInfoRequest(session_id="short"), timeout=10)
        t.check(si.token_count == 0, "the refused append left the session empty")
        # a text far past what the context can hold is refused before it is tokenized (20 MB of
        # text on a 64-token node)
        t0 = time.time()
        e = rpc_error(lambda: sc.Append(pb.AppendRequest(session_id="short", text="x" * (20 << 20)),
                                        timeout=60))
        t.check(e is not None and e.code() == grpc.StatusCode.OUT_OF_RANGE and
                "before tokenizing" in e.details(),
                "a 20 MB text -> OUT_OF_RANGE before tokenizing (%s, %.2f s)" % (e and e.details(), time.time() - t0))

        # 3a. a client that stops reading its stream (B: --stream-stall-ms 1000): its logprobs
        # (16 KB a token) fill the HTTP/2 windows, B's send waits, and after 1 s B ends the call
        # and frees the session, instead of holding it until the client goes away
        sb.OpenSession(pb.OpenSessionRequest(session_id="unread"), timeout=10)
        sb.Append(pb.AppendRequest(session_id="unread", tokens=list(range(300, 310)), prefill=True), timeout=30)
        stalled = sb.Generate(pb.GenerateRequest(session_id="unread", max_tokens=3000, return_logprobs=True,
                                                 temperature=0), timeout=60)
        t0 = time.time()
        state = "?"
        while time.time() - t0 < 15:
            time.sleep(0.2)
            state = sb.SessionInfo(pb.SessionInfoRequest(session_id="unread"), timeout=5).state
            if state == "idle" and time.time() - t0 > 0.5:
                break
        took = time.time() - t0
        e = rpc_error(lambda: list(stalled))
        t.check(state == "idle" and took < 6 and e is not None and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                and "took no message" in e.details(),
                "a stream nobody reads is ended after stream_stall_ms: the session idle after %.1f s (%s), "
                "the client sees %s" % (took, state, e and e.details()))

        # 3b. a client that reads in bursts, 40 messages every 0.8 s: each of B's sends waits
        # less than stream_stall_ms, but their waits add up, and B ends the call once they come
        # to 1 s in all (before, the stream ran all 3,000 tokens at the client's pace: a minute)
        sb.Append(pb.AppendRequest(session_id="unread", tokens=list(range(310, 320)), prefill=True), timeout=30)
        slow = sb.Generate(pb.GenerateRequest(session_id="unread", max_tokens=3000, return_logprobs=True,
                                              temperature=0), timeout=120)
        t0, got, e, freed = time.time(), 0, None, None
        try:
            for _ in slow:
                got += 1
                if got % 40 == 0:
                    if freed is None and sb.SessionInfo(pb.SessionInfoRequest(session_id="unread"),
                                                        timeout=5).state == "idle":
                        freed = time.time() - t0
                    time.sleep(0.8)
                if time.time() - t0 > 40:
                    break
        except grpc.RpcError as err:
            e = err
        took = time.time() - t0
        t.check(freed is not None and freed < 6, "a client reading in bursts: B freed its session %s s into "
                "the stream (%d messages read by then)" % (freed and round(freed, 1), got))
        t.check(e is not None and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "in all" in e.details(),
                "... and the client, once it read what was on its way, sees %s after %.1f s" % (
                    e and e.details(), took))

        # 4. header naming another model / 5. unknown source model (crafted ImportSpan)
        def import_with(header):
            req = pb.ImportSpanRequest(session_id="x", header=header)
            return rpc_error(lambda: list(sb.ImportSpan(req, timeout=10)))
        ia = sa.Info(pb.InfoRequest(), timeout=10)
        n = 8
        base = dict(version=1, n_layers=ia.n_layers, n_kv_heads=ia.n_kv_heads,
                    head_dim=ia.head_dim, dtype=spb.DTYPE_F32, capture=spb.CAPTURE_PRENORM,
                    t0=0, t1=n, payload_bytes=2 * ia.n_layers * n * ia.n_kv_heads * ia.head_dim * 4 + 4 * n)
        e = import_with(spb.SpanHeader(source=spb.ModelId(name="qwen3-a", hash=ia.model.hash),
                                       target=spb.ModelId(name="qwen3-zzz"), **base))
        t.check(e is not None and e.code() == grpc.StatusCode.FAILED_PRECONDITION and
                "qwen3-zzz" in e.details(), "header naming another model -> FAILED_PRECONDITION (%s)"
                % (e and e.details()))
        e = import_with(spb.SpanHeader(source=spb.ModelId(name="mystery"),
                                       target=spb.ModelId(name="qwen3-b"), **base))
        t.check(e is not None and e.code() == grpc.StatusCode.FAILED_PRECONDITION and
                "no translator" in e.details(), "unknown source model -> FAILED_PRECONDITION (%s)"
                % (e and e.details()))
        bad = dict(base)
        bad["payload_bytes"] += 1
        e = import_with(spb.SpanHeader(source=spb.ModelId(name="qwen3-a"),
                                       target=spb.ModelId(name="qwen3-b"), **bad))
        t.check(e is not None and e.code() == grpc.StatusCode.INVALID_ARGUMENT,
                "inconsistent payload_bytes -> INVALID_ARGUMENT (%s)" % (e and e.details()))
        bad = dict(base)
        bad["n_layers"] += 1
        bad["payload_bytes"] = 2 * bad["n_layers"] * n * ia.n_kv_heads * ia.head_dim * 4 + 4 * n
        e = import_with(spb.SpanHeader(source=spb.ModelId(name="qwen3-a"),
                                       target=spb.ModelId(name="qwen3-b"), **bad))
        t.check(e is not None and e.code() == grpc.StatusCode.FAILED_PRECONDITION and
                "geometry" in e.details(), "geometry mismatch -> FAILED_PRECONDITION (%s)"
                % (e and e.details()))
        # a range past 2^31 (uint32 in the header): a gap, not an overlap that replace allows
        far = dict(base)
        far["t0"], far["t1"] = 2 ** 31 + 5, 2 ** 31 + 5 + n
        req = pb.ImportSpanRequest(session_id="x", replace=True,
                                   header=spb.SpanHeader(source=spb.ModelId(name="qwen3-a", hash=ia.model.hash),
                                                         target=spb.ModelId(name="qwen3-b"), **far))
        e = rpc_error(lambda: list(sb.ImportSpan(req, timeout=10)))
        t.check(e is not None and e.code() == grpc.StatusCode.OUT_OF_RANGE and "leaves a gap" in e.details(),
                "span [2^31+5, +8) with replace -> OUT_OF_RANGE gap (%s)" % (e and "%s %s" % (e.code(), e.details())))
        # a real export to a node without the translator
        sa.OpenSession(pb.OpenSessionRequest(session_id="s1"), timeout=10)
        sa.Append(pb.AppendRequest(session_id="s1", tokens=list(range(300, 320)), prefill=True),
                  timeout=30)
        sb.OpenSession(pb.OpenSessionRequest(session_id="s2"), timeout=10)
        sb.Append(pb.AppendRequest(session_id="s2", tokens=list(range(300, 320)), prefill=True),
                  timeout=30)
        e = rpc_error(lambda: sb.ExportSpan(pb.ExportSpanRequest(session_id="s2", peer=C.addr),
                                            timeout=30))
        t.check(e is not None and e.code() == grpc.StatusCode.FAILED_PRECONDITION and
                "no translator" in e.details(), "export to a node without the translator -> "
                "FAILED_PRECONDITION (%s)" % (e and e.details()))
        # a span overlapping what the peer holds, without replace
        sa.ExportSpan(pb.ExportSpanRequest(session_id="s1", peer=B.addr, peer_session_id="s1b"),
                      timeout=30)
        e = rpc_error(lambda: sa.ExportSpan(pb.ExportSpanRequest(session_id="s1", peer=B.addr,
                                                                 peer_session_id="s1b"), timeout=30))
        t.check(e is not None and e.code() == grpc.StatusCode.FAILED_PRECONDITION and
                "overlaps" in e.details(), "overlapping span without replace -> refused (%s)"
                % (e and e.details()))
        ok = sa.ExportSpan(pb.ExportSpanRequest(session_id="s1", peer=B.addr, peer_session_id="s1b",
                                                replace=True, **{"from": 5}), timeout=30)
        t.check(ok.t0 == 5 and ok.peer_token_count == 20, "clean replace of [5, 20) accepted")

        # 6-9. transfers broken on purpose (span_inject: a misbehaving exporter)
        def inject(mode, session):
            r = subprocess.run([args.span_inject, B.addr, qa, session, mode], capture_output=True,
                               text=True, timeout=60)
            return r.stdout.strip() + r.stderr.strip()
        out = inject("ok", "inj-ok")
        t.check(out.startswith("code=OK"), "control: a well-formed injected span is accepted (%s)" % out)
        for mode, code, words in [("truncate", "DATA_LOSS", "truncated"),
                                  ("oversize", "DATA_LOSS", "larger than"),
                                  ("corrupt", "DATA_LOSS", "checksum mismatch"),
                                  ("hang", "CANCELLED", "")]:
            out = inject(mode, "inj-" + mode)
            # after a client-side cancel the client sees CANCELLED whatever the server says
            t.check(("code=" + code) in out and words in out,
                    "%s payload -> %s (%s)" % (mode, code, out))
            e = rpc_error(lambda: sb.SessionInfo(pb.SessionInfoRequest(session_id="inj-" + mode),
                                                 timeout=10))
            t.check(e is not None and e.code() == grpc.StatusCode.NOT_FOUND,
                    "the failed import left no session behind (%s)" % mode)
        before = rejected(B, "transfer")
        out = inject("vanish", "inj-vanish")
        deadline = time.time() + 20
        while rejected(B, "transfer") == before and time.time() < deadline:
            time.sleep(0.1)
        t.check(rejected(B, "transfer") > before, "peer gone mid-transfer: B rejected the span "
                "(reason=transfer) and kept serving")
        log = open(B.log_path).read()
        t.check("peer gone mid-transfer" in log, "B logged 'peer gone mid-transfer'")
        for reason in ["checksum", "truncated", "wrong_target", "no_translator", "geometry"]:
            t.check(rejected(B, reason) >= 1, "metric kvlingo_spans_rejected_total{reason=%s}" % reason)

        # importer gone mid-transfer, seen from the exporter: a fake importer announces an
        # endpoint and dies while A sends a 2 MB span
        sink = subprocess.Popen([args.span_inject, "--sink"], stdout=subprocess.PIPE, text=True)
        port = int(sink.stdout.readline().split("=")[1])
        sa.OpenSession(pb.OpenSessionRequest(session_id="big"), timeout=10)
        sa.Append(pb.AppendRequest(session_id="big", tokens=[(3 * i) % 4000 for i in range(1000)],
                                   prefill=True), timeout=60)
        t0 = time.time()
        e = rpc_error(lambda: sa.ExportSpan(pb.ExportSpanRequest(
            session_id="big", peer="127.0.0.1:%d" % port, timeout_ms=20000), timeout=60))
        took = time.time() - t0
        sink.wait(timeout=30)
        t.check(e is not None and e.code() == grpc.StatusCode.UNAVAILABLE and took < 10,
                "importer gone mid-transfer -> UNAVAILABLE in %.2f s (%s)" % (took, e and e.details()))
        si = sa.SessionInfo(pb.SessionInfoRequest(session_id="big"), timeout=10)
        t.check(si.state == "idle" and si.cached_count == 1000, "A's session intact after the failed export")

        # an importer whose ImportSpan reply names another UCX worker than its Info: the span
        # goes only to the address the fleet knows the member by, so nothing reaches the other
        sink = subprocess.Popen([args.span_inject, "--sink-redirect"], stdout=subprocess.PIPE, text=True)
        port = int(sink.stdout.readline().split("=")[1])
        e = rpc_error(lambda: sa.ExportSpan(pb.ExportSpanRequest(
            session_id="big", peer="127.0.0.1:%d" % port, timeout_ms=20000), timeout=60))
        got = sink.stdout.readline().strip()
        sink.wait(timeout=30)
        t.check(e is not None and e.code() == grpc.StatusCode.PERMISSION_DENIED
                and "other than its Info" in e.details(),
                "ImportSpan naming another transport address -> PERMISSION_DENIED (%s)" % (e and e.details()))
        t.check(got == "redirect_received=0", "nothing reached the address the reply named (%s)" % got)
        si = sa.SessionInfo(pb.SessionInfoRequest(session_id="big"), timeout=10)
        t.check(si.state == "idle" and si.cached_count == 1000, "A's session intact after the refused export")

        # 10. client cancelling a stream
        stream = sa.Generate(pb.GenerateRequest(session_id="s1", max_tokens=3000), timeout=60)
        got = 0
        for _ in stream:
            got += 1
            if got == 3:
                stream.cancel()
                break
        state, deadline = "", time.time() + 10
        while time.time() < deadline:
            state = sa.SessionInfo(pb.SessionInfoRequest(session_id="s1"), timeout=10).state
            if state == "idle":
                break
            time.sleep(0.05)
        t.check(state == "idle", "cancelled Generate released the session")
        g = list(sa.Generate(pb.GenerateRequest(session_id="s1", max_tokens=2), timeout=30))
        t.check(len(g) == 3 and g[-1].done, "the session generates again after the cancel")

        # the daemons keep serving; B's healthy session is untouched
        si = sb.SessionInfo(pb.SessionInfoRequest(session_id="keep"), timeout=10)
        t.check(si.token_count == 40 and si.cached_count == 40 and si.state == "idle",
                "B's other session is intact")
        g = list(sb.Generate(pb.GenerateRequest(session_id="keep", max_tokens=3), timeout=30))
        t.check(len(g) == 4, "B still generates")
        for node, name in zip(nodes, "ABC"):
            t.check(node.alive(), "node %s still running" % name)

        # 11. what a node computes on: kvlingo_node_info, and devices refused at start
        t.check(re.search(r'^kvlingo_node_info\{model="qwen3-a",device="cpu",backend="cpu"\} 1$',
                          A.metrics(), re.M) is not None, "A exports kvlingo_node_info{device=cpu}")
        for dev, want in [("gpu", "device = 'gpu'"), ("cuda:x", "device = 'cuda:x'"),
                          ("cuda", "cuda")]:
            r = subprocess.run([args.kvld, "--model", qa, "--listen", "127.0.0.1:0",
                                "--transport", "none", "--insecure", "--device", dev],
                               capture_output=True, text=True, timeout=120)
            t.check(r.returncode != 0 and want in r.stderr,
                    "kvld --device %s refused at start with a message (%s)" %
                    (dev, r.stderr.strip().splitlines()[-1:] if r.stderr else r.returncode))

        # 12. a Health/Watch flood: the streams are capped, and Health/Check (the Kubernetes
        # probe) keeps its own slots, so the probe still answers SERVING
        hch = grpc.insecure_channel(C.addr)
        watch = hch.unary_stream("/grpc.health.v1.Health/Watch")
        streams, busy = [], 0
        for i in range(48):
            it = watch(b"", timeout=60)
            try:
                next(it)   # the first update: SERVING
                streams.append(it)
            except grpc.RpcError as err:
                if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "Watch" in err.details():
                    busy += 1
        t.check(len(streams) == 32 and busy == 16,
                "48 Health/Watch streams: %d held, %d refused (32 / 16 expected)" % (len(streams), busy))
        check_raw = hch.unary_unary("/grpc.health.v1.Health/Check")
        t.check(check_raw(b"", timeout=10) == b"\x08\x01", "Health/Check answers SERVING under a Watch flood")
        for it in streams:
            it.cancel()
        hch.close()

        # 13. streams that send headers and never their request: one connection holds no more
        # than the server would ever run (10,000 such streams took 125 MB), the rest wait on
        # the client's side; the node's memory stays put and another connection's probe answers
        fch = grpc.insecure_channel(C.addr)
        info_stream = fch.stream_unary("/kvlingo.v1.Node/Info")
        hold = threading.Event()

        def never():
            hold.wait()
            return
            yield b""
        rss0 = C.rss_kb()
        futs = [info_stream.future(never(), timeout=60) for _ in range(10000)]
        time.sleep(3)
        grew = C.rss_kb() - rss0
        pch = grpc.insecure_channel(C.addr, options=[("grpc.use_local_subchannel_pool", 1)])
        t.check(pch.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=10) == b"\x08\x01",
                "Health/Check on another connection answers SERVING under 10,000 request-less streams")
        t.check(grew < 40 * 1024, "10,000 request-less streams on one connection grew kvld by %d KB "
                "(under 40 MB expected)" % grew)
        hold.set()
        for f in futs:
            f.cancel()
        fch.close()
        pch.close()
    finally:
        codes = [node.stop() for node in nodes]
    t.check(codes == [0, 0, 0], "all nodes exit 0 on SIGTERM (%s)" % codes)
    t.done()


def rejected(node, reason):
    m = re.search(r'^kvlingo_spans_rejected_total\{reason="%s"\} (\S+)$' % reason, node.metrics(),
                  re.M)
    return float(m.group(1)) if m else 0.0


if __name__ == "__main__":
    main()
