/* engine/tokenizer/tokenizer_added.c: added tokens and the top-level encode.
 *
 * As tokenizers' AddedVocabulary: tokens with normalized=false are matched in the raw text,
 * tokens with normalized=true in each normalized remaining segment; matching is leftmost-longest
 * over all tokens (aho-corasick MatchKind::LeftmostLongest), non-overlapping, and each match is
 * then checked/extended by single_word, lstrip, rstrip exactly as find_matches does (Unicode \w
 * and \s of the Rust regex crate). */
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "error.h"
#include "tokenizer_internal.h"

/* ---- trie ----------------------------------------------------------------------------------- */

static int32_t trie_new_node(kvl__trie *tr, uint8_t byte) {
    if (tr->n_nodes == tr->cap) {
        size_t ncap = tr->cap ? tr->cap * 2 : 64;
        kvl__trie_node *nn = realloc(tr->nodes, ncap * sizeof *nn);
        if (!nn) return -1;
        tr->nodes = nn;
        tr->cap = ncap;
    }
    kvl__trie_node *n = &tr->nodes[tr->n_nodes];
    n->first_child = n->next_sibling = n->token = -1;
    n->byte = byte;
    return (int32_t)tr->n_nodes++;
}

static int32_t trie_child(const kvl__trie *tr, int32_t node, uint8_t byte) {
    for (int32_t c = tr->nodes[node].first_child; c >= 0; c = tr->nodes[c].next_sibling)
        if (tr->nodes[c].byte == byte) return c;
    return -1;
}

static kvl_status trie_insert(kvl__trie *tr, const char *s, size_t len, int32_t token) {
    if (tr->n_nodes == 0 && trie_new_node(tr, 0) < 0) goto oom;
    int32_t node = 0;
    for (size_t i = 0; i < len; i++) {
        uint8_t b = (uint8_t)s[i];
        int32_t c = trie_child(tr, node, b);
        if (c < 0) {
            c = trie_new_node(tr, b);
            if (c < 0) goto oom;
            tr->nodes[c].next_sibling = tr->nodes[node].first_child;
            tr->nodes[node].first_child = c;
        }
        node = c;
    }
    /* the first token with a given content wins (later duplicates are the same pattern) */
    if (tr->nodes[node].token < 0) tr->nodes[node].token = token;
    tr->first[(uint8_t)s[0]] = 1;
    tr->n_tokens++;
    return KVL_OK;
oom:
    return kvl__errorf(KVL_ERR_NOMEM, "tokenizer: out of memory (added tokens)");
}

void kvl__added_free(kvl_tokenizer *t) {
    for (size_t i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    t->added = NULL;
    t->n_added = 0;
    free(t->trie_raw.nodes);
    free(t->trie_norm.nodes);
    memset(&t->trie_raw, 0, sizeof t->trie_raw);
    memset(&t->trie_norm, 0, sizeof t->trie_norm);
}

kvl_status kvl__added_build(kvl_tokenizer *t) {
    /* tokenizers builds its tries from special tokens first, then the others, each in file order */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < t->n_added; i++) {
            kvl__added_token *a = &t->added[i];
            if ((pass == 0) != (a->special != 0) || a->len == 0) continue;
            kvl_status st;
            if (!a->normalized) {
                st = trie_insert(&t->trie_raw, a->content, a->len, (int32_t)i);
            } else {
                char *norm = NULL;
                size_t nlen = a->len;
                if (t->nfc && (st = kvl__tok_nfc(a->content, a->len, &norm, &nlen))) return st;
                st = nlen ? trie_insert(&t->trie_norm, norm ? norm : a->content, nlen, (int32_t)i) : KVL_OK;
                free(norm);
            }
            if (st) return st;
        }
    }
    return KVL_OK;
}

/* A special token may not be matched over a byte that `guard` marks (client text inside a
 * chat template): for those bytes the special tokens are out of the trie, as with tokenizers'
 * split_special_tokens, and the text is encoded as ordinary text. */
static int guarded(const kvl_tokenizer *t, const uint8_t *guard, int32_t tok, size_t from, size_t to) {
    if (!guard || !t->added[tok].special) return 0;
    for (size_t k = from; k < to; k++)
        if (guard[k]) return 1;
    return 0;
}

/* Leftmost-longest match at or after `pos`; returns 1 and sets *ms, *me, *tok when found. */
static int trie_find(const kvl_tokenizer *t, const kvl__trie *tr, const char *s, size_t len,
                     const uint8_t *guard, size_t pos, size_t *ms, size_t *me, int32_t *tok) {
    const uint8_t *p = (const uint8_t *)s;
    for (size_t i = pos; i < len; i++) {
        if (!tr->first[p[i]]) continue;
        int32_t node = 0, best = -1;
        size_t best_end = 0;
        for (size_t j = i; j < len; j++) {
            node = trie_child(tr, node, p[j]);
            if (node < 0) break;
            int32_t k = tr->nodes[node].token;
            if (k >= 0 && !guarded(t, guard, k, i, j + 1)) { best = k; best_end = j + 1; }
        }
        if (best >= 0) { *ms = i; *me = best_end; *tok = best; return 1; }
    }
    return 0;
}

/* ---- Unicode classes of the Rust regex crate ------------------------------------------------ */

static int is_white_space(uint32_t c) {
    return (c >= 0x9 && c <= 0xd) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
           c == 0x205f || c == 0x3000;
}

static int is_word_char(uint32_t c) {
    if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (c == 0x200c || c == 0x200d) return 1;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
        return 1;
    default:
        return 0;
    }
}

/* Last code point of s[0..end) (end > 0, valid UTF-8). */
static uint32_t last_cp(const char *s, size_t end, size_t *start) {
    size_t i = end - 1;
    while (i > 0 && ((uint8_t)s[i] & 0xc0) == 0x80) i--;
    uint32_t cp = 0;
    kvl__utf8_decode((const uint8_t *)s + i, end - i, &cp);
    if (start) *start = i;
    return cp;
}

kvl_status kvl__added_split(const kvl_tokenizer *t, const kvl__trie *trie, const char *s, size_t len,
                           const uint8_t *guard, kvl__added_cb cb, void *ctx) {
    if (len == 0) return KVL_OK;
    if (trie->n_tokens == 0) return cb(ctx, s, len, -1);
    size_t start_offset = 0, pos = 0, ms, me;
    int32_t tok;
    kvl_status st;
    while (pos < len && trie_find(t, trie, s, len, guard, pos, &ms, &me, &tok)) {
        pos = me;
        const kvl__added_token *a = &t->added[tok];
        size_t start = ms, stop = me;
        if (a->single_word) {
            int start_space = start == 0 || !is_word_char(last_cp(s, start, NULL));
            uint32_t cp = 0;
            if (stop < len) kvl__utf8_decode((const uint8_t *)s + stop, len - stop, &cp);
            int stop_space = stop == len || !is_word_char(cp);
            if (!start_space || !stop_space) continue;
        }
        if (a->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t cs;
                uint32_t cp = last_cp(s, ns, &cs);
                if (!is_white_space(cp)) break;
                ns = cs;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip) {
            while (stop < len) {
                uint32_t cp;
                size_t n = kvl__utf8_decode((const uint8_t *)s + stop, len - stop, &cp);
                if (n == 0 || !is_white_space(cp)) break;
                stop += n;
            }
        }
        if (start_offset < start && (st = cb(ctx, s + start_offset, start - start_offset, -1))) return st;
        if ((st = cb(ctx, s + start, stop - start, a->id))) return st;
        start_offset = stop;
    }
    if (start_offset < len) return cb(ctx, s + start_offset, len - start_offset, -1);
    return KVL_OK;
}

/* ---- top-level encode ----------------------------------------------------------------------- */

typedef struct enc_ctx {
    const kvl_tokenizer *t;
    kvl__idvec *out;
    pcre2_match_data *md;
    const char *text;        /* the whole input, which `guard` (or NULL) marks byte by byte */
    const uint8_t *guard;
} enc_ctx;

static kvl_status norm_cb(void *vctx, const char *s, size_t len, int32_t id) {
    enc_ctx *c = vctx;
    if (id >= 0) return kvl__idvec_push(c->out, id);
    return kvl__tok_pretok_encode(c->t, s, len, c->out, c->md);
}

static kvl_status raw_cb(void *vctx, const char *s, size_t len, int32_t id) {
    enc_ctx *c = vctx;
    if (id >= 0) return kvl__idvec_push(c->out, id);
    char *norm = NULL;
    size_t nlen = len;
    kvl_status st;
    if (c->t->nfc && (st = kvl__tok_nfc(s, len, &norm, &nlen))) return st;
    const uint8_t *guard = c->guard ? c->guard + (s - c->text) : NULL;
    uint8_t *nguard = NULL;
    if (guard && norm) {
        /* normalizing moved the bytes: the whole piece is guarded when any of it was */
        int any = 0;
        for (size_t k = 0; k < len && !any; k++) any = guard[k] != 0;
        guard = NULL;
        if (any && !(guard = nguard = malloc(nlen ? nlen : 1))) {
            free(norm);
            return kvl__errorf(KVL_ERR_NOMEM, "kvl_tokenizer_encode: out of memory");
        }
        if (any) memset(nguard, 1, nlen);
    }
    st = kvl__added_split(c->t, &c->t->trie_norm, norm ? norm : s, nlen, guard, norm_cb, c);
    free(nguard);
    free(norm);
    return st;
}

kvl_status kvl__tokenizer_encode_guarded(const kvl_tokenizer *tok, const char *text, size_t len,
                                        const uint8_t *guard, int32_t **ids_out, size_t *n_out) {
    if (ids_out) *ids_out = NULL;
    if (n_out) *n_out = 0;
    if (!tok || !ids_out || !n_out || (!text && len))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_tokenizer_encode: NULL argument");
    if (!kvl__utf8_valid(text, len))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_tokenizer_encode: text is not valid UTF-8");
    if (len == 0) return KVL_OK;
    kvl__idvec out = {0};
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!md) return kvl__errorf(KVL_ERR_NOMEM, "kvl_tokenizer_encode: out of memory");
    enc_ctx c = {tok, &out, md, text, guard};
    kvl_status st = kvl__added_split(tok, &tok->trie_raw, text, len, guard, raw_cb, &c);
    pcre2_match_data_free(md);
    if (st) {
        free(out.v);
        return st;
    }
    *ids_out = out.v;
    *n_out = out.n;
    return KVL_OK;
}

kvl_status kvl_tokenizer_encode(const kvl_tokenizer *tok, const char *text, size_t len,
                                int32_t **ids_out, size_t *n_out) {
    return kvl__tokenizer_encode_guarded(tok, text, len, NULL, ids_out, n_out);
}
