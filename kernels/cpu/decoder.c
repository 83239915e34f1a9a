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
#include "decoder.inc"
#undef R
#undef SFX
#undef LAYER
#undef FWD
#undef MATMUL

#define R float
#define SFX f32p
#define LAYER kvl__layer_view_f32p
#define FWD(name) name
#define MATMUL(out, in, W, b, T, K, N) kvl__cpu_matmul_f32(*w->pool, out, in, W, b, T, K, N)
#include "decoder.inc"
#undef R
#undef SFX
#undef LAYER
#undef FWD
#undef MATMUL
