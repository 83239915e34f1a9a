/* service/log.c: logfmt lines on stderr (log.h).  The line is assembled in a stack buffer and
 * written with a single write(2): stdio on an unbuffered stderr may split one fprintf into
 * several writes, which would let lines of concurrent handlers interleave. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define LINE_MAX_BYTES 4000   /* below PIPE_BUF (4096): a write of it to a pipe stays whole */

static const char *g_component = "kvlingo";

void kvl__svc_log_init(const char *component) {
    if (component && component[0]) g_component = component;
}

/* "ts=... level=... component=... " into line; returns its length. */
static size_t prefix(char *line, size_t cap, const char *level) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    int n = snprintf(line, cap, "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03dZ level=%s component=%s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, (int)(tv.tv_usec / 1000), level, g_component);
    if (n < 0) return 0;
    return (size_t)n < cap ? (size_t)n : cap - 1;
}

/* Terminate line[0, n) with a newline (n < LINE_MAX_BYTES) and write it in one call.  Control
 * characters become spaces first: a value a caller sent (a session id, a peer address) that
 * holds a newline must not start a line of its own, forged to look like the daemon's. */
static void emit(char *line, size_t n) {
    if (n > LINE_MAX_BYTES - 1) n = LINE_MAX_BYTES - 1;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)line[i] < 0x20 || line[i] == 0x7f) line[i] = ' ';
    line[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, n);
    (void)w;   /* nowhere to report a failed log write */
}

void kvl__svc_log(const char *level, const char *fmt, ...) {
    char line[LINE_MAX_BYTES + 1];
    size_t n = prefix(line, LINE_MAX_BYTES, level);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, LINE_MAX_BYTES - n, fmt, ap);
    va_end(ap);
    if (m > 0) n += (size_t)m < LINE_MAX_BYTES - n ? (size_t)m : LINE_MAX_BYTES - n - 1;
    emit(line, n);
}

void kvl__svc_log_text(const char *level, const char *fmt, ...) {
    char text[2048];
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (m < 0) text[0] = '\0';
    size_t tl = strlen(text);
    if (tl && text[tl - 1] == '\n') text[tl - 1] = '\0';
    char q[LINE_MAX_BYTES];
    kvl__svc_log(level, "msg=%s", kvl__svc_log_q(q, sizeof q, text));
}

const char *kvl__svc_log_q(char *buf, size_t cap, const char *s) {
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
