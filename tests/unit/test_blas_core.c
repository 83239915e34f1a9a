/* tests/unit/test_blas_core.c: the OpenBLAS kernel set the process runs on (blas_core.c).
 *   - on a CPU with AVX-512 (F, DQ, BW, VL), OpenBLAS runs its AVX-512 kernels, whatever it
 *     would pick from the CPU's model number (Debian's 0.3.21 picks "Prescott" on CPUs newer
 *     than itself); likewise its AVX2 kernels on an AVX2+FMA CPU;
 *   - a kernel set the user chose (OPENBLAS_CORETYPE) is kept: a child run with "Prescott"
 *     gets Prescott.
 * The child run is this program again, in its own mode (see main). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cmocka.h>

#include "ops.h"
#include "testutil.h"

static int is_one_of(const char *s, const char *const *names) {
    for (int i = 0; names[i]; i++)
        if (strcasecmp(s, names[i]) == 0) return 1;
    return 0;
}

static void test_core_follows_features(void **state) {
    (void)state;
    const char *ct = getenv("OPENBLAS_CORETYPE");
    const char *core = kvl__cpu_blas_core();
    static const char *const avx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids", NULL};
    static const char *const avx2[] = {"Haswell", "Zen", "SkylakeX", "Cooperlake",
                                       "SapphireRapids", NULL};
    __builtin_cpu_init();
    const int has512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                       __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
    const int has2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    /* set by the check itself, or by the user: only the former says what the check did */
    if (ct && strcasecmp(ct, has512 ? "SkylakeX" : "Haswell") != 0) {
        print_message("OPENBLAS_CORETYPE=%s was set by the user: kept (%s)\n", ct, core);
        skip();
    }
    print_message("OpenBLAS kernels: %s\n", core);
    if (has512) assert_true(is_one_of(core, avx512));
    else if (has2) assert_true(is_one_of(core, avx2));
}

static void test_user_choice_kept(void **state) {
    (void)state;
    /* the child exits 0 iff it ran on Prescott (see main) */
    assert_int_equal(kvl__test_rerun_self_with("OPENBLAS_CORETYPE", "Prescott"), 0);
}

int main(void) {
    const char *ct = getenv("OPENBLAS_CORETYPE");
    if (ct && strcmp(ct, "Prescott") == 0) return strcasecmp(kvl__cpu_blas_core(), "Prescott") != 0;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_core_follows_features),
        cmocka_unit_test(test_user_choice_kept),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
