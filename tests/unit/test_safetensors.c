/* tests/unit/test_safetensors.c: safetensors reader/writer, conversions, sharded sets and
 * every malformed-input class the reader must reject with a precise message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvlingo/safetensors.h"
#include "testutil.h"

#define LABEL "mem.safetensors"

static void assert_error_has(const char *needle) {
    const char *msg = kvl_last_error();
    if (!strstr(msg, needle))
        fail_msg("error message \"%s\" lacks \"%s\"", msg, needle);
}

/* File image: u64 length, `json` verbatim, `data_len` data bytes (value i & 0xff). */
static uint8_t *make_image(const char *json, size_t data_len, size_t *len_out) {
    size_t n = strlen(json);
    uint8_t *b = malloc(8 + n + data_len + 1);
    assert_non_null(b);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(b + 8, json, n);
    for (size_t i = 0; i < data_len; i++)
        b[8 + n + i] = (uint8_t)i;
    *len_out = 8 + n + data_len;
    return b;
}

/* Parse json+data and expect `status` with the label and every needle in the message. */
static void expect_bad(const char *json, size_t data_len, kvl_status status, const char *n1,
                       const char *n2) {
    size_t len;
    uint8_t *img = make_image(json, data_len, &len);
    kvl_safetensors *st = (kvl_safetensors *)0x1;
    kvl_clear_error();
    assert_int_equal(kvl_safetensors_parse(img, len, LABEL, &st), status);
    assert_null(st);
    assert_error_has(LABEL);
    if (n1) assert_error_has(n1);
    if (n2) assert_error_has(n2);
    free(img);
}

/* ---- shipped models --------------------------------------------------------------------- */

static void check_model(const char *dir, kvl_dtype dtype, size_t n_tensors, const float *norm3) {
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", kvl__test_path(dir));
    kvl_safetensors *st = NULL;
    assert_int_equal(kvl_safetensors_open(path, &st), KVL_OK);
    assert_int_equal(kvl_safetensors_count(st), n_tensors);
    assert_string_equal(kvl_safetensors_path(st), path);
    assert_string_equal(kvl_safetensors_metadata(st, "format"), "pt");
    assert_null(kvl_safetensors_metadata(st, "nope"));
    assert_null(kvl_safetensors_find(st, "nope"));
    assert_null(kvl_safetensors_get(st, n_tensors));

    const kvl_st_tensor *t = kvl_safetensors_find(st, "model.norm.weight");
    assert_non_null(t);
    assert_int_equal(t->dtype, dtype);
    assert_int_equal(t->n_dims, 1);
    float *v = malloc((size_t)t->n_elements * sizeof *v);
    assert_non_null(v);
    assert_int_equal(kvl_st_tensor_to_f32(t, v, (size_t)t->n_elements), KVL_OK);
    for (int i = 0; i < 3; i++)
        assert_true(v[i] == norm3[i]);
    assert_int_equal(kvl_st_tensor_to_f32(t, v, (size_t)t->n_elements - 1), KVL_ERR_MISMATCH);
    assert_error_has("model.norm.weight");
    free(v);

    /* every tensor converts and is finite; find agrees with get */
    for (size_t i = 0; i < n_tensors; i++) {
        const kvl_st_tensor *u = kvl_safetensors_get(st, i);
        assert_ptr_equal(kvl_safetensors_find(st, u->name), u);
        assert_int_equal(u->nbytes, (size_t)u->n_elements * kvl_dtype_size(u->dtype));
        float *w = malloc((size_t)u->n_elements * sizeof *w);
        assert_non_null(w);
        assert_int_equal(kvl_st_tensor_to_f32(u, w, (size_t)u->n_elements), KVL_OK);
        for (int64_t k = 0; k < u->n_elements; k++)
            assert_true(isfinite(w[k]));
        free(w);
    }
    kvl_safetensors_close(st);

    /* the same folder as a set */
    kvl_st_set *set = NULL;
    assert_int_equal(kvl_st_set_open_dir(kvl__test_path(dir), &set), KVL_OK);
    assert_int_equal(kvl_st_set_num_files(set), 1);
    assert_int_equal(kvl_st_set_num_tensors(set), n_tensors);
    const char *file = NULL;
    assert_non_null(kvl_st_set_find(set, "model.norm.weight", &file));
    assert_non_null(strstr(file, "model.safetensors"));
    assert_non_null(kvl_st_set_get(set, n_tensors - 1, NULL));
    assert_null(kvl_st_set_get(set, n_tensors, NULL));
    kvl_st_set_free(set);
}

static void test_models(void **state) {
    (void)state;
    const float a[3] = {1.8741722106933594f, 1.8695024251937866f, 1.8321890830993652f};
    const float b[3] = {1.671875f, 1.609375f, 1.625f};
    const float c[3] = {1.642578125f, 1.720703125f, 1.6767578125f};
    check_model("models/qwen3-a", KVL_DTYPE_F32, 46, a);
    check_model("models/qwen3-b", KVL_DTYPE_BF16, 68, b);
    check_model("models/qwen2-c", KVL_DTYPE_F16, 63, c);
}

static void test_golden(void **state) {
    (void)state;
    const char *names[3] = {"models/qwen3-a/golden.safetensors", "models/qwen3-b/golden.safetensors",
                            "models/qwen2-c/golden.safetensors"};
    const size_t counts[3] = {25, 33, 29};
    for (int m = 0; m < 3; m++) {
        kvl_safetensors *st = NULL;
        assert_int_equal(kvl_safetensors_open(kvl__test_path(names[m]), &st), KVL_OK);
        assert_int_equal(kvl_safetensors_count(st), counts[m]);
        const kvl_st_tensor *k = kvl_safetensors_find(st, "prompt0.layer0.k_cache");
        assert_non_null(k);
        assert_int_equal(k->dtype, KVL_DTYPE_F32);
        assert_int_equal(k->n_dims, 3);
        int seen_i32 = 0;
        for (size_t i = 0; i < kvl_safetensors_count(st); i++) {
            const kvl_st_tensor *t = kvl_safetensors_get(st, i);
            float *w = malloc(((size_t)t->n_elements + 1) * sizeof *w);
            assert_non_null(w);
            assert_int_equal(kvl_st_tensor_to_f32(t, w, (size_t)t->n_elements), KVL_OK);
            free(w);
            seen_i32 |= t->dtype == KVL_DTYPE_I32;
        }
        assert_true(seen_i32);
        kvl_safetensors_close(st);
    }
}

/* ---- conversions --------------------------------------------------------------------------- */

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void test_f16(void **state) {
    (void)state;
    assert_true(kvl_f16_to_f32(0x0001) == ldexpf(1.0f, -24));      /* smallest subnormal */
    assert_true(kvl_f16_to_f32(0x03ff) == ldexpf(1023.0f, -24));   /* largest subnormal */
    assert_true(kvl_f16_to_f32(0x0400) == ldexpf(1.0f, -14));      /* smallest normal */
    assert_true(kvl_f16_to_f32(0x8001) == -ldexpf(1.0f, -24));
    assert_true(kvl_f16_to_f32(0x7bff) == 65504.0f);
    assert_true(kvl_f16_to_f32(0x3c00) == 1.0f);
    assert_true(kvl_f16_to_f32(0xc000) == -2.0f);
    assert_true(isinf(kvl_f16_to_f32(0x7c00)) && kvl_f16_to_f32(0x7c00) > 0);
    assert_true(isinf(kvl_f16_to_f32(0xfc00)) && kvl_f16_to_f32(0xfc00) < 0);
    assert_int_equal(fbits(kvl_f16_to_f32(0x8000)), 0x80000000u); /* -0 */
    assert_true(isnan(kvl_f16_to_f32(0x7e00)));
    assert_true(isnan(kvl_f16_to_f32(0x7c01))); /* signalling NaN comes back quiet */
    assert_true(fbits(kvl_f16_to_f32(0x7c01)) & 0x400000);

    /* every half value survives f16 -> f32 -> f16 */
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = kvl_f16_to_f32((uint16_t)h);
        uint16_t back = kvl_f32_to_f16(f);
        if (isnan(f))
            assert_true((back & 0x7c00) == 0x7c00 && (back & 0x3ff));
        else
            assert_int_equal(back, h);
    }
    /* rounding: nearest, ties to even, overflow to inf, underflow to 0 */
    assert_int_equal(kvl_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(kvl_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(kvl_f32_to_f16(-1e9f), 0xfc00);
    assert_int_equal(kvl_f32_to_f16(ldexpf(1.0f, -25)), 0x0000);
    assert_int_equal(kvl_f32_to_f16(nextafterf(ldexpf(1.0f, -25), 1.0f)), 0x0001);
    assert_int_equal(kvl_f32_to_f16(ldexpf(3.0f, -25)), 0x0002);
    assert_int_equal(kvl_f32_to_f16(-ldexpf(1.0f, -30)), 0x8000);
    assert_int_equal(kvl_f32_to_f16(1.0f + ldexpf(1.0f, -11)), 0x3c00);
    assert_int_equal(kvl_f32_to_f16(1.0f + ldexpf(3.0f, -11)), 0x3c02);
    assert_int_equal(kvl_f32_to_f16(ldexpf(2047.0f, -25)), 0x0400); /* rounds up into normal */
    assert_true((kvl_f32_to_f16(NAN) & 0x7c00) == 0x7c00 && (kvl_f32_to_f16(NAN) & 0x3ff));
    assert_int_equal(kvl_f32_to_f16(INFINITY), 0x7c00);
    assert_int_equal(kvl_f32_to_f16(-0.0f), 0x8000);
}

static void test_bf16(void **state) {
    (void)state;
    assert_true(kvl_bf16_to_f32(0x3f80) == 1.0f);
    assert_true(kvl_bf16_to_f32(0x0001) == ldexpf(1.0f, -133)); /* subnormal */
    assert_int_equal(fbits(kvl_bf16_to_f32(0x8000)), 0x80000000u);
    assert_true(isinf(kvl_bf16_to_f32(0xff80)) && kvl_bf16_to_f32(0xff80) < 0);
    assert_true(isnan(kvl_bf16_to_f32(0x7f81)));
    assert_int_equal(fbits(kvl_bf16_to_f32(0x7f81)), 0x7fc10000u); /* quieted, payload kept */
    for (uint32_t b = 0; b < 0x10000; b++) {
        float f = kvl_bf16_to_f32((uint16_t)b);
        uint16_t back = kvl_f32_to_bf16(f);
        if (isnan(f))
            assert_true((back & 0x7f80) == 0x7f80 && (back & 0x7f));
        else
            assert_int_equal(back, b);
    }
    assert_int_equal(kvl_f32_to_bf16(1.0f + ldexpf(1.0f, -8)), 0x3f80);
    assert_int_equal(kvl_f32_to_bf16(1.0f + ldexpf(3.0f, -8)), 0x3f82);
    assert_int_equal(kvl_f32_to_bf16(3.4028235e38f), 0x7f80); /* FLT_MAX rounds to inf */
    assert_true((kvl_f32_to_bf16(NAN) & 0x7f80) == 0x7f80 && (kvl_f32_to_bf16(NAN) & 0x7f));
}

/* ---- parsing ---------------------------------------------------------------------------- */

static void test_parse_valid(void **state) {
    (void)state;
    /* header of odd length: data is unaligned, conversions must still be right */
    const char *json = "{\"__metadata__\":{\"k\":\"v\"},"
                       "\"s\":{\"dtype\":\"I16\",\"shape\":[],\"data_offsets\":[8,10]},"
                       "\"f\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"e\":{\"dtype\":\"BOOL\",\"shape\":[0,3],\"data_offsets\":[4,4]},"
                       "\"b\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[10,11]}}  \n";
    size_t len;
    uint8_t *img = make_image(json, 11, &len);
    float two[2] = {1.5f, -2.25f};
    memcpy(img + len - 11, two, 8);
    img[len - 3] = 0xfe; /* I16 -2, little-endian */
    img[len - 2] = 0xff;
    kvl_safetensors *st = NULL;
    assert_int_equal(kvl_safetensors_parse(img, len, LABEL, &st), KVL_OK);
    assert_int_equal(kvl_safetensors_count(st), 4);
    assert_string_equal(kvl_safetensors_get(st, 0)->name, "s");  /* header order */
    assert_string_equal(kvl_safetensors_get(st, 3)->name, "b");
    assert_string_equal(kvl_safetensors_metadata(st, "k"), "v");
    const kvl_st_tensor *s = kvl_safetensors_find(st, "s");
    assert_int_equal(s->n_dims, 0);
    assert_int_equal(s->n_elements, 1);
    float out[2];
    assert_int_equal(kvl_st_tensor_to_f32(s, out, 1), KVL_OK);
    assert_true(out[0] == -2.0f);
    assert_int_equal(kvl_st_tensor_to_f32(kvl_safetensors_find(st, "f"), out, 2), KVL_OK);
    assert_true(out[0] == 1.5f && out[1] == -2.25f);
    const kvl_st_tensor *e = kvl_safetensors_find(st, "e");
    assert_int_equal(e->n_elements, 0);
    assert_int_equal(e->nbytes, 0);
    assert_int_equal(kvl_st_tensor_to_f32(kvl_safetensors_find(st, "b"), out, 1),
                     KVL_ERR_UNSUPPORTED);
    assert_error_has("'b'");
    kvl_safetensors_close(st);
    free(img);

    /* empty object: a file with no tensors is valid */
    img = make_image("{}", 0, &len);
    assert_int_equal(kvl_safetensors_parse(img, len, LABEL, &st), KVL_OK);
    assert_int_equal(kvl_safetensors_count(st), 0);
    assert_null(kvl_safetensors_find(st, "x"));
    kvl_safetensors_close(st);
    free(img);
    kvl_safetensors_close(NULL);
}

#define T1(body) "{\"w\":{" body "}}"

static void test_parse_malformed(void **state) {
    (void)state;
    kvl_safetensors *st = NULL;
    /* truncated: fewer than 8 bytes */
    assert_int_equal(kvl_safetensors_parse("abc", 3, LABEL, &st), KVL_ERR_FORMAT);
    assert_error_has(LABEL);
    assert_error_has("header length");
    /* header length beyond the file */
    uint8_t big[16] = {0xe8, 0x03};
    assert_int_equal(kvl_safetensors_parse(big, sizeof big, LABEL, &st), KVL_ERR_FORMAT);
    assert_error_has(LABEL);
    assert_error_has("header length");
    uint8_t huge[16] = {0, 0, 0, 0, 0, 0, 0, 0x80};
    assert_int_equal(kvl_safetensors_parse(huge, sizeof huge, LABEL, &st), KVL_ERR_FORMAT);
    assert_error_has("header length");
    /* header length below 2 */
    uint8_t tiny[9] = {1, 0, 0, 0, 0, 0, 0, 0, '{'};
    assert_int_equal(kvl_safetensors_parse(tiny, sizeof tiny, LABEL, &st), KVL_ERR_FORMAT);
    assert_error_has("header length");
    assert_null(st);

    expect_bad("{\"w\": ", 0, KVL_ERR_FORMAT, "header", "invalid JSON");
    expect_bad("{} x", 0, KVL_ERR_FORMAT, "header", "after the JSON");
    expect_bad("[1, 2]", 0, KVL_ERR_FORMAT, "header", "JSON object");
    expect_bad("{\"w\xff\":1}", 0, KVL_ERR_FORMAT, "header", "UTF-8");
    expect_bad("{\"w\":[1]}", 0, KVL_ERR_FORMAT, "'w'", "object");
    expect_bad(T1("\"dtype\":\"F17\",\"shape\":[1],\"data_offsets\":[0,4]"), 4, KVL_ERR_FORMAT,
               "'w'", "dtype");
    expect_bad(T1("\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]"), 4, KVL_ERR_FORMAT, "'w'",
               "dtype");
    expect_bad(T1("\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]"), 8, KVL_ERR_FORMAT,
               "'w'", "data_offsets");
    expect_bad(T1("\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]"), 4, KVL_ERR_FORMAT,
               "'w'", "exceed data buffer of 4 bytes");
    expect_bad(T1("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]"), 8, KVL_ERR_FORMAT,
               "'w'", "data_offsets");
    expect_bad(T1("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]"), 8, KVL_ERR_FORMAT,
               "'w'", "data_offsets");
    expect_bad(T1("\"dtype\":\"F32\",\"shape\":[1]"), 8, KVL_ERR_FORMAT, "'w'", "data_offsets");
    expect_bad(T1("\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]"), 4, KVL_ERR_FORMAT,
               "'w'", "shape");
    expect_bad(T1("\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]"), 4, KVL_ERR_FORMAT,
               "'w'", "shape");
    expect_bad(T1("\"dtype\":\"F32\",\"shape\":\"1\",\"data_offsets\":[0,4]"), 4, KVL_ERR_FORMAT,
               "'w'", "shape");
    expect_bad(T1("\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]"), 4,
               KVL_ERR_FORMAT, "'w'", "shape");
    expect_bad(T1("\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
                  "\"data_offsets\":[0,4]"),
               4, KVL_ERR_FORMAT, "'w'", "overflow");
    expect_bad(T1("\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,4]"), 4,
               KVL_ERR_FORMAT, "'w'", "shape");
    expect_bad(T1("\"dtype\":\"F64\",\"shape\":[4294967296,1073741824],\"data_offsets\":[0,4]"),
               4, KVL_ERR_FORMAT, "'w'", "overflow");
    expect_bad(T1("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,1e300]"), 4,
               KVL_ERR_FORMAT, "'w'", "data_offsets");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
               12, KVL_ERR_FORMAT, "'b'", "overlap tensor 'a'");
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
               "\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]}}",
               4, KVL_ERR_FORMAT, "'a'", "twice");
    expect_bad("{\"__metadata__\":{\"k\":1}}", 0, KVL_ERR_FORMAT, "__metadata__", "'k'");
    expect_bad("{\"__metadata__\":{\"k\":\"v\",\"n\":null}}", 0, KVL_ERR_FORMAT, "__metadata__",
               "'n'");
    expect_bad("{\"__metadata__\":[\"k\"]}", 0, KVL_ERR_FORMAT, "__metadata__", "object");
    expect_bad("{\"__metadata__\":{\"k\":\"1\",\"j\":\"2\",\"k\":\"3\"}}", 0, KVL_ERR_FORMAT,
               "'k'", "appears twice");
    expect_bad("{\"__metadata__\":{},\"__metadata__\":{}}", 0, KVL_ERR_FORMAT, "__metadata__",
               "twice");

    /* embedded NUL in the header */
    size_t len;
    uint8_t *img = make_image("{\"a\":1}", 0, &len);
    img[10] = '\0';
    assert_int_equal(kvl_safetensors_parse(img, len, LABEL, &st), KVL_ERR_FORMAT);
    assert_error_has(LABEL);
    free(img);

    /* bad arguments */
    assert_int_equal(kvl_safetensors_parse(NULL, 4, LABEL, &st), KVL_ERR_INVALID_ARG);
    assert_int_equal(kvl_safetensors_parse("x", 1, LABEL, NULL), KVL_ERR_INVALID_ARG);
}

static void test_open_errors(void **state) {
    (void)state;
    const char *dir = kvl__test_tmpdir();
    assert_non_null(dir);
    char path[4096];
    kvl_safetensors *st = NULL;

    snprintf(path, sizeof path, "%s/truncated.safetensors", dir);
    assert_int_equal(kvl__test_write_file(path, "\x10\0\0", 3), 0);
    assert_int_equal(kvl_safetensors_open(path, &st), KVL_ERR_FORMAT);
    assert_error_has(path);
    assert_error_has("header length");
    remove(path);

    snprintf(path, sizeof path, "%s/empty.safetensors", dir);
    assert_int_equal(kvl__test_write_file(path, "", 0), 0);
    assert_int_equal(kvl_safetensors_open(path, &st), KVL_ERR_FORMAT);
    assert_error_has(path);
    remove(path);

    snprintf(path, sizeof path, "%s/missing.safetensors", dir);
    assert_int_equal(kvl_safetensors_open(path, &st), KVL_ERR_IO);
    assert_error_has(path);
    assert_int_equal(kvl_safetensors_open(dir, &st), KVL_ERR_IO); /* a folder */
    assert_error_has(dir);
    assert_null(st);
    remove(dir);
}

/* ---- writing ---------------------------------------------------------------------------- */

static size_t count_dir_entries(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    size_t n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static void test_write_roundtrip(void **state) {
    (void)state;
    const char *tmp = kvl__test_tmpdir();
    assert_non_null(tmp);
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s", tmp);
    snprintf(path, sizeof path, "%s/out.safetensors", dir);

    float f[6] = {1, -2, 3.5f, 0, -0.0f, 1e-3f};
    uint16_t bf[4] = {0x3f80, 0xc000, 0x7f80, 0x0001};
    int32_t scalar = -7;
    uint16_t h[3] = {0x3c00, 0x0001, 0xfc00};
    kvl_st_write_tensor t[5] = {
        {.name = "w.f32", .dtype = KVL_DTYPE_F32, .n_dims = 2, .shape = {2, 3}, .data = f,
         .nbytes = sizeof f},
        {.name = "w.bf16", .dtype = KVL_DTYPE_BF16, .n_dims = 1, .shape = {4}, .data = bf,
         .nbytes = sizeof bf},
        {.name = "scalar", .dtype = KVL_DTYPE_I32, .n_dims = 0, .data = &scalar, .nbytes = 4},
        {.name = "empty", .dtype = KVL_DTYPE_U8, .n_dims = 1, .shape = {0}, .data = NULL,
         .nbytes = 0},
        {.name = "q\"uo\\te/\xc3\xa9\n", .dtype = KVL_DTYPE_F16, .n_dims = 1, .shape = {3},
         .data = h, .nbytes = sizeof h},
    };
    const char *keys[2] = {"format", "note"};
    const char *vals[2] = {"pt", "line1\nline2 \"q\" \xe2\x82\xac"};
    assert_int_equal(kvl_safetensors_write(path, t, 5, keys, vals, 2), KVL_OK);
    assert_int_equal(count_dir_entries(dir), 1); /* no temporary file left behind */

    size_t len;
    char *raw = kvl__test_read_file(path, &len);
    assert_non_null(raw);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | (uint8_t)raw[i];
    assert_int_equal((8 + hlen) % 8, 0); /* data starts 8-byte aligned */
    free(raw);

    kvl_safetensors *st = NULL;
    assert_int_equal(kvl_safetensors_open(path, &st), KVL_OK);
    assert_int_equal(kvl_safetensors_count(st), 5);
    for (int i = 0; i < 5; i++) {
        const kvl_st_tensor *r = kvl_safetensors_get(st, (size_t)i);
        assert_string_equal(r->name, t[i].name);
        assert_int_equal(r->dtype, t[i].dtype);
        assert_int_equal(r->n_dims, t[i].n_dims);
        for (int d = 0; d < r->n_dims; d++)
            assert_int_equal(r->shape[d], t[i].shape[d]);
        assert_int_equal(r->nbytes, t[i].nbytes);
        if (r->nbytes)
            assert_memory_equal(r->data, t[i].data, r->nbytes);
    }
    assert_string_equal(kvl_safetensors_metadata(st, "format"), "pt");
    assert_string_equal(kvl_safetensors_metadata(st, "note"), vals[1]);
    float out[4];
    assert_int_equal(kvl_st_tensor_to_f32(kvl_safetensors_get(st, 1), out, 4), KVL_OK);
    assert_true(out[0] == 1.0f && out[1] == -2.0f && isinf(out[2]));
    assert_int_equal(kvl_st_tensor_to_f32(kvl_safetensors_get(st, 4), out, 3), KVL_OK);
    assert_true(out[0] == 1.0f && out[1] == ldexpf(1.0f, -24) && isinf(out[2]) && out[2] < 0);
    kvl_safetensors_close(st);

    /* overwrite in place with no metadata */
    assert_int_equal(kvl_safetensors_write(path, t, 1, NULL, NULL, 0), KVL_OK);
    assert_int_equal(kvl_safetensors_open(path, &st), KVL_OK);
    assert_int_equal(kvl_safetensors_count(st), 1);
    assert_null(kvl_safetensors_metadata(st, "format"));
    kvl_safetensors_close(st);

    /* argument errors */
    kvl_st_write_tensor dup[2] = {t[0], t[0]};
    assert_int_equal(kvl_safetensors_write(path, dup, 2, NULL, NULL, 0), KVL_ERR_INVALID_ARG);
    assert_error_has("w.f32");
    kvl_st_write_tensor bad = t[0];
    bad.nbytes = 20;
    assert_int_equal(kvl_safetensors_write(path, &bad, 1, NULL, NULL, 0), KVL_ERR_INVALID_ARG);
    assert_error_has("w.f32");
    bad = t[0];
    bad.name = "__metadata__";
    assert_int_equal(kvl_safetensors_write(path, &bad, 1, NULL, NULL, 0), KVL_ERR_INVALID_ARG);
    const char *dk[2] = {"a", "a"};
    assert_int_equal(kvl_safetensors_write(path, t, 1, dk, dk, 2), KVL_ERR_INVALID_ARG);
    assert_error_has("'a'");
    char nodir[4300];
    snprintf(nodir, sizeof nodir, "%s/no/such/dir/x.safetensors", dir);
    assert_int_equal(kvl_safetensors_write(nodir, t, 1, NULL, NULL, 0), KVL_ERR_IO);
    assert_error_has(nodir);

    remove(path);
    remove(dir);
}

/* ---- sharded sets ----------------------------------------------------------------------- */

static void write_index(const char *dir, const char *json) {
    char p[4200];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    assert_int_equal(kvl__test_write_file(p, json, strlen(json)), 0);
}

static void test_sharded(void **state) {
    (void)state;
    const char *tmp = kvl__test_tmpdir();
    assert_non_null(tmp);
    char dir[4096], p1[4200], p2[4200], p[4200];
    snprintf(dir, sizeof dir, "%s", tmp);
    snprintf(p1, sizeof p1, "%s/model-00001-of-00002.safetensors", dir);
    snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", dir);

    kvl_st_set *set = NULL;
    assert_int_equal(kvl_st_set_open_dir(dir, &set), KVL_ERR_NOT_FOUND);
    assert_error_has(dir);
    assert_null(set);

    float a[2] = {1, 2}, b[3] = {3, 4, 5}, c[1] = {6};
    kvl_st_write_tensor s1[2] = {
        {.name = "a", .dtype = KVL_DTYPE_F32, .n_dims = 1, .shape = {2}, .data = a, .nbytes = 8},
        {.name = "b", .dtype = KVL_DTYPE_F32, .n_dims = 1, .shape = {3}, .data = b, .nbytes = 12},
    };
    kvl_st_write_tensor s2[1] = {
        {.name = "c", .dtype = KVL_DTYPE_F32, .n_dims = 1, .shape = {1}, .data = c, .nbytes = 4},
    };
    assert_int_equal(kvl_safetensors_write(p1, s1, 2, NULL, NULL, 0), KVL_OK);
    assert_int_equal(kvl_safetensors_write(p2, s2, 1, NULL, NULL, 0), KVL_OK);
    write_index(dir, "{\"metadata\":{\"total_size\":24},\"weight_map\":{"
                     "\"c\":\"model-00002-of-00002.safetensors\","
                     "\"a\":\"model-00001-of-00002.safetensors\","
                     "\"b\":\"model-00001-of-00002.safetensors\"}}");
    assert_int_equal(kvl_st_set_open_dir(dir, &set), KVL_OK);
    assert_int_equal(kvl_st_set_num_files(set), 2);
    assert_int_equal(kvl_st_set_num_tensors(set), 3);
    const char *file = NULL;
    const kvl_st_tensor *t = kvl_st_set_find(set, "c", &file);
    assert_non_null(t);
    assert_string_equal(file, p2);
    assert_true(((const float *)t->data)[0] == 6.0f);
    assert_null(kvl_st_set_find(set, "zz", NULL));
    const char *names[3] = {"a", "b", "c"};
    for (size_t i = 0; i < 3; i++) {
        t = kvl_st_set_get(set, i, &file);
        assert_non_null(t);
        assert_string_equal(t->name, names[i]);
        assert_string_equal(file, i < 2 ? p1 : p2);
    }
    assert_null(kvl_st_set_get(set, 3, NULL));
    kvl_st_set_free(set);

    /* index names a shard that does not exist */
    write_index(dir, "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                     "\"x\":\"model-00003-of-00003.safetensors\"}}");
    set = (kvl_st_set *)0x1;
    assert_int_equal(kvl_st_set_open_dir(dir, &set), KVL_ERR_NOT_FOUND);
    assert_null(set);
    assert_error_has("model-00003-of-00003.safetensors");
    assert_error_has("'x'");

    /* index maps a tensor to a shard that does not hold it */
    write_index(dir, "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                     "\"c\":\"model-00001-of-00002.safetensors\"}}");
    assert_int_equal(kvl_st_set_open_dir(dir, &set), KVL_ERR_FORMAT);
    assert_error_has("'c'");
    assert_error_has("model-00001-of-00002.safetensors");

    /* index escaping the folder */
    write_index(dir, "{\"weight_map\":{\"a\":\"../model-00001-of-00002.safetensors\"}}");
    assert_int_equal(kvl_st_set_open_dir(dir, &set), KVL_ERR_FORMAT);
    assert_error_has("'a'");

    /* a tensor present in two shards */
    assert_int_equal(kvl_safetensors_write(p2, s1, 1, NULL, NULL, 0), KVL_OK);
    write_index(dir, "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                     "\"b\":\"model-00002-of-00002.safetensors\"}}");
    assert_int_equal(kvl_st_set_open_dir(dir, &set), KVL_ERR_FORMAT);
    assert_error_has("'a'");
    assert_error_has("two shards");

    /* bad index JSON */
    write_index(dir, "{\"weight_map\":");
    assert_int_equal(kvl_st_set_open_dir(dir, &set), KVL_ERR_FORMAT);
    assert_error_has("model.safetensors.index.json");

    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    remove(p);
    remove(p1);
    remove(p2);
    remove(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_models),         cmocka_unit_test(test_golden),
        cmocka_unit_test(test_f16),            cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_parse_valid),    cmocka_unit_test(test_parse_malformed),
        cmocka_unit_test(test_open_errors),    cmocka_unit_test(test_write_roundtrip),
        cmocka_unit_test(test_sharded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
