#!/usr/bin/env python3
"""tests/deploy/check_manifests.py: consistency checks on a rendered kustomize overlay.

  check_manifests.py --overlay NAME RENDERED.yaml   checks one overlay's objects
  check_manifests.py --same A.yaml B.yaml           the same objects (two kubectl versions)

What a schema validator cannot see, checked here on the objects `kubectl kustomize` printed:
  - one namespace for everything, and its Namespace object;
  - every container: CPU and memory requests and limits; readiness and liveness probes on the
    gRPC health of the container port named "health" (Kubernetes-native `grpc:` probes, which
    speak no TLS: the plaintext health-only port, --health-listen / health_listen);
    prometheus.io/* annotations naming the port called "metrics"; a pinned image tag;
  - every StatefulSet: a headless Service (serviceName) selecting its pods, a
    PodDisruptionBudget selecting them, a "models" volume claim; kvld's flags agree with the
    ports (--listen, --metrics, --health-listen) and the model label (--model /models/<model>);
    its --peers lists every other kvld of fleet.yaml (spans move only between listed nodes);
  - TLS everywhere: kvld's --tls-cert/--tls-key/--tls-ca and fleet.yaml's tls_cert/tls_key/tls_ca
    name files of a mounted Secret volume whose items provide them; nothing runs --insecure;
  - transfer tickets: kvld's --ticket-key-file and fleet.yaml's ticket_key_file are files of a
    mounted Secret; kvld --advertise is its pod's DNS name $(POD_NAME).<service>:<grpc port>;
  - every Service selects some pods and its target ports exist; the router's grpc and openai
    ports are published, the openai one with sessionAffinity ClientIP; a ServiceMonitor exactly in the
    *-monitoring overlays, selecting Services that have its endpoint port; every referenced
    ConfigMap / PVC exists;
  - fleet.yaml (the router's ConfigMap): listen / metrics / health_listen ports = the router's
    container ports; http_listen (the OpenAI-compatible API) is set exactly when the router has
    a container port named openai, and on it;
    every node address is <statefulset>-<ordinal>.<service>:<grpc port> of a pod that exists,
    with the StatefulSet's model; every kvld pod is listed exactly once; the policy names only
    models the fleet has;
  - NetworkPolicies: default deny; kvld's gRPC port admits the router and the nodes only; the
    router's client ports (grpc, openai) admit anyone; every metrics port admits a pod labelled only
    kvlingo.dev/metrics-scraper: "true" (as deploy/README.md asks of Prometheus);
  - GPUs (nvidia.com/gpu requested = limited) on every kvld exactly in the gpu overlays;
  - every Secret volume without the "other" read bit (defaultMode);
  - the router's API keys: api_keys names a file in a Secret volume (mounted whole, so that an
    update of the Secret reaches the router);
  - the router's ledger: a SQLite file on a writable volume (one replica), or env:NAME from a
    Secret (never a PostgreSQL URI in the ConfigMap); several replicas need the latter, a
    PodDisruptionBudget and no Recreate strategy.
Exit 0 when all hold, 1 with one line per problem otherwise.
"""
import copy
import re
import sys

import yaml

problems = []


def bad(msg):
    problems.append(msg)


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def oid(o):
    return f"{o.get('kind')}/{o.get('metadata', {}).get('name')}"


def selects(selector, labels):
    """matchLabels-style (or plain map) selector, with matchExpressions In / NotIn / Exists /
    DoesNotExist, against labels; an empty selector selects nothing here (none of ours should
    be empty)."""
    selector = selector or {}
    exprs = selector.get("matchExpressions") or []
    sel = selector.get("matchLabels", {} if exprs else selector)
    if not sel and not exprs:
        return False
    if not all(labels.get(k) == v for k, v in sel.items()):
        return False
    for e in exprs:
        k, op, vals = e.get("key"), e.get("operator"), e.get("values") or []
        ok = {"In": k in labels and labels[k] in vals, "NotIn": labels.get(k) not in vals,
              "Exists": k in labels, "DoesNotExist": k not in labels}.get(op, False)
        if not ok:
            return False
    return True


def pod_spec(o):
    return o["spec"]["template"]["spec"]


def port_by_name(container, name):
    for p in container.get("ports", []):
        if p.get("name") == name:
            return p.get("containerPort")
    return None


def secret_file(spec, container, path):
    """Why `path` is not a file of a Secret volume mounted in `container` ('' when it is)."""
    if not path:
        return "not set"
    path = str(path)
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    for m in container.get("volumeMounts", []):
        mp = m["mountPath"].rstrip("/") + "/"
        if not path.startswith(mp):
            continue
        sec = vols.get(m["name"], {}).get("secret")
        if not sec:
            return f"mount {m['mountPath']} is not a Secret volume"
        items = sec.get("items")
        rel = path[len(mp):]
        if items is not None and rel not in {i["path"] for i in items}:
            return f"Secret {sec.get('secretName')} mounted at {m['mountPath']} has no item {rel}"
        return ""
    return "no Secret volume is mounted there"


def parse_flags(args):
    flags = {}
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--") and "=" in a:
            k, v = a[2:].split("=", 1)
            flags[k] = v
        elif a.startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--"):
            flags[a[2:]] = args[i + 1]
            i += 1
        elif a.startswith("--"):
            flags[a[2:]] = True
        i += 1
    return flags


def port_of(addr):
    m = re.fullmatch(r"(.+):(\d+)", str(addr))
    return (m.group(1), int(m.group(2))) if m else (None, None)


def check_overlay(name, objs):
    is_gpu = name.split("-")[0] == "gpu"   # gpu and gpu-monitoring
    by_kind = {}
    for o in objs:
        for key in ("apiVersion", "kind", "metadata"):
            if key not in o:
                bad(f"an object lacks {key}: {str(o)[:80]}")
        by_kind.setdefault(o.get("kind"), []).append(o)
    names = {oid(o) for o in objs}
    if len(names) != len(objs):
        bad("two objects share a kind and a name")

    # ---- namespace and labels
    nss = {o["metadata"].get("namespace") for o in objs if o["kind"] != "Namespace"}
    if len(nss) != 1 or None in nss:
        bad(f"objects are not all in one namespace: {sorted(map(str, nss))}")
    else:
        ns = nss.pop()
        if not any(o["metadata"]["name"] == ns for o in by_kind.get("Namespace", [])):
            bad(f"namespace {ns} is used but no Namespace object creates it")
    for o in objs:
        if o["metadata"].get("labels", {}).get("app.kubernetes.io/part-of") != "kvlingo":
            bad(f"{oid(o)}: no label app.kubernetes.io/part-of=kvlingo")

    configmaps = {o["metadata"]["name"]: o for o in by_kind.get("ConfigMap", [])}
    pvcs = {o["metadata"]["name"] for o in by_kind.get("PersistentVolumeClaim", [])}
    services = {o["metadata"]["name"]: o for o in by_kind.get("Service", [])}
    workloads = by_kind.get("Deployment", []) + by_kind.get("StatefulSet", [])
    if not by_kind.get("Deployment"):
        bad("no Deployment (the router)")
    if not by_kind.get("StatefulSet"):
        bad("no StatefulSet (kvld nodes)")

    kvld_pods = {}      # (statefulset, ordinal) -> (service, grpc port, model)
    kvld_peers = {}     # statefulset -> its --peers, $(VAR)s expanded as Kubernetes does
    router = None
    for w in workloads:
        wid = oid(w)
        spec = pod_spec(w)
        tlabels = w["spec"]["template"]["metadata"].get("labels", {})
        if not selects(w["spec"].get("selector", {}), tlabels):
            bad(f"{wid}: selector does not select its own pod template")
        if not spec.get("securityContext", {}).get("runAsNonRoot"):
            bad(f"{wid}: pod securityContext.runAsNonRoot is not set")
        if spec.get("automountServiceAccountToken") is not False:
            bad(f"{wid}: automountServiceAccountToken is not false (no pod needs API credentials)")
        # Secret files hold keys: the programs warn at start about one any user can read, which
        # a Secret volume without defaultMode (0644) is
        for v in spec.get("volumes", []):
            if "secret" in v and v["secret"].get("defaultMode", 0o644) & 0o004:
                bad(f"{wid}: Secret volume {v['name']} is readable by every user (defaultMode "
                    f"{oct(v['secret'].get('defaultMode', 0o644))}; 0440 with fsGroup)")
        vol_names = {v["name"] for v in spec.get("volumes", [])}
        vol_names |= {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])}
        for v in spec.get("volumes", []):
            if "configMap" in v and v["configMap"]["name"] not in configmaps:
                bad(f"{wid}: volume {v['name']}: no ConfigMap {v['configMap']['name']}")
            if "persistentVolumeClaim" in v and v["persistentVolumeClaim"]["claimName"] not in pvcs:
                bad(f"{wid}: volume {v['name']}: no PersistentVolumeClaim "
                    f"{v['persistentVolumeClaim']['claimName']}")
        ann = w["spec"]["template"]["metadata"].get("annotations", {})
        for c in spec.get("initContainers", []) + spec.get("containers", []):
            cid = f"{wid} container {c['name']}"
            res = c.get("resources", {})
            for part in ("requests", "limits"):
                for r in ("cpu", "memory"):
                    if r not in res.get(part, {}):
                        bad(f"{cid}: no resources.{part}.{r}")
            if ":" not in c.get("image", "").rsplit("/", 1)[-1]:
                bad(f"{cid}: image {c.get('image')!r} has no tag (the overlay's images: sets it)")
            for m in c.get("volumeMounts", []):
                if m["name"] not in vol_names:
                    bad(f"{cid}: volumeMount {m['name']} has no volume")
            if c.get("securityContext", {}).get("allowPrivilegeEscalation") is not False:
                bad(f"{cid}: allowPrivilegeEscalation is not false")
        for c in spec.get("containers", []):
            cid = f"{wid} container {c['name']}"
            grpc = port_by_name(c, "grpc")
            metrics = port_by_name(c, "metrics")
            health = port_by_name(c, "health")
            if grpc is None or metrics is None or health is None:
                bad(f"{cid}: needs container ports named grpc, metrics and health")
                continue
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                p = c.get(probe)
                if not p or "grpc" not in p:
                    bad(f"{cid}: {probe} is not a gRPC health probe")
                elif p["grpc"].get("port") != health:
                    bad(f"{cid}: {probe} probes port {p['grpc'].get('port')}, the plaintext health "
                        f"port is {health} (the kubelet's gRPC probe speaks no TLS)")
            if "--insecure" in [str(a) for a in c.get("args", [])]:
                bad(f"{cid}: runs --insecure (plaintext gRPC)")
            if ann.get("prometheus.io/scrape") != "true" or \
                    str(ann.get("prometheus.io/port")) != str(metrics) or \
                    ann.get("prometheus.io/path") != "/metrics":
                bad(f"{wid}: prometheus.io/scrape|port|path annotations do not name the "
                    f"metrics port {metrics} and /metrics")
            gpu_l = c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
            gpu_r = c.get("resources", {}).get("requests", {}).get("nvidia.com/gpu")
            if str(gpu_l) != str(gpu_r):
                bad(f"{cid}: nvidia.com/gpu requests ({gpu_r}) != limits ({gpu_l})")
            if w["kind"] == "StatefulSet":
                if is_gpu and not (gpu_l and int(gpu_l) >= 1):
                    bad(f"{cid}: the gpu overlay's kvld requests no nvidia.com/gpu")
                if not is_gpu and gpu_l:
                    bad(f"{cid}: overlay {name} requests nvidia.com/gpu")
            elif gpu_l:
                bad(f"{cid}: the router requests a GPU")

        if w["kind"] == "Deployment":
            router = w
            continue
        # ---- StatefulSet: kvld
        sname = w["spec"].get("serviceName")
        svc = services.get(sname)
        if not svc:
            bad(f"{wid}: serviceName {sname} has no Service")
        else:
            if svc["spec"].get("clusterIP") != "None":
                bad(f"{wid}: Service {sname} is not headless (clusterIP: None)")
            if not selects(svc["spec"].get("selector", {}), tlabels):
                bad(f"{wid}: Service {sname} does not select its pods")
        if not any(selects(p["spec"].get("selector", {}), tlabels)
                   for p in by_kind.get("PodDisruptionBudget", [])):
            bad(f"{wid}: no PodDisruptionBudget selects its pods")
        if "models" not in {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])}:
            bad(f"{wid}: no 'models' volumeClaimTemplate")
        model = tlabels.get("kvlingo.dev/model")
        kvld = [c for c in pod_spec(w)["containers"] if c["name"] == "kvld"]
        if not kvld or not model:
            bad(f"{wid}: needs a container named kvld and a kvlingo.dev/model label")
            continue
        c = kvld[0]
        flags = parse_flags(c.get("args", []))
        if flags.get("model") != f"/models/{model}":
            bad(f"{wid}: --model is {flags.get('model')}, expected /models/{model}")
        if port_of(flags.get("listen", ""))[1] != port_by_name(c, "grpc"):
            bad(f"{wid}: --listen {flags.get('listen')} is not the grpc port")
        if port_of(flags.get("metrics", ""))[1] != port_by_name(c, "metrics"):
            bad(f"{wid}: --metrics {flags.get('metrics')} is not the metrics port")
        if port_of(flags.get("health-listen", ""))[1] != port_by_name(c, "health"):
            bad(f"{wid}: --health-listen {flags.get('health-listen')} is not the health port")
        for k in ("tls-cert", "tls-key", "tls-ca"):
            why = secret_file(pod_spec(w), c, flags.get(k))
            if why:
                bad(f"{wid}: --{k} {flags.get(k)}: {why}")
        # transfer tickets: the fleet key from a Secret, and the pod's name as fleet.yaml gives it
        why = secret_file(pod_spec(w), c, flags.get("ticket-key-file"))
        if why:
            bad(f"{wid}: --ticket-key-file {flags.get('ticket-key-file')}: {why}")
        if flags.get("advertise") != f"$(POD_NAME).{sname}:{port_by_name(c, 'grpc')}":
            bad(f"{wid}: --advertise {flags.get('advertise')} is not $(POD_NAME).{sname}:"
                f"{port_by_name(c, 'grpc')} (the address fleet.yaml names the pod by)")
        for i in range(int(w["spec"].get("replicas", 1))):
            kvld_pods[(w["metadata"]["name"], i)] = (sname, port_by_name(c, "grpc"), model)
        env = {e["name"]: str(e["value"]) for e in c.get("env", []) if "value" in e}
        peers = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), str(flags.get("peers", "")))
        kvld_peers[w["metadata"]["name"]] = {p.strip() for p in peers.split(",") if p.strip()}

    # ---- Services select pods and name existing ports
    for s in services.values():
        sel = s["spec"].get("selector", {})
        targets = [w for w in workloads
                   if selects(sel, w["spec"]["template"]["metadata"].get("labels", {}))]
        if not targets:
            bad(f"{oid(s)}: selects no pods")
            continue
        cports = {p.get("name") for w in targets for c in pod_spec(w)["containers"]
                  for p in c.get("ports", [])}
        for p in s["spec"].get("ports", []):
            tp = p.get("targetPort", p.get("port"))
            if isinstance(tp, str) and tp not in cports:
                bad(f"{oid(s)}: targetPort {tp} is no container port")
    # the router's client ports are published, the OpenAI door's with client affinity (its
    # prefix index lives in each replica's memory)
    router_svcs = [s for s in services.values()
                   if s["spec"].get("selector", {}).get("app.kubernetes.io/name") == "kvlingo-router"]
    router_c = next((pod_spec(w)["containers"][0] for w in workloads if w["kind"] == "Deployment"), None)
    for pname in ("grpc", "openai"):
        if router_c is None or port_by_name(router_c, pname) is None:
            continue
        pub = [s for s in router_svcs if any(p.get("targetPort") in (pname, port_by_name(router_c, pname))
                                             for p in s["spec"].get("ports", []))]
        if not pub:
            bad(f"no Service publishes the router's {pname} port")
        elif pname == "openai" and not any(s["spec"].get("sessionAffinity") == "ClientIP" for s in pub):
            bad("the Service publishing the router's openai port has no sessionAffinity: ClientIP "
                "(stateless OpenAI requests would alternate between replicas' prefix indexes)")

    # ---- ServiceMonitor: only in the *-monitoring overlays (the others must apply on a cluster
    # without the Prometheus Operator's CRDs)
    sms = by_kind.get("ServiceMonitor", [])
    if name.endswith("-monitoring") and not sms:
        bad("no ServiceMonitor in a -monitoring overlay")
    if not name.endswith("-monitoring") and sms:
        bad(f"overlay {name} has a ServiceMonitor: `kubectl apply -k` fails without the Prometheus "
            "Operator's CRDs (it belongs in deploy/k8s/monitoring, added by the -monitoring overlays)")
    for sm in sms:
        chosen = [s for s in services.values()
                  if selects(sm["spec"].get("selector", {}), s["metadata"].get("labels", {}))]
        if not chosen:
            bad(f"{oid(sm)}: selects no Service")
        kinds = {s["spec"]["selector"].get("app.kubernetes.io/name") for s in chosen}
        if not {"kvld", "kvlingo-router"} <= kinds:
            bad(f"{oid(sm)}: does not scrape both the router and the nodes ({sorted(map(str, kinds))})")
        for ep in sm["spec"].get("endpoints", []):
            for s in chosen:
                if ep.get("port") not in {p.get("name") for p in s["spec"].get("ports", [])}:
                    bad(f"{oid(sm)}: Service {s['metadata']['name']} has no port {ep.get('port')}")

    # ---- fleet.yaml
    if router is None:
        return
    rc = pod_spec(router)["containers"][0]
    flags = parse_flags(rc.get("args", []))
    cfg_path = flags.get("config", "")
    mounts = {m["mountPath"]: m for m in rc.get("volumeMounts", [])}
    vols = {v["name"]: v for v in pod_spec(router).get("volumes", [])}
    fleet = None
    for path, m in mounts.items():
        v = vols.get(m["name"], {})
        if "configMap" in v and cfg_path.startswith(path.rstrip("/") + "/"):
            cm = configmaps.get(v["configMap"]["name"], {})
            text = cm.get("data", {}).get(cfg_path[len(path.rstrip("/")) + 1:])
            fleet = yaml.safe_load(text) if text else None
    if not fleet:
        bad(f"router --config {cfg_path} is not a key of a mounted ConfigMap")
        return
    if port_of(fleet.get("listen"))[1] != port_by_name(rc, "grpc"):
        bad(f"fleet.yaml listen {fleet.get('listen')} is not the router's grpc port")
    if port_of(fleet.get("metrics"))[1] != port_by_name(rc, "metrics"):
        bad(f"fleet.yaml metrics {fleet.get('metrics')} is not the router's metrics port")
    if port_of(fleet.get("health_listen"))[1] != port_by_name(rc, "health"):
        bad(f"fleet.yaml health_listen {fleet.get('health_listen')} is not the router's health port")
    openai = port_by_name(rc, "openai")
    if fleet.get("http_listen") and port_of(fleet.get("http_listen"))[1] != openai:
        bad(f"fleet.yaml http_listen {fleet.get('http_listen')} is not the router's openai port "
            f"({openai})")
    if openai is not None and not fleet.get("http_listen"):
        bad(f"the router has an openai port {openai} but fleet.yaml sets no http_listen")
    if fleet.get("insecure") not in (None, False) or "--insecure" in [str(a) for a in rc.get("args", [])]:
        bad("the router runs insecure (plaintext gRPC)")
    for k in ("tls_cert", "tls_key", "tls_ca", "ticket_key_file"):
        why = secret_file(pod_spec(router), rc, fleet.get(k))
        if why:
            bad(f"fleet.yaml {k} {fleet.get(k)}: {why}")
    # API keys: a file of a mounted Secret (never keys in the ConfigMap); a Secret mounted with
    # subPath would never see an update of the Secret
    keys = str(fleet.get("api_keys", ""))
    if not keys:
        bad("fleet.yaml has no api_keys: the router would serve every session to anyone")
    else:
        kdir = keys.rsplit("/", 1)[0]
        km = mounts.get(kdir)
        if not km or "secret" not in vols.get(km["name"], {}) or km.get("subPath"):
            bad(f"fleet.yaml api_keys {keys}: its directory is no Secret volume mounted whole")
    ledger = str(fleet.get("ledger", ""))
    replicas = int(router["spec"].get("replicas", 1))
    env = {e["name"]: e for e in rc.get("env", [])}
    if ledger.startswith(("postgresql://", "postgres://")):
        bad(f"fleet.yaml ledger: a PostgreSQL URI in a ConfigMap (its password belongs in a Secret: "
            "ledger: env:NAME)")
    elif ledger.startswith("env:"):
        e = env.get(ledger[4:])
        if not e or "secretKeyRef" not in e.get("valueFrom", {}):
            bad(f"fleet.yaml ledger {ledger}: the router has no env {ledger[4:]} from a Secret")
    else:
        path = ledger[7:] if ledger.startswith("sqlite:") else ledger
        ledger_dir = path.rsplit("/", 1)[0]
        if ledger_dir not in mounts or mounts[ledger_dir].get("readOnly"):
            bad(f"fleet.yaml ledger {ledger}: its directory is no writable volume")
        if replicas > 1:
            bad(f"{oid(router)}: {replicas} replicas on a SQLite ledger (one file per pod: sessions "
                "would not be shared); replicas need a PostgreSQL ledger")
    if replicas > 1:
        if router["spec"].get("strategy", {}).get("type") == "Recreate":
            bad(f"{oid(router)}: {replicas} replicas with strategy Recreate (every replica down at once)")
        tl = router["spec"]["template"]["metadata"].get("labels", {})
        if not any(selects(p["spec"].get("selector", {}), tl) for p in by_kind.get("PodDisruptionBudget", [])):
            bad(f"{oid(router)}: {replicas} replicas and no PodDisruptionBudget selects them")
    seen = {}
    models = set()
    for n in fleet.get("nodes", []):
        host, port = port_of(n.get("address"))
        m = re.fullmatch(r"(.+)-(\d+)\.([^.]+)", host or "")
        if not m:
            bad(f"fleet.yaml node {n.get('name')}: address {n.get('address')} is not "
                "<statefulset>-<ordinal>.<service>:<port>")
            continue
        key = (m.group(1), int(m.group(2)))
        pod = kvld_pods.get(key)
        if not pod:
            bad(f"fleet.yaml node {n.get('name')}: no pod {key[0]}-{key[1]} in the StatefulSets")
            continue
        if m.group(3) != pod[0] or port != pod[1]:
            bad(f"fleet.yaml node {n.get('name')}: {n.get('address')} is not service {pod[0]} "
                f"port {pod[1]}")
        if n.get("model") != pod[2]:
            bad(f"fleet.yaml node {n.get('name')}: model {n.get('model')} but the pod runs {pod[2]}")
        if key in seen:
            bad(f"fleet.yaml lists pod {key[0]}-{key[1]} twice")
        # spans move only between members of each side's --peers (ExportSpan and a ContinueTurn
        # pull refuse any other node): every other kvld must list this one
        for (sts, i) in kvld_pods:
            if (sts, i) != key and n.get("address") not in kvld_peers.get(sts, set()):
                bad(f"{sts}-{i}: --peers lacks {n.get('address')} (fleet.yaml node {n.get('name')}): "
                    "spans to and from it would be refused")
        seen[key] = n
        models.add(n.get("model"))
    for key in kvld_pods:
        if key not in seen:
            bad(f"pod {key[0]}-{key[1]} runs but fleet.yaml does not list it (scaled without "
                "updating fleet.yaml?)")
    names = [n.get("name") for n in fleet.get("nodes", [])]
    if len(names) != len(set(names)):
        bad("fleet.yaml: two nodes share a name")
    pol = fleet.get("policy", {}) or {}
    for mname in pol.get("models", []) or []:
        if mname not in models:
            bad(f"fleet.yaml policy names model {mname}, which no node serves")
    check_network_policies(by_kind, workloads)


def policy_admits(policy, port, from_labels):
    """Whether NetworkPolicy `policy` admits TCP `port` from a pod with labels `from_labels` in
    the same namespace (None: from any source, e.g. another namespace's pod without labels)."""
    for rule in policy["spec"].get("ingress", []) or []:
        ports = rule.get("ports")
        if ports and not any(p.get("port") in (None, port) for p in ports):
            continue
        froms = rule.get("from")
        if not froms:
            return True
        if from_labels is None:
            continue
        for f in froms:
            if "podSelector" in f and "namespaceSelector" not in f and \
                    selects(f["podSelector"], from_labels):
                return True
    return False


SCRAPER = {"kvlingo.dev/metrics-scraper": "true"}   # the label deploy/README.md asks Prometheus' pods for


def check_network_policies(by_kind, workloads):
    """Every pod is under a default-deny ingress policy; kvld's gRPC port admits the router and
    other nodes but nobody else; the router's client ports admit any client."""
    pols = by_kind.get("NetworkPolicy", [])
    if not any(p["spec"].get("podSelector", {}) in ({}, None) or
               p["spec"]["podSelector"].get("matchLabels", {}).keys() <= {"app.kubernetes.io/part-of"}
               for p in pols if "Ingress" in p["spec"].get("policyTypes", []) and
               not p["spec"].get("ingress")):
        bad("no default-deny ingress NetworkPolicy")
    router_labels = kvld_labels = None
    for w in workloads:
        tl = w["spec"]["template"]["metadata"].get("labels", {})
        if w["kind"] == "Deployment":
            router_labels = tl
        else:
            kvld_labels = kvld_labels or tl
    for w in workloads:
        tl = w["spec"]["template"]["metadata"].get("labels", {})
        mine = [p for p in pols if selects(p["spec"].get("podSelector", {}), tl)]
        c = pod_spec(w)["containers"][0]
        grpc = port_by_name(c, "grpc")
        if not mine:
            bad(f"{oid(w)}: no NetworkPolicy selects its pods")
            continue
        admits = lambda labels: any(policy_admits(p, grpc, labels) for p in mine)
        # a scraper labelled as deploy/README.md says (and nothing else) reaches /metrics
        metrics = port_by_name(c, "metrics")
        if not any(policy_admits(p, metrics, SCRAPER) for p in mine):
            bad(f"{oid(w)}: its metrics port {metrics} does not admit a pod labelled only "
                "kvlingo.dev/metrics-scraper: \"true\" (commonLabels adds part-of to a matchLabels "
                "selector)")
        if w["kind"] == "StatefulSet":
            if any(policy_admits(p, grpc, None) for p in mine):
                bad(f"{oid(w)}: its gRPC port {grpc} admits any source (should be router + nodes)")
            if router_labels and not admits(router_labels):
                bad(f"{oid(w)}: its gRPC port {grpc} does not admit the router")
            if kvld_labels and not admits(kvld_labels):
                bad(f"{oid(w)}: its gRPC port {grpc} does not admit the other nodes")
            if admits({"app": "stranger"}):
                bad(f"{oid(w)}: its gRPC port {grpc} admits an unlabelled pod")
        else:
            for pname in ("grpc", "openai"):
                port = port_by_name(c, pname)
                if port is not None and not any(policy_admits(p, port, None) for p in mine):
                    bad(f"{oid(w)}: the router's client port {port} ({pname}) is closed to clients")


def normalise(objs):
    """Objects keyed by kind/name with what legitimately differs between kustomize versions
    taken out: the generated ConfigMap's hash suffix, the order of env lists, empty maps."""
    out = {}
    text = yaml.safe_dump_all(objs)
    text = re.sub(r"(kvlingo-fleet)-[a-z0-9]{10}", r"\1-HASH", text)

    def clean(x):
        if isinstance(x, dict):
            x = {k: clean(v) for k, v in x.items() if v != {}}
            if isinstance(x.get("env"), list):
                x["env"] = sorted(x["env"], key=lambda e: e.get("name", ""))
            return x
        if isinstance(x, list):
            return [clean(v) for v in x]
        return x

    for o in yaml.safe_load_all(text):
        if o:
            out[oid(o)] = clean(copy.deepcopy(o))
    return out


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--overlay":
        check_overlay(sys.argv[2], load(sys.argv[3]))
        label = f"overlay {sys.argv[2]}"
    elif len(sys.argv) == 4 and sys.argv[1] == "--same":
        a, b = normalise(load(sys.argv[2])), normalise(load(sys.argv[3]))
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                bad(f"{k} differs" if k in a and k in b else f"{k} only in one rendering")
        label = "same objects"
    else:
        print(__doc__)
        return 2
    for p in problems:
        print(f"  problem: {p}")
    print(f"{'ok' if not problems else 'FAIL'}: {label}: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
