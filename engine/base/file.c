/* engine/base/file.c: whole-file reads (file.h). */
#include "file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

kvl_status kvl__file_read(const char *path, size_t max_bytes, int missing_ok, char **out,
                          size_t *len) {
    if (!path || !out || !len) return kvl__errorf(KVL_ERR_INVALID_ARG, "file read: NULL argument");
    *out = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (missing_ok && errno == ENOENT) return KVL_ERR_NOT_FOUND;
        return kvl__errorf(KVL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    kvl_status s = KVL_OK;
    for (;;) {
        if (n + 65536 + 1 > cap) {
            size_t nc = cap ? cap * 2 : 65536 + 1;
            char *nb = realloc(buf, nc);
            if (!nb) { s = kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory", path); break; }
            buf = nb;
            cap = nc;
        }
        size_t got = fread(buf + n, 1, 65536, f);
        n += got;
        if (max_bytes > 0 && n > max_bytes) {
            s = kvl__errorf(KVL_ERR_RANGE, "%s: larger than the %zu-byte limit", path, max_bytes);
            break;
        }
        if (got < 65536) {
            if (ferror(f)) s = kvl__errorf(KVL_ERR_IO, "%s: read error: %s", path, strerror(errno));
            break;
        }
    }
    fclose(f);
    if (s != KVL_OK) { free(buf); return s; }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return KVL_OK;
}
