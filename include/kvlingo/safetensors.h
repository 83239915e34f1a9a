/* kvlingo/safetensors.h: read and write safetensors files (Hugging Face format).
 *
 * Format (https://github.com/huggingface/safetensors, "Format" section):
 *   bytes [0, 8)        little-endian u64 N, the header length
 *   bytes [8, 8+N)      UTF-8 JSON object: name -> {"dtype", "shape", "data_offsets": [begin, end)}
 *                       plus optional "__metadata__": {string: string}
 *   bytes [8+N, EOF)    the data buffer; data_offsets are relative to its start.
 * Validation done by kvl_safetensors_open/_parse: header length within the file, valid JSON
 * object, known dtype, shape entries >= 0, prod(shape) * dtype size == end - begin (checked for
 * overflow), ranges inside the data buffer, no two tensors overlapping.  No cap on header size
 * other than the file's size.  Every error names the file and the tensor/field at fault.
 *
 * Tensors are row-major.  The file is memory-mapped read-only; tensor data pointers stay valid
 * until kvl_safetensors_close().
 */
#ifndef KVLINGO_SAFETENSORS_H
#define KVLINGO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "kvlingo/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kvl_dtype {
    KVL_DTYPE_F32 = 0,
    KVL_DTYPE_F16 = 1,
    KVL_DTYPE_BF16 = 2,
    KVL_DTYPE_F64 = 3,
    KVL_DTYPE_I64 = 4,
    KVL_DTYPE_I32 = 5,
    KVL_DTYPE_I16 = 6,
    KVL_DTYPE_I8 = 7,
    KVL_DTYPE_U8 = 8,
    KVL_DTYPE_BOOL = 9,
} kvl_dtype;

#define KVL_ST_MAX_DIMS 8

/* One tensor of an open file.  Owned by the file. */
typedef struct kvl_st_tensor {
    const char *name;              /* NUL-terminated tensor name                       */
    kvl_dtype dtype;
    int n_dims;                    /* 0..KVL_ST_MAX_DIMS (0 = scalar)                   */
    int64_t shape[KVL_ST_MAX_DIMS];
    int64_t n_elements;            /* prod(shape), 1 for a scalar                       */
    const void *data;              /* points into the mapping; may be unaligned          */
    size_t nbytes;
} kvl_st_tensor;

typedef struct kvl_safetensors kvl_safetensors;

/* Size in bytes of one element of `dtype`, 0 for an invalid value. */
size_t kvl_dtype_size(kvl_dtype dtype);
/* Safetensors name of a dtype ("F32", "BF16", ...). */
const char *kvl_dtype_name(kvl_dtype dtype);
/* Parse a safetensors dtype name; KVL_ERR_FORMAT for an unknown one. */
kvl_status kvl_dtype_parse(const char *name, kvl_dtype *out);

/* Open and validate `path` (mmap, read-only).  On success *out owns the mapping; free with
 * kvl_safetensors_close.  Errors: KVL_ERR_IO (open/stat/mmap), KVL_ERR_FORMAT (any of the
 * validation rules above), KVL_ERR_NOMEM. */
kvl_status kvl_safetensors_open(const char *path, kvl_safetensors **out);

/* Validate a file image already in memory (used by fuzz targets and tests).  `buf` must stay
 * alive and unchanged while *out is used; `label` names it in error messages. */
kvl_status kvl_safetensors_parse(const void *buf, size_t len, const char *label,
                                 kvl_safetensors **out);

/* Free a file opened by _open or _parse (NULL is a no-op). */
void kvl_safetensors_close(kvl_safetensors *st);

size_t kvl_safetensors_count(const kvl_safetensors *st);
/* i-th tensor in header order, NULL if i >= count. */
const kvl_st_tensor *kvl_safetensors_get(const kvl_safetensors *st, size_t i);
/* Tensor by exact name, NULL when absent (no error recorded). */
const kvl_st_tensor *kvl_safetensors_find(const kvl_safetensors *st, const char *name);
/* "__metadata__" string value by key, NULL when absent. */
const char *kvl_safetensors_metadata(const kvl_safetensors *st, const char *key);
/* "__metadata__" entries in file order: their count, and key / value i (NULL past the end);
 * owned by st. */
size_t kvl_safetensors_metadata_count(const kvl_safetensors *st);
const char *kvl_safetensors_metadata_key(const kvl_safetensors *st, size_t i);
const char *kvl_safetensors_metadata_value(const kvl_safetensors *st, size_t i);
/* Path or label the file was opened with. */
const char *kvl_safetensors_path(const kvl_safetensors *st);

/* Convert a tensor's elements to float32 into the caller's dst[n] (n must equal
 * t->n_elements).  F32/F16/BF16/F64/integer sources; F16 and BF16 are decoded exactly
 * (subnormals, +-inf, NaN).  Errors: KVL_ERR_MISMATCH when n differs, KVL_ERR_UNSUPPORTED
 * for BOOL. */
kvl_status kvl_st_tensor_to_f32(const kvl_st_tensor *t, float *dst, size_t n);

/* Element conversions (exact; NaN payload kept as a quiet NaN). */
float kvl_f16_to_f32(uint16_t h);
float kvl_bf16_to_f32(uint16_t b);
/* Round-to-nearest-even float32 -> bfloat16 / float16 (NaN stays NaN, overflow -> inf). */
uint16_t kvl_f32_to_bf16(float f);
uint16_t kvl_f32_to_f16(float f);

/* ---- writing ----------------------------------------------------------------------------- */

/* One tensor to write; data is row-major, nbytes must equal prod(shape) * dtype size. */
typedef struct kvl_st_write_tensor {
    const char *name;
    kvl_dtype dtype;
    int n_dims;
    int64_t shape[KVL_ST_MAX_DIMS];
    const void *data;
    size_t nbytes;
} kvl_st_write_tensor;

/* Write a safetensors file atomically (temp file in the same folder + rename): tensors in
 * the given order, 8-byte aligned data, `n_meta` string pairs in "__metadata__" (meta_keys[i]
 * -> meta_values[i]; may be 0).  Errors: KVL_ERR_INVALID_ARG (duplicate name, size mismatch),
 * KVL_ERR_IO. */
kvl_status kvl_safetensors_write(const char *path, const kvl_st_write_tensor *tensors, size_t n,
                                 const char *const *meta_keys, const char *const *meta_values,
                                 size_t n_meta);

/* ---- model directories: single file or sharded --------------------------------------------- */

/* A model's weights: `dir/model.safetensors`, or the shards listed by
 * `dir/model.safetensors.index.json` ("weight_map": name -> shard file).  Every shard the
 * index names must exist and hold the tensors mapped to it (a missing shard or tensor is an
 * error naming both); a tensor present in two shards is an error. */
typedef struct kvl_st_set kvl_st_set;

/* Errors: KVL_ERR_NOT_FOUND (neither file in `dir`, or a shard the index names is missing),
 * KVL_ERR_FORMAT (bad index JSON, shard name outside `dir`, tensor not in its shard, tensor in
 * two shards), and those of kvl_safetensors_open for each file. */
kvl_status kvl_st_set_open_dir(const char *dir, kvl_st_set **out);
void kvl_st_set_free(kvl_st_set *set);
/* Find a tensor across shards; NULL when absent.  If file_out, it receives the shard path. */
const kvl_st_tensor *kvl_st_set_find(const kvl_st_set *set, const char *name,
                                     const char **file_out);
/* Number of shards and tensors in all. */
size_t kvl_st_set_num_files(const kvl_st_set *set);
size_t kvl_st_set_num_tensors(const kvl_st_set *set);
/* i-th tensor across all shards (shard order, then header order); NULL past the end. */
const kvl_st_tensor *kvl_st_set_get(const kvl_st_set *set, size_t i, const char **file_out);

#ifdef __cplusplus
}
#endif
#endif
