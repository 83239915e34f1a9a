/* cli/main.c: `kvlingo` command dispatch. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "kvlingo/version.h"

static void usage(FILE *f) {
    fputs("usage: kvlingo <command> [options]\n"
          "\n"
          "commands:\n"
          "  info        --model DIR [--json]                      architecture, geometry, parameters\n"
          "  generate    --model DIR (--prompt TEXT | --prompt-ids 1,2,3) [--max-tokens N]\n"
          "              [--temperature T] [--top-k K] [--top-p P] [--seed S] [--threads N] [--json]\n"
          "              [--device cpu|cuda|cuda:N] [--weights-dtype auto|f32|bf16] [--kv-dtype f32|bf16]\n"
          "  eval-ppl    --model DIR --text-file FILE [--window 256] [--max-windows 200] [--json]\n"
          "              [--device cpu|cuda|cuda:N] [--weights-dtype auto|f32|bf16] [--kv-dtype f32|bf16]\n"
          "  tokenize    (--model DIR | --tokenizer FILE) (--text STR | --text-file FILE) [--json]\n"
          "  detokenize  (--model DIR | --tokenizer FILE) --ids 1,2,3\n"
#ifdef KVL_HAVE_SERVER
          "  chat        --router HOST:PORT (--tls-ca FILE | --insecure) [--session ID] [--model NAME] TEXT\n"
          "              one turn via kvlingo-router (--tokenizer DIR --system TEXT / --interactive:\n"
          "              chat messages with roles)\n"
#endif
          "  translator  train --source DIR --target DIR --corpus FILE --out FILE [--steps N]\n"
          "              [--stage1-only] [--seed S] [--threads N] [--resume CKPT]   KV-Lingo training\n"
          "  translator  eval --translator FILE --source DIR --target DIR --text-file FILE\n"
          "              [--prefix-len P] [--cont-len C] [--samples N] [--turns K] [--json]\n"
          "              [--device cpu|cuda|cuda:N]\n"
          "  translator  info FILE [--json]                          pair, geometry, figures\n"
          "  translator  import --layout plain --in FILE --source DIR --target DIR --out FILE\n"
          "  translator  plot --csv FILE[,FILE...] --out FILE.png       loss curve of training (gnuplot)\n"
          "  translator  random --source DIR --target DIR --out FILE [--dtype f32|bf16] [--seed S]\n"
          "              random maps of the right shape (cost measurements only)\n"
          "  model       random --shape SHAPE --out DIR [--dtype f32|bf16] [--seed S]   random-weight model dir\n"
          "  bench switch --source DIR|SHAPE --target DIR|SHAPE [--device cpu|cuda] [--lengths 64,1024]\n"
          "              [--new-tokens N] [--reps N] [--json]\n"
          "\n"
          "\n"
          "  --version   version, git commit, build options, backends\n"
          "Run `kvlingo <command> --help` (or -h) for a command's details and defaults; options take\n"
          "`--key value` or `--key=value`.\n", f);
}

int main(int argc, char **argv) {
    if (argc < 2) { usage(stderr); return 2; }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) { usage(stdout); return 0; }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V") || !strcmp(cmd, "version")) {
        kvl_version_print(stdout, "kvlingo");
        return 0;
    }
    if (!strcmp(cmd, "info")) return cmd_info(argc, argv);
    if (!strcmp(cmd, "generate")) return cmd_generate(argc, argv);
    if (!strcmp(cmd, "eval-ppl")) return cmd_eval_ppl(argc, argv);
    if (!strcmp(cmd, "tokenize")) return cmd_tokenize(argc, argv);
    if (!strcmp(cmd, "detokenize")) return cmd_detokenize(argc, argv);
#ifdef KVL_HAVE_SERVER
    if (!strcmp(cmd, "chat")) return cmd_chat(argc, argv);
#endif
    if (!strcmp(cmd, "translator")) return cmd_translator(argc, argv);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc, argv);
    if (!strcmp(cmd, "model")) return cmd_model(argc, argv);
    fprintf(stderr, "kvlingo: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
