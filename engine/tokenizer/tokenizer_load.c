/* engine/tokenizer/tokenizer_load.c: load tokenizer.json (+ tokenizer_config.json, chat_template.jinja).
 *
 * Accepted components are listed in kvlingo/tokenizer.h; anything else is refused with
 * KVL_ERR_UNSUPPORTED naming the component.  Every error names the file and the JSON field. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "error.h"
#include "file.h"
#include "tokenizer_internal.h"


static int is_null(const cJSON *j) { return !j || cJSON_IsNull(j); }

static const char *type_of(const cJSON *obj) {
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(obj, "type");
    return cJSON_IsString(ty) ? ty->valuestring : NULL;
}

static kvl_status get_bool(const char *path, const char *where, const cJSON *obj, const char *key,
                           int dflt, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (is_null(v)) { *out = dflt; return KVL_OK; }
    if (!cJSON_IsBool(v)) return kvl__errorf(KVL_ERR_FORMAT, "%s: %s.%s: expected a boolean", path, where, key);
    *out = cJSON_IsTrue(v);
    return KVL_OK;
}

/* ---- normalizer ----------------------------------------------------------------------------- */

static kvl_status load_normalizer(kvl_tokenizer *t, const cJSON *n, const char *where, int depth) {
    if (is_null(n)) return KVL_OK;
    if (depth > 16) return kvl__errorf(KVL_ERR_FORMAT, "%s: %s: nested too deeply", t->path, where);
    if (!cJSON_IsObject(n)) return kvl__errorf(KVL_ERR_FORMAT, "%s: %s: expected an object", t->path, where);
    const char *ty = type_of(n);
    if (!ty) return kvl__errorf(KVL_ERR_FORMAT, "%s: %s: missing \"type\"", t->path, where);
    if (!strcmp(ty, "NFC")) { t->nfc = 1; return KVL_OK; }
    if (!strcmp(ty, "Sequence")) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        if (!cJSON_IsArray(arr))
            return kvl__errorf(KVL_ERR_FORMAT, "%s: %s.normalizers: expected an array", t->path, where);
        const cJSON *it;
        int i = 0;
        cJSON_ArrayForEach(it, arr) {
            char w[128];
            snprintf(w, sizeof w, "%s.normalizers[%d]", where, i++);
            kvl_status st = load_normalizer(t, it, w, depth + 1);
            if (st) return st;
        }
        return KVL_OK;
    }
    return kvl__errorf(KVL_ERR_UNSUPPORTED, "%s: %s: normalizer type \"%s\" is not supported (NFC, Sequence)",
                      t->path, where, ty);
}

/* ---- pre-tokenizer -------------------------------------------------------------------------- */

static kvl_status add_pretok(kvl_tokenizer *t, kvl__pretok *p) {
    kvl__pretok *np = realloc(t->pretoks, (t->n_pretoks + 1) * sizeof *np);
    if (!np) {
        pcre2_code_free(p->re);
        return kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory", t->path);
    }
    t->pretoks = np;
    t->pretoks[t->n_pretoks++] = *p;
    return KVL_OK;
}

static void jit_compile(kvl__pretok *p) {
    p->jit = pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE) == 0;
}

static kvl_status load_pretok(kvl_tokenizer *t, const cJSON *n, const char *where, int depth) {
    if (is_null(n)) return KVL_OK;
    if (depth > 16) return kvl__errorf(KVL_ERR_FORMAT, "%s: %s: nested too deeply", t->path, where);
    if (!cJSON_IsObject(n)) return kvl__errorf(KVL_ERR_FORMAT, "%s: %s: expected an object", t->path, where);
    const char *ty = type_of(n);
    if (!ty) return kvl__errorf(KVL_ERR_FORMAT, "%s: %s: missing \"type\"", t->path, where);
    kvl_status st;
    char w[160];
    if (!strcmp(ty, "Sequence")) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(n, "pretokenizers");
        if (!cJSON_IsArray(arr))
            return kvl__errorf(KVL_ERR_FORMAT, "%s: %s.pretokenizers: expected an array", t->path, where);
        const cJSON *it;
        int i = 0;
        cJSON_ArrayForEach(it, arr) {
            snprintf(w, sizeof w, "%s.pretokenizers[%d]", where, i++);
            if ((st = load_pretok(t, it, w, depth + 1))) return st;
        }
        return KVL_OK;
    }
    if (t->byte_level)
        return kvl__errorf(KVL_ERR_UNSUPPORTED,
                          "%s: %s: pre-tokenizer \"%s\" after ByteLevel is not supported", t->path, where, ty);
    kvl__pretok p;
    memset(&p, 0, sizeof p);
    if (!strcmp(ty, "Split")) {
        p.kind = KVL_PRETOK_SPLIT;
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(n, "pattern");
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *lit = cJSON_GetObjectItemCaseSensitive(pat, "String");
        if (!cJSON_IsObject(pat) || (!cJSON_IsString(re) && !cJSON_IsString(lit)))
            return kvl__errorf(KVL_ERR_FORMAT, "%s: %s.pattern: expected {\"Regex\": str} or {\"String\": str}",
                              t->path, where);
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(n, "behavior");
        if (!cJSON_IsString(beh))
            return kvl__errorf(KVL_ERR_FORMAT, "%s: %s.behavior: expected a string", t->path, where);
        static const struct { const char *name; kvl__split_behavior b; } B[] = {
            {"Removed", KVL_SPLIT_REMOVED}, {"Isolated", KVL_SPLIT_ISOLATED},
            {"MergedWithPrevious", KVL_SPLIT_MERGED_PREV}, {"MergedWithNext", KVL_SPLIT_MERGED_NEXT},
            {"Contiguous", KVL_SPLIT_CONTIGUOUS}};
        int found = 0;
        for (size_t i = 0; i < sizeof B / sizeof B[0]; i++)
            if (!strcmp(beh->valuestring, B[i].name)) { p.behavior = B[i].b; found = 1; }
        if (!found)
            return kvl__errorf(KVL_ERR_FORMAT, "%s: %s.behavior: unknown behavior \"%s\"", t->path, where,
                              beh->valuestring);
        if ((st = get_bool(t->path, where, n, "invert", 0, &p.invert))) return st;
        snprintf(w, sizeof w, "%s: %s.pattern", t->path, where);
        if ((st = kvl__pretok_compile_regex(cJSON_IsString(re) ? re->valuestring : lit->valuestring,
                                           !cJSON_IsString(re), w, &p.re)))
            return st;
        jit_compile(&p);
        return add_pretok(t, &p);
    }
    if (!strcmp(ty, "ByteLevel")) {
        p.kind = KVL_PRETOK_BYTELEVEL;
        if ((st = get_bool(t->path, where, n, "add_prefix_space", 1, &p.add_prefix_space))) return st;
        if ((st = get_bool(t->path, where, n, "use_regex", 1, &p.use_regex))) return st;
        if (p.use_regex) {
            snprintf(w, sizeof w, "%s: %s (GPT-2 pattern)", t->path, where);
            if ((st = kvl__pretok_compile_regex(kvl__gpt2_pattern(), 0, w, &p.re))) return st;
            jit_compile(&p);
        }
        t->byte_level = 1;
        return add_pretok(t, &p);
    }
    return kvl__errorf(KVL_ERR_UNSUPPORTED,
                      "%s: %s: pre-tokenizer type \"%s\" is not supported (Split, ByteLevel, Sequence)",
                      t->path, where, ty);
}

/* ---- decoder / post-processor --------------------------------------------------------------- */

static kvl_status check_decoder(kvl_tokenizer *t, const cJSON *n, const char *where, int depth) {
    if (is_null(n))
        return kvl__errorf(KVL_ERR_UNSUPPORTED, "%s: %s: a null decoder is not supported (ByteLevel)", t->path, where);
    if (depth > 16 || !cJSON_IsObject(n))
        return kvl__errorf(KVL_ERR_FORMAT, "%s: %s: expected an object", t->path, where);
    const char *ty = type_of(n);
    if (!ty) return kvl__errorf(KVL_ERR_FORMAT, "%s: %s: missing \"type\"", t->path, where);
    if (!strcmp(ty, "ByteLevel")) return KVL_OK;
    if (!strcmp(ty, "Sequence")) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(n, "decoders");
        if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) == 0)
            return kvl__errorf(KVL_ERR_FORMAT, "%s: %s.decoders: expected a non-empty array", t->path, where);
        const cJSON *it;
        int i = 0;
        cJSON_ArrayForEach(it, arr) {
            char w[128];
            snprintf(w, sizeof w, "%s.decoders[%d]", where, i++);
            kvl_status st = check_decoder(t, it, w, depth + 1);
            if (st) return st;
        }
        return KVL_OK;
    }
    return kvl__errorf(KVL_ERR_UNSUPPORTED, "%s: %s: decoder type \"%s\" is not supported (ByteLevel)",
                      t->path, where, ty);
}

static kvl_status check_post(kvl_tokenizer *t, const cJSON *n, const char *where, int depth) {
    if (is_null(n)) return KVL_OK;
    if (depth > 16 || !cJSON_IsObject(n))
        return kvl__errorf(KVL_ERR_FORMAT, "%s: %s: expected an object", t->path, where);
    const char *ty = type_of(n);
    if (!ty) return kvl__errorf(KVL_ERR_FORMAT, "%s: %s: missing \"type\"", t->path, where);
    /* only used with add_special_tokens=true, which kvlingo never does */
    if (!strcmp(ty, "ByteLevel") || !strcmp(ty, "TemplateProcessing")) return KVL_OK;
    if (!strcmp(ty, "Sequence")) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(n, "processors");
        if (!cJSON_IsArray(arr))
            return kvl__errorf(KVL_ERR_FORMAT, "%s: %s.processors: expected an array", t->path, where);
        const cJSON *it;
        int i = 0;
        cJSON_ArrayForEach(it, arr) {
            char w[128];
            snprintf(w, sizeof w, "%s.processors[%d]", where, i++);
            kvl_status st = check_post(t, it, w, depth + 1);
            if (st) return st;
        }
        return KVL_OK;
    }
    return kvl__errorf(KVL_ERR_UNSUPPORTED,
                      "%s: %s: post-processor type \"%s\" is not supported (ByteLevel, TemplateProcessing)",
                      t->path, where, ty);
}

/* ---- model ---------------------------------------------------------------------------------- */

static kvl_status check_affix(kvl_tokenizer *t, const cJSON *m, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, key);
    if (is_null(v) || (cJSON_IsString(v) && v->valuestring[0] == '\0')) return KVL_OK;
    return kvl__errorf(KVL_ERR_UNSUPPORTED, "%s: model.%s: a non-empty value is not supported", t->path, key);
}

static int32_t max_id_seen(kvl_tokenizer *t, int32_t id) {
    if ((size_t)id + 1 > t->n_ids) t->n_ids = (size_t)id + 1;
    return id;
}

static kvl_status parse_id(kvl_tokenizer *t, const cJSON *v, const char *what, const char *name, int32_t *out) {
    if (!cJSON_IsNumber(v))
        return kvl__errorf(KVL_ERR_FORMAT, "%s: %s \"%.100s\": id is not a number", t->path, what, name);
    double d = v->valuedouble;
    if (!(d >= 0 && d < KVL_TOK_MAX_ID) || d != (double)(int32_t)d)
        return kvl__errorf(KVL_ERR_FORMAT, "%s: %s \"%.100s\": id %g out of range [0, %d)", t->path, what, name,
                          d, KVL_TOK_MAX_ID);
    *out = max_id_seen(t, (int32_t)d);
    return KVL_OK;
}

/* Byte-level raw bytes of a vocabulary string; returns 0 if some char is not a byte char. */
static int bytelevel_to_bytes(const char *s, size_t len, char *out, size_t *olen) {
    size_t i = 0, o = 0;
    while (i < len) {
        uint32_t cp;
        size_t n = kvl__utf8_decode((const uint8_t *)s + i, len - i, &cp);
        if (n == 0) return 0;
        int b = kvl__bytelevel_byte(cp);
        if (b < 0) return 0;
        out[o++] = (char)b;
        i += n;
    }
    *olen = o;
    return 1;
}

static kvl_status load_model(kvl_tokenizer *t, const cJSON *m) {
    kvl_status st;
    if (is_null(m)) return kvl__errorf(KVL_ERR_FORMAT, "%s: missing \"model\"", t->path);
    if (!cJSON_IsObject(m)) return kvl__errorf(KVL_ERR_FORMAT, "%s: model: expected an object", t->path);
    const char *ty = type_of(m);
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(m, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(m, "merges");
    if (ty && strcmp(ty, "BPE"))
        return kvl__errorf(KVL_ERR_UNSUPPORTED, "%s: model: type \"%s\" is not supported (BPE)", t->path, ty);
    if (!ty && !merges)
        return kvl__errorf(KVL_ERR_UNSUPPORTED, "%s: model: no \"type\" and no merges: only BPE is supported", t->path);
    if (!cJSON_IsObject(vocab)) return kvl__errorf(KVL_ERR_FORMAT, "%s: model.vocab: expected an object", t->path);
    if (!cJSON_IsArray(merges)) return kvl__errorf(KVL_ERR_FORMAT, "%s: model.merges: expected an array", t->path);
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(m, "dropout");
    if (!is_null(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0.0))
        return kvl__errorf(KVL_ERR_UNSUPPORTED, "%s: model.dropout: BPE dropout is not supported", t->path);
    int byte_fallback;
    if ((st = get_bool(t->path, "model", m, "byte_fallback", 0, &byte_fallback))) return st;
    if (byte_fallback) return kvl__errorf(KVL_ERR_UNSUPPORTED, "%s: model.byte_fallback: not supported", t->path);
    if ((st = check_affix(t, m, "continuing_subword_prefix")) || (st = check_affix(t, m, "end_of_word_suffix")))
        return st;
    if ((st = get_bool(t->path, "model", m, "ignore_merges", 0, &t->ignore_merges))) return st;
    if ((st = get_bool(t->path, "model", m, "fuse_unk", 0, &t->fuse_unk))) return st;

    int nv = cJSON_GetArraySize(vocab);
    if ((st = kvl__strmap_init(&t->vocab_str, (size_t)nv)) || (st = kvl__strmap_init(&t->vocab_bytes, (size_t)nv)))
        return st;
    char *tmp = NULL;
    size_t tmp_cap = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        int32_t id;
        if ((st = parse_id(t, it, "model.vocab", it->string, &id))) goto out;
        size_t klen = strlen(it->string);
        int existed;
        if ((st = kvl__strmap_put(&t->vocab_str, it->string, klen, id, &existed))) goto out;
        if (t->byte_level) {
            if (klen > tmp_cap) {
                free(tmp);
                tmp_cap = klen * 2 + 16;
                tmp = malloc(tmp_cap);
                if (!tmp) { st = kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory", t->path); goto out; }
            }
            size_t blen;
            if (bytelevel_to_bytes(it->string, klen, tmp, &blen) &&
                (st = kvl__strmap_put(&t->vocab_bytes, tmp, blen, id, NULL)))
                goto out;
        } else if ((st = kvl__strmap_put(&t->vocab_bytes, it->string, klen, id, NULL))) {
            goto out;
        }
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_id[b] = t->byte_level ? kvl__strmap_get(&t->vocab_bytes, &c, 1) : -1;
    }

    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(m, "unk_token");
    t->unk_id = -1;
    if (!is_null(unk)) {
        if (!cJSON_IsString(unk)) { st = kvl__errorf(KVL_ERR_FORMAT, "%s: model.unk_token: expected a string", t->path); goto out; }
        t->unk_id = kvl__strmap_get(&t->vocab_str, unk->valuestring, strlen(unk->valuestring));
        if (t->unk_id < 0) {
            st = kvl__errorf(KVL_ERR_FORMAT, "%s: model.unk_token \"%.100s\" is not in model.vocab", t->path,
                            unk->valuestring);
            goto out;
        }
    }

    int nm = cJSON_GetArraySize(merges);
    if ((st = kvl__mergemap_init(&t->merges, (size_t)nm))) goto out;
    int rank = 0;
    cJSON_ArrayForEach(it, merges) {
        const char *a, *b;
        size_t alen, blen;
        if (cJSON_IsString(it)) {
            const char *sp = strchr(it->valuestring, ' ');
            if (!sp) {
                st = kvl__errorf(KVL_ERR_FORMAT, "%s: model.merges[%d]: \"%.100s\" is not \"left right\"", t->path,
                                rank, it->valuestring);
                goto out;
            }
            a = it->valuestring;
            alen = (size_t)(sp - a);
            b = sp + 1;
            blen = strlen(b);
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(it->child) &&
                   cJSON_IsString(it->child->next)) {
            a = it->child->valuestring;
            alen = strlen(a);
            b = it->child->next->valuestring;
            blen = strlen(b);
        } else {
            st = kvl__errorf(KVL_ERR_FORMAT, "%s: model.merges[%d]: expected \"a b\" or [\"a\", \"b\"]", t->path, rank);
            goto out;
        }
        int32_t ia = kvl__strmap_get(&t->vocab_str, a, alen);
        int32_t ib = kvl__strmap_get(&t->vocab_str, b, blen);
        if (ia < 0 || ib < 0) {
            st = kvl__errorf(KVL_ERR_FORMAT, "%s: model.merges[%d]: token \"%.*s\" is not in model.vocab", t->path,
                            rank, (int)(ia < 0 ? (alen > 100 ? 100 : alen) : (blen > 100 ? 100 : blen)),
                            ia < 0 ? a : b);
            goto out;
        }
        if (alen + blen > tmp_cap) {
            free(tmp);
            tmp_cap = (alen + blen) * 2 + 16;
            tmp = malloc(tmp_cap);
            if (!tmp) { st = kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory", t->path); goto out; }
        }
        memcpy(tmp, a, alen);
        memcpy(tmp + alen, b, blen);
        int32_t inew = kvl__strmap_get(&t->vocab_str, tmp, alen + blen);
        if (inew < 0) {
            st = kvl__errorf(KVL_ERR_FORMAT, "%s: model.merges[%d]: merged token \"%.*s\" is not in model.vocab",
                            t->path, rank, (int)((alen + blen) > 100 ? 100 : alen + blen), tmp);
            goto out;
        }
        if ((st = kvl__mergemap_put(&t->merges, ia, ib, rank, inew))) goto out;
        rank++;
    }
    st = KVL_OK;
out:
    free(tmp);
    return st;
}

/* ---- added tokens --------------------------------------------------------------------------- */

static kvl_status load_added(kvl_tokenizer *t, const cJSON *arr) {
    if (is_null(arr)) return KVL_OK;
    if (!cJSON_IsArray(arr)) return kvl__errorf(KVL_ERR_FORMAT, "%s: added_tokens: expected an array", t->path);
    int n = cJSON_GetArraySize(arr);
    kvl_status st = kvl__strmap_init(&t->added_map, (size_t)n);
    if (st) return st;
    if (n == 0) return KVL_OK;
    t->added = calloc((size_t)n, sizeof *t->added);
    if (!t->added) return kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory", t->path);
    const cJSON *it;
    int i = 0;
    cJSON_ArrayForEach(it, arr) {
        char w[64];
        snprintf(w, sizeof w, "added_tokens[%d]", i);
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (!cJSON_IsObject(it) || !cJSON_IsString(content))
            return kvl__errorf(KVL_ERR_FORMAT, "%s: %s: expected an object with a string \"content\"", t->path, w);
        kvl__added_token *a = &t->added[t->n_added];
        a->len = strlen(content->valuestring);
        if (!kvl__utf8_valid(content->valuestring, a->len))
            return kvl__errorf(KVL_ERR_FORMAT, "%s: %s.content: not valid UTF-8", t->path, w);
        if ((st = parse_id(t, cJSON_GetObjectItemCaseSensitive(it, "id"), w, content->valuestring, &a->id)))
            return st;
        int sp, ls, rs, nz, sw;
        if ((st = get_bool(t->path, w, it, "special", 0, &sp)) || (st = get_bool(t->path, w, it, "lstrip", 0, &ls)) ||
            (st = get_bool(t->path, w, it, "rstrip", 0, &rs)) || (st = get_bool(t->path, w, it, "normalized", !sp, &nz)) ||
            (st = get_bool(t->path, w, it, "single_word", 0, &sw)))
            return st;
        a->content = strdup(content->valuestring);
        if (!a->content) return kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory", t->path);
        a->special = (uint8_t)sp;
        a->lstrip = (uint8_t)ls;
        a->rstrip = (uint8_t)rs;
        a->normalized = (uint8_t)nz;
        a->single_word = (uint8_t)sw;
        t->n_added++;
        if ((st = kvl__strmap_put(&t->added_map, a->content, a->len, a->id, NULL))) return st;
        i++;
    }
    return kvl__added_build(t);
}

/* ---- id tables ------------------------------------------------------------------------------ */

static kvl_status build_id_tables(kvl_tokenizer *t) {
    size_t n = t->n_ids;
    t->id_str = calloc(n ? n : 1, sizeof *t->id_str);
    t->id_bytes = calloc(n ? n : 1, sizeof *t->id_bytes);
    t->id_bytes_len = calloc(n ? n : 1, sizeof *t->id_bytes_len);
    t->id_special = calloc(n ? n : 1, 1);
    if (!t->id_str || !t->id_bytes || !t->id_bytes_len || !t->id_special)
        return kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory (id table of %zu)", t->path, n);
    for (size_t i = 0; i < t->vocab_str.cap; i++) {
        const kvl__strmap_entry *e = &t->vocab_str.slots[i];
        if (!e->used) continue;
        if (t->id_str[e->value])
            return kvl__errorf(KVL_ERR_FORMAT, "%s: model.vocab: id %d is used by two tokens (\"%.100s\", \"%.100s\")",
                              t->path, e->value, t->id_str[e->value], t->vocab_str.arena + e->off);
        t->id_str[e->value] = t->vocab_str.arena + e->off;
    }
    for (size_t i = 0; i < t->n_added; i++) {   /* added tokens override the model's string */
        t->id_str[t->added[i].id] = t->added[i].content;
        t->id_special[t->added[i].id] = t->added[i].special;
    }
    /* ByteLevel decoder: a token whose chars all map to bytes decodes to those bytes,
     * any other token to its own UTF-8 text */
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        if (t->id_str[i]) total += strlen(t->id_str[i]) + 1;
    char *arena = malloc(total ? total : 1);
    if (!arena) return kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory (decoder table)", t->path);
    t->id_bytes_arena = arena;
    size_t off = 0;
    t->max_token_bytes = 0;
    for (size_t i = 0; i < n; i++) {
        const char *s = t->id_str[i];
        if (!s) { t->id_bytes[i] = NULL; continue; }
        size_t len = strlen(s), blen;
        char *dst = arena + off;
        if (!bytelevel_to_bytes(s, len, dst, &blen)) {
            memcpy(dst, s, len);
            blen = len;
        }
        dst[blen] = '\0';
        t->id_bytes[i] = dst;
        t->id_bytes_len[i] = (uint32_t)blen;
        if (blen > t->max_token_bytes) t->max_token_bytes = blen;
        off += blen + 1;
    }
    t->id_bytes_arena = arena;
    return KVL_OK;
}

/* ---- public --------------------------------------------------------------------------------- */

void kvl_tokenizer_free(kvl_tokenizer *t) {
    if (!t) return;
    for (size_t i = 0; i < t->n_pretoks; i++) pcre2_code_free(t->pretoks[i].re);
    free(t->pretoks);
    kvl__strmap_free(&t->vocab_str);
    kvl__strmap_free(&t->vocab_bytes);
    kvl__strmap_free(&t->added_map);
    kvl__mergemap_free(&t->merges);
    kvl__added_free(t);
    free(t->id_str);
    free(t->id_bytes_arena);
    free(t->id_bytes);
    free(t->id_bytes_len);
    free(t->id_special);
    free(t->bos_token);
    free(t->chat_template);
    kvl__tokcache_free(t);
    free(t->path);
    free(t);
}

static kvl_status load_json_text(kvl_tokenizer *t, const char *text, size_t len) {
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root) return kvl__errorf(KVL_ERR_FORMAT, "%s: not valid JSON (near byte %td)", t->path,
                                 cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - text : (ptrdiff_t)-1);
    kvl_status st = KVL_OK;
    if (!cJSON_IsObject(root)) { st = kvl__errorf(KVL_ERR_FORMAT, "%s: expected a JSON object", t->path); goto out; }
    const cJSON *tr = cJSON_GetObjectItemCaseSensitive(root, "truncation");
    const cJSON *pad = cJSON_GetObjectItemCaseSensitive(root, "padding");
    if (!is_null(tr)) { st = kvl__errorf(KVL_ERR_UNSUPPORTED, "%s: truncation: must be null", t->path); goto out; }
    if (!is_null(pad)) { st = kvl__errorf(KVL_ERR_UNSUPPORTED, "%s: padding: must be null", t->path); goto out; }
    if ((st = load_normalizer(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), "normalizer", 0))) goto out;
    if ((st = load_pretok(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), "pre_tokenizer", 0))) goto out;
    if ((st = load_model(t, cJSON_GetObjectItemCaseSensitive(root, "model")))) goto out;
    if ((st = check_decoder(t, cJSON_GetObjectItemCaseSensitive(root, "decoder"), "decoder", 0))) goto out;
    if ((st = check_post(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), "post_processor", 0))) goto out;
    if ((st = load_added(t, cJSON_GetObjectItemCaseSensitive(root, "added_tokens")))) goto out;
    if (t->n_ids == 0) { st = kvl__errorf(KVL_ERR_FORMAT, "%s: model.vocab: empty vocabulary", t->path); goto out; }
    /* the id tables are sized by the largest id: ids far past the tokens there are (a 90-byte
     * file with one token of id 16777215 took 300 MB) are refused, with room for the gaps of
     * released vocabularies (reserved ids, added tokens past the model's) */
    const size_t n_tokens = t->vocab_str.count + t->n_added;
    if (t->n_ids > 2 * n_tokens + 65536) {
        st = kvl__errorf(KVL_ERR_FORMAT, "%s: model.vocab / added_tokens: ids reach %zu for %zu tokens "
                        "(at most twice the tokens and 65536 more)", t->path, t->n_ids - 1, n_tokens);
        goto out;
    }
    if ((st = build_id_tables(t))) goto out;
    st = kvl__tokcache_init(t);
out:
    cJSON_Delete(root);
    return st;
}

static kvl_status tokenizer_new(const char *path, kvl_tokenizer **out) {
    kvl_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory", path);
    t->path = strdup(path);
    if (!t->path) { free(t); return kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory", path); }
    t->eos_id = t->bos_id = t->unk_id = -1;
    *out = t;
    return KVL_OK;
}

/* For the fuzz target and tests: load from memory; `name` is used in messages. */
kvl_status kvl__tokenizer_load_json(const char *json, size_t len, const char *name, kvl_tokenizer **out) {
    if (out) *out = NULL;
    if (!json || !name || !out) return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl__tokenizer_load_json: NULL argument");
    kvl_tokenizer *t = NULL;
    kvl_status st = tokenizer_new(name, &t);
    if (st) return st;
    if ((st = load_json_text(t, json, len))) { kvl_tokenizer_free(t); return st; }
    *out = t;
    return KVL_OK;
}

kvl_status kvl_tokenizer_load(const char *path, kvl_tokenizer **out) {
    if (out) *out = NULL;
    if (!path || !out) return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_tokenizer_load: NULL argument");
    char *text;
    size_t len;
    kvl_status st = kvl__file_read(path, 0, 0, &text, &len);
    if (st) return st;
    st = kvl__tokenizer_load_json(text, len, path, out);
    free(text);
    return st;
}

static const char *config_token(const cJSON *v) {
    if (cJSON_IsString(v)) return v->valuestring;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsObject(v) && cJSON_IsString(c) ? c->valuestring : NULL;
}

static kvl_status load_config(kvl_tokenizer *t, const char *path) {
    char *text;
    size_t len;
    kvl_status st = kvl__file_read(path, 0, 1, &text, &len);
    if (st == KVL_ERR_NOT_FOUND) return KVL_OK;
    if (st) return st;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return kvl__errorf(KVL_ERR_FORMAT, "%s: not a valid JSON object", path);
    }
    const char *eos = config_token(cJSON_GetObjectItemCaseSensitive(root, "eos_token"));
    const char *bos = config_token(cJSON_GetObjectItemCaseSensitive(root, "bos_token"));
    if (eos) t->eos_id = kvl_tokenizer_token_id(t, eos);
    if (bos) {
        t->bos_id = kvl_tokenizer_token_id(t, bos);
        if (!(t->bos_token = strdup(bos))) st = kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory", path);
    }
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
    const char *tmpl = NULL;
    if (cJSON_IsString(ct)) {
        tmpl = ct->valuestring;
    } else if (cJSON_IsArray(ct)) {   /* [{"name": "default", "template": "..."}, ...] */
        const cJSON *it;
        cJSON_ArrayForEach(it, ct) {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(it, "name");
            const cJSON *tp = cJSON_GetObjectItemCaseSensitive(it, "template");
            if (cJSON_IsString(nm) && cJSON_IsString(tp) && !strcmp(nm->valuestring, "default")) tmpl = tp->valuestring;
        }
    }
    if (!st && tmpl && !(t->chat_template = strdup(tmpl))) st = kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory", path);
    cJSON_Delete(root);
    return st;
}

kvl_status kvl_tokenizer_load_dir(const char *dir, kvl_tokenizer **out) {
    if (out) *out = NULL;
    if (!dir || !out) return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_tokenizer_load_dir: NULL argument");
    size_t dl = strlen(dir);
    char *p = malloc(dl + 32);
    if (!p) return kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory", dir);
    snprintf(p, dl + 32, "%s/tokenizer.json", dir);
    kvl_tokenizer *t = NULL;
    kvl_status st = kvl_tokenizer_load(p, &t);
    if (st) { free(p); return st; }
    snprintf(p, dl + 32, "%s/tokenizer_config.json", dir);
    st = load_config(t, p);
    if (!st) {
        snprintf(p, dl + 32, "%s/chat_template.jinja", dir);
        char *text;
        size_t len;
        kvl_status r = kvl__file_read(p, 0, 1, &text, &len);
        if (r == KVL_OK) { free(t->chat_template); t->chat_template = text; }
        else if (r != KVL_ERR_NOT_FOUND) st = r;
    }
    free(p);
    if (st) { kvl_tokenizer_free(t); return st; }
    t->chat_format = t->chat_template ? kvl__chat_detect(t->chat_template) : KVL_CHAT_NONE;
    *out = t;
    return KVL_OK;
}

int32_t kvl_tokenizer_token_id(const kvl_tokenizer *t, const char *token) {
    if (!t || !token) return -1;
    size_t len = strlen(token);
    int32_t id = kvl__strmap_get(&t->added_map, token, len);
    return id >= 0 ? id : kvl__strmap_get(&t->vocab_str, token, len);
}

size_t kvl_tokenizer_vocab_size(const kvl_tokenizer *t) { return t ? t->n_ids : 0; }
int32_t kvl_tokenizer_eos_id(const kvl_tokenizer *t) { return t ? t->eos_id : -1; }
int32_t kvl_tokenizer_bos_id(const kvl_tokenizer *t) { return t ? t->bos_id : -1; }
int kvl_tokenizer_is_special(const kvl_tokenizer *t, int32_t id) {
    return t && id >= 0 && (size_t)id < t->n_ids && t->id_special[id];
}
kvl_chat_format kvl_tokenizer_chat_format(const kvl_tokenizer *t) { return t ? t->chat_format : KVL_CHAT_NONE; }

kvl_status kvl_tokenizer_token_bytes(const kvl_tokenizer *t, int32_t id, const char **bytes_out, size_t *len_out) {
    if (!t || !bytes_out || !len_out) return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_tokenizer_token_bytes: NULL argument");
    if (id < 0 || (size_t)id >= t->n_ids || !t->id_bytes[id])
        return kvl__errorf(KVL_ERR_RANGE, "kvl_tokenizer_token_bytes: id %d is not a token (vocab size %zu)", id, t->n_ids);
    *bytes_out = t->id_bytes[id];
    *len_out = t->id_bytes_len[id];
    return KVL_OK;
}
