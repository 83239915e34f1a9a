/* tests/fuzz/fuzz_safetensors.c: libFuzzer target for the safetensors reader.
 * Any input must either fail with a status and a message or yield tensors whose every byte
 * lies inside the input (ASan checks the walk and the conversions below). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvlingo/safetensors.h"

/* Convert only small tensors: large shapes are legal but would only make the run slow. */
#define FUZZ_MAX_ELEMENTS 4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kvl_safetensors *st = NULL;
    kvl_status s = kvl_safetensors_parse(data, size, "fuzz", &st);
    if (s != KVL_OK) {
        /* every failure must leave a message naming the input */
        if (st || !strstr(kvl_last_error(), "fuzz"))
            abort();
        return 0;
    }
    float buf[FUZZ_MAX_ELEMENTS];
    size_t n = kvl_safetensors_count(st);
    for (size_t i = 0; i < n; i++) {
        const kvl_st_tensor *t = kvl_safetensors_get(st, i);
        if (kvl_safetensors_find(st, t->name) != t)
            abort();
        const uint8_t *p = t->data;
        if (p < data || p + t->nbytes > data + size)
            abort();
        if (t->n_elements <= FUZZ_MAX_ELEMENTS) {
            s = kvl_st_tensor_to_f32(t, buf, (size_t)t->n_elements);
            if (s != KVL_OK && !(s == KVL_ERR_UNSUPPORTED && t->dtype == KVL_DTYPE_BOOL))
                abort();
        }
    }
    (void)kvl_safetensors_metadata(st, "format");
    kvl_safetensors_close(st);
    return 0;
}
