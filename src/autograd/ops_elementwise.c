/* ops_elementwise.c: broadcasting add/sub/mul/div/pow and comparisons, scale, exp/log/pow,
 * activations and dropout.
 *
 * A broadcast is walked as rows of the output's last dimension: each row has one base offset per
 * operand, and within a row an operand either moves with the output (stride 1) or repeats one
 * element (stride 0). Rows are independent, so the forward runs them on threads; a backward that
 * must sum over broadcast positions runs them in order on one thread, which keeps it bitwise
 * independent of the thread count. */
#include <math.h>

#include "autograd/ag.h"

typedef struct bcast {
  int nd;
  int64_t shape[APEX_MAX_DIMS];
  int64_t st[2][APEX_MAX_DIMS]; /* element strides of a and b in the output's index space */
  size_t rows, len;
} bcast;

static int bcast_plan(const apex_tensor *a, const apex_tensor *b, bcast *p) {
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

static void row_offsets(const bcast *p, size_t r, size_t off[2]) {
  off[0] = off[1] = 0;
  for (int d = p->nd - 2; d >= 0; d--) {
    size_t i = r % (size_t)p->shape[d];
    r /= (size_t)p->shape[d];
    off[0] += i * (size_t)p->st[0][d];
    off[1] += i * (size_t)p->st[1][d];
  }
}

static int is_comparison(apex_op op) { return op == APEX_OP_GT || op == APEX_OP_LT || op == APEX_OP_EQ; }

static apex_var *binary(apex_graph *g, apex_op op, apex_var *a, apex_var *b) {
  apex_var *in[2] = {a, b}, *u[2];
  apex_dtype dt;
  if (apex__dispatch(g, op, 2, in, 0, u, &dt) != APEX_OK) return NULL;
  bcast p;
  if (!bcast_plan(u[0]->value, u[1]->value, &p))
    return apex__fail_null(APEX_ERR_SHAPE, "%s: shapes %s and %s do not broadcast", apex_op_name(op), apex__shape(a), apex__shape(b));
  /* A comparison's mask is a step function of its inputs, with no useful derivative: it records no
   * inputs, so it never requires gradients and keeps nothing alive for a backward (PyTorch's bool
   * results do not require grad either). */
  apex_var *out = apex__result(g, op, dt, p.nd, p.shape, is_comparison(op) ? 0 : 2, u);
  if (!out) return NULL;
  const float *A = apex__f32(g, u[0]->value), *B = apex__f32(g, u[1]->value);
  float *o = apex__out_f32(g, out);
  if (!A || !B || !o) return NULL;
  size_t rows = p.rows, len = p.len, n = rows * len;
  size_t sa = p.nd ? (size_t)p.st[0][p.nd - 1] : 0, sb = p.nd ? (size_t)p.st[1][p.nd - 1] : 0;
#pragma omp parallel for schedule(static) if (n > AG_PAR_MIN)
  for (size_t r = 0; r < rows; r++) {
    size_t off[2];
    row_offsets(&p, r, off);
    const float *x = A + off[0], *y = B + off[1];
    float *z = o + r * len;
    switch (op) {
    case APEX_OP_ADD: for (size_t j = 0; j < len; j++) z[j] = x[j * sa] + y[j * sb]; break;
    case APEX_OP_SUB: for (size_t j = 0; j < len; j++) z[j] = x[j * sa] - y[j * sb]; break;
    case APEX_OP_MUL: for (size_t j = 0; j < len; j++) z[j] = x[j * sa] * y[j * sb]; break;
    case APEX_OP_POW_TENSOR: for (size_t j = 0; j < len; j++) z[j] = powf(x[j * sa], y[j * sb]); break;
    case APEX_OP_GT: for (size_t j = 0; j < len; j++) z[j] = x[j * sa] > y[j * sb] ? 1.0f : 0.0f; break;
    case APEX_OP_LT: for (size_t j = 0; j < len; j++) z[j] = x[j * sa] < y[j * sb] ? 1.0f : 0.0f; break;
    case APEX_OP_EQ: for (size_t j = 0; j < len; j++) z[j] = x[j * sa] == y[j * sb] ? 1.0f : 0.0f; break;
    default: for (size_t j = 0; j < len; j++) z[j] = x[j * sa] / y[j * sb]; break;
    }
  }
  apex__store(out, o);
  return out;
}

apex_var *apex_add(apex_graph *g, apex_var *a, apex_var *b) { return binary(g, APEX_OP_ADD, a, b); }
apex_var *apex_sub(apex_graph *g, apex_var *a, apex_var *b) { return binary(g, APEX_OP_SUB, a, b); }
apex_var *apex_mul(apex_graph *g, apex_var *a, apex_var *b) { return binary(g, APEX_OP_MUL, a, b); }
apex_var *apex_div(apex_graph *g, apex_var *a, apex_var *b) { return binary(g, APEX_OP_DIV, a, b); }
apex_var *apex_pow_tensor(apex_graph *g, apex_var *a, apex_var *b) { return binary(g, APEX_OP_POW_TENSOR, a, b); }
apex_var *apex_gt(apex_graph *g, apex_var *a, apex_var *b) { return binary(g, APEX_OP_GT, a, b); }
apex_var *apex_lt(apex_graph *g, apex_var *a, apex_var *b) { return binary(g, APEX_OP_LT, a, b); }
apex_var *apex_eq(apex_graph *g, apex_var *a, apex_var *b) { return binary(g, APEX_OP_EQ, a, b); }

/* d(out)/d(operand k) at one position, given the operands' values there. */
static inline float partial(apex_op op, int k, float x, float y) {
  switch (op) {
  case APEX_OP_ADD: return 1.0f;
  case APEX_OP_SUB: return k ? -1.0f : 1.0f;
  case APEX_OP_MUL: return k ? x : y;
  /* PyTorch's pow_backward_self / pow_backward_exponent, zeros included: b == 0 gives a^b = 1 for
   * every a, and 0^b (b >= 0) has log(0) * 0 = NaN where the limit from a > 0 is 0 */
  case APEX_OP_POW_TENSOR:
    if (!k) return y == 0.0f ? 0.0f : y * powf(x, y - 1.0f);
    return x == 0.0f && y >= 0.0f ? 0.0f : powf(x, y) * logf(x);
  default: return k ? -x / (y * y) : 1.0f / y;
  }
}

apex_status apex__bwd_binary(apex_graph *g, apex_var *out) {
  bcast p;
  bcast_plan(out->in[0]->value, out->in[1]->value, &p);
  apex_op op = out->op;
  /* add and sub have constant partials and read no values (op_table.c lets them go) */
  int reads = op == APEX_OP_MUL || op == APEX_OP_DIV || op == APEX_OP_POW_TENSOR;
  const float *v[2] = {NULL, NULL};
  if (reads && (!(v[0] = apex__f32(g, out->in[0]->value)) || !(v[1] = apex__f32(g, out->in[1]->value)))) return APEX_ERR_OUT_OF_MEMORY;
  const float *go = out->gbuf;
  size_t rows = p.rows, len = p.len, n = rows * len;
  for (int k = 0; k < 2; k++) {
    float *gk = apex__gbuf(g, out->in[k]);
    if (!gk) continue;
    size_t s[2] = {p.nd ? (size_t)p.st[0][p.nd - 1] : 0, p.nd ? (size_t)p.st[1][p.nd - 1] : 0};
    int full = ag_numel(out->in[k]) == n; /* no broadcast: each output position has its own element */
#pragma omp parallel for schedule(static) if (full && n > AG_PAR_MIN)
    for (size_t r = 0; r < rows; r++) {
      size_t off[2];
      row_offsets(&p, r, off);
      const float *gr = go + r * len;
      float *gd = gk + off[k];
      size_t sk = s[k];
      if (!reads) {
        float c = partial(op, k, 0.0f, 0.0f);
        for (size_t j = 0; j < len; j++) gd[j * sk] += gr[j] * c;
        continue;
      }
      const float *x = v[0] + off[0], *y = v[1] + off[1];
      for (size_t j = 0; j < len; j++) gd[j * sk] += gr[j] * partial(op, k, x[j * s[0]], y[j * s[1]]);
    }
  }
  return APEX_OK;
}

/* ---- scale --------------------------------------------------------------------------------------- */

apex_var *apex_scale(apex_graph *g, apex_var *x, float s) {
  apex_var *u;
  apex_dtype dt;
  if (apex__dispatch(g, APEX_OP_SCALE, 1, &x, 0, &u, &dt) != APEX_OK) return NULL;
  apex_var *out = apex__result(g, APEX_OP_SCALE, dt, u->value->ndim, u->value->shape, 1, &u);
  if (!out) return NULL;
  out->p.scale.s = s;
  const float *X = apex__f32(g, u->value);
  float *o = apex__out_f32(g, out);
  if (!X || !o) return NULL;
  size_t n = ag_numel(out);
  AG_PFOR
  for (size_t i = 0; i < n; i++) o[i] = X[i] * s;
  apex__store(out, o);
  return out;
}

apex_status apex__bwd_scale(apex_graph *g, apex_var *out) {
  float *gx = apex__gbuf(g, out->in[0]);
  if (!gx) return APEX_OK;
  const float *go = out->gbuf;
  float s = out->p.scale.s;
  size_t n = ag_numel(out);
  AG_PFOR
  for (size_t i = 0; i < n; i++) gx[i] += go[i] * s;
  return APEX_OK;
}

/* ---- activations --------------------------------------------------------------------------------- */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

/* p: pow's exponent (kept in p.scale.s for the backward); unused by the other ops. */
static apex_var *unary(apex_graph *g, apex_op op, apex_var *x, float p) {
  apex_var *u;
  apex_dtype dt;
  if (apex__dispatch(g, op, 1, &x, 0, &u, &dt) != APEX_OK) return NULL;
  apex_var *out = apex__result(g, op, dt, u->value->ndim, u->value->shape, 1, &u);
  if (!out) return NULL;
  out->p.scale.s = p;
  const float *X = apex__f32(g, u->value);
  float *o = apex__out_f32(g, out);
  if (!X || !o) return NULL;
  size_t n = ag_numel(out);
  switch (op) {
  case APEX_OP_RELU:
    AG_PFOR
    for (size_t i = 0; i < n; i++) o[i] = X[i] > 0.0f ? X[i] : 0.0f;
    break;
  case APEX_OP_GELU:
    AG_PFOR
    for (size_t i = 0; i < n; i++) o[i] = 0.5f * X[i] * (1.0f + erff(X[i] * 0.70710678118654752f));
    break;
  case APEX_OP_GELU_TANH:
    AG_PFOR
    for (size_t i = 0; i < n; i++) o[i] = 0.5f * X[i] * (1.0f + tanhf(GELU_K * (X[i] + GELU_C * X[i] * X[i] * X[i])));
    break;
  case APEX_OP_TANH:
    AG_PFOR
    for (size_t i = 0; i < n; i++) o[i] = tanhf(X[i]);
    break;
  case APEX_OP_EXP:
    AG_PFOR
    for (size_t i = 0; i < n; i++) o[i] = expf(X[i]);
    break;
  case APEX_OP_LOG:
    AG_PFOR
    for (size_t i = 0; i < n; i++) o[i] = logf(X[i]);
    break;
  case APEX_OP_POW:
    /* squares and square roots exactly rounded, as PyTorch's pow special-cases them */
    if (p == 2.0f) {
      AG_PFOR
      for (size_t i = 0; i < n; i++) o[i] = X[i] * X[i];
    } else if (p == 0.5f) {
      AG_PFOR
      for (size_t i = 0; i < n; i++) o[i] = sqrtf(X[i]);
    } else {
      AG_PFOR
      for (size_t i = 0; i < n; i++) o[i] = powf(X[i], p);
    }
    break;
  default:
    AG_PFOR
    for (size_t i = 0; i < n; i++) o[i] = 1.0f / (1.0f + expf(-X[i]));
    break;
  }
  apex__store(out, o);
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
 * nothing else keeps) can go (op_table.c). The output is +0 or the positive input itself, in the
 * input's dtype (never -0 or NaN: see unary), so its bits are non-zero exactly where the input was
 * > 0: tested as raw bits, a half output needs no widening to f32. */
/* The gradient is loaded whatever the mask and then selected, so that the loop vectorises into
 * masks instead of branching on every element (the signs of a ReLU input are coin flips to the
 * branch predictor: the branching loop took 15% of the benchmark CNN's step). */
#define RELU_BWD(T)                                                  \
  do {                                                               \
    const T *restrict o = apex_tensor_data(out->value);              \
    if (fresh) {                                                     \
      AG_PFOR                                                        \
      for (size_t i = 0; i < n; i++) {                               \
        float v = go[i] + 0.0f; /* 0 + go, as adding into zeros */   \
        uint32_t b;                                                  \
        memcpy(&b, &v, sizeof b);                                    \
        b &= -(uint32_t)(o[i] != 0); /* a mask: gcc will not         \
                                        vectorise a stored select */ \
        memcpy(gx + i, &b, sizeof b);                                \
      }                                                              \
    } else {                                                         \
      AG_PFOR                                                        \
      for (size_t i = 0; i < n; i++) {                               \
        float v = go[i];                                             \
        gx[i] += o[i] ? v : 0.0f;                                    \
      }                                                              \
    }                                                                \
  } while (0)

static void relu_bwd(float *restrict gx, int fresh, const apex_var *out) {
  const float *restrict go = out->gbuf;
  size_t n = ag_numel(out);
  if (apex_dtype_size(out->value->dtype) == 2)
    RELU_BWD(uint16_t);
  else
    RELU_BWD(uint32_t);
}

apex_status apex__bwd_unary(apex_graph *g, apex_var *out) {
  if (out->op == APEX_OP_RELU) {
    int fresh;
    float *gx = apex__gbuf_w(g, out->in[0], &fresh);
    if (gx) relu_bwd(gx, fresh, out);
    return APEX_OK;
  }
  float *gx = apex__gbuf(g, out->in[0]);
  if (!gx) return APEX_OK;
  const float *X = apex__f32(g, out->in[0]->value), *go = out->gbuf;
  if (!X) return APEX_ERR_OUT_OF_MEMORY;
  size_t n = ag_numel(out);
  switch (out->op) {
  case APEX_OP_GELU:
    AG_PFOR
    for (size_t i = 0; i < n; i++) {
      float x = X[i], cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f)), pdf = 0.3989422804014327f * expf(-0.5f * x * x);
      gx[i] += go[i] * (cdf + x * pdf);
    }
    break;
  case APEX_OP_GELU_TANH:
    AG_PFOR
    for (size_t i = 0; i < n; i++) {
      float x = X[i], t = tanhf(GELU_K * (x + GELU_C * x * x * x));
      gx[i] += go[i] * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_C * x * x));
    }
    break;
  case APEX_OP_TANH:
    AG_PFOR
    for (size_t i = 0; i < n; i++) {
      float t = tanhf(X[i]);
      gx[i] += go[i] * (1.0f - t * t);
    }
    break;
  /* exp is recomputed from x rather than read from a half output, which would round it once more */
  case APEX_OP_EXP:
    AG_PFOR
    for (size_t i = 0; i < n; i++) gx[i] += go[i] * expf(X[i]);
    break;
  case APEX_OP_LOG:
    AG_PFOR
    for (size_t i = 0; i < n; i++) gx[i] += go[i] / X[i];
    break;
  case APEX_OP_POW: {
    float p = out->p.scale.s;
    if (p == 0.0f) break; /* x^0 is 1 everywhere: PyTorch gives 0, not 0 * 0^-1 = NaN at x = 0 */
    AG_PFOR
    for (size_t i = 0; i < n; i++) gx[i] += go[i] * (p * powf(X[i], p - 1.0f));
    break;
  }
  default:
    AG_PFOR
    for (size_t i = 0; i < n; i++) {
      float s = 1.0f / (1.0f + expf(-X[i]));
      gx[i] += go[i] * s * (1.0f - s);
    }
    break;
  }
  return APEX_OK;
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
  apex_var *out = apex__result(g, APEX_OP_DROPOUT, dt, u->value->ndim, u->value->shape, 1, &u);
  if (!out) return NULL;
  size_t n = ag_numel(out);
  uint8_t *mask = apex__scratch(g, n ? n : 1);
  const float *X = apex__f32(g, u->value);
  float *o = apex__out_f32(g, out);
  if (!mask || !X || !o) return NULL;
  if (apex_rng_bernoulli(rng, mask, n, 1.0f - p) != APEX_OK) return NULL;
  float s = 1.0f / (1.0f - p);
  out->aux = mask;
  out->p.scale.s = s;
  AG_PFOR
  for (size_t i = 0; i < n; i++) o[i] = mask[i] ? X[i] * s : 0.0f;
  apex__store(out, o);
  return out;
}

apex_status apex__bwd_dropout(apex_graph *g, apex_var *out) {
  float *gx = apex__gbuf(g, out->in[0]);
  if (!gx) return APEX_OK;
  const uint8_t *mask = out->aux;
  const float *go = out->gbuf;
  float s = out->p.scale.s;
  size_t n = ag_numel(out);
  AG_PFOR
  for (size_t i = 0; i < n; i++) gx[i] += mask[i] ? go[i] * s : 0.0f;
  return APEX_OK;
}
