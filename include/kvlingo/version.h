/* kvlingo/version.h: what a build is: version, git commit, build options, backends. */
#ifndef KVLINGO_VERSION_H
#define KVLINGO_VERSION_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* "0.1.0" */
const char *kvl_version(void);
/* The commit the build was configured from (12 hex digits, "+dirty" when the tree had changes),
 * or "unknown" outside a git checkout. */
const char *kvl_git_commit(void);
/* "build=RelWithDebInfo compiler=GNU-12.2.0 sanitize=OFF cuda=ON(90) server=ON" */
const char *kvl_build_options(void);
/* Writes the backends compiled in and whether each can run here, e.g.
 * "cpu (OpenBLAS); cuda (built for sm_90; no usable GPU: ...)". */
void kvl_backends_describe(char *buf, size_t cap);
/* Prints "<program> <version> (git <commit>)", the build options and the backends to f. */
void kvl_version_print(FILE *f, const char *program);

#ifdef __cplusplus
}
#endif
#endif
