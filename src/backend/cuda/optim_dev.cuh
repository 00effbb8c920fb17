/* optim_dev.cuh: what the optimizer kernels (optim.cu, lamb.cu, novograd.cu) share: lists of one value
 * per parameter (list 6, the step counts), and the op that advances the counts after an update. */
#ifndef APEX_CUDA_OPTIM_DEV_CUH
#define APEX_CUDA_OPTIM_DEV_CUH

#include <stdlib.h>

#include "backend/cuda/mt_apply.cuh"

/* After the update: the first chunk of each tensor advances its step count, unless the step was skipped. */
struct CountOp {
  const int *d_skip;
  __device__ bool begin(const MtTable &t, int k, int64_t start, float *) const {
    if (start == 0 && !(d_skip && *d_skip)) ++*(int64_t *)t.ptr[6][k];
    return false;
  }
  __device__ void elem(const MtTable &, int, int64_t, bool &, const float *) const {}
  __device__ void end_chunk(const MtTable &, int, int, bool) const {}
};

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
