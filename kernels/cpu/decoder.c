/* kernels/cpu/decoder.c: instantiates the decoder layer (decoder.inc) for float and double. */
#include "decoder.h"

#include <string.h>

#include "ops.h"
#include "ops_backward.h"

#define R float
#define SFX f32
#define LAYER kvl_layer_view
#define FWD(name) name
#include "decoder.inc"
#undef R
#undef SFX
#undef LAYER
#undef FWD

#define R double
#define SFX f64
#define LAYER kvl__layer_view_f64
#define FWD(name) name##_f64
#include "decoder.inc"
