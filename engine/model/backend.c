/* engine/model/backend.c: choosing a backend by device (kvlingo/backend.h). */
#include "kvlingo/backend.h"

#include "error.h"
#include "kvlingo/cuda.h"

kvl_status kvl_backend_for_device(kvl_device device, const kvl_backend_ops **out) {
    if (!out) return kvl__errorf(KVL_ERR_INVALID_ARG, "kvl_backend_for_device: NULL argument");
    *out = NULL;
    switch (device) {
    case KVL_DEVICE_CPU:
        *out = kvl_backend_cpu();
        return KVL_OK;
    case KVL_DEVICE_CUDA: {
        kvl_status s = kvl_cuda_probe(NULL);   /* UNSUPPORTED in a build without CUDA */
        if (s != KVL_OK) return kvl__error_prefix(s, "--device cuda");
        *out = kvl_backend_cuda();
        return KVL_OK;
    }
    }
    return kvl__errorf(KVL_ERR_INVALID_ARG, "unknown device %d", (int)device);
}
