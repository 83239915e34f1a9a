#!/usr/bin/env python3
"""tests/router/test_tls.py: a kvlingo fleet with TLS on every gRPC hop, on loopback.

Certificates are made here with the openssl command line (tlscerts.py): a fleet CA signing the
router's, the nodes' and a client's certificate, and a second "rogue" CA with a node
certificate of its own.

  1. kvld and kvlingo-router without TLS files and without --insecure refuse to start, saying
     how to fix it;
  2. a fleet with TLS (clients -> router: server TLS; router -> nodes and node -> node: mutual
     TLS) completes turns, including a translated switch, for Python grpcio (root certificates
     only, no client certificate) and for `kvlingo chat --tls-ca`;
  3. a plaintext client against the TLS router is refused (UNAVAILABLE), so is a client that
     does not trust the fleet CA (grpcio and `kvlingo chat`);
  4. the plaintext health ports (--health-listen, health_listen) answer grpc.health.v1 and
     nothing else; the OpenAI HTTP API serves HTTPS with the router's certificate;
  5. the Node API refuses a caller with a node certificate of the rogue CA, a caller without a
     certificate, and a plaintext caller (UNAVAILABLE: the handshake fails), accepts one with a
     certificate of the fleet CA; the fleet keeps serving turns and switches afterwards.
usage: test_tls.py --build BUILD_DIR --work WORK_DIR
"""
import argparse
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rtest  # noqa: E402
import tlscerts  # noqa: E402
from rtest import check  # noqa: E402

MSG = "no TLS certificate: set tls_cert/tls_key/tls_ca or pass --insecure to run plaintext"


def refused(fn, what):
    """fn() must fail with UNAVAILABLE (a failed TLS handshake reads so to a gRPC client)."""
    import grpc
    try:
        fn()
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.UNAVAILABLE,
              "%s: expected UNAVAILABLE, got %s: %s" % (what, e.code().name, e.details()))
        print("  ok: %s refused: UNAVAILABLE (%s)" % (what, (e.details() or "")[:90]))
        return
    raise AssertionError("%s: the call succeeded" % what)


def health_status(addr, service):
    """grpc.health.v1 Check over plaintext: the status number (1 SERVING, 2 NOT_SERVING)."""
    import grpc
    ch = grpc.insecure_channel(addr)
    req = bytes([0x0a, len(service)]) + service.encode() if service else b""
    resp = ch.unary_unary("/grpc.health.v1.Health/Check")(req, timeout=10)
    ch.close()
    return resp[1] if len(resp) >= 2 and resp[0] == 0x08 else 0


def node_stub(fleet, model, creds):
    import grpc
    import importlib
    node_grpc = importlib.import_module("kvlingo.v1.node_pb2_grpc")
    addr = "127.0.0.1:%d" % fleet.node_ports[model]
    ch = grpc.insecure_channel(addr) if creds is None else grpc.secure_channel(addr, creds)
    return node_grpc.NodeStub(ch), ch


def switch_turns(c, sid, first_text):
    """Two turns on session sid: qwen3-a, then escalate to qwen3-b (a translated switch)."""
    _, _, s1 = c.send_all(sid, first_text, max_tokens=4)
    _, _, s2 = c.send_all(sid, rtest.corpus_text(2000, 60), max_tokens=4, escalate=True)
    return s1, s2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    pki = tlscerts.make(os.path.join(a.work, "pki"))
    import grpc

    # 1. neither TLS nor --insecure: a clear refusal at start
    kvld = os.path.join(a.build, "daemon", "kvld")
    r = subprocess.run([kvld, "--model", os.path.join(rtest.SRC, "models", "qwen3-a"), "--listen",
                        "127.0.0.1:0", "--transport", "none"], capture_output=True, text=True, timeout=60)
    check(r.returncode == 1 and MSG in r.stdout + r.stderr, "kvld without TLS: rc %d %r" % (r.returncode, r.stderr))
    cfg = os.path.join(a.work, "plain.yaml")
    with open(cfg, "w") as f:
        f.write("listen: 127.0.0.1:0\ntokenizer: %s\nledger: %s\nnodes:\n  - {name: a0, address: "
                "127.0.0.1:1, model: qwen3-a}\npolicy:\n  name: pinned\n" % (
                    os.path.join(rtest.SRC, "models", "qwen3-a"), os.path.join(a.work, "plain.db")))
    r = subprocess.run([os.path.join(a.build, "kvlingo-router"), "--config", cfg], capture_output=True,
                       text=True, timeout=60)
    check(r.returncode == 1 and MSG in r.stderr, "router without TLS: rc %d %r" % (r.returncode, r.stderr))
    print("  ok: kvld and kvlingo-router without TLS files nor --insecure refuse: %s" % MSG)

    hport, oport = rtest.free_port(), rtest.free_port()
    fleet = rtest.Fleet(a.build, os.path.join(a.work, "fleet"), tls=pki, peers=True,
                        kvld_args=("--health-listen", "127.0.0.1:0"),
                        extra_top={"health_listen": "127.0.0.1:%d" % hport,
                                   "http_listen": "127.0.0.1:%d" % oport},
                        policy={"name": "cascade", "models": ["qwen3-a", "qwen3-b"],
                                "entropy_threshold": 100, "calm_turns": 1},
                        guardrail={"shadow_fraction": 0.0, "kl_budget": 100})
    try:
        for m in ("qwen3-a", "qwen3-b"):
            with open(fleet.nodes[m].log_path) as f:
                log = f.read()
            check("msg=tls " in log and "client_certs=required" in log and "msg=plaintext" not in log,
                  "kvld %s logs its TLS identity" % m)
        with open(fleet.router.log_path) as f:
            check("tls: CN=kvlingo-router" in f.read(), "the router logs its TLS identity")
        # node -> node (--peers): mutual TLS with each node's own certificate
        for m in ("qwen3-a", "qwen3-b"):
            t0 = time.time()
            while "msg=peer_ready" not in open(fleet.nodes[m].log_path).read():
                check(time.time() - t0 < 60, "kvld %s never connected its peer over TLS" % m)
                time.sleep(0.1)
        print("  ok: the nodes connected each other (peers) over mutual TLS")

        # the plaintext health ports (for probes that cannot speak TLS): health, nothing else
        import re
        for m in ("qwen3-a", "qwen3-b"):
            t0 = time.time()
            while not re.search(r"msg=serving .*health_port=(\d+)", open(fleet.nodes[m].log_path).read()):
                check(time.time() - t0 < 60, "kvld %s: no serving line" % m)
                time.sleep(0.1)
            port = int(re.search(r"msg=serving .*health_port=(\d+)", open(fleet.nodes[m].log_path).read()).group(1))
            check(port > 0, "kvld %s reports its health port" % m)
            for svc in ("", "kvlingo.v1.Node"):
                check(health_status("127.0.0.1:%d" % port, svc) == 1, "kvld %s health %r SERVING" % (m, svc))
            ch = grpc.insecure_channel("127.0.0.1:%d" % port)
            try:
                ch.unary_unary("/kvlingo.v1.Node/Info")(b"", timeout=10)
                raise AssertionError("the health port served Node/Info")
            except grpc.RpcError as e:
                check(e.code() == grpc.StatusCode.UNIMPLEMENTED, "Info on the health port: %s" % e.code())
            ch.close()
        check(health_status("127.0.0.1:%d" % hport, "kvlingo.v1.Router") == 1, "router health port SERVING")
        print("  ok: plaintext health ports of both nodes and the router answer SERVING and serve nothing else")

        # the OpenAI door serves HTTPS with the router's certificate; plain HTTP gets no answer
        url = "https://127.0.0.1:%d/v1/models" % oport
        r = subprocess.run(["curl", "-sS", "--max-time", "20", "--cacert", pki["ca"], "-H",
                            "Authorization: Bearer %s" % fleet.default_key, url],
                           capture_output=True, text=True, timeout=60)
        check(r.returncode == 0 and "qwen3-b" in r.stdout, "HTTPS /v1/models: rc %d %r %r" % (
            r.returncode, r.stdout[:200], r.stderr))
        r2 = subprocess.run(["curl", "-sS", "--max-time", "20", "--cacert", pki["rogue-ca"], url],
                            capture_output=True, text=True, timeout=60)
        r3 = subprocess.run(["curl", "-sS", "--max-time", "5", url.replace("https:", "http:")],
                            capture_output=True, text=True, timeout=60)
        check(r2.returncode != 0 and r3.returncode != 0 and "qwen3-b" not in r3.stdout,
              "HTTPS door: untrusting client rc %d, plain HTTP rc %d %r" % (r2.returncode, r3.returncode, r3.stdout[:100]))
        print("  ok: the OpenAI API answers over HTTPS (fleet CA); a client of another CA and plain HTTP fail")

        # 2. turns with a translated switch; this client has root certificates only
        c = fleet.client()
        sid = c.create_session()
        s1, s2 = switch_turns(c, sid, rtest.corpus_text(0, 300))
        check(s1.model == "qwen3-a" and s2.model == "qwen3-b", "models: %s, %s" % (s1.model, s2.model))
        check(rtest.MODES[s2.switch_mode] == "translate",
              "switch over TLS: %s (%s)" % (rtest.MODES[s2.switch_mode], s2.fallback_reason))
        check(s2.span_tokens > 0, "the translated switch shipped a span (%d tokens)" % s2.span_tokens)
        print("  ok: TLS fleet: turn on qwen3-a, then a translated switch to qwen3-b (%d span tokens, "
              "TTFT %.1f ms); the client presented no certificate" % (s2.span_tokens, s2.ttft_seconds * 1e3))
        kv = os.path.join(a.build, "kvlingo")
        r = subprocess.run([kv, "chat", "--router", fleet.addr, "--tls-ca", pki["ca"], "--max-tokens", "3",
                            "--api-key", fleet.default_key, "Hello"], capture_output=True, text=True, timeout=120)
        check(r.returncode == 0 and "qwen3-a" in r.stdout, "kvlingo chat --tls-ca: rc %d %r %r" % (
            r.returncode, r.stdout, r.stderr))
        print("  ok: kvlingo chat --tls-ca: %s" % r.stdout.strip().split("\n")[-1])

        # 3. plaintext and untrusting clients of the router
        import importlib
        router_grpc = importlib.import_module("kvlingo.v1.router_pb2_grpc")
        router_pb = importlib.import_module("kvlingo.v1.router_pb2")
        ch = grpc.insecure_channel(fleet.addr)
        refused(lambda: router_grpc.RouterStub(ch).ListNodes(router_pb.ListNodesRequest(), timeout=10),
                "plaintext client -> TLS router")
        ch.close()
        rogue = grpc.ssl_channel_credentials(root_certificates=tlscerts.read(pki["rogue-ca"]))
        ch = grpc.secure_channel(fleet.addr, rogue)
        refused(lambda: router_grpc.RouterStub(ch).ListNodes(router_pb.ListNodesRequest(), timeout=10),
                "client trusting another CA -> router")
        ch.close()
        # each with the hint that fits: a plaintext client of a TLS router, a CA that did not sign it
        for args, what, hint in ((["--insecure"], "--insecure", "does the router run TLS?"),
                                 (["--tls-ca", pki["rogue-ca"]], "--tls-ca rogue CA",
                                  "does not verify against --tls-ca")):
            r = subprocess.run([kv, "chat", "--router", fleet.addr] + args + ["--timeout-ms", "10000", "Hi"],
                               capture_output=True, text=True, timeout=60)
            check(r.returncode != 0 and "UNAVAILABLE" in r.stderr and hint in r.stderr,
                  "kvlingo chat %s: rc %d %r" % (what, r.returncode, r.stderr))
            print("  ok: kvlingo chat %s against the TLS router fails: %s" % (what, r.stderr.strip()[:100]))

        # 4. the Node API: mutual TLS with the fleet CA
        node_pb = importlib.import_module("kvlingo.v1.node_pb2")
        ca = tlscerts.read(pki["ca"])
        rc, rk = pki["rogue-node"]
        cases = [
            (grpc.ssl_channel_credentials(root_certificates=ca, private_key=tlscerts.read(rk),
                                          certificate_chain=tlscerts.read(rc)), "rogue-CA node certificate -> kvld"),
            (grpc.ssl_channel_credentials(root_certificates=ca), "no client certificate -> kvld"),
            (None, "plaintext -> kvld"),
        ]
        for m in ("qwen3-a", "qwen3-b"):
            for creds, what in cases:
                stub, ch = node_stub(fleet, m, creds)
                refused(lambda: stub.Info(node_pb.InfoRequest(), timeout=10), "%s %s" % (what, m))
                ch.close()
        # gRPC core's own lines about those handshakes are in the node's logfmt log, one per
        # source line every 10 s, not bare "E1207 ..." lines on stderr
        for m in ("qwen3-a", "qwen3-b"):
            with open(fleet.nodes[m].log_path) as f:
                lines = f.read().split("\n")
            core = [ln for ln in lines if "msg=grpc_core" in ln and "andshake" in ln]
            check(core and not [ln for ln in lines if re.match(r"[EWI]\d{4} ", ln)],
                  "kvld %s: gRPC core's lines: %r" % (m, core[:3] or [ln for ln in lines if re.match(r"[EWI]\d{4} ", ln)][:3]))
            check(len(core) < 3, "kvld %s: %d handshake lines for 3 refused handshakes (not rate-limited)" % (m, len(core)))
        print("  ok: gRPC core's handshake failures are logfmt lines of the node's log (%d in kvld qwen3-b)" % len(core))
        info = fleet.node_info("qwen3-a")
        check(info.model.name == "qwen3-a", "fleet-CA client certificate: Info %s" % info)
        print("  ok: a client certificate of the fleet CA reaches the Node API (Info: %s)" % info.model.name)
        # the fleet still serves, switches included
        sid2 = c.create_session()
        s3, s4 = switch_turns(c, sid2, rtest.corpus_text(500, 300))
        check(rtest.MODES[s4.switch_mode] == "translate", "after the refusals: %s (%s)" % (
            rtest.MODES[s4.switch_mode], s4.fallback_reason))
        for m in ("qwen3-a", "qwen3-b"):
            check(fleet.nodes[m].alive(), "kvld %s still running" % m)
        print("  ok: after the refused callers the fleet serves turns and translated switches")
    finally:
        fleet.stop()
    print("test_tls: all checks passed")


if __name__ == "__main__":
    main()
