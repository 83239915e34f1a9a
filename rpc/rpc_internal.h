/* rpc/rpc_internal.h: helpers shared by the server and client halves of rpc/ (not public). */
#ifndef KVL_RPC_INTERNAL_H
#define KVL_RPC_INTERNAL_H

#include <grpc/grpc.h>
#include <grpc/byte_buffer.h>
#include <grpc/support/time.h>

#include "rpc.h"

/* A raw byte buffer holding a copy of data[0..len) (never NULL unless out of memory). */
grpc_byte_buffer *kvl__rpc_bb_from(const uint8_t *data, size_t len);
/* Copy a byte buffer into a malloc'ed array (*out NULL for an empty buffer). */
kvl_status kvl__rpc_bb_read(grpc_byte_buffer *bb, uint8_t **out, size_t *len);
/* malloc'ed NUL-terminated copy of a slice. */
char *kvl__rpc_slice_strdup(grpc_slice s);
/* Deadline `ms` from now (infinite when ms <= 0). */
gpr_timespec kvl__rpc_deadline(int64_t ms);
/* Channel/server arguments capping received and sent messages at max_msg bytes (64 MiB when
 * max_msg <= 0): the one place both halves set their message limits.  `args` must outlive
 * *out. */
static inline void kvl__rpc_message_limits(int max_msg, grpc_arg args[2], grpc_channel_args *out) {
    if (max_msg <= 0) max_msg = 64 << 20;
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = max_msg;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    args[1].value.integer = max_msg;
    out->num_args = 2;
    out->args = args;
}
/* Client channels' reconnect back-off after a peer went away (ms): first try, and the most it
 * grows to (rpc/client.c). */
#define KVL_RPC_RECONNECT_MIN_MS 100
#define KVL_RPC_RECONNECT_MAX_MS 2000

/* Pack a protobuf-c message into a malloc'ed buffer. */
kvl_status kvl__rpc_pack(const ProtobufCMessage *msg, uint8_t **out, size_t *len);

#endif
