/* cli/cmd_random.c: `kvlingo model random` and `kvlingo translator random`: random-weight model
 * directories of a published geometry and random translators between two models, so that the
 * whole stack (kvld, kvlingo-router) runs at real sizes without downloaded weights or training.
 * Both are reproducible: the same arguments give byte-identical files (hence the same model
 * hashes, which translators and kvld check). */
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "error.h"
#include "kvlingo/kv_maps.h"
#include "kvlingo/model.h"
#include "kvlingo/safetensors.h"
#include "kvlingo/shapes.h"
#include "kvlingo/translator_train.h"

/* --dtype f32|bf16 (absent: dflt).  A bad name -> message on stderr, *err = 1. */
static kvl_dtype opt_dtype(cli_args *a, const char *cmd, kvl_dtype dflt, int *err) {
    const char *d = cli_opt(a, "--dtype", err);
    if (!d) return dflt;
    if (!strcmp(d, "f32")) return KVL_DTYPE_F32;
    if (!strcmp(d, "bf16")) return KVL_DTYPE_BF16;
    fprintf(stderr, "kvlingo %s: --dtype must be f32 or bf16 (got '%s')\n", cmd, d);
    *err = 1;
    return dflt;
}

static int model_random(int argc, char **argv) {
    cli_args a;
    if (cli_args_init(&a, argc, argv, 3)) return 1;
    int err = 0;
    if (cli_flag(&a, "--help")) {
        printf("usage: kvlingo model random --shape SHAPE --out DIR [--dtype f32|bf16] [--seed S] [--force]\n"
               "Writes DIR/config.json and DIR/model.safetensors: random weights (std 0.02, norms 1,\n"
               "biases 0; kvlingo/shapes.h) of SHAPE's geometry, f32 by default; no tokenizer (kvld\n"
               "then serves token ids only).  SHAPE: %s.  Seed default 1.  A DIR that holds a\n"
               "model already is refused unless --force (its other files, a tokenizer, would stay).\n",
               kvl_shape_names());
        cli_args_free(&a);
        return 0;
    }
    const char *shape = cli_opt(&a, "--shape", &err);
    const char *out = cli_opt(&a, "--out", &err);
    kvl_dtype dt = opt_dtype(&a, "model random", KVL_DTYPE_F32, &err);
    long seed = cli_opt_long(&a, "--seed", 1, 0, 1L << 62, &err);
    const int force = cli_flag(&a, "--force");
    if (err || cli_args_leftover(&a, "model random")) { cli_args_free(&a); return 2; }
    cli_args_free(&a);
    if (!shape || !out) {
        fprintf(stderr, "kvlingo model random: --shape SHAPE and --out DIR are required\n");
        return 2;
    }
    kvl_model_config cfg;
    kvl_status s = kvl_shape_config(shape, &cfg);
    if (s != KVL_OK) return cli_fail("model random --shape", s);
    static const char *const held[] = {"config.json", "model.safetensors", "model.safetensors.index.json"};
    for (size_t i = 0; i < sizeof held / sizeof held[0] && !force; i++) {
        char p[4200];
        snprintf(p, sizeof p, "%s/%s", out, held[i]);
        if (access(p, F_OK) == 0) {
            fprintf(stderr, "kvlingo model random: option --out: %s holds a model already (%s); give --force "
                    "to replace its weights and config (its other files stay)\n", out, held[i]);
            return 2;
        }
    }
    if ((s = kvl_model_write_random(&cfg, (uint64_t)seed, dt, out)) != KVL_OK) return cli_fail("model random", s);
    printf("kvlingo model random: wrote %s (%s, %lld parameters, %s, seed %ld)\n", out, shape,
           (long long)kvl_config_param_count(&cfg), dt == KVL_DTYPE_BF16 ? "bf16" : "f32", seed);
    return 0;
}

int cmd_model(int argc, char **argv) {
    const char *sub = argc >= 3 ? argv[2] : NULL;
    if (sub && !strcmp(sub, "random")) return model_random(argc, argv);
    int help = sub && (!strcmp(sub, "--help") || !strcmp(sub, "-h"));
    fprintf(help ? stdout : stderr, "usage: kvlingo model random --shape SHAPE --out DIR [--dtype f32|bf16] [--seed S]\n");
    return help ? 0 : 2;
}

kvl_status cli_translator_from_maps(const kvl_model *src, const kvl_model *dst, const kvl_kv_maps *maps,
                                    kvl_translator **out) {
    *out = NULL;
    kvl_translator *tr = NULL;
    kvl_status s = kvl_translator_create(src, dst, NULL, &tr);
    if (s != KVL_OK) return s;
    kvl_translator_geometry g;
    kvl_translator_get_geometry(tr, &g);
    if (g.dst_layers != maps->dst_layers || g.src_kv_heads != maps->src_kv_heads ||
        g.src_head_dim != maps->src_head_dim || g.dst_kv_heads != maps->dst_kv_heads ||
        g.dst_head_dim != maps->dst_head_dim || kvl_translator_taps(tr) != 1) {
        kvl_translator_free(tr);
        return kvl__errorf(KVL_ERR_MISMATCH, "random maps: geometry differs from the translator of %s -> %s",
                          kvl_model_name(src), kvl_model_name(dst));
    }
    size_t per = (size_t)maps->dst_kv_heads * maps->dst_head_dim * (size_t)maps->src_kv_heads * maps->src_head_dim;
    for (int l = 0; l < maps->dst_layers; l++) {
        /* both use the default layer map s(l) = round(l (Ls-1) / (Lt-1)) */
        if (kvl_translator_layer_map(tr, l) != maps->layer_map[l]) {
            kvl_status e = kvl__errorf(KVL_ERR_MISMATCH, "random maps: target layer %d reads source layer %d, "
                                      "the translator's map says %d", l, maps->layer_map[l],
                                      kvl_translator_layer_map(tr, l));
            kvl_translator_free(tr);
            return e;
        }
        memcpy(kvl_translator_wk(tr, l), maps->wk + (size_t)l * per, per * sizeof(float));
        memcpy(kvl_translator_wv(tr, l), maps->wv + (size_t)l * per, per * sizeof(float));
    }
    *out = tr;
    return KVL_OK;
}

int cmd_translator_random(int argc, char **argv) {
    cli_args a;
    if (cli_args_init(&a, argc, argv, 3)) return 1;
    int err = 0;
    if (cli_flag(&a, "--help")) {
        puts("usage: kvlingo translator random --source DIR --target DIR --out FILE [--dtype f32|bf16]\n"
             "                                 [--seed S]\n"
             "An untrained translator SOURCE -> TARGET with random maps of the right shape (default\n"
             "layer map, weights uniform with std 1/sqrt(Hs*Ds): kvlingo/kv_maps.h), the target's\n"
             "k_norm weights and both models' names and hashes, so kvld loads it for that pair.\n"
             "For measuring cost only: its translations are meaningless.  f32 maps, seed 1 by default.");
        cli_args_free(&a);
        return 0;
    }
    const char *src_dir = cli_opt(&a, "--source", &err);
    const char *dst_dir = cli_opt(&a, "--target", &err);
    const char *out = cli_opt(&a, "--out", &err);
    kvl_dtype dt = opt_dtype(&a, "translator random", KVL_DTYPE_F32, &err);
    long seed = cli_opt_long(&a, "--seed", 1, 0, 1L << 62, &err);
    if (err || cli_args_leftover(&a, "translator random")) { cli_args_free(&a); return 2; }
    cli_args_free(&a);
    if (!src_dir || !dst_dir || !out) {
        fprintf(stderr, "kvlingo translator random: --source DIR, --target DIR and --out FILE are required\n");
        return 2;
    }
    kvl_model *src = NULL, *dst = NULL;
    kvl_translator *tr = NULL;
    kvl_kv_maps maps = {0};
    const char *what = "translator random --source";
    kvl_model_params mp = kvl_model_default_params();
    kvl_status s = kvl_model_load(src_dir, &mp, &src);
    if (s == KVL_OK) { what = "translator random --target"; s = kvl_model_load(dst_dir, &mp, &dst); }
    if (s == KVL_OK) { what = "translator random"; s = kvl_kv_maps_random(kvl_model_config_get(src),
                                                                           kvl_model_config_get(dst),
                                                                           (uint64_t)seed, &maps); }
    if (s == KVL_OK) s = cli_translator_from_maps(src, dst, &maps, &tr);
    char meta[128];
    snprintf(meta, sizeof meta, "{\"seed\":%ld,\"purpose\":\"cost measurements only: untrained maps\"}", seed);
    if (s == KVL_OK) s = kvl_translator_set_meta(tr, "random", meta);
    if (s == KVL_OK) s = kvl_translator_save(tr, out, dt);
    int rc = 0;
    if (s != KVL_OK) rc = cli_fail(what, s);
    else
        printf("kvlingo translator random: wrote %s (%s -> %s, %d target layers, %s)\n", out,
               kvl_model_name(src), kvl_model_name(dst), maps.dst_layers, dt == KVL_DTYPE_BF16 ? "bf16" : "f32");
    kvl_kv_maps_free(&maps);
    kvl_translator_free(tr);
    kvl_model_free(src);
    kvl_model_free(dst);
    return rc;
}
