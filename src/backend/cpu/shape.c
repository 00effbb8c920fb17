/* shape.c: the CPU backend's reductions (sum, mean, L2 norm), permute, concat and embedding kernels
 * (args_nn.h), forward and backward.
 *
 * A reduction sums each line in order (one line over the whole tensor in apex__blocked_sum's fixed
 * blocks), so its bits do not depend on the thread count; a half input is read in its own dtype, a
 * block at a time. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/sums.h"
#include "backend/grad_dtype.h"

/* Sum of squares of n floats in double on the calling thread, in order: the block function of a norm's
 * apex__blocked_sum, so its bits do not depend on the thread count either. */
static double sumsq_serial(const float *x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
  return s;
}

/* A half x is read RED_CHUNK elements at a time, widened into a block on the stack (exact), and
 * summed from there in the order an f32 x is: each line from its first element, in double. Lines with
 * inner > 1 are strided; a task takes RED_COLS of them side by side, so each step along dim reads one
 * contiguous run of RED_COLS elements. */
enum { RED_CHUNK = 512, RED_COLS = 64 };

static float red_finish(int sq, double s, double scale) { return sq ? (float)sqrt(s) : (float)(s * scale); }

/* res[l] = the sum (times scale) or, sq, the root of the sum of squares of each line l of x. */
static void reduce_lines(apex_nn_buf x, size_t outer, size_t D, size_t inner, int sq, double scale, float *res) {
  size_t n = outer * D * inner;
  if (inner == 1) {
#pragma omp parallel for schedule(static) if (n > APEX__CPU_PAR_MIN)
    for (size_t l = 0; l < outer; l++) {
      float tmp[RED_CHUNK];
      double s = 0;
      for (size_t j0 = 0; j0 < D; j0 += RED_CHUNK) {
        size_t w = D - j0 < RED_CHUNK ? D - j0 : RED_CHUNK;
        const float *r = apex__cpu_row_f32(x, l * D + j0, w, tmp);
        if (sq)
          for (size_t c = 0; c < w; c++) s += (double)r[c] * r[c];
        else
          for (size_t c = 0; c < w; c++) s += r[c];
      }
      res[l] = red_finish(sq, s, scale);
    }
    return;
  }
  size_t nb = (inner + RED_COLS - 1) / RED_COLS, tasks = outer * nb;
#pragma omp parallel for schedule(static) if (n > APEX__CPU_PAR_MIN)
  for (size_t t = 0; t < tasks; t++) {
    float tmp[RED_COLS];
    double acc[RED_COLS];
    size_t o = t / nb, c0 = (t % nb) * RED_COLS, w = inner - c0 < RED_COLS ? inner - c0 : RED_COLS;
    for (size_t c = 0; c < w; c++) acc[c] = 0;
    for (size_t j = 0; j < D; j++) {
      const float *r = apex__cpu_row_f32(x, (o * D + j) * inner + c0, w, tmp);
      if (sq)
        for (size_t c = 0; c < w; c++) acc[c] += (double)r[c] * r[c];
      else
        for (size_t c = 0; c < w; c++) acc[c] += r[c];
    }
    for (size_t c = 0; c < w; c++) res[o * inner + c0 + c] = red_finish(sq, acc[c], scale);
  }
}

apex_status apex__cpu_nn_reduce(const apex_nn_reduce_args *a) {
  size_t nl = a->outer * a->inner, D = a->dim;
  int sq = a->kind == APEX_NN_REDUCE_NORM;
  float *res = sq ? a->norms : a->out;
  apex_simd_active(); /* the half path widens on threads */
  if (nl == 1)
    res[0] = sq ? (float)sqrt(apex__blocked_sum_buf(a->x.data, a->x.dtype, D, sumsq_serial))
                : (float)(apex__blocked_sum_buf(a->x.data, a->x.dtype, D, apex__sum_serial) * a->scale);
  else if (nl)
    reduce_lines(a->x, a->outer, D, a->inner, sq, a->scale, res);
  if (sq) memcpy(a->out, res, nl * sizeof(float));
  return APEX_OK;
}

/* d norm / dx = x / norm, and 0 where the norm is 0 (PyTorch's norm_backward: the subgradient 0 at
 * the origin rather than 0/0). */
apex_status apex__cpu_nn_reduce_bwd(const apex_nn_reduce_bwd_args *a) {
  size_t D = a->dim, inner = a->inner, n = a->outer * D * inner;
  const float *go = a->gout;
  float *gx = a->gx;
  apex__cpu_grad_begin(gx, n, a->accumulate_x);
  if (a->kind == APEX_NN_REDUCE_NORM) {
    const float *nrm = a->norms;
    size_t nb = (n + RED_CHUNK - 1) / RED_CHUNK;
    apex_simd_active();
#pragma omp parallel for schedule(static) if (n > APEX__CPU_PAR_MIN)
    for (size_t b = 0; b < nb; b++) {
      float tmp[RED_CHUNK];
      size_t lo = b * RED_CHUNK, w = n - lo < RED_CHUNK ? n - lo : RED_CHUNK;
      const float *X = apex__cpu_row_f32(a->x, lo, w, tmp);
      for (size_t k = 0; k < w; k++) {
        size_t i = lo + k, l = (i / (D * inner)) * inner + i % inner;
        if (nrm[l] != 0.0f) gx[i] += go[l] * (X[k] / nrm[l]);
      }
    }
    return APEX_OK;
  }
  float s = a->scale;
  APEX__CPU_PFOR
  for (size_t i = 0; i < n; i++) gx[i] += go[(i / (D * inner)) * inner + i % inner] * s;
  return APEX_OK;
}

/* Calls BODY with oi (output index) and ii (input offset) for every element, rows of the last dim on
 * threads. */
#define PERMUTE_WALK(out_shape, nd, st, n, BODY)                                                                        \
  do {                                                                                                                  \
    size_t len_ = nd ? (size_t)out_shape[nd - 1] : 1, rows_ = len_ ? n / len_ : 0;                                      \
    _Pragma("omp parallel for schedule(static) if (n > APEX__CPU_PAR_MIN)") for (size_t r_ = 0; r_ < rows_; r_++) {    \
      size_t rem_ = r_, base_ = 0;                                                                                      \
      for (int d_ = nd - 2; d_ >= 0; d_--) {                                                                            \
        base_ += (rem_ % (size_t)out_shape[d_]) * (size_t)st[d_];                                                       \
        rem_ /= (size_t)out_shape[d_];                                                                                  \
      }                                                                                                                 \
      size_t ls_ = nd ? (size_t)st[nd - 1] : 0;                                                                         \
      if (ls_ == 1) { /* the last dim stays in place (attention's head split): a run that vectorises */                 \
        for (size_t j_ = 0; j_ < len_; j_++) {                                                                          \
          size_t oi = r_ * len_ + j_, ii = base_ + j_;                                                                  \
          BODY;                                                                                                         \
        }                                                                                                               \
      } else {                                                                                                          \
        for (size_t j_ = 0; j_ < len_; j_++) {                                                                          \
          size_t oi = r_ * len_ + j_, ii = base_ + j_ * ls_;                                                            \
          BODY;                                                                                                         \
        }                                                                                                               \
      }                                                                                                                 \
    }                                                                                                                   \
  } while (0)

/* Elements move as 2- or 4-byte words: a half tensor is permuted in its own dtype. */
apex_status apex__cpu_nn_permute(const apex_nn_permute_args *a) {
  const int64_t *shape = a->shape, *st = a->strides;
  int nd = a->ndim;
  size_t n = a->n;
  if (apex_dtype_size(a->dtype) == 2) {
    const uint16_t *X = a->x;
    uint16_t *o = a->out;
    PERMUTE_WALK(shape, nd, st, n, o[oi] = X[ii]);
  } else {
    const uint32_t *X = a->x;
    uint32_t *o = a->out;
    PERMUTE_WALK(shape, nd, st, n, o[oi] = X[ii]);
  }
  return APEX_OK;
}

apex_status apex__cpu_nn_permute_bwd(const apex_nn_permute_bwd_args *a) {
  const int64_t *shape = a->shape, *st = a->strides;
  int nd = a->ndim;
  size_t n = a->n;
  const float *go = a->gout;
  float *gx = a->gx;
  apex__cpu_grad_begin(gx, n, a->accumulate_x);
  PERMUTE_WALK(shape, nd, st, n, gx[ii] += go[oi]);
  return APEX_OK;
}

apex_status apex__cpu_nn_concat(const apex_nn_concat_args *a) {
  size_t es = apex_dtype_size(a->out_dtype), row = a->row, at = 0;
  char *o = a->out;
  for (int k = 0; k < a->n; k++) {
    const char *X = a->x[k];
    size_t w = a->width[k], tes = apex_dtype_size(a->x_dtype[k]);
    for (size_t r = 0; r < a->outer; r++) apex_convert(o + (r * row + at) * es, a->out_dtype, X + r * w * tes, a->x_dtype[k], w);
    at += w;
  }
  return APEX_OK;
}

apex_status apex__cpu_nn_concat_bwd(const apex_nn_concat_bwd_args *a) {
  size_t row = a->row, at = 0;
  for (int k = 0; k < a->n; k++) {
    size_t w = a->width[k];
    float *gx = a->gx[k];
    if (gx) {
      apex__cpu_grad_begin(gx, a->outer * w, a->accumulate[k]);
      for (size_t r = 0; r < a->outer; r++)
        for (size_t j = 0; j < w; j++) gx[r * w + j] += a->gout[r * row + at + j];
    }
    at += w;
  }
  return APEX_OK;
}

apex_status apex__cpu_nn_embedding(const apex_nn_embedding_args *a) {
  size_t es = apex_dtype_size(a->dtype), D = a->dim;
  const char *src = a->w;
  char *dst = a->out;
  for (size_t i = 0; i < a->n; i++) memcpy(dst + i * D * es, src + (size_t)a->ids[i] * D * es, D * es);
  return APEX_OK;
}

static apex_status embedding_bwd_k(const void *a) { return apex__cpu_nn_embedding_bwd(a); }

apex_status apex__cpu_nn_embedding_bwd(const apex_nn_embedding_bwd_args *a) {
  int ran;
  apex_status rs = apex__embedding_bwd_f32(&apex__cpu_backend, embedding_bwd_k, a, &ran);
  if (ran) return rs;
  size_t D = a->dim;
  const int64_t *ids = a->ids;
  const float *go = a->gout;
  float *gw = a->gw;
  apex__cpu_grad_begin(gw, a->rows * D, a->accumulate_w);
  for (size_t i = 0; i < a->n; i++)
    for (size_t j = 0; j < D; j++) gw[(size_t)ids[i] * D + j] += go[i * D + j];
  return APEX_OK;
}
