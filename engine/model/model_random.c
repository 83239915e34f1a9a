/* engine/model/model_random.c: published geometries by name and random-weight host models
 * (include/kvlingo/shapes.h), for benchmarks at real sizes without downloaded weights, in memory
 * or written out as a model directory that every tool loads (kvld, `kvlingo bench switch`). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bigalloc.h"
#include "error.h"
#include "kvlingo/safetensors.h"
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

static size_t spec_numel(const kvl__param_spec *p) {
    return (size_t)p->shape[0] * (size_t)(p->n_dims == 2 ? p->shape[1] : 1);
}

/* The next n values of parameter p (a whole tensor, or the next piece of one when called
 * again with the same stream): filled as transformers initialises, matrices uniform with std
 * 0.02 (initializer_range), norm weights 1, biases 0.  Only matrices draw from the stream, so
 * a tensor written in pieces holds the values it would hold written at once. */
static void fill_param(const kvl__param_spec *p, float *out, size_t n, uint64_t *st) {
    if (p->n_dims == 2) kvl__rng_fill_uniform(out, n, st, 0.02f * 1.7320508f);
    else
        for (size_t j = 0; j < n; j++) out[j] = strstr(p->name, "norm") ? 1.0f : 0.0f;
}

static kvl_status check_geometry(const kvl_model_config *c, const char *what) {
    if (c->hidden_size < 1 || c->n_layers < 1 || c->n_heads < 1 || c->n_kv_heads < 1 ||
        c->n_heads % c->n_kv_heads || c->head_dim < 2 || c->head_dim % 2 || c->intermediate_size < 1 ||
        c->vocab_size < 1)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "%s: bad geometry (layers %d, hidden %d, heads %d/%d, "
                          "head_dim %d, ffn %d, vocab %d)", what, c->n_layers, c->hidden_size, c->n_heads,
                          c->n_kv_heads, c->head_dim, c->intermediate_size, c->vocab_size);
    return KVL_OK;
}

kvl_status kvl_model_create_random(const kvl_model_config *cfg, uint64_t seed,
                                   const kvl_model_params *params, kvl_model **out) {
    if (!cfg || !out) return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_model_create_random: NULL argument");
    *out = NULL;
    const kvl_model_config *c = cfg;
    kvl_status gs = check_geometry(c, "kvl_model_create_random");
    if (gs != KVL_OK) return gs;
    kvl_model *m = NULL;
    kvl__param_spec *specs = NULL;
    int n_specs = 0;
    size_t total = 0;
    kvl_status s = kvl__model_alloc(c, params, &m, &specs, &n_specs, &total);
    if (s != KVL_OK) return s;
    snprintf(m->name, sizeof m->name, "random-%s", c->architecture);
    snprintf(m->dir, sizeof m->dir, "(random)");
    snprintf(m->hash, sizeof m->hash, "%016llx", (unsigned long long)(seed * 0x9E3779B97F4A7C15ull));
    m->weights_base = kvl__bigalloc(total * sizeof(float));   /* huge pages: streamed each step */
    if (!m->weights_base) {
        free(specs);
        kvl_model_free(m);
        return kvl__errorf(KVL_ERR_NOMEM, "random model: out of memory for %zu weights", total);
    }
    m->weights_floats = total;
    uint64_t st = seed;
    float *cur = m->weights_base;
    for (int i = 0; i < n_specs; i++) {
        const kvl__param_spec *p = &specs[i];
        size_t n = spec_numel(p);
        fill_param(p, cur, n, &st);
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

/* ---- random model directories --------------------------------------------------------------- */

static const char *model_type_of(kvl_arch a) {
    return a == KVL_ARCH_QWEN2 ? "qwen2" : a == KVL_ARCH_QWEN3 ? "qwen3" : "llama";
}

static const char *arch_name_of(kvl_arch a) {
    return a == KVL_ARCH_QWEN2 ? "Qwen2ForCausalLM" : a == KVL_ARCH_QWEN3 ? "Qwen3ForCausalLM" : "LlamaForCausalLM";
}

/* config.json text of cfg (Hugging Face field names, the ones kvl_config_parse reads) into
 * buf[cap].  Only what that format can say: KVL_ERR_UNSUPPORTED for RoPE scaling or a bias /
 * norm layout the architecture's config cannot express. */
static kvl_status config_json(const kvl_model_config *c, uint64_t seed, kvl_dtype dtype, char *buf,
                              size_t cap) {
    if (c->rope.type != KVL_ROPE_DEFAULT || c->rope.dim != c->head_dim || c->rope.theta != c->rope_theta)
        return kvl__errorf(KVL_ERR_UNSUPPORTED, "random model dir: RoPE type %d over %d of head_dim %d "
                          "(theta %g vs %g): only the default RoPE over the whole head is written",
                          (int)c->rope.type, c->rope.dim, c->head_dim, c->rope.theta, c->rope_theta);
    int ok = c->arch == KVL_ARCH_QWEN2 ? c->qkv_bias && !c->o_bias && !c->qk_norm
           : c->arch == KVL_ARCH_QWEN3 ? c->qk_norm && c->qkv_bias == c->o_bias
           : c->arch == KVL_ARCH_LLAMA ? !c->qk_norm && c->qkv_bias == c->o_bias : 0;
    if (!ok)
        return kvl__errorf(KVL_ERR_UNSUPPORTED, "random model dir: architecture %d with qkv_bias %d, "
                          "o_bias %d, qk_norm %d has no config.json form", (int)c->arch, c->qkv_bias,
                          c->o_bias, c->qk_norm);
    char eos[16 * KVL_MAX_EOS_IDS + 4] = "null", bos[24] = "null";
    if (c->n_eos == 1) snprintf(eos, sizeof eos, "%d", c->eos_token_ids[0]);
    else if (c->n_eos > 1) {
        size_t o = 0;
        o += (size_t)snprintf(eos + o, sizeof eos - o, "[");
        for (int i = 0; i < c->n_eos && o < sizeof eos; i++)
            o += (size_t)snprintf(eos + o, sizeof eos - o, "%s%d", i ? ", " : "", c->eos_token_ids[i]);
        if (o < sizeof eos) snprintf(eos + o, sizeof eos - o, "]");
    }
    if (c->bos_token_id >= 0) snprintf(bos, sizeof bos, "%d", c->bos_token_id);
    int n = snprintf(buf, cap,
        "{\n"
        "  \"architectures\": [\"%s\"],\n"
        "  \"model_type\": \"%s\",\n"
        "  \"vocab_size\": %d,\n"
        "  \"hidden_size\": %d,\n"
        "  \"num_hidden_layers\": %d,\n"
        "  \"num_attention_heads\": %d,\n"
        "  \"num_key_value_heads\": %d,\n"
        "  \"head_dim\": %d,\n"
        "  \"intermediate_size\": %d,\n"
        "  \"hidden_act\": \"silu\",\n"
        "  \"max_position_embeddings\": %d,\n"
        "  \"rms_norm_eps\": %.9g,\n"
        "  \"rope_theta\": %.17g,\n"
        "  \"attention_bias\": %s,\n"
        "  \"tie_word_embeddings\": %s,\n"
        "  \"use_sliding_window\": false,\n"
        "  \"bos_token_id\": %s,\n"
        "  \"eos_token_id\": %s,\n"
        "  \"initializer_range\": 0.02,\n"
        "  \"torch_dtype\": \"%s\",\n"
        "  \"kvlingo_random_seed\": %llu\n"
        "}\n",
        arch_name_of(c->arch), model_type_of(c->arch), c->vocab_size, c->hidden_size, c->n_layers,
        c->n_heads, c->n_kv_heads, c->head_dim, c->intermediate_size, c->max_position_embeddings,
        (double)c->rms_norm_eps, c->rope_theta,
        c->arch != KVL_ARCH_QWEN2 && c->qkv_bias ? "true" : "false",
        c->tie_word_embeddings ? "true" : "false", bos, eos,
        dtype == KVL_DTYPE_BF16 ? "bfloat16" : "float32", (unsigned long long)seed);
    if (n < 0 || (size_t)n >= cap) return kvl__errorf(KVL_ERR_NOMEM, "random model dir: config.json too long");
    return KVL_OK;
}

static kvl_status write_text(const char *path, const char *text) {
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return kvl__errorf(KVL_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    size_t len = strlen(text);
    int bad = fwrite(text, 1, len, f) != len;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path)) {
        kvl_status s = kvl__errorf(KVL_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        remove(tmp);
        return s;
    }
    return KVL_OK;
}

kvl_status kvl_model_write_random(const kvl_model_config *cfg, uint64_t seed, kvl_dtype dtype,
                                  const char *dir) {
    if (!cfg || !dir || !dir[0]) return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_model_write_random: NULL argument");
    if (dtype != KVL_DTYPE_F32 && dtype != KVL_DTYPE_BF16)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "random model dir %s: dtype must be F32 or BF16", dir);
    kvl_status s = check_geometry(cfg, dir);
    if (s != KVL_OK) return s;
    char cfg_text[4096], path[1200];
    if ((s = config_json(cfg, seed, dtype, cfg_text, sizeof cfg_text)) != KVL_OK) return kvl__error_prefix(s, dir);
    if (strlen(dir) > 1100) return kvl__errorf(KVL_ERR_INVALID_ARG, "random model dir: path too long");
    struct stat sb;
    if (mkdir(dir, 0755) != 0 && !(errno == EEXIST && stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode)))
        return kvl__errorf(KVL_ERR_IO, "%s: cannot create the directory: %s", dir, strerror(errno));
    kvl_model *m = NULL;
    kvl__param_spec *specs = NULL;
    int n_specs = 0;
    size_t total = 0;
    if ((s = kvl__model_alloc(cfg, NULL, &m, &specs, &n_specs, &total)) != KVL_OK) return s;
    size_t esz = dtype == KVL_DTYPE_BF16 ? 2 : 4;
    kvl_st_write_tensor *wt = calloc((size_t)n_specs, sizeof *wt);
    unsigned char *data = total <= SIZE_MAX / esz ? malloc(total * esz) : NULL;
    float *chunk = dtype == KVL_DTYPE_BF16 ? malloc(sizeof(float) * ((size_t)1 << 20)) : NULL;
    if (!wt || !data || (dtype == KVL_DTYPE_BF16 && !chunk)) {
        s = kvl__errorf(KVL_ERR_NOMEM, "random model dir %s: out of memory for %zu weights", dir, total);
        goto out;
    }
    /* the same stream, in the same order, as kvl_model_create_random: an F32 directory loads
     * to that model's weights exactly, a BF16 one to them rounded */
    uint64_t st = seed;
    unsigned char *cur = data;
    for (int i = 0; i < n_specs; i++) {
        const kvl__param_spec *p = &specs[i];
        size_t n = spec_numel(p);
        if (dtype == KVL_DTYPE_F32) {
            fill_param(p, (float *)cur, n, &st);
        } else {
            uint16_t *o = (uint16_t *)cur;
            for (size_t j = 0; j < n; j += (size_t)1 << 20) {
                size_t k = n - j < ((size_t)1 << 20) ? n - j : (size_t)1 << 20;
                fill_param(p, chunk, k, &st);
                for (size_t e = 0; e < k; e++) o[j + e] = kvl_f32_to_bf16(chunk[e]);
            }
        }
        wt[i].name = p->name;
        wt[i].dtype = dtype;
        wt[i].n_dims = p->n_dims;
        wt[i].shape[0] = p->shape[0];
        wt[i].shape[1] = p->n_dims == 2 ? p->shape[1] : 0;
        wt[i].data = cur;
        wt[i].nbytes = n * esz;
        cur += n * esz;
    }
    char seed_s[32];
    snprintf(seed_s, sizeof seed_s, "%llu", (unsigned long long)seed);
    const char *keys[] = {"format", "kvlingo_random_seed"}, *vals[] = {"pt", seed_s};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if ((s = kvl_safetensors_write(path, wt, (size_t)n_specs, keys, vals, 2)) != KVL_OK) goto out;
    /* config.json last: a directory a failed run leaves behind does not load */
    snprintf(path, sizeof path, "%s/config.json", dir);
    s = write_text(path, cfg_text);
out:
    free(chunk);
    free(data);
    free(wt);
    free(specs);
    kvl_model_free(m);
    return s;
}
