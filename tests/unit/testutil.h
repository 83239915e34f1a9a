/* tests/unit/testutil.h: small helpers shared by the unit tests. */
#ifndef KVL_TESTUTIL_H
#define KVL_TESTUTIL_H

#include <stddef.h>

/* Absolute path of `rel` under the source tree (KVL_SOURCE_DIR).  Returns a pointer into one
 * of 8 rotating static buffers: copy it if you need more than 8 at once. */
const char *kvl_test_path(const char *rel);

/* Fresh temporary directory (mkdtemp under $TMPDIR or /tmp); static buffer. */
const char *kvl_test_tmpdir(void);

/* Write `len` bytes to `path`; returns 0 on success. */
int kvl_test_write_file(const char *path, const void *data, size_t len);

/* Read a whole file (malloc'ed, NUL-terminated); NULL on failure. */
char *kvl_test_read_file(const char *path, size_t *len_out);

#endif
