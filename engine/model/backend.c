/* engine/model/backend.c: choosing a backend by device (kvlingo/backend.h). */
#include "kvlingo/backend.h"

#include <stdlib.h>
#include <string.h>

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

kvl_status kvl_device_parse(const char *text, kvl_device *device, int *index) {
    if (!text || !device || !index) return kvl__errorf(KVL_ERR_INVALID_ARG, "device: NULL argument");
    *index = 0;
    if (!strcmp(text, "cpu")) { *device = KVL_DEVICE_CPU; return KVL_OK; }
    if (!strcmp(text, "cuda")) { *device = KVL_DEVICE_CUDA; return KVL_OK; }
    if (!strncmp(text, "cuda:", 5) && text[5] >= '0' && text[5] <= '9') {
        char *end;
        long n = strtol(text + 5, &end, 10);
        if (!*end && n >= 0 && n < 1024) {
            *device = KVL_DEVICE_CUDA;
            *index = (int)n;
            return KVL_OK;
        }
    }
    return kvl__errorf(KVL_ERR_INVALID_ARG, "device '%s': expected cpu, cuda or cuda:N", text);
}

const char *kvl_device_name(kvl_device device) {
    return device == KVL_DEVICE_CUDA ? "cuda" : "cpu";
}
