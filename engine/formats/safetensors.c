/* engine/formats/safetensors.c: safetensors reader (mmap + validation) and element conversions.
 * The writer is in safetensors_write.c, sharded model directories in st_set.c. */
#include "kvlingo/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bf16.h"
#include "error.h"
#include "safetensors_internal.h"

/* JSON numbers reach us as doubles; above 2^53 they are no longer exact, so a larger shape
 * entry or offset cannot be trusted and is refused (no real file comes near 8 PiB). */
#define ST_MAX_EXACT_INT 9007199254740992.0

struct kvl_safetensors {
    const char *label;            /* in arena                                         */
    void *map;                    /* mmap'ed file, NULL for _parse                     */
    size_t map_len;
    size_t n;
    kvl_st_tensor *tensors;       /* header order                                      */
    const kvl_st_tensor **by_name;/* sorted by name, for bsearch                      */
    size_t n_meta;
    const char **meta_keys;       /* in arena                                          */
    const char **meta_values;
    char *arena;                  /* every string this file owns, one allocation       */
};

/* ---- dtypes ------------------------------------------------------------------------------- */

static const struct {
    const char *name;
    size_t size;
} g_dtypes[] = {
    [KVL_DTYPE_F32] = {"F32", 4},  [KVL_DTYPE_F16] = {"F16", 2}, [KVL_DTYPE_BF16] = {"BF16", 2},
    [KVL_DTYPE_F64] = {"F64", 8},  [KVL_DTYPE_I64] = {"I64", 8}, [KVL_DTYPE_I32] = {"I32", 4},
    [KVL_DTYPE_I16] = {"I16", 2},  [KVL_DTYPE_I8] = {"I8", 1},   [KVL_DTYPE_U8] = {"U8", 1},
    [KVL_DTYPE_BOOL] = {"BOOL", 1},
};
#define ST_N_DTYPES (sizeof g_dtypes / sizeof g_dtypes[0])

size_t kvl_dtype_size(kvl_dtype dtype) {
    return (unsigned)dtype < ST_N_DTYPES ? g_dtypes[dtype].size : 0;
}

const char *kvl_dtype_name(kvl_dtype dtype) {
    return (unsigned)dtype < ST_N_DTYPES ? g_dtypes[dtype].name : "?";
}

kvl_status kvl_dtype_parse(const char *name, kvl_dtype *out) {
    if (!name || !out)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_dtype_parse: NULL argument");
    for (size_t i = 0; i < ST_N_DTYPES; i++) {
        if (strcmp(name, g_dtypes[i].name) == 0) {
            *out = (kvl_dtype)i;
            return KVL_OK;
        }
    }
    return kvl__errorf(KVL_ERR_FORMAT, "unknown dtype '%.32s'", name);
}

/* ---- UTF-8 -------------------------------------------------------------------------------- */

bool kvl__st_utf8_valid(const char *str, size_t len) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t need;
        unsigned lo = 0x80, hi = 0xBF; /* allowed range of the first continuation byte */
        if (c >= 0xC2 && c <= 0xDF) {
            need = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            if (c == 0xE0) lo = 0xA0;           /* overlong */
            if (c == 0xED) hi = 0x9F;           /* surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            if (c == 0xF0) lo = 0x90;           /* overlong */
            if (c == 0xF4) hi = 0x8F;           /* > U+10FFFF */
        } else {
            return false;
        }
        if (len - i <= need)
            return false;
        if (s[i + 1] < lo || s[i + 1] > hi)
            return false;
        for (size_t k = 2; k <= need; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return false;
        i += need + 1;
    }
    return true;
}

/* ---- header validation -------------------------------------------------------------------- */

typedef struct st_range {
    uint64_t begin, end;
    const char *name;
} st_range;

static int cmp_range(const void *a, const void *b) {
    const st_range *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

static int cmp_tensor_name(const void *a, const void *b) {
    const kvl_st_tensor *x = *(const kvl_st_tensor *const *)a;
    const kvl_st_tensor *y = *(const kvl_st_tensor *const *)b;
    return strcmp(x->name, y->name);
}

/* A JSON number that is an exact non-negative integer we can represent. */
static bool json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v))
        return false;
    double d = v->valuedouble;
    if (!(d >= 0.0 && d <= ST_MAX_EXACT_INT) || d != (double)(uint64_t)d)
        return false;
    *out = (uint64_t)d;
    return true;
}

static const char *json_kind(const cJSON *v) {
    if (cJSON_IsObject(v)) return "an object";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNull(v)) return "null";
    return "an invalid value";
}

static char *arena_put(char **cursor, const char *s) {
    size_t n = strlen(s) + 1;
    char *dst = *cursor;
    memcpy(dst, s, n);
    *cursor += n;
    return dst;
}

/* Validate one tensor entry; fills t (except name/data) and its byte range. */
static kvl_status parse_entry(const char *label, const cJSON *e, size_t data_len,
                              kvl_st_tensor *t, st_range *r) {
    const char *name = e->string;
    if (!cJSON_IsObject(e))
        return kvl__errorf(KVL_ERR_FORMAT, "%s: tensor '%s': expected an object, got %s", label,
                          name, json_kind(e));

    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    if (!cJSON_IsString(dt))
        return kvl__errorf(KVL_ERR_FORMAT, "%s: tensor '%s': field 'dtype': expected a string, got %s",
                          label, name, dt ? json_kind(dt) : "nothing");
    if (kvl_dtype_parse(dt->valuestring, &t->dtype) != KVL_OK)
        return kvl__errorf(KVL_ERR_FORMAT, "%s: tensor '%s': field 'dtype': unknown dtype '%.32s'",
                          label, name, dt->valuestring);

    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    if (!cJSON_IsArray(shape))
        return kvl__errorf(KVL_ERR_FORMAT, "%s: tensor '%s': field 'shape': expected an array, got %s",
                          label, name, shape ? json_kind(shape) : "nothing");
    int nd = cJSON_GetArraySize(shape);
    if (nd > KVL_ST_MAX_DIMS)
        return kvl__errorf(KVL_ERR_FORMAT,
                          "%s: tensor '%s': field 'shape': %d dimensions, at most %d supported",
                          label, name, nd, KVL_ST_MAX_DIMS);
    t->n_dims = nd;
    int64_t count = 1;
    int d = 0;
    for (const cJSON *v = shape->child; v; v = v->next, d++) {
        uint64_t u;
        if (!json_uint(v, &u))
            return kvl__errorf(KVL_ERR_FORMAT,
                              "%s: tensor '%s': field 'shape'[%d]: expected a non-negative integer",
                              label, name, d);
        t->shape[d] = (int64_t)u;
        if (!kvl__st_mul_i64(count, (int64_t)u, &count))
            return kvl__errorf(KVL_ERR_FORMAT,
                              "%s: tensor '%s': field 'shape': element count overflows 64 bits",
                              label, name);
    }
    t->n_elements = count;

    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    uint64_t b, en;
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || !json_uint(off->child, &b) ||
        !json_uint(off->child->next, &en))
        return kvl__errorf(KVL_ERR_FORMAT,
                          "%s: tensor '%s': field 'data_offsets': expected [begin, end] "
                          "non-negative integers",
                          label, name);
    if (b > en)
        return kvl__errorf(KVL_ERR_FORMAT,
                          "%s: tensor '%s': field 'data_offsets': begin %" PRIu64 " > end %" PRIu64,
                          label, name, b, en);
    if (en > data_len)
        return kvl__errorf(KVL_ERR_FORMAT,
                          "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                          ") exceed data buffer of %zu bytes",
                          label, name, b, en, data_len);
    int64_t need;
    if (!kvl__st_mul_i64(count, (int64_t)kvl_dtype_size(t->dtype), &need))
        return kvl__errorf(KVL_ERR_FORMAT, "%s: tensor '%s': field 'shape': byte size overflows 64 bits",
                          label, name);
    if ((uint64_t)need != en - b)
        return kvl__errorf(KVL_ERR_FORMAT,
                          "%s: tensor '%s': field 'data_offsets': [%" PRIu64 ", %" PRIu64
                          ") holds %" PRIu64 " bytes but shape (%" PRId64 " elements of %s) needs %" PRId64,
                          label, name, b, en, en - b, count, kvl_dtype_name(t->dtype), need);
    t->nbytes = (size_t)need;
    r->begin = b;
    r->end = en;
    r->name = name;
    return KVL_OK;
}

static kvl_status parse_metadata(const char *label, const cJSON *m) {
    if (!cJSON_IsObject(m))
        return kvl__errorf(KVL_ERR_FORMAT, "%s: field '__metadata__': expected an object, got %s",
                          label, json_kind(m));
    for (const cJSON *v = m->child; v; v = v->next) {
        if (!cJSON_IsString(v))
            return kvl__errorf(KVL_ERR_FORMAT,
                              "%s: field '__metadata__': key '%s': expected a string, got %s", label,
                              v->string, json_kind(v));
        /* cJSON keeps duplicate keys: a lookup would see the first, a copy of the whole map
         * both (metadata headers are small: the quadratic scan costs nothing) */
        for (const cJSON *w = m->child; w != v; w = w->next)
            if (strcmp(w->string, v->string) == 0)
                return kvl__errorf(KVL_ERR_FORMAT, "%s: field '__metadata__': key '%s' appears twice",
                                  label, v->string);
    }
    return KVL_OK;
}

/* Build the file object from the JSON tree; everything the result keeps is copied out. */
static kvl_status build(const char *label, const cJSON *root, const uint8_t *data,
                        size_t data_len, kvl_safetensors **out) {
    size_t n = 0, n_meta = 0, strbytes = strlen(label) + 1;
    const cJSON *meta = NULL;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) {
            if (meta)
                return kvl__errorf(KVL_ERR_FORMAT, "%s: field '__metadata__': appears twice", label);
            kvl_status s = parse_metadata(label, e);
            if (s != KVL_OK)
                return s;
            meta = e;
            for (const cJSON *v = e->child; v; v = v->next) {
                n_meta++;
                strbytes += strlen(v->string) + strlen(v->valuestring) + 2;
            }
        } else {
            n++;
            strbytes += strlen(e->string) + 1;
        }
    }

    kvl_safetensors *st = calloc(1, sizeof *st);
    st_range *ranges = calloc(n ? n : 1, sizeof *ranges);
    if (!st || !ranges) {
        free(st);
        free(ranges);
        return kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory for %zu tensors", label, n);
    }
    st->n = n;
    st->n_meta = n_meta;
    st->tensors = calloc(n ? n : 1, sizeof *st->tensors);
    st->by_name = calloc(n ? n : 1, sizeof *st->by_name);
    st->meta_keys = calloc(n_meta ? n_meta : 1, sizeof *st->meta_keys);
    st->meta_values = calloc(n_meta ? n_meta : 1, sizeof *st->meta_values);
    st->arena = malloc(strbytes);
    kvl_status s = KVL_OK;
    if (!st->tensors || !st->by_name || !st->meta_keys || !st->meta_values || !st->arena) {
        s = kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory for %zu tensors", label, n);
        goto fail;
    }
    char *cur = st->arena;
    st->label = arena_put(&cur, label);

    size_t i = 0;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (e == meta)
            continue;
        kvl_st_tensor *t = &st->tensors[i];
        s = parse_entry(st->label, e, data_len, t, &ranges[i]);
        if (s != KVL_OK)
            goto fail;
        t->name = arena_put(&cur, e->string);
        ranges[i].name = t->name;
        t->data = data + ranges[i].begin;
        st->by_name[i] = t;
        i++;
    }
    if (meta) {
        size_t k = 0;
        for (const cJSON *v = meta->child; v; v = v->next, k++) {
            st->meta_keys[k] = arena_put(&cur, v->string);
            st->meta_values[k] = arena_put(&cur, v->valuestring);
        }
    }

    /* cJSON keeps duplicate keys; a duplicate tensor name would make lookups ambiguous. */
    qsort(st->by_name, n, sizeof *st->by_name, cmp_tensor_name);
    for (i = 1; i < n; i++) {
        if (strcmp(st->by_name[i - 1]->name, st->by_name[i]->name) == 0) {
            s = kvl__errorf(KVL_ERR_FORMAT, "%s: tensor '%s': name appears twice in the header",
                           st->label, st->by_name[i]->name);
            goto fail;
        }
    }

    /* Sorted by begin, non-empty ranges must follow one another; empty tensors occupy no bytes
     * and so cannot overlap anything. */
    qsort(ranges, n, sizeof *ranges, cmp_range);
    const st_range *prev = NULL;
    for (i = 0; i < n; i++) {
        if (ranges[i].begin == ranges[i].end)
            continue;
        if (prev && ranges[i].begin < prev->end) {
            s = kvl__errorf(KVL_ERR_FORMAT,
                           "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                           ") overlap tensor '%s' at [%" PRIu64 ", %" PRIu64 ")",
                           st->label, ranges[i].name, ranges[i].begin, ranges[i].end, prev->name,
                           prev->begin, prev->end);
            goto fail;
        }
        prev = &ranges[i];
    }
    free(ranges);
    *out = st;
    return KVL_OK;

fail:
    free(ranges);
    kvl_safetensors_close(st);
    return s;
}

/* Validate a whole file image; `map` (may be NULL) is owned by the result on success. */
static kvl_status parse_image(const uint8_t *buf, size_t len, const char *label, void *map,
                              size_t map_len, kvl_safetensors **out) {
    if (len < 8)
        return kvl__errorf(KVL_ERR_FORMAT,
                          "%s: header length: file is %zu bytes, shorter than the 8-byte length field",
                          label, len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | buf[i];
    if (hlen < 2)
        return kvl__errorf(KVL_ERR_FORMAT,
                          "%s: header length: %" PRIu64 " is below the 2-byte minimum", label, hlen);
    if (hlen > len - 8)
        return kvl__errorf(KVL_ERR_FORMAT,
                          "%s: header length: %" PRIu64 " exceeds the %zu bytes after the length field",
                          label, hlen, len - 8);
    const char *hdr = (const char *)buf + 8;
    size_t n = (size_t)hlen;
    const char *nul = memchr(hdr, '\0', n);
    if (nul)
        return kvl__errorf(KVL_ERR_FORMAT, "%s: header: NUL byte at header offset %zu", label,
                          (size_t)(nul - hdr));
    if (!kvl__st_utf8_valid(hdr, n))
        return kvl__errorf(KVL_ERR_FORMAT, "%s: header: not valid UTF-8", label);

    /* cJSON is given a NUL-terminated private copy: older releases may read one byte past a
     * buffer that is not terminated, and the mapping ends exactly at the file's end. */
    char *copy = malloc(n + 1);
    if (!copy)
        return kvl__errorf(KVL_ERR_NOMEM, "%s: header: out of memory for %zu bytes", label, n);
    memcpy(copy, hdr, n);
    copy[n] = '\0';
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(copy, n, &end, 0);
    kvl_status s;
    if (!root) {
        size_t at = end && end >= copy && end <= copy + n ? (size_t)(end - copy) : 0;
        s = kvl__errorf(KVL_ERR_FORMAT, "%s: header: invalid JSON near byte %zu", label, at);
        goto done;
    }
    /* Writers pad the header with spaces; anything else after the value is malformed. */
    for (const char *p = end; p < copy + n; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            s = kvl__errorf(KVL_ERR_FORMAT, "%s: header: unexpected data after the JSON value at byte %zu",
                           label, (size_t)(p - copy));
            goto done;
        }
    }
    if (!cJSON_IsObject(root)) {
        s = kvl__errorf(KVL_ERR_FORMAT, "%s: header: expected a JSON object, got %s", label,
                       json_kind(root));
        goto done;
    }
    s = build(label, root, buf + 8 + n, len - 8 - n, out);
    if (s == KVL_OK) {
        (*out)->map = map;
        (*out)->map_len = map_len;
    }
done:
    cJSON_Delete(root);
    free(copy);
    return s;
}

kvl_status kvl_safetensors_parse(const void *buf, size_t len, const char *label,
                                 kvl_safetensors **out) {
    if (!out || (!buf && len))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_safetensors_parse: NULL argument");
    *out = NULL;
    if (!label)
        label = "<memory>";
    return parse_image(buf ? buf : (const void *)"", len, label, NULL, 0, out);
}

kvl_status kvl_safetensors_open(const char *path, kvl_safetensors **out) {
    if (!path || !out)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_safetensors_open: NULL argument");
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kvl__errorf(KVL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return kvl__errorf(KVL_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return kvl__errorf(KVL_ERR_IO, "%s: not a regular file", path);
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        close(fd);
        return kvl__errorf(KVL_ERR_IO, "%s: file too large to map", path);
    }
    size_t len = (size_t)sb.st_size;
    if (len == 0) { /* mmap refuses length 0; let the validator produce the error */
        close(fd);
        return parse_image((const uint8_t *)"", 0, path, NULL, 0, out);
    }
    /* Note: a file truncated by someone else while mapped raises SIGBUS on access; shipped
     * weights are immutable, so we accept that rather than copying every file. */
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED)
        return kvl__errorf(KVL_ERR_IO, "%s: cannot mmap %zu bytes: %s", path, len, strerror(e));
    kvl_status s = parse_image(map, len, path, map, len, out);
    if (s != KVL_OK)
        munmap(map, len);
    return s;
}

void kvl_safetensors_close(kvl_safetensors *st) {
    if (!st)
        return;
    if (st->map)
        munmap(st->map, st->map_len);
    free(st->tensors);
    free(st->by_name);
    free(st->meta_keys);
    free(st->meta_values);
    free(st->arena);
    free(st);
}

/* ---- queries ------------------------------------------------------------------------------ */

size_t kvl_safetensors_count(const kvl_safetensors *st) { return st ? st->n : 0; }

const kvl_st_tensor *kvl_safetensors_get(const kvl_safetensors *st, size_t i) {
    return st && i < st->n ? &st->tensors[i] : NULL;
}

static int cmp_key_tensor(const void *key, const void *elem) {
    return strcmp((const char *)key, (*(const kvl_st_tensor *const *)elem)->name);
}

const kvl_st_tensor *kvl_safetensors_find(const kvl_safetensors *st, const char *name) {
    if (!st || !name || st->n == 0)
        return NULL;
    const kvl_st_tensor *const *hit =
        bsearch(name, st->by_name, st->n, sizeof *st->by_name, cmp_key_tensor);
    return hit ? *hit : NULL;
}

size_t kvl_safetensors_metadata_count(const kvl_safetensors *st) { return st ? st->n_meta : 0; }
const char *kvl_safetensors_metadata_key(const kvl_safetensors *st, size_t i) {
    return st && i < st->n_meta ? st->meta_keys[i] : NULL;
}
const char *kvl_safetensors_metadata_value(const kvl_safetensors *st, size_t i) {
    return st && i < st->n_meta ? st->meta_values[i] : NULL;
}

const char *kvl_safetensors_metadata(const kvl_safetensors *st, const char *key) {
    if (!st || !key)
        return NULL;
    for (size_t i = 0; i < st->n_meta; i++)
        if (strcmp(st->meta_keys[i], key) == 0)
            return st->meta_values[i];
    return NULL;
}

const char *kvl_safetensors_path(const kvl_safetensors *st) { return st ? st->label : NULL; }

/* ---- element conversions ------------------------------------------------------------------ */

static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

float kvl_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0) {
        if (m == 0)
            return bits_f32(sign);
        /* subnormal m * 2^-24: shift the leading 1 into the implicit bit */
        uint32_t ex = 113;
        while (!(m & 0x400)) {
            m <<= 1;
            ex--;
        }
        return bits_f32(sign | (ex << 23) | ((m & 0x3ff) << 13));
    }
    if (e == 31)
        return bits_f32(sign | 0x7f800000 | (m ? 0x400000 | (m << 13) : 0));
    return bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

float kvl_bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    if ((u & 0x7fffffff) > 0x7f800000)
        u |= 0x400000; /* quiet a signalling NaN, keep its payload */
    return bits_f32(u);
}

uint16_t kvl_f32_to_bf16(float f) { return kvl__bf16_round(f); }

uint16_t kvl_f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t x = u & 0x7fffffff;
    if (x >= 0x7f800000)
        return sign | (x > 0x7f800000 ? 0x7e00 | ((x >> 13) & 0x3ff) : 0x7c00);
    if (x >= 0x477ff000) /* >= 65520 rounds to inf */
        return sign | 0x7c00;
    if (x < 0x38800000) { /* below the smallest normal half, 2^-14 */
        if (x <= 0x33000000) /* <= 2^-25: ties to even give 0 */
            return sign;
        uint32_t e = x >> 23, m = (x & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1)))
            r++;
        return sign | (uint16_t)r;
    }
    uint32_t r = (x - 0x38000000) >> 13, rem = x & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1)))
        r++;
    return sign | (uint16_t)r;
}

/* double -> float without the undefined behaviour of an out-of-range cast: values at or past
 * the midpoint between FLT_MAX and 2^128 round to inf, as IEEE conversion would. */
static inline float f64_to_f32(double v) {
    if (v != v)
        return (float)v;
    if (v >= 0x1.ffffffp127)
        return INFINITY;
    if (v <= -0x1.ffffffp127)
        return -INFINITY;
    return (float)v;
}

kvl_status kvl_st_tensor_to_f32(const kvl_st_tensor *t, float *dst, size_t n) {
    if (!t || (!dst && n))
        return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_st_tensor_to_f32: NULL argument");
    if (t->n_elements < 0 || n != (uint64_t)t->n_elements)
        return kvl__errorf(KVL_ERR_MISMATCH,
                          "tensor '%s': destination holds %zu floats, tensor has %" PRId64 " elements",
                          t->name, n, t->n_elements);
    const unsigned char *p = t->data;
    /* Data may be unaligned inside the mapping, so every load goes through memcpy. */
#define ST_CONVERT(T, EXPR)                       \
    for (size_t i = 0; i < n; i++) {              \
        T v;                                      \
        memcpy(&v, p + i * sizeof(T), sizeof(T)); \
        dst[i] = (EXPR);                          \
    }
    switch (t->dtype) {
    case KVL_DTYPE_F32: if (n) memcpy(dst, p, n * 4); break;
    case KVL_DTYPE_F16: ST_CONVERT(uint16_t, kvl_f16_to_f32(v)); break;
    case KVL_DTYPE_BF16: ST_CONVERT(uint16_t, kvl_bf16_to_f32(v)); break;
    case KVL_DTYPE_F64: ST_CONVERT(double, f64_to_f32(v)); break;
    case KVL_DTYPE_I64: ST_CONVERT(int64_t, (float)v); break;
    case KVL_DTYPE_I32: ST_CONVERT(int32_t, (float)v); break;
    case KVL_DTYPE_I16: ST_CONVERT(int16_t, (float)v); break;
    case KVL_DTYPE_I8: ST_CONVERT(int8_t, (float)v); break;
    case KVL_DTYPE_U8: ST_CONVERT(uint8_t, (float)v); break;
    case KVL_DTYPE_BOOL:
        return kvl__errorf(KVL_ERR_UNSUPPORTED, "tensor '%s': BOOL cannot be converted to F32",
                          t->name);
    default:
        return kvl__errorf(KVL_ERR_INVALID_ARG, "tensor '%s': invalid dtype %d", t->name,
                          (int)t->dtype);
    }
#undef ST_CONVERT
    return KVL_OK;
}
