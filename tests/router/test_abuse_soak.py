#!/usr/bin/env python3
"""tests/router/test_abuse_soak.py: honest sessions keep completing while an abuser attacks the
fleet (CTest label heavy).

The fleet runs as it would in production: TLS on every hop (mutual between the router and the
nodes), API keys with two tenants (honest, evil), transfer tickets.  For --seconds (default 60):
  - N honest workers (default 32) create sessions and run turns that switch models (cascade with
    escalation every other turn), checking every turn's ledger length; any failed turn fails the
    test (0 lost turns);
  - a victim session and a control session get the same inputs, turn by turn: their greedy
    outputs must stay equal (the victim is the abuser's target throughout);
  - the abuser loops, bounded, over the attacks: another tenant's GetSession / Send /
    CloseSession on honest sessions (NOT_FOUND), no key and a wrong key (UNAUTHENTICATED),
    plaintext and rogue-CA clients of the router and the nodes (refused at the handshake), a
    fleet-CA certificate without the ticket key on the Node API (ExportSpan of the victim to an
    address it names and ImportSpan into the victim: PERMISSION_DENIED), Append of a huge text
    (OUT_OF_RANGE), Generate streams nobody reads (paused, bounded), Health/Watch floods (capped,
    Check still SERVING), and slow connections held on the metrics ports.
At the end: every attack was refused as expected (counts printed), the router and node RSS stay
bounded (figures printed), and once the honest sessions are closed the nodes hold none of them.
usage: test_abuse_soak.py --build BUILD_DIR --work WORK_DIR [--sessions 32] [--seconds 60]
"""
import argparse
import importlib
import os
import shutil
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rtest  # noqa: E402
import tlscerts  # noqa: E402
from rtest import check  # noqa: E402

HONEST_KEY = "sk-honest-0123456789abcdef0123"
EVIL_KEY = "sk-evil-0123456789abcdef012345"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=60)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    import grpc
    pki = tlscerts.make(os.path.join(a.work, "pki"))
    keys = os.path.join(a.work, "api-keys.yaml")
    with open(keys, "w") as f:
        f.write("tenants:\n"
                "  - {name: honest, keys: [%s], admin: true}\n"
                "  - {name: evil, keys: [%s], max_sessions: 8, tokens_per_minute: 2000}\n"
                % (HONEST_KEY, EVIL_KEY))
    mports = {"qwen3-a": rtest.free_port(), "qwen3-b": rtest.free_port()}

    class MetricsFleet(rtest.Fleet):
        def start_node(self, m, trdir=None, kvld_args=()):
            return super().start_node(m, trdir, list(kvld_args) + ["--metrics", "127.0.0.1:%d" % mports[m]])

    fleet = MetricsFleet(a.build, a.work, tls=pki, api_keys=keys, peers=True,
                         policy={"name": "cascade", "models": ["qwen3-a", "qwen3-b"],
                                 "entropy_threshold": 100, "calm_turns": 1},
                         kvld_args=("--max-sessions", "256"))
    honest = fleet.client(timeout=120, api_key=HONEST_KEY)
    evil = fleet.client(timeout=30, api_key=EVIL_KEY)
    node_pb = importlib.import_module("kvlingo.v1.node_pb2")
    node_grpc = importlib.import_module("kvlingo.v1.node_pb2_grpc")
    router_pb = importlib.import_module("kvlingo.v1.router_pb2")
    router_grpc = importlib.import_module("kvlingo.v1.router_pb2_grpc")
    ca = tlscerts.read(pki["ca"])
    member = grpc.ssl_channel_credentials(root_certificates=ca,
                                          private_key=tlscerts.read(pki["client"][1]),
                                          certificate_chain=tlscerts.read(pki["client"][0]))
    rogue = grpc.ssl_channel_credentials(root_certificates=ca,
                                         private_key=tlscerts.read(pki["rogue-node"][1]),
                                         certificate_chain=tlscerts.read(pki["rogue-node"][0]))
    node_addr = {m: "127.0.0.1:%d" % p for m, p in fleet.node_ports.items()}

    stats = {"turns": 0, "switches": 0, "translate": 0, "errors": [], "sessions": 0}
    refused = {}       # attack -> times refused as expected
    surprises = []     # an attack that got through, or failed the wrong way
    lock = threading.Lock()
    stop_at = time.time() + a.seconds
    text = rtest.corpus_text(0, 20000)

    def refused_as(what, fn, codes):
        try:
            fn()
        except grpc.RpcError as e:
            if e.code() in codes:
                with lock:
                    refused[what] = refused.get(what, 0) + 1
                return
            with lock:
                surprises.append("%s: %s %s" % (what, e.code(), e.details()))
            return
        with lock:
            surprises.append("%s: succeeded" % what)

    # ---- honest traffic ------------------------------------------------------------------------
    def worker(w):
        def seen(sid):
            with lock:
                honest_ids.append(sid)
        rtest.switching_sessions(fleet.client(timeout=120, api_key=HONEST_KEY), w, stop_at, text,
                                 stats, lock, turns=6, on_session=seen)

    honest_ids = []
    victim = honest.create_session()
    control = honest.create_session()
    victim_turns = []

    def victim_worker():
        t = 0
        try:
            while time.time() < stop_at:
                off = (t * 389) % 19000
                got = []
                for sid in (victim, control):
                    ids, _, s = honest.send_all(sid, text[off:off + (200 if t == 0 else 30)],
                                                max_tokens=6, escalate=(t % 2 == 1))
                    got.append((ids, s.model))
                check(got[0] == got[1], "turn %d: victim %s != control %s" % (t, got[0], got[1]))
                victim_turns.append(got[0][1])
                t += 1
        except Exception as e:  # noqa: BLE001
            with lock:
                stats["errors"].append("victim: %r" % e)

    # ---- the abuser ----------------------------------------------------------------------------
    NF, UA, PD = grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED
    UN, RE = grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED

    def abuser():
        n = 0
        held = []                   # slow metrics connections, at most 200
        nobody_reads = []           # Generate streams never read, at most 4
        plain = {m: node_grpc.NodeStub(grpc.insecure_channel(addr)) for m, addr in node_addr.items()}
        insider = {m: node_grpc.NodeStub(grpc.secure_channel(addr, member)) for m, addr in node_addr.items()}
        outsider = {m: node_grpc.NodeStub(grpc.secure_channel(addr, rogue)) for m, addr in node_addr.items()}
        no_key = fleet.client(timeout=10, api_key="")
        bad_key = fleet.client(timeout=10, api_key="sk-wrong-0123456789abcdef0123")
        plain_router = router_grpc.RouterStub(grpc.insecure_channel(fleet.addr))
        while time.time() < stop_at - 2:
            n += 1
            target = victim if n % 2 else (honest_ids[-1] if honest_ids else victim)
            # another tenant, no key, a wrong key
            refused_as("evil GetSession(include_tokens)", lambda: evil.get_session(target, True), (NF,))
            refused_as("evil Send", lambda: evil.send_all(target, "poison", max_tokens=2), (NF, RE))
            refused_as("evil CloseSession", lambda: evil.close_session(target), (NF,))
            refused_as("no key GetSession", lambda: no_key.get_session(target), (UA,))
            refused_as("wrong key CloseSession", lambda: bad_key.close_session(target), (UA,))
            refused_as("plaintext client -> router",
                       lambda: plain_router.GetSession(router_pb.GetSessionRequest(session_id=target), timeout=5),
                       (UN,))
            for m in node_addr:
                # plaintext and a certificate of another CA: refused at the handshake
                refused_as("plaintext -> node", lambda: plain[m].DropSession(
                    node_pb.DropSessionRequest(session_id=target), timeout=5), (UN,))
                refused_as("rogue-CA cert -> node", lambda: outsider[m].DropSession(
                    node_pb.DropSessionRequest(session_id=target), timeout=5), (UN,))
                # a fleet-CA certificate, but no ticket key: no span moves
                other = [x for x in node_addr if x != m][0]
                refused_as("member: ExportSpan victim -> any address", lambda: insider[m].ExportSpan(
                    node_pb.ExportSpanRequest(session_id=victim, peer="127.0.0.1:9", timeout_ms=2000),
                    timeout=10), (PD, NF))
                refused_as("member: ExportSpan evil -> victim (replace)", lambda: insider[m].ExportSpan(
                    node_pb.ExportSpanRequest(session_id="evil-%d" % n, peer=node_addr[other],
                                              peer_session_id=victim, replace=True,
                                              ticket=os.urandom(96), timeout_ms=2000), timeout=10), (PD, NF))
                refused_as("member: ImportSpan into victim", lambda: list(insider[m].ImportSpan(
                    node_pb.ImportSpanRequest(session_id=victim, replace=True), timeout=10)),
                    (PD, grpc.StatusCode.INVALID_ARGUMENT))
            if n % 5 == 1:
                sid = "abuse-%d" % n
                try:
                    insider["qwen3-a"].OpenSession(node_pb.OpenSessionRequest(session_id=sid), timeout=10)
                    refused_as("member: Append 8 MB text", lambda: insider["qwen3-a"].Append(
                        node_pb.AppendRequest(session_id=sid, text="x" * (8 << 20)), timeout=30),
                        (grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.INVALID_ARGUMENT, RE))
                    if len(nobody_reads) < 4:
                        insider["qwen3-a"].Append(node_pb.AppendRequest(session_id=sid, tokens=[11, 12, 13]),
                                                  timeout=10)
                        nobody_reads.append(insider["qwen3-a"].Generate(node_pb.GenerateRequest(
                            session_id=sid, max_tokens=4000, return_logprobs=True), timeout=a.seconds + 60))
                    else:
                        insider["qwen3-a"].DropSession(node_pb.DropSessionRequest(session_id=sid), timeout=10)
                except grpc.RpcError as e:
                    with lock:
                        surprises.append("member session setup: %s %s" % (e.code(), e.details()))
            if n % 7 == 1:
                # a Watch flood: at most 32 held, Check keeps answering
                ch = grpc.secure_channel(fleet.addr, grpc.ssl_channel_credentials(root_certificates=ca))
                watch = ch.unary_stream("/grpc.health.v1.Health/Watch")
                streams, busy = [], 0
                for _ in range(40):
                    it = watch(b"", timeout=30)
                    try:
                        next(it)
                        streams.append(it)
                    except grpc.RpcError as e:
                        busy += e.code() == RE
                ok = ch.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=10) == b"\x08\x01"
                with lock:
                    if ok and len(streams) <= 32 and busy >= 8:
                        refused["Health/Watch flood (Check still SERVING)"] = \
                            refused.get("Health/Watch flood (Check still SERVING)", 0) + 1
                    else:
                        surprises.append("Watch flood: %d held, %d refused, Check %s" % (len(streams), busy, ok))
                for it in streams:
                    it.cancel()
                ch.close()
            tries = 0
            while len(held) < 200 and tries < 300:   # slow connections on the metrics ports, held open
                tries += 1
                port = [mports["qwen3-a"], mports["qwen3-b"], fleet.metrics_port][tries % 3]
                try:
                    s = socket.create_connection(("127.0.0.1", port), 5)
                    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")   # never finished
                    held.append(s)
                except OSError:
                    pass   # refused by the endpoint's connection cap: what it is for
            if n % 10 == 1:
                # the held connections starve nobody else: /healthz answers on every metrics port
                # to another address (127.0.0.1 itself is over its per-address cap: by design)
                import http.client
                for port in (mports["qwen3-a"], mports["qwen3-b"], fleet.metrics_port):
                    try:
                        hc = http.client.HTTPConnection("127.0.0.1", port, timeout=10,
                                                        source_address=("127.0.0.2", 0))
                        hc.request("GET", "/healthz")
                        status = hc.getresponse().status
                        hc.close()
                        if status != 200:
                            raise OSError("HTTP %d" % status)
                        with lock:
                            refused["slow metrics connections (/healthz answers)"] = \
                                refused.get("slow metrics connections (/healthz answers)", 0) + 1
                    except OSError as e:
                        with lock:
                            surprises.append("/healthz on %d under slow connections: %r" % (port, e))
            time.sleep(0.2)
        for s in held:
            s.close()
        for it in nobody_reads:
            it.cancel()

    try:
        rss0 = None
        threads = [threading.Thread(target=worker, args=(w,)) for w in range(a.sessions)]
        threads.append(threading.Thread(target=victim_worker))
        ab = threading.Thread(target=abuser)
        for th in threads:
            th.start()
        time.sleep(min(15.0, a.seconds / 4))
        rss0 = {"router": fleet.router.rss_kb(), **{m: p.rss_kb() for m, p in fleet.nodes.items()}}
        ab.start()
        time.sleep(a.seconds / 2)
        rss_mid = {"router": fleet.router.rss_kb(), **{m: p.rss_kb() for m, p in fleet.nodes.items()}}
        for th in threads + [ab]:
            th.join(a.seconds + 180)
        rss1 = {"router": fleet.router.rss_kb(), **{m: p.rss_kb() for m, p in fleet.nodes.items()}}
        print("abuse soak: %d honest workers x %.0f s: %d turns (%d switches, %d translated), %d sessions "
              "closed, %d errors; victim = control over %d turns" % (
                  a.sessions, a.seconds, stats["turns"], stats["switches"], stats["translate"],
                  stats["sessions"], len(stats["errors"]), len(victim_turns)))
        for k, v in sorted(refused.items()):
            print("  refused as expected: %-50s x%d" % (k, v))
        for s in surprises[:10]:
            print("  SURPRISE: " + s)
        print("  RSS (MB) once warm -> half-way -> at the end: " + ", ".join(
            "%s %.0f -> %.0f -> %.0f" % (k, rss0[k] / 1024, rss_mid[k] / 1024, rss1[k] / 1024) for k in rss0))
        for e in stats["errors"][:5]:
            print("  " + e)
        check(not stats["errors"], "%d honest turns failed" % len(stats["errors"]))
        check(not surprises, "%d attacks were not refused as expected" % len(surprises))
        check(stats["switches"] > a.sessions, "too few switches (%d)" % stats["switches"])
        check(len(victim_turns) >= 3, "the victim ran only %d turns" % len(victim_turns))
        check(len(refused) >= 12, "only %d kinds of attack ran" % len(refused))
        with open(os.path.join(a.build, "kvlingo-router"), "rb") as f:
            sanitized = b"AddressSanitizer" in f.read()
        if sanitized:
            print("  (sanitizer build: RSS bounds skipped, LeakSanitizer checks at exit)")
        else:
            check(rss1["router"] - rss0["router"] < 48 * 1024, "router RSS grew by %d kB" % (rss1["router"] - rss0["router"]))
            # a node keeps caches of bounded size: idle KV blocks (256 MiB at most) and span
            # payload buffers (128 MiB); what it holds beyond them must not grow in the second
            # half of the soak
            for m in fleet.nodes:
                check(rss1[m] - rss0[m] < (256 + 128 + 64) * 1024, "kvld %s RSS grew by %d kB" % (m, rss1[m] - rss0[m]))
                check(rss1[m] - rss_mid[m] < 64 * 1024, "kvld %s RSS grew by %d kB in the second half" % (
                    m, rss1[m] - rss_mid[m]))
        for sid in (victim, control):
            honest.close_session(sid)
        time.sleep(1.0)
        ln = honest.list_nodes()
        check(ln.sessions_open == 0, "sessions open after closing: %d" % ln.sessions_open)
        print("test_abuse_soak: PASS")
    finally:
        fleet.stop()


if __name__ == "__main__":
    main()
