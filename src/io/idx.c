/* idx.c: reading IDX files (MNIST, Fashion-MNIST), plain or gzip'd, through zlib's gzread (which
 * reads uncompressed files unchanged). */
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "apex/data.h"
#include "core/internal.h"

struct apex_idx {
  int ndim;
  int64_t shape[APEX_MAX_DIMS];
  size_t numel;
  uint8_t *data;
};

static int read_all(gzFile f, void *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    unsigned chunk = n - got > (1u << 30) ? (1u << 30) : (unsigned)(n - got);
    int r = gzread(f, (char *)buf + got, chunk);
    if (r <= 0) return 0;
    got += (size_t)r;
  }
  return 1;
}

apex_status apex_idx_load(const char *path, apex_idx **out) {
  if (!path || !out) return apex__fail(APEX_ERR_INVALID_ARG, "apex_idx_load: NULL %s", path ? "out" : "path");
  gzFile f = gzopen(path, "rb");
  if (!f) return apex__fail(APEX_ERR_IO, "apex_idx_load: cannot open %s", path);
  uint8_t head[4];
  apex_status st = APEX_OK;
  apex_idx *idx = calloc(1, sizeof *idx);
  if (!idx) {
    gzclose(f);
    return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_idx_load: out of memory");
  }
  if (!read_all(f, head, 4) || head[0] || head[1]) {
    st = apex__fail(APEX_ERR_CORRUPT, "apex_idx_load: %s is not an IDX file (bad magic)", path);
  } else if (head[2] != 0x08) {
    st = apex__fail(APEX_ERR_CORRUPT, "apex_idx_load: %s holds type 0x%02x; apex reads unsigned bytes (0x08)", path, head[2]);
  } else if (head[3] < 1 || head[3] > APEX_MAX_DIMS) {
    st = apex__fail(APEX_ERR_CORRUPT, "apex_idx_load: %s has %d dimensions (1 to %d supported)", path, head[3], APEX_MAX_DIMS);
  } else {
    idx->ndim = head[3];
    idx->numel = 1;
    for (int i = 0; i < idx->ndim && st == APEX_OK; i++) {
      uint8_t b[4];
      if (!read_all(f, b, 4)) st = apex__fail(APEX_ERR_CORRUPT, "apex_idx_load: %s ends inside its header", path);
      idx->shape[i] = (int64_t)((uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3]);
      idx->numel *= (size_t)idx->shape[i];
    }
    if (st == APEX_OK && !(idx->data = malloc(idx->numel ? idx->numel : 1)))
      st = apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_idx_load: cannot allocate %zu bytes for %s", idx->numel, path);
    if (st == APEX_OK && !read_all(f, idx->data, idx->numel))
      st = apex__fail(APEX_ERR_CORRUPT, "apex_idx_load: %s is truncated (its header promises %zu elements)", path, idx->numel);
  }
  gzclose(f);
  if (st != APEX_OK) {
    apex_idx_destroy(idx);
    return st;
  }
  *out = idx;
  return APEX_OK;
}

void apex_idx_destroy(apex_idx *idx) {
  if (!idx) return;
  free(idx->data);
  free(idx);
}

/* The accessors answer NULL (a load that failed) with a value no file has, and a message. */
static int null_idx(const apex_idx *idx, const char *fn) {
  if (idx) return 0;
  apex__fail_null_arg(fn, "idx");
  return 1;
}

int apex_idx_ndim(const apex_idx *idx) { return null_idx(idx, __func__) ? 0 : idx->ndim; }
int64_t apex_idx_dim(const apex_idx *idx, int dim) {
  if (null_idx(idx, __func__)) return -1;
  return dim >= 0 && dim < idx->ndim ? idx->shape[dim] : -1;
}
size_t apex_idx_numel(const apex_idx *idx) { return null_idx(idx, __func__) ? 0 : idx->numel; }
const uint8_t *apex_idx_data(const apex_idx *idx) { return null_idx(idx, __func__) ? NULL : idx->data; }

apex_tensor *apex_idx_to_f32(const apex_idx *idx, size_t first, size_t count, int ndim, const int64_t *shape, float mean, float std) {
  if (!idx) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_idx_to_f32: NULL idx");
  size_t items = (size_t)idx->shape[0], item = items ? idx->numel / items : 0;
  if (first > items || count > items - first)
    return apex__fail_null(APEX_ERR_SHAPE, "apex_idx_to_f32: items [%zu, %zu) of %zu", first, first + count, items);
  int64_t s[APEX_MAX_DIMS];
  int nd = ndim > 0 ? ndim : idx->ndim - 1;
  if (nd + 1 > APEX_MAX_DIMS || (ndim > 0 && !shape)) return apex__fail_null(APEX_ERR_SHAPE, "apex_idx_to_f32: %d item dimensions", ndim);
  s[0] = (int64_t)count;
  size_t want = 1;
  for (int i = 0; i < nd; i++) want *= (size_t)(s[i + 1] = ndim > 0 ? shape[i] : idx->shape[i + 1]);
  if (want != item) return apex__fail_null(APEX_ERR_SHAPE, "apex_idx_to_f32: item shape of %zu elements for items of %zu", want, item);
  apex_tensor *t = apex_tensor_create(APEX_F32, nd + 1, s);
  if (!t) return NULL;
  float *d = apex_tensor_data(t), a = 1.0f / (255.0f * (std != 0.0f ? std : 1.0f)), b = -mean / (std != 0.0f ? std : 1.0f);
  const uint8_t *src = idx->data + first * item;
  for (size_t i = 0; i < count * item; i++) d[i] = (float)src[i] * a + b;
  return t;
}

apex_status apex_idx_labels(const apex_idx *idx, size_t first, size_t count, int64_t *out) {
  if (!idx || (!out && count)) return apex__fail(APEX_ERR_INVALID_ARG, "apex_idx_labels: NULL %s", idx ? "out" : "idx");
  if (idx->ndim != 1) return apex__fail(APEX_ERR_SHAPE, "apex_idx_labels: the file has %d dimensions; labels are 1-d", idx->ndim);
  if (first > idx->numel || count > idx->numel - first)
    return apex__fail(APEX_ERR_SHAPE, "apex_idx_labels: labels [%zu, %zu) of %zu", first, first + count, idx->numel);
  for (size_t i = 0; i < count; i++) out[i] = idx->data[first + i];
  return APEX_OK;
}
