/* engine/model/model_random.c: published geometries by name and random-weight host models
 * (include/kvlingo/shapes.h), for benchmarks at real sizes without downloaded weights. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "kvlingo/shapes.h"
#include "model_internal.h"
#include "rng.h"

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
        out->rope = kvl_rope_default_params(d->theta, d->head_dim, d->max_pos);
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

kvl_status kvl_model_create_random(const kvl_model_config *cfg, uint64_t seed,
                                   const kvl_model_params *params, kvl_model **out) {
    if (!cfg || !out) return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_model_create_random: NULL argument");
    *out = NULL;
    const kvl_model_config *c = cfg;
    if (c->hidden_size < 1 || c->n_layers < 1 || c->n_heads < 1 || c->n_kv_heads < 1 ||
        c->n_heads % c->n_kv_heads || c->head_dim < 2 || c->head_dim % 2 || c->intermediate_size < 1 ||
        c->vocab_size < 1)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_model_create_random: bad geometry");
    kvl_model *m = NULL;
    kvl__param_spec *specs = NULL;
    int n_specs = 0;
    size_t total = 0;
    kvl_status s = kvl__model_alloc(c, params, &m, &specs, &n_specs, &total);
    if (s != KVL_OK) return s;
    snprintf(m->name, sizeof m->name, "random-%s", c->architecture);
    snprintf(m->dir, sizeof m->dir, "(random)");
    snprintf(m->hash, sizeof m->hash, "%016llx", (unsigned long long)(seed * 0x9E3779B97F4A7C15ull));
    m->weights_base = malloc(total * sizeof(float));
    if (!m->weights_base) {
        free(specs);
        kvl_model_free(m);
        return kvl__errorf(KVL_ERR_NOMEM, "random model: out of memory for %zu weights", total);
    }
    m->weights_floats = total;
    /* the loader's sizes table, filled as transformers initialises: matrices uniform with std
     * 0.02 (initializer_range), norm weights 1, biases 0 */
    uint64_t st = seed;
    float *cur = m->weights_base;
    for (int i = 0; i < n_specs; i++) {
        const kvl__param_spec *p = &specs[i];
        size_t n = (size_t)p->shape[0] * (size_t)(p->n_dims == 2 ? p->shape[1] : 1);
        if (p->n_dims == 2) kvl__rng_fill_uniform(cur, n, &st, 0.02f * 1.7320508f);
        else
            for (size_t j = 0; j < n; j++) cur[j] = strstr(p->name, "norm") ? 1.0f : 0.0f;
        *p->dst = cur;
        cur += n;
    }
    free(specs);
    /* the weights are generated in float32: AUTO computes on them as they are */
    if ((s = kvl__model_finish(m, params, KVL_WEIGHTS_F32)) != KVL_OK) {
        kvl_model_free(m);
        return s;
    }
    *out = m;
    return KVL_OK;
}
