/* service/ticket.c: transfer tickets (see ticket.h) on OpenSSL's libcrypto. */
#include "ticket.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "error.h"

static const uint8_t MAGIC[4] = {'K', 'V', 'T', '1'};

kvl_status kvl__ticket_key_load(const char *path, kvl__ticket_key *out) {
    memset(out, 0, sizeof *out);
    if (!path || !path[0]) return kvl__errorf(KVL_ERR_INVALID_ARG, "ticket key file: no path given");
    FILE *f = fopen(path, "rb");
    if (!f)
        return kvl__errorf(KVL_ERR_IO, "ticket key file '%s': %s", path,
                          errno == ENOENT ? "missing (no such file)" : strerror(errno));
    size_t n = fread(out->key, 1, sizeof out->key, f);
    int err = ferror(f);
    fclose(f);
    if (err) {
        memset(out, 0, sizeof *out);
        return kvl__errorf(KVL_ERR_IO, "ticket key file '%s': unreadable", path);
    }
    while (n > 0 && (out->key[n - 1] == '\n' || out->key[n - 1] == '\r')) n--;
    if (n < KVL_TICKET_KEY_MIN) {
        memset(out, 0, sizeof *out);
        return kvl__errorf(KVL_ERR_RANGE, "ticket key file '%s': too short (%zu bytes; at least %d)",
                          path, n, KVL_TICKET_KEY_MIN);
    }
    out->len = n;
    return KVL_OK;
}

uint64_t kvl__ticket_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

kvl_status kvl__ticket_new_nonce(kvl__ticket *t) {
    if (RAND_bytes(t->nonce, KVL_TICKET_NONCE) != 1)
        return kvl__errorf(KVL_ERR_INTERNAL, "ticket: the random source failed (RAND_bytes)");
    return KVL_OK;
}

kvl_status kvl__ticket_warmup(const kvl__ticket_key *key) {
    kvl__ticket t, back;
    memset(&t, 0, sizeof t);
    snprintf(t.source, sizeof t.source, "warm-up");
    const uint64_t now = kvl__ticket_now_ms();   /* one reading: a clock step cannot expire it */
    t.expiry_ms = now + 1000;
    uint8_t buf[KVL_TICKET_MAX];
    size_t len = 0;
    kvl_status st = kvl__ticket_new_nonce(&t);
    if (st == KVL_OK) st = kvl__ticket_encode(key, &t, buf, sizeof buf, &len);
    if (st == KVL_OK) st = kvl__ticket_verify(key, buf, len, now, &back);
    OPENSSL_cleanse(buf, sizeof buf);
    return st ? kvl__error_prefix(st, "ticket key: a test ticket at start") : KVL_OK;
}

/* ---- encoding --------------------------------------------------------------------------------- */

typedef struct wbuf {
    uint8_t *p;
    size_t cap, n;
    int over;
} wbuf;

static void put(wbuf *w, const void *src, size_t len) {
    if (w->over || len > w->cap - w->n) {
        w->over = 1;
        return;
    }
    memcpy(w->p + w->n, src, len);
    w->n += len;
}

static void put_u(wbuf *w, uint64_t v, int bytes) {
    uint8_t b[8];
    for (int i = 0; i < bytes; i++) b[i] = (uint8_t)(v >> (8 * i));
    put(w, b, (size_t)bytes);
}

static int put_str(wbuf *w, const char *s) {
    size_t l = strlen(s);
    if (l >= KVL_TICKET_STR_MAX) return -1;
    put_u(w, l, 2);
    put(w, s, l);
    return 0;
}

/* 0 on success; -1 when HMAC fails (no memory, a provider refusing it): callers refuse the
 * ticket rather than compare against a MAC that was never computed */
static int mac_of(const kvl__ticket_key *key, const uint8_t *msg, size_t len,
                  uint8_t mac[KVL_TICKET_MAC]) {
    unsigned ml = KVL_TICKET_MAC;
    if (!HMAC(EVP_sha256(), key->key, (int)key->len, msg, len, mac, &ml) || ml != KVL_TICKET_MAC) {
        memset(mac, 0, KVL_TICKET_MAC);
        return -1;
    }
    return 0;
}

kvl_status kvl__ticket_key_id(const kvl__ticket_key *key, char out[17]) {
    static const char label[] = "kvlingo ticket key id v1";
    uint8_t mac[KVL_TICKET_MAC];
    out[0] = '\0';
    if (mac_of(key, (const uint8_t *)label, sizeof label - 1, mac))
        return kvl__errorf(KVL_ERR_INTERNAL, "ticket: HMAC-SHA256 failed");
    for (int i = 0; i < 8; i++) snprintf(out + 2 * i, 3, "%02x", mac[i]);
    return KVL_OK;
}

kvl_status kvl__ticket_encode(const kvl__ticket_key *key, const kvl__ticket *t, uint8_t *out,
                              size_t cap, size_t *len) {
    *len = 0;
    if (!key || key->len < KVL_TICKET_KEY_MIN) return kvl__errorf(KVL_ERR_INVALID_ARG, "ticket: no key");
    wbuf w = {out, cap, 0, 0};
    put(&w, MAGIC, sizeof MAGIC);
    put_u(&w, (t->replace ? 1u : 0u) | (t->window ? 2u : 0u), 1);
    put_u(&w, t->expiry_ms, 8);
    put(&w, t->nonce, KVL_TICKET_NONCE);
    put_u(&w, t->t0, 4);
    put_u(&w, t->t1, 4);
    if (put_str(&w, t->src_session) || put_str(&w, t->dst_session) || put_str(&w, t->source) ||
        put_str(&w, t->target))
        return kvl__errorf(KVL_ERR_RANGE, "ticket: a name is longer than %d bytes", KVL_TICKET_STR_MAX - 1);
    if (w.over || cap - w.n < KVL_TICKET_MAC)
        return kvl__errorf(KVL_ERR_RANGE, "ticket: buffer of %zu bytes too small", cap);
    if (mac_of(key, out, w.n, out + w.n))
        return kvl__errorf(KVL_ERR_INTERNAL, "ticket: HMAC-SHA256 failed");
    *len = w.n + KVL_TICKET_MAC;
    return KVL_OK;
}

/* ---- parsing ---------------------------------------------------------------------------------- */

typedef struct rbuf {
    const uint8_t *p;
    size_t n, at;
} rbuf;

static int get(rbuf *r, void *dst, size_t len) {
    if (len > r->n - r->at) return -1;
    memcpy(dst, r->p + r->at, len);
    r->at += len;
    return 0;
}

static int get_u(rbuf *r, uint64_t *v, int bytes) {
    uint8_t b[8];
    if (get(r, b, (size_t)bytes)) return -1;
    *v = 0;
    for (int i = 0; i < bytes; i++) *v |= (uint64_t)b[i] << (8 * i);
    return 0;
}

static int get_str(rbuf *r, char out[KVL_TICKET_STR_MAX]) {
    uint64_t l;
    if (get_u(r, &l, 2) || l >= KVL_TICKET_STR_MAX || get(r, out, (size_t)l)) return -1;
    out[l] = 0;
    if (memchr(out, 0, (size_t)l)) return -1;   /* a NUL inside a name */
    return 0;
}

kvl_status kvl__ticket_parse(const uint8_t *buf, size_t len, kvl__ticket *out) {
    memset(out, 0, sizeof *out);
    if (!buf || len < sizeof MAGIC + KVL_TICKET_MAC || len > KVL_TICKET_MAX)
        return kvl__errorf(KVL_ERR_FORMAT, "ticket is malformed: %zu bytes", len);
    if (memcmp(buf, MAGIC, sizeof MAGIC))
        return kvl__errorf(KVL_ERR_FORMAT, "ticket is malformed: not a KVT1 ticket");
    rbuf r = {buf, len - KVL_TICKET_MAC, sizeof MAGIC};
    uint64_t flags, t0, t1;
    if (get_u(&r, &flags, 1) || get_u(&r, &out->expiry_ms, 8) || get(&r, out->nonce, KVL_TICKET_NONCE) ||
        get_u(&r, &t0, 4) || get_u(&r, &t1, 4))
        return kvl__errorf(KVL_ERR_FORMAT, "ticket is malformed: truncated header");
    if (flags > 3) return kvl__errorf(KVL_ERR_FORMAT, "ticket is malformed: unknown flags 0x%llx",
                                     (unsigned long long)flags);
    out->replace = (int)(flags & 1);
    out->window = (int)(flags >> 1 & 1);
    out->t0 = (uint32_t)t0;
    out->t1 = (uint32_t)t1;
    if (get_str(&r, out->src_session) || get_str(&r, out->dst_session) || get_str(&r, out->source) ||
        get_str(&r, out->target))
        return kvl__errorf(KVL_ERR_FORMAT, "ticket is malformed: a name field is truncated or too long");
    if (r.at != r.n) return kvl__errorf(KVL_ERR_FORMAT, "ticket is malformed: %zu trailing bytes", r.n - r.at);
    return KVL_OK;
}

kvl_status kvl__ticket_verify(const kvl__ticket_key *key, const uint8_t *buf, size_t len,
                              uint64_t now_ms, kvl__ticket *out) {
    kvl_status st = kvl__ticket_parse(buf, len, out);
    if (st != KVL_OK) return st;
    uint8_t mac[KVL_TICKET_MAC];
    if (mac_of(key, buf, len - KVL_TICKET_MAC, mac))
        return kvl__errorf(KVL_ERR_MISMATCH, "ticket MAC cannot be computed (HMAC-SHA256 failed)");
    if (CRYPTO_memcmp(mac, buf + len - KVL_TICKET_MAC, KVL_TICKET_MAC) != 0)
        return kvl__errorf(KVL_ERR_MISMATCH, "ticket MAC does not verify (another fleet's key, or altered)");
    if (out->expiry_ms <= now_ms)
        return kvl__errorf(KVL_ERR_RANGE, "ticket expired %llu ms ago",
                          (unsigned long long)(now_ms - out->expiry_ms));
    if (out->expiry_ms - now_ms > KVL_TICKET_MAX_LIFETIME_MS)
        return kvl__errorf(KVL_ERR_RANGE, "ticket expiry is %llu ms ahead (at most %d)",
                          (unsigned long long)(out->expiry_ms - now_ms), KVL_TICKET_MAX_LIFETIME_MS);
    return KVL_OK;
}

static kvl_status str_field(const char *field, const char *got, const char *want) {
    if (!want || !strcmp(got, want)) return KVL_OK;
    return kvl__errorf(KVL_ERR_MISMATCH, "ticket names %s '%s', not '%s'", field, got, want);
}

kvl_status kvl__ticket_match(const kvl__ticket *t, const kvl__ticket_expect *e) {
    kvl_status st;
    if ((st = str_field("source node", t->source, e->source)) ||
        (st = str_field("target node", t->target, e->target)) ||
        (st = str_field("source session", t->src_session, e->src_session)) ||
        (st = str_field("target session", t->dst_session, e->dst_session)))
        return st;
    if (t->window) {
        /* a window ticket: the nodes settle the exact range (the target's cache, the source's)
         * inside it */
        if ((e->t0 >= 0 && (int64_t)t->t0 > e->t0) || (e->t1 >= 0 && (int64_t)t->t1 < e->t1))
            return kvl__errorf(KVL_ERR_MISMATCH, "ticket allows range [%u, %u), not [%lld, %lld)",
                              t->t0, t->t1, (long long)(e->t0 >= 0 ? e->t0 : t->t0),
                              (long long)(e->t1 >= 0 ? e->t1 : t->t1));
    } else if ((e->t0 >= 0 && (int64_t)t->t0 != e->t0) || (e->t1 >= 0 && (int64_t)t->t1 != e->t1))
        return kvl__errorf(KVL_ERR_MISMATCH, "ticket names range [%u, %u), not [%lld, %lld)", t->t0,
                          t->t1, (long long)(e->t0 >= 0 ? e->t0 : t->t0),
                          (long long)(e->t1 >= 0 ? e->t1 : t->t1));
    if (e->replace >= 0 && !t->replace != !e->replace)
        return kvl__errorf(KVL_ERR_MISMATCH, "ticket says replace=%d, the request replace=%d",
                          t->replace, e->replace);
    return KVL_OK;
}

/* ---- replay cache ----------------------------------------------------------------------------- */

kvl_status kvl__ticket_replay_init(kvl__ticket_replay *r, int cap) {
    memset(r, 0, sizeof *r);
    r->items = calloc((size_t)(cap > 0 ? cap : 1), sizeof *r->items);
    if (!r->items) return kvl__errorf(KVL_ERR_NOMEM, "ticket replay cache");
    r->cap = cap > 0 ? cap : 1;
    pthread_mutex_init(&r->mu, NULL);
    return KVL_OK;
}

void kvl__ticket_replay_free(kvl__ticket_replay *r) {
    if (!r->items) return;
    free(r->items);
    r->items = NULL;
    pthread_mutex_destroy(&r->mu);
}

kvl_status kvl__ticket_replay_check(kvl__ticket_replay *r, const kvl__ticket *t, uint64_t now_ms,
                                    int64_t mono_ms) {
    pthread_mutex_lock(&r->mu);
    /* forget what expired first (an expired ticket fails verify anyway), by both clocks */
    for (int i = 0; i < r->n;) {
        if (r->items[i].expiry_ms <= now_ms && r->items[i].mono_until_ms <= mono_ms) r->items[i] = r->items[--r->n];
        else i++;
    }
    kvl_status st = KVL_OK;
    for (int i = 0; i < r->n && st == KVL_OK; i++)
        if (!memcmp(r->items[i].nonce, t->nonce, KVL_TICKET_NONCE))
            st = kvl__errorf(KVL_ERR_MISMATCH, "ticket replayed (its nonce was used before)");
    if (st == KVL_OK && r->n >= r->cap)
        st = kvl__errorf(KVL_ERR_RANGE, "ticket replay cache full (%d live tickets)", r->cap);
    if (st == KVL_OK) {
        memcpy(r->items[r->n].nonce, t->nonce, KVL_TICKET_NONCE);
        r->items[r->n].expiry_ms = t->expiry_ms;
        r->items[r->n++].mono_until_ms =
            mono_ms + (t->expiry_ms > now_ms ? (int64_t)(t->expiry_ms - now_ms) : 0);
    }
    pthread_mutex_unlock(&r->mu);
    return st;
}

/* ---- token hash ------------------------------------------------------------------------------- */

void kvl__tokens_sha256_hex(const int32_t *ids, size_t n, char out[65]) {
    uint8_t d[32] = {0};
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    int ok = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) == 1;
    uint8_t b[4 * 256];
    for (size_t i = 0; ok && i < n;) {
        size_t k = 0;
        for (; k < 256 && i < n; k++, i++) {
            uint32_t v = (uint32_t)ids[i];
            b[4 * k] = (uint8_t)v, b[4 * k + 1] = (uint8_t)(v >> 8);
            b[4 * k + 2] = (uint8_t)(v >> 16), b[4 * k + 3] = (uint8_t)(v >> 24);
        }
        ok = EVP_DigestUpdate(c, b, 4 * k) == 1;
    }
    unsigned dl = 0;
    if (ok) ok = EVP_DigestFinal_ex(c, d, &dl) == 1 && dl == 32;
    EVP_MD_CTX_free(c);
    /* a failed digest (out of memory) yields the empty string: it matches nothing */
    if (!ok) {
        out[0] = 0;
        return;
    }
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) out[2 * i] = hx[d[i] >> 4], out[2 * i + 1] = hx[d[i] & 15];
    out[64] = 0;
}
