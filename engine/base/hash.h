/* engine/base/hash.h: XXH3-64 through xxHash's run-time dispatch where the library has it
 * (AVX-512 or AVX2 lanes chosen at load time; Debian's libxxhash exports the *_dispatch entry
 * points), else through its portable entry points.  The hash of given bytes is the same either
 * way: XXH3's result does not depend on the vector width (xxHash's specification).  Header-only;
 * whoever includes it links libxxhash. */
#ifndef KVL_BASE_HASH_H
#define KVL_BASE_HASH_H

#include <stddef.h>
#include <stdint.h>

#include <xxhash.h>
#if defined(KVL_HAVE_XXH_DISPATCH)
#include <xxh_x86dispatch.h>   /* renames XXH3_64bits* to their *_dispatch forms */
#endif

/* XXH3-64 of `len` bytes at `data` (seed 0). */
static inline uint64_t kvl__xxh3_64(const void *data, size_t len) { return XXH3_64bits(data, len); }

/* Streaming XXH3-64 (the same hash as kvl__xxh3_64 over the concatenated parts): `state` from
 * XXH3_createState, reset with XXH3_64bits_reset, finished with XXH3_64bits_digest. */
static inline XXH_errorcode kvl__xxh3_64_update(XXH3_state_t *state, const void *data, size_t len) {
    return XXH3_64bits_update(state, data, len);
}

#endif
