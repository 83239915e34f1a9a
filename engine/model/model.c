/* engine/model/model.c: load a Hugging Face model directory into float32 weights.
 *
 * Parameters are carved from one allocation by a sizes table (llm.c style): the table lists
 * every tensor's name, expected shape and destination pointer; loading walks it once, checking
 * each shape against the safetensors header before widening to float32. */
#include "model_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "error.h"
#include "kvlingo/cuda.h"
#include "kvlingo/safetensors.h"

typedef struct param_spec {
    char name[128];
    int n_dims;
    int64_t shape[2];
    float **dst;
} param_spec;

typedef struct spec_list {
    param_spec *v;
    int n, cap;
} spec_list;

static kvl_status spec_add(spec_list *l, float **dst, int n_dims, int64_t d0, int64_t d1,
                           const char *fmt, int layer) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 64;
        param_spec *v = realloc(l->v, sizeof *v * (size_t)cap);
        if (!v) return kvl__errorf(KVL_ERR_NOMEM, "out of memory building the parameter table");
        l->v = v;
        l->cap = cap;
    }
    param_spec *p = &l->v[l->n++];
    snprintf(p->name, sizeof p->name, fmt, layer);
    p->n_dims = n_dims;
    p->shape[0] = d0;
    p->shape[1] = d1;
    p->dst = dst;
    return KVL_OK;
}

static kvl_status build_specs(kvl_model *m, spec_list *l) {
    const kvl_model_config *c = &m->cfg;
    int64_t H = c->hidden_size, D = c->head_dim, Hq = c->n_heads, Hkv = c->n_kv_heads;
    int64_t F = c->intermediate_size, V = c->vocab_size;
    kvl_status s;
#define ADD(dst, nd, a, b, fmt, li) do { if ((s = spec_add(l, dst, nd, a, b, fmt, li)) != KVL_OK) return s; } while (0)
    ADD(&m->embed, 2, V, H, "model.embed_tokens.weight%.0d", 0);
    for (int i = 0; i < c->n_layers; i++) {
        kvl__layer_weights *w = &m->layers[i];
        ADD(&w->attn_norm, 1, H, 0, "model.layers.%d.input_layernorm.weight", i);
        ADD(&w->wq, 2, Hq * D, H, "model.layers.%d.self_attn.q_proj.weight", i);
        ADD(&w->wk, 2, Hkv * D, H, "model.layers.%d.self_attn.k_proj.weight", i);
        ADD(&w->wv, 2, Hkv * D, H, "model.layers.%d.self_attn.v_proj.weight", i);
        if (c->qkv_bias) {
            ADD(&w->bq, 1, Hq * D, 0, "model.layers.%d.self_attn.q_proj.bias", i);
            ADD(&w->bk, 1, Hkv * D, 0, "model.layers.%d.self_attn.k_proj.bias", i);
            ADD(&w->bv, 1, Hkv * D, 0, "model.layers.%d.self_attn.v_proj.bias", i);
        }
        if (c->qk_norm) {
            ADD(&w->q_norm, 1, D, 0, "model.layers.%d.self_attn.q_norm.weight", i);
            ADD(&w->k_norm, 1, D, 0, "model.layers.%d.self_attn.k_norm.weight", i);
        }
        ADD(&w->wo, 2, H, Hq * D, "model.layers.%d.self_attn.o_proj.weight", i);
        if (c->o_bias) ADD(&w->bo, 1, H, 0, "model.layers.%d.self_attn.o_proj.bias", i);
        ADD(&w->mlp_norm, 1, H, 0, "model.layers.%d.post_attention_layernorm.weight", i);
        ADD(&w->w_gate, 2, F, H, "model.layers.%d.mlp.gate_proj.weight", i);
        ADD(&w->w_up, 2, F, H, "model.layers.%d.mlp.up_proj.weight", i);
        ADD(&w->w_down, 2, H, F, "model.layers.%d.mlp.down_proj.weight", i);
    }
    ADD(&m->final_norm, 1, H, 0, "model.norm.weight%.0d", 0);
    if (!c->tie_word_embeddings) ADD(&m->lm_head, 2, V, H, "lm_head.weight%.0d", 0);
#undef ADD
    return KVL_OK;
}

static size_t spec_numel(const param_spec *p) {
    return (size_t)p->shape[0] * (size_t)(p->n_dims == 2 ? p->shape[1] : 1);
}

static void shape_str(char *buf, size_t cap, int n_dims, const int64_t *shape) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (int i = 0; i < n_dims && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

static kvl_status read_text(const char *path, char **out, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return kvl__errorf(KVL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            char *nb = realloc(buf, cap);
            if (!nb) { free(buf); fclose(f); return kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory", path); }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, 4096, f);
        n += got;
        if (got < 4096) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) { free(buf); return kvl__errorf(KVL_ERR_IO, "%s: read error", path); }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return KVL_OK;
}

kvl_model_params kvl_model_default_params(void) {
    kvl_model_params p = {.n_threads = 0};
    return p;
}

kvl_status kvl_model_load(const char *dir, const kvl_model_params *params, kvl_model **out) {
    if (!dir || !out) return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_model_load: NULL argument");
    *out = NULL;
    kvl_model_params prm = params ? *params : kvl_model_default_params();
    if (prm.device == KVL_DEVICE_CUDA) {   /* backend check first: fail before reading weights */
        kvl_status ds = kvl_cuda_probe(NULL);
        if (ds != KVL_OK) return kvl__error_prefix(ds, "kvl_model_load --device cuda");
    }
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *cfg_text = NULL;
    size_t cfg_len = 0;
    kvl_status s = read_text(path, &cfg_text, &cfg_len);
    if (s != KVL_OK) return s;

    kvl_model *m = calloc(1, sizeof *m);
    if (!m) { free(cfg_text); return kvl__errorf(KVL_ERR_NOMEM, "out of memory"); }
    s = kvl_config_parse(cfg_text, cfg_len, path, &m->cfg);
    if (s != KVL_OK) { free(cfg_text); free(m); return s; }
    snprintf(m->dir, sizeof m->dir, "%s", dir);
    {
        /* short name: last non-empty path component */
        char tmp[1024];
        snprintf(tmp, sizeof tmp, "%s", dir);
        size_t n = strlen(tmp);
        while (n > 1 && tmp[n - 1] == '/') tmp[--n] = '\0';
        const char *slash = strrchr(tmp, '/');
        snprintf(m->name, sizeof m->name, "%s", slash ? slash + 1 : tmp);
    }
    m->n_threads = prm.n_threads;
    pthread_mutex_init(&m->lock, NULL);
    m->layers = calloc((size_t)m->cfg.n_layers, sizeof *m->layers);
    spec_list specs = {0};
    kvl_st_set *set = NULL;
    if (!m->layers) { s = kvl__errorf(KVL_ERR_NOMEM, "out of memory"); goto fail; }
    if ((s = build_specs(m, &specs)) != KVL_OK) goto fail;
    if ((s = kvl_st_set_open_dir(dir, &set)) != KVL_OK) goto fail;

    size_t total = 0;
    for (int i = 0; i < specs.n; i++) total += spec_numel(&specs.v[i]);
    m->weights_base = malloc(total * sizeof(float));
    if (!m->weights_base) {
        s = kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory for %zu weights", dir, total);
        goto fail;
    }
    m->weights_floats = total;
    float *cur = m->weights_base;
    for (int i = 0; i < specs.n; i++) {
        param_spec *p = &specs.v[i];
        const char *file = NULL;
        const kvl_st_tensor *t = kvl_st_set_find(set, p->name, &file);
        if (!t) {
            s = kvl__errorf(KVL_ERR_NOT_FOUND, "%s: tensor '%s' is missing from the weights", dir, p->name);
            goto fail;
        }
        int ok = t->n_dims == p->n_dims;
        for (int d = 0; ok && d < p->n_dims; d++) ok = t->shape[d] == p->shape[d];
        if (!ok) {
            char want[64], got[160];
            shape_str(want, sizeof want, p->n_dims, p->shape);
            shape_str(got, sizeof got, t->n_dims, t->shape);
            s = kvl__errorf(KVL_ERR_MISMATCH, "%s: tensor '%s': shape %s does not match config.json "
                           "(expected %s)", file, p->name, got, want);
            goto fail;
        }
        size_t n = spec_numel(p);
        if ((s = kvl_st_tensor_to_f32(t, cur, n)) != KVL_OK) {
            kvl__error_prefix(s, file);
            goto fail;
        }
        *p->dst = cur;
        cur += n;
    }
    if (m->cfg.tie_word_embeddings) m->lm_head = m->embed;   /* a redundant lm_head.weight is ignored */

    /* identity hash: config text + widened weights */
    XXH3_state_t *hs = XXH3_createState();
    if (!hs) { s = kvl__errorf(KVL_ERR_NOMEM, "out of memory"); goto fail; }
    XXH3_64bits_reset(hs);
    XXH3_64bits_update(hs, cfg_text, cfg_len);
    XXH3_64bits_update(hs, m->weights_base, total * sizeof(float));
    snprintf(m->hash, sizeof m->hash, "%016llx", (unsigned long long)XXH3_64bits_digest(hs));
    XXH3_freeState(hs);

    kvl_st_set_free(set);
    free(specs.v);
    free(cfg_text);
    *out = m;
    return KVL_OK;
fail:
    kvl_st_set_free(set);
    free(specs.v);
    free(cfg_text);
    kvl_model_free(m);
    return s;
}

void kvl_model_free(kvl_model *m) {
    if (!m) return;
    free(m->weights_base);
    free(m->layers);
    free(m->scratch.base);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

const kvl_model_config *kvl_model_config_get(const kvl_model *m) { return &m->cfg; }
const char *kvl_model_dir(const kvl_model *m) { return m->dir; }
const char *kvl_model_name(const kvl_model *m) { return m->name; }
const char *kvl_model_hash(const kvl_model *m) { return m->hash; }

int kvl_model_is_eos(const kvl_model *m, int32_t id) {
    for (int i = 0; i < m->cfg.n_eos; i++)
        if (m->cfg.eos_token_ids[i] == id) return 1;
    return 0;
}
