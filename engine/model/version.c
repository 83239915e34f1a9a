/* engine/model/version.c: the build's identity (generated build_info.h) and the backends it can
 * run on here (kvlingo/version.h). */
#include <stdio.h>
#include <string.h>

#include "build_info.h"
#include "error.h"
#include "kvlingo/backend.h"
#include "kvlingo/version.h"

const char *kvl_version(void) { return KVL_BUILD_VERSION; }
const char *kvl_git_commit(void) { return KVL_BUILD_GIT_COMMIT; }
const char *kvl_build_options(void) { return KVL_BUILD_OPTIONS; }

void kvl_backends_describe(char *buf, size_t cap) {
    if (!buf || !cap) return;
    const kvl_backend_ops *cpu = kvl_backend_cpu();
    const char *cd = cpu->describe ? cpu->describe() : "float32";
    if (!kvl_backend_cuda()) {
        snprintf(buf, cap, "cpu (%s); cuda not built", cd);
        return;
    }
    const kvl_backend_ops *ops = NULL;
    kvl_status s = kvl_backend_for_device(KVL_DEVICE_CUDA, &ops);
    if (s == KVL_OK)
        snprintf(buf, cap, "cpu (%s); cuda (built, a GPU is usable here)", cd);
    else
        snprintf(buf, cap, "cpu (%s); cuda (built, not usable here: %s)", cd, kvl_last_error());
}

void kvl_version_print(FILE *f, const char *program) {
    char be[512];
    kvl_backends_describe(be, sizeof be);
    fprintf(f, "%s %s (git %s)\nbuild: %s\nbackends: %s\n", program, kvl_version(), kvl_git_commit(),
            kvl_build_options(), be);
}
