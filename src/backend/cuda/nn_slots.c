/* nn_slots.c: the CUDA backend's nn slots (backend/args_nn.h) over the kernels of elementwise.cu
 * (add, mul, scale, ReLU, tanh GELU in their operands' and results' own dtypes; every other unary and
 * binary kind and any broadcast in its general kernels; column sums), norm.cu (layer and RMS norm),
 * embedding.cu, gemm.cu (linear, matmul), conv.cu (cuDNN convolution), attention.cu, flash_attention.cu
 * and attention_cudnn.cu (causal attention), xent.cu (cross entropy), dropout.cu and bn_forward.cu. The
 * slots whose kernels need no such glue live beside them (loss.cu, shape.cu, conv.cu's pooling,
 * norm.cu's batch norm backward; cuda_backend.h lists them). Every buffer of a slot's arguments is
 * device memory, except the embedding's ids, which its kernel reads on the host.
 *
 * Where a library kernel takes one dtype for inputs that arrive in two (autocast's bf16 weight against
 * an f32 gradient, a bias of another dtype than its weight), the low-precision ones are widened exactly
 * to f32 in scratch and the kernel runs in f32, which are the CPU's numerics (it widens too); a result of
 * another dtype than the kernel writes is rounded from f32 once. The kernels overwrite their gradient
 * outputs; args_nn.h's accumulate rule (add into the buffer, or store 0.0f + term) is kept by computing
 * the term into device scratch and adding it (land), so the bits are those of one f32 addition. All
 * work is queued on apex's one stream; nothing here waits. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/grad_dtype.h"
#include "core/internal.h"

static apex_status unsupported(const char *slot, const char *what) {
  return apex__fail(APEX_ERR_UNSUPPORTED, "%s: %s on the cuda backend; run this op on the CPU", slot, what);
}

/* n f32 of device scratch, or NULL after a message (*st set). */
static float *scratch(size_t n, apex_status *st) {
  void *p = NULL;
  *st = apex__cuda_alloc((n ? n : 1) * sizeof(float), 0, &p);
  return *st == APEX_OK ? (float *)p : NULL;
}

/* dst (n elements of dt) receives term (tt) by args_nn.h's accumulate rule: dst + term, or 0.0f + term when
 * dst holds nothing yet (zeroed first, so -0 terms land as +0 exactly as on the CPU), in f32, rounded once. */
static apex_status land(void *dst, apex_dtype dt, const void *term, apex_dtype tt, size_t n, int accumulate) {
  if (!n) return APEX_OK;
  apex_status st = accumulate ? APEX_OK : apex__cuda_fill(dst, dt, 0.0f, n);
  if (st == APEX_OK) st = apex__cuda_ew(APEX__EW_ADD, dst, dt, term, tt, 0.0f, dst, dt, (int64_t)n);
  return st;
}

/* A backward kernel's gradient in scratch (src) and where it lands in the slot's output (dst, by the
 * accumulate rule); src or dst NULL: nothing to land. */
typedef struct landing {
  float *dst, *src;
  size_t n;
  int accumulate;
} landing;

/* The end of a backward that ran its kernel on scratch outputs (status st so far): lands each of the
 * three gradients while nothing has failed, then frees the scratch and the f32 input copies ox and ow
 * (dev_f32) whatever happened. */
static apex_status land_grads(apex_status st, const landing l[3], void *ox, void *ow) {
  for (int i = 0; i < 3; i++)
    if (st == APEX_OK && l[i].dst && l[i].src) st = land(l[i].dst, APEX_F32, l[i].src, APEX_F32, l[i].n, l[i].accumulate);
  for (int i = 0; i < 3; i++) apex__cuda_free(l[i].src);
  apex__cuda_free(ox);
  apex__cuda_free(ow);
  return st;
}

/* dst (when set; dt) receives the f32 elementwise term op(a, b) over n elements, by the accumulate rule. */
static apex_status ew_into(void *dst, apex_dtype dt, int accumulate, apex__cuda_ew_op op, const void *a, apex_dtype at, const void *b,
                           apex_dtype bt, float alpha, size_t n) {
  if (!dst || !n) return APEX_OK;
  apex_status st;
  float *t = scratch(n, &st);
  if (t) st = apex__cuda_ew(op, a, at, b, bt, alpha, t, APEX_F32, (int64_t)n);
  if (st == APEX_OK) st = land(dst, dt, t, APEX_F32, n, accumulate);
  apex__cuda_free(t);
  return st;
}

/* ---- elementwise ------------------------------------------------------------------------------- */

/* 1 when neither operand broadcasts: both move with the output's contiguous index in every dimension
 * of extent above 1, so the plan is one flat run of rows * len elements. */
static int flat_plan(const apex_nn_bcast *p) {
  int64_t s = 1;
  for (int d = p->nd - 1; d >= 0; d--) {
    if (p->shape[d] != 1 && (p->st[0][d] != s || p->st[1][d] != s)) return 0;
    s *= p->shape[d];
  }
  return 1;
}

/* 1 with the functor of add and mul. */
static int binary_op(apex_nn_binary_kind kind, apex__cuda_ew_op *op) {
  if (kind == APEX_NN_ADD) *op = APEX__EW_ADD;
  else if (kind == APEX_NN_MUL) *op = APEX__EW_MUL;
  else return 0;
  return 1;
}

/* The functors of elementwise.cu take flat add and mul, relu and tanh GELU; every other kind and every
 * broadcast goes to its general kernels (apex__cuda_nn_*_any). */
apex_status apex__cuda_slot_nn_binary(const apex_nn_binary_args *a) {
  apex__cuda_ew_op op = APEX__EW_ADD;
  if (!binary_op(a->kind, &op) || !flat_plan(a->plan)) return apex__cuda_nn_binary_any(a);
  size_t n = a->plan->rows * a->plan->len;
  return n ? apex__cuda_ew(op, a->a.data, a->a.dtype, a->b.data, a->b.dtype, 0.0f, a->out, a->out_dtype, (int64_t)n) : APEX_OK;
}

static apex_status binary_bwd_k(const void *a) { return apex__cuda_nn_binary_bwd_any(a); }

/* Flat add and mul read gout and write ga, gb in their own dtypes; the general kernels take f32 gradients,
 * so low-precision ones reach them through the f32 road. */
apex_status apex__cuda_slot_nn_binary_bwd(const apex_nn_binary_bwd_args *a) {
  apex__cuda_ew_op op = APEX__EW_ADD;
  size_t n = a->plan->rows * a->plan->len;
  if (!binary_op(a->kind, &op) || !flat_plan(a->plan)) {
    int ran;
    apex_status rs = apex__binary_bwd_f32(&apex__cuda_backend, binary_bwd_k, a, &ran);
    return ran ? rs : apex__cuda_nn_binary_bwd_any(a);
  }
  apex_status st = APEX_OK;
  if (op == APEX__EW_ADD) {
    if (a->ga && n) st = land(a->ga, a->ga_dtype, a->gout, a->gout_dtype, n, a->accumulate_a);
    if (st == APEX_OK && a->gb && n) st = land(a->gb, a->gb_dtype, a->gout, a->gout_dtype, n, a->accumulate_b);
    return st;
  }
  st = ew_into(a->ga, a->ga_dtype, a->accumulate_a, APEX__EW_MUL, a->gout, a->gout_dtype, a->b.data, a->b.dtype, 0.0f, n);
  if (st == APEX_OK)
    st = ew_into(a->gb, a->gb_dtype, a->accumulate_b, APEX__EW_MUL, a->gout, a->gout_dtype, a->a.data, a->a.dtype, 0.0f, n);
  return st;
}

apex_status apex__cuda_slot_nn_unary(const apex_nn_unary_args *a) {
  apex__cuda_ew_op op = APEX__EW_ADD;
  if (a->kind == APEX_NN_RELU) op = APEX__EW_RELU;
  else if (a->kind == APEX_NN_GELU_TANH) op = APEX__EW_GELU;
  else return apex__cuda_nn_unary_any(a);
  /* the kernel reads x and writes out in their own dtypes, in f32 between */
  return a->n ? apex__cuda_ew(op, a->x.data, a->x.dtype, NULL, APEX_F32, 0.0f, a->out, a->out_dtype, (int64_t)a->n) : APEX_OK;
}

static apex_status unary_bwd_k(const void *a) { return apex__cuda_nn_unary_bwd_any(a); }

apex_status apex__cuda_slot_nn_unary_bwd(const apex_nn_unary_bwd_args *a) {
  /* ReLU's mask comes from its output y (raw, y_dtype): non-zero exactly where x > 0, and the kernel
   * passes gout where its second operand is > 0, which for y is the same set. */
  if (a->kind == APEX_NN_RELU)
    return ew_into(a->gx, a->gx_dtype, a->accumulate_x, APEX__EW_RELU_BWD, a->gout, a->gout_dtype, a->y, a->y_dtype, 0.0f, a->n);
  if (a->kind == APEX_NN_GELU_TANH)
    return ew_into(a->gx, a->gx_dtype, a->accumulate_x, APEX__EW_GELU_BWD, a->gout, a->gout_dtype, a->x.data, a->x.dtype, 0.0f, a->n);
  int ran;
  apex_status rs = apex__unary_bwd_f32(&apex__cuda_backend, unary_bwd_k, a, &ran);
  return ran ? rs : apex__cuda_nn_unary_bwd_any(a);
}

apex_status apex__cuda_slot_nn_scale(const apex_nn_scale_args *a) {
  return a->n ? apex__cuda_ew(APEX__EW_SCALE, a->x.data, a->x.dtype, NULL, APEX_F32, a->s, a->out, a->out_dtype, (int64_t)a->n)
              : APEX_OK;
}

apex_status apex__cuda_slot_nn_scale_bwd(const apex_nn_scale_bwd_args *a) {
  /* the identity (reshape, a cast's backward) lands gout itself: one pass, in both buffers' dtypes */
  if (a->s == 1.0f) return a->gx ? land(a->gx, a->gx_dtype, a->gout, a->gout_dtype, a->n, a->accumulate_x) : APEX_OK;
  return ew_into(a->gx, a->gx_dtype, a->accumulate_x, APEX__EW_SCALE, a->gout, a->gout_dtype, NULL, APEX_F32, a->s, a->n);
}

/* ---- row norms ---------------------------------------------------------------------------------- */

/* b's n elements as f32 on the device: its own data when f32, else a converted copy in scratch, which
 * *owned then holds for the caller to free. NULL after a message (*st set). */
static const float *dev_f32(apex_nn_buf b, size_t n, void **owned, apex_status *st) {
  *owned = NULL;
  *st = APEX_OK;
  if (b.dtype == APEX_F32) return (const float *)b.data;
  float *f = scratch(n, st);
  if (f && n) *st = apex__cuda_convert(f, APEX_F32, b.data, b.dtype, n);
  *owned = f;
  return *st == APEX_OK ? f : NULL;
}

/* A weight as the kernels read it when it is not read as stored: widened to f32 (exact), or, with no
 * data, D ones; the copy is in *owned for the caller to free. */
static const float *norm_weight(apex_nn_buf w, size_t D, void **owned, apex_status *st) {
  if (w.data) return dev_f32(w, D, owned, st);
  float *f = scratch(D, st);
  if (f) *st = apex__cuda_fill(f, APEX_F32, 1.0f, D);
  *owned = f;
  return *st == APEX_OK ? f : NULL;
}

apex_status apex__cuda_slot_nn_row_norm(const apex_nn_row_norm_args *a) {
  size_t R = a->rows, D = a->cols;
  if (!R || !D) return APEX_OK;
  if (a->x2.data) {
    /* the residual add in front: one kernel where the fused layer norm reads everything as stored (a layer
     * norm whose result, weight and bias share x's dtype or are f32 weights), else the add into xsum and
     * the norm of xsum */
    int wt_ok = a->w.data && (a->w.dtype == APEX_F32 || a->w.dtype == a->x.dtype) && a->b.data && a->b.dtype == a->w.dtype;
    if (a->centre && a->out_dtype == a->x.dtype && D <= APEX__CUDA_NORM_FUSED_COLS && wt_ok)
      return apex__cuda_add_layer_norm_fwd(a->x.data, a->x2.data, a->xsum, a->x.dtype, a->w.data, a->b.data, a->w.dtype, (int64_t)R,
                                           (int64_t)D, a->eps, a->out, a->stats, a->stats + R);
    apex_status st = apex__cuda_ew(APEX__EW_ADD, a->x.data, a->x.dtype, a->x2.data, a->x.dtype, 0.0f, a->xsum, a->x.dtype, (int64_t)(R * D));
    if (st != APEX_OK) return st;
    apex_nn_row_norm_args c = apex__row_norm_of_sum(a);
    return apex__cuda_slot_nn_row_norm(&c);
  }
  if (D > APEX__CUDA_NORM_FUSED_COLS) return apex__cuda_row_norm_wide(a);
  /* The kernel writes its result in x's dtype and reads w and b in one dtype, f32 or x's. A result of
   * another dtype is computed from x widened (exact) into f32 scratch and rounded once into out; a
   * missing weight is ones; a w and b that the kernel cannot read as stored are both widened to f32. */
  int direct = a->out_dtype == a->x.dtype;
  void *ox = NULL, *ow = NULL, *ob = NULL, *oy = NULL;
  apex_status st = APEX_OK;
  const void *x = direct ? a->x.data : dev_f32(a->x, R * D, &ox, &st);
  apex_dtype xt = direct ? a->x.dtype : APEX_F32;
  const void *w = a->w.data, *b = a->centre ? a->b.data : NULL;
  apex_dtype wt = a->w.dtype;
  int as_is = w && (wt == APEX_F32 || wt == xt) && (!b || a->b.dtype == wt);
  if (st == APEX_OK && !as_is) {
    wt = APEX_F32;
    w = norm_weight(a->w, D, &ow, &st);
    if (st == APEX_OK && b) b = dev_f32(a->b, D, &ob, &st);
  }
  void *y = a->out;
  if (st == APEX_OK && !direct && a->out_dtype != APEX_F32) y = oy = scratch(R * D, &st);
  /* stats is mean[rows] then rstd[rows], the kernel's two outputs side by side */
  if (st == APEX_OK)
    st = apex__cuda_layer_norm_fwd(x, xt, w, b, wt, (int64_t)R, (int64_t)D, a->eps, !a->centre, y, a->stats, a->stats + R);
  if (st == APEX_OK && oy) st = apex__cuda_convert(a->out, a->out_dtype, y, APEX_F32, R * D);
  apex__cuda_free(ox);
  apex__cuda_free(ow);
  apex__cuda_free(ob);
  apex__cuda_free(oy);
  return st;
}

static apex_status row_norm_bwd_k(const void *a) { return apex__cuda_slot_nn_row_norm_bwd(a); }

apex_status apex__cuda_slot_nn_row_norm_bwd(const apex_nn_row_norm_bwd_args *a) {
  size_t R = a->rows, D = a->cols;
  if (!R || !D || (!a->gx && !a->gw && !a->gb)) return APEX_OK;
  const apex_dtype xt = a->x.dtype;
  /* The kernel reads dy and writes dx in x's dtype and lands each gradient itself. Gradients in x's own
   * dtype (a graph that keeps them so) go straight in; f32 gradients of a low-precision x run on an f32
   * copy of x; any other mix, and the wide rows' kernel (f32 gradients only), take the f32 road. */
  const int in_x = a->gout_dtype == xt && (!a->gx || a->gx_dtype == xt);
  const int all_f32 = a->gout_dtype == APEX_F32 && (!a->gx || a->gx_dtype == APEX_F32);
  const int direct = in_x && (!a->w.data || a->w.dtype == APEX_F32 || a->w.dtype == xt);
  if ((!direct && !all_f32) || (D > APEX__CUDA_NORM_FUSED_COLS && !all_f32)) {
    int ran; /* !all_f32: some gradient is f16/bf16, so the road runs */
    return apex__row_norm_bwd_f32(&apex__cuda_backend, row_norm_bwd_k, a, &ran);
  }
  if (D > APEX__CUDA_NORM_FUSED_COLS) return apex__cuda_row_norm_wide_bwd(a);
  void *ox = NULL, *ow = NULL;
  apex_status st = APEX_OK;
  const void *x = direct ? a->x.data : (const void *)dev_f32(a->x, R * D, &ox, &st);
  apex_dtype kt = direct ? xt : APEX_F32, wt = direct && a->w.data ? a->w.dtype : APEX_F32;
  const void *w = x ? (direct && a->w.data ? a->w.data : (const void *)norm_weight(a->w, D, &ow, &st)) : NULL; /* no weight: ones */
  if (st == APEX_OK)
    st = apex__cuda_layer_norm_bwd(a->gout, x, kt, w, wt, a->stats, a->stats + R, (int64_t)R, (int64_t)D, !a->centre, a->gx,
                                   a->accumulate_x, a->gw, a->accumulate_w, a->centre ? a->gb : NULL, a->accumulate_b, a->ws);
  apex__cuda_free(ox);
  apex__cuda_free(ow);
  return st;
}

/* ---- lookups ------------------------------------------------------------------------ */

apex_status apex__cuda_slot_nn_embedding(const apex_nn_embedding_args *a) {
  /* the lookup never reads the table's row count (the front checked the ids against it); ids on the device
   * (an apex_index's) go to the kernel as they are, with no upload */
  if (a->ids_on_device)
    return apex__cuda_embedding_fwd_dev(a->w, a->dtype, (int64_t)a->dim, a->ids, (int64_t)a->n, a->out, a->dtype);
  return apex__cuda_embedding_fwd(a->w, a->dtype, 0, (int64_t)a->dim, a->ids, (int64_t)a->n, a->out, a->dtype);
}

/* dtable [rows, dim] (f32) = the rows' sums of gout, overwritten, from host ids (a host sort and an upload)
 * or device ids (a device sort in pool scratch: nothing from the host, so a CUDA graph can hold it); the
 * same bits either way (embedding.cu). */
static apex_status embedding_grad(const apex_nn_embedding_bwd_args *a, float *dtable) {
  if (!a->ids_on_device)
    return apex__cuda_embedding_bwd(a->gout, a->gout_dtype, a->ids, (int64_t)a->n, (int64_t)a->rows, (int64_t)a->dim, dtable, APEX_F32);
  size_t bytes = apex__cuda_embedding_bwd_scratch((int64_t)a->n, (int64_t)a->rows);
  void *owned;
  apex_status st;
  void *s = apex__cuda_ws_scratch(a->ws, bytes, &owned, &st);
  if (st == APEX_OK)
    st = apex__cuda_embedding_bwd_dev(a->gout, a->gout_dtype, a->ids, (int64_t)a->n, (int64_t)a->rows, (int64_t)a->dim, dtable, APEX_F32,
                                      s, bytes);
  apex__cuda_free(owned); /* the stream orders its reuse after the sort */
  return st;
}

apex_status apex__cuda_slot_nn_embedding_bwd(const apex_nn_embedding_bwd_args *a) {
  size_t total = a->rows * a->dim;
  /* The kernel writes the whole table (zeros where no id points), summing each row's terms in order of
   * position from 0.0f: the fresh case's bits directly. */
  if (!a->accumulate_w) return embedding_grad(a, a->gw);
  if (!total) return APEX_OK;
  apex_status st;
  float *t = scratch(total, &st);
  if (t) st = embedding_grad(a, t);
  if (st == APEX_OK) st = land(a->gw, APEX_F32, t, APEX_F32, total, 1);
  apex__cuda_free(t);
  return st;
}

/* ---- products ---------------------------------------------------------------------------------------- */

/* cuBLASLt reads both operands of a product in one dtype. Where they differ (autocast's bf16 weight
 * and f32 gradient), each low-precision operand is widened exactly to f32 in scratch and the product
 * runs in f32: the CPU's numerics (apex__gemm widens low-precision operands to f32 and accumulates in
 * f32). pair_f32 gives x and y as the product reads them: as stored when their dtypes agree, else as f32
 * (copies in *ox, *oy for the caller to free). */
static apex_status pair_f32(apex_nn_buf *x, size_t nx, apex_nn_buf *y, size_t ny, void **ox, void **oy) {
  *ox = *oy = NULL;
  if (x->dtype == y->dtype) return APEX_OK;
  apex_status st = APEX_OK;
  const float *fx = dev_f32(*x, nx, ox, &st), *fy = fx ? dev_f32(*y, ny, oy, &st) : NULL;
  if (st != APEX_OK) return st;
  *x = (apex_nn_buf){fx, APEX_F32};
  *y = (apex_nn_buf){fy, APEX_F32};
  return APEX_OK;
}

/* The GELU epilogue (args_nn.h): one cuBLASLt product with GELU_AUX_BIAS (pre as its aux) where it
 * applies (half operands of one dtype with a bias, the result in that dtype), else the product into
 * pre and the GELU kernel over it. */
static apex_status linear_gelu(const apex_nn_linear_args *a) {
  const apex_dtype dt = a->out_dtype;
  if ((dt == APEX_BF16 || dt == APEX_F16) && a->x.dtype == dt && a->w.dtype == dt && a->bias.data && a->bias.dtype == dt &&
      a->n % 8 == 0) {
    apex__cuda_epilogue e = {APEX__EPI_GELU_AUX_BIAS, a->bias.data, a->pre, NULL, 0};
    if (apex__cuda_gemm_epilogue(0, 1, a->m, a->n, a->k, a->x.data, a->w.data, dt, a->out, dt, &e) == APEX_OK) return APEX_OK;
    /* no algorithm for the epilogue (its message says why): the separate kernels give the same result */
  }
  apex_nn_linear_args p = *a;
  p.gelu = 0;
  p.out = a->pre;
  p.pre = NULL;
  apex_status st = apex__cuda_slot_nn_linear(&p);
  size_t mn = (size_t)a->m * (size_t)a->n;
  return st == APEX_OK ? apex__cuda_ew(APEX__EW_GELU, a->pre, dt, NULL, APEX_F32, 0.0f, a->out, dt, (int64_t)mn) : st;
}

apex_status apex__cuda_slot_nn_linear(const apex_nn_linear_args *a) {
  if (!a->m || !a->n) return APEX_OK;
  if (a->gelu) return linear_gelu(a);
  size_t m = (size_t)a->m, n = (size_t)a->n, k = (size_t)a->k;
  apex_nn_buf x = a->x, w = a->w;
  void *ox = NULL, *ow = NULL;
  apex_status st = pair_f32(&x, m * k, &w, n * k, &ox, &ow);
  /* f32 operands give an f32 product (cuBLASLt's only output for them): a half result is rounded from
   * it once, in scratch */
  void *y = a->out, *oy = NULL;
  apex_dtype yt = x.dtype == APEX_F32 ? APEX_F32 : a->out_dtype;
  if (st == APEX_OK && yt != a->out_dtype) y = oy = scratch(m * n, &st);
  /* the bias epilogue reads the bias in the product's output dtype */
  void *bias = (void *)a->bias.data;
  if (st == APEX_OK && a->bias.data && a->bias.dtype != yt) {
    bias = NULL;
    st = apex__cuda_alloc(n * apex_dtype_size(yt), 0, &bias);
    if (st == APEX_OK) st = apex__cuda_convert(bias, yt, a->bias.data, a->bias.dtype, n);
  }
  if (st == APEX_OK) st = apex__cuda_gemm(0, 1, a->m, a->n, a->k, 1.0f, x.data, w.data, x.dtype, 0.0f, y, yt, bias, 0);
  if (st == APEX_OK && oy) st = apex__cuda_convert(a->out, a->out_dtype, oy, APEX_F32, m * n);
  if (bias != a->bias.data) apex__cuda_free(bias);
  apex__cuda_free(ox);
  apex__cuda_free(ow);
  apex__cuda_free(oy);
  return st;
}

/* cuBLASLt's beta for a gradient output: 1 over what it holds, or over zeros put there first, so that
 * the fresh case stores 0.0f + product as args_nn.h asks. */
static apex_status zero_unless(void *dst, apex_dtype dt, size_t n, int accumulate) {
  return accumulate || !n ? APEX_OK : apex__cuda_fill(dst, dt, 0.0f, n);
}

/* The f32 gradient gout (n elements) rounded to bf16 in scratch (freed by the caller), for the backward
 * products of a bf16 partner: they then run on the tensor cores (bf16 operands, an f32 result added to
 * the gradient), as PyTorch's autocast backward and oneDNN's bf16 products on the CPU do, instead of as
 * f32 products of the widened partner, several times slower. f16 partners keep the f32 product: f16's
 * range would turn a large (loss-scaled) gradient into an Inf that the f32 path keeps finite. */
static void *bf16_grad(const void *gout, size_t n, apex_status *st) {
  void *h = NULL;
  *st = apex__cuda_alloc(n ? n * 2 : 2, 0, &h);
  if (*st == APEX_OK && n) *st = apex__cuda_convert(h, APEX_BF16, gout, APEX_F32, n);
  return h;
}

/* One backward product's operands: the gradient as stored when the partner shares its low dtype (a graph
 * that keeps gradients in the values' dtype: already what the tensor cores read), an f32 gradient rounded
 * to bf16 against a bf16 partner (g16), else both in f32 (g32, the partner widened into *owned). */
typedef struct bwd_operands {
  const void *g, *partner;
  apex_dtype dtype;
} bwd_operands;

static bwd_operands bwd_pair(apex_dtype gt, const void *gout, const void *g16, const float *g32, apex_nn_buf partner, size_t np,
                             void **owned, apex_status *st) {
  if (gt != APEX_F32 && partner.dtype == gt) return (bwd_operands){gout, partner.data, gt};
  if (gt == APEX_F32 && partner.dtype == APEX_BF16) return (bwd_operands){g16, partner.data, APEX_BF16};
  return (bwd_operands){g32, dev_f32(partner, np, owned, st), APEX_F32};
}

/* gx [m, k] = gout [m, n] w [n, k] (operands o), landed in gx's dtype: cuBLASLt adds beta * gx in f32 and
 * rounds once where it can write gx's dtype (f32, or the operands' own); another (a half gx of f32 operands)
 * is computed into f32 scratch and landed. */
static apex_status product_x(const apex_nn_linear_bwd_args *a, bwd_operands o) {
  apex_status st;
  size_t mk = (size_t)a->m * (size_t)a->k;
  if (a->gx_dtype == APEX_F32 || a->gx_dtype == o.dtype) {
    st = zero_unless(a->gx, a->gx_dtype, mk, a->accumulate_x);
    return st == APEX_OK ? apex__cuda_gemm_scaled(0, 0, a->m, a->k, a->n, a->gout_scale, o.g, o.partner, o.dtype, 1.0f, a->gx, a->gx_dtype) : st;
  }
  float *t = scratch(mk, &st);
  if (t) st = apex__cuda_gemm_scaled(0, 0, a->m, a->k, a->n, a->gout_scale, o.g, o.partner, o.dtype, 0.0f, t, APEX_F32);
  if (st == APEX_OK) st = land(a->gx, a->gx_dtype, t, APEX_F32, mk, a->accumulate_x);
  apex__cuda_free(t);
  return st;
}

/* args_nn.h's dgelu (gx fresh, m and k not 0): one product with cuBLASLt's DGELU epilogue where it applies
 * (the operands, gx and dgelu_pre of one half dtype, k a multiple of 8, no gout_scale), taking the previous layer's bias
 * gradient in the same product when cuBLASLt writes it in f32 (BGRAD), else by the column-sum kernel over
 * gx; otherwise the CPU's steps: the product rounded into gx, GELU's backward over it in place, the sums. */
static apex_status dgelu_x(const apex_nn_linear_bwd_args *a, bwd_operands o) {
  const apex_dtype dt = a->gx_dtype;
  void *pre = (void *)a->dgelu_pre.data;
  apex_status st = APEX_ERR_UNSUPPORTED;
  int summed = 0;
  if (o.dtype == dt && a->dgelu_pre.dtype == dt && !a->gout_scale) { /* the epilogues take alpha on the host */
    if (a->dgelu_gb) {
      void *owned, *t = apex__cuda_ws_scratch(a->ws, (size_t)a->k * sizeof(float), &owned, &st);
      apex__cuda_epilogue e = {APEX__EPI_DGELU_BGRAD, NULL, pre, t, 1};
      if (t) st = apex__cuda_gemm_epilogue(0, 0, a->m, a->k, a->n, o.g, o.partner, dt, a->gx, dt, &e);
      if (st == APEX_OK) {
        summed = 1;
        st = land(a->dgelu_gb, APEX_F32, t, APEX_F32, (size_t)a->k, a->accumulate_dgelu_gb);
      }
      apex__cuda_free(owned);
      if (summed) return st;
    }
    apex__cuda_epilogue e = {APEX__EPI_DGELU, NULL, pre, NULL, 0};
    st = apex__cuda_gemm_epilogue(0, 0, a->m, a->k, a->n, o.g, o.partner, dt, a->gx, dt, &e);
    /* no algorithm for the epilogue (its message says why): the separate kernels give the CPU's result */
  }
  if (st != APEX_OK) {
    st = product_x(a, o);
    if (st == APEX_OK)
      st = apex__cuda_ew(APEX__EW_GELU_BWD, a->gx, dt, pre, a->dgelu_pre.dtype, 0.0f, a->gx, dt, (int64_t)a->m * a->k);
  }
  if (st != APEX_OK || !a->dgelu_gb) return st;
  st = zero_unless(a->dgelu_gb, APEX_F32, (size_t)a->k, a->accumulate_dgelu_gb);
  return st == APEX_OK ? apex__cuda_sum_rows(a->gx, dt, a->m, a->k, a->dgelu_gb, APEX_F32, 1) : st;
}

static apex_status linear_bwd_products(const apex_nn_linear_bwd_args *a) {
  apex_status st = APEX_OK;
  size_t m = (size_t)a->m, n = (size_t)a->n, k = (size_t)a->k;
  const int want_x = a->gx && m && k, want_w = a->gw && n && k;
  const apex_dtype gt = a->gout_dtype;
  const int to16_x = want_x && gt == APEX_F32 && a->w.dtype == APEX_BF16, to16_w = want_w && gt == APEX_F32 && a->x.dtype == APEX_BF16;
  const int f32_x = want_x && !to16_x && !(gt != APEX_F32 && a->w.dtype == gt);
  const int f32_w = want_w && !to16_w && !(gt != APEX_F32 && a->x.dtype == gt);
  void *g16 = (to16_x || to16_w) && m && n ? bf16_grad(a->gout, m * n, &st) : NULL;
  void *og = NULL, *ow = NULL, *ox = NULL;
  const float *g32 = st == APEX_OK && (f32_x || f32_w) ? dev_f32((apex_nn_buf){a->gout, gt}, m * n, &og, &st) : NULL;
  if (st == APEX_OK && a->dgelu_pre.data && (a->accumulate_x || !a->gx))
    st = apex__fail(APEX_ERR_INVALID_ARG, "nn_linear_bwd: dgelu_pre needs a gx that holds nothing yet (accumulate_x 0)");
  if (st == APEX_OK && want_x) {
    bwd_operands o = bwd_pair(gt, a->gout, g16, g32, a->w, n * k, &ow, &st);
    if (st == APEX_OK) st = a->dgelu_pre.data ? dgelu_x(a, o) : product_x(a, o);
  } else if (st == APEX_OK && a->dgelu_pre.data && a->dgelu_gb) /* no rows: the sums are zeros */
    st = zero_unless(a->dgelu_gb, APEX_F32, k, a->accumulate_dgelu_gb);
  /* gw [n, k] = gout^T [n, m] x [m, k] */
  if (st == APEX_OK && want_w) {
    bwd_operands o = bwd_pair(gt, a->gout, g16, g32, a->x, m * k, &ox, &st);
    if (st == APEX_OK) st = zero_unless(a->gw, APEX_F32, n * k, a->accumulate_w);
    if (st == APEX_OK) st = apex__cuda_gemm_scaled(1, 0, a->n, a->k, a->m, a->gout_scale, o.g, o.partner, o.dtype, 1.0f, a->gw, APEX_F32);
  }
  if (st == APEX_OK && a->gb && n) {
    st = zero_unless(a->gb, APEX_F32, n, a->accumulate_b);
    if (st == APEX_OK) st = apex__cuda_sum_rows(a->gout, gt, a->m, a->n, a->gb, APEX_F32, 1);
  }
  apex__cuda_free(og);
  apex__cuda_free(ow);
  apex__cuda_free(ox);
  apex__cuda_free(g16);
  return st;
}

apex_status apex__cuda_slot_nn_linear_bwd(const apex_nn_linear_bwd_args *a) {
  if (a->gout_scale && a->gb) return apex__fail(APEX_ERR_INVALID_ARG, "nn_linear_bwd: gout_scale with a bias gradient (args_nn.h)");
  if (!a->gelu) return linear_bwd_products(a);
  /* gpre = gout * gelu'(pre) in scratch, in gout's dtype (args_nn.h; a -0 term stays -0: only the CPU adds
   * it to +0), then the linear's backward on it */
  apex_status st;
  size_t mn = (size_t)a->m * (size_t)a->n;
  void *owned, *gp = apex__cuda_ws_scratch(a->ws, mn * apex_dtype_size(a->gout_dtype), &owned, &st);
  if (st == APEX_OK && mn)
    st = apex__cuda_ew(APEX__EW_GELU_BWD, a->gout, a->gout_dtype, a->pre.data, a->pre.dtype, 0.0f, gp, a->gout_dtype, (int64_t)mn);
  apex_nn_linear_bwd_args p = *a;
  p.gelu = 0;
  p.gout = gp;
  if (st == APEX_OK) st = linear_bwd_products(&p);
  apex__cuda_free(owned);
  return st;
}

/* cuBLASLt's batch count is an int: longer batches go in runs of at most INT_MAX products. */
#define BATCH_RUN ((size_t)INT_MAX)

/* The raw product (args_nn.h's apex_nn_gemm_ext): one entry through cuBLASLt's bias and GELU epilogues
 * (the bias read in the output's dtype), a batch without them through the strided batched product. */
static apex_status matmul_ext(const apex_nn_matmul_args *a) {
  const apex_nn_gemm_ext *e = a->ext;
  int64_t m = a->m, n = a->n, k = a->k;
  if (a->batch != 1) {
    if (e->bias.data || e->gelu) return unsupported("nn_matmul", "a batch of products with a bias or GELU epilogue");
    return apex__cuda_gemm_batched("nn_matmul", e->trans_a, e->trans_b, m, n, k, e->alpha, a->a.data, e->trans_a ? m : k, m * k,
                                   a->b.data, e->trans_b ? k : n, a->b_batched ? k * n : 0, a->a.dtype, e->beta, a->out, n, m * n,
                                   a->out_dtype, (int)a->batch);
  }
  void *bias = (void *)e->bias.data;
  apex_status st = APEX_OK;
  if (bias && e->bias.dtype != a->out_dtype) {
    bias = NULL;
    st = apex__cuda_alloc((size_t)n * apex_dtype_size(a->out_dtype), 0, &bias);
    if (st == APEX_OK) st = apex__cuda_convert(bias, a->out_dtype, e->bias.data, e->bias.dtype, (size_t)n);
  }
  if (st == APEX_OK)
    st = apex__cuda_gemm(e->trans_a, e->trans_b, m, n, k, e->alpha, a->a.data, a->b.data, a->a.dtype, e->beta, a->out, a->out_dtype,
                         bias, e->gelu);
  if (bias != e->bias.data) apex__cuda_free(bias);
  return st;
}

apex_status apex__cuda_slot_nn_matmul(const apex_nn_matmul_args *a) {
  if (a->ext) return matmul_ext(a);
  int64_t m = a->m, n = a->n, k = a->k, sb = a->b_batched ? k * n : 0;
  apex_nn_buf x = a->a, y = a->b;
  void *ox = NULL, *oy = NULL;
  apex_status st = pair_f32(&x, a->batch * (size_t)(m * k), &y, (a->b_batched ? a->batch : 1) * (size_t)(k * n), &ox, &oy);
  size_t es = apex_dtype_size(x.dtype);
  /* f32 operands give f32 products (as nn_linear): a half result is rounded from them once */
  void *out = a->out, *oo = NULL;
  apex_dtype ot = x.dtype == APEX_F32 ? APEX_F32 : a->out_dtype;
  if (st == APEX_OK && ot != a->out_dtype) out = oo = scratch(a->batch * (size_t)(m * n), &st);
  size_t es_out = apex_dtype_size(ot);
  for (size_t i0 = 0; st == APEX_OK && i0 < a->batch; i0 += BATCH_RUN) {
    size_t run = a->batch - i0 < BATCH_RUN ? a->batch - i0 : BATCH_RUN;
    st = apex__cuda_gemm_batched("nn_matmul", 0, 0, m, n, k, 1.0f, (const char *)x.data + i0 * (size_t)(m * k) * es, k, m * k,
                                 (const char *)y.data + i0 * (size_t)sb * es, n, sb, x.dtype, 0.0f,
                                 (char *)out + i0 * (size_t)(m * n) * es_out, n, m * n, ot, (int)run);
  }
  if (st == APEX_OK && oo) st = apex__cuda_convert(a->out, a->out_dtype, oo, APEX_F32, a->batch * (size_t)(m * n));
  apex__cuda_free(ox);
  apex__cuda_free(oy);
  apex__cuda_free(oo);
  return st;
}

apex_status apex__cuda_slot_nn_matmul_bwd(const apex_nn_matmul_bwd_args *a) {
  apex_status st = APEX_OK;
  int64_t m = a->m, n = a->n, k = a->k, sb = a->b_batched ? k * n : 0;
  size_t nb = (a->b_batched ? a->batch : 1) * (size_t)(k * n), ng = a->batch * (size_t)(m * n);
  /* a bf16 partner meets the gradient rounded to bf16 (bf16_grad); any other is read as f32 with the f32
   * gradient (widened when it is f16) */
  const int half_a = a->ga && a->b.dtype == APEX_BF16, half_b = a->gb && a->a.dtype == APEX_BF16;
  void *g16 = half_a || half_b ? bf16_grad(a->gout, ng, &st) : NULL;
  void *oa = NULL, *ob = NULL;
  const char *B = st == APEX_OK && a->ga ? (half_a ? (const char *)a->b.data : (const char *)dev_f32(a->b, nb, &ob, &st)) : NULL;
  const char *A = st == APEX_OK && a->gb ? (half_b ? (const char *)a->a.data : (const char *)dev_f32(a->a, a->batch * (size_t)(m * k), &oa, &st))
                                         : NULL;
  const apex_dtype ta = half_a ? APEX_BF16 : APEX_F32, tb = half_b ? APEX_BF16 : APEX_F32;
  const char *ga_src = half_a ? (const char *)g16 : (const char *)a->gout, *gb_src = half_b ? (const char *)g16 : (const char *)a->gout;
  const size_t ea = apex_dtype_size(ta), eb = apex_dtype_size(tb);
  for (size_t i0 = 0; st == APEX_OK && B && i0 < a->batch; i0 += BATCH_RUN) {
    size_t run = a->batch - i0 < BATCH_RUN ? a->batch - i0 : BATCH_RUN;
    /* ga_i [m, k] = gout_i [m, n] b_i^T (b_i stored [k, n]) */
    st = apex__cuda_gemm_batched("nn_matmul_bwd", 0, 1, m, k, n, 1.0f, ga_src + i0 * (size_t)(m * n) * ea, n, m * n, B + i0 * (size_t)sb * ea,
                                 n, sb, ta, a->accumulate_a ? 1.0f : 0.0f, a->ga + i0 * (size_t)(m * k), k, m * k, APEX_F32, (int)run);
  }
  float beta = a->accumulate_b ? 1.0f : 0.0f;
  /* gb_i [k, n] = a_i^T gout_i; a shared b's gradient is the sum over the batch, which is one product
   * of the stacked a [batch * m, k] with the stacked gout [batch * m, n] */
  if (st == APEX_OK && A && a->b_batched)
    for (size_t i0 = 0; st == APEX_OK && i0 < a->batch; i0 += BATCH_RUN) {
      size_t run = a->batch - i0 < BATCH_RUN ? a->batch - i0 : BATCH_RUN;
      st = apex__cuda_gemm_batched("nn_matmul_bwd", 1, 0, k, n, m, 1.0f, A + i0 * (size_t)(m * k) * eb, k, m * k,
                                   gb_src + i0 * (size_t)(m * n) * eb, n, m * n, tb, beta, a->gb + i0 * (size_t)(k * n), n, k * n, APEX_F32,
                                   (int)run);
    }
  else if (st == APEX_OK && A)
    st = apex__cuda_gemm_batched("nn_matmul_bwd", 1, 0, k, n, (int64_t)a->batch * m, 1.0f, A, k, 0, gb_src, n, 0, tb, beta, a->gb, n, 0,
                                 APEX_F32, 1);
  apex__cuda_free(oa);
  apex__cuda_free(ob);
  apex__cuda_free(g16);
  return st;
}

/* ---- convolution ------------------------------------------------------------------------------------- */

static apex__cuda_conv conv_of(const apex_nn_conv_geom *g, apex_dtype dt) {
  return (apex__cuda_conv){.n = g->n, .c = g->c, .h = g->h, .w = g->w, .k = g->o, .r = g->kh, .s = g->kw, .p = g->ho,
                           .q = g->wo, .pad_h = g->ph, .pad_w = g->pw, .stride_h = g->sh, .stride_w = g->sw,
                           .dtype = dt};
}

apex_status apex__cuda_slot_nn_conv2d(const apex_nn_conv2d_args *a) {
  if (a->w.dtype == a->x.dtype && a->out_dtype == a->x.dtype) {
    apex__cuda_conv g = conv_of(&a->geom, a->x.dtype);
    return apex__cuda_conv2d_fwd(&g, a->x.data, a->w.data, a->bias.data, a->bias.dtype, a->out);
  }
  /* cuDNN takes one dtype: mixed operands run in f32 on exact widenings, the result rounded once */
  const apex_nn_conv_geom *G = &a->geom;
  size_t nx = (size_t)G->n * G->c * G->h * G->w, nw = (size_t)G->o * G->c * G->kh * G->kw, no = (size_t)G->n * G->o * G->ho * G->wo;
  void *ox = NULL, *ow = NULL, *oy = NULL;
  apex_status st = APEX_OK;
  const float *x = dev_f32(a->x, nx, &ox, &st), *w = x ? dev_f32(a->w, nw, &ow, &st) : NULL;
  void *y = a->out;
  if (st == APEX_OK && a->out_dtype != APEX_F32) y = oy = scratch(no, &st);
  apex__cuda_conv g = conv_of(G, APEX_F32);
  if (st == APEX_OK) st = apex__cuda_conv2d_fwd(&g, x, w, a->bias.data, a->bias.dtype, y);
  if (st == APEX_OK && oy) st = apex__cuda_convert(a->out, a->out_dtype, oy, APEX_F32, no);
  apex__cuda_free(ox);
  apex__cuda_free(ow);
  apex__cuda_free(oy);
  return st;
}

apex_status apex__cuda_slot_nn_conv2d_bwd(const apex_nn_conv2d_bwd_args *a) {
  const apex_nn_conv_geom *G = &a->geom;
  apex__cuda_conv g = conv_of(G, APEX_F32);
  size_t nx = (size_t)G->n * G->c * G->h * G->w, nw = (size_t)G->o * G->c * G->kh * G->kw, nb = (size_t)G->o;
  /* cuDNN writes the gradients in the inputs' dtype and the slot's are f32, so it runs on f32 copies of
   * low-precision inputs; it overwrites its outputs, so each goes to scratch and lands by its flag */
  void *ox = NULL, *ow = NULL;
  apex_status st = APEX_OK;
  const float *x = a->gw ? dev_f32(a->x, nx, &ox, &st) : NULL;
  const float *w = st == APEX_OK && a->gx ? dev_f32(a->w, nw, &ow, &st) : NULL;
  float *dx = st == APEX_OK && a->gx ? scratch(nx, &st) : NULL;
  float *dw = st == APEX_OK && a->gw ? scratch(nw, &st) : NULL;
  float *db = st == APEX_OK && a->gb ? scratch(nb, &st) : NULL;
  if (st == APEX_OK) st = apex__cuda_conv2d_bwd(&g, a->gout, x, w, dx, dw, db, APEX_F32);
  const landing l[3] = {{a->gx, dx, nx, a->accumulate_x}, {a->gw, dw, nw, a->accumulate_w}, {a->gb, db, nb, a->accumulate_b}};
  return land_grads(st, l, ox, ow);
}

/* ---- kernels whose layout the slots do not share ------------------------------------------------------ */

/* ---- attention ----------------------------------------------------------------------------------- */

/* The kernels read q, k and v in one dtype (cuBLASLt's products). */
static apex_status attention_dtypes(const char *slot, apex_nn_buf q, apex_nn_buf k, apex_nn_buf v) {
  if (q.dtype == k.dtype && q.dtype == v.dtype) return APEX_OK;
  return apex__fail(APEX_ERR_UNSUPPORTED, "%s: q, k, v of %s, %s, %s on the cuda backend (its products read one dtype); cast them to one",
                    slot, apex_dtype_name(q.dtype), apex_dtype_name(k.dtype), apex_dtype_name(v.dtype));
}

/* The error state before a call that may answer APEX_ERR_UNSUPPORTED for a path the slot then does not
 * take: restored afterwards, so the caller sees only what the taken path said. */
typedef struct saved_error {
  apex_status status;
  char msg[512];
} saved_error;

static void error_save(saved_error *e) {
  e->status = apex_last_status();
  snprintf(e->msg, sizeof e->msg, "%s", e->status == APEX_OK ? "" : apex_last_error());
}

static void error_restore(const saved_error *e) {
  if (e->status == APEX_OK) apex_clear_error();
  else apex__fail(e->status, "%s", e->msg);
}

/* The fused kernels' geometry for the slot's (flash_attention.cu, attention_cudnn.cu), when every buffer
 * is of one half dtype and the extents fit their ints; else 0, and the materialised path runs. */
static int flash_geom(size_t batch, int heads, int t, int d, apex_dtype dt, apex__cuda_flash *g) {
  if ((dt != APEX_F16 && dt != APEX_BF16) || batch > (size_t)INT_MAX) return 0;
  *g = (apex__cuda_flash){.batch = (int)batch, .heads = heads, .t = t, .d = d, .dtype = dt};
  return 1;
}

/* Which fused attention runs, from $APEX_ATTENTION, read at every call so that one program (the benchmark)
 * can time each road in one run:
 *   unset, "" or "auto": cuDNN's fused attention where cuDNN takes the shape (llm.c's and PyTorch's
 *                        fast path on Hopper), else apex's fused kernel, else the materialised path;
 *   "flash":             apex's fused kernel (cuDNN not asked), else the materialised path;
 *   "cudnn":             cuDNN's, and its refusal is the answer (no other path): for measuring it;
 *   "cudnn-nondeterministic": the same with cuDNN's faster backward, whose dQ is summed with atomics
 *                        (not bitwise repeatable);
 *   "hopper":            apex's Hopper kernels (flash_attention_sm90*.cu: TMA, wgmma; compute capability 9.0
 *                        only), forward and backward, and their refusal is the answer: for measuring them.
 *                        It joins auto's order (ahead of cuDNN where faster, else only where it alone runs)
 *                        once bench_attention has timed it against the cudnn and flash roads on a GPU;
 *                        until then auto does not ask it. */
typedef enum { ROAD_AUTO, ROAD_FLASH, ROAD_CUDNN, ROAD_CUDNN_NONDET, ROAD_HOPPER } attention_road;

static apex_status road_of(const char *slot, attention_road *road) {
  const char *v = getenv("APEX_ATTENTION");
  static const char *const names[] = {"auto", "flash", "cudnn", "cudnn-nondeterministic", "hopper"};
  *road = ROAD_AUTO;
  if (!v || !*v) return APEX_OK;
  for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++)
    if (!strcmp(v, names[i])) {
      *road = (attention_road)i;
      return APEX_OK;
    }
  return apex__fail(APEX_ERR_INVALID_ARG, "%s: APEX_ATTENTION='%s' names no attention path; use auto, flash, cudnn, "
                    "cudnn-nondeterministic or hopper (or leave it unset)", slot, v);
}

/* Roads whose refusal is the answer: the ones asked for by name to measure a single path. */
static int road_exclusive(attention_road road) { return road == ROAD_CUDNN || road == ROAD_CUDNN_NONDET || road == ROAD_HOPPER; }

/* The answer of an exclusive road for a call no fused path takes. */
static apex_status fused_only(const char *slot, attention_road road, apex_dtype in, apex_dtype out) {
  return apex__fail(APEX_ERR_UNSUPPORTED, "%s: APEX_ATTENTION asks for %s, which takes q, k, v and the output in one of f16, "
                    "bf16 (this call: %s into %s)", slot, road == ROAD_HOPPER ? "apex's Hopper attention" : "cuDNN's fused attention",
                    apex_dtype_name(in), apex_dtype_name(out));
}

/* Tries cuDNN's fused attention and apex's fused kernel, as the road says (any status but
 * APEX_ERR_UNSUPPORTED is the answer), else the materialised path (attention.cu); the hopper road runs apex's
 * Hopper kernel alone. */
apex_status apex__cuda_slot_nn_attention(const apex_nn_attention_args *a) {
  apex_status st = attention_dtypes("nn_attention", a->q, a->k, a->v);
  if (st != APEX_OK || !a->batch || !a->heads || !a->t) return st;
  attention_road road;
  if ((st = road_of("nn_attention", &road)) != APEX_OK) return st;
  apex__cuda_flash g;
  if (a->out_dtype == a->q.dtype && flash_geom(a->batch, a->heads, a->t, a->d, a->q.dtype, &g)) {
    g.ld_q = (int64_t)a->ld_q, g.ld_k = (int64_t)a->ld_k, g.ld_v = (int64_t)a->ld_v, g.ld_o = (int64_t)a->ld_out;
    if (road == ROAD_HOPPER) return apex__cuda_flash_sm90_fwd(&g, a->q.data, a->k.data, a->v.data, a->out, a->stats);
    saved_error e;
    error_save(&e);
    if (road != ROAD_FLASH) {
      st = apex__cuda_sdpa_fwd(&g, 1, a->q.data, a->k.data, a->v.data, a->out, a->stats);
      if (st != APEX_ERR_UNSUPPORTED || road != ROAD_AUTO) return st;
      error_restore(&e);
    }
    st = apex__cuda_flash_attention_fwd(&g, a->q.data, a->k.data, a->v.data, a->out, a->stats);
    if (st != APEX_ERR_UNSUPPORTED) return st;
    error_restore(&e);
  } else if (road_exclusive(road)) {
    return fused_only("nn_attention", road, a->q.dtype, a->out_dtype);
  }
  return apex__cuda_attention_slot_fwd(a);
}

/* The fused backwards read dO in the inputs' dtype and write dq, dk, dv in it (not accumulated), with any
 * row strides. dO is gout itself when it is in that dtype, else rounded into scratch once. The three
 * gradients go straight into the slot's buffers when all three are wanted, fresh and in that dtype (the
 * packed q/k/v of a graph that keeps gradients in the values' dtype: the bits of 0.0f + term but for the
 * sign of a zero); otherwise into scratch ([batch, t, heads * d]), landed by the accumulate rule. cuDNN or
 * apex's kernel runs as the road says (in auto, the kernel when cuDNN refuses, with e's error state back), or
 * apex's Hopper kernel on the hopper road. */
static apex_status fused_bwd(const apex_nn_attention_bwd_args *a, apex__cuda_flash *g, attention_road road, const saved_error *e) {
  size_t rows = a->batch * (size_t)a->t, C = (size_t)a->heads * (size_t)a->d, es = apex_dtype_size(g->dtype);
  const int do_direct = a->gout_dtype == g->dtype;
  const int direct = a->gq && a->gk && a->gv && !a->accumulate_q && !a->accumulate_k && !a->accumulate_v && a->gq_dtype == g->dtype &&
                     a->gk_dtype == g->dtype && a->gv_dtype == g->dtype;
  const size_t nbuf = (do_direct ? 0 : 1) + (direct ? 0 : 3);
  void *buf = NULL, *owned = NULL;
  apex_status st = APEX_OK;
  if (nbuf) buf = apex__cuda_ws_scratch(a->ws, nbuf * rows * C * es, &owned, &st);
  if (st != APEX_OK) return st;
  char *next = buf;
  const void *dout = do_direct ? a->gout : (const void *)next;
  if (!do_direct) next += rows * C * es;
  void *dq = direct ? a->gq : next, *dk = direct ? a->gk : next + rows * C * es, *dv = direct ? a->gv : next + 2 * rows * C * es;
  g->ld_do = do_direct ? (int64_t)a->ld_gout : (int64_t)C;
  g->ld_dq = direct ? (int64_t)a->ld_gq : (int64_t)C;
  g->ld_dk = direct ? (int64_t)a->ld_gk : (int64_t)C;
  g->ld_dv = direct ? (int64_t)a->ld_gv : (int64_t)C;
  if (!do_direct)
    st = apex__cuda_rows_copy((void *)dout, g->dtype, (int64_t)C, a->gout, a->gout_dtype, (int64_t)a->ld_gout, (int64_t)rows, (int64_t)C, 0, 0);
  int flash = road == ROAD_FLASH;
  if (st == APEX_OK && road == ROAD_HOPPER) {
    st = apex__cuda_flash_sm90_bwd(g, a->q.data, a->k.data, a->v.data, a->out, dout, a->stats, dq, dk, dv);
  } else if (st == APEX_OK && !flash) {
    st = apex__cuda_sdpa_bwd(g, 1, road == ROAD_CUDNN_NONDET, a->q.data, a->k.data, a->v.data, a->out, dout, a->stats, dq, dk, dv);
    if (st == APEX_ERR_UNSUPPORTED && road == ROAD_AUTO) {
      error_restore(e);
      flash = 1;
    }
  }
  if (st == APEX_OK && flash)
    st = apex__cuda_flash_attention_bwd(g, a->q.data, a->k.data, a->v.data, a->out, dout, a->stats, dq, dk, dv);
  void *dst[3] = {a->gq, a->gk, a->gv};
  const apex_dtype dt[3] = {a->gq_dtype, a->gk_dtype, a->gv_dtype};
  const void *src[3] = {dq, dk, dv};
  const size_t ld[3] = {a->ld_gq, a->ld_gk, a->ld_gv};
  const int acc[3] = {a->accumulate_q, a->accumulate_k, a->accumulate_v};
  for (int w = 0; w < 3 && st == APEX_OK && !direct; w++)
    if (dst[w])
      st = apex__cuda_rows_copy(dst[w], dt[w], (int64_t)ld[w], src[w], g->dtype, (int64_t)C, (int64_t)rows, (int64_t)C, 1, acc[w]);
  apex__cuda_free(owned);
  return st;
}

static apex_status attention_bwd_k(const void *a) { return apex__cuda_attention_slot_bwd(a); }

/* The materialised backward (attention.cu) takes f32 gradients: others reach it through the f32 road. */
static apex_status materialised_bwd(const apex_nn_attention_bwd_args *a) {
  int ran;
  apex_status rs = apex__attention_bwd_f32(&apex__cuda_backend, attention_bwd_k, a, &ran);
  return ran ? rs : apex__cuda_attention_slot_bwd(a);
}

apex_status apex__cuda_slot_nn_attention_bwd(const apex_nn_attention_bwd_args *a) {
  apex_status st = attention_dtypes("nn_attention_bwd", a->q, a->k, a->v);
  if (st != APEX_OK || !a->batch || !a->heads || !a->t || (!a->gq && !a->gk && !a->gv)) return st;
  attention_road road;
  if ((st = road_of("nn_attention_bwd", &road)) != APEX_OK) return st;
  apex__cuda_flash g;
  if (a->out_dtype == a->q.dtype && flash_geom(a->batch, a->heads, a->t, a->d, a->q.dtype, &g)) {
    g.ld_q = (int64_t)a->ld_q, g.ld_k = (int64_t)a->ld_k, g.ld_v = (int64_t)a->ld_v, g.ld_o = (int64_t)a->ld_out;
    saved_error e;
    error_save(&e);
    st = fused_bwd(a, &g, road, &e);
    if (st != APEX_ERR_UNSUPPORTED || road_exclusive(road)) return st;
    error_restore(&e);
  } else if (road_exclusive(road)) {
    return fused_only("nn_attention_bwd", road, a->q.dtype, a->out_dtype);
  }
  return materialised_bwd(a);
}

/* ---- cross entropy, dropout, batch norm ----------------------------------------------------------- */

apex_status apex__cuda_slot_nn_cross_entropy(const apex_nn_cross_entropy_args *a) { return apex__cuda_cross_entropy_slot_fwd(a); }
apex_status apex__cuda_slot_nn_cross_entropy_bwd(const apex_nn_cross_entropy_bwd_args *a) { return apex__cuda_cross_entropy_slot_bwd(a); }
apex_status apex__cuda_slot_nn_dropout(const apex_nn_dropout_args *a) { return apex__cuda_dropout_slot_fwd(a); }
static apex_status dropout_bwd_k(const void *a) { return apex__cuda_dropout_slot_bwd(a); }

apex_status apex__cuda_slot_nn_dropout_bwd(const apex_nn_dropout_bwd_args *a) {
  int ran;
  apex_status rs = apex__dropout_bwd_f32(&apex__cuda_backend, dropout_bwd_k, a, &ran);
  return ran ? rs : apex__cuda_dropout_slot_bwd(a);
}
apex_status apex__cuda_slot_nn_batch_norm(const apex_nn_batch_norm_args *a) {
  /* statistics only (args_nn.h): bn_stats.cu's Welford kernel */
  if (!a->out && a->training && !a->given_mean && a->batch_var)
    return apex__cuda_bn_stats(a->x.data, a->x.dtype, (int64_t)a->N, (int64_t)a->C, (int64_t)a->S, a->stats, a->batch_var,
                               a->batch_m2);
  return apex__cuda_batch_norm_slot_fwd(a);
}
