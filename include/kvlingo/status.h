/* kvlingo/status.h: the one status enum of the kvlingo C API.
 *
 * Every public function that can fail returns kvl_status: 0 on success, a negative
 * value on error.  kvl_strerror() names the error class; kvl_last_error() gives the
 * calling thread's detailed message (file, field, values) of the most recent failure.
 * Library code never calls exit() or abort() on bad input.
 */
#ifndef KVLINGO_STATUS_H
#define KVLINGO_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kvl_status {
    KVL_OK = 0,
    KVL_ERR_INVALID_ARG = -1,  /* a caller-supplied argument is out of its domain      */
    KVL_ERR_IO = -2,           /* open/read/write/mmap failed                            */
    KVL_ERR_FORMAT = -3,       /* a file or message is malformed (JSON, safetensors, ...) */
    KVL_ERR_UNSUPPORTED = -4,  /* well-formed but not supported (architecture, rope type) */
    KVL_ERR_NOMEM = -5,        /* an allocation failed                                   */
    KVL_ERR_NOT_FOUND = -6,    /* a named tensor, key, file or session does not exist    */
    KVL_ERR_RANGE = -7,        /* an index, length or capacity is exceeded               */
    KVL_ERR_MISMATCH = -8,     /* shapes, geometry or model identity do not agree        */
    KVL_ERR_INTERNAL = -9,     /* an invariant was broken inside kvlingo (a bug)         */
    KVL_ERR_DEVICE = -10,      /* a CUDA / accelerator call failed                       */
    KVL_ERR_NUMERIC = -11,     /* NaN or Inf where finite values are required           */
    KVL_ERR_CANCELLED = -12,   /* the operation was cancelled by its caller              */
} kvl_status;

/* Static, never-NULL name of a status ("ok", "invalid argument", ...). */
const char *kvl_strerror(kvl_status status);

/* The calling thread's detailed message for the most recent error set by kvlingo
 * (e.g. "models/x/config.json: field 'hidden_size': expected a positive integer").
 * Thread-local storage owned by the library; valid until the next kvlingo call on
 * this thread.  Empty string when no error has been recorded. */
const char *kvl_last_error(void);

/* Clear the calling thread's error message. */
void kvl_clear_error(void);

#ifdef __cplusplus
}
#endif
#endif
