/* engine/translator/translator.c: the translator file (load, validate, save), metadata, pair check, and
 * apply (the method: include/kvlingo/translator.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "error.h"
#include "kvlingo/safetensors.h"
#include "kvlingo/translator_train.h"
#include "kvlingo/backend.h"
#include "model_iface.h"
#include "translator_internal.h"

#define KVL_TR_FORMAT "kvlingo-translator-1"

int kvl__tr_default_source_layer(int l, int Ls, int Lt) {
    if (Lt <= 1) return 0;
    /* round half away from zero, as Python's round() differs only on exact .5 ties, which the
     * shipped geometries avoid; the file records the map, so readers never recompute it */
    double x = (double)l * (Ls - 1) / (Lt - 1);
    int s = (int)floor(x + 0.5);
    return s < 0 ? 0 : (s >= Ls ? Ls - 1 : s);
}

void kvl__tr_default_sources(int l, int Ls, int Lt, int T, int *out) {
    if (T > Ls) T = Ls;
    double x = Lt <= 1 ? 0.0 : (double)l * (Ls - 1) / (Lt - 1);
    int lo = kvl__tr_default_source_layer(l, Ls, Lt), hi = lo;
    /* grow the window [lo, hi] one layer at a time toward the nearer side of x (the lower one
     * on a tie), so that the taps stay the layers closest in relative depth */
    while (hi - lo + 1 < T) {
        int can_lo = lo > 0, can_hi = hi < Ls - 1;
        if (can_lo && (!can_hi || x - (lo - 1) <= (hi + 1) - x)) lo--;
        else hi++;
    }
    for (int j = 0; j < T; j++) out[j] = lo + j;
}

void kvl__tr_gather(const kvl_translator *tr, int l, const float *x, int n, float *out) {
    const int T = tr->taps, ds = kvl__tr_ds(tr);
    const int *m = tr->layer_map + (size_t)l * T;
    if (T == 1) {
        memcpy(out, x + (size_t)m[0] * n * ds, sizeof(float) * (size_t)n * ds);
        return;
    }
    for (int t = 0; t < n; t++)
        for (int j = 0; j < T; j++)
            memcpy(out + ((size_t)t * T + j) * ds, x + ((size_t)m[j] * n + t) * ds, sizeof(float) * ds);
}

void kvl_translator_free(kvl_translator *tr) {
    if (!tr) return;
    if (tr->prep) tr->prep_ops->translate_release(tr->prep);
    pthread_mutex_destroy(&tr->prep_lock);
    free(tr->wT);
    free(tr->wP);
    for (int i = 0; i < tr->n_meta; i++) {
        free(tr->meta_keys[i]);
        free(tr->meta_vals[i]);
    }
    free(tr->meta_keys);
    free(tr->meta_vals);
    free(tr->layer_map);
    free(tr->ident_map);
    free(tr->wk);
    free(tr->wv);
    free(tr->k_norm);
    free(tr);
}

kvl_status kvl_translator_set_meta(kvl_translator *tr, const char *key, const char *value) {
    for (int i = 0; i < tr->n_meta; i++) {
        if (!strcmp(tr->meta_keys[i], key)) {
            char *v = strdup(value);
            if (!v) return kvl__errorf(KVL_ERR_NOMEM, "out of memory");
            free(tr->meta_vals[i]);
            tr->meta_vals[i] = v;
            return KVL_OK;
        }
    }
    char **k = realloc(tr->meta_keys, sizeof(char *) * (size_t)(tr->n_meta + 1));
    if (!k) return kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    tr->meta_keys = k;
    char **v = realloc(tr->meta_vals, sizeof(char *) * (size_t)(tr->n_meta + 1));
    if (!v) return kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    tr->meta_vals = v;
    char *ks = strdup(key), *vs = strdup(value);
    if (!ks || !vs) {
        free(ks);
        free(vs);
        return kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    }
    tr->meta_keys[tr->n_meta] = ks;
    tr->meta_vals[tr->n_meta] = vs;
    tr->n_meta++;
    return KVL_OK;
}

const char *kvl_translator_metadata(const kvl_translator *tr, const char *key) {
    if (!tr || !key) return NULL;
    for (int i = 0; i < tr->n_meta; i++)
        if (!strcmp(tr->meta_keys[i], key)) return tr->meta_vals[i];
    return NULL;
}
int kvl_translator_metadata_count(const kvl_translator *tr) { return tr->n_meta; }
const char *kvl_translator_metadata_key(const kvl_translator *tr, int i) {
    return i >= 0 && i < tr->n_meta ? tr->meta_keys[i] : NULL;
}
const char *kvl_translator_metadata_value(const kvl_translator *tr, int i) {
    return i >= 0 && i < tr->n_meta ? tr->meta_vals[i] : NULL;
}
const char *kvl_translator_source_name(const kvl_translator *tr) { return kvl_translator_metadata(tr, "source_name"); }
const char *kvl_translator_target_name(const kvl_translator *tr) { return kvl_translator_metadata(tr, "target_name"); }
const char *kvl_translator_source_hash(const kvl_translator *tr) { return kvl_translator_metadata(tr, "source_hash"); }
const char *kvl_translator_target_hash(const kvl_translator *tr) { return kvl_translator_metadata(tr, "target_hash"); }

void kvl_translator_get_geometry(const kvl_translator *tr, kvl_translator_geometry *g) {
    *g = (kvl_translator_geometry){tr->src_layers, tr->src_kv_heads, tr->src_head_dim,
                                   tr->dst_layers, tr->dst_kv_heads, tr->dst_head_dim,
                                   tr->dst_qk_norm};
}
int kvl_translator_taps(const kvl_translator *tr) { return tr ? tr->taps : 0; }
int kvl_translator_layer_source(const kvl_translator *tr, int l, int j) {
    return l >= 0 && l < tr->dst_layers && j >= 0 && j < tr->taps ? tr->layer_map[(size_t)l * tr->taps + j] : -1;
}
int kvl_translator_layer_map(const kvl_translator *tr, int l) { return kvl_translator_layer_source(tr, l, 0); }
float *kvl_translator_wk(kvl_translator *tr, int l) {
    kvl__tr_maps_changed(tr);
    return l >= 0 && l < tr->dst_layers ? tr->wk + (size_t)l * kvl__tr_dt(tr) * kvl__tr_din(tr) : NULL;
}
float *kvl_translator_wv(kvl_translator *tr, int l) {
    kvl__tr_maps_changed(tr);
    return l >= 0 && l < tr->dst_layers ? tr->wv + (size_t)l * kvl__tr_dt(tr) * kvl__tr_din(tr) : NULL;
}

/* Allocate maps, layer map and k_norm for the geometry (and taps) already set in tr. */
static kvl_status alloc_arrays(kvl_translator *tr) {
    size_t n = (size_t)tr->dst_layers * kvl__tr_dt(tr) * kvl__tr_din(tr);
    tr->layer_map = calloc((size_t)tr->dst_layers * tr->taps, sizeof(int));
    tr->ident_map = calloc((size_t)tr->dst_layers, sizeof(int));
    tr->wk = calloc(n, sizeof(float));
    tr->wv = calloc(n, sizeof(float));
    if (tr->dst_qk_norm) tr->k_norm = calloc((size_t)tr->dst_layers * tr->dst_head_dim, sizeof(float));
    if (!tr->layer_map || !tr->ident_map || !tr->wk || !tr->wv || (tr->dst_qk_norm && !tr->k_norm))
        return kvl__errorf(KVL_ERR_NOMEM, "out of memory for a translator (%zu floats per side)", n);
    for (int l = 0; l < tr->dst_layers; l++) tr->ident_map[l] = l;
    return KVL_OK;
}

static kvl_status set_int_meta(kvl_translator *tr, const char *key, long v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%ld", v);
    return kvl_translator_set_meta(tr, key, buf);
}

/* Write the identity and geometry keys from the struct into the metadata. */
static kvl_status write_geometry_meta(kvl_translator *tr) {
    kvl_status s;
    if ((s = kvl_translator_set_meta(tr, "format", KVL_TR_FORMAT)) ||
        (s = set_int_meta(tr, "source_layers", tr->src_layers)) ||
        (s = set_int_meta(tr, "source_kv_heads", tr->src_kv_heads)) ||
        (s = set_int_meta(tr, "source_head_dim", tr->src_head_dim)) ||
        (s = set_int_meta(tr, "source_taps", tr->taps)) ||
        (s = set_int_meta(tr, "target_layers", tr->dst_layers)) ||
        (s = set_int_meta(tr, "target_kv_heads", tr->dst_kv_heads)) ||
        (s = set_int_meta(tr, "target_head_dim", tr->dst_head_dim)) ||
        (s = set_int_meta(tr, "target_qk_norm", tr->dst_qk_norm)))
        return s;
    char buf[64];
    snprintf(buf, sizeof buf, "%.9g", (double)tr->k_norm_eps);
    if ((s = kvl_translator_set_meta(tr, "target_rms_norm_eps", buf))) return s;
    /* "0,1,1,2" with one tap; "0+1,1+2,2+3" with two (a target layer's taps joined by '+') */
    size_t cap = (size_t)tr->dst_layers * tr->taps * 12 + 1, len = 0;
    char *map = malloc(cap);
    if (!map) return kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    map[0] = 0;
    for (int l = 0; l < tr->dst_layers; l++)
        for (int j = 0; j < tr->taps; j++)
            len += (size_t)snprintf(map + len, cap - len, j ? "+%d" : (l ? ",%d" : "%d"),
                                    tr->layer_map[(size_t)l * tr->taps + j]);
    s = kvl_translator_set_meta(tr, "layer_map", map);
    free(map);
    if (s) return s;
    return kvl_translator_set_meta(tr, "capture", "k_proj/v_proj outputs (pre-norm, pre-RoPE)");
}

kvl_status kvl_translator_create(const kvl_model *src, const kvl_model *dst,
                                 const int *layer_map, kvl_translator **out) {
    return kvl_translator_create_taps(src, dst, 1, layer_map, out);
}

kvl_status kvl_translator_create_taps(const kvl_model *src, const kvl_model *dst, int taps,
                                      const int *layer_map, kvl_translator **out) {
    if (!src || !dst || !out) return kvl__errorf(KVL_ERR_INVALID_ARG, "translator create: NULL argument");
    const kvl_model_config *a = kvl_model_config_get(src), *b = kvl_model_config_get(dst);
    if (taps < 1 || taps > a->n_layers)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "translator create: %d taps per target layer is outside "
                          "[1, %d] (the source '%s' has %d layers)", taps, a->n_layers,
                          kvl_model_name(src), a->n_layers);
    if (a->vocab_size != b->vocab_size)
        return kvl__errorf(KVL_ERR_MISMATCH, "translator create: source '%s' (vocab %d) and target "
                          "'%s' (vocab %d) do not share a tokenizer", kvl_model_name(src), a->vocab_size,
                          kvl_model_name(dst), b->vocab_size);
    kvl_translator *tr = calloc(1, sizeof *tr);
    if (!tr) return kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&tr->prep_lock, NULL);
    tr->bf16_products = 1;
    tr->src_layers = a->n_layers;
    tr->src_kv_heads = a->n_kv_heads;
    tr->src_head_dim = a->head_dim;
    tr->dst_layers = b->n_layers;
    tr->dst_kv_heads = b->n_kv_heads;
    tr->dst_head_dim = b->head_dim;
    tr->dst_qk_norm = b->qk_norm;
    tr->k_norm_eps = b->rms_norm_eps;
    tr->taps = taps;
    kvl_status s = alloc_arrays(tr);
    for (int l = 0; s == KVL_OK && l < b->n_layers; l++) {
        int *m = tr->layer_map + (size_t)l * taps;
        if (layer_map) memcpy(m, layer_map + (size_t)l * taps, sizeof(int) * (size_t)taps);
        else kvl__tr_default_sources(l, a->n_layers, b->n_layers, taps, m);
        for (int j = 0; s == KVL_OK && j < taps; j++)
            if (m[j] < 0 || m[j] >= a->n_layers || (j && m[j] <= m[j - 1]))
                s = kvl__errorf(KVL_ERR_INVALID_ARG, "translator create: layer map entry %d tap %d = %d "
                               "is outside the source's %d layers or not above the previous tap",
                               l, j, m[j], a->n_layers);
        if (s == KVL_OK && b->qk_norm)
            memcpy(tr->k_norm + (size_t)l * b->head_dim, kvl_model_weights(dst)->layers[l].k_norm, sizeof(float) * b->head_dim);
    }
    if (s == KVL_OK) s = write_geometry_meta(tr);
    if (s == KVL_OK) s = kvl_translator_set_meta(tr, "source_name", kvl_model_name(src));
    if (s == KVL_OK) s = kvl_translator_set_meta(tr, "source_hash", kvl_model_hash(src));
    if (s == KVL_OK) s = kvl_translator_set_meta(tr, "target_name", kvl_model_name(dst));
    if (s == KVL_OK) s = kvl_translator_set_meta(tr, "target_hash", kvl_model_hash(dst));
    if (s != KVL_OK) {
        kvl_translator_free(tr);
        return s;
    }
    *out = tr;
    return KVL_OK;
}

/* ---- load ---------------------------------------------------------------------------------- */

static kvl_status meta_int(const kvl_safetensors *st, const char *path, const char *key, int lo,
                           int hi, int *out) {
    const char *v = kvl_safetensors_metadata(st, key);
    if (!v) return kvl__errorf(KVL_ERR_FORMAT, "%s: metadata key '%s' is missing", path, key);
    char *end;
    long x = strtol(v, &end, 10);
    if (end == v || *end || x < lo || x > hi)
        return kvl__errorf(KVL_ERR_FORMAT, "%s: metadata '%s' = \"%s\" is not an integer in [%d, %d]",
                          path, key, v, lo, hi);
    *out = (int)x;
    return KVL_OK;
}

/* Load tensor `name` of shape [d0] (nd 1) or [d0, d1] (nd 2) into dst as float32, finite. */
kvl_status kvl__tr_load_tensor(const kvl_safetensors *st, const char *path, const char *name, int nd,
                               int64_t d0, int64_t d1, float *dst) {
    const kvl_st_tensor *t = kvl_safetensors_find(st, name);
    if (!t) return kvl__errorf(KVL_ERR_FORMAT, "%s: tensor '%s' is missing", path, name);
    if (t->n_dims != nd || t->shape[0] != d0 || (nd == 2 && t->shape[1] != d1))
        return kvl__errorf(KVL_ERR_MISMATCH, "%s: tensor '%s' has shape [%lld%s%lld], expected "
                          "[%lld%s%lld] from the geometry in the metadata", path, name,
                          (long long)t->shape[0], t->n_dims > 1 ? ", " : "",
                          t->n_dims > 1 ? (long long)t->shape[1] : 0LL, (long long)d0,
                          nd == 2 ? ", " : "", nd == 2 ? (long long)d1 : 0LL);
    if (t->dtype != KVL_DTYPE_F32 && t->dtype != KVL_DTYPE_BF16 && t->dtype != KVL_DTYPE_F16)
        return kvl__errorf(KVL_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s (F32, BF16 or F16 expected)",
                          path, name, kvl_dtype_name(t->dtype));
    kvl_status s = kvl_st_tensor_to_f32(t, dst, (size_t)t->n_elements);
    if (s != KVL_OK) return kvl__error_prefix(s, path);
    for (int64_t i = 0; i < t->n_elements; i++)
        if (!isfinite(dst[i]))
            return kvl__errorf(KVL_ERR_NUMERIC, "%s: tensor '%s' element %lld is %s", path, name,
                              (long long)i, isnan(dst[i]) ? "NaN" : "Inf");
    return KVL_OK;
}

static kvl_status load_from(kvl_safetensors *st, const char *path, kvl_translator *tr) {
    kvl_status s;
    const char *fmt = kvl_safetensors_metadata(st, "format");
    if (!fmt || strcmp(fmt, KVL_TR_FORMAT))
        return kvl__errorf(KVL_ERR_FORMAT, "%s: not a kvlingo translator (metadata 'format' is %s%s%s, "
                          "expected \"" KVL_TR_FORMAT "\")%s", path, fmt ? "\"" : "", fmt ? fmt : "missing",
                          fmt ? "\"" : "",
                          !fmt && kvl_safetensors_find(st, "layers.0.k.weight")
                              ? "; a plain-layout file (layers.{l}.k.weight / v.weight + layer_map) is "
                                "converted with `kvlingo translator import --layout plain`" : "");
    if ((s = meta_int(st, path, "source_layers", 1, 4096, &tr->src_layers)) ||
        (s = meta_int(st, path, "source_kv_heads", 1, 4096, &tr->src_kv_heads)) ||
        (s = meta_int(st, path, "source_head_dim", 1, 4096, &tr->src_head_dim)) ||
        (s = meta_int(st, path, "target_layers", 1, 4096, &tr->dst_layers)) ||
        (s = meta_int(st, path, "target_kv_heads", 1, 4096, &tr->dst_kv_heads)) ||
        (s = meta_int(st, path, "target_head_dim", 2, 4096, &tr->dst_head_dim)) ||
        (s = meta_int(st, path, "target_qk_norm", 0, 1, &tr->dst_qk_norm)))
        return s;
    tr->taps = 1;   /* files written before multi-layer maps have no source_taps */
    if (kvl_safetensors_metadata(st, "source_taps") &&
        (s = meta_int(st, path, "source_taps", 1, tr->src_layers, &tr->taps)))
        return s;
    if (tr->dst_head_dim % 2)
        return kvl__errorf(KVL_ERR_FORMAT, "%s: target_head_dim %d is odd (RoPE needs pairs)", path, tr->dst_head_dim);
    /* the maps' widths and sizes in 64 bits: each factor is bounded above, their products are
     * not (a map of 256 taps of 4096 x 4096 features wrapped an int to 0 floats) */
    const int64_t ds = (int64_t)tr->src_kv_heads * tr->src_head_dim, din = ds * tr->taps,
                  dt = (int64_t)tr->dst_kv_heads * tr->dst_head_dim;
    if (ds > KVL_TR_MAX_WIDTH || din > KVL_TR_MAX_WIDTH || dt > KVL_TR_MAX_WIDTH ||
        (int64_t)tr->dst_layers * dt * din > KVL_TR_MAX_WEIGHTS)
        return kvl__errorf(KVL_ERR_FORMAT, "%s: the metadata's geometry (source %d taps x %d kv heads x %d "
                          "head_dim, target %d layers x %d kv heads x %d head_dim) makes maps larger than "
                          "%lld features wide or %lld weights per side", path, tr->taps, tr->src_kv_heads,
                          tr->src_head_dim, tr->dst_layers, tr->dst_kv_heads, tr->dst_head_dim,
                          (long long)KVL_TR_MAX_WIDTH, (long long)KVL_TR_MAX_WEIGHTS);
    const char *eps = kvl_safetensors_metadata(st, "target_rms_norm_eps");
    tr->k_norm_eps = eps ? strtof(eps, NULL) : 1e-6f;
    if (!(tr->k_norm_eps > 0 && tr->k_norm_eps < 1))
        return kvl__errorf(KVL_ERR_FORMAT, "%s: metadata 'target_rms_norm_eps' = \"%s\" is not in (0, 1)", path, eps);
    if ((s = alloc_arrays(tr))) return s;
    const char *map = kvl_safetensors_metadata(st, "layer_map");
    const int T = tr->taps;
    for (int l = 0; l < tr->dst_layers; l++) {
        int *m = tr->layer_map + (size_t)l * T;
        if (!map) {
            kvl__tr_default_sources(l, tr->src_layers, tr->dst_layers, T, m);
            continue;
        }
        for (int j = 0; j < T; j++) {   /* entry l: T ascending source layers joined by '+' */
            char *end;
            long v = strtol(map, &end, 10);
            char want = j < T - 1 ? '+' : (l < tr->dst_layers - 1 ? ',' : 0);
            if (end == map || v < 0 || v >= tr->src_layers || *end != want || (j && v <= m[j - 1]))
                return kvl__errorf(KVL_ERR_FORMAT, "%s: metadata 'layer_map' must list %d entries of %d "
                                  "ascending source layer(s) in [0, %d) (taps joined by '+', entries "
                                  "by commas); entry %d is bad", path, tr->dst_layers, T,
                                  tr->src_layers, l);
            m[j] = (int)v;
            map = *end ? end + 1 : end;
        }
    }
    char name[96];
    for (int l = 0; l < tr->dst_layers; l++) {
        snprintf(name, sizeof name, "layers.%d.k.weight", l);
        if ((s = kvl__tr_load_tensor(st, path, name, 2, dt, din, kvl_translator_wk(tr, l)))) return s;
        snprintf(name, sizeof name, "layers.%d.v.weight", l);
        if ((s = kvl__tr_load_tensor(st, path, name, 2, dt, din, kvl_translator_wv(tr, l)))) return s;
        if (tr->dst_qk_norm) {
            snprintf(name, sizeof name, "layers.%d.k_norm.weight", l);
            if ((s = kvl__tr_load_tensor(st, path, name, 1, tr->dst_head_dim, 0,
                                 tr->k_norm + (size_t)l * tr->dst_head_dim)))
                return s;
        }
    }
    return KVL_OK;
}


kvl_status kvl_translator_load(const char *path, kvl_translator **out) {
    if (!path || !out) return kvl__errorf(KVL_ERR_INVALID_ARG, "translator load: NULL argument");
    kvl_safetensors *st = NULL;
    kvl_status s = kvl_safetensors_open(path, &st);
    if (s != KVL_OK) return s;
    kvl_translator *tr = calloc(1, sizeof *tr);
    if (tr) {
        pthread_mutex_init(&tr->prep_lock, NULL);
        tr->bf16_products = 1;
    }
    if (!tr) {
        kvl_safetensors_close(st);
        return kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    }
    s = load_from(st, path, tr);
    /* every metadata entry, in file order: figures stored under any key (`translator eval
     * --store KEY`) survive a later load + save */
    for (size_t i = 0; s == KVL_OK && i < kvl_safetensors_metadata_count(st); i++)
        s = kvl_translator_set_meta(tr, kvl_safetensors_metadata_key(st, i), kvl_safetensors_metadata_value(st, i));
    kvl_safetensors_close(st);
    if (s != KVL_OK) {
        kvl_translator_free(tr);
        return s;
    }
    *out = tr;
    return KVL_OK;
}

/* ---- save ---------------------------------------------------------------------------------- */

kvl_status kvl_translator_save(const kvl_translator *tr, const char *path, int dtype) {
    if (!tr || !path) return kvl__errorf(KVL_ERR_INVALID_ARG, "translator save: NULL argument");
    if (dtype != KVL_DTYPE_F32 && dtype != KVL_DTYPE_BF16)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "translator save: dtype must be F32 or BF16");
    int Lt = tr->dst_layers, per = tr->dst_qk_norm ? 3 : 2;
    size_t n = (size_t)kvl__tr_dt(tr) * kvl__tr_din(tr);
    kvl_st_write_tensor *ts = calloc((size_t)Lt * per, sizeof *ts);
    char *names = calloc((size_t)Lt * per, 64);
    uint16_t *half = dtype == KVL_DTYPE_BF16 ? malloc(sizeof(uint16_t) * n * 2 * Lt) : NULL;
    if (!ts || !names || (dtype == KVL_DTYPE_BF16 && !half)) {
        free(ts); free(names); free(half);
        return kvl__errorf(KVL_ERR_NOMEM, "out of memory");
    }
    size_t esz = dtype == KVL_DTYPE_BF16 ? 2 : 4;
    int k = 0;
    for (int l = 0; l < Lt; l++) {
        for (int side = 0; side < 2; side++) {
            const float *w = (side ? tr->wv : tr->wk) + (size_t)l * n;
            const void *data = w;
            if (half) {
                uint16_t *h = half + ((size_t)l * 2 + side) * n;
                for (size_t i = 0; i < n; i++) h[i] = kvl_f32_to_bf16(w[i]);
                data = h;
            }
            char *nm = names + (size_t)k * 64;
            snprintf(nm, 64, "layers.%d.%s.weight", l, side ? "v" : "k");
            ts[k++] = (kvl_st_write_tensor){nm, (kvl_dtype)dtype, 2, {kvl__tr_dt(tr), kvl__tr_din(tr)},
                                            data, n * esz};
        }
        if (tr->dst_qk_norm) {
            char *nm = names + (size_t)k * 64;
            snprintf(nm, 64, "layers.%d.k_norm.weight", l);
            ts[k++] = (kvl_st_write_tensor){nm, KVL_DTYPE_F32, 1, {tr->dst_head_dim},
                                            tr->k_norm + (size_t)l * tr->dst_head_dim,
                                            sizeof(float) * (size_t)tr->dst_head_dim};
        }
    }
    kvl_status s = kvl_safetensors_write(path, ts, (size_t)k, (const char *const *)tr->meta_keys,
                                         (const char *const *)tr->meta_vals, (size_t)tr->n_meta);
    free(ts);
    free(names);
    free(half);
    return s;
}

/* ---- pair check ------------------------------------------------------------------------------ */

kvl_status kvl_translator_check(const kvl_translator *tr, const kvl_model *src, const kvl_model *dst) {
    if (!tr || !src || !dst) return kvl__errorf(KVL_ERR_INVALID_ARG, "translator check: NULL argument");
    const kvl_model_config *a = kvl_model_config_get(src), *b = kvl_model_config_get(dst);
    const char *sn = kvl_translator_source_name(tr), *tn = kvl_translator_target_name(tr);
    if (a->n_layers != tr->src_layers || a->n_kv_heads != tr->src_kv_heads || a->head_dim != tr->src_head_dim)
        return kvl__errorf(KVL_ERR_MISMATCH, "translator %s -> %s: source geometry (layers %d, kv_heads %d, "
                          "head_dim %d) does not match model '%s' (layers %d, kv_heads %d, head_dim %d)",
                          sn ? sn : "?", tn ? tn : "?", tr->src_layers, tr->src_kv_heads, tr->src_head_dim,
                          kvl_model_name(src), a->n_layers, a->n_kv_heads, a->head_dim);
    if (b->n_layers != tr->dst_layers || b->n_kv_heads != tr->dst_kv_heads || b->head_dim != tr->dst_head_dim ||
        b->qk_norm != tr->dst_qk_norm)
        return kvl__errorf(KVL_ERR_MISMATCH, "translator %s -> %s: target geometry (layers %d, kv_heads %d, "
                          "head_dim %d, k_norm %d) does not match model '%s' (layers %d, kv_heads %d, "
                          "head_dim %d, k_norm %d)", sn ? sn : "?", tn ? tn : "?", tr->dst_layers,
                          tr->dst_kv_heads, tr->dst_head_dim, tr->dst_qk_norm, kvl_model_name(dst), b->n_layers,
                          b->n_kv_heads, b->head_dim, b->qk_norm);
    const char *sh = kvl_translator_source_hash(tr), *th = kvl_translator_target_hash(tr);
    if (sh && strcmp(sh, kvl_model_hash(src)))
        return kvl__errorf(KVL_ERR_MISMATCH, "translator was trained for source model '%s' (hash %s), "
                          "not '%s' (hash %s)", sn ? sn : "?", sh, kvl_model_name(src), kvl_model_hash(src));
    if (th && strcmp(th, kvl_model_hash(dst)))
        return kvl__errorf(KVL_ERR_MISMATCH, "translator was trained for target model '%s' (hash %s), "
                          "not '%s' (hash %s)", tn ? tn : "?", th, kvl_model_name(dst), kvl_model_hash(dst));
    if (b->qk_norm)   /* apply uses the file's k_norm copy: it must be the target's own */
        for (int l = 0; l < b->n_layers; l++)
            if (memcmp(tr->k_norm + (size_t)l * b->head_dim, kvl_model_weights(dst)->layers[l].k_norm, sizeof(float) * b->head_dim))
                return kvl__errorf(KVL_ERR_MISMATCH, "translator's k_norm weights of layer %d differ from "
                                  "target model '%s''s", l, kvl_model_name(dst));
    return KVL_OK;
}

/* ---- apply ----------------------------------------------------------------------------------- */

/* The maps as a backend applies them.  With T > 1 taps the backend sees a virtual source of Lt
 * layers whose layer l is target layer l's gathered input ([n][T*Hs*Ds], T*Hs "kv heads" of
 * head_dim Ds) under the identity layer map: the same matmuls, so every backend applies a
 * multi-layer map without knowing of taps. */
static void maps_view(const kvl_translator *tr, kvl_kv_maps *m) {
    if (tr->taps == 1)
        *m = (kvl_kv_maps){tr->src_layers, tr->src_kv_heads, tr->src_head_dim, tr->dst_layers,
                           tr->dst_kv_heads, tr->dst_head_dim, tr->layer_map, tr->wk, tr->wv, 0,
                           NULL, NULL, NULL, NULL};
    else
        *m = (kvl_kv_maps){tr->dst_layers, tr->taps * tr->src_kv_heads, tr->src_head_dim, tr->dst_layers,
                           tr->dst_kv_heads, tr->dst_head_dim, tr->ident_map, tr->wk, tr->wv, 0,
                           NULL, NULL, NULL, NULL};
}

/* The maps transposed (kvl_kv_maps.wkT, .wvT: [2][Lt][din][dt]) and, when want_pairs (the
 * backend takes bf16 products for this geometry), as bf16 pairs too (.wkP, .wvP:
 * [2][Lt][din/2][dt][2], into *pairs; NULL when not asked for or out of memory), made again when
 * the maps changed since: the CPU's fused rows read them so, and transposing every layer's maps
 * per span cost more than translating a short span (64 tokens, qwen3-a -> qwen3-b: 0.08 ms with
 * them kept, 0.11 ms transposing per span).  NULL when out of memory: the kernel transposes per
 * span (and takes float32 products). */
static const float *transposed_maps(kvl_translator *tr, int want_pairs, const uint16_t **pairs) {
    const size_t din = (size_t)kvl__tr_din(tr), dt = (size_t)kvl__tr_dt(tr), per = din * dt;
    const size_t Lt = (size_t)tr->dst_layers;
    *pairs = NULL;
    pthread_mutex_lock(&tr->prep_lock);
    const unsigned gen = __atomic_load_n(&tr->maps_gen, __ATOMIC_ACQUIRE);
    /* made once, rewritten in place (never freed before the translator): an apply still reading
     * it while the maps change races as one reading wk / wv itself would, no worse */
    const int stale = !tr->wT || tr->wT_gen != gen;
    if (!tr->wT) tr->wT = malloc(sizeof(float) * 2 * Lt * per);
    /* pairs made late (their first allocation failed) are filled alone: the transposes, current,
     * may be in use by an apply outside this lock */
    const int pairs_new = want_pairs && !tr->wP && din % 2 == 0 && (tr->wP = malloc(sizeof(uint16_t) * 2 * Lt * per));
    if (tr->wT && (stale || pairs_new)) {
        for (size_t side = 0; side < 2; side++)
            for (size_t l = 0; l < Lt; l++) {
                const float *W = (side ? tr->wv : tr->wk) + l * per;   /* [dt][din] */
                float *T = stale ? tr->wT + (side * Lt + l) * per : NULL;   /* [din][dt] */
                uint16_t *P = tr->wP ? tr->wP + (side * Lt + l) * per : NULL;   /* [din/2][dt][2] */
                for (size_t o = 0; o < dt; o++)
                    for (size_t i = 0; i < din; i++) {
                        if (T) T[i * dt + o] = W[o * din + i];
                        if (P) P[((i / 2) * dt + o) * 2 + (i & 1)] = kvl__bf16_round(W[o * din + i]);
                    }
            }
        tr->wT_gen = gen;
    }
    const float *w = tr->wT;
    if (w && want_pairs) *pairs = tr->wP;
    pthread_mutex_unlock(&tr->prep_lock);
    return w;
}

static kvl_status apply_view(const kvl_translator *tr, const float *k_src, const float *v_src,
                             int n, const int32_t *ids, kvl_cache *dst);

void kvl_translator_set_bf16_products(kvl_translator *tr, int on) {
    if (tr) tr->bf16_products = on != 0;
}

/* Whether apply on backend `ops` takes bf16 products (the setting, din even, the backend). */
static int bf16_products_on(const kvl_translator *tr, const kvl_backend_ops *ops) {
    return tr->bf16_products && kvl__tr_din(tr) % 2 == 0 && ops && ops->translate_bf16_products &&
           ops->translate_bf16_products(tr->dst_head_dim, kvl__tr_dt(tr), kvl__tr_din(tr));
}

int kvl_translator_bf16_products(const kvl_translator *tr, const kvl_model *target) {
    /* an apply that finds no memory for the maps' pairs takes float32 products: a span sent as
     * bf16 on this answer is then translated from its bf16 values, correctly, though not bit
     * for bit as the bf16 products would */
    return tr && target && bf16_products_on(tr, kvl_model_backend(target));
}

/* The arguments of an apply against the translator and the target cache (rows: both source
 * arrays given). */
static kvl_status apply_check(const kvl_translator *tr, int rows, int t0, int n, const kvl_cache *dst) {
    if (!tr || !dst || n < 0 || (n > 0 && !rows))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "translator apply: bad arguments (n=%d)", n);
    const kvl_model_config *c = kvl_cache_config(dst);
    if (c->n_layers != tr->dst_layers || c->n_kv_heads != tr->dst_kv_heads ||
        c->head_dim != tr->dst_head_dim || c->qk_norm != tr->dst_qk_norm)
        return kvl__errorf(KVL_ERR_MISMATCH, "translator apply: the target cache's geometry (layers %d, "
                          "kv_heads %d, head_dim %d) is not the translator's (layers %d, kv_heads %d, "
                          "head_dim %d)", c->n_layers, c->n_kv_heads, c->head_dim, tr->dst_layers,
                          tr->dst_kv_heads, tr->dst_head_dim);
    if (t0 != kvl_cache_n_tokens(dst))
        return kvl__errorf(KVL_ERR_RANGE, "translator apply: span starts at token %d but the target "
                          "cache holds %d tokens", t0, kvl_cache_n_tokens(dst));
    if (t0 + n > kvl_cache_capacity(dst))
        return kvl__errorf(KVL_ERR_RANGE, "translator apply: %d tokens exceed the target cache's capacity %d",
                          t0 + n, kvl_cache_capacity(dst));
    return KVL_OK;
}

kvl_status kvl_translator_apply(const kvl_translator *tr, const float *k_src, const float *v_src,
                                int t0, int n, const int32_t *ids, kvl_cache *dst) {
    kvl_status s0 = apply_check(tr, k_src && v_src, t0, n, dst);
    if (s0 != KVL_OK || n == 0) return s0;
    if (tr->taps == 1) return apply_view(tr, k_src, v_src, n, ids, dst);
    /* gather each target layer's taps: [Lt][n][T*Hs*Ds] per side */
    const size_t per = (size_t)n * kvl__tr_din(tr);
    float *gk = malloc(sizeof(float) * per * tr->dst_layers), *gv = malloc(sizeof(float) * per * tr->dst_layers);
    kvl_status s = KVL_OK;
    if (!gk || !gv) {
        s = kvl__errorf(KVL_ERR_NOMEM, "translator apply: out of memory gathering %d tokens of %d taps", n,
                        tr->taps);
    } else {
        for (int l = 0; l < tr->dst_layers; l++) {
            kvl__tr_gather(tr, l, k_src, n, gk + (size_t)l * per);
            kvl__tr_gather(tr, l, v_src, n, gv + (size_t)l * per);
        }
        s = apply_view(tr, gk, gv, n, ids, dst);
    }
    free(gk);
    free(gv);
    return s;
}

kvl_status kvl_translator_apply_bf16(const kvl_translator *tr, const uint16_t *k_src16,
                                     const uint16_t *v_src16, int t0, int n, const int32_t *ids,
                                     kvl_cache *dst) {
    kvl_status s = apply_check(tr, k_src16 && v_src16, t0, n, dst);
    if (s != KVL_OK || n == 0) return s;
    const kvl_backend_ops *ops;
    void *bm;
    kvl__cache_backend(dst, &ops, &bm);
    if (tr->taps == 1 && ops == kvl_backend_cpu() && bf16_products_on(tr, ops)) {
        /* the rows as they are: the products round them to bf16 anyway */
        kvl_translator *mt = (kvl_translator *)tr;   /* only its prepared forms change */
        const uint16_t *wP = NULL;
        const float *wT = transposed_maps(mt, 1, &wP);
        if (wP) {
            const kvl_model_config *c = kvl_cache_config(dst);
            const size_t half = (size_t)tr->dst_layers * kvl__tr_din(tr) * kvl__tr_dt(tr);
            kvl_kv_maps maps;
            maps_view(tr, &maps);
            maps.wkT = wT;
            maps.wvT = wT + half;
            maps.wkP = wP;
            maps.wvP = wP + half;
            kvl_translate_params p = {&maps, tr->dst_qk_norm ? tr->k_norm : NULL, tr->k_norm_eps, c->rope};
            s = kvl__cache_translate_bf16(dst, &p, k_src16, v_src16, n, ids);
            if (s != KVL_ERR_UNSUPPORTED) return s;
            kvl_clear_error();
        }
    }
    /* float32 products (or several taps, or a device): the rows widened, exactly */
    const size_t nf = (size_t)tr->src_layers * n * kvl__tr_ds(tr);
    float *w = malloc(2 * nf * sizeof(float));
    if (!w) return kvl__errorf(KVL_ERR_NOMEM, "translator apply: out of memory widening %d bf16 tokens", n);
    kvl__bf16_widen_n(w, k_src16, nf);
    kvl__bf16_widen_n(w + nf, v_src16, nf);
    s = kvl_translator_apply(tr, w, w + nf, t0, n, ids, dst);
    free(w);
    return s;
}

/* Apply the backend view of the maps (maps_view) to a span already in its layout. */
static kvl_status apply_view(const kvl_translator *tr, const float *k_src, const float *v_src,
                             int n, const int32_t *ids, kvl_cache *dst) {
    const kvl_model_config *c = kvl_cache_config(dst);
    kvl_kv_maps maps;
    maps_view(tr, &maps);
    kvl_translator *mt = (kvl_translator *)tr;   /* only its prepared forms change */
    kvl_translate_params p = {&maps, tr->dst_qk_norm ? tr->k_norm : NULL, tr->k_norm_eps,
                              c->rope};
    const kvl_backend_ops *ops;
    void *bm;
    kvl__cache_backend(dst, &ops, &bm);
    /* the CPU prepares a view in no time: per call, so concurrent imports run in parallel; the
     * transposed maps it reads are kept while the maps stay the same */
    if (ops == kvl_backend_cpu()) {
        const uint16_t *wP = NULL;
        const float *wT = transposed_maps(mt, bf16_products_on(tr, ops), &wP);
        const size_t half = (size_t)tr->dst_layers * kvl__tr_din(tr) * kvl__tr_dt(tr);
        if (wT) {
            maps.wkT = wT;
            maps.wvT = wT + half;
        }
        if (wP) {
            maps.wkP = wP;
            maps.wvP = wP + half;
        }
        return kvl__cache_translate(dst, &p, k_src, v_src, n, ids);
    }
    /* a device uploads the maps: once per target model, reused while it and the maps stay the
     * same */
    pthread_mutex_lock(&mt->prep_lock);
    kvl_status s = KVL_OK;
    const unsigned gen = __atomic_load_n(&mt->maps_gen, __ATOMIC_ACQUIRE);
    if (!mt->prep || mt->prep_ops != ops || mt->prep_bm != bm || mt->prep_gen != gen) {
        if (mt->prep) mt->prep_ops->translate_release(mt->prep);
        mt->prep = NULL;
        if ((s = ops->translate_prepare(bm, &p, &mt->prep)) == KVL_OK) {
            mt->prep_ops = ops;
            mt->prep_bm = bm;
            mt->prep_gen = gen;
        } else {
            mt->prep = NULL;
        }
    }
    if (s == KVL_OK) s = kvl__cache_translate_prepared(dst, mt->prep, k_src, v_src, n, ids);
    pthread_mutex_unlock(&mt->prep_lock);
    return s;
}

kvl_status kvl__tr_read_span(const kvl_cache *src, int Ls, size_t per, int t0, int t1, float **k,
                             float **v) {
    *k = malloc(sizeof(float) * per * Ls);
    *v = malloc(sizeof(float) * per * Ls);
    kvl_status s = *k && *v ? KVL_OK
                   : kvl__errorf(KVL_ERR_NOMEM, "out of memory reading %d source tokens", t1 - t0);
    for (int l = 0; s == KVL_OK && l < Ls; l++)
        s = kvl_cache_read_prenorm(src, l, t0, t1, *k + (size_t)l * per, *v + (size_t)l * per);
    if (s != KVL_OK) { free(*k); free(*v); *k = *v = NULL; }
    return s;
}

kvl_status kvl_translator_translate_span(const kvl_translator *tr, const kvl_cache *src, int t0,
                                         int t1, kvl_cache *dst) {
    if (!tr || !src || !dst) return kvl__errorf(KVL_ERR_INVALID_ARG, "translate span: NULL argument");
    const kvl_model_config *c = kvl_cache_config(src);
    if (c->n_layers != tr->src_layers || c->n_kv_heads != tr->src_kv_heads || c->head_dim != tr->src_head_dim)
        return kvl__errorf(KVL_ERR_MISMATCH, "translate span: the source cache's geometry (layers %d, "
                          "kv_heads %d, head_dim %d) is not the translator's (layers %d, kv_heads %d, "
                          "head_dim %d)", c->n_layers, c->n_kv_heads, c->head_dim, tr->src_layers,
                          tr->src_kv_heads, tr->src_head_dim);
    if (t0 < 0 || t1 < t0 || t1 > kvl_cache_n_tokens(src))
        return kvl__errorf(KVL_ERR_RANGE, "translate span: [%d, %d) is outside the source cache's %d tokens",
                          t0, t1, kvl_cache_n_tokens(src));
    int n = t1 - t0;
    if (n == 0) return t0 == kvl_cache_n_tokens(dst) ? KVL_OK
                     : kvl__errorf(KVL_ERR_RANGE, "translate span: target holds %d tokens, span starts at %d",
                                  kvl_cache_n_tokens(dst), t0);
    const kvl_backend_ops *ops;
    void *bm;
    kvl__cache_backend(dst, &ops, &bm);
    if (tr->taps == 1 && bf16_products_on(tr, ops)) {
        /* the products round the rows to bf16: read them so (as a node exports a span to a peer
         * that multiplies in bf16), half the bytes, the same cache */
        const size_t nf = (size_t)tr->src_layers * n * kvl__tr_ds(tr);
        uint16_t *r16 = malloc(2 * nf * sizeof(uint16_t));
        if (!r16) return kvl__errorf(KVL_ERR_NOMEM, "out of memory reading %d source tokens", n);
        kvl_status s = kvl_cache_read_prenorm_bf16(src, t0, t1, r16, r16 + nf);
        if (s == KVL_OK) s = kvl_translator_apply_bf16(tr, r16, r16 + nf, t0, n, kvl_cache_tokens(src) + t0, dst);
        free(r16);
        return s;
    }
    float *k, *v;
    kvl_status s = kvl__tr_read_span(src, tr->src_layers, (size_t)n * kvl__tr_ds(tr), t0, t1, &k, &v);
    if (s == KVL_OK) s = kvl_translator_apply(tr, k, v, t0, n, kvl_cache_tokens(src) + t0, dst);
    free(k);
    free(v);
    return s;
}
