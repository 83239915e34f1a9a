/* daemon/translators.h: the translators a node can import with: every *.safetensors file of
 * --translators DIR whose target is this node's model (name, and hash when the file has one).
 * Looked up by the source model named in a span header. */
#ifndef KVLD_TRANSLATORS_H
#define KVLD_TRANSLATORS_H

#include "kvlingo/model.h"
#include "kvlingo/translator.h"

typedef struct kvld_translator_entry {
    kvl_translator *tr;
    char path[512];
    const char *source_name, *source_hash, *target_name, *target_hash;   /* owned by tr */
    int src_layers, src_kv_heads, src_head_dim;
} kvld_translator_entry;

typedef struct kvld_translators {
    kvld_translator_entry *items;
    int n;
} kvld_translators;

/* Load the directory (missing or empty dir: zero translators, not an error; a file that does
 * not load or targets another model is skipped with a log line). */
kvl_status kvld_translators_load(const char *dir, const kvl_model *self, kvld_translators *out);
void kvld_translators_free(kvld_translators *t);

/* The translator for source `name` (and `hash` unless empty), or NULL. */
const kvld_translator_entry *kvld_translators_find(const kvld_translators *t, const char *name,
                                                   const char *hash);

#endif
