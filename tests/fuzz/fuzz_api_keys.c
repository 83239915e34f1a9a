/* tests/fuzz/fuzz_api_keys.c: libFuzzer target for the router's API key file parser
 * (router/tenants.c) and the Authorization value parser. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tenants.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kvr_tenants *t = NULL;
    if (kvr_tenants_parse((const char *)data, size, "fuzz.yaml", &t) == KVL_OK) {
        /* a table that parses has tenants, each with a key, within the bounds */
        int n = kvr_tenants_count(t), k = kvr_tenants_key_count(t);
        if (n < 1 || n > KVR_TENANTS_MAX || k < n || k > KVR_TENANT_KEYS_MAX) __builtin_trap();
        char name[KVR_TENANT_NAME_MAX];
        for (int i = 0; i < n; i++) {
            kvr_tenants_name(t, i, name, sizeof name);
            if (!name[0]) __builtin_trap();
        }
    } else if (kvr_tenants_anonymous(&t) != KVL_OK) {
        return 0;
    }
    /* the same bytes as a presented key and as an Authorization value */
    kvr_tenant_info info;
    (void)kvr_tenants_lookup(t, (const char *)data, size, &info);
    char *v = malloc(size + 1);
    if (v) {
        memcpy(v, data, size);
        v[size] = 0;
        if (kvr_tenants_authorize(t, v, &info) == 1 && !info.name[0]) __builtin_trap();
        free(v);
    }
    kvr_tenants_charge(t, "acme", (long)size, 1.0);
    (void)kvr_tenants_admit(t, "acme", (long)(size % 1000), 2.0, NULL);
    kvr_tenants_free(t);
    return 0;
}
