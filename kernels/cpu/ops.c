/* kernels/cpu/ops.c: CPU forward kernels (see ops.h). */
#include "ops.h"

#include "fastmath.h"
#include "kvlingo/rope.h"

#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void kvl__cpu_matmul_forward(float *out, const float *in, const float *W, const float *bias,
                            int T, int K, int N) {
    if (T == 1) {
        /* decode: matrix-vector is cheaper through sgemv than a 1-row sgemm */
        if (bias) memcpy(out, bias, sizeof(float) * (size_t)N);
        cblas_sgemv(CblasRowMajor, CblasNoTrans, N, K, 1.0f, W, K, in, 1, bias ? 1.0f : 0.0f, out, 1);
        return;
    }
    if (bias) {
        for (int t = 0; t < T; t++) memcpy(out + (size_t)t * N, bias, sizeof(float) * (size_t)N);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, N, K, 1.0f, in, K, W, K,
                bias ? 1.0f : 0.0f, out, N);
}

KVL_MULTIVERSION
void kvl__cpu_rmsnorm_forward(float *out, const float *in, const float *w, int T, int C, float eps) {
    for (int t = 0; t < T; t++) {
        const float *x = in + (size_t)t * C;
        float *o = out + (size_t)t * C;
        /* 16 partial sums, so the compiler runs the sum of squares 16 lanes wide (a single
         * float accumulator is a chain it may not reorder) */
        float acc[16] = {0};
        int i = 0;
        for (; i + 16 <= C; i += 16)
            for (int l = 0; l < 16; l++) acc[l] += x[i + l] * x[i + l];
        for (; i < C; i++) acc[0] += x[i] * x[i];
        float ss = 0.0f;
        for (int l = 0; l < 16; l++) ss += acc[l];
        float r = 1.0f / sqrtf(ss / (float)C + eps);
        for (int i = 0; i < C; i++) o[i] = w[i] * (x[i] * r);
    }
}

/* seq_len of a call: the largest position + 1 (only `dynamic` RoPE reads it) */
static int rope_seq_len(const int *pos, int T) {
    int m = 0;
    for (int t = 0; t < T; t++) m = pos[t] + 1 > m ? pos[t] + 1 : m;
    return m;
}

/* cos/sin[T, D/2] of angle float(pos) * inv_freq[i], times `scale` (1.0f leaves them exact) */
static void rope_fill(float *cos_tab, float *sin_tab, const int *pos, int T, int half,
                      const float *inv_freq, float scale) {
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            float *c = &cos_tab[(size_t)t * half + i], *s = &sin_tab[(size_t)t * half + i];
            sincosf((float)pos[t] * inv_freq[i], s, c);
            if (scale != 1.0f) { *c = *c * scale; *s = *s * scale; }
        }
}

void kvl__cpu_rope_angles(float *cos_out, float *sin_out, int pos, int D,
                          const kvl_rope_params *rope) {
    kvl__cpu_rope_table(cos_out, sin_out, &pos, 1, D, rope);
}

void kvl__cpu_rope_table(float *cos_tab, float *sin_tab, const int *pos, int T, int D,
                         const kvl_rope_params *rope) {
    kvl__cpu_rope_table_len(cos_tab, sin_tab, pos, T, D, rope, rope_seq_len(pos, T));
}

void kvl__cpu_rope_table_len(float *cos_tab, float *sin_tab, const int *pos, int T, int D,
                             const kvl_rope_params *rope, int seq_len) {
    float inv_freq[512], attn;   /* head_dim <= 1024 (kvl_config_parse) */
    kvl_rope_inv_freq(rope, seq_len, inv_freq, &attn);
    rope_fill(cos_tab, sin_tab, pos, T, D / 2, inv_freq, attn);
}

void kvl__rope_cache_create(const kvl_rope_params *rope, int D, kvl__rope_cache *out) {
    memset(out, 0, sizeof *out);
    out->rope = *rope;
    const int half = D / 2;
    size_t cap = KVL__ROPE_CACHE_BYTES / (sizeof(float) * 2 * (size_t)(half > 0 ? half : 1));
    int n = rope->max_position_embeddings;
    if (n <= 0 || half <= 0) return;
    if ((size_t)n > cap) n = (int)cap;
    float *t = malloc(sizeof(float) * 2 * (size_t)n * half);
    int *pos = malloc(sizeof(int) * (size_t)n);
    if (!t || !pos) {   /* a speed-up only: computed rows instead */
        free(t);
        free(pos);
        return;
    }
    for (int i = 0; i < n; i++) pos[i] = i;
    /* seq_len 0: dynamic RoPE's frequencies at init, those of every seq_len up to
     * max_position_embeddings */
    kvl__cpu_rope_table_len(t, t + (size_t)n * half, pos, n, D, rope, 0);
    free(pos);
    out->cos = t;
    out->sin = t + (size_t)n * half;
    out->n_pos = n;
    out->half = half;
}

static int rope_same(const kvl_rope_params *a, const kvl_rope_params *b) {
    return a->type == b->type && a->theta == b->theta && a->dim == b->dim &&
           a->max_position_embeddings == b->max_position_embeddings && a->factor == b->factor &&
           a->original_max_position_embeddings == b->original_max_position_embeddings &&
           a->low_freq_factor == b->low_freq_factor && a->high_freq_factor == b->high_freq_factor &&
           a->beta_fast == b->beta_fast && a->beta_slow == b->beta_slow &&
           a->attention_factor == b->attention_factor && a->mscale == b->mscale &&
           a->mscale_all_dim == b->mscale_all_dim && a->truncate == b->truncate;
}

int kvl__rope_cache_covers(const kvl__rope_cache *rc, const kvl_rope_params *rope, int D, int p0, int n) {
    return rc && rc->n_pos > 0 && rc->half == D / 2 && p0 >= 0 && n >= 0 &&
           (int64_t)p0 + n <= rc->n_pos && rope_same(&rc->rope, rope);
}

void kvl__rope_cache_free(kvl__rope_cache *rc) {
    if (!rc) return;
    free(rc->cos);   /* one allocation: sin follows cos */
    memset(rc, 0, sizeof *rc);
}

void kvl__cpu_rope_table_cached(const kvl__rope_cache *rc, float *cos_tab, float *sin_tab,
                                const int *pos, int T, int D, const kvl_rope_params *rope) {
    const int half = D / 2;
    int ok = kvl__rope_cache_covers(rc, rope, D, 0, 0);
    for (int t = 0; ok && t < T; t++) ok = pos[t] >= 0 && pos[t] < rc->n_pos;
    if (!ok) {
        kvl__cpu_rope_table(cos_tab, sin_tab, pos, T, D, rope);
        return;
    }
    for (int t = 0; t < T; t++) {
        memcpy(cos_tab + (size_t)t * half, rc->cos + (size_t)pos[t] * half, sizeof(float) * half);
        memcpy(sin_tab + (size_t)t * half, rc->sin + (size_t)pos[t] * half, sizeof(float) * half);
    }
}

void kvl__cpu_rope_table_mode(float *cos_tab, float *sin_tab, const int *pos, int T, int D,
                              const kvl_rope_params *rope, int mode) {
    float inv_freq[512], attn;   /* head_dim <= 1024 (kvl_config_parse) */
    kvl_rope_inv_freq(rope, rope_seq_len(pos, T), inv_freq, &attn);
    rope_fill(cos_tab, sin_tab, pos, T, D / 2, inv_freq, mode == KVL_ROPE_INVERSE ? 1.0f / attn : attn);
}

void kvl__cpu_rope_apply(float *x, const float *cos_tab, const float *sin_tab, int T, int n_heads,
                        int D, int inverse) {
    int half = D / 2;
    float sgn = inverse ? -1.0f : 1.0f;
    for (int t = 0; t < T; t++) {
        const float *cs = cos_tab + (size_t)t * half, *sn = sin_tab + (size_t)t * half;
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)t * n_heads + h) * D;
            for (int i = 0; i < half; i++) {
                float x1 = v[i], x2 = v[i + half];
                float c = cs[i], s = sgn * sn[i];
                v[i] = x1 * c - x2 * s;
                v[i + half] = x2 * c + x1 * s;
            }
        }
    }
}

void kvl__cpu_rope_forward(float *x, const int *pos, int T, int n_heads, int D,
                          const kvl_rope_params *rope, int mode) {
    float inv_freq[512], attn, cs[512], sn[512];
    kvl_rope_inv_freq(rope, rope_seq_len(pos, T), inv_freq, &attn);
    float scale = mode == KVL_ROPE_INVERSE ? 1.0f / attn : attn;
    for (int t = 0; t < T; t++) {   /* one position at a time: no allocation */
        rope_fill(cs, sn, &pos[t], 1, D / 2, inv_freq, scale);
        kvl__cpu_rope_apply(x + (size_t)t * n_heads * D, cs, sn, 1, n_heads, D, mode != KVL_ROPE_FORWARD);
    }
}

/* silu(g) * up = g * sigmoid(g) * up, sigmoid from e = e^-|g| (kvl__exp_nonpos, where expf is a
 * call per element): 1 / (1 + e) for g >= 0, e / (1 + e) below. */
static inline __attribute__((always_inline)) float swiglu_one(float g, float u) {
    const float e = kvl__exp_nonpos(-fabsf(g));
    return g * ((g >= 0.0f ? 1.0f : e) / (1.0f + e)) * u;
}

#ifdef KVL_HAVE_EXP_AVX2
/* swiglu_one 8 lanes at a time, the last n % 8 masked, so every element takes the same
 * arithmetic wherever it sits in the array (a batch's row gets the bits it gets alone).  GCC
 * at -O2 leaves the plain loop scalar for AVX2 (the select is control flow to it): measured
 * 5.7% of a 16-session decode step's samples, on the thread the pool's worker waits for. */
KVL_AVX2_FMA_FN static void swiglu_avx2(float *out, const float *gate, const float *up, size_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f), zero = _mm256_setzero_ps();
    size_t i = 0;
    for (;; i += 8) {
        const int full = i + 8 <= n;
        if (!full && i >= n) break;
        const __m256i m = full ? _mm256_set1_epi32(-1) : kvl__tail_mask_avx2((int)(n - i));
        const __m256 g = full ? _mm256_loadu_ps(gate + i) : _mm256_maskload_ps(gate + i, m);
        const __m256 u = full ? _mm256_loadu_ps(up + i) : _mm256_maskload_ps(up + i, m);
        const __m256 e = kvl__exp_nonpos_avx2(_mm256_or_ps(g, sign));   /* e^-|g| */
        const __m256 num = _mm256_blendv_ps(e, one, _mm256_cmp_ps(g, zero, _CMP_GE_OQ));
        const __m256 y = _mm256_mul_ps(_mm256_mul_ps(g, _mm256_div_ps(num, _mm256_add_ps(one, e))), u);
        if (full) _mm256_storeu_ps(out + i, y);
        else {
            _mm256_maskstore_ps(out + i, m, y);
            break;
        }
    }
}
#endif

void kvl__cpu_swiglu_forward(float *out, const float *gate, const float *up, size_t n) {
#ifdef KVL_HAVE_EXP_AVX2
    if (kvl__cpu_has_avx2_fma()) {
        swiglu_avx2(out, gate, up, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) out[i] = swiglu_one(gate[i], up[i]);
}

#ifdef KVL_HAVE_EXP_AVX2
KVL_AVX2_FMA_FN static void softmax_rows_avx2(float *x, int rows, int n) {
    for (int r = 0; r < rows; r++) kvl__softmax_row_avx2(x + (size_t)r * n, n);
}
#endif

void kvl__cpu_softmax_rows(float *x, int rows, int n) {
#ifdef KVL_HAVE_EXP_AVX2
    if (kvl__cpu_has_avx2_fma()) {   /* expf is a library call per element (3.7% of a batched
                                        decode run's samples went to the prompts' softmax rows) */
        softmax_rows_avx2(x, rows, n);
        return;
    }
#endif
    for (int r = 0; r < rows; r++) {
        float *row = x + (size_t)r * n;
        float m = -INFINITY;
        for (int j = 0; j < n; j++) m = row[j] > m ? row[j] : m;
        float sum = 0.0f;
        for (int j = 0; j < n; j++) { row[j] = expf(row[j] - m); sum += row[j]; }
        float inv = 1.0f / sum;
        for (int j = 0; j < n; j++) row[j] *= inv;
    }
}

/* Queries are processed in chunks so the score matrix stays bounded for long contexts. */
#define KVL_ATTN_QCHUNK 256

size_t kvl__cpu_attention_scratch(int Tq, int Tk) {
    int qc = Tq < KVL_ATTN_QCHUNK ? Tq : KVL_ATTN_QCHUNK;
    return (size_t)qc * (size_t)Tk;
}

void kvl__cpu_attention_forward(float *out, float *probs, const float *q, const float *k,
                               const float *v, int Tq, int Tk, int q_pos0, int Hq, int Hkv, int D,
                               float *scratch) {
    const int group = Hq / Hkv;
    const int ldq = Hq * D, ldk = Hkv * D;
    const float scale = 1.0f / sqrtf((float)D);
    for (int h = 0; h < Hq; h++) {
        const int g = h / group;
        for (int c0 = 0; c0 < Tq; c0 += KVL_ATTN_QCHUNK) {
            int nq = Tq - c0 < KVL_ATTN_QCHUNK ? Tq - c0 : KVL_ATTN_QCHUNK;
            /* keys visible to the last query of this chunk */
            int nk = q_pos0 + c0 + nq;
            if (nk > Tk) nk = Tk;
            float *S = scratch;   /* [nq, nk] with row stride nk */
            const float *qh = q + (size_t)c0 * ldq + (size_t)h * D;
            const float *kg = k + (size_t)g * D;
            const float *vg = v + (size_t)g * D;
            if (nq == 1) {
                cblas_sgemv(CblasRowMajor, CblasNoTrans, nk, D, scale, kg, ldk, qh, 1, 0.0f, S, 1);
            } else {
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, D, scale, qh, ldq, kg,
                            ldk, 0.0f, S, nk);
            }
            for (int i = 0; i < nq; i++) {
                float *row = S + (size_t)i * nk;
                int last = q_pos0 + c0 + i;   /* keys 0..last visible */
                int vis = last + 1 < nk ? last + 1 : nk;
                kvl__cpu_softmax_rows(row, 1, vis);
                for (int j = vis; j < nk; j++) row[j] = 0.0f;
                if (probs) {
                    float *pr = probs + ((size_t)h * Tq + c0 + i) * Tk;
                    memcpy(pr, row, sizeof(float) * (size_t)nk);
                    for (int j = nk; j < Tk; j++) pr[j] = 0.0f;
                }
            }
            float *oh = out + (size_t)c0 * ldq + (size_t)h * D;
            if (nq == 1) {
                cblas_sgemv(CblasRowMajor, CblasTrans, nk, D, 1.0f, vg, ldk, S, 1, 0.0f, oh, 1);
            } else {
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, D, nk, 1.0f, S, nk, vg,
                            ldk, 0.0f, oh, ldq);
            }
        }
    }
}

