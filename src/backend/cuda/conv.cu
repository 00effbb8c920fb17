/* conv.cu: 2-D convolution on the GPU through cuDNN (forward, backward data, backward filter), with
 * apex's own kernels for the bias and its gradient.
 *
 * cuDNN is loaded at the first call (cudnn_lib.h): libapex builds and links without it, and a machine
 * without it gets APEX_ERR_UNSUPPORTED saying how to point apex at it.
 *
 * Numerics: f32 compute for every dtype; f32 tensors on the FMA units (no TF32, like apex_kernel_matmul),
 * f16/bf16 on the tensor cores. Algorithms come from cuDNN's heuristics, keeping the first that cuDNN
 * marks deterministic and whose workspace fits: the same inputs give the same bits on every run. The
 * bias gradient sums each channel in a fixed order (block_reduce.cuh).
 *
 * The pooling slots (args_nn.h's nn_pool2d, nn_pool2d_bwd) close the file: apex's own kernels, the
 * CPU's loops of cpu/conv.c one output (forward) or one input element (backward) per thread. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

extern "C" {
#include "core/internal.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_internal.h"
}
#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/cudnn_lib.h"
#include "backend/cuda/dtype_dev.cuh"
#include "backend/cuda/grad_dev.cuh"

#define CONV_MAX_WORKSPACE ((size_t)1 << 30)

#define DNN(call, what)                                                                                        \
  do {                                                                                                         \
    cudnnStatus_t s_ = (call);                                                                                 \
    if (s_ != CUDNN_STATUS_SUCCESS) {                                                                          \
      st = apex__fail(APEX_ERR_DEVICE, "%s: cuDNN %s failed: %s", c->fn, what, apex__dnn.cudnnGetErrorString(s_)); \
      goto done;                                                                                               \
    }                                                                                                          \
  } while (0)

/* ---- descriptors ------------------------------------------------------------------------------------ */

typedef struct {
  const char *fn;
  cudnnTensorDescriptor_t x, y;
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t conv;
} conv_desc;

static cudnnDataType_t dnn_type(apex_dtype t) {
  return t == APEX_F16 ? CUDNN_DATA_HALF : t == APEX_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}

static void desc_free(conv_desc *c) {
  if (c->x) apex__dnn.cudnnDestroyTensorDescriptor(c->x);
  if (c->y) apex__dnn.cudnnDestroyTensorDescriptor(c->y);
  if (c->w) apex__dnn.cudnnDestroyFilterDescriptor(c->w);
  if (c->conv) apex__dnn.cudnnDestroyConvolutionDescriptor(c->conv);
}

static apex_status desc_make(conv_desc *c, const apex__cuda_conv *g) {
  apex_status st = APEX_OK;
  cudnnDataType_t t = dnn_type(g->dtype);
  DNN(apex__dnn.cudnnCreateTensorDescriptor(&c->x), "tensor descriptor");
  DNN(apex__dnn.cudnnCreateTensorDescriptor(&c->y), "tensor descriptor");
  DNN(apex__dnn.cudnnCreateFilterDescriptor(&c->w), "filter descriptor");
  DNN(apex__dnn.cudnnCreateConvolutionDescriptor(&c->conv), "convolution descriptor");
  DNN(apex__dnn.cudnnSetTensor4dDescriptor(c->x, CUDNN_TENSOR_NCHW, t, g->n, g->c, g->h, g->w), "x descriptor");
  DNN(apex__dnn.cudnnSetTensor4dDescriptor(c->y, CUDNN_TENSOR_NCHW, t, g->n, g->k, g->p, g->q), "y descriptor");
  DNN(apex__dnn.cudnnSetFilter4dDescriptor(c->w, t, CUDNN_TENSOR_NCHW, g->k, g->c, g->r, g->s), "w descriptor");
  DNN(apex__dnn.cudnnSetConvolution2dDescriptor(c->conv, g->pad_h, g->pad_w, g->stride_h, g->stride_w, 1, 1,
                                          CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
      "convolution descriptor");
done:
  return st;
}

/* The math type an algorithm runs with: f32 stays off the tensor cores (no TF32). */
static cudnnMathType_t math_for(apex_dtype t, cudnnMathType_t suggested) {
  return t == APEX_F32 ? CUDNN_FMA_MATH : suggested;
}

/* The first of cuDNN's ranked algorithms that succeeds, is deterministic and fits CONV_MAX_WORKSPACE. */
template <class Perf>
static int pick(const Perf *perf, int n, apex_dtype t, int *index) {
  for (int i = 0; i < n; i++)
    if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].determinism == CUDNN_DETERMINISTIC &&
        perf[i].memory <= CONV_MAX_WORKSPACE && (t != APEX_F32 || perf[i].mathType != CUDNN_TENSOR_OP_MATH)) {
      *index = i;
      return 1;
    }
  return 0;
}

/* ---- bias kernels ------------------------------------------------------------------------------------ */

/* y[n, k, :] += b[k] over the N * K planes of pq elements. */
__global__ void bias_add(void *y, apex_dtype yt, const void *b, apex_dtype bt, int64_t k, int64_t pq, int64_t total) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
    apex_st(y, yt, i, apex_ld(y, yt, i) + apex_ld(b, bt, (i / pq) % k));
}

/* db[k] = sum over n and the plane of dy[n, k, :], one block a channel, in a fixed order. */
__global__ void bias_grad(const void *dy, apex_dtype dt, void *db, apex_dtype bt, int64_t n, int64_t k, int64_t pq) {
  __shared__ float scratch[33];
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < n * pq; i += blockDim.x) {
    int64_t img = i / pq, at = i % pq;
    s += apex_ld(dy, dt, (img * k + blockIdx.x) * pq + at);
  }
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) apex_st(db, bt, blockIdx.x, s);
}

/* ---- forward and backward ---------------------------------------------------------------------------- */

static apex_status launched(const char *fn) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return apex__fail(APEX_ERR_DEVICE, "%s: CUDA error %s (%s)", fn, cudaGetErrorName(e), cudaGetErrorString(e));
  return APEX_OK;
}

extern "C" apex_status apex__cuda_conv2d_fwd(const apex__cuda_conv *g, const void *x, const void *w, const void *b,
                                             apex_dtype bt, void *y) {
  const char *fn = "apex_kernel_conv2d_forward";
  apex_status st = apex__cudnn_ready(fn);
  if (st != APEX_OK) return st;
  conv_desc cd = {fn, 0, 0, 0, 0}, *c = &cd;
  void *ws = NULL;
  size_t ws_size = 0;
  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int found = 0, at = 0;
  const float one = 1.0f, zero = 0.0f;
  if ((st = desc_make(c, g)) != APEX_OK) goto done;
  DNN(apex__dnn.cudnnSetConvolutionMathType(c->conv, math_for(g->dtype, CUDNN_TENSOR_OP_MATH)), "math type");
  DNN(apex__dnn.cudnnGetConvolutionForwardAlgorithm_v7(apex__dnn.handle, c->x, c->w, c->conv, c->y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                 &found, perf),
      "forward heuristics");
  if (!pick(perf, found, g->dtype, &at)) {
    st = apex__fail(APEX_ERR_UNSUPPORTED, "%s: cuDNN offers no deterministic forward algorithm for this shape", fn);
    goto done;
  }
  DNN(apex__dnn.cudnnSetConvolutionMathType(c->conv, math_for(g->dtype, perf[at].mathType)), "math type");
  DNN(apex__dnn.cudnnGetConvolutionForwardWorkspaceSize(apex__dnn.handle, c->x, c->w, c->conv, c->y, perf[at].algo, &ws_size),
      "forward workspace size");
  if (ws_size && (st = apex__cuda_alloc(ws_size, 0, &ws)) != APEX_OK) goto done;
  DNN(apex__dnn.cudnnConvolutionForward(apex__dnn.handle, &one, c->x, x, c->w, w, c->conv, perf[at].algo, ws, ws_size, &zero, c->y, y),
      "forward");
  if (b) {
    int64_t total = g->n * g->k * g->p * g->q, blocks = (total + 255) / 256;
    if (total > 0) {
      bias_add<<<(unsigned)(blocks < 4096 ? blocks : 4096), 256, 0, (cudaStream_t)apex__cuda_stream()>>>(
          y, g->dtype, b, bt, g->k, g->p * g->q, total);
      st = launched(fn);
    }
  }
done:
  apex__cuda_free(ws); /* stream-ordered: handed out again only to later work */
  desc_free(c);
  return st;
}

extern "C" apex_status apex__cuda_conv2d_bwd(const apex__cuda_conv *g, const void *dy, const void *x, const void *w,
                                             void *dx, void *dw, void *db, apex_dtype bt) {
  const char *fn = "apex_kernel_conv2d_backward";
  apex_status st = apex__cudnn_ready(fn);
  if (st != APEX_OK) return st;
  conv_desc cd = {fn, 0, 0, 0, 0}, *c = &cd;
  void *ws = NULL;
  size_t ws_size = 0;
  int found = 0, at = 0;
  const float one = 1.0f, zero = 0.0f;
  if ((st = desc_make(c, g)) != APEX_OK) goto done;
  if (dx) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    DNN(apex__dnn.cudnnSetConvolutionMathType(c->conv, math_for(g->dtype, CUDNN_TENSOR_OP_MATH)), "math type");
    DNN(apex__dnn.cudnnGetConvolutionBackwardDataAlgorithm_v7(apex__dnn.handle, c->w, c->y, c->conv, c->x,
                                                        CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &found, perf),
        "backward-data heuristics");
    if (!pick(perf, found, g->dtype, &at)) {
      st = apex__fail(APEX_ERR_UNSUPPORTED, "%s: cuDNN offers no deterministic backward-data algorithm for this shape", fn);
      goto done;
    }
    DNN(apex__dnn.cudnnSetConvolutionMathType(c->conv, math_for(g->dtype, perf[at].mathType)), "math type");
    DNN(apex__dnn.cudnnGetConvolutionBackwardDataWorkspaceSize(apex__dnn.handle, c->w, c->y, c->conv, c->x, perf[at].algo, &ws_size),
        "backward-data workspace size");
    if (ws_size && (st = apex__cuda_alloc(ws_size, 0, &ws)) != APEX_OK) goto done;
    DNN(apex__dnn.cudnnConvolutionBackwardData(apex__dnn.handle, &one, c->w, w, c->y, dy, c->conv, perf[at].algo, ws, ws_size, &zero,
                                         c->x, dx),
        "backward data");
    apex__cuda_free(ws);
    ws = NULL;
  }
  if (dw) {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    DNN(apex__dnn.cudnnSetConvolutionMathType(c->conv, math_for(g->dtype, CUDNN_TENSOR_OP_MATH)), "math type");
    DNN(apex__dnn.cudnnGetConvolutionBackwardFilterAlgorithm_v7(apex__dnn.handle, c->x, c->y, c->conv, c->w,
                                                          CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &found, perf),
        "backward-filter heuristics");
    if (!pick(perf, found, g->dtype, &at)) {
      st = apex__fail(APEX_ERR_UNSUPPORTED, "%s: cuDNN offers no deterministic backward-filter algorithm for this shape", fn);
      goto done;
    }
    DNN(apex__dnn.cudnnSetConvolutionMathType(c->conv, math_for(g->dtype, perf[at].mathType)), "math type");
    DNN(apex__dnn.cudnnGetConvolutionBackwardFilterWorkspaceSize(apex__dnn.handle, c->x, c->y, c->conv, c->w, perf[at].algo, &ws_size),
        "backward-filter workspace size");
    if (ws_size && (st = apex__cuda_alloc(ws_size, 0, &ws)) != APEX_OK) goto done;
    DNN(apex__dnn.cudnnConvolutionBackwardFilter(apex__dnn.handle, &one, c->x, x, c->y, dy, c->conv, perf[at].algo, ws, ws_size, &zero,
                                           c->w, dw),
        "backward filter");
  }
  if (db && g->k > 0) {
    bias_grad<<<(unsigned)g->k, 256, 0, (cudaStream_t)apex__cuda_stream()>>>(dy, g->dtype, db, bt, g->n, g->k, g->p * g->q);
    st = launched(fn);
  }
done:
  apex__cuda_free(ws);
  desc_free(c);
  return st;
}

/* ---- pooling (cpu/conv.c's pool_plane and apex__cpu_nn_pool2d_bwd) ------------------------------------------ */

/* One output per thread: the window walked in the CPU's order, the max taking each element that is
 * greater or NaN (so NaN propagates, the last one winning) with its index in the plane, or the
 * window's sum in order times 1 / (kh * kw): the CPU's f32 operations, so its bits. */
__global__ void pool_kernel(apex_nn_conv_geom q, int64_t total, const void *x, apex_dtype xt, void *out, apex_dtype ot,
                            int32_t *arg, float inv) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x, P = (int64_t)q.ho * q.wo, HW = (int64_t)q.h * q.w;
  for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < total; o += stride) {
    int64_t pl = o / P;
    int oh = (int)(o % P / q.wo), ow = (int)(o % q.wo);
    float best = -3.402823466e38f, s = 0.0f;
    int32_t at = -1;
    for (int i = 0; i < q.kh; i++) {
      int ih = oh * q.sh - q.ph + i;
      if (ih < 0 || ih >= q.h) continue;
      for (int j = 0; j < q.kw; j++) {
        int iw = ow * q.sw - q.pw + j;
        if (iw < 0 || iw >= q.w) continue;
        float v = apex_ld(x, xt, pl * HW + ih * q.w + iw);
        s += v;
        if (v > best || at < 0 || v != v) best = v, at = ih * q.w + iw;
      }
    }
    if (arg) arg[o] = at;
    apex_st(out, ot, o, arg ? best : s * inv);
  }
}

extern "C" apex_status apex__cuda_slot_nn_pool2d(const apex_nn_pool2d_args *a) {
  apex_nn_conv_geom q = a->geom;
  int64_t total = (int64_t)q.n * q.c * q.ho * q.wo;
  if (!total) return APEX_OK;
  pool_kernel<<<apex_grid(total, 256, 4), 256, 0, nn_stream()>>>(q, total, a->x.data, a->x.dtype, a->out, a->out_dtype, a->argmax,
                                                                1.0f / (float)(q.kh * q.kw));
  return apex__cuda_check_launch("nn_pool2d");
}

/* One input element per thread gathers the outputs whose windows hold it, in the CPU's output order
 * (rows, then columns), so each element's additions are the CPU's and no two threads write one. */
__global__ void pool_bwd_kernel(apex_nn_conv_geom q, int64_t total, const int32_t *arg, const float *go, float *gx, int acc,
                                float inv) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x, P = (int64_t)q.ho * q.wo, HW = (int64_t)q.h * q.w;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
    int64_t pl = e / HW;
    int ih = (int)(e % HW / q.w), iw = (int)(e % q.w);
    /* outputs oh with oh * sh - ph <= ih <= oh * sh - ph + kh - 1, likewise ow */
    int oh0 = ih + q.ph - q.kh + 1, ow0 = iw + q.pw - q.kw + 1;
    oh0 = oh0 <= 0 ? 0 : (oh0 + q.sh - 1) / q.sh;
    ow0 = ow0 <= 0 ? 0 : (ow0 + q.sw - 1) / q.sw;
    int oh1 = (ih + q.ph) / q.sh, ow1 = (iw + q.pw) / q.sw;
    if (oh1 > q.ho - 1) oh1 = q.ho - 1;
    if (ow1 > q.wo - 1) ow1 = q.wo - 1;
    float v = acc ? gx[e] : 0.0f;
    const float *gp = go + pl * P;
    for (int oh = oh0; oh <= oh1; oh++)
      for (int ow = ow0; ow <= ow1; ow++) {
        int64_t oi = (int64_t)oh * q.wo + ow;
        if (!arg) v += gp[oi] * inv;
        else if (arg[pl * P + oi] == ih * q.w + iw) v += gp[oi];
      }
    gx[e] = v;
  }
}

extern "C" apex_status apex__cuda_slot_nn_pool2d_bwd(const apex_nn_pool2d_bwd_args *a) {
  apex_nn_conv_geom q = a->geom;
  int64_t total = (int64_t)q.n * q.c * q.h * q.w;
  if (!total) return APEX_OK;
  pool_bwd_kernel<<<apex_grid(total, 256, 4), 256, 0, nn_stream()>>>(q, total, a->argmax, a->gout, a->gx, a->accumulate_x,
                                                                    1.0f / (float)(q.kh * q.kw));
  return apex__cuda_check_launch("nn_pool2d_bwd");
}
