/* kernels/cuda/kernels.cu: the element-wise and per-row kernels of the forward pass (see
 * cuda_internal.h for shapes).  Storage is bf16 or f32 (template T), math float32, formulas as
 * the CPU path (kernels/cpu/ops.c) so both backends agree to rounding. */
#include "cu_common.cuh"
#include "cuda_internal.h"
#include "rng.h"

/* ---- embedding ---------------------------------------------------------------------------- */

template <typename T>
__global__ void embed_kernel(float *x, const T *embed, const int32_t *tok, int H) {
    int t = blockIdx.x;
    const T *row = embed + (size_t)tok[t] * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x) x[(size_t)t * H + i] = ldf(row, i);
}

extern "C" void kvl__cu_embed(cudaStream_t s, int dt, float *x, const void *embed,
                             const int32_t *tok, int T, int H) {
    if (dt == 0) embed_kernel<<<T, 256, 0, s>>>(x, (const bf16 *)embed, tok, H);
    else embed_kernel<<<T, 256, 0, s>>>(x, (const float *)embed, tok, H);
}

/* ---- RMSNorm ------------------------------------------------------------------------------ */

template <typename T>
__global__ void rmsnorm_kernel(T *out, const float *in, size_t in_stride, const float *w, int C,
                               float eps) {
    __shared__ float red[32];
    int t = blockIdx.x;
    const float *x = in + (size_t)t * in_stride;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < C; i += blockDim.x) ss += x[i] * x[i];
    ss = block_sum(ss, red);
    /* as the CPU path: 1 / sqrtf(mean + eps), then w * (x * r) */
    float r = 1.0f / sqrtf(ss / (float)C + eps);
    for (int i = threadIdx.x; i < C; i += blockDim.x) stf(out, (size_t)t * C + i, w[i] * (x[i] * r));
}

extern "C" void kvl__cu_rmsnorm(cudaStream_t s, int dt, void *out, const float *in,
                               size_t in_stride, const float *w, int T, int C, float eps) {
    if (dt == 0) rmsnorm_kernel<<<T, 256, 0, s>>>((bf16 *)out, in, in_stride, w, C, eps);
    else rmsnorm_kernel<<<T, 256, 0, s>>>((float *)out, in, in_stride, w, C, eps);
}

/* ---- bias, q/k norm, RoPE, cache write (one block per token, one warp per head) ---------- */

#define QKV_WARPS 4
#define QKV_MAXD 256

template <typename T>
__global__ void qkv_post_kernel(const float *qkv, const float *bias, const float *q_norm,
                                const float *k_norm, int pos0, const int32_t *d_pos0, int Hq,
                                int Hkv, int D, const float *inv_freq, float rope_scale, float eps, T *q_out,
                                T *kc, T *vc, T *kpre) {
    __shared__ float buf[QKV_WARPS][QKV_MAXD];
    const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int QD = Hq * D, KD = Hkv * D, W = QD + 2 * KD, half = D / 2;
    const int pos = (d_pos0 ? d_pos0[0] : pos0) + t;
    const float *row = qkv + (size_t)t * W;
    float *b = buf[warp];
    for (int h = warp; h < Hq + 2 * Hkv; h += QKV_WARPS) {
        const int off = h * D;   /* q heads, then k heads, then v heads: the fused row's order */
        for (int d = lane; d < D; d += 32) b[d] = row[off + d] + (bias ? bias[off + d] : 0.0f);
        __syncwarp();
        if (h >= Hq + Hkv) {   /* value head: stored as projected */
            const int g = h - Hq - Hkv;
            for (int d = lane; d < D; d += 32) stf(vc, (size_t)pos * KD + g * D + d, b[d]);
            __syncwarp();
            continue;
        }
        const int is_k = h >= Hq;
        const int g = is_k ? h - Hq : h;
        const float *nw = is_k ? k_norm : q_norm;
        if (is_k && kpre)
            for (int d = lane; d < D; d += 32) stf(kpre, (size_t)pos * KD + g * D + d, b[d]);
        if (nw) {
            float ss = 0.0f;
            for (int d = lane; d < D; d += 32) ss += b[d] * b[d];
            ss = warp_sum(ss);
            float r = 1.0f / sqrtf(ss / (float)D + eps);
            __syncwarp();
            for (int d = lane; d < D; d += 32) b[d] = nw[d] * (b[d] * r);
            __syncwarp();
        }
        /* rotate_half RoPE: element i pairs with i + D/2 */
        T *dst = is_k ? kc + (size_t)pos * KD + g * D : q_out + (size_t)t * QD + g * D;
        for (int i = lane; i < half; i += 32) {
            float ang = (float)pos * inv_freq[i];
            float c = cosf(ang) * rope_scale, sn = sinf(ang) * rope_scale;
            float x1 = b[i], x2 = b[i + half];
            stf(dst, i, x1 * c - x2 * sn);
            stf(dst, i + half, x2 * c + x1 * sn);
        }
        __syncwarp();
    }
}

extern "C" void kvl__cu_qkv_post(cudaStream_t s, int dt, const float *qkv, const float *bias,
                                const float *q_norm, const float *k_norm, int pos0,
                                const int32_t *d_pos0, int T, int Hq, int Hkv, int D,
                                const float *inv_freq, float rope_scale, float eps, void *q_out, void *k_cache,
                                void *v_cache, void *kpre_cache) {
    if (dt == 0)
        qkv_post_kernel<<<T, QKV_WARPS * 32, 0, s>>>(qkv, bias, q_norm, k_norm, pos0, d_pos0, Hq,
                                                     Hkv, D, inv_freq, rope_scale, eps, (bf16 *)q_out,
                                                     (bf16 *)k_cache, (bf16 *)v_cache,
                                                     (bf16 *)kpre_cache);
    else
        qkv_post_kernel<<<T, QKV_WARPS * 32, 0, s>>>(qkv, bias, q_norm, k_norm, pos0, d_pos0, Hq,
                                                     Hkv, D, inv_freq, rope_scale, eps, (float *)q_out,
                                                     (float *)k_cache, (float *)v_cache,
                                                     (float *)kpre_cache);
}

/* ---- SwiGLU ------------------------------------------------------------------------------- */

template <typename T>
__global__ void swiglu_kernel(T *act, const float *gu, int T_, int F) {
    size_t n = (size_t)T_ * F;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / F, f = i - t * F;
        float g = gu[t * 2 * F + f], u = gu[t * 2 * F + F + f];
        stf(act, i, g / (1.0f + expf(-g)) * u);
    }
}

static int grid_for(size_t n, int block) {
    size_t g = (n + block - 1) / block;
    return (int)(g > 65535 * 16 ? 65535 * 16 : (g ? g : 1));
}

extern "C" void kvl__cu_swiglu(cudaStream_t s, int dt, void *act, const float *gu, int T, int F) {
    int g = grid_for((size_t)T * F, 256);
    if (dt == 0) swiglu_kernel<<<g, 256, 0, s>>>((bf16 *)act, gu, T, F);
    else swiglu_kernel<<<g, 256, 0, s>>>((float *)act, gu, T, F);
}

__global__ void add_bias_kernel(float *x, const float *b, int T_, int N) {
    size_t n = (size_t)T_ * N;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] += b[i % N];
}

extern "C" void kvl__cu_add_bias(cudaStream_t s, float *x, const float *b, int T, int N) {
    add_bias_kernel<<<grid_for((size_t)T * N, 256), 256, 0, s>>>(x, b, T, N);
}

/* ---- argmax ------------------------------------------------------------------------------- */

#define ARGMAX_THREADS 1024

__global__ void argmax_kernel(const float *logits, int V, int32_t *out, int32_t *next_tok,
                              int32_t *pos) {
    __shared__ float sv[ARGMAX_THREADS];
    __shared__ int si[ARGMAX_THREADS];
    float best = -INFINITY;
    int bi = -1;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float v = logits[i];
        if (v > best || bi < 0) { best = v; bi = i; }   /* strided scan: first index per thread */
    }
    sv[threadIdx.x] = best;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) {
            float ov = sv[threadIdx.x + w];
            int oi = si[threadIdx.x + w];
            float mv = sv[threadIdx.x];
            int mi = si[threadIdx.x];
            /* larger value wins; on ties (or NaN on our side) the smaller index wins */
            if (oi >= 0 && (mi < 0 || ov > mv || (ov == mv && oi < mi) || (mv != mv && ov == ov))) {
                sv[threadIdx.x] = ov;
                si[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        int r = si[0] < 0 ? 0 : si[0];
        *out = r;
        if (next_tok) {
            *next_tok = r;
            *pos += 1;
        }
    }
}

extern "C" void kvl__cu_argmax(cudaStream_t s, const float *logits, int V, int32_t *out,
                              int32_t *next_tok, int32_t *pos) {
    argmax_kernel<<<1, ARGMAX_THREADS, 0, s>>>(logits, V, out, next_tok, pos);
}

/* ---- initialisation and conversion -------------------------------------------------------- */

template <typename T>
__global__ void fill_random_kernel(T *dst, size_t n, uint64_t seed, float a) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = kvl__splitmix64_at(seed ^ (i * 0xD1B54A32D192ED03ull));
        float u = (float)(z >> 40) * (1.0f / 16777216.0f);   /* [0, 1) */
        stf(dst, i, (2.0f * u - 1.0f) * a);
    }
}

extern "C" void kvl__cu_fill_random(cudaStream_t s, int dt, void *dst, size_t n, uint64_t seed,
                                   float std) {
    float a = std * 1.7320508f;   /* uniform(-a, a) has standard deviation a / sqrt(3) */
    int g = grid_for(n, 256);
    if (dt == 0) fill_random_kernel<<<g, 256, 0, s>>>((bf16 *)dst, n, seed, a);
    else fill_random_kernel<<<g, 256, 0, s>>>((float *)dst, n, seed, a);
}

__global__ void fill_f32_kernel(float *dst, size_t n, float v) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = v;
}

extern "C" void kvl__cu_fill_f32(cudaStream_t s, float *dst, size_t n, float value) {
    fill_f32_kernel<<<grid_for(n, 256), 256, 0, s>>>(dst, n, value);
}

template <typename T>
__global__ void convert_kernel(T *dst, const float *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        stf(dst, i, src[i]);
}

extern "C" void kvl__cu_convert(cudaStream_t s, int dt, void *dst, const float *src, size_t n) {
    int g = grid_for(n, 256);
    if (dt == 0) convert_kernel<<<g, 256, 0, s>>>((bf16 *)dst, src, n);
    else convert_kernel<<<g, 256, 0, s>>>((float *)dst, src, n);
}
