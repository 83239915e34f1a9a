/* kernels/cpu/kv_prefetch.h: the attention kernels' software prefetch of KV cache blocks, shared
 * by the prefill tiles (attention_decode.c) and the decode passes (attention_decode_avx512.c).
 * Private to kernels/cpu.
 *
 * Why: a cache's 16-token blocks sit anywhere in memory, and the hardware prefetchers, which
 * follow a stride, start over at every block; K/V a translation has just written past the
 * caches, or a long context's, are read from memory.  So each pass prefetches the rows of the
 * block KVL__KV_PF_BLOCKS ahead as it reaches the same row of the current block.  Measured on
 * a 2-core Zen 4: one prefill tile over 2048 keys read from memory 214 against 292 us (from
 * the caches unchanged, 88 us); the 9-token forward of a 2048-token switch 2.46-2.65 against
 * 2.73-2.95 ms (kvlingo bench switch, four interleaved pairs); decode at a 2,000-token context
 * one session 945 -> 1,612 tokens/s, 16 sessions 1,048 -> 1,129 (bench_batch, five pairs).  One
 * or four blocks ahead were not told apart from two. */
#ifndef KVL_KERNELS_CPU_KV_PREFETCH_H
#define KVL_KERNELS_CPU_KV_PREFETCH_H

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define KVL__KV_PF_BLOCKS 2

/* Prefetch rows [t0, t1) of a block (base: the head's first element of its row 0; row stride
 * `row` elements), `lines` 64-byte lines of each (the head's head_dim elements). */
#define KVL__KV_PREFETCH_ROWS(base, t0, t1, row, lines)                                          \
    do {                                                                                         \
        for (int pr_ = (t0); pr_ < (t1); pr_++) {                                                \
            const char *p_ = (const char *)((base) + (size_t)pr_ * (row));                       \
            for (int l_ = 0; l_ < (int)(lines); l_++) _mm_prefetch(p_ + 64 * l_, _MM_HINT_T0);   \
        }                                                                                        \
    } while (0)
#endif

#endif
