/* daemon/log.c: logfmt lines on stderr; one fprintf per line so lines from concurrent
 * handlers never interleave. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

void kvld_log(const char *level, const char *fmt, ...) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    char line[2048];
    int n = snprintf(line, sizeof line, "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03dZ level=%s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, (int)(tv.tv_usec / 1000), level);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof line) vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
}

const char *kvld_log_q(char *buf, size_t cap, const char *s) {
    size_t o = 0;
    if (cap < 3) return "";
    buf[o++] = '"';
    for (; s && *s && o + 3 < cap; s++) {
        char c = *s;
        if (c == '"' || c == '\\') {
            buf[o++] = '\\';
            buf[o++] = c;
        } else if (c == '\n' || c == '\r') {
            buf[o++] = ' ';
        } else {
            buf[o++] = c;
        }
    }
    buf[o++] = '"';
    buf[o] = '\0';
    return buf;
}
