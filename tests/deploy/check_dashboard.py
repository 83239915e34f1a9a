#!/usr/bin/env python3
"""tests/deploy/check_dashboard.py SOURCE_DIR [PROMTOOL]

Static checks of deploy/grafana/kvlingo.json and deploy/prometheus/:
  - the dashboard is well-formed: unique panel ids, panels inside the 24-column grid and not
    overlapping, every query panel on the ${datasource} variable with a non-empty expr;
  - it has the panels the fleet needs (sessions, turns/s, switches by pair and mode, switch TTFT
    percentiles translate vs re-prefill, fallbacks by reason, span bytes, transfer bandwidth,
    decode tokens/s per node, KV memory per node);
  - no query sums a gauge that every router replica reports about the whole fleet
    (sessions_open, nodes_healthy, pairs_disabled);
  - every kvlingo_* metric a dashboard query or an alert rule uses appears in the exporters' source
    (daemon/*.c, router/*.c) -- tests/deploy/test_dashboard_metrics.sh
    checks the same names against running binaries;
  - with PROMTOOL: every dashboard query parses as PromQL (as a recording rule, with the
    Grafana variables substituted), the alert rules pass `promtool check rules`, and
    tests/deploy/rules_test.yml passes `promtool test rules`.
Prints the metric names used.  Exit 0 / 1.
"""
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

problems = []
METRIC = re.compile(r"\bkvlingo_[a-zA-Z0-9_]+")
SUFFIXES = ("_bucket", "_sum", "_count")
FLEET_GAUGES = ("kvlingo_router_sessions_open", "kvlingo_router_nodes_healthy",
                "kvlingo_router_pairs_disabled")


def bad(msg):
    problems.append(msg)


def queries(dash):
    """(panel title, expr) of every panel target and templating query."""
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                out.append((p.get("title", "?"), t.get("expr", "")))
            walk(p.get("panels", []))

    walk(dash.get("panels", []))
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        if isinstance(q, dict):
            q = q.get("query", "")
        if v.get("type") == "query":
            out.append((f"variable {v.get('name')}", q or ""))
    return out


def base_name(m):
    for s in SUFFIXES:
        if m.endswith(s):
            return m[: -len(s)]
    return m


def to_promql(expr):
    """A Grafana query as plain PromQL: variables replaced by values Prometheus accepts."""
    e = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m")
    e = re.sub(r"\$\{?[a-zA-Z_]+\}?", ".*", e)
    return e


def main():
    src = sys.argv[1]
    promtool = sys.argv[2] if len(sys.argv) > 2 else ""
    dpath = os.path.join(src, "deploy", "grafana", "kvlingo.json")
    try:
        dash = json.load(open(dpath))
    except (OSError, ValueError) as e:
        print(f"FAIL: {dpath}: {e}")
        return 1

    # ---- structure
    if not dash.get("uid") or not dash.get("title"):
        bad("dashboard has no uid or title")
    names = [v.get("name") for v in dash.get("templating", {}).get("list", [])]
    if "datasource" not in names:
        bad("no ${datasource} variable")
    ids, cells = set(), {}
    for p in dash.get("panels", []):
        if p.get("id") in ids:
            bad(f"panel id {p.get('id')} used twice")
        ids.add(p.get("id"))
        g = p.get("gridPos", {})
        if g.get("x", 0) + g.get("w", 0) > 24:
            bad(f"panel {p.get('title')!r} runs past the 24-column grid")
        for yy in range(g.get("y", 0), g.get("y", 0) + g.get("h", 0)):
            for xx in range(g.get("x", 0), g.get("x", 0) + g.get("w", 0)):
                if (xx, yy) in cells:
                    bad(f"panels {cells[(xx, yy)]!r} and {p.get('title')!r} overlap")
                    break
                cells[(xx, yy)] = p.get("title")
            else:
                continue
            break
        if p.get("type") == "row":
            continue
        if p.get("datasource", {}).get("uid") != "${datasource}":
            bad(f"panel {p.get('title')!r} does not use the ${{datasource}} variable")
        if not p.get("targets") or not all(t.get("expr", "").strip() for t in p["targets"]):
            bad(f"panel {p.get('title')!r} has no query or an empty one")

    qs = queries(dash)
    exprs = [e for _, e in qs]

    # ---- coverage: what the fleet dashboard must show
    required = [
        ("sessions", r"kvlingo_sessions\b|kvlingo_router_sessions_open"),
        ("turns/s", r"rate\(kvlingo_router_turns_total"),
        ("switches by pair and mode", r"by \(source, target, mode\) \(rate\(kvlingo_router_switches_total"),
        ("switch TTFT percentiles by mode", r"histogram_quantile\(0\.\d+, sum by \(le, mode\) \(rate\(kvlingo_router_switch_ttft_seconds_bucket"),
        ("re-prefill vs translate TTFT", r'switch_ttft_seconds_bucket\{mode="reprefill"\}.*switch_ttft_seconds_bucket\{mode="translate"\}'),
        ("fallback rate by reason", r"by \(reason\) \(rate\(kvlingo_router_fallbacks_total"),
        ("span bytes", r"rate\(kvlingo_span_bytes_(sent|received)_total"),
        ("transfer bandwidth", r"kvlingo_span_bytes_\w+_total.*/.*kvlingo_span_transfer_seconds_sum"),
        ("decode tokens/s per node", r"by \(instance\) \(rate\(kvlingo_tokens_decoded_total"),
        ("KV memory per node", r"by \(instance\) \(kvlingo_cache_bytes"),
    ]
    for what, rx in required:
        if not any(re.search(rx, e, re.S) for e in exprs):
            bad(f"no panel shows {what} (a query matching /{rx}/)")

    # ---- gauges every router replica reports about the whole fleet (the shared ledger, the
    # nodes each replica probes, its guardrail's pairs): summed over replicas they count twice
    # with the overlays' two replicas
    for title, e in qs:
        for m in FLEET_GAUGES:
            if re.search(r"\bsum\s*(by\s*\([^)]*\)\s*)?\(\s*" + m + r"\b", e):
                bad(f"panel {title!r}: sum({m}) counts it once per router replica (use max)")

    # ---- metric names against the exporters' source
    rules_path = os.path.join(src, "deploy", "prometheus", "kvlingo-rules.yml")
    rules_text = open(rules_path).read() if os.path.exists(rules_path) else ""
    used = sorted({m for e in exprs for m in METRIC.findall(e)} | set(METRIC.findall(rules_text)))
    source = ""
    for d in ("daemon", "router"):
        for f in glob.glob(os.path.join(src, d, "*.c")):
            source += open(f, errors="replace").read()
    exported = set(METRIC.findall(source))
    for m in used:
        if base_name(m) not in exported and m not in exported:
            bad(f"metric {m} is used by the dashboard or the alert rules but no string in "
                f"daemon/*.c or router/*.c names it")
    print(f"metrics used ({len(used)}): {' '.join(used)}")

    # ---- PromQL syntax and alert rules, with promtool
    if promtool:
        with tempfile.TemporaryDirectory() as tmp:
            rf = os.path.join(tmp, "dashboard-rules.yml")
            with open(rf, "w") as f:
                f.write("groups:\n  - name: dashboard\n    rules:\n")
                for i, (title, e) in enumerate(qs):
                    if e.startswith("label_values("):
                        m = re.match(r"label_values\((\w+),\s*(\w+)\)", e)
                        if not m:
                            bad(f"{title}: cannot read {e}")
                            continue
                        e = f"count by ({m.group(2)}) ({m.group(1)})"
                    f.write(f"      - record: dashboard:q{i}\n        expr: {json.dumps(to_promql(e))}\n")
            r = subprocess.run([promtool, "check", "rules", rf], capture_output=True, text=True)
            if r.returncode:
                bad("dashboard queries are not valid PromQL:\n    " +
                    (r.stdout + r.stderr).strip().replace("\n", "\n    "))
            else:
                print(f"ok: {len(qs)} dashboard queries parse as PromQL (promtool)")
        for args in (["check", "rules", rules_path],
                     ["test", "rules", os.path.join(src, "tests", "deploy", "rules_test.yml")]):
            r = subprocess.run([promtool] + args, capture_output=True, text=True)
            if r.returncode:
                bad(f"promtool {' '.join(args[:2])} {os.path.relpath(args[2], src)}:\n    " +
                    (r.stdout + r.stderr).strip().replace("\n", "\n    "))
            else:
                print(f"ok: promtool {' '.join(args[:2])} {os.path.relpath(args[2], src)}")
    else:
        print("note: promtool not installed (Debian package prometheus): PromQL syntax and alert "
              "rule tests skipped")

    for p in problems:
        print(f"  problem: {p}")
    print(f"{'ok' if not problems else 'FAIL'}: dashboard and rules: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
