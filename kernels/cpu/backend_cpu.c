/* kernels/cpu/backend_cpu.c: the CPU backend behind kvl_backend_ops (kvlingo/backend.h).
 *
 * Weights: computed on in place from the host view (float32, matmul_f32.h), or, with
 * KVL_WEIGHTS_BF16, from bf16 copies of the big matrices made at model_create (matmul_bf16.h:
 * decode streams half the bytes; the host view stays float32 for translator training).
 * Cache: blocks of block_tokens tokens (kv_blocks.h), allocated as tokens arrive; the table's
 * cache entries but cache_create live in cache_cpu.c.
 * Forward: all tokens of a batch go through the projections and the MLP as one GEMM; attention
 * reads each sequence's K/V in place from its blocks (attention_decode.c: decode rows one by
 * one, prefill chunks in tiles of query rows), split over the model's pool, so prefill and
 * decode share one code path: the decoder layer of decoder.h, the same function translator
 * training runs.  Where the tiles' AVX-512 kernel applies (AVX-512F, head_dim <= 128) they
 * measured faster than gathering the context and running the sgemm attention of ops.c at every
 * chunk tried (9 to 2048 rows over contexts of 512 and 2048, head_dim 20/32/64, one and two
 * threads): causal keys skipped, exps vectorised, no copy.  Elsewhere prefill keeps the gather:
 * the tiles' portable C measured slower at head_dim 20.
 * Translate-apply: translate_cpu.c, on this model's pool when it is free. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend_cpu_internal.h"
#include "decoder.h"
#include "error.h"
#include "kv_blocks.h"
#include "matmul_bf16.h"
#include "translate_avx512.h"
#include "bigalloc.h"
#include "matmul_f32.h"
#include "ops.h"

/* ---- model: the view, the thread count, and the activation scratch ------------------------- */

typedef struct cpu_scratch {
    float *base;
    int cap_tokens, cap_ctx;
    float *x;           /* [T, H]      residual stream                          */
    float *xn;          /* [T, H]      normed input / projection outputs        */
    float *q;           /* [T, Hq*D]   queries (pre-norm, then normed + RoPE)   */
    float *k;           /* [T, Hkv*D]  keys after k_norm + RoPE                 */
    float *kpre;        /* [T, Hkv*D]  k_proj output                            */
    float *v;           /* [T, Hkv*D]                                           */
    float *att;         /* [T, Hq*D]   attention output                         */
    float *gate, *up;   /* [T, F]                                               */
    float *kctx, *vctx; /* [ctx, Hkv*D] gathered keys / values (gather path only) */
    float *scores;      /* kvl__cpu_attention_forward scratch (gather path only) */
    float *logit_x;     /* [T, H]      rows that need logits (normed)           */
    int *pos;           /* [T]         absolute positions                       */
    float *rope_cos, *rope_sin; /* [T, D/2] RoPE angles of the batch's tokens   */
} cpu_scratch;

/* KVL_WEIGHTS_BF16: the big matrices in bf16, carved from one allocation in the host view's
 * order; norms and biases are read from the host view. */
typedef struct cpu_bf16 {
    uint16_t *base;
    const uint16_t *embed, *lm_head;   /* [V, H]; lm_head == embed when tied */
    kvl__layer_view_bf16 *layers;      /* [L] */
    kvl__bf16_exec exec;               /* pool, panel */
    int k_max;                         /* largest K of any matmul: max(H, Hq*D, F) */
} cpu_bf16;

/* Decode attention of a batch over the pool: per-part scratch and the batch's decode rows. */
typedef struct cpu_decode_att {
    float *buf;              /* [parts][part_floats]: attention scratch [att_floats] (decode
                                scores [group, cap_ctx] or a prefill tile's), then K and V
                                block-pointer tables [cap_blocks] each */
    int parts, cap_ctx, cap_blocks;
    size_t part_floats, att_floats;
    int *seq_of, *t0_of;     /* [cap_seqs] a decode row's sequence index and batch row */
    int *pre_of, *pre_t0;    /* [cap_seqs] a prefill chunk's sequence index and first batch row */
    int cap_seqs;
} cpu_decode_att;

typedef struct cpu_model {
    const kvl_weights_view *w;
    int n_threads;
    cpu_scratch s;
    kvl__block_pool *pool;   /* idle KV blocks shared by this model's caches */
    cpu_bf16 *bf;            /* NULL in float32 mode */
    kvl__pool *workers;      /* float32 mode: threads for attention and every matmul
                                (bf16: bf->exec.pool) */
    kvl__layer_view_f32p *f32_layers;   /* [L] float32 mode: the host view and &workers */
    cpu_decode_att dec;
    int prefill_gather;      /* prefill chunks gather their context (kvl__cpu_attention_prefill_vectorised,
                                or a bf16 KV cache: the in-place prefill tiles read float32) */
    int kv_bf16;             /* caches made for this model store bf16 (kvl_model_params.kv_dtype) */
    /* The pool serves one job at a time: a forward holds pool_lock throughout; a translate-apply
     * (which may run beside a forward of this model, see cpu_translate_apply) only when it gets
     * it at once, and otherwise runs on its caller's thread alone. */
    pthread_mutex_t pool_lock;
    float *tr_buf;           /* translate-apply working memory while holding pool_lock */
    size_t tr_floats;
    float *lm_rows;          /* [n_last, V] logits of a batch's last rows, before they are */
    size_t lm_floats;        /*   copied to each sequence (grown on demand)                */
    kvl__rope_cache rope;    /* RoPE tables of the first positions (read-only once made)   */
} cpu_model;

/* Idle KV blocks a model keeps for reuse (beyond what its sessions hold). */
#define CPU_POOL_IDLE_BYTES ((size_t)256 << 20)
#define CPU_DEFAULT_BLOCK_TOKENS 16

static int pool_threads_for(int n_threads) {
    if (n_threads > 0) return n_threads;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* The pool matches the model's thread count (created again when model_set_threads changed it). */
static kvl_status bf16_pool_sync(cpu_model *m) {
    cpu_bf16 *b = m->bf;
    int want = pool_threads_for(m->n_threads);
    if (b->exec.pool && kvl__pool_threads(b->exec.pool) == want) return KVL_OK;
    kvl__pool_free(b->exec.pool);
    b->exec.pool = NULL;
    return kvl__pool_create(want, &b->exec.pool);
}

/* The threads of the model's own kernels: the bf16 matmuls' pool, or in float32 mode a pool of
 * the same size for attention and every matmul (matmul_f32.h). */
static kvl_status model_pool_sync(cpu_model *m) {
    if (m->bf) return bf16_pool_sync(m);
    int want = pool_threads_for(m->n_threads);
    if (m->workers && kvl__pool_threads(m->workers) == want) return KVL_OK;
    kvl__pool_free(m->workers);
    m->workers = NULL;
    return kvl__pool_create(want, &m->workers);
}

static kvl__pool *model_pool(cpu_model *m) { return m->bf ? m->bf->exec.pool : m->workers; }

/* float32 mode: the layers' inference view, pointing at m->workers (which model_pool_sync may
 * create again: the view reads it at each matmul). */
static kvl_status f32_layers_create(cpu_model *m) {
    const kvl_weights_view *w = m->w;
    m->f32_layers = calloc((size_t)w->cfg.n_layers, sizeof *m->f32_layers);
    if (!m->f32_layers) return kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    for (int l = 0; l < w->cfg.n_layers; l++) {
        const kvl_layer_view *f = &w->layers[l];
        m->f32_layers[l] = (kvl__layer_view_f32p){
            .attn_norm = f->attn_norm, .wq = f->wq, .wk = f->wk, .wv = f->wv, .bq = f->bq,
            .bk = f->bk, .bv = f->bv, .q_norm = f->q_norm, .k_norm = f->k_norm, .wo = f->wo,
            .bo = f->bo, .mlp_norm = f->mlp_norm, .w_gate = f->w_gate, .w_up = f->w_up,
            .w_down = f->w_down, .pool = &m->workers};
    }
    return KVL_OK;
}

static void bf16_free(cpu_bf16 *b) {
    if (!b) return;
    kvl__pool_free(b->exec.pool);
    free(b->exec.panel);
    free(b->layers);
    free(b->base);
    free(b);
}

typedef struct convert_job {
    uint16_t *dst;
    const float *src;
    size_t n;
} convert_job;

static void convert_part(void *pj, int part, int n_parts) {
    const convert_job *j = pj;
    size_t a = j->n * (size_t)part / (size_t)n_parts, b = j->n * (size_t)(part + 1) / (size_t)n_parts;
    kvl__bf16_from_f32(j->dst + a, j->src + a, b - a);
}

/* Round one host matrix to bf16 into *cur (split over the pool) and advance *cur. */
static const uint16_t *bf16_take(cpu_bf16 *b, uint16_t **cur, const float *src, size_t n) {
    convert_job j = {*cur, src, n};
    kvl__pool_run(b->exec.pool, convert_part, &j);
    *cur += n;
    return j.dst;
}

static kvl_status bf16_create(cpu_model *m) {
    const kvl_weights_view *w = m->w;
    const kvl_model_config *c = &w->cfg;
    const size_t H = c->hidden_size, QD = (size_t)c->n_heads * c->head_dim;
    const size_t KD = (size_t)c->n_kv_heads * c->head_dim, F = c->intermediate_size, V = c->vocab_size;
    const int tied = w->lm_head == w->embed;
    cpu_bf16 *b = calloc(1, sizeof *b);
    if (!b) return kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    m->bf = b;
    size_t per_layer = QD * H + 2 * KD * H + H * QD + 3 * F * H;
    size_t total = V * H * (tied ? 1 : 2) + per_layer * (size_t)c->n_layers;
    b->k_max = (int)(H > QD ? H : QD);
    if ((int)F > b->k_max) b->k_max = (int)F;
    b->base = kvl__bigalloc(total * sizeof(uint16_t));
    b->layers = calloc((size_t)c->n_layers, sizeof *b->layers);
    b->exec.panel = malloc(kvl__bf16_panel_elems(b->k_max) * sizeof(float));
    if (!b->base || !b->layers || !b->exec.panel)
        return kvl__errorf(KVL_ERR_NOMEM, "cpu backend: out of memory for %zu bf16 weights", total);
    kvl_status st = bf16_pool_sync(m);
    if (st != KVL_OK) return st;
    uint16_t *cur = b->base;
    b->embed = bf16_take(b, &cur, w->embed, V * H);
    b->lm_head = tied ? b->embed : bf16_take(b, &cur, w->lm_head, V * H);
    for (int l = 0; l < c->n_layers; l++) {
        const kvl_layer_view *f = &w->layers[l];
        kvl__layer_view_bf16 *o = &b->layers[l];
        o->attn_norm = f->attn_norm;
        o->bq = f->bq; o->bk = f->bk; o->bv = f->bv;
        o->q_norm = f->q_norm; o->k_norm = f->k_norm;
        o->bo = f->bo; o->mlp_norm = f->mlp_norm;
        o->wq = bf16_take(b, &cur, f->wq, QD * H);
        o->wk = bf16_take(b, &cur, f->wk, KD * H);
        o->wv = bf16_take(b, &cur, f->wv, KD * H);
        o->wo = bf16_take(b, &cur, f->wo, H * QD);
        o->w_gate = bf16_take(b, &cur, f->w_gate, F * H);
        o->w_up = bf16_take(b, &cur, f->w_up, F * H);
        o->w_down = bf16_take(b, &cur, f->w_down, H * F);
        o->exec = &b->exec;
    }
    return KVL_OK;
}

static void cpu_model_free(void *pm) {
    cpu_model *m = pm;
    if (!m) return;
    bf16_free(m->bf);
    kvl__pool_free(m->workers);
    free(m->f32_layers);
    free(m->dec.buf);
    free(m->dec.seq_of);
    free(m->dec.t0_of);
    free(m->dec.pre_of);
    free(m->dec.pre_t0);
    kvl__block_pool_unref(m->pool);   /* caches still alive keep it until they go */
    free(m->s.base);
    free(m->tr_buf);
    free(m->lm_rows);
    kvl__rope_cache_free(&m->rope);
    pthread_mutex_destroy(&m->pool_lock);
    free(m);
}

static kvl_status cpu_model_create(const kvl_weights_view *w, const kvl_model_params *p, void **out) {
    cpu_model *m = calloc(1, sizeof *m);
    if (!m) return kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    m->w = w;
    m->n_threads = p ? p->n_threads : 0;
    /* KVL_CPU_PREFILL=gather|tiles overrides the choice (to compare the two on one machine) */
    const char *pf = getenv("KVL_CPU_PREFILL");
    m->prefill_gather = pf && !strcmp(pf, "gather")  ? 1
                        : pf && !strcmp(pf, "tiles") ? 0
                                                     : !kvl__cpu_attention_prefill_vectorised(w->cfg.head_dim);
    m->kv_bf16 = p && p->kv_dtype == KVL_KV_BF16;
    if (m->kv_bf16 && !kvl__cpu_attention_prefill_bf16_vectorised(w->cfg.head_dim)) m->prefill_gather = 1;
    if (m->kv_bf16 && w->cfg.head_dim > KVL__ATT_BF16_MAX_D) {
        free(m);
        return kvl__errorf(KVL_ERR_UNSUPPORTED, "kv dtype bf16: head_dim %d is above the %d the bf16 "
                           "attention kernels take; use kv dtype f32", w->cfg.head_dim, KVL__ATT_BF16_MAX_D);
    }
    if (pthread_mutex_init(&m->pool_lock, NULL) != 0) {
        free(m);
        return kvl__errorf(KVL_ERR_IO, "cpu backend: cannot create the thread pool's mutex");
    }
    kvl_status s = kvl__block_pool_create(kvl__kv_blocks_block_bytes(&w->cfg, CPU_DEFAULT_BLOCK_TOKENS, m->kv_bf16),
                                          CPU_POOL_IDLE_BYTES, &m->pool);
    if (s != KVL_OK) {
        pthread_mutex_destroy(&m->pool_lock);
        free(m);
        return s;
    }
    s = p && p->weights_dtype == KVL_WEIGHTS_BF16 ? bf16_create(m) : f32_layers_create(m);
    if (s == KVL_OK) kvl__rope_cache_create(&w->cfg.rope, w->cfg.head_dim, &m->rope);
    if (s != KVL_OK) {
        cpu_model_free(m);
        return s;
    }
    *out = m;
    return KVL_OK;
}

static void cpu_model_set_threads(void *pm, int n_threads) { ((cpu_model *)pm)->n_threads = n_threads; }

/* Carve the scratch for T tokens of a batch whose longest sequence reaches ctx tokens, from one
 * allocation by a sizes table (context-sized parts only for the gather path: in place, attention
 * reads the blocks with per-part scratch in cpu_decode_att); grown geometrically so a growing
 * context does not reallocate every step. */
static kvl_status scratch_prepare(cpu_model *m, int T, int ctx) {
    cpu_scratch *s = &m->s;
    if (!m->prefill_gather) ctx = 0;
    if (s->base && T <= s->cap_tokens && ctx <= s->cap_ctx) return KVL_OK;
    int nt = T > s->cap_tokens ? T : s->cap_tokens;
    int nc = ctx > s->cap_ctx ? ctx : s->cap_ctx;
    if (ctx > s->cap_ctx && nc < 2 * s->cap_ctx) nc = 2 * s->cap_ctx;
    const size_t att = m->prefill_gather ? kvl__cpu_attention_scratch(nt, nc) : 0;
    const kvl_model_config *c = &m->w->cfg;
    size_t H = c->hidden_size, QD = (size_t)c->n_heads * c->head_dim;
    size_t KD = (size_t)c->n_kv_heads * c->head_dim, F = c->intermediate_size;
    size_t sizes[] = {
        nt * H, nt * H, nt * QD, nt * KD, nt * KD, nt * KD, nt * QD, nt * F, nt * F,
        (size_t)nc * KD, (size_t)nc * KD, att, nt * H,
        (size_t)nt /* pos (ints fit in floats' space) */,
        nt * (size_t)c->head_dim / 2, nt * (size_t)c->head_dim / 2,   /* RoPE cos/sin tables */
    };
    float **dst[] = {&s->x, &s->xn, &s->q, &s->k, &s->kpre, &s->v, &s->att, &s->gate, &s->up,
                     &s->kctx, &s->vctx, &s->scores, &s->logit_x, (float **)&s->pos,
                     &s->rope_cos, &s->rope_sin};
    size_t n = sizeof sizes / sizeof sizes[0], total = 0;
    for (size_t i = 0; i < n; i++) total += (sizes[i] + 15) & ~(size_t)15;   /* 64-byte steps */
    float *base = aligned_alloc(64, total * sizeof(float));
    if (!base) return kvl__errorf(KVL_ERR_NOMEM, "forward: out of memory for %zu activation floats", total);
    free(s->base);
    s->base = base;
    s->cap_tokens = nt;
    s->cap_ctx = nc;
    float *cur = base;
    for (size_t i = 0; i < n; i++) {
        *dst[i] = cur;
        cur += (sizes[i] + 15) & ~(size_t)15;
    }
    return KVL_OK;
}

/* ---- cache ----------------------------------------------------------------------------------- */

static kvl_status cpu_cache_create(const kvl_model_config *cfg, void *model, int capacity,
                                   int block_tokens, void **out) {
    cpu_model *m = model;
    return kvl__kv_blocks_create(cfg, capacity, block_tokens, m && m->kv_bf16, m ? m->pool : NULL,
                                 (kvl__kv_blocks **)out);
}

/* ---- forward ---------------------------------------------------------------------------------- */

typedef struct attend_ctx {
    cpu_model *m;
    const kvl_backend_seq *seqs;
    int n_seqs;
} attend_ctx;

/* One layer's decode attention of a batch, split over the pool: the items are (sequence, KV
 * head) pairs of the batch's one-token sequences, cut into contiguous runs of about equal cost
 * (context length x group) per part.  Each part has its own scores scratch and block-pointer
 * tables, carved from cpu_decode_att.buf. */
typedef struct decode_job {
    cpu_model *m;
    const kvl_backend_seq *seqs;
    const int *seq_of, *t0_of;   /* [n_dec] the decode sequences and their row in the batch */
    int n_dec, layer;
    const float *q;              /* [T, Hq*D] */
    float *att;                  /* [T, Hq*D] */
    double total_cost;
} decode_job;

static void decode_part(void *pj, int part, int n_parts) {
    const decode_job *j = pj;
    cpu_model *m = j->m;
    const kvl_model_config *c = &m->w->cfg;
    const int D = c->head_dim, Hq = c->n_heads, Hkv = c->n_kv_heads, group = Hq / Hkv, QD = Hq * D;
    cpu_decode_att *da = &m->dec;
    float *scores = da->buf + (size_t)part * da->part_floats;
    const float **kb = (const float **)(scores + da->att_floats);
    const float **vb = kb + da->cap_blocks;
    const double lo = j->total_cost * part / n_parts, hi = j->total_cost * (part + 1) / n_parts;
    double cum = 0;
    int loaded = -1;
    for (int d = 0; d < j->n_dec; d++) {
        const kvl_backend_seq *sq = &j->seqs[j->seq_of[d]];
        const kvl__kv_blocks *kc = sq->cache;
        const int Tk = sq->n_past + 1;
        for (int g = 0; g < Hkv; g++) {
            double mid = cum + 0.5 * Tk;   /* an item belongs to the part holding its midpoint */
            cum += Tk;
            if (mid < lo || mid >= hi) continue;
            if (loaded != d) {
                const int nb = (Tk + kc->block_tokens - 1) / kc->block_tokens;
                for (int b = 0; b < nb; b++) {
                    kb[b] = kvl__kv_blocks_slot(kc, j->layer, KVL_PLANE_K, b * kc->block_tokens);
                    vb[b] = kvl__kv_blocks_slot(kc, j->layer, KVL_PLANE_V, b * kc->block_tokens);
                }
                loaded = d;
            }
            const size_t row0 = (size_t)j->t0_of[d] * QD + (size_t)g * group * D;
            if (kc->bf16)   /* the tables hold uint16_t rows (kvl__kv_blocks_slot) */
                kvl__cpu_attention_decode_group_bf16(j->att + row0, j->q + row0,
                                                     (const uint16_t *const *)kb,
                                                     (const uint16_t *const *)vb, kc->block_tokens,
                                                     Hkv * D, g * D, Tk, group, D, scores);
            else
                kvl__cpu_attention_decode_group(j->att + row0, j->q + row0, kb, vb, kc->block_tokens,
                                                Hkv * D, g * D, Tk, group, D, scores);
        }
    }
}

/* One layer's prefill attention of a batch, split over the pool like decode_part: the items are
 * (sequence, KV head, tile of query rows) triples of the batch's multi-token chunks, in
 * contiguous runs of about equal cost per part; each reads its keys and values in place.  Head
 * by head: a switch's 9-token turn at GQA group 2 is an 8-row tile and one decode row per head,
 * and tile by tile the two decode rows fell to the same part (the forward over 2048 cached
 * tokens 7-13% slower than head by head, which keeps each head's tile and row together). */
typedef struct prefill_job {
    cpu_model *m;
    const kvl_backend_seq *seqs;
    const int *seq_of, *t0_of;   /* [n_pre] the prefill sequences and their first batch row */
    int n_pre, layer;
    const float *q;              /* [T, Hq*D] */
    float *att;                  /* [T, Hq*D] */
    double total_cost;
} prefill_job;

/* Relative cost of one tile over Tk keys with `lanes` query vectors: the scores pass costs the
 * same for any number of lanes (all LANES run together), the values pass one per lane. */
static double prefill_tile_cost(int Tk, int lanes) { return (double)Tk * (16.0 + lanes); }

/* A chunk's last tile when its rows fill at most this many of the tile's 16 query vectors runs
 * as single-query decode, row by row: the tile's scores pass costs the same for 2 lanes as for
 * 16, so a switch's 9-token turn at group 2 (a tile of 8 rows, then 1 row) read the whole
 * context twice at full cost.  Decode of one row of a group costs about 3 * group units a key
 * on prefill_tile_cost's scale (the AVX-512 form loads each key once for the group). */
#define CPU_PREFILL_DECODE_LANES 4
static int rows_by_decode(int r, int group) { return r * group <= CPU_PREFILL_DECODE_LANES; }
static double prefill_item_cost(int Tk, int r, int group) {
    return rows_by_decode(r, group) ? (double)Tk * r * 3.0 * group : prefill_tile_cost(Tk, r * group);
}

static void prefill_part(void *pj, int part, int n_parts) {
    const prefill_job *j = pj;
    cpu_model *m = j->m;
    const kvl_model_config *c = &m->w->cfg;
    const int D = c->head_dim, Hq = c->n_heads, Hkv = c->n_kv_heads, group = Hq / Hkv, QD = Hq * D;
    const int tile = kvl__cpu_attention_prefill_rows(group);
    cpu_decode_att *da = &m->dec;
    float *scratch = da->buf + (size_t)part * da->part_floats;
    const float **kb = (const float **)(scratch + da->att_floats);
    const float **vb = kb + da->cap_blocks;
    const double lo = j->total_cost * part / n_parts, hi = j->total_cost * (part + 1) / n_parts;
    double cum = 0;
    int loaded = -1;
    for (int d = 0; d < j->n_pre; d++) {
        const kvl_backend_seq *sq = &j->seqs[j->seq_of[d]];
        const kvl__kv_blocks *kc = sq->cache;
        const int n = sq->n_tokens, p0 = sq->n_past;
        for (int g = 0; g < Hkv; g++) {
            for (int i0 = 0; i0 < n; i0 += tile) {
                const int r = n - i0 < tile ? n - i0 : tile, Tk = p0 + i0 + r;
                const double w = prefill_item_cost(Tk, r, group);
                double mid = cum + 0.5 * w;   /* an item belongs to the part holding its midpoint */
                cum += w;
                if (mid < lo || mid >= hi) continue;
                if (loaded != d) {
                    const int nb = (p0 + n + kc->block_tokens - 1) / kc->block_tokens;
                    for (int b = 0; b < nb; b++) {
                        kb[b] = kvl__kv_blocks_slot(kc, j->layer, KVL_PLANE_K, b * kc->block_tokens);
                        vb[b] = kvl__kv_blocks_slot(kc, j->layer, KVL_PLANE_V, b * kc->block_tokens);
                    }
                    loaded = d;
                }
                const size_t off = (size_t)(j->t0_of[d] + i0) * QD + (size_t)g * group * D;
                if (rows_by_decode(r, group)) {   /* row p0+i0+i sees keys [0, p0+i0+i] */
                    for (int i = 0; i < r; i++) {
                        float *o = j->att + off + (size_t)i * QD;
                        const float *qi = j->q + off + (size_t)i * QD;
                        if (kc->bf16)
                            kvl__cpu_attention_decode_group_bf16(o, qi, (const uint16_t *const *)kb,
                                                                 (const uint16_t *const *)vb,
                                                                 kc->block_tokens, Hkv * D, g * D,
                                                                 p0 + i0 + i + 1, group, D, scratch);
                        else
                            kvl__cpu_attention_decode_group(o, qi, kb, vb, kc->block_tokens, Hkv * D,
                                                            g * D, p0 + i0 + i + 1, group, D, scratch);
                    }
                    continue;
                }
                if (kc->bf16)   /* the tables hold uint16_t rows (kvl__kv_blocks_slot) */
                    kvl__cpu_attention_prefill_group_bf16(j->att + off, j->q + off, QD,
                                                          (const uint16_t *const *)kb,
                                                          (const uint16_t *const *)vb,
                                                          kc->block_tokens, Hkv * D, g * D, p0 + i0,
                                                          r, group, D, scratch);
                else
                    kvl__cpu_attention_prefill_group(j->att + off, j->q + off, QD, kb, vb,
                                                     kc->block_tokens, Hkv * D, g * D, p0 + i0, r,
                                                     group, D, scratch);
            }
        }
    }
}

/* Grow the per-part decode scratch for contexts up to ctx tokens (geometrically, so a growing
 * context does not reallocate every step). */
static kvl_status decode_scratch_prepare(cpu_model *m, int parts, int ctx, int block_tokens) {
    cpu_decode_att *da = &m->dec;
    const kvl_model_config *c = &m->w->cfg;
    const int group = c->n_heads / c->n_kv_heads;
    if (da->buf && parts <= da->parts && ctx <= da->cap_ctx &&
        (ctx + block_tokens - 1) / block_tokens <= da->cap_blocks)
        return KVL_OK;
    int nc = ctx > da->cap_ctx ? ctx : da->cap_ctx;
    if (ctx > da->cap_ctx && nc < 2 * da->cap_ctx) nc = 2 * da->cap_ctx;
    if (nc < 256) nc = 256;
    int np = parts > da->parts ? parts : da->parts;
    int blocks = (nc + block_tokens - 1) / block_tokens;
    /* attention scratch, then two pointer tables (a pointer takes at most two floats' room) */
    size_t att = (size_t)group * nc, pre = kvl__cpu_attention_prefill_scratch(nc, c->head_dim);
    att = ((att > pre ? att : pre) + 15) & ~(size_t)15;
    size_t part_floats = (att + 4 * (size_t)blocks + 15) & ~(size_t)15;
    float *buf = aligned_alloc(64, (size_t)np * part_floats * sizeof(float));
    if (!buf) return kvl__errorf(KVL_ERR_NOMEM, "forward: out of memory for decode attention scratch");
    free(da->buf);
    da->buf = buf;
    da->parts = np;
    da->cap_ctx = nc;
    da->cap_blocks = blocks;
    da->part_floats = part_floats;
    da->att_floats = att;
    return KVL_OK;
}

/* Write each sequence's new K/V into its blocks, then attend over its whole context in place:
 * the batch's decode rows together on the pool, then its prefill chunks together on the pool. */
static void attend_blocks(void *pctx, int l, int T, const float *q, const float *k,
                          const float *kpre, const float *v, float *att) {
    (void)T;
    attend_ctx *ac = pctx;
    cpu_model *m = ac->m;
    const kvl_model_config *c = &m->w->cfg;
    const int D = c->head_dim, Hq = c->n_heads, Hkv = c->n_kv_heads, KD = Hkv * D;
    const int group = Hq / Hkv, tile = kvl__cpu_attention_prefill_rows(group);
    int n_dec = 0, n_pre = 0;
    double cost = 0, pre_cost = 0, pre_macs = 0;
    for (int i = 0, t0 = 0; i < ac->n_seqs; t0 += ac->seqs[i].n_tokens, i++) {
        kvl__kv_blocks *kc = ac->seqs[i].cache;
        int n = ac->seqs[i].n_tokens, p0 = ac->seqs[i].n_past;
        kvl__kv_blocks_scatter(kc, l, KVL_PLANE_K, p0, p0 + n, k + (size_t)t0 * KD);
        kvl__kv_blocks_scatter(kc, l, KVL_PLANE_V, p0, p0 + n, v + (size_t)t0 * KD);
        if (c->qk_norm) kvl__kv_blocks_scatter(kc, l, KVL_PLANE_KPRE, p0, p0 + n, kpre + (size_t)t0 * KD);
        if (n == 1) {
            m->dec.seq_of[n_dec] = i;
            m->dec.t0_of[n_dec++] = t0;
            cost += (double)(p0 + 1) * Hkv;
        } else if (!m->prefill_gather) {
            m->dec.pre_of[n_pre] = i;
            m->dec.pre_t0[n_pre++] = t0;
            for (int i0 = 0; i0 < n; i0 += tile) {
                const int r = n - i0 < tile ? n - i0 : tile;
                pre_cost += prefill_item_cost(p0 + i0 + r, r, group) * Hkv;
                pre_macs += (double)(p0 + i0 + r) * r * Hq;
            }
        }
    }
    if (n_dec > 0) {
        /* a worker hand-off costs more than it saves below ~64k multiply-adds (the workers
         * spin between the matmuls of a step) */
        decode_job j = {m, ac->seqs, m->dec.seq_of, m->dec.t0_of, n_dec, l, q, att, cost};
        kvl__pool *pool = model_pool(m);
        double macs = cost * 2.0 * (Hq / Hkv) * D, min_macs = 65536.0;
        if (pool && macs >= min_macs && n_dec * Hkv > 1) kvl__pool_run(pool, decode_part, &j);
        else decode_part(&j, 0, 1);
    }
    if (m->prefill_gather) {
        /* no AVX-512 kernel here: each chunk gathers its context and runs the sgemm attention */
        cpu_scratch *s = &m->s;
        for (int i = 0, t0 = 0; i < ac->n_seqs; t0 += ac->seqs[i].n_tokens, i++) {
            kvl__kv_blocks *kc = ac->seqs[i].cache;
            int n = ac->seqs[i].n_tokens, p0 = ac->seqs[i].n_past;
            if (n == 1) continue;
            kvl__kv_blocks_gather(kc, l, KVL_PLANE_K, 0, p0 + n, s->kctx);
            kvl__kv_blocks_gather(kc, l, KVL_PLANE_V, 0, p0 + n, s->vctx);
            kvl__cpu_attention_forward(att + (size_t)t0 * Hq * D, NULL, q + (size_t)t0 * Hq * D,
                                       s->kctx, s->vctx, n, p0 + n, p0, Hq, Hkv, D, s->scores);
        }
        return;
    }
    if (n_pre == 0) return;
    prefill_job pj = {m, ac->seqs, m->dec.pre_of, m->dec.pre_t0, n_pre, l, q, att, pre_cost};
    kvl__pool *pool = model_pool(m);
    const double macs = pre_macs * 2.0 * D;
    if (pool && macs >= 65536.0) kvl__pool_run(pool, prefill_part, &pj);
    else prefill_part(&pj, 0, 1);
}

static kvl_status forward_locked(cpu_model *m, const kvl_backend_seq *seqs, int n_seqs) {
    const kvl_weights_view *w = m->w;
    const kvl_model_config *c = &w->cfg;
    int T = 0, ctx = 0;
    for (int i = 0; i < n_seqs; i++) {
        T += seqs[i].n_tokens;
        if (seqs[i].n_past + seqs[i].n_tokens > ctx) ctx = seqs[i].n_past + seqs[i].n_tokens;
    }
    kvl_status st = scratch_prepare(m, T, ctx);
    if (st != KVL_OK) return st;
    for (int i = 0; i < n_seqs; i++)
        if ((st = kvl__kv_blocks_reserve(seqs[i].cache, seqs[i].n_past + seqs[i].n_tokens)) != KVL_OK)
            return st;
    cpu_bf16 *bf = m->bf;
    if ((st = model_pool_sync(m)) != KVL_OK) return st;
    if (n_seqs > m->dec.cap_seqs) {
        int *a = realloc(m->dec.seq_of, sizeof(int) * (size_t)n_seqs);
        if (a) m->dec.seq_of = a;
        int *b = realloc(m->dec.t0_of, sizeof(int) * (size_t)n_seqs);
        if (b) m->dec.t0_of = b;
        int *e = realloc(m->dec.pre_of, sizeof(int) * (size_t)n_seqs);
        if (e) m->dec.pre_of = e;
        int *f = realloc(m->dec.pre_t0, sizeof(int) * (size_t)n_seqs);
        if (f) m->dec.pre_t0 = f;
        if (!a || !b || !e || !f) return kvl__errorf(KVL_ERR_NOMEM, "forward: out of memory for %d sequences", n_seqs);
        m->dec.cap_seqs = n_seqs;
    }
    int min_bt = n_seqs > 0 ? ((const kvl__kv_blocks *)seqs[0].cache)->block_tokens : 1;
    for (int i = 1; i < n_seqs; i++) {
        int bt = ((const kvl__kv_blocks *)seqs[i].cache)->block_tokens;
        if (bt < min_bt) min_bt = bt;
    }
    if ((st = decode_scratch_prepare(m, kvl__pool_threads(model_pool(m)), ctx, min_bt)) != KVL_OK)
        return st;
    const int H = c->hidden_size, D = c->head_dim;
    cpu_scratch *s = &m->s;

    /* embeddings and absolute positions */
    for (int i = 0, t = 0; i < n_seqs; i++)
        for (int j = 0; j < seqs[i].n_tokens; j++, t++) {
            size_t row = (size_t)seqs[i].tokens[j] * H;
            if (bf) kvl__bf16_to_f32_n(s->x + (size_t)t * H, bf->embed + row, (size_t)H);
            else memcpy(s->x + (size_t)t * H, w->embed + row, sizeof(float) * H);
            s->pos[t] = seqs[i].n_past + j;
        }
    /* RoPE angles of every new token, once for all layers; per sequence, as each sequence is a
     * call of its own for RoPE whose frequencies depend on the sequence length (dynamic) */
    for (int i = 0, t0 = 0; i < n_seqs; t0 += seqs[i].n_tokens, i++)
        kvl__cpu_rope_table_cached(&m->rope, s->rope_cos + (size_t)t0 * (D / 2),
                                   s->rope_sin + (size_t)t0 * (D / 2), s->pos + t0, seqs[i].n_tokens,
                                   D, &c->rope);

    /* in place: the residual stream stays in x; k aliases kpre only without k_norm */
    kvl__decoder_acts_f32 a = {.x_in = s->x, .x_mid = s->x, .x_out = s->x, .xn = s->xn,
                               .qpre = s->q, .q = s->q, .kpre = c->qk_norm ? s->kpre : s->k,
                               .k = s->k, .v = s->v, .att = s->att, .gate = s->gate, .up = s->up,
                               .h = s->gate};
    attend_ctx ac = {m, seqs, n_seqs};
    if (bf) {
        /* the same layer over bf16 weights (same activation buffers and attention) */
        kvl__decoder_acts_bf16 ab = {.x_in = a.x_in, .x_mid = a.x_mid, .x_out = a.x_out, .xn = a.xn,
                                     .qpre = a.qpre, .q = a.q, .kpre = a.kpre, .k = a.k, .v = a.v,
                                     .att = a.att, .gate = a.gate, .up = a.up, .h = a.h};
        for (int l = 0; l < c->n_layers; l++)
            kvl__cpu_decoder_layer_forward_bf16(&bf->layers[l], c, l, T, s->rope_cos, s->rope_sin,
                                                &ab, attend_blocks, &ac);
    } else {
        /* the same layer over the host view, its matmuls on the model's pool */
        kvl__decoder_acts_f32p ap = {.x_in = a.x_in, .x_mid = a.x_mid, .x_out = a.x_out, .xn = a.xn,
                                     .qpre = a.qpre, .q = a.q, .kpre = a.kpre, .k = a.k, .v = a.v,
                                     .att = a.att, .gate = a.gate, .up = a.up, .h = a.h};
        for (int l = 0; l < c->n_layers; l++)
            kvl__cpu_decoder_layer_forward_f32p(&m->f32_layers[l], c, l, T, s->rope_cos, s->rope_sin,
                                                &ap, attend_blocks, &ac);
    }

    /* final norm + LM head, only for the rows whose logits were asked for.  The last rows
     * (KVL_LOGITS_LAST: every decode step) go through the LM head as one matrix, so a batch of
     * decode steps reads its [V, H] weights once, not once a sequence; then each row is copied
     * to its sequence.  KVL_LOGITS_ALL rows go straight into their sequence's logits. */
    const size_t V = (size_t)c->vocab_size;
    int n_last = 0, one = -1;
    for (int i = 0, t0 = 0; i < n_seqs; t0 += seqs[i].n_tokens, i++)
        if (seqs[i].logits_mode == KVL_LOGITS_LAST) {
            kvl__cpu_rmsnorm_forward(s->logit_x + (size_t)n_last * H,
                                     s->x + (size_t)(t0 + seqs[i].n_tokens - 1) * H, w->final_norm, 1, H,
                                     c->rms_norm_eps);
            n_last++;
            one = i;
        }
    if (n_last > 1 && m->lm_floats < (size_t)n_last * V) {
        float *g = realloc(m->lm_rows, sizeof(float) * (size_t)n_last * V);
        if (!g) return kvl__errorf(KVL_ERR_NOMEM, "forward: out of memory for %d rows of logits", n_last);
        m->lm_rows = g;
        m->lm_floats = (size_t)n_last * V;
    }
    if (n_last > 0) {
        float *dst = n_last == 1 ? seqs[one].logits : m->lm_rows;
        if (bf) kvl__cpu_matmul_bf16(&bf->exec, dst, s->logit_x, bf->lm_head, NULL, n_last, H, (int)V);
        else kvl__cpu_matmul_f32(m->workers, dst, s->logit_x, w->lm_head, NULL, n_last, H, (int)V);
        for (int i = 0, r = 0; n_last > 1 && i < n_seqs; i++)
            if (seqs[i].logits_mode == KVL_LOGITS_LAST)
                memcpy(seqs[i].logits, m->lm_rows + (size_t)r++ * V, sizeof(float) * V);
    }
    for (int i = 0, t0 = 0; i < n_seqs; t0 += seqs[i].n_tokens, i++) {
        const kvl_backend_seq *q = &seqs[i];
        if (q->logits_mode != KVL_LOGITS_ALL) continue;
        kvl__cpu_rmsnorm_forward(s->logit_x, s->x + (size_t)t0 * H, w->final_norm, q->n_tokens, H,
                                 c->rms_norm_eps);
        if (bf) kvl__cpu_matmul_bf16(&bf->exec, q->logits, s->logit_x, bf->lm_head, NULL, q->n_tokens, H, (int)V);
        else kvl__cpu_matmul_f32(m->workers, q->logits, s->logit_x, w->lm_head, NULL, q->n_tokens, H, (int)V);
    }
    return KVL_OK;
}

static kvl_status cpu_forward(void *pm, const kvl_backend_seq *seqs, int n_seqs) {
    cpu_model *m = pm;
    pthread_mutex_lock(&m->pool_lock);
    /* every matmul is split over the model's pool, OpenBLAS single-threaded in each part
     * (matmul_f32.h, matmul_bf16.h): one set of threads for the whole forward pass.  Afterwards
     * OpenBLAS gets the model's thread count when it has one (what translate-apply's sgemm and
     * other callers then see, as before), else the caller's setting back (translator training
     * threads its own GEMMs). */
    const int blas_was = kvl__cpu_set_threads(1);
    kvl_status st = forward_locked(m, seqs, n_seqs);
    kvl__cpu_set_threads(m->n_threads > 0 ? m->n_threads : blas_was);
    pthread_mutex_unlock(&m->pool_lock);
    return st;
}

/* ---- the pool for translate-apply (translate_cpu.c) ------------------------------------------- */

const kvl__rope_cache *kvl__cpu_model_rope(const void *model) { return &((const cpu_model *)model)->rope; }

int kvl__cpu_model_exec_take(void *model, kvl__cpu_exec *ex) {
    cpu_model *m = model;
    *ex = (kvl__cpu_exec){&m->pool_lock, NULL, &m->tr_buf, &m->tr_floats};
    if (pthread_mutex_trylock(ex->lock) != 0) return 1;
    int parts = 1;
    if (model_pool_sync(m) == KVL_OK) {
        ex->pool = model_pool(m);
        parts = kvl__pool_threads(ex->pool);
    }
    if (parts < 2) pthread_mutex_unlock(ex->lock);
    return parts < 2 ? 1 : parts;
}

/* ---- the table ------------------------------------------------------------------------------------ */

static char cpu_description[160];

static void cpu_describe_once(void) {
    const int f32 = kvl__f32_tiles_active();
    const kvl__bf16_kernel bf = kvl__bf16_kernel_active();
    snprintf(cpu_description, sizeof cpu_description,
             "float32: %s%sOpenBLAS (%s kernels); bf16 weights: %s", f32 ? kvl__f32_tiles_name() : "",
             f32 ? " tiles + " : "", kvl__cpu_blas_core(),
             bf == KVL__BF16_KERNEL_AMX      ? "AMX tiles + AVX-512 kernel"
             : bf == KVL__BF16_KERNEL_AVX512 ? "AVX-512 kernel"
             : bf == KVL__BF16_KERNEL_AVX2 ? "AVX2+FMA kernel (no AVX-512 here)"
                                           : "portable kernel (no AVX2 or AVX-512 here)");
}

static const char *cpu_describe(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, cpu_describe_once);
    return cpu_description;
}

static const kvl_backend_ops cpu_ops = {
    .name = "cpu",
    .describe = cpu_describe,
    .model_create = cpu_model_create,
    .model_free = cpu_model_free,
    .model_set_threads = cpu_model_set_threads,
    .cache_create = cpu_cache_create,
    .cache_free = kvl__cpu_cache_free,
    .cache_bytes = kvl__cpu_cache_bytes,
    .cache_truncate = kvl__cpu_cache_truncate,
    .cache_write = kvl__cpu_cache_write,
    .cache_read = kvl__cpu_cache_read,
    .cache_export_prenorm = kvl__cpu_cache_export_prenorm,
    .cache_export_prenorm_bf16 = kvl__cpu_cache_export_prenorm_bf16,
    .forward = cpu_forward,
    .translate_prepare = kvl__cpu_translate_prepare,
    .translate_release = kvl__cpu_translate_release,
    .translate_apply = kvl__cpu_translate_apply,
    .translate_bf16_products = kvl__translate_bf16_usable,
    .translate_apply_bf16 = kvl__cpu_translate_apply_bf16,
};

const kvl_backend_ops *kvl_backend_cpu(void) { return &cpu_ops; }
