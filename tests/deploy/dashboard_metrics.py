#!/usr/bin/env python3
"""tests/deploy/dashboard_metrics.py: every metric the Grafana dashboard and the alert rules
use is exported by a running kvld or kvlingo-router.

  dashboard_metrics.py --source DIR --kvld BIN --router BIN --kvlingo BIN --work DIR

On loopback only: fits a stage-1 (ridge) translator qwen3-a -> qwen3-b with `kvlingo translator
train --stage1-only` (none the other way), starts kvld for qwen3-a and qwen3-b and
kvlingo-router with the command lines and environment of deploy/k8s/base's StatefulSets and
Deployment (pod paths, 0.0.0.0 addresses and $(VAR)s replaced by local ones) and its fleet.yaml
(every key kept, only addresses and paths moved to this machine; the guardrail shadows every
switch; the TLS Secret's files are a throw-away PKI made here with openssl, so the fleet runs
TLS as deployed), checks gRPC health on the plaintext health ports (grpc.health.v1, what
the Kubernetes probes ask) and /healthz on each, and drives one session:
  turn 1 on qwen3-a, turn 2 on qwen3-b (translated switch: span shipped and translated),
  turn 3 back on qwen3-a (no qwen3-b -> qwen3-a translator: fallback, re-prefill),
  a Send to an unknown session (an error turn).
Every fleet.yaml under deploy/k8s also passes `kvlingo-router --check`, and the OpenAI door the
shipped fleet.yaml opens (http_listen) answers GET /v1/models over HTTPS, verified with the
fleet CA, with the API key (401 without).
Then reads /metrics of the three processes and checks that each kvlingo_* series the dashboard
(deploy/grafana/kvlingo.json) and the rules (deploy/prometheus/kvlingo-rules.yml) use is
exported, with the labels their queries group or filter by.  With a Prometheus server
($KVL_PROMETHEUS: Debian's, unpacked by scripts/test.sh) scraping the three processes every
second, every dashboard query must also return data from the real series and every alert rule
evaluate without error (the conversation runs twice, a few scrapes apart, so rates move).
`promtool check metrics` lint is printed when promtool is there (informative).  Exit 0 / 1.
"""
import argparse
import importlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import yaml
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import testports  # noqa: E402

METRIC = re.compile(r"\bkvlingo_[a-zA-Z0-9_]+")
STANDARD_LABELS = {"instance", "job", "le"}     # added by Prometheus / histogram buckets


def free_port():
    """A loopback port no other test process holds (see tests/testports.py)."""
    return testports.free_port()


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def grpc_health(grpc, addr, timeout=2.0):
    """grpc.health.v1.Health/Check with service "" (empty request): the status enum, or None."""
    ch = grpc.insecure_channel(addr)
    try:
        call = ch.unary_unary("/grpc.health.v1.Health/Check",
                              request_serializer=lambda b: b, response_deserializer=lambda b: b)
        resp = call(b"", timeout=timeout)
        # HealthCheckResponse { ServingStatus status = 1; }: b"\x08\x01" is SERVING
        return resp[1] if len(resp) >= 2 and resp[0] == 0x08 else 0
    except grpc.RpcError:
        return None
    finally:
        ch.close()


def load_router_stubs(src, out):
    from grpc_tools import protoc
    import grpc_tools
    inc = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    proto = os.path.join(src, "proto")
    os.makedirs(out, exist_ok=True)
    files = [os.path.join(proto, "kvlingo", "v1", "router.proto")]
    rc = protoc.main(["protoc", "-I" + proto, "-I" + inc, "--python_out=" + out,
                      "--grpc_python_out=" + out] + files)
    if rc != 0:
        raise RuntimeError("grpc_tools.protoc failed on proto/kvlingo/v1/router.proto")
    for pkg in ("kvlingo", os.path.join("kvlingo", "v1")):
        open(os.path.join(out, pkg, "__init__.py"), "a").close()
    sys.path.insert(0, out)
    return (importlib.import_module("kvlingo.v1.router_pb2"),
            importlib.import_module("kvlingo.v1.router_pb2_grpc"))


def parse_exposition(text):
    """{sample name: set of label names} from Prometheus text format, including names that only
    have # TYPE lines (histograms expand to _bucket, _sum, _count)."""
    out = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) >= 4:
                name, kind = parts[2], parts[3]
                names = [name + s for s in ("_bucket", "_sum", "_count")] if kind in (
                    "histogram", "summary") else [name]
                for n in names:
                    out.setdefault(n, set())
            continue
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s", line)
        if m:
            labels = set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', m.group(3) or ""))
            out.setdefault(m.group(1), set()).update(labels)
    return out


def used_queries(src):
    dash = json.load(open(os.path.join(src, "deploy", "grafana", "kvlingo.json")))
    qs = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                qs.append((f"dashboard panel {p.get('title')!r}", t.get("expr", "")))
            walk(p.get("panels", []))

    walk(dash.get("panels", []))
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        if v.get("type") == "query":
            qs.append((f"dashboard variable {v.get('name')}",
                       q.get("query", "") if isinstance(q, dict) else q or ""))
    rules = yaml.safe_load(open(os.path.join(src, "deploy", "prometheus", "kvlingo-rules.yml")))
    for g in rules.get("groups", []):
        for r in g.get("rules", []):
            qs.append((f"rule {r.get('alert') or r.get('record')}", r.get("expr", "")))
    return qs


def labels_used(expr):
    """Label names a query groups by or matches on (by/without/on/ignoring lists, selectors)."""
    labels = set()
    for grp in re.findall(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", expr):
        labels |= {x.strip() for x in grp.split(",") if x.strip()}
    for sel in re.findall(r"\{([^}]*)\}", expr):
        labels |= set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", sel))
    return labels


def manifest_commands(src):
    """{workload name: container} of the kvld and router containers in deploy/k8s/base."""
    import glob
    out = {}
    for f in sorted(glob.glob(os.path.join(src, "deploy", "k8s", "base", "*.yaml"))):
        if os.path.basename(f) in ("kustomization.yaml", "fleet.yaml"):
            continue
        for d in yaml.safe_load_all(open(f)):
            if d and d.get("kind") in ("StatefulSet", "Deployment"):
                c = d["spec"]["template"]["spec"]["containers"][0]
                out[d["metadata"]["name"]] = c
    return out


def localise(container, binary, paths, ports, env_values):
    """A container of the manifests as a command line for this machine: its binary, its args with
    pod paths (paths: {pod path: local path}) and 0.0.0.0:PORT addresses (ports: {pod port:
    local port}) replaced and $(VAR) expanded the way Kubernetes does; plus its literal env."""
    env = dict(env_values)
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
    argv = [binary]
    for a in container.get("args", []):
        a = str(a)
        a = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a)
        m = re.fullmatch(r"0\.0\.0\.0:(\d+)", a)
        if m:
            a = f"127.0.0.1:{ports[int(m.group(1))]}"
        a = ",".join(paths.get(x, x) for x in a.split(","))   # --peers is a list
        argv.append(a)
    return argv, env


def args_prometheus():
    return os.environ.get("KVL_PROMETHEUS", "")


def start_prometheus(fl, work, src, servers):
    """A Prometheus server (Debian's, on loopback) scraping the three processes every second
    and evaluating deploy/prometheus/kvlingo-rules.yml.  Returns its base URL."""
    port = free_port()
    data = os.path.join(work, "prometheus-data")
    subprocess.run(["rm", "-rf", data])
    targets = []
    for name, _, mport in servers:
        labels = {"component": "router"} if name == "kvlingo-router" else \
                 {"component": "node", "model": name[len("kvld-"):]}
        targets.append({"targets": [f"127.0.0.1:{mport}"], "labels": labels})
    cfg = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
           "rule_files": [os.path.join(src, "deploy", "prometheus", "kvlingo-rules.yml")],
           "scrape_configs": [{"job_name": "kvlingo", "static_configs": targets}]}
    path = os.path.join(work, "prometheus.yml")
    yaml.safe_dump(cfg, open(path, "w"))
    fl.start("prometheus", [args_prometheus(), f"--config.file={path}",
                            f"--storage.tsdb.path={data}",
                            f"--web.listen-address=127.0.0.1:{port}"])
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        fl.check_alive()
        try:
            if http_get(url + "/-/ready")[0] == 200:
                up = json.loads(http_get(url + "/api/v1/query?query=" +
                                         urllib.parse.quote('count(up == 1)'))[1])
                res = up["data"]["result"]
                if res and int(float(res[0]["value"][1])) == len(servers):
                    print(f"ok: Prometheus {url} scrapes the {len(servers)} processes")
                    return url
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError("Prometheus did not become ready and scrape every target:\n" +
                       fl.tail("prometheus"))


def evaluate_with_prometheus(url, src):
    """Every dashboard query, evaluated by Prometheus on the scraped series, returns data (at
    least one finite value; a query that filters with a comparison may be empty), and every
    alert rule evaluates without error."""
    problems = []
    shown = filtered = 0
    for where, expr in used_queries(src):
        if where.startswith("rule "):
            continue
        q = expr
        m = re.match(r"label_values\((\w+),\s*(\w+)\)", q)
        if m:
            q = f"count by ({m.group(2)}) ({m.group(1)})"
        q = q.replace("$__rate_interval", "1m").replace("$__interval", "15s")
        q = re.sub(r"\$\{?[a-zA-Z_]+\}?", ".*", q)
        try:
            body = json.loads(http_get(url + "/api/v1/query?query=" + urllib.parse.quote(q))[1])
        except (OSError, ValueError) as e:
            problems.append(f"{where}: Prometheus could not evaluate {expr!r}: {e}")
            continue
        res = body.get("data", {}).get("result", [])
        finite = [r for r in res if r["value"][1] not in ("NaN", "+Inf", "-Inf")]
        filters = re.search(r"\)\s*(>|<|==|!=)\s*[0-9.]+\s*$", expr)
        if finite:
            shown += 1
        elif filters:
            filtered += 1
        else:
            problems.append(f"{where}: {expr!r} returned no finite value from the real series "
                            f"({len(res)} series)")
    print(f"ok: {shown} dashboard queries return data from the scraped series (Prometheus), "
          f"{filtered} filtered by a comparison to nothing")
    rules = json.loads(http_get(url + "/api/v1/rules")[1])["data"]["groups"]
    n = 0
    for g in rules:
        for r in g["rules"]:
            n += 1
            if r.get("health") != "ok":
                problems.append(f"rule {r.get('name')}: {r.get('health')}: {r.get('lastError')}")
    print(f"ok: {n} alert rules evaluate on the scraped series")
    return problems


class Fleet:
    def __init__(self, work):
        self.work = work
        self.procs = []

    def start(self, name, argv, env=None):
        log = open(os.path.join(self.work, f"{name}.log"), "w")
        log.write("$ " + " ".join(argv) + "\n")
        log.flush()
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                             env=dict(os.environ, **(env or {})))
        self.procs.append((name, p, log))
        return p

    def check_alive(self):
        for name, p, _ in self.procs:
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode}:\n" + self.tail(name))

    def tail(self, name, n=30):
        try:
            lines = open(os.path.join(self.work, f"{name}.log")).read().splitlines()
        except OSError:
            return ""
        return "\n".join("    " + l for l in lines[-n:])

    def stop(self):
        for name, p, _ in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.time() + 20
        for name, p, log in reversed(self.procs):
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                print(f"note: {name} did not exit 20 s after SIGTERM; killing it")
                p.kill()
                p.wait()
            log.close()
            if p.returncode != 0:
                print(f"note: {name} exited with {p.returncode} after SIGTERM (a pod would be "
                      "seen as failed): see its log in " + self.work)
            if "Sanitizer" in open(os.path.join(self.work, f"{name}.log"), errors="replace").read():
                print(f"note: {name}'s log has a sanitizer report: {self.work}/{name}.log")


def main():
    ap = argparse.ArgumentParser()
    for a in ("--source", "--kvld", "--router", "--kvlingo", "--work"):
        ap.add_argument(a, required=True)
    args = ap.parse_args()
    import grpc

    src, work = args.source, args.work
    os.makedirs(work, exist_ok=True)
    problems = []

    # ---- the Secret kvlingo-tls as the pods see it: /etc/kvlingo-tls/{tls.crt,tls.key,ca.crt}
    sys.path.insert(0, os.path.join(src, "tests", "router"))
    import shutil
    import tlscerts
    pki = tlscerts.make(os.path.join(work, "pki"))
    tls_dirs = {}
    for who, leaf in (("router", "router"), ("kvld", "node-a")):
        d = os.path.join(work, "tls-" + who)
        os.makedirs(d, exist_ok=True)
        for src_path, name in ((pki[leaf][0], "tls.crt"), (pki[leaf][1], "tls.key"), (pki["ca"], "ca.crt")):
            shutil.copyfile(src_path, os.path.join(d, name))
        tls_dirs[who] = d

    # ---- translator qwen3-a -> qwen3-b (stage 1 only: seconds); none the other way
    trdir = os.path.join(work, "translators")
    os.makedirs(trdir, exist_ok=True)
    tr = os.path.join(trdir, "qwen3-a_to_qwen3-b.safetensors")
    # always anew: a file left by an older build may not match today's format
    t0 = time.time()
    r = subprocess.run([args.kvlingo, "translator", "train",
                        "--source", os.path.join(src, "models", "qwen3-a"),
                        "--target", os.path.join(src, "models", "qwen3-b"),
                        "--corpus", os.path.join(src, "testdata", "corpus", "train_slice.txt"),
                        "--out", tr, "--stage1-only", "--ridge-tokens", "4096"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print("FAIL: kvlingo translator train:\n" + r.stdout + r.stderr)
        return 1
    print(f"ok: translator qwen3-a -> qwen3-b fitted (stage 1) in {time.time() - t0:.1f} s")

    # the Secret kvlingo-ticket-key of the pods: one transfer-ticket key for the whole fleet
    key_file = os.path.join(work, "ticket.key")
    with open(key_file, "w") as kf:
        kf.write(os.urandom(24).hex() + "\n")

    # ---- every fleet.yaml the manifests ship passes the router's own check
    import glob
    # the API key file the pods mount from the Secret kvlingo-api-keys: a local one with a key
    api_key = "sk-dashboard-test-0000000001"
    keys = os.path.join(work, "api-keys.yaml")
    with open(keys, "w") as fh:
        fh.write('tenants:\n  - name: ops\n    keys: ["%s"]\n    admin: true\n' % api_key)
    md = (("authorization", "Bearer " + api_key),)
    for f in sorted(glob.glob(os.path.join(src, "deploy", "k8s", "*", "fleet.yaml")) +
                    glob.glob(os.path.join(src, "deploy", "k8s", "overlays", "*", "fleet.yaml"))):
        text = open(f).read().replace("/opt/kvlingo/models/", os.path.join(src, "models") + "/")
        text = text.replace("/var/lib/kvlingo/", os.path.join(work, "check-"))
        text = text.replace("/etc/kvlingo-tls/", tls_dirs["router"] + "/")
        text = text.replace("/etc/kvlingo-keys/api-keys.yaml", keys)
        text = text.replace("/etc/kvlingo-ticket/key", key_file)
        local = os.path.join(work, "check-fleet.yaml")
        open(local, "w").write(text)
        # a ledger from the environment is the Secret's URI in a pod; --check does not contact it
        env = dict(os.environ, KVLINGO_LEDGER="postgresql://kvlingo:placeholder@postgres:5432/kvlingo")
        r = subprocess.run([args.router, "--config", local, "--check"], capture_output=True,
                           text=True, timeout=60, env=env)
        rel = os.path.relpath(f, src)
        if r.returncode != 0:
            problems.append(f"kvlingo-router --check rejects {rel}: {(r.stdout + r.stderr).strip()}")
        else:
            print(f"ok: kvlingo-router --check accepts {rel}: {r.stdout.strip().split(': ', 1)[-1]}")

    # ---- fleet.yaml: the shipped one, moved to loopback
    fleet = yaml.safe_load(open(os.path.join(src, "deploy", "k8s", "base", "fleet.yaml")))
    ports = {k: free_port() for k in ("a", "am", "ah", "b", "bm", "bh", "r", "rm", "rh")}
    nodes = {n["model"]: n for n in fleet["nodes"]}
    if set(nodes) != {"qwen3-a", "qwen3-b"}:
        print(f"FAIL: deploy/k8s/base/fleet.yaml serves {sorted(nodes)}, this test expects "
              "qwen3-a and qwen3-b")
        return 1
    nodes["qwen3-a"]["address"] = f"127.0.0.1:{ports['a']}"
    nodes["qwen3-b"]["address"] = f"127.0.0.1:{ports['b']}"
    fleet["listen"] = f"127.0.0.1:{ports['r']}"
    fleet["metrics"] = f"127.0.0.1:{ports['rm']}"
    fleet["health_listen"] = f"127.0.0.1:{ports['rh']}"
    if fleet.get("http_listen"):   # the OpenAI-compatible API the manifests open (HTTPS)
        ports["ro"] = free_port()
        fleet["http_listen"] = f"127.0.0.1:{ports['ro']}"
    for k in ("tls_cert", "tls_key", "tls_ca"):
        fleet[k] = str(fleet[k]).replace("/etc/kvlingo-tls", tls_dirs["router"])
    fleet["ledger"] = os.path.join(work, "router.db")
    fleet["tokenizer"] = os.path.join(src, "models", "qwen3-a")
    if "api_keys" in fleet:
        fleet["api_keys"] = keys
    fleet["ticket_key_file"] = key_file
    fleet.setdefault("guardrail", {})["shadow_fraction"] = 1.0
    for f in ("router.db", "router.db-wal", "router.db-shm"):
        if os.path.exists(os.path.join(work, f)):
            os.remove(os.path.join(work, f))
    cfg = os.path.join(work, "fleet.yaml")
    yaml.safe_dump(fleet, open(cfg, "w"), sort_keys=False)

    fl = Fleet(work)
    try:
        # the kvld command lines of the StatefulSets, as the pods run them
        containers = manifest_commands(src)
        for m, p, pm, ph in (("qwen3-a", "a", "am", "ah"), ("qwen3-b", "b", "bm", "bh")):
            c = containers.get(f"kvld-{m}")
            if not c:
                raise RuntimeError(f"deploy/k8s/base has no StatefulSet kvld-{m}")
            tls_paths = {f"/etc/kvlingo-tls/{f}": os.path.join(tls_dirs["kvld"], f)
                         for f in ("tls.crt", "tls.key", "ca.crt")}
            # pod DNS names (--advertise, --peers) become the loopback addresses fleet.yaml got
            argv, env = localise(c, args.kvld,
                                 dict({f"/models/{m}": os.path.join(src, "models", m),
                                       "/models/translators": trdir, "/etc/kvlingo-ticket/key": key_file,
                                       "kvld-qwen3-a-0.kvld-qwen3-a:7100": f"127.0.0.1:{ports['a']}",
                                       "kvld-qwen3-b-0.kvld-qwen3-b:7100": f"127.0.0.1:{ports['b']}"},
                                      **tls_paths),
                                 {7100: ports[p], 7101: ports[pm], 7102: ports[ph]},
                                 {"KVL_THREADS": "1", "POD_NAME": f"kvld-{m}-0"})
            fl.start(f"kvld-{m}", argv, env)
        # (name, plaintext health port: what the probes ask, metrics port)
        servers = [("kvld-qwen3-a", ports["ah"], ports["am"]),
                   ("kvld-qwen3-b", ports["bh"], ports["bm"])]

        def wait_healthy(name, gport, mport, limit=90):
            deadline = time.time() + limit
            while time.time() < deadline:
                fl.check_alive()
                if grpc_health(grpc, f"127.0.0.1:{gport}") == 1:
                    try:
                        if http_get(f"http://127.0.0.1:{mport}/healthz")[0] == 200:
                            return
                    except OSError:
                        pass
                time.sleep(0.3)
            raise RuntimeError(f"{name}: not SERVING on gRPC health / 200 on /healthz after "
                               f"{limit} s:\n" + fl.tail(name))

        for s in servers:
            wait_healthy(*s)
        c = containers.get("kvlingo-router")
        if not c:
            raise RuntimeError("deploy/k8s/base has no Deployment kvlingo-router")
        argv, env = localise(c, args.router, {"/etc/kvlingo/fleet.yaml": cfg}, {}, {})
        fl.start("kvlingo-router", argv, env)
        wait_healthy("kvlingo-router", ports["rh"], ports["rm"])
        print("ok: kvld qwen3-a, kvld qwen3-b and kvlingo-router SERVING (grpc.health.v1) and "
              "200 on /healthz")

        # ---- one session: a, b (translate), a (fallback: no b -> a translator), an error
        pb2, pbg = load_router_stubs(src, os.path.join(work, "stubs"))
        # clients verify the router with the fleet CA (server TLS; no client certificate)
        ch = grpc.secure_channel(f"127.0.0.1:{ports['r']}", grpc.ssl_channel_credentials(
            root_certificates=open(pki["ca"], "rb").read()))
        stub = pbg.RouterStub(ch)
        sid = stub.CreateSession(pb2.CreateSessionRequest(), timeout=30, metadata=md).session_id
        if "ro" in ports:
            # the OpenAI door of the shipped fleet.yaml: HTTPS with the router's certificate,
            # verified with the fleet CA, and the same API keys
            import ssl
            ctx = ssl.create_default_context(cafile=pki["ca"])
            rq = urllib.request.Request(f"https://127.0.0.1:{ports['ro']}/v1/models",
                                        headers={"Authorization": "Bearer " + api_key})
            with urllib.request.urlopen(rq, timeout=10, context=ctx) as r:
                ids = sorted(m["id"] for m in json.loads(r.read())["data"])
            if not {"qwen3-a", "qwen3-b"} <= set(ids):
                problems.append(f"GET /v1/models over HTTPS listed {ids}")
            try:
                with urllib.request.urlopen(f"https://127.0.0.1:{ports['ro']}/v1/models", timeout=10,
                                            context=ctx):
                    problems.append("GET /v1/models without an API key was served")
            except urllib.error.HTTPError as e:
                if e.code != 401:
                    problems.append(f"GET /v1/models without an API key: HTTP {e.code}, expected 401")
            print(f"ok: the OpenAI API of the shipped fleet.yaml answers over HTTPS (models {ids}), "
                  "401 without a key")
        text = open(os.path.join(src, "testdata", "corpus", "valid.txt")).read().split("\n")
        text = [t for t in text if len(t) > 200]
        prom = None
        if args_prometheus():
            prom = start_prometheus(fl, work, src, servers + [("kvlingo-router", ports["rh"], ports["rm"])])

        # two rounds, a few scrapes apart, so that rate() sees every counter move (the router
        # creates a labelled series at its first event)
        summaries = []
        turns = (("qwen3-a", "qwen3-b", "qwen3-a"), ("qwen3-b", "qwen3-a"))
        for rnd, models in enumerate(turns):
            for model in models:
                i = len(summaries)
                req = pb2.SendRequest(session_id=sid, text=text[i][:400], max_tokens=4, model=model)
                summary = None
                for msg in stub.Send(req, timeout=120, metadata=md):
                    if msg.HasField("summary"):
                        summary = msg.summary
                if summary is None:
                    raise RuntimeError(f"turn {i}: no summary")
                mode = pb2.SwitchMode.Name(summary.switch_mode)
                print(f"  turn {i}: asked {model}, answered {summary.model} ({summary.node}), "
                      f"{mode}, span {summary.span_tokens} tokens, TTFT {summary.ttft_seconds * 1e3:.1f} ms"
                      + (f", fallback: {summary.fallback_reason}" if summary.fallback_reason else ""))
                summaries.append(summary)
            try:
                for _ in stub.Send(pb2.SendRequest(session_id="no-such-session", text="hello"),
                                   timeout=30, metadata=md):
                    pass
                problems.append("a Send to an unknown session did not fail")
            except grpc.RpcError as e:
                print(f"  unknown session: {e.code().name} (expected an error)")
            time.sleep(3.0 if prom else 1.0)   # scrapes; the guardrail's shadow re-prefill
        ch.close()
        for i in (1, 3):
            if pb2.SwitchMode.Name(summaries[i].switch_mode) != "SWITCH_MODE_TRANSLATE":
                problems.append(f"turn {i} (qwen3-a -> qwen3-b) was not translated: "
                                f"{pb2.SwitchMode.Name(summaries[i].switch_mode)} "
                                f"{summaries[i].fallback_reason}")
        for i in (2, 4):
            if not summaries[i].fallback_reason:
                problems.append(f"turn {i} (qwen3-b -> qwen3-a, no translator) reported no fallback")
        if prom:
            problems += evaluate_with_prometheus(prom, src)

        # ---- scrape
        exported = {}
        expositions = {}
        for name, _, mport in servers + [("kvlingo-router", ports["rh"], ports["rm"])]:
            code, body = http_get(f"http://127.0.0.1:{mport}/metrics")
            if code != 200:
                problems.append(f"{name}: /metrics answered {code}")
            expositions[name] = body
            for k, v in parse_exposition(body).items():
                exported.setdefault(k, set()).update(v)
            with open(os.path.join(work, f"{name}.metrics"), "w") as f:
                f.write(body)
        fl.check_alive()
    except Exception as e:   # a process that died or never became healthy
        print(f"FAIL: {e}")
        fl.stop()
        return 1
    fl.stop()

    # ---- compare
    names = sorted(n for n in exported if n.startswith("kvlingo_"))
    print(f"exported by kvld and kvlingo-router ({len(names)}): {' '.join(names)}")
    checked = set()
    for where, expr in used_queries(src):
        metrics = set(METRIC.findall(expr))
        for m in sorted(metrics):
            checked.add(m)
            if m not in exported:
                problems.append(f"{where}: {m} is not exported by kvld or kvlingo-router")
        present = [m for m in metrics if m in exported]
        for label in sorted(labels_used(expr) - STANDARD_LABELS):
            if present and not any(label in exported[m] for m in present):
                problems.append(f"{where}: label {label!r} is on none of "
                                f"{', '.join(sorted(present))}")
    print(f"checked {len(checked)} metric names used by the dashboard and the alert rules")

    promtool = os.environ.get("KVL_PROMTOOL", "")
    if promtool:
        for name, body in expositions.items():
            r = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True,
                               text=True)
            lint = (r.stdout + r.stderr).strip()
            if lint:
                print(f"note: promtool check metrics on {name} (informative):\n    "
                      + lint.replace("\n", "\n    "))

    for p in problems:
        print(f"  problem: {p}")
    print(f"{'PASS' if not problems else 'FAIL'}: dashboard metrics: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
