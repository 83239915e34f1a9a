/* kernels/cpu/decoder.c: instantiates the decoder layer (decoder.inc) for float (training,
 * OpenBLAS), double (the gradient check), float activations over bf16 weights, and float on the
 * model's pool (the backend's float32 inference). */
#include "decoder.h"

#include <string.h>

#include "matmul_f32.h"
#include "ops.h"
#include "ops_backward.h"

#define R float
#define SFX f32
#define LAYER kvl_layer_view
#define FWD(name) name
#define MATMUL(out, in, W, b, T, K, N) kvl__cpu_matmul_forward(out, in, W, b, T, K, N)
#include "decoder.inc"
#undef R
#undef SFX
#undef LAYER
#undef FWD
#undef MATMUL

#define R double
#define SFX f64
#define LAYER kvl__layer_view_f64
#define FWD(name) name##_f64
#define MATMUL(out, in, W, b, T, K, N) kvl__cpu_matmul_forward_f64(out, in, W, b, T, K, N)
#include "decoder.inc"
#undef R
#undef SFX
#undef LAYER
#undef FWD
#undef MATMUL

#define R float
#define SFX bf16
#define LAYER kvl__layer_view_bf16
#define FWD(name) name
#define MATMUL(out, in, W, b, T, K, N) kvl__cpu_matmul_bf16(w->exec, out, in, W, b, T, K, N)
#define MATMUL2(in, T, K, o1, W1, b1, N1, o2, W2, b2, N2) \
    kvl__cpu_matmul_bf16_multi(w->exec, in, T, K, (const kvl__bf16_out[2]){{o1, W1, b1, N1}, {o2, W2, b2, N2}}, 2)
#define MATMUL3(in, T, K, o1, W1, b1, N1, o2, W2, b2, N2, o3, W3, b3, N3)                       \
    kvl__cpu_matmul_bf16_multi(w->exec, in, T, K,                                                \
                               (const kvl__bf16_out[3]){{o1, W1, b1, N1}, {o2, W2, b2, N2}, {o3, W3, b3, N3}}, 3)
#include "decoder.inc"
#undef R
#undef SFX
#undef LAYER
#undef FWD
#undef MATMUL
#undef MATMUL2
#undef MATMUL3

#define R float
#define SFX f32p
#define LAYER kvl__layer_view_f32p
#define FWD(name) name
#define MATMUL(out, in, W, b, T, K, N) kvl__cpu_matmul_f32(*w->pool, out, in, W, b, T, K, N)
#define MATMUL2(in, T, K, o1, W1, b1, N1, o2, W2, b2, N2) \
    kvl__cpu_matmul_f32_multi(*w->pool, in, T, K, (const kvl__f32_out[2]){{o1, W1, b1, N1}, {o2, W2, b2, N2}}, 2)
#define MATMUL3(in, T, K, o1, W1, b1, N1, o2, W2, b2, N2, o3, W3, b3, N3)                        \
    kvl__cpu_matmul_f32_multi(*w->pool, in, T, K,                                                 \
                              (const kvl__f32_out[3]){{o1, W1, b1, N1}, {o2, W2, b2, N2}, {o3, W3, b3, N3}}, 3)
#include "decoder.inc"
#undef R
#undef SFX
#undef LAYER
#undef FWD
#undef MATMUL
#undef MATMUL2
#undef MATMUL3
