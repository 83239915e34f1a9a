"""tests/integration/kvlclient.py: an independent gRPC client for kvld, written with grpcio and
stubs generated at test time from proto/ (grpc_tools.protoc), plus helpers to run kvld
processes on loopback.  Uses Debian's /usr/bin/python3 (python3-grpcio, python3-grpc-tools)."""
import importlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import testports  # noqa: E402
import testprocs  # noqa: E402


def load_stubs(src_dir, out_dir):
    """Generate *_pb2.py / *_pb2_grpc.py for proto/ into out_dir and import them."""
    from grpc_tools import protoc
    import grpc_tools
    proto_dir = os.path.join(src_dir, "proto")
    os.makedirs(out_dir, exist_ok=True)
    # grpc/health/v1/health.proto is left out on purpose: its Python package would be named
    # "grpc" and shadow grpcio (the tests speak Health/Check with hand-written bytes)
    files = ["kvlingo/v1/span.proto", "kvlingo/v1/node.proto"]
    inc = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    args = ["protoc", "-I" + proto_dir, "-I" + inc, "--python_out=" + out_dir,
            "--grpc_python_out=" + out_dir] + [os.path.join(proto_dir, f) for f in files]
    if protoc.main(args) != 0:
        raise RuntimeError("grpc_tools.protoc failed")
    for pkg in ["kvlingo", "kvlingo/v1"]:
        open(os.path.join(out_dir, pkg, "__init__.py"), "a").close()
    sys.path.insert(0, out_dir)
    node_pb2 = importlib.import_module("kvlingo.v1.node_pb2")
    node_grpc = importlib.import_module("kvlingo.v1.node_pb2_grpc")
    span_pb2 = importlib.import_module("kvlingo.v1.span_pb2")
    return node_pb2, node_grpc, span_pb2


def free_port():
    """A loopback port no other test process holds (see tests/testports.py)."""
    return testports.free_port()


class Kvld:
    """One kvld process on loopback."""

    def __init__(self, kvld, model, log_path, translators=None, extra=()):
        self.port = free_port()
        self.metrics_port = free_port()
        self.addr = "127.0.0.1:%d" % self.port
        # plaintext, by name: these tests call the Node API directly with grpc.insecure_channel,
        # and move spans by hand, without transfer tickets (insecure and no ticket key)
        args = [kvld, "--model", model, "--listen", self.addr, "--insecure",
                "--metrics", "127.0.0.1:%d" % self.metrics_port]
        if translators:
            args += ["--translators", translators]
        args += list(extra)
        self.log_path = log_path
        self.log = open(log_path, "w")
        env = dict(os.environ)
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("kvld exited early:\n" + open(log_path).read())
            if "msg=serving" in open(log_path).read():
                return
            time.sleep(0.05)
        raise RuntimeError("kvld did not start:\n" + open(log_path).read())

    def rss_kb(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def metrics(self):
        import urllib.request
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.metrics_port) as r:
            return r.read().decode()

    def metric(self, name):
        m = re.search(r"^%s (\S+)$" % re.escape(name), self.metrics(), re.M)
        return float(m.group(1)) if m else None

    def alive(self):
        return self.proc.poll() is None

    def freeze(self):
        """SIGSTOP, returning once every thread is stopped (tests/testprocs.py)."""
        testprocs.freeze(self.proc)

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def parse_args(argv):
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("--kvld", required=True)
    p.add_argument("--kvlingo", required=True)
    p.add_argument("--span-ref", required=True)
    p.add_argument("--span-inject", required=True)
    p.add_argument("--source", required=True)
    p.add_argument("--work", required=True)
    a = p.parse_args(argv)
    os.makedirs(a.work, exist_ok=True)
    return a


def ensure_translators(args):
    """Stage-1 (ridge) translators qwen3-a <-> qwen3-b, trained in seconds on valid.txt, in
    <work>/translators (both directions: each node loads those that target its own model)."""
    out = os.path.join(args.work, "translators")
    os.makedirs(out, exist_ok=True)
    corpus = os.path.join(args.source, "testdata/corpus/valid.txt")
    for s, t in [("qwen3-a", "qwen3-b"), ("qwen3-b", "qwen3-a")]:
        path = os.path.join(out, "%s_to_%s.safetensors" % (s, t))
        if os.path.exists(path):
            continue
        cmd = [args.kvlingo, "translator", "train", "--source",
               os.path.join(args.source, "models", s), "--target",
               os.path.join(args.source, "models", t), "--corpus", corpus, "--out", path,
               "--stage1-only", "--ridge-tokens", "4096"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError("translator training failed: %s\n%s" % (" ".join(cmd), r.stderr))
    return out


def corpus_text(args, chars=600):
    with open(os.path.join(args.source, "testdata/corpus/valid.txt")) as f:
        text = ""
        for line in f:
            text += line.strip() + " "
            if len(text) >= chars:
                break
    return text[:chars].strip()


class Checks:
    """Collects pass/fail lines; exit status 1 if any failed."""

    def __init__(self):
        self.failed = 0

    def check(self, cond, what):
        print(("PASS " if cond else "FAIL ") + what, flush=True)
        if not cond:
            self.failed += 1
        return cond

    def done(self):
        print("%s: %d failure(s)" % ("FAILED" if self.failed else "OK", self.failed), flush=True)
        sys.exit(1 if self.failed else 0)
