/* engine/translator/translator_import.c: kvl_translator_import_plain, a translator of the plain
 * layout (per-layer k/v maps and a layer_map metadata key, as other tools write them) read into
 * a kvlingo translator of the pair. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "kvlingo/safetensors.h"
#include "kvlingo/translator_train.h"
#include "model_iface.h"
#include "translator_internal.h"

/* One source layer per target layer ("0,1,2", "[0, 1, 2]", " 0 1 2") or several: "[[0, 1], [1, 2]]"
 * or "0+1,1+2" (every entry the same number of taps, ascending).  map: [Lt][KVL_TR_PLAIN_TAPS_MAX];
 * *taps receives the count. */
#define KVL_TR_PLAIN_TAPS_MAX 64
static kvl_status parse_plain_layer_map(const char *path, const char *v, int Ls, int Lt, int *map,
                                        int *taps) {
    const char *p = v;
    *taps = 0;
    while (*p == ' ') p++;
    int outer = *p == '[';
    if (outer) p++;
    for (int l = 0; l < Lt; l++) {
        while (*p == ' ' || *p == ',') p++;
        int nested = *p == '[', k = 0;
        if (nested) p++;
        for (;;) {
            while (*p == ' ' || (nested && *p == ',')) p++;
            if (nested && *p == ']') { p++; break; }
            char *end;
            long x = strtol(p, &end, 10);
            if (end == p || x < 0 || x >= Ls || k >= KVL_TR_PLAIN_TAPS_MAX ||
                (k && x <= map[l * KVL_TR_PLAIN_TAPS_MAX + k - 1]))
                return kvl__errorf(KVL_ERR_FORMAT, "%s: metadata 'layer_map' = \"%s\": entry %d is not a "
                                  "list of ascending source layers in [0, %d) (the target has %d layers)",
                                  path, v, l, Ls, Lt);
            map[l * KVL_TR_PLAIN_TAPS_MAX + k++] = (int)x;
            p = end;
            while (*p == ' ') p++;
            if (!nested && *p == '+') { p++; continue; }
            if (!nested) break;
        }
        if (*taps == 0) *taps = k;
        if (k != *taps)
            return kvl__errorf(KVL_ERR_FORMAT, "%s: metadata 'layer_map' = \"%s\": entry %d has %d source "
                              "layers, entry 0 has %d (every target layer reads the same number)",
                              path, v, l, k, *taps);
    }
    while (*p == ' ' || *p == ']') p++;
    if (*p)
        return kvl__errorf(KVL_ERR_FORMAT, "%s: metadata 'layer_map' = \"%s\" lists more than the "
                          "target's %d layers", path, v, Lt);
    return KVL_OK;
}

kvl_status kvl_translator_import_plain(const char *path, const kvl_model *src, const kvl_model *dst,
                                       kvl_translator **out) {
    if (!path || !src || !dst || !out)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "translator import: NULL argument");
    kvl_safetensors *st = NULL;
    kvl_status s = kvl_safetensors_open(path, &st);
    if (s != KVL_OK) return s;
    const kvl_model_config *a = kvl_model_config_get(src), *b = kvl_model_config_get(dst);
    int *map = calloc((size_t)b->n_layers * KVL_TR_PLAIN_TAPS_MAX, sizeof(int)), taps = 1;
    kvl_translator *tr = NULL;
    const char *mv = kvl_safetensors_metadata(st, "layer_map");
    if (!map) s = kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    else if (kvl_safetensors_metadata(st, "format"))
        s = kvl__errorf(KVL_ERR_FORMAT, "%s: has a 'format' metadata key (\"%s\"): not a plain-layout "
                       "file (a kvlingo translator loads as it is)", path, kvl_safetensors_metadata(st, "format"));
    else if (!mv)
        s = kvl__errorf(KVL_ERR_FORMAT, "%s: metadata key 'layer_map' is missing (the plain layout names "
                       "the source layer of each of the target's %d layers)", path, b->n_layers);
    else
        s = parse_plain_layer_map(path, mv, a->n_layers, b->n_layers, map, &taps);
    for (int l = 0; s == KVL_OK && l < b->n_layers; l++)   /* compact [Lt][MAX] to [Lt][taps] */
        memmove(map + (size_t)l * taps, map + (size_t)l * KVL_TR_PLAIN_TAPS_MAX, sizeof(int) * (size_t)taps);
    for (int l = 0; s == KVL_OK && l < b->n_layers + 1; l++) {   /* no tensor past the target's depth */
        char name[64];
        snprintf(name, sizeof name, "layers.%d.k.weight", l);
        if (l == b->n_layers && kvl_safetensors_find(st, name))
            s = kvl__errorf(KVL_ERR_MISMATCH, "%s: tensor '%s' exists but target model '%s' has %d layers",
                           path, name, kvl_model_name(dst), b->n_layers);
    }
    /* k_norm comes from the target model (kvl_translator_create copies it); the maps from the file,
     * each checked against [Ht*Dt, Hs*Ds] of the two models */
    if (s == KVL_OK) s = kvl_translator_create_taps(src, dst, taps, map, &tr);
    for (int l = 0; s == KVL_OK && l < b->n_layers; l++) {
        char name[64];
        snprintf(name, sizeof name, "layers.%d.k.weight", l);
        s = kvl__tr_load_tensor(st, path, name, 2, kvl__tr_dt(tr), kvl__tr_din(tr), kvl_translator_wk(tr, l));
        snprintf(name, sizeof name, "layers.%d.v.weight", l);
        if (s == KVL_OK) s = kvl__tr_load_tensor(st, path, name, 2, kvl__tr_dt(tr), kvl__tr_din(tr), kvl_translator_wv(tr, l));
    }
    if (s == KVL_OK) s = kvl_translator_set_meta(tr, "imported_from", path);
    if (s == KVL_OK) s = kvl_translator_set_meta(tr, "created_by", "kvlingo translator import --layout plain");
    kvl_safetensors_close(st);
    free(map);
    if (s != KVL_OK) {
        kvl_translator_free(tr);
        return s;
    }
    *out = tr;
    return KVL_OK;
}
