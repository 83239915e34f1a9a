/* daemon/translators.c: loading --translators DIR. */
#include "translators.h"
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "log.h"

static int meta_int(const kvl_translator *tr, const char *key) {
    const char *v = kvl_translator_metadata(tr, key);
    return v ? atoi(v) : -1;
}

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

kvl_status kvld_translators_load(const char *dir, const kvl_model *self, kvld_translators *out) {
    memset(out, 0, sizeof *out);
    if (!dir || !dir[0]) return KVL_OK;
    DIR *d = opendir(dir);
    if (!d) {
        const int err = errno;   /* before getcwd */
        char note[PATH_MAX + 96];
        kvl__svc_log("warn", "msg=translators_dir_unreadable dir=\"%s\" err=\"%s%s\": no translator loads, every "
                     "switch to this node re-prefills", dir, strerror(err), kvld_config_cwd_note(dir, note, sizeof note));
        return KVL_OK;
    }
    char **names = NULL;
    int n_names = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 12 || strcmp(e->d_name + len - 12, ".safetensors")) continue;
        char **nn = realloc(names, sizeof *nn * (size_t)(n_names + 1));
        if (!nn) break;
        names = nn;
        if (!(names[n_names] = strdup(e->d_name))) break;
        n_names++;
    }
    closedir(d);
    qsort(names, (size_t)n_names, sizeof *names, cmp_names);   /* deterministic order */
    kvl_status st = KVL_OK;
    for (int i = 0; i < n_names && st == KVL_OK; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        kvl_translator *tr;
        if (kvl_translator_load(path, &tr) != KVL_OK) {
            kvl__svc_log("warn", "msg=translator_skipped path=\"%s\" err=\"%s\"", path, kvl_last_error());
            continue;
        }
        const char *tn = kvl_translator_target_name(tr), *th = kvl_translator_target_hash(tr);
        const int same_name = tn && strcmp(tn, kvl_model_name(self)) == 0;
        const int same_hash = th && th[0] && strcmp(th, kvl_model_hash(self)) == 0;
        int mine = same_name && (!th || !th[0] || same_hash);
        const char *sn = kvl_translator_source_name(tr);
        if (!mine || !sn) {
            /* another pair's file is normal in a shared folder; a near miss is the operator's
             * mistake, and every switch here would re-prefill: said as a warning */
            if (mine)   /* this model's, but it does not say which model it translates from */
                kvl__svc_log("warn", "msg=translator_skipped path=\"%s\" err=\"no source_name in its metadata: "
                             "which model it translates from is unknown\"", path);
            else if (same_hash && !same_name && tn)
                kvl__svc_log("warn", "msg=translator_other_name path=\"%s\" target=%s hash=%s: the same weights "
                             "as this model, which is named '%s' after its directory (--model): name the "
                             "directory %s, as the fleet and the translators do", path, tn, th,
                             kvl_model_name(self), tn);
            else if (same_name && th && th[0])
                kvl__svc_log("warn", "msg=translator_other_weights path=\"%s\" target=%s hash=%s: this node's "
                             "%s has hash %s (other weights: the translator was trained for another "
                             "checkpoint of that name)", path, tn, th ? th : "?", tn, kvl_model_hash(self));
            else
                kvl__svc_log("info", "msg=translator_other_target path=\"%s\" target=%s", path, tn ? tn : "?");
            kvl_translator_free(tr);
            continue;
        }
        kvld_translator_entry *it = realloc(out->items, sizeof *it * (size_t)(out->n + 1));
        if (!it) {
            kvl_translator_free(tr);
            st = kvl__errorf(KVL_ERR_NOMEM, "translator table");
            break;
        }
        out->items = it;
        kvld_translator_entry *x = &it[out->n++];
        memset(x, 0, sizeof *x);
        x->tr = tr;
        snprintf(x->path, sizeof x->path, "%s", path);
        x->source_name = sn;
        x->source_hash = kvl_translator_source_hash(tr);
        x->target_name = tn;
        x->target_hash = th;
        x->src_layers = meta_int(tr, "source_layers");
        x->src_kv_heads = meta_int(tr, "source_kv_heads");
        x->src_head_dim = meta_int(tr, "source_head_dim");
        kvl__svc_log("info", "msg=translator_loaded path=\"%s\" source=%s target=%s products=%s", path, sn, tn,
                     kvl_translator_bf16_products(tr, self) ? "bf16" : "f32");
    }
    if (st == KVL_OK && out->n == 0)
        kvl__svc_log("warn", "msg=no_translators dir=\"%s\" files=%d model=%s hash=%s: none of them translates into "
                     "this model, so every switch to this node re-prefills", dir, n_names, kvl_model_name(self),
                     kvl_model_hash(self));
    for (int i = 0; i < n_names; i++) free(names[i]);
    free(names);
    return st;
}

void kvld_translators_free(kvld_translators *t) {
    for (int i = 0; i < t->n; i++) kvl_translator_free(t->items[i].tr);
    free(t->items);
    memset(t, 0, sizeof *t);
}

const kvld_translator_entry *kvld_translators_find(const kvld_translators *t, const char *name,
                                                   const char *hash) {
    for (int i = 0; i < t->n; i++) {
        const kvld_translator_entry *e = &t->items[i];
        if (strcmp(e->source_name, name)) continue;
        if (hash && hash[0] && e->source_hash && e->source_hash[0] && strcmp(hash, e->source_hash))
            continue;
        return e;
    }
    return NULL;
}
