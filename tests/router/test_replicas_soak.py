"""tests/router/test_replicas_soak.py: three router replicas on one PostgreSQL ledger (a server
started here), N sessions with switches (default 64) driven for S seconds (default 120) while
one replica is killed (kill -9) and restarted every K seconds (default 20).  Clients retry a
failed turn (UNAVAILABLE, ABORTED) on the next replica with the same request id, as the
README tells gRPC clients to.  Passes when no turn is lost or applied twice: the request ids
in the ledger are exactly the turns the clients saw complete, each once, every session's
turns are numbered 0..n-1 and its chunks tile its context.  CTest label heavy.
usage: test_replicas_soak.py --build B --work W [--sessions 64] [--seconds 120] [--kill-every 20]"""
import argparse
import os
import random
import shutil
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pgtest  # noqa: E402
import rtest  # noqa: E402
from rtest import check  # noqa: E402
from test_replicas import consistent, grpc_code  # noqa: E402

NAMES = ("r0", "r1", "r2")
# a worker's session is left for a new one past this many tokens: the nodes hold 4,096 a session,
# and a quiet 2-core machine runs 230+ turns of ~16 tokens on one session in the soak's 2 minutes
CONTEXT_CAP = 3500


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--kill-every", type=float, default=20)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    try:
        pg = pgtest.Postgres()
    except pgtest.Missing as e:
        print("skipped: %s" % e)
        return 77
    pg.start()
    extra = {"replica_id": "r0", "lease_ms": 2000, "lease_wait_ms": 1000}
    fleet = rtest.Fleet(a.build, a.work, ledger=pg.uri, extra_top=extra,
                        policy={"name": "cascade", "models": ["qwen3-a", "qwen3-b"],
                                "entropy_threshold": 100, "calm_turns": 1},
                        guardrail={"shadow_fraction": 0.05, "kl_budget": 100},
                        kvld_args=("--max-sessions", "512"))
    lock = threading.Lock()
    stats = {"turns": 0, "retries": 0, "replays": 0, "switches": 0, "errors": [], "kills": 0}
    done = {}          # sid -> [request ids completed, in order]
    stop_at = [0.0]
    text = rtest.corpus_text(0, 20000)
    try:
        fleet.replicas["r0"] = {"proc": fleet.router, "addr": fleet.addr, "metrics_port": fleet.metrics_port,
                                "config": fleet.config, "port": fleet.router_port, "name": "r0"}
        fleet.add_replica("r1")
        fleet.add_replica("r2")
        stop_at[0] = time.time() + a.seconds

        def open_session(w, clients, name):
            for _ in range(100):
                try:
                    return clients[NAMES[w % 3]].create_session(session_id=name)
                except Exception as e:  # noqa: BLE001
                    if grpc_code(e) == "ALREADY_EXISTS":   # created before a lost answer
                        return name
                    time.sleep(0.2)
            return None

        def worker(w):
            rnd = random.Random(w)
            clients = {n: fleet.replica_client(n, timeout=30) for n in NAMES}
            k = 0          # the worker's session: a full one (CONTEXT_CAP) is followed by a new one
            sid = open_session(w, clients, "soak-%d" % w)
            if sid is None:
                with lock:
                    stats["errors"].append("worker %d: no session" % w)
                return
            with lock:
                done[sid] = []
            t = 0
            ctx = 0
            while time.time() < stop_at[0]:
                if ctx > CONTEXT_CAP:
                    k += 1
                    sid = open_session(w, clients, "soak-%d-%d" % (w, k))
                    if sid is None:
                        with lock:
                            stats["errors"].append("worker %d: no session %d" % (w, k))
                        return
                    with lock:
                        done[sid] = []
                    t, ctx = 0, 0
                rid = "w%d-s%d-t%d" % (w, k, t)
                off = (w * 997 + t * 131) % 19000
                start = rnd.randrange(3)
                t_first = time.time()
                tries = 0
                while True:
                    name = NAMES[(start + tries) % 3]
                    tries += 1
                    try:
                        ids, _, s = clients[name].send_all(sid, text[off:off + (200 if t == 0 else 40)],
                                                           max_tokens=4, escalate=(t % 2 == 1),
                                                           request_id=rid)
                        break
                    except Exception as e:  # noqa: BLE001
                        code = grpc_code(e)
                        if code not in ("UNAVAILABLE", "ABORTED", "DEADLINE_EXCEEDED") or \
                                time.time() - t_first > 90:
                            with lock:
                                stats["errors"].append("worker %d turn %d on %s: %s %s" % (
                                    w, t, name, code, getattr(e, "details", lambda: "")()))
                            return
                        time.sleep(0.05 * min(tries, 10))
                if s.turn != t or s.context_tokens != ctx + s.user_tokens + len(ids):
                    with lock:
                        stats["errors"].append("worker %d turn %d: summary turn %d ctx %d (had %d)" % (
                            w, t, s.turn, s.context_tokens, ctx))
                    return
                ctx = s.context_tokens
                with lock:
                    done[sid].append(rid)
                    stats["turns"] += 1
                    stats["retries"] += tries - 1
                    stats["replays"] += s.policy_reason.startswith("replayed")
                    stats["switches"] += bool(s.from_model)
                t += 1

        def killer():
            k = 0
            while time.time() + a.kill_every < stop_at[0] + 1:
                time.sleep(a.kill_every)
                if time.time() >= stop_at[0]:
                    break
                name = NAMES[k % 3]
                k += 1
                fleet.replicas[name]["proc"].kill9()
                with lock:
                    stats["kills"] += 1
                time.sleep(1.0)
                fleet.restart_replica(name)

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(a.sessions)]
        kt = threading.Thread(target=killer)
        t0 = time.time()
        for th in threads:
            th.start()
        kt.start()
        for th in threads:
            th.join(a.seconds + 200)
        kt.join(60)
        wall = time.time() - t0
        print("replica soak: %d sessions, %.0f s, %d replicas killed and restarted: %d turns (%.1f/s), "
              "%d switches, %d client retries, %d answered from the ledger, %d errors" % (
                  a.sessions, wall, stats["kills"], stats["turns"], stats["turns"] / wall, stats["switches"],
                  stats["retries"], stats["replays"], len(stats["errors"])))
        for e in stats["errors"][:5]:
            print("  " + e)
        check(not stats["errors"], "%d sessions failed" % len(stats["errors"]))
        check(stats["kills"] >= max(1, int(a.seconds / a.kill_every) - 1), "too few kills")
        # the ledger: every completed turn exactly once, nothing else
        lost = dup = extra_rows = 0
        for sid, rids in done.items():
            rows = pg.psql("SELECT request_id, idx FROM turns WHERE session='%s' ORDER BY idx" % sid).split("\n")
            got = [r.split("\t") for r in rows if r.strip()]
            ledger_ids = [g[0] for g in got]
            idxs = [int(g[1]) for g in got]
            check(idxs == list(range(len(idxs))), "session %s: turn indices %s" % (sid, idxs[:10]))
            lost += len(set(rids) - set(ledger_ids))
            dup += len(ledger_ids) - len(set(ledger_ids))
            extra_rows += len(set(ledger_ids) - set(rids))
            n_tokens, n_turns = consistent(pg, sid)
            check(n_turns == len(rids), "session %s: %d turns in the ledger, %d completed" % (sid, n_turns, len(rids)))
        print("  ledger: %d turns lost, %d applied twice, %d not seen by a client" % (lost, dup, extra_rows))
        check(lost == 0 and dup == 0 and extra_rows == 0, "lost or duplicated turns")
        check(stats["switches"] > a.sessions, "too few switches")
        print("test_replicas_soak: PASS")
    finally:
        fleet.stop()
        pg.stop(True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
