#!/usr/bin/env python3
"""tests/router/test_cancel.py: a cancelled turn keeps the user's input; clients name the session.

  1. a turn cancelled by the client after its first token: the ledger keeps the turn's input
     (exactly the ids sent) and none of its output; the next turn continues after that input
     and answers normally (the node that generated the discarded tokens is reset, not trusted);
  2. a turn failing with UNAVAILABLE (the only node killed): `kvlingo chat` and
     examples/python_client.py print the session id they created, so it can be continued (kvlingo
     chat closes it instead when it holds nothing, and says so).
usage: test_cancel.py --build BUILD_DIR --work WORK_DIR
"""
import argparse
import os
import signal
import subprocess
import sys
import time

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rtest  # noqa: E402
from rtest import check  # noqa: E402


def cancel_keeps_input(a):
    fleet = rtest.Fleet(a.build, os.path.join(a.work, "cancel"), models=("qwen3-a",),
                        policy={"name": "pinned"}, translators=False)
    try:
        c = fleet.client(timeout=60)
        sid = c.create_session()
        c.send_all(sid, tokens=[725, 732, 1553, 623, 12, 40], max_tokens=4)
        before = list(c.get_session(sid, include_tokens=True).tokens)
        user = [39, 918, 78, 845, 264, 1210]
        call = c.stub.Send(c.pb.SendRequest(session_id=sid, tokens=user, max_tokens=500,
                                            ignore_eos=True), timeout=60)
        got = 0
        for m in call:
            if not m.HasField("summary"):
                got += 1
                if got == 2:
                    call.cancel()
                    break
        check(got == 2, "the turn streamed tokens before the cancel")
        t0 = time.time()
        after = before
        while time.time() - t0 < 10:   # the router commits once it sees the cancel
            after = list(c.get_session(sid, include_tokens=True).tokens)
            if len(after) != len(before):
                break
            time.sleep(0.1)
        check(after == before + user, "ledger after the cancel: %d tokens, expected %d (+ the input only)"
              % (len(after), len(before) + len(user)))
        # the node's copy (input + discarded output) went with the cancel: listed in no holding,
        # a close or expiry could not have reached it
        npb, node = fleet.node_stub("qwen3-a")
        code, t0 = "OK", time.time()
        while code != "NOT_FOUND" and time.time() - t0 < 5:   # dropped right after the commit
            try:
                node.SessionInfo(npb.SessionInfoRequest(session_id=sid), timeout=10)
                time.sleep(0.05)
            except Exception as e:  # grpc.RpcError
                code = e.code().name
        check(code == "NOT_FOUND", "the node's copy after the cancel: %s, expected NOT_FOUND" % code)
        ids, _, s = c.send_all(sid, tokens=[13, 198], max_tokens=3)
        check(len(ids) == 3 and s.context_tokens == len(before) + len(user) + 2 + 3,
              "the next turn continues after the kept input: %s" % s)
        log = open(fleet.router.log_path).read()
        check("turn cancelled by the client" in log, "the router logs the cancel")
        print("  ok: cancelled turn kept its %d input tokens, discarded the output" % len(user))
    finally:
        fleet.stop()


def cancel_before_first_token(a):
    """A client that goes away while the node has not answered yet (here: the node is frozen)
    ends the turn at once: the router cancels the node's call instead of waiting for a token
    to fail to send (or for its deadline)."""
    fleet = rtest.Fleet(a.build, os.path.join(a.work, "early"), models=("qwen3-a",),
                        policy={"name": "pinned"}, translators=False)
    node = fleet.nodes["qwen3-a"]
    try:
        c = fleet.client(timeout=60)
        sid = c.create_session()
        c.send_all(sid, tokens=[725, 732, 1553, 623], max_tokens=2)
        before = list(c.get_session(sid, include_tokens=True).tokens)
        rtest.freeze(node.proc)
        try:
            try:
                for _ in c.stub.Send(c.pb.SendRequest(session_id=sid, tokens=[39, 918], max_tokens=4),
                                     timeout=0.5, metadata=c.metadata):
                    pass
            except Exception:  # grpc.RpcError: DEADLINE_EXCEEDED, the client went away
                pass
            t0, seen = time.time(), False
            while time.time() - t0 < 2.5 and not seen:
                seen = "session %s: turn cancelled by the client" % sid in open(fleet.router.log_path).read()
                time.sleep(0.05)
            check(seen, "the router did not end the turn within 2.5 s of the client's cancel, with "
                  "its node frozen")
        finally:
            node.proc.send_signal(signal.SIGCONT)
        after = list(c.get_session(sid, include_tokens=True).tokens)
        check(after == before + [39, 918], "ledger after the early cancel: %r" % after[len(before):])
        # the cancelled turn commits its input, then drops the node's copy and lets the session
        # go: a turn sent in between is told the session is busy (ABORTED), and a client retries
        t0 = time.time()
        while True:
            try:
                ids, _, s2 = c.send_all(sid, tokens=[13, 198], max_tokens=3)
                break
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.ABORTED or "busy" not in err.details() or time.time() - t0 > 10:
                    raise
                time.sleep(0.05)
        check(len(ids) == 3, "the next turn after an early cancel: %s" % s2)
        print("  ok: a turn cancelled before its first token ends at once (node frozen); its input kept")
    finally:
        fleet.stop()


def clients_name_the_session(a):
    fleet = rtest.Fleet(a.build, os.path.join(a.work, "sid"), models=("qwen3-a",),
                        policy={"name": "pinned"}, translators=False)
    try:
        fleet.nodes["qwen3-a"].kill9()
        r = subprocess.run([os.path.join(a.build, "kvlingo"), "chat", "--router", fleet.addr] + fleet.cli_security() + ["Hello"],
                           capture_output=True, text=True, timeout=60)
        # the session it made holds nothing (the turn failed before its input was kept): closed
        # again rather than left to count against the tenant's sessions until its TTL
        check(r.returncode == 1 and "UNAVAILABLE" in r.stderr and "kvlingo chat: session s" in r.stderr
              and "closed (the turn failed before it held anything)" in r.stderr,
              "kvlingo chat on a dead fleet: rc %d %r" % (r.returncode, r.stderr))
        sid = r.stderr.split("kvlingo chat: session ")[1].split()[0]
        got = fleet.client().get_session(sid)
        check(got.session_id == sid and got.state == "closed", "the session it named is closed: %s" % got)
        print("  ok: kvlingo chat named session %s after UNAVAILABLE and closed it (it held nothing)" % sid)
        r = subprocess.run(["/usr/bin/python3", os.path.join(rtest.SRC, "examples", "python_client.py"),
                            "--router", fleet.addr, "--insecure", "Hello"], capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, PYTHONPATH=os.path.join(fleet.work, "stubs")))
        check(r.returncode == 1 and "UNAVAILABLE" in r.stderr and "session s" in r.stderr,
              "python_client on a dead fleet: rc %d %r" % (r.returncode, r.stderr))
        print("  ok: python_client printed the session after UNAVAILABLE")
        # no text: a usage error before any session is made (not a session left behind)
        r = subprocess.run(["/usr/bin/python3", os.path.join(rtest.SRC, "examples", "python_client.py"),
                            "--router", fleet.addr, "--insecure"], capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, PYTHONPATH=os.path.join(fleet.work, "stubs")))
        check(r.returncode == 2 and "TEXT is required" in r.stderr and "session s" not in r.stderr,
              "python_client without text: rc %d %r" % (r.returncode, r.stderr))
        print("  ok: python_client without text is a usage error")
    finally:
        fleet.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    cancel_keeps_input(a)
    cancel_before_first_token(a)
    clients_name_the_session(a)
    print("test_cancel: PASS")


if __name__ == "__main__":
    main()
