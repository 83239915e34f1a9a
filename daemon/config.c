/* daemon/config.c: kvld flags and YAML config (read through service/yamlcfg.h).  Keys and
 * flags share names: --max-sessions N  <=>  max_sessions: N. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "kvlingo/backend.h"
#include "yamlcfg.h"

void kvld_config_defaults(kvld_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->listen, sizeof cfg->listen, "127.0.0.1:7070");
    snprintf(cfg->transport, sizeof cfg->transport, "ucx");
    snprintf(cfg->device, sizeof cfg->device, "cpu");
    snprintf(cfg->weights_dtype, sizeof cfg->weights_dtype, "auto");
    cfg->max_sessions = 64;
    cfg->max_batch = 32;
    cfg->prefill_chunk = 256;
    cfg->drain_timeout_ms = 30000;
    cfg->span_timeout_ms = 30000;
}

const char *kvld_config_usage(void) {
    return "usage: kvld --model DIR --listen HOST:PORT [--translators DIR] [--transport ucx|none]\n"
           "            [--metrics HOST:PORT] [--device cpu|cuda|cuda:N]\n"
           "            [--weights-dtype auto|f32|bf16]\n"
           "            [--max-sessions N] [--max-context N]\n"
           "            [--max-batch N] [--prefill-chunk N] [--threads N]\n"
           "            [--drain-timeout-ms N] [--span-timeout-ms N] [--quiet]\n"
           "       kvld --config FILE.yaml   (same keys, with '_' for '-'; flags override)\n";
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
    STR(listen);
    STR(translators);
    STR(transport);
    STR(metrics);
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
    INT(max_sessions, 1, 1000000);
    INT(max_context, 0, 1 << 24);
    INT(max_batch, 1, 4096);
    INT(prefill_chunk, 1, 1 << 20);
    INT(threads, 0, 1024);
    INT(drain_timeout_ms, 0, 3600 * 1000);
    INT(span_timeout_ms, 1, 3600 * 1000);
    INT(quiet, 0, 1);
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
    if (st != KVL_OK) kvl__error_prefix(st, w->path);
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
    *help = 0;
    /* the config file first, so flags override it */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc) return kvl__errorf(KVL_ERR_INVALID_ARG, "--config needs a file");
            kvl_status st = kvld_config_load_yaml(cfg, argv[i + 1]);
            if (st != KVL_OK) return st;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            *help = 1;
            return KVL_OK;
        }
        if (!strcmp(a, "--quiet")) {
            cfg->quiet = 1;
            continue;
        }
        if (strncmp(a, "--", 2) != 0)
            return kvl__errorf(KVL_ERR_INVALID_ARG, "unexpected argument '%s'", a);
        if (i + 1 >= argc) return kvl__errorf(KVL_ERR_INVALID_ARG, "%s needs a value", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--config")) continue;
        kvl_status st = set_key(cfg, a + 2, v);
        if (st != KVL_OK) return st;
    }
    if (!cfg->model[0]) return kvl__errorf(KVL_ERR_INVALID_ARG, "--model DIR is required");
    if (strcmp(cfg->transport, "ucx") && strcmp(cfg->transport, "none"))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "--transport '%s': expected ucx or none",
                          cfg->transport);
    return KVL_OK;
}
