/* cli/cmd_plot.c: `kvlingo translator plot`, the loss curve `translator train` writes, drawn
 * with gnuplot into a PNG. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"

/* 1 when s has a control character: inside a gnuplot literal a newline ends the command and
 * the rest runs as gnuplot (`system "..."` included), so such text is refused, not quoted. */
static int has_control(const char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f) return 1;
    return 0;
}

/* Quote s for a gnuplot string literal (single quotes; a quote is doubled). */
static void gp_quote(FILE *f, const char *s) {
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', f);
        fputc(*s, f);
    }
    fputc('\'', f);
}

int cmd_translator_plot(int argc, char **argv) {
    cli_args a;
    if (cli_args_init(&a, argc, argv, 3)) return 1;
    int err = 0;
    if (cli_flag(&a, "--help")) {
        puts("usage: kvlingo translator plot --csv FILE --out FILE.png [--title TEXT] [--gnuplot PROGRAM]\n"
             "Renders the loss curve `translator train` writes (step, loss, kl_ema, lr, tokens_per_s) as a\n"
             "PNG with gnuplot (Debian package gnuplot-nox): KL per step and its moving average on a log\n"
             "scale, the learning rate below, tokens/s on the right.  Several CSVs of consecutive runs\n"
             "may be given as --csv A,B,C: their steps are laid end to end.");
        cli_args_free(&a);
        return 0;
    }
    const char *csv = cli_opt(&a, "--csv", &err), *out = cli_opt(&a, "--out", &err);
    const char *title = cli_opt(&a, "--title", &err), *prog = cli_opt(&a, "--gnuplot", &err);
    if (err || cli_args_leftover(&a, "translator plot")) { cli_args_free(&a); return 2; }
    cli_args_free(&a);
    if (!csv || !out) {
        fprintf(stderr, "kvlingo translator plot: --csv and --out are required\n");
        return 2;
    }
    const char *bad = has_control(out) ? "--out" : title && has_control(title) ? "--title"
                      : !title && has_control(csv) ? "--csv" : NULL;
    if (bad) {
        fprintf(stderr, "kvlingo translator plot: option %s: control characters (a newline, a tab...) are not "
                "allowed: gnuplot would run what follows them\n", bad);
        return 2;
    }
    /* the PNG is drawn into a file beside --out and renamed onto it once gnuplot succeeded: a
     * folder that does not exist is named now, and a failure leaves no half-drawn image */
    char part[4200];
    if (snprintf(part, sizeof part, "%s.part-XXXXXX", out) >= (int)sizeof part) {
        fprintf(stderr, "kvlingo translator plot: option --out: path too long\n");
        return 2;
    }
    int pfd = mkstemp(part);
    if (pfd < 0) {
        fprintf(stderr, "kvlingo translator plot: option --out: cannot write beside %s: %s\n", out, strerror(errno));
        return 1;
    }
    mode_t um = umask(0);   /* the image gets the mode a plain create would give it, not mkstemp's 0600 */
    umask(um);
    (void)fchmod(pfd, 0666 & ~um);
    close(pfd);
    /* lay the runs end to end into one data file gnuplot reads */
    char tmp[] = "/tmp/kvlingo-plot-XXXXXX";
    int fd = mkstemp(tmp);
    FILE *d = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!d) {
        fprintf(stderr, "kvlingo translator plot: cannot create a temporary file\n");
        if (fd >= 0) {
            close(fd);
            unlink(tmp);
        }
        unlink(part);
        return 1;
    }
    char *list = strdup(csv);
    long offset = 0, rows = 0;
    int rc = 0, runs = 0;
    for (char *save = NULL, *f = strtok_r(list, ",", &save); f && !rc; f = strtok_r(NULL, ",", &save)) {
        FILE *in = fopen(f, "r");
        if (!in) { fprintf(stderr, "kvlingo translator plot: %s: cannot open\n", f); rc = 1; break; }
        char line[512];
        long last = 0, ln = 0;
        while (fgets(line, sizeof line, in)) {
            ln++;
            if (ln == 1) {
                if (strncmp(line, "step,loss,kl_ema,lr,tokens_per_s", 32)) {
                    fprintf(stderr, "kvlingo translator plot: %s:1: not a loss curve of `translator train` "
                            "(header step,loss,kl_ema,lr,tokens_per_s expected)\n", f);
                    rc = 1;
                }
                continue;
            }
            long step;
            double loss, ema, lr, tps;
            if (sscanf(line, "%ld,%lf,%lf,%lf,%lf", &step, &loss, &ema, &lr, &tps) != 5) {
                fprintf(stderr, "kvlingo translator plot: %s:%ld: expected 5 numbers\n", f, ln);
                rc = 1;
                break;
            }
            fprintf(d, "%ld %.9g %.9g %.9g %.9g %d\n", offset + step, loss, ema, lr, tps, runs);
            last = step;
            rows++;
        }
        fclose(in);
        offset += last;
        runs++;
    }
    free(list);
    fclose(d);
    if (!rc && rows == 0) { fprintf(stderr, "kvlingo translator plot: %s: no rows\n", csv); rc = 1; }
    if (rc) { unlink(tmp); unlink(part); return rc; }
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s", prog ? prog : "gnuplot");
    /* a gnuplot that exits early (missing, or refusing a line) closes the pipe: a write then
     * fails instead of killing this process with SIGPIPE and leaving the files behind */
    void (*was)(int) = signal(SIGPIPE, SIG_IGN);
    FILE *g = popen(cmd, "w");
    if (!g) {
        signal(SIGPIPE, was);
        fprintf(stderr, "kvlingo translator plot: cannot run %s\n", cmd);
        unlink(tmp);
        unlink(part);
        return 1;
    }
    fputs("set terminal pngcairo size 1100,800 font ',10'\nset output ", g);
    gp_quote(g, part);
    fputs("\nset multiplot layout 2,1 title ", g);
    gp_quote(g, title ? title : csv);
    fputs("\nset grid\nset key top right\nset logscale y\nset ylabel 'KL(teacher || student), nats'\n"
          "set y2label 'tokens/s'\nset y2tics\nset ytics nomirror\nunset xlabel\n", g);
    fputs("plot ", g);
    gp_quote(g, tmp);
    fputs(" using 1:2 with points pt 7 ps 0.3 lc rgb '#9ecae1' title 'loss (step KL)', '' using 1:3 "
          "with lines lw 2 lc rgb '#08519c' title 'KL moving average', '' using 1:5 axes x1y2 with "
          "lines lc rgb '#bbbbbb' title 'tokens/s'\n", g);
    fputs("unset logscale y\nunset y2tics\nunset y2label\nset ytics mirror\nset xlabel 'step'\n"
          "set ylabel 'learning rate'\nplot ", g);
    gp_quote(g, tmp);
    fputs(" using 1:4 with lines lw 2 lc rgb '#d94801' title 'lr'\nunset multiplot\n", g);
    int st = pclose(g);
    signal(SIGPIPE, was);
    unlink(tmp);
    if (st != 0) {
        const int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        fprintf(stderr, "kvlingo translator plot: %s failed (exit status %d)%s\n", cmd, code,
                code == 127 ? "; is gnuplot installed (Debian: apt-get install gnuplot-nox)?"
                            : " (its own message is above)");
        unlink(part);
        return 1;
    }
    if (rename(part, out) != 0) {
        fprintf(stderr, "kvlingo translator plot: option --out: cannot write %s: %s\n", out, strerror(errno));
        unlink(part);
        return 1;
    }
    fprintf(stderr, "translator plot: %ld steps of %d run(s) -> %s\n", rows, runs, out);
    return 0;
}
