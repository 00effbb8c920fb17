/* optim_dev.cuh: what the optimizer kernels (optim.cu, lamb.cu) share: list 6 of a step, the step
 * counts, and the op that advances them after an update. */
#ifndef APEX_CUDA_OPTIM_DEV_CUH
#define APEX_CUDA_OPTIM_DEV_CUH

#include <stdlib.h>

#include "cuda/mt_apply.cuh"

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

/* The step counts of s's parameters as a list (pointers into s->d_step, dtype ignored), with the
 * element counts of s->p so that it walks with the other lists. Its ptr array is malloc'd: free it.
 * 0 when out of memory. */
static int step_count_list(const apex__cuda_step *s, apex__cuda_list *out) {
  *out = s->p;
  void **ptr = (void **)malloc(sizeof(void *) * (size_t)(s->n ? s->n : 1));
  if (!ptr) return 0;
  for (int i = 0; i < s->n; i++) ptr[i] = s->d_step + s->idx[i];
  out->ptr = ptr;
  return 1;
}

#endif
