/* tests/fuzz/fuzz_config.c: libFuzzer target for the config.json parser. */
#include <stddef.h>
#include <stdint.h>

#include "kvlingo/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kvl_model_config c;
    if (kvl_config_parse((const char *)data, size, "fuzz.json", &c) == KVL_OK) {
        /* a config that parses must have a usable geometry */
        if (c.n_heads % c.n_kv_heads != 0 || c.head_dim <= 0 || c.head_dim % 2) __builtin_trap();
        (void)kvl_config_param_count(&c);
        (void)kvl_config_kv_bytes_per_token(&c);
    }
    return 0;
}
