/* daemon/config.h: kvld's settings, from command-line flags or a YAML file (same keys). */
#ifndef KVLD_CONFIG_H
#define KVLD_CONFIG_H

#include <stddef.h>
#include "kvlingo/status.h"

#define KVLD_STR_MAX 512

typedef struct kvld_config {
    char model[KVLD_STR_MAX];        /* model directory (required)                              */
    char listen[KVLD_STR_MAX];       /* gRPC "host:port"; default 127.0.0.1:7070               */
    char translators[KVLD_STR_MAX];  /* directory of *.safetensors translators; "" = none       */
    char transport[64];              /* "ucx" (default) or "none"                               */
    char metrics[KVLD_STR_MAX];      /* "host:port" for /metrics and /healthz; "" = off         */
    char device[32];                 /* compute backend: "cpu" (default), "cuda" or "cuda:N"    */
    char weights_dtype[8];           /* CPU weights: "auto" (default: the checkpoint's), "f32", "bf16" */
    char kv_dtype[8];                /* KV cache elements: "f32" (default) or "bf16" (CPU only)     */
    char peers[KVLD_STR_MAX * 4];    /* the fleet's other nodes, "host:port,host:port"; "" = none */
    int warmup;                      /* 1 (default): one forward + each translator before serving */
    int max_sessions;                /* default 64                                              */
    int max_context;                 /* tokens per session; 0 = model max_position_embeddings   */
    int max_batch;                   /* sequences per forward pass; default 32                  */
    int prefill_chunk;               /* prefill tokens per scheduler step; default 256          */
    double decode_stretch;           /* kvld_sched_params.decode_stretch; default 2             */
    int threads;                     /* BLAS/attention threads; 0 = all cores                   */
    int drain_timeout_ms;            /* SIGTERM: wait this long for running work; default 30000 */
    int span_timeout_ms;             /* transfer deadline; default 30000                        */
    int quiet;                       /* 1: no per-request log lines                             */
    char ticket_key_file[KVLD_STR_MAX];  /* fleet transfer-ticket key; "" = none (see main.c)   */
    char advertise[KVLD_STR_MAX];    /* "host:port" the router and peers name this node by      */
                                     /* (tickets' source/target); "" = listen                   */
    int session_idle_ttl_s;          /* a session unused this long is dropped; 0 = never; 600   */
    int import_timeout_ms;           /* an announced span must arrive within this; default 5000 */
    int span_push;                   /* 1: a pull asks a peer that takes it to send straight   */
                                     /* to a posted receive (no ImportSpan); 0: ImportSpan      */
    int stream_stall_ms;             /* a call's client takes no message this long: it is ended   */
    int stream_backlog_kb;           /* a Generate stream's unread output; beyond it, it pauses */
    int stream_buffer_mb;            /* all streams' unread output on the node; default 64      */
    int insecure;                    /* 1: plaintext gRPC (no TLS); must be asked for by name   */
    char tls_cert[KVLD_STR_MAX];     /* PEM certificate (chain) of this node: server and client */
    char tls_key[KVLD_STR_MAX];      /* its PEM private key                                     */
    char tls_ca[KVLD_STR_MAX];       /* PEM fleet CA: verifies callers (mTLS) and peers         */
    char health_listen[KVLD_STR_MAX]; /* plaintext grpc.health.v1-only "host:port"; "" = off   */
} kvld_config;

void kvld_config_defaults(kvld_config *cfg);

/* Parse argv (flags override a --config file given anywhere on the line).  Returns KVL_OK, or
 * KVL_ERR_INVALID_ARG with a message naming the flag/key; *help is set for -h/--help. */
kvl_status kvld_config_parse_args(kvld_config *cfg, int argc, char **argv, int *help);

/* Read a YAML mapping of the same keys (max_sessions: 16, model: models/qwen3-a, ...). */
kvl_status kvld_config_load_yaml(kvld_config *cfg, const char *path);

typedef enum kvld_cli_mode { KVLD_CLI_RUN, KVLD_CLI_HELP, KVLD_CLI_VERSION, KVLD_CLI_CHECK } kvld_cli_mode;
/* As kvld_config_parse_args (getopt_long: --key value, --key=value, -h), telling whether the
 * line asks for help, the version, a check of the settings, or a run. */
kvl_status kvld_config_parse_cli(kvld_config *cfg, int argc, char **argv, kvld_cli_mode *mode);

/* The node's TLS files, read and checked (service/tls.h): all three keys set and not insecure
 * -> KVL_OK with *out loaded; insecure and no key set -> KVL_OK with *out empty; neither ->
 * KVL_ERR_INVALID_ARG with KVL_SVC_TLS_REQUIRED_MSG; insecure with TLS files, or only some of
 * the three -> KVL_ERR_INVALID_ARG naming the keys.  Free *out with kvl__svc_tls_free. */
struct kvl__svc_tls;
kvl_status kvld_config_tls(const kvld_config *cfg, struct kvl__svc_tls *out);

/* How many settings other than peers differ between a and b, their keys comma-separated into
 * names[cap] (cut at cap): what a SIGHUP reload read but does not apply. */
int kvld_config_changed(const kvld_config *a, const kvld_config *b, char *names, size_t cap);

/* The --help text: every flag with what it does and its default. */
const char *kvld_config_usage(void);

/* " (relative to the working directory DIR, ...)" into buf[cap] (caller-owned) for a relative
 * `path`, else "" (NULL or absolute): kvld reads every path against its working directory, a
 * --config file's too (the router reads its fleet file's against the file's folder), which an
 * error about a path that is not there says.  Returns buf. */
const char *kvld_config_cwd_note(const char *path, char *buf, size_t cap);

#endif
