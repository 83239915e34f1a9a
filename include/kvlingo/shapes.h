/* kvlingo/shapes.h: published model geometries by name, and random-weight models of them, so
 * benchmarks can run at real sizes without downloaded weights (`kvlingo bench switch`). */
#ifndef KVLINGO_SHAPES_H
#define KVLINGO_SHAPES_H

#include <stdint.h>

#include "kvlingo/model.h"
#include "kvlingo/safetensors.h"
#include "kvlingo/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Geometry of a published checkpoint, from its Hugging Face config.json:
 *   "qwen2.5-0.5b"  Qwen/Qwen2.5-0.5B   24 layers, hidden 896,  14/2 heads, D 64,  ffn 4864, tied
 *   "qwen2.5-1.5b"  Qwen/Qwen2.5-1.5B   28 layers, hidden 1536, 12/2 heads, D 128, ffn 8960, tied
 *   "qwen3-4b"      Qwen/Qwen3-4B       36 layers, hidden 2560, 32/8 heads, D 128, ffn 9728, tied
 *   "qwen3-8b"      Qwen/Qwen3-8B       36 layers, hidden 4096, 32/8 heads, D 128, ffn 12288
 *   "tiny"          a 2-layer Qwen3 toy (hidden 64, 4/2 heads, D 32, vocab 512) for tests
 * (vocab 151936, rope_theta 1e6, rms eps 1e-6, bf16 for the published ones).
 * KVL_ERR_NOT_FOUND for any other name. */
kvl_status kvl_shape_config(const char *name, kvl_model_config *out);

/* Comma-separated list of the names kvl_shape_config knows (static string). */
const char *kvl_shape_names(void);

/* A host (float32) model of geometry `cfg` with weights uniform of standard deviation 0.02
 * (transformers' initializer_range), norm weights 1 and biases 0, from a splitmix64 stream
 * seeded with `seed`.  Its name is "random-<arch>", its hash derives from the seed.  Free with
 * kvl_model_free.  Errors: KVL_ERR_INVALID_ARG (bad geometry), KVL_ERR_NOMEM. */
kvl_status kvl_model_create_random(const kvl_model_config *cfg, uint64_t seed,
                                   const kvl_model_params *params, kvl_model **out);

/* Write a model directory `dir` (created if missing, in an existing parent; files replaced) that
 * kvl_model_load reads:
 * config.json (Hugging Face field names; default RoPE only, plus "kvlingo_random_seed") and
 * model.safetensors with the weights kvl_model_create_random(cfg, seed) makes, stored as
 * `dtype` KVL_DTYPE_F32 (loads to exactly those weights) or KVL_DTYPE_BF16 (rounded to
 * nearest even).  Same cfg and seed give byte-identical files, hence the same model hash.
 * Needs prod(weights) * (4 or 2) bytes of memory while writing.  config.json is written last,
 * so a failed write leaves no loadable directory.  Errors: KVL_ERR_INVALID_ARG (bad geometry or
 * dtype), KVL_ERR_UNSUPPORTED (RoPE scaling, a bias/norm layout config.json cannot say),
 * KVL_ERR_IO (naming the file), KVL_ERR_NOMEM. */
kvl_status kvl_model_write_random(const kvl_model_config *cfg, uint64_t seed, kvl_dtype dtype,
                                  const char *dir);

#ifdef __cplusplus
}
#endif
#endif
