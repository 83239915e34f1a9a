"""tests/router/test_replicas.py: three kvlingo-router replicas on one PostgreSQL ledger (a real
server started here, initdb + pg_ctl, as an unprivileged user) in front of two kvld nodes.

  - a session created on one replica continues on the others (switches included);
  - kill -9 of the replica driving a turn: the client's retry (same request id) on another
    replica completes the turn once, within the lease time plus one turn; the ledger holds
    exactly one copy, and a second retry answers the stored result;
  - concurrent turns on one session through two replicas: one runs, the other gets ABORTED
    naming the replica that drives it; the ledger stays consistent;
  - PostgreSQL restarted mid-run: turns fail with UNAVAILABLE while it is down and work again
    after, on every replica;
  - the replicas' lease and ledger metrics.
Exit 77 (skipped) when the PostgreSQL server binaries are not installed."""
import argparse
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pgtest  # noqa: E402
import rtest  # noqa: E402
from rtest import check  # noqa: E402

LEASE_MS = 3000
WAIT_MS = 600


def grpc_code(e):
    try:
        return e.code().name
    except Exception:  # noqa: BLE001
        return type(e).__name__


def ledger_turns(pg, sid, rid=None):
    q = "SELECT count(*) FROM turns WHERE session='%s'" % sid
    if rid:
        q += " AND request_id='%s'" % rid
    return int(pg.psql(q).strip())


def consistent(pg, sid):
    """The ledger's own view: chunks tile [0, n_tokens), one turn row per n_turns."""
    n_tokens, n_turns = pg.psql("SELECT n_tokens, n_turns FROM sessions WHERE id='%s'" % sid).split()
    rows = pg.psql("SELECT t0, length(ids) FROM chunks WHERE session='%s' ORDER BY t0" % sid).split("\n")
    have = 0
    for r in rows:
        if not r.strip():
            continue
        t0, nb = map(int, r.split("\t"))
        check(t0 == have, "session %s: chunk at %d does not follow %d" % (sid, t0, have))
        have += nb // 4
    check(have == int(n_tokens), "session %s: %d tokens in chunks, %s in the row" % (sid, have, n_tokens))
    check(ledger_turns(pg, sid) == int(n_turns), "session %s: turn rows != n_turns" % sid)
    return int(n_tokens), int(n_turns)


def metric(text, name):
    for ln in text.split("\n"):
        if ln.startswith(name + " "):
            return float(ln.split()[1])
    raise AssertionError("metric %s missing" % name)


def retry_send(client_for, names, sid, deadline_s, **kw):
    """The client's retry loop: UNAVAILABLE or ABORTED -> the next replica, until deadline."""
    t0 = time.time()
    i, last = 0, None
    while time.time() - t0 < deadline_s:
        name = names[i % len(names)]
        i += 1
        try:
            ta = time.time()
            r = client_for(name).send_all(sid, **kw)
            retry_send.last_attempt_s = time.time() - ta
            return name, r, i
        except Exception as e:  # noqa: BLE001
            last = e
            if grpc_code(e) not in ("UNAVAILABLE", "ABORTED"):
                raise
            time.sleep(0.1)
    raise AssertionError("no replica completed the turn within %.1f s: %s" % (deadline_s, last))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    try:
        pg = pgtest.Postgres()
    except pgtest.Missing as e:
        print("skipped: %s" % e)
        return 77
    pg.start()
    print("PostgreSQL at %s (data %s)" % (pg.uri, pg.data))
    extra = {"replica_id": "r0", "lease_ms": LEASE_MS, "lease_wait_ms": WAIT_MS, "max_new_tokens": 2048}
    fleet = rtest.Fleet(a.build, a.work, policy={"name": "pinned", "default_model": "qwen3-a"},
                        extra_top=extra, ledger=pg.uri)
    try:
        fleet.replicas["r0"] = {"proc": fleet.router, "addr": fleet.addr, "metrics_port": fleet.metrics_port,
                                "config": fleet.config, "port": fleet.router_port, "name": "r0"}
        fleet.add_replica("r1")
        fleet.add_replica("r2")
        clients = {}

        def cl(name):
            if name not in clients:
                clients[name] = fleet.replica_client(name, timeout=120)
            return clients[name]

        # -- 1. one session across the replicas, with switches --------------------------------
        sid = cl("r0").create_session()
        ctx = 0
        for i, (rep, model) in enumerate((("r0", "qwen3-a"), ("r1", "qwen3-b"), ("r2", "qwen3-a"),
                                          ("r1", "qwen3-a"), ("r0", "qwen3-b"))):
            ids, _, s = cl(rep).send_all(sid, rtest.corpus_text(i * 50, 60), max_tokens=6, model=model,
                                         request_id="t%d" % i)
            check(s.turn == i and s.model == model, "turn %d on %s: %s" % (i, rep, s))
            check(s.context_tokens == ctx + s.user_tokens + 6, "turn %d: context %d" % (i, s.context_tokens))
            ctx = s.context_tokens
            print("  turn %d on %s: %s, %s" % (i, rep, model, rtest.MODES[s.switch_mode]))
        g = cl("r2").get_session(sid)
        check(g.n_turns == 5 and g.context_tokens == ctx, "GetSession on r2: %s" % g)
        check(consistent(pg, sid) == (ctx, 5), "ledger after 5 turns")
        print("  ok: a session created on r0 continued on r1 and r2 (%d tokens, 5 turns)" % ctx)

        # long turns last about 3 s whatever the build (a sanitizer build decodes far slower):
        # the decode rate is measured on qwen3-b first
        t_cal = time.time()
        _, _, sc = cl("r0").send_all(sid, " and", max_tokens=64, model="qwen3-b", request_id="cal")
        rate = 64.0 / max(time.time() - t_cal, 1e-3)
        long_n = max(64, min(1800, int(rate * 3.0)))
        print("  qwen3-b decodes ~%.0f tokens/s through the router: long turns of %d tokens" % (rate, long_n))

        # -- 2. kill -9 of the replica driving a turn ---------------------------------------
        n0, t0 = consistent(pg, sid)
        first = threading.Event()
        res = {}

        def long_turn():
            try:
                for piece, summary in cl("r1").send(sid, text=" and so the story went on", max_tokens=long_n,
                                                     model="qwen3-b", request_id="kill-1"):
                    first.set()
                res["done"] = summary
            except Exception as e:  # noqa: BLE001
                res["e"] = e
                first.set()

        th = threading.Thread(target=long_turn)
        th.start()
        check(first.wait(30), "the long turn produced no token")
        check("e" not in res, "long turn failed early: %s" % res.get("e"))
        fleet.replicas["r1"]["proc"].kill9()
        t_kill = time.time()
        th.join(30)
        check("done" not in res, "the turn finished before the kill: make it longer")
        print("  r1 killed mid-turn; the client saw %s" % grpc_code(res.get("e")))
        check(ledger_turns(pg, sid, "kill-1") == 0, "the killed replica's turn must not be committed")
        who, (ids, _, s), tries = retry_send(cl, ["r2", "r0"], sid, 60, text=" and so the story went on",
                                             max_tokens=long_n, model="qwen3-b", request_id="kill-1")
        took = time.time() - t_kill
        turn_s = retry_send.last_attempt_s
        check(s.n_generated == long_n and s.turn == t0, "the retried turn: %s" % s)
        check(ledger_turns(pg, sid, "kill-1") == 1, "exactly one copy of the retried turn")
        n1, t1 = consistent(pg, sid)
        check(t1 == t0 + 1 and n1 == n0 + s.user_tokens + long_n, "ledger after the retry")
        # the lease time, plus the turn itself, plus the client's retry pacing (one wait + sleep)
        bound = LEASE_MS / 1000.0 + turn_s + WAIT_MS / 1000.0 + 0.5
        check(took <= bound, "retry completed %.2f s after the kill, bound %.2f s" % (took, bound))
        print("  ok: kill -9 of r1 mid-turn: the retry completed on %s after %d tries, %.2f s after the "
              "kill (<= lease %.1f s + the turn %.2f s + one retry wait); one copy in the ledger" % (
                  who, tries, took, LEASE_MS / 1000.0, turn_s))
        m = fleet.replica_metrics(who)
        check(metric(m, "kvlingo_router_lease_takeovers_total") == 1, "%s counted the takeover" % who)
        # a second retry of the same request: the stored result, not a new turn
        other = "r0" if who == "r2" else "r2"
        ids2, _, s2 = cl(other).send_all(sid, text=" and so the story went on", max_tokens=long_n,
                                         model="qwen3-b", request_id="kill-1")
        check(ids2 == ids and s2.turn == s.turn and s2.policy_reason.startswith("replayed"),
              "the replay: turn %d, %d tokens, %r" % (s2.turn, len(ids2), s2.policy_reason))
        check(consistent(pg, sid) == (n1, t1), "a replay adds nothing")
        check(metric(fleet.replica_metrics(other), "kvlingo_router_turns_replayed_total") == 1, "replay counted")
        # the same id with other input is refused
        try:
            cl(other).send_all(sid, text="something else", max_tokens=4, request_id="kill-1")
            check(False, "reuse of a request id with other input must fail")
        except AssertionError:
            raise
        except Exception as e:  # noqa: BLE001
            check(grpc_code(e) == "INVALID_ARGUMENT", "reused request id: %s" % grpc_code(e))
        print("  ok: a second retry on %s answered the stored turn (%d tokens); no second copy" % (
            other, len(ids2)))
        fleet.restart_replica("r1")
        clients.pop("r1", None)

        # -- 3. concurrent turns on one session through two replicas -------------------------
        sid2 = cl("r0").create_session()
        cl("r0").send_all(sid2, "Once upon a time", max_tokens=4, request_id="c0")
        first.clear()
        res = {}

        def long_turn2():
            try:
                for piece, summary in cl("r0").send(sid2, text=" there was", max_tokens=long_n,
                                                     model="qwen3-b", request_id="c1"):
                    first.set()
                res["done"] = summary
            except Exception as e:  # noqa: BLE001
                res["e"] = e
                first.set()

        th = threading.Thread(target=long_turn2)
        th.start()
        check(first.wait(30), "no token")
        t_c = time.time()
        try:
            cl("r2").send_all(sid2, " meanwhile", max_tokens=4, request_id="c2")
            conflict = None
        except Exception as e:  # noqa: BLE001
            conflict = e
        waited = time.time() - t_c
        still = th.is_alive()
        th.join(60)
        check("done" in res, "the first turn must complete: %s" % res.get("e"))
        check(conflict is not None and grpc_code(conflict) == "ABORTED",
              "the second turn must be ABORTED, got %s (first still running: %s)" % (
                  grpc_code(conflict) if conflict else "success", still))
        check("r0" in conflict.details() and "is busy" in conflict.details(), conflict.details())
        n2, t2 = consistent(pg, sid2)
        check(t2 == 2 and ledger_turns(pg, sid2, "c2") == 0, "only the first turn is in the ledger")
        check(n2 == res["done"].context_tokens, "ledger length = the turn's context")
        print("  ok: concurrent turns via r0 and r2: r2 answered ABORTED after %.2f s (%s); ledger %d "
              "tokens, 2 turns" % (waited, conflict.details()[:70], n2))
        check(metric(fleet.replica_metrics("r2"), "kvlingo_router_lease_conflicts_total") >= 1, "conflict counted")
        # the lease was released: r2 drives the session now, at once
        _, _, s3 = cl("r2").send_all(sid2, " meanwhile", max_tokens=4, request_id="c2")
        check(s3.turn == 2, "r2 continues after the release")

        # -- 4. PostgreSQL restarted mid-run ------------------------------------------------
        pg.stop()
        codes = []
        for rep in ("r0", "r1", "r2"):
            try:
                cl(rep).send_all(sid2, " while the database is away", max_tokens=4, request_id="pgdown-" + rep)
                codes.append("OK")
            except Exception as e:  # noqa: BLE001
                codes.append(grpc_code(e))
        check(all(c == "UNAVAILABLE" for c in codes), "turns while PostgreSQL is down: %s" % codes)
        pg.start()
        done = []
        for rep in ("r0", "r1", "r2"):
            who, (_, _, s), tries = retry_send(cl, [rep], sid2, 30, text=" it came back", max_tokens=4,
                                               request_id="pgup-" + rep)
            done.append((rep, tries))
        n3, t3 = consistent(pg, sid2)
        check(t3 == 6, "three turns after the restart, none of the failed ones: %d turns" % t3)
        print("  ok: PostgreSQL down: %s; back: every replica answers again (tries %s)" % (codes, done))

        # -- 5. metrics of a replica -----------------------------------------------------------
        m = fleet.replica_metrics("r2")
        for series in ("kvlingo_router_leases_held 0", 'kvlingo_router_replica_info{replica="r2",backend="postgresql"} 1',
                       'kvlingo_router_ledger_seconds_bucket{backend="postgresql",op="commit"',
                       "kvlingo_router_lease_takeovers_total", "kvlingo_router_turns_replayed_total"):
            check(series in m, "r2 metrics lack %s" % series)
        print("  ok: replica metrics")
    finally:
        fleet.stop()
        pg.stop(True)
    print("router_replicas: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
