/* bench/bench_transfer.c: the span transfer bench (bench/bench_transfer.sh runs it beside
 * ucx_perftest; the batched-decode bench of the same script is bench_batch.c).
 *
 *   bench_transfer transfer [--sizes-mb 1,4,16,64,256] [--seconds 1]
 *       Span payload transfer over kvlingo's UCX transport between two processes on this host
 *       (fork: the child receives), one tagged message at a time, as ExportSpan sends them.
 *       Prints "transfer size_mb=S iters=N gbps=X" per size (GB = 1e9 bytes).
 *
 *   bench_transfer latency [--sizes-kb 128,1024,4096] [--iters 50] [--gap-ms 20]
 *       One span at a time, as a switch moves it: the receiver posts its receive and asks the
 *       sender (a pipe stands in for the ExportSpan request), then drives it as a pull does
 *       (kvl__transport_recv_poll) until the last byte lands; the sender sends from a buffer it
 *       has just written (the span's encode).  gap-ms apart, so that each message finds both
 *       processes idle, as turns do.  Prints per size the medians of the sender's send time
 *       (ExportSpan's transfer_ms) and of the receiver's wait from its request to the last byte
 *       (which also holds the request's trip and the sender's writing of the buffer, as a
 *       pull's does); `ucx_perftest -t tag_lat -s BYTES` gives the floor of the send time (back
 *       to back, buffers hot).  A failure on either side ends both (exit 1).
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
#include <signal.h>
#include <sys/prctl.h>
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

static int read_full(int fd, void *p, size_t n) {
    for (size_t got = 0; got < n;) {
        ssize_t r = read(fd, (uint8_t *)p + got, n - got);
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

/* The receiving child's transport, its address written down the pipe to the parent (a u32
 * length, then the bytes); NULL on failure. */
static kvl__transport *announce(int wr) {
    kvl__transport *t;
    if (kvl__transport_create("ucx", &t) != KVL_OK) return NULL;
    const uint8_t *addr;
    size_t alen;
    kvl__transport_address(t, &addr, &alen);
    uint32_t l = (uint32_t)alen;
    if (write(wr, &l, 4) != 4 || write(wr, addr, alen) != (ssize_t)alen) {
        kvl__transport_free(t);
        return NULL;
    }
    return t;
}

/* The parent's side of announce: the child's address (malloc'd, *len bytes), NULL on failure. */
static uint8_t *read_address(int rd, uint32_t *len) {
    uint8_t *addr = NULL;
    if (read_full(rd, len, 4) || *len == 0 || *len > (1u << 20) || !(addr = malloc(*len))) return NULL;
    if (read_full(rd, addr, *len)) {
        free(addr);
        return NULL;
    }
    return addr;
}

/* What the receiving child needs to know (both modes). */
typedef struct receiver_args {
    const int *sizes;
    int ns;
    double seconds;   /* transfer */
    int iters;        /* latency */
} receiver_args;

typedef int (*receiver_fn)(int rd, int wr, const receiver_args *a);

/* Fork the receiving child, which runs fn on its ends of two pipes and dies with this process;
 * *rd and *wr are this side's ends.  -1 on failure. */
static pid_t spawn_receiver(receiver_fn fn, const receiver_args *a, int *rd, int *wr) {
    int to_parent[2], to_child[2];
    if (pipe(to_parent)) return -1;
    if (pipe(to_child)) {
        close(to_parent[0]);
        close(to_parent[1]);
        return -1;
    }
    signal(SIGPIPE, SIG_IGN);   /* a receiver that died is a failed write, not this process's end */
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(to_child[1]);
        close(to_parent[0]);
        _exit(fn(to_child[0], to_parent[1], a));
    }
    close(to_child[0]);
    close(to_parent[1]);
    if (pid < 0) {
        close(to_child[1]);
        close(to_parent[0]);
        return -1;
    }
    *rd = to_parent[0];
    *wr = to_child[1];
    return pid;
}

/* ---- transfer ------------------------------------------------------------------------------- */

static int iters_for(size_t bytes, double seconds) {
    /* assume ~4 GB/s to size the run; at least 3 messages */
    double n = seconds * 4e9 / (double)bytes;
    return n < 3 ? 3 : n > 2000 ? 2000 : (int)n;
}

static int run_receiver(int rd, int wr, const receiver_args *a) {
    const int *sizes = a->sizes, ns = a->ns;
    const double seconds = a->seconds;
    kvl__transport *t = announce(wr);
    if (!t) return 1;
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
        /* every receive of the size is posted before the sender starts: the transport drops a
         * message that finds no receive posted (an unmatched one), so a receive posted after
         * its message came would wait for ever */
        kvl__transport_recv *rs[2001];
        for (int k = 0; k < iters; k++)
            if (kvl__transport_recv_post(t, ++tag, buf, b, &rs[k]) != KVL_OK) {
                fprintf(stderr, "receiver: %s\n", kvl_last_error());
                return 1;
            }
        if (write(wr, "r", 1) != 1) return 1;
        for (int k = 0; k < iters; k++) {
            size_t got;
            if (kvl__transport_recv_wait(t, rs[k], 60000, NULL, &got) != KVL_OK || got != b) {
                fprintf(stderr, "receiver: %s\n", kvl_last_error());
                return 1;
            }
            kvl__transport_recv_free(t, rs[k], NULL, NULL);
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
    const receiver_args ra = {.sizes = sizes, .ns = ns, .seconds = seconds};
    int rd, wr;
    const pid_t pid = spawn_receiver(run_receiver, &ra, &rd, &wr);
    if (pid < 0) return 1;
    uint32_t l;
    uint8_t *addr = read_address(rd, &l);
    if (!addr) return 1;
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
        char ready;
        if (read(rd, &ready, 1) != 1) {   /* the receiver posted this size's receives */
            rc = 1;
            break;
        }
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
    if (write(wr, &done, 1) != 1) rc = 1;
    if (rc) kill(pid, SIGKILL);   /* it may be waiting for messages that will not come */
    int status = 0;
    waitpid(pid, &status, 0);
    kvl__transport_free(t);
    free(buf);
    free(addr);
    return rc || !WIFEXITED(status) || WEXITSTATUS(status) != 0;
}

/* ---- latency -------------------------------------------------------------------------------- */

static int cmp_dbl(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_dbl);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static size_t max_bytes_kb(const int *sizes, int ns) {
    size_t m = 0;
    for (int i = 0; i < ns; i++)
        if (((size_t)sizes[i] << 10) > m) m = (size_t)sizes[i] << 10;
    return m;
}

/* The child: per message, post the receive, ask for the span (its tag down the pipe), drive the
 * receive until it lands (at most 60 s), and send the wait (seconds) back.  Dies with its
 * parent. */
static int latency_receiver(int rd, int wr, const receiver_args *a) {
    const int *sizes = a->sizes, ns = a->ns, iters = a->iters;
    kvl__transport *t = announce(wr);
    if (!t) return 1;
    const size_t maxb = max_bytes_kb(sizes, ns);
    uint8_t *buf = malloc(maxb);
    if (!buf) return 1;
    memset(buf, 0, maxb);
    uint64_t tag = 1000;
    for (int i = 0; i < ns; i++) {
        const size_t b = (size_t)sizes[i] << 10;
        for (int k = 0; k <= iters; k++) {
            char go;
            if (read_full(rd, &go, 1)) return 1;   /* the sender is ready for the next one */
            kvl__transport_recv *r;
            if (kvl__transport_recv_post(t, ++tag, buf, b, &r) != KVL_OK) return 1;
            const double t0 = kvl__now_s();
            if (write(wr, &tag, sizeof tag) != (ssize_t)sizeof tag) return 1;
            while (!kvl__transport_recv_poll(t, r, 1000) && kvl__now_s() - t0 < 60) {
            }
            const double w = kvl__now_s() - t0;
            size_t got;
            if (kvl__transport_recv_wait(t, r, 1000, NULL, &got) != KVL_OK || got != b) {
                fprintf(stderr, "receiver: %s\n", kvl_last_error());
                return 1;
            }
            kvl__transport_recv_free(t, r, NULL, NULL);
            if (write(wr, &w, sizeof w) != (ssize_t)sizeof w) return 1;
        }
    }
    free(buf);
    kvl__transport_free(t);
    return 0;
}

static int bench_latency(int argc, char **argv) {
    const char *sizes_s = "128,1024,4096";
    int iters = 50, gap_ms = 20, bad = (argc - 2) % 2 != 0;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--sizes-kb")) sizes_s = argv[i + 1];
        else if (!strcmp(argv[i], "--iters")) iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--gap-ms")) gap_ms = atoi(argv[i + 1]);
        else bad = 1;
    }
    int sizes[32];
    const int ns = parse_list(sizes_s, sizes, 32);
    bad |= ns < 1 || ns > 31 || iters < 1 || iters > 100000 || gap_ms < 0 || gap_ms > 10000;
    for (int i = 0; i < ns; i++) bad |= sizes[i] < 1 || sizes[i] > (1 << 20);
    if (bad) {
        fprintf(stderr, "usage: bench_transfer latency [--sizes-kb LIST] [--iters N] [--gap-ms MS]: at most 31 "
                        "sizes of 1..1048576 KB, iters 1..100000, gap-ms 0..10000\n");
        return 2;
    }
    const receiver_args ra = {.sizes = sizes, .ns = ns, .iters = iters};
    int rd, wr;
    const pid_t pid = spawn_receiver(latency_receiver, &ra, &rd, &wr);
    if (pid < 0) return 1;
    uint32_t l;
    uint8_t *addr = NULL, *buf = NULL;
    double *snd = NULL, *rcv = NULL;
    kvl__transport *t = NULL;
    int rc = 1;
    if (!(addr = read_address(rd, &l)) || kvl__transport_create("ucx", &t) != KVL_OK) goto out;
    const size_t maxb = max_bytes_kb(sizes, ns);
    buf = malloc(maxb);
    snd = malloc(sizeof(double) * (size_t)iters);
    rcv = malloc(sizeof(double) * (size_t)iters);
    if (!buf || !snd || !rcv) goto out;
    rc = 0;
    printf("%10s %6s %14s %18s\n", "size_kb", "iters", "send_us(med)", "recv_wait_us(med)");
    for (int i = 0; i < ns && !rc; i++) {
        const size_t b = (size_t)sizes[i] << 10;
        for (int k = 0; k <= iters && !rc; k++) {   /* the first is the warm-up */
            struct timespec gap = {gap_ms / 1000, (long)(gap_ms % 1000) * 1000000L};
            nanosleep(&gap, NULL);
            char go = 1;
            uint64_t tag;
            double w;
            if (write(wr, &go, 1) != 1 || read_full(rd, &tag, sizeof tag)) {
                rc = 1;
                break;
            }
            memset(buf, k & 0xff, b);   /* written just before, as the encode does */
            const double t0 = kvl__now_s();
            if (kvl__transport_send(t, addr, l, tag, buf, b, 60000, NULL, NULL, NULL, NULL) != KVL_OK) {
                fprintf(stderr, "send: %s\n", kvl_last_error());
                rc = 1;
                break;
            }
            const double sent = kvl__now_s() - t0;
            if (read_full(rd, &w, sizeof w)) {
                rc = 1;
                break;
            }
            if (k > 0) {
                snd[k - 1] = sent;
                rcv[k - 1] = w;
            }
        }
        if (!rc)
            printf("%10d %6d %14.1f %18.1f\n", sizes[i], iters, median(snd, iters) * 1e6, median(rcv, iters) * 1e6);
        fflush(stdout);
    }
out:
    close(wr);
    close(rd);
    if (rc) kill(pid, SIGKILL);   /* it may be waiting for a span that will not come */
    int status = 0;
    waitpid(pid, &status, 0);
    if (t) kvl__transport_free(t);
    free(buf);
    free(addr);
    free(snd);
    free(rcv);
    return rc || !WIFEXITED(status) || WEXITSTATUS(status) != 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "transfer")) return bench_transfer(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "latency")) return bench_latency(argc, argv);
    fprintf(stderr, "usage: bench_transfer transfer [--sizes-mb 1,4,16,64,256] [--seconds 1]\n"
                    "       bench_transfer latency [--sizes-kb 128,1024,4096] [--iters 50] [--gap-ms 20]\n");
    return 2;
}
#endif
