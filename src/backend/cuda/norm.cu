/* norm.cu: fused layer norm and RMS norm, forward and backward (Apex's FusedLayerNorm / FusedRMSNorm).
 *
 * The kernels are memory-bound, so they are shaped around the bytes:
 * - templated on x's and w's dtypes (dispatched once on the host), and on VEC: with the row length a
 *   multiple of 16 bytes' worth of elements and every pointer 16-byte aligned, each access moves 16 bytes
 *   (8 halfs or 4 floats); otherwise VEC = 1 and the same code moves one element (views at odd offsets);
 * - a row is held in registers, PER values per thread, by a "row team" of TPR threads: one warp for rows
 *   up to 512 (four rows per block, no __syncthreads at all), 64..512 threads for longer rows (warp
 *   shuffles, then one shared-memory step per reduction);
 * - forward: two passes over the registers (mean, then the squared deviations), one read of x, one write
 *   of y; backward: dx's two row sums (sum w*dy and sum w*dy*xhat) reduced together, and dw/db summed
 *   in the same kernel: a thread owns the same columns in every row it visits, so it keeps their dw/db
 *   in registers across its block's rows (no second read of x and dy). Each block writes one partial row,
 *   and a column-sum kernel adds the blocks' partials in order. Rows longer than 8,192 keep too many
 *   values per thread for that; there dw/db come from a column-sum kernel over dy and x themselves.
 * Deterministic: every sum has a fixed order (butterfly shuffles give every lane the same bits; partials
 * are added by block index), no atomics. The number of blocks of the backward follows the GPU's size
 * (one wave of resident blocks), so the grouping of dw/db's sums is fixed per GPU model and shape.
 *
 * The batch norm backward slots (args_nn.h: nn_batch_norm_bwd, _sums, _dx) close the file, beside
 * cpu/norm.c's: one block per channel sums in double in a fixed tree, then writes the channel's input
 * gradient from the sums. */
#include <cuda_runtime.h>
#include <pthread.h>

#include <type_traits>

extern "C" {
#include "core/internal.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_internal.h"
}
#include "backend/cuda/dtype_dev.cuh"
#include "backend/cuda/grad_dev.cuh"

#define NORM_MAX_COLS (512 * 32)
#define NORM_FUSED_COLS 8192 /* longest row whose dw/db stay in registers (PER 16 at 512 threads) */
#define NORM_MAX_WARPS 16    /* 512 threads */
#define NORM_ROW_THREADS 128 /* a block holds 128 / TPR rows when a row takes less */

/* Sums N values over the TPR threads of a row team (TPR a power of two >= 32; the block holds
 * blockDim.x / TPR teams); every thread of the team gets the same bits: the butterfly gives each lane the
 * same sum (a + b == b + a), and the warps' sums are added in warp order. With TPR > 32 it synchronises
 * the block, so every thread of the block must call it (the callers keep their trip counts uniform and
 * never return early); scratch holds NORM_MAX_WARPS * N floats and must not be the one the previous call
 * used (the callers alternate two). */
template <int N>
__device__ __forceinline__ void row_sum(float (&v)[N], int tpr, float *scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
#pragma unroll
    for (int n = 0; n < N; n++) v[n] += __shfl_xor_sync(0xffffffffu, v[n], o);
  if (tpr > 32) {
    const int nw = tpr >> 5, warp = (threadIdx.x % tpr) >> 5;
    float *mine = scratch + (threadIdx.x / tpr) * nw * N; /* this team's warps */
    if ((threadIdx.x & 31) == 0)
#pragma unroll
      for (int n = 0; n < N; n++) mine[warp * N + n] = v[n];
    __syncthreads();
#pragma unroll
    for (int n = 0; n < N; n++) {
      float s = 0.0f;
      for (int i = 0; i < nw; i++) s += mine[i * N + n];
      v[n] = s;
    }
  }
}

/* Calls f(j, c) for each vector of the row this thread holds: j, the index of its first value in the
 * thread's PER registers; c, its first column (thread t of the team holds vectors t, t + TPR, ...). */
template <int PER, int VEC, class F>
__device__ __forceinline__ void each_vec(int tpr, int t, int64_t cols, F &&f) {
#pragma unroll
  for (int k = 0; k < PER / VEC; k++) {
    const int c = (k * tpr + t) * VEC; /* cols <= NORM_MAX_COLS: int */
    if (c < cols) f(k * VEC, c);
  }
}

/* One row per team: y = (x - mean) * rstd * w + b (rms: x * rstd * w). Grid: ceil(rows / teams). With x2 (a
 * residual add fused in front): x is first replaced by x + x2 rounded to T, as a separate add would store
 * it, and that sum is stored in xsum (the residual stream; it may be x or x2 itself: each element is read
 * before the thread holding it writes it). */
template <class T, class W, int VEC, int PER>
__global__ void __launch_bounds__(512, 1) ln_fwd_kernel(const typename T::S *x, const typename W::S *__restrict__ w,
                                                     const typename W::S *__restrict__ b, int64_t rows, int64_t cols,
                                                     int tpr, float eps, int rms, typename T::S *__restrict__ y,
                                                     float *__restrict__ mean_out, float *__restrict__ rstd_out,
                                                     const typename T::S *x2, typename T::S *xsum) {
  __shared__ float scratch[2][NORM_MAX_WARPS];
  const int teams = blockDim.x / tpr, t = threadIdx.x % tpr;
  const int64_t row = (int64_t)blockIdx.x * teams + threadIdx.x / tpr;
  const bool live = row < rows; /* a team past the last row still takes part in row_sum's __syncthreads */
  const typename T::S *xr = x + row * cols;
  float v[PER] = {}, s[1] = {0.0f};
  if (live) each_vec<PER, VEC>(tpr, t, cols, [&](int j, int c) { dev_ld_vec<T, VEC>(xr + c, v + j); });
  if (live && x2) {
    each_vec<PER, VEC>(tpr, t, cols, [&](int j, int c) {
      float v2[VEC];
      dev_ld_vec<T, VEC>(x2 + row * cols + c, v2);
#pragma unroll
      for (int e = 0; e < VEC; e++) v[j + e] = T::ld(T::st(v[j + e] + v2[e]));
      dev_st_vec<T, VEC>(xsum + row * cols + c, v + j);
    });
  }
#pragma unroll
  for (int j = 0; j < PER; j++) s[0] += rms ? v[j] * v[j] : v[j]; /* zeros past the row's end */
  row_sum(s, tpr, scratch[0]);
  float mean = 0.0f, var;
  if (rms) {
    var = s[0] / (float)cols;
  } else {
    mean = s[0] / (float)cols;
    float q[1] = {0.0f};
    each_vec<PER, VEC>(tpr, t, cols, [&](int j, int) {
#pragma unroll
      for (int e = 0; e < VEC; e++) q[0] += (v[j + e] - mean) * (v[j + e] - mean);
    });
    row_sum(q, tpr, scratch[1]);
    var = q[0] / (float)cols;
  }
  float rstd = 1.0f / sqrtf(var + eps);
  if (!live) return; /* after the last row_sum */
  if (t == 0) {
    if (mean_out) mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
  typename T::S *yr = y + row * cols;
  each_vec<PER, VEC>(tpr, t, cols, [&](int j, int c) {
    float wv[VEC], bv[VEC], o[VEC];
    dev_ld_vec<W, VEC>(w + c, wv);
    if (b) dev_ld_vec<W, VEC>(b + c, bv);
#pragma unroll
    for (int e = 0; e < VEC; e++) {
      o[e] = (v[j + e] - mean) * rstd * wv[e];
      if (b) o[e] += bv[e];
    }
    dev_st_vec<T, VEC>(yr + c, o);
  });
}

/* dx for the rows of each team, team after team down the grid (block g takes row groups g, g + grid, ...,
 * the same count for every team of a block, so the reductions stay uniform): dx + term when acc_dx, else
 * 0.0f + term (args_nn.h's landing, in f32, rounded once to dx's dtype); no dx: only the sums. With FUSE,
 * each thread also sums dy * xhat and dy over its columns of every row it visits, the block's teams are
 * added in team order through dynamic shared memory ((teams - 1) * 2 * cols floats), and the block writes
 * part[block][0][c] (dw) and part[block][1][c] (db). */
template <class T, class W, int VEC, int PER, bool FUSE>
__global__ void __launch_bounds__(512, 1) ln_bwd_kernel(const typename T::S *__restrict__ dy, const typename T::S *__restrict__ x,
                                                     const typename W::S *__restrict__ w, const float *__restrict__ mean,
                                                     const float *__restrict__ rstd, int64_t rows, int64_t cols, int tpr,
                                                     int rms, typename T::S *__restrict__ dx, int acc_dx, float *__restrict__ part) {
  __shared__ float scratch[2][2 * NORM_MAX_WARPS];
  extern __shared__ float team_acc[];
  const int teams = blockDim.x / tpr, team = threadIdx.x / tpr, t = threadIdx.x % tpr;
  constexpr int NA = FUSE ? PER : 1;
  float aw[NA], ab[NA];
#pragma unroll
  for (int j = 0; j < NA; j++) aw[j] = ab[j] = 0.0f;
  int it = 0;
  for (int64_t base = (int64_t)blockIdx.x * teams; base < rows; base += (int64_t)gridDim.x * teams, it ^= 1) {
    const int64_t row = base + team;
    const bool live = row < rows;
    const float mu = live && !rms ? mean[row] : 0.0f, rs = live ? rstd[row] : 0.0f;
    const typename T::S *xr = x + row * cols, *gr = dy + row * cols;
    float xh[PER] = {}, wg[PER] = {}; /* xhat, and w * dy (zeros past the row's end) */
    float red[2] = {0.0f, 0.0f};
    if (live)
      each_vec<PER, VEC>(tpr, t, cols, [&](int j, int c) {
        float g[VEC], wv[VEC];
        dev_ld_vec<T, VEC>(xr + c, xh + j);
        dev_ld_vec<T, VEC>(gr + c, g);
        dev_ld_vec<W, VEC>(w + c, wv);
#pragma unroll
        for (int e = 0; e < VEC; e++) {
          xh[j + e] = (xh[j + e] - mu) * rs;
          wg[j + e] = g[e] * wv[e];
          red[0] += wg[j + e];
          red[1] += wg[j + e] * xh[j + e];
          if (FUSE) {
            aw[j + e] += g[e] * xh[j + e];
            ab[j + e] += g[e];
          }
        }
      });
    row_sum(red, tpr, scratch[it]);
    const float ma = rms ? 0.0f : red[0] / (float)cols, mb = red[1] / (float)cols;
    if (live && dx) {
      typename T::S *dr = dx + row * cols;
      each_vec<PER, VEC>(tpr, t, cols, [&](int j, int c) {
        float o[VEC], base[VEC] = {};
        if (acc_dx) dev_ld_vec<T, VEC>(dr + c, base);
#pragma unroll
        for (int e = 0; e < VEC; e++) o[e] = base[e] + rs * (wg[j + e] - ma - xh[j + e] * mb);
        dev_st_vec<T, VEC>(dr + c, o);
      });
    }
  }
  if (!FUSE) return;
  /* teams 1.. hand their sums to team 0, which adds them in team order */
  float *acc = team_acc + (int64_t)(team - 1) * 2 * cols; /* team m's dw at acc, its db at acc + cols */
  if (teams > 1) {
    __syncthreads();
    if (team > 0)
      each_vec<PER, VEC>(tpr, t, cols, [&](int j, int c) {
#pragma unroll
        for (int e = 0; e < VEC; e++) acc[c + e] = aw[j + e], acc[cols + c + e] = ab[j + e];
      });
    __syncthreads();
    if (team > 0) return;
  }
  float *pw = part + (int64_t)blockIdx.x * 2 * cols, *pb = pw + cols;
  each_vec<PER, VEC>(tpr, t, cols, [&](int j, int c) {
#pragma unroll
    for (int e = 0; e < VEC; e++) {
      float sw = aw[j + e], sb = ab[j + e];
      for (int m = 1; m < teams; m++) {
        sw += team_acc[(int64_t)(m - 1) * 2 * cols + c + e];
        sb += team_acc[(int64_t)(m - 1) * 2 * cols + cols + c + e];
      }
      pw[c + e] = sw;
      pb[c + e] = sb;
    }
  });
}

/* Column sums for dw/db, the two sources a column-sum kernel reads: the blocks' partial rows (fused), or dy
 * and x themselves (rows too long to fuse). add() adds row r's terms for column c. */
struct PartialRows {
  const float *p;
  int64_t cols;
  __device__ void add(int64_t r, int64_t c, float &sw, float &sb) const {
    sw += p[r * 2 * cols + c];
    sb += p[r * 2 * cols + cols + c];
  }
};
template <class T>
struct GradRows {
  const typename T::S *dy, *x;
  const float *mean, *rstd;
  int64_t cols;
  int rms;
  __device__ void add(int64_t r, int64_t c, float &sw, float &sb) const {
    float g = T::ld(dy[r * cols + c]), mu = rms ? 0.0f : mean[r];
    sw += g * ((T::ld(x[r * cols + c]) - mu) * rstd[r]);
    sb += g;
  }
};

#define COLSUM_COLS 32
#define COLSUM_LANES 32 /* threads down a column: lane l takes rows l, l + 32, ...; then added in lane order.
                          * Many lanes and an unrolled loop keep many loads in flight: a few hundred partial
                          * rows of a short row length make only cols / 32 blocks. */

/* dw[c] (and db[c], when db is given; f32) = the sum over rows r < n of src's terms, in a fixed order, added
 * to what the buffer holds when acc_w (acc_b), else to 0.0f (args_nn.h's landing). */
template <class Src>
__global__ void __launch_bounds__(COLSUM_COLS *COLSUM_LANES) ln_colsum_kernel(Src src, int64_t n, int64_t cols, float *dw,
                                                                              int acc_w, float *db, int acc_b) {
  __shared__ float sw[COLSUM_LANES][COLSUM_COLS + 1], sb[COLSUM_LANES][COLSUM_COLS + 1];
  const int64_t c = (int64_t)blockIdx.x * COLSUM_COLS + threadIdx.x;
  float aw = 0.0f, ab = 0.0f;
  if (c < cols)
#pragma unroll 8
    for (int64_t r = threadIdx.y; r < n; r += COLSUM_LANES) src.add(r, c, aw, ab);
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float tw = 0.0f, tb = 0.0f;
    for (int l = 0; l < COLSUM_LANES; l++) {
      tw += sw[l][threadIdx.x];
      tb += sb[l][threadIdx.x];
    }
    if (dw) dw[c] = (acc_w ? dw[c] : 0.0f) + tw;
    if (db) db[c] = (acc_b ? db[c] : 0.0f) + tb;
  }
}

/* ---- host: shapes and dispatch ---------------------------------------------------------------------------- */

/* Values per thread and threads per row for a row length; PER 32 only past NORM_FUSED_COLS. */
typedef struct {
  int per, tpr, teams;
} norm_shape;

static norm_shape norm_shape_for(int64_t cols) {
  norm_shape s;
  s.per = cols <= 256 ? 8 : cols <= NORM_FUSED_COLS ? 16 : 32;
  s.tpr = 32;
  while ((int64_t)s.tpr * s.per < cols) s.tpr *= 2;
  s.teams = s.tpr < NORM_ROW_THREADS ? NORM_ROW_THREADS / s.tpr : 1;
  return s;
}

static int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

template <int V>
using Int = std::integral_constant<int, V>;

/* Calls f(T, W, Int<VEC>) with x's and w's dtype tags, VEC the wide width when `wide`, else 1. */
template <class T, class W, class F>
static apex_status with_vec(bool wide, F &&f) {
  constexpr int V = (int)(16 / sizeof(typename T::S));
  return wide ? f(T{}, W{}, Int<V>{}) : f(T{}, W{}, Int<1>{});
}
template <class F>
static apex_status norm_dispatch(apex_dtype xt, apex_dtype wt, int64_t cols, bool aligned, F &&f) {
  const bool wide = aligned && cols % (xt == APEX_F32 ? 4 : 8) == 0;
  const bool wf32 = wt == APEX_F32;
  switch (xt) {
  case APEX_F32: return with_vec<DevF32, DevF32>(wide, f);
  case APEX_F16: return wf32 ? with_vec<DevF16, DevF32>(wide, f) : with_vec<DevF16, DevF16>(wide, f);
  case APEX_BF16: return wf32 ? with_vec<DevBF16, DevF32>(wide, f) : with_vec<DevBF16, DevBF16>(wide, f);
  default: return apex__fail(APEX_ERR_DTYPE, "layer norm: x's dtype %d is not f32, f16 or bf16", (int)xt);
  }
}

/* Calls f(Int<PER>) for the shape's per. */
template <class F>
static void with_per(int per, F &&f) {
  if (per == 8) f(Int<8>{});
  else if (per == 16) f(Int<16>{});
  else f(Int<32>{});
}

static int norm_fits(int64_t cols) { return cols <= NORM_MAX_COLS; }

static apex_status layer_norm_fwd(const void *x, const void *x2, void *xsum, apex_dtype xt, const void *w, const void *b,
                                  apex_dtype wt, int64_t rows, int64_t cols, float eps, int rms, void *y, float *mean,
                                  float *rstd);

extern "C" apex_status apex__cuda_layer_norm_fwd(const void *x, apex_dtype xt, const void *w, const void *b,
                                                 apex_dtype wt, int64_t rows, int64_t cols, float eps, int rms, void *y,
                                                 float *mean, float *rstd) {
  return layer_norm_fwd(x, NULL, NULL, xt, w, b, wt, rows, cols, eps, rms, y, mean, rstd);
}

extern "C" apex_status apex__cuda_add_layer_norm_fwd(const void *x, const void *x2, void *xsum, apex_dtype xt, const void *w,
                                                     const void *b, apex_dtype wt, int64_t rows, int64_t cols, float eps,
                                                     void *y, float *mean, float *rstd) {
  if (!x2 || !xsum) return apex__fail(APEX_ERR_INVALID_ARG, "apex__cuda_add_layer_norm_fwd: NULL residual operand");
  return layer_norm_fwd(x, x2, xsum, xt, w, b, wt, rows, cols, eps, 0, y, mean, rstd);
}

static apex_status layer_norm_fwd(const void *x, const void *x2, void *xsum, apex_dtype xt, const void *w, const void *b,
                                  apex_dtype wt, int64_t rows, int64_t cols, float eps, int rms, void *y, float *mean,
                                  float *rstd) {
  if (!norm_fits(cols))
    return apex__fail(APEX_ERR_UNSUPPORTED, "apex_kernel_layer_norm_forward: rows of %lld; the fused kernel takes up to %d",
                      (long long)cols, NORM_MAX_COLS);
  if (rows == 0 || cols == 0) return APEX_OK;
  if (rms) b = NULL;
  const norm_shape sh = norm_shape_for(cols);
  const bool aligned = aligned16(x) && aligned16(w) && (!b || aligned16(b)) && aligned16(y) &&
                       (!x2 || (aligned16(x2) && aligned16(xsum)));
  cudaStream_t st = (cudaStream_t)apex__cuda_stream();
  const unsigned grid = (unsigned)((rows + sh.teams - 1) / sh.teams);
  return norm_dispatch(xt, wt, cols, aligned, [&](auto tx, auto tw, auto vec) {
    typedef decltype(tx) T;
    typedef decltype(tw) W;
    typedef typename T::S TS;
    typedef typename W::S WS;
    with_per(sh.per, [&](auto per) {
      ln_fwd_kernel<T, W, decltype(vec)::value, decltype(per)::value><<<grid, sh.tpr * sh.teams, 0, st>>>(
          (const TS *)x, (const WS *)w, (const WS *)b, rows, cols, sh.tpr, eps, rms, (TS *)y, mean, rstd, (const TS *)x2,
          (TS *)xsum);
    });
    return apex__cuda_check_launch("apex_kernel_layer_norm_forward");
  });
}

/* Blocks for the fused backward: one wave of resident blocks (at most one team per row). The wave (SMs
 * times resident blocks, per kernel and shape on the current device) is asked of the runtime once and
 * kept: the queries cost microseconds of host time, and every layer norm's backward asked them. */
template <class K>
static unsigned bwd_blocks(K kernel, int threads, size_t smem, int64_t rows, int teams) {
  enum { SLOTS = 64 };
  static struct { const void *kernel; int threads; size_t smem; int dev; int64_t wave; } cache[SLOTS];
  static int used;
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  int dev = 0;
  cudaGetDevice(&dev);
  int64_t wave = 0;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < used && !wave; i++)
    if (cache[i].kernel == (const void *)kernel && cache[i].threads == threads && cache[i].smem == smem && cache[i].dev == dev)
      wave = cache[i].wave;
  pthread_mutex_unlock(&mu);
  if (!wave) {
    int sms = 1, per_sm = 1;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess) {
      sms = per_sm = 1;
      cudaGetLastError(); /* the failed query is not the launch's error; one block per SM still runs */
    }
    wave = (int64_t)(sms < 1 ? 1 : sms) * (per_sm < 1 ? 1 : per_sm);
    pthread_mutex_lock(&mu);
    if (used < SLOTS) cache[used++] = {(const void *)kernel, threads, smem, dev, wave};
    pthread_mutex_unlock(&mu);
  }
  int64_t want = (rows + teams - 1) / teams;
  return (unsigned)(want < wave ? want : wave);
}

extern "C" apex_status apex__cuda_layer_norm_bwd(const void *dy, const void *x, apex_dtype xt, const void *w,
                                                 apex_dtype wt, const float *mean, const float *rstd, int64_t rows,
                                                 int64_t cols, int rms, void *dx, int acc_dx, float *dw, int acc_w,
                                                 float *db, int acc_b, apex_nn_workspace ws) {
  if (!norm_fits(cols))
    return apex__fail(APEX_ERR_UNSUPPORTED, "apex_kernel_layer_norm_backward: rows of %lld; the fused kernel takes up to %d",
                      (long long)cols, NORM_MAX_COLS);
  if (cols == 0) return APEX_OK;
  const norm_shape sh = norm_shape_for(cols);
  const bool fuse = cols <= NORM_FUSED_COLS;
  const bool aligned = aligned16(dy) && aligned16(x) && aligned16(w) && (!dx || aligned16(dx));
  cudaStream_t st = (cudaStream_t)apex__cuda_stream();
  const int threads = sh.tpr * sh.teams;
  const size_t smem = fuse ? sizeof(float) * 2 * (size_t)(sh.teams - 1) * (size_t)cols : 0;
  return norm_dispatch(xt, wt, cols, aligned, [&](auto tx, auto tw, auto vec) {
    typedef decltype(tx) T;
    typedef decltype(tw) W;
    typedef typename T::S TS;
    typedef typename W::S WS;
    constexpr int VEC = decltype(vec)::value;
    const unsigned cgrid = (unsigned)((cols + COLSUM_COLS - 1) / COLSUM_COLS);
    const dim3 cblock(COLSUM_COLS, COLSUM_LANES);
    if (!fuse) {
      if (rows > 0) {
        int64_t g = (rows + sh.teams - 1) / sh.teams;
        ln_bwd_kernel<T, W, VEC, 32, false><<<(unsigned)(g < 65535 * 64 ? g : 65535 * 64), threads, 0, st>>>(
            (const TS *)dy, (const TS *)x, (const WS *)w, mean, rstd, rows, cols, sh.tpr, rms, (TS *)dx, acc_dx, NULL);
      }
      GradRows<T> src = {(const TS *)dy, (const TS *)x, mean, rstd, cols, rms};
      if (dw || db) ln_colsum_kernel<<<cgrid, cblock, 0, st>>>(src, rows, cols, dw, acc_w, db, acc_b);
      return apex__cuda_check_launch("apex_kernel_layer_norm_backward");
    }
    unsigned grid = 0;
    void *part = NULL, *owned = NULL;
    apex_status s = APEX_OK;
    if (rows > 0)
      with_per(sh.per, [&](auto per) {
        /* fused rows take PER 8 or 16; mapping 32 to 16 keeps a fused PER-32 kernel from being built */
        auto k = ln_bwd_kernel<T, W, VEC, decltype(per)::value < 32 ? decltype(per)::value : 16, true>;
        grid = bwd_blocks(k, threads, smem, rows, sh.teams);
        part = apex__cuda_ws_scratch(ws, sizeof(float) * 2 * (size_t)grid * (size_t)cols, &owned, &s);
        if (s == APEX_OK)
          k<<<grid, threads, smem, st>>>((const TS *)dy, (const TS *)x, (const WS *)w, mean, rstd, rows, cols, sh.tpr,
                                         rms, (TS *)dx, acc_dx, (float *)part);
      });
    if (s == APEX_OK) {
      PartialRows src = {(const float *)part, cols};
      if (dw || db) ln_colsum_kernel<<<cgrid, cblock, 0, st>>>(src, (int64_t)grid, cols, dw, acc_w, db, acc_b);
      s = apex__cuda_check_launch("apex_kernel_layer_norm_backward");
    }
    apex__cuda_free(owned);
    return s;
  });
}

/* ---- batch norm backward (cpu/norm.c's bn_backward_channel, batch_norm_sums, batch_norm_dx) ---------------- */

#define BN_THREADS 256

/* The gradient at the batch norm's output: gout, through the fused relu's mask when relu is set (an f32
 * output's mask recomputed from x, a half output's from its raw bits; 0 + go where it passes, as the
 * unfused relu backward writes it). */
__device__ __forceinline__ float bn_gout(const apex_nn_batch_norm_bwd_args &a, int64_t j, float x, float m, float r, float w,
                                         float bias) {
  float g = a.gout[j];
  if (!a.relu) return g;
  bool pass = a.y_dtype != APEX_F32 ? ((const uint16_t *)a.y)[j] != 0 : (x - m) * r * w + bias > 0.0f;
  return pass ? (g == 0.0f ? 0.0f : g) : 0.0f;
}

__global__ void __launch_bounds__(BN_THREADS) bn_bwd_kernel(const apex_nn_batch_norm_bwd_args a) {
  __shared__ double red[8];
  int64_t c = blockIdx.x, C = (int64_t)a.C, S = (int64_t)a.S, M = (int64_t)a.N * S;
  float m = a.stats[c], r = a.stats[C + c], w = a.w ? a.w[c] : 1.0f, bias = a.relu && a.b ? a.b[c] : 0.0f;
  double sg = 0, sgx = 0;
  for (int64_t e = threadIdx.x; e < M; e += BN_THREADS) {
    int64_t j = ((e / S) * C + c) * S + e % S;
    float x = apex_ld(a.x.data, a.x.dtype, j), g = bn_gout(a, j, x, m, r, w, bias);
    sg += g;
    sgx += g * (x - m) * r;
  }
  sg = block_total256(sg, red);
  sgx = block_total256(sgx, red);
  if (threadIdx.x == 0) {
    if (a.gw) grad_put(a.gw, c, (float)sgx, a.accumulate_w);
    if (a.gb) grad_put(a.gb, c, (float)sg, a.accumulate_b);
  }
  if (!a.gx) return;
  float k = w * r, mg = a.training ? (float)(sg / (double)M) : 0.0f, mgx = a.training ? (float)(sgx / (double)M) : 0.0f;
  for (int64_t e = threadIdx.x; e < M; e += BN_THREADS) {
    int64_t j = ((e / S) * C + c) * S + e % S;
    float x = apex_ld(a.x.data, a.x.dtype, j), g = bn_gout(a, j, x, m, r, w, bias);
    grad_put(a.gx, j, k * (g - mg - (x - m) * r * mgx), a.accumulate_x);
  }
}

extern "C" apex_status apex__cuda_slot_nn_batch_norm_bwd(const apex_nn_batch_norm_bwd_args *a) {
  if (!a->C) return APEX_OK;
  bn_bwd_kernel<<<(unsigned)a->C, BN_THREADS, 0, nn_stream()>>>(*a);
  return apex__cuda_check_launch("nn_batch_norm_bwd");
}

__global__ void __launch_bounds__(BN_THREADS) bn_sums_kernel(const apex_nn_batch_norm_sums_args a) {
  __shared__ double red[8];
  int64_t c = blockIdx.x, C = (int64_t)a.C, S = (int64_t)a.S, M = (int64_t)a.N * S;
  float m = a.mean[c], r = a.rstd[c];
  double sg = 0, sgx = 0;
  for (int64_t e = threadIdx.x; e < M; e += BN_THREADS) {
    int64_t j = ((e / S) * C + c) * S + e % S;
    float g = a.gout[j];
    sg += g;
    sgx += g * (apex_ld(a.x.data, a.x.dtype, j) - m) * r;
  }
  sg = block_total256(sg, red);
  sgx = block_total256(sgx, red);
  if (threadIdx.x) return;
  a.sums[c] = (float)sg;
  a.sums[C + c] = (float)sgx;
  if (a.gb) grad_put(a.gb, c, (float)sg, a.accumulate_b);
  if (a.gw) grad_put(a.gw, c, (float)sgx, a.accumulate_w);
}

extern "C" apex_status apex__cuda_slot_nn_batch_norm_sums(const apex_nn_batch_norm_sums_args *a) {
  if (!a->C) return APEX_OK;
  bn_sums_kernel<<<(unsigned)a->C, BN_THREADS, 0, nn_stream()>>>(*a);
  return apex__cuda_check_launch("nn_batch_norm_sums");
}

__global__ void bn_dx_kernel(const apex_nn_batch_norm_dx_args a, int64_t n, float inv_total) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x, C = (int64_t)a.C, S = (int64_t)a.S;
  for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += stride) {
    int64_t c = j / S % C;
    float m = a.mean[c], r = a.rstd[c], k = (a.w ? a.w[c] : 1.0f) * r, mg = a.sums[c] * inv_total, mgx = a.sums[C + c] * inv_total;
    grad_put(a.gx, j, k * (a.gout[j] - mg - (apex_ld(a.x.data, a.x.dtype, j) - m) * r * mgx), a.accumulate_x);
  }
}

extern "C" apex_status apex__cuda_slot_nn_batch_norm_dx(const apex_nn_batch_norm_dx_args *a) {
  int64_t n = (int64_t)(a->N * a->C * a->S);
  if (!n || !a->gx) return APEX_OK;
  bn_dx_kernel<<<apex_grid(n, 256, 4), 256, 0, nn_stream()>>>(*a, n, 1.0f / (float)a->count);
  return apex__cuda_check_launch("nn_batch_norm_dx");
}

/* ---- rows too long for the fused kernels (cpu/norm.c's row norm loops) ------------------------------------ */

static_assert(NORM_MAX_COLS == APEX__CUDA_NORM_FUSED_COLS, "nn_slots.c picks the wide-row path by this bound");

/* One block per row, any dtypes: mean and the sum of squared deviations in double (as the CPU sums
 * them, here in a fixed tree), then the row written from them in f32 as the CPU writes it. */
__global__ void __launch_bounds__(BN_THREADS) rn_wide_fwd_kernel(const apex_nn_row_norm_args a) {
  __shared__ double red[8];
  int64_t r = blockIdx.x, D = (int64_t)a.cols, R = (int64_t)a.rows, base = r * D;
  double mean = 0, q = 0;
  if (a.centre) {
    for (int64_t j = threadIdx.x; j < D; j += BN_THREADS) mean += apex_ld(a.x.data, a.x.dtype, base + j);
    mean = block_total256(mean, red) / (double)D;
  }
  for (int64_t j = threadIdx.x; j < D; j += BN_THREADS) {
    double d = apex_ld(a.x.data, a.x.dtype, base + j) - mean;
    q += d * d;
  }
  q = block_total256(q, red);
  float m = (float)mean, rs = (float)(1.0 / sqrt(q / (double)D + a.eps));
  if (threadIdx.x == 0) a.stats[r] = m, a.stats[R + r] = rs;
  for (int64_t j = threadIdx.x; j < D; j += BN_THREADS) {
    float w = a.w.data ? apex_ld(a.w.data, a.w.dtype, j) : 1.0f, b = a.centre && a.b.data ? apex_ld(a.b.data, a.b.dtype, j) : 0.0f;
    apex_st(a.out, a.out_dtype, base + j, (apex_ld(a.x.data, a.x.dtype, base + j) - m) * rs * w + b);
  }
}

extern "C" apex_status apex__cuda_row_norm_wide(const apex_nn_row_norm_args *a) {
  if (!a->rows || !a->cols) return APEX_OK;
  rn_wide_fwd_kernel<<<(unsigned)a->rows, BN_THREADS, 0, nn_stream()>>>(*a);
  return apex__cuda_check_launch("nn_row_norm");
}

/* gx of one row per block, from its two sums (of gout * w, and of that times x-hat) in double. */
__global__ void __launch_bounds__(BN_THREADS) rn_wide_bwd_kernel(const apex_nn_row_norm_bwd_args a) {
  __shared__ double red[8];
  int64_t r = blockIdx.x, D = (int64_t)a.cols, R = (int64_t)a.rows, base = r * D;
  float m = a.stats[r], rk = a.stats[R + r];
  double s1 = 0, s2 = 0;
  for (int64_t j = threadIdx.x; j < D; j += BN_THREADS) {
    float xh = (apex_ld(a.x.data, a.x.dtype, base + j) - m) * rk, gh = ((const float *)a.gout)[base + j] * (a.w.data ? apex_ld(a.w.data, a.w.dtype, j) : 1.0f);
    s1 += gh;
    s2 += gh * xh;
  }
  s1 = block_total256(s1, red);
  s2 = block_total256(s2, red);
  float ca = a.centre ? (float)(s1 / (double)D) : 0.0f, cb = (float)(s2 / (double)D);
  for (int64_t j = threadIdx.x; j < D; j += BN_THREADS) {
    float xh = (apex_ld(a.x.data, a.x.dtype, base + j) - m) * rk, gh = ((const float *)a.gout)[base + j] * (a.w.data ? apex_ld(a.w.data, a.w.dtype, j) : 1.0f);
    grad_put((float *)a.gx, base + j, rk * (gh - ca - xh * cb), a.accumulate_x);
  }
}

/* gw and gb: one column per thread, its rows' terms (gout * x-hat, gout) added in row order. */
__global__ void rn_wide_wb_kernel(const apex_nn_row_norm_bwd_args a) {
  int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, D = (int64_t)a.cols, R = (int64_t)a.rows;
  if (j >= D) return;
  double sw = 0, sb = 0;
  for (int64_t r = 0; r < R; r++) {
    float g = ((const float *)a.gout)[r * D + j];
    if (a.gw) sw += g * ((apex_ld(a.x.data, a.x.dtype, r * D + j) - a.stats[r]) * a.stats[R + r]);
    sb += g;
  }
  if (a.gw) grad_put(a.gw, j, (float)sw, a.accumulate_w);
  if (a.gb) grad_put(a.gb, j, (float)sb, a.accumulate_b);
}

extern "C" apex_status apex__cuda_row_norm_wide_bwd(const apex_nn_row_norm_bwd_args *a) {
  if (!a->rows || !a->cols) return APEX_OK;
  if (a->gx) {
    rn_wide_bwd_kernel<<<(unsigned)a->rows, BN_THREADS, 0, nn_stream()>>>(*a);
    apex_status st = apex__cuda_check_launch("nn_row_norm_bwd");
    if (st != APEX_OK) return st;
  }
  if (!a->gw && !(a->gb && a->centre)) return APEX_OK;
  apex_nn_row_norm_bwd_args b = *a;
  if (!a->centre) b.gb = NULL;
  rn_wide_wb_kernel<<<(unsigned)((a->cols + 255) / 256), 256, 0, nn_stream()>>>(b);
  return apex__cuda_check_launch("nn_row_norm_bwd");
}
