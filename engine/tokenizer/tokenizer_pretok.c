/* engine/tokenizer/tokenizer_pretok.c: NFC normalization and the pre-tokenizers (Split, ByteLevel).
 *
 * Split follows tokenizers' NormalizedString::split: the regex's matches and the gaps between
 * them cover the text; `invert` swaps the two; the behaviour decides how matches join their
 * neighbours; empty pieces are dropped.  Regexes run through PCRE2 (UTF + UCP, JIT when
 * available).  tokenizers uses Oniguruma, whose \s is Unicode White_Space; PCRE2's differs
 * (U+0085, U+180E), so \s and \S are rewritten to the explicit White_Space set. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "error.h"
#include "tokenizer_internal.h"

#define WS_SET "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

kvl_status kvl__pretok_compile_regex(const char *pattern, int literal, const char *where,
                                    pcre2_code **out) {
    *out = NULL;
    size_t plen = strlen(pattern);
    char *tr = NULL;
    const char *use = pattern;
    size_t ulen = plen;
    if (!literal) {
        kvl__buf b = {0};
        int in_class = 0;
        kvl_status st = KVL_OK;
        for (size_t i = 0; i < plen && !st; i++) {
            char c = pattern[i];
            if (c == '\\' && i + 1 < plen) {
                char d = pattern[i + 1];
                if (d == 's') {
                    st = in_class ? kvl__buf_append(&b, WS_SET, strlen(WS_SET))
                                  : kvl__buf_append(&b, "[" WS_SET "]", strlen(WS_SET) + 2);
                } else if (d == 'S' && !in_class) {
                    st = kvl__buf_append(&b, "[^" WS_SET "]", strlen(WS_SET) + 3);
                } else {
                    st = kvl__buf_append(&b, pattern + i, 2);
                }
                i++;
                continue;
            }
            if (!in_class && c == '[') {
                in_class = 1;
                st = kvl__buf_append(&b, &c, 1);
                /* a ']' right after '[' or '[^' is literal */
                if (!st && i + 1 < plen && pattern[i + 1] == '^') { st = kvl__buf_append(&b, "^", 1); i++; }
                if (!st && i + 1 < plen && pattern[i + 1] == ']') { st = kvl__buf_append(&b, "]", 1); i++; }
                continue;
            }
            if (in_class && c == ']') in_class = 0;
            st = kvl__buf_append(&b, &c, 1);
        }
        if (st) { free(b.p); return st; }
        if (!b.p) { b.p = calloc(1, 1); if (!b.p) return kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory", where); }
        tr = b.p;
        use = tr;
        ulen = b.n;
    }
    int errcode;
    PCRE2_SIZE erroff;
    uint32_t opts = literal ? (PCRE2_UTF | PCRE2_LITERAL) : (PCRE2_UTF | PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)use, ulen, opts, &errcode, &erroff, NULL);
    free(tr);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(errcode, msg, sizeof msg);
        return kvl__errorf(KVL_ERR_FORMAT, "%s: invalid regex \"%.200s\": %s", where, pattern, (char *)msg);
    }
    *out = re;
    return KVL_OK;
}

/* ---- NFC ------------------------------------------------------------------------------------ */

/* Code points that are NFC_Quick_Check=Yes with canonical combining class 0 in every Unicode
 * version: a string made only of them is already NFC. */
static inline int nfc_stable(uint32_t cp) {
    return cp < 0x300 || (cp >= 0x400 && cp <= 0x482) || (cp >= 0x48a && cp <= 0x52f) ||
           (cp >= 0x4e00 && cp <= 0x9fff) || (cp >= 0xac00 && cp <= 0xd7a3) ||
           (cp >= 0x3041 && cp <= 0x3096) || (cp >= 0x30a1 && cp <= 0x30fa) ||
           (cp >= 0xff01 && cp <= 0xff5e);
}

kvl_status kvl__tok_nfc(const char *s, size_t len, char **out, size_t *out_len) {
    *out = NULL;
    *out_len = len;
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0;
    int stable = 1;
    while (i < len) {
        if (p[i] < 0x80) { i++; continue; }
        uint32_t cp;
        size_t n = kvl__utf8_decode(p + i, len - i, &cp);
        if (n == 0 || !nfc_stable(cp)) { stable = 0; break; }
        i += n;
    }
    if (stable) return KVL_OK;
    /* Hangul syllables followed by a trailing jamo compose; kana followed by U+3099/U+309A do:
     * both cases contain a non-stable code point and take this path. */
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &dst,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (r < 0) {
        free(dst);
        if (r == UTF8PROC_ERROR_NOMEM) return kvl__errorf(KVL_ERR_NOMEM, "tokenizer: out of memory (NFC)");
        return kvl__errorf(KVL_ERR_INVALID_ARG, "tokenizer: NFC normalizer: %s", utf8proc_errmsg(r));
    }
    *out = (char *)dst;
    *out_len = (size_t)r;
    return KVL_OK;
}

/* ---- pre-tokenization ----------------------------------------------------------------------- */

typedef struct span { size_t a, b; int m; } span;

typedef struct spanvec { span *v; size_t n, cap; span stack[64]; } spanvec;

static kvl_status span_push(spanvec *sv, size_t a, size_t b, int m) {
    if (sv->n == sv->cap) {
        size_t ncap = sv->cap * 2;
        span *nv;
        if (sv->v == sv->stack) {
            nv = malloc(ncap * sizeof *nv);
            if (nv) memcpy(nv, sv->stack, sv->n * sizeof *nv);
        } else {
            nv = realloc(sv->v, ncap * sizeof *nv);
        }
        if (!nv) return kvl__errorf(KVL_ERR_NOMEM, "tokenizer: out of memory (pre-tokens)");
        sv->v = nv;
        sv->cap = ncap;
    }
    sv->v[sv->n].a = a;
    sv->v[sv->n].b = b;
    sv->v[sv->n].m = m;
    sv->n++;
    return KVL_OK;
}

static void spanvec_init(spanvec *sv) { sv->v = sv->stack; sv->n = 0; sv->cap = 64; }
static void spanvec_free(spanvec *sv) { if (sv->v != sv->stack) free(sv->v); }

/* Matches and gaps of `re` over s[0..len) (tokenizers' Pattern::find_matches). */
static kvl_status regex_spans(const kvl__pretok *pt, const char *s, size_t len, pcre2_match_data *md,
                              spanvec *sv) {
    if (len == 0) return span_push(sv, 0, 0, 0);
    size_t prev = 0, off = 0;
    kvl_status st;
    while (off <= len) {
        int rc = pt->jit ? pcre2_jit_match(pt->re, (PCRE2_SPTR)s, len, off, 0, md, NULL)
                         : pcre2_match(pt->re, (PCRE2_SPTR)s, len, off, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(pt->re, (PCRE2_SPTR)s, len, off, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return kvl__errorf(KVL_ERR_FORMAT, "its regex failed: %s", (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t a = ov[0], b = ov[1];
        if (a > prev && (st = span_push(sv, prev, a, 0))) return st;
        if ((st = span_push(sv, a, b, 1))) return st;
        prev = b;
        if (b == a) {   /* empty match: step one character */
            if (b >= len) break;
            size_t step = 1;
            while (b + step < len && ((uint8_t)s[b + step] & 0xc0) == 0x80) step++;
            off = b + step;
        } else {
            off = b;
        }
    }
    if (prev < len) return span_push(sv, prev, len, 0);
    return KVL_OK;
}

/* Apply a Split behaviour in place (tokenizers' SplitDelimiterBehavior). */
static void apply_behavior(spanvec *sv, kvl__split_behavior beh, int invert) {
    if (invert)
        for (size_t i = 0; i < sv->n; i++) sv->v[i].m = !sv->v[i].m;
    size_t w = 0;
    int prev_match = 0;
    switch (beh) {
    case KVL_SPLIT_ISOLATED:
        return;
    case KVL_SPLIT_REMOVED:
        for (size_t i = 0; i < sv->n; i++)
            if (!sv->v[i].m) sv->v[w++] = sv->v[i];
        sv->n = w;
        return;
    case KVL_SPLIT_MERGED_PREV:
        for (size_t i = 0; i < sv->n; i++) {
            span c = sv->v[i];
            if (c.m && !prev_match && w > 0) sv->v[w - 1].b = c.b;
            else sv->v[w++] = c;
            prev_match = c.m;
        }
        sv->n = w;
        return;
    case KVL_SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < sv->n; i++) {
            span c = sv->v[i];
            if (c.m == prev_match && w > 0) sv->v[w - 1].b = c.b;
            else sv->v[w++] = c;
            prev_match = c.m;
        }
        sv->n = w;
        return;
    case KVL_SPLIT_MERGED_NEXT: {
        /* fold from the right, then the kept pieces are in reverse order at the end */
        size_t r = sv->n;   /* write position from the right */
        for (size_t k = sv->n; k-- > 0;) {
            span c = sv->v[k];
            if (c.m && !prev_match && r < sv->n) sv->v[r].a = c.a;
            else sv->v[--r] = c;
            prev_match = c.m;
        }
        memmove(sv->v, sv->v + r, (sv->n - r) * sizeof *sv->v);
        sv->n -= r;
        return;
    }
    }
}

static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char *kvl__gpt2_pattern(void) { return GPT2_PATTERN; }

static kvl_status pretok_stage(const kvl_tokenizer *t, size_t k, const char *s, size_t len,
                               kvl__idvec *out, pcre2_match_data *md);

static kvl_status split_stage(const kvl_tokenizer *t, size_t k, const kvl__pretok *pt, const char *s,
                              size_t len, kvl__split_behavior beh, int invert, kvl__idvec *out,
                              pcre2_match_data *md) {
    spanvec sv;
    spanvec_init(&sv);
    kvl_status st = regex_spans(pt, s, len, md, &sv);
    if (st) {   /* which file and which stage: the input itself is fine, the pattern is not */
        char why[256];
        snprintf(why, sizeof why, "%s", kvl_last_error());
        kvl__errorf(KVL_ERR_FORMAT, "%s: pre_tokenizer %zu (%s): %s on %zu bytes of input", t->path, k,
                    pt->kind == KVL_PRETOK_SPLIT ? "Split" : "ByteLevel", why, len);
    }
    if (!st) {
        apply_behavior(&sv, beh, invert);
        for (size_t i = 0; i < sv.n && !st; i++)
            if (sv.v[i].b > sv.v[i].a) st = pretok_stage(t, k + 1, s + sv.v[i].a, sv.v[i].b - sv.v[i].a, out, md);
    }
    spanvec_free(&sv);
    return st;
}

static kvl_status pretok_stage(const kvl_tokenizer *t, size_t k, const char *s, size_t len,
                               kvl__idvec *out, pcre2_match_data *md) {
    if (len == 0) return KVL_OK;
    if (k == t->n_pretoks) return kvl__bpe_encode_word(t, s, len, out);
    const kvl__pretok *pt = &t->pretoks[k];
    if (pt->kind == KVL_PRETOK_SPLIT) return split_stage(t, k, pt, s, len, pt->behavior, pt->invert, out, md);
    /* ByteLevel: optional prefix space, optional GPT-2 split; the byte mapping itself is implicit
     * (pre-tokens stay raw bytes, see tokenizer_internal.h). */
    if (pt->add_prefix_space && s[0] != ' ') {
        char stackbuf[256];
        char *tmp = len + 1 <= sizeof stackbuf ? stackbuf : malloc(len + 1);
        if (!tmp) return kvl__errorf(KVL_ERR_NOMEM, "tokenizer: out of memory (pre-token)");
        tmp[0] = ' ';
        memcpy(tmp + 1, s, len);
        kvl_status st = pt->use_regex
                            ? split_stage(t, k, pt, tmp, len + 1, KVL_SPLIT_ISOLATED, 0, out, md)
                            : pretok_stage(t, k + 1, tmp, len + 1, out, md);
        if (tmp != stackbuf) free(tmp);
        return st;
    }
    if (pt->use_regex) return split_stage(t, k, pt, s, len, KVL_SPLIT_ISOLATED, 0, out, md);
    return pretok_stage(t, k + 1, s, len, out, md);
}

kvl_status kvl__tok_pretok_encode(const kvl_tokenizer *t, const char *s, size_t len, kvl__idvec *out,
                                 pcre2_match_data *md) {
    return pretok_stage(t, 0, s, len, out, md);
}
