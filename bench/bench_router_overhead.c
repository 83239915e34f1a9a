/* bench/bench_router_overhead.c: the router's own work per turn, without the nodes: take the
 * session's lease, look its request id up, load the session with its tokens, let the policy
 * choose (cascade over two models) and observe, commit the turn fenced by the lease, release.
 * That is every ledger and policy step of kvr_turn_run (router/turn_once.c, router/turn.c),
 * in the same order, on the real ledger code; the node calls are what is left out.
 *
 *   bench_router_overhead --ledger CONN [--replicas R] [--sessions S] [--turns N]
 *
 * R replicas run at once, each with its own ledger connection and lease name (as R router
 * processes would), each driving S sessions for N turns of 20 input + 16 generated tokens.
 * Prints one table row: backend, replicas, turns, turns/s, p50 / p99 / max per turn, load. */
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lease.h"
#include "ledger.h"
#include "policy.h"

#define N_USER 20
#define N_GEN 16

typedef struct worker {
    const char *conn;
    int id, sessions, turns;
    double *lat;               /* [sessions * turns] seconds */
    int n_lat, failed;
    char err[256];
    kvr_config *cfg;
} worker;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const char *k_fleet =
    "listen: 127.0.0.1:0\n"
    "tokenizer: models/qwen3-a\n"
    "nodes:\n"
    "  - {name: a0, address: 127.0.0.1:1, model: qwen3-a}\n"
    "  - {name: b0, address: 127.0.0.1:2, model: qwen3-b}\n"
    "policy: {name: cascade, models: [qwen3-a, qwen3-b], entropy_threshold: 3.0, calm_turns: 2}\n";

static int fail(worker *w, const char *what) {
    snprintf(w->err, sizeof w->err, "%s: %s", what, kvl_last_error());
    w->failed = 1;
    return -1;
}

static int one_turn(worker *w, kvr_ledger *l, kvr_leases *k, kvr_policy *pol, const char *sid,
                    int turn, int32_t *buf) {
    char rid[40];
    snprintf(rid, sizeof rid, "q-%d", turn);
    if (kvr_leases_add(k, sid)) return fail(w, "reserve");
    kvr_lease le;
    if (kvr_ledger_lease_acquire(l, sid, kvr_leases_owner(k), wall_s(), 10.0, &le)) {
        kvr_leases_drop(k, sid);
        return fail(w, "lease");
    }
    kvr_leases_bind(k, sid, le.gen);
    kvr_turn_found f;
    kvl_status s = kvr_ledger_turn_find(l, sid, rid, &f);
    if (s != KVL_ERR_NOT_FOUND) { kvr_turn_found_clear(&f); kvr_leases_drop(k, sid); return fail(w, "find"); }
    kvr_session ses;
    if (kvr_ledger_session_load(l, sid, 1, &ses)) { kvr_leases_drop(k, sid); return fail(w, "load"); }
    static const char *names[2] = {"a0", "b0"}, *models[2] = {"qwen3-a", "qwen3-b"};
    kvr_node_view v[2];
    int cur = -1;
    for (int i = 0; i < 2; i++) {
        v[i] = (kvr_node_view){.name = names[i], .model = models[i], .healthy = 1, .load = 0,
                               .held = kvr_session_held(&ses, names[i]), .can_translate = 1,
                               .prefill_tps = 5000, .decode_tps = 800, .translate_tps = 20000};
        if (!strcmp(ses.current_node, names[i])) cur = i;
    }
    kvr_policy_input in = {.nodes = v, .n_nodes = 2, .current = cur, .n_context = ses.n_tokens,
                           .n_user = N_USER, .max_tokens = N_GEN, .requested_model = "",
                           .session_model = ses.model, .escalate = turn % 3 == 2,
                           .state = {.level = ses.pol_level, .calm = ses.pol_calm}};
    kvr_policy_decision d;
    if (kvr_policy_choose(pol, &in, &d)) { kvr_session_clear(&ses); kvr_leases_drop(k, sid); return fail(w, "choose"); }
    kvr_turn_outcome oc = {.node = d.node, .mean_entropy = 2.0 + (turn % 4), .entropy_valid = 1};
    kvr_policy_state ps = d.state;
    kvr_policy_observe(pol, &in, &oc, &ps);
    for (int i = 0; i < N_USER + N_GEN; i++) buf[i] = (turn * 37 + i) % 4000;
    kvr_holding h[2];
    int nh = 0;
    for (int i = 0; i < ses.n_holdings && nh < 1; i++)
        if (strcmp(ses.holdings[i].node, names[d.node])) h[nh++] = ses.holdings[i];
    snprintf(h[nh].node, sizeof h[nh].node, "%s", names[d.node]);
    h[nh++].n_tokens = ses.n_tokens + N_USER + N_GEN;
    kvr_fence fence = {.owner = kvr_leases_owner(k), .gen = le.gen, .request_id = rid};
    kvr_turn_rec tr = {.idx = ses.n_turns, .node = names[d.node], .model = models[d.node],
                       .mode = cur >= 0 && cur != d.node ? "translate" : "none", .fallback = "",
                       .t0 = ses.n_tokens, .n_user = N_USER, .n_gen = N_GEN, .span = N_USER,
                       .ttft_s = 0.01, .tps = 800, .entropy = oc.mean_entropy, .finish = "length",
                       .fence = &fence};
    s = kvr_ledger_turn_commit(l, sid, buf, ses.n_tokens, N_USER + N_GEN, &tr, names[d.node], ps.level,
                               ps.calm, h, nh, wall_s());
    kvr_session_clear(&ses);
    kvr_leases_drop(k, sid);
    return s ? fail(w, "commit") : 0;
}

static void *run(void *arg) {
    worker *w = arg;
    kvr_ledger *l = NULL;
    kvr_leases *k = NULL;
    kvr_policy *pol = NULL;
    int32_t buf[N_USER + N_GEN];
    char owner[32];
    snprintf(owner, sizeof owner, "bench-r%d", w->id);
    if (kvr_ledger_open(w->conn, &l)) { fail(w, "open"); return NULL; }
    if (kvr_leases_create(l, owner, 10.0, 16, &k)) { fail(w, "leases"); kvr_ledger_free(l); return NULL; }
    if (kvr_policy_create(w->cfg, &pol)) { fail(w, "policy"); goto out; }
    char (*sids)[KVR_ID_MAX] = calloc((size_t)w->sessions, KVR_ID_MAX);
    if (!sids) { snprintf(w->err, sizeof w->err, "out of memory"); w->failed = 1; goto out; }
    for (int i = 0; i < w->sessions; i++) {
        snprintf(sids[i], KVR_ID_MAX, "b-%ld-%d-%d-%d", (long)time(NULL), (int)getpid(), w->id, i);
        if (kvr_ledger_session_create(l, sids[i], "", wall_s())) { fail(w, "create"); free(sids); goto out; }
    }
    /* round robin over the sessions, as a replica serving many clients would */
    for (int t = 0; t < w->turns && !w->failed; t++)
        for (int i = 0; i < w->sessions && !w->failed; i++) {
            double t0 = now_s();
            if (one_turn(w, l, k, pol, sids[i], t, buf)) break;
            w->lat[w->n_lat++] = now_s() - t0;
        }
    for (int i = 0; i < w->sessions; i++) kvr_ledger_session_end(l, sids[i], KVR_SESSION_CLOSED, wall_s());
    free(sids);
out:
    kvr_policy_free(pol);
    kvr_leases_free(k);
    kvr_ledger_free(l);
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const char *conn = NULL;
    int replicas = 1, sessions = 16, turns = 20, header = 1;
    static const struct option opts[] = {{"ledger", required_argument, NULL, 'l'},
                                         {"replicas", required_argument, NULL, 'r'},
                                         {"sessions", required_argument, NULL, 's'},
                                         {"turns", required_argument, NULL, 't'},
                                         {"no-header", no_argument, NULL, 'n'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'l': conn = optarg; break;
        case 'r': replicas = atoi(optarg); break;
        case 's': sessions = atoi(optarg); break;
        case 't': turns = atoi(optarg); break;
        case 'n': header = 0; break;
        case 'h':
            printf("usage: bench_router_overhead --ledger CONN [--replicas R] [--sessions S] [--turns N] "
                   "[--no-header]\n");
            return 0;
        default: return 2;
        }
    }
    if (!conn || replicas < 1 || replicas > 64 || sessions < 1 || sessions > 10000 || turns < 1 ||
        turns > 100000) {
        fprintf(stderr, "bench_router_overhead: --ledger CONN is required; 1-64 replicas, 1-10000 "
                        "sessions, 1-100000 turns\n");
        return 2;
    }
    worker *w = calloc((size_t)replicas, sizeof *w);
    pthread_t *th = calloc((size_t)replicas, sizeof *th);
    if (!w || !th) { fprintf(stderr, "out of memory\n"); return 1; }
    kvr_config *cfg = NULL;
    if (kvr_config_parse(k_fleet, strlen(k_fleet), "bench-fleet.yaml", &cfg) || kvr_policy_check(cfg)) {
        fprintf(stderr, "bench_router_overhead: %s\n", kvl_last_error());
        return 1;
    }
    /* one schema migration before the replicas race to open */
    kvr_ledger *l0 = NULL;
    if (kvr_ledger_open(conn, &l0)) { fprintf(stderr, "bench_router_overhead: %s\n", kvl_last_error()); return 1; }
    char backend[32];
    snprintf(backend, sizeof backend, "%s", kvr_ledger_backend(l0));
    kvr_ledger_free(l0);
    for (int i = 0; i < replicas; i++) {
        w[i] = (worker){.conn = conn, .id = i, .sessions = sessions, .turns = turns, .cfg = cfg};
        w[i].lat = malloc(sizeof(double) * (size_t)sessions * (size_t)turns);
        if (!w[i].lat) { fprintf(stderr, "out of memory\n"); return 1; }
    }
    double t0 = now_s();
    for (int i = 0; i < replicas; i++) pthread_create(&th[i], NULL, run, &w[i]);
    for (int i = 0; i < replicas; i++) pthread_join(th[i], NULL);
    double wall = now_s() - t0;
    int n = 0, bad = 0;
    for (int i = 0; i < replicas; i++) {
        n += w[i].n_lat;
        if (w[i].failed) { fprintf(stderr, "replica %d: %s\n", i, w[i].err); bad = 1; }
    }
    double *all = malloc(sizeof(double) * (size_t)(n ? n : 1));
    if (!all) return 1;
    int o = 0;
    for (int i = 0; i < replicas; i++) {
        memcpy(all + o, w[i].lat, sizeof(double) * (size_t)w[i].n_lat);
        o += w[i].n_lat;
        free(w[i].lat);
    }
    qsort(all, (size_t)n, sizeof *all, cmp);
    double la[3] = {0};
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf %lf %lf", &la[0], &la[1], &la[2]) != 3) la[0] = la[1] = la[2] = 0;
        fclose(f);
    }
    if (header)
        printf("| ledger | replicas | sessions | turns | turns/s | p50 ms/turn | p99 ms/turn | max ms | load (1/5/15 min) |\n"
               "|---|---|---|---|---|---|---|---|---|\n");
    if (n)
        printf("| %s | %d | %d | %d | %.0f | %.3f | %.3f | %.2f | %.2f %.2f %.2f |\n", backend, replicas,
               sessions * replicas, n, n / wall, all[n / 2] * 1e3, all[(int)(n * 0.99)] * 1e3,
               all[n - 1] * 1e3, la[0], la[1], la[2]);
    free(all);
    free(w);
    free(th);
    kvr_config_free(cfg);
    return bad;
}
