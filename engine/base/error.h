/* engine/base/error.h: internal helpers to record the thread's detailed error message.
 * Not part of the public API (see include/kvlingo/status.h). */
#ifndef KVL_ENGINE_ERROR_H
#define KVL_ENGINE_ERROR_H

#include "kvlingo/status.h"

/* Record a printf-style message as the thread's last error and return `status`,
 * so call sites read: `return kvl__errorf(KVL_ERR_FORMAT, "%s: field '%s' ...", ...)`. */
kvl_status kvl__errorf(kvl_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prefix the current thread error message with "prefix: " (keeps status). */
kvl_status kvl__error_prefix(kvl_status status, const char *prefix);

#endif
