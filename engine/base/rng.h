/* engine/base/rng.h: the project's one seedable generator, splitmix64 (Steele, Lea, Flood,
 * "Fast splittable pseudorandom number generators", OOPSLA 2014; reference constants from
 * https://prng.di.unimi.it/splitmix64.c).  Its state is one integer, so a stream is fully
 * determined by its seed: random weights, random translator maps, training batches and the
 * sampler's xoshiro seeding all draw from it.  Header-only (inline) so hot loops stay inlined,
 * and usable from CUDA device code (the GPU's random weights use the same mixer). */
#ifndef KVL_BASE_RNG_H
#define KVL_BASE_RNG_H

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define KVL__HOST_DEVICE __host__ __device__
#else
#define KVL__HOST_DEVICE
#endif

/* The value splitmix64 returns when its state steps to x + golden ratio: the output mixer, as
 * a pure function, so parallel code (one GPU thread per element) can draw element i directly. */
static inline KVL__HOST_DEVICE uint64_t kvl__splitmix64_at(uint64_t x) {
    uint64_t z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Next 64-bit value of the stream whose state is *state (advanced). */
static inline uint64_t kvl__splitmix64(uint64_t *state) {
    uint64_t z = kvl__splitmix64_at(*state);
    *state += 0x9E3779B97F4A7C15ull;
    return z;
}

/* Uniform integer in [0, n) (0 when n == 0); modulo bias is below 2^-40 for the n used here. */
static inline uint64_t kvl__rng_below(uint64_t *state, uint64_t n) {
    return n ? kvl__splitmix64(state) % n : 0;
}

/* Fill p[n] with floats uniform in [-a, a): the top 24 bits of each draw, so the values are
 * exact in float32 and identical on every platform. */
static inline void kvl__rng_fill_uniform(float *p, size_t n, uint64_t *state, float a) {
    for (size_t i = 0; i < n; i++)
        p[i] = (2.0f * (float)(kvl__splitmix64(state) >> 40) / 16777216.0f - 1.0f) * a;
}

#endif
