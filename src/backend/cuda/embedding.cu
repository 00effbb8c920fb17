/* embedding.cu: embedding lookup and its gradient on the GPU, with the token ids on the host (where a
 * data loader has them: apex_embedding takes host ids too).
 *
 * The gradient of a row is the sum of dy over the positions holding that id. Atomic adds would sum them
 * in a different order each run; instead the host sorts the positions by id (a stable counting sort,
 * O(n + V)), and one thread per (id, channel) adds its positions' dy in position order: deterministic,
 * and the same order as the CPU op's loop over positions. The sorted lists are copied with the stream's
 * asynchronous copy from pageable memory, which stages the host bytes before it returns, so the host
 * buffers can go at once and nothing waits for the GPU. */
#include <cuda_runtime.h>
#include <stdlib.h>

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
  if (st == APEX_OK && n * d > 0) {
    embed_fwd<<<grid_for(n * d, 256), 256, 0, (cudaStream_t)apex__cuda_stream()>>>(table, tt, d_ids, y, yt, n, d);
    st = launched(fn);
  }
  apex__cuda_free(d_ids);
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
