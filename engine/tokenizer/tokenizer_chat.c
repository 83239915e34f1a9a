/* engine/tokenizer/tokenizer_chat.c: chat templates.
 *
 * kvlingo does not run Jinja.  It recognises the template families it knows by the exact text of
 * the template (compared with all whitespace removed, by a 64-bit hash) and renders them in C
 * with the same output as transformers' apply_chat_template:
 *   CHATML  the shipped models' chat_template.jinja (plain ChatML);
 *   QWEN3   Qwen3's template (system / user / assistant with <think> handling / tool messages;
 *           tool calls and the tools preamble are not supported);
 *   LLAMA3  Meta Llama 3 Instruct's template (header ids, bos_token, trimmed content, and an
 *           assistant header always appended as that template does).
 * Any other template is KVL_CHAT_UNKNOWN and rendering it is refused. */
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "tokenizer_internal.h"

/* XXH3-64 of the whitespace-stripped templates (see kvl__chat_fingerprint). */
#define FP_CHATML 0x31e59567c2012ecfULL  /* shipped models: chat_template.jinja */
#define FP_QWEN3 0xf1317766b6c277e0ULL   /* Qwen3 tokenizer_config.json */
#define FP_LLAMA3 0x90a9bf1481a973dcULL  /* Llama 3 Instruct tokenizer_config.json */

uint64_t kvl__chat_fingerprint(const char *tmpl) {
    size_t n = strlen(tmpl), o = 0;
    char *s = malloc(n + 1);
    if (!s) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = tmpl[i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != '\v' && c != '\f') s[o++] = c;
    }
    uint64_t h = kvl__tok_hash(s, o);
    free(s);
    return h;
}

kvl_chat_format kvl__chat_detect(const char *tmpl) {
    if (!tmpl) return KVL_CHAT_NONE;
    uint64_t h = kvl__chat_fingerprint(tmpl);
    if (h == FP_CHATML) return KVL_CHAT_CHATML;
    if (h == FP_QWEN3) return KVL_CHAT_QWEN3;
    if (h == FP_LLAMA3) return KVL_CHAT_LLAMA3;
    return KVL_CHAT_UNKNOWN;
}

/* The rendered text, and beside it (when `guard` is set) one byte per text byte: 1 where the
 * text came from a message (its role or content), 0 where the template wrote it. */
typedef struct chat_out {
    kvl__buf text, mask;
    int guard;
} chat_out;

static kvl_status mark(chat_out *o, int from_message, size_t len) {
    if (!o->guard) return KVL_OK;
    uint8_t chunk[64];
    memset(chunk, from_message ? 1 : 0, sizeof chunk);
    kvl_status st = KVL_OK;
    for (size_t k = 0; k < len && !st; k += 64)
        st = kvl__buf_append(&o->mask, chunk, len - k < 64 ? len - k : 64);
    return st;
}

/* Template text. */
static kvl_status put(chat_out *o, const char *s) {
    size_t n = strlen(s);
    kvl_status st = kvl__buf_append(&o->text, s, n);
    return st ? st : mark(o, 0, n);
}

/* Text from a message: never a special token, however it is spelled. */
static kvl_status put_msg(chat_out *o, const char *s, size_t n) {
    kvl_status st = kvl__buf_append(&o->text, s, n);
    return st ? st : mark(o, 1, n);
}

/* Python str.isspace() for one code point (Jinja's trim is Python's strip()). */
static int py_space(uint32_t c) {
    return (c >= 0x9 && c <= 0xd) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
           c == 0x3000;
}

/* Bounds of s stripped: of all whitespace (ws = 1) or of '\n' only (ws = 0); left/right flags. */
static void strip(const char *s, size_t len, int ws, int left, int right, size_t *a, size_t *b) {
    size_t i = 0, j = len;
    while (left && i < j) {
        uint32_t cp;
        size_t n = kvl__utf8_decode((const uint8_t *)s + i, j - i, &cp);
        if (n == 0 || !(ws ? py_space(cp) : cp == '\n')) break;
        i += n;
    }
    while (right && j > i) {
        size_t k = j - 1;
        while (k > i && ((uint8_t)s[k] & 0xc0) == 0x80) k--;
        uint32_t cp;
        size_t n = kvl__utf8_decode((const uint8_t *)s + k, j - k, &cp);
        if (n == 0 || !(ws ? py_space(cp) : cp == '\n')) break;
        j = k;
    }
    *a = i;
    *b = j;
}

static const char *find_last(const char *s, size_t len, const char *pat) {
    size_t pl = strlen(pat);
    const char *last = NULL;
    for (const char *p = s; (size_t)(p - s) + pl <= len; p++) {
        p = memmem(p, len - (size_t)(p - s), pat, pl);
        if (!p) break;
        last = p;
    }
    return last;
}

static int starts_ends_tool_response(const char *c) {
    size_t n = strlen(c);
    const char *a = "<tool_response>", *z = "</tool_response>";
    return n >= strlen(a) && !strncmp(c, a, strlen(a)) && n >= strlen(z) && !strcmp(c + n - strlen(z), z);
}

static kvl_status render_qwen3(const kvl_chat_message *m, size_t n, int gen, chat_out *b) {
    kvl_status st = KVL_OK;
    if (n > 0 && !strcmp(m[0].role, "system")) {
        if ((st = put(b, "<|im_start|>system\n")) || (st = put_msg(b, m[0].content, strlen(m[0].content))) || (st = put(b, "<|im_end|>\n")))
            return st;
    }
    size_t last_query = n ? n - 1 : 0;
    for (size_t k = n; k-- > 0;) {
        if (!strcmp(m[k].role, "user") && !starts_ends_tool_response(m[k].content)) { last_query = k; break; }
    }
    for (size_t i = 0; i < n && !st; i++) {
        const char *role = m[i].role, *c = m[i].content;
        size_t cl = strlen(c);
        if (!strcmp(role, "user") || (!strcmp(role, "system") && i != 0)) {
            if ((st = put(b, "<|im_start|>")) || (st = put_msg(b, role, strlen(role))) || (st = put(b, "\n")) ||
                (st = put_msg(b, c, cl)) ||
                (st = put(b, "<|im_end|>\n")))
                return st;
        } else if (!strcmp(role, "assistant")) {
            const char *content = c;
            size_t content_len = cl;
            const char *reason = "";
            size_t reason_len = 0;
            const char *endthink = memmem(c, cl, "</think>", 8);
            if (endthink) {
                /* content = c.split('</think>')[-1].lstrip('\n') */
                const char *last = find_last(c, cl, "</think>");
                size_t a, z;
                const char *after = last + 8;
                strip(after, cl - (size_t)(after - c), 0, 1, 0, &a, &z);
                content = after + a;
                content_len = z - a;
                /* reasoning = c.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
                size_t first_len = (size_t)(endthink - c);
                strip(c, first_len, 0, 0, 1, &a, &z);
                const char *lt = find_last(c, z, "<think>");
                const char *r0 = lt ? lt + 7 : c;
                size_t rlen = (size_t)(c + z - r0);
                strip(r0, rlen, 0, 1, 0, &a, &z);
                reason = r0 + a;
                reason_len = z - a;
            }
            if ((st = put(b, "<|im_start|>assistant\n"))) return st;
            if (i > last_query && (i == n - 1 || reason_len > 0)) {
                size_t a, z;
                strip(reason, reason_len, 0, 1, 1, &a, &z);
                size_t ca, cz;
                strip(content, content_len, 0, 1, 0, &ca, &cz);
                if ((st = put(b, "<think>\n")) || (st = put_msg(b, reason + a, z - a)) ||
                    (st = put(b, "\n</think>\n\n")) || (st = put_msg(b, content + ca, cz - ca)))
                    return st;
            } else if ((st = put_msg(b, content, content_len))) {
                return st;
            }
            if ((st = put(b, "<|im_end|>\n"))) return st;
        } else if (!strcmp(role, "tool")) {
            if ((i == 0 || strcmp(m[i - 1].role, "tool")) && (st = put(b, "<|im_start|>user"))) return st;
            if ((st = put(b, "\n<tool_response>\n")) || (st = put_msg(b, c, cl)) || (st = put(b, "\n</tool_response>")))
                return st;
            if ((i == n - 1 || strcmp(m[i + 1].role, "tool")) && (st = put(b, "<|im_end|>\n"))) return st;
        }
    }
    if (!st && gen) st = put(b, "<|im_start|>assistant\n");
    return st;
}

/* Render into o (o->guard: with the mask of message bytes). */
static kvl_status render(const kvl_tokenizer *t, const kvl_chat_message *msgs, size_t n,
                         int add_generation_prompt, chat_out *o) {
    if (!t || (!msgs && n))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_tokenizer_apply_chat_template: NULL argument");
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_tokenizer_apply_chat_template: message %zu has a NULL role or content", i);
    if (t->chat_format == KVL_CHAT_NONE)
        return kvl__errorf(KVL_ERR_NOT_FOUND, "%s: no chat template (tokenizer_config.json chat_template or chat_template.jinja)",
                          t->path);
    kvl_status st = KVL_OK;
    switch (t->chat_format) {
    case KVL_CHAT_CHATML:
        for (size_t i = 0; i < n && !st; i++)
            if ((st = put(o, "<|im_start|>")) || (st = put_msg(o, msgs[i].role, strlen(msgs[i].role))) ||
                (st = put(o, "\n")) || (st = put_msg(o, msgs[i].content, strlen(msgs[i].content))) ||
                (st = put(o, "<|im_end|>\n")))
                break;
        if (!st && add_generation_prompt) st = put(o, "<|im_start|>assistant\n");
        break;
    case KVL_CHAT_QWEN3:
        st = render_qwen3(msgs, n, add_generation_prompt, o);
        break;
    case KVL_CHAT_LLAMA3:
        for (size_t i = 0; i < n && !st; i++) {
            size_t a, z;
            strip(msgs[i].content, strlen(msgs[i].content), 1, 1, 1, &a, &z);
            if ((i == 0 && (st = put(o, t->bos_token ? t->bos_token : ""))) ||
                (st = put(o, "<|start_header_id|>")) || (st = put_msg(o, msgs[i].role, strlen(msgs[i].role))) ||
                (st = put(o, "<|end_header_id|>\n\n")) || (st = put_msg(o, msgs[i].content + a, z - a)) ||
                (st = put(o, "<|eot_id|>")))
                break;
        }
        /* this template appends the assistant header whatever add_generation_prompt says */
        if (!st) st = put(o, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    default:
        return kvl__errorf(KVL_ERR_UNSUPPORTED,
                          "%s: the chat template beside it (tokenizer_config.json chat_template or "
                          "chat_template.jinja) is not one kvlingo renders (ChatML, Qwen3, Llama 3); it does "
                          "not guess", t->path);
    }
    if (!st && !o->text.p) st = kvl__buf_append(&o->text, "", 0);
    return st;
}

kvl_status kvl_tokenizer_apply_chat_template(const kvl_tokenizer *t, const kvl_chat_message *msgs, size_t n,
                                             int add_generation_prompt, char **text_out) {
    if (text_out) *text_out = NULL;
    if (!text_out) return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_tokenizer_apply_chat_template: NULL argument");
    chat_out o = {0};
    kvl_status st = render(t, msgs, n, add_generation_prompt, &o);
    if (st) { free(o.text.p); return st; }
    *text_out = o.text.p;
    return KVL_OK;
}

kvl_status kvl_tokenizer_encode_chat(const kvl_tokenizer *t, const kvl_chat_message *msgs, size_t n,
                                     int add_generation_prompt, int32_t **ids_out, size_t *n_out) {
    if (ids_out) *ids_out = NULL;
    if (n_out) *n_out = 0;
    if (!ids_out || !n_out) return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_tokenizer_encode_chat: NULL argument");
    chat_out o = {.guard = 1};
    kvl_status st = render(t, msgs, n, add_generation_prompt, &o);
    if (!st) st = kvl__tokenizer_encode_guarded(t, o.text.p, o.text.n, (const uint8_t *)o.mask.p, ids_out, n_out);
    free(o.text.p);
    free(o.mask.p);
    return st;
}
