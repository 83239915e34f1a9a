/* engine/model/model.c: load a Hugging Face model directory into float32 weights.
 *
 * Parameters are carved from one allocation by a sizes table (llm.c style): the table lists
 * every tensor's name, expected shape and destination pointer; loading walks it once, checking
 * each shape against the safetensors header before widening to float32.  The weights then go to
 * the chosen backend (kvlingo/backend.h), which computes every forward pass. */
#include "model_internal.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bigalloc.h"
#include "error.h"
#include "file.h"
#include "hash.h"
#include "kvlingo/safetensors.h"

typedef struct spec_list {
    kvl__param_spec *v;
    int n, cap;
} spec_list;

static kvl_status spec_add(spec_list *l, float **dst, int n_dims, int64_t d0, int64_t d1,
                           const char *fmt, int layer) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 64;
        kvl__param_spec *v = realloc(l->v, sizeof *v * (size_t)cap);
        if (!v) return kvl__errorf(KVL_ERR_NOMEM, "out of memory building the parameter table");
        l->v = v;
        l->cap = cap;
    }
    kvl__param_spec *p = &l->v[l->n++];
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

static size_t spec_numel(const kvl__param_spec *p) {
    return (size_t)p->shape[0] * (size_t)(p->n_dims == 2 ? p->shape[1] : 1);
}

static void shape_str(char *buf, size_t cap, int n_dims, const int64_t *shape) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (int i = 0; i < n_dims && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

kvl_status kvl__model_alloc(const kvl_model_config *cfg, const kvl_model_params *params,
                            kvl_model **out, kvl__param_spec **specs, int *n_specs, size_t *total) {
    *out = NULL;
    *specs = NULL;
    kvl_model *m = calloc(1, sizeof *m);
    if (!m) return kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    m->cfg = *cfg;
    m->n_threads = params ? params->n_threads : 0;
    pthread_mutex_init(&m->lock, NULL);
    m->layers = calloc((size_t)cfg->n_layers, sizeof *m->layers);
    m->layer_views = calloc((size_t)cfg->n_layers, sizeof *m->layer_views);
    spec_list l = {0};
    kvl_status s = m->layers && m->layer_views ? build_specs(m, &l)
                   : kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    if (s != KVL_OK) {
        free(l.v);
        kvl_model_free(m);
        return s;
    }
    size_t t = 0;
    for (int i = 0; i < l.n; i++) t += spec_numel(&l.v[i]);
    *out = m;
    *specs = l.v;
    *n_specs = l.n;
    *total = t;
    return KVL_OK;
}

kvl_status kvl__model_finish(kvl_model *m, const kvl_model_params *params,
                             kvl_weights_dtype auto_dtype) {
    kvl_model_params prm = params ? *params : kvl_model_default_params();
    if (prm.weights_dtype != KVL_WEIGHTS_AUTO && prm.weights_dtype != KVL_WEIGHTS_F32 &&
        prm.weights_dtype != KVL_WEIGHTS_BF16)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "model params: weights_dtype %d is not auto, f32 or bf16",
                           (int)prm.weights_dtype);
    if (prm.weights_dtype == KVL_WEIGHTS_AUTO) prm.weights_dtype = auto_dtype;
    m->weights_dtype = prm.weights_dtype;
    if (prm.kv_dtype != KVL_KV_F32 && prm.kv_dtype != KVL_KV_BF16)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "model params: kv_dtype %d is not f32 or bf16",
                           (int)prm.kv_dtype);
    if (prm.kv_dtype == KVL_KV_BF16 && prm.device != KVL_DEVICE_CPU)
        return kvl__errorf(KVL_ERR_UNSUPPORTED, "kv dtype bf16: only the CPU backend stores a bf16 "
                           "KV cache (the CUDA backend keeps float32); use kv dtype f32");
    m->kv_dtype = prm.kv_dtype;
    if (m->cfg.tie_word_embeddings) m->lm_head = m->embed;   /* a redundant lm_head.weight is ignored */
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const kvl__layer_weights *w = &m->layers[l];
        m->layer_views[l] = (kvl_layer_view){w->attn_norm, w->wq, w->wk, w->wv, w->bq, w->bk,
                                             w->bv, w->q_norm, w->k_norm, w->wo, w->bo,
                                             w->mlp_norm, w->w_gate, w->w_up, w->w_down};
    }
    m->view = (kvl_weights_view){m->cfg, m->embed, m->final_norm, m->lm_head, m->layer_views};
    kvl_status s = kvl_backend_for_device(prm.device, &m->ops);
    if (s == KVL_OK) s = m->ops->model_create(&m->view, &prm, &m->be);
    return s;
}

kvl_model_params kvl_model_default_params(void) {
    kvl_model_params p = {.n_threads = 0, .weights_dtype = KVL_WEIGHTS_AUTO};
    return p;
}

kvl_status kvl_weights_dtype_parse(const char *text, kvl_weights_dtype *out) {
    static const char *names[] = {"auto", "f32", "bf16"};
    for (int i = 0; text && i < 3; i++)
        if (!strcmp(text, names[i])) {
            *out = (kvl_weights_dtype)i;
            return KVL_OK;
        }
    return kvl__errorf(KVL_ERR_INVALID_ARG, "weights dtype '%s': expected auto, f32 or bf16",
                       text ? text : "(null)");
}

const char *kvl_weights_dtype_name(kvl_weights_dtype d) {
    return d == KVL_WEIGHTS_F32 ? "f32" : d == KVL_WEIGHTS_BF16 ? "bf16" : "auto";
}

kvl_weights_dtype kvl_model_weights_dtype(const kvl_model *m) { return m->weights_dtype; }

kvl_status kvl_kv_dtype_parse(const char *text, kvl_kv_dtype *out) {
    if (text && !strcmp(text, "f32")) *out = KVL_KV_F32;
    else if (text && !strcmp(text, "bf16")) *out = KVL_KV_BF16;
    else
        return kvl__errorf(KVL_ERR_INVALID_ARG, "kv dtype '%s': expected f32 or bf16",
                           text ? text : "(null)");
    return KVL_OK;
}

const char *kvl_kv_dtype_name(kvl_kv_dtype d) { return d == KVL_KV_BF16 ? "bf16" : "f32"; }

kvl_kv_dtype kvl_model_kv_dtype(const kvl_model *m) { return m->kv_dtype; }

/* The first non-finite element of x[0, n) (n when every one is finite): blocks OR-reduced, so the
 * usual all-finite case runs vectorised. */
static size_t first_non_finite(const float *x, size_t n) {
    for (size_t b = 0; b < n; b += 4096) {
        const size_t e = b + 4096 < n ? b + 4096 : n;
        uint32_t any = 0;
        for (size_t i = b; i < e; i++) {
            uint32_t u;
            memcpy(&u, x + i, sizeof u);
            any |= (u & 0x7f800000u) == 0x7f800000u;
        }
        if (any)
            for (size_t i = b; i < e; i++)
                if (!isfinite(x[i])) return i;
    }
    return n;
}

kvl_status kvl_model_load(const char *dir, const kvl_model_params *params, kvl_model **out) {
    if (!dir || !out) return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_model_load: NULL argument");
    *out = NULL;
    kvl_model_params prm = params ? *params : kvl_model_default_params();
    {   /* backend check first: fail before reading weights */
        const kvl_backend_ops *ops = NULL;
        kvl_status ds = kvl_backend_for_device(prm.device, &ops);
        if (ds != KVL_OK) return kvl__error_prefix(ds, "kvl_model_load");
    }
    {   /* the directory itself first: "models/nope: no such directory", not its config.json */
        struct stat sb;
        if (stat(dir, &sb) != 0)
            return kvl__errorf(KVL_ERR_IO, "model directory '%s': %s", dir, strerror(errno));
        if (!S_ISDIR(sb.st_mode))
            return kvl__errorf(KVL_ERR_IO, "model directory '%s': not a directory (give the folder holding "
                              "config.json and the *.safetensors)", dir);
    }
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *cfg_text = NULL;
    size_t cfg_len = 0;
    kvl_status s = kvl__file_read(path, 0, 0, &cfg_text, &cfg_len);
    if (s != KVL_OK) return s;
    kvl_model_config cfg;
    s = kvl_config_parse(cfg_text, cfg_len, path, &cfg);
    if (s != KVL_OK) { free(cfg_text); return s; }

    kvl_model *m = NULL;
    kvl__param_spec *specs = NULL;
    int n_specs = 0;
    size_t total = 0;
    kvl_st_set *set = NULL;
    if ((s = kvl__model_alloc(&cfg, &prm, &m, &specs, &n_specs, &total)) != KVL_OK) {
        free(cfg_text);
        return kvl__error_prefix(s, path);
    }
    snprintf(m->dir, sizeof m->dir, "%s", dir);
    {
        /* short name: the last path component that names a directory ("models/qwen3-a/." and
         * "models/qwen3-a/" are qwen3-a; ".", ".." and the like are named by where they lead) */
        char tmp[PATH_MAX];
        snprintf(tmp, sizeof tmp, "%s", dir);
        size_t n = strlen(tmp);
        for (;;) {
            if (n > 1 && tmp[n - 1] == '/') tmp[--n] = '\0';
            else if (n > 2 && !strcmp(tmp + n - 2, "/.")) tmp[n -= 2] = '\0';
            else break;
        }
        const char *slash = strrchr(tmp, '/');
        const char *last = slash ? slash + 1 : tmp;
        if ((!strcmp(last, ".") || !strcmp(last, "..")) && realpath(dir, tmp) && strrchr(tmp, '/'))
            last = strrchr(tmp, '/')[1] ? strrchr(tmp, '/') + 1 : tmp;
        snprintf(m->name, sizeof m->name, "%s", last);
    }
    if ((s = kvl_st_set_open_dir(dir, &set)) != KVL_OK) goto fail;
    m->weights_base = kvl__bigalloc(total * sizeof(float));   /* huge pages: streamed each step */
    if (!m->weights_base) {
        s = kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory for %zu weights", dir, total);
        goto fail;
    }
    m->weights_floats = total;
    float *cur = m->weights_base;
    int all_bf16 = 1;   /* every matrix stored as bfloat16: AUTO keeps bf16 copies */
    for (int i = 0; i < n_specs; i++) {
        kvl__param_spec *p = &specs[i];
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
        if (t->dtype != KVL_DTYPE_F32 && t->dtype != KVL_DTYPE_BF16 && t->dtype != KVL_DTYPE_F16) {
            s = kvl__errorf(KVL_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s (F32, BF16 or F16 expected)",
                           file, p->name, kvl_dtype_name(t->dtype));
            goto fail;
        }
        if (p->n_dims == 2 && t->dtype != KVL_DTYPE_BF16) all_bf16 = 0;
        size_t n = spec_numel(p);
        if ((s = kvl_st_tensor_to_f32(t, cur, n)) != KVL_OK) {
            kvl__error_prefix(s, file);
            goto fail;
        }
        /* a NaN or infinity in a weight makes every logit NaN, far from here: named now */
        size_t bad = first_non_finite(cur, n);
        if (bad < n) {
            s = kvl__errorf(KVL_ERR_NUMERIC, "%s: tensor '%s' element %zu is %s", file, p->name, bad,
                           isnan(cur[bad]) ? "NaN" : "Inf");
            goto fail;
        }
        *p->dst = cur;
        cur += n;
    }

    /* identity hash: config text + widened weights */
    XXH3_state_t *hs = XXH3_createState();
    if (!hs) { s = kvl__errorf(KVL_ERR_NOMEM, "out of memory"); goto fail; }
    XXH3_64bits_reset(hs);
    kvl__xxh3_64_update(hs, cfg_text, cfg_len);
    kvl__xxh3_64_update(hs, m->weights_base, total * sizeof(float));
    snprintf(m->hash, sizeof m->hash, "%016llx", (unsigned long long)XXH3_64bits_digest(hs));
    XXH3_freeState(hs);
    if ((s = kvl__model_finish(m, &prm, all_bf16 ? KVL_WEIGHTS_BF16 : KVL_WEIGHTS_F32)) != KVL_OK)
        goto fail;

    kvl_st_set_free(set);
    free(specs);
    free(cfg_text);
    *out = m;
    return KVL_OK;
fail:
    kvl_st_set_free(set);
    free(specs);
    free(cfg_text);
    kvl_model_free(m);
    return s;
}

void kvl_model_free(kvl_model *m) {
    if (!m) return;
    if (m->be) m->ops->model_free(m->be);
    free(m->weights_base);
    free(m->layers);
    free(m->layer_views);
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

const kvl_weights_view *kvl_model_weights(const kvl_model *m) { return &m->view; }
const kvl_backend_ops *kvl_model_backend(const kvl_model *m) { return m->ops; }

int kvl__model_set_threads(kvl_model *m, int n_threads) {
    int old = m->n_threads;
    m->n_threads = n_threads;
    if (m->be) m->ops->model_set_threads(m->be, n_threads);
    return old;
}
