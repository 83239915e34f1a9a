#!/usr/bin/env python3
"""router/tests/test_e2e.py: kvld (qwen3-a, qwen3-b) + kvlingo-router on loopback.

  1. a multi-turn session that switches both ways (cascade: escalate flag up, calm turns down):
     every turn's tokens equal an in-process replay of the same steps (kvr_turn_ref, greedy);
     switches translate; the switch back ships only the span the node lacks (retained span);
     the ledger holds exactly the turns' tokens;
  2. /metrics and ListNodes show the turns, switches, pairs, guardrail samples;
  3. bad input: unknown session, empty text, oversize input, unknown model, token outside the
     vocabulary, text and tokens together, closed session -> clear gRPC errors; the router keeps
     serving;
  4. SIGHUP reloads the policy without dropping the session.
usage: test_e2e.py --build BUILD_DIR --work WORK_DIR
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rtest  # noqa: E402
import grpc  # noqa: E402
from rtest import check  # noqa: E402


def expect_error(fn, code, words):
    import grpc
    try:
        fn()
    except grpc.RpcError as e:
        check(e.code().name == code, "expected %s, got %s: %s" % (code, e.code().name, e.details()))
        for w in words:
            check(w in e.details(), "error %r should mention %r" % (e.details(), w))
        print("  ok: %s: %s" % (code, e.details()))
        return
    raise AssertionError("expected %s, the call succeeded" % code)


def hup_and_wait(fleet):
    """SIGHUP the router and wait (up to 20 s) until its log shows the reload's outcome."""
    def outcomes():
        with open(fleet.router.log_path, errors="replace") as f:
            t = f.read()
        return t.count("reloaded ") + t.count("reload failed")
    before = outcomes()
    fleet.router.proc.send_signal(signal.SIGHUP)
    deadline = time.time() + 20
    while outcomes() == before and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.05)   # the line after the outcome (a warning) is written right after it
    return open(fleet.router.log_path, errors="replace").read()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    fleet = rtest.Fleet(a.build, a.work,
                        policy={"name": "cascade", "models": ["qwen3-a", "qwen3-b"],
                                "entropy_threshold": 100, "calm_turns": 1},
                        guardrail={"shadow_fraction": 1.0, "kl_budget": 100})
    try:
        c = fleet.client()
        sid = c.create_session()
        # 1. turns: a, b (escalate), a (calm step down), a, b (escalate), a
        plan = [({}, "qwen3-a", "none"), ({"escalate": True}, "qwen3-b", "translate"),
                ({}, "qwen3-a", "translate"), ({}, "qwen3-a", "none"),
                ({"escalate": True}, "qwen3-b", "translate"), ({}, "qwen3-a", "translate")]
        steps, outs, ledger = [], [], []
        for i, (kw, want_model, want_mode) in enumerate(plan):
            text = rtest.corpus_text(0, 300) if i == 0 else rtest.corpus_text(1000 + 97 * i, 60)
            ids, out, s = c.send_all(sid, text, max_tokens=10, **kw)
            mode = rtest.MODES[s.switch_mode]
            print("turn %d: %s %s span=%d ttft=%.2fms tokens=%d fallback=%r" % (
                i, s.model, mode, s.span_tokens, s.ttft_seconds * 1e3, s.n_generated,
                s.fallback_reason))
            check(s.model == want_model, "turn %d answered by %s, expected %s" % (i, s.model, want_model))
            check(mode == want_mode.replace("reprefill", "re-prefill"),
                  "turn %d switch mode %s, expected %s (%s)" % (i, mode, want_mode, s.fallback_reason))
            check(len(ids) == 10 and s.n_generated == 10, "turn %d: %d tokens" % (i, len(ids)))
            user = s.user_tokens
            g = c.get_session(sid, include_tokens=True)
            toks = list(g.tokens)
            check(toks[:len(ledger)] == ledger, "ledger prefix changed at turn %d" % i)
            check(toks[len(ledger) + user:] == ids, "ledger tail != streamed tokens at turn %d" % i)
            steps.append((s.model, "translate" if mode == "translate" else "none",
                          toks[len(ledger):len(ledger) + user]))
            ledger = toks
            outs.append(ids)
            if i == 4:
                # retained span: a holds the context up to turn 3, only what b added since ships
                check(s.span_tokens < s.context_tokens - 30,
                      "turn 4 shipped %d of %d tokens" % (s.span_tokens, s.context_tokens))
        # in-process replay
        ref_in = os.path.join(a.work, "steps.txt")
        trdir = os.path.join(a.work, "translators")
        with open(ref_in, "w") as f:
            for m in ("qwen3-a", "qwen3-b"):
                f.write("model %s %s\n" % (m, os.path.join(rtest.SRC, "models", m)))
            f.write("translator qwen3-a qwen3-b %s\n" % os.path.join(trdir, "qwen3-a_to_qwen3-b.safetensors"))
            f.write("translator qwen3-b qwen3-a %s\n" % os.path.join(trdir, "qwen3-b_to_qwen3-a.safetensors"))
            for m, mode, user in steps:
                f.write("turn %s %s 10 %s\n" % (m, mode, ",".join(map(str, user))))
        ref = subprocess.run([os.path.join(a.build, "tests", "router", "kvr_turn_ref"), ref_in],
                             capture_output=True, text=True, check=True,
                             env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
        ref_outs = [list(map(int, l.split())) for l in ref.stdout.strip().split("\n")]
        for i, (o, r) in enumerate(zip(outs, ref_outs)):
            check(o == r, "turn %d: router %s != in-process %s" % (i, o, r))
        print("  ok: %d turns identical to the in-process replay" % len(outs))

        # 2. metrics and ListNodes
        time.sleep(1.0)   # guardrail samples run off the critical path
        m = fleet.metrics()
        for name in ["kvlingo_router_turns_total", "kvlingo_router_switches_total",
                     "kvlingo_router_switch_ttft_seconds_bucket", "kvlingo_router_shadow_kl_nats_bucket",
                     "kvlingo_router_ledger_write_seconds_count", "kvlingo_router_sessions_open 1",
                     "kvlingo_router_pairs_disabled 0"]:
            check(name in m, "metric %s missing" % name)
        ln = c.list_nodes()
        check(ln.policy == "cascade" and len(ln.nodes) == 2 and all(n.healthy for n in ln.nodes),
              "ListNodes: %s" % ln)
        pairs = {(p.source_model, p.target_model): p for p in ln.pairs}
        check(pairs[("qwen3-a", "qwen3-b")].shadow_samples >= 1 and pairs[("qwen3-a", "qwen3-b")].enabled,
              "pair a->b: %s" % pairs.get(("qwen3-a", "qwen3-b")))
        print("  ok: metrics and ListNodes (a->b moving KL %.4f)" % pairs[("qwen3-a", "qwen3-b")].moving_kl)

        # grpc.health.v1 (raw bytes: HealthCheckResponse{status: SERVING} = 08 01)
        check_fn = c.channel.unary_unary("/grpc.health.v1.Health/Check",
                                         request_serializer=lambda b: b,
                                         response_deserializer=lambda b: b)
        svc = b"kvlingo.v1.Router"
        check(check_fn(b"", timeout=5) == b"\x08\x01", "health ''")
        check(check_fn(b"\x0a" + bytes([len(svc)]) + svc, timeout=5) == b"\x08\x01", "health Router")
        print("  ok: grpc.health.v1 SERVING")

        # 3. bad input
        expect_error(lambda: c.send_all("nope", "hello"), "NOT_FOUND", ["unknown session", "nope"])
        # an id no session can have says why (it answered NOT_FOUND with the id cut to 64 characters)
        expect_error(lambda: c.send_all("x" * 10000, "hello"), "INVALID_ARGUMENT",
                     ["session_id", "(10000 characters) is invalid (1-64 of A-Za-z0-9._:-)"])
        expect_error(lambda: c.get_session("no spaces"), "INVALID_ARGUMENT",
                     ["'no spaces' (9 characters) is invalid"])
        expect_error(lambda: c.close_session("y" * 65), "INVALID_ARGUMENT", ["...' (65 characters) is invalid (1-64"])
        expect_error(lambda: c.send_all(sid, ""), "INVALID_ARGUMENT", ["empty input"])
        expect_error(lambda: c.send_all(sid, "word " * 5000), "OUT_OF_RANGE", ["max_input_tokens"])
        expect_error(lambda: c.send_all(sid, "hi", model="gpt-9"), "NOT_FOUND", ["unknown model", "gpt-9"])
        expect_error(lambda: c.send_all(sid, tokens=[1, 999999]), "INVALID_ARGUMENT", ["vocabulary"])
        expect_error(lambda: c.send_all(sid, "x", tokens=[1]), "INVALID_ARGUMENT", ["not both"])
        expect_error(lambda: c.send_all(sid, "x", max_tokens=10 ** 6), "OUT_OF_RANGE", ["max_new_tokens"])
        expect_error(lambda: c.create_session(model="nope"), "NOT_FOUND", ["unknown model"])
        expect_error(lambda: c.create_session(session_id=sid), "ALREADY_EXISTS", ["exists"])
        sid2 = c.create_session()
        c.send_all(sid2, "One more", max_tokens=2)
        check(c.close_session(sid2), "close")
        expect_error(lambda: c.send_all(sid2, "again"), "FAILED_PRECONDITION", ["closed"])
        check(c.get_session(sid2).state == "closed", "state closed")

        # a client cancelling mid-stream: the input is kept, the output is not; the next turn is
        # consistent (tests/router/test_cancel.py checks the kept ids exactly)
        n_before = c.get_session(sid).context_tokens
        it = c.stub.Send(c.pb.SendRequest(session_id=sid, tokens=[264, 1210, 13], max_tokens=200,
                                          ignore_eos=True), timeout=60)
        next(it)
        it.cancel()
        t0 = time.time()
        while c.get_session(sid).context_tokens == n_before and time.time() - t0 < 10:
            time.sleep(0.1)
        check(c.get_session(sid).context_tokens == n_before + 3,
              "a cancelled turn keeps exactly its input: %d -> %d" % (n_before, c.get_session(sid).context_tokens))
        # the cancelled turn commits its input, then drops the node's copy and lets the session
        # go: a turn sent in between is told the session is busy (ABORTED), and a client retries
        t0 = time.time()
        while True:
            try:
                ids, _, s = c.send_all(sid, " after cancel", max_tokens=3)
                break
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.ABORTED or "busy" not in err.details() or time.time() - t0 > 10:
                    raise
                time.sleep(0.05)
        check(s.context_tokens == n_before + 3 + s.user_tokens + 3, "turn after a cancel")
        print("  ok: client cancel mid-stream: input kept, output discarded, next turn consistent (%s)" % (
            s.fallback_reason or rtest.MODES[s.switch_mode]))

        # kvlingo chat (the C client)
        kv = os.path.join(a.build, "kvlingo")
        r = subprocess.run([kv, "chat", "--router", fleet.addr] + fleet.cli_security() + ["--session", sid, "--max-tokens", "5",
                            " The end"], capture_output=True, text=True, timeout=60)
        check(r.returncode == 0 and "[session %s turn" % sid in r.stdout and "TTFT" in r.stdout,
              "kvlingo chat: rc %d %r %r" % (r.returncode, r.stdout, r.stderr))
        r2 = subprocess.run([kv, "chat", "--router", fleet.addr] + fleet.cli_security() + ["--session", "nope", "hi"],
                            capture_output=True, text=True, timeout=60)
        check(r2.returncode == 1 and "NOT_FOUND" in r2.stderr and "unknown session" in r2.stderr,
              "kvlingo chat bad session: %r" % r2.stderr)
        # a refused first turn leaves no open session behind (it would count against the
        # tenant's max_sessions until the TTL); the id of one that holds something is printed
        open_before = c.list_nodes().sessions_open
        r3 = subprocess.run([kv, "chat", "--router", fleet.addr] + fleet.cli_security() + ["--max-tokens", "99999", "hi"],
                            capture_output=True, text=True, timeout=60)
        check(r3.returncode == 1 and "OUT_OF_RANGE" in r3.stderr and "closed (the turn failed before it held "
              "anything)" in r3.stderr and "continue with" not in r3.stderr, "kvlingo chat refused turn: %r" % r3.stderr)
        check(c.list_nodes().sessions_open == open_before,
              "sessions open after a refused chat: %d, before %d" % (c.list_nodes().sessions_open, open_before))
        print("  ok: kvlingo chat: %s" % r.stdout.strip().split("\n")[-1])
        ledger = list(c.get_session(sid, include_tokens=True).tokens)

        # 4. SIGHUP: switch the policy to pinned on qwen3-b; the session continues there
        fleet.write_config({"name": "pinned", "default_model": "qwen3-b"},
                           {"shadow_fraction": 1.0, "kl_budget": 100})
        hup_and_wait(fleet)
        check(c.list_nodes().policy == "pinned", "policy after SIGHUP")
        ids, out, s = c.send_all(sid, " Then", max_tokens=4)
        check(s.model == "qwen3-a" and rtest.MODES[s.switch_mode] == "none",
              "pinned keeps the session's model: %s %s" % (s.model, rtest.MODES[s.switch_mode]))
        ids, out, s = c.send_all(sid, " Then", max_tokens=4, model="qwen3-b")
        check(s.model == "qwen3-b" and rtest.MODES[s.switch_mode] == "translate",
              "after reload: %s %s" % (s.model, rtest.MODES[s.switch_mode]))
        check(s.context_tokens > len(ledger), "session kept across reload")
        # a broken config on SIGHUP keeps the old policy
        with open(fleet.config, "a") as f:
            f.write("bogus_key: 1\n")
        hup_and_wait(fleet)
        check(c.list_nodes().policy == "pinned" and fleet.router.alive(), "router after bad reload")
        log = open(fleet.router.log_path).read()
        check("reload failed, keeping the old policy: %s:" % fleet.config in log and "bogus_key" in log,
              "the log names the file, line and key of a bad reload")
        # nodes are read at start only: a policy naming a model only a newly listed node serves
        # is refused (it would fail every turn NOT_FOUND), and the reason says why
        def with_node_c(policy):
            fleet.write_config(policy, {"shadow_fraction": 1.0, "kl_budget": 100})
            with open(fleet.config) as f:
                text = f.read()
            with open(fleet.config, "w") as f:
                f.write(text.replace("nodes:\n", "nodes:\n  - {name: c0, address: 127.0.0.1:9, model: qwen2-c}\n"))
            return hup_and_wait(fleet)
        log = with_node_c({"name": "cascade", "models": ["qwen3-a", "qwen2-c"]})
        check("model 'qwen2-c' is served by no node" in log and "read at start only" in log,
              "a policy for a node added to the file: %r" % log[-600:])
        check(c.list_nodes().policy == "pinned", "the old policy stays: %s" % c.list_nodes().policy)
        ids, out, s = c.send_all(c.create_session(), "Hello", max_tokens=4)
        check(s.model == "qwen3-b", "a new session after the refused reload: %s" % s.model)
        log = with_node_c({"name": "least_loaded", "default_model": "qwen3-a"})
        check("'nodes:' differs from the running fleet's 2 nodes" in log and
              c.list_nodes().policy == "least_loaded", "a reload with a changed node list warns")
        check(len(c.list_nodes().nodes) == 2, "the node list is the one started with")
        print("  ok: SIGHUP reloads the policy, sessions kept; a bad file keeps the old one; "
              "a changed node list is not applied and said so")
        check(fleet.router.alive(), "router died")
    finally:
        fleet.stop()
    print("test_e2e: PASS")


if __name__ == "__main__":
    main()
