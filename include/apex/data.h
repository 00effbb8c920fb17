/* data.h: datasets. IDX files (the MNIST / Fashion-MNIST format), plain or gzip-compressed.
 *
 * An IDX file is a big-endian header (two zero bytes, a type code, the number of dimensions, one
 * 32-bit size per dimension) followed by the elements. apex reads unsigned-byte files (type 0x08),
 * which is what the MNIST family ships; a ".gz" file (or any gzip stream) is decompressed on the
 * fly with zlib. */
#ifndef APEX_DATA_H
#define APEX_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "apex/status.h"
#include "apex/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct apex_idx apex_idx;

/* Reads the IDX file at path into *out. Errors: APEX_ERR_INVALID_ARG (NULL argument), APEX_ERR_IO
 * (cannot open or read; the message names the path), APEX_ERR_CORRUPT (bad magic, a type other than
 * unsigned byte, 0 or more than APEX_MAX_DIMS dimensions, or fewer elements than the header says),
 * APEX_ERR_OUT_OF_MEMORY; *out is left as it was on error. */
APEX_API apex_status apex_idx_load(const char *path, apex_idx **out);
APEX_API void apex_idx_destroy(apex_idx *idx);

/* The accessors take NULL without crashing: ndim 0, dim -1, numel 0, data NULL, each with an
 * APEX_ERR_INVALID_ARG message. */
APEX_API int apex_idx_ndim(const apex_idx *idx);
/* Size of dimension dim (-1 when out of range). */
APEX_API int64_t apex_idx_dim(const apex_idx *idx, int dim);
APEX_API size_t apex_idx_numel(const apex_idx *idx);
APEX_API const uint8_t *apex_idx_data(const apex_idx *idx);

/* Items [first, first + count) along dimension 0 as an f32 tensor of shape [count, rest...]
 * (with `shape` overriding the item shape when ndim > 0, e.g. {1, 28, 28}), each byte b mapped to
 * (b / 255 - mean) / std (std 0 means 1). NULL (with a message) for a range or shape that does not
 * fit. */
APEX_API apex_tensor *apex_idx_to_f32(const apex_idx *idx, size_t first, size_t count, int ndim, const int64_t *shape,
                                      float mean, float std);
/* Items [first, first + count) of a 1-d file (labels) as int64 into out. APEX_ERR_SHAPE for a file
 * that is not 1-d or a range past its end. */
APEX_API apex_status apex_idx_labels(const apex_idx *idx, size_t first, size_t count, int64_t *out);

#ifdef __cplusplus
}
#endif
#endif
