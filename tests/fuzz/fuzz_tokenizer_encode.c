/* tests/fuzz/fuzz_tokenizer_encode.c: libFuzzer target for encode, decode and streaming decode on
 * a small byte-level BPE tokenizer (fuzz_tokenizer_common.h).  Checks: invalid UTF-8 is refused,
 * ids are in range, decode succeeds, streamed pieces are valid UTF-8 and join to the one-shot
 * decode. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_tokenizer_common.h"
#include "kvlingo/tokenizer.h"

static kvl_tokenizer *g_tok;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_tok) {
        char *json = fuzz_mini_tokenizer_json();
        if (!json || kvl__tokenizer_load_json(json, strlen(json), "fuzz-mini", &g_tok) != KVL_OK) __builtin_trap();
        free(json);
    }
    int32_t *ids = NULL;
    size_t n = 0;
    kvl_status st = kvl_tokenizer_encode(g_tok, (const char *)data, size, &ids, &n);
    if (!kvl__utf8_valid((const char *)data, size)) {
        if (st != KVL_ERR_INVALID_ARG) __builtin_trap();
        return 0;
    }
    if (st != KVL_OK) __builtin_trap();
    if (size > 0 && n == 0) __builtin_trap();   /* every byte has a token */
    char *dec = NULL;
    size_t dl = 0;
    if (kvl_tokenizer_decode(g_tok, ids, n, &dec, &dl) != KVL_OK) __builtin_trap();
    kvl_detok *d;
    if (kvl_detok_create(g_tok, &d) != KVL_OK) __builtin_trap();
    size_t cap = kvl_detok_push_capacity(g_tok), len, jl = 0;
    char *buf = malloc(cap), *joined = malloc(dl + cap + 1);
    if (!buf || !joined) __builtin_trap();
    for (size_t i = 0; i < n; i++) {
        if (kvl_detok_push(d, ids[i], buf, cap, &len) != KVL_OK || !kvl__utf8_valid(buf, len)) __builtin_trap();
        memcpy(joined + jl, buf, len);
        jl += len;
    }
    if (kvl_detok_flush(d, buf, cap, &len) != KVL_OK) __builtin_trap();
    memcpy(joined + jl, buf, len);
    jl += len;
    if (jl != dl || memcmp(joined, dec, dl)) __builtin_trap();
    kvl_detok_free(d);
    free(buf);
    free(joined);
    free(dec);
    free(ids);
    return 0;
}
