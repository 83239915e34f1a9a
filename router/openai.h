/* router/openai.h: the OpenAI-compatible HTTP front door of kvlingo-router (internal).
 *
 *   openai_json.c   requests in (validation, OpenAI error bodies) and responses out (JSON)
 *   openai_http.c   the HTTP server (libmicrohttpd, a thread per connection), the endpoints,
 *                   stateless requests mapped onto ledger sessions through the prefix index
 *
 * Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health,
 * GET /ready.  Errors carry OpenAI's body {"error": {"message", "type", "param", "code"}}. */
#ifndef KVR_OPENAI_H
#define KVR_OPENAI_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "kvlingo/status.h"
#include "kvlingo/tokenizer.h"
#include "ledger.h"
#include "tenants.h"

#define KVR_OAI_MAX_STOP 4          /* stop strings per request, as OpenAI allows              */
#define KVR_OAI_STOP_MAX_BYTES 256  /* one stop string                                         */
#define KVR_OAI_MAX_MESSAGES 1024

typedef struct kvr_oai_error {
    int http;                       /* HTTP status                                             */
    const char *type;               /* invalid_request_error, not_found_error, server_error ... */
    char param[48];                 /* "" -> null                                              */
    char code[48];                  /* "" -> null                                              */
    char message[400];
} kvr_oai_error;

void kvr_oai_set_error(kvr_oai_error *e, int http, const char *type, const char *param,
                       const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* The error body (malloc'ed, NUL-terminated), or NULL when out of memory. */
char *kvr_oai_error_json(const kvr_oai_error *e);

typedef struct kvr_oai_req {
    int chat;                       /* 1: chat completions, 0: completions                     */
    char model[KVR_NAME_MAX];       /* "" for "auto": the policy chooses                       */
    kvl_chat_message *msgs;         /* chat: strings point into root or into owned[]           */
    int n_msgs;
    char **owned;                   /* contents joined from content-part arrays                */
    int n_owned;
    const char *prompt;             /* completions                                             */
    long max_tokens;                /* 0: the router's default                                 */
    float temperature, top_p;
    unsigned top_k;
    uint64_t seed;
    const char *stop[KVR_OAI_MAX_STOP];
    int n_stop;
    int stream, include_usage;
    int ignore_eos;                 /* extension: do not stop at EOS                           */
    int skip_special;               /* 1 (default): special tokens never reach the text        */
    cJSON *root;
} kvr_oai_req;

/* Parse and validate a request body.  `known_model(arg, name)` says whether the fleet serves a
 * model.  0 on success (*out filled; release with kvr_oai_req_clear), else -1 with *err set. */
int kvr_oai_parse(const char *body, size_t len, int chat, long max_new_tokens,
                  int (*known_model)(void *arg, const char *name), void *arg, kvr_oai_req *out,
                  kvr_oai_error *err);
void kvr_oai_req_clear(kvr_oai_req *q);

/* What a finished (or streaming) turn reports. */
typedef struct kvr_oai_result {
    char id[96];
    long created;
    const char *model;
    const char *session, *node, *switch_mode, *from_model;
    int prompt_tokens, completion_tokens, cached_tokens;
    unsigned span_tokens;
    double ttft_ms;
} kvr_oai_result;

/* ---- one request as one turn (openai_session.c) ---------------------------------------------- */

struct kvr_router;
typedef struct kvr_oai_run kvr_oai_run;

/* Where a turn's output goes while it runs (a streaming response); every callback returns
 * non-zero when the client is gone (the turn is then cancelled). */
typedef struct kvr_oai_sink {
    int (*on_start)(void *arg, const kvr_oai_run *run);   /* first token: model, switch known */
    int (*on_text)(void *arg, const char *text, size_t len);
    void *arg;
    int names_session;   /* on_start sends the client the session's id (a stream's headers) */
    struct kvr_turn_cancel *cancel;   /* fired when the client goes away (a stream: before its
                                         first token; a whole reply: any time): the node's call
                                         ends at once (NULL: none) */
} kvr_oai_sink;

struct kvr_oai_run {
    kvr_oai_result res;
    char sid[KVR_ID_MAX];
    char model[KVR_NAME_MAX], node[KVR_NAME_MAX], from_model[KVR_NAME_MAX], mode[16];
    char finish[16];              /* "stop" or "length"                                      */
    char *text;                   /* the whole reply (special tokens and stop sequence out)  */
    size_t len, cap;
    kvr_oai_error err;            /* set when kvr_oai_run_turn fails                          */
};

/* Render, find or create the session, run the turn.  0 on success (u filled), -1 with u->err
 * set.  `session_hdr`: the x-kvlingo-session header or NULL.  `tenant`: the caller; only its
 * own sessions are found (another tenant's named session is 404, its prefixes are never
 * matched), new sessions are its own (max_sessions: 429), its tokens_per_minute apply (429).
 * Release with kvr_oai_run_clear. */
int kvr_oai_run_turn(struct kvr_router *r, const kvr_oai_req *q, const char *session_hdr,
                     const kvr_tenant_info *tenant, kvr_oai_sink *sink, kvr_oai_run *u);
void kvr_oai_run_clear(kvr_oai_run *u);

/* ---- the HTTP server (openai_http.c) --------------------------------------------------------- */

typedef struct kvr_oai_http kvr_oai_http;
/* Listen on `addr` (HOST:PORT, IPv4 or localhost; port 0 picks one) with a thread per
 * connection, at most `max_conn` connections and `max_body` bytes of request body. */
kvl_status kvr_oai_http_start(struct kvr_router *r, const char *addr, long max_conn, long max_body,
                              kvr_oai_http **out);
int kvr_oai_http_port(const kvr_oai_http *h);
/* Stop (running requests finish first) and free; NULL is a no-op. */
void kvr_oai_http_stop(kvr_oai_http *h);

/* ---- JSON out (openai_json.c) ------------------------------------------------------------------ */

/* The whole non-streaming body (chat.completion / text_completion). */
char *kvr_oai_body(int chat, const kvr_oai_result *r, const char *text, const char *finish);
/* One streaming chunk's JSON (no "data: " framing): `role` adds delta.role (chat, first
 * chunk); `text` the delta (may be NULL); `finish` NULL or the finish reason; `usage`:
 * 0 none, 1 "usage": null (include_usage set, not the last chunk), 2 the usage-only chunk. */
char *kvr_oai_chunk(int chat, const kvr_oai_result *r, int role, const char *text,
                    const char *finish, int usage);
/* GET /v1/models: `models` is a list of n names; "auto" is added. */
char *kvr_oai_models(const char *const *models, int n, long created);

#endif
