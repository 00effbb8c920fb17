/* mt_apply.cuh: Apex's multi_tensor_applier for the GPU. One launch covers up to MT_TENSORS tensors
 * of up to MT_LISTS lists; the tensor table travels in the kernel's parameters (no copy,
 * no synchronisation). Each tensor is cut into MT_CHUNK-element chunks; a grid of as many blocks as the
 * device holds at once walks all chunks of the launch, so that 20 big tensors and 2,000 small
 * ones both keep the GPU busy without a long tail. An Op supplies:
 *     bool begin(const MtTable &t, int k, int64_t start, float *coef)
 *         run by one thread per chunk [start, start + MT_CHUNK) of tensor k: false skips the chunk;
 *         it may fill coef[0..MT_COEFS) with per-tensor values that every thread then reads
 *     void elem(const MtTable &t, int k, int64_t i, bool &bad, const float *coef)   element i
 *     void end_chunk(const MtTable &t, int k, int chunk_id, bool bad)   per thread, after its elements
 * and may read per-tensor data through t.id[k], the tensor's index among all tensors of the call. */
#ifndef APEX_CUDA_MT_APPLY_CUH
#define APEX_CUDA_MT_APPLY_CUH

#include <cuda_runtime.h>

#include "apex/mt_apply.h"
#include "backend/cuda/dtype_dev.cuh"

#define MT_LISTS 7
#define MT_COEFS 4
#define MT_TENSORS 64
#define MT_CHUNK 16384
#define MT_THREADS 512

struct MtTable {
  void *ptr[MT_LISTS][MT_TENSORS];
  int64_t numel[MT_TENSORS];
  int cstart[MT_TENSORS + 1]; /* first chunk of each tensor in this launch; cstart[n] = all chunks */
  int id[MT_TENSORS];
  int first_chunk_id;         /* chunks of earlier launches of the same call (for per-chunk outputs) */
  int n;
  apex_dtype dtype[MT_LISTS][MT_TENSORS];
};

template <class Op>
__global__ void __launch_bounds__(MT_THREADS) mt_kernel(const __grid_constant__ MtTable t, Op op) {
  __shared__ int s_go;
  __shared__ float s_coef[MT_COEFS];
  for (int c = blockIdx.x; c < t.cstart[t.n]; c += gridDim.x) {
    int k = 0;
    while (t.cstart[k + 1] <= c) k++;
    int64_t start = (int64_t)(c - t.cstart[k]) * MT_CHUNK;
    int64_t end = start + MT_CHUNK < t.numel[k] ? start + MT_CHUNK : t.numel[k];
    __syncthreads(); /* s_go of the previous chunk is read by everyone */
    if (threadIdx.x == 0) s_go = op.begin(t, k, start, s_coef);
    __syncthreads();
    if (!s_go) continue;
    bool bad = false;
#pragma unroll 4
    for (int64_t i = start + threadIdx.x; i < end; i += MT_THREADS) op.elem(t, k, i, bad, s_coef);
    op.end_chunk(t, k, t.first_chunk_id + c, bad);
  }
}

/* Blocks of `kernel` (`threads` each) that the current device holds at once. The walks launch exactly this
 * many (or fewer, for less work): one block more than fits would wait for a whole block's share, doubling
 * the time of the tail. Callers cache it per kernel in a function-local static. */
static int mt_resident(const void *kernel, int threads) {
  int dev = 0, sms = 0, per = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kernel, threads, 0) != cudaSuccess)
    cudaGetLastError(); /* ours, not the launch's: the launch reports its own */
  return (sms > 0 ? sms : 80) * (per > 0 ? per : 1);
}

/* Cuts lists[0..nlists) (each n tensors; element counts taken from list 0, empty tensors left out) into
 * tables of at most MT_TENSORS tensors, and calls launch(table, chunks) for each, in order. */
template <class Launch>
static cudaError_t mt_tables(int nlists, const apex__cuda_list *const *lists, Launch launch) {
  MtTable t;
  int n = lists[0]->n, chunk_id = 0;
  t.n = 0;
  t.cstart[0] = 0;
  for (int i = 0; i < n; i++) {
    int64_t numel = (int64_t)lists[0]->numel[i];
    if (numel == 0) continue;
    int k = t.n;
    for (int l = 0; l < nlists; l++) {
      t.ptr[l][k] = lists[l]->ptr[i];
      t.dtype[l][k] = lists[l]->dtype[i];
    }
    t.numel[k] = numel;
    t.id[k] = i;
    t.cstart[k + 1] = t.cstart[k] + (int)((numel + MT_CHUNK - 1) / MT_CHUNK);
    t.n++;
    if (t.n == MT_TENSORS || i == n - 1) {
      t.first_chunk_id = chunk_id;
      int chunks = t.cstart[t.n];
      cudaError_t e = launch(t, chunks);
      if (e != cudaSuccess) return e;
      chunk_id += chunks;
      t.n = 0;
    }
  }
  if (t.n > 0) { /* the last tensors were empty ones after a non-empty partial table */
    t.first_chunk_id = chunk_id;
    return launch(t, t.cstart[t.n]);
  }
  return cudaSuccess;
}

/* Launches kernel, a walk over one table (mt_kernel), for each table of the lists, with as many blocks as
 * there are chunks up to cap (the caller's cached mt_resident). */
template <class Op>
static cudaError_t mt_launch(void (*kernel)(MtTable, Op), int cap, int nlists, const apex__cuda_list *const *lists,
                             const Op &op) {
  cudaStream_t stream = (cudaStream_t)apex__cuda_stream();
  return mt_tables(nlists, lists, [&](const MtTable &t, int chunks) {
    kernel<<<chunks < cap ? chunks : cap, MT_THREADS, 0, stream>>>(t, op);
    return cudaGetLastError();
  });
}

/* Runs op over lists[0..nlists) with mt_kernel (chunk ids for per-chunk outputs: mt_chunks). */
template <class Op>
static cudaError_t mt_apply(int nlists, const apex__cuda_list *const *lists, Op op) {
  static const int cap = mt_resident((const void *)mt_kernel<Op>, MT_THREADS);
  return mt_launch(mt_kernel<Op>, cap, nlists, lists, op);
}

/* Chunks a call over these element counts has, and each tensor's first chunk id (n + 1 entries). */
static int mt_chunks(const apex__cuda_list *l, int *first) {
  int c = 0;
  for (int i = 0; i < l->n; i++) {
    if (first) first[i] = c;
    c += (int)(((int64_t)l->numel[i] + MT_CHUNK - 1) / MT_CHUNK);
  }
  if (first) first[l->n] = c;
  return c;
}

/* Ops without per-chunk output end chunks by raising the flag. */
struct MtFlagEnd {
  int *flag;
  __device__ void end_chunk(const MtTable &, int, int, bool bad) const {
    if (bad && flag) *flag = 1;
  }
};

#endif
