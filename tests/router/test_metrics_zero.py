#!/usr/bin/env python3
"""tests/router/test_metrics_zero.py: every metric is exported from the start.

Before any turn, the router's /metrics has each labelled family at zero for the label sets known
from the fleet (turns by model and mode, switches and failovers by pair, fallbacks by reason,
errors by code, the histograms) and the process_* series; kvld's /metrics has its counters,
rejections by reason and process_*.  ListNodes says the rates are unmeasured until a turn
measured them, then reports the measured moving averages.
usage: test_metrics_zero.py --build BUILD_DIR --work WORK_DIR
"""
import argparse
import os
import re
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rtest  # noqa: E402
from rtest import check  # noqa: E402


def value(text, series):
    m = re.search(r"^" + re.escape(series) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def check_process(text, who):
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds",
                 "process_start_time_seconds"):
        v = value(text, name)
        check(v is not None and v > 0, "%s: %s missing or not positive (%s)" % (who, name, v))
        check("# TYPE %s " % name in text, "%s: %s has no TYPE line" % (who, name))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    fleet = rtest.Fleet(a.build, os.path.join(a.work, "fleet"),
                        policy={"name": "cascade", "models": ["qwen3-a", "qwen3-b"]})
    kport, mport = rtest.free_port(), rtest.free_port()
    node = rtest.Proc([os.path.join(a.build, "daemon", "kvld"), "--model",
                       os.path.join(rtest.SRC, "models", "qwen3-a"), "--listen", "127.0.0.1:%d" % kport,
                       "--metrics", "127.0.0.1:%d" % mport, "--transport", "none", "--insecure"],
                      os.path.join(a.work, "kvld-metrics.log"))
    try:
        rtest.wait_port(mport, node.proc, what="kvld --metrics")
        m = fleet.metrics()
        zero = [
            'kvlingo_router_turns_total{model="qwen3-a",mode="none"}',
            'kvlingo_router_turns_total{model="qwen3-b",mode="translate"}',
            'kvlingo_router_switches_total{source="qwen3-a",target="qwen3-b",mode="translate"}',
            'kvlingo_router_switches_total{source="qwen3-b",target="qwen3-a",mode="reprefill"}',
            'kvlingo_router_model_failovers_total{from="qwen3-a",to="qwen3-b",mode="reprefill"}',
            'kvlingo_router_fallbacks_total{reason="source_unavailable"}',
            'kvlingo_router_fallbacks_total{reason="export_deadline"}',
            'kvlingo_router_errors_total{code="UNAVAILABLE"}',
            'kvlingo_router_errors_total{code="INVALID_ARGUMENT"}',
            'kvlingo_router_shadow_dropped_total',
            'kvlingo_router_turn_ttft_seconds_count',
            'kvlingo_router_switch_ttft_seconds_count{mode="translate"}',
            'kvlingo_router_ledger_write_seconds_count',
            'kvlingo_router_shadow_kl_nats_count{source="qwen3-a",target="qwen3-b"}',
        ]
        for s in zero:
            check(value(m, s) == 0, "router: %s is %s before any event, not 0" % (s, value(m, s)))
        check_process(m, "router")
        km = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % mport, timeout=5).read().decode()
        for s in ("kvlingo_sessions_opened_total", "kvlingo_tokens_decoded_total",
                  'kvlingo_spans_rejected_total{reason="checksum"}', "kvlingo_forward_seconds_count"):
            v = value(km, s)
            if v is None and "reason" in s:   # the reason names come from the span codec
                v = 0 if re.search(r'^kvlingo_spans_rejected_total\{reason="[a-z_]+"\} 0$', km, re.M) else None
            check(v == 0, "kvld: %s is %s before any event, not 0" % (s, v))
        check_process(km, "kvld")
        c = fleet.client()
        ln = c.list_nodes()
        for n in ln.nodes:
            check(n.rate_status == "unmeasured" and n.prefill_tokens_per_second == 0
                  and n.decode_tokens_per_second == 0 and n.prefill_rate_samples == 0,
                  "ListNodes before any turn: %s" % n)
        sid = c.create_session()
        c.send_all(sid, rtest.corpus_text(0, 600), max_tokens=8)
        ln = c.list_nodes()
        served = [n for n in ln.nodes if n.decode_rate_samples > 0]
        check(len(served) == 1 and served[0].decode_tokens_per_second > 0 and
              served[0].prefill_rate_samples == 1 and served[0].prefill_tokens_per_second > 0 and
              served[0].rate_status == "measured", "ListNodes after one turn: %s" % ln)
        check(all(n.rate_status == "unmeasured" for n in ln.nodes if n not in served),
              "a node without turns must stay unmeasured: %s" % ln)
        m = fleet.metrics()
        check(value(m, "kvlingo_router_turn_ttft_seconds_count") == 1, "one turn counted")
        print("ok: metrics at zero before any event (router and kvld), process_* present, "
              "rates unmeasured until measured")
    finally:
        node.stop()
        fleet.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
