/* kernels/cuda/attention.cu: causal GQA attention over the device KV cache.
 *
 *  - prefill, bf16: two flash-style kernels (FlashAttention-2 loop order: one block per 64
 *    queries of one query head, 64-key tiles streamed through shared memory, online softmax in
 *    float32, products on tensor cores).  flash2 (default) keeps scores, probabilities and the
 *    running output in registers (PTX mma.sync); the wmma kernel (KVL_FLASH=wmma) keeps the
 *    running output in shared memory, because wmma's register layout is opaque and the online
 *    softmax must rescale it per row between tiles.
 *  - decode (and prefill in f32 or with an unusual head_dim): split-K kernel, one block per
 *    (kv head, key chunk, query), all query heads of the GQA group in the block so each key and
 *    value row is read once per group; a second kernel merges the chunks' (max, sum, acc).
 * Reference: transformers' eager attention (softmax(q k^T / sqrt(D) + causal mask) v). */
#include <mma.h>
#include <stdlib.h>
#include <string.h>

#include "cu_common.cuh"
#include "cuda_internal.h"

using namespace nvcuda;

/* ---- split-K kernel ------------------------------------------------------------------------ */

#define SK_WARPS 4
#define SK_MAXG 8

template <typename T, int DPL>
__global__ void __launch_bounds__(SK_WARPS * 32)
attn_splitk_kernel(float *part, const T *q, const T *k, const T *v, int p0, const int32_t *d_pos,
                   int Hq, int Hkv, int nsplit) {
    constexpr int D = DPL * 32;
    __shared__ float sm_acc[SK_WARPS][SK_MAXG][D];
    __shared__ float sm_ml[SK_WARPS][SK_MAXG][2];
    const int g = blockIdx.x, sp = blockIdx.y, i = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int group = Hq / Hkv, KD = Hkv * D, QD = Hq * D;
    const int pos = (d_pos ? d_pos[0] : p0) + i;
    const int nvis = pos + 1;
    const int chunk = (nvis + nsplit - 1) / nsplit;
    const int j0 = sp * chunk;
    const int j1 = min(nvis, j0 + chunk);
    const float scale = 1.0f / sqrtf((float)D);

    float qr[SK_MAXG][DPL], acc[SK_MAXG][DPL], m[SK_MAXG], l[SK_MAXG];
#pragma unroll
    for (int hh = 0; hh < SK_MAXG; hh++) {
        m[hh] = -INFINITY;
        l[hh] = 0.0f;
#pragma unroll
        for (int e = 0; e < DPL; e++) {
            acc[hh][e] = 0.0f;
            qr[hh][e] = hh < group
                ? ldf(q, (size_t)i * QD + (size_t)(g * group + hh) * D + lane * DPL + e) * scale
                : 0.0f;
        }
    }
    for (int j = j0 + warp; j < j1; j += SK_WARPS) {
        float kr[DPL], vr[DPL];
#pragma unroll
        for (int e = 0; e < DPL; e++) {
            kr[e] = ldf(k, (size_t)j * KD + g * D + lane * DPL + e);
            vr[e] = ldf(v, (size_t)j * KD + g * D + lane * DPL + e);
        }
#pragma unroll
        for (int hh = 0; hh < SK_MAXG; hh++) {
            if (hh >= group) break;
            float s = 0.0f;
#pragma unroll
            for (int e = 0; e < DPL; e++) s += qr[hh][e] * kr[e];
            s = warp_sum(s);
            float mn = fmaxf(m[hh], s);
            float corr = expf(m[hh] - mn);   /* 0 while m is -inf */
            float p = expf(s - mn);
            l[hh] = l[hh] * corr + p;
#pragma unroll
            for (int e = 0; e < DPL; e++) acc[hh][e] = acc[hh][e] * corr + p * vr[e];
            m[hh] = mn;
        }
    }
#pragma unroll
    for (int hh = 0; hh < SK_MAXG; hh++) {
        if (hh >= group) break;
#pragma unroll
        for (int e = 0; e < DPL; e++) sm_acc[warp][hh][lane * DPL + e] = acc[hh][e];
        if (lane == 0) {
            sm_ml[warp][hh][0] = m[hh];
            sm_ml[warp][hh][1] = l[hh];
        }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < group * D; idx += blockDim.x) {
        const int hh = idx / D, d = idx - hh * D;
        float M = -INFINITY;
        for (int w = 0; w < SK_WARPS; w++) M = fmaxf(M, sm_ml[w][hh][0]);
        float L = 0.0f, A = 0.0f;
        if (M != -INFINITY) {
            for (int w = 0; w < SK_WARPS; w++) {
                float mw = sm_ml[w][hh][0];
                if (mw == -INFINITY) continue;
                float f = expf(mw - M);
                L += sm_ml[w][hh][1] * f;
                A += sm_acc[w][hh][d] * f;
            }
        }
        const int h = g * group + hh;
        float *dst = part + (((size_t)i * Hq + h) * nsplit + sp) * (D + 2);
        dst[d] = A;
        if (d == 0) {
            dst[D] = M;
            dst[D + 1] = L;
        }
    }
}

template <typename T>
__global__ void attn_combine_kernel(T *out, const float *part, int Hq, int D, int nsplit) {
    const int ih = blockIdx.x;   /* i * Hq + h */
    const float *base = part + (size_t)ih * nsplit * (D + 2);
    float M = -INFINITY;
    for (int s = 0; s < nsplit; s++) M = fmaxf(M, base[(size_t)s * (D + 2) + D]);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float L = 0.0f, A = 0.0f;
        for (int s = 0; s < nsplit; s++) {
            const float *ps = base + (size_t)s * (D + 2);
            if (ps[D] == -INFINITY) continue;
            float f = expf(ps[D] - M);
            L += ps[D + 1] * f;
            A += ps[d] * f;
        }
        stf(out, (size_t)ih * D + d, L > 0.0f ? A / L : 0.0f);
    }
}

size_t kvl__cu_attention_part_floats(int T, int Hq, int D, int nsplit) {
    return (size_t)T * Hq * nsplit * (D + 2);
}

template <typename E>
static int splitk_launch(cudaStream_t s, void *out, const void *q, const void *k, const void *v,
                         float *part, int Tq, int p0, const int32_t *d_pos, int nsplit, int Hq,
                         int Hkv, int D) {
    if (Hq % Hkv || Hq / Hkv > SK_MAXG) return -1;
    if (D != 32 && D != 64 && D != 128) return -1;
    const E *kk = (const E *)k, *vv = (const E *)v;
    const size_t QD = (size_t)Hq * D, PS = (size_t)Hq * nsplit * (D + 2);
    /* grid.z holds at most 65535 queries: long f32 prefills go in slices */
    for (int off = 0; off < Tq; off += 65535) {
        const int nq = Tq - off < 65535 ? Tq - off : 65535;
        const E *qq = (const E *)q + off * QD;
        float *pp = part + off * PS;
        dim3 grid(Hkv, nsplit, nq);
        switch (D) {
        case 32: attn_splitk_kernel<E, 1><<<grid, SK_WARPS * 32, 0, s>>>(pp, qq, kk, vv, p0 + off, d_pos, Hq, Hkv, nsplit); break;
        case 64: attn_splitk_kernel<E, 2><<<grid, SK_WARPS * 32, 0, s>>>(pp, qq, kk, vv, p0 + off, d_pos, Hq, Hkv, nsplit); break;
        default: attn_splitk_kernel<E, 4><<<grid, SK_WARPS * 32, 0, s>>>(pp, qq, kk, vv, p0 + off, d_pos, Hq, Hkv, nsplit); break;
        }
        attn_combine_kernel<E><<<nq * Hq, D, 0, s>>>((E *)out + off * QD, pp, Hq, D, nsplit);
    }
    return 0;
}

/* ---- flash prefill (bf16, tensor cores) ---------------------------------------------------- */

#define FA_BR 64
#define FA_BC 64
#define FA_THREADS 128

template <int D>
struct fa_smem {
    static constexpr int LDK = D + 8;        /* bf16, padded against bank conflicts */
    static constexpr int LDS = FA_BC + 4;    /* float */
    static constexpr int LDP = FA_BC + 8;    /* bf16 */
    static constexpr int LDO = D + 4;        /* float */
    static constexpr size_t K_OFF = 0;
    static constexpr size_t V_OFF = K_OFF + (size_t)FA_BC * LDK * 2;
    static constexpr size_t S_OFF = V_OFF + (size_t)FA_BC * LDK * 2;
    static constexpr size_t P_OFF = S_OFF + (size_t)FA_BR * LDS * 4;
    static constexpr size_t O_OFF = P_OFF + (size_t)FA_BR * LDP * 2;
    static constexpr size_t M_OFF = O_OFF + (size_t)FA_BR * LDO * 4;
    static constexpr size_t BYTES = M_OFF + (size_t)FA_BR * 2 * 4;
};

/* Copy rows [r0, r0+64) of a [rows][ld] bf16 matrix (columns col0 .. col0+D) into a padded
 * shared tile with 16-byte loads; rows >= nrows are zero. */
template <int D>
__device__ __forceinline__ void fa_load_tile(bf16 *dst, const bf16 *src, size_t ld, int r0,
                                             int nrows) {
    constexpr int VPR = D / 8;   /* uint4 per row */
    for (int idx = threadIdx.x; idx < FA_BC * VPR; idx += FA_THREADS) {
        int r = idx / VPR, c = idx - r * VPR;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (r0 + r < nrows) val = *(const uint4 *)(src + (size_t)(r0 + r) * ld + c * 8);
        *(uint4 *)(dst + r * fa_smem<D>::LDK + c * 8) = val;
    }
}

template <int D>
__global__ void __launch_bounds__(FA_THREADS)
flash_prefill_kernel(bf16 *out, const bf16 *q, const bf16 *k, const bf16 *v, int T, int p0,
                     int Hq, int Hkv) {
    typedef fa_smem<D> L;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *Ks = (bf16 *)(smem + L::K_OFF);
    bf16 *Vs = (bf16 *)(smem + L::V_OFF);
    float *Ss = (float *)(smem + L::S_OFF);
    bf16 *Ps = (bf16 *)(smem + L::P_OFF);
    float *Os = (float *)(smem + L::O_OFF);
    float *Ms = (float *)(smem + L::M_OFF);
    float *Ls = Ms + FA_BR;

    /* the last query blocks see the most keys: start them first */
    const int qb = gridDim.x - 1 - blockIdx.x;
    const int h = blockIdx.y, g = h / (Hq / Hkv);
    const size_t QD = (size_t)Hq * D, KD = (size_t)Hkv * D;
    const int i0 = qb * FA_BR;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const float scale_log2 = 1.4426950408889634f / sqrtf((float)D);

    /* Q tile through shared memory (zero rows past T), then into registers */
    fa_load_tile<D>(Ks, q + (size_t)h * D, QD, i0, T);
    for (int idx = threadIdx.x; idx < FA_BR * L::LDO; idx += FA_THREADS) Os[idx] = 0.0f;
    for (int idx = threadIdx.x; idx < FA_BR; idx += FA_THREADS) {
        Ms[idx] = -INFINITY;
        Ls[idx] = 0.0f;
    }
    __syncthreads();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> qf[D / 16];
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
        wmma::load_matrix_sync(qf[kk], Ks + warp * 16 * L::LDK + kk * 16, L::LDK);

    const int nk = p0 + min(i0 + FA_BR, T);   /* keys visible to the block's last query */
    const int r = lane >> 1, hf = lane & 1;     /* softmax: two lanes per row */
    const int row = warp * 16 + r;
    const int qpos = p0 + min(i0 + row, T - 1); /* padding rows behave like the last query */
    float *srow = Ss + row * L::LDS;
    bf16 *prow = Ps + row * L::LDP;
    float *orow = Os + row * L::LDO;

    for (int j0 = 0; j0 < nk; j0 += FA_BC) {
        __syncthreads();   /* everyone is done with the previous K/V tile (and the Q staging) */
        fa_load_tile<D>(Ks, k + (size_t)g * D, KD, j0, nk);
        fa_load_tile<D>(Vs, v + (size_t)g * D, KD, j0, nk);
        __syncthreads();

        /* S = Q K^T for this warp's 16 rows */
#pragma unroll
        for (int n = 0; n < FA_BC / 16; n++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> sacc;
            wmma::fill_fragment(sacc, 0.0f);
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> kf;
                wmma::load_matrix_sync(kf, Ks + n * 16 * L::LDK + kk * 16, L::LDK);
                wmma::mma_sync(sacc, qf[kk], kf, sacc);
            }
            wmma::store_matrix_sync(Ss + warp * 16 * L::LDS + n * 16, sacc, L::LDS,
                                    wmma::mem_row_major);
        }
        __syncwarp();

        /* online softmax (log2 domain); lanes take interleaved columns 2c + hf */
        float mx = -INFINITY;
        for (int c = 0; c < FA_BC / 2; c++) {
            int col = 2 * c + hf, j = j0 + col;
            float sv = j <= qpos ? srow[col] * scale_log2 : -INFINITY;
            srow[col] = sv;
            mx = fmaxf(mx, sv);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        const float m_old = Ms[row];
        const float m_new = fmaxf(m_old, mx);
        const float alpha = m_new == -INFINITY ? 1.0f : exp2f(m_old - m_new);
        float sum = 0.0f;
        for (int c = 0; c < FA_BC / 2; c++) {
            int col = 2 * c + hf;
            bf16 pb = __float2bfloat16(m_new == -INFINITY ? 0.0f : exp2f(srow[col] - m_new));
            prow[col] = pb;
            sum += __bfloat162float(pb);   /* normalise by what the tensor cores multiply */
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        __syncwarp();   /* both lanes of the row have read Ms before it changes */
        if (hf == 0) {
            Ms[row] = m_new;
            Ls[row] = Ls[row] * alpha + sum;
        }
        for (int c = 0; c < D / 2; c++) orow[2 * c + hf] *= alpha;
        __syncwarp();

        /* O += P V */
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> pf[FA_BC / 16];
#pragma unroll
        for (int kk = 0; kk < FA_BC / 16; kk++)
            wmma::load_matrix_sync(pf[kk], Ps + warp * 16 * L::LDP + kk * 16, L::LDP);
#pragma unroll
        for (int n = 0; n < D / 16; n++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> oacc;
            wmma::load_matrix_sync(oacc, Os + warp * 16 * L::LDO + n * 16, L::LDO,
                                   wmma::mem_row_major);
#pragma unroll
            for (int kk = 0; kk < FA_BC / 16; kk++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> vf;
                wmma::load_matrix_sync(vf, Vs + kk * 16 * L::LDK + n * 16, L::LDK);
                wmma::mma_sync(oacc, pf[kk], vf, oacc);
            }
            wmma::store_matrix_sync(Os + warp * 16 * L::LDO + n * 16, oacc, L::LDO,
                                    wmma::mem_row_major);
        }
        __syncwarp();
    }

    if (i0 + row < T) {
        const float inv = 1.0f / Ls[row];
        bf16 *dst = out + (size_t)(i0 + row) * QD + (size_t)h * D;
        for (int c = 0; c < D / 2; c++) dst[2 * c + hf] = __float2bfloat16(orow[2 * c + hf] * inv);
    }
}

template <int D>
static int flash_launch(cudaStream_t s, void *out, const void *q, const void *k, const void *v,
                        int T, int p0, int Hq, int Hkv) {
    /* > 48 KiB of dynamic shared memory must be opted into, per device: set before every
     * launch (a microsecond) rather than once per process, which left a second GPU without it */
    if (cudaFuncSetAttribute(flash_prefill_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)fa_smem<D>::BYTES) != cudaSuccess) {
        (void)cudaGetLastError();   /* reported by the caller's message, not by a later check */
        return -2;
    }
    dim3 grid((T + FA_BR - 1) / FA_BR, Hq);
    flash_prefill_kernel<D><<<grid, FA_THREADS, fa_smem<D>::BYTES, s>>>(
        (bf16 *)out, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, T, p0, Hq, Hkv);
    return 0;
}

/* ---- flash prefill v2 (bf16, mma.sync in registers) ----------------------------------------
 * FlashAttention-2 with the running output, scores and probabilities in registers: PTX
 * mma.sync.m16n8k16 (fragment layouts as the PTX ISA documents them for .bf16), K and V tiles
 * double-buffered in shared memory by cp.async, V fragments through ldmatrix.trans.  The default
 * prefill kernel; KVL_FLASH=wmma selects the wmma kernel above.  Not yet run on a GPU: its
 * fragment indexing was checked by a CPU simulation of the PTX-documented mma / ldmatrix.trans
 * layouts against naive attention (D 32/64/128, offsets); scripts/gpu_check.sh runs the parity
 * test and the bench with both kernels. */

#define F2_BR 64
#define F2_BC 64
#define F2_THREADS 128

__device__ __forceinline__ void mma_bf16_16816(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);   /* .x = lo (lower address) */
    return *(uint32_t *)&v;
}

__device__ __forceinline__ void cp_async16(void *smem_dst, const void *gsrc, int src_bytes) {
    unsigned d = (unsigned)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(gsrc), "r"(src_bytes));
}

template <int D>
__device__ __forceinline__ void f2_load_kv(bf16 *dst, const bf16 *src, size_t ld, int r0, int nrows) {
    constexpr int VPR = D / 8, LDK = D + 8;
    for (int idx = threadIdx.x; idx < F2_BC * VPR; idx += F2_THREADS) {
        int r = idx / VPR, c = idx - r * VPR;
        int ok = r0 + r < nrows;
        const bf16 *g = ok ? src + (size_t)(r0 + r) * ld + c * 8 : src;   /* 0 bytes: zero fill */
        cp_async16(dst + r * LDK + c * 8, g, ok ? 16 : 0);
    }
}

template <int D>
__global__ void __launch_bounds__(F2_THREADS)
flash2_prefill_kernel(bf16 *out, const bf16 *q, const bf16 *k, const bf16 *v, int T, int p0,
                      int Hq, int Hkv) {
    constexpr int LDK = D + 8;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *Qs = (bf16 *)smem;              /* [BR][LDK]     */
    bf16 *Ks = Qs + F2_BR * LDK;          /* [2][BC][LDK]  */
    bf16 *Vs = Ks + 2 * F2_BC * LDK;      /* [2][BC][LDK]  */
    const int qb = gridDim.x - 1 - blockIdx.x;
    const int h = blockIdx.y, g = h / (Hq / Hkv);
    const size_t QD = (size_t)Hq * D, KD = (size_t)Hkv * D;
    const int i0 = qb * F2_BR;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tq = lane & 3;
    const float scale_log2 = 1.4426950408889634f / sqrtf((float)D);
    const int nk = p0 + min(i0 + F2_BR, T);
    const int ntiles = (nk + F2_BC - 1) / F2_BC;
    const bf16 *kg = k + (size_t)g * D, *vg = v + (size_t)g * D;

    f2_load_kv<D>(Ks, kg, KD, 0, nk);
    f2_load_kv<D>(Vs, vg, KD, 0, nk);
    asm volatile("cp.async.commit_group;\n" ::);
    for (int idx = threadIdx.x; idx < F2_BR * (D / 8); idx += F2_THREADS) {
        int r = idx / (D / 8), c = idx - r * (D / 8);
        uint4 val = make_uint4(0, 0, 0, 0);
        if (i0 + r < T) val = *(const uint4 *)(q + (size_t)(i0 + r) * QD + (size_t)h * D + c * 8);
        *(uint4 *)(Qs + r * LDK + c * 8) = val;
    }
    __syncthreads();
    /* A fragments of this warp's 16 query rows: {row gid | row gid+8} x {cols 2tq | 2tq+8} */
    uint32_t qa[D / 16][4];
    const bf16 *qrow0 = Qs + (warp * 16 + gid) * LDK, *qrow1 = qrow0 + 8 * LDK;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        qa[kk][0] = *(const uint32_t *)(qrow0 + kk * 16 + 2 * tq);
        qa[kk][1] = *(const uint32_t *)(qrow1 + kk * 16 + 2 * tq);
        qa[kk][2] = *(const uint32_t *)(qrow0 + kk * 16 + 8 + 2 * tq);
        qa[kk][3] = *(const uint32_t *)(qrow1 + kk * 16 + 8 + 2 * tq);
    }
    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    const int qi0 = i0 + warp * 16 + gid;
    const int qpos0 = p0 + min(qi0, T - 1), qpos1 = p0 + min(qi0 + 8, T - 1);

    for (int t = 0; t < ntiles; t++) {
        const int st = t & 1;
        if (t + 1 < ntiles) {   /* prefetch the next tile into the other stage */
            f2_load_kv<D>(Ks + (st ^ 1) * F2_BC * LDK, kg, KD, (t + 1) * F2_BC, nk);
            f2_load_kv<D>(Vs + (st ^ 1) * F2_BC * LDK, vg, KD, (t + 1) * F2_BC, nk);
            asm volatile("cp.async.commit_group;\n" ::);
            asm volatile("cp.async.wait_group 1;\n" ::);
        } else {
            asm volatile("cp.async.wait_group 0;\n" ::);
        }
        __syncthreads();
        const bf16 *Kt = Ks + st * F2_BC * LDK, *Vt = Vs + st * F2_BC * LDK;

        float s[F2_BC / 8][4];
#pragma unroll
        for (int n = 0; n < F2_BC / 8; n++) {
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
            const bf16 *krow = Kt + (n * 8 + gid) * LDK + 2 * tq;   /* B: k = dim, n = key */
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++)
                mma_bf16_16816(s[n], qa[kk], *(const uint32_t *)(krow + kk * 16),
                               *(const uint32_t *)(krow + kk * 16 + 8));
        }
        /* mask, scale (log2 domain), row max over the 4 lanes sharing a row */
        const int j0 = t * F2_BC;
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int n = 0; n < F2_BC / 8; n++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int j = j0 + n * 8 + 2 * tq + (e & 1);
                int qp = e < 2 ? qpos0 : qpos1;
                float sv = j <= qp ? s[n][e] * scale_log2 : -INFINITY;
                s[n][e] = sv;
                if (e < 2) mx0 = fmaxf(mx0, sv); else mx1 = fmaxf(mx1, sv);
            }
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
        const float a0 = mn0 == -INFINITY ? 1.0f : exp2f(m0 - mn0);
        const float a1 = mn1 == -INFINITY ? 1.0f : exp2f(m1 - mn1);
        /* probabilities as bf16 A fragments: n-tiles 2kk, 2kk+1 form k-step kk of P V */
        uint32_t pa[F2_BC / 16][4];
        float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
        for (int n = 0; n < F2_BC / 8; n++) {
            float p[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float mref = e < 2 ? mn0 : mn1;
                p[e] = mref == -INFINITY ? 0.0f : exp2f(s[n][e] - mref);
            }
            uint32_t lo = pack_bf16(p[0], p[1]), hi = pack_bf16(p[2], p[3]);
            __nv_bfloat162 bl = *(__nv_bfloat162 *)&lo, bh = *(__nv_bfloat162 *)&hi;
            sum0 += __low2float(bl) + __high2float(bl);   /* normalise by what is multiplied */
            sum1 += __low2float(bh) + __high2float(bh);
            pa[n >> 1][(n & 1) * 2 + 0] = lo;
            pa[n >> 1][(n & 1) * 2 + 1] = hi;
        }
        sum0 += __shfl_xor_sync(0xffffffffu, sum0, 1);
        sum0 += __shfl_xor_sync(0xffffffffu, sum0, 2);
        sum1 += __shfl_xor_sync(0xffffffffu, sum1, 1);
        sum1 += __shfl_xor_sync(0xffffffffu, sum1, 2);
        l0 = l0 * a0 + sum0;
        l1 = l1 * a1 + sum1;
        m0 = mn0;
        m1 = mn1;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            o[n][0] *= a0; o[n][1] *= a0;
            o[n][2] *= a1; o[n][3] *= a1;
        }
        /* O += P V; V fragments (k = key, n = dim) by ldmatrix.x4.trans of two 8-dim columns */
        const int mi = lane >> 3, rr = lane & 7;
#pragma unroll
        for (int kk = 0; kk < F2_BC / 16; kk++) {
#pragma unroll
            for (int n = 0; n < D / 8; n += 2) {
                const bf16 *addr = Vt + (kk * 16 + (mi & 1) * 8 + rr) * LDK + (n + (mi >> 1)) * 8;
                unsigned sa = (unsigned)__cvta_generic_to_shared(addr);
                uint32_t b0, b1, b2, b3;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                             : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3) : "r"(sa));
                mma_bf16_16816(o[n], pa[kk], b0, b1);
                mma_bf16_16816(o[n + 1], pa[kk], b2, b3);
            }
        }
        __syncthreads();   /* the stage read here is refilled by the next iteration's prefetch */
    }
    const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
#pragma unroll
    for (int n = 0; n < D / 8; n++) {
        const size_t col = (size_t)h * D + n * 8 + 2 * tq;
        if (qi0 < T) *(uint32_t *)(out + (size_t)qi0 * QD + col) = pack_bf16(o[n][0] * inv0, o[n][1] * inv0);
        if (qi0 + 8 < T) *(uint32_t *)(out + (size_t)(qi0 + 8) * QD + col) = pack_bf16(o[n][2] * inv1, o[n][3] * inv1);
    }
}

template <int D>
static int flash2_launch(cudaStream_t s, void *out, const void *q, const void *k, const void *v,
                         int T, int p0, int Hq, int Hkv) {
    const int bytes = (F2_BR + 4 * F2_BC) * (D + 8) * 2;
    if (cudaFuncSetAttribute(flash2_prefill_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             bytes) != cudaSuccess) {   /* per device: as flash_launch */
        (void)cudaGetLastError();
        return -2;
    }
    dim3 grid((T + F2_BR - 1) / F2_BR, Hq);
    flash2_prefill_kernel<D><<<grid, F2_THREADS, bytes, s>>>(
        (bf16 *)out, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, T, p0, Hq, Hkv);
    return 0;
}

/* flash2 unless KVL_FLASH=wmma (read once). */
static int use_flash2(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("KVL_FLASH");
        v = !(e && !strcmp(e, "wmma"));
    }
    return v;
}

extern "C" int kvl__cu_attention_prefill(cudaStream_t s, int dt, void *out, const void *q,
                                        const void *k, const void *v, float *part, int T, int p0,
                                        int Hq, int Hkv, int D) {
    if (Hq % Hkv) return -1;
    if (dt == 0 && use_flash2()) {
        switch (D) {
        case 32: return flash2_launch<32>(s, out, q, k, v, T, p0, Hq, Hkv);
        case 64: return flash2_launch<64>(s, out, q, k, v, T, p0, Hq, Hkv);
        case 128: return flash2_launch<128>(s, out, q, k, v, T, p0, Hq, Hkv);
        default: break;
        }
    }
    if (dt == 0) {
        switch (D) {
        case 32: return flash_launch<32>(s, out, q, k, v, T, p0, Hq, Hkv);
        case 64: return flash_launch<64>(s, out, q, k, v, T, p0, Hq, Hkv);
        case 128: return flash_launch<128>(s, out, q, k, v, T, p0, Hq, Hkv);
        default: return splitk_launch<bf16>(s, out, q, k, v, part, T, p0, NULL, 1, Hq, Hkv, D);
        }
    }
    return splitk_launch<float>(s, out, q, k, v, part, T, p0, NULL, 1, Hq, Hkv, D);
}

extern "C" int kvl__cu_attention_decode(cudaStream_t s, int dt, void *out, const void *q,
                                       const void *k, const void *v, float *part,
                                       const int32_t *d_pos, int nsplit, int Hq, int Hkv, int D) {
    if (dt == 0) return splitk_launch<bf16>(s, out, q, k, v, part, 1, 0, d_pos, nsplit, Hq, Hkv, D);
    return splitk_launch<float>(s, out, q, k, v, part, 1, 0, d_pos, nsplit, Hq, Hkv, D);
}
