/* ops_elementwise.c: the fronts of broadcasting add/sub/mul/div/pow and comparisons, scale,
 * exp/log/pow, activations and dropout: autocast, shape checks and recording here, the loops in the
 * backend's elementwise slots (backend/args_nn.h; the CPU's in backend/cpu/elementwise.c). */
#include <math.h>

#include "autograd/ag.h"

/* The broadcast of a and b as rows of the output's last dimension (apex_nn_bcast); 0 when the shapes
 * do not broadcast. */
static int bcast_plan(const apex_tensor *a, const apex_tensor *b, apex_nn_bcast *p) {
  int nd = a->ndim > b->ndim ? a->ndim : b->ndim;
  const apex_tensor *t[2] = {a, b};
  p->nd = nd;
  for (int d = 0; d < nd; d++) {
    int64_t s[2];
    for (int k = 0; k < 2; k++) {
      int dk = d - (nd - t[k]->ndim);
      s[k] = dk >= 0 ? t[k]->shape[dk] : 1;
    }
    if (s[0] != s[1] && s[0] != 1 && s[1] != 1) return 0;
    p->shape[d] = s[0] == 1 ? s[1] : s[0];
  }
  for (int k = 0; k < 2; k++) {
    int64_t stride = 1;
    for (int d = nd - 1; d >= 0; d--) {
      int dk = d - (nd - t[k]->ndim);
      int64_t sz = dk >= 0 ? t[k]->shape[dk] : 1;
      p->st[k][d] = sz == 1 ? 0 : stride;
      stride *= sz;
    }
  }
  p->len = nd ? (size_t)p->shape[nd - 1] : 1;
  size_t total = 1;
  for (int d = 0; d < nd; d++) total *= (size_t)p->shape[d];
  p->rows = p->len ? total / p->len : 0;
  return 1;
}

static int is_comparison(apex_op op) { return op == APEX_OP_GT || op == APEX_OP_LT || op == APEX_OP_EQ; }

/* The kernel's kind of a binary op; -1 (after a message) for any other op. Every op is named, so the
 * compiler (-Wswitch) catches one added to apex_op without a decision here. */
static int binary_kind(apex_op op) {
  switch (op) {
  case APEX_OP_ADD: return APEX_NN_ADD;
  case APEX_OP_SUB: return APEX_NN_SUB;
  case APEX_OP_MUL: return APEX_NN_MUL;
  case APEX_OP_DIV: return APEX_NN_DIV;
  case APEX_OP_POW_TENSOR: return APEX_NN_POW;
  case APEX_OP_GT: return APEX_NN_GT;
  case APEX_OP_LT: return APEX_NN_LT;
  case APEX_OP_EQ: return APEX_NN_EQ;
  case APEX_OP_LEAF: case APEX_OP_CAST: case APEX_OP_SCALE: case APEX_OP_RELU: case APEX_OP_GELU:
  case APEX_OP_GELU_TANH: case APEX_OP_TANH: case APEX_OP_SIGMOID: case APEX_OP_DROPOUT: case APEX_OP_MATMUL:
  case APEX_OP_LINEAR: case APEX_OP_CONV2D: case APEX_OP_MAX_POOL2D: case APEX_OP_AVG_POOL2D:
  case APEX_OP_BATCH_NORM: case APEX_OP_LAYER_NORM: case APEX_OP_RMS_NORM: case APEX_OP_EMBEDDING:
  case APEX_OP_SOFTMAX: case APEX_OP_LOG_SOFTMAX: case APEX_OP_CROSS_ENTROPY: case APEX_OP_MSE:
  case APEX_OP_BCE_WITH_LOGITS: case APEX_OP_BCE: case APEX_OP_SUM: case APEX_OP_MEAN: case APEX_OP_RESHAPE:
  case APEX_OP_PERMUTE: case APEX_OP_CONCAT: case APEX_OP_ATTENTION: case APEX_OP_SYNC_BATCH_NORM:
  case APEX_OP_BATCH_NORM_RELU: case APEX_OP_EXP: case APEX_OP_LOG: case APEX_OP_POW: case APEX_OP_NORM:
  case APEX_OP_LINEAR_GELU: case APEX_OP_LINEAR_CROSS_ENTROPY: case APEX_OP_COUNT:
    break;
  }
  apex__fail(APEX_ERR_INVALID_ARG, "%s (op %d) is not a binary elementwise op", apex_op_name(op), (int)op);
  return -1;
}

/* The binary op's front; with run 0 it records the result without computing it (apex__add_unfilled). */
static apex_var *binary_op(apex_graph *g, apex_op op, apex_var *a, apex_var *b, int run) {
  apex_var *in[2] = {a, b}, *u[2];
  apex_dtype dt;
  if (apex__dispatch(g, op, 2, in, 0, u, &dt) != APEX_OK) return NULL;
  int kind = binary_kind(op);
  const apex_backend *be = kind < 0 ? NULL : apex__ag_backend(u[0], op);
  if (!be || !AG_HAS(be, nn_binary, op)) return NULL;
  apex_nn_bcast p;
  if (!bcast_plan(u[0]->value, u[1]->value, &p))
    return apex__fail_null(APEX_ERR_SHAPE, "%s: shapes %s and %s do not broadcast", apex_op_name(op), apex__shape(a), apex__shape(b));
  /* A comparison's mask is a step function of its inputs, with no useful derivative: it records no
   * inputs, so it never requires gradients and keeps nothing alive for a backward (PyTorch's bool
   * results do not require grad either). */
  apex_var *out = apex__result(g, op, dt, p.nd, p.shape, is_comparison(op) ? 0 : 2, u);
  if (!out || !run) return out;
  if (be->nn_binary(&(apex_nn_binary_args){.kind = (apex_nn_binary_kind)kind, .plan = &p, .a = ag_buf(u[0]->value), .b = ag_buf(u[1]->value),
                                           .numel_a = ag_numel(u[0]), .numel_b = ag_numel(u[1]), .out = apex_tensor_data(out->value),
                                           .out_dtype = out->value->dtype, .ws = apex__ag_workspace(g)}) != APEX_OK)
    return NULL;
  return out;
}

static apex_var *binary(apex_graph *g, apex_op op, apex_var *a, apex_var *b) { return binary_op(g, op, a, b, 1); }

apex_var *apex__add_unfilled(apex_graph *g, apex_var *a, apex_var *b) { return binary_op(g, APEX_OP_ADD, a, b, 0); }
apex_var *apex_add(apex_graph *g, apex_var *a, apex_var *b) { return binary(g, APEX_OP_ADD, a, b); }
apex_var *apex_sub(apex_graph *g, apex_var *a, apex_var *b) { return binary(g, APEX_OP_SUB, a, b); }
apex_var *apex_mul(apex_graph *g, apex_var *a, apex_var *b) { return binary(g, APEX_OP_MUL, a, b); }
apex_var *apex_div(apex_graph *g, apex_var *a, apex_var *b) { return binary(g, APEX_OP_DIV, a, b); }
apex_var *apex_pow_tensor(apex_graph *g, apex_var *a, apex_var *b) { return binary(g, APEX_OP_POW_TENSOR, a, b); }
apex_var *apex_gt(apex_graph *g, apex_var *a, apex_var *b) { return binary(g, APEX_OP_GT, a, b); }
apex_var *apex_lt(apex_graph *g, apex_var *a, apex_var *b) { return binary(g, APEX_OP_LT, a, b); }
apex_var *apex_eq(apex_graph *g, apex_var *a, apex_var *b) { return binary(g, APEX_OP_EQ, a, b); }

apex_status apex__bwd_binary(apex_graph *g, apex_var *out) {
  apex_nn_bcast p;
  bcast_plan(out->in[0]->value, out->in[1]->value, &p);
  apex_op op = out->op;
  int kind = binary_kind(op);
  const apex_backend *be = kind < 0 ? NULL : apex__ag_backend(out, op);
  if (!be || !AG_HAS(be, nn_binary_bwd, op)) return apex_last_status();
  /* add and sub have constant partials and read no values (op_table.c lets them go) */
  int reads = op == APEX_OP_MUL || op == APEX_OP_DIV || op == APEX_OP_POW_TENSOR;
  apex_nn_buf v[2] = {{NULL, APEX_F32}, {NULL, APEX_F32}};
  if (reads) v[0] = ag_buf(out->in[0]->value), v[1] = ag_buf(out->in[1]->value);
  /* a and b may be one var: the kernel adds a's terms, then b's, into the one buffer */
  apex_dtype ta, tb;
  void *ga = apex__gbuf_any(g, out->in[0], &ta), *gb = apex__gbuf_any(g, out->in[1], &tb);
  if (!ga && !gb) return APEX_OK;
  return be->nn_binary_bwd(&(apex_nn_binary_bwd_args){.kind = (apex_nn_binary_kind)kind, .plan = &p, .a = v[0], .b = v[1],
                                                      .numel_a = ag_numel(out->in[0]), .numel_b = ag_numel(out->in[1]),
                                                      .gout = out->gbuf, .gout_dtype = out->gdt, .ga = ga, .gb = gb, .ga_dtype = ta,
                                                      .gb_dtype = tb, .accumulate_a = 1, .accumulate_b = 1, .ws = apex__ag_workspace(g)});
}

/* ---- scale --------------------------------------------------------------------------------------- */

apex_var *apex_scale(apex_graph *g, apex_var *x, float s) {
  apex_var *u;
  apex_dtype dt;
  if (apex__dispatch(g, APEX_OP_SCALE, 1, &x, 0, &u, &dt) != APEX_OK) return NULL;
  const apex_backend *be = apex__ag_backend(u, APEX_OP_SCALE);
  if (!be || !AG_HAS(be, nn_scale, APEX_OP_SCALE)) return NULL;
  apex_var *out = apex__result(g, APEX_OP_SCALE, dt, u->value->ndim, u->value->shape, 1, &u);
  if (!out) return NULL;
  out->p.scale.s = s;
  if (be->nn_scale(&(apex_nn_scale_args){.n = ag_numel(out), .x = ag_buf(u->value), .out = apex_tensor_data(out->value),
                                         .out_dtype = out->value->dtype, .s = s, .ws = apex__ag_workspace(g)}) != APEX_OK)
    return NULL;
  return out;
}

apex_status apex__bwd_scale(apex_graph *g, apex_var *out) {
  const apex_backend *be = apex__ag_backend(out, APEX_OP_SCALE);
  if (!be || !AG_HAS(be, nn_scale_bwd, APEX_OP_SCALE)) return apex_last_status();
  apex_dtype dt;
  void *gx = apex__gbuf_any(g, out->in[0], &dt);
  if (!gx) return APEX_OK;
  return be->nn_scale_bwd(&(apex_nn_scale_bwd_args){.n = ag_numel(out), .gout = out->gbuf, .gout_dtype = out->gdt, .gx = gx, .gx_dtype = dt,
                                                    .s = out->p.scale.s, .accumulate_x = 1});
}

/* ---- activations --------------------------------------------------------------------------------- */

/* The kernel's kind of a unary op; -1 (after a message) for any other op, every op named as in
 * binary_kind. */
static int unary_kind(apex_op op) {
  switch (op) {
  case APEX_OP_RELU: return APEX_NN_RELU;
  case APEX_OP_GELU: return APEX_NN_GELU;
  case APEX_OP_GELU_TANH: return APEX_NN_GELU_TANH;
  case APEX_OP_TANH: return APEX_NN_TANH;
  case APEX_OP_SIGMOID: return APEX_NN_SIGMOID;
  case APEX_OP_EXP: return APEX_NN_EXP;
  case APEX_OP_LOG: return APEX_NN_LOG;
  case APEX_OP_POW: return APEX_NN_POW_SCALAR;
  case APEX_OP_LEAF: case APEX_OP_CAST: case APEX_OP_ADD: case APEX_OP_SUB: case APEX_OP_MUL: case APEX_OP_DIV:
  case APEX_OP_SCALE: case APEX_OP_DROPOUT: case APEX_OP_MATMUL: case APEX_OP_LINEAR: case APEX_OP_CONV2D:
  case APEX_OP_MAX_POOL2D: case APEX_OP_AVG_POOL2D: case APEX_OP_BATCH_NORM: case APEX_OP_LAYER_NORM:
  case APEX_OP_RMS_NORM: case APEX_OP_EMBEDDING: case APEX_OP_SOFTMAX: case APEX_OP_LOG_SOFTMAX:
  case APEX_OP_CROSS_ENTROPY: case APEX_OP_MSE: case APEX_OP_BCE_WITH_LOGITS: case APEX_OP_BCE: case APEX_OP_SUM:
  case APEX_OP_MEAN: case APEX_OP_RESHAPE: case APEX_OP_PERMUTE: case APEX_OP_CONCAT: case APEX_OP_ATTENTION:
  case APEX_OP_SYNC_BATCH_NORM: case APEX_OP_BATCH_NORM_RELU: case APEX_OP_POW_TENSOR: case APEX_OP_NORM:
  case APEX_OP_GT: case APEX_OP_LT: case APEX_OP_EQ: case APEX_OP_LINEAR_GELU: case APEX_OP_LINEAR_CROSS_ENTROPY: case APEX_OP_COUNT:
    break;
  }
  apex__fail(APEX_ERR_INVALID_ARG, "%s (op %d) is not a unary elementwise op", apex_op_name(op), (int)op);
  return -1;
}

/* p: pow's exponent (kept in p.scale.s for the backward); unused by the other ops. */
static apex_var *unary(apex_graph *g, apex_op op, apex_var *x, float p) {
  apex_var *u;
  apex_dtype dt;
  if (apex__dispatch(g, op, 1, &x, 0, &u, &dt) != APEX_OK) return NULL;
  int kind = unary_kind(op);
  const apex_backend *be = kind < 0 ? NULL : apex__ag_backend(u, op);
  if (!be || !AG_HAS(be, nn_unary, op)) return NULL;
  apex_var *out = apex__result(g, op, dt, u->value->ndim, u->value->shape, 1, &u);
  if (!out) return NULL;
  out->p.scale.s = p;
  if (be->nn_unary(&(apex_nn_unary_args){.kind = (apex_nn_unary_kind)kind, .n = ag_numel(out), .x = ag_buf(u->value),
                                         .out = apex_tensor_data(out->value), .out_dtype = out->value->dtype, .p = p,
                                         .ws = apex__ag_workspace(g)}) != APEX_OK)
    return NULL;
  return out;
}

apex_var *apex_relu(apex_graph *g, apex_var *x) { return unary(g, APEX_OP_RELU, x, 0.0f); }
apex_var *apex_gelu(apex_graph *g, apex_var *x) { return unary(g, APEX_OP_GELU, x, 0.0f); }
apex_var *apex_gelu_tanh(apex_graph *g, apex_var *x) { return unary(g, APEX_OP_GELU_TANH, x, 0.0f); }
apex_var *apex_tanh(apex_graph *g, apex_var *x) { return unary(g, APEX_OP_TANH, x, 0.0f); }
apex_var *apex_sigmoid(apex_graph *g, apex_var *x) { return unary(g, APEX_OP_SIGMOID, x, 0.0f); }
apex_var *apex_exp(apex_graph *g, apex_var *x) { return unary(g, APEX_OP_EXP, x, 0.0f); }
apex_var *apex_log(apex_graph *g, apex_var *x) { return unary(g, APEX_OP_LOG, x, 0.0f); }
apex_var *apex_pow(apex_graph *g, apex_var *x, float p) { return unary(g, APEX_OP_POW, x, p); }

/* ReLU's backward reads its output, not its input, so that the input (usually a linear's output
 * nothing else keeps) can go (op_table.c), and writes every element of the gradient, so its buffer
 * need not be zeroed first (apex__gbuf_w). */
apex_status apex__bwd_unary(apex_graph *g, apex_var *out) {
  int kind = unary_kind(out->op);
  const apex_backend *be = kind < 0 ? NULL : apex__ag_backend(out, out->op);
  if (!be || !AG_HAS(be, nn_unary_bwd, out->op)) return apex_last_status();
  apex_nn_unary_bwd_args a = {.kind = (apex_nn_unary_kind)kind, .n = ag_numel(out), .p = out->p.scale.s, .gout = out->gbuf,
                              .gout_dtype = out->gdt, .accumulate_x = 1, .ws = apex__ag_workspace(g)};
  if (out->op == APEX_OP_RELU) {
    int fresh;
    a.gx = apex__gbuf_w_any(g, out->in[0], &fresh, &a.gx_dtype);
    if (!a.gx) return APEX_OK;
    a.accumulate_x = !fresh;
    a.y = apex_tensor_data(out->value);
    a.y_dtype = out->value->dtype;
    return be->nn_unary_bwd(&a);
  }
  a.gx = apex__gbuf_any(g, out->in[0], &a.gx_dtype);
  if (!a.gx) return APEX_OK;
  a.x = ag_buf(out->in[0]->value);
  return be->nn_unary_bwd(&a);
}

/* ---- dropout ------------------------------------------------------------------------------------- */

apex_var *apex_dropout(apex_graph *g, apex_var *x, float p, int training, apex_rng *rng) {
  apex_var *u;
  apex_dtype dt;
  if (apex__dispatch(g, APEX_OP_DROPOUT, 1, &x, 0, &u, &dt) != APEX_OK) return NULL;
  if (!(p >= 0.0f && p < 1.0f)) return apex__fail_null(APEX_ERR_INVALID_ARG, "dropout: p = %g on %s; it must be in [0, 1)", p, apex__shape(x));
  if (!training || p == 0.0f) {
    apex__claim(g, u); /* an autocast copy handed out as the result stays */
    return u;
  }
  if (!rng) return apex__fail_null(APEX_ERR_INVALID_ARG, "dropout: NULL rng for p = %g on %s in training", p, apex__shape(x));
  const apex_backend *be = apex__ag_backend(u, APEX_OP_DROPOUT);
  if (!be || !AG_HAS(be, nn_dropout, APEX_OP_DROPOUT)) return NULL;
  apex_var *out = apex__result(g, APEX_OP_DROPOUT, dt, u->value->ndim, u->value->shape, 1, &u);
  if (!out) return NULL;
  size_t n = ag_numel(out);
  /* the kernel draws the mask on the graph's device, into the op's scratch, from the generator's
   * state (args_nn.h): the same mask on every backend */
  uint8_t *mask = apex__scratch(g, n ? n : 1);
  if (!mask) return NULL;
  float s = 1.0f / (1.0f - p);
  out->aux = mask;
  out->p.scale.s = s;
  if (be->nn_dropout(&(apex_nn_dropout_args){.n = n, .mask = mask, .seed = rng->seed, .offset = rng->offset, .keep = 1.0f - p,
                                             .x = ag_buf(u->value), .out = apex_tensor_data(out->value), .out_dtype = out->value->dtype,
                                             .s = s}) != APEX_OK)
    return NULL;
  rng->offset += (n + 3) / 4; /* as apex_rng_bernoulli advances it */
  return out;
}

apex_status apex__bwd_dropout(apex_graph *g, apex_var *out) {
  const apex_backend *be = apex__ag_backend(out, APEX_OP_DROPOUT);
  if (!be || !AG_HAS(be, nn_dropout_bwd, APEX_OP_DROPOUT)) return apex_last_status();
  apex_dtype dt;
  void *gx = apex__gbuf_any(g, out->in[0], &dt);
  if (!gx) return APEX_OK;
  return be->nn_dropout_bwd(&(apex_nn_dropout_bwd_args){.n = ag_numel(out), .mask = out->aux, .gout = out->gbuf, .gout_dtype = out->gdt,
                                                        .gx = gx, .gx_dtype = dt, .s = out->p.scale.s, .accumulate_x = 1});
}
