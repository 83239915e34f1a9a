/* bench/bench_rpc.c: what one gRPC message costs through the rpc layer (rpc/rpc.h), plaintext
 * against mutual TLS, in one process on loopback: the floor under every leg of a turn.
 *
 *   bench_rpc --certs DIR [--calls N] [--gap-us U] [--bytes B]
 *
 * DIR holds the PKI of tests/router/tlscerts.py (ca.pem, node-a.pem / node-a-key.pem for the
 * server, node-b.pem / node-b-key.pem for the client; bench/bench_tls.py makes one and runs this
 * with it).  Two servers (one plaintext, one requiring client certificates of the CA) answer
 *   Echo (unary):      the request's B bytes back;
 *   First (stream):    one message of B bytes, then OK (a turn's first token);
 * and one client of each kind calls them N times, the two kinds interleaved (which goes first
 * alternates) with U microseconds between calls (default 1000, at least 200: a fleet's links are
 * idle between turns, so a call finds its threads asleep and its code out of the caches; and a
 * call's server-side tail must land in its own gap, not in the next call, of the other kind).  Per kind: the
 * round trip's minimum, 10th percentile and median, and the process's CPU time per call (both
 * sides: client and server threads run in this process; measured over each call and the gap
 * after it, which catches the server's work after its answer).  The last row is TLS's cost.
 * Channels are long-lived: the handshakes happen in the warm-up, so what is measured is the
 * per-message work (encryption and framing in gRPC core's secure endpoint and OpenSSL). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rpc.h"

#define WARMUP 50

static double mono_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double cpu_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static char *slurp(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "bench_rpc: cannot open %s (make the PKI with tests/router/tlscerts.py)\n", path);
        return NULL;
    }
    char *b = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (b = malloc((size_t)n + 1)) && fread(b, 1, (size_t)n, f) == (size_t)n) {
        b[n] = 0;
    } else {
        fprintf(stderr, "bench_rpc: cannot read %s\n", path);
        free(b);
        b = NULL;
    }
    fclose(f);
    return b;
}

static void h_echo(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user) {
    (void)user;
    kvl__rpc_call_reply(call, req, len);
}

static void h_first(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user) {
    (void)user;
    kvl_status st = kvl__rpc_call_send(call, req, len);
    if (st != KVL_OK) kvl__rpc_call_finish_kvl(call, st);
    else kvl__rpc_call_finish(call, GRPC_STATUS_OK, NULL);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct kind {
    const char *name;
    kvl__rpc_server *srv;
    kvl__rpc_client *cli;
    double *rtt[2];      /* [calls] seconds: unary, stream's first message */
    double cpu[2];       /* seconds of process CPU over the calls and their gaps */
} kind;

/* One call of `what` (0 unary, 1 stream) on k: its round trip in seconds, < 0 on failure. */
static double one_call(kind *k, int what, const uint8_t *msg, size_t len) {
    double t0 = mono_s();
    if (what == 0) {
        kvl__rpc_result res = {0};
        kvl_status st = kvl__rpc_client_unary(k->cli, "/kvlingo.bench.Rpc/Echo", msg, len, 10000, &res);
        double dt = mono_s() - t0;
        int ok = st == KVL_OK && res.code == GRPC_STATUS_OK && res.len == len;
        if (st != KVL_OK)
            fprintf(stderr, "bench_rpc: %s unary: %s\n", k->name, kvl_last_error());
        else if (!ok)
            fprintf(stderr, "bench_rpc: %s unary: %s \"%s\", %zu bytes back of %zu\n", k->name,
                    kvl__rpc_status_name(res.code), res.message ? res.message : "", res.len, len);
        kvl__rpc_result_clear(&res);
        return ok ? dt : -1;
    }
    kvl__rpc_stream *s = NULL;
    if (kvl__rpc_client_stream_open(k->cli, "/kvlingo.bench.Rpc/First", msg, len, 10000, &s) != KVL_OK) {
        fprintf(stderr, "bench_rpc: %s stream: %s\n", k->name, kvl_last_error());
        return -1;
    }
    uint8_t *d = NULL;
    size_t dl = 0;
    int got = kvl__rpc_stream_read(s, &d, &dl);
    double dt = mono_s() - t0;
    const size_t first_len = got == 1 ? dl : 0;
    free(d);
    kvl__rpc_result res = {0};
    while (got == 1 && (got = kvl__rpc_stream_read(s, &d, &dl)) == 1) free(d);
    kvl_status fst = got == 0 ? kvl__rpc_stream_finish(s, &res) : (kvl_status)got;
    int ok = fst == KVL_OK && res.code == GRPC_STATUS_OK && first_len == len;
    if (fst != KVL_OK)
        fprintf(stderr, "bench_rpc: %s stream: %s\n", k->name, kvl_last_error());
    else if (!ok)
        fprintf(stderr, "bench_rpc: %s stream: %s \"%s\", a first message of %zu bytes (sent %zu)\n", k->name,
                kvl__rpc_status_name(res.code), res.message ? res.message : "", first_len, len);
    kvl__rpc_result_clear(&res);
    kvl__rpc_stream_free(s);
    return ok ? dt : -1;
}

/* An integer option in [lo, hi], or -1 (the caller prints the usage). */
static long int_arg(const char *text, long lo, long hi) {
    char *end = NULL;
    long v = strtol(text, &end, 10);
    return end && end != text && !*end && v >= lo && v <= hi ? v : -1;
}

int main(int argc, char **argv) {
    const char *certs = NULL;
    long calls = 2000, gap_us = 1000, bytes = 200;
    static const struct option opts[] = {{"certs", required_argument, 0, 'c'},
                                         {"calls", required_argument, 0, 'n'},
                                         {"gap-us", required_argument, 0, 'g'},
                                         {"bytes", required_argument, 0, 'b'},
                                         {0, 0, 0, 0}};
    for (int o; (o = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        if (o == 'c') certs = optarg;
        else if (o == 'n') calls = int_arg(optarg, 10, 1000000);
        else if (o == 'g') gap_us = int_arg(optarg, 200, 1000000);
        else if (o == 'b') bytes = int_arg(optarg, 1, 1 << 20);
        else calls = -1;
    }
    if (!certs || calls < 0 || gap_us < 0 || bytes < 0) {
        /* the gap's floor: a call's server-side tail (its handler's return, the send's
         * completion) must land in its own gap, not in the next call, of the other kind */
        fprintf(stderr, "usage: bench_rpc --certs DIR [--calls 10..1000000] [--gap-us 200..1000000] "
                        "[--bytes 1..1048576]\n");
        return 2;
    }
    char *ca = slurp(certs, "ca.pem"), *scert = slurp(certs, "node-a.pem"),
         *skey = slurp(certs, "node-a-key.pem"), *ccert = slurp(certs, "node-b.pem"),
         *ckey = slurp(certs, "node-b-key.pem");
    if (!ca || !scert || !skey || !ccert || !ckey) return 1;
    const kvl__rpc_tls plain = {.insecure = 1};
    const kvl__rpc_tls stls = {.cert_pem = scert, .key_pem = skey, .ca_pem = ca, .require_client_cert = 1};
    const kvl__rpc_tls ctls = {.cert_pem = ccert, .key_pem = ckey, .ca_pem = ca};
    kind k[2] = {{.name = "plaintext"}, {.name = "mutual TLS"}};
    for (int i = 0; i < 2; i++) {
        kvl__rpc_server_params p = kvl__rpc_server_default_params();
        p.tls = i ? &stls : &plain;
        char target[64];
        if (kvl__rpc_server_create(&p, &k[i].srv) != KVL_OK ||
            kvl__rpc_server_add_method(k[i].srv, "/kvlingo.bench.Rpc/Echo", KVL_RPC_UNARY, h_echo, NULL) ||
            kvl__rpc_server_add_method(k[i].srv, "/kvlingo.bench.Rpc/First", KVL_RPC_SERVER_STREAM, h_first,
                                       NULL) ||
            kvl__rpc_server_start(k[i].srv) != KVL_OK ||
            snprintf(target, sizeof target, "127.0.0.1:%d", kvl__rpc_server_port(k[i].srv)) <= 0 ||
            kvl__rpc_client_create(target, 0, i ? &ctls : &plain, &k[i].cli) != KVL_OK) {
            fprintf(stderr, "bench_rpc: the %s server or its client on 127.0.0.1 (certificates from %s): %s\n",
                    k[i].name, certs, kvl_last_error());
            return 1;
        }
        for (int w = 0; w < 2; w++)
            if (!(k[i].rtt[w] = malloc(sizeof(double) * (size_t)calls))) return 1;
    }
    uint8_t *msg = malloc((size_t)bytes);
    if (!msg) return 1;
    memset(msg, 0x5a, (size_t)bytes);
    for (int r = -WARMUP; r < calls; r++)
        for (int w = 0; w < 2; w++)
            for (int j = 0; j < 2; j++) {
                kind *kk = &k[(r & 1) ? j : 1 - j];
                double c0 = cpu_s();
                double dt = one_call(kk, w, msg, (size_t)bytes);
                if (dt < 0) return 1;
                usleep((useconds_t)gap_us);
                if (r < 0) continue;
                kk->rtt[w][r] = dt;
                kk->cpu[w] += cpu_s() - c0;
            }
    double load[3] = {0};
    if (getloadavg(load, 3) < 1) load[0] = -1;
    printf("bench_rpc: the rpc layer in one process on loopback, %ld calls of each kind interleaved, %ld us "
           "apart, %ld-byte messages; load average %.2f\n", calls, gap_us, bytes, load[0]);
    printf("%-12s | %-32s | %-12s | %-32s | %-12s\n", "", "unary round trip min/p10/med", "CPU a call",
           "stream's 1st message min/p10/med", "CPU a call");
    double med[2][2], cpu[2][2];
    for (int i = 0; i < 2; i++) {
        char cell[2][64];
        for (int w = 0; w < 2; w++) {
            qsort(k[i].rtt[w], (size_t)calls, sizeof(double), cmp_d);
            med[i][w] = k[i].rtt[w][calls / 2];
            cpu[i][w] = k[i].cpu[w] / calls;
            snprintf(cell[w], sizeof cell[w], "%.1f / %.1f / %.1f us", k[i].rtt[w][0] * 1e6,
                     k[i].rtt[w][calls / 10] * 1e6, med[i][w] * 1e6);
        }
        printf("%-12s | %-32s | %9.1f us | %-32s | %9.1f us\n", k[i].name, cell[0], cpu[i][0] * 1e6, cell[1],
               cpu[i][1] * 1e6);
    }
    char cost[2][64];
    for (int w = 0; w < 2; w++)
        snprintf(cost[w], sizeof cost[w], "median %+.1f us (%+.1f%%)", (med[1][w] - med[0][w]) * 1e6,
                 100 * (med[1][w] / med[0][w] - 1));
    printf("%-12s | %-32s | %+9.1f us | %-32s | %+9.1f us\n", "TLS cost", cost[0], (cpu[1][0] - cpu[0][0]) * 1e6,
           cost[1], (cpu[1][1] - cpu[0][1]) * 1e6);
    printf("(a round trip is two messages; CPU a call: the process's, both sides' threads, over the whole call "
           "(a stream's: open, message, status, free) and its gap, so the servers' and channels' idle "
           "work is in both rows alike and cancels in the cost row)\n");
    for (int i = 0; i < 2; i++) {
        kvl__rpc_client_free(k[i].cli);
        kvl__rpc_server_free(k[i].srv);
        free(k[i].rtt[0]);
        free(k[i].rtt[1]);
    }
    free(msg);
    free(ca), free(scert), free(skey), free(ccert), free(ckey);
    return 0;
}
