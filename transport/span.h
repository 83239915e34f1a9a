/* transport/span.h: encoding and checking a KV-cache span (kvlingo.v1.SpanHeader + payload).
 *
 * Payload (little-endian, no padding), for n = t1 - t0 tokens of a source model with Ls layers,
 * Hs kv heads, head_dim Ds, dtype f32 or bf16 (the header's dtype):
 *   K   [Ls][n][Hs*Ds] dtype     pre-norm keys (k_proj output, before k_norm and RoPE)
 *   V   [Ls][n][Hs*Ds] dtype     values (v_proj output)
 *   ids [n]            int32     token ids
 * A node whose KV cache holds bf16 sends bf16 (half the bytes; for k_norm models the pre-norm
 * keys and the values are bf16 in its cache already, so nothing is lost), and so does one whose
 * receiver asks for it because its translator rounds the span to bf16 before multiplying
 * (kvlingo.v1.ExportSpanRequest.wire_bf16: the same translation from half the bytes); a
 * receiver widens bf16 to float32 for the translator.
 * checksum = xxh3-64 (seed 0) of the payload.  These functions never trust the header: every
 * size is checked for overflow and against limits before anything is read. */
#ifndef KVL_SPAN_H
#define KVL_SPAN_H

#include <stddef.h>
#include <stdint.h>

#include "kvlingo/status.h"
#include "kvlingo/v1/span.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Why a span was refused; the names are the `reason` label of kvlingo_spans_rejected_total. */
typedef enum kvl__span_reject {
    KVL_SPAN_OK = 0,
    KVL_SPAN_MALFORMED,       /* header does not parse or is inconsistent                     */
    KVL_SPAN_WRONG_TARGET,    /* header names another target model                           */
    KVL_SPAN_NO_TRANSLATOR,   /* no translator from the source model to this one             */
    KVL_SPAN_GEOMETRY,        /* layers / heads / head_dim / dtype disagree                  */
    KVL_SPAN_RANGE,           /* token range not contiguous with the session, or too long    */
    KVL_SPAN_TRUNCATED,       /* payload shorter or longer than announced                    */
    KVL_SPAN_CHECKSUM,        /* xxh3-64 mismatch                                             */
    KVL_SPAN_BAD_VALUES,      /* token id out of range, NaN / Inf in K or V                   */
    KVL_SPAN_TRANSFER,        /* transport failure: peer gone, timeout                        */
    KVL_SPAN_TRANSLATE,       /* the translator refused or failed                             */
    KVL_SPAN_BUSY,            /* the session is busy with another operation                  */
    KVL_SPAN_N_REASONS
} kvl__span_reject;

const char *kvl__span_reject_name(kvl__span_reject r);

/* Limits that keep a hostile header from asking for absurd allocations. */
#define KVL_SPAN_MAX_LAYERS 1024
#define KVL_SPAN_MAX_HEADS 1024
#define KVL_SPAN_MAX_HEAD_DIM 4096
#define KVL_SPAN_MAX_TOKENS (1 << 22)

/* Payload bytes for a geometry and token count, float32 K/V (0 on overflow or out-of-limit
 * values): the largest a span of that geometry can be. */
uint64_t kvl__span_payload_bytes(uint32_t n_layers, uint32_t n_kv_heads, uint32_t head_dim,
                                uint32_t n_tokens);
/* The same for K/V elements of elem_bytes bytes (4: float32, 2: bf16). */
uint64_t kvl__span_payload_bytes_of(uint32_t n_layers, uint32_t n_kv_heads, uint32_t head_dim,
                                   uint32_t n_tokens, uint32_t elem_bytes);

/* Structural check of a header: version, capture point, dtype f32 or bf16, 1 <= n, t0 < t1
 * within limits, payload_bytes equal to kvl__span_payload_bytes_of(...) for the dtype and
 * <= max_payload.  On failure
 * sets *why and records a message (kvl_last_error). */
kvl_status kvl__span_header_check(const Kvlingo__V1__SpanHeader *h, uint64_t max_payload,
                                 kvl__span_reject *why);

/* A checked payload: pointers into the caller's payload buffer. */
typedef struct kvl__span_view {
    uint32_t t0, n;
    uint32_t n_layers, row;     /* row = Hs*Ds elements per token and layer */
    int bf16;                   /* K/V below are k16/v16, else k/v        */
    const float *k;             /* [Ls][n][row] float32 (NULL for bf16)   */
    const float *v;             /* [Ls][n][row]                           */
    const uint16_t *k16, *v16;  /* [Ls][n][row] bf16 (NULL for float32)   */
    const int32_t *ids;         /* [n]          */
} kvl__span_view;

/* Check a received payload against its (already header-checked) header: exact length,
 * checksum, token ids in [0, vocab), finite K/V (either dtype).  `payload` must be 4-byte
 * aligned. */
kvl_status kvl__span_payload_check(const Kvlingo__V1__SpanHeader *h, const uint8_t *payload,
                                  size_t len, int vocab, kvl__span_view *out,
                                  kvl__span_reject *why);

/* Where an encoded span comes from: the source model's identity and geometry, the token ids it
 * holds, and a reader of its pre-norm K/V (the node's backend export: kvl_cache_read_prenorm on
 * the node's cache).  The codec reads nothing else of the source. */
typedef kvl_status (*kvl__span_read_fn)(const void *ctx, int layer, int t0, int t1, float *k_out,
                                        float *v_out);
typedef kvl_status (*kvl__span_read_bf16_fn)(const void *ctx, int t0, int t1, uint16_t *k_out,
                                             uint16_t *v_out);
typedef struct kvl__span_source {
    const char *model_name, *model_hash;
    uint32_t n_layers, n_kv_heads, head_dim;    /* Ls, Hs, Ds                            */
    uint32_t n_held;                            /* tokens held: [0, n_held)              */
    const int32_t *ids;                         /* [n_held] token ids                    */
    kvl__span_read_fn read_prenorm;             /* layer l, tokens [t0, t1) -> k, v      */
    const void *ctx;                            /*   [t1-t0, Hs*Ds] float32 each         */
    struct kvl__spanbufs *bufs;                 /* where the payload buffer comes from   */
                                                /*   (spanbuf.h; NULL: a plain allocation) */
    int bf16;                                   /* send K/V as bf16 (rounded to nearest even) */
    uint32_t trailer_room;                      /* bytes kept free after the payload in its */
                                                /*   buffer (kvl__span_trailer_write); 0 none */
    kvl__span_read_bf16_fn read_prenorm_bf16;   /* bf16: every layer's tokens [t0, t1) at once */
                                                /*   into [Ls][t1-t0][Hs*Ds] each (optional: */
                                                /*   read_prenorm a chunk at a time otherwise) */
} kvl__span_source;

/* Build the payload of tokens [t0, t1) of `src`, and fill `h` (the caller's header,
 * initialised with KVLINGO__V1__SPAN_HEADER__INIT; its `source`/`target` sub-messages point
 * into `ids_storage`, which must outlive h).  *payload comes from kvl__spanbuf_take(src->bufs):
 * the caller gives it back with kvl__spanbuf_give(src->bufs, *payload).
 * Errors: KVL_ERR_RANGE (empty range, past the held tokens, too large), KVL_ERR_NOMEM, and
 * whatever the reader returns. */
typedef struct kvl__span_ids {
    Kvlingo__V1__ModelId source, target;
} kvl__span_ids;

kvl_status kvl__span_encode(const kvl__span_source *src, uint32_t t0, uint32_t t1,
                            const char *target_name, const char *target_hash,
                            kvl__span_ids *ids_storage, Kvlingo__V1__SpanHeader *h,
                            uint8_t **payload, size_t *len);

/* A span sent with its header behind the payload, in one message, so that the receiver can
 * check and translate the payload the moment it lands, before the sender's answer (which
 * carries the same header over the authenticated call) arrives:
 *   payload (as above) | header (kvlingo.v1.SpanHeader, header_len bytes) | header_len u32 LE |
 *   magic u32 LE "KVST" (KVL_SPAN_TRAILER_MAGIC)
 * The magic is larger than any vocabulary, so a payload without a trailer (which ends with a
 * token id) is never taken for one.  The payload keeps its alignment (it starts the buffer). */
#define KVL_SPAN_TRAILER_MAGIC 0x5453564Bu   /* "KVST" little-endian */
#define KVL_SPAN_TRAILER_MAX 4096            /* room a sender keeps and a receiver allows   */

/* Write the trailer of header `h` into room[0..room_len) (right after the payload): its packed
 * header, length and magic; *trailer_len the bytes written.  KVL_ERR_RANGE when it does not
 * fit (room_len < packed size + 8). */
kvl_status kvl__span_trailer_write(const Kvlingo__V1__SpanHeader *h, uint8_t *room, size_t room_len,
                                  size_t *trailer_len);

/* Read the trailer of a received message msg[0..len): 1 with *payload_len (the bytes before the
 * header), *header / *header_len (the packed header's bytes inside msg: unpack them with
 * kvlingo__v1__span_header__unpack, compare them with another copy byte for byte); 0 when msg
 * has no trailer (shorter than 8 bytes, another magic, a header length that does not fit in
 * front of it, or a header longer than KVL_SPAN_TRAILER_MAX - 8).  Reads only inside msg;
 * sets its outputs only when it returns 1. */
int kvl__span_trailer_find(const uint8_t *msg, size_t len, size_t *payload_len,
                           const uint8_t **header, size_t *header_len);

/* xxh3-64 of a buffer (the span checksum). */
uint64_t kvl__span_checksum(const void *data, size_t len);

#ifdef __cplusplus
}
#endif
#endif
