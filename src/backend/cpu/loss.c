/* loss.c: the CPU backend's softmax, log-softmax and loss kernels (args_nn.h): cross entropy, MSE,
 * BCE with logits, BCE.
 *
 * Softmax's lines and cross entropy's rows are independent, so they run on threads. A reduced loss
 * sums its per-element terms with apex__sum_f32, in double and in fixed blocks, so no result depends
 * on the thread count. */
#include <math.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/sums.h"

apex_status apex__cpu_nn_softmax(const apex_nn_softmax_args *a) {
  const float *X = a->x;
  float *o = a->out;
  size_t D = a->dim, inner = a->inner, nl = a->outer * inner, n = nl * D;
  int logsm = a->log;
#pragma omp parallel for schedule(static) if (n > APEX__CPU_PAR_MIN)
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
  return APEX_OK;
}

apex_status apex__cpu_nn_softmax_bwd(const apex_nn_softmax_bwd_args *a) {
  const float *y = a->y, *go = a->gout;
  float *gx = a->gx;
  size_t D = a->dim, inner = a->inner, nl = a->outer * inner, n = nl * D;
  int logsm = a->log;
  apex__cpu_grad_begin(gx, n, a->accumulate_x);
#pragma omp parallel for schedule(static) if (n > APEX__CPU_PAR_MIN)
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

/* The gradient of term i (apex_nn_reduction). */
static inline float loss_grad(apex_nn_reduction red, const float *go, size_t i, double count) {
  if (red == APEX_NN_NONE) return go[i];
  return red == APEX_NN_MEAN ? (float)(go[0] / count) : go[0];
}

apex_status apex__cpu_nn_cross_entropy(const apex_nn_cross_entropy_args *a) {
  size_t N = a->rows, C = a->classes, n = N * C;
  const float *x = a->x;
  const int64_t *tg = a->target;
  float *p = a->prob, *l = a->loss, eps = a->smoothing;
#pragma omp parallel for schedule(static) if (n > APEX__CPU_PAR_MIN)
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
  if (a->sum) *a->sum = apex__sum_f32(l, N);
  return APEX_OK;
}

apex_status apex__cpu_nn_cross_entropy_bwd(const apex_nn_cross_entropy_bwd_args *a) {
  size_t N = a->rows, C = a->classes, n = N * C;
  const float *p = a->prob, *go = a->gout;
  const int64_t *tg = a->target;
  float *gx = a->gx;
  float eps = a->smoothing, smooth = eps / (float)C;
  double count = a->count;
  apex_nn_reduction red = a->reduction;
  apex__cpu_grad_begin(gx, n, a->accumulate_x);
#pragma omp parallel for schedule(static) if (n > APEX__CPU_PAR_MIN)
  for (size_t i = 0; i < N; i++) {
    if (tg[i] < 0) continue;
    float w = loss_grad(red, go, i, count);
    for (size_t c = 0; c < C; c++) gx[i * C + c] += w * (p[i * C + c] - smooth - ((int64_t)c == tg[i] ? 1.0f - eps : 0.0f));
  }
  return APEX_OK;
}

/* log clamped at -100 (PyTorch's); a NaN stays NaN (fmaxf would turn it into -100 and hide it). */
static inline float clamp_log(float v) {
  float l = logf(v);
  return l < -100.0f ? -100.0f : l;
}

apex_status apex__cpu_nn_pointwise_loss(const apex_nn_pointwise_loss_args *a) {
  const float *X = a->x, *Y = a->y;
  float *l = a->loss;
  size_t n = a->n;
  switch (a->kind) {
  case APEX_NN_MSE:
    APEX__CPU_PFOR
    for (size_t i = 0; i < n; i++) l[i] = (X[i] - Y[i]) * (X[i] - Y[i]);
    break;
  case APEX_NN_BCE_WITH_LOGITS:
    APEX__CPU_PFOR
    for (size_t i = 0; i < n; i++) l[i] = fmaxf(X[i], 0.0f) - X[i] * Y[i] + log1pf(expf(-fabsf(X[i])));
    break;
  default:
    APEX__CPU_PFOR
    for (size_t i = 0; i < n; i++) l[i] = -(Y[i] * clamp_log(X[i]) + (1.0f - Y[i]) * clamp_log(1.0f - X[i]));
    break;
  }
  if (a->sum) *a->sum = apex__sum_f32(l, n);
  return APEX_OK;
}

apex_status apex__cpu_nn_pointwise_loss_bwd(const apex_nn_pointwise_loss_bwd_args *a) {
  const float *X = a->x, *Y = a->y, *go = a->gout;
  float *gx = a->gx, *gy = a->gy;
  size_t n = a->n;
  double count = a->count;
  apex_nn_reduction red = a->reduction;
  apex_nn_pointwise_loss_kind op = a->kind;
  apex__cpu_grad_begin(gx, n, a->accumulate_x);
  apex__cpu_grad_begin(gy, n, a->accumulate_y);
  APEX__CPU_PFOR
  for (size_t i = 0; i < n; i++) {
    float w = loss_grad(red, go, i, count), x = X[i], y = Y[i], dx, dy;
    if (op == APEX_NN_MSE) {
      dx = 2.0f * (x - y);
      dy = -dx;
    } else if (op == APEX_NN_BCE_WITH_LOGITS) {
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
