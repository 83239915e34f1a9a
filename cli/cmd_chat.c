/* cli/cmd_chat.c: `kvlingo chat` — one turn of a session through kvlingo-router (gRPC client).
 *
 *   kvlingo chat --router ADDR [--session ID] [--model NAME] [--max-tokens N]
 *                [--temperature T] [--top-k K] [--top-p P] [--seed S] [--escalate]
 *                [--force-reprefill] [--ignore-eos] [--special] TEXT
 *
 * Streams the generated text as it arrives, then prints one summary line:
 *   [session s-1a2b turn 3: qwen3-b on b0, switch translate from qwen3-a (95 span tokens),
 *    TTFT 19.3 ms, 12 tokens, 335.6 tok/s]
 * Without --session a new session is created first (its id is in the summary, to continue it).
 * Built only with the server components (KVL_HAVE_SERVER); the command is absent otherwise. */
#ifdef KVL_HAVE_SERVER

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvlingo/v1/router.pb-c.h"
#include "rpc.h"

#define ROUTER "/kvlingo.v1.Router/"

static void chat_usage(FILE *f) {
    fputs("usage: kvlingo chat --router HOST:PORT [--session ID] [--model NAME] [--max-tokens N]\n"
          "                    [--temperature T] [--top-k K] [--top-p P] [--seed S] [--escalate]\n"
          "                    [--force-reprefill] [--ignore-eos] [--special] [--timeout-ms N] TEXT\n"
          "  Stops at EOS unless --ignore-eos; special tokens' text is left out unless --special.\n"
          "  One turn of a session through kvlingo-router: streams the text as it is generated,\n"
          "  then a one-line summary (model, switch mode, span tokens, TTFT, tokens, tokens/s).\n"
          "  Without --session a new session is created; its id is printed to continue it.\n", f);
}

static int rpc_fail(const char *what, const kvl__rpc_result *res) {
    fprintf(stderr, "kvlingo chat: %s: %s: %s\n", what, kvl__rpc_status_name(res->code),
            res->message && res->message[0] ? res->message : "(no details)");
    return 1;
}

int cmd_chat(int argc, char **argv) {
    cli_args a;
    if (cli_args_init(&a, argc, argv, 2)) return 1;
    int err = 0;
    if (cli_flag(&a, "--help") || cli_flag(&a, "-h")) { chat_usage(stdout); cli_args_free(&a); return 0; }
    const char *router = cli_opt(&a, "--router", &err);
    const char *session = cli_opt(&a, "--session", &err);
    const char *model = cli_opt(&a, "--model", &err);
    long max_tokens = cli_opt_long(&a, "--max-tokens", 32, 1, 1 << 20, &err);
    double temperature = cli_opt_double(&a, "--temperature", 0, 0, 100, &err);
    long top_k = cli_opt_long(&a, "--top-k", 0, 0, 1 << 30, &err);
    double top_p = cli_opt_double(&a, "--top-p", 1.0, 1e-9, 1.0, &err);
    int special = cli_flag(&a, "--special");
    long seed = cli_opt_long(&a, "--seed", 0, 0, 0x7fffffffL, &err);
    long timeout_ms = cli_opt_long(&a, "--timeout-ms", 300000, 1, 86400000L, &err);
    int escalate = cli_flag(&a, "--escalate");
    int force = cli_flag(&a, "--force-reprefill");
    int ignore_eos = cli_flag(&a, "--ignore-eos");   /* default: stop at EOS, as generate does */
    /* the one positional argument: TEXT */
    const char *text = NULL;
    for (int i = 2; i < argc; i++) {
        if (a.used[i] || !strncmp(argv[i], "--", 2)) continue;
        if (text) { fprintf(stderr, "kvlingo chat: more than one TEXT argument ('%s')\n", argv[i]); err = 1; break; }
        text = argv[i];
        a.used[i] = 1;
    }
    if (!err && cli_args_leftover(&a, "chat")) err = 1;
    cli_args_free(&a);
    if (err) { chat_usage(stderr); return 2; }
    if (!router || !text) {
        fprintf(stderr, "kvlingo chat: %s is required\n", !router ? "--router" : "TEXT");
        chat_usage(stderr);
        return 2;
    }

    kvl__rpc_client *cli = NULL;
    kvl_status s = kvl__rpc_client_create(router, 0, &cli);
    if (s) return cli_fail("chat", s);
    int rc = 0;
    char *sid = NULL;
    int summary = 0;
    kvl__rpc_result res = {0};
    if (session && session[0]) {
        sid = strdup(session);
    } else {
        Kvlingo__V1__CreateSessionRequest cq = KVLINGO__V1__CREATE_SESSION_REQUEST__INIT;
        cq.model = (char *)(model ? model : "");
        Kvlingo__V1__CreateSessionResponse *cr = NULL;
        s = kvl__rpc_client_unary_pb(cli, ROUTER "CreateSession", &cq.base,
                                    &kvlingo__v1__create_session_response__descriptor, 30000,
                                    (ProtobufCMessage **)&cr, &res);
        if (s) { rc = cli_fail("chat", s); goto out; }
        if (res.code != GRPC_STATUS_OK) { rc = rpc_fail("CreateSession", &res); goto out; }
        sid = strdup(cr->session_id);
        protobuf_c_message_free_unpacked(&cr->base, NULL);
        kvl__rpc_result_clear(&res);
    }
    if (!sid) { fprintf(stderr, "kvlingo chat: out of memory\n"); rc = 1; goto out; }

    Kvlingo__V1__SendRequest q = KVLINGO__V1__SEND_REQUEST__INIT;
    q.session_id = sid;
    q.text = (char *)text;
    q.max_tokens = (uint32_t)max_tokens;
    q.temperature = (float)temperature;
    q.seed = (uint64_t)seed;
    q.model = (char *)(model ? model : "");
    q.escalate = escalate;
    q.force_reprefill = force;
    q.stop_at_eos = !ignore_eos;
    q.ignore_eos = ignore_eos;
    q.special_text = special;
    q.top_k = (uint32_t)top_k;
    q.top_p = top_p < 1.0 ? (float)top_p : 0.0f;
    size_t len = kvlingo__v1__send_request__get_packed_size(&q);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) { fprintf(stderr, "kvlingo chat: out of memory\n"); rc = 1; goto out; }
    kvlingo__v1__send_request__pack(&q, buf);
    kvl__rpc_stream *st = NULL;
    s = kvl__rpc_client_stream_open(cli, ROUTER "Send", buf, len, timeout_ms, &st);
    free(buf);
    if (s) { rc = cli_fail("chat", s); goto out; }
    static const char *modes[] = {"none", "translate", "re-prefill"};
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
            if (x->fallback_reason && x->fallback_reason[0]) printf(", fallback: %s", x->fallback_reason);
            if (x->failover_from && x->failover_from[0])
                printf(", failover from %s (%s)", x->failover_from, x->policy_reason);
            printf("]\n");
            summary = 1;
        } else {
            fputs(m->text ? m->text : "", stdout);
            fflush(stdout);
        }
        protobuf_c_message_free_unpacked(&m->base, NULL);
    }
    s = kvl__rpc_stream_finish(st, &res);
    kvl__rpc_stream_free(st);
    if (s) rc = cli_fail("chat", s);
    else if (res.code != GRPC_STATUS_OK) rc = rpc_fail("Send", &res);
out:
    /* the session exists (given or created) even when the turn failed: say which, so the
     * conversation can be continued with --session */
    if (sid && !summary) fprintf(stderr, "kvlingo chat: session %s (continue with --session %s)\n", sid, sid);
    kvl__rpc_result_clear(&res);
    free(sid);
    kvl__rpc_client_free(cli);
    return rc;
}

#endif /* KVL_HAVE_SERVER */
