/* tests/fuzz/fuzz_tokenizer_load.c: libFuzzer target for the tokenizer.json loader.  A file that
 * loads must encode and decode without error. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "kvlingo/tokenizer.h"
#include "tokenizer_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kvl_tokenizer *tok = NULL;
    if (kvl__tokenizer_load_json((const char *)data, size, "fuzz.json", &tok) != KVL_OK) {
        if (tok) __builtin_trap();   /* no handle on error */
        return 0;
    }
    static const char text[] = "Hello, world! it's 12 <|im_end|> caf\xc3\xa9 \xf0\x9f\x98\x80\r\n  x";
    int32_t *ids = NULL;
    size_t n = 0;
    kvl_status st = kvl_tokenizer_encode(tok, text, sizeof text - 1, &ids, &n);
    if (st == KVL_OK) {
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || (size_t)ids[i] >= kvl_tokenizer_vocab_size(tok)) __builtin_trap();
        char *dec = NULL;
        if (kvl_tokenizer_decode(tok, ids, n, &dec, NULL) != KVL_OK) __builtin_trap();
        free(dec);
    }
    free(ids);
    kvl_tokenizer_free(tok);
    return 0;
}
