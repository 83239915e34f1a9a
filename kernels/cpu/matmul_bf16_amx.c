/* kernels/cpu/matmul_bf16_amx.c: bf16-weight prefill on AMX tiles (see matmul_bf16_amx.h).
 *
 * Tile registers: tmm0-3 the float32 accumulators of a 32-row (2 x 16 weight rows) by 32-token
 * (2 x 16 input rows) block, tmm4-5 the two weight tiles, tmm6-7 two input tiles (hi, then lo).
 * Per 32 k: 2 weight tiles from W, 4 input tiles from the packed buffer, 8 TDPBF16PS.  The
 * weight block (32 rows x K, 96 KB at K = 1536) is re-read from L2 for every 32 tokens, so W
 * streams from memory once per call.
 *
 * GCC's tile intrinsics are asm statements that name no memory operands, so the compiler is
 * told by a barrier that tile stores wrote the result buffer. */
#include "matmul_bf16_amx.h"

#include <string.h>

#if defined(__x86_64__) && defined(__linux__) && \
    ((defined(__GNUC__) && __GNUC__ >= 11) || (defined(__clang__) && __clang_major__ >= 12))
#define KVL_HAVE_AMX 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define KVL_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))
#define KVL_ARCH_REQ_XCOMP_PERM 0x1023   /* linux/arch/x86/include/uapi/asm/prctl.h */
#define KVL_XFEATURE_XTILEDATA 18
#endif

size_t kvl__amx_pack_bytes(int T, int K) { return (size_t)((T + 31) & ~31) * (size_t)K * 4; }

#ifndef KVL_HAVE_AMX

int kvl__amx_usable(void) { return 0; }
int kvl__amx_matmul_bf16(kvl__pool *pool, float *out, const float *in, const uint16_t *W,
                         const float *bias, int T, int K, int N, void *pack, size_t pack_bytes) {
    (void)pool, (void)out, (void)in, (void)W, (void)bias, (void)T, (void)K, (void)N, (void)pack,
        (void)pack_bytes;
    return -1;
}

#else

static int amx_probe(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    const int tile = (d >> 24) & 1, bf16 = (d >> 22) & 1;
    if (!tile || !bf16) return 0;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512bf16"))
        return 0;
    /* Linux >= 5.16 hands out the 8 KB tile state only to processes that ask for it */
    return syscall(SYS_arch_prctl, KVL_ARCH_REQ_XCOMP_PERM, KVL_XFEATURE_XTILEDATA) == 0;
}

int kvl__amx_usable(void) {
    static int usable = -1;   /* a benign race: every caller computes the same answer */
    if (usable < 0) usable = amx_probe();
    return usable;
}

/* LDTILECFG's 64-byte operand (Intel SDM vol. 2, "LDTILECFG"), palette 1: 8 tiles of up to
 * 16 rows x 64 bytes. */
typedef struct amx_cfg {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

KVL_AMX static void amx_config(void) {
    amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette_id = 1;
    for (int i = 0; i < 8; i++) c.colsb[i] = 64, c.rows[i] = 16;   /* every tile 16 x 64 bytes */
    _tile_loadconfig(&c);
}

typedef struct amx_job {
    float *out;
    const float *in;
    const uint16_t *W;
    const float *bias;
    uint32_t *hi, *lo;   /* [TB][KB][16 kk][16 t]: pairs (k = 2kk, 2kk + 1) of token t */
    int T, Tp, K, N, N32;
} amx_job;

/* Pack k-blocks [kb0, kb1) of every token (rows >= T are zeros): per token and 32 k, the hi
 * and lo bf16 halves as 16 pairs, scattered into column t of the block's tile. */
KVL_AMX static void pack_part(void *pj, int part, int n_parts) {
    const amx_job *j = pj;
    const int KB = j->K / 32, per = (KB + n_parts - 1) / n_parts;
    const int kb0 = part * per < KB ? part * per : KB, kb1 = kb0 + per < KB ? kb0 + per : KB;
    const __m512i rows = _mm512_mullo_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(16));
    for (int t = 0; t < j->Tp; t++) {
        const size_t tile0 = (size_t)(t / 16) * KB * 256 + (t % 16);
        for (int kb = kb0; kb < kb1; kb++) {
            uint32_t *dh = j->hi + tile0 + (size_t)kb * 256, *dl = j->lo + tile0 + (size_t)kb * 256;
            __m512i hv = _mm512_setzero_si512(), lv = _mm512_setzero_si512();
            if (t < j->T) {
                const float *x = j->in + (size_t)t * j->K + (size_t)kb * 32;
                const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
                hv = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);   /* bf16 k = 0..31, round to even */
                const __m512 h0 = _mm512_castsi512_ps(
                    _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(hv)), 16));
                const __m512 h1 = _mm512_castsi512_ps(
                    _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(hv, 1)), 16));
                lv = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(x1, h1), _mm512_sub_ps(x0, h0));
            }
            _mm512_i32scatter_epi32(dh, rows, hv, 4);
            _mm512_i32scatter_epi32(dl, rows, lv, 4);
        }
    }
}

/* Result tile c (16 weight rows x 16 tokens, float32) into out[t0.., n..n+16), plus bias. */
KVL_AMX static void store_tile(const amx_job *j, const float *c, int t0, int n) {
    const __m512i cols = _mm512_mullo_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(16));
    const __m512 b = j->bias ? _mm512_loadu_ps(j->bias + n) : _mm512_setzero_ps();
    for (int t = 0; t < 16 && t0 + t < j->T; t++)
        _mm512_storeu_ps(j->out + (size_t)(t0 + t) * j->N + n,
                         _mm512_add_ps(_mm512_i32gather_ps(cols, c + t, 4), b));
}

/* Weight rows in 32-row blocks [blk0, blk1) against every token. */
KVL_AMX static void gemm_part(void *pj, int part, int n_parts) {
    const amx_job *j = pj;
    const int NB = j->N32 / 32, per = (NB + n_parts - 1) / n_parts;
    const int blk0 = part * per < NB ? part * per : NB, blk1 = blk0 + per < NB ? blk0 + per : NB;
    if (blk0 >= blk1) return;
    const int KB = j->K / 32, TB = j->Tp / 16;
    const long wstride = (long)j->K * 2, tstride = 64;
    float c[4][256] __attribute__((aligned(64)));
    amx_config();
    for (int blk = blk0; blk < blk1; blk++) {
        const uint16_t *w0 = j->W + (size_t)blk * 32 * j->K, *w1 = w0 + (size_t)16 * j->K;
        for (int tb = 0; tb < TB; tb += 2) {
            const uint32_t *h0 = j->hi + (size_t)tb * KB * 256, *l0 = j->lo + (size_t)tb * KB * 256;
            const int n = blk * 32, t0 = tb * 16;
            if (tb + 1 == TB) {
                /* one block of 16 tokens (T <= 16: a switch's turn, a short chunk): half the
                 * tile products of a pair */
                const uint32_t *half[2] = {h0, l0};
                _tile_zero(0);
                _tile_zero(2);
                for (int kb = 0; kb < KB; kb++) {
                    const size_t o = (size_t)kb * 256;
                    _tile_loadd(4, w0 + kb * 32, wstride);
                    _tile_loadd(5, w1 + kb * 32, wstride);
                    for (int p = 0; p < 2; p++) {
                        _tile_loadd(6, half[p] + o, tstride);
                        _tile_dpbf16ps(0, 4, 6);
                        _tile_dpbf16ps(2, 5, 6);
                    }
                }
                _tile_stored(0, c[0], 64);
                _tile_stored(2, c[2], 64);
                __asm__ volatile("" ::: "memory");   /* the tile stores wrote c */
                store_tile(j, c[0], t0, n);
                store_tile(j, c[2], t0, n + 16);
                continue;
            }
            const uint32_t *half[2][2] = {{h0, h0 + (size_t)KB * 256}, {l0, l0 + (size_t)KB * 256}};
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int kb = 0; kb < KB; kb++) {
                const size_t o = (size_t)kb * 256;
                _tile_loadd(4, w0 + kb * 32, wstride);
                _tile_loadd(5, w1 + kb * 32, wstride);
                for (int p = 0; p < 2; p++) {   /* the hi, then the lo halves of the inputs */
                    _tile_loadd(6, half[p][0] + o, tstride);
                    _tile_loadd(7, half[p][1] + o, tstride);
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_dpbf16ps(1, 4, 7);
                    _tile_dpbf16ps(2, 5, 6);
                    _tile_dpbf16ps(3, 5, 7);
                }
            }
            _tile_stored(0, c[0], 64);
            _tile_stored(1, c[1], 64);
            _tile_stored(2, c[2], 64);
            _tile_stored(3, c[3], 64);
            __asm__ volatile("" ::: "memory");   /* the tile stores wrote c */
            store_tile(j, c[0], t0, n);
            store_tile(j, c[1], t0 + 16, n);
            store_tile(j, c[2], t0, n + 16);
            store_tile(j, c[3], t0 + 16, n + 16);
        }
    }
    _tile_release();   /* so a context switch does not save 8 KB of tile state */
}

static void run(kvl__pool *pool, kvl__pool_fn fn, amx_job *j) {
    if (pool) kvl__pool_run(pool, fn, j);
    else fn(j, 0, 1);
}

int kvl__amx_matmul_bf16(kvl__pool *pool, float *out, const float *in, const uint16_t *W,
                         const float *bias, int T, int K, int N, void *pack, size_t pack_bytes) {
    if (!kvl__amx_usable() || T < 1 || K < 32 || K % 32 || N < 32 || !pack) return -1;
    /* tile loads want no alignment, but 64-byte tiles on cache lines load in one line each */
    size_t skip = (64 - ((uintptr_t)pack & 63)) & 63;
    if (pack_bytes < skip) return -1;
    pack = (char *)pack + skip;
    pack_bytes -= skip;
    /* rows per pass: what the scratch holds, in 32s */
    size_t per_row = (size_t)K * 4;
    int t_pass = (int)((pack_bytes / per_row) & ~(size_t)31);
    if (t_pass < 32) return -1;
    for (int t0 = 0; t0 < T; t0 += t_pass) {
        const int Tn = T - t0 < t_pass ? T - t0 : t_pass, Tp = Tn <= 16 ? 16 : (Tn + 31) & ~31;
        amx_job j = {.out = out + (size_t)t0 * N, .in = in + (size_t)t0 * K, .W = W, .bias = bias,
                     .hi = pack, .T = Tn, .Tp = Tp, .K = K, .N = N, .N32 = N & ~31};
        j.lo = j.hi + (size_t)Tp * K / 2;
        run(pool, pack_part, &j);
        run(pool, gemm_part, &j);
    }
    return 0;
}

#endif
