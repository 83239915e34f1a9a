/* service/process.c: the standard process_* series of a Prometheus client, read from /proc at
 * scrape time (prom.h: kvl__svc_process_render). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "prom.h"

/* Seconds since the epoch at boot (btime of /proc/stat); 0 when unreadable. */
static double boot_time(void) {
    FILE *f = fopen("/proc/stat", "r");
    char line[256];
    double bt = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "btime ", 6)) {
            bt = strtod(line + 6, NULL);
            break;
        }
    if (f) fclose(f);
    return bt;
}

/* utime, stime (clock ticks) and starttime (ticks after boot) of /proc/self/stat. */
static int self_stat(unsigned long long *ut, unsigned long long *st, unsigned long long *start) {
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f) return -1;
    char buf[1024];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');   /* the command name may hold spaces and parentheses */
    if (!p) return -1;
    /* fields after the name: 3 state ... 14 utime 15 stime ... 22 starttime */
    int field = 2;
    unsigned long long v[23] = {0};
    for (char *tok = strtok(p + 1, " "); tok && field < 22; tok = strtok(NULL, " ")) {
        field++;
        v[field] = strtoull(tok, NULL, 10);
    }
    if (field < 22) return -1;
    *ut = v[14];
    *st = v[15];
    *start = v[22];
    return 0;
}

static long open_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    long n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n - 1;   /* the directory stream's own descriptor */
}

void kvl__svc_process_render(kvl__svc_text *b) {
    double tck = (double)sysconf(_SC_CLK_TCK), page = (double)sysconf(_SC_PAGESIZE);
    unsigned long long ut = 0, st = 0, start = 0;
    int have = self_stat(&ut, &st, &start) == 0 && tck > 0;
    if (have)
        kvl__svc_text_printf(b, "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"
                             "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total %.17g\n",
                             (double)(ut + st) / tck);
    long size = 0, res = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &size, &res) != 2) size = res = 0;
        fclose(f);
        kvl__svc_text_printf(b, "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
                             "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes %.17g\n"
                             "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
                             "# TYPE process_virtual_memory_bytes gauge\nprocess_virtual_memory_bytes %.17g\n",
                             (double)res * page, (double)size * page);
    }
    long fds = open_fds();
    if (fds >= 0)
        kvl__svc_text_printf(b, "# HELP process_open_fds Number of open file descriptors.\n"
                             "# TYPE process_open_fds gauge\nprocess_open_fds %ld\n", fds);
    struct rlimit rl;
    if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur != RLIM_INFINITY)
        kvl__svc_text_printf(b, "# HELP process_max_fds Maximum number of open file descriptors.\n"
                             "# TYPE process_max_fds gauge\nprocess_max_fds %llu\n",
                             (unsigned long long)rl.rlim_cur);
    double bt = boot_time();
    if (have && bt > 0)
        kvl__svc_text_printf(b, "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n"
                             "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds %.17g\n",
                             bt + (double)start / tck);
}
