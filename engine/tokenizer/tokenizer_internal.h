/* engine/tokenizer/tokenizer_internal.h: internal structures of the tokenizer (see kvlingo/tokenizer.h).
 *
 * Pipeline of kvl_tokenizer_encode (mirrors Hugging Face tokenizers' encode):
 *   1. added tokens with normalized=false are matched in the raw text (leftmost-longest);
 *   2. each remaining segment is normalized (NFC) and searched for normalized=true added tokens;
 *   3. each remaining segment is pre-tokenized (Split regex / ByteLevel, in sequence);
 *   4. each pre-token is encoded by BPE.  With a ByteLevel pre-tokenizer, pre-tokens are kept as
 *      raw bytes and the vocabulary is indexed by the raw bytes of its tokens (the byte <-> char
 *      map of GPT-2 is a bijection), so the merge loop works on bytes without re-encoding.
 */
#ifndef KVL_TOKENIZER_INTERNAL_H
#define KVL_TOKENIZER_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "kvlingo/tokenizer.h"

/* Largest id accepted in a tokenizer.json (bounds the id -> token table). */
#define KVL_TOK_MAX_ID (1 << 24)

/* ---- byte-string -> int32 hash map (keys copied into an arena) ---------------------------- */
typedef struct kvl__strmap_entry {
    uint64_t hash;
    uint32_t off;   /* key offset in arena */
    uint32_t len;   /* key length */
    int32_t value;
    int32_t used;
} kvl__strmap_entry;

typedef struct kvl__strmap {
    kvl__strmap_entry *slots;
    size_t cap;     /* power of two */
    size_t count;
    char *arena;
    size_t arena_len, arena_cap;
} kvl__strmap;

kvl_status kvl__strmap_init(kvl__strmap *m, size_t expected);
void kvl__strmap_free(kvl__strmap *m);
/* Insert or overwrite.  *existed (may be NULL) is set when the key was present. */
kvl_status kvl__strmap_put(kvl__strmap *m, const char *key, size_t len, int32_t value, int *existed);
/* Value or -1. */
int32_t kvl__strmap_get(const kvl__strmap *m, const char *key, size_t len);
uint64_t kvl__tok_hash(const void *data, size_t len);

/* ---- merges: (left id, right id) -> (rank, new id) ------------------------------------------ */
typedef struct kvl__merge_slot {
    uint64_t key;   /* (left << 32 | right) + 1; 0 = empty */
    int32_t rank;
    int32_t new_id;
} kvl__merge_slot;

typedef struct kvl__mergemap {
    kvl__merge_slot *slots;
    size_t cap, count;
} kvl__mergemap;

/* ---- pre-token cache (sharded, mutex-guarded) ----------------------------------------------- */
#define KVL_TOKCACHE_SHARDS 16
#define KVL_TOKCACHE_MAX_KEY 64

typedef struct kvl__tokcache_entry {
    uint64_t hash;
    uint8_t klen, nids;   /* klen == 0: empty slot */
    char key[KVL_TOKCACHE_MAX_KEY];
    int32_t ids[8];
} kvl__tokcache_entry;

typedef struct kvl__tokcache_shard {
    pthread_mutex_t lock;
    kvl__tokcache_entry *slots;
    size_t cap, count;
} kvl__tokcache_shard;

/* ---- components ----------------------------------------------------------------------------- */
typedef enum { KVL_SPLIT_REMOVED, KVL_SPLIT_ISOLATED, KVL_SPLIT_MERGED_PREV, KVL_SPLIT_MERGED_NEXT,
               KVL_SPLIT_CONTIGUOUS } kvl__split_behavior;

typedef enum { KVL_PRETOK_SPLIT, KVL_PRETOK_BYTELEVEL } kvl__pretok_kind;

typedef struct kvl__pretok {
    kvl__pretok_kind kind;
    pcre2_code *re;            /* Split pattern, or ByteLevel's GPT-2 pattern when use_regex */
    kvl__split_behavior behavior;
    int invert;
    int add_prefix_space;      /* ByteLevel */
    int use_regex;             /* ByteLevel */
    int jit;                   /* re was JIT-compiled */
} kvl__pretok;

typedef struct kvl__added_token {
    char *content;
    size_t len;
    int32_t id;
    uint8_t special, lstrip, rstrip, normalized, single_word;
} kvl__added_token;

/* byte trie for leftmost-longest matching of added token contents */
typedef struct kvl__trie_node {
    int32_t first_child;  /* -1 when none */
    int32_t next_sibling; /* -1 when none */
    int32_t token;        /* index into added[] of the token ending here, -1 if none */
    uint8_t byte;
} kvl__trie_node;

typedef struct kvl__trie {
    kvl__trie_node *nodes;  /* nodes[0] is the root */
    size_t n_nodes, cap;
    uint8_t first[256];    /* bytes that can start a match */
    size_t n_tokens;       /* 0: nothing to match */
} kvl__trie;

struct kvl_tokenizer {
    char *path;                  /* tokenizer.json path, for messages */
    /* normalizer */
    int nfc;
    /* pre-tokenizers, applied in order */
    kvl__pretok *pretoks;
    size_t n_pretoks;
    int byte_level;              /* a ByteLevel pre-tokenizer is present: BPE works on raw bytes */
    /* BPE model */
    kvl__strmap vocab_str;        /* token string as in JSON -> id (model vocab only) */
    kvl__strmap vocab_bytes;      /* byte-level: raw bytes -> id; else same strings as vocab_str */
    int32_t byte_id[256];        /* byte-level: id of each single byte, -1 if absent */
    kvl__mergemap merges;
    int ignore_merges;
    int32_t unk_id;              /* -1 when none */
    int fuse_unk;
    /* added tokens */
    kvl__added_token *added;
    size_t n_added;
    kvl__strmap added_map;        /* content -> id */
    kvl__trie trie_raw, trie_norm;
    /* id -> token */
    size_t n_ids;                /* 1 + max id */
    char **id_str;               /* token string as in JSON (borrowed from vocab_str / added); NULL = unused */
    char **id_bytes;             /* decoded raw bytes (ByteLevel decoder rule), into id_bytes_arena */
    char *id_bytes_arena;
    uint32_t *id_bytes_len;
    uint8_t *id_special;
    size_t max_token_bytes;
    /* config */
    int32_t eos_id, bos_id;
    char *bos_token;             /* content, for templates; may be NULL */
    char *chat_template;
    kvl_chat_format chat_format;
    /* cache */
    kvl__tokcache_shard cache[KVL_TOKCACHE_SHARDS];
    int cache_ready;
};

/* ---- functions shared between the tokenizer files ------------------------------------------- */

/* GPT-2 byte <-> unicode map. */
extern const uint16_t kvl__bytelevel_char[256];
/* Codepoint -> byte, -1 when the codepoint is not one of the 256 byte chars. */
int kvl__bytelevel_byte(uint32_t cp);
/* Decode one UTF-8 code point at s[0..len); returns its length (>0) or 0 when invalid. */
size_t kvl__utf8_decode(const uint8_t *s, size_t len, uint32_t *cp);
/* Whole string valid UTF-8 (no surrogates, <= U+10FFFF, shortest form). */
int kvl__utf8_valid(const char *s, size_t len);

/* mergemap */
kvl_status kvl__mergemap_init(kvl__mergemap *m, size_t expected);
void kvl__mergemap_free(kvl__mergemap *m);
kvl_status kvl__mergemap_put(kvl__mergemap *m, int32_t a, int32_t b, int32_t rank, int32_t new_id);
const kvl__merge_slot *kvl__mergemap_get(const kvl__mergemap *m, int32_t a, int32_t b);

/* cache */
kvl_status kvl__tokcache_init(kvl_tokenizer *t);
void kvl__tokcache_free(kvl_tokenizer *t);

/* growable id vector */
typedef struct kvl__idvec {
    int32_t *v;
    size_t n, cap;
} kvl__idvec;
kvl_status kvl__idvec_push(kvl__idvec *v, int32_t id);

/* growable byte buffer */
typedef struct kvl__buf {
    char *p;
    size_t n, cap;
} kvl__buf;
kvl_status kvl__buf_append(kvl__buf *b, const void *data, size_t len);

/* Pre-tokenizer compilation (pattern translated for PCRE2; errors name `where`). */
kvl_status kvl__pretok_compile_regex(const char *pattern, int literal, const char *where,
                                    pcre2_code **out);

/* Pre-tokenize + BPE one normalized segment that holds no added token, appending ids.
 * `md` is match data for the pre-tokenizer regexes (one per calling thread). */
kvl_status kvl__tok_pretok_encode(const kvl_tokenizer *t, const char *s, size_t len, kvl__idvec *out,
                                 pcre2_match_data *md);

/* BPE of one pre-token (raw bytes when byte-level), appending ids. */
kvl_status kvl__bpe_encode_word(const kvl_tokenizer *t, const char *w, size_t len, kvl__idvec *out);

/* NFC of s[0..len) into a malloc'ed buffer (*out, *out_len).  *out = NULL (nothing allocated)
 * when the text is already NFC by a quick check. */
kvl_status kvl__tok_nfc(const char *s, size_t len, char **out, size_t *out_len);

/* Added tokens: build the tries after t->added is filled; find the leftmost-longest match. */
kvl_status kvl__added_build(kvl_tokenizer *t);
void kvl__added_free(kvl_tokenizer *t);
/* Split s[0..len) on the added tokens of `trie` (HF find_matches), calling back for each piece:
 * id >= 0 for an added token, -1 for plain text.  `guard` (NULL: none) marks, byte by byte
 * beside s, the bytes no special token may be matched over. */
typedef kvl_status (*kvl__added_cb)(void *ctx, const char *s, size_t len, int32_t id);
kvl_status kvl__added_split(const kvl_tokenizer *t, const kvl__trie *trie, const char *s, size_t len,
                           const uint8_t *guard, kvl__added_cb cb, void *ctx);

/* kvl_tokenizer_encode, with no special token matched over a byte guard[i] != 0 marks (guard
 * NULL: as kvl_tokenizer_encode). */
kvl_status kvl__tokenizer_encode_guarded(const kvl_tokenizer *tok, const char *text, size_t len,
                                        const uint8_t *guard, int32_t **ids_out, size_t *n_out);

/* Load from memory (fuzzing, tests); `name` is used in messages in place of a path. */
kvl_status kvl__tokenizer_load_json(const char *json, size_t len, const char *name, kvl_tokenizer **out);

/* GPT-2 pre-tokenizer pattern used by ByteLevel with use_regex. */
const char *kvl__gpt2_pattern(void);

/* Chat template recognition (chat.c). */
kvl_chat_format kvl__chat_detect(const char *tmpl);

#endif
