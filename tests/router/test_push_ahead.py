#!/usr/bin/env python3
"""tests/router/test_push_ahead.py: span push-ahead (router/push_ahead.h) with real kvld nodes
(qwen3-a, qwen3-b) and kvlingo-router on loopback.

Two fleets run the same sessions, greedy, token for token: one with push-ahead on (cascade, its
default), one with `push_ahead: false` in the policy block (the control, switching without it).
  P  cascade prediction: entropy_threshold 0 sends every turn after one on qwen3-a to qwen3-b;
     after turn 0 the router pushes the span to b0, the switch then ships 0 tokens, translates,
     and its summary says how many tokens were pushed ahead;
  H  the client hint: turn 0 asks for qwen3-b with prefetch_model qwen3-a, turn 1 asks for
     qwen3-a: pushed back from b0 to a0 ahead of time;
  W  a wrong guess: pushed to b0 after turn 0, turn 1 stays on qwen3-a (counted "unused"), turn 2
     moves to qwen3-b and ships only the tokens after the push;
  T  a target restarted (kill -9, same port) under a listed copy: the push refused there removes
     the stale holding, and a later push ships (one-call fleet);
  R  races: as P, but each next turn is sent at once, so the push and the turn meet (the push is
     skipped, or the turn waits for it, or the push finds the session moved on);
and in every case the outputs equal the control's, with the turn as one ContinueTurn call on
the node and as several calls (transfer.one_call false); the push itself is one ContinueTurn
(pull_only) on the target, or on the several-call path an ExportSpan the source pushes through
the target's ImportSpan.  The control shows no push at all (metrics,
summaries, holdings).
usage: test_push_ahead.py --build BUILD_DIR --work WORK_DIR
"""
import argparse
import os
import re
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rtest  # noqa: E402
from rtest import check  # noqa: E402

TRANSLATE = 1


def push_counts(fleet):
    out = {}
    for m in re.finditer(r'^kvlingo_router_push_ahead_total\{result="(\w+)"\} ([0-9.e+]+)$',
                         fleet.metrics(), re.M):
        out[m.group(1)] = float(m.group(2))
    return out


def wait_pushes(fleet, done_before, timeout=30.0):
    """Wait until one more push has finished (any result but used/unused); returns the counts."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        c = push_counts(fleet)
        done = sum(v for k, v in c.items() if k not in ("used", "unused"))
        if done > done_before:
            return c
        time.sleep(0.05)
    raise AssertionError("no push finished within %.0f s: %r" % (timeout, push_counts(fleet)))


def finished(c):
    return sum(v for k, v in c.items() if k not in ("used", "unused"))


def holding(client, sid, node):
    for h in client.get_session(sid).holdings:
        if h.node == node:
            return h.n_tokens
    return 0


PLANS = {
    "P": [({}, "qwen3-a"), ({}, "qwen3-b"), ({}, "qwen3-b")],
    # a hint naming the answering model means "no switch next": it overrides the cascade's
    # prediction (qwen3-b after every qwen3-a turn here), so no other push is made
    "H": [({"model": "qwen3-b", "prefetch_model": "qwen3-a"}, "qwen3-b"),
          ({"model": "qwen3-a", "prefetch_model": "qwen3-a"}, "qwen3-a")],
    "W": [({}, "qwen3-a"), ({"model": "qwen3-a", "prefetch_model": "qwen3-a"}, "qwen3-a"),
          ({"model": "qwen3-b"}, "qwen3-b")],
}
RACES = {"R%d" % k: [({}, "qwen3-a"), ({}, "qwen3-b")] for k in range(4)}


def run_plans(fleet, pushing, plans=PLANS):
    """Run every plan on `fleet`; returns {name: [(ids, summary), ...]}.  With pushing, each
    turn that should queue a push waits for it to finish before the next turn."""
    c = fleet.client()
    res = {}
    for name, plan in plans.items():
        sid = c.create_session()
        turns = []
        for i, (kw, want_model) in enumerate(plan):
            before = finished(push_counts(fleet))
            text = rtest.corpus_text(0 if i == 0 else 2000 + 131 * i, 300 if i == 0 else 50)
            ids, _, s = c.send_all(sid, text, max_tokens=6, **kw)
            check(s.model == want_model, "%s turn %d: answered by %s, expected %s (%s)" % (
                name, i, s.model, want_model, s.policy_reason))
            print("  %s turn %d: %s mode=%d span=%d pushed=%d ctx=%d fallback=%r" % (
                name, i, s.model, s.switch_mode, s.span_tokens, s.pushed_ahead_tokens,
                s.context_tokens, s.fallback_reason))
            turns.append((list(ids), s, sid))
            # a push follows P0, H0 and W0 only (P1, P2 predict qwen3-b, where they ran)
            if pushing and i == 0 and plans is PLANS:
                cnt = wait_pushes(fleet, before)
                check(cnt.get("failed", 0) == 0, "a push failed: %r (see router.log)" % cnt)
        res[name] = turns
    return res, c


def check_push_fleet(a, policy, want, want_races, one_call):
    print("push-ahead fleet, transfer.one_call: %s" % one_call)
    fleet = rtest.Fleet(a.build, os.path.join(a.work, "push-%s" % ("one" if one_call else "calls")),
                        policy=policy, transfer={"one_call": one_call})
    try:
        got, c = run_plans(fleet, pushing=True)
        for name in PLANS:
            for i, ((gi, gs, _), (wi, ws, _)) in enumerate(zip(got[name], want[name])):
                check(gi == wi, "%s turn %d: tokens %r differ from the control's %r" % (name, i, gi, wi))
                check(gs.context_tokens == ws.context_tokens, "%s turn %d: ledger length" % (name, i))
        # P: the switch after the push ships nothing and translates
        p0, p1 = got["P"][0][1], got["P"][1][1]
        check(p1.switch_mode == TRANSLATE and p1.span_tokens == 0,
              "P turn 1: mode %d span %d, expected a 0-token translated switch (%s)" % (
                  p1.switch_mode, p1.span_tokens, p1.fallback_reason))
        check(p1.one_call == one_call, "P turn 1: one_call %s, the fleet says %s" % (p1.one_call, one_call))
        check(p1.pushed_ahead_tokens == p0.context_tokens - 1,
              "P turn 1: pushed_ahead_tokens %d, expected %d" % (p1.pushed_ahead_tokens, p0.context_tokens - 1))
        check(want["P"][1][1].span_tokens == p0.context_tokens - 1,
              "control P turn 1 shipped %d" % want["P"][1][1].span_tokens)
        if one_call:
            # b0 caches all a0 does but the last sampled token, which it prefills with the turn:
            # the push's export is the session's only one on a0 (no round trip for an empty span)
            with open(os.path.join(fleet.work, "kvld-qwen3-a.log")) as f:
                exports = [ln for ln in f if "method=ExportSpan" in ln and "session=%s " % got["P"][0][2] in ln]
            check(len(exports) == 1, "P: %d ExportSpan calls on a0, expected the push's only:\n%s" % (
                len(exports), "".join(exports)))
        # the push's span move: one ContinueTurn (pull_only) on b0, which pulled from a0; on the
        # several-call path, a0's ExportSpan pushed it through b0's ImportSpan
        with open(os.path.join(fleet.work, "kvld-qwen3-b.log")) as f:
            blog = [ln for ln in f if "session=%s " % got["P"][0][2] in ln]
        pulls = [ln for ln in blog if "method=ContinueTurn" in ln and "pull_only=1 mode=translate" in ln]
        imports = [ln for ln in blog if "method=ImportSpan" in ln]
        check((len(pulls), len(imports)) == ((1, 0) if one_call else (0, 1)),
              "P: the push on b0: %d pull_only ContinueTurn, %d ImportSpan:\n%s" % (
                  len(pulls), len(imports), "".join(blog)))
        # H: the hint pushed b0 -> a0
        h1 = got["H"][1][1]
        check(h1.switch_mode == TRANSLATE and h1.span_tokens == 0 and h1.pushed_ahead_tokens > 0,
              "H turn 1: mode %d span %d pushed %d" % (h1.switch_mode, h1.span_tokens, h1.pushed_ahead_tokens))
        # W: the wrong guess stayed on a0; the later switch ships only what came after the push
        w0, w1, w2 = (t[1] for t in got["W"])
        check(w1.switch_mode != TRANSLATE and w1.pushed_ahead_tokens == 0, "W turn 1 used a push")
        check(w2.switch_mode == TRANSLATE and w2.span_tokens == w1.context_tokens - 1 - (w0.context_tokens - 1),
              "W turn 2: span %d, expected %d (only the tokens after the push)" % (
                  w2.span_tokens, w1.context_tokens - w0.context_tokens))
        check(w2.span_tokens < want["W"][2][1].span_tokens, "W turn 2 shipped no less than the control")
        cnt = push_counts(fleet)
        print("  push metrics:", cnt)
        check(cnt.get("shipped", 0) == 3 and cnt.get("used", 0) == 2 and cnt.get("unused", 0) == 1,
              "push counts %r, expected shipped 3, used 2, unused 1" % cnt)
        check(cnt.get("failed", 0) == 0 and cnt.get("dropped_full", 0) == 0, "push failures: %r" % cnt)
        check(re.search(r"^kvlingo_router_push_ahead_seconds_count 3$", fleet.metrics(), re.M),
              "push_ahead_seconds should have 3 samples")
        # the ledger: b0 holds P's context (its last turn ran there); the holdings match the nodes
        sid_p = got["P"][0][2]
        check(holding(c, sid_p, "b0") == got["P"][-1][1].context_tokens, "P: b0's holding")
        # races: whatever the push did, the answers are the control's
        races, _ = run_plans(fleet, pushing=True, plans=RACES)
        for name in RACES:
            for i, ((gi, gs, _), (wi, ws, _)) in enumerate(zip(races[name], want_races[name])):
                check(gi == wi, "%s turn %d: tokens %r differ from the control's %r" % (name, i, gi, wi))
                check(gs.context_tokens == ws.context_tokens, "%s turn %d: ledger length" % (name, i))
        time.sleep(0.5)
        cnt = push_counts(fleet)
        print("  push metrics after the races:", cnt)
        check(cnt.get("failed", 0) == 0, "a push failed in the races: %r" % cnt)
        print("ok: push-ahead ships ahead, the next switch translates 0 or only new tokens, "
              "outputs equal the control")
        if one_call:
            # the target restarts (kill -9, the same port) while the ledger lists its copy: the
            # next push there is refused (session unknown), which removes the stale holding, so
            # the push after it starts the session afresh and ships, instead of every push being
            # refused until a turn lands there
            c0 = push_counts(fleet)
            sid = c.create_session()
            c.send_all(sid, rtest.corpus_text(0, 300), max_tokens=6)
            cnt = wait_pushes(fleet, finished(c0))
            check(holding(c, sid, "b0") > 0, "the first push was not recorded: %r" % cnt)
            fleet.nodes["qwen3-b"].kill9()
            fleet.start_node("qwen3-b")
            # the source's first send to the target's new UCX address may fail (its peer table
            # still has the old one until a failed send makes it ask Info again): a few turns
            results = []
            for k in range(4):
                c0 = push_counts(fleet)
                c.send_all(sid, rtest.corpus_text(500 + 50 * k, 40), max_tokens=6, model="qwen3-a")
                cnt = wait_pushes(fleet, finished(c0))
                results.append([r for r in cnt if cnt[r] > c0.get(r, 0) and r not in ("used", "unused")])
                if cnt.get("shipped", 0) > c0.get("shipped", 0):
                    break
            check(results[0] == ["skipped"] and results[-1] == ["shipped"],
                  "pushes to the restarted target: %r (the first refused, then shipped)" % results)
            check("b0 does not hold the session the ledger listed" in open(fleet.router.log_path).read(),
                  "the stale holding's removal is logged")
            g = c.get_session(sid)
            check(holding(c, sid, "b0") == g.context_tokens - 1,
                  "b0 holds %d after the restart's pushes, the ledger %d" % (holding(c, sid, "b0"), g.context_tokens))
            print("ok: a restarted push target's stale holding is removed and the next push ships")
        if not one_call:
            # the source dies after its push: the switch's export of the last token fails and
            # the turn re-prefills only that token and its input on the pushed span, which
            # saved the rest: the push is counted used, and the answer is the control's
            c0 = push_counts(fleet)
            sid = c.create_session()
            c.send_all(sid, rtest.corpus_text(0, 300), max_tokens=6)
            cnt = wait_pushes(fleet, finished(c0))
            check(cnt.get("shipped", 0) == c0.get("shipped", 0) + 1, "the last push was not shipped: %r" % cnt)
            fleet.nodes["qwen3-a"].kill9()
            ids, _, s1 = c.send_all(sid, rtest.corpus_text(2000 + 131, 50), max_tokens=6)
            print("  source gone: %s mode=%d span=%d pushed=%d fallback=%r" % (
                s1.model, s1.switch_mode, s1.span_tokens, s1.pushed_ahead_tokens, s1.fallback_reason))
            check(s1.model == "qwen3-b" and s1.switch_mode == 2 and s1.pushed_ahead_tokens > 0,
                  "with the source gone: mode %d pushed %d (%s)" % (s1.switch_mode, s1.pushed_ahead_tokens,
                                                                    s1.fallback_reason))
            check(list(ids) == want["P"][1][0], "with the source gone: %r, control %r" % (list(ids), want["P"][1][0]))
            cnt = push_counts(fleet)
            check(cnt.get("used", 0) == c0.get("used", 0) + 1, "a push that saved the prefill was not counted used: %r" % cnt)
            print("ok: a push whose source died before the switch is used (re-prefill of the last token)")
    finally:
        fleet.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    policy = {"name": "cascade", "models": ["qwen3-a", "qwen3-b"], "entropy_threshold": 0,
              "calm_turns": 1000}

    print("control fleet: push_ahead: false")
    ctl = rtest.Fleet(a.build, os.path.join(a.work, "control"), policy=dict(policy, push_ahead=False))
    try:
        want, _ = run_plans(ctl, pushing=False)
        want_races, _ = run_plans(ctl, pushing=False, plans=RACES)
        cnt = push_counts(ctl)
        check(cnt and all(v == 0 for v in cnt.values()), "control fleet pushed: %r" % cnt)
        for name, turns in want.items():
            for i, (_, s, _) in enumerate(turns):
                check(s.pushed_ahead_tokens == 0, "control %s turn %d: pushed %d" % (name, i, s.pushed_ahead_tokens))
            check(turns[1][1].span_tokens > 0 or name == "W", "control %s: the switch shipped nothing" % name)
    finally:
        ctl.stop()

    # the turn as one ContinueTurn call on the node, and as several calls (SessionInfo,
    # ExportSpan, Append, Generate): both see the pushed span
    for one_call in (True, False):
        check_push_fleet(a, policy, want, want_races, one_call)
    return 0


if __name__ == "__main__":
    sys.exit(main())
