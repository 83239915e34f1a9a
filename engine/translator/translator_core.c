/* engine/translator/translator_core.c: instantiates the stage-2 training core (translator_core.inc) for
 * float (training) and double (gradient check), and the float view of a loaded model. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "ops_backward.h"
#include "error.h"
#include "translator_internal.h"

#define R float
#define SFX f32
#define CAT(a) a##_f32
#define FWD(name) name
#define BWD(name) name
#include "translator_core.inc"
#undef R
#undef SFX
#undef CAT
#undef FWD
#undef BWD

#define R double
#define SFX f64
#define CAT(a) a##_f64
#define FWD(name) name##_f64
#define BWD(name) name##_f64
#include "translator_core.inc"

