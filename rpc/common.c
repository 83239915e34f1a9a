/* rpc/common.c: status mapping, gRPC library lifetime, byte-buffer and protobuf helpers. */
#include "rpc_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>
#include <grpc/support/log.h>

#include "clock.h"
#include "error.h"

grpc_status_code kvl__rpc_status_from_kvl(kvl_status s) {
    switch (s) {
    case KVL_OK: return GRPC_STATUS_OK;
    case KVL_ERR_INVALID_ARG:
    case KVL_ERR_FORMAT:
    case KVL_ERR_NUMERIC: return GRPC_STATUS_INVALID_ARGUMENT;
    case KVL_ERR_NOT_FOUND: return GRPC_STATUS_NOT_FOUND;
    case KVL_ERR_RANGE: return GRPC_STATUS_OUT_OF_RANGE;
    case KVL_ERR_MISMATCH: return GRPC_STATUS_FAILED_PRECONDITION;
    case KVL_ERR_UNSUPPORTED: return GRPC_STATUS_UNIMPLEMENTED;
    case KVL_ERR_NOMEM: return GRPC_STATUS_RESOURCE_EXHAUSTED;
    case KVL_ERR_CANCELLED: return GRPC_STATUS_CANCELLED;
    case KVL_ERR_IO: return GRPC_STATUS_UNAVAILABLE;
    default: return GRPC_STATUS_INTERNAL;
    }
}

kvl_status kvl__rpc_status_to_kvl(grpc_status_code code) {
    switch (code) {
    case GRPC_STATUS_OK: return KVL_OK;
    case GRPC_STATUS_INVALID_ARGUMENT: return KVL_ERR_INVALID_ARG;
    case GRPC_STATUS_NOT_FOUND: return KVL_ERR_NOT_FOUND;
    case GRPC_STATUS_OUT_OF_RANGE: return KVL_ERR_RANGE;
    case GRPC_STATUS_FAILED_PRECONDITION: return KVL_ERR_MISMATCH;
    case GRPC_STATUS_UNIMPLEMENTED: return KVL_ERR_UNSUPPORTED;
    case GRPC_STATUS_RESOURCE_EXHAUSTED: return KVL_ERR_NOMEM;
    case GRPC_STATUS_CANCELLED:
    case GRPC_STATUS_DEADLINE_EXCEEDED: return KVL_ERR_CANCELLED;
    case GRPC_STATUS_UNAVAILABLE: return KVL_ERR_IO;
    default: return KVL_ERR_INTERNAL;
    }
}

const char *kvl__rpc_status_name(grpc_status_code code) {
    static const char *names[] = {
        "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
        "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
        "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
        "UNAUTHENTICATED"};
    if ((int)code >= 0 && (size_t)code < sizeof names / sizeof names[0]) return names[code];
    return "UNKNOWN";
}

void kvl__rpc_init(void) { grpc_init(); }

/* ---- gRPC core's log ---------------------------------------------------------------------- */

#define KVL_RPC_LOG_SITES 32          /* source lines remembered for the rate limit */
#define KVL_RPC_LOG_EVERY_S 10.0

static struct {
    pthread_mutex_t mu;
    void (*log)(const char *level, const char *fmt, ...);
    struct { const char *file; int line; double last; unsigned left_out; } site[KVL_RPC_LOG_SITES];
    int n_sites;
} g_rpc_log = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void rpc_log_fn(gpr_log_func_args *a) {
    const char *level = a->severity == GPR_LOG_SEVERITY_ERROR ? "error"
                        : a->severity == GPR_LOG_SEVERITY_INFO ? "info" : "debug";
    const char *file = a->file ? a->file : "?";
    const char *base = strrchr(file, '/') ? strrchr(file, '/') + 1 : file;
    const double now = kvl__now_s();
    unsigned left_out = 0;
    pthread_mutex_lock(&g_rpc_log.mu);
    int i = 0;
    while (i < g_rpc_log.n_sites && !(g_rpc_log.site[i].line == a->line && !strcmp(g_rpc_log.site[i].file, file))) i++;
    if (i == g_rpc_log.n_sites && i < KVL_RPC_LOG_SITES) {
        g_rpc_log.site[i].file = file;   /* gRPC's __FILE__: a string that lives as long as the library */
        g_rpc_log.site[i].line = a->line;
        g_rpc_log.site[i].last = -1e9;
        g_rpc_log.n_sites++;
    }
    if (i < KVL_RPC_LOG_SITES) {
        if (now - g_rpc_log.site[i].last < KVL_RPC_LOG_EVERY_S) {
            g_rpc_log.site[i].left_out++;
            pthread_mutex_unlock(&g_rpc_log.mu);
            return;
        }
        g_rpc_log.site[i].last = now;
        left_out = g_rpc_log.site[i].left_out;
        g_rpc_log.site[i].left_out = 0;
    }
    void (*log)(const char *, const char *, ...) = g_rpc_log.log;
    pthread_mutex_unlock(&g_rpc_log.mu);
    char detail[600];
    snprintf(detail, sizeof detail, "%s", a->message ? a->message : "");
    for (char *c = detail; *c; c++)   /* one logfmt value: no quote or backslash to escape, one line */
        if (*c == '"') *c = '\'';
        else if (*c == '\\') *c = '/';
        else if (*c == '\n' || *c == '\r') *c = ' ';
    if (log) {
        if (left_out)
            log(level, "msg=grpc_core where=%s:%d detail=\"%s\" left_out=%u", base, a->line, detail, left_out);
        else
            log(level, "msg=grpc_core where=%s:%d detail=\"%s\"", base, a->line, detail);
    }
}

void kvl__rpc_log_to(void (*log)(const char *level, const char *fmt, ...)) {
    if (!log) return;   /* gRPC's own writer cannot be named from C to be put back: kept as it is */
    pthread_mutex_lock(&g_rpc_log.mu);
    g_rpc_log.log = log;
    pthread_mutex_unlock(&g_rpc_log.mu);
    gpr_set_log_function(rpc_log_fn);
}

void kvl__rpc_shutdown(void) { grpc_shutdown(); }

grpc_byte_buffer *kvl__rpc_bb_from(const uint8_t *data, size_t len) {
    grpc_slice s = grpc_slice_from_copied_buffer((const char *)(data ? data : (const uint8_t *)""),
                                                 len);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

kvl_status kvl__rpc_bb_read(grpc_byte_buffer *bb, uint8_t **out, size_t *len) {
    *out = NULL;
    *len = 0;
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, bb))
        return kvl__errorf(KVL_ERR_FORMAT, "rpc: cannot read message (decompression failed)");
    grpc_slice s = grpc_byte_buffer_reader_readall(&r);
    size_t n = GRPC_SLICE_LENGTH(s);
    kvl_status st = KVL_OK;
    if (n > 0) {
        *out = malloc(n);
        if (!*out) {
            st = kvl__errorf(KVL_ERR_NOMEM, "rpc: message of %zu bytes", n);
        } else {
            memcpy(*out, GRPC_SLICE_START_PTR(s), n);
            *len = n;
        }
    }
    grpc_slice_unref(s);
    grpc_byte_buffer_reader_destroy(&r);
    return st;
}

char *kvl__rpc_slice_strdup(grpc_slice s) {
    size_t n = GRPC_SLICE_LENGTH(s);
    char *p = malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, GRPC_SLICE_START_PTR(s), n);
    p[n] = '\0';
    return p;
}

gpr_timespec kvl__rpc_deadline(int64_t ms) {
    if (ms <= 0) return gpr_inf_future(GPR_CLOCK_MONOTONIC);
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(ms, GPR_TIMESPAN));
}

kvl_status kvl__rpc_pack(const ProtobufCMessage *msg, uint8_t **out, size_t *len) {
    size_t n = protobuf_c_message_get_packed_size(msg);
    /* +1: a zero-length message still gets a valid pointer */
    uint8_t *buf = malloc(n + 1);
    if (!buf) return kvl__errorf(KVL_ERR_NOMEM, "rpc: packing a message of %zu bytes", n);
    protobuf_c_message_pack(msg, buf);
    *out = buf;
    *len = n;
    return KVL_OK;
}

void kvl__rpc_result_clear(kvl__rpc_result *res) {
    if (!res) return;
    free(res->message);
    free(res->data);
    memset(res, 0, sizeof *res);
}
