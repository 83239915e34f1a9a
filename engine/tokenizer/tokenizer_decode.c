/* engine/tokenizer/tokenizer_decode.c: decode (ByteLevel decoder) and the streaming detokenizer.
 *
 * tokenizers' ByteLevel decoder concatenates the tokens' bytes and converts them with
 * String::from_utf8_lossy: each maximal invalid subpart of a UTF-8 sequence (Unicode's
 * "substitution of maximal subparts") becomes one U+FFFD.  The streaming detokenizer applies the
 * same rule incrementally, holding back a trailing sequence that may still be completed, so the
 * concatenation of its outputs equals the one-shot decode. */
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "tokenizer_internal.h"

enum { U8_VALID, U8_INVALID, U8_INCOMPLETE };

/* Classify the sequence at s[0..n) (n >= 1): *len is the char length (VALID), the maximal
 * invalid subpart (INVALID, >= 1) or the bytes available (INCOMPLETE). */
static int u8_class(const uint8_t *s, size_t n, size_t *len) {
    uint8_t b = s[0];
    if (b < 0x80) { *len = 1; return U8_VALID; }
    size_t w;
    uint8_t lo = 0x80, hi = 0xbf;
    if (b >= 0xc2 && b <= 0xdf) w = 2;
    else if (b >= 0xe0 && b <= 0xef) { w = 3; if (b == 0xe0) lo = 0xa0; if (b == 0xed) hi = 0x9f; }
    else if (b >= 0xf0 && b <= 0xf4) { w = 4; if (b == 0xf0) lo = 0x90; if (b == 0xf4) hi = 0x8f; }
    else { *len = 1; return U8_INVALID; }
    for (size_t i = 1; i < w; i++) {
        if (i >= n) { *len = i; return U8_INCOMPLETE; }
        uint8_t c = s[i];
        if (i == 1 ? (c < lo || c > hi) : ((c & 0xc0) != 0x80)) { *len = i; return U8_INVALID; }
    }
    *len = w;
    return U8_VALID;
}

static const char REPL[3] = {(char)0xef, (char)0xbf, (char)0xbd};

/* Lossy-convert s[0..n); when `hold` an incomplete tail is left unconsumed.  Writes to dst when
 * non-NULL; returns the output size, *consumed the input bytes used. */
static size_t lossy(const uint8_t *s, size_t n, int hold, char *dst, size_t *consumed) {
    size_t i = 0, o = 0;
    while (i < n) {
        size_t run = i;
        while (run < n && s[run] < 0x80) run++;
        if (run > i) {
            if (dst) memcpy(dst + o, s + i, run - i);
            o += run - i;
            i = run;
            continue;
        }
        size_t len;
        int c = u8_class(s + i, n - i, &len);
        if (c == U8_VALID) {
            if (dst) memcpy(dst + o, s + i, len);
            o += len;
        } else if (c == U8_INCOMPLETE && hold) {
            break;
        } else {
            if (dst) memcpy(dst + o, REPL, 3);
            o += 3;
        }
        i += len;
    }
    *consumed = i;
    return o;
}

/* id >= 0 names a token with bytes (not past the tokenizer's ids, nor an unused one) */
static int is_token(const kvl_tokenizer *t, int32_t id) {
    return (size_t)id < t->n_ids && t->id_bytes[id];
}

kvl_status kvl_tokenizer_decode(const kvl_tokenizer *t, const int32_t *ids, size_t n, char **text_out,
                                size_t *len_out) {
    if (text_out) *text_out = NULL;
    if (len_out) *len_out = 0;
    if (!t || !text_out || (!ids && n)) return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_tokenizer_decode: NULL argument");
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0)
            return kvl__errorf(KVL_ERR_RANGE, "kvl_tokenizer_decode: ids[%zu] = %d is negative", i, ids[i]);
        if (!is_token(t, ids[i])) continue;   /* a padded logit's id: nothing, as tokenizers skips it */
        total += t->id_bytes_len[ids[i]];
    }
    uint8_t *raw = malloc(total ? total : 1);
    if (!raw) return kvl__errorf(KVL_ERR_NOMEM, "kvl_tokenizer_decode: out of memory (%zu bytes)", total);
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        if (!is_token(t, ids[i])) continue;
        memcpy(raw + off, t->id_bytes[ids[i]], t->id_bytes_len[ids[i]]);
        off += t->id_bytes_len[ids[i]];
    }
    size_t consumed;
    size_t olen = lossy(raw, total, 0, NULL, &consumed);
    char *out = malloc(olen + 1);
    if (!out) { free(raw); return kvl__errorf(KVL_ERR_NOMEM, "kvl_tokenizer_decode: out of memory"); }
    lossy(raw, total, 0, out, &consumed);
    out[olen] = '\0';
    free(raw);
    *text_out = out;
    if (len_out) *len_out = olen;
    return KVL_OK;
}

/* ---- streaming ------------------------------------------------------------------------------ */

struct kvl_detok {
    const kvl_tokenizer *tok;
    uint8_t pending[4];
    size_t n_pending;     /* < 4: an incomplete but so far valid sequence */
    uint8_t *scratch;     /* pending + one token */
};

size_t kvl_detok_push_capacity(const kvl_tokenizer *t) {
    return t ? 3 * (t->max_token_bytes + 4) : 0;
}

kvl_status kvl_detok_create(const kvl_tokenizer *t, kvl_detok **out) {
    if (out) *out = NULL;
    if (!t || !out) return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_detok_create: NULL argument");
    kvl_detok *d = calloc(1, sizeof *d);
    if (!d) return kvl__errorf(KVL_ERR_NOMEM, "kvl_detok_create: out of memory");
    d->tok = t;
    d->scratch = malloc(t->max_token_bytes + 8);
    if (!d->scratch) { free(d); return kvl__errorf(KVL_ERR_NOMEM, "kvl_detok_create: out of memory"); }
    *out = d;
    return KVL_OK;
}

void kvl_detok_free(kvl_detok *d) {
    if (!d) return;
    free(d->scratch);
    free(d);
}

static kvl_status emit(kvl_detok *d, size_t n, int hold, char *buf, size_t cap, size_t *len_out) {
    size_t consumed;
    size_t need = lossy(d->scratch, n, hold, NULL, &consumed);
    if (need > cap) {
        *len_out = need;
        return kvl__errorf(KVL_ERR_RANGE, "kvl_detok: output buffer of %zu bytes too small (%zu needed)", cap, need);
    }
    if (need && !buf) return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_detok: NULL buffer");
    lossy(d->scratch, n, hold, buf, &consumed);
    d->n_pending = n - consumed;
    memcpy(d->pending, d->scratch + consumed, d->n_pending);
    *len_out = need;
    return KVL_OK;
}

kvl_status kvl_detok_push(kvl_detok *d, int32_t id, char *buf, size_t cap, size_t *len_out) {
    if (!d || !len_out || (!buf && cap)) return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_detok_push: NULL argument");
    *len_out = 0;
    const kvl_tokenizer *t = d->tok;
    if (id < 0) return kvl__errorf(KVL_ERR_RANGE, "kvl_detok_push: id %d is negative", id);
    if (!is_token(t, id)) return KVL_OK;   /* nothing, as kvl_tokenizer_decode skips it */
    memcpy(d->scratch, d->pending, d->n_pending);
    memcpy(d->scratch + d->n_pending, t->id_bytes[id], t->id_bytes_len[id]);
    return emit(d, d->n_pending + t->id_bytes_len[id], 1, buf, cap, len_out);
}

kvl_status kvl_detok_flush(kvl_detok *d, char *buf, size_t cap, size_t *len_out) {
    if (!d || !len_out || (!buf && cap)) return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_detok_flush: NULL argument");
    *len_out = 0;
    memcpy(d->scratch, d->pending, d->n_pending);
    return emit(d, d->n_pending, 0, buf, cap, len_out);
}
