/* engine/formats/st_set.c: a model's weights as one safetensors file or a sharded set
 * (model.safetensors.index.json + shards), with lookups across all shards. */
#include "kvlingo/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "error.h"

typedef struct st_entry {
    const char *name;
    size_t file;
    const kvl_st_tensor *t;
} st_entry;

struct kvl_st_set {
    size_t n_files;
    kvl_safetensors **files; /* shard order (index: sorted shard names)              */
    size_t *first;           /* first[i]: global index of file i's first tensor; n+1  */
    size_t n_total;
    st_entry *by_name;       /* sorted by name                                       */
};

static char *path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p)
        return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const st_entry *)a)->name, ((const st_entry *)b)->name);
}

static int cmp_key_entry(const void *key, const void *elem) {
    return strcmp((const char *)key, ((const st_entry *)elem)->name);
}

void kvl_st_set_free(kvl_st_set *set) {
    if (!set)
        return;
    for (size_t i = 0; i < set->n_files; i++)
        kvl_safetensors_close(set->files[i]);
    free(set->files);
    free(set->first);
    free(set->by_name);
    free(set);
}

/* Fill the cross-shard tables once set->files[0..n_files) are open; `label` names the set
 * (its index file) in the duplicate-tensor error. */
static kvl_status index_tensors(kvl_st_set *set, const char *label) {
    set->first = calloc(set->n_files + 1, sizeof *set->first);
    if (!set->first)
        return kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory", label);
    size_t total = 0;
    for (size_t i = 0; i < set->n_files; i++) {
        set->first[i] = total;
        total += kvl_safetensors_count(set->files[i]);
    }
    set->first[set->n_files] = total;
    set->n_total = total;
    set->by_name = calloc(total ? total : 1, sizeof *set->by_name);
    if (!set->by_name)
        return kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory for %zu tensors", label, total);
    size_t k = 0;
    for (size_t i = 0; i < set->n_files; i++) {
        for (size_t j = 0; j < kvl_safetensors_count(set->files[i]); j++, k++) {
            set->by_name[k].t = kvl_safetensors_get(set->files[i], j);
            set->by_name[k].name = set->by_name[k].t->name;
            set->by_name[k].file = i;
        }
    }
    qsort(set->by_name, total, sizeof *set->by_name, cmp_entry);
    for (k = 1; k < total; k++) {
        const st_entry *a = &set->by_name[k - 1], *b = &set->by_name[k];
        if (strcmp(a->name, b->name) == 0)
            return kvl__errorf(KVL_ERR_FORMAT, "%s: tensor '%s' is in two shards: %s and %s", label,
                              a->name, kvl_safetensors_path(set->files[a->file]),
                              kvl_safetensors_path(set->files[b->file]));
    }
    return KVL_OK;
}

static char *read_small_file(const char *path, size_t *len_out, kvl_status *s) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        *s = kvl__errorf(KVL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (len + 1 >= cap) {
            char *nb = cap < SIZE_MAX / 2 ? realloc(buf, cap * 2) : NULL;
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + len, 1, cap - len - 1, f);
        len += r;
        if (r == 0)
            break;
    }
    bool err = ferror(f);
    fclose(f);
    if (!buf) {
        *s = kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory reading the file", path);
        return NULL;
    }
    if (err) {
        free(buf);
        *s = kvl__errorf(KVL_ERR_IO, "%s: read error", path);
        return NULL;
    }
    buf[len] = '\0';
    *len_out = len;
    return buf;
}

/* Shard names come from a file we do not control: keep them inside the model folder. */
static bool shard_name_ok(const char *s) {
    if (!*s || s[0] == '/')
        return false;
    for (const char *p = s; *p;) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        if (n == 2 && p[0] == '.' && p[1] == '.')
            return false;
        p += n + (slash ? 1 : 0);
    }
    return true;
}

static kvl_status open_sharded(const char *dir, const char *index_path, kvl_st_set *set) {
    size_t len;
    kvl_status s = KVL_OK;
    char *text = read_small_file(index_path, &len, &s);
    if (!text)
        return s;
    cJSON *root = cJSON_ParseWithLength(text, len);
    const char **shards = NULL;
    char *shard_path = NULL;
    if (!root) {
        s = kvl__errorf(KVL_ERR_FORMAT, "%s: invalid JSON", index_path);
        goto done;
    }
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm) || !wm->child) {
        s = kvl__errorf(KVL_ERR_FORMAT, "%s: field 'weight_map': expected a non-empty object",
                       index_path);
        goto done;
    }
    size_t n = (size_t)cJSON_GetArraySize(wm);
    shards = malloc(n * sizeof *shards);
    if (!shards) {
        s = kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory", index_path);
        goto done;
    }
    size_t k = 0;
    for (const cJSON *e = wm->child; e; e = e->next, k++) {
        if (!cJSON_IsString(e) || !shard_name_ok(e->valuestring)) {
            s = kvl__errorf(KVL_ERR_FORMAT,
                           "%s: field 'weight_map': tensor '%s': expected a relative shard "
                           "file name inside the model folder",
                           index_path, e->string);
            goto done;
        }
        shards[k] = e->valuestring;
    }
    qsort(shards, n, sizeof *shards, cmp_str);
    size_t n_unique = 0;
    for (k = 0; k < n; k++)
        if (k == 0 || strcmp(shards[k], shards[n_unique - 1]) != 0)
            shards[n_unique++] = shards[k];

    set->files = calloc(n_unique, sizeof *set->files);
    if (!set->files) {
        s = kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory", index_path);
        goto done;
    }
    for (k = 0; k < n_unique; k++) {
        shard_path = path_join(dir, shards[k]);
        if (!shard_path) {
            s = kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory", index_path);
            goto done;
        }
        struct stat sb;
        if (stat(shard_path, &sb) != 0 && errno == ENOENT) {
            const char *who = "?";
            for (const cJSON *e = wm->child; e; e = e->next)
                if (strcmp(e->valuestring, shards[k]) == 0) {
                    who = e->string;
                    break;
                }
            s = kvl__errorf(KVL_ERR_NOT_FOUND,
                           "%s: shard '%s' (holding tensor '%s'): file %s not found", index_path,
                           shards[k], who, shard_path);
            goto done;
        }
        s = kvl_safetensors_open(shard_path, &set->files[k]);
        if (s != KVL_OK)
            goto done;
        set->n_files++;
        free(shard_path);
        shard_path = NULL;
    }
    s = index_tensors(set, index_path);
    if (s != KVL_OK)
        goto done;
    /* Every tensor the index promises must be in the shard it names. */
    for (const cJSON *e = wm->child; e; e = e->next) {
        const char *file = NULL;
        const kvl_st_tensor *t = kvl_st_set_find(set, e->string, &file);
        size_t dlen = strlen(dir);
        if (!t || strncmp(file, dir, dlen) != 0 || strcmp(file + dlen + 1, e->valuestring) != 0) {
            s = kvl__errorf(KVL_ERR_FORMAT,
                           "%s: field 'weight_map': tensor '%s' is not in its shard '%s'%s%s",
                           index_path, e->string, e->valuestring, t ? " but in " : "",
                           t ? file : "");
            goto done;
        }
    }
done:
    free(shard_path);
    free(shards);
    cJSON_Delete(root);
    free(text);
    return s;
}

kvl_status kvl_st_set_open_dir(const char *dir, kvl_st_set **out) {
    if (!dir || !out)
        return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_st_set_open_dir: NULL argument");
    *out = NULL;
    kvl_st_set *set = calloc(1, sizeof *set);
    char *single = path_join(dir, "model.safetensors");
    char *index = path_join(dir, "model.safetensors.index.json");
    kvl_status s;
    if (!set || !single || !index) {
        s = kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    struct stat sb;
    if (stat(single, &sb) == 0) {
        /* a complete single file wins over an index, as in transformers */
        set->files = calloc(1, sizeof *set->files);
        if (!set->files) {
            s = kvl__errorf(KVL_ERR_NOMEM, "%s: out of memory", dir);
            goto done;
        }
        s = kvl_safetensors_open(single, &set->files[0]);
        if (s == KVL_OK) {
            set->n_files = 1;
            s = index_tensors(set, single);
        }
    } else if (stat(index, &sb) == 0) {
        s = open_sharded(dir, index, set);
    } else {
        s = kvl__errorf(KVL_ERR_NOT_FOUND,
                       "%s: neither model.safetensors nor model.safetensors.index.json found", dir);
    }
done:
    free(single);
    free(index);
    if (s == KVL_OK)
        *out = set;
    else
        kvl_st_set_free(set);
    return s;
}

const kvl_st_tensor *kvl_st_set_find(const kvl_st_set *set, const char *name,
                                     const char **file_out) {
    if (!set || !name || set->n_total == 0)
        return NULL;
    const st_entry *e =
        bsearch(name, set->by_name, set->n_total, sizeof *set->by_name, cmp_key_entry);
    if (!e)
        return NULL;
    if (file_out)
        *file_out = kvl_safetensors_path(set->files[e->file]);
    return e->t;
}

size_t kvl_st_set_num_files(const kvl_st_set *set) { return set ? set->n_files : 0; }

size_t kvl_st_set_num_tensors(const kvl_st_set *set) { return set ? set->n_total : 0; }

const kvl_st_tensor *kvl_st_set_get(const kvl_st_set *set, size_t i, const char **file_out) {
    if (!set || i >= set->n_total)
        return NULL;
    size_t f = 0;
    while (i >= set->first[f + 1])
        f++;
    if (file_out)
        *file_out = kvl_safetensors_path(set->files[f]);
    return kvl_safetensors_get(set->files[f], i - set->first[f]);
}
