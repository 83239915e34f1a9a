/* kernels/cpu/blas_core.c: OpenBLAS set-up for the process: its thread count, and the kernel
 * set it runs on this CPU.
 *
 * Why the kernel set needs care: OpenBLAS built with DYNAMIC_ARCH (Debian's is) picks its
 * kernels in its load-time constructor from the CPU's model number, and on a CPU newer than the
 * library it falls back to its oldest ones.  Debian 12's 0.3.21 takes the SSE3 "Prescott"
 * kernels on Emerald Rapids (family 6, model 207), which has AVX-512: measured on such a
 * machine, a 2048-token prefill of qwen3-b took 754 ms against 354 ms on the AVX-512
 * ("SkylakeX") kernels, and a decode step 3.7 ms against 2.8.  OpenBLAS's documented override is
 * the OPENBLAS_CORETYPE environment variable, read only by that constructor.  A constructor of
 * the executable runs after the libraries' ones, so this one can see what OpenBLAS chose: when
 * that is weaker than the CPU's features allow, it sets OPENBLAS_CORETYPE from the features
 * (never from the model number) and executes the program again, once, with the same argv
 * (the variable is set then, so it cannot loop).  A value the user set is always kept;
 * KVL_BLAS_CORE_CHECK=0 turns the check off.  If the exec fails the process goes on, slower. */
#include "ops.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

int kvl__cpu_set_threads(int n_threads) {
    const int was = openblas_get_num_threads();
    if (n_threads > 0 && n_threads != was) openblas_set_num_threads(n_threads);
    return was;
}

const char *kvl__cpu_blas_core(void) {
    const char *c = openblas_get_corename();
    return c ? c : "unknown";
}

/* OpenBLAS's x86 kernel sets that use the instructions `want` names (AVX-512 or AVX2+FMA). */
static int core_at_least(const char *have, const char *want) {
    static const char *const avx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids", NULL};
    static const char *const avx2[] = {"Haswell", "Zen", "SkylakeX", "Cooperlake",
                                       "SapphireRapids", NULL};
    const char *const *ok = strcmp(want, "SkylakeX") == 0 ? avx512 : avx2;
    for (int i = 0; ok[i]; i++)
        if (strcasecmp(have, ok[i]) == 0) return 1;
    return 0;
}

/* The kernel set this CPU's features call for; NULL: leave OpenBLAS's choice. */
static const char *core_for_cpu(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
        return "SkylakeX";   /* 0.3.21's newest float32 kernels */
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
    return NULL;
}

__attribute__((constructor)) static void blas_core_check(int argc, char **argv, char **envp) {
    (void)argc, (void)envp;
    if (getenv("OPENBLAS_CORETYPE")) return;
    const char *off = getenv("KVL_BLAS_CORE_CHECK");
    if (off && strcmp(off, "0") == 0) return;
    const char *want = core_for_cpu();
    const char *have = openblas_get_corename();
    if (!want || !have || !argv || !argv[0] || core_at_least(have, want)) return;
    if (setenv("OPENBLAS_CORETYPE", want, 1) != 0) return;
    execv("/proc/self/exe", argv);
    /* still here: no /proc, or the exec failed; run on what OpenBLAS chose */
    unsetenv("OPENBLAS_CORETYPE");
}
