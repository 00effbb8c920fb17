/* ops_loss.c: softmax, log-softmax and the losses (cross entropy, MSE, BCE with logits, BCE).
 *
 * Softmax along any dim sees x as [outer, D, inner]: each of the outer * inner lines of D elements
 * is one independent softmax, so lines run on threads. The forward keeps its f32 result in the
 * op's scratch for the backward. Reduced losses sum their per-element terms with apex__sum_f32, in
 * double and in a fixed order. */
#include <math.h>

#include "autograd/ag.h"

/* ---- softmax / log-softmax ---------------------------------------------------------------------- */

static apex_var *softmax_op(apex_graph *g, apex_op op, apex_var *x, int dim) {
  apex_var *u;
  apex_dtype dt;
  if (apex__dispatch(g, op, 1, &x, 0, &u, &dt) != APEX_OK) return NULL;
  int dd = ag_dim(dim, u->value->ndim);
  if (dd < 0) return apex__fail_null(APEX_ERR_SHAPE, "%s: dim %d is out of range for %s", apex_op_name(op), dim, apex__shape(x));
  apex_var *out = apex__result(g, op, dt, u->value->ndim, u->value->shape, 1, &u);
  if (!out) return NULL;
  const float *X = apex__f32(g, u->value);
  /* backward reads the f32 result (aux): persistent scratch when the value itself is not f32 */
  float *o = out->value->dtype == APEX_F32 ? ag_data(out->value) : apex__scratch(g, ag_numel(out) * sizeof(float));
  if (!X || !o) return NULL;
  size_t outer, D, inner;
  ag_lines(u->value, dd, &outer, &D, &inner);
  out->p.softmax.dim = dd;
  out->aux = o;
  size_t nl = outer * inner, n = nl * D;
  int logsm = op == APEX_OP_LOG_SOFTMAX;
#pragma omp parallel for schedule(static) if (n > AG_PAR_MIN)
  for (size_t l = 0; l < nl; l++) {
    size_t base = (l / inner) * D * inner + l % inner;
    const float *xl = X + base;
    float *ol = o + base;
    float mx = -INFINITY;
    for (size_t j = 0; j < D; j++) mx = fmaxf(mx, xl[j * inner]);
    float s = 0.0f;
    for (size_t j = 0; j < D; j++) s += expf(xl[j * inner] - mx);
    if (logsm) {
      float lse = mx + logf(s);
      for (size_t j = 0; j < D; j++) ol[j * inner] = xl[j * inner] - lse;
    } else {
      float r = 1.0f / s;
      for (size_t j = 0; j < D; j++) ol[j * inner] = expf(xl[j * inner] - mx) * r;
    }
  }
  apex__store(out, o);
  return out;
}

apex_var *apex_softmax(apex_graph *g, apex_var *x, int dim) { return softmax_op(g, APEX_OP_SOFTMAX, x, dim); }
apex_var *apex_log_softmax(apex_graph *g, apex_var *x, int dim) { return softmax_op(g, APEX_OP_LOG_SOFTMAX, x, dim); }

static apex_status softmax_bwd(apex_graph *g, apex_var *out) {
  float *gx = apex__gbuf(g, out->in[0]);
  if (!gx) return APEX_OK;
  size_t outer, D, inner;
  ag_lines(out->value, out->p.softmax.dim, &outer, &D, &inner);
  const float *y = out->aux, *go = out->gbuf;
  size_t nl = outer * inner, n = nl * D;
  int logsm = out->op == APEX_OP_LOG_SOFTMAX;
#pragma omp parallel for schedule(static) if (n > AG_PAR_MIN)
  for (size_t l = 0; l < nl; l++) {
    size_t base = (l / inner) * D * inner + l % inner;
    const float *yl = y + base, *gl = go + base;
    float *xl = gx + base;
    float s = 0.0f;
    if (logsm) {
      for (size_t j = 0; j < D; j++) s += gl[j * inner];
      for (size_t j = 0; j < D; j++) xl[j * inner] += gl[j * inner] - expf(yl[j * inner]) * s;
    } else {
      for (size_t j = 0; j < D; j++) s += gl[j * inner] * yl[j * inner];
      for (size_t j = 0; j < D; j++) xl[j * inner] += yl[j * inner] * (gl[j * inner] - s);
    }
  }
  return APEX_OK;
}

apex_status apex__bwd_softmax(apex_graph *g, apex_var *out) { return softmax_bwd(g, out); }
apex_status apex__bwd_log_softmax(apex_graph *g, apex_var *out) { return softmax_bwd(g, out); }

/* ---- reduced results ---------------------------------------------------------------------------- */

/* The result var of a loss: 0-d for MEAN and SUM, like `shape` for NONE. */
static apex_var *loss_result(apex_graph *g, apex_op op, apex_dtype dt, apex_reduction red, int ndim, const int64_t *shape,
                             int n, apex_var *const *in) {
  if ((int)red < 0 || red > APEX_REDUCTION_NONE)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: reduction %d is not an apex_reduction", apex_op_name(op), (int)red);
  apex_var *out = red == APEX_REDUCTION_NONE ? apex__result(g, op, dt, ndim, shape, n, in) : apex__result(g, op, dt, 0, NULL, n, in);
  if (out) out->p.loss.reduction = red;
  return out;
}

/* Writes the reduced value of per-element terms l[0..n) (divided by `count` for MEAN) into out. */
static void loss_store(apex_var *out, const float *l, size_t n, double count) {
  if (out->p.loss.reduction == APEX_REDUCTION_NONE) {
    if (out->value->dtype == APEX_F32) {
      if (ag_data(out->value) != l) memcpy(ag_data(out->value), l, n * sizeof(float));
    } else {
      apex__store(out, l);
    }
    return;
  }
  double s = apex__sum_f32(l, n);
  if (out->p.loss.reduction == APEX_REDUCTION_MEAN) s /= count;
  apex_tensor_set(out->value, 0, (float)s);
}

/* The gradient of term i: go[i] for NONE, go[0] for SUM, go[0] / count for MEAN. */
static inline float loss_grad(const apex_var *out, size_t i, double count) {
  const float *go = out->gbuf;
  if (out->p.loss.reduction == APEX_REDUCTION_NONE) return go[i];
  return out->p.loss.reduction == APEX_REDUCTION_MEAN ? (float)(go[0] / count) : go[0];
}

/* ---- cross entropy ------------------------------------------------------------------------------ */

apex_var *apex_cross_entropy(apex_graph *g, apex_var *logits, const int64_t *targets, const apex_cross_entropy_options *opts) {
  static const apex_cross_entropy_options defaults = {0};
  if (!opts) opts = &defaults;
  apex_var *u;
  apex_dtype dt;
  if (apex__dispatch(g, APEX_OP_CROSS_ENTROPY, 1, &logits, 0, &u, &dt) != APEX_OK) return NULL;
  const apex_tensor *X = u->value;
  if (X->ndim != 2) return apex__fail_null(APEX_ERR_SHAPE, "cross_entropy: logits %s must be [N, C]", apex__shape(logits));
  if (!targets && X->shape[0] > 0) return apex__fail_null(APEX_ERR_INVALID_ARG, "cross_entropy: NULL targets for logits %s", apex__shape(logits));
  float eps = opts->label_smoothing;
  if (!(eps >= 0.0f && eps <= 1.0f))
    return apex__fail_null(APEX_ERR_INVALID_ARG, "cross_entropy: label_smoothing %g is outside [0, 1]", eps);
  size_t N = (size_t)X->shape[0], C = (size_t)X->shape[1];
  size_t count = 0;
  for (size_t i = 0; i < N; i++) {
    if (opts->use_ignore_index && targets[i] == opts->ignore_index) continue;
    if (targets[i] < 0 || (size_t)targets[i] >= C)
      return apex__fail_null(APEX_ERR_INVALID_ARG, "cross_entropy: target %lld at row %zu is outside [0, %zu) for logits %s",
                             (long long)targets[i], i, C, apex__shape(logits));
    count++;
  }
  int64_t nshape = (int64_t)N;
  apex_var *out = loss_result(g, APEX_OP_CROSS_ENTROPY, dt, opts->reduction, 1, &nshape, 1, &u);
  if (!out) return NULL;
  size_t pad = (N * C + 1) & ~(size_t)1;
  float *p = apex__scratch(g, pad * sizeof(float) + N * sizeof(int64_t) + N * sizeof(float));
  const float *x = apex__f32(g, X);
  if (!p || !x) return NULL;
  int64_t *tg = (int64_t *)(p + pad);
  float *l = (float *)(tg + N);
  for (size_t i = 0; i < N; i++) tg[i] = opts->use_ignore_index && targets[i] == opts->ignore_index ? -1 : targets[i];
  out->aux = p;
  out->p.loss.rows = (int64_t)N;
  out->p.loss.classes = (int64_t)C;
  out->p.loss.smoothing = eps;
  out->p.loss.count = (int64_t)count;
  size_t n = N * C;
#pragma omp parallel for schedule(static) if (n > AG_PAR_MIN)
  for (size_t i = 0; i < N; i++) {
    const float *xi = x + i * C;
    float *pi = p + i * C;
    float mx = -INFINITY, s = 0.0f, sum_logp = 0.0f;
    for (size_t c = 0; c < C; c++) mx = fmaxf(mx, xi[c]);
    for (size_t c = 0; c < C; c++) s += (pi[c] = expf(xi[c] - mx));
    float lse = mx + logf(s), r = 1.0f / s;
    for (size_t c = 0; c < C; c++) {
      pi[c] *= r;
      sum_logp += xi[c] - lse;
    }
    l[i] = tg[i] < 0 ? 0.0f : -(1.0f - eps) * (xi[tg[i]] - lse) - eps / (float)C * sum_logp;
  }
  loss_store(out, l, N, (double)count);
  return out;
}

apex_status apex__bwd_cross_entropy(apex_graph *g, apex_var *out) {
  float *gx = apex__gbuf(g, out->in[0]);
  if (!gx) return APEX_OK;
  size_t N = (size_t)out->p.loss.rows, C = (size_t)out->p.loss.classes, pad = (N * C + 1) & ~(size_t)1;
  const float *p = out->aux;
  const int64_t *tg = (const int64_t *)(p + pad);
  float eps = out->p.loss.smoothing, smooth = eps / (float)C;
  double count = (double)out->p.loss.count;
  size_t n = N * C;
#pragma omp parallel for schedule(static) if (n > AG_PAR_MIN)
  for (size_t i = 0; i < N; i++) {
    if (tg[i] < 0) continue;
    float w = loss_grad(out, i, count);
    for (size_t c = 0; c < C; c++) gx[i * C + c] += w * (p[i * C + c] - smooth - ((int64_t)c == tg[i] ? 1.0f - eps : 0.0f));
  }
  return APEX_OK;
}

/* ---- pointwise losses --------------------------------------------------------------------------- */

/* log clamped at -100 (PyTorch's); a NaN stays NaN (fmaxf would turn it into -100 and hide it). */
static inline float clamp_log(float v) {
  float l = logf(v);
  return l < -100.0f ? -100.0f : l;
}

static apex_var *pointwise_loss(apex_graph *g, apex_op op, apex_var *x, apex_var *y, apex_reduction red) {
  apex_var *in[2] = {x, y}, *u[2];
  apex_dtype dt;
  if (apex__dispatch(g, op, 2, in, 0, u, &dt) != APEX_OK) return NULL;
  if (!apex_tensor_same_shape(u[0]->value, u[1]->value))
    return apex__fail_null(APEX_ERR_SHAPE, "%s: input %s and target %s must have the same shape", apex_op_name(op), apex__shape(x), apex__shape(y));
  size_t n = ag_numel(u[0]);
  const float *X = apex__f32(g, u[0]->value), *Y = apex__f32(g, u[1]->value);
  if (!X || !Y) return NULL;
  /* Probabilities outside [0, 1] would give a finite, meaningless loss (the clamp turns log of a
   * negative number into -100), so they are refused as PyTorch refuses them. NaN passes: a
   * non-finite forward must reach the loss scaler, which skips the step. */
  if (op == APEX_OP_BCE)
    for (size_t i = 0; i < n; i++)
      if (X[i] < 0.0f || X[i] > 1.0f)
        return apex__fail_null(APEX_ERR_INVALID_ARG, "bce: input element %zu of %s is %g; probabilities must be in [0, 1] (for logits use "
                               "apex_bce_with_logits)", i, apex__shape(x), (double)X[i]);
  apex_var *out = loss_result(g, op, dt, red, u[0]->value->ndim, u[0]->value->shape, 2, u);
  if (!out) return NULL;
  float *l = apex__scratch(g, ag_nz(n) * sizeof(float));
  if (!l) return NULL;
  switch (op) {
  case APEX_OP_MSE:
    AG_PFOR
    for (size_t i = 0; i < n; i++) l[i] = (X[i] - Y[i]) * (X[i] - Y[i]);
    break;
  case APEX_OP_BCE_WITH_LOGITS:
    AG_PFOR
    for (size_t i = 0; i < n; i++) l[i] = fmaxf(X[i], 0.0f) - X[i] * Y[i] + log1pf(expf(-fabsf(X[i])));
    break;
  default:
    AG_PFOR
    for (size_t i = 0; i < n; i++) l[i] = -(Y[i] * clamp_log(X[i]) + (1.0f - Y[i]) * clamp_log(1.0f - X[i]));
    break;
  }
  loss_store(out, l, n, (double)n);
  return out;
}

apex_var *apex_mse_loss(apex_graph *g, apex_var *x, apex_var *y, apex_reduction r) { return pointwise_loss(g, APEX_OP_MSE, x, y, r); }
apex_var *apex_bce_with_logits(apex_graph *g, apex_var *x, apex_var *y, apex_reduction r) {
  return pointwise_loss(g, APEX_OP_BCE_WITH_LOGITS, x, y, r);
}
apex_var *apex_bce(apex_graph *g, apex_var *p, apex_var *y, apex_reduction r) { return pointwise_loss(g, APEX_OP_BCE, p, y, r); }

apex_status apex__bwd_pointwise_loss(apex_graph *g, apex_var *out) {
  float *gx = apex__gbuf(g, out->in[0]), *gy = apex__gbuf(g, out->in[1]);
  const float *X = apex__f32(g, out->in[0]->value), *Y = apex__f32(g, out->in[1]->value);
  if (!X || !Y) return APEX_ERR_OUT_OF_MEMORY;
  size_t n = ag_numel(out->in[0]);
  double count = (double)n;
  apex_op op = out->op;
  AG_PFOR
  for (size_t i = 0; i < n; i++) {
    float w = loss_grad(out, i, count), x = X[i], y = Y[i], dx, dy;
    if (op == APEX_OP_MSE) {
      dx = 2.0f * (x - y);
      dy = -dx;
    } else if (op == APEX_OP_BCE_WITH_LOGITS) {
      dx = 1.0f / (1.0f + expf(-x)) - y;
      dy = -x;
    } else {
      dx = (x - y) / fmaxf((1.0f - x) * x, 1e-12f);
      dy = clamp_log(1.0f - x) - clamp_log(x);
    }
    if (gx) gx[i] += w * dx;
    if (gy) gy[i] += w * dy;
  }
  return APEX_OK;
}
