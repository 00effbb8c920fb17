/* loss.cu: the CUDA backend's softmax, log-softmax and pointwise losses (MSE, BCE with logits, BCE), the
 * slots of args_nn.h beside their CPU reference, cpu/loss.c.
 *
 * Each kernel reads its inputs in their own dtype (apex_ld widens exactly) and repeats the CPU's f32
 * expressions in the same order (this file is built with -fmad=false, as every .cu file here). What
 * differs from the CPU: the device's expf, logf and log1pf are not glibc's (within 2 ulps), and the
 * softmax's line sums run as a fixed butterfly over a warp instead of left to right, so results agree
 * to rounding, not bitwise. A reduced loss sums its terms in double: per block in a fixed tree, then
 * the blocks' partials in index order, the grid set by n alone, so every run gives the same bits. */
#include <math.h>

extern "C" {
#include "backend/cuda/cuda_backend.h"
#include "core/internal.h"
}
#include "backend/cuda/grad_dev.cuh"

/* ---- softmax: one warp per line of dim elements, `inner` apart ---------------------------------------- */

#define LINES_PER_BLOCK 8

__global__ void softmax_kernel(int logsm, int64_t lines, int64_t D, int64_t inner, const void *x, apex_dtype xt, float *out,
                               void *cast, apex_dtype ct) {
  int64_t l = (int64_t)blockIdx.x * LINES_PER_BLOCK + (threadIdx.x >> 5);
  int lane = threadIdx.x & 31;
  if (l >= lines) return; /* a whole warp leaves together */
  int64_t base = (l / inner) * D * inner + l % inner;
  float mx = -INFINITY;
  for (int64_t j = lane; j < D; j += 32) mx = fmaxf(mx, apex_ld(x, xt, base + j * inner));
  mx = warp_max(mx);
  float s = 0.0f;
  for (int64_t j = lane; j < D; j += 32) s += expf(apex_ld(x, xt, base + j * inner) - mx);
  s = warp_total(s);
  float lse = mx + logf(s), r = 1.0f / s;
  for (int64_t j = lane; j < D; j += 32) {
    int64_t i = base + j * inner;
    float v = apex_ld(x, xt, i);
    float o = logsm ? v - lse : expf(v - mx) * r;
    out[i] = o;
    if (cast) apex_st(cast, ct, i, o);
  }
}

extern "C" apex_status apex__cuda_slot_nn_softmax(const apex_nn_softmax_args *a) {
  int64_t lines = (int64_t)(a->outer * a->inner);
  if (!lines || !a->dim) return APEX_OK;
  softmax_kernel<<<(unsigned)((lines + LINES_PER_BLOCK - 1) / LINES_PER_BLOCK), 32 * LINES_PER_BLOCK, 0, nn_stream()>>>(
      a->log, lines, (int64_t)a->dim, (int64_t)a->inner, a->x.data, a->x.dtype, a->out, a->out_cast, a->cast_dtype);
  return apex__cuda_check_launch("nn_softmax");
}

__global__ void softmax_bwd_kernel(int logsm, int64_t lines, int64_t D, int64_t inner, const float *y, const float *go, float *gx,
                                   int acc) {
  int64_t l = (int64_t)blockIdx.x * LINES_PER_BLOCK + (threadIdx.x >> 5);
  int lane = threadIdx.x & 31;
  if (l >= lines) return;
  int64_t base = (l / inner) * D * inner + l % inner;
  float s = 0.0f;
  for (int64_t j = lane; j < D; j += 32) {
    int64_t i = base + j * inner;
    s += logsm ? go[i] : go[i] * y[i];
  }
  s = warp_total(s);
  for (int64_t j = lane; j < D; j += 32) {
    int64_t i = base + j * inner;
    grad_put(gx, i, logsm ? go[i] - expf(y[i]) * s : y[i] * (go[i] - s), acc);
  }
}

extern "C" apex_status apex__cuda_slot_nn_softmax_bwd(const apex_nn_softmax_bwd_args *a) {
  int64_t lines = (int64_t)(a->outer * a->inner);
  if (!lines || !a->dim) return APEX_OK;
  softmax_bwd_kernel<<<(unsigned)((lines + LINES_PER_BLOCK - 1) / LINES_PER_BLOCK), 32 * LINES_PER_BLOCK, 0, nn_stream()>>>(
      a->log, lines, (int64_t)a->dim, (int64_t)a->inner, a->y, a->gout, a->gx, a->accumulate_x);
  return apex__cuda_check_launch("nn_softmax_bwd");
}

/* ---- pointwise losses ------------------------------------------------------------------------------- */

/* log clamped at -100 (PyTorch's); a NaN stays NaN. */
__device__ __forceinline__ float clamp_log(float v) {
  float l = logf(v);
  return l < -100.0f ? -100.0f : l;
}

__device__ __forceinline__ float loss_term(apex_nn_pointwise_loss_kind kind, float x, float y) {
  if (kind == APEX_NN_MSE) return (x - y) * (x - y);
  if (kind == APEX_NN_BCE_WITH_LOGITS) return fmaxf(x, 0.0f) - x * y + log1pf(expf(-fabsf(x)));
  return -(y * clamp_log(x) + (1.0f - y) * clamp_log(1.0f - x));
}

#define SUM_THREADS 256
#define SUM_PER_THREAD 8
#define SUM_MAX_BLOCKS 1024

/* Terms into loss (when set, rounded once) and, when partial is set, each block's double sum of its
 * grid-stride share into partial[blockIdx.x]. */
__global__ void loss_kernel(apex_nn_pointwise_loss_kind kind, int64_t n, const void *x, apex_dtype xt, const void *y,
                            apex_dtype yt, void *loss, apex_dtype lt, double *partial) {
  __shared__ double red[8];
  double s = 0;
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float t = loss_term(kind, apex_ld(x, xt, i), apex_ld(y, yt, i));
    if (loss) apex_st(loss, lt, i, t);
    s += t;
  }
  if (!partial) return; /* uniform over the grid */
  s = block_total256(s, red);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

/* The sum of partial[0..n) in index order (one thread: n <= SUM_MAX_BLOCKS) into *out (when set) and
 * result (when set) as (float)(sum / divisor) rounded to rt. */
__global__ void partials_kernel(const double *partial, int n, double *out, void *result, apex_dtype rt, double divisor) {
  double s = 0;
  for (int i = 0; i < n; i++) s += partial[i];
  if (out) *out = s;
  if (result) apex_st(result, rt, 0, (float)(s / divisor));
}

extern "C" apex_status apex__cuda_slot_nn_pointwise_loss(const apex_nn_pointwise_loss_args *a) {
  int64_t n = (int64_t)a->n;
  int64_t want = (n + SUM_THREADS * SUM_PER_THREAD - 1) / (SUM_THREADS * SUM_PER_THREAD);
  int blocks = (int)(want < 1 ? 1 : want > SUM_MAX_BLOCKS ? SUM_MAX_BLOCKS : want);
  double *partial = NULL;
  apex_status st = APEX_OK;
  if (a->sum || a->result) st = apex__cuda_alloc((size_t)blocks * sizeof(double), 0, (void **)&partial);
  if (st != APEX_OK) return st;
  if (n || partial) {
    loss_kernel<<<blocks, SUM_THREADS, 0, nn_stream()>>>(a->kind, n, a->x.data, a->x.dtype, a->y.data, a->y.dtype, a->loss,
                                                         a->loss_dtype, partial);
    st = apex__cuda_check_launch("nn_pointwise_loss");
  }
  if (st == APEX_OK && partial) { /* sum and result are device memory (the contract): nothing waits */
    partials_kernel<<<1, 1, 0, nn_stream()>>>(partial, blocks, a->sum, a->result, a->result_dtype, a->divisor);
    st = apex__cuda_check_launch("nn_pointwise_loss");
  }
  apex__cuda_free(partial);
  return st;
}

__global__ void loss_bwd_kernel(apex_nn_pointwise_loss_kind kind, int64_t n, const void *x, apex_dtype xt, const void *y,
                                apex_dtype yt, apex_nn_reduction red, double count, const float *go, float *gx, float *gy, int acc_x,
                                int acc_y) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float w = red == APEX_NN_NONE ? go[i] : red == APEX_NN_MEAN ? (float)(go[0] / count) : go[0];
    float xv = apex_ld(x, xt, i), yv = apex_ld(y, yt, i), dx, dy;
    if (kind == APEX_NN_MSE) {
      dx = 2.0f * (xv - yv);
      dy = -dx;
    } else if (kind == APEX_NN_BCE_WITH_LOGITS) {
      dx = 1.0f / (1.0f + expf(-xv)) - yv;
      dy = -xv;
    } else {
      dx = (xv - yv) / fmaxf((1.0f - xv) * xv, 1e-12f);
      dy = clamp_log(1.0f - xv) - clamp_log(xv);
    }
    if (gx) grad_put(gx, i, w * dx, acc_x);
    if (gy) grad_put(gy, i, w * dy, acc_y);
  }
}

extern "C" apex_status apex__cuda_slot_nn_pointwise_loss_bwd(const apex_nn_pointwise_loss_bwd_args *a) {
  int64_t n = (int64_t)a->n;
  if (!n || (!a->gx && !a->gy)) return APEX_OK;
  loss_bwd_kernel<<<apex_grid(n, 256, 4), 256, 0, nn_stream()>>>(a->kind, n, a->x.data, a->x.dtype, a->y.data, a->y.dtype,
                                                                 a->reduction, a->count, a->gout, a->gx, a->gy, a->accumulate_x,
                                                                 a->accumulate_y);
  return apex__cuda_check_launch("nn_pointwise_loss_bwd");
}
