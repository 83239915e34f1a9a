/* router/lease.c: the lease table and its keeper thread (see lease.h). */
#include "lease.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "log.h"

typedef struct held {
    char id[KVR_ID_MAX];
    int64_t gen;
    int lost;
    char why[200];             /* the keeper's copy: the failed renewal's message             */
} held;

struct kvr_leases {
    kvr_ledger *ledger;
    char owner[KVR_NAME_MAX];
    double ttl_s;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int started, stop;
    held *tab;
    held *snap;                /* the keeper's copy of tab, renewed outside the lock          */
    int n, max;
    long renew_failures;
};

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *keeper(void *arg) {
    kvr_leases *k = arg;
    held *snap = k->snap;
    pthread_mutex_lock(&k->mu);
    while (!k->stop) {
        struct timespec until;   /* on the monotonic clock (the cv's): a wall-clock step back
                                  * must not stop the renewals for as long as it stepped */
        clock_gettime(CLOCK_MONOTONIC, &until);
        double period = k->ttl_s / 3.0;
        long ns = until.tv_nsec + (long)((period - (long)period) * 1e9);
        until.tv_sec += (time_t)period + ns / 1000000000L;
        until.tv_nsec = ns % 1000000000L;
        while (!k->stop && pthread_cond_timedwait(&k->cv, &k->mu, &until) != ETIMEDOUT) {}
        if (k->stop) break;
        int n = 0;
        for (int i = 0; i < k->n; i++) if (!k->tab[i].lost && k->tab[i].gen > 0) snap[n++] = k->tab[i];
        pthread_mutex_unlock(&k->mu);
        /* renewals outside the lock: a slow ledger must not stall the turns registering */
        for (int i = 0; i < n; i++) {
            kvl_status s = kvr_ledger_lease_renew(k->ledger, snap[i].id, k->owner, snap[i].gen,
                                                  wall_now(), k->ttl_s);
            snap[i].lost = s == KVL_ERR_MISMATCH ? 1 : s ? -1 : 0;
            if (s) snprintf(snap[i].why, sizeof snap[i].why, "%s", kvl_last_error());
        }
        pthread_mutex_lock(&k->mu);
        for (int i = 0; i < n; i++) {
            if (!snap[i].lost) continue;
            /* a turn that ended (and released) while the renewal was on its way is no failure */
            held *h = NULL;
            for (int j = 0; j < k->n && !h; j++)
                if (!strcmp(k->tab[j].id, snap[i].id) && k->tab[j].gen == snap[i].gen) h = &k->tab[j];
            if (!h) continue;
            k->renew_failures++;
            kvl__svc_log_text("warn", "session %s: lease renewal failed: %s", snap[i].id, snap[i].why);
            if (snap[i].lost > 0) h->lost = 1;   /* < 0: the ledger is away, try again next period */
        }
    }
    pthread_mutex_unlock(&k->mu);
    return NULL;
}

kvl_status kvr_leases_create(kvr_ledger *ledger, const char *owner, double ttl_s, int max,
                             kvr_leases **out) {
    *out = NULL;
    if (!owner || !owner[0] || strlen(owner) >= KVR_NAME_MAX || !(ttl_s > 0) || max < 1)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "leases: owner '%s', %g s, %d sessions", owner ? owner : "",
                          ttl_s, max);
    kvr_leases *k = calloc(1, sizeof *k);
    if (!k) return kvl__errorf(KVL_ERR_NOMEM, "leases: out of memory");
    k->tab = calloc((size_t)max, sizeof *k->tab);
    k->snap = calloc((size_t)max, sizeof *k->snap);
    if (!k->tab || !k->snap) {
        free(k->tab);
        free(k->snap);
        free(k);
        return kvl__errorf(KVL_ERR_NOMEM, "leases: out of memory");
    }
    k->ledger = ledger;
    k->ttl_s = ttl_s;
    k->max = max;
    snprintf(k->owner, sizeof k->owner, "%s", owner);
    pthread_mutex_init(&k->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&k->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&k->thread, NULL, keeper, k)) {
        kvr_leases_free(k);
        return kvl__errorf(KVL_ERR_INTERNAL, "leases: cannot start the keeper thread");
    }
    k->started = 1;
    *out = k;
    return KVL_OK;
}

void kvr_leases_free(kvr_leases *k) {
    if (!k) return;
    pthread_mutex_lock(&k->mu);
    k->stop = 1;
    pthread_cond_broadcast(&k->cv);
    pthread_mutex_unlock(&k->mu);
    if (k->started) pthread_join(k->thread, NULL);
    for (int i = 0; i < k->n; i++)
        if (!k->tab[i].lost && k->tab[i].gen > 0) kvr_ledger_lease_release(k->ledger, k->tab[i].id, k->owner, k->tab[i].gen);
    pthread_cond_destroy(&k->cv);
    pthread_mutex_destroy(&k->mu);
    free(k->tab);
    free(k->snap);
    free(k);
}

kvl_status kvr_leases_add(kvr_leases *k, const char *id) {
    pthread_mutex_lock(&k->mu);
    kvl_status s = KVL_OK;
    for (int i = 0; i < k->n && !s; i++)
        if (!strcmp(k->tab[i].id, id))
            s = kvl__errorf(KVL_ERR_MISMATCH, "session '%s' is busy: a turn is running on this replica", id);
    if (!s && k->n >= k->max) s = kvl__errorf(KVL_ERR_NOMEM, "leases: %d sessions held (max_busy_sessions)", k->n);
    if (!s) {
        held *h = &k->tab[k->n++];
        snprintf(h->id, sizeof h->id, "%s", id);
        h->gen = 0;
        h->lost = 0;
    }
    pthread_mutex_unlock(&k->mu);
    return s;
}

void kvr_leases_bind(kvr_leases *k, const char *id, int64_t gen) {
    pthread_mutex_lock(&k->mu);
    for (int i = 0; i < k->n; i++)
        if (!strcmp(k->tab[i].id, id)) k->tab[i].gen = gen;
    pthread_mutex_unlock(&k->mu);
}

int kvr_leases_drop(kvr_leases *k, const char *id) {
    int lost = 0, found = 0;
    int64_t gen = 0;
    pthread_mutex_lock(&k->mu);
    for (int i = 0; i < k->n; i++)
        if (!strcmp(k->tab[i].id, id)) {
            lost = k->tab[i].lost > 0;
            gen = k->tab[i].gen;
            k->tab[i] = k->tab[--k->n];
            found = 1;
            break;
        }
    pthread_mutex_unlock(&k->mu);
    if (found && !lost && gen > 0 && kvr_ledger_lease_release(k->ledger, id, k->owner, gen))
        kvl__svc_log_text("warn", "session %s: lease release failed (it expires by itself): %s", id,
                          kvl_last_error());
    return lost;
}

int kvr_leases_held(kvr_leases *k) {
    pthread_mutex_lock(&k->mu);
    int n = k->n;
    pthread_mutex_unlock(&k->mu);
    return n;
}

long kvr_leases_renew_failures(kvr_leases *k) {
    pthread_mutex_lock(&k->mu);
    long n = k->renew_failures;
    pthread_mutex_unlock(&k->mu);
    return n;
}

const char *kvr_leases_owner(const kvr_leases *k) { return k->owner; }
double kvr_leases_ttl(const kvr_leases *k) { return k->ttl_s; }
