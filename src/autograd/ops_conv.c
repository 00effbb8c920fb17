/* ops_conv.c: the fronts of conv2d, max and average pooling: autocast, geometry checks, recording;
 * the kernels are the backend's (backend/args_nn.h; the CPU's in backend/cpu/conv.c). */
#include "autograd/ag.h"

typedef ag_conv_geom conv_geom;

apex_var *apex_conv2d(apex_graph *g, apex_var *x, apex_var *w, apex_var *b, const apex_conv2d_options *opts) {
  static const apex_conv2d_options defaults = {0};
  if (!opts) opts = &defaults;
  apex_var *in[3] = {x, w, b}, *u[3];
  apex_dtype dt;
  if (apex__dispatch(g, APEX_OP_CONV2D, 3, in, 4u, u, &dt) != APEX_OK) return NULL;
  const apex_tensor *X = u[0]->value, *W = u[1]->value;
  conv_geom q = {0};
  q.sh = opts->stride_h ? opts->stride_h : 1;
  q.sw = opts->stride_w ? opts->stride_w : 1;
  q.ph = opts->pad_h;
  q.pw = opts->pad_w;
  if (X->ndim != 4 || W->ndim != 4 || X->shape[1] != W->shape[1] || (b && (u[2]->value->ndim != 1 || u[2]->value->shape[0] != W->shape[0])))
    return apex__fail_null(APEX_ERR_SHAPE, "conv2d: input %s, weight %s, bias %s do not fit (need x [N, C, H, W], w [O, C, KH, KW], b [O])",
                           apex__shape(x), apex__shape(w), b ? apex__shape(b) : "none");
  if (q.sh < 1 || q.sw < 1 || q.ph < 0 || q.pw < 0)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "conv2d: stride %dx%d, padding %dx%d on input %s", q.sh, q.sw, q.ph, q.pw, apex__shape(x));
  q.n = (int)X->shape[0], q.c = (int)X->shape[1], q.h = (int)X->shape[2], q.w = (int)X->shape[3];
  q.o = (int)W->shape[0], q.kh = (int)W->shape[2], q.kw = (int)W->shape[3];
  q.ho = (q.h + 2 * q.ph - q.kh) / q.sh + 1;
  q.wo = (q.w + 2 * q.pw - q.kw) / q.sw + 1;
  if (q.h + 2 * q.ph < q.kh || q.w + 2 * q.pw < q.kw)
    return apex__fail_null(APEX_ERR_SHAPE, "conv2d: kernel %s is larger than the padded input %s", apex__shape(w), apex__shape(x));
  const apex_backend *be = apex__ag_backend(u[0], APEX_OP_CONV2D);
  if (!be || !AG_HAS(be, nn_conv2d, APEX_OP_CONV2D)) return NULL;
  int64_t shape[4] = {q.n, q.o, q.ho, q.wo};
  apex_var *out = apex__result(g, APEX_OP_CONV2D, dt, 4, shape, 3, u);
  if (!out) return NULL;
  out->p.conv = q;
  if (be->nn_conv2d(&(apex_nn_conv2d_args){.geom = q, .x = ag_buf(X), .w = ag_buf(W), .bias = ag_buf_of(b ? u[2] : NULL),
                                           .out = apex_tensor_data(out->value), .out_dtype = out->value->dtype,
                                           .ws = apex__ag_workspace(g)}) != APEX_OK)
    return NULL;
  return out;
}

/* The input's first gradient need not be zeroed (apex__gbuf_w): the kernel writes every element. */
apex_status apex__bwd_conv2d(apex_graph *g, apex_var *out) {
  const apex_backend *be = apex__ag_backend(out, APEX_OP_CONV2D);
  if (!be || !AG_HAS(be, nn_conv2d_bwd, APEX_OP_CONV2D)) return apex_last_status();
  int fresh;
  float *gx = apex__gbuf_w(g, out->in[0], &fresh), *gw = apex__gbuf(g, out->in[1]), *gb = apex__gbuf(g, out->in[2]);
  if (!gw && !gx && !gb) return APEX_OK;
  return be->nn_conv2d_bwd(&(apex_nn_conv2d_bwd_args){.geom = out->p.conv, .x = ag_buf(out->in[0]->value),
                                                      .w = ag_buf(out->in[1]->value), .gout = out->gbuf, .gx = gx, .gw = gw,
                                                      .gb = gb, .accumulate_x = !fresh, .accumulate_w = 1, .accumulate_b = 1,
                                                      .ws = apex__ag_workspace(g)});
}

/* ---- pooling ------------------------------------------------------------------------------------ */

static apex_var *pool(apex_graph *g, apex_op op, apex_var *x, const apex_pool2d_options *opts) {
  apex_var *u;
  apex_dtype dt;
  if (apex__dispatch(g, op, 1, &x, 0, &u, &dt) != APEX_OK) return NULL;
  const char *name = apex_op_name(op);
  if (!opts) return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: NULL options (the kernel size is required) for %s", name, apex__shape(x));
  const apex_tensor *X = u->value;
  conv_geom q = {0};
  q.kh = opts->kernel_h, q.kw = opts->kernel_w;
  q.sh = opts->stride_h ? opts->stride_h : q.kh;
  q.sw = opts->stride_w ? opts->stride_w : q.kw;
  q.ph = opts->pad_h, q.pw = opts->pad_w;
  if (X->ndim != 4) return apex__fail_null(APEX_ERR_SHAPE, "%s: input %s must be [N, C, H, W]", name, apex__shape(x));
  if (q.kh < 1 || q.kw < 1 || q.sh < 1 || q.sw < 1 || q.ph < 0 || q.pw < 0 || 2 * q.ph > q.kh || 2 * q.pw > q.kw)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: kernel %dx%d, stride %dx%d, padding %dx%d on %s (padding at most half the kernel)", name,
                           q.kh, q.kw, q.sh, q.sw, q.ph, q.pw, apex__shape(x));
  q.n = (int)X->shape[0], q.c = (int)X->shape[1], q.h = (int)X->shape[2], q.w = (int)X->shape[3], q.o = q.c;
  if (q.h + 2 * q.ph < q.kh || q.w + 2 * q.pw < q.kw)
    return apex__fail_null(APEX_ERR_SHAPE, "%s: kernel %dx%d is larger than the padded input %s", name, q.kh, q.kw, apex__shape(x));
  q.ho = (q.h + 2 * q.ph - q.kh) / q.sh + 1;
  q.wo = (q.w + 2 * q.pw - q.kw) / q.sw + 1;
  const apex_backend *be = apex__ag_backend(u, op);
  if (!be || !AG_HAS(be, nn_pool2d, op)) return NULL;
  int64_t shape[4] = {q.n, q.c, q.ho, q.wo};
  apex_var *out = apex__result(g, op, dt, 4, shape, 1, &u);
  if (!out) return NULL;
  out->p.conv = q;
  size_t planes = (size_t)q.n * q.c, P = (size_t)q.ho * q.wo;
  int32_t *arg = op == APEX_OP_MAX_POOL2D ? apex__scratch(g, ag_nz(planes * P) * sizeof(int32_t)) : NULL;
  if (op == APEX_OP_MAX_POOL2D && !arg) return NULL;
  out->aux = arg;
  if (be->nn_pool2d(&(apex_nn_pool2d_args){.geom = q, .x = ag_buf(X), .out = apex_tensor_data(out->value),
                                           .out_dtype = out->value->dtype, .argmax = arg, .ws = apex__ag_workspace(g)}) != APEX_OK)
    return NULL;
  return out;
}

apex_var *apex_max_pool2d(apex_graph *g, apex_var *x, const apex_pool2d_options *o) { return pool(g, APEX_OP_MAX_POOL2D, x, o); }
apex_var *apex_avg_pool2d(apex_graph *g, apex_var *x, const apex_pool2d_options *o) { return pool(g, APEX_OP_AVG_POOL2D, x, o); }

/* The input's first gradient need not be zeroed (apex__gbuf_w): the kernel zeroes each plane as it
 * reaches it, while the plane is about to be in cache anyway. */
static apex_status pool_bwd(apex_graph *g, apex_var *out) {
  const apex_backend *be = apex__ag_backend(out, out->op);
  if (!be || !AG_HAS(be, nn_pool2d_bwd, out->op)) return apex_last_status();
  int fresh;
  float *gx = apex__gbuf_w(g, out->in[0], &fresh);
  if (!gx) return APEX_OK;
  return be->nn_pool2d_bwd(&(apex_nn_pool2d_bwd_args){.geom = out->p.conv, .argmax = out->aux, .gout = out->gbuf, .gx = gx,
                                                      .accumulate_x = !fresh});
}

apex_status apex__bwd_max_pool2d(apex_graph *g, apex_var *out) { return pool_bwd(g, out); }
apex_status apex__bwd_avg_pool2d(apex_graph *g, apex_var *out) { return pool_bwd(g, out); }
