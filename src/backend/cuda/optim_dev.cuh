/* optim_dev.cuh: what the optimizer kernels (optim.cu, lamb.cu, novograd.cu) share: lists of one value
 * per parameter (list 6, the step counts), and the launch that advances the counts after an update. */
#ifndef APEX_CUDA_OPTIM_DEV_CUH
#define APEX_CUDA_OPTIM_DEV_CUH

#include <stdlib.h>

#include "backend/cuda/mt_apply.cuh"

/* After the update: every entry's step count advances by one, unless the step was skipped; empty tensors'
 * too, as on the CPU. One thread per entry, COUNT_BATCH entries a launch, the entries' indexes in the
 * kernel's parameters. (It is a launch of its own because every block of the update reads the counts.) */
#define COUNT_BATCH 512
struct CountBatch {
  int64_t *d_step;
  const int *d_skip;
  int n;
  int idx[COUNT_BATCH];
};

static __global__ void count_kernel(const __grid_constant__ CountBatch b) {
  const int i = (int)threadIdx.x;
  if (i < b.n && !(b.d_skip && *b.d_skip)) ++b.d_step[b.idx[i]];
}

static cudaError_t advance_counts(const apex__cuda_step *s) {
  CountBatch b;
  b.d_step = s->d_step;
  b.d_skip = s->d_skip;
  for (int j0 = 0; j0 < s->n; j0 += COUNT_BATCH) {
    b.n = s->n - j0 < COUNT_BATCH ? s->n - j0 : COUNT_BATCH;
    for (int j = 0; j < b.n; j++) b.idx[j] = s->idx[j0 + j];
    count_kernel<<<1, (b.n + 31) / 32 * 32, 0, (cudaStream_t)apex__cuda_stream()>>>(b);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

/* One value per parameter as a list: entry i points at base + idx[i] * bytes_each (the group's step
 * counts in d_step, NovoGrad's per-tensor scalars), with the element counts of s->p so that it walks
 * with the other lists; dtypes ignored. Its ptr array is malloc'd: free it. 0 when out of memory. */
static int per_param_list(const apex__cuda_step *s, void *base, size_t bytes_each, apex__cuda_list *out) {
  *out = s->p;
  void **ptr = (void **)malloc(sizeof(void *) * (size_t)(s->n ? s->n : 1));
  if (!ptr) return 0;
  for (int i = 0; i < s->n; i++) ptr[i] = (char *)base + (size_t)s->idx[i] * bytes_each;
  out->ptr = ptr;
  return 1;
}

/* The step counts as list 6 expects them. */
static int step_count_list(const apex__cuda_step *s, apex__cuda_list *out) {
  return per_param_list(s, s->d_step, sizeof(int64_t), out);
}

#endif
