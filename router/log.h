/* router/log.h: the router's log lines on stderr, one line per event, logfmt-style prefix like
 * kvld's:  ts=2026-11-29T21:07:00.123Z level=info component=router <message>
 * Each line is written with one call, so lines of concurrent turns never interleave. */
#ifndef KVR_LOG_H
#define KVR_LOG_H

/* level: "info", "warn" or "error"; fmt ends with "\n". */
void kvr_logf(const char *level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
