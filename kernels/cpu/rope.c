/* kernels/cpu/rope.c: RoPE inverse frequencies and attention factor for every scaling type
 * (kvlingo/rope.h).  The float32 path follows transformers' tensor code operation by operation
 * (modeling_rope_utils.py, ROPE_INIT_FUNCTIONS) as PyTorch evaluates it on the CPU: a Python
 * scalar meets a float32 tensor as a float32 value, `x / tensor` is `tensor.reciprocal() * x`,
 * and each operation rounds to float32 (one operation per statement, so that no multiply-add is
 * fused where the target has FMA).  The float64 path uses the same formulas in double. */
#include "kvlingo/rope.h"

#include <math.h>

#define KVL_PI 3.14159265358979323846

const char *kvl_rope_type_name(kvl_rope_type type) {
    switch (type) {
    case KVL_ROPE_DEFAULT: return "default";
    case KVL_ROPE_LINEAR: return "linear";
    case KVL_ROPE_DYNAMIC: return "dynamic";
    case KVL_ROPE_YARN: return "yarn";
    case KVL_ROPE_LLAMA3: return "llama3";
    }
    return "unknown";
}

kvl_rope_params kvl_rope_default_params(double theta, int dim, int max_position_embeddings) {
    kvl_rope_params r = {0};
    r.type = KVL_ROPE_DEFAULT;
    r.theta = theta;
    r.dim = dim;
    r.max_position_embeddings = max_position_embeddings;
    r.truncate = 1;
    return r;
}

/* _compute_yarn_parameters' get_mscale */
static double yarn_get_mscale(double scale, double mscale) {
    if (scale <= 1) return 1.0;
    return 0.1 * mscale * log(scale) + 1.0;
}

static double yarn_attention_factor(const kvl_rope_params *r) {
    if (r->attention_factor > 0) return r->attention_factor;
    if (r->mscale != 0 && r->mscale_all_dim != 0)
        return yarn_get_mscale(r->factor, r->mscale) / yarn_get_mscale(r->factor, r->mscale_all_dim);
    return yarn_get_mscale(r->factor, 1.0);
}

/* _compute_yarn_parameters' find_correction_range: the ramp's [low, high] in dimension index
 * units (doubles, as Python computes them). */
static void yarn_correction_range(const kvl_rope_params *r, double *low, double *high) {
    const double D = r->dim, base = r->theta;
    const double orig = r->original_max_position_embeddings > 0 ? r->original_max_position_embeddings
                                                                : r->max_position_embeddings;
    const double bf = r->beta_fast > 0 ? r->beta_fast : 32, bs = r->beta_slow > 0 ? r->beta_slow : 1;
    double lo = (D * log(orig / (bf * 2 * KVL_PI))) / (2 * log(base));
    double hi = (D * log(orig / (bs * 2 * KVL_PI))) / (2 * log(base));
    if (r->truncate) { lo = floor(lo); hi = ceil(hi); }
    *low = lo > 0 ? lo : 0;
    *high = hi < D - 1 ? hi : D - 1;
    if (*low == *high) *high += 0.001;   /* linear_ramp_factor: prevent singularity */
}

/* dynamic: the effective sequence length S = max(seq_len, M) (seq_len 0: M, the init value) */
static int dynamic_seq_len(const kvl_rope_params *r, int seq_len) {
    int M = r->max_position_embeddings;
    return seq_len > M ? seq_len : M;
}

void kvl_rope_inv_freq(const kvl_rope_params *r, int seq_len, float *inv_freq,
                       float *attention_scaling) {
    const int D = r->dim, half = D / 2;
    float base = (float)r->theta;
    float attn = 1.0f;
    if (r->type == KVL_ROPE_DYNAMIC) {
        int S = dynamic_seq_len(r, seq_len), M = r->max_position_embeddings;
        if (S == M) {
            /* init time: Python scalars throughout, then the base meets the float32 exponents */
            double b = r->theta * pow(r->factor * S / M - (r->factor - 1), (double)D / (D - 2));
            base = (float)b;
        } else {
            /* dynamic_rope_update passes seq_len as an int64 tensor: float32 from there on */
            float s = (float)r->factor * (float)S;
            s = s / (float)M;
            s = s - (float)(r->factor - 1);
            s = powf(s, (float)((double)D / (D - 2)));
            base = (float)r->theta * s;
        }
    }
    for (int i = 0; i < half; i++) inv_freq[i] = 1.0f / powf(base, (float)(2 * i) / (float)D);

    switch (r->type) {
    case KVL_ROPE_DEFAULT:
    case KVL_ROPE_DYNAMIC:
        break;
    case KVL_ROPE_LINEAR: {
        float f = (float)r->factor;
        for (int i = 0; i < half; i++) inv_freq[i] = inv_freq[i] / f;
        break;
    }
    case KVL_ROPE_YARN: {
        double low, high;
        yarn_correction_range(r, &low, &high);
        const float f = (float)r->factor, lo = (float)low, span = (float)(high - low);
        for (int i = 0; i < half; i++) {
            float pos_freq = powf(base, (float)(2 * i) / (float)D);
            float extra = 1.0f / pos_freq;
            float inter = 1.0f / (f * pos_freq);
            float ramp = ((float)i - lo) / span;
            ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
            float ef = 1.0f - ramp;          /* inv_freq_extrapolation_factor */
            float a = inter * (1.0f - ef);
            float b = extra * ef;
            inv_freq[i] = a + b;
        }
        attn = (float)yarn_attention_factor(r);
        break;
    }
    case KVL_ROPE_LLAMA3: {
        const double orig = r->original_max_position_embeddings;
        const float low_wl = (float)(orig / r->low_freq_factor);
        const float high_wl = (float)(orig / r->high_freq_factor);
        const float f = (float)r->factor, two_pi = (float)(2 * KVL_PI);
        const float lf = (float)r->low_freq_factor, dh = (float)(r->high_freq_factor - r->low_freq_factor);
        for (int i = 0; i < half; i++) {
            float inv = inv_freq[i];
            float wavelen = (1.0f / inv) * two_pi;
            float llama = wavelen > low_wl ? inv / f : inv;
            float smooth = ((1.0f / wavelen) * (float)orig - lf) / dh;
            float a = ((1.0f - smooth) * llama) / f;
            float b = smooth * llama;
            float smoothed = a + b;
            int medium = !(wavelen < high_wl) && !(wavelen > low_wl);
            inv_freq[i] = medium ? smoothed : llama;
        }
        break;
    }
    }
    if (attention_scaling) *attention_scaling = attn;
}

void kvl_rope_inv_freq_f64(const kvl_rope_params *r, int seq_len, double *inv_freq,
                           double *attention_scaling) {
    const int D = r->dim, half = D / 2;
    double base = r->theta, attn = 1.0;
    if (r->type == KVL_ROPE_DYNAMIC) {
        int S = dynamic_seq_len(r, seq_len), M = r->max_position_embeddings;
        base = r->theta * pow(r->factor * S / M - (r->factor - 1), (double)D / (D - 2));
    }
    for (int i = 0; i < half; i++) inv_freq[i] = 1.0 / pow(base, (double)(2 * i) / D);
    switch (r->type) {
    case KVL_ROPE_DEFAULT:
    case KVL_ROPE_DYNAMIC:
        break;
    case KVL_ROPE_LINEAR:
        for (int i = 0; i < half; i++) inv_freq[i] /= r->factor;
        break;
    case KVL_ROPE_YARN: {
        double low, high;
        yarn_correction_range(r, &low, &high);
        for (int i = 0; i < half; i++) {
            double ramp = (i - low) / (high - low);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double ef = 1 - ramp;
            inv_freq[i] = inv_freq[i] / r->factor * (1 - ef) + inv_freq[i] * ef;
        }
        attn = yarn_attention_factor(r);
        break;
    }
    case KVL_ROPE_LLAMA3: {
        const double orig = r->original_max_position_embeddings;
        const double low_wl = orig / r->low_freq_factor, high_wl = orig / r->high_freq_factor;
        for (int i = 0; i < half; i++) {
            double inv = inv_freq[i], wavelen = 2 * KVL_PI / inv;
            double llama = wavelen > low_wl ? inv / r->factor : inv;
            double smooth = (orig / wavelen - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
            double smoothed = (1 - smooth) * llama / r->factor + smooth * llama;
            int medium = !(wavelen < high_wl) && !(wavelen > low_wl);
            inv_freq[i] = medium ? smoothed : llama;
        }
        break;
    }
    }
    if (attention_scaling) *attention_scaling = attn;
}
