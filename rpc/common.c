/* rpc/common.c: status mapping, gRPC library lifetime, byte-buffer and protobuf helpers. */
#include "rpc_internal.h"

#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>

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
