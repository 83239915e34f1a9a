/* bench/bench_transfer.c: the span transfer bench (bench/bench_transfer.sh runs it beside
 * ucx_perftest; the batched-decode bench of the same script is bench_batch.c).
 *
 *   bench_transfer transfer [--sizes-mb 1,4,16,64,256] [--seconds 1]
 *       Span payload transfer over kvlingo's UCX transport between two processes on this host
 *       (fork: the child receives), one tagged message at a time, as ExportSpan sends them.
 *       Prints "transfer size_mb=S iters=N gbps=X" per size (GB = 1e9 bytes).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef KVL_HAVE_SERVER
int main(void) {
    fprintf(stderr, "bench_transfer: built without the server components (KVL_SERVER)\n");
    return 77;
}
#else
#include <pthread.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "kvlingo/status.h"
#include "transport.h"

static int parse_list(const char *s, int *out, int cap) {
    int n = 0;
    while (s && *s && n < cap) {
        out[n++] = atoi(s);
        s = strchr(s, ',');
        if (s) s++;
    }
    return n;
}

/* ---- transfer ------------------------------------------------------------------------------- */

static int iters_for(size_t bytes, double seconds) {
    /* assume ~4 GB/s to size the run; at least 3 messages */
    double n = seconds * 4e9 / (double)bytes;
    return n < 3 ? 3 : n > 2000 ? 2000 : (int)n;
}

static int run_receiver(int rd, int wr, const int *sizes, int ns, double seconds) {
    kvl__transport *t;
    if (kvl__transport_create("ucx", &t) != KVL_OK) return 1;
    const uint8_t *addr;
    size_t alen;
    kvl__transport_address(t, &addr, &alen);
    uint32_t l = (uint32_t)alen;
    if (write(wr, &l, 4) != 4 || write(wr, addr, alen) != (ssize_t)alen) return 1;
    size_t maxb = (size_t)sizes[0] << 20;
    for (int i = 1; i < ns; i++)
        if (((size_t)sizes[i] << 20) > maxb) maxb = (size_t)sizes[i] << 20;
    uint8_t *buf = malloc(maxb);
    if (!buf) return 1;
    memset(buf, 0, maxb);
    uint64_t tag = 0;
    for (int i = 0; i < ns; i++) {
        size_t b = (size_t)sizes[i] << 20;
        int iters = iters_for(b, seconds) + 1;   /* + warm-up */
        for (int k = 0; k < iters; k++) {
            kvl__transport_recv *r;
            size_t got;
            if (kvl__transport_recv_post(t, ++tag, buf, b, &r) != KVL_OK ||
                kvl__transport_recv_wait(t, r, 60000, NULL, &got) != KVL_OK || got != b) {
                fprintf(stderr, "receiver: %s\n", kvl_last_error());
                return 1;
            }
            kvl__transport_recv_free(t, r, NULL, NULL);
        }
    }
    char done = 1;
    if (read(rd, &done, 1) < 0) return 1;   /* wait for the parent before tearing down */
    free(buf);
    kvl__transport_free(t);
    return 0;
}

static int bench_transfer(int argc, char **argv) {
    const char *sizes_s = "1,4,16,64,256";
    double seconds = 1;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--sizes-mb")) sizes_s = argv[i + 1];
        else if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);
    }
    int sizes[32];
    int ns = parse_list(sizes_s, sizes, 32);
    int to_parent[2], to_child[2];
    if (pipe(to_parent) || pipe(to_child)) return 1;
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) _exit(run_receiver(to_child[0], to_parent[1], sizes, ns, seconds));
    uint32_t l;
    if (read(to_parent[0], &l, 4) != 4 || l == 0 || l > (1u << 20)) return 1;
    uint8_t *addr = malloc(l);
    size_t got = 0;
    while (got < l) {
        ssize_t r = read(to_parent[0], addr + got, l - got);
        if (r <= 0) return 1;
        got += (size_t)r;
    }
    kvl__transport *t;
    if (kvl__transport_create("ucx", &t) != KVL_OK) return 1;
    size_t maxb = 0;
    for (int i = 0; i < ns; i++)
        if (((size_t)sizes[i] << 20) > maxb) maxb = (size_t)sizes[i] << 20;
    uint8_t *buf = malloc(maxb);
    if (!buf) return 1;
    for (size_t i = 0; i < maxb; i++) buf[i] = (uint8_t)i;
    uint64_t tag = 0;
    int rc = 0;
    for (int i = 0; i < ns && !rc; i++) {
        size_t b = (size_t)sizes[i] << 20;
        int iters = iters_for(b, seconds);
        if (kvl__transport_send(t, addr, l, ++tag, buf, b, 60000, NULL, NULL, NULL, NULL) != KVL_OK) rc = 1;   /* warm-up */
        double t0 = kvl__now_s();
        for (int k = 0; k < iters && !rc; k++)
            if (kvl__transport_send(t, addr, l, ++tag, buf, b, 60000, NULL, NULL, NULL, NULL) != KVL_OK) rc = 1;
        double dt = kvl__now_s() - t0;
        if (rc) fprintf(stderr, "send: %s\n", kvl_last_error());
        else printf("transfer size_mb=%d iters=%d gbps=%.3f\n", sizes[i], iters,
                    (double)b * iters / dt / 1e9);
        fflush(stdout);
    }
    char done = 1;
    if (write(to_child[1], &done, 1) != 1) rc = 1;
    int status = 0;
    waitpid(pid, &status, 0);
    kvl__transport_free(t);
    free(buf);
    free(addr);
    return rc || !WIFEXITED(status) || WEXITSTATUS(status) != 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "transfer")) return bench_transfer(argc, argv);
    fprintf(stderr, "usage: bench_transfer transfer [--sizes-mb 1,4,16,64,256] [--seconds 1]\n");
    return 2;
}
#endif
