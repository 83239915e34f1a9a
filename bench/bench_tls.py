#!/usr/bin/env python3
"""bench/bench_tls.py: what TLS costs a turn: switch TTFT and re-prefill TTFT with TLS on every
gRPC hop (client -> router server TLS, router -> nodes and node -> node mutual TLS) against the
same fleet in plaintext (--insecure), on loopback.

Two fleets run side by side (kvld qwen3-a + qwen3-b + kvlingo-router each, certificates made
with openssl by tests/router/tlscerts.py); every repeat runs the same turns on both, in
alternating order, so that load from other processes falls on both alike.  A turn is the one of
bench_switch.py: a fresh session reads C tokens on the source model, then the target answers
8 new tokens either by translating the shipped span (switch) or by re-reading everything
(re-prefill, force_reprefill).  TTFT as the client measures it (request sent -> first token);
medians of the repeats.
Then, with no fleet running, bench_rpc (bench_rpc.c) on the same certificates: one gRPC message
through the rpc layer in one process, plaintext against mutual TLS, the floor under what TLS
costs each leg of a turn.
usage: bench_tls.py --build BUILD_DIR [--contexts 64,512,2048] [--repeats 7] [--threads 1]
                    [--rpc-calls 2000] [--client python|c]
--client c: the timed turns through build/bench_send, a C client (as bench_switch.py --client c),
so the client's TLS is the rpc layer's (OpenSSL through gRPC core) as on every other leg.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "router"))
sys.path.insert(0, HERE)
import rtest  # noqa: E402
import tlscerts  # noqa: E402
from bench_switch import bench_client, client_turn, close_client, require_client  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", required=True)
    ap.add_argument("--contexts", default="64,512,2048", help="context lengths in tokens (default %(default)s)")
    ap.add_argument("--repeats", type=int, default=7, help="interleaved repeats per context (default %(default)s)")
    ap.add_argument("--src", default="qwen3-a", help="the source model of the switch (default %(default)s)")
    ap.add_argument("--dst", default="qwen3-b", help="the target model (default %(default)s)")
    ap.add_argument("--threads", type=int, default=1, help="OPENBLAS_NUM_THREADS of the nodes")
    ap.add_argument("--new-tokens", type=int, default=8, help="input tokens of the switched turn")
    ap.add_argument("--rpc-calls", type=int, default=2000,
                    help="calls of each kind for bench_rpc, the per-message floor printed last (default %(default)s)")
    ap.add_argument("--work", default=None, help="keep the fleets' files and logs here (default: a temporary dir)")
    ap.add_argument("--client", default="python", choices=("python", "c"),
                    help="the timed turns' client: grpcio (default) or build/bench_send, a C client")
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    require_client(a)
    os.environ["OPENBLAS_NUM_THREADS"] = str(a.threads)
    work = a.work or tempfile.mkdtemp(prefix="kvlingo-bench-tls-")
    try:
        run(a, work)
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)


def run(a, work):
    contexts = [int(x) for x in a.contexts.split(",")]
    pki = tlscerts.make(os.path.join(work, "pki"))
    kw = dict(policy={"name": "pinned"}, guardrail={"shadow_fraction": 0.0}, peers=True)
    fleets, clients = {}, {}
    try:
        fleets["plain"] = rtest.Fleet(a.build, os.path.join(work, "plain"), **kw)
        fleets["tls"] = rtest.Fleet(a.build, os.path.join(work, "tls"), tls=pki, **kw)
        for k, f in fleets.items():
            clients[k] = bench_client(a, f)
        c0 = clients["plain"]
        sid = c0.create_session()
        c0.send_all(sid, rtest.corpus_text(0, 12000), max_tokens=1, model=a.src)
        corpus = list(c0.get_session(sid, include_tokens=True).tokens)[:-1]
        c0.close_session(sid)
        user = corpus[2100:2100 + a.new_tokens]
        print("bench_tls: %s client -> kvlingo-router -> kvld x2 on loopback, %s -> %s; plaintext vs TLS "
              "(mutual between fleet members); OPENBLAS_NUM_THREADS=%d; medians of %d interleaved "
              "repeats; client-measured TTFT" % ("C (bench_send)" if a.client == "c" else "Python (grpcio)", a.src,
                                               a.dst, a.threads, a.repeats))
        print("%8s | %10s %10s %8s | %10s %10s %8s | %9s %9s %8s %7s" % (
            "context", "switch", "switch", "TLS", "re-prefill", "re-prefill", "TLS", "messages",
            "messages", "TLS", "of"))
        print("%8s | %10s %10s %8s | %10s %10s %8s | %9s %9s %8s %7s" % (
            "", "plain", "TLS", "cost", "plain", "TLS", "cost", "plain", "TLS", "cost", "switch"))
        for ctx in contexts:
            prompt = corpus[:ctx]
            res = {(k, m): [] for k in fleets for m in ("t", "p", "m")}
            for r in range(a.repeats + 1):           # repeat 0 warms every path up
                order = ("plain", "tls") if r % 2 == 0 else ("tls", "plain")
                for k in order:
                    c = clients[k]
                    for mode in ("t", "p"):
                        sid = c.create_session()
                        c.send_all(sid, tokens=prompt, max_tokens=1, model=a.src)
                        ttft, s = client_turn(c, sid, tokens=user, max_tokens=1, model=a.dst,
                                              force_reprefill=(mode == "p"))
                        if s.switch_mode != (1 if mode == "t" else 2):
                            raise SystemExit("%s: unexpected switch mode %d (%s)" % (k, s.switch_mode,
                                                                                     s.fallback_reason))
                        if r > 0:
                            res[(k, mode)].append(ttft * 1e3)
                            if mode == "t":
                                # what TLS can touch: the TTFT less the work no message carries
                                # (the source's export, the UCX move, translate, the forward)
                                res[(k, "m")].append((ttft - s.export_seconds - s.transfer_seconds -
                                                      s.translate_seconds - s.forward_seconds) * 1e3)
                        c.close_session(sid)
            med = {key: statistics.median(v) for key, v in res.items()}
            dm = med[("tls", "m")] - med[("plain", "m")]
            print("%8d | %7.2f ms %7.2f ms %+6.2f ms | %7.2f ms %7.2f ms %+6.2f ms | %6.2f ms %6.2f ms "
                  "%+5.2f ms %+6.1f%%" % (
                      ctx, med[("plain", "t")], med[("tls", "t")], med[("tls", "t")] - med[("plain", "t")],
                      med[("plain", "p")], med[("tls", "p")], med[("tls", "p")] - med[("plain", "p")],
                      med[("plain", "m")], med[("tls", "m")], dm, 100.0 * dm / med[("plain", "t")]))
        print("(TLS cost = TLS median - plaintext median; channels are long-lived, so the handshakes "
              "happen once, before the first repeat: what remains is encryption of the messages. "
              "messages = a switch's TTFT less what no gRPC message carries, from its turn summary: "
              "the source's export, the UCX transfer, translate and the target's forward; its TLS "
              "cost, also as a share of the plaintext switch TTFT, is what TLS adds with the noise "
              "of those compute phases taken out)")
    finally:
        try:
            for c in clients.values():
                close_client(c)
        finally:
            for f in fleets.values():
                f.stop()
    # the floor under those costs: one gRPC message through the rpc layer, no fleet running
    rpc = os.path.join(a.build, "bench_rpc")
    if not os.path.exists(rpc):
        print("\nbench_tls: %s was not built (it needs the server components): no per-message figures" % rpc)
        return
    print()
    sys.stdout.flush()
    r = subprocess.run([rpc, "--certs", os.path.dirname(pki["ca"]), "--calls", str(a.rpc_calls)])
    if r.returncode != 0:
        raise SystemExit("bench_tls: bench_rpc failed (exit %d)" % r.returncode)


if __name__ == "__main__":
    main()
