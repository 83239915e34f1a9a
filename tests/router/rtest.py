"""tests/router/rtest.py: shared helpers of the router's process-level tests, demo and bench:
start kvld nodes and kvlingo-router on loopback, make stage-1 translators, talk to the router
with the documented Python client (examples/python_client.py).

Debian's /usr/bin/python3 with python3-grpcio and python3-grpc-tools.  Every process started
here is stopped by Fleet.stop() (also at interpreter exit), by its own pid."""
import atexit
import os
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SRC, "examples"))
import python_client  # noqa: E402
sys.path.insert(0, os.path.dirname(HERE))
import testports  # noqa: E402
from testprocs import freeze  # noqa: E402,F401  (tests call rtest.freeze)

MODES = {0: "none", 1: "translate", 2: "re-prefill"}


def free_port():
    """A loopback port no other test process holds (see tests/testports.py)."""
    return testports.free_port()


def log_tail(path, n=12):
    """The last n lines of a process log, indented, for an error message ('' when unreadable)."""
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()[-n:]
    except (OSError, TypeError):
        return ""
    return "".join("\n    | " + ln for ln in lines)


def wait_port(port, proc, timeout=30.0, what="process", log=None):
    """Wait until something listens on 127.0.0.1:port; raise (with the tail of `log`, the
    process's log file, when given) when `proc` exits first or `timeout` seconds pass."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError("%s exited with %s before listening on %d%s"
                               % (what, proc.returncode, port, log_tail(log)))
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("%s did not listen on %d within %.0f s%s" % (what, port, timeout, log_tail(log)))


def translator_pair(path):
    """(source_name, target_name) from a translator file's safetensors metadata, or None."""
    import json
    import struct
    try:
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            meta = json.loads(f.read(n)).get("__metadata__", {})
        return meta.get("source_name"), meta.get("target_name")
    except (OSError, ValueError, struct.error):
        return None


def shipped_translators(root):
    out = []
    for dirpath, _, files in os.walk(root) if os.path.isdir(root) else []:
        out += [os.path.join(dirpath, f) for f in sorted(files) if f.endswith(".safetensors")]
    return out


def ensure_translators(build, out_dir, pairs=(("qwen3-a", "qwen3-b"), ("qwen3-b", "qwen3-a")),
                       tokens=8192):
    """Translators for the pairs: the shipped trained ones (models/translators/) when present,
    else stage-1 ridge fits made here (seconds).  Returns the directory."""
    shipped = os.path.join(SRC, "models", "translators")
    os.makedirs(out_dir, exist_ok=True)
    for s, d in pairs:
        name = "%s_to_%s.safetensors" % (s, d)
        dst = os.path.join(out_dir, name)
        if os.path.exists(dst):
            continue
        cand = [p for p in shipped_translators(shipped) if translator_pair(p) == (s, d)]
        if cand:
            os.symlink(cand[0], dst)
            continue
        subprocess.run([os.path.join(build, "tests", "router", "kvr_make_translator"),
                        os.path.join(SRC, "models", s), os.path.join(SRC, "models", d),
                        os.path.join(SRC, "testdata", "corpus", "valid.txt"), dst, str(tokens)],
                       check=True, stdout=subprocess.DEVNULL,
                       env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    return out_dir


class Proc:
    def __init__(self, args, log_path, env=None):
        self.args = args
        self.log_path = log_path
        self.log = open(log_path, "a")
        e = dict(os.environ)
        e.setdefault("OPENBLAS_NUM_THREADS", "1")
        if env:
            e.update(env)
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=e)
        self.told_to_stop = False

    def alive(self):
        return self.proc.poll() is None

    def kill9(self):
        self.told_to_stop = True
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self, sig=signal.SIGTERM, timeout=10):
        self.told_to_stop = True
        if self.alive():
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode

    def rss_kb(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0


class FixedLengthClient(python_client.RouterClient):
    """The documented client with ignore_eos on by default: these tests count a turn's tokens
    and compare them with kvr_turn_ref, an in-process replay of fixed-length turns, while the
    router stops at EOS unless told otherwise."""

    def send(self, session_id, text=None, tokens=None, **params):
        params.setdefault("ignore_eos", True)
        return super().send(session_id, text, tokens, **params)

    def send_all(self, session_id, text=None, tokens=None, **params):
        params.setdefault("ignore_eos", True)
        return super().send_all(session_id, text, tokens, **params)


class Fleet:
    """kvld for each model + kvlingo-router, on loopback."""

    def __init__(self, build, work, models=("qwen3-a", "qwen3-b"), policy=None, guardrail=None,
                 transfer=None, extra_top=None, translators=True, kvld_args=(), pairs=None,
                 peers=False, ledger=None, tls=None, api_keys=None, tickets=True, model_dirs=None,
                 tokenizer=None, start_timeout=30.0):
        """tls: None runs every process plaintext (kvld --insecure, insecure: true in the fleet
        file); a PKI of tlscerts.make() runs TLS: each node its own certificate and mutual TLS,
        the router its certificate, the clients verify it with the fleet CA.
        api_keys: the router's key file (api_keys:).  Without one, a plaintext fleet lets every
        client in as tenant "default" (insecure), and a TLS fleet (which must check keys) gets a
        key file of one admin tenant, whose key the clients of client() send by default.
        model_dirs: {model: directory} for models outside models/ (the directory's last component
        is the model's name); tokenizer: the router's tokenizer (default models/qwen3-a)."""
        self.model_dirs = dict(model_dirs or {})
        self.tokenizer = tokenizer or os.path.join(SRC, "models", "qwen3-a")
        self.build, self.work = build, work
        self.start_timeout = start_timeout
        self.tls = tls
        self.api_keys = api_keys
        self.default_key = None
        self.peers = peers   # give each kvld the others' addresses (--peers): connected at start
        # transfer tickets: one fleet key for the nodes and the router (spans then go only to
        # --peers members, so tickets imply --peers); tickets=False: an insecure fleet
        self.tickets = tickets
        self.key_file = os.path.join(work, "fleet.key")
        self.ledger = ledger or os.path.join(work, "ledger.db")
        self.replicas = {}
        os.makedirs(work, exist_ok=True)
        if tickets:
            # the owner's alone, as a fleet's secret is (kvld and the router warn otherwise)
            fd = os.open(self.key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(24).hex().encode() + b"\n")
        self.nodes = {}
        self.node_ports = {}
        self.router = None
        self.procs = []
        atexit.register(self.stop)
        if pairs is None:   # both directions between the first two models (qwen3-a <-> qwen3-b)
            pairs = ((models[0], models[1]), (models[1], models[0])) if len(models) > 1 else \
                (("qwen3-a", "qwen3-b"), ("qwen3-b", "qwen3-a"))
        trdir = ensure_translators(build, os.path.join(work, "translators"), pairs) \
            if translators else None
        for i, m in enumerate(models):
            self.node_ports[m] = free_port()
        for m in models:
            self.start_node(m, trdir, kvld_args)
        self.router_port = free_port()
        self.metrics_port = free_port()
        self.config = os.path.join(work, "fleet.yaml")
        self.write_config(policy or {"name": "cascade", "models": list(models)}, guardrail,
                          transfer, extra_top)
        self.start_router()

    def start_node(self, m, trdir=None, kvld_args=()):
        if trdir is None:
            trdir = os.path.join(self.work, "translators")
        port = self.node_ports[m]
        args = [os.path.join(self.build, "daemon", "kvld"), "--model",
                self.model_dirs.get(m, os.path.join(SRC, "models", m)), "--listen", "127.0.0.1:%d" % port]
        if os.path.isdir(trdir):
            args += ["--translators", trdir]
        args += self.node_tls_args(m)
        if self.peers or self.tickets:
            others = ["127.0.0.1:%d" % q for o, q in self.node_ports.items() if o != m]
            if others:
                args += ["--peers", ",".join(others)]
        if self.tickets:
            args += ["--ticket-key-file", self.key_file]
        elif "--insecure" not in args:
            args += ["--insecure"]
        p = Proc(args + list(kvld_args), os.path.join(self.work, "kvld-%s.log" % m))
        # a real-shape model (gigabytes of weights) takes longer to load than the shipped ones
        wait_port(port, p.proc, timeout=self.start_timeout, what="kvld " + m, log=p.log_path)
        self.nodes[m] = p
        self.procs.append(p)
        return p

    def node_tls_args(self, m):
        """kvld's TLS flags for model m (node-a, node-b, node-c certificates in model order)."""
        if not self.tls:
            return ["--insecure"]
        leaf = "node-" + "abc"[list(self.node_ports).index(m) % 3]
        cert, key = self.tls[leaf]
        return ["--tls-cert", cert, "--tls-key", key, "--tls-ca", self.tls["ca"]]

    def write_config(self, policy, guardrail=None, transfer=None, extra_top=None):
        def yv(v):
            return "[" + ", ".join(v) + "]" if isinstance(v, (list, tuple)) else str(v).lower() \
                if isinstance(v, bool) else str(v)
        lines = ["listen: 127.0.0.1:%d" % self.router_port,
                 "metrics: 127.0.0.1:%d" % self.metrics_port,
                 "ledger: %s" % self.ledger,
                 "tokenizer: %s" % self.tokenizer]
        if self.tls:
            lines += ["tls_cert: %s" % self.tls["router"][0], "tls_key: %s" % self.tls["router"][1],
                      "tls_ca: %s" % self.tls["ca"]]
            if not self.api_keys:
                self.default_key = "sk-fleet-default-0123456789abcdef"
                self.api_keys = os.path.join(self.work, "api-keys.yaml")
                with open(self.api_keys, "w") as f:
                    f.write("tenants:\n  - {name: fleet-admin, keys: [%s], admin: true}\n" % self.default_key)
        else:
            lines.append("insecure: true")
        if self.api_keys:
            lines.append("api_keys: %s" % self.api_keys)
        if self.tickets:
            lines.append("ticket_key_file: %s" % self.key_file)
        elif self.tls:
            raise ValueError("Fleet: a TLS fleet needs transfer tickets (tickets=True)")
        for k, v in (extra_top or {}).items():
            lines.append("%s: %s" % (k, yv(v)))
        lines.append("nodes:")
        for m, port in self.node_ports.items():
            lines.append("  - {name: %s, address: 127.0.0.1:%d, model: %s}" % (
                m.replace("qwen3-", "") + "0", port, m))
        for sect, d in (("policy", policy), ("guardrail", guardrail), ("transfer", transfer)):
            if d:
                lines.append(sect + ":")
                for k, v in d.items():
                    lines.append("  %s: %s" % (k, yv(v)))
        with open(self.config, "w") as f:
            f.write("\n".join(lines) + "\n")

    def start_router(self):
        # a port taken between free_port() and the router's bind: new ports, up to three tries
        for attempt in range(3):
            p = Proc([os.path.join(self.build, "kvlingo-router"), "--config", self.config],
                     os.path.join(self.work, "router.log"))
            try:
                wait_port(self.router_port, p.proc, what="kvlingo-router", log=p.log_path)
                break
            except RuntimeError as e:
                if attempt == 2 or p.alive() or "cannot listen" not in str(e):
                    p.kill9()
                    raise
                print("  (router: %s; again on new ports)" % str(e).split("\n")[-1].strip(" |"))
                self.router_port, self.metrics_port = free_port(), free_port()
                self.rewrite_ports(self.config, self.router_port, self.metrics_port)
        self.router = p
        self.procs.append(p)
        self.addr = "127.0.0.1:%d" % self.router_port
        return p

    @staticmethod
    def rewrite_ports(path, port, mport):
        """Point a fleet file's listen: and metrics: keys at new ports."""
        with open(path) as f:
            lines = f.read().split("\n")
        lines = ["listen: 127.0.0.1:%d" % port if ln.startswith("listen:") else
                 "metrics: 127.0.0.1:%d" % mport if ln.startswith("metrics:") else ln for ln in lines]
        with open(path, "w") as f:
            f.write("\n".join(lines))

    def add_replica(self, name, extra=None):
        """One more kvlingo-router on the same nodes and ledger (its own ports and replica_id);
        returns a dict: proc, addr, metrics_port, config."""
        with open(self.config) as f:
            lines = [ln for ln in f.read().split("\n")
                     if not ln.startswith(("listen:", "metrics:", "replica_id:"))]
        cfg = os.path.join(self.work, "fleet-%s.yaml" % name)
        for attempt in range(3):   # new ports when one was taken before the bind
            port, mport = free_port(), free_port()
            with open(cfg, "w") as f:
                f.write("\n".join(["listen: 127.0.0.1:%d" % port, "metrics: 127.0.0.1:%d" % mport,
                                   "replica_id: %s" % name] +
                                  ["%s: %s" % kv for kv in (extra or {}).items()] + lines))
            p = Proc([os.path.join(self.build, "kvlingo-router"), "--config", cfg],
                     os.path.join(self.work, "router-%s.log" % name))
            try:
                wait_port(port, p.proc, what="kvlingo-router " + name, log=p.log_path)
                break
            except RuntimeError as e:
                if attempt == 2 or p.alive() or "cannot listen" not in str(e):
                    p.kill9()
                    raise
        self.procs.append(p)
        rep = {"proc": p, "addr": "127.0.0.1:%d" % port, "metrics_port": mport, "config": cfg,
               "port": port, "name": name}
        self.replicas[name] = rep
        return rep

    def restart_replica(self, name):
        """Start replica `name` again on its ports (after a kill -9)."""
        rep = self.replicas[name]
        if rep["proc"] in self.procs:
            self.procs.remove(rep["proc"])
        # its own port, which a connection may hold for a moment after the kill: a few tries
        for attempt in range(5):
            p = Proc([os.path.join(self.build, "kvlingo-router"), "--config", rep["config"]],
                     os.path.join(self.work, "router-%s.log" % name))
            try:
                wait_port(rep["port"], p.proc, timeout=60.0, what="kvlingo-router " + name, log=p.log_path)
                break
            except RuntimeError as e:
                if attempt == 4 or p.alive() or "cannot listen" not in str(e):
                    p.kill9()
                    raise
                time.sleep(1.0)
        self.procs.append(p)
        rep["proc"] = p
        return rep

    def client_security(self):
        """RouterClient keyword arguments: verify the router with the fleet CA, or plaintext."""
        return {"tls_ca": self.tls["ca"]} if self.tls else {"insecure": True}

    def cli_security(self):
        """The same for `kvlingo chat` and the Python command-line clients."""
        return ["--tls-ca", self.tls["ca"]] if self.tls else ["--insecure"]

    def replica_client(self, name, timeout=120.0):
        return FixedLengthClient(self.replicas[name]["addr"], timeout=timeout,
                                 stub_dir=os.path.join(self.work, "stubs"), api_key=self.default_key,
                                 **self.client_security())

    def replica_metrics(self, name):
        import urllib.request
        return urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.replicas[name]["metrics_port"],
                                      timeout=5).read().decode()

    def client(self, timeout=120.0, api_key=None):
        return FixedLengthClient(self.addr, timeout=timeout,
                                 stub_dir=os.path.join(self.work, "stubs"),
                                 api_key=api_key if api_key is not None else self.default_key,
                                 **self.client_security())

    def metrics(self):
        import urllib.request
        return urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.metrics_port,
                                      timeout=5).read().decode()

    def stop(self):
        """Stop what this fleet started; raise when the router's log shows a sanitizer report
        (ASan/UBSan/LeakSanitizer builds) or it did not exit cleanly on SIGTERM."""
        bad = []
        for p in reversed(self.procs):
            # a process that exited before anyone told it to is reported with its log's tail
            # is reported with its log's tail: a rerun overwrites the log
            if not p.alive() and not p.told_to_stop:
                print("  NOTE: %s exited by itself with %s before the fleet stopped; its log (%s) ends:%s"
                      % (os.path.basename(p.args[0]), p.proc.returncode, p.log_path,
                         log_tail(p.log_path, 40)), flush=True)
            if p.alive():
                rc = p.stop()
                if rc != 0 and (p is self.router or any(p is r["proc"] for r in self.replicas.values())):
                    bad.append("kvlingo-router exited with %s on SIGTERM" % rc)
        self.procs = []
        logs = [self.router.log_path] if self.router is not None else []
        logs += [os.path.join(self.work, "router-%s.log" % n) for n in self.replicas]
        for path in logs:
            try:
                with open(path, errors="replace") as f:
                    log = f.read()
            except OSError:
                continue
            for w in ("AddressSanitizer", "LeakSanitizer", "runtime error:"):
                if w in log:
                    bad.append("router log %s: %s" % (path, w))
        self.router = None
        if bad:
            raise AssertionError("; ".join(bad))

    def node_stub(self, model):
        """(node_pb2, a Node stub) for a node's own Service, with the client's stubs; a TLS fleet
        presents a certificate of the fleet CA (the Node API is mutual TLS)."""
        import grpc
        import importlib
        self.client()
        node_pb2 = importlib.import_module("kvlingo.v1.node_pb2")
        node_grpc = importlib.import_module("kvlingo.v1.node_pb2_grpc")
        addr = "127.0.0.1:%d" % self.node_ports[model]
        if self.tls:
            cert, key = self.tls["client"]
            creds = grpc.ssl_channel_credentials(
                root_certificates=open(self.tls["ca"], "rb").read(),
                private_key=open(key, "rb").read(), certificate_chain=open(cert, "rb").read())
            ch = grpc.secure_channel(addr, creds)
        else:
            ch = grpc.insecure_channel(addr)
        return node_pb2, node_grpc.NodeStub(ch)

    def node_info(self, model):
        """Info of a node, straight from its Node service."""
        pb, stub = self.node_stub(model)
        return stub.Info(pb.InfoRequest(), timeout=10)


def switching_sessions(c, w, stop_at, text, stats, lock, turns=8, on_session=None):
    """One worker of the soak tests, until stop_at: sessions of `turns` turns on client c that
    escalate every other turn (so the cascade switches models), each turn's ledger length
    checked; counts go to stats (turns, switches, translate, sessions) under lock, and the first
    error ends the worker with a line in stats["errors"].  on_session(sid) sees each new id."""
    k = 0
    while time.time() < stop_at:
        try:
            sid = c.create_session()
            if on_session:
                on_session(sid)
            ctx = 0
            for t in range(turns):
                if time.time() >= stop_at:
                    break
                off = (w * 997 + k * 131) % 19000
                k += 1
                ids, _, s = c.send_all(sid, text[off:off + (300 if t == 0 else 40)],
                                       max_tokens=6, escalate=(t % 2 == 1))
                check(s.context_tokens == ctx + s.user_tokens + len(ids),
                      "ledger length %d != %d + %d + %d" % (s.context_tokens, ctx, s.user_tokens, len(ids)))
                ctx = s.context_tokens
                with lock:
                    stats["turns"] += 1
                    if s.from_model:
                        stats["switches"] += 1
                        stats["translate"] += s.switch_mode == 1
            check(c.close_session(sid), "close")
            with lock:
                stats["sessions"] += 1
        except Exception as e:  # noqa: BLE001
            with lock:
                stats["errors"].append("worker %d: %r" % (w, e))
            return


def corpus_text(start=0, chars=400):
    with open(os.path.join(SRC, "testdata", "corpus", "valid.txt"), encoding="utf-8") as f:
        t = f.read()
    return t[start:start + chars]


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)

