/* grad_dtype.c: an f32 backward kernel under the gradient-dtype contract (grad_dtype.h). */
#include "backend/grad_dtype.h"

#include "core/internal.h"

/* A gradient the kernel reads: *data (n elements of *dtype), rewritten to f32 for the call. */
typedef struct grad_in {
  const void **data;
  apex_dtype *dtype;
  size_t n;
} grad_in;

/* A gradient the kernel writes: *data spans n elements of *dtype, *accumulate its flag. NULL data: no
 * gradient wanted. */
typedef struct grad_out {
  void **data;
  apex_dtype *dtype;
  size_t n;
  int *accumulate;
} grad_out;

#define IO_MAX 4

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

/* The road of grad_dtype.h over the listed gradients of args (the caller's copy of the slot's arguments,
 * which the lists point into). fn names the slot in messages. */
static apex_status road(const apex_backend *be, const char *fn, apex__grad_kernel kernel, void *args, const grad_in *in, int n_in,
                        const grad_out *out, int n_out, int *ran) {
  int low = 0;
  for (int i = 0; i < n_in; i++) low |= *in[i].data && *in[i].dtype != APEX_F32;
  for (int i = 0; i < n_out; i++) low |= *out[i].data && *out[i].dtype != APEX_F32;
  *ran = low;
  if (!low) return APEX_OK;
  if (n_in > IO_MAX || n_out > IO_MAX) return apex__fail(APEX_ERR_INVALID_ARG, "%s: too many gradients for the f32 road", fn);
  const apex_memory *m = be->mem;
  void *tmp_in[IO_MAX] = {0}, *tmp_out[IO_MAX] = {0}, *dst[IO_MAX] = {0};
  apex_dtype dt[IO_MAX] = {0};
  int acc[IO_MAX] = {0};
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
  for (int i = 0; i < IO_MAX; i++) m->free(tmp_in[i]), m->free(tmp_out[i]);
  return st;
}

apex_status apex__binary_bwd_f32(const apex_backend *be, apex__grad_kernel kernel, const apex_nn_binary_bwd_args *a, int *ran) {
  apex_nn_binary_bwd_args c = *a;
  const grad_in in[] = {{&c.gout, &c.gout_dtype, a->plan->rows * a->plan->len}};
  const grad_out out[] = {{&c.ga, &c.ga_dtype, a->numel_a, &c.accumulate_a}, {&c.gb, &c.gb_dtype, a->numel_b, &c.accumulate_b}};
  return road(be, "nn_binary_bwd", kernel, &c, in, 1, out, 2, ran);
}

/* The road of a slot whose gout and gx are both n elements (fields of the copy c). */
static apex_status one_in_one_out(const apex_backend *be, const char *fn, apex__grad_kernel kernel, void *c, const void **gout,
                                  apex_dtype *gout_dtype, void **gx, apex_dtype *gx_dtype, int *accumulate_x, size_t n, int *ran) {
  const grad_in in[] = {{gout, gout_dtype, n}};
  const grad_out out[] = {{gx, gx_dtype, n, accumulate_x}};
  return road(be, fn, kernel, c, in, 1, out, 1, ran);
}

apex_status apex__unary_bwd_f32(const apex_backend *be, apex__grad_kernel kernel, const apex_nn_unary_bwd_args *a, int *ran) {
  apex_nn_unary_bwd_args c = *a;
  return one_in_one_out(be, "nn_unary_bwd", kernel, &c, &c.gout, &c.gout_dtype, &c.gx, &c.gx_dtype, &c.accumulate_x, a->n, ran);
}

apex_status apex__scale_bwd_f32(const apex_backend *be, apex__grad_kernel kernel, const apex_nn_scale_bwd_args *a, int *ran) {
  apex_nn_scale_bwd_args c = *a;
  return one_in_one_out(be, "nn_scale_bwd", kernel, &c, &c.gout, &c.gout_dtype, &c.gx, &c.gx_dtype, &c.accumulate_x, a->n, ran);
}

apex_status apex__dropout_bwd_f32(const apex_backend *be, apex__grad_kernel kernel, const apex_nn_dropout_bwd_args *a, int *ran) {
  apex_nn_dropout_bwd_args c = *a;
  return one_in_one_out(be, "nn_dropout_bwd", kernel, &c, &c.gout, &c.gout_dtype, &c.gx, &c.gx_dtype, &c.accumulate_x, a->n, ran);
}

apex_status apex__row_norm_bwd_f32(const apex_backend *be, apex__grad_kernel kernel, const apex_nn_row_norm_bwd_args *a, int *ran) {
  apex_nn_row_norm_bwd_args c = *a;
  return one_in_one_out(be, "nn_row_norm_bwd", kernel, &c, &c.gout, &c.gout_dtype, &c.gx, &c.gx_dtype, &c.accumulate_x,
                        a->rows * a->cols, ran);
}

/* gout is [m, n] and gx [m, k] (gw and gb are f32). */
apex_status apex__linear_bwd_f32(const apex_backend *be, apex__grad_kernel kernel, const apex_nn_linear_bwd_args *a, int *ran) {
  apex_nn_linear_bwd_args c = *a;
  const grad_in in[] = {{&c.gout, &c.gout_dtype, (size_t)a->m * (size_t)a->n}};
  const grad_out out[] = {{&c.gx, &c.gx_dtype, (size_t)a->m * (size_t)a->k, &c.accumulate_x}};
  return road(be, "nn_linear_bwd", kernel, &c, in, 1, out, 1, ran);
}

apex_status apex__embedding_bwd_f32(const apex_backend *be, apex__grad_kernel kernel, const apex_nn_embedding_bwd_args *a, int *ran) {
  apex_nn_embedding_bwd_args c = *a;
  const grad_in in[] = {{&c.gout, &c.gout_dtype, a->n * a->dim}};
  return road(be, "nn_embedding_bwd", kernel, &c, in, 1, NULL, 0, ran);
}

apex_status apex__cross_entropy_bwd_f32(const apex_backend *be, apex__grad_kernel kernel, const apex_nn_cross_entropy_bwd_args *a,
                                        int *ran) {
  apex_nn_cross_entropy_bwd_args c = *a;
  const grad_out out[] = {{&c.gx, &c.gx_dtype, a->rows * a->classes, &c.accumulate_x}};
  return road(be, "nn_cross_entropy_bwd", kernel, &c, NULL, 0, out, 1, ran);
}

/* The elements a strided [rows, heads * d] operand spans from its first. */
static size_t span(size_t rows, size_t ld, size_t row) { return rows ? (rows - 1) * ld + row : 0; }

apex_status apex__attention_bwd_f32(const apex_backend *be, apex__grad_kernel kernel, const apex_nn_attention_bwd_args *a, int *ran) {
  apex_nn_attention_bwd_args c = *a;
  const size_t rows = a->batch * (size_t)a->t, row = (size_t)a->heads * (size_t)a->d;
  const grad_in in[] = {{&c.gout, &c.gout_dtype, span(rows, a->ld_gout, row)}};
  const grad_out out[] = {{&c.gq, &c.gq_dtype, span(rows, a->ld_gq, row), &c.accumulate_q},
                          {&c.gk, &c.gk_dtype, span(rows, a->ld_gk, row), &c.accumulate_k},
                          {&c.gv, &c.gv_dtype, span(rows, a->ld_gv, row), &c.accumulate_v}};
  return road(be, "nn_attention_bwd", kernel, &c, in, 1, out, 3, ran);
}
