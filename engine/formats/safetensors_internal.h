/* engine/formats/safetensors_internal.h: helpers shared by the safetensors reader, writer and the
 * sharded-set loader.  Not part of the public API (see include/kvlingo/safetensors.h). */
#ifndef KVL_ENGINE_SAFETENSORS_INTERNAL_H
#define KVL_ENGINE_SAFETENSORS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* True when s[0..len) is well-formed UTF-8 (no overlongs, no surrogates, <= U+10FFFF).
 * The reader requires it of the header (the format says UTF-8) and the writer of names, so
 * that we never write a file we would refuse to read. */
bool kvl__st_utf8_valid(const char *s, size_t len);

/* a * b into *out; false on int64 overflow.  Both factors must be >= 0. */
static inline bool kvl__st_mul_i64(int64_t a, int64_t b, int64_t *out) {
    if (a != 0 && b > INT64_MAX / a)
        return false;
    *out = a * b;
    return true;
}

#endif
