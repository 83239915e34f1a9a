/* tests/router/make_translator.c: test helper: fit a stage-1 (ridge) translator SRC -> DST on a
 * slice of a text file, so router tests can run real translated switches without waiting for
 * trained translators.  Not a training tool (see `kvlingo translator train` for that).
 *
 *   make_translator SRC_DIR DST_DIR TEXT_FILE OUT.safetensors [TRAIN_TOKENS]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "file.h"
#include "kvlingo/model.h"
#include "kvlingo/safetensors.h"
#include "kvlingo/tokenizer.h"
#include "kvlingo/translator_train.h"


int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: make_translator SRC_DIR DST_DIR TEXT_FILE OUT.safetensors [TRAIN_TOKENS]\n");
        return 2;
    }
    long train = argc > 5 ? atol(argv[5]) : 16384;
    kvl_model_params mp = kvl_model_default_params();
    kvl_model *src = NULL, *dst = NULL;
    kvl_tokenizer *tok = NULL;
    kvl_translator *tr = NULL;
    int32_t *ids = NULL;
    size_t n = 0, len = 0;
    char *text = NULL;
    if (kvl__file_read(argv[3], 0, 0, &text, &len) != KVL_OK) text = NULL;
    kvl_status s = text ? KVL_OK : KVL_ERR_IO;
    if (!s) s = kvl_model_load(argv[1], &mp, &src);
    if (!s) s = kvl_model_load(argv[2], &mp, &dst);
    if (!s) s = kvl_tokenizer_load_dir(argv[1], &tok);
    if (!s) s = kvl_tokenizer_encode(tok, text, len, &ids, &n);
    if (!s) s = kvl_translator_create(src, dst, NULL, &tr);
    kvl_ridge_params rp = kvl_ridge_default_params();
    rp.train_tokens = train;
    rp.heldout_tokens = train / 4;
    rp.window = 256;
    if (!s) s = kvl_translator_fit_ridge(tr, src, dst, ids, n, &rp);
    if (!s) s = kvl_translator_set_meta(tr, "training", "{\"stage\":\"ridge\",\"purpose\":\"router tests\"}");
    if (!s) s = kvl_translator_save(tr, argv[4], KVL_DTYPE_F32);
    if (s) fprintf(stderr, "make_translator: %s: %s\n", kvl_strerror(s), kvl_last_error());
    else printf("make_translator: wrote %s (%s -> %s)\n", argv[4], kvl_model_name(src), kvl_model_name(dst));
    kvl_translator_free(tr);
    free(ids);
    free(text);
    kvl_tokenizer_free(tok);
    kvl_model_free(src);
    kvl_model_free(dst);
    return s ? 1 : 0;
}
