/* daemon/config.c: kvld flags and YAML config (read through service/yamlcfg.h).  Keys and
 * flags share names: --max-sessions N  <=>  max_sessions: N. */
#include "config.h"
#include "peers.h"
#include "scheduler.h"

#include <errno.h>
#include <limits.h>
#include <getopt.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "error.h"
#include "kvlingo/backend.h"
#include "tls.h"
#include "yamlcfg.h"

void kvld_config_defaults(kvld_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->listen, sizeof cfg->listen, "127.0.0.1:7070");
    snprintf(cfg->transport, sizeof cfg->transport, "ucx");
    snprintf(cfg->device, sizeof cfg->device, "cpu");
    snprintf(cfg->weights_dtype, sizeof cfg->weights_dtype, "auto");
    snprintf(cfg->kv_dtype, sizeof cfg->kv_dtype, "f32");
    cfg->max_sessions = 64;
    cfg->max_batch = 32;
    cfg->prefill_chunk = 256;
    cfg->decode_stretch = KVLD_DEFAULT_DECODE_STRETCH;
    cfg->drain_timeout_ms = 30000;
    cfg->span_timeout_ms = 30000;
    cfg->warmup = 1;
    cfg->session_idle_ttl_s = 600;
    cfg->import_timeout_ms = 5000;
    cfg->span_push = 1;
    cfg->stream_backlog_kb = 1024;
    cfg->stream_buffer_mb = 64;
    cfg->stream_stall_ms = 120000;
}

/* Every flag, its YAML key (the same name with '_'), what it does and its default. */
typedef struct kvld_flag {
    const char *name, *arg, *help, *dflt;
} kvld_flag;

static const kvld_flag k_flags[] = {
    {"model", "DIR", "model directory (config.json, tokenizer.json, *.safetensors); required", NULL},
    {"listen", "HOST:PORT", "gRPC address of the Node service (port 0: any free port)", "127.0.0.1:7070"},
    {"translators", "DIR", "directory of *.safetensors translators this node applies", "none"},
    {"transport", "ucx|none", "span transport between nodes", "ucx"},
    {"metrics", "HOST:PORT", "Prometheus /metrics and /healthz endpoint", "off"},
    {"device", "cpu|cuda|cuda:N", "compute backend of the model and its caches", "cpu"},
    {"weights-dtype", "auto|f32|bf16", "weights in memory (auto: bf16 for bf16 checkpoints)", "auto"},
    {"kv-dtype", "f32|bf16", "KV cache elements (bf16: half the cache memory and attention reads; CPU only)", "f32"},
    {"max-sessions", "N", "sessions held at once", "64"},
    {"max-context", "N", "tokens per session (0: the model's max_position_embeddings)", "0"},
    {"max-batch", "N", "sequences per forward pass (continuous batching)", "32"},
    {"prefill-chunk", "N", "prefill tokens per scheduler step", "256"},
    {"decode-stretch", "X", "while sessions decode, a step carrying prefill takes at most X times a "
                            "decode-only step (the chunk shrinks to fit; 0: always prefill-chunk)", "2"},
    {"threads", "N", "compute threads of the forward pass, translate-apply included (0: all cores)", "0"},
    {"drain-timeout-ms", "N", "on SIGTERM, wait this long for running work", "30000"},
    {"span-timeout-ms", "N", "deadline of a span transfer", "30000"},
    {"peers", "HOST:PORT,...", "the fleet's other nodes: channels and transport endpoints are set up "
                               "at start (retried until they answer), so the first span pays no set-up; "
                               "read again on SIGHUP (keep it in --config to change it)", "none"},
    {"warmup", "0|1", "run one forward pass and each translator before serving", "1"},
    {"ticket-key-file", "FILE", "the fleet's transfer-ticket key (>= 32 bytes, the router's too): "
                                "spans move only on a router-issued ticket", "none"},
    {"advertise", "HOST:PORT", "this node's fleet address, as the router and --peers name it "
                               "(tickets' source and target)", "--listen"},
    {"session-idle-ttl-s", "N", "drop a session unused for N seconds (0: never)", "600"},
    {"import-timeout-ms", "N", "an announced span must arrive within N ms, else the import ends "
                               "and frees its session", "5000"},
    {"span-push", "0|1", "a switch's span comes in one call: this node posts its receive, the peer "
                         "sends straight to it (0: the peer pushes it through ImportSpan)", "1"},
    {"stream-backlog-kb", "N", "unread output one Generate stream may buffer before it pauses", "1024"},
    {"stream-buffer-mb", "N", "unread output of all Generate streams on the node before they pause", "64"},
    {"stream-stall-ms", "N", "a call whose client takes no message for this long, or whose messages "
                             "waited this long in all, is ended (DEADLINE_EXCEEDED): a reader that "
                             "stopped or crawls frees its session", "120000"},
    {"config", "FILE.yaml", "read these keys from YAML (key names with '_'); flags override; paths in "
                            "it, as in flags, are relative to the working directory", NULL},
    {"quiet", NULL, "no per-request log lines (YAML: quiet: 1)", "off"},
    {"tls-cert", "FILE.pem", "this node's certificate: its server identity and its client certificate "
                             "towards peers (mutual TLS)", NULL},
    {"tls-key", "FILE.pem", "the certificate's private key (unencrypted PEM)", NULL},
    {"tls-ca", "FILE.pem", "the fleet CA: callers of the Node API (router, other nodes) must present a "
                           "certificate it signed; peers' certificates are checked against it", NULL},
    {"health-listen", "HOST:PORT", "plaintext gRPC port serving only grpc.health.v1 (the Node API's "
                                   "health), for probes that cannot speak TLS (Kubernetes grpc probes)", "off"},
    {"insecure", NULL, "serve and call peers in plaintext, without TLS (YAML: insecure: true); "
                       "without it the three tls keys are required", "off"},
    {"check", NULL, "validate the settings (and the files they name) and exit", NULL},
    {"version", NULL, "print version, git commit, build options and backends, and exit", NULL},
    {"help", NULL, "this text (also -h)", NULL},
};
#define N_FLAGS (int)(sizeof k_flags / sizeof k_flags[0])

const char *kvld_config_usage(void) {
    static char buf[8192];
    if (buf[0]) return buf;
    size_t n = (size_t)snprintf(buf, sizeof buf,
                                "usage: kvld --model DIR [options]    (or: kvld --config FILE.yaml [options])\n"
                                "Serves one model over gRPC (kvlingo.v1.Node).  Options (--key value or --key=value):\n");
    for (int i = 0; i < N_FLAGS && n < sizeof buf; i++) {
        char left[64];
        snprintf(left, sizeof left, "--%s%s%s", k_flags[i].name, k_flags[i].arg ? " " : "",
                 k_flags[i].arg ? k_flags[i].arg : "");
        n += (size_t)snprintf(buf + n, sizeof buf - n, "  %-30s %s%s%s%s\n", left, k_flags[i].help,
                              k_flags[i].dflt ? " (default: " : "", k_flags[i].dflt ? k_flags[i].dflt : "",
                              k_flags[i].dflt ? ")" : "");
    }
    return buf;
}

static kvl_status set_int(int *dst, const char *key, const char *v, int lo, int hi) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "config: %s = '%s': expected an integer in [%d, %d]",
                          key, v, lo, hi);
    *dst = (int)x;
    return KVL_OK;
}

static kvl_status set_bool(int *dst, const char *key, const char *v) {
    if (!strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcmp(v, "1")) *dst = 1;
    else if (!strcasecmp(v, "false") || !strcasecmp(v, "no") || !strcmp(v, "0")) *dst = 0;
    else return kvl__errorf(KVL_ERR_INVALID_ARG, "config: %s = '%s': expected true or false", key, v);
    return KVL_OK;
}

static kvl_status set_str(char *dst, size_t cap, const char *key, const char *v) {
    if (strlen(v) >= cap)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "config: %s: value longer than %zu bytes", key,
                          cap - 1);
    memcpy(dst, v, strlen(v) + 1);
    return KVL_OK;
}

/* key uses '_' (YAML) or '-' (flag) spelling */
static kvl_status set_key(kvld_config *cfg, const char *key_in, const char *v) {
    char key[64];
    size_t n = strlen(key_in);
    if (n >= sizeof key) return kvl__errorf(KVL_ERR_INVALID_ARG, "config: unknown key '%s'", key_in);
    for (size_t i = 0; i <= n; i++) key[i] = key_in[i] == '-' ? '_' : key_in[i];
#define STR(name) if (!strcmp(key, #name)) return set_str(cfg->name, sizeof cfg->name, key, v)
#define INT(name, lo, hi) if (!strcmp(key, #name)) return set_int(&cfg->name, key, v, lo, hi)
    STR(model);
    if (!strcmp(key, "listen") || !strcmp(key, "health_listen") || !strcmp(key, "advertise")) {
        /* checked here: gRPC would listen on port 99999 as 34463, and on 443 with none */
        kvl_status st = v[0] || !strcmp(key, "listen")
                            ? kvl__svc_check_hostport(key, v, strcmp(key, "advertise") != 0)
                            : KVL_OK;
        if (st != KVL_OK) return kvl__error_prefix(st, "config");
    }
    STR(listen);
    STR(translators);
    STR(transport);
    STR(metrics);
    STR(tls_cert);
    STR(tls_key);
    STR(tls_ca);
    STR(health_listen);
    STR(ticket_key_file);
    STR(advertise);
    if (!strcmp(key, "peers")) {   /* checked here so a bad entry fails at start, naming it */
        static __thread char list[KVLD_MAX_PEERS][KVLD_PEER_ADDR_MAX];
        int n;
        kvl_status st = kvld_peers_parse(v, list, KVLD_MAX_PEERS, &n);
        if (st != KVL_OK) return kvl__error_prefix(st, "config");
        return set_str(cfg->peers, sizeof cfg->peers, key, v);
    }
    if (!strcmp(key, "device")) {   /* checked here so a typo fails at start, naming the key */
        kvl_device d;
        int idx;
        if (kvl_device_parse(v, &d, &idx) != KVL_OK)
            return kvl__errorf(KVL_ERR_INVALID_ARG, "config: device = '%s': expected cpu, cuda or "
                               "cuda:N", v);
        return set_str(cfg->device, sizeof cfg->device, key, v);
    }
    if (!strcmp(key, "weights_dtype")) {
        kvl_weights_dtype d;
        if (kvl_weights_dtype_parse(v, &d) != KVL_OK)
            return kvl__errorf(KVL_ERR_INVALID_ARG, "config: weights_dtype = '%s': expected auto, f32 "
                               "or bf16", v);
        return set_str(cfg->weights_dtype, sizeof cfg->weights_dtype, key, v);
    }
    if (!strcmp(key, "kv_dtype")) {
        kvl_kv_dtype d;
        if (kvl_kv_dtype_parse(v, &d) != KVL_OK)
            return kvl__errorf(KVL_ERR_INVALID_ARG, "config: kv_dtype = '%s': expected f32 or bf16", v);
        return set_str(cfg->kv_dtype, sizeof cfg->kv_dtype, key, v);
    }
    INT(max_sessions, 1, 1000000);
    INT(max_context, 0, 1 << 24);
    INT(max_batch, 1, 4096);
    INT(prefill_chunk, 1, 1 << 20);
    if (!strcmp(key, "decode_stretch")) {
        char *end;
        errno = 0;
        double d = strtod(v, &end);
        if (errno || end == v || *end || !(d == 0 || (d >= 1.0 && d <= 100.0)))
            return kvl__errorf(KVL_ERR_INVALID_ARG, "config: decode_stretch = '%s': expected 0 (off) "
                               "or a number from 1 to 100", v);
        cfg->decode_stretch = d;
        return KVL_OK;
    }
    INT(threads, 0, 1024);
    INT(drain_timeout_ms, 0, 3600 * 1000);
    INT(span_timeout_ms, 1, 3600 * 1000);
    if (!strcmp(key, "quiet")) return set_bool(&cfg->quiet, key, v);   /* true / false, or 1 / 0 */
    if (!strcmp(key, "warmup")) return set_bool(&cfg->warmup, key, v);   /* true / false, or 1 / 0 */
    INT(session_idle_ttl_s, 0, 30 * 24 * 3600);
    INT(import_timeout_ms, 100, 3600 * 1000);
    if (!strcmp(key, "span_push")) return set_bool(&cfg->span_push, key, v);   /* true / false, or 1 / 0 */
    INT(stream_backlog_kb, 16, 1 << 20);
    INT(stream_buffer_mb, 1, 1 << 16);
    INT(stream_stall_ms, 100, 3600 * 1000);
    if (!strcmp(key, "insecure")) return set_bool(&cfg->insecure, key, v);
#undef STR
#undef INT
    return kvl__errorf(KVL_ERR_INVALID_ARG, "config: unknown key '%s'", key_in);
}

typedef struct yaml_walk {
    kvld_config *cfg;
    const char *path;
} yaml_walk;

static kvl_status on_pair(void *arg, const char *key, yaml_node_t *v, int line) {
    yaml_walk *w = arg;
    if (v->type == YAML_MAPPING_NODE)
        return kvl__errorf(KVL_ERR_FORMAT, "config: %s:%d: nested mappings are not supported",
                          w->path, kvl__svc_yaml_line(v));
    if (v->type == YAML_SEQUENCE_NODE)
        return kvl__errorf(KVL_ERR_FORMAT, "config: %s:%d: lists are not supported", w->path,
                          kvl__svc_yaml_line(v));
    if (!key)
        return kvl__errorf(KVL_ERR_FORMAT, "config: %s: expected a mapping of key: value", w->path);
    kvl_status st = set_key(w->cfg, key, kvl__svc_yaml_scalar(v));
    if (st != KVL_OK) {
        char where[4200];
        snprintf(where, sizeof where, "%s:%d", w->path, line);
        kvl__error_prefix(st, where);
    }
    return st;
}

kvl_status kvld_config_load_yaml(kvld_config *cfg, const char *path) {
    kvl__svc_yaml y;
    kvl_status st = kvl__svc_yaml_read(path, &y);
    if (st != KVL_OK) return kvl__error_prefix(st, "config");
    yaml_node_t *root = kvl__svc_yaml_root(&y);
    yaml_walk w = {cfg, path};
    if (root && root->type == YAML_SEQUENCE_NODE)
        st = kvl__errorf(KVL_ERR_FORMAT, "config: %s:%d: lists are not supported", path,
                        kvl__svc_yaml_line(root));
    else if (root && root->type != YAML_MAPPING_NODE)
        st = kvl__errorf(KVL_ERR_FORMAT, "config: %s: expected a mapping of key: value", path);
    else
        st = kvl__svc_yaml_each(&y, root, on_pair, &w);   /* an empty file sets nothing */
    kvl__svc_yaml_free(&y);
    return st;
}

kvl_status kvld_config_parse_args(kvld_config *cfg, int argc, char **argv, int *help) {
    kvld_cli_mode mode;
    kvl_status st = kvld_config_parse_cli(cfg, argc, argv, &mode);
    *help = mode == KVLD_CLI_HELP;
    return st;
}

kvl_status kvld_config_parse_cli(kvld_config *cfg, int argc, char **argv, kvld_cli_mode *mode) {
    *mode = KVLD_CLI_RUN;
    struct option opts[N_FLAGS + 1];
    for (int i = 0; i < N_FLAGS; i++)
        opts[i] = (struct option){k_flags[i].name, k_flags[i].arg ? required_argument : no_argument, NULL, 1000 + i};
    opts[N_FLAGS] = (struct option){0, 0, 0, 0};
    /* pass 1: --help / --version win; the config file is read first, so flags override it */
    for (int pass = 0; pass < 2; pass++) {
        optind = 0;   /* glibc: 0 re-initialises the scan */
        opterr = 0;
        int c, li;
        while ((c = getopt_long(argc, argv, "+:h", opts, &li)) != -1) {
            if (c == 'h') { *mode = KVLD_CLI_HELP; return KVL_OK; }
            if (c == '?')
                return kvl__errorf(KVL_ERR_INVALID_ARG, "unknown option '%s'", argv[optind - 1]);
            if (c == ':')
                return kvl__errorf(KVL_ERR_INVALID_ARG, "%s needs a value", argv[optind - 1]);
            const char *name = k_flags[c - 1000].name;
            if (pass == 0) {
                if (!strcmp(name, "help")) { *mode = KVLD_CLI_HELP; return KVL_OK; }
                if (!strcmp(name, "version")) { *mode = KVLD_CLI_VERSION; return KVL_OK; }
                if (!strcmp(name, "config")) {
                    kvl_status st = kvld_config_load_yaml(cfg, optarg);
                    if (st != KVL_OK) return st;
                }
                continue;
            }
            if (!strcmp(name, "config")) continue;
            if (!strcmp(name, "quiet")) { cfg->quiet = 1; continue; }
            if (!strcmp(name, "insecure")) { cfg->insecure = 1; continue; }
            if (!strcmp(name, "check")) { *mode = KVLD_CLI_CHECK; continue; }
            kvl_status st = set_key(cfg, name, optarg);
            if (st != KVL_OK) {
                char pre[80];
                snprintf(pre, sizeof pre, "--%s", name);
                return kvl__error_prefix(st, pre);
            }
        }
        if (optind < argc) return kvl__errorf(KVL_ERR_INVALID_ARG, "unexpected argument '%s'", argv[optind]);
    }
    if (!cfg->model[0]) return kvl__errorf(KVL_ERR_INVALID_ARG, "--model DIR is required (or model: in --config)");
    if (strcmp(cfg->transport, "ucx") && strcmp(cfg->transport, "none"))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "--transport '%s': expected ucx or none",
                          cfg->transport);
    return KVL_OK;
}

kvl_status kvld_config_tls(const kvld_config *cfg, kvl__svc_tls *out) {
    memset(out, 0, sizeof *out);
    int hc = cfg->tls_cert[0] != 0, hk = cfg->tls_key[0] != 0, ha = cfg->tls_ca[0] != 0;
    if (cfg->insecure) {
        /* both at once is a contradiction an operator must resolve, not one kvld guesses */
        if (hc || hk || ha)
            return kvl__errorf(KVL_ERR_INVALID_ARG, "insecure is set together with %s: choose TLS or "
                              "plaintext", hc ? "tls_cert" : hk ? "tls_key" : "tls_ca");
        return KVL_OK;
    }
    if (!hc && !hk && !ha) return kvl__errorf(KVL_ERR_INVALID_ARG, "%s", KVL_SVC_TLS_REQUIRED_MSG);
    if (!hc || !hk || !ha)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "TLS needs tls_cert, tls_key and tls_ca; %s is not set",
                          !hc ? "tls_cert" : !hk ? "tls_key" : "tls_ca");
    return kvl__svc_tls_load(cfg->tls_cert, cfg->tls_key, cfg->tls_ca, out);
}

/* The settings a reload compares (every one but peers, which SIGHUP applies): name, place, size,
 * and whether it is a string. */
typedef struct cfg_field {
    const char *name;
    size_t off, size;
    int str;
} cfg_field;
#define FS(f) {#f, offsetof(kvld_config, f), sizeof(((kvld_config *)0)->f), 1}
#define FN(f) {#f, offsetof(kvld_config, f), sizeof(((kvld_config *)0)->f), 0}
static const cfg_field cfg_fields[] = {
    FS(model), FS(listen), FS(translators), FS(transport), FS(metrics), FS(device), FS(weights_dtype),
    FS(kv_dtype), FN(warmup), FN(max_sessions), FN(max_context), FN(max_batch), FN(prefill_chunk),
    FN(decode_stretch), FN(threads), FN(drain_timeout_ms), FN(span_timeout_ms), FN(quiet),
    FS(ticket_key_file), FS(advertise), FN(session_idle_ttl_s), FN(import_timeout_ms), FN(span_push),
    FN(stream_stall_ms), FN(stream_backlog_kb), FN(stream_buffer_mb), FN(insecure), FS(tls_cert),
    FS(tls_key), FS(tls_ca), FS(health_listen),
};
#undef FS
#undef FN

int kvld_config_changed(const kvld_config *a, const kvld_config *b, char *names, size_t cap) {
    int n = 0;
    size_t used = 0;
    if (cap) names[0] = 0;
    for (size_t i = 0; i < sizeof cfg_fields / sizeof cfg_fields[0]; i++) {
        const cfg_field *f = &cfg_fields[i];
        const char *pa = (const char *)a + f->off, *pb = (const char *)b + f->off;
        if (f->str ? strncmp(pa, pb, f->size) == 0 : memcmp(pa, pb, f->size) == 0) continue;
        n++;
        if (cap && used < cap) {
            int w = snprintf(names + used, cap - used, "%s%s", used ? "," : "", f->name);
            used = w < 0 ? cap : used + (size_t)w;
        }
    }
    return n;
}

const char *kvld_config_cwd_note(const char *path, char *buf, size_t cap) {
    char cwd[PATH_MAX];
    if (cap) buf[0] = '\0';
    if (cap && path && path[0] && path[0] != '/' && getcwd(cwd, sizeof cwd))
        snprintf(buf, cap, " (relative to the working directory %s, as every kvld path is, a --config file's too)",
                 cwd);
    return buf;
}
