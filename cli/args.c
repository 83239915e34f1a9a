/* cli/args.c: argument parsing and small I/O helpers for the CLI. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "cli.h"
#include "clock.h"
#include "error.h"

#include "kvlingo/backend.h"
#include "kvlingo/tokenizer.h"

/* "--key=value" becomes "--key" "value", so both spellings parse alike. */
int cli_args_init(cli_args *a, int argc, char **argv, int first) {
    memset(a, 0, sizeof *a);
    int n = argc;
    for (int i = first; i < argc; i++)
        if (!strncmp(argv[i], "--", 2) && strchr(argv[i], '=')) n++;
    a->argv = calloc((size_t)n + 1, sizeof(char *));
    a->split = calloc((size_t)n + 1, 1);
    a->used = calloc((size_t)n + 1, 1);
    a->role = calloc((size_t)n + 1, 1);
    if (!a->argv || !a->split || !a->used || !a->role) {
        cli_args_free(a);
        fprintf(stderr, "kvlingo: out of memory\n");
        return -1;
    }
    int k = 0;
    for (int i = 0; i < argc; i++) {
        const char *eq = i >= first && !strncmp(argv[i], "--", 2) ? strchr(argv[i], '=') : NULL;
        if (!eq) { a->argv[k++] = argv[i]; continue; }
        a->argv[k] = strndup(argv[i], (size_t)(eq - argv[i]));
        if (!a->argv[k]) { cli_args_free(a); return -1; }
        a->split[k++] = 1;
        a->role[k] = CLI_ROLE_VALUE;   /* "--text=--json": the value is never an option */
        a->argv[k++] = (char *)eq + 1;
    }
    a->argc = k;
    a->first = first;
    return 0;
}

void cli_args_free(cli_args *a) {
    for (int i = 0; a->argv && i < a->argc; i++)
        if (a->split[i]) free(a->argv[i]);
    free(a->argv);
    free(a->split);
    free(a->used);
    free(a->role);
    memset(a, 0, sizeof *a);
}

/* argv[i] == name, not taken as an option's value (`--text --json`: "--json" is the text) */
static int find(cli_args *a, const char *name) {
    for (int i = a->first; i < a->argc; i++)
        if (a->role[i] != CLI_ROLE_VALUE && !strcmp(a->argv[i], name)) return i;
    return -1;
}

const char *cli_opt(cli_args *a, const char *name, int *err) {
    int i = find(a, name);
    if (i < 0) return NULL;
    a->used[i] = 1;
    a->role[i] = CLI_ROLE_NAME;
    if (i + 1 >= a->argc) {
        fprintf(stderr, "kvlingo: option %s needs a value\n", name);
        *err = 1;
        return NULL;
    }
    if (a->role[i + 1] == CLI_ROLE_NAME) {   /* an earlier lookup took the value for an option */
        fprintf(stderr, "kvlingo: option %s: its value '%s' was also read as an option; write %s=%s\n",
                name, a->argv[i + 1], name, a->argv[i + 1]);
        *err = 1;
        return NULL;
    }
    a->used[i + 1] = 1;
    a->role[i + 1] = CLI_ROLE_VALUE;
    return a->argv[i + 1];
}

int cli_flag(cli_args *a, const char *name) {
    int i = find(a, name);
    if (i < 0 && !strcmp(name, "--help")) i = find(a, "-h");
    if (i < 0) return 0;
    a->used[i] = 1;
    a->role[i] = CLI_ROLE_NAME;
    return 1;
}

int cli_check_context(const char *cmd, const char *flags, long tokens, const struct kvl_model *m) {
    const kvl_model_config *c = kvl_model_config_get(m);
    if (tokens <= c->max_position_embeddings) return 0;
    fprintf(stderr, "kvlingo %s: %s: %ld positions exceed model '%s''s context (config.json "
            "max_position_embeddings %d)\n", cmd, flags, tokens, kvl_model_name(m), c->max_position_embeddings);
    return 1;
}

int cli_check_output(const char *cmd, const char *flag, const char *path) {
    if (!path[0] || strlen(path) >= 4096 || path[strlen(path) - 1] == '/') {
        fprintf(stderr, "kvlingo %s: option %s: '%.200s' is not a file path\n", cmd, flag, path);
        return 1;
    }
    struct stat st;
    const int sr = stat(path, &st);
    if (sr == 0 && S_ISDIR(st.st_mode)) {
        fprintf(stderr, "kvlingo %s: option %s: %s is a folder (a file path is expected)\n", cmd, flag, path);
        return 1;
    }
    if (sr != 0 && errno == ENOTDIR) {   /* a part of the path is a file */
        fprintf(stderr, "kvlingo %s: option %s: %s: %s\n", cmd, flag, path, strerror(errno));
        return 1;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    if (access(dir, W_OK) != 0) {
        fprintf(stderr, "kvlingo %s: option %s: cannot write into %s: %s\n", cmd, flag, dir, strerror(errno));
        return 1;
    }
    return 0;
}

long cli_opt_long(cli_args *a, const char *name, long dflt, long lo, long hi, int *err) {
    const char *v = cli_opt(a, name, err);
    if (!v) return dflt;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || end == v || x < lo || x > hi) {
        fprintf(stderr, "kvlingo: option %s: '%s' is not an integer in [%ld, %ld]\n", name, v, lo, hi);
        *err = 1;
        return dflt;
    }
    return x;
}

void cli_opt_device(cli_args *a, kvl_model_params *params, int *err) {
    const char *v = cli_opt(a, "--device", err);
    if (!v) return;
    if (kvl_device_parse(v, &params->device, &params->device_index) != KVL_OK) {
        fprintf(stderr, "kvlingo: option --device: %s\n", kvl_last_error());
        *err = 1;
    }
}

void cli_opt_weights_dtype(cli_args *a, kvl_model_params *params, int *err) {
    const char *v = cli_opt(a, "--weights-dtype", err);
    if (!v) return;
    if (kvl_weights_dtype_parse(v, &params->weights_dtype) != KVL_OK) {
        fprintf(stderr, "kvlingo: option --weights-dtype: %s\n", kvl_last_error());
        *err = 1;
    }
}

void cli_opt_kv_dtype(cli_args *a, kvl_model_params *params, int *err) {
    const char *v = cli_opt(a, "--kv-dtype", err);
    if (!v) return;
    if (kvl_kv_dtype_parse(v, &params->kv_dtype) != KVL_OK) {
        fprintf(stderr, "kvlingo: option --kv-dtype: %s\n", kvl_last_error());
        *err = 1;
    }
}

double cli_opt_double(cli_args *a, const char *name, double dflt, double lo, double hi, int *err) {
    const char *v = cli_opt(a, name, err);
    if (!v) return dflt;
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || *end || end == v || !(x >= lo && x <= hi)) {
        fprintf(stderr, "kvlingo: option %s: '%s' is not a number in [%g, %g]\n", name, v, lo, hi);
        *err = 1;
        return dflt;
    }
    return x;
}

int cli_args_leftover(cli_args *a, const char *cmd) {
    for (int i = a->first; i < a->argc; i++) {
        if (!a->used[i]) {
            fprintf(stderr, "kvlingo %s: unexpected argument '%s' (see kvlingo %s --help)\n", cmd,
                    a->argv[i], cmd);
            return 1;
        }
    }
    return 0;
}

int cli_parse_ids(const char *s, int32_t **ids_out, size_t *n_out) {
    size_t cap = 16, n = 0;
    int32_t *ids = malloc(sizeof(int32_t) * cap);
    if (!ids) { fprintf(stderr, "kvlingo: out of memory\n"); return 1; }
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        /* digits only: strtol also takes leading blanks and a sign (" 1", "+1"), and a comma
         * must be followed by another entry */
        if (*p < '0' || *p > '9' || end == p || errno || v < 0 || v > INT32_MAX || (*end && *end != ',') ||
            (*end == ',' && !end[1])) {
            fprintf(stderr, "kvlingo: token id list '%s': bad entry at offset %zu (expected "
                    "comma-separated non-negative integers)\n", s, (size_t)(p - s));
            free(ids);
            return 1;
        }
        if (n == cap) {
            cap *= 2;
            int32_t *ni = realloc(ids, sizeof(int32_t) * cap);
            if (!ni) { free(ids); fprintf(stderr, "kvlingo: out of memory\n"); return 1; }
            ids = ni;
        }
        ids[n++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    if (n == 0) {
        fprintf(stderr, "kvlingo: token id list is empty\n");
        free(ids);
        return 1;
    }
    *ids_out = ids;
    *n_out = n;
    return 0;
}

int cli_fail(const char *cmd, kvl_status s) {
    const char *d = kvl_last_error();
    fprintf(stderr, "kvlingo %s: %s%s%s\n", cmd, kvl_strerror(s), d && *d ? ": " : "", d ? d : "");
    return 1;
}

char *cli_read_file(const char *path, size_t *len_out) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "kvlingo: %s: cannot open: %s\n", path, strerror(errno)); return NULL; }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (n + 1 < cap) break;
        cap *= 2;
        char *nb = realloc(buf, cap);
        if (!nb) { free(buf); buf = NULL; }
        else buf = nb;
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        fprintf(stderr, "kvlingo: %s: %s\n", path, buf ? "read error" : "out of memory");
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    if (len_out) *len_out = n;
    return buf;
}

/* Copy of text[len] as valid UTF-8 (each byte of an invalid or truncated sequence becomes
 * U+FFFD, as Hugging Face's decode does), NUL-terminated; NULL when out of memory. */
static char *utf8_clean(const char *t, size_t len) {
    char *o = malloc(len * 3 + 1);
    if (!o) return NULL;
    size_t n = 0;
    const unsigned char *u = (const unsigned char *)t;
    for (size_t i = 0; i < len;) {
        unsigned c = u[i];
        size_t k = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3
                 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        int ok = k > 0 && i + k <= len;
        for (size_t j = 1; ok && j < k; j++) ok = (u[i + j] & 0xC0) == 0x80;
        if (ok && k == 3) ok = !(c == 0xE0 && u[i + 1] < 0xA0) && !(c == 0xED && u[i + 1] > 0x9F);
        if (ok && k == 4) ok = !(c == 0xF0 && u[i + 1] < 0x90) && !(c == 0xF4 && u[i + 1] > 0x8F);
        if (ok && c == 0) ok = 0;   /* a NUL would end the C string: U+FFFD instead */
        if (ok) {
            memcpy(o + n, t + i, k);
            n += k;
            i += k;
        } else {
            memcpy(o + n, "\xEF\xBF\xBD", 3);
            n += 3;
            i++;
        }
    }
    o[n] = 0;
    return o;
}

cJSON *cli_json_add_text(cJSON *obj, const char *key, const char *t, size_t len) {
    char *c = utf8_clean(t, len);
    cJSON *item = c ? cJSON_AddStringToObject(obj, key, c) : NULL;
    free(c);
    return item;
}

int cli_print_json(cJSON *j) {
    char *s = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!s) {
        fprintf(stderr, "kvlingo: out of memory writing JSON\n");
        return 1;
    }
    puts(s);
    cJSON_free(s);
    return 0;
}

/* Token stream of a text file under the evaluation protocol of models/PROVENANCE.md: each line
 * is a document, encoded on its own and followed by <|endoftext|>; documents concatenated. */
int cli_encode_documents(const char *cmd, kvl_tokenizer *tok, int32_t eos, const char *path,
                            int32_t **out, size_t *n_out) {
    size_t len;
    char *text = cli_read_file(path, &len);
    if (!text) return 1;
    size_t cap = 1 << 16, n = 0;
    int32_t *stream = malloc(sizeof(int32_t) * cap);
    if (!stream) { free(text); fprintf(stderr, "kvlingo %s: out of memory\n", cmd); return 1; }
    char *p = text, *end = text + len;
    long line = 0;
    while (p < end) {
        line++;
        char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t dl = nl ? (size_t)(nl - p) : (size_t)(end - p);
        if (dl > 0 && p[dl - 1] == '\r') dl--;
        if (dl > 0) {
            int32_t *ids;
            size_t k;
            kvl_status s = kvl_tokenizer_encode(tok, p, dl, &ids, &k);
            if (s != KVL_OK) {   /* which line of which file: a corpus is long */
                char where[4200];
                snprintf(where, sizeof where, "%s:%ld", path, line);
                kvl__error_prefix(s, where);
                free(stream);
                free(text);
                return cli_fail(cmd, s);
            }
            if (n + k + 1 > cap) {
                while (n + k + 1 > cap) cap *= 2;
                int32_t *ns = realloc(stream, sizeof(int32_t) * cap);
                if (!ns) { free(ids); free(stream); free(text); fprintf(stderr, "kvlingo %s: out of memory\n", cmd); return 1; }
                stream = ns;
            }
            memcpy(stream + n, ids, sizeof(int32_t) * k);
            n += k;
            stream[n++] = eos;
            free(ids);
        }
        p = nl ? nl + 1 : end;
    }
    free(text);
    *out = stream;
    *n_out = n;
    return 0;
}

void cli_progress_init(cli_progress *p, const char *what, int quiet) {
    memset(p, 0, sizeof *p);
    p->what = what;
    p->quiet = quiet;
    p->tty = isatty(2);
    p->t0 = p->last = kvl__now_s();
    p->last_frac = -1;
}

void cli_progress_step(cli_progress *p, const char *unit, long done, long total) {
    if (p->quiet || total <= 0) return;
    double now = kvl__now_s(), el = now - p->t0, frac = (double)done / (double)total;
    int end = done >= total;
    /* a terminal gets one updating line (at most every 0.5 s); a log a line every 10% or 5 s */
    if (!end && (p->tty ? now - p->last < 0.5 : (frac - p->last_frac < 0.1 && now - p->last < 5))) return;
    double eta = done > 0 ? el / (double)done * (double)(total - done) : 0;
    fprintf(stderr, "%s%s: %s %ld/%ld (%.0f%%), %.1f s elapsed%s", p->tty ? "\r" : "", p->what, unit,
            done, total, 100.0 * frac, el, end ? "" : ", ETA ");
    if (!end) fprintf(stderr, "%.0f s", eta);
    fputs(p->tty ? (end ? "   \n" : "   ") : "\n", stderr);
    fflush(stderr);
    p->last = now;
    p->last_frac = frac;
}
