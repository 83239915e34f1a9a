/* engine/formats/config.c: parse a Hugging Face config.json into kvl_model_config.
 *
 * Two layouts exist in the wild: older checkpoints put `rope_theta` and `torch_dtype` at top
 * level; transformers >= 5 writes `rope_parameters: {rope_theta, rope_type}` and `dtype`.
 * Both are read, with RoPE scaling in either (`rope_scaling` or `rope_parameters`).  Features we
 * do not implement are refused by name rather than silently computed wrong (other RoPE scaling
 * types, partial rotary embeddings, sliding-window attention). */
#include "kvlingo/model.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

#define TRY0(x) do { kvl_status s0_ = (x); if (s0_ != KVL_OK) return s0_; } while (0)

/* Reads an integer field; `required` makes absence an error.  JSON numbers that are not whole
 * or out of int range are errors. */
static kvl_status get_int(const cJSON *root, const char *label, const char *key, int required,
                          int dflt, int *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!it || cJSON_IsNull(it)) {
        if (required) return kvl__errorf(KVL_ERR_FORMAT, "%s: field '%s' is missing", label, key);
        *out = dflt;
        return KVL_OK;
    }
    if (!cJSON_IsNumber(it))
        return kvl__errorf(KVL_ERR_FORMAT, "%s: field '%s' must be a number", label, key);
    double v = it->valuedouble;
    if (v != floor(v) || v < -2147483648.0 || v > 2147483647.0)
        return kvl__errorf(KVL_ERR_FORMAT, "%s: field '%s' must be an integer (got %g)", label, key, v);
    *out = (int)v;
    return KVL_OK;
}

static kvl_status get_bool(const cJSON *root, const char *label, const char *key, int dflt,
                           int *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!it || cJSON_IsNull(it)) { *out = dflt; return KVL_OK; }
    if (!cJSON_IsBool(it))
        return kvl__errorf(KVL_ERR_FORMAT, "%s: field '%s' must be true or false", label, key);
    *out = cJSON_IsTrue(it) ? 1 : 0;
    return KVL_OK;
}

static kvl_status require_positive(const char *label, const char *key, int v) {
    if (v <= 0) return kvl__errorf(KVL_ERR_FORMAT, "%s: field '%s' must be > 0 (got %d)", label, key, v);
    return KVL_OK;
}

/* A model dimension in [1, hi]: the bounds are far above any released model's, and keep every
 * size made from them (parameter tables, caches, spans) within 64-bit arithmetic and memory that
 * a small crafted config.json cannot make the loader reserve. */
static kvl_status require_dim(const char *label, const char *key, int v, int hi) {
    if (v <= 0 || v > hi)
        return kvl__errorf(KVL_ERR_FORMAT, "%s: field '%s' must be in [1, %d] (got %d)", label, key, hi, v);
    return KVL_OK;
}

static kvl_status parse_dtype(const cJSON *root, const char *label, kvl_dtype *out) {
    const char *key = "dtype";
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!it || cJSON_IsNull(it)) { key = "torch_dtype"; it = cJSON_GetObjectItemCaseSensitive(root, key); }
    if (!it || cJSON_IsNull(it)) { *out = KVL_DTYPE_F32; return KVL_OK; }
    if (!cJSON_IsString(it))
        return kvl__errorf(KVL_ERR_FORMAT, "%s: field '%s' must be a string", label, key);
    const char *s = it->valuestring;
    if (!strcmp(s, "float32")) *out = KVL_DTYPE_F32;
    else if (!strcmp(s, "bfloat16")) *out = KVL_DTYPE_BF16;
    else if (!strcmp(s, "float16")) *out = KVL_DTYPE_F16;
    else return kvl__errorf(KVL_ERR_UNSUPPORTED, "%s: field '%s': dtype '%s' not supported "
                           "(float32, bfloat16, float16)", label, key, s);
    return KVL_OK;
}

/* A number inside the rope object `obj` (named `where` in errors): absent or null leaves *out.
 * `positive` requires > 0. */
static kvl_status rope_num(const cJSON *obj, const char *label, const char *where, const char *key,
                           int positive, double *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!it || cJSON_IsNull(it)) return KVL_OK;
    if (!cJSON_IsNumber(it) || (positive && !(it->valuedouble > 0)))
        return kvl__errorf(KVL_ERR_FORMAT, "%s: field '%s.%s' must be a %snumber", label, where, key,
                          positive ? "positive " : "");
    *out = it->valuedouble;
    return KVL_OK;
}

static kvl_status rope_need(const cJSON *obj, const char *label, const char *where, const char *key,
                            const char *type, double *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!it || cJSON_IsNull(it))
        return kvl__errorf(KVL_ERR_FORMAT, "%s: field '%s.%s' is missing (required by '%s' RoPE)",
                          label, where, key, type);
    return rope_num(obj, label, where, key, 1, out);
}

/* The scaling type string of a rope object: "rope_type", else the older "type" (NULL: none). */
static kvl_status rope_type_of(const cJSON *obj, const char *label, const char *where,
                               const char **type, const char **key) {
    *type = NULL;
    *key = "rope_type";
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(obj, "rope_type");
    if (!t || cJSON_IsNull(t)) { *key = "type"; t = cJSON_GetObjectItemCaseSensitive(obj, "type"); }
    if (!t || cJSON_IsNull(t)) return KVL_OK;
    if (!cJSON_IsString(t))
        return kvl__errorf(KVL_ERR_FORMAT, "%s: field '%s.%s' must be a string", label, where, *key);
    *type = t->valuestring;
    return KVL_OK;
}

/* rope: `rope_theta` at top level plus `rope_scaling` {type | rope_type, ...} (older layout, as
 * most published checkpoints), or `rope_parameters` {rope_theta, rope_type, ...} (transformers
 * >= 5).  Scaling types default, linear, dynamic, yarn, llama3 (kvlingo/rope.h), with the
 * fields their transformers functions read; any other type is refused by name. */
static kvl_status parse_rope(const cJSON *root, const char *label, const kvl_model_config *c,
                             kvl_rope_params *r) {
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    const cJSON *scaling = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    const cJSON *top = cJSON_GetObjectItemCaseSensitive(root, "rope_theta");
    memset(r, 0, sizeof *r);
    r->type = KVL_ROPE_DEFAULT;
    r->theta = 10000.0;  /* transformers' default for these architectures */
    r->dim = c->head_dim;
    r->max_position_embeddings = c->max_position_embeddings;
    r->truncate = 1;
    if (params && cJSON_IsNull(params)) params = NULL;
    if (scaling && cJSON_IsNull(scaling)) scaling = NULL;
    if (params && !cJSON_IsObject(params))
        return kvl__errorf(KVL_ERR_FORMAT, "%s: field 'rope_parameters' must be an object", label);
    if (scaling && !cJSON_IsObject(scaling))
        return kvl__errorf(KVL_ERR_FORMAT, "%s: field 'rope_scaling' must be an object", label);
    if (params) TRY0(rope_num(params, label, "rope_parameters", "rope_theta", 1, &r->theta));
    if (top && !cJSON_IsNull(top)) {
        if (!cJSON_IsNumber(top) || !(top->valuedouble > 0))
            return kvl__errorf(KVL_ERR_FORMAT, "%s: field 'rope_theta' must be a positive number", label);
        r->theta = top->valuedouble;
    }
    /* the object that names the scaling type carries its fields */
    const cJSON *obj = NULL;
    const char *where = NULL, *type = NULL, *tkey = NULL;
    if (params) {
        TRY0(rope_type_of(params, label, "rope_parameters", &type, &tkey));
        if (type && strcmp(type, "default") != 0) { obj = params; where = "rope_parameters"; }
    }
    if (!obj && scaling) {
        TRY0(rope_type_of(scaling, label, "rope_scaling", &type, &tkey));
        if (!type)
            return kvl__errorf(KVL_ERR_FORMAT, "%s: field 'rope_scaling' names no 'rope_type' or 'type'", label);
        obj = scaling;
        where = "rope_scaling";
    }
    if (!obj || !strcmp(type, "default")) return KVL_OK;

    if (!strcmp(type, "linear")) r->type = KVL_ROPE_LINEAR;
    else if (!strcmp(type, "dynamic")) r->type = KVL_ROPE_DYNAMIC;
    else if (!strcmp(type, "yarn")) r->type = KVL_ROPE_YARN;
    else if (!strcmp(type, "llama3")) r->type = KVL_ROPE_LLAMA3;
    else
        return kvl__errorf(KVL_ERR_UNSUPPORTED, "%s: field '%s.%s': '%s' RoPE scaling is not supported "
                          "(default, linear, dynamic, yarn, llama3)", label, where, tkey, type);
    double prf = 1.0;
    TRY0(rope_num(obj, label, where, "partial_rotary_factor", 1, &prf));
    if (prf != 1.0)
        return kvl__errorf(KVL_ERR_UNSUPPORTED, "%s: field '%s.partial_rotary_factor': partial rotary "
                          "embeddings are not supported (got %g)", label, where, prf);
    TRY0(rope_need(obj, label, where, "factor", type, &r->factor));
    if (r->type == KVL_ROPE_DYNAMIC && r->dim <= 2)
        return kvl__errorf(KVL_ERR_FORMAT, "%s: field 'head_dim' must be > 2 for 'dynamic' RoPE", label);
    double orig = 0;
    if (r->type == KVL_ROPE_LLAMA3) {
        TRY0(rope_need(obj, label, where, "low_freq_factor", type, &r->low_freq_factor));
        TRY0(rope_need(obj, label, where, "high_freq_factor", type, &r->high_freq_factor));
        TRY0(rope_need(obj, label, where, "original_max_position_embeddings", type, &orig));
        if (!(r->high_freq_factor > r->low_freq_factor))
            return kvl__errorf(KVL_ERR_FORMAT, "%s: field '%s.high_freq_factor' (%g) must be greater than "
                              "'low_freq_factor' (%g)", label, where, r->high_freq_factor, r->low_freq_factor);
    }
    if (r->type == KVL_ROPE_YARN) {
        orig = c->max_position_embeddings;   /* transformers' standardize_rope_params default */
        TRY0(rope_num(obj, label, where, "original_max_position_embeddings", 1, &orig));
        TRY0(rope_num(obj, label, where, "beta_fast", 1, &r->beta_fast));
        TRY0(rope_num(obj, label, where, "beta_slow", 1, &r->beta_slow));
        TRY0(rope_num(obj, label, where, "attention_factor", 1, &r->attention_factor));
        TRY0(rope_num(obj, label, where, "mscale", 0, &r->mscale));
        TRY0(rope_num(obj, label, where, "mscale_all_dim", 0, &r->mscale_all_dim));
        const cJSON *tr = cJSON_GetObjectItemCaseSensitive(obj, "truncate");
        if (tr && !cJSON_IsNull(tr)) {
            if (!cJSON_IsBool(tr))
                return kvl__errorf(KVL_ERR_FORMAT, "%s: field '%s.truncate' must be true or false", label, where);
            r->truncate = cJSON_IsTrue(tr) ? 1 : 0;
        }
        double bf = r->beta_fast > 0 ? r->beta_fast : 32, bs = r->beta_slow > 0 ? r->beta_slow : 1;
        if (!(bf > bs))
            return kvl__errorf(KVL_ERR_FORMAT, "%s: field '%s.beta_fast' (%g) must be greater than "
                              "'beta_slow' (%g)", label, where, bf, bs);
    }
    if (orig != 0) {
        if (orig != floor(orig) || orig > 2147483647.0)
            return kvl__errorf(KVL_ERR_FORMAT, "%s: field '%s.original_max_position_embeddings' must be a "
                              "positive integer (got %g)", label, where, orig);
        r->original_max_position_embeddings = (int)orig;
    }
    return KVL_OK;
}

/* A token id of config.json: a non-negative integer (1e30, -7 or 2.9 are not; an id past the
 * vocabulary is accepted, as transformers does: it is never sampled). */
static int token_id_ok(const cJSON *e) {
    return cJSON_IsNumber(e) && e->valuedouble >= 0 && e->valuedouble <= 2147483647.0 &&
           e->valuedouble == (double)e->valueint;
}

static kvl_status parse_eos(const cJSON *root, const char *label, kvl_model_config *c) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id");
    c->n_eos = 0;
    if (!it || cJSON_IsNull(it)) return KVL_OK;
    if (cJSON_IsNumber(it)) {
        if (!token_id_ok(it))
            return kvl__errorf(KVL_ERR_FORMAT, "%s: field 'eos_token_id' (%g) is not a token id (an integer >= 0)",
                              label, it->valuedouble);
        c->eos_token_ids[c->n_eos++] = it->valueint;
        return KVL_OK;
    }
    if (!cJSON_IsArray(it))
        return kvl__errorf(KVL_ERR_FORMAT, "%s: field 'eos_token_id' must be an integer or a list", label);
    const cJSON *e;
    cJSON_ArrayForEach(e, it) {
        if (!token_id_ok(e))
            return kvl__errorf(KVL_ERR_FORMAT, "%s: field 'eos_token_id' has an entry that is not a token id (an "
                              "integer >= 0)", label);
        if (c->n_eos >= KVL_MAX_EOS_IDS)
            return kvl__errorf(KVL_ERR_UNSUPPORTED, "%s: field 'eos_token_id' lists more than %d ids",
                              label, KVL_MAX_EOS_IDS);
        c->eos_token_ids[c->n_eos++] = e->valueint;
    }
    return KVL_OK;
}

#define TRY(x) do { kvl_status s_ = (x); if (s_ != KVL_OK) { cJSON_Delete(root); return s_; } } while (0)

/* The first key an object (at any depth) names twice, or NULL: cJSON keeps the first, Python's
 * json (and so transformers) the last, so such a file would load as another model. */
static const char *duplicate_key(const cJSON *o) {
    for (const cJSON *a = o ? o->child : NULL; a; a = a->next) {
        if (cJSON_IsObject(o) && a->string)
            for (const cJSON *b = a->next; b; b = b->next)
                if (b->string && !strcmp(a->string, b->string)) return a->string;
        const char *d = duplicate_key(a);
        if (d) return d;
    }
    return NULL;
}

kvl_status kvl_config_parse(const char *json, size_t len, const char *label, kvl_model_config *out) {
    if (!json || !out) return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_config_parse: NULL argument");
    if (!label) label = "config.json";
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) return kvl__errorf(KVL_ERR_FORMAT, "%s: invalid JSON", label);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return kvl__errorf(KVL_ERR_FORMAT, "%s: top level must be a JSON object", label);
    }
    const char *dup = duplicate_key(root);
    if (dup) {
        kvl_status s = kvl__errorf(KVL_ERR_FORMAT, "%s: key '%.100s' is given twice", label, dup);
        cJSON_Delete(root);
        return s;
    }
    kvl_model_config c;
    memset(&c, 0, sizeof c);

    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *a0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    if (!a0 || !cJSON_IsString(a0)) {
        cJSON_Delete(root);
        return kvl__errorf(KVL_ERR_FORMAT, "%s: field 'architectures' must be a non-empty list of strings", label);
    }
    snprintf(c.architecture, sizeof c.architecture, "%s", a0->valuestring);
    if (!strcmp(a0->valuestring, "Qwen2ForCausalLM")) c.arch = KVL_ARCH_QWEN2;
    else if (!strcmp(a0->valuestring, "Qwen3ForCausalLM")) c.arch = KVL_ARCH_QWEN3;
    else if (!strcmp(a0->valuestring, "LlamaForCausalLM")) c.arch = KVL_ARCH_LLAMA;
    else {
        kvl_status s = kvl__errorf(KVL_ERR_UNSUPPORTED, "%s: field 'architectures': '%s' is not supported "
                                  "(Qwen2ForCausalLM, Qwen3ForCausalLM, LlamaForCausalLM)", label, a0->valuestring);
        cJSON_Delete(root);
        return s;
    }

    TRY(get_int(root, label, "vocab_size", 1, 0, &c.vocab_size));
    TRY(require_dim(label, "vocab_size", c.vocab_size, 1 << 22));
    TRY(get_int(root, label, "hidden_size", 1, 0, &c.hidden_size));
    TRY(require_dim(label, "hidden_size", c.hidden_size, 1 << 16));
    TRY(get_int(root, label, "num_hidden_layers", 1, 0, &c.n_layers));
    TRY(require_dim(label, "num_hidden_layers", c.n_layers, 1024));
    TRY(get_int(root, label, "num_attention_heads", 1, 0, &c.n_heads));
    TRY(require_dim(label, "num_attention_heads", c.n_heads, 1024));
    TRY(get_int(root, label, "num_key_value_heads", 0, c.n_heads, &c.n_kv_heads));
    TRY(require_positive(label, "num_key_value_heads", c.n_kv_heads));
    if (c.n_heads % c.n_kv_heads != 0) {
        cJSON_Delete(root);
        return kvl__errorf(KVL_ERR_FORMAT, "%s: field 'num_key_value_heads' (%d) must divide "
                          "'num_attention_heads' (%d)", label, c.n_kv_heads, c.n_heads);
    }
    TRY(get_int(root, label, "head_dim", 0, 0, &c.head_dim));
    if (c.head_dim == 0) {
        if (c.hidden_size % c.n_heads != 0) {
            cJSON_Delete(root);
            return kvl__errorf(KVL_ERR_FORMAT, "%s: no 'head_dim' and 'hidden_size' (%d) is not a multiple "
                              "of 'num_attention_heads' (%d)", label, c.hidden_size, c.n_heads);
        }
        c.head_dim = c.hidden_size / c.n_heads;
    }
    TRY(require_dim(label, "head_dim", c.head_dim, 4096));
    if (c.head_dim % 2 != 0) {
        cJSON_Delete(root);
        return kvl__errorf(KVL_ERR_FORMAT, "%s: field 'head_dim' must be even for RoPE (got %d)", label, c.head_dim);
    }
    TRY(get_int(root, label, "intermediate_size", 1, 0, &c.intermediate_size));
    TRY(require_dim(label, "intermediate_size", c.intermediate_size, 1 << 18));
    TRY(get_int(root, label, "max_position_embeddings", 0, 4096, &c.max_position_embeddings));
    TRY(require_dim(label, "max_position_embeddings", c.max_position_embeddings, 1 << 24));
    TRY(get_int(root, label, "bos_token_id", 0, -1, &c.bos_token_id));

    const cJSON *eps = cJSON_GetObjectItemCaseSensitive(root, "rms_norm_eps");
    if (eps && !cJSON_IsNull(eps)) {
        if (!cJSON_IsNumber(eps) || !((float)eps->valuedouble > 0) || !(eps->valuedouble < 1)) {
            cJSON_Delete(root);
            return kvl__errorf(KVL_ERR_FORMAT, "%s: field 'rms_norm_eps' must be a number in (0, 1) that "
                              "float32 holds above 0", label);
        }
        c.rms_norm_eps = (float)eps->valuedouble;
    } else {
        c.rms_norm_eps = 1e-6f;
    }

    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (act && !cJSON_IsNull(act) && !(cJSON_IsString(act) && !strcmp(act->valuestring, "silu"))) {
        cJSON_Delete(root);
        return kvl__errorf(KVL_ERR_UNSUPPORTED, "%s: field 'hidden_act': only 'silu' is supported", label);
    }

    int attention_bias = 0, use_sw = 0;
    TRY(get_bool(root, label, "attention_bias", 0, &attention_bias));
    TRY(get_bool(root, label, "use_sliding_window", 0, &use_sw));
    TRY(get_bool(root, label, "tie_word_embeddings", 0, &c.tie_word_embeddings));
    if (use_sw) {
        /* A window with use_sliding_window=true would make attention local; we only do full. */
        const cJSON *sw = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
        if (sw && cJSON_IsNumber(sw)) {
            cJSON_Delete(root);
            return kvl__errorf(KVL_ERR_UNSUPPORTED, "%s: field 'use_sliding_window': sliding-window "
                              "attention is not supported", label);
        }
    }
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
    if (lt && cJSON_IsArray(lt)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, lt) {
            if (cJSON_IsString(e) && strcmp(e->valuestring, "full_attention") != 0) {
                kvl_status s = kvl__errorf(KVL_ERR_UNSUPPORTED, "%s: field 'layer_types': '%s' layers are "
                                          "not supported (only full_attention)", label, e->valuestring);
                cJSON_Delete(root);
                return s;
            }
        }
    }
    switch (c.arch) {
    case KVL_ARCH_QWEN2: c.qkv_bias = 1; c.o_bias = 0; c.qk_norm = 0; break;  /* bias built in */
    case KVL_ARCH_QWEN3: c.qkv_bias = attention_bias; c.o_bias = attention_bias; c.qk_norm = 1; break;
    case KVL_ARCH_LLAMA: c.qkv_bias = attention_bias; c.o_bias = attention_bias; c.qk_norm = 0; break;
    }
    const cJSON *mlp_bias = cJSON_GetObjectItemCaseSensitive(root, "mlp_bias");
    if (mlp_bias && cJSON_IsTrue(mlp_bias)) {
        cJSON_Delete(root);
        return kvl__errorf(KVL_ERR_UNSUPPORTED, "%s: field 'mlp_bias': MLP bias is not supported", label);
    }

    if (c.head_dim > 1024) {
        cJSON_Delete(root);
        return kvl__errorf(KVL_ERR_UNSUPPORTED, "%s: field 'head_dim': at most 1024 is supported (got %d)",
                          label, c.head_dim);
    }
    TRY(parse_rope(root, label, &c, &c.rope));
    c.rope_theta = c.rope.theta;
    TRY(parse_eos(root, label, &c));
    TRY(parse_dtype(root, label, &c.weight_dtype));
    cJSON_Delete(root);
    *out = c;
    return KVL_OK;
}

kvl_status kvl_config_load(const char *path, kvl_model_config *out) {
    FILE *f = fopen(path, "rb");
    if (!f) return kvl__errorf(KVL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) { fclose(f); return kvl__errorf(KVL_ERR_IO, "%s: cannot seek", path); }
    long n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) { fclose(f); return kvl__errorf(KVL_ERR_IO, "%s: cannot seek", path); }
    char *buf = malloc((size_t)n + 1);
    if (!buf) { fclose(f); return kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory (%ld bytes)", path, n); }
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    if (got != (size_t)n) { free(buf); return kvl__errorf(KVL_ERR_IO, "%s: short read", path); }
    buf[n] = '\0';
    kvl_status s = kvl_config_parse(buf, (size_t)n, path, out);
    free(buf);
    return s;
}

size_t kvl_config_kv_bytes_per_token(const kvl_model_config *c) {
    size_t per_layer = (size_t)c->n_kv_heads * c->head_dim * sizeof(float);
    size_t planes = c->qk_norm ? 3 : 2;   /* K, V, and Kpre for k_norm models */
    return per_layer * planes * (size_t)c->n_layers;
}

int64_t kvl_config_param_count(const kvl_model_config *c) {
    int64_t H = c->hidden_size, D = c->head_dim, Hq = c->n_heads, Hkv = c->n_kv_heads;
    int64_t F = c->intermediate_size, V = c->vocab_size;
    int64_t layer = H                                 /* input_layernorm */
                  + H * Hq * D + 2 * H * Hkv * D      /* q, k, v */
                  + Hq * D * H                        /* o */
                  + H                                 /* post_attention_layernorm */
                  + 3 * H * F;                        /* gate, up, down */
    if (c->qkv_bias) layer += Hq * D + 2 * Hkv * D;
    if (c->o_bias) layer += H;
    if (c->qk_norm) layer += 2 * D;
    int64_t total = V * H + layer * c->n_layers + H;
    if (!c->tie_word_embeddings) total += V * H;
    return total;
}
