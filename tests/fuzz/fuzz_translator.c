/* tests/fuzz/fuzz_translator.c: libFuzzer target for the translator file readers: the kvlingo
 * format (kvl_translator_load: geometry metadata, taps, layer_map, tensors) and the plain layout
 * (kvl_translator_import_plain against two tiny models).  Any input must either fail with a
 * status and a message, or give a translator whose every accessor stays in range and which
 * survives a save + load unchanged in shape. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvlingo/model.h"
#include "kvlingo/safetensors.h"
#include "kvlingo/translator.h"
#include "kvlingo/translator_train.h"
#include "testutil.h"

static char g_root[4096], g_in[4200], g_out[4200];
static kvl_model *g_src, *g_dst;

static kvl_model *tiny(const char *root, const char *name, const char *arch, int L, int Hkv, int D,
                       unsigned seed) {
    char d[4200];
    snprintf(d, sizeof d, "%s/%s", root, name);
    if (mkdir(d, 0755) || kvl__test_write_tiny_model(d, arch, 64, 2 * D, L, 2, Hkv, D, 24, 10000.0, seed, NULL, NULL))
        abort();
    kvl_model *m = NULL;
    kvl_model_params p = kvl_model_default_params();
    p.n_threads = 1;
    if (kvl_model_load(d, &p, &m) != KVL_OK) abort();
    return m;
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(p);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    /* a fixed folder in the build tree, emptied at start: libFuzzer ends with _Exit, so nothing
     * made here could be removed at exit */
    snprintf(g_root, sizeof g_root, "%s/fuzz-work-translator", KVL_BINARY_DIR);
    nftw(g_root, rm_one, 8, FTW_DEPTH | FTW_PHYS);
    if (mkdir(g_root, 0755)) abort();
    const char *root = g_root;
    snprintf(g_in, sizeof g_in, "%s/in.safetensors", root);
    snprintf(g_out, sizeof g_out, "%s/out.safetensors", root);
    /* the plain seed's pair: source 2 layers x 1 kv head x head_dim 4, target 2 x 1 x 4 */
    g_src = tiny(root, "src", "Qwen2ForCausalLM", 2, 1, 4, 1);
    g_dst = tiny(root, "dst", "Qwen3ForCausalLM", 2, 1, 4, 2);
    return 0;
}

static void check_ranges(const kvl_translator *tr) {
    kvl_translator_geometry g;
    kvl_translator_get_geometry(tr, &g);
    int T = kvl_translator_taps(tr);
    if (T < 1 || T > g.src_layers) abort();
    for (int l = 0; l < g.dst_layers; l++)
        for (int j = 0; j < T; j++) {
            int s = kvl_translator_layer_source(tr, l, j);
            if (s < 0 || s >= g.src_layers || (j && s <= kvl_translator_layer_source(tr, l, j - 1))) abort();
        }
    if (kvl_translator_layer_source(tr, g.dst_layers, 0) != -1 || kvl_translator_layer_source(tr, 0, T) != -1)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = fopen(g_in, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f)) abort();
    kvl_translator *tr = NULL, *back = NULL;
    kvl_status s = kvl_translator_load(g_in, &tr);
    if (s != KVL_OK) {
        if (tr || !kvl_last_error()[0]) abort();
    } else {
        check_ranges(tr);
        if (kvl_translator_save(tr, g_out, KVL_DTYPE_F32) == KVL_OK) {
            if (kvl_translator_load(g_out, &back) != KVL_OK) abort();
            check_ranges(back);
            if (kvl_translator_taps(back) != kvl_translator_taps(tr)) abort();
            kvl_translator_free(back);
        }
        kvl_translator_free(tr);
        tr = NULL;
    }
    s = kvl_translator_import_plain(g_in, g_src, g_dst, &tr);
    if (s != KVL_OK) {
        if (tr || !kvl_last_error()[0]) abort();
    } else {
        check_ranges(tr);
        if (kvl_translator_check(tr, g_src, g_dst) != KVL_OK) abort();
        kvl_translator_free(tr);
    }
    return 0;
}
