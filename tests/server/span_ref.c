/* tests/server/span_ref.c: the in-process reference for the integration test.  It replays, with
 * the library API only, what two kvld nodes do in the test scenario and prints the next-token
 * log-distributions the nodes must reproduce:
 *   1. A prefills prompt [0, N); the span [0, N) is translated into B (trAB); B re-reads token
 *      N-1 natively -> distribution 1 (B's first Generate step).
 *   2. B decodes the K generated tokens (given); the span [N, N+K) of B is translated into A,
 *      which holds [0, N) natively (trBA); A re-reads token N+K-1 natively -> distribution 2.
 * usage: span_ref MODEL_A MODEL_B TR_AB TR_BA IDS_FILE OUT_FILE
 *   IDS_FILE: line 1 the N prompt ids, line 2 the K generated ids (space separated)
 *   OUT_FILE: two lines of `vocab` log-probabilities (%.9g). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvlingo/cache.h"
#include "kvlingo/model.h"
#include "kvlingo/status.h"
#include "kvlingo/translator.h"

#define CHECK(x)                                                                          \
    do {                                                                                  \
        kvl_status s_ = (x);                                                              \
        if (s_ != KVL_OK) {                                                               \
            fprintf(stderr, "span_ref: %s failed: %s\n", #x, kvl_last_error());          \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

static int read_line_ids(FILE *f, int32_t *ids, int cap) {
    char line[1 << 16];
    if (!fgets(line, sizeof line, f)) return 0;
    int n = 0;
    for (char *p = strtok(line, " \n"); p && n < cap; p = strtok(NULL, " \n")) ids[n++] = atoi(p);
    return n;
}

static void write_logprobs(FILE *f, const float *logits, int vocab) {
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < vocab; i++) mx = fmax(mx, logits[i]);
    for (int i = 0; i < vocab; i++) sum += exp((double)logits[i] - mx);
    double lse = mx + log(sum);
    for (int i = 0; i < vocab; i++)
        fprintf(f, i ? " %.9g" : "%.9g", (double)(float)((double)logits[i] - lse));
    fputc('\n', f);
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: span_ref MODEL_A MODEL_B TR_AB TR_BA IDS_FILE OUT_FILE\n");
        return 2;
    }
    kvl_model *a, *b;
    kvl_translator *tab, *tba;
    CHECK(kvl_model_load(argv[1], NULL, &a));
    CHECK(kvl_model_load(argv[2], NULL, &b));
    CHECK(kvl_translator_load(argv[3], &tab));
    CHECK(kvl_translator_load(argv[4], &tba));
    CHECK(kvl_translator_check(tab, a, b));
    CHECK(kvl_translator_check(tba, b, a));
    FILE *f = fopen(argv[5], "r");
    if (!f) return 1;
    static int32_t prompt[8192], gen[8192];
    int n = read_line_ids(f, prompt, 8192), k = read_line_ids(f, gen, 8192);
    fclose(f);
    if (n < 2 || k < 1) return 1;
    const kvl_model_config *ca = kvl_model_config_get(a), *cb = kvl_model_config_get(b);
    int vocab = cb->vocab_size;
    float *logits = malloc(sizeof(float) * (size_t)vocab);
    kvl_cache *A, *B;
    kvl_cache_params cp = kvl_cache_default_params();
    cp.max_tokens = 4096;
    CHECK(kvl_cache_create(ca, &cp, &A));
    CHECK(kvl_cache_create(cb, &cp, &B));
    FILE *out = fopen(argv[6], "w");
    if (!out) return 1;
    /* 1: A native [0, N) -> B; B re-reads token N-1 */
    CHECK(kvl_model_prefill(a, A, prompt, n, KVL_LOGITS_NONE, NULL));
    CHECK(kvl_translator_translate_span(tab, A, 0, n, B));
    CHECK(kvl_cache_truncate(B, n - 1));
    CHECK(kvl_model_decode(b, B, prompt[n - 1], logits));
    write_logprobs(out, logits, vocab);
    /* 2: B decodes the generated tokens, ships [N, N+K) back to A */
    for (int i = 0; i < k; i++) CHECK(kvl_model_decode(b, B, gen[i], logits));
    CHECK(kvl_translator_translate_span(tba, B, n, n + k, A));
    CHECK(kvl_cache_truncate(A, n + k - 1));
    CHECK(kvl_model_decode(a, A, gen[k - 1], logits));
    write_logprobs(out, logits, ca->vocab_size);
    fclose(out);
    kvl_cache_free(A);
    kvl_cache_free(B);
    kvl_translator_free(tab);
    kvl_translator_free(tba);
    kvl_model_free(a);
    kvl_model_free(b);
    free(logits);
    return 0;
}
