/* tests/router/turn_ref.c: in-process reference of a routed session, for the end-to-end test
 * "each turn's output is identical (greedy) to an in-process run of the same steps".
 *
 * It replays, with the library API only, what the nodes do for the router: one KV cache per
 * model; a turn on model T first (translate mode) translates the span [len(cache T),
 * len(cache S)) of the previous model S's cache into T's cache with the S->T translator, then
 * prefills natively whatever of the ledger T's cache lacks plus the turn's input, then decodes
 * greedily max_tokens tokens (the last sampled token is not fed, as on a node).
 *
 *   turn_ref STEPS_FILE
 *   STEPS_FILE lines:
 *     model NAME DIR                       declare a model
 *     translator SRC DST FILE              declare a translator
 *     turn NAME MODE MAX_TOKENS ID,ID,...  MODE: none | translate | reprefill
 *   Output: one line per turn: the generated ids, space separated.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvlingo/cache.h"
#include "kvlingo/model.h"
#include "kvlingo/translator.h"

#define MAXM 4
#define MAXT 8
#define MAXCTX 8192

static void die(const char *what) {
    fprintf(stderr, "turn_ref: %s: %s\n", what, kvl_last_error());
    exit(1);
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: turn_ref STEPS_FILE\n"); return 2; }
    FILE *f = fopen(argv[1], "r");
    if (!f) { perror(argv[1]); return 1; }
    char names[MAXM][64];
    kvl_model *models[MAXM];
    kvl_cache *caches[MAXM];
    int nm = 0;
    char trs[MAXT][2][64];
    kvl_translator *tr[MAXT];
    int nt = 0;
    int32_t *ledger = malloc(sizeof(int32_t) * MAXCTX);
    int n_ledger = 0, prev = -1;
    static char line[1 << 18];
    while (fgets(line, sizeof line, f)) {
        char kind[32], a[512], b[512], c[512];
        if (sscanf(line, "%31s", kind) != 1) continue;
        if (!strcmp(kind, "model") && sscanf(line, "%*s %63s %511s", a, b) == 2 && nm < MAXM) {
            kvl_model_params mp = kvl_model_default_params();
            if (kvl_model_load(b, &mp, &models[nm])) die(b);
            kvl_cache_params cp = kvl_cache_default_params();
            cp.max_tokens = MAXCTX;
            if (kvl_cache_create(kvl_model_config_get(models[nm]), &cp, &caches[nm])) die("cache");
            snprintf(names[nm++], 64, "%s", a);
        } else if (!strcmp(kind, "translator") && sscanf(line, "%*s %63s %63s %511s", a, b, c) == 3 && nt < MAXT) {
            if (kvl_translator_load(c, &tr[nt])) die(c);
            snprintf(trs[nt][0], 64, "%s", a);
            snprintf(trs[nt][1], 64, "%s", b);
            nt++;
        } else if (!strcmp(kind, "turn")) {
            int max_tokens = 0;
            char ids[1 << 17] = "";
            if (sscanf(line, "%*s %63s %31s %d %131071s", a, b, &max_tokens, ids) < 3) die("turn line");
            int m = -1;
            for (int i = 0; i < nm; i++) if (!strcmp(names[i], a)) m = i;
            if (m < 0) { fprintf(stderr, "turn_ref: unknown model %s\n", a); return 1; }
            for (char *p = strtok(ids, ","); p; p = strtok(NULL, ",")) ledger[n_ledger++] = atoi(p);
            kvl_cache *cache = caches[m];
            if (!strcmp(b, "translate")) {
                if (prev < 0 || prev == m) { fprintf(stderr, "turn_ref: translate without a source\n"); return 1; }
                int t = -1;
                for (int i = 0; i < nt; i++)
                    if (!strcmp(trs[i][0], names[prev]) && !strcmp(trs[i][1], names[m])) t = i;
                if (t < 0) { fprintf(stderr, "turn_ref: no translator %s->%s\n", names[prev], names[m]); return 1; }
                int from = kvl_cache_n_tokens(cache), to = kvl_cache_n_tokens(caches[prev]);
                if (kvl_translator_translate_span(tr[t], caches[prev], from, to, cache)) die("translate");
            }
            int have = kvl_cache_n_tokens(cache);
            int vocab = kvl_model_config_get(models[m])->vocab_size;
            float *logits = malloc(sizeof(float) * (size_t)vocab);
            if (kvl_model_prefill(models[m], cache, ledger + have, n_ledger - have, KVL_LOGITS_LAST, logits)) die("prefill");
            for (int k = 0; k < max_tokens; k++) {
                int best = 0;
                for (int v = 1; v < vocab; v++) if (logits[v] > logits[best]) best = v;
                printf("%s%d", k ? " " : "", best);
                ledger[n_ledger++] = best;
                if (k + 1 < max_tokens && kvl_model_decode(models[m], cache, best, logits)) die("decode");
            }
            printf("\n");
            fflush(stdout);
            free(logits);
            prev = m;
        }
    }
    fclose(f);
    for (int i = 0; i < nm; i++) { kvl_cache_free(caches[i]); kvl_model_free(models[i]); }
    for (int i = 0; i < nt; i++) kvl_translator_free(tr[i]);
    free(ledger);
    return 0;
}
