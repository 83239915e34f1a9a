/* transport/span.c: span header/payload encoding and the receiver's checks. */
#include "span.h"
#include "spanbuf.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "bf16.h"
#include "fastmath.h"
#include "hash.h"

static const char *const reject_names[KVL_SPAN_N_REASONS] = {
    "ok", "malformed", "wrong_target", "no_translator", "geometry", "range", "truncated",
    "checksum", "bad_values", "transfer", "translate", "busy"};

const char *kvl__span_reject_name(kvl__span_reject r) {
    if ((int)r < 0 || r >= KVL_SPAN_N_REASONS) return "unknown";
    return reject_names[r];
}

uint64_t kvl__span_checksum(const void *data, size_t len) { return kvl__xxh3_64(data, len); }

uint64_t kvl__span_payload_bytes(uint32_t n_layers, uint32_t n_kv_heads, uint32_t head_dim,
                                uint32_t n_tokens) {
    return kvl__span_payload_bytes_of(n_layers, n_kv_heads, head_dim, n_tokens, sizeof(float));
}

uint64_t kvl__span_payload_bytes_of(uint32_t n_layers, uint32_t n_kv_heads, uint32_t head_dim,
                                   uint32_t n_tokens, uint32_t elem_bytes) {
    if ((elem_bytes != 2 && elem_bytes != 4) || n_layers == 0 || n_layers > KVL_SPAN_MAX_LAYERS || n_kv_heads == 0 ||
        n_kv_heads > KVL_SPAN_MAX_HEADS || head_dim == 0 || head_dim > KVL_SPAN_MAX_HEAD_DIM ||
        n_tokens == 0 || n_tokens > KVL_SPAN_MAX_TOKENS)
        return 0;
    /* each factor is bounded above, so the product fits in 64 bits (2^10*2^10*2^12*2^22*8) */
    return 2ull * n_layers * n_tokens * n_kv_heads * head_dim * elem_bytes +
           (uint64_t)n_tokens * sizeof(int32_t);
}

static kvl_status reject(kvl__span_reject *why, kvl__span_reject r, kvl_status st) {
    if (why) *why = r;
    return st;
}

kvl_status kvl__span_header_check(const Kvlingo__V1__SpanHeader *h, uint64_t max_payload,
                                 kvl__span_reject *why) {
    if (why) *why = KVL_SPAN_OK;
    if (!h)
        return reject(why, KVL_SPAN_MALFORMED, kvl__errorf(KVL_ERR_FORMAT, "span: no header"));
    if (h->version != 1)
        return reject(why, KVL_SPAN_MALFORMED,
                      kvl__errorf(KVL_ERR_UNSUPPORTED, "span: header version %u (supported: 1)",
                                 h->version));
    if (!h->source || !h->source->name || !h->source->name[0])
        return reject(why, KVL_SPAN_MALFORMED,
                      kvl__errorf(KVL_ERR_FORMAT, "span: header names no source model"));
    if (h->capture != KVLINGO__V1__CAPTURE_POINT__CAPTURE_PRENORM)
        return reject(why, KVL_SPAN_GEOMETRY,
                      kvl__errorf(KVL_ERR_UNSUPPORTED,
                                 "span: capture point %d (supported: CAPTURE_PRENORM)",
                                 (int)h->capture));
    if (h->dtype != KVLINGO__V1__DTYPE__DTYPE_F32 && h->dtype != KVLINGO__V1__DTYPE__DTYPE_BF16)
        return reject(why, KVL_SPAN_GEOMETRY,
                      kvl__errorf(KVL_ERR_UNSUPPORTED, "span: dtype %d (supported: DTYPE_F32, DTYPE_BF16)",
                                 (int)h->dtype));
    if (h->t1 <= h->t0)
        return reject(why, KVL_SPAN_RANGE,
                      kvl__errorf(KVL_ERR_RANGE, "span: empty token range [%u, %u)", h->t0, h->t1));
    uint32_t n = h->t1 - h->t0;
    uint64_t want = kvl__span_payload_bytes_of(h->n_layers, h->n_kv_heads, h->head_dim, n,
                                               h->dtype == KVLINGO__V1__DTYPE__DTYPE_BF16 ? 2 : 4);
    if (want == 0)
        return reject(why, KVL_SPAN_GEOMETRY,
                      kvl__errorf(KVL_ERR_RANGE,
                                 "span: geometry out of limits (layers %u, kv heads %u, "
                                 "head_dim %u, tokens %u)",
                                 h->n_layers, h->n_kv_heads, h->head_dim, n));
    if (h->payload_bytes != want)
        return reject(why, KVL_SPAN_MALFORMED,
                      kvl__errorf(KVL_ERR_FORMAT,
                                 "span: payload_bytes %llu does not match the geometry (%llu)",
                                 (unsigned long long)h->payload_bytes, (unsigned long long)want));
    if (max_payload && want > max_payload)
        return reject(why, KVL_SPAN_RANGE,
                      kvl__errorf(KVL_ERR_RANGE, "span: payload of %llu bytes exceeds the limit %llu",
                                 (unsigned long long)want, (unsigned long long)max_payload));
    return KVL_OK;
}

/* The vectors of the scans below (GCC / clang vector extensions: 16 lanes of AVX-512, two
 * halves on AVX2, four quarters on the base ISA). */
typedef uint32_t kvl__u32x16 __attribute__((vector_size(64)));
typedef uint16_t kvl__u16x32 __attribute__((vector_size(64)));
#define KVL_SPAN_CHECK_BLOCK 4096

/* The first non-finite element of a received span (n if none): blocks of 4096 elements reduced
 * 16 lanes wide (an exponent of all ones, i.e. NaN or infinity, carries into bit 31), then the
 * one block that has one scanned element by element.  One pass over the payload at memory
 * speed: 4 MB in ~0.05 ms on AVX-512, where the element loop GCC leaves scalar at -O2 took
 * 0.57.  Lanes are loaded with memcpy: the payload is only 4-byte aligned. */
KVL_MULTIVERSION static size_t first_non_finite(const float *x, size_t n) {
    const unsigned char *p = (const unsigned char *)(const void *)x;
    const uint32_t *u = (const uint32_t *)(const void *)x;
    size_t b = 0;
    for (; b + KVL_SPAN_CHECK_BLOCK <= n; b += KVL_SPAN_CHECK_BLOCK) {
        kvl__u32x16 acc = {0};
        for (size_t i = b; i < b + KVL_SPAN_CHECK_BLOCK; i += 16) {
            kvl__u32x16 v;
            memcpy(&v, p + 4 * i, sizeof v);
            acc |= (v & 0x7f800000u) + 0x00800000u;
        }
        uint32_t bad = 0;
        for (int l = 0; l < 16; l++) bad |= acc[l];
        if (bad >> 31) break;
    }
    for (size_t i = b; i < n; i++)   /* the block with a bad element, or the tail */
        if (((u[i] & 0x7f800000u) + 0x00800000u) >> 31) return i;
    return n;
}

/* The same over bf16 elements: an exponent of all ones (NaN or infinity) carries into bit 15.
 * (A 16-bit lane comparison, which the AVX-512F copy, without AVX512BW, compiles slowly, made the
 * payload check of a 2 MB span 0.70 ms; with the carry it is 0.09.) */
KVL_MULTIVERSION static size_t first_non_finite_bf16(const uint16_t *x, size_t n) {
    const unsigned char *p = (const unsigned char *)(const void *)x;
    size_t b = 0;
    for (; b + KVL_SPAN_CHECK_BLOCK <= n; b += KVL_SPAN_CHECK_BLOCK) {
        kvl__u16x32 acc = {0};
        for (size_t i = b; i < b + KVL_SPAN_CHECK_BLOCK; i += 32) {
            kvl__u16x32 v;
            memcpy(&v, p + 2 * i, sizeof v);
            acc |= (kvl__u16x32)((v & 0x7f80u) + 0x0080u);
        }
        uint16_t bad = 0;
        for (int l = 0; l < 32; l++) bad |= acc[l];
        if (bad >> 15) break;
    }
    for (size_t i = b; i < n; i++)
        if ((x[i] & 0x7f80u) == 0x7f80u) return i;
    return n;
}

kvl_status kvl__span_payload_check(const Kvlingo__V1__SpanHeader *h, const uint8_t *payload,
                                  size_t len, int vocab, kvl__span_view *out,
                                  kvl__span_reject *why) {
    kvl_status st = kvl__span_header_check(h, 0, why);
    if (st != KVL_OK) return st;
    if ((uint64_t)len != h->payload_bytes)
        return reject(why, KVL_SPAN_TRUNCATED,
                      kvl__errorf(KVL_ERR_FORMAT,
                                 "span: payload truncated: %zu bytes received, %llu announced",
                                 len, (unsigned long long)h->payload_bytes));
    if (!payload || ((uintptr_t)payload & 3u))
        return reject(why, KVL_SPAN_MALFORMED,
                      kvl__errorf(KVL_ERR_INVALID_ARG, "span: payload buffer not 4-byte aligned"));
    uint64_t sum = kvl__span_checksum(payload, len);
    if (sum != h->checksum)
        return reject(why, KVL_SPAN_CHECKSUM,
                      kvl__errorf(KVL_ERR_FORMAT,
                                 "span: checksum mismatch: xxh3-64 %016llx, header says %016llx",
                                 (unsigned long long)sum, (unsigned long long)h->checksum));
    uint32_t n = h->t1 - h->t0;
    size_t row = (size_t)h->n_kv_heads * h->head_dim;
    size_t nf = (size_t)h->n_layers * n * row;
    const int bf16 = h->dtype == KVLINGO__V1__DTYPE__DTYPE_BF16;
    const size_t eb = bf16 ? sizeof(uint16_t) : sizeof(float);
    const int32_t *ids = (const int32_t *)(const void *)(payload + 2 * nf * eb);   /* 4-aligned */
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] < 0 || (vocab > 0 && ids[i] >= vocab))
            return reject(why, KVL_SPAN_BAD_VALUES,
                          kvl__errorf(KVL_ERR_RANGE, "span: token %u has id %d outside [0, %d)",
                                     h->t0 + i, ids[i], vocab));
    size_t bad = bf16 ? first_non_finite_bf16((const uint16_t *)(const void *)payload, 2 * nf)
                      : first_non_finite((const float *)(const void *)payload, 2 * nf);
    if (bad < 2 * nf)
        return reject(why, KVL_SPAN_BAD_VALUES,
                      kvl__errorf(KVL_ERR_NUMERIC, "span: non-finite %s value at element %zu",
                                 bad < nf ? "K" : "V", bad < nf ? bad : bad - nf));
    if (out) {
        out->t0 = h->t0;
        out->n = n;
        out->n_layers = h->n_layers;
        out->row = (uint32_t)row;
        out->bf16 = bf16;
        out->k = bf16 ? NULL : (const float *)(const void *)payload;
        out->v = bf16 ? NULL : out->k + nf;
        out->k16 = bf16 ? (const uint16_t *)(const void *)payload : NULL;
        out->v16 = bf16 ? out->k16 + nf : NULL;
        out->ids = ids;
    }
    if (why) *why = KVL_SPAN_OK;
    return KVL_OK;
}

kvl_status kvl__span_encode(const kvl__span_source *src, uint32_t t0, uint32_t t1,
                            const char *target_name, const char *target_hash,
                            kvl__span_ids *ids_storage, Kvlingo__V1__SpanHeader *h,
                            uint8_t **payload, size_t *len) {
    if (!src || !src->read_prenorm || !src->ids || !ids_storage || !h || !payload || !len)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "span: encode: NULL argument");
    *payload = NULL;
    *len = 0;
    if (t1 <= t0 || t1 > src->n_held)
        return kvl__errorf(KVL_ERR_RANGE, "span: range [%u, %u) not within the %u cached tokens",
                           t0, t1, src->n_held);
    uint32_t n = t1 - t0;
    const uint32_t eb = src->bf16 ? 2 : 4;
    uint64_t bytes = kvl__span_payload_bytes_of(src->n_layers, src->n_kv_heads, src->head_dim, n, eb);
    if (bytes == 0 || bytes > SIZE_MAX)
        return kvl__errorf(KVL_ERR_RANGE, "span: %u tokens is too large a span", n);
    if (src->trailer_room > SIZE_MAX - bytes)
        return kvl__errorf(KVL_ERR_RANGE, "span: %u tokens is too large a span", n);
    uint8_t *buf = kvl__spanbuf_take(src->bufs, (size_t)bytes + src->trailer_room);
    if (!buf) return kvl__errorf(KVL_ERR_NOMEM, "span: payload of %llu bytes",
                                (unsigned long long)bytes);
    size_t row = (size_t)src->n_kv_heads * src->head_dim;
    size_t per_layer = (size_t)n * row, nf = (size_t)src->n_layers * per_layer;
    int32_t *ids = (int32_t *)(void *)(buf + 2 * nf * eb);
    /* bf16: the source's own reader when it has one (one pass, all layers: a node's); else each
     * layer read as float32 over the whole range (the range's inverse RoPE, as
     * kvl_cache_read_prenorm makes it) and rounded into the payload */
    const int whole16 = src->bf16 && src->read_prenorm_bf16;
    if (whole16) {
        kvl_status st = src->read_prenorm_bf16(src->ctx, (int)t0, (int)t1, (uint16_t *)(void *)buf,
                                               (uint16_t *)(void *)buf + nf);
        if (st != KVL_OK) {
            kvl__spanbuf_give(src->bufs, buf);
            return st;
        }
    }
    float *tmp = NULL;
    if (src->bf16 && !whole16 && !(tmp = malloc(2 * per_layer * sizeof(float)))) {
        kvl__spanbuf_give(src->bufs, buf);
        return kvl__errorf(KVL_ERR_NOMEM, "span: encode: %zu floats of one layer", 2 * per_layer);
    }
    for (uint32_t l = 0; !whole16 && l < src->n_layers; l++) {
        const size_t off = l * per_layer;
        float *k = tmp ? tmp : (float *)(void *)buf + off;
        float *v = tmp ? tmp + per_layer : (float *)(void *)buf + nf + off;
        kvl_status st = src->read_prenorm(src->ctx, (int)l, (int)t0, (int)t1, k, v);
        if (st != KVL_OK) {
            free(tmp);
            kvl__spanbuf_give(src->bufs, buf);
            return st;
        }
        if (tmp) {
            kvl__bf16_round_n((uint16_t *)(void *)buf + off, k, per_layer);
            kvl__bf16_round_n((uint16_t *)(void *)buf + nf + off, v, per_layer);
        }
    }
    free(tmp);
    memcpy(ids, src->ids + t0, n * sizeof(int32_t));
    kvlingo__v1__model_id__init(&ids_storage->source);
    kvlingo__v1__model_id__init(&ids_storage->target);
    ids_storage->source.name = (char *)(src->model_name ? src->model_name : "");
    ids_storage->source.hash = (char *)(src->model_hash ? src->model_hash : "");
    ids_storage->target.name = (char *)(target_name ? target_name : "");
    ids_storage->target.hash = (char *)(target_hash ? target_hash : "");
    h->version = 1;
    h->source = &ids_storage->source;
    h->target = &ids_storage->target;
    h->n_layers = src->n_layers;
    h->n_kv_heads = src->n_kv_heads;
    h->head_dim = src->head_dim;
    h->dtype = src->bf16 ? KVLINGO__V1__DTYPE__DTYPE_BF16 : KVLINGO__V1__DTYPE__DTYPE_F32;
    h->capture = KVLINGO__V1__CAPTURE_POINT__CAPTURE_PRENORM;
    h->t0 = t0;
    h->t1 = t1;
    h->payload_bytes = bytes;
    h->checksum = kvl__span_checksum(buf, (size_t)bytes);
    *payload = buf;
    *len = (size_t)bytes;
    return KVL_OK;
}

kvl_status kvl__span_trailer_write(const Kvlingo__V1__SpanHeader *h, uint8_t *room, size_t room_len,
                                  size_t *trailer_len) {
    if (!h || !room || !trailer_len) return kvl__errorf(KVL_ERR_INVALID_ARG, "span: trailer: NULL");
    *trailer_len = 0;
    size_t hl = kvlingo__v1__span_header__get_packed_size(h);
    if (hl > KVL_SPAN_TRAILER_MAX - 8 || room_len < hl + 8)
        return kvl__errorf(KVL_ERR_RANGE, "span: a header of %zu bytes does not fit a trailer of %zu", hl,
                           room_len);
    kvlingo__v1__span_header__pack(h, room);
    const uint32_t words[2] = {(uint32_t)hl, KVL_SPAN_TRAILER_MAGIC};
    for (int w = 0; w < 2; w++)   /* little-endian whatever the host */
        for (int b = 0; b < 4; b++) room[hl + 4 * (size_t)w + (size_t)b] = (uint8_t)(words[w] >> (8 * b));
    *trailer_len = hl + 8;
    return KVL_OK;
}

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int kvl__span_trailer_find(const uint8_t *msg, size_t len, size_t *payload_len,
                           const uint8_t **header, size_t *header_len) {
    if (!msg || len < 8 || !payload_len || !header || !header_len) return 0;
    if (le32(msg + len - 4) != KVL_SPAN_TRAILER_MAGIC) return 0;
    size_t hl = le32(msg + len - 8);
    if (hl > KVL_SPAN_TRAILER_MAX - 8 || hl > len - 8) return 0;
    *payload_len = len - 8 - hl;
    *header = msg + *payload_len;
    *header_len = hl;
    return 1;
}
