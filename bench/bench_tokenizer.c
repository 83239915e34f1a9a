/* bench/bench_tokenizer.c: tokenizer load time and single-thread encode throughput.
 *
 * usage: bench_tokenizer [TOKENIZER_JSON [CORPUS]]   (run from the source root; defaults: the
 *        real Qwen3 tokenizer.json the build unpacks into BUILD/testdata/tokenizers/qwen3/, and
 *        testdata/corpus/valid.txt)
 * Encodes the corpus line by line (documents as the perplexity evaluation does) with a cold and a
 * warm pre-token cache, best of 3 runs.  When python3 can import Hugging Face `tokenizers`, runs
 * bench/bench_tokenizer_hf.py on the same inputs and prints both in one table. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "file.h"
#include "kvlingo/tokenizer.h"



/* Encode every line; returns the token count or -1. */
static long encode_lines(const kvl_tokenizer *tok, const char *text, size_t len) {
    long total = 0;
    size_t i = 0;
    while (i < len) {
        const char *nl = memchr(text + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - text) + 1 : len;
        int32_t *ids;
        size_t n;
        if (kvl_tokenizer_encode(tok, text + i, e - i, &ids, &n)) return -1;
        total += (long)n;
        free(ids);
        i = e;
    }
    return total;
}

int main(int argc, char **argv) {
    const char *tj = argc > 1 ? argv[1] : KVL_DEFAULT_TOKENIZER;
    const char *corpus = argc > 2 ? argv[2] : "testdata/corpus/valid.txt";
    size_t len;
    char *text = NULL;
    if (kvl__file_read(corpus, 0, 0, &text, &len) != KVL_OK) text = NULL;
    if (!text) { fprintf(stderr, "cannot read %s\n", corpus); return 1; }

    double best_load = 1e9;
    kvl_tokenizer *tok = NULL;
    for (int r = 0; r < 3; r++) {
        double t0 = kvl__now_s();
        if (kvl_tokenizer_load(tj, &tok)) { fprintf(stderr, "%s\n", kvl_last_error()); return 1; }
        double dt = kvl__now_s() - t0;
        if (dt < best_load) best_load = dt;
        if (r < 2) kvl_tokenizer_free(tok);
    }
    /* cold: a fresh tokenizer (empty cache) */
    double t0 = kvl__now_s();
    long ntok = encode_lines(tok, text, len);
    double cold = kvl__now_s() - t0;
    if (ntok < 0) { fprintf(stderr, "encode: %s\n", kvl_last_error()); return 1; }
    double warm = 1e9;
    for (int r = 0; r < 3; r++) {
        t0 = kvl__now_s();
        encode_lines(tok, text, len);
        double dt = kvl__now_s() - t0;
        if (dt < warm) warm = dt;
    }
    double mb = len / 1e6;
    printf("tokenizer %s, corpus %s (%.2f MB, %ld tokens), one thread\n", tj, corpus, mb, ntok);
    printf("| implementation            | load ms | encode MB/s (cold) | encode MB/s (warm) |\n");
    printf("|---------------------------|---------|--------------------|--------------------|\n");
    printf("| kvlingo                   | %7.1f | %18.2f | %18.2f |\n", best_load * 1e3, mb / cold, mb / warm);
    fflush(stdout);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "python3 bench/bench_tokenizer_hf.py --table-row '%s' '%s' 2>/dev/null", tj, corpus);
    int rc = system(cmd);
    if (rc != 0)
        printf("| Hugging Face tokenizers   | (not installed: pip install tokenizers)                   |\n");
    printf("goals: load < 300 ms; encode >= Hugging Face tokenizers on one thread\n");
    kvl_tokenizer_free(tok);
    free(text);
    return 0;
}
