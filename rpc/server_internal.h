/* rpc/server_internal.h: the server's and server call's private state, shared by server.c
 * (lifecycle, worker threads), server_call.c (the handler-facing call API) and health.c. */
#ifndef KVL_RPC_SERVER_INTERNAL_H
#define KVL_RPC_SERVER_INTERNAL_H

#include <pthread.h>

#include "rpc_internal.h"

/* What a completion-queue tag stands for; the tag pointer is the address of a kvl__rpc_tag
 * embedded in a call (or the server, for shutdown). */
typedef enum { TAG_NEW_CALL, TAG_RECV_MSG, TAG_RECV_CLOSE, TAG_SEND, TAG_REJECT,
               TAG_SHUTDOWN } kvl__rpc_tag_kind;

typedef struct kvl__rpc_tag {
    kvl__rpc_tag_kind kind;
    struct kvl__rpc_call *call;
} kvl__rpc_tag;

typedef struct kvl__rpc_method {
    char *path;
    kvl__rpc_kind kind;
    kvl__rpc_handler fn;
    void *user;
} kvl__rpc_method;

typedef struct kvl__rpc_health_entry {
    char *service;
    int serving;
} kvl__rpc_health_entry;

struct kvl__rpc_call {
    kvl__rpc_server *srv;
    grpc_call *call;
    grpc_call_details details;
    grpc_metadata_array md;
    char *method;
    char *peer;
    gpr_timespec deadline;
    grpc_byte_buffer *recv_buf;
    int close_cancelled;           /* written by gRPC when RECV_CLOSE_ON_SERVER completes      */
    const kvl__rpc_method *m;
    int stall_ms;                  /* how long one send may wait for the client (set before the
                                    * handler runs: the server's send_stall_ms, less for a
                                    * health check), and all of the call's sends together     */
    int64_t stall_spent_ms;        /* what the call's sends have waited so far (under mu)     */

    pthread_mutex_t mu;            /* guards the fields below                                 */
    pthread_cond_t cv;
    int refs;                      /* outstanding batches + the running handler               */
    int cancelled;                 /* client cancelled / deadline / connection lost           */
    int close_done;
    int send_pending;              /* one send batch at a time; the handler waits on it      */
    int send_ok;
    int initial_md_sent;
    int finished;
    void (*cancel_fn)(void *);
    void *cancel_arg;
    int cancel_running;            /* cancel_fn is running on the poller thread               */

    kvl__rpc_tag t_new, t_recv, t_close, t_send;
};

struct kvl__rpc_server {
    grpc_server *server;
    grpc_resource_quota *quota;   /* its memory bound (server.c), released at free */
    grpc_completion_queue *cq;
    int port;
    int max_calls;
    int send_stall_ms;             /* kvl__rpc_server_params.send_stall_ms                    */
    kvl__rpc_method *methods;
    int n_methods;

    int started;

    pthread_mutex_t mu;            /* guards the fields below                                 */
    pthread_cond_t cv;
    int stopping;                  /* shutdown begun: accept nothing new                      */
    int shutdown_done;             /* the server shutdown tag came back                       */
    int freed_cq;
    int n_requests;                /* grpc_server_request_call outstanding                    */
    int n_calls;                   /* live kvl__rpc_call structs                               */
    int active;                    /* handlers running                                        */
    int n_check;                   /* of which Health/Check (their own slots, see server.c)   */
    int n_watch;                   /* of which Health/Watch streams (capped)                  */
    kvl__rpc_health_entry *health;
    int n_health;
    kvl__rpc_server *health_src;   /* params.health_of: Health answers with that server's table */
    kvl__rpc_tag t_shutdown;
    /* worker threads: one polls the queue and runs the handler of the call whose request it
     * receives, passing the poll role to an idle worker first (server.c) */
    pthread_cond_t work_cv;        /* an idle worker waits here for the poll role              */
    int poll_wanted;               /* the role was passed on and no idle worker took it yet     */
    int poll_exited;               /* the queue shut down and its last poller left             */
    int n_threads;                 /* workers alive (polling, running a handler or idle)      */
    int n_idle;                    /* idle workers not yet asked to poll                       */
};

/* server_call.c */
void kvl__rpc_call_unref(kvl__rpc_call *c);      /* drops one ref; destroys at zero           */
void kvl__rpc_call_destroy(kvl__rpc_call *c);
/* Start SEND_INITIAL_METADATA + SEND_STATUS (no handler ran): unknown method, overload. */
void kvl__rpc_call_reject(kvl__rpc_call *c, grpc_status_code code, const char *msg);
void kvl__rpc_call_mark_cancelled(kvl__rpc_call *c);

/* server.c */
void kvl__rpc_server_maybe_close_cq(kvl__rpc_server *srv);

/* health.c */
void kvl__rpc_health_check(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user);
void kvl__rpc_health_watch(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user);
void kvl__rpc_health_free(kvl__rpc_server *srv);

#endif
