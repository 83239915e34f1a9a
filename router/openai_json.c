/* router/openai_json.c: OpenAI request bodies in, response bodies out (cJSON).
 *
 * Validation follows the OpenAI API: a parameter kvlingo cannot honour (n > 1, logit_bias,
 * tools, logprobs, penalties, ...) is refused with 400 naming it, never silently ignored, and an
 * unknown parameter is refused as OpenAI refuses it; metadata-only keys (user, metadata, store,
 * service_tier) are accepted and ignored.  Extensions (vLLM's spelling): top_k, ignore_eos,
 * skip_special_tokens. */
#include "openai.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvr_oai_set_error(kvr_oai_error *e, int http, const char *type, const char *param,
                       const char *code, const char *fmt, ...) {
    e->http = http;
    e->type = type;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

/* s with each byte that is not part of a valid UTF-8 sequence replaced by U+FFFD (malloc'ed).
 * Messages quote the client's strings (a model name, a key, a role), which cJSON does not check,
 * cut to a byte count that can split a character: JSON out must be UTF-8 all the same. */
static char *valid_utf8(const char *s) {
    size_t n = strlen(s), o = 0;
    char *d = malloc(3 * n + 1);
    if (!d) return NULL;
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned char b = p[i];
        size_t w = b < 0x80 ? 1 : b >= 0xc2 && b <= 0xdf ? 2 : b >= 0xe0 && b <= 0xef ? 3 : b >= 0xf0 && b <= 0xf4 ? 4 : 0;
        int ok = w > 0 && i + w <= n;
        for (size_t k = 1; ok && k < w; k++) ok = (p[i + k] & 0xc0) == 0x80;
        /* overlong forms, surrogates, past U+10FFFF */
        if (ok && w == 3) ok = !(b == 0xe0 && p[i + 1] < 0xa0) && !(b == 0xed && p[i + 1] > 0x9f);
        if (ok && w == 4) ok = !(b == 0xf0 && p[i + 1] < 0x90) && !(b == 0xf4 && p[i + 1] > 0x8f);
        if (ok) {
            memcpy(d + o, p + i, w);
            o += w;
            i += w;
        } else {
            memcpy(d + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    d[o] = 0;
    return d;
}

char *kvr_oai_error_json(const kvr_oai_error *e) {
    cJSON *root = cJSON_CreateObject();
    cJSON *err = root ? cJSON_AddObjectToObject(root, "error") : NULL;
    char *out = NULL;
    char *msg = valid_utf8(e->message), *param = valid_utf8(e->param);
    if (err && msg && param && cJSON_AddStringToObject(err, "message", msg) &&
        cJSON_AddStringToObject(err, "type", e->type ? e->type : "invalid_request_error") &&
        (param[0] ? cJSON_AddStringToObject(err, "param", param) != NULL
                  : cJSON_AddNullToObject(err, "param") != NULL) &&
        (e->code[0] ? cJSON_AddStringToObject(err, "code", e->code) != NULL
                    : cJSON_AddNullToObject(err, "code") != NULL))
        out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    free(msg);
    free(param);
    return out;
}

#define BAD(param, ...) \
    (kvr_oai_set_error(err, 400, "invalid_request_error", param, NULL, __VA_ARGS__), -1)
#define UNSUPPORTED(param, ...) \
    (kvr_oai_set_error(err, 400, "invalid_request_error", param, "unsupported_parameter", __VA_ARGS__), -1)

static int is_null(const cJSON *v) { return !v || cJSON_IsNull(v); }

/* A number that is an integer in [lo, hi]. */
static int get_int(const cJSON *v, double lo, double hi, double *out) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= lo && d <= hi) || floor(d) != d) return 0;
    *out = d;
    return 1;
}

/* A message's content: a string, or an array of {"type": "text", "text": "..."} parts
 * (joined; the joined copy is owned by q). */
static int message_content(kvr_oai_req *q, const cJSON *c, int i, const char **out, kvr_oai_error *err) {
    char param[48];
    snprintf(param, sizeof param, "messages[%d].content", i);
    if (cJSON_IsString(c)) { *out = c->valuestring; return 0; }
    if (!cJSON_IsArray(c))
        return BAD(param, "messages[%d].content must be a string or an array of text parts", i);
    size_t total = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *tx = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(ty))
            return BAD(param, "messages[%d].content: each part must be an object with a type", i);
        if (strcmp(ty->valuestring, "text"))
            return UNSUPPORTED(param, "messages[%d].content: part type '%.32s' is not supported "
                               "(only 'text')", i, ty->valuestring);
        if (!cJSON_IsString(tx)) return BAD(param, "messages[%d].content: a text part needs 'text'", i);
        total += strlen(tx->valuestring);
    }
    char *joined = malloc(total + 1);
    char **owned = realloc(q->owned, sizeof(char *) * (size_t)(q->n_owned + 1));
    if (owned) q->owned = owned;
    if (!joined || !owned) {
        free(joined);
        kvr_oai_set_error(err, 500, "server_error", NULL, NULL, "out of memory");
        return -1;
    }
    q->owned[q->n_owned++] = joined;
    size_t at = 0;
    cJSON_ArrayForEach(part, c) {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        size_t l = strlen(t);
        memcpy(joined + at, t, l);
        at += l;
    }
    joined[at] = 0;
    *out = joined;
    return 0;
}

static int parse_messages(kvr_oai_req *q, const cJSON *m, kvr_oai_error *err) {
    if (!m) return BAD("messages", "'messages' is a required property");
    if (!cJSON_IsArray(m)) return BAD("messages", "'messages' must be an array of messages");
    int n = cJSON_GetArraySize(m);
    if (n == 0) return BAD("messages", "'messages' must not be empty: give at least one message");
    if (n > KVR_OAI_MAX_MESSAGES)
        return BAD("messages", "'messages' has %d messages, at most %d", n, KVR_OAI_MAX_MESSAGES);
    if (q->msgs) return BAD("messages", "'messages' is given twice");
    q->msgs = calloc((size_t)n, sizeof *q->msgs);
    if (!q->msgs) {
        kvr_oai_set_error(err, 500, "server_error", NULL, NULL, "out of memory");
        return -1;
    }
    int i = 0;
    const cJSON *msg;
    cJSON_ArrayForEach(msg, m) {
        char param[48];
        snprintf(param, sizeof param, "messages[%d]", i);
        if (!cJSON_IsObject(msg)) return BAD(param, "messages[%d] must be an object", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        if (!cJSON_IsString(role)) return BAD(param, "messages[%d].role is required (a string)", i);
        const char *r = role->valuestring;
        /* "developer" is the newer spelling of "system" */
        if (!strcmp(r, "developer")) r = "system";
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant")) {
            snprintf(param, sizeof param, "messages[%d].role", i);
            if (!strcmp(r, "tool") || !strcmp(r, "function"))
                return UNSUPPORTED(param, "messages[%d].role '%s' is not supported: tool calls are "
                                   "not implemented", i, r);
            return BAD(param, "messages[%d].role '%.32s' is invalid: expected 'system', 'developer', "
                       "'user' or 'assistant'", i, r);
        }
        const cJSON *it;
        cJSON_ArrayForEach(it, msg) {
            const char *k = it->string;
            if (!strcmp(k, "role") || !strcmp(k, "content") || !strcmp(k, "name")) continue;
            if ((!strcmp(k, "tool_calls") || !strcmp(k, "function_call") || !strcmp(k, "refusal") ||
                 !strcmp(k, "audio")) && is_null(it))
                continue;
            snprintf(param, sizeof param, "messages[%d].%.24s", i, k);
            return UNSUPPORTED(param, "messages[%d].%.32s is not supported", i, k);
        }
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(msg, "content");
        if (is_null(c)) {
            snprintf(param, sizeof param, "messages[%d].content", i);
            return BAD(param, "messages[%d].content is required", i);
        }
        q->msgs[i].role = r;
        if (message_content(q, c, i, &q->msgs[i].content, err)) return -1;
        i++;
    }
    q->n_msgs = n;
    return 0;
}

static int parse_stop(kvr_oai_req *q, const cJSON *v, kvr_oai_error *err) {
    if (is_null(v)) return 0;
    if (cJSON_IsString(v)) {
        if (q->n_stop >= KVR_OAI_MAX_STOP) return BAD("stop", "'stop' has more than %d sequences", KVR_OAI_MAX_STOP);
        q->stop[q->n_stop++] = v->valuestring;
    } else if (cJSON_IsArray(v)) {
        if (cJSON_GetArraySize(v) > KVR_OAI_MAX_STOP)
            return BAD("stop", "'stop' has %d sequences, at most %d", cJSON_GetArraySize(v), KVR_OAI_MAX_STOP);
        const cJSON *s;
        cJSON_ArrayForEach(s, v) {
            if (!cJSON_IsString(s)) return BAD("stop", "'stop' must be a string or an array of strings");
            if (q->n_stop >= KVR_OAI_MAX_STOP)
                return BAD("stop", "'stop' has more than %d sequences", KVR_OAI_MAX_STOP);
            q->stop[q->n_stop++] = s->valuestring;
        }
    } else {
        return BAD("stop", "'stop' must be a string or an array of strings");
    }
    for (int i = 0; i < q->n_stop; i++) {
        size_t l = strlen(q->stop[i]);
        if (l == 0) return BAD("stop", "'stop' sequences must not be empty");
        if (l > KVR_OAI_STOP_MAX_BYTES)
            return BAD("stop", "a 'stop' sequence is %zu bytes, at most %d", l, KVR_OAI_STOP_MAX_BYTES);
    }
    return 0;
}

/* Keys refused when set to anything but their neutral value. */
static int neutral_or_refuse(const cJSON *it, kvr_oai_error *err) {
    const char *k = it->string;
    if (is_null(it)) return 0;
    if (!strcmp(k, "logit_bias")) {
        if (cJSON_IsObject(it) && !it->child) return 0;
        return UNSUPPORTED(k, "'logit_bias' is not supported");
    }
    if (!strcmp(k, "tools") || !strcmp(k, "functions")) {
        if (cJSON_IsArray(it) && !it->child) return 0;
        return UNSUPPORTED(k, "'%s' is not supported: tool and function calling are not implemented", k);
    }
    if (!strcmp(k, "tool_choice") || !strcmp(k, "function_call")) {
        if (cJSON_IsString(it) && !strcmp(it->valuestring, "none")) return 0;
        return UNSUPPORTED(k, "'%s' is not supported: tool and function calling are not implemented", k);
    }
    if (!strcmp(k, "parallel_tool_calls")) return 0;
    if (!strcmp(k, "logprobs") || !strcmp(k, "echo")) {
        if (cJSON_IsFalse(it)) return 0;
        return UNSUPPORTED(k, "'%s' is not supported", k);
    }
    if (!strcmp(k, "top_logprobs")) {
        if (cJSON_IsNumber(it) && it->valuedouble == 0) return 0;
        return UNSUPPORTED(k, "'top_logprobs' is not supported");
    }
    if (!strcmp(k, "presence_penalty") || !strcmp(k, "frequency_penalty")) {
        if (cJSON_IsNumber(it) && it->valuedouble == 0) return 0;
        return UNSUPPORTED(k, "'%s' is not supported (only 0)", k);
    }
    if (!strcmp(k, "best_of")) {
        if (cJSON_IsNumber(it) && it->valuedouble == 1) return 0;
        return UNSUPPORTED(k, "'best_of' is not supported (only 1)");
    }
    if (!strcmp(k, "suffix")) return UNSUPPORTED(k, "'suffix' is not supported");
    if (!strcmp(k, "response_format")) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(it, "type");
        if (cJSON_IsString(t) && !strcmp(t->valuestring, "text")) return 0;
        return UNSUPPORTED(k, "'response_format' is not supported (only {\"type\": \"text\"})");
    }
    return 1;   /* not one of these keys */
}

/* Offset of the first \u0000 escape in JSON text (a backslash not itself escaped, then u0000),
 * or -1.  cJSON decodes it to a NUL byte, which ends its C string there: the rest of that
 * string would be dropped without a word. */
static long nul_escape_at(const char *s, size_t len) {
    for (size_t i = 0; i + 6 <= len; i++) {
        if (s[i] != '\\') continue;
        if (s[i + 1] == 'u' && s[i + 2] == '0' && s[i + 3] == '0' && s[i + 4] == '0' && s[i + 5] == '0')
            return (long)i;
        i++;   /* an escape's second character is never the start of another */
    }
    return -1;
}

int kvr_oai_parse(const char *body, size_t len, int chat, long max_new_tokens,
                  int (*known_model)(void *arg, const char *name), void *arg, kvr_oai_req *q,
                  kvr_oai_error *err) {
    memset(q, 0, sizeof *q);
    q->chat = chat;
    q->skip_special = 1;
    q->top_p = 1.0f;
    q->temperature = 1.0f;   /* OpenAI's default; 0 is greedy */
    /* the error's position from this parse (cJSON_GetErrorPtr is one for the whole process,
     * which another connection's parse may have set meanwhile) */
    const char *end = NULL;
    q->root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!q->root)
        return BAD(NULL, "We could not parse the JSON body of your request (malformed JSON near byte "
                   "%ld). The body must be a JSON object.",
                   (long)(end && end >= body && end <= body + len ? end - body : 0));
    if (!cJSON_IsObject(q->root)) return BAD(NULL, "the request body must be a JSON object");
    long nul = nul_escape_at(body, len);
    if (nul >= 0)
        return BAD(NULL, "the request body holds a NUL character (\\u0000, at byte %ld), which no "
                   "string of a request may contain", nul);
    const cJSON *it;
    int have_model = 0, stream_opts = 0;
    cJSON_ArrayForEach(it, q->root) {
        const char *k = it->string;
        double d;
        /* a key given twice (cJSON keeps both) is refused, not read twice: a second 'stop' or
         * 'messages' would add to the first.  Bounded work: every key before a repeat was
         * accepted, and this loop refuses unknown keys, so the lookup scans few of them */
        if (cJSON_GetObjectItemCaseSensitive(q->root, k) != it)
            return BAD(k, "'%.48s' is given twice in the request body", k);
        if (!strcmp(k, "model")) {
            if (!cJSON_IsString(it) || !it->valuestring[0]) return BAD("model", "'model' must be a non-empty string");
            have_model = 1;
            if (!strcmp(it->valuestring, "auto")) continue;
            if (strlen(it->valuestring) >= sizeof q->model || !known_model(arg, it->valuestring)) {
                kvr_oai_set_error(err, 404, "invalid_request_error", "model", "model_not_found",
                                  "The model '%.64s' does not exist: GET /v1/models lists the fleet's "
                                  "models and 'auto'", it->valuestring);
                return -1;
            }
            snprintf(q->model, sizeof q->model, "%s", it->valuestring);
        } else if (chat && !strcmp(k, "messages")) {
            if (parse_messages(q, it, err)) return -1;
        } else if (!chat && !strcmp(k, "prompt")) {
            const cJSON *p = it;
            if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(p->child)) p = p->child;
            else if (cJSON_IsArray(p))
                return UNSUPPORTED("prompt", "'prompt' must be one string (batches and token arrays "
                                   "are not supported)");
            if (!cJSON_IsString(p)) return BAD("prompt", "'prompt' must be a string");
            if (!p->valuestring[0]) return BAD("prompt", "'prompt' must not be empty");
            q->prompt = p->valuestring;
        } else if (!strcmp(k, "max_tokens") || (chat && !strcmp(k, "max_completion_tokens"))) {
            if (is_null(it)) continue;
            if (!get_int(it, 1, 1e12, &d))
                return BAD(k, "'%s' must be an integer >= 1", k);
            if (d > (double)max_new_tokens)
                return BAD(k, "'%s' is %.0f, at most %ld (the router's max_new_tokens)", k, d, max_new_tokens);
            q->max_tokens = (long)d;
        } else if (!strcmp(k, "temperature")) {
            if (is_null(it)) continue;
            if (!cJSON_IsNumber(it) || !(it->valuedouble >= 0 && it->valuedouble <= 2))
                return BAD(k, "'temperature' must be a number in [0, 2]");
            q->temperature = (float)it->valuedouble;
        } else if (!strcmp(k, "top_p")) {
            if (is_null(it)) continue;
            if (!cJSON_IsNumber(it) || !(it->valuedouble > 0 && it->valuedouble <= 1))
                return BAD(k, "'top_p' must be a number in (0, 1]");
            q->top_p = (float)it->valuedouble;
        } else if (!strcmp(k, "top_k")) {
            if (is_null(it)) continue;
            if (!get_int(it, -1, 1e6, &d)) return BAD(k, "'top_k' must be an integer >= -1 (-1 or 0: off)");
            q->top_k = d > 0 ? (unsigned)d : 0;
        } else if (!strcmp(k, "seed")) {
            if (is_null(it)) continue;
            if (!get_int(it, -9.2e18, 9.2e18, &d)) return BAD(k, "'seed' must be an integer");
            q->seed = (uint64_t)(int64_t)d;
        } else if (!strcmp(k, "stop")) {
            if (parse_stop(q, it, err)) return -1;
        } else if (!strcmp(k, "n")) {
            if (is_null(it)) continue;
            if (!get_int(it, 1, 1e9, &d)) return BAD(k, "'n' must be an integer >= 1");
            if (d != 1) return UNSUPPORTED(k, "'n' must be 1: one choice per request is supported");
        } else if (!strcmp(k, "stream")) {
            if (is_null(it)) continue;
            if (!cJSON_IsBool(it)) return BAD(k, "'stream' must be a boolean");
            q->stream = cJSON_IsTrue(it);
        } else if (!strcmp(k, "stream_options")) {
            if (is_null(it)) continue;
            if (!cJSON_IsObject(it)) return BAD(k, "'stream_options' must be an object");
            const cJSON *o;
            cJSON_ArrayForEach(o, it) {
                if (!strcmp(o->string, "include_usage") && cJSON_IsBool(o)) q->include_usage = cJSON_IsTrue(o);
                else if (!strcmp(o->string, "include_obfuscation") && cJSON_IsBool(o)) continue;
                else return BAD("stream_options", "stream_options.%.32s is not supported", o->string);
            }
            stream_opts = 1;
        } else if (!strcmp(k, "ignore_eos") || !strcmp(k, "skip_special_tokens")) {
            if (is_null(it)) continue;
            if (!cJSON_IsBool(it)) return BAD(k, "'%s' must be a boolean", k);
            if (k[0] == 'i') q->ignore_eos = cJSON_IsTrue(it);
            else q->skip_special = cJSON_IsTrue(it);
        } else if (!strcmp(k, "user") || !strcmp(k, "metadata") || !strcmp(k, "store") ||
                   !strcmp(k, "service_tier")) {
            continue;   /* bookkeeping for OpenAI's own platform: nothing to do here */
        } else {
            int r = neutral_or_refuse(it, err);
            if (r < 0) return -1;
            if (r > 0) return BAD(k, "Unrecognized request argument supplied: %.48s", k);
        }
    }
    if (!have_model) return BAD("model", "'model' is a required property (a fleet model or 'auto')");
    if (chat && !q->msgs) return BAD("messages", "'messages' is a required property");
    if (!chat && !q->prompt) return BAD("prompt", "'prompt' is a required property");
    if (stream_opts && !q->stream)
        return BAD("stream_options", "'stream_options' is only allowed when 'stream' is true");
    return 0;
}

void kvr_oai_req_clear(kvr_oai_req *q) {
    for (int i = 0; i < q->n_owned; i++) free(q->owned[i]);
    free(q->owned);
    free(q->msgs);
    cJSON_Delete(q->root);
    memset(q, 0, sizeof *q);
}

/* ---- responses ------------------------------------------------------------------------------
 * Every node is created attached to its parent (cJSON_Add*ToObject), so a failed allocation
 * anywhere leaves one tree to delete: `ok` collects the failures. */

static int add_usage(cJSON *o, const kvr_oai_result *r) {
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON *d = u ? cJSON_AddObjectToObject(u, "prompt_tokens_details") : NULL;
    return u && d && cJSON_AddNumberToObject(u, "prompt_tokens", r->prompt_tokens) &&
           cJSON_AddNumberToObject(u, "completion_tokens", r->completion_tokens) &&
           cJSON_AddNumberToObject(u, "total_tokens", r->prompt_tokens + r->completion_tokens) &&
           cJSON_AddNumberToObject(d, "cached_tokens", r->cached_tokens);
}

/* kvlingo's own account of the turn, beside OpenAI's fields (clients ignore unknown keys). */
static int add_kvlingo(cJSON *o, const kvr_oai_result *r) {
    cJSON *k = cJSON_AddObjectToObject(o, "kvlingo");
    return k && cJSON_AddStringToObject(k, "session", r->session ? r->session : "") &&
           cJSON_AddStringToObject(k, "node", r->node ? r->node : "") &&
           cJSON_AddStringToObject(k, "switch", r->switch_mode ? r->switch_mode : "none") &&
           cJSON_AddStringToObject(k, "from_model", r->from_model ? r->from_model : "") &&
           cJSON_AddNumberToObject(k, "span_tokens", r->span_tokens) &&
           cJSON_AddNumberToObject(k, "ttft_ms", r->ttft_ms);
}

static cJSON *head(int chat, const kvr_oai_result *r, int chunk, int *ok) {
    cJSON *o = cJSON_CreateObject();
    const char *obj = chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
    *ok = o && cJSON_AddStringToObject(o, "id", r->id) && cJSON_AddStringToObject(o, "object", obj) &&
          cJSON_AddNumberToObject(o, "created", (double)r->created) &&
          cJSON_AddStringToObject(o, "model", r->model ? r->model : "") &&
          cJSON_AddNullToObject(o, "system_fingerprint");
    return o;
}

static char *print_free(cJSON *o, int ok) {
    char *s = ok && o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

static cJSON *add_choice(cJSON *o, int *ok) {
    cJSON *a = *ok ? cJSON_AddArrayToObject(o, "choices") : NULL;
    cJSON *c = a ? cJSON_CreateObject() : NULL;
    if (c && !cJSON_AddItemToArray(a, c)) { cJSON_Delete(c); c = NULL; }
    *ok = *ok && c && cJSON_AddNumberToObject(c, "index", 0);
    return c;
}

char *kvr_oai_body(int chat, const kvr_oai_result *r, const char *text, const char *finish) {
    int ok;
    cJSON *o = head(chat, r, 0, &ok);
    cJSON *c = add_choice(o, &ok);
    if (ok && chat) {
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        ok = m && cJSON_AddStringToObject(m, "role", "assistant") && cJSON_AddStringToObject(m, "content", text) &&
             cJSON_AddNullToObject(m, "refusal");
    } else if (ok) {
        ok = cJSON_AddStringToObject(c, "text", text) != NULL;
    }
    ok = ok && cJSON_AddNullToObject(c, "logprobs") && cJSON_AddStringToObject(c, "finish_reason", finish) &&
         add_usage(o, r) && add_kvlingo(o, r);
    return print_free(o, ok);
}

char *kvr_oai_chunk(int chat, const kvr_oai_result *r, int role, const char *text,
                    const char *finish, int usage) {
    int ok;
    cJSON *o = head(chat, r, 1, &ok);
    if (usage == 2) {
        ok = ok && cJSON_AddArrayToObject(o, "choices") && add_usage(o, r) && add_kvlingo(o, r);
        return print_free(o, ok);
    }
    cJSON *c = add_choice(o, &ok);
    if (ok && chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        ok = d && (!role || cJSON_AddStringToObject(d, "role", "assistant")) &&
             (!text || cJSON_AddStringToObject(d, "content", text));
    } else if (ok) {
        ok = cJSON_AddStringToObject(c, "text", text ? text : "") != NULL;
    }
    ok = ok && cJSON_AddNullToObject(c, "logprobs") &&
         (finish ? cJSON_AddStringToObject(c, "finish_reason", finish) != NULL
                 : cJSON_AddNullToObject(c, "finish_reason") != NULL) &&
         (usage != 1 || cJSON_AddNullToObject(o, "usage"));
    return print_free(o, ok);
}

char *kvr_oai_models(const char *const *models, int n, long created) {
    cJSON *o = cJSON_CreateObject();
    cJSON *a = o && cJSON_AddStringToObject(o, "object", "list") ? cJSON_AddArrayToObject(o, "data") : NULL;
    int ok = a != NULL;
    for (int i = 0; ok && i <= n; i++) {
        cJSON *m = cJSON_CreateObject();
        if (m && !cJSON_AddItemToArray(a, m)) { cJSON_Delete(m); m = NULL; }
        ok = m && cJSON_AddStringToObject(m, "id", i < n ? models[i] : "auto") &&
             cJSON_AddStringToObject(m, "object", "model") && cJSON_AddNumberToObject(m, "created", (double)created) &&
             cJSON_AddStringToObject(m, "owned_by", i < n ? "kvlingo" : "kvlingo-router");
    }
    return print_free(o, ok);
}
