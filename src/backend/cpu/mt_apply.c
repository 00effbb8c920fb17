/* mt_apply.c: the CPU multi-tensor applier (apex_multi_tensor_apply). Validates a launch, cuts its tensors into chunks, shares the
 * chunks among threads, widens each tile to f32 for the kernel and narrows written tiles back. */
#include <stdlib.h>

#include "apex/mt_apply.h"
#include "core/internal.h"
#include "core/tensor_internal.h"

size_t apex_mt_chunk_count(size_t chunk_size, apex_tensor *const *tensors, int n, size_t *chunk_start) {
  if (chunk_size == 0) chunk_size = APEX_MT_DEFAULT_CHUNK;
  if (n < 0 || (n > 0 && !tensors)) {
    apex__fail(APEX_ERR_INVALID_ARG, "apex_mt_chunk_count: %s; pass n >= 0 tensors", n < 0 ? "negative n" : "NULL tensor list");
    return 0;
  }
  for (int i = 0; i < n; i++)
    if (!tensors[i]) {
      apex__fail(APEX_ERR_INVALID_ARG, "apex_mt_chunk_count: tensor %d is NULL", i);
      return 0;
    }
  size_t total = 0;
  for (int i = 0; i < n; i++) {
    if (chunk_start) chunk_start[i] = total;
    total += (tensors[i]->numel + chunk_size - 1) / chunk_size;
  }
  if (chunk_start) chunk_start[n] = total;
  return total;
}

static apex_status check_launch(const apex_mt_launch *L) {
  const char *name = L->name ? L->name : "apex_multi_tensor_apply";
  if (!L->kernel) return apex__fail(APEX_ERR_INVALID_ARG, "%s: no kernel", name);
  if (L->nlists < 1 || L->nlists > APEX_MT_MAX_LISTS)
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: %d tensor lists; a launch takes 1 to %d", name, L->nlists, APEX_MT_MAX_LISTS);
  if (L->ntensors < 0) return apex__fail(APEX_ERR_INVALID_ARG, "%s: negative tensor count %d", name, L->ntensors);
  for (int l = 0; l < L->nlists; l++) {
    if (L->ntensors > 0 && !L->lists[l]) return apex__fail(APEX_ERR_INVALID_ARG, "%s: tensor list %d is NULL", name, l);
    for (int i = 0; i < L->ntensors; i++) {
      const apex_tensor *t = L->lists[l][i];
      if (!t) return apex__fail(APEX_ERR_INVALID_ARG, "%s: list %d, tensor %d is NULL", name, l, i);
      if (t->device != APEX_DEVICE_CPU)
        return apex__fail(APEX_ERR_DEVICE, "%s: list %d, tensor %d is not on the CPU", name, l, i);
      if (apex_tensor_released(t))
        return apex__fail(APEX_ERR_STATE, "%s: list %d, tensor %d has no memory: it is a gradient that ZeRO stage 2 released after "
                          "its reduce-scatter (it reads as zeros until a backward adds to it; apex_tensor_fill makes it again)", name, l, i);
      if (t->numel != L->lists[0][i]->numel)
        return apex__fail(APEX_ERR_SHAPE, "%s: tensor %d has %zu elements in list 0 but %zu in list %d", name, i,
                          L->lists[0][i]->numel, t->numel, l);
    }
  }
  return APEX_OK;
}

/* Finds the tensor that owns chunk c: the t with chunk_start[t] <= c < chunk_start[t + 1]. */
static int owner_of(const size_t *chunk_start, int n, size_t c) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    int mid = lo + (hi - lo + 1) / 2;
    if (chunk_start[mid] <= c) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

static int run_chunk(const apex_mt_launch *L, const size_t *chunk_start, size_t cs, size_t c) {
  float buf[APEX_MT_MAX_LISTS][APEX_MT_TILE];
  int t = owner_of(chunk_start, L->ntensors, c);
  size_t numel = L->lists[0][t]->numel;
  size_t begin = (c - chunk_start[t]) * cs;
  size_t end = begin + cs < numel ? begin + cs : numel;
  int bad = 0;
  for (size_t off = begin; off < end; off += APEX_MT_TILE) {
    apex_mt_tile tile = {.n = end - off < APEX_MT_TILE ? end - off : APEX_MT_TILE, .tensor = t, .offset = off, .chunk = c};
    for (int l = 0; l < L->nlists; l++) {
      const apex_tensor *x = L->lists[l][t];
      char *at = (char *)apex_tensor_data(x) + off * apex_dtype_size(x->dtype);
      if (x->dtype == APEX_F32 || (L->raw >> l & 1u)) {
        tile.p[l] = (float *)at;
      } else {
        apex__convert_range(buf[l], APEX_F32, at, x->dtype, tile.n);
        tile.p[l] = buf[l];
      }
    }
    int nonfinite = 0;
    L->kernel(L->ctx, &tile, &nonfinite);
    bad |= nonfinite;
    for (int l = 0; l < L->nlists; l++) {
      const apex_tensor *x = L->lists[l][t];
      if ((L->written >> l & 1u) && !(L->raw >> l & 1u) && x->dtype != APEX_F32)
        apex__convert_range((char *)apex_tensor_data(x) + off * apex_dtype_size(x->dtype), x->dtype, buf[l], APEX_F32, tile.n);
    }
  }
  return bad;
}

apex_status apex_multi_tensor_apply(const apex_mt_launch *L, int *overflow) {
  if (!L) return apex__fail(APEX_ERR_INVALID_ARG, "apex_multi_tensor_apply: NULL launch");
  apex_status st = check_launch(L);
  if (st != APEX_OK || L->ntensors == 0) return st;
  size_t cs = L->chunk_size ? L->chunk_size : APEX_MT_DEFAULT_CHUNK;
  size_t *chunk_start = malloc(((size_t)L->ntensors + 1) * sizeof *chunk_start);
  if (!chunk_start) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_multi_tensor_apply: out of memory");
  long long total = (long long)apex_mt_chunk_count(cs, L->lists[0], L->ntensors, chunk_start);
  apex_simd_active(); /* resolve the SIMD path before the threads read it */
  int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (total > 1)
  for (long long c = 0; c < total; c++) bad |= run_chunk(L, chunk_start, cs, (size_t)c);
  free(chunk_start);
  if (bad && overflow) *overflow = 1;
  return APEX_OK;
}
