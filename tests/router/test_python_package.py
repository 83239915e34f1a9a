#!/usr/bin/env python3
"""tests/router/test_python_package.py: the installable Python client (clients/python).

  1. its generated stubs (kvlingo/v1/) are what generate_stubs.py makes from proto/ now;
  2. `pip install` of a copy of clients/python into the test venv ($KVL_PYTHON or build/venv)
     works, and the installed package (module and the kvlingo-client command) talks to a real
     kvld + kvlingo-router on loopback, over TLS (tls_ca= / --tls-ca with the fleet CA): the
     same greedy tokens as the repository's client; --insecure against the TLS router fails,
     and neither option is refused (ValueError, usage error); send_all(retries=) rides out the
     ABORTED of a session still busy with an abandoned stream, and its request_id replays.
usage: test_python_package.py --build BUILD_DIR --work WORK_DIR
"""
import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rtest  # noqa: E402
import tlscerts  # noqa: E402
from rtest import check  # noqa: E402

PKG = os.path.join(rtest.SRC, "clients", "python")


def venv_python():
    for cand in (os.environ.get("KVL_PYTHON"), os.path.join(rtest.SRC, "build", "venv", "bin", "python")):
        if cand and os.path.exists(cand) and subprocess.run(
                [cand, "-c", "import grpc_tools, grpc, google.protobuf, pip"],
                capture_output=True).returncode == 0:
            return cand
    return None


USE = r"""
import json, os, sys
import grpc
from kvlingo_client import RouterClient, new_request_id
try:
    RouterClient(sys.argv[1])
    sys.exit("RouterClient without tls_ca or insecure did not refuse")
except ValueError:
    pass
c = RouterClient(sys.argv[1], tls_ca=sys.argv[2])   # TLS, verified with the fleet CA
sid = c.create_session()
ids, text, s = c.send_all(sid, "Once upon a time", max_tokens=6, ignore_eos=True)
# a stream left early is cancelled, but the router frees the session a few ms later: the next
# turn, sent at once, meets ABORTED "busy", which send_all(retries=) rides out; the same
# request_id again is answered from the ledger, not run twice
for i, _ in enumerate(c.send(sid, " and", max_tokens=200, ignore_eos=True)):
    if i == 1:
        break
rid = new_request_id()
r1 = c.send_all(sid, " then", max_tokens=3, ignore_eos=True, retries=8, request_id=rid)
r2 = c.send_all(sid, " then", max_tokens=3, ignore_eos=True, request_id=rid)
if r1[0] != r2[0] or not r2[2].policy_reason.startswith("replayed") or r1[2].turn != r2[2].turn:
    sys.exit("request_id replay: %r / %r" % (r1, r2))
# create_session takes keywords only (positionally, a session id went in as the model)
try:
    c.create_session("my-session")
    sys.exit("create_session took a positional argument")
except TypeError:
    pass
with RouterClient(sys.argv[1], tls_ca=sys.argv[2]) as c3:
    named = c3.create_session(session_id="py-named-%d" % os.getpid())
    if not named.startswith("py-named-"):
        sys.exit("create_session(session_id=) gave %r" % named)
sid2 = c.create_session()
for i, _ in enumerate(c.send(sid2, "Hello", max_tokens=200, ignore_eos=True)):
    if i == 1:
        break
try:
    c.send_all(sid2, " x", max_tokens=2)   # retries=0: the error as the router gave it
    busy = "ok"
except grpc.RpcError as e:
    busy = e.code().name
print(json.dumps({"ids": ids, "text": text, "model": s.model, "n": s.n_generated,
                  "closed": c.close_session(sid), "busy_without_retry": busy}))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    py = venv_python()
    if not py:
        print("SKIP: no Python with grpcio-tools, grpcio, protobuf and pip (scripts/test.sh installs "
              "them into build/venv; or set KVL_PYTHON)")
        return 77
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    # 1. the committed stubs are current
    gen = os.path.join(a.work, "gen")
    subprocess.run([py, os.path.join(PKG, "generate_stubs.py"), gen], check=True)
    names = sorted(f for f in os.listdir(os.path.join(gen, "kvlingo", "v1")) if f.endswith(".py"))
    _, mismatch, missing = filecmp.cmpfiles(os.path.join(gen, "kvlingo", "v1"),
                                            os.path.join(PKG, "kvlingo", "v1"), names, shallow=False)
    check(not mismatch and not missing, "clients/python/kvlingo/v1 is out of date with proto/ (%s): run "
          "python clients/python/generate_stubs.py" % ", ".join(mismatch + missing))
    print("  ok: %d stub files match proto/" % len(names))
    # 2. install a copy (the build writes into the folder it builds) and use it
    src = os.path.join(a.work, "src")
    shutil.copytree(PKG, src)
    p = subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-build-isolation",
                        "--force-reinstall", "--no-deps", src], capture_output=True, text=True)
    check(p.returncode == 0, "pip install clients/python: %s" % p.stderr[-2000:])
    p = subprocess.run([py, "-m", "pip", "check"], capture_output=True, text=True)
    check(p.returncode == 0, "pip check: %s" % (p.stdout + p.stderr)[-2000:])
    print("  ok: pip install ./clients/python")
    # a TLS fleet: the package's clients verify the router with the fleet CA
    pki = tlscerts.make(os.path.join(a.work, "pki"))
    fleet = rtest.Fleet(a.build, os.path.join(a.work, "fleet"), models=("qwen3-a",), translators=False,
                        policy={"name": "pinned", "default_model": "qwen3-a"}, tls=pki)
    # the fleet's API key, which the installed client and its command read from the environment
    os.environ["KVL_API_KEY"] = fleet.default_key
    try:
        p = subprocess.run([py, "-c", USE, fleet.addr, pki["ca"]], capture_output=True, text=True, cwd=a.work,
                           timeout=120)
        check(p.returncode == 0, "kvlingo_client: %s" % p.stderr[-2000:])
        got = json.loads(p.stdout)
        c = fleet.client()
        sid = c.create_session()
        ids, text, s = c.send_all(sid, "Once upon a time", max_tokens=6, ignore_eos=True)
        check(got["ids"] == ids and got["text"] == text and got["n"] == 6 and got["model"] == "qwen3-a" and
              got["closed"], "installed client %r vs repository client %r" % (got, (ids, text)))
        print("  ok: the installed client: %r; retries with one request_id, replayed (a turn sent "
              "right after a stream left early, without retries: %s)" % (got["text"], got["busy_without_retry"]))
        cli = os.path.join(os.path.dirname(py), "kvlingo-client")
        tls = ["--tls-ca", pki["ca"]]
        p = subprocess.run([cli, "--router", fleet.addr] + tls + ["--max-tokens", "3", "Hello"], capture_output=True,
                           text=True, timeout=120)
        check(p.returncode == 0 and "turn 0: qwen3-a on a0" in p.stdout, "kvlingo-client: %r %r" % (p.stdout, p.stderr))
        p = subprocess.run([cli, "--router", fleet.addr] + tls + ["--list-nodes"], capture_output=True, text=True, timeout=60)
        check(p.returncode == 0 and "qwen3-a" in p.stdout, "kvlingo-client --list-nodes: %r" % p.stderr)
        p = subprocess.run([cli, "--router", fleet.addr] + tls + ["--session", "nope", "x"], capture_output=True, text=True,
                           timeout=60)
        check(p.returncode == 1 and "NOT_FOUND" in p.stderr, "unknown session: %r" % p.stderr)
        # plaintext against the TLS router fails; neither option is a usage error
        p = subprocess.run([cli, "--router", fleet.addr, "--insecure", "--list-nodes"], capture_output=True,
                           text=True, timeout=60)
        check(p.returncode != 0 and "UNAVAILABLE" in p.stderr, "--insecure against TLS: %r" % p.stderr[-300:])
        p = subprocess.run([cli, "--router", fleet.addr, "--list-nodes"], capture_output=True, text=True, timeout=60)
        check(p.returncode == 2 and "--tls-ca" in p.stderr, "no --tls-ca/--insecure: %d %r" % (p.returncode, p.stderr))
        print("  ok: the kvlingo-client command")
    finally:
        fleet.stop()
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
