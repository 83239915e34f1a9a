/* tests/unit/test_config.c: config.json parsing (both layouts, defaults, refusals, errors). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "kvlingo/model.h"

#define BASE_FIELDS \
    "\"hidden_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, " \
    "\"intermediate_size\": 256, \"vocab_size\": 100"

static kvl_status parse(const char *json, kvl_model_config *c) {
    return kvl_config_parse(json, strlen(json), "cfg.json", c);
}

static void expect_error(const char *json, kvl_status want, const char *needle) {
    kvl_model_config c;
    kvl_status s = parse(json, &c);
    if (s != want) fail_msg("status %d (%s), want %d for %s", s, kvl_last_error(), want, json);
    if (!strstr(kvl_last_error(), needle)) fail_msg("message '%s' lacks '%s'", kvl_last_error(), needle);
    assert_non_null(strstr(kvl_last_error(), "cfg.json"));
}

static void test_shipped_layouts(void **st) {
    (void)st;
    kvl_model_config a, c;
    char p[4096];
    snprintf(p, sizeof p, "%s/models/qwen3-a/config.json", KVL_SOURCE_DIR);
    assert_int_equal(kvl_config_load(p, &a), KVL_OK);
    assert_int_equal(a.arch, KVL_ARCH_QWEN3);
    assert_int_equal(a.head_dim, 32);
    assert_true(a.qk_norm && !a.qkv_bias && a.tie_word_embeddings);
    assert_true(a.rope_theta == 10000.0);
    assert_int_equal(a.weight_dtype, KVL_DTYPE_F32);
    snprintf(p, sizeof p, "%s/models/qwen2-c/config.json", KVL_SOURCE_DIR);
    assert_int_equal(kvl_config_load(p, &c), KVL_OK);
    assert_int_equal(c.arch, KVL_ARCH_QWEN2);
    assert_int_equal(c.head_dim, 32);                 /* 192 / 6 */
    assert_true(c.qkv_bias && !c.qk_norm && !c.tie_word_embeddings);   /* bias without the key */
    assert_int_equal(c.weight_dtype, KVL_DTYPE_F16);  /* torch_dtype (older layout) */
    assert_int_equal(c.n_eos, 1);
    assert_int_equal(c.eos_token_ids[0], 4093);
    snprintf(p, sizeof p, "%s/models/qwen3-b/config.json", KVL_SOURCE_DIR);
    assert_int_equal(kvl_config_load(p, &a), KVL_OK);
    assert_true(a.rope_theta == 1000000.0);           /* rope_parameters.rope_theta */
}

static void test_llama_and_defaults(void **st) {
    (void)st;
    kvl_model_config c;
    assert_int_equal(parse("{\"architectures\": [\"LlamaForCausalLM\"], " BASE_FIELDS
                           ", \"num_key_value_heads\": 2, \"rope_theta\": 500000.0, "
                           "\"eos_token_id\": [128001, 128009], \"attention_bias\": false, "
                           "\"rope_scaling\": null, \"sliding_window\": 4096, \"use_sliding_window\": false}", &c),
                     KVL_OK);
    assert_int_equal(c.arch, KVL_ARCH_LLAMA);
    assert_int_equal(c.head_dim, 32);
    assert_int_equal(c.n_kv_heads, 2);
    assert_int_equal(c.n_eos, 2);
    assert_int_equal(c.eos_token_ids[1], 128009);
    assert_false(c.qkv_bias);
    assert_true(c.rope_theta == 500000.0);
    assert_true(c.rms_norm_eps > 0);
    /* no num_key_value_heads: MHA */
    assert_int_equal(parse("{\"architectures\": [\"LlamaForCausalLM\"], " BASE_FIELDS "}", &c), KVL_OK);
    assert_int_equal(c.n_kv_heads, 4);
    assert_int_equal(kvl_config_param_count(&c) > 0, 1);
    /* explicit head_dim wins */
    assert_int_equal(parse("{\"architectures\": [\"Qwen3ForCausalLM\"], " BASE_FIELDS ", \"head_dim\": 64}", &c), KVL_OK);
    assert_int_equal(c.head_dim, 64);
    assert_true(c.qk_norm);
}

static void test_refusals(void **st) {
    (void)st;
    expect_error("{\"architectures\": [\"GPT2LMHeadModel\"], " BASE_FIELDS "}", KVL_ERR_UNSUPPORTED, "architectures");
    /* RoPE types other than default, linear, dynamic, yarn, llama3: refused by name */
    expect_error("{\"architectures\": [\"LlamaForCausalLM\"], " BASE_FIELDS
                 ", \"rope_scaling\": {\"rope_type\": \"longrope\", \"factor\": 8.0}}", KVL_ERR_UNSUPPORTED,
                 "field 'rope_scaling.rope_type': 'longrope'");
    expect_error("{\"architectures\": [\"LlamaForCausalLM\"], " BASE_FIELDS
                 ", \"rope_scaling\": {\"type\": \"su\", \"factor\": 8.0}}", KVL_ERR_UNSUPPORTED,
                 "field 'rope_scaling.type': 'su'");
    expect_error("{\"architectures\": [\"Qwen3ForCausalLM\"], " BASE_FIELDS
                 ", \"rope_parameters\": {\"rope_type\": \"proportional\", \"rope_theta\": 1e6}}",
                 KVL_ERR_UNSUPPORTED, "field 'rope_parameters.rope_type': 'proportional'");
    expect_error("{\"architectures\": [\"Qwen3ForCausalLM\"], " BASE_FIELDS
                 ", \"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": 2, "
                 "\"partial_rotary_factor\": 0.5}}", KVL_ERR_UNSUPPORTED, "rope_parameters.partial_rotary_factor");
    expect_error("{\"architectures\": [\"Qwen2ForCausalLM\"], " BASE_FIELDS
                 ", \"use_sliding_window\": true, \"sliding_window\": 64}", KVL_ERR_UNSUPPORTED, "sliding");
    expect_error("{\"architectures\": [\"Qwen2ForCausalLM\"], " BASE_FIELDS
                 ", \"hidden_act\": \"gelu\"}", KVL_ERR_UNSUPPORTED, "hidden_act");
}

static void test_rope_scaling(void **st) {
    (void)st;
    kvl_model_config c;
    /* older layout: rope_theta + rope_scaling with rope_type (Llama 3.x) */
    assert_int_equal(parse("{\"architectures\": [\"LlamaForCausalLM\"], " BASE_FIELDS ", \"rope_theta\": 5e5, "
                           "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
                           "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}}", &c), KVL_OK);
    assert_int_equal(c.rope.type, KVL_ROPE_LLAMA3);
    assert_true(c.rope.theta == 5e5 && c.rope_theta == 5e5 && c.rope.factor == 8);
    assert_int_equal(c.rope.original_max_position_embeddings, 8192);
    assert_int_equal(c.rope.dim, 32);
    /* older layout with "type" (Qwen2.5 long context); original defaults to max_position */
    assert_int_equal(parse("{\"architectures\": [\"Qwen2ForCausalLM\"], " BASE_FIELDS ", \"max_position_embeddings\": 8192, "
                           "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0, \"beta_fast\": 16, "
                           "\"truncate\": false}}", &c), KVL_OK);
    assert_int_equal(c.rope.type, KVL_ROPE_YARN);
    assert_int_equal(c.rope.original_max_position_embeddings, 8192);
    assert_true(c.rope.beta_fast == 16 && c.rope.truncate == 0);
    /* newer layout: rope_parameters */
    assert_int_equal(parse("{\"architectures\": [\"Qwen3ForCausalLM\"], " BASE_FIELDS ", \"rope_parameters\": "
                           "{\"rope_type\": \"yarn\", \"rope_theta\": 1e6, \"factor\": 4, "
                           "\"original_max_position_embeddings\": 1024, \"attention_factor\": 1.5}}", &c), KVL_OK);
    assert_int_equal(c.rope.type, KVL_ROPE_YARN);
    assert_true(c.rope.theta == 1e6 && c.rope.attention_factor == 1.5);
    assert_int_equal(parse("{\"architectures\": [\"Qwen3ForCausalLM\"], " BASE_FIELDS ", \"rope_parameters\": "
                           "{\"rope_type\": \"linear\", \"rope_theta\": 1e4, \"factor\": 2}}", &c), KVL_OK);
    assert_int_equal(c.rope.type, KVL_ROPE_LINEAR);
    assert_int_equal(parse("{\"architectures\": [\"LlamaForCausalLM\"], " BASE_FIELDS
                           ", \"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2}}", &c), KVL_OK);
    assert_int_equal(c.rope.type, KVL_ROPE_DYNAMIC);
    assert_int_equal(c.rope.max_position_embeddings, 4096);
    /* default type in either object */
    assert_int_equal(parse("{\"architectures\": [\"LlamaForCausalLM\"], " BASE_FIELDS
                           ", \"rope_scaling\": {\"rope_type\": \"default\"}}", &c), KVL_OK);
    assert_int_equal(c.rope.type, KVL_ROPE_DEFAULT);
    /* errors name the file and the field */
    expect_error("{\"architectures\": [\"LlamaForCausalLM\"], " BASE_FIELDS
                 ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}}", KVL_ERR_FORMAT,
                 "field 'rope_scaling.low_freq_factor' is missing");
    expect_error("{\"architectures\": [\"LlamaForCausalLM\"], " BASE_FIELDS
                 ", \"rope_scaling\": {\"rope_type\": \"linear\"}}", KVL_ERR_FORMAT, "field 'rope_scaling.factor'");
    expect_error("{\"architectures\": [\"LlamaForCausalLM\"], " BASE_FIELDS
                 ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": -2}}", KVL_ERR_FORMAT,
                 "field 'rope_scaling.factor' must be a positive number");
    expect_error("{\"architectures\": [\"LlamaForCausalLM\"], " BASE_FIELDS
                 ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 4, "
                 "\"high_freq_factor\": 1, \"original_max_position_embeddings\": 8192}}", KVL_ERR_FORMAT,
                 "rope_scaling.high_freq_factor");
    expect_error("{\"architectures\": [\"LlamaForCausalLM\"], " BASE_FIELDS
                 ", \"rope_scaling\": {\"factor\": 8}}", KVL_ERR_FORMAT, "rope_scaling");
    expect_error("{\"architectures\": [\"LlamaForCausalLM\"], " BASE_FIELDS
                 ", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4, \"truncate\": 1}}", KVL_ERR_FORMAT,
                 "field 'rope_scaling.truncate'");
    expect_error("{\"architectures\": [\"LlamaForCausalLM\"], " BASE_FIELDS
                 ", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4, "
                 "\"original_max_position_embeddings\": 1000.5}}", KVL_ERR_FORMAT,
                 "rope_scaling.original_max_position_embeddings");
}

static void test_malformed(void **st) {
    (void)st;
    expect_error("{\"architectures\": [\"Qwen2ForCausalLM\"], ", KVL_ERR_FORMAT, "invalid JSON");
    expect_error("[1, 2]", KVL_ERR_FORMAT, "object");
    expect_error("{\"hidden_size\": 12}", KVL_ERR_FORMAT, "architectures");
    expect_error("{\"architectures\": [\"Qwen2ForCausalLM\"], \"hidden_size\": 128}", KVL_ERR_FORMAT, "vocab_size");
    expect_error("{\"architectures\": [\"Qwen2ForCausalLM\"], " BASE_FIELDS ", \"num_key_value_heads\": 3}",
                 KVL_ERR_FORMAT, "num_key_value_heads");
    expect_error("{\"architectures\": [\"Qwen2ForCausalLM\"], \"hidden_size\": \"big\", \"num_hidden_layers\": 2, "
                 "\"num_attention_heads\": 4, \"intermediate_size\": 256, \"vocab_size\": 100}", KVL_ERR_FORMAT, "hidden_size");
    expect_error("{\"architectures\": [\"Qwen2ForCausalLM\"], \"hidden_size\": 128.5, \"num_hidden_layers\": 2, "
                 "\"num_attention_heads\": 4, \"intermediate_size\": 256, \"vocab_size\": 100}", KVL_ERR_FORMAT, "integer");
    expect_error("{\"architectures\": [\"Qwen2ForCausalLM\"], " BASE_FIELDS ", \"rope_theta\": -1}", KVL_ERR_FORMAT, "rope_theta");
    expect_error("{\"architectures\": [\"Qwen2ForCausalLM\"], " BASE_FIELDS ", \"torch_dtype\": \"int8\"}",
                 KVL_ERR_UNSUPPORTED, "torch_dtype");
    expect_error("{\"architectures\": [\"Qwen2ForCausalLM\"], " BASE_FIELDS ", \"head_dim\": 33}", KVL_ERR_FORMAT, "head_dim");
    /* dimensions past any model's: refused before the loader sizes anything by them (two
     * million layers made it reserve 3 GB before it looked for the weights) */
    expect_error("{\"architectures\": [\"Qwen2ForCausalLM\"], \"hidden_size\": 128, \"num_hidden_layers\": 2000000, "
                 "\"num_attention_heads\": 4, \"intermediate_size\": 256, \"vocab_size\": 100}", KVL_ERR_FORMAT,
                 "field 'num_hidden_layers' must be in [1, 1024]");
    expect_error("{\"architectures\": [\"Qwen2ForCausalLM\"], \"hidden_size\": 128, \"num_hidden_layers\": 2, "
                 "\"num_attention_heads\": 4, \"intermediate_size\": 256, \"vocab_size\": 100000000}", KVL_ERR_FORMAT,
                 "field 'vocab_size'");
    expect_error("{\"architectures\": [\"Qwen2ForCausalLM\"], " BASE_FIELDS ", \"head_dim\": 8192}", KVL_ERR_FORMAT,
                 "field 'head_dim' must be in [1, 4096]");
    /* a key given twice: cJSON took the first, transformers the last (another model) */
    expect_error("{\"architectures\": [\"Qwen2ForCausalLM\"], " BASE_FIELDS ", \"num_hidden_layers\": 3}", KVL_ERR_FORMAT,
                 "key 'num_hidden_layers' is given twice");
    /* eos ids are token ids: integers >= 0 */
    expect_error("{\"architectures\": [\"Qwen2ForCausalLM\"], " BASE_FIELDS ", \"eos_token_id\": [1e30, 2]}", KVL_ERR_FORMAT,
                 "eos_token_id");
    expect_error("{\"architectures\": [\"Qwen2ForCausalLM\"], " BASE_FIELDS ", \"eos_token_id\": 2.9}", KVL_ERR_FORMAT,
                 "eos_token_id");
    expect_error("{\"architectures\": [\"Qwen2ForCausalLM\"], " BASE_FIELDS ", \"eos_token_id\": -7}", KVL_ERR_FORMAT,
                 "eos_token_id");
    /* an epsilon float32 rounds to 0 would divide by zero on an all-zero row */
    expect_error("{\"architectures\": [\"Qwen2ForCausalLM\"], " BASE_FIELDS ", \"rms_norm_eps\": 1e-60}", KVL_ERR_FORMAT,
                 "rms_norm_eps");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shipped_layouts), cmocka_unit_test(test_rope_scaling),
        cmocka_unit_test(test_llama_and_defaults),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_malformed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
