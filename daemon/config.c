/* daemon/config.c: kvld flags and YAML config (libyaml).  Keys and flags share names:
 * --max-sessions N  <=>  max_sessions: N. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yaml.h>

#include "error.h"

void kvld_config_defaults(kvld_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->listen, sizeof cfg->listen, "127.0.0.1:7070");
    snprintf(cfg->transport, sizeof cfg->transport, "ucx");
    cfg->max_sessions = 64;
    cfg->max_batch = 32;
    cfg->prefill_chunk = 256;
    cfg->drain_timeout_ms = 30000;
    cfg->span_timeout_ms = 30000;
}

const char *kvld_config_usage(void) {
    return "usage: kvld --model DIR --listen HOST:PORT [--translators DIR] [--transport ucx|none]\n"
           "            [--metrics HOST:PORT] [--max-sessions N] [--max-context N]\n"
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

kvl_status kvld_config_load_yaml(kvld_config *cfg, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return kvl__errorf(KVL_ERR_IO, "config: cannot open '%s': %s", path, strerror(errno));
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p)) {
        fclose(f);
        return kvl__errorf(KVL_ERR_NOMEM, "config: yaml parser");
    }
    yaml_parser_set_input_file(&p, f);
    kvl_status st = KVL_OK;
    char key[128] = "";
    int have_key = 0, depth = 0, done = 0;
    while (!done && st == KVL_OK) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&p, &ev)) {
            st = kvl__errorf(KVL_ERR_FORMAT, "config: %s:%zu: %s", path,
                            (size_t)p.problem_mark.line + 1, p.problem ? p.problem : "YAML error");
            break;
        }
        switch (ev.type) {
        case YAML_MAPPING_START_EVENT:
            if (++depth > 1)
                st = kvl__errorf(KVL_ERR_FORMAT, "config: %s:%zu: nested mappings are not supported",
                                path, (size_t)ev.start_mark.line + 1);
            break;
        case YAML_SEQUENCE_START_EVENT:
            st = kvl__errorf(KVL_ERR_FORMAT, "config: %s:%zu: lists are not supported", path,
                            (size_t)ev.start_mark.line + 1);
            break;
        case YAML_MAPPING_END_EVENT: depth--; break;
        case YAML_SCALAR_EVENT: {
            const char *val = (const char *)ev.data.scalar.value;
            if (depth != 1) {
                st = kvl__errorf(KVL_ERR_FORMAT, "config: %s: expected a mapping of key: value", path);
            } else if (!have_key) {
                snprintf(key, sizeof key, "%s", val);
                have_key = 1;
            } else {
                st = set_key(cfg, key, val);
                if (st != KVL_OK) kvl__error_prefix(st, path);
                have_key = 0;
            }
            break;
        }
        case YAML_STREAM_END_EVENT: done = 1; break;
        default: break;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&p);
    fclose(f);
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
