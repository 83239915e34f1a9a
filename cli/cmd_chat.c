/* cli/cmd_chat.c: `kvlingo chat`: turns of a session through kvlingo-router (gRPC client).
 *
 *   kvlingo chat --router ADDR [--session ID] [--model NAME] [--max-tokens N]
 *                [--temperature T] [--top-k K] [--top-p P] [--seed S] [--escalate]
 *                [--force-reprefill] [--ignore-eos] [--special] TEXT
 *   kvlingo chat --router ADDR --tokenizer DIR [--system TEXT] [--interactive] [TEXT] ...
 *
 * Plain mode sends TEXT as a continuation of the session's text.  Chat mode (--system or
 * --interactive; --tokenizer names the fleet's tokenizer, whose chat template renders the
 * messages) sends roles: the whole conversation is rendered with the template, and only the
 * tokens past the session's ledger go to the router, as a chat turn (it ends at the template's
 * end-of-turn token), so the node keeps serving the old part from its cache.  --interactive
 * reads one user message per line from stdin and keeps the session id across them.
 *
 * Streams the generated text as it arrives, then prints one summary line per turn:
 *   [session s-1a2b turn 3: qwen3-b on b0, switch translate from qwen3-a (95 span tokens),
 *    TTFT 19.3 ms, 12 tokens, 335.6 tok/s]
 * Without --session a new session is created first (its id is in the summary, to continue it).
 * Built only with the server components (KVL_HAVE_SERVER); the command is absent otherwise. */
#ifdef KVL_HAVE_SERVER

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "kvlingo/tokenizer.h"
#include "kvlingo/v1/router.pb-c.h"
#include "tls.h"
#include "rpc.h"

#define ROUTER "/kvlingo.v1.Router/"
#define MAX_LINE (64 * 1024)      /* one interactive message */
#define MAX_MESSAGES 512

static void chat_usage(FILE *f) {
    fputs("usage: kvlingo chat --router HOST:PORT (--tls-ca FILE | --insecure) [--session ID]\n"
          "                    [--model NAME] [--max-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S] [--escalate]\n"
          "                    [--force-reprefill] [--ignore-eos] [--special] [--timeout-ms N] [--api-key KEY] TEXT\n"
          "       kvlingo chat --router HOST:PORT (--tls-ca FILE | --insecure) --tokenizer DIR [--system TEXT] [--interactive]\n"
          "                    [options above] [TEXT]\n"
          "  One turn of a session through kvlingo-router: streams the text as it is generated,\n"
          "  then a one-line summary (model, switch mode, span tokens, TTFT, tokens, tokens/s).\n"
          "  Without --session a new session is created; its id is printed to continue it (one\n"
          "  whose first turn was refused before it held anything is closed again).\n"
          "  Stops at EOS unless --ignore-eos; special tokens' text is left out unless --special.\n"
          "  Chat mode (--system or --interactive): messages with roles, rendered by the chat\n"
          "  template of --tokenizer DIR (the fleet's tokenizer, e.g. models/qwen3-a); --system\n"
          "  sets the system message; --interactive reads one user message per line from stdin\n"
          "  (TEXT, when given, is the first) and keeps the session until end of input.\n"
          "  --tls-ca FILE: the CA (PEM) that signed the router's certificate (TLS); --insecure:\n"
          "  plaintext, for a router started with --insecure.  One of the two is required.\n"
          "  --api-key KEY (default: environment variable KVL_API_KEY) is sent as\n"
          "  'authorization: Bearer KEY': the router's key file maps it to a tenant, whose\n"
          "  sessions only it sees.\n", f);
}

/* The call's error, with what the user can do about it.  `got`: the turn's tokens that had
 * come when it ended (Send; 0 for other calls). */
static int rpc_fail(const char *what, const kvl__rpc_result *res, unsigned got) {
    const char *msg = res->message && res->message[0] ? res->message : "(no details)";
    char hint[200] = "";
    if (strstr(msg, "certificate verify failed") || strstr(msg, "CERTIFICATE_VERIFY_FAILED"))
        snprintf(hint, sizeof hint, " (the router's certificate does not verify against --tls-ca: give the "
                 "CA that signed it)");
    else if (res->code == GRPC_STATUS_UNAUTHENTICATED)
        snprintf(hint, sizeof hint, " (give a key of the router's api_keys: --api-key KEY or KVL_API_KEY)");
    else if (got > 0 && res->code == GRPC_STATUS_UNAVAILABLE)
        /* a node that failed mid-reply: the router commits a turn only once it is whole */
        snprintf(hint, sizeof hint, " (the turn ended after %u token%s; the router recorded nothing of it: "
                 "send it again)", got, got == 1 ? "" : "s");
    else if (got > 0 && (res->code == GRPC_STATUS_DEADLINE_EXCEEDED || res->code == GRPC_STATUS_CANCELLED))
        /* this client's own deadline: the router keeps the input as a cancelled turn (router/README) */
        snprintf(hint, sizeof hint, " (after %u token%s; the router kept your input as a cancelled turn: the "
                 "next message continues after it; --timeout-ms sets the deadline)", got, got == 1 ? "" : "s");
    else if (res->code == GRPC_STATUS_UNAVAILABLE && strncmp(msg, "node ", 5) &&
             (strstr(msg, "Socket closed") || strstr(msg, "handshake") || strstr(msg, "ssl")))
        /* a plaintext client of a TLS router (or the reverse) sees only a closed socket; a
         * message naming a node is the router's, which this client reached */
        snprintf(hint, sizeof hint, " (does the router run TLS? --tls-ca CA.pem for a TLS router, --insecure "
                 "for a plaintext one)");
    fprintf(stderr, "kvlingo chat: %s: %s: %s%s\n", what, kvl__rpc_status_name(res->code), msg, hint);
    return 1;
}

typedef struct chat_opts {
    long max_tokens, top_k, seed, timeout_ms;
    double temperature, top_p;
    const char *model;
    int escalate, force, ignore_eos, special;
} chat_opts;

static int create_session(kvl__rpc_client *cli, const char *model, char **sid) {
    Kvlingo__V1__CreateSessionRequest cq = KVLINGO__V1__CREATE_SESSION_REQUEST__INIT;
    cq.model = (char *)(model ? model : "");
    Kvlingo__V1__CreateSessionResponse *cr = NULL;
    kvl__rpc_result res = {0};
    kvl_status s = kvl__rpc_client_unary_pb(cli, ROUTER "CreateSession", &cq.base,
                                            &kvlingo__v1__create_session_response__descriptor, 30000,
                                            (ProtobufCMessage **)&cr, &res);
    int rc = 0;
    if (s) rc = cli_fail("chat", s);
    else if (res.code != GRPC_STATUS_OK) rc = rpc_fail("CreateSession", &res, 0);
    else if (!(*sid = strdup(cr->session_id))) rc = cli_fail("chat", KVL_ERR_NOMEM);
    if (cr) protobuf_c_message_free_unpacked(&cr->base, NULL);
    kvl__rpc_result_clear(&res);
    return rc;
}

/* The session's ledger (GetSession with tokens). */
static int ledger_tokens(kvl__rpc_client *cli, const char *sid, int32_t **ids, size_t *n) {
    Kvlingo__V1__GetSessionRequest q = KVLINGO__V1__GET_SESSION_REQUEST__INIT;
    q.session_id = (char *)sid;
    q.include_tokens = 1;
    Kvlingo__V1__GetSessionResponse *r = NULL;
    kvl__rpc_result res = {0};
    kvl_status s = kvl__rpc_client_unary_pb(cli, ROUTER "GetSession", &q.base,
                                            &kvlingo__v1__get_session_response__descriptor, 30000,
                                            (ProtobufCMessage **)&r, &res);
    int rc = 0;
    *ids = NULL;
    *n = 0;
    if (s) rc = cli_fail("chat", s);
    else if (res.code != GRPC_STATUS_OK) rc = rpc_fail("GetSession", &res, 0);
    else if (r->n_tokens && !(*ids = malloc(sizeof(int32_t) * r->n_tokens))) rc = cli_fail("chat", KVL_ERR_NOMEM);
    else if (r->n_tokens) {
        memcpy(*ids, r->tokens, sizeof(int32_t) * r->n_tokens);
        *n = r->n_tokens;
    }
    if (r) protobuf_c_message_free_unpacked(&r->base, NULL);
    kvl__rpc_result_clear(&res);
    return rc;
}

/* A session this call created whose first turn failed before the ledger took anything (a
 * refused Send: max_tokens over the router's bound, empty input, an unknown model, a quota)
 * holds nothing worth continuing, yet stays open until the router's session TTL and counts
 * against the tenant's max_sessions: close it.  1 when it was closed. */
static int close_if_empty(kvl__rpc_client *cli, const char *sid) {
    Kvlingo__V1__GetSessionRequest q = KVLINGO__V1__GET_SESSION_REQUEST__INIT;
    q.session_id = (char *)sid;
    Kvlingo__V1__GetSessionResponse *r = NULL;
    kvl__rpc_result res = {0};
    kvl_status s = kvl__rpc_client_unary_pb(cli, ROUTER "GetSession", &q.base,
                                            &kvlingo__v1__get_session_response__descriptor, 10000,
                                            (ProtobufCMessage **)&r, &res);
    int empty = !s && res.code == GRPC_STATUS_OK && r && r->open && !r->context_tokens && !r->n_turns;
    if (r) protobuf_c_message_free_unpacked(&r->base, NULL);
    kvl__rpc_result_clear(&res);
    if (!empty) return 0;
    Kvlingo__V1__CloseSessionRequest cq = KVLINGO__V1__CLOSE_SESSION_REQUEST__INIT;
    cq.session_id = (char *)sid;
    Kvlingo__V1__CloseSessionResponse *cr = NULL;
    s = kvl__rpc_client_unary_pb(cli, ROUTER "CloseSession", &cq.base,
                                 &kvlingo__v1__close_session_response__descriptor, 10000,
                                 (ProtobufCMessage **)&cr, &res);
    int closed = !s && res.code == GRPC_STATUS_OK;
    if (cr) protobuf_c_message_free_unpacked(&cr->base, NULL);
    kvl__rpc_result_clear(&res);
    return closed;
}

/* One Send: text or tokens; streams the reply, prints the summary; the reply text goes to
 * *reply (malloc'ed) when reply != NULL.  0 when the turn completed. */
static int send_turn(kvl__rpc_client *cli, const char *sid, const chat_opts *o, const char *text,
                     const int32_t *ids, size_t n_ids, int chat, char **reply, int *summary) {
    Kvlingo__V1__SendRequest q = KVLINGO__V1__SEND_REQUEST__INIT;
    q.session_id = (char *)sid;
    q.text = (char *)(text ? text : "");
    q.tokens = (int32_t *)ids;
    q.n_tokens = n_ids;
    q.max_tokens = (uint32_t)o->max_tokens;
    q.temperature = (float)o->temperature;
    q.top_k = (uint32_t)o->top_k;
    q.top_p = o->top_p < 1.0 ? (float)o->top_p : 0.0f;
    q.seed = (uint64_t)o->seed;
    q.model = (char *)(o->model ? o->model : "");
    q.escalate = o->escalate;
    q.force_reprefill = o->force;
    q.stop_at_eos = !o->ignore_eos;
    q.ignore_eos = o->ignore_eos;
    q.special_text = o->special;
    q.chat = chat;
    size_t len = kvlingo__v1__send_request__get_packed_size(&q);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) return cli_fail("chat", KVL_ERR_NOMEM);
    kvlingo__v1__send_request__pack(&q, buf);
    kvl__rpc_stream *st = NULL;
    kvl_status s = kvl__rpc_client_stream_open(cli, ROUTER "Send", buf, len, o->timeout_ms, &st);
    free(buf);
    if (s) return cli_fail("chat", s);
    static const char *modes[] = {"none", "translate", "re-prefill"};
    size_t rl = 0, rcap = 0;
    char *acc = NULL;
    int rc = 0;
    unsigned n_text = 0;   /* token messages received */
    *summary = 0;
    for (;;) {
        uint8_t *data = NULL;
        size_t dl = 0;
        int r = kvl__rpc_stream_read(st, &data, &dl);
        if (r <= 0) break;
        Kvlingo__V1__SendResponse *m = kvlingo__v1__send_response__unpack(NULL, dl, data);
        free(data);
        if (!m) { fprintf(stderr, "kvlingo chat: malformed message from the router\n"); rc = 1; break; }
        if (m->summary) {
            const Kvlingo__V1__TurnSummary *x = m->summary;
            printf("\n[session %s turn %u: %s on %s, switch %s", sid, x->turn, x->model, x->node,
                   modes[x->switch_mode % 3]);
            if (x->from_model && x->from_model[0]) printf(" from %s", x->from_model);
            printf(" (%u span tokens), TTFT %.2f ms, %u tokens, %.1f tok/s", x->span_tokens,
                   x->ttft_seconds * 1e3, x->n_generated, x->tokens_per_second);
            if (x->pushed_ahead_tokens) printf(", %u tokens pushed ahead", x->pushed_ahead_tokens);
            if (x->fallback_reason && x->fallback_reason[0]) printf(", fallback: %s", x->fallback_reason);
            if (x->failover_from && x->failover_from[0])
                printf(", failover from %s (%s)", x->failover_from, x->policy_reason);
            printf("]\n");
            fflush(stdout);
            *summary = 1;
        } else if (m->text) {
            n_text++;
            size_t pl = strlen(m->text);
            fputs(m->text, stdout);
            fflush(stdout);
            if (reply && rl + pl + 1 > rcap) {
                size_t cap = rcap ? rcap * 2 : 256;
                while (cap < rl + pl + 1) cap *= 2;
                char *t = realloc(acc, cap);
                if (!t) { rc = cli_fail("chat", KVL_ERR_NOMEM); protobuf_c_message_free_unpacked(&m->base, NULL); break; }
                acc = t;
                rcap = cap;
            }
            if (reply) { memcpy(acc + rl, m->text, pl); rl += pl; acc[rl] = 0; }
        }
        protobuf_c_message_free_unpacked(&m->base, NULL);
    }
    kvl__rpc_result res = {0};
    s = kvl__rpc_stream_finish(st, &res);
    kvl__rpc_stream_free(st);
    if (s) rc = cli_fail("chat", s);
    else if (res.code != GRPC_STATUS_OK) rc = rpc_fail("Send", &res, n_text);
    kvl__rpc_result_clear(&res);
    if (reply && !rc) *reply = acc ? acc : strdup("");
    else free(acc);
    if (reply && !rc && !*reply) rc = cli_fail("chat", KVL_ERR_NOMEM);
    return rc;
}

/* Chat mode: render msgs, send the tokens past the session's ledger. */
static int chat_turn(kvl__rpc_client *cli, const kvl_tokenizer *tok, char **sid, const chat_opts *o,
                     const kvl_chat_message *msgs, size_t n, char **reply, int *summary) {
    int32_t *ids = NULL, *led = NULL;
    size_t nids = 0, nled = 0;
    /* what the user typed (and the replies) never becomes a special token */
    kvl_status s = kvl_tokenizer_encode_chat(tok, msgs, n, 1, &ids, &nids);
    if (s) return cli_fail("chat: chat template", s);
    int rc = ledger_tokens(cli, *sid, &led, &nled);
    if (!rc && (nled >= nids || (nled && memcmp(led, ids, sizeof(int32_t) * nled)))) {
        /* the session's ledger is not this conversation's prefix (a reply that re-tokenizes
         * differently, a session given from elsewhere): continue in a new session */
        char *ns = NULL;
        fprintf(stderr, "kvlingo chat: session %s does not hold this conversation's prefix; "
                "continuing in a new session (the conversation is read again)\n", *sid);
        rc = create_session(cli, o->model, &ns);
        if (!rc) { free(*sid); *sid = ns; nled = 0; }
    }
    if (!rc) rc = send_turn(cli, *sid, o, NULL, ids + nled, nids - nled, 1, reply, summary);
    free(ids);
    free(led);
    return rc;
}

static int chat_mode(kvl__rpc_client *cli, const char *tokdir, char **sid, const chat_opts *o,
                     const char *system, const char *first, int interactive, int *summary) {
    kvl_tokenizer *tok = NULL;
    kvl_status s = kvl_tokenizer_load_dir(tokdir, &tok);
    if (s) return cli_fail("chat: --tokenizer", s);
    kvl_chat_message msgs[MAX_MESSAGES];
    char *owned[MAX_MESSAGES];
    size_t n = 0, n_owned = 0;
    if (system) msgs[n++] = (kvl_chat_message){"system", system};
    char *line = malloc(MAX_LINE);
    int rc = line ? 0 : cli_fail("chat", KVL_ERR_NOMEM);
    const char *next = first;
    while (!rc) {
        if (!next) {
            if (interactive && isatty(0)) {   /* at a terminal, a prompt: without it the wait looks hung */
                fputs("> ", stderr);
                fflush(stderr);
            }
            if (!interactive || !fgets(line, MAX_LINE, stdin)) break;
            size_t l = strlen(line);
            while (l && (line[l - 1] == '\n' || line[l - 1] == '\r')) line[--l] = 0;
            if (!l) continue;
            next = line;
        }
        if (n + 2 > MAX_MESSAGES) { fprintf(stderr, "kvlingo chat: at most %d messages\n", MAX_MESSAGES); rc = 1; break; }
        char *u = strdup(next);
        if (!u) { rc = cli_fail("chat", KVL_ERR_NOMEM); break; }
        owned[n_owned++] = u;
        msgs[n++] = (kvl_chat_message){"user", u};
        char *reply = NULL;
        rc = chat_turn(cli, tok, sid, o, msgs, n, &reply, summary);
        if (rc) break;
        owned[n_owned++] = reply;
        msgs[n++] = (kvl_chat_message){"assistant", reply};
        next = NULL;
        if (!interactive) break;
    }
    for (size_t i = 0; i < n_owned; i++) free(owned[i]);
    free(line);
    kvl_tokenizer_free(tok);
    return rc;
}

int cmd_chat(int argc, char **argv) {
    cli_args a;
    if (cli_args_init(&a, argc, argv, 2)) return 1;
    int err = 0;
    if (cli_flag(&a, "--help") || cli_flag(&a, "-h")) { chat_usage(stdout); cli_args_free(&a); return 0; }
    chat_opts o = {0};
    const char *router = cli_opt(&a, "--router", &err);
    const char *tls_ca = cli_opt(&a, "--tls-ca", &err);
    int insecure = cli_flag(&a, "--insecure");
    const char *session = cli_opt(&a, "--session", &err);
    const char *tokdir = cli_opt(&a, "--tokenizer", &err);
    const char *system = cli_opt(&a, "--system", &err);
    const char *api_key = cli_opt(&a, "--api-key", &err);
    if (!api_key) api_key = getenv("KVL_API_KEY");
    o.model = cli_opt(&a, "--model", &err);
    o.max_tokens = cli_opt_long(&a, "--max-tokens", 32, 1, 1 << 20, &err);
    o.temperature = cli_opt_double(&a, "--temperature", 0, 0, 100, &err);
    o.top_k = cli_opt_long(&a, "--top-k", 0, 0, 1 << 30, &err);
    o.top_p = cli_opt_double(&a, "--top-p", 1.0, 1e-9, 1.0, &err);
    o.seed = cli_opt_long(&a, "--seed", 0, 0, 0x7fffffffL, &err);
    o.timeout_ms = cli_opt_long(&a, "--timeout-ms", 300000, 1, 86400000L, &err);
    o.escalate = cli_flag(&a, "--escalate");
    o.force = cli_flag(&a, "--force-reprefill");
    o.ignore_eos = cli_flag(&a, "--ignore-eos");   /* default: stop at EOS, as generate does */
    o.special = cli_flag(&a, "--special");
    int interactive = cli_flag(&a, "--interactive");
    int chat = interactive || system;
    /* the one positional argument: TEXT */
    const char *text = NULL;
    for (int i = 2; i < a.argc; i++) {   /* a.argv: "--key=value" split in two, as a.used counts */
        if (a.used[i] || !strncmp(a.argv[i], "--", 2)) continue;
        if (text) { fprintf(stderr, "kvlingo chat: more than one TEXT argument ('%s')\n", a.argv[i]); err = 1; break; }
        text = a.argv[i];
        a.used[i] = 1;
    }
    if (!err && cli_args_leftover(&a, "chat")) err = 1;
    cli_args_free(&a);
    if (err) { chat_usage(stderr); return 2; }
    if (!router || (!text && !interactive)) {
        fprintf(stderr, "kvlingo chat: %s is required\n", !router ? "--router" : "TEXT (or --interactive)");
        chat_usage(stderr);
        return 2;
    }
    if (chat && !tokdir) {
        fprintf(stderr, "kvlingo chat: --system and --interactive need --tokenizer DIR (the fleet's "
                "tokenizer, whose chat template renders the messages)\n");
        return 2;
    }
    if (chat && session) {
        fprintf(stderr, "kvlingo chat: chat mode keeps its own session (--session continues plain "
                "text turns only)\n");
        return 2;
    }

    if (!tls_ca == !insecure) {
        fprintf(stderr, "kvlingo chat: %s\n", insecure ? "--tls-ca and --insecure exclude each other"
                : "--tls-ca FILE (the CA that signed the router's certificate) or --insecure "
                  "(plaintext) is required");
        return 2;
    }
    kvl__svc_tls ca = {0};
    kvl__rpc_tls tls = {.insecure = 1};
    if (tls_ca) {
        kvl_status ts = kvl__svc_tls_load(NULL, NULL, tls_ca, &ca);
        if (ts) return cli_fail("chat", ts);
        tls = (kvl__rpc_tls){.ca_pem = ca.ca_pem};
    }
    kvl__rpc_client *cli = NULL;
    kvl_status s = kvl__rpc_client_create(router, 0, &tls, &cli);
    kvl__svc_tls_free(&ca);   /* the channel keeps its own copy */
    if (s) return cli_fail("chat", s);
    if ((s = kvl__rpc_client_set_bearer(cli, api_key))) {
        kvl__rpc_client_free(cli);
        return cli_fail("chat: --api-key", s);
    }
    int rc = 0, summary = 0;
    char *sid = NULL;
    if (session && session[0]) {
        if (!(sid = strdup(session))) rc = cli_fail("chat", KVL_ERR_NOMEM);
    } else {
        rc = create_session(cli, o.model, &sid);
    }
    if (!rc && chat) rc = chat_mode(cli, tokdir, &sid, &o, system, text, interactive, &summary);
    else if (!rc) rc = send_turn(cli, sid, &o, text, NULL, 0, 0, NULL, &summary);
    /* a session this call created exists even when its turn failed: say which, so the
     * conversation can be continued with --session (one given with --session the user knows) */
    if (sid && !(session && session[0]) && (!summary || rc)) {
        if (rc && close_if_empty(cli, sid))
            fprintf(stderr, "kvlingo chat: session %s closed (the turn failed before it held anything)\n", sid);
        else
            fprintf(stderr, "kvlingo chat: session %s (continue with --session %s)\n", sid, sid);
    }
    free(sid);
    kvl__rpc_client_free(cli);
    return rc;
}

#endif /* KVL_HAVE_SERVER */
