/* kernels/cpu/ops_backward.c: backward kernels (and float64 forwards) of ops_backward.h.
 * The bodies are written once over a scalar type in ops_generic.inc and instantiated here for
 * float (production training) and double (gradient check). */
#include "ops_backward.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#include "ops.h"

#define R float
#define KFN(name) name
#define GEMM cblas_sgemm
#define GEMV cblas_sgemv
#define RSQRT(x) (1.0f / sqrtf(x))
#define REXP expf
#include "ops_generic.inc"
#undef R
#undef KFN
#undef GEMM
#undef GEMV
#undef RSQRT
#undef REXP

#define KVL_GEN_FORWARD 1
#define R double
#define KFN(name) name##_f64
#define GEMM cblas_dgemm
#define GEMV cblas_dgemv
#define RSQRT(x) (1.0 / sqrt(x))
#define REXP exp
#include "ops_generic.inc"
