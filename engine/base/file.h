/* engine/base/file.h: whole-file reads with errors that name the file. */
#ifndef KVL_BASE_FILE_H
#define KVL_BASE_FILE_H

#include <stddef.h>

#include "kvlingo/status.h"

/* Read the whole file at `path` into a malloc'ed buffer (caller frees *out) with a NUL byte
 * after the last one (so text can be parsed in place); *len receives the byte count without
 * it.  An empty file gives a valid empty string.  Errors: KVL_ERR_NOT_FOUND when the file does
 * not exist and missing_ok is set (no message recorded); KVL_ERR_IO (open or read failed,
 * message names the file and errno's text); KVL_ERR_RANGE (larger than max_bytes, when
 * max_bytes > 0); KVL_ERR_NOMEM.  On error *out is NULL. */
kvl_status kvl__file_read(const char *path, size_t max_bytes, int missing_ok, char **out,
                          size_t *len);

#endif
