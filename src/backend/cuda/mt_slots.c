/* mt_slots.c: the CUDA backend's multi-tensor slots (backend/args_mt.h) over the kernels of
 * multi_tensor.cu. Every tensor of every list must be on the GPU (APEX_ERR_DEVICE naming the first that
 * is not) with matching element counts. A host overflow flag is gathered in a device int and copied back
 * once; a device flag (dev_found_inf) is raised in place, without waiting. */
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/cuda_backend.h"
#include "core/internal.h"

/* A CUDA tensor, or APEX_ERR_INVALID_ARG / APEX_ERR_DEVICE naming it. */
static apex_status need(const char *fn, const char *what, const apex_tensor *t) {
  if (!t) return apex__fail(APEX_ERR_INVALID_ARG, "%s: %s is NULL", fn, what);
  if (apex_tensor_device(t) != APEX_DEVICE_CUDA)
    return apex__fail(APEX_ERR_DEVICE, "%s: %s is on the CPU; this kernel takes CUDA tensors (apex_tensor_create_on)",
                      fn, what);
  return APEX_OK;
}

apex_status apex__cuda_list_make(const char *fn, const char *what, apex_tensor *const *t, int n, apex__cuda_list *l) {
  *l = (apex__cuda_list){0};
  if (n < 0 || (n > 0 && !t)) return apex__fail(APEX_ERR_INVALID_ARG, "%s: bad %s list (%d tensors)", fn, what, n);
  char *mem = malloc((size_t)(n ? n : 1) * (sizeof(void *) + sizeof(apex_dtype) + sizeof(size_t)));
  if (!mem) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  l->n = n;
  l->ptr = (void **)mem;
  l->numel = (size_t *)(mem + (size_t)(n ? n : 1) * sizeof(void *));
  l->dtype = (apex_dtype *)(mem + (size_t)(n ? n : 1) * (sizeof(void *) + sizeof(size_t)));
  for (int i = 0; i < n; i++) {
    char name[64];
    snprintf(name, sizeof name, "%s %d", what, i);
    apex_status st = need(fn, name, t[i]);
    if (st != APEX_OK) {
      free(mem);
      *l = (apex__cuda_list){0};
      return st;
    }
    l->ptr[i] = apex_tensor_data(t[i]);
    l->numel[i] = apex_tensor_numel(t[i]);
    l->dtype[i] = apex_tensor_dtype(t[i]);
  }
  return APEX_OK;
}

void apex__cuda_list_free(apex__cuda_list *l) { free(l->ptr); }

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

apex_status apex__cuda_slot_mt_scale(const apex_mt_scale_args *a) {
  apex__cuda_list l[2];
  apex_tensor *const *t[2] = {a->in, a->out};
  apex_status st = make_lists(a->fn, t, 2, a->n, l);
  if (st != APEX_OK) return st;
  int *d_flag = a->dev_found_inf, *d_tmp = NULL;
  if (!d_flag && a->overflow) {
    st = apex__cuda_alloc(sizeof(int), 1, (void **)&d_tmp);
    d_flag = d_tmp;
  }
  if (st == APEX_OK) st = apex__cuda_mt_scale(&l[0], a->out ? &l[1] : NULL, a->scale, a->dev_scale, a->dev_inverse, d_flag);
  if (d_tmp) {
    st = flag_back(st, d_tmp, a->overflow);
  } else if (a->overflow) { /* both flags: the host one reads the device one, earlier overflows included */
    int h = 0;
    if (st == APEX_OK) st = apex__cuda_memcpy(&h, d_flag, sizeof h, APEX__D2H, 1);
    if (st == APEX_OK && h) *a->overflow = 1;
  }
  apex__cuda_list_free(&l[0]);
  apex__cuda_list_free(&l[1]);
  return st;
}

apex_status apex__cuda_slot_mt_axpby(const apex_mt_axpby_args *a) {
  apex__cuda_list l[3];
  apex_tensor *const *t[3] = {a->x, a->y, a->out};
  apex_status st = make_lists(a->fn, t, 3, a->n, l);
  if (st != APEX_OK) return st;
  int *d_flag = NULL;
  st = apex__cuda_alloc(sizeof(int), 1, (void **)&d_flag);
  if (st == APEX_OK) st = apex__cuda_mt_axpby(&l[0], &l[1], &l[2], a->a, a->b, a->arg_to_check, d_flag);
  st = flag_back(st, d_flag, a->overflow);
  for (int k = 0; k < 3; k++) apex__cuda_list_free(&l[k]);
  return st;
}

apex_status apex__cuda_slot_mt_l2norm(const apex_mt_l2norm_args *a) {
  const char *fn = a->fn;
  int n = a->n;
  apex__cuda_list l;
  apex_tensor *const *t[1] = {a->x};
  apex_status st = make_lists(fn, t, 1, n, &l);
  if (st != APEX_OK) return st;
  /* Only the device norm asked for: written in place, nothing waits. */
  if (!a->global_norm && !a->per_tensor && !a->overflow && !a->per_chunk) {
    st = apex__cuda_mt_l2norm_chunked(&l, a->chunk_size, a->inv_scale, a->dev_global_norm, NULL, NULL, NULL);
    apex__cuda_list_free(&l);
    return st;
  }
  float *d_out = NULL; /* [0] the global norm, [1..n] the per-tensor ones */
  int *d_flag = NULL;
  st = apex__cuda_alloc(sizeof(float) * (size_t)(n + 1), 1, (void **)&d_out);
  if (st == APEX_OK) st = apex__cuda_alloc(sizeof(int), 1, (void **)&d_flag);
  if (st == APEX_OK) st = apex__cuda_mt_l2norm_chunked(&l, a->chunk_size, a->inv_scale, d_out, d_out + 1, d_flag, a->per_chunk);
  if (st == APEX_OK && a->dev_global_norm) st = apex__cuda_memcpy(a->dev_global_norm, d_out, sizeof(float), APEX__D2D, 0);
  float *h = st == APEX_OK ? malloc(sizeof(float) * (size_t)(n + 1)) : NULL;
  if (st == APEX_OK && !h) st = apex__fail(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  if (st == APEX_OK) st = apex__cuda_memcpy(h, d_out, sizeof(float) * (size_t)(n + 1), APEX__D2H, 1);
  if (st == APEX_OK) {
    if (a->global_norm) *a->global_norm = h[0];
    for (int i = 0; a->per_tensor && i < n; i++) a->per_tensor[i] = h[1 + i];
  }
  free(h);
  st = flag_back(st, d_flag, a->overflow);
  apex__cuda_free(d_out);
  apex__cuda_list_free(&l);
  return st;
}

/* The fused flush + unscale of amp's bf16 leaves (args_mt.h). The host flags it reports (overflow and
 * each tensor's nonzero) come back in one copy of n + 1 device ints, which waits for the device. */
apex_status apex__cuda_slot_mt_flush_unscale(const apex_mt_flush_unscale_args *a) {
  const char *fn = a->fn;
  int n = a->n;
  if (n < 0 || (n > 0 && (!a->grad || !a->sum || !a->out)))
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: %s", fn, n < 0 ? "negative tensor count" : "NULL tensor list");
  for (int i = 0; i < n; i++) {
    if (!a->grad[i] || !a->sum[i] || !a->out[i]) return apex__fail(APEX_ERR_INVALID_ARG, "%s: tensor %d of a list is NULL", fn, i);
    if (apex_tensor_dtype(a->grad[i]) != APEX_BF16 || apex_tensor_dtype(a->sum[i]) != APEX_F32 || apex_tensor_dtype(a->out[i]) != APEX_F32)
      return apex__fail(APEX_ERR_DTYPE, "%s: tensor %d is %s + %s -> %s; the fused flush takes a bf16 grad, an f32 sum and an f32 out", fn,
                        i, apex_dtype_name(apex_tensor_dtype(a->grad[i])), apex_dtype_name(apex_tensor_dtype(a->sum[i])),
                        apex_dtype_name(apex_tensor_dtype(a->out[i])));
  }
  apex__cuda_list l[3];
  apex_tensor *const *t[3] = {a->grad, a->sum, a->out};
  apex_status st = make_lists(fn, t, 3, n, l);
  if (st != APEX_OK) return st;
  int *d = NULL, *h = NULL; /* d[0]: the overflow flag, d[1 + i]: tensor i's nonzero flag */
  st = apex__cuda_alloc(sizeof(int) * (size_t)(n + 1), 1, (void **)&d);
  if (st == APEX_OK) st = apex__cuda_mt_flush_unscale(&l[0], &l[1], &l[2], a->scale, d, d + 1);
  if (st == APEX_OK && (a->overflow || a->nonzero)) {
    h = malloc(sizeof(int) * (size_t)(n + 1));
    st = h ? apex__cuda_memcpy(h, d, sizeof(int) * (size_t)(n + 1), APEX__D2H, 1)
           : apex__fail(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  }
  if (st == APEX_OK && h) {
    if (a->overflow && h[0]) *a->overflow = 1;
    for (int i = 0; a->nonzero && i < n; i++) a->nonzero[i] = h[1 + i] != 0;
  }
  free(h);
  apex__cuda_free(d);
  for (int k = 0; k < 3; k++) apex__cuda_list_free(&l[k]);
  return st;
}
