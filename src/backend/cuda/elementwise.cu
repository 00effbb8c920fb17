/* elementwise.cu: the elementwise ops and the two reductions of cuda.h's "elementwise and reductions":
 * add, mul, scale, ReLU and GELU (tanh form) with their gradients, column sums and the sum of all.
 *
 * Every elementwise op is a functor run by the one kernel ew_kernel: widen the inputs to f32
 * (dtype_dev.cuh), apply the functor, round once to the output's dtype, which is what the CPU ops do
 * (apex__f32, an f32 loop, apex__store). The functors repeat the CPU's expressions
 * (src/autograd/ops_elementwise.c) operation for operation and in the same order, and this file is
 * built with -fmad=false, so that nothing is contracted into an FMA the CPU does not do: the GPU
 * computes the CPU's bits. GELU is the exception: it calls tanhf, and the device's is not glibc's.
 *
 * The reductions use no float atomics, whose order changes from run to run: partial sums go to a
 * workspace from a grid laid out by the shape alone (never by the GPU's SM count), and a second pass
 * adds them in index order, so every run, and every GPU, gives the same bits.
 *
 * The file closes with the general kernels of the nn slots (args_nn.h, beside cpu/elementwise.c): every
 * unary kind and every binary kind over any broadcast, forward and backward, for what the functors above
 * do not cover (nn_slots.c picks). A broadcast operand's gradient is gathered per element, its terms
 * added in the order of the output's index as the CPU adds them, so no two threads write one element. */
#include <cuda_runtime.h>

extern "C" {
#include "core/internal.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_internal.h"
}
#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/dtype_dev.cuh"
#include "backend/cuda/grad_dev.cuh"

#define EW_THREADS 256

/* ---- the elementwise kernel and its functors ----------------------------------------------------------- */

/* y[i] = op(a[i], b[i]) for i < n (b is not read by a unary op: Op::binary false). A grid-stride loop
 * in 64-bit indices: the grid is capped (apex_grid), the tensors need not be. y may be a (or b): each
 * thread reads its element before it writes it, and no thread touches another's. */
template <class Op>
__global__ void ew_kernel(Op op, const void *a, apex_dtype at, const void *b, apex_dtype bt, void *y, apex_dtype yt,
                          int64_t n) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float va = apex_ld(a, at, i);
    float vb = Op::binary ? apex_ld(b, bt, i) : 0.0f;
    apex_st(y, yt, i, op(va, vb));
  }
}

template <class Op>
static apex_status ew_launch(const Op &op, const void *a, apex_dtype at, const void *b, apex_dtype bt, void *y,
                             apex_dtype yt, int64_t n, const char *fn) {
  if (n <= 0) return APEX_OK;
  ew_kernel<Op><<<apex_grid(n, EW_THREADS, 4), EW_THREADS, 0, (cudaStream_t)apex__cuda_stream()>>>(op, a, at, b, bt, y,
                                                                                                    yt, n);
  return apex__cuda_check_launch(fn);
}

/* The bits of 0.0f + v: a CPU backward adds its term into a zeroed f32 gradient (or stores 0.0f + term
 * into a fresh one, autograd/ag.h), which turns -0 into +0 and changes nothing else. Written as a
 * select so that no compiler may fold the addition away. */
__device__ __forceinline__ float plus_zero(float v) { return v == 0.0f ? 0.0f : v; }

struct AddOp {
  static constexpr bool binary = true;
  __device__ float operator()(float a, float b) const { return a + b; }
};

struct MulOp {
  static constexpr bool binary = true;
  __device__ float operator()(float a, float b) const { return a * b; }
};

struct ScaleOp {
  static constexpr bool binary = false;
  float alpha;
  __device__ float operator()(float x, float) const { return x * alpha; } /* apex_scale's X[i] * s */
};

/* NaN > 0 is false, so NaN gives +0, as on the CPU. */
struct ReluOp {
  static constexpr bool binary = false;
  __device__ float operator()(float x, float) const { return x > 0.0f ? x : 0.0f; }
};

/* (dy, x): the CPU masks by its output being non-zero, which is x > 0 (the output is x there, +0
 * elsewhere, in x's dtype). */
struct ReluBwdOp {
  static constexpr bool binary = true;
  __device__ float operator()(float dy, float x) const { return x > 0.0f ? plus_zero(dy) : 0.0f; }
};

#define GELU_K 0.7978845608028654f /* sqrt(2/pi), as ops_elementwise.c */
#define GELU_C 0.044715f

/* tanh(sqrt(2/pi) (x + 0.044715 x^3)) with the CPU's grouping: ((C x) x) x. */
__device__ __forceinline__ float gelu_tanh_t(float x) { return tanhf(GELU_K * (x + GELU_C * x * x * x)); }

struct GeluOp {
  static constexpr bool binary = false;
  __device__ float operator()(float x, float) const { return 0.5f * x * (1.0f + gelu_tanh_t(x)); }
};

/* (dy, x): dy * gelu'(x), the CPU backward's expression term for term. */
struct GeluBwdOp {
  static constexpr bool binary = true;
  __device__ float operator()(float dy, float x) const {
    float t = gelu_tanh_t(x);
    return plus_zero(dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_C * x * x)));
  }
};

extern "C" apex_status apex__cuda_ew(apex__cuda_ew_op op, const void *a, apex_dtype at, const void *b, apex_dtype bt,
                                     float alpha, void *y, apex_dtype yt, int64_t n) {
  switch (op) {
  case APEX__EW_ADD: return ew_launch(AddOp{}, a, at, b, bt, y, yt, n, "apex_kernel_add");
  case APEX__EW_MUL: return ew_launch(MulOp{}, a, at, b, bt, y, yt, n, "apex_kernel_mul");
  case APEX__EW_SCALE: return ew_launch(ScaleOp{alpha}, a, at, b, bt, y, yt, n, "apex_kernel_scale");
  case APEX__EW_RELU: return ew_launch(ReluOp{}, a, at, b, bt, y, yt, n, "apex_kernel_relu_forward");
  case APEX__EW_RELU_BWD: return ew_launch(ReluBwdOp{}, a, at, b, bt, y, yt, n, "apex_kernel_relu_backward");
  case APEX__EW_GELU: return ew_launch(GeluOp{}, a, at, b, bt, y, yt, n, "apex_kernel_gelu_forward");
  case APEX__EW_GELU_BWD: return ew_launch(GeluBwdOp{}, a, at, b, bt, y, yt, n, "apex_kernel_gelu_backward");
  }
  return apex__fail(APEX_ERR_INVALID_ARG, "apex__cuda_ew: unknown op %d", (int)op);
}

/* ---- column sums --------------------------------------------------------------------------------------- */

/* A block is SR_TX columns by SR_TY row lanes: a warp reads 32 adjacent columns of a row (coalesced). */
#define SR_TX 32
#define SR_TY 8
/* Rows a chunk aims at, and the most blocks the first pass spreads over: enough to fill a GPU (and no
 * more: the second pass reads a workspace row per chunk). */
#define SR_CHUNK_ROWS 256
#define SR_MAX_BLOCKS 4096

/* Block (bx, by) sums columns [bx SR_TX, +SR_TX) of x [rows, cols] over the rows of chunk by, rows
 * [by per, min(rows, (by + 1) per)): row lane ty adds rows ty, ty + SR_TY, ... of the chunk in order,
 * then lane 0 adds the SR_TY lanes' sums in order and stores out[by * cols + c] (plus the value there
 * when accumulate). The first pass writes one f32 workspace row per chunk; the second is this kernel
 * again over the workspace, [chunks, cols] as one chunk, storing y. */
__global__ void sum_rows_kernel(const void *x, apex_dtype xt, int64_t rows, int64_t cols, int64_t per, void *out,
                                apex_dtype ot, int accumulate) {
  __shared__ float part[SR_TY][SR_TX];
  const int64_t c = (int64_t)blockIdx.x * SR_TX + threadIdx.x;
  const int64_t r0 = (int64_t)blockIdx.y * per, r1 = r0 + per < rows ? r0 + per : rows;
  float s = 0.0f;
  if (c < cols)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += SR_TY) s += apex_ld(x, xt, r * cols + c);
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float t = part[0][threadIdx.x];
    for (int k = 1; k < SR_TY; k++) t += part[k][threadIdx.x];
    const int64_t o = (int64_t)blockIdx.y * cols + c;
    if (accumulate) t = apex_ld(out, ot, o) + t;
    apex_st(out, ot, o, t);
  }
}

extern "C" apex_status apex__cuda_sum_rows(const void *x, apex_dtype xt, int64_t rows, int64_t cols, void *y,
                                           apex_dtype yt, int accumulate) {
  const char *fn = "apex_kernel_sum_rows";
  if (cols <= 0) return APEX_OK;
  const int64_t tiles = (cols + SR_TX - 1) / SR_TX;
  if (tiles > INT32_MAX) return apex__fail(APEX_ERR_SHAPE, "%s: %lld columns are more than one launch takes", fn, (long long)cols);
  /* The chunking depends on the shape only, so the order of the additions does too. */
  int64_t chunks = (rows + SR_CHUNK_ROWS - 1) / SR_CHUNK_ROWS, cap = SR_MAX_BLOCKS / tiles;
  if (chunks > cap) chunks = cap;
  if (chunks < 1) chunks = 1;
  const int64_t per = chunks > 1 ? (rows + chunks - 1) / chunks : rows;
  if (chunks > 1) chunks = (rows + per - 1) / per; /* no empty chunk */
  cudaStream_t stream = (cudaStream_t)apex__cuda_stream();
  const dim3 block(SR_TX, SR_TY);
  if (chunks == 1) {
    sum_rows_kernel<<<dim3((unsigned)tiles, 1), block, 0, stream>>>(x, xt, rows, cols, rows, y, yt, accumulate);
    return apex__cuda_check_launch(fn);
  }
  float *ws = NULL; /* [chunks, cols]: chunks * tiles <= SR_MAX_BLOCKS, so at most 512 KiB */
  apex_status st = apex__cuda_alloc((size_t)(chunks * cols) * sizeof(float), 0, (void **)&ws);
  if (st != APEX_OK) return st;
  sum_rows_kernel<<<dim3((unsigned)tiles, (unsigned)chunks), block, 0, stream>>>(x, xt, rows, cols, per, ws, APEX_F32, 0);
  st = apex__cuda_check_launch(fn);
  if (st == APEX_OK) {
    sum_rows_kernel<<<dim3((unsigned)tiles, 1), block, 0, stream>>>(ws, APEX_F32, chunks, cols, chunks, y, yt, accumulate);
    st = apex__cuda_check_launch(fn);
  }
  apex__cuda_free(ws); /* stream-ordered: a later allocation reusing it runs after these kernels */
  return st;
}

/* ---- sum of all ------------------------------------------------------------------------------------------ */

#define SA_THREADS 256
#define SA_PER_THREAD 16
#define SA_MAX_BLOCKS 1024

/* Thread t of block b (g = b * SA_THREADS + t) adds x[g], x[g + G], x[g + 2G], ... (G: the grid's
 * threads) in order in f32; block_sum adds the block's threads in a fixed tree; part[b] gets it. */
__global__ void sum_all_partial(const void *x, apex_dtype xt, int64_t n, float *part) {
  __shared__ float scratch[33];
  const int64_t stride = (int64_t)gridDim.x * SA_THREADS;
  float s = 0.0f;
  for (int64_t i = (int64_t)blockIdx.x * SA_THREADS + threadIdx.x; i < n; i += stride) s += apex_ld(x, xt, i);
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

/* One warp: lane l adds part[l], part[l + 32], ... in f64 in order, then the lanes are summed by an
 * xor butterfly (at every step a lane and its partner add the same two values, so all lanes agree);
 * y = the sum, or the sum / n, rounded once to f32. */
__global__ void sum_all_final(const float *part, int nparts, int64_t n, int mean, float *y) {
  double s = 0.0;
  for (int i = threadIdx.x; i < nparts; i += 32) s += (double)part[i];
  s = warp_sum(s);
  if (threadIdx.x == 0) *y = (float)(mean ? s / (double)n : s);
}

extern "C" apex_status apex__cuda_sum_all(const void *x, apex_dtype xt, int64_t n, int mean, float *y) {
  const char *fn = "apex_kernel_sum_all";
  int64_t blocks = (n + (int64_t)SA_THREADS * SA_PER_THREAD - 1) / ((int64_t)SA_THREADS * SA_PER_THREAD);
  if (blocks > SA_MAX_BLOCKS) blocks = SA_MAX_BLOCKS;
  if (blocks < 1) blocks = 1; /* n = 0: one block of zeros, so the sum is 0 and the mean 0 / 0 = NaN */
  float *part = NULL;
  apex_status st = apex__cuda_alloc((size_t)blocks * sizeof(float), 0, (void **)&part);
  if (st != APEX_OK) return st;
  cudaStream_t stream = (cudaStream_t)apex__cuda_stream();
  sum_all_partial<<<(unsigned)blocks, SA_THREADS, 0, stream>>>(x, xt, n, part);
  st = apex__cuda_check_launch(fn);
  if (st == APEX_OK) {
    sum_all_final<<<1, 32, 0, stream>>>(part, (int)blocks, n, mean, y);
    st = apex__cuda_check_launch(fn);
  }
  apex__cuda_free(part);
  return st;
}

/* ---- the nn slots' general unary and binary kernels (cpu/elementwise.c) ---------------------------------- */

#define NN_GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define NN_GELU_C 0.044715f

__device__ __forceinline__ float nn_unary_f(apex_nn_unary_kind kind, float x, float p) {
  switch (kind) {
  case APEX_NN_RELU: return x > 0.0f ? x : 0.0f;
  case APEX_NN_GELU: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
  case APEX_NN_GELU_TANH: return 0.5f * x * (1.0f + tanhf(NN_GELU_K * (x + NN_GELU_C * x * x * x)));
  case APEX_NN_TANH: return tanhf(x);
  case APEX_NN_EXP: return expf(x);
  case APEX_NN_LOG: return logf(x);
  case APEX_NN_POW_SCALAR: return p == 2.0f ? x * x : p == 0.5f ? sqrtf(x) : powf(x, p);
  default: return 1.0f / (1.0f + expf(-x)); /* sigmoid */
  }
}

/* kind'(x) times go, in the CPU's order of operations (act_slope, unary_bwd_f32). */
__device__ __forceinline__ float nn_unary_term(apex_nn_unary_kind kind, float x, float g, float p) {
  switch (kind) {
  case APEX_NN_GELU: {
    float e = erff(x * 0.70710678118654752f);
    float cdf = 0.5f * (1.0f + e), pdf = 0.3989422804014327f * expf(-0.5f * x * x);
    return g * (cdf + x * pdf);
  }
  case APEX_NN_GELU_TANH: {
    float t = tanhf(NN_GELU_K * (x + NN_GELU_C * x * x * x));
    return g * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * NN_GELU_K * (1.0f + 3.0f * NN_GELU_C * x * x));
  }
  case APEX_NN_TANH: {
    float t = tanhf(x);
    return g * (1.0f - t * t);
  }
  case APEX_NN_EXP: return g * expf(x);
  case APEX_NN_LOG: return g / x;
  case APEX_NN_POW_SCALAR: return g * (p * powf(x, p - 1.0f));
  default: {
    float s = 1.0f / (1.0f + expf(-x));
    return g * s * (1.0f - s);
  }
  }
}

__global__ void nn_unary_kernel(apex_nn_unary_kind kind, int64_t n, const void *x, apex_dtype xt, void *out, apex_dtype ot, float p) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    apex_st(out, ot, i, nn_unary_f(kind, apex_ld(x, xt, i), p));
}

/* RELU reads its raw output y (non-zero exactly where x > 0); POW_SCALAR with p 0 adds nothing (x^0 is
 * 1 everywhere). */
__global__ void nn_unary_bwd_kernel(apex_nn_unary_kind kind, int64_t n, const void *x, apex_dtype xt, const void *y, int y16,
                                    float p, const float *go, float *gx, int acc) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float t;
    if (kind == APEX_NN_RELU) {
      bool on = y16 ? ((const uint16_t *)y)[i] != 0 : ((const uint32_t *)y)[i] != 0;
      if (acc) {
        gx[i] += on ? go[i] : 0.0f;
        continue;
      }
      t = on ? go[i] : 0.0f;
    } else if (kind == APEX_NN_POW_SCALAR && p == 0.0f) {
      if (!acc) gx[i] = 0.0f;
      continue;
    } else {
      t = nn_unary_term(kind, apex_ld(x, xt, i), go[i], p);
    }
    grad_put(gx, i, t, acc);
  }
}

extern "C" apex_status apex__cuda_nn_unary_any(const apex_nn_unary_args *a) {
  int64_t n = (int64_t)a->n;
  if (!n) return APEX_OK;
  nn_unary_kernel<<<apex_grid(n, EW_THREADS, 4), EW_THREADS, 0, nn_stream()>>>(a->kind, n, a->x.data, a->x.dtype, a->out, a->out_dtype,
                                                                               a->p);
  return apex__cuda_check_launch("nn_unary");
}

extern "C" apex_status apex__cuda_nn_unary_bwd_any(const apex_nn_unary_bwd_args *a) {
  int64_t n = (int64_t)a->n;
  if (!n || !a->gx) return APEX_OK;
  nn_unary_bwd_kernel<<<apex_grid(n, EW_THREADS, 4), EW_THREADS, 0, nn_stream()>>>(
      a->kind, n, a->x.data, a->x.dtype, a->y, apex_dtype_size(a->y_dtype) == 2, a->p, (const float *)a->gout, (float *)a->gx, a->accumulate_x);
  return apex__cuda_check_launch("nn_unary_bwd");
}

__device__ __forceinline__ float nn_binary_f(apex_nn_binary_kind kind, float x, float y) {
  switch (kind) {
  case APEX_NN_ADD: return x + y;
  case APEX_NN_SUB: return x - y;
  case APEX_NN_MUL: return x * y;
  case APEX_NN_POW: return powf(x, y);
  case APEX_NN_GT: return x > y ? 1.0f : 0.0f;
  case APEX_NN_LT: return x < y ? 1.0f : 0.0f;
  case APEX_NN_EQ: return x == y ? 1.0f : 0.0f;
  default: return x / y;
  }
}

/* d(out)/d(operand k) (cpu/elementwise.c's partial, PyTorch's pow_backward zeros included). */
__device__ __forceinline__ float nn_partial(apex_nn_binary_kind kind, int k, float x, float y) {
  switch (kind) {
  case APEX_NN_ADD: return 1.0f;
  case APEX_NN_SUB: return k ? -1.0f : 1.0f;
  case APEX_NN_MUL: return k ? x : y;
  case APEX_NN_POW:
    if (!k) return y == 0.0f ? 0.0f : y * powf(x, y - 1.0f);
    return x == 0.0f && y >= 0.0f ? 0.0f : powf(x, y) * logf(x);
  default: return k ? -x / (y * y) : 1.0f / y;
  }
}

__global__ void nn_binary_kernel(apex_nn_binary_kind kind, apex_nn_bcast p, int64_t n, const void *a, apex_dtype at, const void *b,
                                 apex_dtype bt, void *out, apex_dtype ot) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < n; o += stride) {
    int64_t rem = o, oa = 0, ob = 0;
    for (int d = p.nd - 1; d >= 0; d--) {
      int64_t i = rem % p.shape[d];
      rem /= p.shape[d];
      oa += i * p.st[0][d];
      ob += i * p.st[1][d];
    }
    apex_st(out, ot, o, nn_binary_f(kind, apex_ld(a, at, oa), apex_ld(b, bt, ob)));
  }
}

/* Operand k's gradient, one of its elements e per thread: e's index in each dimension where k moves,
 * then every output position over the dimensions where k repeats, in the output's index order, each
 * term go * partial added to the running value as the CPU adds them. */
__global__ void nn_binary_bwd_kernel(apex_nn_binary_kind kind, int k, apex_nn_bcast p, int64_t numel, const void *a, apex_dtype at,
                                     const void *b, apex_dtype bt, const float *go, float *g, int acc) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  bool reads = kind == APEX_NN_MUL || kind == APEX_NN_DIV || kind == APEX_NN_POW;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < numel; e += stride) {
    int64_t idx[APEX_MAX_DIMS];
    for (int d = 0; d < p.nd; d++) idx[d] = p.st[k][d] ? e / p.st[k][d] % p.shape[d] : 0;
    float v = acc ? g[e] : 0.0f;
    for (;;) {
      int64_t o = 0, off[2] = {0, 0};
      for (int d = 0; d < p.nd; d++) {
        o = o * p.shape[d] + idx[d];
        off[0] += idx[d] * p.st[0][d];
        off[1] += idx[d] * p.st[1][d];
      }
      float x = reads ? apex_ld(a, at, off[0]) : 0.0f, y = reads ? apex_ld(b, bt, off[1]) : 0.0f;
      v += go[o] * nn_partial(kind, k, x, y);
      int d = p.nd - 1; /* the next position: an odometer over the repeated dimensions */
      for (; d >= 0; d--) {
        if (p.st[k][d] || p.shape[d] == 1) continue;
        if (++idx[d] < p.shape[d]) break;
        idx[d] = 0;
      }
      if (d < 0) break;
    }
    g[e] = v;
  }
}

extern "C" apex_status apex__cuda_nn_binary_any(const apex_nn_binary_args *a) {
  int64_t n = (int64_t)(a->plan->rows * a->plan->len);
  if (!n) return APEX_OK;
  nn_binary_kernel<<<apex_grid(n, EW_THREADS, 4), EW_THREADS, 0, nn_stream()>>>(a->kind, *a->plan, n, a->a.data, a->a.dtype, a->b.data,
                                                                                a->b.dtype, a->out, a->out_dtype);
  return apex__cuda_check_launch("nn_binary");
}

extern "C" apex_status apex__cuda_nn_binary_bwd_any(const apex_nn_binary_bwd_args *a) {
  float *g[2] = {(float *)a->ga, (float *)a->gb};
  size_t numel[2] = {a->numel_a, a->numel_b};
  int acc[2] = {a->accumulate_a, a->accumulate_b};
  apex_status st = APEX_OK;
  for (int k = 0; k < 2 && st == APEX_OK; k++) {
    if (!g[k] || !numel[k]) continue;
    nn_binary_bwd_kernel<<<apex_grid((int64_t)numel[k], EW_THREADS, 4), EW_THREADS, 0, nn_stream()>>>(
        a->kind, k, *a->plan, (int64_t)numel[k], a->a.data, a->a.dtype, a->b.data, a->b.dtype, (const float *)a->gout, g[k], acc[k]);
    st = apex__cuda_check_launch("nn_binary_bwd");
  }
  return st;
}
