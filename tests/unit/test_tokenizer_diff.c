/* tests/unit/test_tokenizer_diff.c: differential test against Hugging Face `tokenizers`.
 *
 * tests/tokenizer/hf_reference.py (python3 + the PyPI package `tokenizers`) generates 5,000 seeded
 * random strings per vocabulary (shipped models, Qwen3, Llama 3) with the reference ids, decode
 * and expected round trip; this program encodes the same strings with kvlingo and requires:
 * identical ids, decode identical to tokenizers' decode, and decode(encode(s)) == NFC(s) (== s for
 * Llama 3, which has no normalizer).  Exit 77 (CTest: skipped) when `tokenizers` is not installed.
 * KVL_TOKDIFF_N overrides the number of strings per vocabulary. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "kvlingo/tokenizer.h"
#include "testutil.h"

static char g_json[4096];

static void show(const char *label, const char *s) {
    printf("    %s: \"", label);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p < 0x20 || *p == '"' || *p == '\\') printf("\\x%02x", *p);
        else putchar(*p);
    }
    printf("\"\n");
}

static void test_diff(void **state) {
    (void)state;
    size_t len;
    char *text = kvl__test_read_file(g_json, &len);
    assert_non_null(text);
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    assert_non_null(root);
    const cJSON *ver = cJSON_GetObjectItem(root, "tokenizers_version");
    printf("reference: tokenizers %s\n", cJSON_IsString(ver) ? ver->valuestring : "?");
    size_t total_bad = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, cJSON_GetObjectItem(root, "vocabs")) {
        const char *name = cJSON_GetObjectItem(v, "name")->valuestring;
        const char *path = cJSON_GetObjectItem(v, "path")->valuestring;
        kvl_tokenizer *tok = NULL;
        /* the fixture is named relative to the source tree; the real tokenizers by the
         * absolute path of their unpacked copy in the build tree */
        kvl_status st = kvl_tokenizer_load(path[0] == '/' ? path : kvl__test_path(path), &tok);
        if (st) printf("%s: %s\n", path, kvl_last_error());
        assert_int_equal(st, KVL_OK);
        size_t n = 0, bad_ids = 0, bad_dec = 0, bad_rt = 0;
        const cJSON *c;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(v, "cases")) {
            n++;
            const char *s = cJSON_GetObjectItem(c, "text")->valuestring;
            const cJSON *ids = cJSON_GetObjectItem(c, "ids");
            int32_t *got = NULL;
            size_t ng = 0;
            st = kvl_tokenizer_encode(tok, s, strlen(s), &got, &ng);
            int same = st == KVL_OK && ng == (size_t)cJSON_GetArraySize(ids);
            size_t k = 0;
            const cJSON *e;
            cJSON_ArrayForEach(e, ids) {
                if (!same) break;
                if (got[k++] != e->valueint) same = 0;
            }
            if (!same) {
                if (bad_ids++ < 5) {
                    printf("  %s: ids differ (status %d)\n", name, st);
                    show("text", s);
                    printf("    kvlingo:");
                    for (size_t i = 0; i < ng; i++) printf(" %d", got[i]);
                    printf("\n    tokenizers:");
                    cJSON_ArrayForEach(e, ids) printf(" %d", e->valueint);
                    printf("\n");
                }
            }
            char *dec = NULL;
            size_t dl;
            if (st == KVL_OK && kvl_tokenizer_decode(tok, got, ng, &dec, &dl) == KVL_OK) {
                if (strcmp(dec, cJSON_GetObjectItem(c, "hf_decoded")->valuestring)) {
                    if (bad_dec++ < 3) { printf("  %s: decode differs from tokenizers'\n", name); show("text", s); show("kvlingo", dec); }
                }
                if (strcmp(dec, cJSON_GetObjectItem(c, "roundtrip")->valuestring)) {
                    if (bad_rt++ < 3) { printf("  %s: decode(encode(s)) != NFC(s)\n", name); show("text", s); show("decoded", dec); }
                }
            } else {
                bad_dec++;
            }
            free(dec);
            free(got);
        }
        printf("%-8s %6zu strings: %zu id mismatches, %zu decode mismatches, %zu round-trip mismatches\n", name, n,
               bad_ids, bad_dec, bad_rt);
        total_bad += bad_ids + bad_dec + bad_rt;
        kvl_tokenizer_free(tok);
    }
    cJSON_Delete(root);
    assert_int_equal(total_bad, 0);
}

int main(void) {
    const char *n = getenv("KVL_TOKDIFF_N");
    /* KVL_PYTHON: the interpreter that has `tokenizers` (scripts/test.sh sets up a venv) */
    const char *py = getenv("KVL_PYTHON");
    if (!py || !*py) py = "python3";
    snprintf(g_json, sizeof g_json, "%s/tokenizer_diff.json", KVL_BINARY_DIR);
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && '%s' tests/tokenizer/hf_reference.py --out '%s' --n %s "
             "fixture=models/qwen3-a/tokenizer.json qwen3='%s/testdata/tokenizers/qwen3/tokenizer.json' "
             "llama3='%s/testdata/tokenizers/llama3/tokenizer.json'",
             KVL_SOURCE_DIR, py, g_json, n && *n ? n : "5000", KVL_BINARY_DIR, KVL_BINARY_DIR);
    fflush(stdout);
    int rc = system(cmd);
    if (rc == -1 || !WIFEXITED(rc)) {
        printf("FAILED to run python3 tests/tokenizer/hf_reference.py\n");
        return 1;
    }
    if (WEXITSTATUS(rc) == 77) {
        printf("SKIPPED: Hugging Face tokenizers is not installed (pip install tokenizers)\n");
        return 77;
    }
    if (WEXITSTATUS(rc) != 0) {
        printf("FAILED: hf_reference.py exited with %d\n", WEXITSTATUS(rc));
        return 1;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_diff)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
