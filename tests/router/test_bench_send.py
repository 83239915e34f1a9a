#!/usr/bin/env python3
"""tests/router/test_bench_send.py: bench_send, the C client of bench_switch.py --client c.

Real processes on loopback: a TLS fleet (two kvld nodes, kvlingo-router, certificates made by
tlscerts.py) and build/bench_send verifying the router with the fleet CA, its key from
KVL_API_KEY:
  1. a session's source turn (Python client), then the switched turn through bench_send: "ok",
     a TTFT in seconds no shorter than the router's own, the summary decoded with the generated
     Python protobuf classes says translate, one token, and the session's ledger (GetSession) holds the turn;
  2. a refused request (an unknown session): "err 5 ..." (NOT_FOUND) and the next line is
     served;
  3. line by line, as the benches drive it: each answer read before the next request is
     written (an answer left in a buffer hangs this, within a timeout);
  4. a line of odd length and one that is not hex: exit 2 naming the line; a wrong key:
     "err 16" (UNAUTHENTICATED); no router at the address: exit 2 (its health check fails)
     before any request is read; neither --tls-ca nor --insecure: exit 2 saying so.
usage: test_bench_send.py --build BUILD --work DIR
"""
import argparse
import os
import select
import shutil
import socket
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import rtest  # noqa: E402
import tlscerts  # noqa: E402
from rtest import check  # noqa: E402


def run_send(build, fleet, lines, key=None, addr=None):
    """bench_send over `lines` (strings): (exit status, stdout lines, stderr)."""
    env = dict(os.environ, KVL_API_KEY=key if key is not None else fleet.default_key)
    p = subprocess.run([os.path.join(build, "bench_send"), "--router", addr or fleet.addr]
                       + fleet.cli_security(), input="".join(ln + "\n" for ln in lines),
                       capture_output=True, text=True, env=env, timeout=120)
    return p.returncode, p.stdout.splitlines(), p.stderr


def interactive(build, fleet, lines, timeout=60.0):
    """bench_send fed one line at a time, each answer read (within timeout) before the next."""
    env = dict(os.environ, KVL_API_KEY=fleet.default_key)
    p = subprocess.Popen([os.path.join(build, "bench_send"), "--router", fleet.addr] + fleet.cli_security(),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    out = []
    try:
        for ln in lines:
            p.stdin.write(ln + "\n")
            p.stdin.flush()
            ready, _, _ = select.select([p.stdout], [], [], timeout)
            check(ready, "bench_send gave no answer to a request within %.0f s (not flushed?)" % timeout)
            out.append(p.stdout.readline().rstrip("\n"))
        p.stdin.close()
        check(p.wait(timeout=30) == 0, "bench_send exited with %s at the end of its stdin" % p.returncode)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.build, "bench_send")):
        print("SKIP: no bench_send in %s (it is built with the server components and KVL_BENCH=ON)" % a.build)
        sys.exit(77)
    shutil.rmtree(a.work, ignore_errors=True)
    pki = tlscerts.make(os.path.join(a.work, "pki"))
    fleet = rtest.Fleet(a.build, os.path.join(a.work, "fleet"), tls=pki, peers=True,
                        policy={"name": "pinned", "default_model": "qwen3-a"},
                        guardrail={"shadow_fraction": 0.0})
    try:
        c = fleet.client()
        sid = c.create_session()
        c.send_all(sid, rtest.corpus_text(0, 400), max_tokens=1, model="qwen3-a")
        n0 = len(c.get_session(sid, include_tokens=True).tokens)
        req = c.pb.SendRequest(session_id=sid, text=" and then", max_tokens=1, model="qwen3-b",
                               ignore_eos=True)
        bad = c.pb.SendRequest(session_id="s-no-such-session", text="x", max_tokens=1)
        rc, out, err = run_send(a.build, fleet, [bad.SerializeToString().hex(),
                                                 req.SerializeToString().hex()])
        check(rc == 0 and len(out) == 2, "bench_send: exit %d, stdout %r, stderr %r" % (rc, out, err))
        check(out[0].startswith("err 5 "), "an unknown session: %r (want NOT_FOUND, 5)" % out[0])
        kind, ttft, hexsum = (out[1].split(" ", 2) + ["", ""])[:3]
        check(kind == "ok" and hexsum, "the switched turn: %r" % out[1][:200])
        s = c.pb.SendResponse.FromString(bytes.fromhex(hexsum)).summary
        check(s.switch_mode == 1 and s.n_generated == 1 and s.model == "qwen3-b",
              "its summary: mode %d, %d generated, model %r (%s)" % (s.switch_mode, s.n_generated, s.model,
                                                                    s.fallback_reason))
        # the router's TTFT runs inside the client's: from after the request arrived to the
        # first token's send
        check(0 < s.ttft_seconds <= float(ttft) < 60, "client TTFT %s s, the router's %.6f s" % (
            ttft, s.ttft_seconds))
        n1 = len(c.get_session(sid, include_tokens=True).tokens)
        check(n1 > n0, "the ledger holds %d tokens after the turn, %d before" % (n1, n0))
        print("ok: a translated switch through bench_send (TTFT %.2f ms), a refused request answered "
              "'err 5' and the next served" % (float(ttft) * 1e3))

        turns = []
        for text in (" one", " two", " three"):
            turns.append(c.pb.SendRequest(session_id=sid, text=text, max_tokens=2,
                                          model="qwen3-a" if text == " two" else "qwen3-b").SerializeToString().hex())
        got = interactive(a.build, fleet, turns)
        check(len(got) == 3 and all(g.startswith("ok ") for g in got), "line by line: %r" % [g[:60] for g in got])
        print("ok: line by line, each answer before the next request (switches both ways)")

        rc, out, err = run_send(a.build, fleet, ["0a0", req.SerializeToString().hex()])
        check(rc == 2 and not out and "stdin line 1" in err, "a line of odd hex: exit %d %r %r" % (rc, out, err))
        rc, out, err = run_send(a.build, fleet, [req.SerializeToString().hex(), "zz"])
        check(rc == 2 and len(out) == 1 and "stdin line 2" in err, "a non-hex line: exit %d %r %r" % (rc, out, err))
        rc, out, err = run_send(a.build, fleet, [req.SerializeToString().hex()], key="not-a-key")
        check(rc == 0 and len(out) == 1 and out[0].startswith("err 16 "), "a wrong key: %r %r" % (out, err))
        with socket.socket() as sk:   # a port nobody serves
            sk.bind(("127.0.0.1", 0))
            port = sk.getsockname()[1]
        rc, out, err = run_send(a.build, fleet, [req.SerializeToString().hex()], addr="127.0.0.1:%d" % port)
        check(rc == 2 and not out and "health check" in err, "no router: exit %d %r %r" % (rc, out, err))
        p = subprocess.run([os.path.join(a.build, "bench_send"), "--router", fleet.addr], capture_output=True,
                           text=True, timeout=30)
        check(p.returncode == 2 and "--insecure" in p.stderr and "usage" in p.stderr,
              "neither --tls-ca nor --insecure: exit %d %r" % (p.returncode, p.stderr))
        print("ok: a malformed line, a wrong key, a missing router and missing flags each refused as documented")
    finally:
        fleet.stop()
    print("PASS test_bench_send")


if __name__ == "__main__":
    main()
