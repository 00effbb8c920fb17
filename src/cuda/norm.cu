/* norm.cu: fused layer norm and RMS norm, forward and backward (Apex's FusedLayerNorm / FusedRMSNorm).
 *
 * Forward: one block per row; the row is read once into registers (PER values per thread, a template
 * parameter of 8, 16 or 32 picked from the row length, so short rows keep few registers and many
 * blocks per multiprocessor; rows up to 16,384 at 512 threads), its mean and variance reduced in f32 in a fixed
 * order, and y written from the registers: one read and one write of x's bytes. Backward: dx in the
 * same one-row-per-block shape; dw and db as per-column partial sums over groups of rows, then a
 * second kernel adding the groups in order (deterministic, no atomics). */
#include <cuda_runtime.h>

extern "C" {
#include "core/internal.h"
#include "cuda/cuda_internal.h"
}
#include "cuda/block_reduce.cuh"
#include "cuda/dtype_dev.cuh"

#define NORM_MAX_COLS (512 * 32)

/* Values per thread for a row length, and threads per block. */
static int norm_per(int64_t cols) { return cols <= 4096 ? 8 : cols <= 8192 ? 16 : 32; }
static int norm_threads(int64_t cols) {
  int t = 32, per = norm_per(cols);
  while (t < 512 && (int64_t)t * per < cols) t *= 2;
  return t;
}

template <int NORM_MAX_PER_THREAD>
__global__ void __launch_bounds__(512) ln_fwd_kernel(const void *x, apex_dtype xt, const void *w, const void *b, apex_dtype wt, int64_t cols,
                              float eps, int rms, void *y, float *mean_out, float *rstd_out) {
  __shared__ float scratch[33];
  const int64_t row = blockIdx.x;
  const int64_t base = row * cols;
  float v[NORM_MAX_PER_THREAD];
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < NORM_MAX_PER_THREAD; j++) {
    int64_t c = threadIdx.x + (int64_t)j * blockDim.x;
    v[j] = c < cols ? apex_ld(x, xt, base + c) : 0.0f;
    s += rms ? v[j] * v[j] : v[j];
  }
  float mean = rms ? 0.0f : block_sum(s, scratch) / (float)cols;
  float var;
  if (rms) {
    var = block_sum(s, scratch) / (float)cols;
  } else {
    float q = 0.0f;
#pragma unroll
    for (int j = 0; j < NORM_MAX_PER_THREAD; j++) {
      int64_t c = threadIdx.x + (int64_t)j * blockDim.x;
      float d = v[j] - mean;
      q += c < cols ? d * d : 0.0f;
    }
    var = block_sum(q, scratch) / (float)cols;
  }
  float rstd = 1.0f / sqrtf(var + eps);
  if (threadIdx.x == 0) {
    if (mean_out) mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
#pragma unroll
  for (int j = 0; j < NORM_MAX_PER_THREAD; j++) {
    int64_t c = threadIdx.x + (int64_t)j * blockDim.x;
    if (c < cols) {
      float o = (v[j] - mean) * rstd * apex_ld(w, wt, c);
      if (b) o += apex_ld(b, wt, c);
      apex_st(y, xt, base + c, o);
    }
  }
}

template <int NORM_MAX_PER_THREAD>
__global__ void __launch_bounds__(512) ln_bwd_dx_kernel(const void *dy, const void *x, apex_dtype xt, const void *w, apex_dtype wt,
                                 const float *mean, const float *rstd, int64_t cols, int rms, void *dx) {
  __shared__ float scratch[33];
  const int64_t row = blockIdx.x, base = row * cols;
  const float mu = rms ? 0.0f : mean[row], rs = rstd[row];
  float wdy[NORM_MAX_PER_THREAD], xh[NORM_MAX_PER_THREAD];
  float a = 0.0f, bsum = 0.0f;
#pragma unroll
  for (int j = 0; j < NORM_MAX_PER_THREAD; j++) {
    int64_t c = threadIdx.x + (int64_t)j * blockDim.x;
    if (c < cols) {
      wdy[j] = apex_ld(dy, xt, base + c) * apex_ld(w, wt, c);
      xh[j] = (apex_ld(x, xt, base + c) - mu) * rs;
    } else {
      wdy[j] = 0.0f;
      xh[j] = 0.0f;
    }
    a += wdy[j];
    bsum += wdy[j] * xh[j];
  }
  float ma = rms ? 0.0f : block_sum(a, scratch) / (float)cols;
  float mb = block_sum(bsum, scratch) / (float)cols;
#pragma unroll
  for (int j = 0; j < NORM_MAX_PER_THREAD; j++) {
    int64_t c = threadIdx.x + (int64_t)j * blockDim.x;
    if (c < cols) apex_st(dx, xt, base + c, rs * (wdy[j] - ma - xh[j] * mb));
  }
}

#define DW_COLS 32
#define DW_ROWS 8   /* threads down a column */
#define DW_GROUP 256 /* rows per partial */

/* partial[g][c] for dw (and db) over rows [g * DW_GROUP, (g + 1) * DW_GROUP). */
__global__ void ln_bwd_dw_partial(const void *dy, const void *x, apex_dtype xt, const float *mean, const float *rstd,
                                  int64_t rows, int64_t cols, int rms, float *pw, float *pb) {
  __shared__ float sw[DW_ROWS][DW_COLS + 1], sb[DW_ROWS][DW_COLS + 1];
  int64_t c = blockIdx.x * (int64_t)DW_COLS + threadIdx.x;
  int64_t r0 = blockIdx.y * (int64_t)DW_GROUP, r1 = r0 + DW_GROUP < rows ? r0 + DW_GROUP : rows;
  float aw = 0.0f, ab = 0.0f;
  if (c < cols)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += DW_ROWS) {
      float g = apex_ld(dy, xt, r * cols + c);
      float xh = (apex_ld(x, xt, r * cols + c) - (rms ? 0.0f : mean[r])) * rstd[r];
      aw += g * xh;
      ab += g;
    }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float tw = 0.0f, tb = 0.0f;
    for (int k = 0; k < DW_ROWS; k++) {
      tw += sw[k][threadIdx.x];
      tb += sb[k][threadIdx.x];
    }
    pw[blockIdx.y * cols + c] = tw;
    if (pb) pb[blockIdx.y * cols + c] = tb;
  }
}

__global__ void ln_bwd_dw_finish(const float *pw, const float *pb, int groups, int64_t cols, void *dw, void *db,
                                 apex_dtype wt) {
  int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float tw = 0.0f, tb = 0.0f;
  for (int g = 0; g < groups; g++) {
    tw += pw[g * cols + c];
    if (pb) tb += pb[g * cols + c];
  }
  apex_st(dw, wt, c, tw);
  if (db) apex_st(db, wt, c, tb);
}

static int norm_fits(int64_t cols) { return cols <= NORM_MAX_COLS; }

/* Launches kernel K<PER> for the row length: PER is a compile-time count (the register arrays). */
#define NORM_LAUNCH(K, cols, grid, block, stream, ...)                                  \
  do {                                                                                   \
    int per_ = norm_per(cols);                                                           \
    if (per_ == 8) K<8><<<grid, block, 0, stream>>>(__VA_ARGS__);                        \
    else if (per_ == 16) K<16><<<grid, block, 0, stream>>>(__VA_ARGS__);                 \
    else K<32><<<grid, block, 0, stream>>>(__VA_ARGS__);                                 \
  } while (0)

extern "C" apex_status apex__cuda_layer_norm_fwd(const void *x, apex_dtype xt, const void *w, const void *b,
                                                 apex_dtype wt, int64_t rows, int64_t cols, float eps, int rms, void *y,
                                                 float *mean, float *rstd) {
  if (!norm_fits(cols))
    return apex__fail(APEX_ERR_UNSUPPORTED, "apex_cuda_layer_norm_forward: rows of %lld; the fused kernel takes up to %d",
                      (long long)cols, NORM_MAX_COLS);
  if (rows == 0) return APEX_OK;
  NORM_LAUNCH(ln_fwd_kernel, cols, (unsigned)rows, norm_threads(cols), (cudaStream_t)apex__cuda_stream(), x, xt, w,
              rms ? NULL : b, wt, cols, eps, rms, y, mean, rstd);
  return apex__cuda_check_launch("apex_cuda_layer_norm_forward");
}

extern "C" apex_status apex__cuda_layer_norm_bwd(const void *dy, const void *x, apex_dtype xt, const void *w,
                                                 apex_dtype wt, const float *mean, const float *rstd, int64_t rows,
                                                 int64_t cols, int rms, void *dx, void *dw, void *db) {
  if (!norm_fits(cols))
    return apex__fail(APEX_ERR_UNSUPPORTED, "apex_cuda_layer_norm_backward: rows of %lld; the fused kernel takes up to %d",
                      (long long)cols, NORM_MAX_COLS);
  cudaStream_t st = (cudaStream_t)apex__cuda_stream();
  if (rows > 0)
    NORM_LAUNCH(ln_bwd_dx_kernel, cols, (unsigned)rows, norm_threads(cols), st, dy, x, xt, w, wt, mean, rstd, cols, rms,
                dx);
  apex_status s = apex__cuda_check_launch("apex_cuda_layer_norm_backward");
  int groups = (int)((rows + DW_GROUP - 1) / DW_GROUP);
  if (groups < 1) groups = 1;
  void *pw = NULL, *pb = NULL;
  if (s == APEX_OK) s = apex__cuda_alloc(sizeof(float) * (size_t)groups * (size_t)cols, 1, &pw);
  if (s == APEX_OK && db) s = apex__cuda_alloc(sizeof(float) * (size_t)groups * (size_t)cols, 1, &pb);
  if (s == APEX_OK) {
    dim3 grid((unsigned)((cols + DW_COLS - 1) / DW_COLS), (unsigned)groups), block(DW_COLS, DW_ROWS);
    if (rows > 0)
      ln_bwd_dw_partial<<<grid, block, 0, st>>>(dy, x, xt, mean, rstd, rows, cols, rms, (float *)pw, (float *)pb);
    ln_bwd_dw_finish<<<(unsigned)((cols + 255) / 256), 256, 0, st>>>((const float *)pw, (const float *)pb, groups, cols,
                                                                     dw, db, wt);
    s = apex__cuda_check_launch("apex_cuda_layer_norm_backward");
  }
  apex__cuda_free(pw);
  apex__cuda_free(pb);
  return s;
}
