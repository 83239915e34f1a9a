/* tests/unit/testutil.h: small helpers shared by the unit tests. */
#ifndef KVL_TESTUTIL_H
#define KVL_TESTUTIL_H

#include <stddef.h>

/* Absolute path of `rel` under the source tree (KVL_SOURCE_DIR).  Returns a pointer into one
 * of 8 rotating static buffers: copy it if you need more than 8 at once. */
const char *kvl__test_path(const char *rel);
/* KVL_BINARY_DIR "/" rel: test data the build unpacks (testdata/CMakeLists.txt), e.g. the
 * real Qwen3 and Llama 3 tokenizers under testdata/tokenizers/{qwen3,llama3}/. */
const char *kvl__test_build_path(const char *rel);

/* Fresh temporary directory (mkdtemp under $TMPDIR or /tmp); static buffer. */
const char *kvl__test_tmpdir(void);

/* Write `len` bytes to `path`; returns 0 on success. */
int kvl__test_write_file(const char *path, const void *data, size_t len);

/* Run this test program again in a child process with the environment variable `var` set to
 * `value` (for a choice a module makes once per process, such as a kernel), its output
 * discarded; returns the child's status as system() gives it (0: every test passed), or -1
 * when /proc/self/exe cannot be read.  A test calling it skips itself when `var` is already
 * set, i.e. in the child. */
int kvl__test_rerun_self_with(const char *var, const char *value);

/* Read a whole file (malloc'ed, NUL-terminated); NULL on failure. */
char *kvl__test_read_file(const char *path, size_t *len_out);

#endif

/* Write a tiny random model directory (config.json + model.safetensors, float32 weights from a
 * seeded generator, scaled like a trained model) of architecture `arch` ("Qwen3ForCausalLM",
 * "Qwen2ForCausalLM", "LlamaForCausalLM") into `dir` (which must exist).
 * Geometry: vocab V, hidden H, L layers, Hq heads, Hkv kv heads, head_dim D, MLP width F.
 * `skip_tensor` (may be NULL) names a tensor left out, `bad_shape_tensor` (may be NULL) one
 * written with a wrong first dimension — for error tests.  Returns 0 on success. */
int kvl__test_write_tiny_model(const char *dir, const char *arch, int V, int H, int L, int Hq, int Hkv,
                              int D, int F, double rope_theta, unsigned seed,
                              const char *skip_tensor, const char *bad_shape_tensor);
