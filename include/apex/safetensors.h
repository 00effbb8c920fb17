/* safetensors.h: reading and writing tensors in the safetensors format (Hugging Face), the format of
 * apex's checkpoints.
 *
 * A file is: an 8-byte little-endian header length N; N bytes of JSON mapping each tensor name to
 * {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the data that follows the header),
 * plus an optional "__metadata__" object of string values; then the raw little-endian tensor data.
 * apex writes F32, F16 and BF16 tensors, in the order given, with no gaps, the header padded with
 * spaces to a multiple of 8 bytes, and nothing that depends on the time or the run: the same tensors
 * and metadata always give the same bytes. Writes are atomic: a temporary file beside the target is
 * written, flushed to disk (fsync) and renamed over it, so a failed or killed save leaves the previous
 * file intact. */
#ifndef APEX_SAFETENSORS_H
#define APEX_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "apex/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest header apex reads (the format's reference implementation uses the same bound). */
#define APEX_SAFETENSORS_MAX_HEADER ((uint64_t)100 << 20)

/* Writes n named tensors (f32/f16/bf16, on any device: a GPU tensor is copied to the host one tensor
 * at a time) and optional metadata (n_meta key/value string pairs, may be 0 with NULL arrays) to path,
 * atomically. Errors: NULL or empty names, a duplicate name or metadata key, a name, key or value that
 * is not valid UTF-8, a name starting with "__" (APEX_ERR_INVALID_ARG, naming the tensor); a device
 * tensor that cannot be copied to the host (that copy's status, naming the tensor); the directory not writable or
 * the disk full (APEX_ERR_IO, with the OS's reason). On any error the previous file at path is untouched and no temporary file is left behind. */
APEX_API apex_status apex_safetensors_save(const char *path, const char *const *names, apex_tensor *const *tensors, int n,
                                           const char *const *meta_keys, const char *const *meta_values, int n_meta);

typedef struct apex_safetensors apex_safetensors;

/* Reads and validates a whole file. Returns NULL with a message (APEX_ERR_IO for an unreadable file,
 * APEX_ERR_CORRUPT for anything malformed: a header length past the end of the file or over
 * APEX_SAFETENSORS_MAX_HEADER, a header that does not start with '{', is not valid UTF-8 or not strict
 * JSON (RFC 8259: no control bytes between tokens or unescaped in strings, no "01"-style numbers),
 * has anything but JSON whitespace (space, tab, CR, LF) after the JSON, or holds "\u0000"; a key that
 * appears twice (a tensor name, __metadata__, a metadata key, or a field of one tensor: readers
 * disagree on which copy wins, so none is chosen); a missing or wrong-typed field, an unknown dtype, a
 * negative or overflowing shape, offsets that do not match the shape, overlap, leave holes or run past
 * the end of the data). The message names the problem and, for the header's text, its byte offset.
 * Time is O(n log n) in the tensor count n; lookups by name are O(log n). */
APEX_API apex_safetensors *apex_safetensors_open(const char *path);
/* The same from a buffer in memory (copied; the caller keeps buf). */
APEX_API apex_safetensors *apex_safetensors_parse(const uint8_t *buf, size_t len);
APEX_API void apex_safetensors_close(apex_safetensors *st);

/* Number of tensors, and the name of tensor i in file order (NULL if i is out of range). For a NULL
 * st: 0 tensors, no name, no tensor and no metadata (count, name and metadata leave a message). */
APEX_API int apex_safetensors_count(const apex_safetensors *st);
APEX_API const char *apex_safetensors_name(const apex_safetensors *st, int i);
/* 1 if a tensor of that name exists. */
APEX_API int apex_safetensors_has(const apex_safetensors *st, const char *name);
/* A metadata value, or NULL when the key is absent. */
APEX_API const char *apex_safetensors_metadata(const apex_safetensors *st, const char *key);

/* A new CPU tensor holding a copy of the named tensor. NULL with APEX_ERR_INVALID_ARG naming the
 * tensor when it is absent. */
APEX_API apex_tensor *apex_safetensors_get(const apex_safetensors *st, const char *name);
/* Copies the named tensor into dst, which must have the same shape and dtype (else
 * APEX_ERR_SHAPE / APEX_ERR_DTYPE, naming the tensor, its shape and dtype in the file and in dst);
 * dst is unchanged on error. dst may be on any device. */
APEX_API apex_status apex_safetensors_read_into(const apex_safetensors *st, const char *name, apex_tensor *dst);

#ifdef __cplusplus
}
#endif
#endif
