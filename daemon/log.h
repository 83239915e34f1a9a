/* daemon/log.h: structured logs, one line per event, logfmt (key=value) on stderr:
 *   ts=2026-11-29T20:31:02.123Z level=info msg=request method=Append session=s1 code=OK ms=3.1
 * Callers pass the key=value pairs after `msg`; values with spaces are quoted by kvld_log_q. */
#ifndef KVLD_LOG_H
#define KVLD_LOG_H

#include <stddef.h>

void kvld_log(const char *level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Quote `s` for a logfmt value into buf (escapes quotes/backslashes/newlines); returns buf. */
const char *kvld_log_q(char *buf, size_t cap, const char *s);

#endif
