/* kvlingo/rope.h: rotary position embedding (RoPE) frequencies, with the scaling types of
 * Hugging Face transformers (modeling_rope_utils.py, ROPE_INIT_FUNCTIONS).
 *
 * A model's RoPE is fixed by config.json (kvl_config_parse fills kvl_model_config.rope once):
 *   default  _compute_default_rope_parameters: inv_freq[i] = 1 / theta^(2i/D)
 *   linear   _compute_linear_scaling_rope_parameters: inv_freq / factor
 *   dynamic  _compute_dynamic_ntk_parameters: theta' = theta * (factor*S/M - (factor-1))^(D/(D-2))
 *            with S = max(seq_len, M), M = max_position_embeddings
 *   yarn     _compute_yarn_parameters: per-dimension blend of inv_freq and inv_freq / factor over
 *            a linear ramp between the correction dimensions of beta_fast and beta_slow rotations
 *            in original_max_position_embeddings positions; attention factor
 *            0.1 ln(factor) + 1 (or attention_factor, or the mscale / mscale_all_dim ratio)
 *   llama3   _compute_llama3_parameters: wavelengths 2 pi / inv_freq above
 *            original/low_freq_factor are divided by factor, below original/high_freq_factor
 *            kept, and smoothly interpolated between
 * The rotation of a vector at position p uses angle p * inv_freq[i] for the pair (i, i + D/2)
 * (rotate_half) and multiplies cos and sin by the attention factor (transformers'
 * `cos = cos * attention_scaling`), so q.k is scaled by its square.
 *
 * `dynamic` depends on the sequence length.  transformers recomputes inv_freq at every forward
 * call whose largest position + 1 exceeds the longest seen so far (dynamic_rope_update); kvlingo
 * does the same per call and per sequence: the tokens of one call at positions [p0, p1] are
 * rotated with seq_len = p1 + 1, which is what transformers computes for one sequence growing
 * call by call.  Keys already cached keep the rotation they were written with (as in
 * transformers); the pre-RoPE export of such keys (inverse rotation over a span) uses the span's
 * own seq_len, exact for the keys of one prefill and for every position below
 * max_position_embeddings, where dynamic equals default. */
#ifndef KVLINGO_ROPE_H
#define KVLINGO_ROPE_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kvl_rope_type {
    KVL_ROPE_DEFAULT = 0,
    KVL_ROPE_LINEAR = 1,
    KVL_ROPE_DYNAMIC = 2,
    KVL_ROPE_YARN = 3,
    KVL_ROPE_LLAMA3 = 4,
} kvl_rope_type;

/* RoPE parameters as read from config.json (`rope_theta` + `rope_scaling` {`type` or
 * `rope_type`, ...}, or `rope_parameters`).  Fields a type does not use are 0. */
typedef struct kvl_rope_params {
    kvl_rope_type type;
    double theta;                        /* base ("rope_theta")                          */
    int dim;                             /* rotary dimension D = head_dim (even)         */
    int max_position_embeddings;         /* config's "max_position_embeddings" (dynamic) */
    double factor;                       /* linear, dynamic, yarn, llama3 (> 0)          */
    int original_max_position_embeddings;/* yarn (default: max_position_embeddings), llama3 */
    double low_freq_factor;              /* llama3                                       */
    double high_freq_factor;             /* llama3 (> low_freq_factor)                   */
    double beta_fast, beta_slow;         /* yarn (defaults 32 and 1)                     */
    double attention_factor;             /* yarn: explicit attention factor, 0 = derived */
    double mscale, mscale_all_dim;       /* yarn: optional, 0 = absent                   */
    int truncate;                        /* yarn: 1 (default) floors/ceils the range     */
} kvl_rope_params;

/* Parameters of the default (unscaled) RoPE: theta, dim = head_dim, max_position_embeddings. */
kvl_rope_params kvl_rope_default_params(double theta, int dim, int max_position_embeddings);

/* Name of a type as config.json spells it ("default", "linear", "dynamic", "yarn", "llama3"). */
const char *kvl_rope_type_name(kvl_rope_type type);

/* Inverse frequencies and attention factor for a forward call whose largest position is
 * seq_len - 1 (seq_len only matters for `dynamic`; pass 0 for "no call": M is used).
 *   inv_freq [r->dim / 2] float32, radians per position, computed in float32 operation by
 *            operation as the transformers function of the type does on the CPU (for `default`
 *            bit-identical to `1.0 / (base ** (arange(0, D, 2).float() / D))`);
 *   *attention_scaling (may be NULL) the factor on cos and sin: 1 except for yarn.
 * r must have been validated by kvl_config_parse (dim even and <= 1024, factors > 0). */
void kvl_rope_inv_freq(const kvl_rope_params *r, int seq_len, float *inv_freq,
                       float *attention_scaling);

/* The same formulas in double precision (for the float64 training and gradient-check kernels):
 * inv_freq [r->dim / 2] float64, *attention_scaling float64 (may be NULL). */
void kvl_rope_inv_freq_f64(const kvl_rope_params *r, int seq_len, double *inv_freq,
                           double *attention_scaling);

#ifdef __cplusplus
}
#endif
#endif
