/* embedding.cu: embedding lookup and its gradient on the GPU, with the token ids on the host (where a
 * data loader has them: apex_embedding takes host ids too).
 *
 * The gradient of a row is the sum of dy over the positions holding that id. Atomic adds would sum them
 * in a different order each run; instead the host sorts the positions by id (a stable counting sort,
 * O(n + V)), and one thread per (id, channel) adds its positions' dy in position order: deterministic,
 * and the same order as the CPU op's loop over positions. The sorted lists are copied with the stream's
 * asynchronous copy from pageable memory, which stages the host bytes before it returns, so the host
 * buffers can go at once and nothing waits for the GPU.
 *
 * With the ids already in device memory (the _dev entries, for work that a CUDA graph captures: the host
 * ids' upload and the host sort cannot be replayed), the results are the host-id entries' bit for bit. The
 * positions are sorted by id on the device with CUB's radix sort, which is stable (equal ids keep their
 * position order), and one thread per (row, channel) adds its positions' dy in that order from 0.0f. The
 * sort's grid does not depend on the ids (the number of distinct ids would, so the summing kernel is
 * launched over every sorted slot and the slots that do not start a run of equal ids return at once): one
 * capture serves every batch. */
#include <cuda_runtime.h>
#include <stdlib.h>

#include <cub/device/device_radix_sort.cuh>

extern "C" {
#include "core/internal.h"
#include "backend/cuda/cuda_internal.h"
}
#include "backend/cuda/dtype_dev.cuh"

static apex_status launched(const char *fn) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return apex__fail(APEX_ERR_DEVICE, "%s: CUDA error %s (%s)", fn, cudaGetErrorName(e), cudaGetErrorString(e));
  return APEX_OK;
}

static unsigned grid_for(int64_t total, int threads) {
  int64_t b = (total + threads - 1) / threads;
  return (unsigned)(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

/* y[t, c] = table[ids[t], c]. */
__global__ void embed_fwd(const void *table, apex_dtype tt, const int64_t *ids, void *y, apex_dtype yt, int64_t n, int64_t d) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * d; i += (int64_t)gridDim.x * blockDim.x)
    apex_st(y, yt, i, apex_ld(table, tt, ids[i / d] * d + i % d));
}

/* Bucket b (id tok[b], positions pos[start[b]] .. pos[start[b + 1] - 1] in ascending order):
 * dtable[tok[b], c] = sum of dy[p, c], one thread a channel. */
__global__ void embed_bwd(const void *dy, apex_dtype dt, const int64_t *tok, const int64_t *start, const int64_t *pos,
                          void *dtable, apex_dtype gt, int64_t d) {
  int64_t b = blockIdx.x, c = (int64_t)blockIdx.y * blockDim.x + threadIdx.x; /* buckets on x: up to 2^31 - 1 */
  if (c >= d) return;
  float s = 0.0f;
  for (int64_t k = start[b]; k < start[b + 1]; k++) s += apex_ld(dy, dt, pos[k] * d + c);
  apex_st(dtable, gt, tok[b] * d + c, s);
}

/* y = the rows of table at the device ids d_ids [n]: the lookup of both entries. */
static apex_status lookup(const void *table, apex_dtype tt, int64_t d, const int64_t *d_ids, int64_t n, void *y, apex_dtype yt,
                          const char *fn) {
  if (n * d <= 0) return APEX_OK;
  embed_fwd<<<grid_for(n * d, 256), 256, 0, (cudaStream_t)apex__cuda_stream()>>>(table, tt, d_ids, y, yt, n, d);
  return launched(fn);
}

/* n int64 values from the host into a new device buffer (freed by the caller). */
static apex_status upload(const int64_t *h, size_t n, int64_t **d) {
  apex_status st = apex__cuda_alloc((n ? n : 1) * sizeof(int64_t), 0, (void **)d);
  if (st == APEX_OK && n) st = apex__cuda_memcpy(*d, h, n * sizeof(int64_t), APEX__H2D, 0);
  return st;
}

extern "C" apex_status apex__cuda_embedding_fwd(const void *table, apex_dtype tt, int64_t v, int64_t d, const int64_t *ids,
                                                int64_t n, void *y, apex_dtype yt) {
  (void)v;
  const char *fn = "apex_kernel_embedding_forward";
  int64_t *d_ids = NULL;
  apex_status st = upload(ids, (size_t)n, &d_ids);
  if (st == APEX_OK) st = lookup(table, tt, d, d_ids, n, y, yt, fn);
  apex__cuda_free(d_ids); /* the stream orders its reuse after the lookup */
  return st;
}

extern "C" apex_status apex__cuda_embedding_bwd(const void *dy, apex_dtype dt, const int64_t *ids, int64_t n, int64_t v,
                                                int64_t d, void *dtable, apex_dtype gt) {
  const char *fn = "apex_kernel_embedding_backward";
  /* Stable counting sort of the positions by id: count, prefix sums over the ids that occur, place. */
  int64_t *count = (int64_t *)calloc((size_t)v + 1, sizeof *count);
  int64_t *pos = (int64_t *)malloc(((size_t)n + 1) * sizeof *pos);
  int64_t *tok = (int64_t *)malloc(((size_t)n + 1) * sizeof *tok), *start = (int64_t *)malloc(((size_t)n + 2) * sizeof *start);
  apex_status st = count && pos && tok && start ? APEX_OK : apex__fail(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  int64_t buckets = 0;
  if (st == APEX_OK) {
    for (int64_t t = 0; t < n; t++) count[ids[t]]++;
    int64_t at = 0;
    for (int64_t id = 0; id < v; id++) {
      if (!count[id]) continue;
      tok[buckets] = id;
      start[buckets++] = at;
      int64_t c = count[id];
      count[id] = at; /* from here on: where id's next position goes */
      at += c;
    }
    start[buckets] = at;
    for (int64_t t = 0; t < n; t++) pos[count[ids[t]]++] = t;
  }
  int64_t *d_pos = NULL, *d_tok = NULL, *d_start = NULL;
  if (st == APEX_OK) st = upload(pos, (size_t)n, &d_pos);
  if (st == APEX_OK) st = upload(tok, (size_t)buckets, &d_tok);
  if (st == APEX_OK) st = upload(start, (size_t)buckets + 1, &d_start);
  free(count);
  free(pos);
  free(tok);
  free(start);
  cudaStream_t stream = (cudaStream_t)apex__cuda_stream();
  /* Rows of ids that never occur get zero; the others are written whole by the kernel. */
  if (st == APEX_OK && v * d > 0 && cudaMemsetAsync(dtable, 0, (size_t)(v * d) * apex_dtype_size(gt), stream) != cudaSuccess)
    st = launched(fn);
  if (st == APEX_OK && buckets > 0 && d > 0) {
    dim3 grid((unsigned)buckets, (unsigned)((d + 127) / 128));
    embed_bwd<<<grid, 128, 0, stream>>>(dy, dt, d_tok, d_start, d_pos, dtable, gt, d);
    st = launched(fn);
  }
  apex__cuda_free(d_pos);
  apex__cuda_free(d_tok);
  apex__cuda_free(d_start);
  return st;
}

/* ---- ids on the device ---------------------------------------------------------------------------------- */

/* The sort's input: each id as an unsigned key (ids are in [0, v)), its position as the value. */
__global__ void embed_keys(const int64_t *ids, unsigned *keys, int *pos, int64_t n) {
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < n; t += (int64_t)gridDim.x * blockDim.x) {
    keys[t] = (unsigned)ids[t];
    pos[t] = (int)t;
  }
}

/* Sorted slot k (blockIdx.x) that starts a run of equal ids: dtable[id, c] = the sum of dy[p, c] over the
 * run's positions p, in position order (the stable sort kept it); one thread a channel. */
__global__ void embed_bwd_dev(const void *dy, apex_dtype dt, const unsigned *keys, const int *pos, int64_t n, void *dtable,
                              apex_dtype gt, int64_t d) {
  const int64_t k = blockIdx.x, c = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
  const unsigned id = keys[k];
  if (c >= d || (k > 0 && keys[k - 1] == id)) return;
  float s = 0.0f;
  for (int64_t j = k; j < n && keys[j] == id; j++) s += apex_ld(dy, dt, (int64_t)pos[j] * d + c);
  apex_st(dtable, gt, (int64_t)id * d + c, s);
}

/* The scratch: keys and positions in and out of the sort, then CUB's own temporary storage. */
static size_t align256(size_t b) { return (b + 255) / 256 * 256; }

static int key_bits(int64_t v) {
  int bits = 1;
  while (bits < 32 && ((int64_t)1 << bits) < v) bits++;
  return bits;
}

static size_t cub_bytes(int64_t n, int64_t v) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(NULL, bytes, (const unsigned *)NULL, (unsigned *)NULL, (const int *)NULL, (int *)NULL, (int)n,
                                  0, key_bits(v));
  return bytes;
}

extern "C" size_t apex__cuda_embedding_bwd_scratch(int64_t n, int64_t v) {
  return 4 * align256((size_t)(n > 0 ? n : 1) * 4) + align256(cub_bytes(n, v));
}

extern "C" apex_status apex__cuda_embedding_fwd_dev(const void *table, apex_dtype tt, int64_t d, const int64_t *d_ids, int64_t n,
                                                    void *y, apex_dtype yt) {
  return lookup(table, tt, d, d_ids, n, y, yt, "embedding lookup (device ids)");
}

extern "C" apex_status apex__cuda_embedding_bwd_dev(const void *dy, apex_dtype dt, const int64_t *d_ids, int64_t n, int64_t v,
                                                    int64_t d, void *dtable, apex_dtype gt, void *d_scratch,
                                                    size_t scratch_bytes) {
  const char *fn = "embedding backward (device ids)";
  if (n > 0x7fffffff || v > 0xffffffffLL)
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: %lld positions over %lld rows: at most 2^31 - 1 positions and 2^32 rows", fn,
                      (long long)n, (long long)v);
  const size_t need = apex__cuda_embedding_bwd_scratch(n, v);
  if (scratch_bytes < need)
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: %zu bytes of scratch, %zu needed", fn, scratch_bytes, need);
  cudaStream_t stream = (cudaStream_t)apex__cuda_stream();
  /* Rows of ids that never occur get zero; the others are written whole by the kernel. */
  if (v * d > 0 && cudaMemsetAsync(dtable, 0, (size_t)(v * d) * apex_dtype_size(gt), stream) != cudaSuccess) return launched(fn);
  if (n <= 0 || d <= 0) return APEX_OK;
  const size_t part = align256((size_t)n * 4);
  char *s = (char *)d_scratch;
  unsigned *keys_in = (unsigned *)s, *keys = (unsigned *)(s + part);
  int *pos_in = (int *)(s + 2 * part), *pos = (int *)(s + 3 * part);
  size_t temp = scratch_bytes - 4 * part;
  embed_keys<<<grid_for(n, 256), 256, 0, stream>>>(d_ids, keys_in, pos_in, n);
  apex_status st = launched(fn);
  if (st != APEX_OK) return st;
  cudaError_t e = cub::DeviceRadixSort::SortPairs(s + 4 * part, temp, keys_in, keys, pos_in, pos, (int)n, 0, key_bits(v), stream);
  if (e != cudaSuccess) return launched(fn);
  dim3 grid((unsigned)n, (unsigned)((d + 127) / 128));
  embed_bwd_dev<<<grid, 128, 0, stream>>>(dy, dt, keys, pos, n, dtable, gt, d);
  return launched(fn);
}
