/* engine/model/sampling.c: greedy / temperature / top-k / top-p sampling (see sampling.h). */
#include "kvlingo/sampling.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "fastmath.h"
#include "rng.h"

struct kvl_sampler {
    kvl_sampler_params p;
    uint64_t s[4];        /* xoshiro256** state */
    int cap;
    int *idx;             /* [cap] candidate ids   */
    double *prob;         /* [cap] candidate probs */
};

kvl_sampler_params kvl_sampler_default_params(void) {
    kvl_sampler_params p = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    return p;
}


static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* xoshiro256** (Blackman & Vigna, https://prng.di.unimi.it/xoshiro256starstar.c) */
static uint64_t next_u64(kvl_sampler *s) {
    uint64_t *st = s->s;
    uint64_t r = rotl(st[1] * 5, 7) * 9, t = st[1] << 17;
    st[2] ^= st[0]; st[3] ^= st[1]; st[1] ^= st[2]; st[0] ^= st[3];
    st[2] ^= t; st[3] = rotl(st[3], 45);
    return r;
}

static double next_unit(kvl_sampler *s) { return (double)(next_u64(s) >> 11) * 0x1.0p-53; }

kvl_status kvl_sampler_create(const kvl_sampler_params *params, kvl_sampler **out) {
    kvl_sampler_params p = params ? *params : kvl_sampler_default_params();
    if (!(p.temperature >= 0.0f))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "sampler: temperature must be >= 0 (got %g)", p.temperature);
    if (p.top_k < 0) return kvl__errorf(KVL_ERR_INVALID_ARG, "sampler: top_k must be >= 0 (got %d)", p.top_k);
    if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "sampler: top_p must be in (0, 1] (got %g)", p.top_p);
    kvl_sampler *s = calloc(1, sizeof *s);
    if (!s) return kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    s->p = p;
    uint64_t x = p.seed;
    for (int i = 0; i < 4; i++) s->s[i] = kvl__splitmix64(&x);
    *out = s;
    return KVL_OK;
}

void kvl_sampler_free(kvl_sampler *s) {
    if (!s) return;
    free(s->idx);
    free(s->prob);
    free(s);
}

/* log softmax(logits)[id] = logits[id] - m - log(sum_i e^(logits[i] - m)), m the maximum.
 * Every decode step of every session computes it (the token's logprob goes out with it), so
 * the terms run 16 lanes wide in float (kvl__exp_nonpos, relative error < 2e-7 a term) and the
 * lanes' partial sums of each 1024 terms are added in double: a few 1e-6 from the all-double
 * form at most. */
#ifdef KVL_HAVE_EXP_AVX2
/* The form below on AVX2 + FMA, its 16 lanes as two 8-lane halves (GCC's vectoriser left the
 * exponentials scalar there): the same partial sums in the same order, each term's e^x within
 * a last bit of the plain form's. */
KVL_AVX2_FMA_FN static void lse_avx2(const float *logits, int vocab, double *m_out, double *log_sum) {
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0;
    int i = 0;
    for (; i + 16 <= vocab; i += 16) {
        /* maxps returns its second operand when one is NaN: NaN logits are passed over, as
         * the plain form's comparisons pass them over */
        m0 = _mm256_max_ps(_mm256_loadu_ps(logits + i), m0);
        m1 = _mm256_max_ps(_mm256_loadu_ps(logits + i + 8), m1);
    }
    float mv[16];
    _mm256_storeu_ps(mv, m0);
    _mm256_storeu_ps(mv + 8, m1);
    float m = -INFINITY;
    for (int l = 0; l < 16; l++) m = mv[l] > m ? mv[l] : m;
    for (int k = i; k < vocab; k++) m = logits[k] > m ? logits[k] : m;
    *m_out = m;
    *log_sum = 0.0;
    if (!(m > -INFINITY)) return;
    const __m256 mm = _mm256_set1_ps(m);
    double sum = 0.0;
    for (int j = 0; j < vocab;) {
        const int end = vocab - j < 1024 ? vocab : j + 1024;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0;
        for (; j + 16 <= end; j += 16) {
            a0 = _mm256_add_ps(a0, kvl__exp_nonpos_avx2(_mm256_sub_ps(_mm256_loadu_ps(logits + j), mm)));
            a1 = _mm256_add_ps(a1, kvl__exp_nonpos_avx2(_mm256_sub_ps(_mm256_loadu_ps(logits + j + 8), mm)));
        }
        float acc[16];
        _mm256_storeu_ps(acc, a0);
        _mm256_storeu_ps(acc + 8, a1);
        for (; j < end; j++) acc[0] += kvl__exp_nonpos(logits[j] - m);
        for (int l = 0; l < 16; l++) sum += acc[l];
    }
    *log_sum = log(sum);
}
#endif

KVL_MULTIVERSION
static void lse_lanes(const float *logits, int vocab, double *m_out, double *log_sum) {
    enum { LANES = 16 };
    float mv[LANES];
    for (int l = 0; l < LANES; l++) mv[l] = -INFINITY;
    int i = 0;
    for (; i + LANES <= vocab; i += LANES)
        for (int l = 0; l < LANES; l++) mv[l] = logits[i + l] > mv[l] ? logits[i + l] : mv[l];
    float m = -INFINITY;
    for (int l = 0; l < LANES; l++) m = mv[l] > m ? mv[l] : m;
    for (int k = i; k < vocab; k++) m = logits[k] > m ? logits[k] : m;
    *m_out = m;
    *log_sum = 0.0;
    if (!(m > -INFINITY)) return;   /* every logit -inf (or NaN): no softmax */
    double sum = 0.0;
    for (int j = 0; j < vocab;) {
        /* blocks of 1024 terms summed in float lanes, each block's lanes then added in double */
        const int end = vocab - j < 1024 ? vocab : j + 1024;
        float acc[LANES] = {0};
        for (; j + LANES <= end; j += LANES)
            for (int l = 0; l < LANES; l++) acc[l] += kvl__exp_nonpos(logits[j + l] - m);
        for (; j < end; j++) acc[0] += kvl__exp_nonpos(logits[j] - m);
        for (int l = 0; l < LANES; l++) sum += acc[l];
    }
    *log_sum = log(sum);
}

/* The maximum m of logits[vocab] and log(sum_i e^(logits[i] - m)) (0 when every logit is -inf
 * or NaN). */
static void log_sum_exp(const float *logits, int vocab, double *m, double *log_sum) {
#ifdef KVL_HAVE_EXP_AVX2
    if (kvl__cpu_has_avx2_fma()) {
        lse_avx2(logits, vocab, m, log_sum);
        return;
    }
#endif
    lse_lanes(logits, vocab, m, log_sum);
}

double kvl_logprob(const float *logits, int vocab, int32_t id) {
    if (!logits || vocab < 1 || id < 0 || id >= vocab) return NAN;   /* never read past logits */
    double m, ls;
    log_sum_exp(logits, vocab, &m, &ls);
    return (double)logits[id] - m - ls;
}

void kvl_log_softmax(float *x, int n) {
    double m, ls;
    log_sum_exp(x, n, &m, &ls);
    for (int i = 0; i < n; i++) x[i] = (float)((double)x[i] - m - ls);
}

static _Thread_local const float *tl_sort_logits;

static int cmp_desc(const void *a, const void *b) {
    float x = tl_sort_logits[*(const int *)a], y = tl_sort_logits[*(const int *)b];
    if (x > y) return -1;
    if (x < y) return 1;
    return *(const int *)a - *(const int *)b;   /* stable by id */
}

kvl_status kvl_sampler_sample(kvl_sampler *s, const float *logits, int vocab, int32_t *token_out,
                              float *logprob_out) {
    if (!s || !logits || vocab <= 0 || !token_out)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "sampler: bad arguments");
    /* the maximum and any NaN in one pass 16 lanes wide, then the first index holding the
     * maximum (ties go to the lowest id, as torch.argmax) */
    float mv[16];
    int bad[16] = {0};
    for (int l = 0; l < 16; l++) mv[l] = -INFINITY;
    int i = 0;
    for (; i + 16 <= vocab; i += 16)
        for (int l = 0; l < 16; l++) {
            const float x = logits[i + l];
            bad[l] |= x != x;
            mv[l] = x > mv[l] ? x : mv[l];
        }
    float mx = -INFINITY;
    int any_nan = 0;
    for (int l = 0; l < 16; l++) {
        mx = mv[l] > mx ? mv[l] : mx;
        any_nan |= bad[l];
    }
    for (; i < vocab; i++) {
        any_nan |= logits[i] != logits[i];
        mx = logits[i] > mx ? logits[i] : mx;
    }
    if (any_nan)
        for (i = 0; i < vocab; i++)
            if (isnan(logits[i])) return kvl__errorf(KVL_ERR_NUMERIC, "sampler: logit %d is NaN", i);
    int best = 0;
    while (best < vocab - 1 && !(logits[best] == mx)) best++;   /* all -inf: id 0, as before */
    int32_t tok = best;
    if (s->p.temperature > 0.0f) {
        if (s->cap < vocab) {
            int *idx = realloc(s->idx, sizeof(int) * (size_t)vocab);
            if (idx) s->idx = idx;
            double *pr = realloc(s->prob, sizeof(double) * (size_t)vocab);
            if (pr) s->prob = pr;
            if (!idx || !pr) return kvl__errorf(KVL_ERR_NOMEM, "sampler: out of memory");
            s->cap = vocab;
        }
        for (int i = 0; i < vocab; i++) s->idx[i] = i;
        tl_sort_logits = logits;
        qsort(s->idx, (size_t)vocab, sizeof(int), cmp_desc);
        int n = vocab;
        if (s->p.top_k > 0 && s->p.top_k < n) n = s->p.top_k;
        double inv_t = 1.0 / s->p.temperature, m = logits[s->idx[0]] * inv_t, sum = 0.0;
        for (int i = 0; i < n; i++) { s->prob[i] = exp(logits[s->idx[i]] * inv_t - m); sum += s->prob[i]; }
        for (int i = 0; i < n; i++) s->prob[i] /= sum;
        if (s->p.top_p < 1.0f) {
            /* smallest prefix whose mass reaches top_p (at least one token) */
            double cum = 0.0;
            int keep = n;
            for (int i = 0; i < n; i++) {
                cum += s->prob[i];
                if (cum >= s->p.top_p) { keep = i + 1; break; }
            }
            n = keep;
            sum = 0.0;
            for (int i = 0; i < n; i++) sum += s->prob[i];
            for (int i = 0; i < n; i++) s->prob[i] /= sum;
        }
        double u = next_unit(s), cum = 0.0;
        tok = s->idx[n - 1];
        for (int i = 0; i < n; i++) {
            cum += s->prob[i];
            if (u < cum) { tok = s->idx[i]; break; }
        }
    }
    *token_out = tok;
    if (logprob_out) *logprob_out = (float)kvl_logprob(logits, vocab, tok);
    return KVL_OK;
}
