/* loss.c: the CPU backend's softmax, log-softmax and loss kernels (args_nn.h): cross entropy, MSE,
 * BCE with logits, BCE.
 *
 * Each kernel reads its inputs in their own dtype, widening a line, row or block at a time into f32
 * (cpu_kernels.h), and computes in f32 as on an f32 copy, so the bits are the same without the copy.
 * Softmax's lines and cross entropy's rows are independent, so they run on threads. A reduced loss
 * sums its per-element terms in double and in apex__blocked_sum's fixed blocks, so no result depends
 * on the thread count. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/sums.h"
#include "backend/grad_dtype.h"

/* Line `base` of D elements, `inner` apart, of x as f32 elements *st apart: x's own when f32, else
 * widened into tmp (2 * D floats: the f32 line, and its raw elements gathered when inner > 1). */
static const float *line_f32(apex_nn_buf x, size_t base, size_t D, size_t inner, float *tmp, size_t *st) {
  if (x.dtype == APEX_F32) {
    *st = inner;
    return (const float *)x.data + base;
  }
  *st = 1;
  if (inner == 1) return apex__cpu_row_f32(x, base, D, tmp);
  uint16_t *h = (uint16_t *)(tmp + D);
  for (size_t j = 0; j < D; j++) h[j] = ((const uint16_t *)x.data)[base + j * inner];
  apex__convert_range(tmp, APEX_F32, h, x.dtype, D);
  return tmp;
}

/* Rounds the f32 line ol (inner apart) into the same line of out (dtype dt) through tmp (as line_f32's). */
static void line_store(void *out, apex_dtype dt, size_t base, const float *ol, size_t D, size_t inner, float *tmp) {
  if (inner == 1) {
    apex__cpu_row_store(out, dt, base, ol, D);
    return;
  }
  uint16_t *h = (uint16_t *)(tmp + D);
  for (size_t j = 0; j < D; j++) tmp[j] = ol[j * inner];
  apex__convert_range(h, dt, tmp, APEX_F32, D);
  for (size_t j = 0; j < D; j++) ((uint16_t *)out)[base + j * inner] = h[j];
}

apex_status apex__cpu_nn_softmax(const apex_nn_softmax_args *a) {
  float *o = a->out;
  size_t D = a->dim, inner = a->inner, nl = a->outer * inner, n = nl * D;
  int logsm = a->log, fail;
  float *lines = apex__cpu_thread_rows(&a->ws, a->x.dtype != APEX_F32 || a->out_cast, 1, 2 * D, &fail);
  if (fail) return APEX_ERR_OUT_OF_MEMORY;
#pragma omp parallel for schedule(static) if (n > APEX__CPU_PAR_MIN)
  for (size_t l = 0; l < nl; l++) {
    size_t base = (l / inner) * D * inner + l % inner, xs;
    float *tmp = apex__cpu_my_row(lines, 1, 2 * D, 0);
    const float *xl = line_f32(a->x, base, D, inner, tmp, &xs);
    float *ol = o + base;
    float mx = -INFINITY;
    for (size_t j = 0; j < D; j++) mx = apex__cpu_line_max(mx, xl[j * xs]);
    float s = 0.0f;
    if (logsm) {
      for (size_t j = 0; j < D; j++) s += expf(xl[j * xs] - mx);
      float lse = mx + logf(s);
      for (size_t j = 0; j < D; j++) ol[j * inner] = xl[j * xs] - lse;
    } else {
      /* each exp once: kept in the output, then scaled (the same values and sum as computing it twice) */
      for (size_t j = 0; j < D; j++) s += (ol[j * inner] = expf(xl[j * xs] - mx));
      float r = 1.0f / s;
      for (size_t j = 0; j < D; j++) ol[j * inner] *= r;
    }
    if (a->out_cast) line_store(a->out_cast, a->cast_dtype, base, ol, D, inner, tmp);
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

/* Cross entropy's backward recomputes each row's softmax from the logits and the row's max mx and
 * r = 1 / sum of expf(x - mx) (stats, args_nn.h): row_softmax does the forward's own f32 operations on
 * the same values, so the recomputed softmax has the forward's bits. */

/* Row x's max (apex__cpu_line_max: a NaN wins). */
static inline float row_max(const float *x, size_t C) {
  float mx = -INFINITY;
  for (size_t c = 0; c < C; c++) mx = apex__cpu_line_max(mx, x[c]);
  return mx;
}

/* p[c] = expf(x[c] - mx) * r. The forward (!given_r) stores the exps, adds them in order into the
 * sum it returns (its log-sum-exp needs it) and stores r = 1 / sum into *r, then scales; a
 * recomputing backward (given_r: the forward's *r) does it in one pass, rounding the same f32
 * operations the same way, so both give the same bits. */
static inline float row_softmax(const float *x, size_t C, float mx, int given_r, float *r, float *p) {
  if (given_r) {
    const float rv = *r; /* not reloaded after each store into p */
    for (size_t c = 0; c < C; c++) p[c] = expf(x[c] - mx) * rv;
    return NAN;
  }
  float s = 0.0f;
  for (size_t c = 0; c < C; c++) s += (p[c] = expf(x[c] - mx));
  const float rv = *r = 1.0f / s;
  for (size_t c = 0; c < C; c++) p[c] *= rv;
  return s;
}

/* One row's gradient: gx[c] += w * (p[c] - smooth - (1 - eps at the target)); fresh: gx[c] = 0.0f + that term
 * (the bits of a zeroed gx's), which may then be written over p itself (the one-pass forward, gx == p). */
static inline void row_grad(float *gx, const float *p, size_t C, int64_t target, float w, float smooth, float eps, int fresh) {
  for (size_t c = 0; c < C; c++) {
    const float term = w * (p[c] - smooth - ((int64_t)c == target ? 1.0f - eps : 0.0f));
    gx[c] = (fresh ? 0.0f : gx[c]) + term;
  }
}

apex_status apex__cpu_nn_cross_entropy(const apex_nn_cross_entropy_args *a) {
  size_t N = a->rows, C = a->classes, n = N * C;
  const int64_t *tg = a->target;
  float *st = a->stats, *l = a->loss, eps = a->smoothing;
  const float w1 = (float)(1.0 / a->divisor); /* the one-pass gradient's weight: loss_grad of a gout of 1 */
  /* per thread: the widened row (half x), then the softmax row */
  size_t k = 1 + (a->x.dtype != APEX_F32);
  int fail;
  float *rows = apex__cpu_thread_rows(&a->ws, 1, k, C, &fail);
  if (fail) return APEX_ERR_OUT_OF_MEMORY;
#pragma omp parallel for schedule(static) if (n > APEX__CPU_PAR_MIN)
  for (size_t i = 0; i < N; i++) {
    const float *xi = apex__cpu_row_f32(a->x, i * C, C, apex__cpu_my_row(rows, k, C, 0));
    float *pi = apex__cpu_my_row(rows, k, C, k - 1);
    float mx = row_max(xi, C), r, sum_logp = 0.0f;
    float lse = mx + logf(row_softmax(xi, C, mx, 0, &r, pi));
    for (size_t c = 0; c < C; c++) sum_logp += xi[c] - lse;
    st[2 * i] = mx;
    st[2 * i + 1] = r;
    l[i] = tg[i] < 0 ? 0.0f : -(1.0f - eps) * (xi[tg[i]] - lse) - eps / (float)C * sum_logp;
    if (a->gx) { /* the one-pass gradient, over p's row (x's row, which gx may be, is read no more) */
      if (tg[i] >= 0) row_grad(pi, pi, C, tg[i], w1, eps / (float)C, eps, 1);
      else memset(pi, 0, C * sizeof *pi);
      if (a->x.dtype == APEX_F32) memcpy((float *)a->gx + i * C, pi, C * sizeof *pi);
      else apex__convert_range((uint16_t *)a->gx + i * C, a->x.dtype, pi, APEX_F32, C);
    }
  }
  if (!a->sum && !a->result) return APEX_OK;
  double sum = apex__sum_f32(l, N);
  if (a->sum) *a->sum = sum;
  if (a->result) {
    float v = (float)(sum / a->divisor);
    apex__convert_portable(a->result, a->result_dtype, &v, APEX_F32, 1); /* apex_tensor_set's rounding */
  }
  return APEX_OK;
}

static apex_status cross_entropy_bwd_k(const void *a) { return apex__cpu_nn_cross_entropy_bwd(a); }

apex_status apex__cpu_nn_cross_entropy_bwd(const apex_nn_cross_entropy_bwd_args *a) {
  size_t N = a->rows, C = a->classes, n = N * C;
  int ran;
  apex_status rs = apex__cross_entropy_bwd_f32(&apex__cpu_backend, cross_entropy_bwd_k, a, &ran);
  if (ran) return rs;
  const float *st = a->stats, *go = a->gout;
  const int64_t *tg = a->target;
  float *gx = a->gx;
  float eps = a->smoothing, smooth = eps / (float)C;
  double count = a->count;
  apex_nn_reduction red = a->reduction;
  /* recomputing, per thread: the widened row (half x), then the softmax row */
  size_t k = 1 + (a->x.dtype != APEX_F32);
  int fail;
  float *rows = apex__cpu_thread_rows(&a->ws, 1, k, C, &fail);
  if (fail) return APEX_ERR_OUT_OF_MEMORY;
  apex__cpu_grad_begin(gx, n, a->accumulate_x);
#pragma omp parallel for schedule(static) if (n > APEX__CPU_PAR_MIN)
  for (size_t i = 0; i < N; i++) {
    if (tg[i] < 0) continue;
    float *p = apex__cpu_my_row(rows, k, C, k - 1), r = st[2 * i + 1];
    (void)row_softmax(apex__cpu_row_f32(a->x, i * C, C, apex__cpu_my_row(rows, k, C, 0)), C, st[2 * i], 1, &r, p);
    row_grad(gx + i * C, p, C, tg[i], loss_grad(red, go, i, count), smooth, eps, 0);
  }
  return APEX_OK;
}

/* log clamped at -100 (PyTorch's); a NaN stays NaN (fmaxf would turn it into -100 and hide it). */
static inline float clamp_log(float v) {
  float l = logf(v);
  return l < -100.0f ? -100.0f : l;
}

/* The pointwise losses run over blocks of LOSS_BLOCK elements, each widened (when not f32) into
 * buffers on the stack: a term depends only on its own elements, so the bits are those of the whole
 * tensor's f32 copy, and no such copy is made. Their terms are never kept whole either: a reduced
 * loss computes them a sum block at a time into the summing thread's stack (apex__blocked_sum_fn, the
 * blocks and order of apex__sum_f32 over all of them), and NONE writes each block into the output,
 * rounded once. */
#define LOSS_BLOCK 1024

static void pointwise_terms(apex_nn_pointwise_loss_kind kind, const float *X, const float *Y, float *l, size_t n) {
  switch (kind) {
  case APEX_NN_MSE:
    for (size_t i = 0; i < n; i++) l[i] = (X[i] - Y[i]) * (X[i] - Y[i]);
    break;
  case APEX_NN_BCE_WITH_LOGITS:
    for (size_t i = 0; i < n; i++) l[i] = fmaxf(X[i], 0.0f) - X[i] * Y[i] + log1pf(expf(-fabsf(X[i])));
    break;
  default:
    for (size_t i = 0; i < n; i++) l[i] = -(Y[i] * clamp_log(X[i]) + (1.0f - Y[i]) * clamp_log(1.0f - X[i]));
    break;
  }
}

/* The terms of elements [lo, lo + len) into t, LOSS_BLOCK at a time. */
static void terms_range(const apex_nn_pointwise_loss_args *a, size_t lo, size_t len, float *t) {
  for (size_t o = 0; o < len; o += LOSS_BLOCK) {
    float xt[LOSS_BLOCK], yt[LOSS_BLOCK];
    size_t m = len - o < LOSS_BLOCK ? len - o : LOSS_BLOCK;
    pointwise_terms(a->kind, apex__cpu_row_f32(a->x, lo + o, m, xt), apex__cpu_row_f32(a->y, lo + o, m, yt), t + o, m);
  }
}

/* A blocked sum's block of terms (apex__sum_block_fn): computed into the summing thread's tmp. */
static const float *terms_block(const void *ctx, size_t lo, size_t len, float *tmp) {
  terms_range(ctx, lo, len, tmp);
  return tmp;
}

apex_status apex__cpu_nn_pointwise_loss(const apex_nn_pointwise_loss_args *a) {
  size_t n = a->n, nb = (n + LOSS_BLOCK - 1) / LOSS_BLOCK;
  apex_simd_active();
  if (a->loss) {
#pragma omp parallel for schedule(static) if (n > APEX__CPU_PAR_MIN)
    for (size_t k = 0; k < nb; k++) {
      float lt[LOSS_BLOCK];
      size_t off = k * LOSS_BLOCK, len = n - off < LOSS_BLOCK ? n - off : LOSS_BLOCK;
      terms_range(a, off, len, apex__cpu_row_out(a->loss, a->loss_dtype, off, lt));
      apex__cpu_row_store(a->loss, a->loss_dtype, off, lt, len);
    }
  }
  if (!a->sum && !a->result) return APEX_OK;
  double sum = apex__blocked_sum_fn(n, terms_block, a, apex__sum_serial);
  if (a->sum) *a->sum = sum;
  if (a->result) {
    float v = (float)(sum / a->divisor);
    apex__convert_portable(a->result, a->result_dtype, &v, APEX_F32, 1); /* apex_tensor_set's rounding */
  }
  return APEX_OK;
}

apex_status apex__cpu_nn_pointwise_loss_bwd(const apex_nn_pointwise_loss_bwd_args *a) {
  const float *go = a->gout;
  float *gx = a->gx, *gy = a->gy;
  size_t n = a->n, nb = (n + LOSS_BLOCK - 1) / LOSS_BLOCK;
  double count = a->count;
  apex_nn_reduction red = a->reduction;
  apex_nn_pointwise_loss_kind op = a->kind;
  apex__cpu_grad_begin(gx, n, a->accumulate_x);
  apex__cpu_grad_begin(gy, n, a->accumulate_y);
  apex_simd_active();
#pragma omp parallel for schedule(static) if (n > APEX__CPU_PAR_MIN)
  for (size_t k = 0; k < nb; k++) {
    float xt[LOSS_BLOCK], yt[LOSS_BLOCK];
    size_t off = k * LOSS_BLOCK, len = n - off < LOSS_BLOCK ? n - off : LOSS_BLOCK;
    const float *X = apex__cpu_row_f32(a->x, off, len, xt), *Y = apex__cpu_row_f32(a->y, off, len, yt);
    for (size_t k2 = 0; k2 < len; k2++) {
      size_t i = off + k2;
      float w = loss_grad(red, go, i, count), x = X[k2], y = Y[k2], dx, dy;
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
  }
  return APEX_OK;
}
