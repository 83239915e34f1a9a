#!/usr/bin/env python3
"""tests/router/test_peers.py: kvld --peers and the warm-up before serving.

- Two kvld started one after the other, each naming the other in --peers: both connect the
  other (channel, Info, transport endpoint) once it is up (log line peer_ready, metric
  kvlingo_peers_connected_total 1), the first one by retrying while the second was not there;
  the second's Info call wakes the first's back-off, so the first connects at once.
- A fleet whose nodes were given --peers serves its first switch by translation (the span goes
  over the endpoint set up at start).
- A membership change without a restart: a node with a ticket key whose --config file names
  its peers refuses spans to a node not in the list (PERMISSION_DENIED, not a member); the file
  gains the node, SIGHUP, and the node reloads (peers_reloaded added=1), connects it
  (peer_ready) and ExportSpan gets past the membership check (to the session's); the file
  loses it again, SIGHUP, and it is refused again; a file that no longer parses changes nothing
  (reload_failed).
- A bad --peers entry is a startup error naming it; --check lists the peers; the serving line
  reports the warm-up (warmup_ms > 0), and --warmup 0 turns it off.
- A second kvld on a port the first one holds fails at start (no shared port, where calls would
  alternate between two models); so does a kvld whose metrics port is taken (exit 1 with the
  reason, not an abort).
usage: test_peers.py --build BUILD_DIR --work WORK_DIR
"""
import argparse
import os
import re
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rtest  # noqa: E402
from rtest import check  # noqa: E402


def wait_log(path, pattern, timeout=20.0):
    until = time.time() + timeout
    while time.time() < until:
        with open(path) as f:
            m = re.search(pattern, f.read())
        if m:
            return m
        time.sleep(0.05)
    with open(path) as f:
        raise AssertionError("%s: no line matching %r within %.0f s:\n%s" % (path, pattern, timeout, f.read()))


def log_time(ts):
    """Seconds of a log line's ts=2026-12-06T15:36:42.275Z (UTC)."""
    import calendar
    return calendar.timegm(time.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S")) + float("0" + ts[19:-1])


def metric(port, name):
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5).read().decode()
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    kvld = os.path.join(a.build, "daemon", "kvld")
    model = lambda m: os.path.join(rtest.SRC, "models", m)  # noqa: E731

    # bad entries: refused at start, the entry named; --check shows the list
    for bad, needle in (("127.0.0.1", "expected HOST:PORT"), ("127.0.0.1:70x1", "port must be a number"),
                        ("127.0.0.1:70000", "port must be a number in [1, 65535]"),
                        (",".join("127.0.0.1:%d" % (1000 + i) for i in range(65)), "more than 64")):
        r = subprocess.run([kvld, "--insecure", "--model", model("qwen3-a"), "--peers", bad], capture_output=True,
                           text=True, timeout=60)
        check(r.returncode == 2 and needle in r.stderr, "--peers %r: rc %d, %r" % (bad[:40], r.returncode, r.stderr))
    r = subprocess.run([kvld, "--insecure", "--model", model("qwen3-a"), "--peers", "127.0.0.1:1,[::1]:2", "--check"],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 0 and "peers: 127.0.0.1:1,[::1]:2" in r.stdout, "--check: %r %r" % (r.stdout, r.stderr))
    print("ok   bad --peers refused, --check lists them")

    # two nodes, the second started after the first has been retrying for a while
    pa, pb, ma, mb = (rtest.free_port() for _ in range(4))
    la, lb = os.path.join(a.work, "kvld-a.log"), os.path.join(a.work, "kvld-b.log")
    for p in (la, lb):
        if os.path.exists(p):
            os.remove(p)
    na = rtest.Proc([kvld, "--insecure", "--model", model("qwen3-a"), "--listen", "127.0.0.1:%d" % pa, "--metrics",
                     "127.0.0.1:%d" % ma, "--peers", "127.0.0.1:%d" % pb], la)
    nb = None
    try:
        rtest.wait_port(pa, na.proc, what="kvld a")
        # a retries against a port nobody listens on (at about 0, 0.1, 0.3, 0.7, 1.5, 3.5, 5.5 s):
        # b comes up early in a's 2 s nap from 3.5 s
        time.sleep(3.6)
        nb = rtest.Proc([kvld, "--insecure", "--model", model("qwen3-b"), "--listen", "127.0.0.1:%d" % pb, "--metrics",
                         "127.0.0.1:%d" % mb, "--peers", "127.0.0.1:%d" % pa, "--warmup", "0"], lb)
        rtest.wait_port(pb, nb.proc, what="kvld b")
        r = subprocess.run([kvld, "--insecure", "--model", model("qwen3-b"), "--listen", "127.0.0.1:%d" % pa,
                            "--transport", "none", "--warmup", "0"], capture_output=True, text=True, timeout=60)
        check(r.returncode == 1 and "cannot listen on '127.0.0.1:%d'" % pa in r.stdout + r.stderr,
              "second kvld on a held port: rc %d, %r" % (r.returncode, (r.stdout + r.stderr)[-300:]))
        print("ok   a second kvld on a held port fails at start")
        r = subprocess.run([kvld, "--insecure", "--model", model("qwen3-b"), "--listen", "127.0.0.1:0", "--metrics",
                            "127.0.0.1:%d" % ma, "--transport", "none", "--warmup", "0"],
                           capture_output=True, text=True, timeout=60)
        check(r.returncode == 1 and "metrics: cannot listen on 127.0.0.1:%d" % ma in r.stdout + r.stderr,
              "kvld on a taken metrics port: rc %d, %r" % (r.returncode, (r.stdout + r.stderr)[-300:]))
        print("ok   a taken metrics port is a clean start-up error")
        ra = wait_log(la, r"ts=(\S+) .*msg=peer_ready peer=127\.0\.0\.1:%d .*woken=(\d)" % pb)
        rb = wait_log(lb, r"ts=(\S+) .*msg=peer_ready peer=127\.0\.0\.1:%d " % pa)
        # b's Info call on connecting woke a's back-off, so a connected b at once rather than at
        # the end of its nap; a retry of its own that came first needed no waking
        gap = log_time(ra.group(1)) - log_time(rb.group(1))
        check(ra.group(2) == "1" or gap < 0.3,
              "a connected b %.3f s after b connected a, its back-off not woken (woken=%s)" % (gap, ra.group(2)))
        check(metric(ma, "kvlingo_peers_connected_total") == 1, "a: peers_connected_total")
        check(metric(mb, "kvlingo_peers_connected_total") == 1, "b: peers_connected_total")
        wa = float(wait_log(la, r"warmup_ms=([0-9.]+)").group(1))
        wb = float(wait_log(lb, r"warmup_ms=([0-9.]+)").group(1))
        check(wa > 0 and wb == 0, "warm-up: a %.3f ms (expected > 0), b %.3f ms with --warmup 0" % (wa, wb))
        print("ok   both nodes connected each other (a %.0f ms after b, woken from its back-off); warm-up %.1f ms, "
              "off with --warmup 0" % (gap * 1e3, wa))
    finally:
        na.stop()
        if nb:
            nb.stop()

    # membership change: --config's peers reloaded on SIGHUP
    import grpc
    import signal
    rtest.python_client.load_stubs(out_dir=os.path.join(a.work, "stubs"))
    import importlib
    npb = importlib.import_module("kvlingo.v1.node_pb2")
    ngrpc = importlib.import_module("kvlingo.v1.node_pb2_grpc")
    pa, pb = rtest.free_port(), rtest.free_port()
    key = os.path.join(a.work, "fleet.key")
    with open(key, "w") as f:
        f.write(os.urandom(24).hex() + "\n")
    cfg_a = os.path.join(a.work, "kvld-a.yaml")
    b_addr = "127.0.0.1:%d" % pb

    def write_peers(v):
        with open(cfg_a, "w") as f:
            f.write("peers: %s\n" % v)

    def export_refusal():
        stub = ngrpc.NodeStub(grpc.insecure_channel("127.0.0.1:%d" % pa))
        try:
            stub.ExportSpan(npb.ExportSpanRequest(session_id="s", peer=b_addr), timeout=10)
            return "OK"
        except grpc.RpcError as e:
            return "%s %s" % (e.code().name, e.details())

    write_peers("127.0.0.1:1")
    la, lb = os.path.join(a.work, "kvld-ma.log"), os.path.join(a.work, "kvld-mb.log")
    for p in (la, lb):
        if os.path.exists(p):
            os.remove(p)
    na = rtest.Proc([kvld, "--insecure", "--ticket-key-file", key, "--model", model("qwen3-a"), "--listen",
                     "127.0.0.1:%d" % pa, "--config", cfg_a, "--warmup", "0"], la)
    nb = rtest.Proc([kvld, "--insecure", "--ticket-key-file", key, "--model", model("qwen3-b"), "--listen",
                     b_addr, "--peers", "127.0.0.1:%d" % pa, "--warmup", "0"], lb)
    try:
        rtest.wait_port(pa, na.proc, what="kvld a", log=la)
        rtest.wait_port(pb, nb.proc, what="kvld b", log=lb)
        r = export_refusal()
        check(r.startswith("PERMISSION_DENIED") and "not a member" in r, "before the change: %s" % r)
        write_peers("127.0.0.1:1, " + b_addr)
        na.proc.send_signal(signal.SIGHUP)
        wait_log(la, r"msg=peers_reloaded members=2 added=1 removed=0")
        wait_log(la, r"msg=peer_ready peer=%s " % re.escape(b_addr))
        check("reload_ignored" not in open(la).read(), "a reload changing peers only warned of other keys")
        r = export_refusal()
        check("not a member" not in r and r.startswith("NOT_FOUND"), "after adding b: %s" % r)
        with open(cfg_a, "w") as f:
            f.write("peers: 127.0.0.1\n")   # no port: the reload fails, b stays a member
        na.proc.send_signal(signal.SIGHUP)
        wait_log(la, r"msg=reload_failed .*expected HOST:PORT")
        r = export_refusal()
        check("not a member" not in r, "a failed reload changed the fleet: %s" % r)
        with open(cfg_a, "w") as f:   # b leaves; a setting SIGHUP does not apply changes too
            f.write("peers: 127.0.0.1:1\nmax_sessions: 9\n")
        na.proc.send_signal(signal.SIGHUP)
        wait_log(la, r"msg=peers_reloaded members=1 added=0 removed=1")
        wait_log(la, r"msg=reload_ignored keys=max_sessions note=")
        r = export_refusal()
        check(r.startswith("PERMISSION_DENIED") and "not a member" in r, "after removing b: %s" % r)
        check(na.alive(), "kvld a died on SIGHUP")
        print("ok   membership change on SIGHUP: b added (connected, spans allowed), a bad list ignored, "
              "b removed (refused again)")
    finally:
        na.stop()
        nb.stop()

    # a fleet of pre-connected nodes: the first switch is a translation
    fleet = rtest.Fleet(a.build, os.path.join(a.work, "fleet"), peers=True,
                        policy={"name": "pinned"})
    try:
        for m, p in fleet.nodes.items():
            wait_log(p.log_path, r"msg=peer_ready")
        c = fleet.client()
        sid = c.create_session(model="qwen3-a")
        _, _, s0 = c.send_all(sid, "The history of the town begins with a mill on the river.", max_tokens=4)
        _, _, s1 = c.send_all(sid, " Later a railway came.", max_tokens=4, model="qwen3-b")
        check(s0.model == "qwen3-a" and s1.model == "qwen3-b", "models %s, %s" % (s0.model, s1.model))
        check(s1.switch_mode == 1 and not s1.fallback_reason,
              "first switch of a pre-connected fleet: mode %d, fallback %r" % (s1.switch_mode, s1.fallback_reason))
        print("ok   first switch of a pre-connected fleet translated (TTFT %.2f ms)" % (s1.ttft_seconds * 1e3))
    finally:
        fleet.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
