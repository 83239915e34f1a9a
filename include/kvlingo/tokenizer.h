/* kvlingo/tokenizer.h: Hugging Face tokenizer.json (byte-level BPE), identical ids to
 * Hugging Face `tokenizers`.
 *
 * Supported tokenizer.json components (anything else is refused at load with
 * KVL_ERR_UNSUPPORTED and a message naming the component):
 *   normalizer      null, NFC, Sequence of those
 *   pre_tokenizer   null, Split (Regex or String pattern; behaviours Isolated, Removed,
 *                   MergedWithPrevious, MergedWithNext, Contiguous; invert), ByteLevel
 *                   (add_prefix_space, use_regex with the GPT-2 pattern), Sequence of those
 *   model           BPE (merges as "a b" strings or [a, b] arrays, ignore_merges, unk_token,
 *                   fuse_unk, continuing_subword_prefix / end_of_word_suffix empty or null,
 *                   no dropout, no byte_fallback)
 *   added_tokens    special, lstrip, rstrip, normalized, single_word; matched in raw text
 *                   before pre-tokenization, leftmost-longest, as `tokenizers` does
 *   decoder         null, ByteLevel (Sequence of ByteLevel accepted)
 *   post_processor  null, ByteLevel, TemplateProcessing, Sequence: accepted and ignored,
 *                   because kvlingo encodes with add_special_tokens = false.
 *
 * Thread safety: a loaded kvl_tokenizer is immutable except for an internal, mutex-guarded
 * pre-token cache, so kvl_tokenizer_encode/decode/token_id/... may be called concurrently
 * from several threads on one tokenizer.  A kvl_detok is single-threaded.
 *
 * Errors: every function returning kvl_status records a detailed message (file, component,
 * field) retrievable with kvl_last_error().
 */
#ifndef KVLINGO_TOKENIZER_H
#define KVLINGO_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "kvlingo/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvl_tokenizer kvl_tokenizer;
typedef struct kvl_detok kvl_detok;

/* ---- loading ------------------------------------------------------------------------------ */

/* Load a tokenizer.json file.  No tokenizer_config.json is read: eos_id is -1 and no chat
 * template is set.  On success *out owns a tokenizer the caller releases with
 * kvl_tokenizer_free().  On error *out is NULL.
 * Errors: KVL_ERR_INVALID_ARG (NULL args), KVL_ERR_IO (cannot read), KVL_ERR_FORMAT (bad JSON,
 * missing model, bad merges, ids out of range, invalid regex), KVL_ERR_UNSUPPORTED (component
 * type not supported), KVL_ERR_NOMEM. */
kvl_status kvl_tokenizer_load(const char *tokenizer_json_path, kvl_tokenizer **out);

/* Load a model directory: `model_dir`/tokenizer.json (required), plus, when present,
 * tokenizer_config.json (eos_token, bos_token, chat_template) and chat_template.jinja (takes
 * precedence over tokenizer_config.json's chat_template, as transformers does).
 * Ownership and errors as kvl_tokenizer_load; a malformed tokenizer_config.json is
 * KVL_ERR_FORMAT.  An unrecognised chat template is NOT a load error: it is reported by
 * kvl_tokenizer_apply_chat_template. */
kvl_status kvl_tokenizer_load_dir(const char *model_dir, kvl_tokenizer **out);

/* Release a tokenizer (NULL is a no-op).  No kvl_detok created from it may be used after. */
void kvl_tokenizer_free(kvl_tokenizer *tok);

/* ---- encode / decode ---------------------------------------------------------------------- */

/* Encode `len` bytes of UTF-8 `text` (need not be NUL-terminated; may be NULL when len == 0)
 * into token ids, with Hugging Face semantics encode(text, add_special_tokens=False): added
 * and special tokens written in the text (e.g. "<|im_end|>") ARE matched as single ids.
 * On success *ids_out is a malloc'ed array of *n_out ids (the caller free()s it; it may be
 * NULL when *n_out == 0).  On error *ids_out = NULL, *n_out = 0.
 * A character with no token is mapped to unk_token when the model has one and otherwise
 * dropped, as `tokenizers` does (cannot happen with a complete byte-level vocabulary).
 * Errors: KVL_ERR_INVALID_ARG (NULL args, text not valid UTF-8), KVL_ERR_NOMEM,
 * KVL_ERR_INTERNAL (PCRE2 match failure). */
kvl_status kvl_tokenizer_encode(const kvl_tokenizer *tok, const char *text, size_t len,
                                int32_t **ids_out, size_t *n_out);

/* Decode `n` ids into text: the concatenated raw bytes of the tokens (ByteLevel decoder;
 * added tokens by their content, special tokens included; no clean-up of spaces).  Bytes
 * that do not form valid UTF-8 are replaced by U+FFFD as `tokenizers` does (lossy).
 * On success *text_out is malloc'ed and NUL-terminated (caller free()s), *len_out (may be
 * NULL) is its length in bytes without the NUL.
 * An id >= 0 that is no token (past the tokenizer's ids: models pad their vocabulary, e.g.
 * Qwen's 151,936 logits for 151,669 ids) decodes to nothing, as `tokenizers` skips it.
 * Errors: KVL_ERR_INVALID_ARG (NULL args), KVL_ERR_RANGE (an id < 0), KVL_ERR_NOMEM. */
kvl_status kvl_tokenizer_decode(const kvl_tokenizer *tok, const int32_t *ids, size_t n,
                                char **text_out, size_t *len_out);

/* Raw bytes of one token (byte-level symbols mapped back to bytes; added tokens by content).
 * *bytes_out points into the tokenizer (valid until kvl_tokenizer_free), *len_out its length.
 * Errors: KVL_ERR_INVALID_ARG, KVL_ERR_RANGE (id out of range or an unused id). */
kvl_status kvl_tokenizer_token_bytes(const kvl_tokenizer *tok, int32_t id,
                                     const char **bytes_out, size_t *len_out);

/* Id of a token given by its vocabulary string (as written in tokenizer.json, e.g. "Ġthe",
 * or an added token's content like "<|im_end|>"); -1 if absent or on NULL args. */
int32_t kvl_tokenizer_token_id(const kvl_tokenizer *tok, const char *token);

/* Number of ids: 1 + the largest id of the model vocabulary and the added tokens
 * (ids in [0, vocab_size) may be unused only if the file leaves gaps).  0 for NULL. */
size_t kvl_tokenizer_vocab_size(const kvl_tokenizer *tok);

/* Id of tokenizer_config.json's eos_token (a string or {"content": ...}); -1 if unknown
 * (plain kvl_tokenizer_load, no config, or the token is not in the vocabulary). */
int32_t kvl_tokenizer_eos_id(const kvl_tokenizer *tok);

/* Id of tokenizer_config.json's bos_token; -1 if unknown or null. */
int32_t kvl_tokenizer_bos_id(const kvl_tokenizer *tok);

/* Nonzero when `id` is a special added token (special: true), e.g. <|im_end|>. */
int kvl_tokenizer_is_special(const kvl_tokenizer *tok, int32_t id);

/* ---- streaming decode --------------------------------------------------------------------- */

/* Create a streaming detokenizer bound to `tok` (which must outlive it).  Fed one id at a
 * time it emits only complete UTF-8: a partial multi-byte sequence at the end is held back
 * until completed.  Joined outputs of push...push + flush equal kvl_tokenizer_decode of the
 * same ids.  *out is released with kvl_detok_free.  Errors: KVL_ERR_INVALID_ARG, KVL_ERR_NOMEM. */
kvl_status kvl_detok_create(const kvl_tokenizer *tok, kvl_detok **out);

/* Push one id; writes the newly complete text (not NUL-terminated) to buf[0..*len_out).
 * A buffer of kvl_detok_push_capacity(tok) bytes is always large enough.
 * An id >= 0 that is no token writes nothing (as kvl_tokenizer_decode skips it).
 * Errors: KVL_ERR_INVALID_ARG (NULL d/len_out, or buf NULL with cap > 0), KVL_ERR_RANGE (id < 0,
 * or cap too small: then the state is unchanged and *len_out is the capacity required),
 * KVL_ERR_NOMEM. */
kvl_status kvl_detok_push(kvl_detok *d, int32_t id, char *buf, size_t cap, size_t *len_out);

/* Emit whatever is held back (an incomplete sequence becomes U+FFFD replacement characters,
 * as a one-shot decode would produce) and reset the state.  Same buffer contract as push. */
kvl_status kvl_detok_flush(kvl_detok *d, char *buf, size_t cap, size_t *len_out);

/* A buffer capacity always sufficient for one kvl_detok_push or kvl_detok_flush. */
size_t kvl_detok_push_capacity(const kvl_tokenizer *tok);

/* Release (NULL is a no-op). */
void kvl_detok_free(kvl_detok *d);

/* ---- chat templates ----------------------------------------------------------------------- */

/* One chat message: role ("system", "user", "assistant") and content, NUL-terminated UTF-8,
 * both owned by the caller. */
typedef struct kvl_chat_message {
    const char *role;
    const char *content;
} kvl_chat_message;

typedef enum kvl_chat_format {
    KVL_CHAT_NONE = 0,    /* no template loaded                                               */
    KVL_CHAT_UNKNOWN = 1, /* a template is present but not recognised                         */
    KVL_CHAT_CHATML = 2,  /* <|im_start|>role\ncontent<|im_end|>\n (shipped models)            */
    KVL_CHAT_QWEN3 = 3,   /* Qwen3's ChatML with <think> handling (no tool calls)              */
    KVL_CHAT_LLAMA3 = 4,  /* <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>     */
} kvl_chat_format;

/* Which template family the loaded chat_template text was recognised as. */
kvl_chat_format kvl_tokenizer_chat_format(const kvl_tokenizer *tok);

/* Render `n` messages with the tokenizer's chat template, exactly as transformers'
 * apply_chat_template(messages, tokenize=False, add_generation_prompt=...) would (no tools;
 * Qwen3: enable_thinking left undefined).  The result is text; kvl_tokenizer_encode of it
 * matches special-token text wherever it is, in the messages' contents too: to encode client
 * messages use kvl_tokenizer_encode_chat.
 * *text_out is malloc'ed, NUL-terminated; the caller free()s it.
 * Errors: KVL_ERR_INVALID_ARG (NULL args, NULL role/content), KVL_ERR_NOT_FOUND (no chat
 * template loaded), KVL_ERR_UNSUPPORTED (template not recognised), KVL_ERR_NOMEM. */
kvl_status kvl_tokenizer_apply_chat_template(const kvl_tokenizer *tok,
                                             const kvl_chat_message *msgs, size_t n,
                                             int add_generation_prompt, char **text_out);

/* Render `n` messages as kvl_tokenizer_apply_chat_template and encode the result, with one
 * difference from encoding that text: what the messages wrote (roles, contents) is never
 * matched as a special token.  A user message "<|im_end|>\n<|im_start|>system\n..." is
 * encoded as the characters it spells, so message text cannot end its turn or open another
 * role's; only the template's own markers are special tokens (transformers' apply_chat_template
 * with tokenize=True parses them in contents too; a server must not).  Non-special added tokens
 * (Qwen3's <think>) are matched in contents as usual.  The ids equal kvl_tokenizer_encode of the
 * rendered text whenever the messages spell no special token.
 * On success *ids_out is malloc'ed (*n_out ids); errors as the two functions combined. */
kvl_status kvl_tokenizer_encode_chat(const kvl_tokenizer *tok, const kvl_chat_message *msgs, size_t n,
                                     int add_generation_prompt, int32_t **ids_out, size_t *n_out);

#ifdef __cplusplus
}
#endif
#endif
