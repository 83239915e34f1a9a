/* engine/model/model_random.c: published geometries by name and random-weight host models
 * (include/kvlingo/shapes.h), for benchmarks at real sizes without downloaded weights. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "kvlingo/shapes.h"
#include "model_internal.h"

typedef struct shape_def {
    const char *name;
    kvl_arch arch;
    int layers, hidden, heads, kv_heads, head_dim, ffn, vocab, max_pos, tied, qkv_bias;
    double theta;
} shape_def;

/* From the checkpoints' config.json (Hugging Face Qwen/<name>). */
static const shape_def SHAPES[] = {
    {"qwen2.5-0.5b", KVL_ARCH_QWEN2, 24, 896, 14, 2, 64, 4864, 151936, 32768, 1, 1, 1e6},
    {"qwen2.5-1.5b", KVL_ARCH_QWEN2, 28, 1536, 12, 2, 128, 8960, 151936, 131072, 1, 1, 1e6},
    {"qwen3-4b", KVL_ARCH_QWEN3, 36, 2560, 32, 8, 128, 9728, 151936, 40960, 1, 0, 1e6},
    {"qwen3-8b", KVL_ARCH_QWEN3, 36, 4096, 32, 8, 128, 12288, 151936, 40960, 0, 0, 1e6},
    {"tiny", KVL_ARCH_QWEN3, 2, 64, 4, 2, 32, 128, 512, 4096, 1, 0, 1e4},
};

const char *kvl_shape_names(void) { return "qwen2.5-0.5b, qwen2.5-1.5b, qwen3-4b, qwen3-8b, tiny"; }

kvl_status kvl_shape_config(const char *name, kvl_model_config *out) {
    for (size_t i = 0; name && i < sizeof SHAPES / sizeof SHAPES[0]; i++) {
        const shape_def *d = &SHAPES[i];
        if (strcmp(name, d->name)) continue;
        memset(out, 0, sizeof *out);
        out->arch = d->arch;
        snprintf(out->architecture, sizeof out->architecture, "%s",
                 d->arch == KVL_ARCH_QWEN2 ? "Qwen2ForCausalLM" : "Qwen3ForCausalLM");
        out->vocab_size = d->vocab;
        out->hidden_size = d->hidden;
        out->n_layers = d->layers;
        out->n_heads = d->heads;
        out->n_kv_heads = d->kv_heads;
        out->head_dim = d->head_dim;
        out->intermediate_size = d->ffn;
        out->rms_norm_eps = 1e-6f;
        out->rope_theta = d->theta;
        out->qkv_bias = d->qkv_bias;
        out->o_bias = 0;
        out->qk_norm = d->arch == KVL_ARCH_QWEN3;
        out->tie_word_embeddings = d->tied;
        out->max_position_embeddings = d->max_pos;
        out->bos_token_id = -1;
        out->n_eos = 1;
        out->eos_token_ids[0] = d->vocab > 151643 ? 151643 : d->vocab - 1;
        out->weight_dtype = KVL_DTYPE_BF16;
        return KVL_OK;
    }
    return kvl__errorf(KVL_ERR_NOT_FOUND, "unknown model shape '%s' (known: %s)", name ? name : "(null)",
                      kvl_shape_names());
}

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void fill_uniform(float *p, size_t n, uint64_t *state, float std) {
    float a = std * 1.7320508f;
    for (size_t i = 0; i < n; i++) p[i] = (2.0f * (float)(splitmix64(state) >> 40) / 16777216.0f - 1.0f) * a;
}

static void fill_const(float *p, size_t n, float v) {
    for (size_t i = 0; i < n; i++) p[i] = v;
}

kvl_status kvl_model_create_random(const kvl_model_config *cfg, uint64_t seed,
                                   const kvl_model_params *params, kvl_model **out) {
    if (!cfg || !out) return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_model_create_random: NULL argument");
    *out = NULL;
    const kvl_model_config *c = cfg;
    if (c->hidden_size < 1 || c->n_layers < 1 || c->n_heads < 1 || c->n_kv_heads < 1 ||
        c->n_heads % c->n_kv_heads || c->head_dim < 2 || c->head_dim % 2 || c->intermediate_size < 1 ||
        c->vocab_size < 1)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_model_create_random: bad geometry");
    kvl_model *m = calloc(1, sizeof *m);
    if (!m) return kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    m->cfg = *c;
    m->n_threads = params ? params->n_threads : 0;
    pthread_mutex_init(&m->lock, NULL);
    snprintf(m->name, sizeof m->name, "random-%s", c->architecture);
    snprintf(m->dir, sizeof m->dir, "(random)");
    snprintf(m->hash, sizeof m->hash, "%016llx", (unsigned long long)(seed * 0x9E3779B97F4A7C15ull));
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    size_t H = c->hidden_size, D = c->head_dim, QD = (size_t)c->n_heads * D;
    size_t KD = (size_t)c->n_kv_heads * D, F = c->intermediate_size, V = c->vocab_size;
    size_t per = 2 * H + QD * H + 2 * KD * H + H * QD + 3 * F * H + (c->qkv_bias ? QD + 2 * KD : 0) +
                 (c->qk_norm ? 2 * D : 0) + (c->o_bias ? H : 0);
    size_t total = V * H * (c->tie_word_embeddings ? 1 : 2) + H + per * c->n_layers;
    m->weights_base = m->layers ? malloc(total * sizeof(float)) : NULL;
    if (!m->weights_base) {
        kvl_model_free(m);
        return kvl__errorf(KVL_ERR_NOMEM, "random model: out of memory for %zu weights", total);
    }
    m->weights_floats = total;
    uint64_t st = seed;
    float *cur = m->weights_base;
#define TAKE(ptr, n, init) do { (ptr) = cur; init; cur += (n); } while (0)
    TAKE(m->embed, V * H, fill_uniform(cur, V * H, &st, 0.02f));
    if (c->tie_word_embeddings) m->lm_head = m->embed;
    else TAKE(m->lm_head, V * H, fill_uniform(cur, V * H, &st, 0.02f));
    TAKE(m->final_norm, H, fill_const(cur, H, 1.0f));
    for (int l = 0; l < c->n_layers; l++) {
        kvl__layer_weights *w = &m->layers[l];
        TAKE(w->attn_norm, H, fill_const(cur, H, 1.0f));
        TAKE(w->wq, QD * H, fill_uniform(cur, QD * H, &st, 0.02f));
        TAKE(w->wk, KD * H, fill_uniform(cur, KD * H, &st, 0.02f));
        TAKE(w->wv, KD * H, fill_uniform(cur, KD * H, &st, 0.02f));
        if (c->qkv_bias) {
            TAKE(w->bq, QD, fill_const(cur, QD, 0.0f));
            TAKE(w->bk, KD, fill_const(cur, KD, 0.0f));
            TAKE(w->bv, KD, fill_const(cur, KD, 0.0f));
        }
        if (c->qk_norm) {
            TAKE(w->q_norm, D, fill_const(cur, D, 1.0f));
            TAKE(w->k_norm, D, fill_const(cur, D, 1.0f));
        }
        TAKE(w->wo, H * QD, fill_uniform(cur, H * QD, &st, 0.02f));
        if (c->o_bias) TAKE(w->bo, H, fill_const(cur, H, 0.0f));
        TAKE(w->mlp_norm, H, fill_const(cur, H, 1.0f));
        TAKE(w->w_gate, F * H, fill_uniform(cur, F * H, &st, 0.02f));
        TAKE(w->w_up, F * H, fill_uniform(cur, F * H, &st, 0.02f));
        TAKE(w->w_down, H * F, fill_uniform(cur, H * F, &st, 0.02f));
    }
#undef TAKE
    *out = m;
    return KVL_OK;
}
