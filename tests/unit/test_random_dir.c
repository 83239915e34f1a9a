/* tests/unit/test_random_dir.c: random-weight model directories (kvl_model_write_random): the
 * directory loads, its config.json round-trips the geometry, an f32 directory holds exactly the
 * weights of kvl_model_create_random (same logits), writes are reproducible byte for byte, and
 * what config.json cannot say is refused. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvlingo/cache.h"
#include "kvlingo/model.h"
#include "kvlingo/shapes.h"
#include "kvlingo/translator_train.h"
#include "testutil.h"

static void same_geometry(const kvl_model_config *a, const kvl_model_config *b) {
    assert_int_equal(a->arch, b->arch);
    assert_string_equal(a->architecture, b->architecture);
    assert_int_equal(a->vocab_size, b->vocab_size);
    assert_int_equal(a->hidden_size, b->hidden_size);
    assert_int_equal(a->n_layers, b->n_layers);
    assert_int_equal(a->n_heads, b->n_heads);
    assert_int_equal(a->n_kv_heads, b->n_kv_heads);
    assert_int_equal(a->head_dim, b->head_dim);
    assert_int_equal(a->intermediate_size, b->intermediate_size);
    assert_true(a->rms_norm_eps == b->rms_norm_eps);
    assert_true(a->rope_theta == b->rope_theta);
    assert_int_equal(a->rope.type, b->rope.type);
    assert_int_equal(a->rope.dim, b->rope.dim);
    assert_int_equal(a->qkv_bias, b->qkv_bias);
    assert_int_equal(a->o_bias, b->o_bias);
    assert_int_equal(a->qk_norm, b->qk_norm);
    assert_int_equal(a->tie_word_embeddings, b->tie_word_embeddings);
    assert_int_equal(a->max_position_embeddings, b->max_position_embeddings);
    assert_int_equal(a->bos_token_id, b->bos_token_id);
    assert_int_equal(a->n_eos, b->n_eos);
    assert_int_equal(a->eos_token_ids[0], b->eos_token_ids[0]);
}

/* Last-position logits [V] of a prefill of ids[n] (malloc'ed). */
static float *logits_of(kvl_model *m, const int32_t *ids, int n) {
    const kvl_model_config *c = kvl_model_config_get(m);
    kvl_cache_params cp = kvl_cache_default_params();
    cp.max_tokens = n;
    kvl_cache *cache = NULL;
    assert_int_equal(kvl_cache_create(c, &cp, &cache), KVL_OK);
    float *lg = malloc(sizeof(float) * (size_t)c->vocab_size);
    assert_non_null(lg);
    assert_int_equal(kvl_model_prefill(m, cache, ids, n, KVL_LOGITS_LAST, lg), KVL_OK);
    kvl_cache_free(cache);
    return lg;
}

static void test_f32_dir_is_the_random_model(void **st) {
    (void)st;
    kvl_model_config cfg;
    assert_int_equal(kvl_shape_config("tiny", &cfg), KVL_OK);
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tiny", kvl__test_tmpdir());
    assert_int_equal(kvl_model_write_random(&cfg, 7, KVL_DTYPE_F32, dir), KVL_OK);
    kvl_model_params mp = kvl_model_default_params();
    mp.weights_dtype = KVL_WEIGHTS_F32;
    kvl_model *disk = NULL, *mem = NULL;
    assert_int_equal(kvl_model_load(dir, &mp, &disk), KVL_OK);
    assert_int_equal(kvl_model_create_random(&cfg, 7, &mp, &mem), KVL_OK);
    same_geometry(kvl_model_config_get(disk), &cfg);
    assert_int_equal(kvl_model_config_get(disk)->weight_dtype, KVL_DTYPE_F32);
    assert_string_equal(kvl_model_name(disk), "tiny");
    int32_t ids[12];
    for (int i = 0; i < 12; i++) ids[i] = (i * 37 + 5) % cfg.vocab_size;
    float *a = logits_of(disk, ids, 12), *b = logits_of(mem, ids, 12);
    for (int v = 0; v < cfg.vocab_size; v++) assert_true(a[v] == b[v]);
    /* not a trivially constant model: the logits differ across the vocabulary */
    int differ = 0;
    for (int v = 1; v < cfg.vocab_size; v++) differ |= a[v] != a[0];
    assert_true(differ);
    free(a);
    free(b);
    kvl_model_free(disk);
    kvl_model_free(mem);
}

static void test_reproducible_and_seeded(void **st) {
    (void)st;
    kvl_model_config cfg;
    assert_int_equal(kvl_shape_config("tiny", &cfg), KVL_OK);
    const char *tmp = kvl__test_tmpdir();
    char d1[1024], d2[1024], d3[1024], p[1100];
    snprintf(d1, sizeof d1, "%s/a", tmp);
    snprintf(d2, sizeof d2, "%s/b", tmp);
    snprintf(d3, sizeof d3, "%s/c", tmp);
    assert_int_equal(kvl_model_write_random(&cfg, 3, KVL_DTYPE_BF16, d1), KVL_OK);
    assert_int_equal(kvl_model_write_random(&cfg, 3, KVL_DTYPE_BF16, d2), KVL_OK);
    assert_int_equal(kvl_model_write_random(&cfg, 4, KVL_DTYPE_BF16, d3), KVL_OK);
    size_t n1 = 0, n2 = 0, n3 = 0;
    snprintf(p, sizeof p, "%s/model.safetensors", d1);
    char *f1 = kvl__test_read_file(p, &n1);
    snprintf(p, sizeof p, "%s/model.safetensors", d2);
    char *f2 = kvl__test_read_file(p, &n2);
    snprintf(p, sizeof p, "%s/model.safetensors", d3);
    char *f3 = kvl__test_read_file(p, &n3);
    assert_non_null(f1);
    assert_non_null(f2);
    assert_non_null(f3);
    assert_int_equal(n1, n2);
    assert_memory_equal(f1, f2, n1);
    assert_true(n1 == n3 && memcmp(f1, f3, n1) != 0);
    free(f1);
    free(f2);
    free(f3);
    kvl_model *a = NULL, *b = NULL, *c = NULL;
    assert_int_equal(kvl_model_load(d1, NULL, &a), KVL_OK);
    assert_int_equal(kvl_model_load(d2, NULL, &b), KVL_OK);
    assert_int_equal(kvl_model_load(d3, NULL, &c), KVL_OK);
    assert_int_equal(kvl_model_config_get(a)->weight_dtype, KVL_DTYPE_BF16);
    assert_int_equal(kvl_model_weights_dtype(a), KVL_WEIGHTS_BF16);
    /* the identity hash covers config text and weights: same seed same hash */
    assert_string_equal(kvl_model_hash(a), kvl_model_hash(b));
    assert_string_not_equal(kvl_model_hash(a), kvl_model_hash(c));
    /* a translator made for (a, a) checks against b (same hash) and not against c */
    kvl_translator *tr = NULL;
    assert_int_equal(kvl_translator_create(a, a, NULL, &tr), KVL_OK);
    snprintf(p, sizeof p, "%s/tr.safetensors", tmp);
    assert_int_equal(kvl_translator_save(tr, p, KVL_DTYPE_F32), KVL_OK);
    kvl_translator_free(tr);
    assert_int_equal(kvl_translator_load(p, &tr), KVL_OK);
    assert_int_equal(kvl_translator_check(tr, b, b), KVL_OK);
    assert_int_equal(kvl_translator_check(tr, c, b), KVL_ERR_MISMATCH);
    kvl_translator_free(tr);
    kvl_model_free(a);
    kvl_model_free(b);
    kvl_model_free(c);
}

static void test_qwen2_layout_round_trips(void **st) {
    (void)st;
    /* the qwen2.5-0.5b layout (q/k/v bias, no q/k norm, GQA 14/2, theta 1e6) at a small size */
    kvl_model_config cfg;
    assert_int_equal(kvl_shape_config("qwen2.5-0.5b", &cfg), KVL_OK);
    cfg.n_layers = 2;
    cfg.hidden_size = 112;
    cfg.n_heads = 14;
    cfg.head_dim = 8;
    cfg.intermediate_size = 64;
    cfg.vocab_size = 300;
    cfg.eos_token_ids[0] = 299;
    cfg.rope = kvl_rope_default_params(cfg.rope_theta, cfg.head_dim, cfg.max_position_embeddings);
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/q2", kvl__test_tmpdir());
    assert_int_equal(kvl_model_write_random(&cfg, 1, KVL_DTYPE_F32, dir), KVL_OK);
    kvl_model *m = NULL;
    assert_int_equal(kvl_model_load(dir, NULL, &m), KVL_OK);
    same_geometry(kvl_model_config_get(m), &cfg);
    assert_int_equal(kvl_model_config_get(m)->qkv_bias, 1);
    kvl_model_free(m);
}

static void test_refusals(void **st) {
    (void)st;
    kvl_model_config cfg;
    assert_int_equal(kvl_shape_config("tiny", &cfg), KVL_OK);
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/bad", kvl__test_tmpdir());
    assert_int_equal(kvl_model_write_random(&cfg, 1, KVL_DTYPE_F16, dir), KVL_ERR_INVALID_ARG);
    kvl_model_config c2 = cfg;
    c2.rope.type = KVL_ROPE_YARN;
    assert_int_equal(kvl_model_write_random(&c2, 1, KVL_DTYPE_F32, dir), KVL_ERR_UNSUPPORTED);
    assert_non_null(strstr(kvl_last_error(), "RoPE"));
    c2 = cfg;
    c2.rope.dim = cfg.head_dim / 2;   /* partial rotary: no config.json field for it here */
    assert_int_equal(kvl_model_write_random(&c2, 1, KVL_DTYPE_F32, dir), KVL_ERR_UNSUPPORTED);
    c2 = cfg;
    c2.qk_norm = 0;   /* a Qwen3 config always has q/k norm */
    assert_int_equal(kvl_model_write_random(&c2, 1, KVL_DTYPE_F32, dir), KVL_ERR_UNSUPPORTED);
    c2 = cfg;
    c2.n_heads = 3;   /* not a multiple of the kv heads */
    assert_int_equal(kvl_model_write_random(&c2, 1, KVL_DTYPE_F32, dir), KVL_ERR_INVALID_ARG);
    assert_non_null(strstr(kvl_last_error(), "geometry"));
    /* nothing loadable was left behind */
    kvl_model *m = NULL;
    assert_int_not_equal(kvl_model_load(dir, NULL, &m), KVL_OK);
    assert_int_equal(kvl_model_write_random(&cfg, 1, KVL_DTYPE_F32, "/proc/no/such/dir"), KVL_ERR_IO);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32_dir_is_the_random_model),
        cmocka_unit_test(test_reproducible_and_seeded),
        cmocka_unit_test(test_qwen2_layout_round_trips),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
