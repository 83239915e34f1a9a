/* kernels/cpu/translate_cpu.c: the CPU backend's translate-apply (kvl_backend_ops.translate_*):
 * one sgemm per target layer and side, the target's k_norm and RoPE (angles once per span),
 * written straight into the cache blocks; target layers (or each layer's rows) split over the
 * target model's pool when it is free.  On AVX-512 CPUs spans of KVL_TR_FUSED_MIN_TOKENS or more
 * take the fused rows instead (translate_avx512.h: products, k_norm and RoPE in registers, items
 * of (layer, 64 tokens) claimed by whichever thread is free; with bf16 pairs of the maps given
 * and AVX512_BF16, bf16 products: each item's source rows rounded to bf16 first, or read in place
 * when they come as bf16, kvl__cpu_translate_apply_bf16); the sgemm path is the portable form and
 * the reference (KVL_CPU_TRANSLATE=portable forces it). */
#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend_cpu_internal.h"
#include "error.h"
#include "kv_blocks.h"
#include "matmul_bf16.h"
#include "ops.h"
#include "translate_avx512.h"

/* A prepared translation: a view of the caller's parameters and the target model (its pool). */
typedef struct cpu_translate {
    kvl_translate_params p;   /* a view: the maps and k_norm arrays stay the caller's */
    void *m;                  /* the target model; NULL for a cache made without one: the process's pool */
} cpu_translate;

kvl_status kvl__cpu_translate_prepare(void *model, const kvl_translate_params *p, void **out) {
    cpu_translate *c = malloc(sizeof *c);
    if (!c) return kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    c->p = *p;
    c->m = model;
    *out = c;
    return KVL_OK;
}

void kvl__cpu_translate_release(void *p) { free(p); }

/* One token row of one layer after the maps: k_norm over each head (when the target has one),
 * RoPE at the token's position, written straight into the block slots (K, V, Kpre): one pass
 * over the row instead of a norm pass, a rotation pass and three scatter copies. */
static void fused_rows(const kvl_translate_params *p, kvl__kv_blocks *c, int l, int t0, int n,
                       const float *kpre, const float *vout, const float *rcos, const float *rsin) {
    const int Ht = p->maps->dst_kv_heads, D = p->maps->dst_head_dim, half = D / 2;
    const size_t dt = (size_t)Ht * D;
    const float *kn = p->k_norm ? p->k_norm + (size_t)l * D : NULL;
    float head[KVL__ATT_BF16_MAX_D];   /* a bf16 cache: one head's key before rounding */
    if (c->bf16 && D > KVL__ATT_BF16_MAX_D) return;   /* refused when the cache was made */
    for (int t = 0; t < n; t++) {
        const float *x = kpre + (size_t)t * dt;
        const float *cs = rcos + (size_t)t * half, *sn = rsin + (size_t)t * half;
        void *ko = kvl__kv_blocks_slot(c, l, KVL_PLANE_K, t0 + t);
        void *vo = kvl__kv_blocks_slot(c, l, KVL_PLANE_V, t0 + t);
        if (c->bf16) kvl__bf16_from_f32(vo, vout + (size_t)t * dt, dt);
        else memcpy(vo, vout + (size_t)t * dt, sizeof(float) * dt);
        if (c->planes == 3) {
            void *po = kvl__kv_blocks_slot(c, l, KVL_PLANE_KPRE, t0 + t);
            if (c->bf16) kvl__bf16_from_f32(po, x, dt);
            else memcpy(po, x, sizeof(float) * dt);
        }
        for (int h = 0; h < Ht; h++) {
            const float *xh = x + (size_t)h * D;
            float *yh = c->bf16 ? head : (float *)ko + (size_t)h * D;
            float r = 1.0f;
            if (kn) {   /* Qwen3RMSNorm: variance in float32 over head_dim */
                float ss = 0.0f;
                for (int i = 0; i < D; i++) ss += xh[i] * xh[i];
                r = 1.0f / sqrtf(ss / (float)D + p->k_norm_eps);
            }
            for (int i = 0; i < half; i++) {   /* rotate_half RoPE of the normed key */
                float x1 = kn ? kn[i] * (xh[i] * r) : xh[i];
                float x2 = kn ? kn[i + half] * (xh[i + half] * r) : xh[i + half];
                yh[i] = x1 * cs[i] - x2 * sn[i];
                yh[i + half] = x2 * cs[i] + x1 * sn[i];
            }
            if (c->bf16) kvl__bf16_from_f32((uint16_t *)ko + (size_t)h * D, head, (size_t)D);
        }
    }
}

/* Translate-apply over the model's pool.  Two splits, both giving the bytes of the serial
 * loop (the same sgemm calls, each row's k_norm and RoPE alone):
 *   layers: OpenBLAS runs single-threaded (it would not use the other cores), so each part
 *           runs whole layers, both matmuls and the rows, with its own kpre/vout buffers;
 *   rows:   OpenBLAS threads its sgemm itself; the caller runs each layer's two matmuls and
 *           the parts then split that layer's rows (norm, RoPE, the writes into the blocks). */
typedef struct translate_job {
    const kvl_translate_params *p;
    kvl__kv_blocks *c;
    const float *k_src, *v_src;   /* [Ls][n][ds] */
    int t0, n, by_layers, layer;  /* layer: the rows split's current layer */
    int parts;                    /* layers split: parts with work, <= the pool's (and <= Lt) */
    float *buf;                   /* layers: [parts][2][n*dt]; rows: [2][n*dt] */
    const float *rcos, *rsin;     /* [n, D/2] */
} translate_job;

static void translate_layer_mats(const kvl_translate_params *p, int l, const float *k_src,
                                 const float *v_src, int n, float *kpre, float *vout) {
    const kvl_kv_maps *mp = p->maps;
    const int ds = mp->src_kv_heads * mp->src_head_dim, dt = mp->dst_kv_heads * mp->dst_head_dim;
    const size_t wsz = (size_t)dt * ds;
    const int sl = mp->layer_map[l];
    const float *xk = k_src + (size_t)sl * n * ds, *xv = v_src + (size_t)sl * n * ds;
    /* k_pre_t = W_K k_s ; v_t = W_V v_s (the method, kvlingo/translator.h) */
    kvl__cpu_matmul_forward(kpre, xk, mp->wk + (size_t)l * wsz, NULL, n, ds, dt);
    kvl__cpu_matmul_forward(vout, xv, mp->wv + (size_t)l * wsz, NULL, n, ds, dt);
}

static void translate_part(void *pj, int part, int n_parts) {
    const translate_job *j = pj;
    const kvl_kv_maps *mp = j->p->maps;
    const int D = mp->dst_head_dim, half = D / 2;
    const size_t per = (size_t)j->n * mp->dst_kv_heads * D;
    if (j->by_layers) {
        const int Lt = mp->dst_layers;
        if (part >= j->parts) return;
        n_parts = j->parts;
        float *kpre = j->buf + (size_t)part * 2 * per, *vout = kpre + per;
        for (int l = Lt * part / n_parts; l < Lt * (part + 1) / n_parts; l++) {
            translate_layer_mats(j->p, l, j->k_src, j->v_src, j->n, kpre, vout);
            fused_rows(j->p, j->c, l, j->t0, j->n, kpre, vout, j->rcos, j->rsin);
        }
        return;
    }
    const int a = (int)((long long)j->n * part / n_parts), b = (int)((long long)j->n * (part + 1) / n_parts);
    const size_t dt = (size_t)mp->dst_kv_heads * D;
    fused_rows(j->p, j->c, j->layer, j->t0 + a, b - a, j->buf + (size_t)a * dt,
               j->buf + per + (size_t)a * dt, j->rcos + (size_t)a * half, j->rsin + (size_t)a * half);
}

/* A cache made without a model (kvl_cache_create) translates on one pool of the process,
 * created at the first such translation (all cores; its workers sleep between jobs), with its
 * working memory. */
static pthread_mutex_t g_tr_lock = PTHREAD_MUTEX_INITIALIZER;
static kvl__pool *g_tr_pool;   /* lives as long as the process */
static float *g_tr_buf;
static size_t g_tr_floats;

/* The pool's thread count with its lock held, or 1 (lock not held) when it is busy or has one
 * thread, or cannot be made: the caller then translates alone. */
static int exec_take(void *model, kvl__cpu_exec *ex) {
    if (model) return kvl__cpu_model_exec_take(model, ex);
    *ex = (kvl__cpu_exec){&g_tr_lock, NULL, &g_tr_buf, &g_tr_floats};
    if (pthread_mutex_trylock(ex->lock) != 0) return 1;
    if (!g_tr_pool) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        if (kvl__pool_create_spin(nc > 0 ? (int)nc : 1, 0, &g_tr_pool) != KVL_OK) g_tr_pool = NULL;
    }
    ex->pool = g_tr_pool;
    int parts = ex->pool ? kvl__pool_threads(ex->pool) : 1;
    if (parts < 2) pthread_mutex_unlock(ex->lock);
    return parts < 2 ? 1 : parts;
}

/* At least `need` floats of working memory: the pool's (reused across switches) while it is
 * held (parts > 1), else the cache's (reused across spans).  NULL when out of memory, with the
 * pool released. */
static float *work_memory(kvl__cpu_exec *ex, int parts, kvl__kv_blocks *c, size_t need) {
    if (parts <= 1) return kvl__kv_blocks_scratch(c, need);
    if (need > *ex->floats) {
        float *nb = malloc(need * sizeof(float));
        if (!nb) {
            pthread_mutex_unlock(ex->lock);
            return NULL;
        }
        free(*ex->buf);
        *ex->buf = nb;
        *ex->floats = need;
    }
    return *ex->buf;
}

/* The target model's RoPE tables (ops.h kvl__rope_cache) when they hold rows [t0, t0 + n) for
 * the translation's RoPE: the rows kvl__cpu_rope_table_len would make for the span (seq_len
 * t0 + n <= max_position_embeddings).  NULL for a cache made without a model, a span past the
 * tables, or parameters other than the model's. */
static const kvl__rope_cache *cached_rope(const cpu_translate *tr, int t0, int n, int D) {
    if (!tr->m) return NULL;
    const kvl__rope_cache *rc = kvl__cpu_model_rope(tr->m);
    return kvl__rope_cache_covers(rc, &tr->p.rope, D, t0, n) ? rc : NULL;
}

/* ---- the fused rows (translate_avx512.h) ----------------------------------------------------
 * Work items are (target layer, chunk of KVL_TR_CHUNK tokens), layer-major, claimed by whichever
 * part is free, so no thread waits for another on an uneven split; a part transposes a layer's
 * maps into its own scratch when it takes its first item of that layer.  The span's RoPE rows
 * come from the target model's tables; past them (or on a cache made without a model) the table
 * of the span is made before, its rows split over the parts (a sincosf per position and
 * frequency: ~1 ms of a 2048-token span on one core). */
#define KVL_TR_CHUNK 64
/* Shorter spans take the sgemm path when the maps come untransposed: transposing every layer's
 * maps per span then costs more than the fused rows save below ~16 tokens (qwen3-a -> qwen3-b, 9
 * tokens: 0.05 against 0.04 ms; 16: 0.04 against 0.08).  With the maps' transposes given
 * (kvl_kv_maps.wkT, a translator's) the fused rows are the faster at every length (1 token:
 * 0.005 against 0.008 ms; 64: 0.08 against 0.31). */
#define KVL_TR_FUSED_MIN_TOKENS 16

typedef struct fused_job {
    const kvl_translate_params *p;
    kvl__kv_blocks *c;
    const float *k_src, *v_src;   /* [Ls][n][ds] */
    int t0, n, n_chunks;
    atomic_int next;              /* the next unclaimed item */
    float *wT;                    /* [parts][2][ds * dt]: each part's transposed W_K, W_V */
    uint16_t *x16;                /* bf16 products: [parts][2][KVL_TR_CHUNK * ds], else NULL */
    const uint16_t *k16, *v16;    /* bf16 products from bf16 source rows [Ls][n][ds] (the
                                   * caller's, read in place; k_src / v_src then NULL), else NULL */
    const float *rcos, *rsin;     /* [n, D/2]: the span's rows of the model's tables, or rtab's */
    float *rtab;                  /* [2][n, D/2] working memory for the tables when made here */
    int *pos;                     /* [n] */
    int stream;                   /* K / V rows written past the caches (KVL_TR_STREAM_BYTES) */
} fused_job;

/* A span whose translated K and V take this much or more is written past the caches
 * (non-temporal stores, as its Kpre rows always are): it cannot stay cached for the forward
 * that reads it next anyway (that forward's attention prefetches the blocks), and a normal
 * store first reads each line it writes, doubling the traffic.  Measured on a 2-core Zen 4
 * (kvlingo bench switch qwen3-a -> qwen3-b, four interleaved pairs): 2048 tokens (12.6 MB)
 * translate 1.85-2.06 against 2.23-2.39 ms, the forward unchanged; at 512 tokens (3.1 MB) the
 * forward read the streamed rows slower, hence the bound. */
#define KVL_TR_STREAM_BYTES (4u << 20)

static void fused_table_part(void *pj, int part, int n_parts) {
    fused_job *j = pj;
    const int half = j->p->maps->dst_head_dim / 2;
    int a, b;
    kvl__pool_part_rows(j->n, part, n_parts, &a, &b);
    if (a < b)   /* the whole span's sequence length, as one table would have it */
        kvl__cpu_rope_table_len(j->rtab + (size_t)a * half, j->rtab + (size_t)(j->n + a) * half,
                                j->pos + a, b - a, j->p->maps->dst_head_dim, &j->p->rope, j->t0 + j->n);
}

static void fused_rows_part(void *pj, int part, int n_parts) {
    fused_job *j = pj;
    (void)n_parts;
    const kvl_kv_maps *mp = j->p->maps;
    const int D = mp->dst_head_dim, dt = mp->dst_kv_heads * D;
    const int ds = mp->src_kv_heads * mp->src_head_dim;
    const size_t wsz = (size_t)dt * ds;
    /* the maps' transposes: the caller's when given, else this part's scratch, made per layer */
    float *own = mp->wkT || j->x16 || j->k16 ? NULL : j->wT + (size_t)part * 2 * wsz;
    const float *wkT = own, *wvT = own ? own + wsz : NULL;
    const int n_items = mp->dst_layers * j->n_chunks;
    int have = -1;   /* the layer whose maps wkT / wvT hold */
    for (int i; (i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < n_items;) {
        const int l = i / j->n_chunks, a = (i % j->n_chunks) * KVL_TR_CHUNK;
        const int b = a + KVL_TR_CHUNK < j->n ? a + KVL_TR_CHUNK : j->n;
        if (l != have && !j->x16 && !j->k16) {
            if (own) {
                kvl__translate_transpose(own, mp->wk + (size_t)l * wsz, dt, ds);
                kvl__translate_transpose(own + wsz, mp->wv + (size_t)l * wsz, dt, ds);
            } else {
                wkT = mp->wkT + (size_t)l * wsz;
                wvT = mp->wvT + (size_t)l * wsz;
            }
            have = l;
        }
        const size_t so = (size_t)mp->layer_map[l] * j->n * ds;
        const float *kn = j->p->k_norm ? j->p->k_norm + (size_t)l * D : NULL;
        if (j->x16 || j->k16) {   /* the item's source rows in bf16 (rounded here, or given), the bf16 products */
            const int half = D / 2;
            const uint16_t *xk, *xv;
            if (j->k16) {
                xk = j->k16 + so + (size_t)a * ds;
                xv = j->v16 + so + (size_t)a * ds;
            } else {
                uint16_t *rk = j->x16 + (size_t)part * 2 * KVL_TR_CHUNK * ds, *rv = rk + (size_t)KVL_TR_CHUNK * ds;
                kvl__bf16_round_n(rk, j->k_src + so + (size_t)a * ds, (size_t)(b - a) * ds);
                kvl__bf16_round_n(rv, j->v_src + so + (size_t)a * ds, (size_t)(b - a) * ds);
                xk = rk;
                xv = rv;
            }
            kvl__translate_rows_avx512_bf16(j->c, l, j->t0 + a, xk, xv, ds, mp->wkP + (size_t)l * wsz,
                                            mp->wvP + (size_t)l * wsz, dt, D, kn, j->p->k_norm_eps,
                                            j->rcos + (size_t)a * half, j->rsin + (size_t)a * half, 0, b - a,
                                            j->stream);
            continue;
        }
        kvl__translate_rows_avx512(j->c, l, j->t0, j->k_src + so, j->v_src + so, ds, wkT, wvT, dt, D, kn,
                                   j->p->k_norm_eps, j->rcos, j->rsin, a, b, j->stream);
    }
}

/* The fused rows over the pool when it is free (parts > 1, ex held), else on the caller; from
 * float32 source rows (k_src, v_src), or from bf16 ones (k16, v16: the caller has checked that
 * this translation takes bf16 products, fused_bf16_ready). */
static kvl_status fused_apply(const cpu_translate *tr, const float *k_src, const float *v_src,
                              const uint16_t *k16, const uint16_t *v16, int t0, int n,
                              kvl__kv_blocks *c) {
    const kvl_translate_params *p = &tr->p;
    const kvl_kv_maps *mp = p->maps;
    const int D = mp->dst_head_dim, dt = mp->dst_kv_heads * D;
    const int ds = mp->src_kv_heads * mp->src_head_dim;
    const double macs = 2.0 * n * (double)ds * dt * mp->dst_layers;
    kvl__cpu_exec ex;
    const int parts = macs >= 1048576.0 ? exec_take(tr->m, &ex) : 1;
    /* working memory: the parts' transposed maps (none when given), RoPE cos/sin [n, D/2],
     * positions [n] */
    const int bf = k16 || (mp->wkP && mp->wvP && kvl__translate_bf16_usable(D, dt, ds));
    const size_t wts = mp->wkT || bf ? 0 : (size_t)parts * 2 * dt * ds, tab = (size_t)n * (D / 2);
    /* bf16 products from float32 rows: each part's item of source rows in bf16 (in floats'
     * room, rounded up) */
    const size_t x16 = bf && !k16 ? ((size_t)parts * 2 * KVL_TR_CHUNK * ds + 1) / 2 : 0;
    const size_t need = wts + 2 * tab + (size_t)n + x16;
    float *buf = work_memory(&ex, parts, c, need);
    if (!buf) return kvl__errorf(KVL_ERR_NOMEM, "out of memory translating %d tokens", n);
    fused_job j = {.p = p, .c = c, .k_src = k_src, .v_src = v_src, .t0 = t0, .n = n,
                   .n_chunks = (n + KVL_TR_CHUNK - 1) / KVL_TR_CHUNK, .wT = buf,
                   .rcos = buf + wts, .rsin = buf + wts + tab, .rtab = buf + wts,
                   .pos = (int *)(buf + wts + 2 * tab),
                   .x16 = x16 ? (uint16_t *)(buf + wts + 2 * tab + n) : NULL, .k16 = k16, .v16 = v16,
                   .stream = 2.0 * n * dt * mp->dst_layers * (c->bf16 ? 2 : 4) >= KVL_TR_STREAM_BYTES};
    atomic_init(&j.next, 0);
    for (int i = 0; i < n; i++) j.pos[i] = t0 + i;
    /* the model's tables when they reach the span's end (the same rows), else made here */
    const kvl__rope_cache *rc = cached_rope(tr, t0, n, D);
    if (rc) {
        j.rcos = rc->cos + (size_t)t0 * (D / 2);
        j.rsin = rc->sin + (size_t)t0 * (D / 2);
    }
    if (parts > 1) {
        if (!rc) kvl__pool_run(ex.pool, fused_table_part, &j);
        kvl__pool_run(ex.pool, fused_rows_part, &j);
        pthread_mutex_unlock(ex.lock);
    } else {
        if (!rc) fused_table_part(&j, 0, 1);
        fused_rows_part(&j, 0, 1);
    }
    return KVL_OK;
}

kvl_status kvl__cpu_translate_apply(void *pp, const float *k_src, const float *v_src, int t0,
                                      int n, void *pc) {
    const cpu_translate *tr = pp;
    const kvl_translate_params *p = &tr->p;
    const kvl_kv_maps *mp = p->maps;
    kvl__kv_blocks *c = pc;
    if (n == 0) return KVL_OK;
    const int Lt = mp->dst_layers, D = mp->dst_head_dim;
    const int ds = mp->src_kv_heads * mp->src_head_dim, dt = mp->dst_kv_heads * D;
    const size_t per = (size_t)n * dt, tab = (size_t)n * (D / 2);
    /* the rows are written at the cache's own layout: maps of another target would overrun it */
    if (Lt != c->cfg.n_layers || D != c->cfg.head_dim || (size_t)dt != c->row)
        return kvl__errorf(KVL_ERR_MISMATCH, "translate: maps for %d layers x %d x %d, the cache holds "
                           "%d x %d x %d", Lt, mp->dst_kv_heads, D, c->cfg.n_layers, c->cfg.n_kv_heads,
                           c->cfg.head_dim);
    kvl_status s = kvl__kv_blocks_reserve(c, t0 + n);
    if (s != KVL_OK) return s;
    if ((mp->wkT || n >= KVL_TR_FUSED_MIN_TOKENS) && kvl__translate_avx512_usable(D, dt) &&
        (size_t)dt == c->row && !(c->bf16 && D > KVL__ATT_BF16_MAX_D))
        return fused_apply(tr, k_src, v_src, NULL, NULL, t0, n, c);
    /* The pool when it is free and the span worth a hand-off (~1M multiply-adds): concurrent
     * imports into one model, or one beside its forward, run on their callers' threads. */
    const double macs = 2.0 * n * (double)ds * dt * Lt;
    kvl__cpu_exec ex;
    int parts = macs >= 1048576.0 ? exec_take(tr->m, &ex) : 1;
    const int by_layers = parts > 1 && openblas_get_num_threads() == 1;
    if (by_layers && parts > Lt) parts = Lt;
    /* working memory: kpre and v [n, dt] (per part when split by layers), RoPE cos/sin [n, D/2],
     * positions [n] (ints in floats' room); the pool's, reused across switches, while it is
     * held, else the cache's (reused across spans) */
    const size_t bufs = 2 * per * (size_t)(by_layers ? parts : 1);
    const size_t need = bufs + 2 * tab + (size_t)n;
    float *buf = work_memory(&ex, parts, c, need);
    if (!buf) return kvl__errorf(KVL_ERR_NOMEM, "out of memory translating %d tokens", n);
    const float *rcos = buf + bufs, *rsin = rcos + tab;
    int *pos = (int *)(buf + bufs + 2 * tab);
    for (int i = 0; i < n; i++) pos[i] = t0 + i;
    /* the target's RoPE angles of the span, once for all layers: the model's rows, or made here */
    const kvl__rope_cache *rc = cached_rope(tr, t0, n, D);
    if (rc) {
        rcos = rc->cos + (size_t)t0 * (D / 2);
        rsin = rc->sin + (size_t)t0 * (D / 2);
    } else {
        kvl__cpu_rope_table(buf + bufs, buf + bufs + tab, pos, n, D, &p->rope);
    }
    translate_job j = {p, c, k_src, v_src, t0, n, by_layers, 0, parts, buf, rcos, rsin};
    if (parts == 1) {
        for (int l = 0; l < Lt; l++) {
            translate_layer_mats(p, l, k_src, v_src, n, buf, buf + per);
            /* k_t = RoPE(k_norm(k_pre_t)), all three rows into the blocks */
            fused_rows(p, c, l, t0, n, buf, buf + per, rcos, rsin);
        }
        return KVL_OK;
    }
    kvl__pool *pool = ex.pool;
    if (by_layers) {
        kvl__pool_run(pool, translate_part, &j);
    } else {
        for (int l = 0; l < Lt; l++) {
            translate_layer_mats(p, l, k_src, v_src, n, buf, buf + per);
            j.layer = l;
            kvl__pool_run(pool, translate_part, &j);
        }
    }
    pthread_mutex_unlock(ex.lock);
    return KVL_OK;
}

/* Whether translate-apply into c takes the fused rows' bf16 products (the conditions under which
 * kvl__cpu_translate_apply does, with the maps' bf16 pairs given). */
static int fused_bf16_ready(const kvl_kv_maps *mp, const kvl__kv_blocks *c, int n) {
    const int D = mp->dst_head_dim, dt = mp->dst_kv_heads * D, ds = mp->src_kv_heads * mp->src_head_dim;
    return (mp->wkT || n >= KVL_TR_FUSED_MIN_TOKENS) && mp->wkP && mp->wvP &&
           kvl__translate_avx512_usable(D, dt) && kvl__translate_bf16_usable(D, dt, ds) &&
           (size_t)dt == c->row && !(c->bf16 && D > KVL__ATT_BF16_MAX_D);
}

kvl_status kvl__cpu_translate_apply_bf16(void *pp, const uint16_t *k_src16, const uint16_t *v_src16,
                                         int t0, int n, void *pc) {
    const cpu_translate *tr = pp;
    const kvl_kv_maps *mp = tr->p.maps;
    kvl__kv_blocks *c = pc;
    if (n == 0) return KVL_OK;
    if (mp->dst_layers != c->cfg.n_layers || mp->dst_head_dim != c->cfg.head_dim || !fused_bf16_ready(mp, c, n))
        return kvl__errorf(KVL_ERR_UNSUPPORTED, "translate: bf16 source rows need the bf16 products "
                           "(AVX512_BF16, the maps' bf16 pairs, this geometry)");
    kvl_status s = kvl__kv_blocks_reserve(c, t0 + n);
    if (s != KVL_OK) return s;
    return fused_apply(tr, NULL, NULL, k_src16, v_src16, t0, n, c);
}
