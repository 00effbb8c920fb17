/* mt_cuda.c: multi_tensor.h's kernels on GPU lists, through the CUDA backend (src/cuda/multi_tensor.cu).
 * Every tensor of every list must be on the GPU (APEX_ERR_DEVICE naming the first that is not) with
 * matching element counts. The overflow flag is gathered in a device int and copied back once. */
#include <stdlib.h>

#include "core/internal.h"
#include "cuda/cuda_internal.h"
#include "multi_tensor/mt_cuda.h"

int apex__mt_on_cuda(apex_tensor *const *t, int n) {
  return t && n > 0 && t[0] && apex_tensor_device(t[0]) == APEX_DEVICE_CUDA;
}

/* Builds up to three lists of n device tensors with equal counts; lists[k] NULL is skipped. */
static apex_status make_lists(const char *fn, apex_tensor *const *const *t, int nl, int n, apex__cuda_list *l) {
  static const char *const names[3] = {"list 0 tensor", "list 1 tensor", "list 2 tensor"};
  apex_status st = APEX_OK;
  for (int k = 0; k < nl; k++) l[k] = (apex__cuda_list){0};
  for (int k = 0; st == APEX_OK && k < nl; k++)
    if (t[k]) st = apex__cuda_list_make(fn, names[k], t[k], n, &l[k]);
  for (int k = 1; st == APEX_OK && k < nl; k++)
    for (int i = 0; t[k] && i < n; i++)
      if (l[k].numel[i] != l[0].numel[i]) {
        st = apex__fail(APEX_ERR_SHAPE, "%s: tensor %d has %zu elements in list 0 but %zu in list %d", fn, i,
                        l[0].numel[i], l[k].numel[i], k);
        break;
      }
  if (st != APEX_OK)
    for (int k = 0; k < nl; k++) apex__cuda_list_free(&l[k]);
  return st;
}

/* A zeroed device int for the flag, and the copy back into *overflow (if set) at the end. */
static apex_status flag_back(apex_status st, int *d_flag, int *overflow) {
  int h = 0;
  if (st == APEX_OK && overflow) st = apex__cuda_memcpy(&h, d_flag, sizeof h, APEX__D2H, 1);
  if (st == APEX_OK && h && overflow) *overflow = 1;
  apex__cuda_free(d_flag);
  return st;
}

apex_status apex__mt_cuda_scale(int *overflow, apex_tensor *const *in, apex_tensor *const *out, int n, float scale) {
  apex__cuda_list l[2];
  apex_tensor *const *t[2] = {in, out};
  if (!out) return apex__fail(APEX_ERR_INVALID_ARG, "apex_mt_scale: NULL output list");
  apex_status st = make_lists("apex_mt_scale", t, 2, n, l);
  if (st != APEX_OK) return st;
  int *d_flag = NULL;
  st = apex__cuda_alloc(sizeof(int), 1, (void **)&d_flag);
  if (st == APEX_OK) st = apex__cuda_mt_scale(&l[0], &l[1], scale, NULL, 0, d_flag);
  st = flag_back(st, d_flag, overflow);
  apex__cuda_list_free(&l[0]);
  apex__cuda_list_free(&l[1]);
  return st;
}

apex_status apex__mt_cuda_axpby(int *overflow, apex_tensor *const *x, apex_tensor *const *y, apex_tensor *const *out,
                                int n, float a, float b, int arg_to_check) {
  apex__cuda_list l[3];
  apex_tensor *const *t[3] = {x, y, out};
  if (!y || !out) return apex__fail(APEX_ERR_INVALID_ARG, "apex_mt_axpby: NULL list");
  apex_status st = make_lists("apex_mt_axpby", t, 3, n, l);
  if (st != APEX_OK) return st;
  int *d_flag = NULL;
  st = apex__cuda_alloc(sizeof(int), 1, (void **)&d_flag);
  if (st == APEX_OK) st = apex__cuda_mt_axpby(&l[0], &l[1], &l[2], a, b, arg_to_check, d_flag);
  st = flag_back(st, d_flag, overflow);
  for (int k = 0; k < 3; k++) apex__cuda_list_free(&l[k]);
  return st;
}

/* The scale kernel without an output list only reads and checks: one pass, nothing written. */
apex_status apex__mt_cuda_check_finite(int *found_inf, apex_tensor *const *x, int n) {
  apex__cuda_list l;
  apex_tensor *const *t[1] = {x};
  apex_status st = make_lists("apex_mt_check_finite", t, 1, n, &l);
  if (st != APEX_OK) return st;
  int *d_flag = NULL;
  st = apex__cuda_alloc(sizeof(int), 1, (void **)&d_flag);
  if (st == APEX_OK) st = apex__cuda_mt_scale(&l, NULL, 1.0f, NULL, 0, d_flag);
  st = flag_back(st, d_flag, found_inf);
  apex__cuda_list_free(&l);
  return st;
}

apex_status apex__mt_cuda_l2norm(const char *fn, int *overflow, apex_tensor *const *x, int n, float inv_scale,
                                 float *global_norm, float *per_tensor) {
  apex__cuda_list l;
  apex_tensor *const *t[1] = {x};
  apex_status st = make_lists(fn, t, 1, n, &l);
  if (st != APEX_OK) return st;
  float *d_out = NULL; /* [0] the global norm, [1..n] the per-tensor ones */
  int *d_flag = NULL;
  st = apex__cuda_alloc(sizeof(float) * (size_t)(n + 1), 1, (void **)&d_out);
  if (st == APEX_OK) st = apex__cuda_alloc(sizeof(int), 1, (void **)&d_flag);
  if (st == APEX_OK) st = apex__cuda_mt_l2norm(&l, inv_scale, d_out, d_out + 1, d_flag);
  float *h = st == APEX_OK ? malloc(sizeof(float) * (size_t)(n + 1)) : NULL;
  if (st == APEX_OK && !h) st = apex__fail(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  if (st == APEX_OK) st = apex__cuda_memcpy(h, d_out, sizeof(float) * (size_t)(n + 1), APEX__D2H, 1);
  if (st == APEX_OK) {
    if (global_norm) *global_norm = h[0];
    for (int i = 0; per_tensor && i < n; i++) per_tensor[i] = h[1 + i];
  }
  free(h);
  st = flag_back(st, d_flag, overflow);
  apex__cuda_free(d_out);
  apex__cuda_list_free(&l);
  return st;
}
