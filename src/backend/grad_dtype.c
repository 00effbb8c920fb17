/* grad_dtype.c: an f32 backward kernel under the gradient-dtype contract (grad_dtype.h). */
#include "backend/grad_dtype.h"

#include "core/internal.h"

int apex__grads_low(const apex__grad_in *in, int n_in, const apex__grad_out *out, int n_out) {
  for (int i = 0; i < n_in; i++)
    if (*in[i].data && *in[i].dtype != APEX_F32) return 1;
  for (int i = 0; i < n_out; i++)
    if (*out[i].data && *out[i].dtype != APEX_F32) return 1;
  return 0;
}

apex_status apex__grad_land(const apex_backend *be, void *dst, apex_dtype dt, const float *src, size_t n, int accumulate) {
  if (!n) return APEX_OK;
  if (!be->nn_binary) return apex__backend_slot_missing(be, "apex_backward", "nn_binary");
  /* 0.0f + src: the fresh rule's bits (a -0 term lands as +0), through the same addition */
  apex_status st = accumulate ? APEX_OK : be->mem->fill(dst, dt, 0.0f, n);
  apex_nn_bcast plan = {.nd = 1, .shape = {(int64_t)n}, .st = {{1}, {1}}, .rows = 1, .len = n};
  if (st == APEX_OK)
    st = be->nn_binary(&(apex_nn_binary_args){.kind = APEX_NN_ADD, .plan = &plan, .a = {dst, dt}, .b = {src, APEX_F32}, .numel_a = n,
                                              .numel_b = n, .out = dst, .out_dtype = dt});
  return st;
}

apex_status apex__grads_via_f32(const apex_backend *be, const char *fn, apex_status (*kernel)(const void *args), void *args,
                                const apex__grad_in *in, int n_in, const apex__grad_out *out, int n_out) {
  if (n_in > APEX__GRAD_IO_MAX || n_out > APEX__GRAD_IO_MAX)
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: too many gradients for the f32 road", fn);
  const apex_memory *m = be->mem;
  void *tmp_in[APEX__GRAD_IO_MAX] = {0}, *tmp_out[APEX__GRAD_IO_MAX] = {0};
  void *dst[APEX__GRAD_IO_MAX] = {0};
  apex_dtype dt[APEX__GRAD_IO_MAX] = {0};
  int acc[APEX__GRAD_IO_MAX] = {0};
  apex_status st = APEX_OK;
  for (int i = 0; i < n_in && st == APEX_OK; i++) {
    if (!*in[i].data || *in[i].dtype == APEX_F32) continue;
    st = m->alloc((in[i].n ? in[i].n : 1) * sizeof(float), 0, &tmp_in[i]);
    if (st == APEX_OK && in[i].n) st = m->convert(tmp_in[i], APEX_F32, *in[i].data, *in[i].dtype, in[i].n);
    if (st == APEX_OK) *in[i].data = tmp_in[i], *in[i].dtype = APEX_F32;
  }
  for (int i = 0; i < n_out && st == APEX_OK; i++) {
    if (!*out[i].data || *out[i].dtype == APEX_F32) continue;
    st = m->alloc((out[i].n ? out[i].n : 1) * sizeof(float), 1, &tmp_out[i]);
    if (st != APEX_OK) break;
    dst[i] = *out[i].data, dt[i] = *out[i].dtype, acc[i] = *out[i].accumulate;
    *out[i].data = tmp_out[i], *out[i].dtype = APEX_F32, *out[i].accumulate = 1;
  }
  if (st == APEX_OK) st = kernel(args);
  /* Buffers that hold nothing yet are zeroed before any lands: outputs may share one buffer's rows (the
   * packed q, k, v), and a later output's zeroing must not wipe an earlier one's columns. */
  for (int i = 0; i < n_out && st == APEX_OK; i++)
    if (tmp_out[i] && !acc[i] && out[i].n) st = m->fill(dst[i], dt[i], 0.0f, out[i].n);
  for (int i = 0; i < n_out && st == APEX_OK; i++)
    if (tmp_out[i]) st = apex__grad_land(be, dst[i], dt[i], tmp_out[i], out[i].n, 1);
  for (int i = 0; i < APEX__GRAD_IO_MAX; i++) m->free(tmp_in[i]), m->free(tmp_out[i]);
  return st;
}
