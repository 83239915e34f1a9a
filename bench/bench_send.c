/* bench/bench_send.c: a C client of the router's Send, for `bench_switch.py --client c`.
 *
 *   bench_send --router HOST:PORT (--insecure | --tls-ca FILE) [--api-key KEY]
 *
 * The Python bench builds each request and reads each answer with the protobuf classes
 * generated from proto/; this program only carries them over one long-lived gRPC channel (the
 * rpc layer kvlingo's own processes use) and times them, so a switch's client-measured TTFT holds the router, the nodes
 * and their legs, not a Python client's own work on each message (grpcio's per-call and
 * per-message overhead, 0.2-0.3 ms a leg on a 2-core host).
 *
 * stdin: one request per line, the hex of a serialized kvlingo.v1.SendRequest (a line of at
 *        most 8 MB).
 * stdout: one line per request, flushed:
 *          "ok TTFT_S HEX"  TTFT_S: seconds from just before the call starts to the first token
 *                           message; HEX: the serialized SendResponse that carried the summary
 *                           (empty when the stream had none);
 *          "err CODE TEXT"  the call failed (CODE: the gRPC status code, -1 for a local error:
 *                           a message that does not parse, the stream broken off, or a turn
 *                           that ended OK without a token message, which has no TTFT); TEXT
 *                           on one line.
 * KEY (default: the environment variable KVL_API_KEY) goes as 'authorization: Bearer KEY'.
 * The channel is connected (a health check) before the first request is read.
 * Exit status: 0 at the end of stdin, 2 on bad arguments, a router that does not answer, or an
 * unusable line. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "error.h"
#include "kvlingo/v1/router.pb-c.h"
#include "rpc.h"
#include "tls.h"

#define LINE_MAX_BYTES (8u << 20)

static void usage(FILE *f) {
    fprintf(f, "usage: bench_send --router HOST:PORT (--insecure | --tls-ca FILE) [--api-key KEY]\n"
               "  A client of the router's Send for bench_switch.py / bench_tls.py --client c.\n"
               "  stdin: one request per line, the hex of a serialized kvlingo.v1.SendRequest.\n"
               "  stdout: a line per request: 'ok TTFT_SECONDS HEX' (HEX: the SendResponse with the\n"
               "  turn's summary) or 'err CODE TEXT' (CODE: the gRPC status, -1 a local failure).\n"
               "  --tls-ca FILE: the CA that signed the router's certificate; --insecure: plaintext.\n"
               "  --api-key KEY (default: $KVL_API_KEY): sent as 'authorization: Bearer KEY'.\n"
               "  Exit: 0 at the end of stdin, 2 on bad arguments, an unreachable router, a bad line.\n");
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* The bytes of `n` hex digits into out (n / 2 bytes); 0, or -1 at an odd length or a non-hex
 * character. */
static int unhex(const char *s, size_t n, uint8_t *out) {
    if (n % 2) return -1;
    for (size_t i = 0; i < n; i += 2) {
        int h = hexval((unsigned char)s[i]), l = hexval((unsigned char)s[i + 1]);
        if (h < 0 || l < 0) return -1;
        out[i / 2] = (uint8_t)(h << 4 | l);
    }
    return 0;
}

static void put_hex(const uint8_t *b, size_t n) {
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        putchar(d[b[i] >> 4]);
        putchar(d[b[i] & 15]);
    }
}

/* "err CODE TEXT" with TEXT on one line: the bench reads a line per request. */
static void put_err(int code, const char *text) {
    printf("err %d ", code);
    for (const char *c = text ? text : ""; *c; c++) putchar(*c == '\n' || *c == '\r' ? ' ' : *c);
    putchar('\n');
}

/* One Send: prints its line. */
static void one_send(kvl__rpc_client *cli, const uint8_t *req, size_t len) {
    double t0 = kvl__now_s(), ttft = -1;
    kvl__rpc_stream *st = NULL;
    kvl_status s = kvl__rpc_client_stream_open(cli, "/kvlingo.v1.Router/Send", req, len, 600000, &st);
    if (s) {
        put_err(-1, kvl_last_error());
        fflush(stdout);
        return;
    }
    uint8_t *summary = NULL;
    size_t summary_len = 0;
    char local[200] = "";   /* a failure here, reported however the call ends */
    for (;;) {
        uint8_t *data = NULL;
        size_t dl = 0;
        int r = kvl__rpc_stream_read(st, &data, &dl);
        if (r < 0) snprintf(local, sizeof local, "reading the stream: %s", kvl_last_error());
        if (r <= 0) break;
        double now = kvl__now_s();
        Kvlingo__V1__SendResponse *m = kvlingo__v1__send_response__unpack(NULL, dl, data);
        if (!m && !local[0]) snprintf(local, sizeof local, "a message of %zu bytes is no SendResponse", dl);
        if (m && m->summary) {
            free(summary);
            summary = data;   /* kept as it came: the bench decodes it with its generated protobuf classes */
            summary_len = dl;
            data = NULL;
        } else if (m && ttft < 0) {
            ttft = now - t0;
        }
        if (m) protobuf_c_message_free_unpacked(&m->base, NULL);
        free(data);
    }
    kvl__rpc_result res = {0};
    s = kvl__rpc_stream_finish(st, &res);
    kvl__rpc_stream_free(st);
    if (s) put_err(-1, kvl_last_error());
    else if (res.code != GRPC_STATUS_OK) put_err((int)res.code, res.message);
    else if (local[0]) put_err(-1, local);
    else if (ttft < 0) put_err(-1, "the turn ended without a token message: no TTFT");
    else {
        printf("ok %.9f ", ttft);
        put_hex(summary, summary_len);
        putchar('\n');
    }
    fflush(stdout);
    kvl__rpc_result_clear(&res);
    free(summary);
}

int main(int argc, char **argv) {
    const char *router = NULL, *ca_path = NULL, *api_key = getenv("KVL_API_KEY");
    int insecure = 0;
    static const struct option opts[] = {{"router", required_argument, 0, 'r'},
                                         {"tls-ca", required_argument, 0, 'c'},
                                         {"insecure", no_argument, 0, 'i'},
                                         {"api-key", required_argument, 0, 'k'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    for (int o; (o = getopt_long(argc, argv, "h", opts, NULL)) != -1;) {
        if (o == 'r') router = optarg;
        else if (o == 'c') ca_path = optarg;
        else if (o == 'i') insecure = 1;
        else if (o == 'k') api_key = optarg;
        else if (o == 'h') {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    const char *why = !router ? "--router HOST:PORT is required"
                    : optind != argc ? "it takes no positional arguments (requests come on stdin)"
                    : ca_path && insecure ? "--tls-ca and --insecure exclude each other"
                    : !ca_path && !insecure ? "--tls-ca FILE (TLS) or --insecure (plaintext) is required"
                                            : NULL;
    if (why) {
        fprintf(stderr, "bench_send: %s\n", why);
        usage(stderr);
        return 2;
    }
    kvl__svc_tls ca = {0};
    kvl__rpc_tls tls = {.insecure = 1};
    if (ca_path) {
        if (kvl__svc_tls_load(NULL, NULL, ca_path, &ca)) {
            fprintf(stderr, "bench_send: --tls-ca %s: %s\n", ca_path, kvl_last_error());
            return 2;
        }
        tls = (kvl__rpc_tls){.ca_pem = ca.ca_pem};
    }
    kvl__rpc_client *cli = NULL;
    kvl_status s = kvl__rpc_client_create(router, 0, &tls, &cli);
    kvl__svc_tls_free(&ca);   /* the channel keeps its own copy */
    if (s) {
        fprintf(stderr, "bench_send: --router %s: %s\n", router, kvl_last_error());
        return 2;
    }
    if ((s = kvl__rpc_client_set_bearer(cli, api_key))) {
        fprintf(stderr, "bench_send: the API key (--api-key or KVL_API_KEY): %s\n", kvl_last_error());
        kvl__rpc_client_free(cli);
        return 2;
    }
    /* connected before the first timed Send, as a client that opened its session is (the
     * health service answers without a key) */
    kvl__rpc_result hr = {0};
    s = kvl__rpc_client_unary(cli, "/grpc.health.v1.Health/Check", NULL, 0, 30000, &hr);
    if (s || hr.code != GRPC_STATUS_OK) {
        fprintf(stderr, "bench_send: --router %s: the health check failed: %s\n", router,
                s ? kvl_last_error() : hr.message);
        kvl__rpc_result_clear(&hr);
        kvl__rpc_client_free(cli);
        return 2;
    }
    kvl__rpc_result_clear(&hr);
    char *line = malloc(LINE_MAX_BYTES + 2);
    uint8_t *req = malloc(LINE_MAX_BYTES / 2 + 1);
    int rc = 0;
    if (!line || !req) {
        fprintf(stderr, "bench_send: no memory for an %u-byte line\n", LINE_MAX_BYTES);
        rc = 2;
    }
    for (long no = 1; !rc && fgets(line, LINE_MAX_BYTES + 2, stdin); no++) {
        size_t n = strcspn(line, "\r\n");
        if (n > LINE_MAX_BYTES || (line[n] != '\n' && !feof(stdin))) {
            fprintf(stderr, "bench_send: stdin line %ld: longer than %u characters\n", no, LINE_MAX_BYTES);
            rc = 2;
        } else if (unhex(line, n, req)) {
            fprintf(stderr, "bench_send: stdin line %ld: an odd number of hex digits or a non-hex character\n", no);
            rc = 2;
        } else {
            one_send(cli, req, n / 2);
        }
    }
    if (!rc && ferror(stdin)) {
        fprintf(stderr, "bench_send: reading stdin failed\n");
        rc = 2;
    }
    free(line);
    free(req);
    kvl__rpc_client_free(cli);
    return rc;
}
