#!/usr/bin/env python3
"""tests/router/test_one_call.py: a turn as one ContinueTurn call on the node.

Real processes on loopback (two kvld nodes with transfer tickets, kvlingo-router):
  1. a translated switch is one call from the router: the target's log has ContinueTurn and
     no SessionInfo / Append / Generate / ImportSpan for it, the source's has one ExportSpan
     from the target, in push mode (sent straight to the target's posted receive, with the
     span's header behind its bytes, so the target translates it as it lands); the summary
     says one_call and names its phases (export, transfer, translate, forward > 0);
     /metrics has kvlingo_router_switch_phase_seconds for them;
  2. the same conversation with `transfer: {one_call: false}` (the several-call path) gives
     the same greedy tokens, the same switch modes, one_call false; and again with nodes
     that do not pull in push mode (--span-push 0: the source pushes through ImportSpan, as
     an older node does);
  3. the target's copy dropped behind the router's back: the node refuses its state
     (FAILED_PRECONDITION), the several-call path resets it, the turn is served and its output
     equals the control;
  4. the source's copy dropped behind the router's back: the node's pull is refused by the
     source (it does not hold what the ledger says), the turn re-prefills with a source_state
     fallback, output equal to the control;
  5. a forced re-prefill and a turn staying on its node are one call too.
usage: test_one_call.py --build BUILD --work DIR
"""
import argparse
import os
import re
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import rtest  # noqa: E402
from rtest import check  # noqa: E402


def log_lines(fleet, model, sid):
    with open(os.path.join(fleet.work, "kvld-%s.log" % model)) as f:
        return [ln for ln in f if ("session=%s " % sid) in ln and "msg=request" in ln]


def methods(lines):
    return [re.search(r"method=(\w+)", ln).group(1) for ln in lines]


def conversation(c, prompt):
    """a -> b (translated) -> b (stays) -> a (translated back): greedy ids and summaries."""
    sid = c.create_session()
    out = []
    for text, model in ((prompt, "qwen3-a"), (" The next part", "qwen3-b"), (" And more", "qwen3-b"),
                        (" Back to the first", "qwen3-a")):
        ids, _, s = c.send_all(sid, text, max_tokens=6, model=model)
        out.append((ids, s))
    return sid, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    prompt = rtest.corpus_text(0, 1200)
    pol = {"name": "pinned", "default_model": "qwen3-a"}
    guard = {"shadow_fraction": 0.0}

    # ---- 2 first: the control, on the several-call path
    ctl = rtest.Fleet(a.build, os.path.join(a.work, "several"), policy=pol, guardrail=guard,
                      transfer={"one_call": False}, peers=True)
    try:
        _, ref = conversation(ctl.client(), prompt)
        check(all(not s.one_call for _, s in ref), "one_call: false still made one-call turns")
        check([s.switch_mode for _, s in ref] == [0, 1, 0, 1],
              "control modes %r" % [s.switch_mode for _, s in ref])
        # the control of 3 and 4: a fresh conversation's first two turns
    finally:
        ctl.stop()
    old = rtest.Fleet(a.build, os.path.join(a.work, "importspan"), policy=pol, guardrail=guard,
                      peers=True, kvld_args=("--span-push", "0"))
    try:
        sid_o, got_o = conversation(old.client(), prompt)
        for i, ((ids, s), (rids, rs)) in enumerate(zip(got_o, ref)):
            check(ids == rids and s.switch_mode == rs.switch_mode and s.one_call,
                  "turn %d through ImportSpan: %r mode %d one_call %r, several calls %r" % (
                      i, ids, s.switch_mode, s.one_call, rids))
        tb = methods(log_lines(old, "qwen3-b", sid_o))
        check(tb[:2] == ["ImportSpan", "ContinueTurn"], "--span-push 0: target's calls %r" % tb)
        exp = [ln for ln in log_lines(old, "qwen3-a", sid_o) if "method=ExportSpan" in ln]
        check(len(exp) == 1 and " push=0" in exp[0], "--span-push 0: source's ExportSpan %r" % exp)
        print("ok: nodes pulling without push mode (ImportSpan back) give the same tokens")
    finally:
        old.stop()

    fleet = rtest.Fleet(a.build, os.path.join(a.work, "one"), policy=pol, guardrail=guard, peers=True)
    try:
        c = fleet.client()
        # ---- 1 + 2
        sid, got = conversation(c, prompt)
        for i, ((ids, s), (rids, rs)) in enumerate(zip(got, ref)):
            check(ids == rids, "turn %d: one call %r, several calls %r" % (i, ids, rids))
            check(s.switch_mode == rs.switch_mode, "turn %d mode %d vs %d" % (i, s.switch_mode, rs.switch_mode))
            check(s.one_call, "turn %d was not one call" % i)
        sw = got[1][1]
        check(sw.switch_mode == 1 and sw.span_tokens > 0, "switch: mode %d span %d (%s)" % (
            sw.switch_mode, sw.span_tokens, sw.fallback_reason))
        for name in ("export_seconds", "transfer_seconds", "translate_seconds", "forward_seconds"):
            check(getattr(sw, name) > 0, "switch summary: %s = %r" % (name, getattr(sw, name)))
        check(sw.forward_seconds < sw.ttft_seconds and sw.translate_seconds < sw.switch_seconds,
              "phases exceed their whole: %r" % sw)
        tl = log_lines(fleet, "qwen3-b", sid)
        first_b = methods(tl)
        check(first_b[:2] == ["ContinueTurn", "ContinueTurn"], "target's calls of the switch: %r" % first_b)
        check(not {"SessionInfo", "Append", "Generate", "OpenSession", "ImportSpan"} & set(first_b),
              "the router or the source still made several calls: %r" % first_b)
        src = methods(log_lines(fleet, "qwen3-a", sid))
        check(src.count("ExportSpan") == 1, "source's calls: %r" % src)
        exp = [ln for ln in log_lines(fleet, "qwen3-a", sid) if "method=ExportSpan" in ln][0]
        check("peer=ipv4:127.0.0.1" in exp and " push=1" in exp and " trailer=1" in exp,
              "ExportSpan line %s" % exp)
        m = fleet.metrics()
        for ph in ("ledger", "export", "transfer", "translate", "forward"):
            check('kvlingo_router_switch_phase_seconds_count{phase="%s"} 2' % ph in m,
                  "phase %s not counted twice in /metrics" % ph)
        print("ok: a switch is one call (%s on the target), phases export %.2f transfer %.2f "
              "translate %.2f forward %.2f of ttft %.2f ms; same tokens as the several-call path" % (
                  "+".join(first_b[:2]), sw.export_seconds * 1e3, sw.transfer_seconds * 1e3,
                  sw.translate_seconds * 1e3, sw.forward_seconds * 1e3, sw.ttft_seconds * 1e3))
        # the span's header came behind its bytes too: the target translated it as it landed,
        # before the source's answer, in at least one of a few switches (the answer can win
        # the race), and every one of them gave the control's tokens (above, and here)
        early, tries = 0, 0
        while tries < 20 and (tries < 6 or not early):   # on a loaded host the answer may win often
            tries += 1
            s2, got2 = conversation(c, prompt)
            check([ids for ids, _ in got2] == [ids for ids, _ in ref], "a repeat's tokens differ")
            with open(os.path.join(fleet.work, "kvld-qwen3-b.log")) as f:
                early += sum(1 for ln in f if "msg=span_landed" in ln and "session=%s " % s2 in ln
                             and "early=1" in ln)
        check(early > 0, "no switch of %d landed its span before the source's answer" % tries)
        print("ok: %d of %d switches translated the span before the source's answer" % (early, tries))

        pb, stub_b = fleet.node_stub("qwen3-b")
        _, stub_a = fleet.node_stub("qwen3-a")
        # ---- 3: the target's copy dropped: its next turn there (a -> b) resets it
        sid3 = c.create_session()
        c.send_all(sid3, prompt, max_tokens=6, model="qwen3-a")
        c.send_all(sid3, " The next part", max_tokens=6, model="qwen3-b")
        c.send_all(sid3, " Back to the first", max_tokens=6, model="qwen3-a")
        stub_b.DropSession(pb.DropSessionRequest(session_id=sid3), timeout=10)
        stub_b.OpenSession(pb.OpenSessionRequest(session_id=sid3), timeout=10)
        stub_b.Append(pb.AppendRequest(session_id=sid3, tokens=[5, 6, 7]), timeout=10)
        ids3, _, s3 = c.send_all(sid3, " Once more", max_tokens=6, model="qwen3-b")
        lines = log_lines(fleet, "qwen3-b", sid3)
        check(any("method=ContinueTurn" in ln and "code=FAILED_PRECONDITION" in ln for ln in lines),
              "the node did not refuse its state: %r" % methods(lines))
        check(not s3.one_call and s3.switch_mode in (1, 2), "turn 3: one_call %r mode %d (%s)" % (
            s3.one_call, s3.switch_mode, s3.fallback_reason))
        g = c.get_session(sid3, include_tokens=True)
        ctx = list(g.tokens)[:g.context_tokens - 6]
        ctl_sid = c.create_session()
        want, _, _ = c.send_all(ctl_sid, tokens=ctx, max_tokens=6, model="qwen3-b", force_reprefill=True)
        check(ids3 == want, "after the reset: %r, control %r" % (ids3, want))
        print("ok: a target holding other tokens refuses (FAILED_PRECONDITION); the several-call "
              "path resets it; output equals the control (%s)" % rtest.MODES[s3.switch_mode])

        # ---- 4: the source's copy dropped: the pull is refused, the turn re-prefills
        sid4 = c.create_session()
        c.send_all(sid4, prompt, max_tokens=6, model="qwen3-a")
        stub_a.DropSession(pb.DropSessionRequest(session_id=sid4), timeout=10)
        stub_a.OpenSession(pb.OpenSessionRequest(session_id=sid4), timeout=10)

        def ab_switches():
            return sum(p.switches for p in c.list_nodes().pairs
                       if (p.source_model, p.target_model) == ("qwen3-a", "qwen3-b"))
        sw_before = ab_switches()
        ids4, _, s4 = c.send_all(sid4, " The next part", max_tokens=6, model="qwen3-b")
        check(s4.one_call and s4.switch_mode == 2 and s4.fallback_reason.startswith("source_state"),
              "turn 4: one_call %r mode %d fallback %r" % (s4.one_call, s4.switch_mode, s4.fallback_reason))
        g = c.get_session(sid4, include_tokens=True)
        ctx = list(g.tokens)[:g.context_tokens - 6]
        ctl4 = c.create_session()
        want4, _, _ = c.send_all(ctl4, tokens=ctx, max_tokens=6, model="qwen3-b")
        check(ids4 == want4, "after a refused pull: %r, control %r" % (ids4, want4))
        m = fleet.metrics()
        check('kvlingo_router_fallbacks_total{reason="source_state"} 1' in m, "fallback not counted")
        # the guardrail counts (and shadows) translated switches only: this turn ran natively
        check(ab_switches() == sw_before, "a pull that fell back was counted as a translated switch "
              "of qwen3-a -> qwen3-b (%d -> %d)" % (sw_before, ab_switches()))
        print("ok: a source not holding what the ledger says refuses the pull; re-prefill "
              "(%s), output equals the control" % s4.fallback_reason[:60])

        # ---- 5: a forced re-prefill is one call
        sid5 = c.create_session()
        c.send_all(sid5, prompt, max_tokens=6, model="qwen3-a")
        _, _, s5 = c.send_all(sid5, " The next part", max_tokens=6, model="qwen3-b", force_reprefill=True)
        check(s5.one_call and s5.switch_mode == 2 and s5.fallback_reason.startswith("forced"),
              "forced: %r %d %r" % (s5.one_call, s5.switch_mode, s5.fallback_reason))
        check(s5.transfer_seconds == 0 and s5.forward_seconds > 0, "forced re-prefill phases %r" % s5)
        print("ok: forced re-prefill and staying turns are one call too")
    finally:
        fleet.stop()
    print("test_one_call: all checks passed")


if __name__ == "__main__":
    main()
