/* router/tenants.c: the key file (YAML, service/yamlcfg.h), SHA-256 key lookup in constant
 * time, token buckets (see tenants.h). */
#include "tenants.h"

#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "error.h"
#include "yamlcfg.h"

typedef struct tenant {
    kvr_tenant_info info;
    kvr_bucket bucket;
    long running;                 /* turns running (kvr_tenants_turn_begin .. _end)          */
} tenant;

typedef struct keyent {
    uint8_t digest[32];
    int tenant;
} keyent;

struct kvr_tenants {
    pthread_mutex_t mu;
    int open;
    tenant *tn;
    int n;
    keyent *keys;
    int n_keys;
};

/* ---- token bucket --------------------------------------------------------------------------- */

static void refill(kvr_bucket *b, double now) {
    if (now > b->t) {
        b->level += (now - b->t) * b->cap / 60.0;
        if (b->level > b->cap) b->level = b->cap;
    }
    /* a clock that went back does not refill, and does not move t back either */
    if (now > b->t) b->t = now;
}

void kvr_bucket_init(kvr_bucket *b, double per_minute, double now) {
    b->cap = per_minute > 0 ? per_minute : 0;
    b->level = b->cap;
    b->t = now;
}

int kvr_bucket_admit(kvr_bucket *b, double now) {
    refill(b, now);
    return b->level >= 1.0;
}

void kvr_bucket_charge(kvr_bucket *b, double n, double now) {
    refill(b, now);
    b->level -= n;   /* n < 0: the unused part of a reservation comes back */
    /* debt is kept, never forgiven (that would let big or concurrent turns use several times
     * the quota); it is bounded by one turn's reservation, since a turn starts only with a
     * token in the bucket */
    if (b->level > b->cap) b->level = b->cap;
}

double kvr_bucket_wait(const kvr_bucket *b, double now) {
    kvr_bucket c = *b;
    refill(&c, now);
    if (c.level >= 1.0 || c.cap <= 0) return 0;
    return (1.0 - c.level) * 60.0 / c.cap;
}

/* ---- SHA-256 ---------------------------------------------------------------------------------- */

static int sha256(const void *data, size_t len, uint8_t out[32]) {
    unsigned int n = 0;
    return EVP_Digest(data, len, out, &n, EVP_sha256(), NULL) == 1 && n == 32 ? 0 : -1;
}

void kvr_sha256_hex(const void *data, size_t len, char out[65]) {
    uint8_t d[32];
    if (sha256(data, len, d)) { out[0] = 0; return; }
    for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static int hexval(int c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* ---- the file --------------------------------------------------------------------------------- */

static kvr_tenants *alloc_table(void) {
    kvr_tenants *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    if (pthread_mutex_init(&t->mu, NULL)) { free(t); return NULL; }
    return t;
}

void kvr_tenants_free(kvr_tenants *t) {
    if (!t) return;
    pthread_mutex_destroy(&t->mu);
    free(t->tn);
    free(t->keys);
    free(t);
}

static int name_ok(const char *s) {
    size_t n = strlen(s);
    if (n < 1 || n >= KVR_TENANT_NAME_MAX) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '.' && s[i] != '_' && s[i] != '-') return 0;
    return 1;
}

/* Add one digest for tenant ti, refusing one already in the table. */
static kvl_status add_digest(kvr_tenants *t, const uint8_t d[32], int ti, const char *file, int line,
                             const char *field, int idx) {
    for (int k = 0; k < t->n_keys; k++)
        if (!memcmp(t->keys[k].digest, d, 32))
            return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s' [%d]: this key is given twice (also for "
                              "tenant '%s')", file, line, field, idx, t->tn[t->keys[k].tenant].info.name);
    if (t->n_keys >= KVR_TENANT_KEYS_MAX)
        return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s': more than %d keys in the file", file, line,
                          field, KVR_TENANT_KEYS_MAX);
    memcpy(t->keys[t->n_keys].digest, d, 32);
    t->keys[t->n_keys].tenant = ti;
    t->n_keys++;
    return KVL_OK;
}

/* `v`: keys joined with ',' (service/yamlcfg.h flattens a list so); raw (hashed here) or hex. */
static kvl_status add_keys(kvr_tenants *t, const char *v, int hex, int ti, const char *file, int line,
                           const char *field) {
    int idx = 0;
    const char *p = v;
    while (1) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        uint8_t d[32];
        if (hex) {
            if (n != 64)
                return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s' [%d]: %zu characters, a SHA-256 digest is "
                                  "64 hex digits", file, line, field, idx, n);
            for (size_t i = 0; i < 32; i++) {
                int a = hexval((unsigned char)p[2 * i]), b = hexval((unsigned char)p[2 * i + 1]);
                if (a < 0 || b < 0)
                    return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s' [%d]: '%c%c' is not hex", file, line,
                                      field, idx, p[2 * i], p[2 * i + 1]);
                d[i] = (uint8_t)(a * 16 + b);
            }
        } else {
            if (n < KVR_KEY_MIN || n > KVR_KEY_MAX)
                return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s' [%d]: %zu characters, a key has %d-%d "
                                  "(printable ASCII, no spaces or commas)", file, line, field, idx, n,
                                  KVR_KEY_MIN, KVR_KEY_MAX);
            for (size_t i = 0; i < n; i++)
                if ((unsigned char)p[i] <= ' ' || (unsigned char)p[i] >= 127)
                    return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s' [%d]: character %zu is %s (a key is "
                                      "printable ASCII without spaces or commas)", file, line, field, idx, i,
                                      p[i] == ' ' ? "a space" : (unsigned char)p[i] < ' ' ? "a control character"
                                                                                      : "not ASCII");
            if (sha256(p, n, d)) return kvl__errorf(KVL_ERR_INTERNAL, "%s: SHA-256 failed", file);
        }
        kvl_status s = add_digest(t, d, ti, file, line, field, idx);
        if (s) return s;
        idx++;
        if (!e) break;
        p = e + 1;
    }
    return KVL_OK;
}

static kvl_status parse_tenant(kvl__svc_yaml *y, kvr_tenants *t, yaml_node_t *m, int i) {
    char sect[32], field[48];
    snprintf(sect, sizeof sect, "tenants[%d]", i);
    kvl__svc_kvlist l;
    kvl_status s = kvl__svc_yaml_map_to_list(y, m, sect, &l);
    tenant *tn = &t->tn[t->n];
    memset(tn, 0, sizeof *tn);
    const char *name = s ? NULL : kvl__svc_kv_str(&l, "name", NULL);
    if (!s && !name)
        s = kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s.name' is required", y->file, l.line, sect);
    if (!s && !name_ok(name))
        s = kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s.name': '%.80s' must be 1-%d of [A-Za-z0-9._-]",
                       y->file, kvl__svc_kv_line(&l, "name"), sect, name, KVR_TENANT_NAME_MAX - 1);
    /* "default" owns the sessions of anonymous clients (insecure) and of ledgers from before
     * tenants: a key for it would open all of those to whoever holds it */
    if (!s && !strcmp(name, KVR_DEFAULT_TENANT))
        s = kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s.name': '%s' is reserved (the tenant of anonymous "
                       "clients and of sessions from before tenants); name the tenant otherwise", y->file,
                       kvl__svc_kv_line(&l, "name"), sect, name);
    for (int j = 0; !s && j < t->n; j++)
        if (!strcmp(t->tn[j].info.name, name))
            s = kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s.name': tenant '%s' named twice", y->file,
                           kvl__svc_kv_line(&l, "name"), sect, name);
    if (!s) snprintf(tn->info.name, sizeof tn->info.name, "%s", name);
    if (!s) s = kvl__svc_kv_int(&l, "max_sessions", 0, 0, 1L << 30, &tn->info.max_sessions);
    if (!s) s = kvl__svc_kv_int(&l, "tokens_per_minute", 0, 0, 1L << 40, &tn->info.tokens_per_minute);
    if (!s) s = kvl__svc_kv_int(&l, "max_concurrent_turns", 0, 0, 1L << 20, &tn->info.max_turns);
    if (!s) s = kvl__svc_kv_bool(&l, "admin", 0, &tn->info.admin);
    int before = t->n_keys;
    const char *raw = s ? NULL : kvl__svc_kv_str(&l, "keys", NULL);
    const char *hex = s ? NULL : kvl__svc_kv_str(&l, "key_sha256", NULL);
    if (!s && raw && raw[0]) {
        snprintf(field, sizeof field, "%s.keys", sect);
        s = add_keys(t, raw, 0, t->n, y->file, kvl__svc_kv_line(&l, "keys"), field);
    }
    if (!s && hex && hex[0]) {
        snprintf(field, sizeof field, "%s.key_sha256", sect);
        s = add_keys(t, hex, 1, t->n, y->file, kvl__svc_kv_line(&l, "key_sha256"), field);
    }
    /* unknown keys before "no keys": a misspelt `keys:` (kyes) is the likeliest cause of a
     * tenant without keys, and the message should name it */
    if (!s) s = kvl__svc_kv_check_unused(&l);
    if (!s && t->n_keys == before)
        s = kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key '%s': tenant '%s' has no keys (give keys or key_sha256)",
                       y->file, l.line, sect, tn->info.name);
    kvl__svc_kvlist_clear(&l);
    if (!s) t->n++;
    return s;
}

static kvl_status from_doc(kvl__svc_yaml *y, kvr_tenants **out) {
    const char *file = y->file;
    yaml_node_t *root = kvl__svc_yaml_root(y);
    if (!root) return kvl__errorf(KVL_ERR_FORMAT, "%s: empty key file (expected 'tenants:')", file);
    if (root->type != YAML_MAPPING_NODE)
        return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: expected a mapping with key 'tenants'", file,
                          kvl__svc_yaml_line(root));
    yaml_node_t *seq = NULL;
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top; p++) {
        yaml_node_t *k = kvl__svc_yaml_node(y, p->key);
        const char *ks = kvl__svc_yaml_scalar(k);
        if (ks && !strcmp(ks, "tenants")) seq = kvl__svc_yaml_node(y, p->value);
        else
            return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: unknown key '%.64s' (a key file has 'tenants')", file,
                              kvl__svc_yaml_line(k), ks ? ks : "?");
    }
    if (!seq) return kvl__errorf(KVL_ERR_FORMAT, "%s: key 'tenants' is required", file);
    if (seq->type != YAML_SEQUENCE_NODE)
        return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key 'tenants': expected a list", file, kvl__svc_yaml_line(seq));
    int n = (int)(seq->data.sequence.items.top - seq->data.sequence.items.start);
    if (n < 1)
        return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key 'tenants': at least one tenant is required", file,
                          kvl__svc_yaml_line(seq));
    if (n > KVR_TENANTS_MAX)
        return kvl__errorf(KVL_ERR_FORMAT, "%s:%d: key 'tenants': %d tenants, at most %d", file,
                          kvl__svc_yaml_line(seq), n, KVR_TENANTS_MAX);
    kvr_tenants *t = alloc_table();
    if (t) {
        t->tn = calloc((size_t)n, sizeof *t->tn);
        t->keys = calloc(KVR_TENANT_KEYS_MAX, sizeof *t->keys);
    }
    if (!t || !t->tn || !t->keys) {
        kvr_tenants_free(t);
        return kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory", file);
    }
    for (int i = 0; i < n; i++) {
        kvl_status s = parse_tenant(y, t, kvl__svc_yaml_node(y, seq->data.sequence.items.start[i]), i);
        if (s) { kvr_tenants_free(t); return s; }
    }
    *out = t;
    return KVL_OK;
}

kvl_status kvr_tenants_parse(const char *text, size_t len, const char *name, kvr_tenants **out) {
    *out = NULL;
    kvl__svc_yaml y;
    kvl_status s = kvl__svc_yaml_parse(text, len, name, &y);
    if (s) return s;
    s = from_doc(&y, out);
    kvl__svc_yaml_free(&y);
    return s;
}

kvl_status kvr_tenants_load(const char *path, kvr_tenants **out) {
    *out = NULL;
    kvl__svc_yaml y;
    kvl_status s = kvl__svc_yaml_read(path, &y);
    if (s) return s;
    s = from_doc(&y, out);
    kvl__svc_yaml_free(&y);
    return s;
}

kvl_status kvr_tenants_anonymous(kvr_tenants **out) {
    *out = NULL;
    kvr_tenants *t = alloc_table();
    if (t) t->tn = calloc(1, sizeof *t->tn);
    if (!t || !t->tn) {
        kvr_tenants_free(t);
        return kvl__errorf(KVL_ERR_NOMEM, "tenants: out of memory");
    }
    t->open = 1;
    t->n = 1;
    snprintf(t->tn[0].info.name, sizeof t->tn[0].info.name, "%s", KVR_DEFAULT_TENANT);
    t->tn[0].info.admin = 1;
    *out = t;
    return KVL_OK;
}

int kvr_tenants_open(const kvr_tenants *t) { return t->open; }
int kvr_tenants_count(const kvr_tenants *t) { return t->n; }
int kvr_tenants_key_count(const kvr_tenants *t) { return t->n_keys; }

void kvr_tenants_name(kvr_tenants *t, int i, char *buf, size_t cap) {
    pthread_mutex_lock(&t->mu);
    snprintf(buf, cap, "%s", i >= 0 && i < t->n ? t->tn[i].info.name : "");
    pthread_mutex_unlock(&t->mu);
}

/* ---- lookups ------------------------------------------------------------------------------ */

int kvr_tenants_lookup(kvr_tenants *t, const char *key, size_t len, kvr_tenant_info *out) {
    uint8_t d[32];
    if (!len || len > KVR_KEY_MAX || sha256(key, len, d)) return 0;
    pthread_mutex_lock(&t->mu);
    int found = -1;
    /* every entry is compared (no early exit), each in constant time */
    for (int k = 0; k < t->n_keys; k++) {
        int eq = CRYPTO_memcmp(t->keys[k].digest, d, 32) == 0;
        found = eq ? t->keys[k].tenant : found;
    }
    if (found >= 0) *out = t->tn[found].info;
    pthread_mutex_unlock(&t->mu);
    return found >= 0;
}

int kvr_tenants_authorize(kvr_tenants *t, const char *value, kvr_tenant_info *out) {
    if (!value) return -1;
    while (*value == ' ' || *value == '\t') value++;
    if (strncasecmp(value, "bearer", 6) || (value[6] != ' ' && value[6] != '\t')) return -1;
    const char *k = value + 6;
    while (*k == ' ' || *k == '\t') k++;
    size_t n = strlen(k);
    while (n && (k[n - 1] == ' ' || k[n - 1] == '\t' || k[n - 1] == '\r' || k[n - 1] == '\n')) n--;
    if (!n) return -1;
    return kvr_tenants_lookup(t, k, n, out);
}

void kvr_tenants_replace(kvr_tenants *t, kvr_tenants *fresh) {
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < fresh->n; i++) {
        tenant *nt = &fresh->tn[i];
        int kept = 0;
        for (int j = 0; j < t->n; j++)   /* its turns still run: they end against the new table */
            if (!strcmp(t->tn[j].info.name, nt->info.name)) nt->running = t->tn[j].running;
        for (int j = 0; j < t->n && !kept; j++)
            if (!strcmp(t->tn[j].info.name, nt->info.name) && t->tn[j].bucket.cap > 0 &&
                nt->info.tokens_per_minute > 0) {
                nt->bucket = t->tn[j].bucket;
                nt->bucket.cap = (double)nt->info.tokens_per_minute;
                if (nt->bucket.level > nt->bucket.cap) nt->bucket.level = nt->bucket.cap;
                kept = 1;
            }
        if (!kept) nt->bucket.cap = 0;   /* initialised at its first use */
    }
    tenant *otn = t->tn;
    keyent *okeys = t->keys;
    t->tn = fresh->tn;
    t->n = fresh->n;
    t->keys = fresh->keys;
    t->n_keys = fresh->n_keys;
    t->open = fresh->open;
    pthread_mutex_unlock(&t->mu);
    fresh->tn = otn;
    fresh->keys = okeys;
    kvr_tenants_free(fresh);
}

static tenant *find_locked(kvr_tenants *t, const char *name) {
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->tn[i].info.name, name)) return &t->tn[i];
    return NULL;
}

/* The bucket of a limited tenant, created full at its first use. */
static kvr_bucket *bucket_locked(tenant *tn, double now) {
    if (!tn || tn->info.tokens_per_minute <= 0) return NULL;
    if (tn->bucket.cap <= 0) kvr_bucket_init(&tn->bucket, (double)tn->info.tokens_per_minute, now);
    return &tn->bucket;
}

int kvr_tenants_admit(kvr_tenants *t, const char *name, long reserve, double now, double *wait_s) {
    pthread_mutex_lock(&t->mu);
    kvr_bucket *b = bucket_locked(find_locked(t, name), now);
    int ok = !b || kvr_bucket_admit(b, now);
    /* reserved under the same lock as the check: concurrent turns of one tenant each see the
     * others' reservations, so a burst cannot all pass on one token */
    if (b && ok) kvr_bucket_charge(b, (double)reserve, now);
    if (wait_s) *wait_s = b && !ok ? kvr_bucket_wait(b, now) : 0;
    pthread_mutex_unlock(&t->mu);
    return ok;
}

void kvr_tenants_charge(kvr_tenants *t, const char *name, long n, double now) {
    pthread_mutex_lock(&t->mu);
    kvr_bucket *b = bucket_locked(find_locked(t, name), now);
    if (b) kvr_bucket_charge(b, (double)n, now);
    pthread_mutex_unlock(&t->mu);
}

int kvr_tenants_turn_begin(kvr_tenants *t, const char *name, long *running) {
    pthread_mutex_lock(&t->mu);
    tenant *tn = find_locked(t, name);
    const int ok = !tn || tn->info.max_turns <= 0 || tn->running < tn->info.max_turns;
    if (running) *running = tn ? tn->running : 0;
    if (tn && ok) tn->running++;
    pthread_mutex_unlock(&t->mu);
    return ok;
}

void kvr_tenants_turn_end(kvr_tenants *t, const char *name) {
    pthread_mutex_lock(&t->mu);
    tenant *tn = find_locked(t, name);   /* a tenant the reload removed: its count went with it */
    if (tn && tn->running > 0) tn->running--;
    pthread_mutex_unlock(&t->mu);
}
