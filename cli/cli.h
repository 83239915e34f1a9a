/* cli/cli.h: shared helpers of the kvlingo command-line tool. */
#ifndef KVL_CLI_H
#define KVL_CLI_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "kvlingo/status.h"

/* --key value / --key=value / --flag parser over argv[first..argc); --help also answers -h. */
typedef struct cli_args {
    int argc;
    char **argv;           /* argv with each "--key=value" split in two (own array) */
    int first;
    unsigned char *used;   /* [argc] marks consumed arguments */
    unsigned char *split;  /* [argc] 1: argv[i] is an owned copy of a split key */
    unsigned char *role;   /* [argc] CLI_ROLE_*: what a lookup took argv[i] for      */
} cli_args;
enum { CLI_ROLE_NONE, CLI_ROLE_NAME, CLI_ROLE_VALUE };   /* a value is never found as an option */

struct kvl_model;

int cli_args_init(cli_args *a, int argc, char **argv, int first);
void cli_args_free(cli_args *a);
/* Value of --name (NULL when absent).  A missing value is reported and *err set. */
const char *cli_opt(cli_args *a, const char *name, int *err);
int cli_flag(cli_args *a, const char *name);
/* Parse numeric options; absent -> dflt.  Bad number -> message on stderr, *err = 1. */
long cli_opt_long(cli_args *a, const char *name, long dflt, long lo, long hi, int *err);
double cli_opt_double(cli_args *a, const char *name, double dflt, double lo, double hi, int *err);
/* --device cpu|cuda|cuda:N into params->device / device_index (absent: cpu).  A bad name ->
 * message on stderr, *err = 1. */
struct kvl_model_params;
void cli_opt_device(cli_args *a, struct kvl_model_params *params, int *err);
/* --weights-dtype auto|f32|bf16 into params->weights_dtype (kvlingo/model.h). */
void cli_opt_weights_dtype(cli_args *a, struct kvl_model_params *params, int *err);
/* --kv-dtype f32|bf16 into params->kv_dtype (kvlingo/model.h). */
void cli_opt_kv_dtype(cli_args *a, struct kvl_model_params *params, int *err);
/* Reports any argument not consumed; returns non-zero if there is one. */
int cli_args_leftover(cli_args *a, const char *cmd);

/* Parse "1,2,3" into a malloc'ed id array. Returns 0 on success, prints the error otherwise. */
int cli_parse_ids(const char *s, int32_t **ids_out, size_t *n_out);

/* Print "kvlingo <cmd>: <status text>: <detail>" to stderr and return 1. */
int cli_fail(const char *cmd, kvl_status s);
/* 0 when `tokens` positions fit in the model's context (config.json max_position_embeddings);
 * else 1 after naming the command, the flag(s) that set them, the model and its limit (a longer
 * window runs, but on positions the model never saw: its figures mean nothing). */
int cli_check_context(const char *cmd, const char *flags, long tokens, const struct kvl_model *m);
/* 0 when `path` can be written as a file (not a folder; its folder exists and is writable),
 * else 1 after naming the command, the flag and why: checked before long work that ends by
 * writing it. */
int cli_check_output(const char *cmd, const char *flag, const char *path);

/* Read a whole file (malloc'ed, NUL-terminated). Prints the error and returns NULL on failure. */
char *cli_read_file(const char *path, size_t *len_out);

/* JSON output goes through cJSON.  cli_json_add_text adds text[len] under key as a string,
 * made valid UTF-8 first (invalid bytes become U+FFFD); NULL when out of memory.
 * cli_print_json prints j on one line to stdout and frees it; non-zero (message on stderr)
 * when j is NULL or printing runs out of memory. */
cJSON *cli_json_add_text(cJSON *obj, const char *key, const char *text, size_t len);
int cli_print_json(cJSON *j);

/* Token stream of a text file under the evaluation protocol: each line is a document, encoded
 * on its own and followed by `eos`; documents concatenated.  *out is malloc'ed.  Prints the
 * error and returns non-zero on failure. */
struct kvl_tokenizer;
int cli_encode_documents(const char *cmd, struct kvl_tokenizer *tok, int32_t eos, const char *path,
                         int32_t **out, size_t *n_out);

/* Progress lines on stderr for long commands: an updating line on a terminal, a line every
 * 10% (or 5 s) otherwise, always the last; nothing when quiet. */
typedef struct cli_progress {
    const char *what;
    int quiet, tty;
    double t0, last, last_frac;
} cli_progress;
void cli_progress_init(cli_progress *p, const char *what, int quiet);
void cli_progress_step(cli_progress *p, const char *unit, long done, long total);

/* Commands */
int cmd_info(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_eval_ppl(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
#ifdef KVL_HAVE_SERVER
int cmd_chat(int argc, char **argv);   /* cli/cmd_chat.c: gRPC client of kvlingo-router */
#endif
int cmd_translator(int argc, char **argv);
int cmd_translator_random(int argc, char **argv);
int cmd_translator_plot(int argc, char **argv);   /* cli/cmd_plot.c */
/* A translator src -> dst holding `maps` (kvlingo/kv_maps.h, the default layer map, one tap):
 * what kvld applies, for benchmarks and random translator files.  KVL_ERR_MISMATCH when the
 * maps' geometry or layer map is not the pair's; free with kvl_translator_free. */
struct kvl_kv_maps;
struct kvl_model;
struct kvl_translator;
kvl_status cli_translator_from_maps(const struct kvl_model *src, const struct kvl_model *dst,
                                    const struct kvl_kv_maps *maps, struct kvl_translator **out);   /* cli/cmd_random.c */
int cmd_model(int argc, char **argv);              /* `model random` */
int cmd_bench(int argc, char **argv);

#endif
