/* engine/base/error.c: status names and the thread-local detailed error message. */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define KVL_ERRMSG_CAP 1024

static _Thread_local char g_errmsg[KVL_ERRMSG_CAP];

const char *kvl_strerror(kvl_status s) {
    switch (s) {
    case KVL_OK: return "ok";
    case KVL_ERR_INVALID_ARG: return "invalid argument";
    case KVL_ERR_IO: return "I/O error";
    case KVL_ERR_FORMAT: return "malformed input";
    case KVL_ERR_UNSUPPORTED: return "unsupported";
    case KVL_ERR_NOMEM: return "out of memory";
    case KVL_ERR_NOT_FOUND: return "not found";
    case KVL_ERR_RANGE: return "out of range";
    case KVL_ERR_MISMATCH: return "mismatch";
    case KVL_ERR_INTERNAL: return "internal error";
    case KVL_ERR_DEVICE: return "device error";
    case KVL_ERR_NUMERIC: return "non-finite value";
    case KVL_ERR_CANCELLED: return "cancelled";
    }
    return "unknown status";
}

const char *kvl_last_error(void) { return g_errmsg; }

void kvl_clear_error(void) { g_errmsg[0] = '\0'; }

kvl_status kvl__errorf(kvl_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_errmsg, sizeof g_errmsg, fmt, ap);
    va_end(ap);
    return status;
}

kvl_status kvl__error_prefix(kvl_status status, const char *prefix) {
    char tmp[KVL_ERRMSG_CAP];
    snprintf(tmp, sizeof tmp, "%s: %s", prefix, g_errmsg);
    memcpy(g_errmsg, tmp, sizeof g_errmsg);
    return status;
}
