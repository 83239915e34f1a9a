/* service/log.h: the one log format of kvld and kvlingo-router: logfmt lines on stderr,
 *   ts=2026-11-29T20:31:02.123Z level=info component=kvld msg=request method=Append code=OK
 * Each line goes out in one write(2), so lines of concurrent threads never interleave (a pipe
 * keeps writes up to PIPE_BUF bytes whole; lines are capped below that). */
#ifndef KVL_SVC_LOG_H
#define KVL_SVC_LOG_H

#include <stddef.h>

/* Name the program for the `component=` field ("kvld", "router").  `component` is borrowed
 * (a string literal): it must outlive every later log call.  Call once from main before any
 * other thread logs; until then lines read component=kvlingo. */
void kvl__svc_log_init(const char *component);

/* One line at `level` ("info", "warn" or "error").  `fmt` formats the logfmt pairs that follow
 * the prefix and starts with `msg=`: kvl__svc_log("info", "msg=serving port=%d", port).  A
 * line longer than 4000 bytes is cut (it still ends with a newline).  No errors: logging
 * never fails the caller (a failed write is dropped). */
void kvl__svc_log(const char *level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Same, for a free-text message: the formatted text becomes one quoted `msg="..."` value
 * (quoted by kvl__svc_log_q; a trailing newline of the text is dropped). */
void kvl__svc_log_text(const char *level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Quote `s` as a logfmt value into `buf` (cap bytes, caller-owned): surrounding double
 * quotes, `"` and `\` escaped, CR/LF turned into spaces, cut to fit.  NULL `s` gives "".
 * Returns buf; returns "" (a static empty string) when cap < 3. */
const char *kvl__svc_log_q(char *buf, size_t cap, const char *s);

#endif
