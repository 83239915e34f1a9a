/* kernels/cuda/stub.c: the CUDA API (include/kvlingo/cuda.h) in a build without CUDA
 * (KVL_CUDA=OFF, or AUTO where nvcc was not found): every call reports KVL_ERR_UNSUPPORTED. */
#include <stddef.h>

#include "error.h"
#include "kvlingo/backend.h"
#include "kvlingo/cuda.h"

#define KVL_NO_CUDA(fn) \
    kvl__errorf(KVL_ERR_UNSUPPORTED, "%s: this kvlingo was built without CUDA (configure with -DKVL_CUDA=ON where nvcc is installed)", fn)

int kvl_cuda_built(void) { return 0; }

kvl_status kvl_cuda_probe(int *n_devices) {
    if (n_devices) *n_devices = 0;
    return KVL_NO_CUDA("kvl_cuda_probe");
}

kvl_status kvl_cuda_device_name(char *buf, size_t cap, int *sm_count) {
    if (buf && cap) buf[0] = '\0';
    if (sm_count) *sm_count = 0;
    return KVL_NO_CUDA("kvl_cuda_device_name");
}

kvl_cuda_params kvl_cuda_default_params(void) {
    kvl_cuda_params p = {.device = 0, .dtype = KVL_CUDA_BF16, .use_graph = 1};
    return p;
}

kvl_status kvl_cuda_model_create(const kvl_weights_view *host, const kvl_cuda_params *params,
                                 kvl_cuda_model **out) {
    if (out) *out = NULL;
    return KVL_NO_CUDA("kvl_cuda_model_create");
}

kvl_status kvl_cuda_model_create_random(const kvl_model_config *cfg, uint64_t seed,
                                        const kvl_cuda_params *params, kvl_cuda_model **out) {
    if (out) *out = NULL;
    return KVL_NO_CUDA("kvl_cuda_model_create_random");
}

void kvl_cuda_model_free(kvl_cuda_model *model) { (void)model; }
const kvl_model_config *kvl_cuda_model_config(const kvl_cuda_model *model) { return NULL; }
size_t kvl_cuda_model_weight_bytes(const kvl_cuda_model *model) { return 0; }
kvl_status kvl_cuda_synchronize(kvl_cuda_model *model) { return KVL_NO_CUDA("kvl_cuda_synchronize"); }

kvl_status kvl_cuda_cache_create(kvl_cuda_model *model, int max_tokens, kvl_cuda_cache **out) {
    if (out) *out = NULL;
    return KVL_NO_CUDA("kvl_cuda_cache_create");
}

void kvl_cuda_cache_free(kvl_cuda_cache *cache) { (void)cache; }
int kvl_cuda_cache_n_tokens(const kvl_cuda_cache *cache) { return 0; }
int kvl_cuda_cache_capacity(const kvl_cuda_cache *cache) { return 0; }
kvl_status kvl_cuda_cache_truncate(kvl_cuda_cache *cache, int n) { return KVL_NO_CUDA("kvl_cuda_cache_truncate"); }

kvl_status kvl_cuda_prefill(kvl_cuda_model *model, kvl_cuda_cache *cache, const int32_t *tokens,
                            int n, kvl_logits_mode mode, float *logits, int32_t *argmax_out) {
    return KVL_NO_CUDA("kvl_cuda_prefill");
}

kvl_status kvl_cuda_decode(kvl_cuda_model *model, kvl_cuda_cache *cache, int32_t token,
                           float *logits, int32_t *argmax_out) {
    return KVL_NO_CUDA("kvl_cuda_decode");
}

kvl_status kvl_cuda_cache_read_kv(const kvl_cuda_cache *cache, int layer, int t0, int t1,
                                  float *k_out, float *v_out) {
    return KVL_NO_CUDA("kvl_cuda_cache_read_kv");
}

kvl_status kvl_cuda_cache_read_prenorm(const kvl_cuda_cache *cache, int layer, int t0, int t1,
                                       float *k_out, float *v_out) {
    return KVL_NO_CUDA("kvl_cuda_cache_read_prenorm");
}

kvl_status kvl_cuda_translator_create(const kvl_kv_maps *maps, const kvl_model_config *src,
                                      kvl_cuda_model *dst, kvl_cuda_translator **out) {
    if (out) *out = NULL;
    return KVL_NO_CUDA("kvl_cuda_translator_create");
}

void kvl_cuda_translator_free(kvl_cuda_translator *tr) { (void)tr; }

kvl_status kvl_cuda_translate(kvl_cuda_translator *tr, const kvl_cuda_cache *src, int t0, int t1,
                              kvl_cuda_cache *dst, size_t *bytes_out) {
    return KVL_NO_CUDA("kvl_cuda_translate");
}

kvl_status kvl_cuda_copy_bandwidth(size_t bytes, int reps, double *gbps_out) {
    return KVL_NO_CUDA("kvl_cuda_copy_bandwidth");
}

/* No CUDA backend in this build: kvl_backend_for_device answers KVL_ERR_UNSUPPORTED first. */
const kvl_backend_ops *kvl_backend_cuda(void) { return NULL; }
