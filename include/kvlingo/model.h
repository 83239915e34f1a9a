/* kvlingo/model.h: model configuration, weights, and the forward pass (prefill and decode).
 *
 * Supported architectures (Hugging Face `config.json` "architectures"[0]):
 *   Qwen2ForCausalLM  (q/k/v bias always, no q/k norm)
 *   Qwen3ForCausalLM  (per-head RMSNorm q_norm/k_norm on head_dim before RoPE, optional bias)
 *   LlamaForCausalLM  (attention_bias optional, no q/k norm)
 * Forward pass as in transformers' modeling_qwen2/qwen3/llama.py: embeddings, per layer
 * RMSNorm -> q/k/v projections (+bias) -> q/k norm (Qwen3) -> RoPE (rotate_half: the two halves of
 * head_dim are the pair, inv_freq from kvl_rope_inv_freq: theta^(-2i/head_dim) in float32 for the
 * default type, or a scaling type of kvlingo/rope.h) -> causal GQA attention
 * (query head h reads kv head h / (n_heads / n_kv_heads), scale 1/sqrt(head_dim)) -> o_proj ->
 * residual -> RMSNorm -> SwiGLU MLP (down(silu(gate(x)) * up(x))) -> residual; final RMSNorm; LM head.
 * Activations and accumulation are float32 whatever the weight dtype on disk (F32/BF16/F16 are
 * widened at load into the host view); the CPU backend streams the matrices in float32 or in
 * bf16 (kvl_weights_dtype below).
 */
#ifndef KVLINGO_MODEL_H
#define KVLINGO_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kvlingo/rope.h"
#include "kvlingo/safetensors.h"
#include "kvlingo/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kvl_arch {
    KVL_ARCH_QWEN2 = 0,
    KVL_ARCH_QWEN3 = 1,
    KVL_ARCH_LLAMA = 2,
} kvl_arch;

#define KVL_MAX_EOS_IDS 8

/* Geometry and hyper-parameters read from config.json. */
typedef struct kvl_model_config {
    kvl_arch arch;
    char architecture[64];      /* "Qwen3ForCausalLM", ...                                 */
    int vocab_size;
    int hidden_size;            /* H                                                       */
    int n_layers;               /* L                                                       */
    int n_heads;                /* Hq, query heads                                         */
    int n_kv_heads;             /* Hkv, key/value heads (GQA groups)                       */
    int head_dim;               /* D: explicit "head_dim" or hidden_size / n_heads          */
    int intermediate_size;      /* F, MLP width                                            */
    float rms_norm_eps;
    double rope_theta;          /* "rope_theta" (top level) or "rope_parameters.rope_theta" */
    kvl_rope_params rope;       /* RoPE type and parameters (kvlingo/rope.h); rope.theta ==
                                 * rope_theta, rope.dim == head_dim                         */
    int qkv_bias;               /* 1 when q/k/v projections have a bias                    */
    int o_bias;                 /* 1 when o_proj has a bias (Llama attention_bias)         */
    int qk_norm;                /* 1 for Qwen3 (q_norm, k_norm)                             */
    int tie_word_embeddings;    /* 1: LM head is the embedding matrix                      */
    int max_position_embeddings;
    int bos_token_id;           /* -1 when absent                                          */
    int n_eos;                  /* number of EOS ids (config may give a list)              */
    int eos_token_ids[KVL_MAX_EOS_IDS];
    kvl_dtype weight_dtype;     /* "dtype"/"torch_dtype": the dtype of the weights on disk */
} kvl_model_config;

/* Parse config.json text.  `label` (e.g. the file path) prefixes every error message, which
 * names the field at fault.  RoPE scaling (`rope_scaling` with `type` or `rope_type`, or
 * `rope_parameters`): default, linear, dynamic, yarn, llama3 with the fields transformers reads
 * (kvlingo/rope.h).  Refuses (KVL_ERR_UNSUPPORTED) an unknown architecture, any other RoPE type
 * (by name), partial rotary embeddings, head_dim > 1024, and sliding-window attention switched on
 * (`use_sliding_window: true`); KVL_ERR_FORMAT for invalid JSON or a missing/ill-typed field
 * (e.g. `rope_scaling.factor` missing for a type that needs it). */
kvl_status kvl_config_parse(const char *json, size_t len, const char *label,
                            kvl_model_config *out);

/* Read and parse `path` (a config.json). */
kvl_status kvl_config_load(const char *path, kvl_model_config *out);

/* K/V bytes one token occupies in the cache (all layers, float32 K and V; plus the pre-norm
 * key buffer for q/k-norm models). */
size_t kvl_config_kv_bytes_per_token(const kvl_model_config *cfg);

/* Total parameter count (embedding counted once when tied). */
int64_t kvl_config_param_count(const kvl_model_config *cfg);

typedef struct kvl_model kvl_model;

/* Backend chosen at model load (`--device cpu|cuda`). */
typedef enum kvl_device { KVL_DEVICE_CPU = 0, KVL_DEVICE_CUDA = 1 } kvl_device;

/* Dtype the CPU backend streams the big matrices in (q/k/v/o, gate/up/down, embedding and LM
 * head; norms and biases stay float32), `--weights-dtype f32|bf16`:
 *   KVL_WEIGHTS_AUTO  the checkpoint's dtype: bf16 when every matrix is stored in bfloat16 on
 *                     disk, float32 otherwise (float32 and float16 checkpoints, random models)
 *   KVL_WEIGHTS_F32   float32 (OpenBLAS sgemm/sgemv), bit-for-bit the pre-existing path
 *   KVL_WEIGHTS_BF16  bfloat16 copies (float32 weights rounded to nearest even at load) with
 *                     float32 accumulation: half the bytes per decode step.  Decode and small
 *                     batches (<= 16 tokens) carry activations as a pair of bf16 (hi + lo, 16
 *                     significant bits); larger batches widen weight panels to float32 for sgemm.
 * The host view (kvl_model_weights) stays float32 in every mode: translator training reads it.
 * Backends without a bf16 path (CUDA keeps its own bf16 copy) ignore the setting. */
typedef enum kvl_weights_dtype {
    KVL_WEIGHTS_AUTO = 0,
    KVL_WEIGHTS_F32 = 1,
    KVL_WEIGHTS_BF16 = 2,
} kvl_weights_dtype;

/* Parse "auto", "f32" or "bf16"; KVL_ERR_INVALID_ARG with a message quoting the text otherwise. */
kvl_status kvl_weights_dtype_parse(const char *text, kvl_weights_dtype *out);
/* "auto", "f32" or "bf16" (static string). */
const char *kvl_weights_dtype_name(kvl_weights_dtype dtype);

/* What the CPU backend's KV cache stores (kvl_model_params.kv_dtype):
 *   KVL_KV_F32   float32 (the default; the golden parity tests run on it)
 *   KVL_KV_BF16  bfloat16, K/V/Kpre rounded to nearest even as they are written and widened to
 *                float32 as attention reads them: half the bytes a decode step reads per token
 *                of context and half the cache memory; attention itself accumulates in float32.
 * Spans exported from a bf16 cache carry the widened float32 values.  The CUDA backend's cache
 * holds its weight dtype (bf16 by default, kvlingo/cuda.h), not this setting, and it refuses
 * KVL_KV_BF16 (KVL_ERR_UNSUPPORTED). */
typedef enum kvl_kv_dtype {
    KVL_KV_F32 = 0,
    KVL_KV_BF16 = 1,
} kvl_kv_dtype;

/* Parse "f32" or "bf16"; KVL_ERR_INVALID_ARG with a message quoting the text otherwise. */
kvl_status kvl_kv_dtype_parse(const char *text, kvl_kv_dtype *out);
/* "f32" or "bf16" (static string). */
const char *kvl_kv_dtype_name(kvl_kv_dtype dtype);

typedef struct kvl_model_params {
    int n_threads;              /* threads for BLAS and attention; 0 = all cores           */
    kvl_device device;          /* KVL_DEVICE_CPU (default) or KVL_DEVICE_CUDA: the backend
                                 * (kvlingo/backend.h) every forward pass, cache and
                                 * translation of this model runs on.  kvl_model_load checks
                                 * it first (KVL_ERR_UNSUPPORTED in a build without CUDA,
                                 * KVL_ERR_DEVICE without a usable GPU), then uploads the
                                 * weights (bf16 on a GPU).  Caches for it come from
                                 * kvl_model_cache_create.                                 */
    int device_index;           /* GPU ordinal with KVL_DEVICE_CUDA (`cuda:N`), default 0   */
    kvl_weights_dtype weights_dtype; /* CPU weight streaming dtype, default AUTO (above);
                                 * kvl_model_load and kvl_model_create_random resolve AUTO, so
                                 * a backend sees F32 or BF16 only                         */
    kvl_kv_dtype kv_dtype;      /* KV cache element type of caches made for this model by
                                 * kvl_model_cache_create, default KVL_KV_F32 (above)       */
} kvl_model_params;

/* The KV cache element type of the caches kvl_model_cache_create makes for this model. */
kvl_kv_dtype kvl_model_kv_dtype(const kvl_model *model);

/* The weights dtype a loaded model computes with on the CPU (F32 or BF16, AUTO resolved). */
kvl_weights_dtype kvl_model_weights_dtype(const kvl_model *model);

kvl_model_params kvl_model_default_params(void);

/* Load a Hugging Face model directory (config.json + model.safetensors or sharded index).
 * Weights are validated against the config's geometry (a missing tensor or a wrong shape is an
 * error naming the tensor, expected and found shapes) and widened to float32.  A redundant
 * lm_head.weight with tied embeddings is ignored.  Free with kvl_model_free. */
kvl_status kvl_model_load(const char *dir, const kvl_model_params *params, kvl_model **out);
void kvl_model_free(kvl_model *model);

const kvl_model_config *kvl_model_config_get(const kvl_model *model);
/* Directory the model was loaded from, and its short name: the directory's last path component
 * ("models/qwen3-a/." is qwen3-a; "." is named after the directory it is), which span headers,
 * translators and the router's fleet file name the model by. */
const char *kvl_model_dir(const kvl_model *model);
const char *kvl_model_name(const kvl_model *model);
/* Content hash (xxh3-64) of config.json text and all weights as loaded, hex, 16 chars. */
const char *kvl_model_hash(const kvl_model *model);

/* Whether `id` is one of the config's EOS ids. */
int kvl_model_is_eos(const kvl_model *model, int32_t id);

/* ---- forward pass -------------------------------------------------------------------------- */

typedef struct kvl_cache kvl_cache;   /* kvlingo/cache.h */

/* One sequence of a forward batch: `n_tokens` new tokens appended to `cache` at positions
 * [kvl_cache_n_tokens(cache), +n_tokens).  `logits` receives float32 logits:
 *   KVL_LOGITS_NONE: nothing (logits may be NULL)
 *   KVL_LOGITS_LAST: [vocab] for the last new token
 *   KVL_LOGITS_ALL:  [n_tokens, vocab], row i for new token i. */
typedef enum kvl_logits_mode { KVL_LOGITS_NONE = 0, KVL_LOGITS_LAST = 1, KVL_LOGITS_ALL = 2 } kvl_logits_mode;

typedef struct kvl_batch_seq {
    kvl_cache *cache;
    const int32_t *tokens;   /* [n_tokens] token ids in [0, vocab)                       */
    int n_tokens;            /* >= 1                                                     */
    kvl_logits_mode logits_mode;
    float *logits;           /* caller-owned, see above                                   */
} kvl_batch_seq;

/* Run the model on a batch of sequences (prefill: one sequence of many tokens; decode: one
 * token for each of many sessions; any mix).  Projections and the MLP run as one GEMM over all
 * tokens of the batch; attention runs per sequence on its own cache.  Each sequence's new K/V
 * are appended to its cache.  Atomic per call: on error no cache changes.  Errors:
 * KVL_ERR_INVALID_ARG (token id out of range, n_tokens < 1, a cache of another geometry, the same
 * cache twice), KVL_ERR_RANGE (capacity), KVL_ERR_NOMEM.  Calls on one model are serialised
 * (the model owns its scratch memory). */
kvl_status kvl_model_forward(kvl_model *model, const kvl_batch_seq *seqs, int n_seqs);

/* Convenience: prefill `n` tokens into `cache`; logits as in kvl_batch_seq. */
kvl_status kvl_model_prefill(kvl_model *model, kvl_cache *cache, const int32_t *tokens, int n,
                             kvl_logits_mode mode, float *logits);

/* Convenience: decode one token; last_logits receives [vocab]. */
kvl_status kvl_model_decode(kvl_model *model, kvl_cache *cache, int32_t token, float *logits);

#ifdef __cplusplus
}
#endif
#endif
