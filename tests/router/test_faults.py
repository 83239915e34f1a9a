#!/usr/bin/env python3
"""router/tests/test_faults.py: failures, with real processes on loopback.

  1. kill -9 of the source node while the router is moving the context off it: the turn
     completes by re-prefill on the target from the router's ledger, the reason is in the
     summary, the log and kvlingo_router_fallbacks_total; the output equals a plain re-prefill;
  2. router kill -9 (also in the middle of a turn) and restart on the same ledger: the session
     continues (a node holding tokens the ledger never committed is reset, not trusted);
  3. configuration errors: an unknown policy -> exit 1 naming file, line and key; a node that
     does not answer -> the router starts, says so, a Send asking for its model is answered by
     the live model (failover, named in the summary), and the node serves once it is up;
  4. the quality guardrail: with a KL budget no translation meets, the pair is disabled after
     its first shadow sample; the next switch re-prefills with reason pair_disabled, visible in
     ListNodes, the metrics and the log; after retry_seconds the pair is on probation (its
     next switch translates and is shadowed), fails it and is disabled for twice as long; and
     a client's compare_reprefill, with the guardrail's own sampling off, reports its KL to the
     client but never disables the pair (a tenant cannot switch translation off for everyone);
  5. TTL: an idle session expires, its nodes drop it, a later Send says it expired;
  6. model failover with a node killed, in every policy: with the only qwen3-a node killed, old
     and new sessions are answered on qwen3-b (re-prefill from the ledger), the summary names
     the failover, the log and kvlingo_router_model_failovers_total record it; with every node
     dead, Send answers UNAVAILABLE;
  7. a node stopped (SIGTERM) in the middle of a long stream cancels it when its grace runs
     out: the node failing, not the client cancelling, so Send answers UNAVAILABLE and the
     ledger does not keep the turn's input as a cancelled turn; `kvlingo chat` whose node is
     killed mid-reply says the turn ended after N tokens and was not recorded (not a TLS hint);
     a node restarted with another ticket key: the router says so at its first Info;
  8. CloseSession sent to another replica while a turn of the session runs: refused as busy
     (the lease), the turn completes and commits, the session continues;
  9. a turn ended by a stop sequence (OpenAI `stop`) whose node went further than the ledger:
     the node's copy is dropped with its holding, so closing the session leaves nothing behind.
usage: test_faults.py --build BUILD_DIR --work WORK_DIR [--only NAME,...]
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rtest  # noqa: E402
from rtest import check  # noqa: E402


def kill_source_during_switch(a):
    work = os.path.join(a.work, "kill_source")
    fleet = rtest.Fleet(a.build, work,
                        policy={"name": "pinned", "default_model": "qwen3-a"},
                        guardrail={"shadow_fraction": 0},
                        transfer={"base_timeout_ms": 3000, "node_timeout_ms": 3000})
    try:
        c = fleet.client()
        sid = c.create_session()
        c.send_all(sid, rtest.corpus_text(0, 2000), max_tokens=4)
        src = fleet.nodes["qwen3-a"]
        # freeze the source so the router's call to it is in flight, then kill it
        rtest.freeze(src.proc)
        result = {}

        def turn():
            try:
                result["r"] = c.send_all(sid, " And then", max_tokens=8, model="qwen3-b")
            except Exception as e:  # noqa: BLE001
                result["e"] = e
        th = threading.Thread(target=turn)
        t0 = time.time()
        th.start()
        time.sleep(0.4)
        src.kill9()
        th.join(60)
        check("r" in result, "turn failed: %s" % result.get("e"))
        ids, out, s = result["r"]
        print("  turn after kill -9 of the source: %s %s, fallback %r, %.0f ms" % (
            s.model, rtest.MODES[s.switch_mode], s.fallback_reason, (time.time() - t0) * 1e3))
        check(s.model == "qwen3-b" and rtest.MODES[s.switch_mode] == "re-prefill",
              "expected re-prefill on qwen3-b, got %s %s" % (s.model, s.switch_mode))
        check(s.fallback_reason.startswith(("source_unavailable", "export_failed", "export_deadline")),
              "fallback reason %r" % s.fallback_reason)
        check(s.n_generated == 8, "tokens lost")
        m = fleet.metrics()
        check('kvlingo_router_fallbacks_total{reason="' in m, "fallback metric missing")
        log = open(os.path.join(work, "router.log")).read()
        check("fallback=\"" + s.fallback_reason[:20] in log, "reason not in the log")
        # the same context re-prefilled natively gives the same tokens
        g = c.get_session(sid, include_tokens=True)
        ctx = list(g.tokens)[:g.context_tokens - 8]
        sid2 = c.create_session()
        ids2, _, s2 = c.send_all(sid2, tokens=ctx, max_tokens=8, model="qwen3-b")
        check(ids2 == ids, "re-prefill output differs: %s vs %s" % (ids, ids2))
        # the next turn stays on b; the dead node is reported
        ids3, _, s3 = c.send_all(sid, " More", max_tokens=4, model="qwen3-b")
        check(rtest.MODES[s3.switch_mode] == "none", "next turn: %s" % s3.switch_mode)
        nodes = {n.name: n for n in c.list_nodes().nodes}
        check(not nodes["a0"].healthy, "a0 should be unhealthy")
        print("  ok: kill -9 of the source during a switch: re-prefill, nothing lost")
    finally:
        fleet.stop()


def kill_source_mid_export(a):
    """The source (qwen3-b, 3000-token context: a 18 MB span whose export lasts tens of ms) is
    killed at the middle of the export as timed on a calibration switch."""
    work = os.path.join(a.work, "kill_mid_export")
    fleet = rtest.Fleet(a.build, work, policy={"name": "pinned", "default_model": "qwen3-b"},
                        guardrail={"shadow_fraction": 0})
    try:
        c = fleet.client()
        prompt = rtest.corpus_text(0, 14000)
        cal = c.create_session()
        c.send_all(cal, prompt, max_tokens=1)
        _, _, sc = c.send_all(cal, " Then", max_tokens=1, model="qwen3-a")
        check(sc.switch_mode == 1, "calibration switch translates")
        # the export starts after the router's checks, roughly ttft - switch - prefill; aim at
        # the middle of the export
        delay = max(0.0, sc.ttft_seconds - sc.switch_seconds - 0.004) + sc.switch_seconds / 2
        sid = c.create_session()
        c.send_all(sid, prompt, max_tokens=1)
        result = {}

        def turn():
            try:
                result["r"] = c.send_all(sid, " Then", max_tokens=6, model="qwen3-a")
            except Exception as e:  # noqa: BLE001
                result["e"] = e
        th = threading.Thread(target=turn)
        th.start()
        time.sleep(delay)
        fleet.nodes["qwen3-b"].kill9()
        th.join(60)
        check("r" in result, "turn failed: %s" % result.get("e"))
        ids, _, s = result["r"]
        print("  kill -9 of the source %.1f ms into a %.1f ms switch: %s, %s" % (
            delay * 1e3, sc.ttft_seconds * 1e3, rtest.MODES[s.switch_mode], s.fallback_reason or "-"))
        check(s.n_generated == 6 and s.model == "qwen3-a", "turn completed on the target")
        if s.switch_mode == 2:
            sid2 = c.create_session()
            g = c.get_session(sid, include_tokens=True)
            ids2, _, _ = c.send_all(sid2, tokens=list(g.tokens)[:g.context_tokens - 6], max_tokens=6,
                                    model="qwen3-a")
            check(ids2 == ids, "re-prefill output differs from a native run")
        print("  ok: the turn completed (%s)" % ("re-prefill after the kill" if s.switch_mode == 2
                                                 else "the target had imported the span; kept"))
    finally:
        fleet.stop()


def kill_source_sweep(a):
    """The source killed at several points of a 3.8k-token switch (before, during and after the
    span's transfer): every turn completes in seconds, by re-prefill or on the imported span.  A
    receive that had matched the span when its sender died used to wait forever.  A sanitizer
    build (every fleet's prefill there takes tens of seconds) runs one point of the sweep."""
    with open(os.path.join(a.build, "kvlingo-router"), "rb") as f:
        sanitized = b"AddressSanitizer" in f.read()
    delays = (8,) if sanitized else (4, 8, 12, 16)
    for delay_ms in delays:
        work = os.path.join(a.work, "kill_sweep_%d" % delay_ms)
        fleet = rtest.Fleet(a.build, work, policy={"name": "pinned", "default_model": "qwen3-b"},
                            guardrail={"shadow_fraction": 0})
        try:
            c = fleet.client()
            sid = c.create_session()
            c.send_all(sid, rtest.corpus_text(0, 14000), max_tokens=1)
            result = {}

            def turn():
                t0 = time.time()
                try:
                    result["r"] = c.send_all(sid, " Then", max_tokens=6, model="qwen3-a")
                except Exception as e:  # noqa: BLE001
                    result["e"] = e
                result["s"] = time.time() - t0
            th = threading.Thread(target=turn)
            th.start()
            time.sleep(delay_ms / 1000.0)
            fleet.nodes["qwen3-b"].kill9()
            th.join(30)
            check("s" in result, "kill -9 of the source %d ms into the switch: the turn hung" % delay_ms)
            check("r" in result, "turn failed: %s" % result.get("e"))
            _, _, st = result["r"]
            check(st.n_generated == 6 and st.model == "qwen3-a", "turn completed on the target")
            print("  kill -9 of the source %d ms into the switch: %s in %.2f s%s" % (
                delay_ms, rtest.MODES[st.switch_mode], result["s"],
                ", " + st.fallback_reason if st.fallback_reason else ""))
        finally:
            fleet.stop()
    print("  ok: the source killed at %s ms into a switch: every turn completed" %
          "/".join(str(d) for d in delays))


def router_restart(a):
    work = os.path.join(a.work, "restart")
    fleet = rtest.Fleet(a.build, work, policy={"name": "pinned", "default_model": "qwen3-a"},
                        guardrail={"shadow_fraction": 0})
    try:
        c = fleet.client()
        sid = c.create_session()
        _, _, s1 = c.send_all(sid, rtest.corpus_text(0, 300), max_tokens=6)
        _, _, s2 = c.send_all(sid, " Next", max_tokens=6, model="qwen3-b")
        fleet.router.kill9()
        fleet.procs.remove(fleet.router)
        fleet.start_router()
        c = fleet.client()
        g = c.get_session(sid)
        check(g.open and g.context_tokens == s2.context_tokens and g.n_turns == 2,
              "after restart: %s" % g)
        ids, _, s3 = c.send_all(sid, " Again", max_tokens=6, model="qwen3-b")
        check(rtest.MODES[s3.switch_mode] == "none" and s3.model == "qwen3-b",
              "continued on b without a switch: %s %s" % (s3.model, s3.switch_mode))
        check(s3.context_tokens > s2.context_tokens, "context grew")
        print("  ok: router kill -9 + restart: session continues (%d tokens)" % s3.context_tokens)
        # kill -9 in the middle of a long turn: the node holds uncommitted tokens
        result = {}
        first = threading.Event()

        def turn():
            # killed after its first token (not after a fixed delay: a quiet machine finishes a
            # few hundred tokens in well under a second)
            try:
                for _, summary in c.send(sid, " Long", max_tokens=1000, model="qwen3-b"):
                    first.set()
                result["r"] = summary
            except Exception as e:  # noqa: BLE001
                result["e"] = e
            first.set()
        th = threading.Thread(target=turn)
        th.start()
        check(first.wait(30), "the long turn produced no token")
        fleet.router.kill9()
        fleet.procs.remove(fleet.router)
        th.join(30)
        fleet.start_router()
        c = fleet.client()
        g = c.get_session(sid)
        check(g.context_tokens == s3.context_tokens, "uncommitted turn must not be in the ledger")
        ids, _, s4 = c.send_all(sid, " After", max_tokens=6, model="qwen3-b")
        check(s4.context_tokens == s3.context_tokens + s4.user_tokens + 6, "ledger length")
        print("  ok: kill -9 mid-turn + restart: next turn %s (%s), ledger consistent" % (
            rtest.MODES[s4.switch_mode], s4.fallback_reason or "node reset"))
    finally:
        fleet.stop()


def config_errors(a):
    work = os.path.join(a.work, "config")
    os.makedirs(work, exist_ok=True)
    router = os.path.join(a.build, "kvlingo-router")
    bad = os.path.join(work, "bad.yaml")
    with open(bad, "w") as f:
        f.write("listen: 127.0.0.1:%d\ntokenizer: %s\nnodes:\n  - {name: a0, address: 127.0.0.1:1, model: qwen3-a}\n"
                "policy:\n  name: fastest\n" % (rtest.free_port(), os.path.join(rtest.SRC, "models", "qwen3-a")))
    r = subprocess.run([router, "--config", bad], capture_output=True, text=True, timeout=30)
    check(r.returncode == 1 and "bad.yaml:6" in r.stderr and "policy.name" in r.stderr
          and "fastest" in r.stderr, "unknown policy: rc %d %r" % (r.returncode, r.stderr))
    print("  ok: unknown policy -> %s" % r.stderr.strip())
    # a node that does not answer
    fleet = rtest.Fleet(a.build, work, models=("qwen3-a",), policy={"name": "pinned"},
                        translators=False)
    try:
        dead_port = rtest.free_port()
        fleet.node_ports["qwen3-b"] = dead_port
        fleet.write_config({"name": "pinned"})
        fleet.router.stop()
        fleet.procs.remove(fleet.router)
        fleet.start_router()
        time.sleep(0.3)
        c = fleet.client(timeout=30)
        sid = c.create_session()
        import grpc
        ids, _, s = c.send_all(sid, "Hello", max_tokens=3, model="qwen3-b")
        check(s.model == "qwen3-a" and s.failover_from == "qwen3-b" and "failover" in s.policy_reason
              and "qwen3-b" in s.policy_reason, "dead model -> failover: %s" % s)
        print("  ok: node that does not answer -> failover: %s" % s.policy_reason)
        ids, _, s = c.send_all(sid, "Hello", max_tokens=3, model="qwen3-a")
        check(s.n_generated == 3, "router serves the live node")
        log = open(os.path.join(work, "router.log")).read()
        check("does not answer" in log and str(dead_port) in log, "log names the dead node")
        fleet.start_node("qwen3-b")
        t0 = time.time()   # the router re-probes unhealthy nodes every 2 s
        while time.time() - t0 < 15 and not all(n.healthy for n in c.list_nodes().nodes):
            time.sleep(0.2)
        ids, _, s = c.send_all(sid, " again", max_tokens=3, model="qwen3-b")
        check(s.model == "qwen3-b" and rtest.MODES[s.switch_mode] == "re-prefill",
              "after the node came up: %s %s" % (s.model, s.switch_mode))
        print("  ok: the node came up later and serves (%s, no translator here)" % s.fallback_reason)
    finally:
        fleet.stop()


def guardrail_disables_pair(a):
    work = os.path.join(a.work, "guardrail")
    fleet = rtest.Fleet(a.build, work, policy={"name": "pinned", "default_model": "qwen3-a"},
                        guardrail={"shadow_fraction": 1.0, "kl_budget": 1e-9, "min_samples": 1,
                                   "retry_seconds": 2})
    try:
        c = fleet.client()
        sid = c.create_session()
        c.send_all(sid, rtest.corpus_text(0, 300), max_tokens=4)
        _, _, s1 = c.send_all(sid, " Next", max_tokens=4, model="qwen3-b")
        check(s1.switch_mode == 1, "first switch translates")
        t0 = time.time()
        pair = None
        while time.time() - t0 < 20:
            pair = {(p.source_model, p.target_model): p for p in c.list_nodes().pairs}[("qwen3-a", "qwen3-b")]
            if not pair.enabled:
                break
            time.sleep(0.1)
        check(pair is not None and not pair.enabled and pair.disabled_reason == "kl_budget",
              "pair a->b should be disabled: %s" % pair)
        _, _, s2 = c.send_all(sid, " And", max_tokens=4, model="qwen3-a")   # b -> a still translates
        check(s2.switch_mode == 1, "b->a unaffected")
        _, _, s3 = c.send_all(sid, " More", max_tokens=4, model="qwen3-b")
        check(s3.switch_mode == 2 and s3.fallback_reason.startswith("pair_disabled"),
              "a->b after disabling: %d %r" % (s3.switch_mode, s3.fallback_reason))
        m = fleet.metrics()
        check(re.search(r"kvlingo_router_pairs_disabled [12]\n", m) and 'reason="pair_disabled"' in m,
              "metrics")
        check(s3.span_tokens == s3.context_tokens - s3.n_generated,
              "the translated prefix must be re-read natively: span %d" % s3.span_tokens)
        check("DISABLED" in open(os.path.join(work, "router.log")).read(), "log")
        print("  ok: guardrail disabled qwen3-a->qwen3-b (moving KL %.4f > budget); re-prefill since" % pair.moving_kl)

        # probation: after retry_seconds the pair translates again, every switch shadowed; this
        # budget fails it, and the next cooldown is twice as long
        c.send_all(sid, " Back", max_tokens=4, model="qwen3-a")   # the session on qwen3-a again
        time.sleep(2.3)
        _, _, s4 = c.send_all(sid, " Trial", max_tokens=4, model="qwen3-b")
        check(s4.switch_mode == 1, "a->b after retry_seconds translates on probation: %d %r" % (
            s4.switch_mode, s4.fallback_reason))
        log = os.path.join(work, "router.log")
        t0 = time.time()
        while time.time() - t0 < 20 and "on probation again in 4 s" not in open(log).read():
            time.sleep(0.1)
        text = open(log).read()
        check("qwen3-a->qwen3-b on probation" in text and "on probation again in 4 s" in text,
              "probation and its failure logged")
        pair = {(p.source_model, p.target_model): p for p in c.list_nodes().pairs}[("qwen3-a", "qwen3-b")]
        check(not pair.enabled and pair.disabled_reason == "kl_budget", "disabled again: %s" % pair)
        c.send_all(sid, " Back", max_tokens=4, model="qwen3-a")
        _, _, s5 = c.send_all(sid, " Again", max_tokens=4, model="qwen3-b")
        check(s5.switch_mode == 2 and s5.fallback_reason.startswith("pair_disabled"),
              "within the doubled cooldown: %d %r" % (s5.switch_mode, s5.fallback_reason))
        print("  ok: after retry_seconds the pair translated on probation, was shadowed, failed and is "
              "disabled for 4 s")
    finally:
        fleet.stop()

    # a client's compare_reprefill never feeds the guardrail unless its own sampling picked the
    # switch: with shadow_fraction 0 and a budget no translation meets, comparisons leave the
    # pair on, while each reports its KL to the client
    work = os.path.join(a.work, "guardrail_compare")
    fleet = rtest.Fleet(a.build, work, policy={"name": "pinned", "default_model": "qwen3-a"},
                        guardrail={"shadow_fraction": 0.0, "kl_budget": 1e-9, "min_samples": 1})
    try:
        c = fleet.client()
        sid = c.create_session()
        c.send_all(sid, rtest.corpus_text(300, 200), max_tokens=4)
        kls = []
        for i in range(3):
            _, _, s = c.send_all(sid, " Compare %d" % i, max_tokens=2, model="qwen3-b", compare_reprefill=True)
            check(s.switch_mode == 1 and s.shadow_kl > 1e-9, "compared switch %d: mode %d KL %r" % (
                i, s.switch_mode, s.shadow_kl))
            kls.append(s.shadow_kl)
            c.send_all(sid, " back", max_tokens=2, model="qwen3-a")
        time.sleep(0.5)
        pair = {(p.source_model, p.target_model): p for p in c.list_nodes().pairs}.get(("qwen3-a", "qwen3-b"))
        check(pair is None or (pair.enabled and pair.shadow_samples == 0), "compare fed the guardrail: %s" % pair)
        _, _, s = c.send_all(sid, " Still", max_tokens=2, model="qwen3-b")
        check(s.switch_mode == 1, "a->b still translates after the comparisons: %d %r" % (
            s.switch_mode, s.fallback_reason))
        print("  ok: 3 compare_reprefill switches (KL %s) left the pair on: the client's, not the "
              "guardrail's" % ", ".join("%.3g" % k for k in kls))
    finally:
        fleet.stop()


def ttl_expiry(a):
    work = os.path.join(a.work, "ttl")
    fleet = rtest.Fleet(a.build, work, models=("qwen3-a",), policy={"name": "pinned"},
                        translators=False, extra_top={"session_ttl_seconds": 2})
    try:
        c = fleet.client()
        sid = c.create_session()
        c.send_all(sid, "Hello there", max_tokens=3)
        check(fleet.node_info("qwen3-a").sessions == 1, "node holds the session")
        t0 = time.time()
        while time.time() - t0 < 20 and c.get_session(sid).state != "expired":
            time.sleep(0.2)
        check(c.get_session(sid).state == "expired", "session did not expire")
        check(fleet.node_info("qwen3-a").sessions == 0, "node still holds the expired session")
        import grpc
        try:
            c.send_all(sid, "again")
            raise AssertionError("Send on an expired session succeeded")
        except grpc.RpcError as e:
            check(e.code().name == "FAILED_PRECONDITION" and "expired" in e.details(), e.details())
        print("  ok: idle session expired after its TTL; the node dropped it")
    finally:
        fleet.stop()


def model_failover(a):
    work = os.path.join(a.work, "failover")
    # a high entropy threshold keeps the cascade on rung 0 (qwen3-a) unless it fails over
    fleet = rtest.Fleet(a.build, work, policy={"name": "cascade", "models": ["qwen3-a", "qwen3-b"],
                                               "entropy_threshold": 100},
                        guardrail={"shadow_fraction": 0})
    try:
        import grpc
        c = fleet.client(timeout=60)
        old = c.create_session()
        ids, _, s = c.send_all(old, rtest.corpus_text(0, 600), max_tokens=4)
        check(s.model == "qwen3-a" and not s.failover_from, "cascade starts on rung 0: %s" % s)
        n_ctx = s.context_tokens
        fleet.nodes["qwen3-a"].kill9()
        ids, _, s = c.send_all(old, " The next day", max_tokens=4)
        check(s.model == "qwen3-b" and s.failover_from == "qwen3-a" and
              rtest.MODES[s.switch_mode] == "re-prefill" and "failover" in s.policy_reason and
              s.context_tokens > n_ctx, "old session after the kill: %s" % s)
        print("  ok: cascade, old session: %s" % s.policy_reason)
        new = c.create_session()
        ids, _, s = c.send_all(new, "Once upon a time", max_tokens=4)
        check(s.model == "qwen3-b" and s.failover_from == "qwen3-a", "cascade, new session: %s" % s)
        n_fail = 2
        for pol in ({"name": "pinned", "default_model": "qwen3-a"},
                    {"name": "least_loaded", "default_model": "qwen3-a"},
                    {"name": "cost", "models": ["qwen3-a"]}):
            fleet.write_config(pol, {"shadow_fraction": 0})
            fleet.router.proc.send_signal(signal.SIGHUP)
            t0 = time.time()
            while c.list_nodes().policy != pol["name"] and time.time() - t0 < 10:
                time.sleep(0.1)
            sid = c.create_session()
            ids, _, s = c.send_all(sid, "She opened the door", max_tokens=4)
            check(s.model == "qwen3-b" and s.failover_from == "qwen3-a" and len(ids) == 4,
                  "%s with qwen3-a dead: %s" % (pol["name"], s))
            n_fail += 1
            print("  ok: %s: %s" % (pol["name"], s.policy_reason))
        m = fleet.metrics()
        got = sum(float(v) for v in re.findall(
            r'^kvlingo_router_model_failovers_total\{from="qwen3-a",to="qwen3-b",mode="[a-z]+"\} (\S+)$', m, re.M))
        check(got == n_fail, "kvlingo_router_model_failovers_total: %s, expected %d" % (got, n_fail))
        log = open(fleet.router.log_path).read()
        check(log.count("model failover from qwen3-a to qwen3-b") >= n_fail, "the log names each failover")
        # nobody left: UNAVAILABLE
        fleet.nodes["qwen3-b"].kill9()
        try:
            c.send_all(old, " More", max_tokens=2)
            raise AssertionError("Send with every node dead succeeded")
        except grpc.RpcError as e:
            # and the node that failed last is named, with why
            # (by name: a client is not told the fleet's addresses)
            check(e.code().name == "UNAVAILABLE" and "no other node is healthy" in e.details() and
                  "node b0 failed before the first token: node b0" in e.details() and
                  "127.0.0.1:%d" % fleet.node_ports["qwen3-b"] not in e.details(),
                  "every node dead: %s %s" % (e.code().name, e.details()))
            print("  ok: every node dead -> UNAVAILABLE: %s" % e.details())
    finally:
        fleet.stop()


def node_stops_mid_stream(a):
    """SIGTERM of the node streaming a long turn: when its 2 s grace runs out it cancels the call
    (its log says CANCELLED; the router's side reads gRPC's UNAVAILABLE "Cancelling all calls",
    and a CANCELLED status from a node is read the same way).  That is the node failing, not the
    client cancelling: the client gets UNAVAILABLE, and the ledger keeps neither the turn's input
    as a cancelled turn nor any of it."""
    import grpc
    work = os.path.join(a.work, "node_stops")
    # no drain time and one thread: 4,000 tokens take longer than the 2 s the node then gives
    # running calls (4-5 s on this class of machine)
    fleet = rtest.Fleet(a.build, work, policy={"name": "pinned", "default_model": "qwen3-b"},
                        guardrail={"shadow_fraction": 0}, kvld_args=("--threads", "1", "--drain-timeout-ms", "0"),
                        extra_top={"max_new_tokens": 4000})
    try:
        c = fleet.client(timeout=120)
        warm = c.create_session()
        # the rate half-way through the stream below (about 2,000 tokens of context): its mean
        _, _, ws = c.send_all(warm, rtest.corpus_text(0, 8000), max_tokens=100, model="qwen3-b",
                              ignore_eos=True)
        print("  the node decodes %.0f tokens/s (100 tokens after %d, one thread)" % (
            ws.tokens_per_second, ws.context_tokens - 100))
        # the stream below starts at a short context, so it runs about 1.6x that rate (measured
        # here: 1,765-2,306 tokens in its first 2.1 s at 490-650 tokens/s); it must outlast the
        # node's 2.1 s to the cancel by a margin, else a node this fast would finish first
        if 4000 / (1.7 * ws.tokens_per_second) < 2.6:
            print("  SKIP node_stops_mid_stream: the node decodes %.0f tokens/s, 4,000 tokens end within "
                  "its 2 s grace" % ws.tokens_per_second)
            return
        sid = c.create_session()
        c.send_all(sid, "Once upon a time", max_tokens=2, model="qwen3-b")
        n0 = c.get_session(sid).context_tokens
        b = fleet.nodes["qwen3-b"]
        got, code, detail = 0, "OK", ""
        t0 = time.time()
        try:   # the client's own stream of (piece, summary), read token by token
            for _, summary in c.send(sid, " and then", max_tokens=4000, model="qwen3-b", ignore_eos=True):
                if summary is not None:
                    continue
                got += 1
                if got == 1:   # the first token is out: stop the node
                    b.told_to_stop = True
                    b.proc.send_signal(signal.SIGTERM)
                    t0 = time.time()
        except grpc.RpcError as e:
            code, detail = e.code().name, e.details()
        check(got > 0, "the turn gave no token: %s %s" % (code, detail))
        b.proc.wait(30)
        check(got < 4000, "the node finished the turn within its grace (%.1f s): no cancel to test"
              % (time.time() - t0))
        check(code == "UNAVAILABLE", "the client got %s (%s) after %d tokens, expected UNAVAILABLE"
              % (code, detail, got))
        with open(fleet.router.log_path) as f:
            check("turn cancelled by the client" not in f.read(), "the node's stop was taken for a client cancel")
        g = c.get_session(sid)
        check(g.context_tokens == n0, "the failed turn left %d tokens in the ledger, had %d" % (g.context_tokens, n0))
        print("  ok: node stopped %.1f s into a stream (%d tokens): UNAVAILABLE (%s), ledger unchanged" % (
            time.time() - t0, got, detail))
    finally:
        fleet.stop()


def cli_node_dies_mid_reply(a):
    """kvlingo chat while its node is killed (-9) mid-reply: the error says the turn ended after
    N tokens and the router recorded nothing of it (so: send it again), not the TLS hint a
    closed socket gave it; the ledger is unchanged."""
    work = os.path.join(a.work, "cli_node_dies")
    fleet = rtest.Fleet(a.build, work, policy={"name": "pinned", "default_model": "qwen3-b"},
                        guardrail={"shadow_fraction": 0}, kvld_args=("--threads", "1"),
                        extra_top={"max_new_tokens": 4000})
    try:
        c = fleet.client(timeout=120)
        sid = c.create_session()
        c.send_all(sid, "Once upon a time", max_tokens=2, model="qwen3-b")
        n0 = c.get_session(sid).context_tokens
        p = subprocess.Popen([os.path.join(a.build, "kvlingo"), "chat", "--router", fleet.addr, "--insecure",
                              "--session", sid, "--model", "qwen3-b", "--max-tokens", "4000", "--ignore-eos",
                              " and then"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first = p.stdout.read(1)   # the reply has begun: kill its node
        fleet.nodes["qwen3-b"].kill9()
        out, err = p.communicate(timeout=60)
        err = err.decode(errors="replace")
        check(first and p.returncode == 1 and "the turn ended after" in err and "recorded nothing of it" in err
              and "does the router run TLS" not in err, "kvlingo chat, node killed mid-reply: rc %s %r"
              % (p.returncode, err))
        check(c.get_session(sid).context_tokens == n0, "the broken turn changed the ledger")
        print("  ok: kvlingo chat, node killed mid-reply: %s" % err.strip().split("\n")[-1][-120:])
    finally:
        fleet.stop()


def node_with_another_ticket_key(a):
    """A node restarted with a ticket key other than the fleet's: the router says so at its first
    Info (the nodes' Info names their key by an HMAC of a fixed label, never the key), and a
    switch that needs a span from it re-prefills with the reason; the fleet's nodes name one key."""
    import base64
    work = os.path.join(a.work, "other_key")
    fleet = rtest.Fleet(a.build, work, policy={"name": "cascade", "models": ["qwen3-a", "qwen3-b"],
                                               "entropy_threshold": 100, "calm_turns": 1},
                        guardrail={"shadow_fraction": 0})
    try:
        ids = {m: fleet.node_info(m).ticket_key_id for m in ("qwen3-a", "qwen3-b")}
        check(re.fullmatch(r"[0-9a-f]{16}", ids["qwen3-a"]) and ids["qwen3-a"] == ids["qwen3-b"],
              "the fleet's nodes name one key: %r" % ids)
        other = os.path.join(work, "other.key")
        with open(other, "w") as f:
            f.write(base64.b64encode(os.urandom(48)).decode() + "\n")
        os.chmod(other, 0o600)
        fleet.nodes["qwen3-b"].stop()
        fleet.start_node("qwen3-b", kvld_args=("--ticket-key-file", other))
        kid = fleet.node_info("qwen3-b").ticket_key_id
        check(re.fullmatch(r"[0-9a-f]{16}", kid) and kid != ids["qwen3-a"], "the restarted node's key id %r" % kid)
        t0, said = time.time(), ""
        while time.time() - t0 < 30 and not said:
            with open(fleet.router.log_path) as f:
                said = next((ln for ln in f if "its transfer-ticket key is not the router's (key id %s" % kid in ln), "")
            time.sleep(0.2)
        check(said and ("the router's %s" % ids["qwen3-a"]) in said, "the router did not say the node's key differs")
        # a switch that needs a span from it: the source checks the ticket, and refuses it
        c = fleet.client(timeout=120)
        sid = c.create_session()
        c.send_all(sid, rtest.corpus_text(0, 400), max_tokens=2, model="qwen3-b")
        _, _, s = c.send_all(sid, " and then", max_tokens=2, model="qwen3-a")
        check(rtest.MODES[s.switch_mode] == "re-prefill" and "ticket" in s.fallback_reason,
              "a switch from the node: %s (%s)" % (rtest.MODES[s.switch_mode], s.fallback_reason))
        print("  ok: a node with another ticket key: the router said so at once; a switch from it re-prefilled (%s)"
              % s.fallback_reason[:70])
    finally:
        fleet.stop()


def close_on_other_replica_mid_turn(a):
    """Two replicas on one ledger: a long turn runs on the first, a CloseSession reaches the
    second.  The close must not drop the node's copy under the running turn: it waits for the
    session's lease like a turn does, and answers ABORTED when the turn outlasts lease_wait_ms."""
    import grpc
    work = os.path.join(a.work, "close_other_replica")
    fleet = rtest.Fleet(a.build, work, models=("qwen3-a",), policy={"name": "pinned"},
                        translators=False, tickets=False,
                        extra_top={"lease_wait_ms": 200, "max_new_tokens": 4000})
    try:
        fleet.add_replica("r1")
        c0, c1 = fleet.client(), fleet.replica_client("r1")
        sid = c0.create_session()
        c0.send_all(sid, "Once upon a time", max_tokens=2)
        n0 = c0.get_session(sid).context_tokens
        res = {"got": 0}
        first = threading.Event()

        def turn():
            try:
                for _, summary in c0.send(sid, " and then", max_tokens=3000, ignore_eos=True):
                    if summary is None:
                        res["got"] += 1
                        first.set()
                    else:
                        res["summary"] = summary
            except grpc.RpcError as e:
                res["error"] = "%s: %s" % (e.code().name, e.details())
            first.set()
        th = threading.Thread(target=turn)
        th.start()
        check(first.wait(60), "no token within 60 s")
        close = None
        try:
            close = c1.close_session(sid)
        except grpc.RpcError as e:
            close = e
        th.join(120)
        print("  close on r1 mid-turn: %s; turn: %d tokens, %s" % (
            close if not isinstance(close, grpc.RpcError) else "%s %s" % (close.code().name, close.details()),
            res["got"], res.get("error", "completed")))
        check("summary" in res and res["got"] == 3000,
              "the turn on r0 did not complete (%d tokens): %s" % (res["got"], res.get("error")))
        check(isinstance(close, grpc.RpcError) and close.code().name == "ABORTED",
              "CloseSession on r1 during r0's turn: %r, expected ABORTED" % close)
        g = c0.get_session(sid)
        check(g.state == "open" and g.context_tokens == n0 + res["summary"].user_tokens + 3000,
              "ledger after the turn: %s, %d tokens" % (g.state, g.context_tokens))
        _, _, s = c0.send_all(sid, " Finally", max_tokens=2)
        check(s.n_generated == 2, "the session continues")
        check(c1.close_session(sid), "closed once idle")
        print("  ok: CloseSession on another replica mid-turn: ABORTED; the turn committed, the session continued")
    finally:
        fleet.stop()


def stop_sequence_leaves_no_copy(a):
    """An OpenAI completion ended by a stop sequence: the router cancels the node's stream after
    the matching token, and the node has usually decoded further.  The ledger then does not list
    that node as holding the session; the node's copy must go too, else a close or expiry of the
    session cannot reach it and it keeps a place in the node's table (where the router's
    least-recently-used eviction, which reads the ledger, cannot see it either)."""
    import json
    import urllib.request
    work = os.path.join(a.work, "stop_sequence")
    hport = rtest.free_port()
    fleet = rtest.Fleet(a.build, work, models=("qwen3-a",), policy={"name": "pinned"},
                        translators=False, tickets=False,
                        extra_top={"http_listen": "127.0.0.1:%d" % hport})
    try:
        def complete(body):
            req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % hport,
                                         data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as r:
                return dict(r.headers), json.loads(r.read())
        body = {"model": "qwen3-a", "prompt": "Once upon a time", "max_tokens": 200, "temperature": 0}
        h1, r1 = complete(body)
        text = r1["choices"][0]["text"]
        # a stop string whose first match is a few characters in: the node decodes on past it
        k = next((i for i in range(2, 40) if len(text) >= i + 3 and text.find(text[i:i + 3]) == i), None)
        check(k is not None, "no usable stop string in %r" % text)
        h2, r2 = complete(dict(body, stop=[text[k:k + 3]]))
        check(r2["choices"][0]["finish_reason"] == "stop", "finish %r" % r2["choices"][0]["finish_reason"])
        c = fleet.client()
        s1, s2 = h1["x-kvlingo-session"], h2["x-kvlingo-session"]
        g = c.get_session(s2)
        print("  stop %r after %d chars: ledger %d tokens, holdings %s; node holds %d sessions" % (
            text[k:k + 3], k, g.context_tokens, [(x.node, x.n_tokens) for x in g.holdings],
            fleet.node_info("qwen3-a").sessions))
        for sid in (s1, s2):
            check(c.close_session(sid), "close %s" % sid)
        n = fleet.node_info("qwen3-a").sessions
        check(n == 0, "after closing both sessions the node still holds %d (a copy the ledger does "
              "not list)" % n)
        print("  ok: a stop-sequence turn left no unlisted copy on the node")
    finally:
        fleet.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--only", default="", help="comma-separated test names (default: all)")
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    tests = [kill_source_during_switch, kill_source_mid_export, kill_source_sweep, router_restart,
             config_errors, guardrail_disables_pair, ttl_expiry, model_failover, node_stops_mid_stream,
             cli_node_dies_mid_reply, node_with_another_ticket_key, close_on_other_replica_mid_turn, stop_sequence_leaves_no_copy]
    only = [n for n in a.only.split(",") if n]
    for n in only:
        check(any(t.__name__ == n for t in tests), "unknown test %r" % n)
    for t in tests:
        if not only or t.__name__ in only:
            t(a)
    print("test_faults: PASS")


if __name__ == "__main__":
    main()
