/* tests/unit/testutil.c: see testutil.h. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *kvl_test_path(const char *rel) {
    static char bufs[8][4096];
    static int next;
    char *b = bufs[next];
    next = (next + 1) % 8;
    snprintf(b, sizeof bufs[0], "%s/%s", KVL_SOURCE_DIR, rel);
    return b;
}

const char *kvl_test_tmpdir(void) {
    static char buf[4096];
    const char *t = getenv("TMPDIR");
    snprintf(buf, sizeof buf, "%s/kvltest.XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(buf)) return NULL;
    return buf;
}

int kvl_test_write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, len, f);
    int rc = fclose(f);
    return (w == len && rc == 0) ? 0 : -1;
}

char *kvl_test_read_file(const char *path, size_t *len_out) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) != 0) { fclose(f); return NULL; }
    long n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) { fclose(f); return NULL; }
    char *buf = malloc((size_t)n + 1);
    if (!buf) { fclose(f); return NULL; }
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); fclose(f); return NULL; }
    fclose(f);
    buf[n] = '\0';
    if (len_out) *len_out = (size_t)n;
    return buf;
}
