/* tests/unit/testutil.c: see testutil.h. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

const char *kvl__test_path(const char *rel) {
    static char bufs[8][4096];
    static int next;
    char *b = bufs[next];
    next = (next + 1) % 8;
    snprintf(b, sizeof bufs[0], "%s/%s", KVL_SOURCE_DIR, rel);
    return b;
}

const char *kvl__test_build_path(const char *rel) {
    static char bufs[8][4096];
    static int next;
    char *b = bufs[next];
    next = (next + 1) % 8;
    snprintf(b, sizeof bufs[0], "%s/%s", KVL_BINARY_DIR, rel);
    return b;
}

int kvl__test_rerun_self_with(const char *var, const char *value) {
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return -1;
    self[n] = 0;
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s='%s' '%s' >/dev/null 2>&1", var, value, self);
    return system(cmd);
}

const char *kvl__test_tmpdir(void) {
    static char buf[4096];
    const char *t = getenv("TMPDIR");
    snprintf(buf, sizeof buf, "%s/kvltest.XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(buf)) return NULL;
    return buf;
}

int kvl__test_write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, len, f);
    int rc = fclose(f);
    return (w == len && rc == 0) ? 0 : -1;
}

char *kvl__test_read_file(const char *path, size_t *len_out) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) != 0) { fclose(f); return NULL; }
    long n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) { fclose(f); return NULL; }
    char *buf = malloc((size_t)n + 1);
    if (!buf) { fclose(f); return NULL; }
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); fclose(f); return NULL; }
    fclose(f);
    buf[n] = '\0';
    if (len_out) *len_out = (size_t)n;
    return buf;
}

#include "kvlingo/safetensors.h"

static float rnd(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return ((*s >> 8) / 16777216.0f) * 2.0f - 1.0f;
}

int kvl__test_write_tiny_model(const char *dir, const char *arch, int V, int H, int L, int Hq, int Hkv,
                              int D, int F, double rope_theta, unsigned seed,
                              const char *skip_tensor, const char *bad_shape_tensor) {
    int qwen2 = !strcmp(arch, "Qwen2ForCausalLM"), qwen3 = !strcmp(arch, "Qwen3ForCausalLM");
    char path[4096], cfg[2048];
    snprintf(cfg, sizeof cfg,
             "{\"architectures\": [\"%s\"], \"vocab_size\": %d, \"hidden_size\": %d, "
             "\"num_hidden_layers\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d, "
             "\"head_dim\": %d, \"intermediate_size\": %d, \"rope_theta\": %g, \"rms_norm_eps\": 1e-6, "
             "\"tie_word_embeddings\": true, \"eos_token_id\": %d, \"max_position_embeddings\": 1024}",
             arch, V, H, L, Hq, Hkv, D, F, rope_theta, V - 1);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (kvl__test_write_file(path, cfg, strlen(cfg))) return -1;

    enum { MAXT = 512 };
    kvl_st_write_tensor t[MAXT];
    char names[MAXT][96];
    float *bufs[MAXT];
    int n = 0;
#define T2(nm, a, b, scale, ones) do {                                              \
        snprintf(names[n], sizeof names[n], "%s", nm);                                 \
        if (skip_tensor && !strcmp(names[n], skip_tensor)) break;                      \
        int64_t d0 = (a), d1 = (b);                                                    \
        if (bad_shape_tensor && !strcmp(names[n], bad_shape_tensor)) d0 += 1;          \
        size_t cnt = (size_t)d0 * (size_t)(d1 > 0 ? d1 : 1);                           \
        bufs[n] = malloc(sizeof(float) * cnt);                                         \
        if (!bufs[n]) return -1;                                                       \
        for (size_t i = 0; i < cnt; i++) bufs[n][i] = (ones) ? 1.0f + 0.1f * rnd(&seed) : (scale) * rnd(&seed); \
        t[n].name = names[n]; t[n].dtype = KVL_DTYPE_F32;                              \
        t[n].n_dims = d1 > 0 ? 2 : 1; t[n].shape[0] = d0; t[n].shape[1] = d1;          \
        t[n].data = bufs[n]; t[n].nbytes = sizeof(float) * cnt; n++;                   \
    } while (0)
    char nm[96];
    T2("model.embed_tokens.weight", V, H, 0.5f, 0);
    for (int l = 0; l < L; l++) {
        float ws = 1.0f / sqrtf((float)H);
#define LN(fmt) (snprintf(nm, sizeof nm, fmt, l), nm)
        T2(LN("model.layers.%d.input_layernorm.weight"), H, 0, 0, 1);
        T2(LN("model.layers.%d.self_attn.q_proj.weight"), Hq * D, H, ws, 0);
        T2(LN("model.layers.%d.self_attn.k_proj.weight"), Hkv * D, H, ws, 0);
        T2(LN("model.layers.%d.self_attn.v_proj.weight"), Hkv * D, H, ws, 0);
        if (qwen2) {
            T2(LN("model.layers.%d.self_attn.q_proj.bias"), Hq * D, 0, 0.1f, 0);
            T2(LN("model.layers.%d.self_attn.k_proj.bias"), Hkv * D, 0, 0.1f, 0);
            T2(LN("model.layers.%d.self_attn.v_proj.bias"), Hkv * D, 0, 0.1f, 0);
        }
        if (qwen3) {
            T2(LN("model.layers.%d.self_attn.q_norm.weight"), D, 0, 0, 1);
            T2(LN("model.layers.%d.self_attn.k_norm.weight"), D, 0, 0, 1);
        }
        T2(LN("model.layers.%d.self_attn.o_proj.weight"), H, Hq * D, 1.0f / sqrtf((float)(Hq * D)), 0);
        T2(LN("model.layers.%d.post_attention_layernorm.weight"), H, 0, 0, 1);
        T2(LN("model.layers.%d.mlp.gate_proj.weight"), F, H, ws, 0);
        T2(LN("model.layers.%d.mlp.up_proj.weight"), F, H, ws, 0);
        T2(LN("model.layers.%d.mlp.down_proj.weight"), H, F, 1.0f / sqrtf((float)F), 0);
#undef LN
    }
    T2("model.norm.weight", H, 0, 0, 1);
#undef T2
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    kvl_status s = kvl_safetensors_write(path, t, (size_t)n, NULL, NULL, 0);
    for (int i = 0; i < n; i++) free(bufs[i]);
    return s == KVL_OK ? 0 : -1;
}
