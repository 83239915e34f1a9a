/* kernels/cuda/translate.cu: the fused KV-Lingo translation kernel.
 *
 * One launch per side (keys, values) covers every target layer: block (token tile of 64, target
 * kv head, target layer l) gathers the source span's pre-norm rows of layer s(l) straight from
 * the source cache (keys of sources without k_norm are rotated back by the inverse RoPE on the
 * way in), multiplies by the head's Dt rows of W_K[l] / W_V[l] on tensor cores (wmma bf16,
 * float accumulators), and the epilogue writes Kpre, applies the target's k_norm and RoPE and
 * writes K (or writes V) into the target cache rows at their absolute positions.  Nothing
 * intermediate touches device memory.  f32 caches (or unusual shapes) use a scalar kernel with
 * the same epilogue.  Math: include/kvlingo/kv_maps.h. */
#include <mma.h>

#include "cu_common.cuh"
#include "cuda_internal.h"

using namespace nvcuda;

#define TR_TOK 64
#define TR_KC 64
#define TR_THREADS 128

__device__ __forceinline__ const void *tr_plane(const void *base, int layer, int plane, int planes,
                                                int cap, int kd, int esz) {
    return (const char *)base + (((size_t)layer * planes + plane) * cap) * (size_t)kd * esz;
}

/* Epilogue for one output row y[Dt] (shared, float) of token position pos, done by one warp:
 * K side: Kpre = y; y = k_norm(y); K = RoPE(y, pos).  V side: V = y. */
template <typename T>
__device__ __forceinline__ void tr_epilogue_warp(float *y, int Dt, int side, int pos, int hd,
                                                 T *kplane, T *vplane, T *kpreplane,
                                                 const float *knorm, float eps,
                                                 const float *inv_freq, float rope_scale,
                                                 size_t kdt) {
    const int lane = threadIdx.x & 31;
    T *rowv = (side ? vplane : kplane) + (size_t)pos * kdt + (size_t)hd * Dt;
    if (side) {
        for (int d = lane; d < Dt; d += 32) stf(rowv, d, y[d]);
        return;
    }
    if (kpreplane) {
        T *rp = kpreplane + (size_t)pos * kdt + (size_t)hd * Dt;
        for (int d = lane; d < Dt; d += 32) stf(rp, d, y[d]);
    }
    if (knorm) {
        float ss = 0.0f;
        for (int d = lane; d < Dt; d += 32) ss += y[d] * y[d];
        ss = warp_sum(ss);
        float r = 1.0f / sqrtf(ss / (float)Dt + eps);
        for (int d = lane; d < Dt; d += 32) y[d] = knorm[d] * (y[d] * r);
        __syncwarp();
    }
    const int half = Dt / 2;
    for (int i = lane; i < half; i += 32) {
        float ang = (float)pos * inv_freq[i];
        float c = cosf(ang) * rope_scale, sn = sinf(ang) * rope_scale;
        float x1 = y[i], x2 = y[i + half];
        stf(rowv, i, x1 * c - x2 * sn);
        stf(rowv, i + half, x2 * c + x1 * sn);
    }
    __syncwarp();
}

/* ---- tensor-core kernel (bf16) --------------------------------------------------------------- */

template <int DT>
struct tr_smem {
    static constexpr int LDX = TR_KC + 8;   /* bf16 */
    static constexpr int LDY = DT + 4;      /* float */
    static constexpr size_t X_OFF = 0;
    static constexpr size_t W_OFF = X_OFF + (size_t)TR_TOK * LDX * 2;
    static constexpr size_t Y_OFF = W_OFF + (size_t)DT * LDX * 2;
    static constexpr size_t BYTES = Y_OFF + (size_t)TR_TOK * LDY * 4;
};

template <int DT>
__global__ void __launch_bounds__(TR_THREADS) translate_wmma_kernel(kvl__cu_translate_args a) {
    typedef tr_smem<DT> L;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *Xs = (bf16 *)(smem + L::X_OFF);
    bf16 *Ws = (bf16 *)(smem + L::W_OFF);
    float *Ys = (float *)(smem + L::Y_OFF);
    const int tile = blockIdx.x, hd = blockIdx.y, l = blockIdx.z;
    const int warp = threadIdx.x >> 5;
    const int KS = a.Hs * a.Ds, KDT = a.Ht * DT;
    const int sl = a.layer_map[l];
    const int unrope = a.side == 0 && a.src_unrope;
    const int splane = a.side == 0 ? (a.src_unrope ? 0 : 2) : 1;
    const bf16 *src = (const bf16 *)tr_plane(a.src_base, sl, splane, a.src_planes, a.src_cap, KS, 2);
    const bf16 *w = (const bf16 *)a.w + ((size_t)l * KDT + (size_t)hd * DT) * KS;
    const int tok0 = tile * TR_TOK;
    const int sdh = a.Ds / 2;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[DT / 16];
#pragma unroll
    for (int n = 0; n < DT / 16; n++) wmma::fill_fragment(acc[n], 0.0f);

    for (int kc = 0; kc < KS; kc += TR_KC) {
        __syncthreads();
        /* X chunk [64 tokens][64 cols], 8 columns (one uint4) per step */
        for (int idx = threadIdx.x; idx < TR_TOK * (TR_KC / 8); idx += TR_THREADS) {
            int r = idx / (TR_KC / 8), c8 = (idx - r * (TR_KC / 8)) * 8;
            int t = tok0 + r;
            uint4 val = make_uint4(0, 0, 0, 0);
            if (t < a.n) {
                int pos = a.t0 + t, col = kc + c8;
                const bf16 *row = src + (size_t)(pos - a.src_row0) * KS;
                val = *(const uint4 *)(row + col);
                if (unrope) {
                    /* inverse rotate_half RoPE: x1 = y1 c + y2 s, x2 = y2 c - y1 s */
                    int i = col % a.Ds, first = i < sdh;
                    int pcol = first ? col + sdh : col - sdh;
                    uint4 pv = *(const uint4 *)(row + pcol);
                    const bf16 *yv = (const bf16 *)&val, *pp = (const bf16 *)&pv;
                    uint4 outv;
                    bf16 *ov = (bf16 *)&outv;
#pragma unroll
                    for (int e = 0; e < 8; e++) {
                        int fi = (first ? i : i - sdh) + e;
                        float ang = (float)pos * a.src_inv_freq[fi];
                        float cs = cosf(ang) * a.src_rope_unscale, sn = sinf(ang) * a.src_rope_unscale;
                        float y = __bfloat162float(yv[e]), yp = __bfloat162float(pp[e]);
                        ov[e] = __float2bfloat16(first ? y * cs + yp * sn : y * cs - yp * sn);
                    }
                    val = outv;
                }
            }
            *(uint4 *)(Xs + r * L::LDX + c8) = val;
        }
        /* W chunk [Dt rows][64 cols] */
        for (int idx = threadIdx.x; idx < DT * (TR_KC / 8); idx += TR_THREADS) {
            int r = idx / (TR_KC / 8), c8 = (idx - r * (TR_KC / 8)) * 8;
            *(uint4 *)(Ws + r * L::LDX + c8) = *(const uint4 *)(w + (size_t)r * KS + kc + c8);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TR_KC / 16; kk++) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> xf;
            wmma::load_matrix_sync(xf, Xs + warp * 16 * L::LDX + kk * 16, L::LDX);
#pragma unroll
            for (int n = 0; n < DT / 16; n++) {
                /* W rows are output features: W^T is column-major with ld LDX */
                wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> wf;
                wmma::load_matrix_sync(wf, Ws + n * 16 * L::LDX + kk * 16, L::LDX);
                wmma::mma_sync(acc[n], xf, wf, acc[n]);
            }
        }
    }
#pragma unroll
    for (int n = 0; n < DT / 16; n++)
        wmma::store_matrix_sync(Ys + warp * 16 * L::LDY + n * 16, acc[n], L::LDY, wmma::mem_row_major);
    __syncwarp();

    bf16 *kpl = (bf16 *)tr_plane(a.dst_base, l, 0, a.dst_planes, a.dst_cap, KDT, 2);
    bf16 *vpl = (bf16 *)tr_plane(a.dst_base, l, 1, a.dst_planes, a.dst_cap, KDT, 2);
    bf16 *ppl = a.dst_planes > 2 ? (bf16 *)tr_plane(a.dst_base, l, 2, a.dst_planes, a.dst_cap, KDT, 2) : NULL;
    const float *kn = a.k_norm ? a.k_norm + (size_t)l * DT : NULL;
    for (int r = 0; r < 16; r++) {
        int t = tok0 + warp * 16 + r;
        if (t >= a.n) break;
        tr_epilogue_warp<bf16>(Ys + (warp * 16 + r) * L::LDY, DT, a.side, a.t0 + t, hd, kpl, vpl,
                               ppl, kn, a.eps, a.dst_inv_freq, a.dst_rope_scale, (size_t)KDT);
    }
}

/* ---- scalar kernel (f32 caches, any shape): block = (token, target head, layer) ----------- */

template <typename T>
__global__ void __launch_bounds__(TR_THREADS) translate_scalar_kernel(kvl__cu_translate_args a) {
    extern __shared__ __align__(16) float fsm[];
    const int t = blockIdx.x, hd = blockIdx.y, l = blockIdx.z;
    const int KS = a.Hs * a.Ds, Dt = a.Dt, KDT = a.Ht * Dt;
    float *xs = fsm;        /* [KS]  */
    float *ys = fsm + KS;   /* [Dt]  */
    const int sl = a.layer_map[l];
    const int unrope = a.side == 0 && a.src_unrope;
    const int splane = a.side == 0 ? (a.src_unrope ? 0 : 2) : 1;
    const int esz = (int)sizeof(T);
    const T *row = (const T *)tr_plane(a.src_base, sl, splane, a.src_planes, a.src_cap, KS, esz) +
                   (size_t)(a.t0 + t - a.src_row0) * KS;
    const int pos = a.t0 + t, sdh = a.Ds / 2;
    for (int c = threadIdx.x; c < KS; c += blockDim.x) {
        float y = ldf(row, c);
        if (unrope) {
            int i = c % a.Ds, first = i < sdh, fi = first ? i : i - sdh;
            float yp = ldf(row, first ? c + sdh : c - sdh);
            float ang = (float)pos * a.src_inv_freq[fi];
            float cs = cosf(ang) * a.src_rope_unscale, sn = sinf(ang) * a.src_rope_unscale;
            y = first ? y * cs + yp * sn : y * cs - yp * sn;
        }
        xs[c] = y;
    }
    __syncthreads();
    const T *w = (const T *)a.w + ((size_t)l * KDT + (size_t)hd * Dt) * KS;
    for (int o = threadIdx.x; o < Dt; o += blockDim.x) {
        const T *wr = w + (size_t)o * KS;
        float s = 0.0f;
        for (int c = 0; c < KS; c++) s += ldf(wr, c) * xs[c];
        ys[o] = s;
    }
    __syncthreads();
    if (threadIdx.x >= 32) return;
    T *kpl = (T *)tr_plane(a.dst_base, l, 0, a.dst_planes, a.dst_cap, KDT, esz);
    T *vpl = (T *)tr_plane(a.dst_base, l, 1, a.dst_planes, a.dst_cap, KDT, esz);
    T *ppl = a.dst_planes > 2 ? (T *)tr_plane(a.dst_base, l, 2, a.dst_planes, a.dst_cap, KDT, esz) : NULL;
    tr_epilogue_warp<T>(ys, Dt, a.side, pos, hd, kpl, vpl, ppl,
                        a.k_norm ? a.k_norm + (size_t)l * Dt : NULL, a.eps, a.dst_inv_freq, a.dst_rope_scale,
                        (size_t)KDT);
}

template <int DT>
static int wmma_launch(cudaStream_t s, const kvl__cu_translate_args *a) {
    /* > 48 KiB of dynamic shared memory: opted into per device, so before every launch (a
     * once-per-process flag left a second GPU without it) */
    if (cudaFuncSetAttribute(translate_wmma_kernel<DT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)tr_smem<DT>::BYTES) != cudaSuccess) {
        (void)cudaGetLastError();   /* reported by the caller's message, not by a later check */
        return -2;
    }
    dim3 grid((a->n + TR_TOK - 1) / TR_TOK, a->Ht, a->Lt);
    translate_wmma_kernel<DT><<<grid, TR_THREADS, tr_smem<DT>::BYTES, s>>>(*a);
    return 0;
}

extern "C" int kvl__cu_translate(cudaStream_t s, const kvl__cu_translate_args *a) {
    if (a->n <= 0) return 0;
    const int KS = a->Hs * a->Ds;
    if (a->dt == 0 && KS % TR_KC == 0 && a->Ds % 16 == 0) {
        switch (a->Dt) {
        case 32: return wmma_launch<32>(s, a);
        case 64: return wmma_launch<64>(s, a);
        case 128: return wmma_launch<128>(s, a);
        default: break;
        }
    }
    if (a->Dt > 1024 || KS > 8192) return -1;
    dim3 grid(a->n, a->Ht, a->Lt);
    size_t sm = (size_t)(KS + a->Dt) * sizeof(float);
    if (a->dt == 0) translate_scalar_kernel<bf16><<<grid, TR_THREADS, sm, s>>>(*a);
    else translate_scalar_kernel<float><<<grid, TR_THREADS, sm, s>>>(*a);
    return 0;
}
