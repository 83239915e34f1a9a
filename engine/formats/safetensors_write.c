/* engine/formats/safetensors_write.c: atomic safetensors writer (temp file in the same folder + rename). */
#include "kvlingo/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "safetensors_internal.h"

/* The reader refuses offsets above 2^53 (JSON numbers are doubles), so the writer does too. */
#define ST_MAX_DATA ((uint64_t)1 << 53)

/* Growable string; `oom` latches the first failed allocation so callers check once. */
typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
} sbuf;

static void sb_putn(sbuf *b, const char *s, size_t n) {
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) {
            if (cap > SIZE_MAX / 2) {
                b->oom = true;
                return;
            }
            cap *= 2;
        }
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_puts(sbuf *b, const char *s) { sb_putn(b, s, strlen(s)); }

static void sb_u64(sbuf *b, uint64_t v) {
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%" PRIu64, v);
    sb_putn(b, tmp, (size_t)n);
}

/* JSON string literal; UTF-8 passes through, quotes/backslashes/control bytes are escaped. */
static void sb_json_str(sbuf *b, const char *s) {
    sb_putn(b, "\"", 1);
    for (const char *p = s; *p; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '"' || c == '\\') {
            char esc[2] = {'\\', (char)c};
            sb_putn(b, esc, 2);
        } else if (c < 0x20) {
            char esc[8];
            snprintf(esc, sizeof esc, "\\u%04x", c);
            sb_putn(b, esc, 6);
        } else {
            sb_putn(b, p, 1);
        }
    }
    sb_putn(b, "\"", 1);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* INVALID_ARG naming the first duplicate in names[n] (sorted in place), or KVL_OK. */
static kvl_status check_unique(const char *path, const char **names, size_t n, const char *what) {
    qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 1; i < n; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            return kvl__errorf(KVL_ERR_INVALID_ARG, "%s: %s '%s': duplicate name", path, what,
                              names[i]);
    return KVL_OK;
}

static kvl_status check_args(const char *path, const kvl_st_write_tensor *tensors, size_t n,
                             const char *const *keys, const char *const *values, size_t n_meta,
                             uint64_t *total_out) {
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const kvl_st_write_tensor *t = &tensors[i];
        if (!t->name)
            return kvl__errorf(KVL_ERR_INVALID_ARG, "%s: tensor #%zu: NULL name", path, i);
        if (strcmp(t->name, "__metadata__") == 0 || !kvl__st_utf8_valid(t->name, strlen(t->name)))
            return kvl__errorf(KVL_ERR_INVALID_ARG,
                              "%s: tensor '%s': name is reserved or not valid UTF-8", path, t->name);
        size_t esize = kvl_dtype_size(t->dtype);
        if (esize == 0)
            return kvl__errorf(KVL_ERR_INVALID_ARG, "%s: tensor '%s': invalid dtype %d", path,
                              t->name, (int)t->dtype);
        if (t->n_dims < 0 || t->n_dims > KVL_ST_MAX_DIMS)
            return kvl__errorf(KVL_ERR_INVALID_ARG, "%s: tensor '%s': n_dims %d outside 0..%d",
                              path, t->name, t->n_dims, KVL_ST_MAX_DIMS);
        int64_t count = 1;
        for (int d = 0; d < t->n_dims; d++) {
            if (t->shape[d] < 0 || !kvl__st_mul_i64(count, t->shape[d], &count))
                return kvl__errorf(KVL_ERR_INVALID_ARG,
                                  "%s: tensor '%s': shape[%d] = %" PRId64
                                  " is negative or overflows the element count",
                                  path, t->name, d, t->shape[d]);
        }
        int64_t need = -1; /* stays -1 when the byte size overflows */
        if (!kvl__st_mul_i64(count, (int64_t)esize, &need) || (uint64_t)need != t->nbytes)
            return kvl__errorf(KVL_ERR_INVALID_ARG,
                              "%s: tensor '%s': nbytes %zu, but %" PRId64 " elements of %s need %" PRId64,
                              path, t->name, t->nbytes, count, kvl_dtype_name(t->dtype), need);
        if (!t->data && t->nbytes)
            return kvl__errorf(KVL_ERR_INVALID_ARG, "%s: tensor '%s': NULL data", path, t->name);
        if (t->nbytes > ST_MAX_DATA - total)
            return kvl__errorf(KVL_ERR_INVALID_ARG, "%s: tensor '%s': data exceeds 2^53 bytes in all",
                              path, t->name);
        total += t->nbytes;
    }
    for (size_t i = 0; i < n_meta; i++) {
        if (!keys[i] || !values[i])
            return kvl__errorf(KVL_ERR_INVALID_ARG, "%s: metadata #%zu: NULL key or value", path, i);
        if (!kvl__st_utf8_valid(keys[i], strlen(keys[i])) ||
            !kvl__st_utf8_valid(values[i], strlen(values[i])))
            return kvl__errorf(KVL_ERR_INVALID_ARG, "%s: metadata '%s': not valid UTF-8", path,
                              keys[i]);
    }

    size_t most = n > n_meta ? n : n_meta;
    const char **names = malloc((most ? most : 1) * sizeof *names);
    if (!names)
        return kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory", path);
    for (size_t i = 0; i < n; i++)
        names[i] = tensors[i].name;
    kvl_status s = check_unique(path, names, n, "tensor");
    if (s == KVL_OK) {
        for (size_t i = 0; i < n_meta; i++)
            names[i] = keys[i];
        s = check_unique(path, names, n_meta, "metadata key");
    }
    free(names);
    *total_out = total;
    return s;
}

/* Header JSON padded with spaces so 8 + its length is a multiple of 8, as HF writes it. */
static kvl_status build_header(const char *path, const kvl_st_write_tensor *tensors, size_t n,
                               const char *const *keys, const char *const *values, size_t n_meta,
                               sbuf *b) {
    sb_puts(b, "{");
    bool first = true;
    if (n_meta) {
        sb_puts(b, "\"__metadata__\":{");
        for (size_t i = 0; i < n_meta; i++) {
            if (i)
                sb_puts(b, ",");
            sb_json_str(b, keys[i]);
            sb_puts(b, ":");
            sb_json_str(b, values[i]);
        }
        sb_puts(b, "}");
        first = false;
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const kvl_st_write_tensor *t = &tensors[i];
        if (!first)
            sb_puts(b, ",");
        first = false;
        sb_json_str(b, t->name);
        sb_puts(b, ":{\"dtype\":\"");
        sb_puts(b, kvl_dtype_name(t->dtype));
        sb_puts(b, "\",\"shape\":[");
        for (int d = 0; d < t->n_dims; d++) {
            if (d)
                sb_puts(b, ",");
            sb_u64(b, (uint64_t)t->shape[d]);
        }
        sb_puts(b, "],\"data_offsets\":[");
        sb_u64(b, off);
        sb_puts(b, ",");
        off += t->nbytes;
        sb_u64(b, off);
        sb_puts(b, "]}");
    }
    sb_puts(b, "}");
    while (!b->oom && b->len % 8 != 0)
        sb_puts(b, " ");
    if (b->oom)
        return kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory for the header", path);
    return KVL_OK;
}

static bool write_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len) {
        /* some kernels cap one write() near 2 GiB; loop over partial writes */
        ssize_t w = write(fd, p, len > ((size_t)1 << 30) ? ((size_t)1 << 30) : len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return false;
        }
        p += w;
        len -= (size_t)w;
    }
    return true;
}

kvl_status kvl_safetensors_write(const char *path, const kvl_st_write_tensor *tensors, size_t n,
                                 const char *const *meta_keys, const char *const *meta_values,
                                 size_t n_meta) {
    if (!path || (n && !tensors) || (n_meta && (!meta_keys || !meta_values)))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_safetensors_write: NULL argument");
    uint64_t total;
    kvl_status s = check_args(path, tensors, n, meta_keys, meta_values, n_meta, &total);
    if (s != KVL_OK)
        return s;
    sbuf hdr = {0};
    s = build_header(path, tensors, n, meta_keys, meta_values, n_meta, &hdr);
    if (s != KVL_OK) {
        free(hdr.p);
        return s;
    }

    size_t plen = strlen(path);
    char *tmp = malloc(plen + sizeof ".tmp.XXXXXX");
    if (!tmp) {
        free(hdr.p);
        return kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory", path);
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp.XXXXXX", sizeof ".tmp.XXXXXX");
    int fd = mkstemp(tmp);
    if (fd < 0) {
        s = kvl__errorf(KVL_ERR_IO, "%s: cannot create temporary file: %s", path, strerror(errno));
        free(tmp);
        free(hdr.p);
        return s;
    }
    /* mkstemp creates 0600; weights are meant to be shared like any other output file */
    (void)fchmod(fd, 0644);

    unsigned char lenbytes[8];
    for (int i = 0; i < 8; i++)
        lenbytes[i] = (unsigned char)((uint64_t)hdr.len >> (8 * i));
    bool ok = write_all(fd, lenbytes, 8) && write_all(fd, hdr.p, hdr.len);
    for (size_t i = 0; ok && i < n; i++)
        ok = write_all(fd, tensors[i].data, tensors[i].nbytes);
    /* fsync before rename so a crash leaves either the old file or the complete new one */
    if (ok)
        ok = fsync(fd) == 0;
    int e = errno;
    if (close(fd) != 0 && ok) {
        ok = false;
        e = errno;
    }
    if (ok && rename(tmp, path) != 0) {
        ok = false;
        e = errno;
    }
    if (!ok) {
        unlink(tmp);
        s = kvl__errorf(KVL_ERR_IO, "%s: write failed: %s", path, strerror(e));
    }
    free(tmp);
    free(hdr.p);
    return s;
}
