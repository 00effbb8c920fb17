/* multi_tensor.cu: the multi-tensor kernels of multi_tensor.h on device tensors: scale (the unscale
 * with overflow check), axpby and the L2 norms, over mt_apply.cuh. The overflow flag is a device int
 * that kernels only ever set, so one flag gathers many launches with no host round trip. */
#include <cuda_runtime.h>

extern "C" {
#include "core/internal.h"
#include "backend/cuda/cuda_internal.h"
}
#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/mt_apply.cuh"

static apex_status launched(cudaError_t e, const char *what) {
  if (e != cudaSuccess)
    return apex__fail(APEX_ERR_DEVICE, "%s: CUDA error %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
  return APEX_OK;
}

struct ScaleOp : MtFlagEnd {
  float scale;
  const float *d_scale;
  int inverse, write;
  __device__ bool begin(const MtTable &, int, int64_t, float *coef) const {
    float s = scale;
    if (d_scale) s = inverse ? s / *d_scale : s * *d_scale;
    coef[0] = s;
    return true;
  }
  __device__ void elem(const MtTable &t, int k, int64_t i, bool &bad, const float *coef) const {
    float s = coef[0];
    float x = apex_ld(t.ptr[0][k], t.dtype[0][k], i);
    bad |= !apex_finite(x);
    if (write) apex_st(t.ptr[1][k], t.dtype[1][k], i, x * s);
  }
};

extern "C" apex_status apex__cuda_mt_scale(const apex__cuda_list *in, const apex__cuda_list *out, float scale,
                                           const float *d_scale, int d_inverse, int *d_flag) {
  ScaleOp op;
  op.flag = d_flag;
  op.scale = scale;
  op.d_scale = d_scale;
  op.inverse = d_inverse;
  op.write = out != NULL; /* no out: check only, reading the inputs once */
  const apex__cuda_list *lists[2] = {in, out ? out : in};
  return launched(mt_apply(2, lists, op), "CUDA multi-tensor scale");
}

struct AxpbyOp : MtFlagEnd {
  float a, b;
  int check;
  __device__ bool begin(const MtTable &, int, int64_t, float *) const { return true; }
  __device__ void elem(const MtTable &t, int k, int64_t i, bool &bad, const float *) const {
    float x = apex_ld(t.ptr[0][k], t.dtype[0][k], i), y = apex_ld(t.ptr[1][k], t.dtype[1][k], i);
    if (check != 1) bad |= !apex_finite(x);
    if (check != 0) bad |= !apex_finite(y);
    apex_st(t.ptr[2][k], t.dtype[2][k], i, a * x + b * y);
  }
};

extern "C" apex_status apex__cuda_mt_axpby(const apex__cuda_list *x, const apex__cuda_list *y,
                                           const apex__cuda_list *out, float a, float b, int arg_to_check,
                                           int *d_flag) {
  AxpbyOp op;
  op.flag = d_flag;
  op.a = a;
  op.b = b;
  op.check = arg_to_check;
  const apex__cuda_list *lists[3] = {x, y, out};
  return launched(mt_apply(3, lists, op), "CUDA multi-tensor axpby");
}

/* Sums of squares: each chunk's in f32 (a fixed tree inside the block), written to partial[chunk]. The
 * norm needs a per-thread accumulator, which mt_kernel's element loop does not carry, so it has its own
 * loop over the same table. */
__global__ void __launch_bounds__(MT_THREADS) sumsq_kernel(const __grid_constant__ MtTable t, float inv_scale,
                                                           float *partial, int *flag) {
  __shared__ float red[MT_THREADS / 32];
  for (int c = blockIdx.x; c < t.cstart[t.n]; c += gridDim.x) {
    int k = 0;
    while (t.cstart[k + 1] <= c) k++;
    int64_t start = (int64_t)(c - t.cstart[k]) * MT_CHUNK;
    int64_t end = start + MT_CHUNK < t.numel[k] ? start + MT_CHUNK : t.numel[k];
    float acc = 0.0f;
    bool bad = false;
    for (int64_t i = start + threadIdx.x; i < end; i += MT_THREADS) {
      float x = apex_ld(t.ptr[0][k], t.dtype[0][k], i) * inv_scale;
      bad |= !apex_finite(x);
      acc += x * x;
    }
    if (bad && flag) *flag = 1;
    acc = warp_sum(acc);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
      float s = 0.0f;
      for (int w = 0; w < MT_THREADS / 32; w++) s += red[w];
      partial[t.first_chunk_id + c] = s;
    }
    __syncthreads();
  }
}

/* Per tensor: its chunks' partials in order, in f64; the global norm: the tensors' sums in order. */
__global__ void norm_finish_kernel(const float *partial, const int *first, int n, float *global, float *per) {
  __shared__ double tsum[1024];
  double g = 0.0;
  for (int base = 0; base < n; base += blockDim.x) {
    int i = base + threadIdx.x;
    if (i < n) {
      double s = 0.0;
      for (int c = first[i]; c < first[i + 1]; c++) s += (double)partial[c];
      tsum[threadIdx.x] = s;
      if (per) per[i] = (float)sqrt(s);
    }
    __syncthreads();
    if (threadIdx.x == 0)
      for (int j = 0; j < (int)blockDim.x && base + j < n; j++) g += tsum[j];
    __syncthreads();
  }
  if (threadIdx.x == 0 && global) *global = (float)sqrt(g);
}

extern "C" apex_status apex__cuda_mt_l2norm(const apex__cuda_list *x, float inv_scale, float *d_global, float *d_per,
                                            int *d_flag) {
  int n = x->n;
  int *first = (int *)malloc(sizeof(int) * (size_t)(n + 1));
  if (!first) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "CUDA l2norm: out of memory");
  int chunks = mt_chunks(x, first);
  void *d_partial = NULL, *d_first = NULL;
  apex_status st = apex__cuda_alloc(sizeof(float) * (size_t)(chunks ? chunks : 1), 0, &d_partial);
  if (st == APEX_OK) st = apex__cuda_alloc(sizeof(int) * (size_t)(n + 1), 0, &d_first);
  if (st == APEX_OK) st = apex__cuda_memcpy(d_first, first, sizeof(int) * (size_t)(n + 1), APEX__H2D, 0);
  cudaStream_t stream = (cudaStream_t)apex__cuda_stream();
  /* mt_apply's table walk, with the kernel swapped. */
  static const int cap = mt_resident((const void *)sumsq_kernel);
  if (st == APEX_OK)
    st = launched(mt_tables(1, &x, [&](const MtTable &t, int c) {
                    sumsq_kernel<<<c < cap ? c : cap, MT_THREADS, 0, stream>>>(t, inv_scale, (float *)d_partial, d_flag);
                    return cudaGetLastError();
                  }),
                  "CUDA l2norm");
  if (st == APEX_OK) {
    norm_finish_kernel<<<1, 1024, 0, stream>>>((const float *)d_partial, (const int *)d_first, n, d_global, d_per);
    st = launched(cudaGetLastError(), "CUDA l2norm");
  }
  apex__cuda_free(d_partial);
  apex__cuda_free(d_first);
  free(first);
  return st;
}

/* The fused flush + unscale of a bf16 leaf's gradient into its f32 master gradient (args_mt.h,
 * apex_mt_flush_unscale_args; cpu/multi_tensor.c's flush_unscale_tile): s = bf16(grad + sum) rounded
 * as apex_convert rounds, out = s * scale, s checked. nonzero[id] is set where grad held any non-zero
 * bits: every thread that sets it stores the same 1, so the order of the stores changes nothing. */
struct FlushUnscaleOp : MtFlagEnd {
  float scale;
  int *nonzero;
  __device__ bool begin(const MtTable &, int, int64_t, float *) const { return true; }
  __device__ void elem(const MtTable &t, int k, int64_t i, bool &bad, const float *) const {
    uint16_t g = ((const uint16_t *)t.ptr[0][k])[i];
    if (g && nonzero) nonzero[t.id[k]] = 1;
    uint16_t s = apex__f32_to_bf16(apex__bf16_to_f32(g) + ((const float *)t.ptr[1][k])[i]);
    float v = apex__bf16_to_f32(s);
    bad |= !apex_finite(v);
    ((float *)t.ptr[2][k])[i] = v * scale;
  }
};

extern "C" apex_status apex__cuda_mt_flush_unscale(const apex__cuda_list *grad, const apex__cuda_list *sum,
                                                   const apex__cuda_list *out, float scale, int *d_flag, int *d_nonzero) {
  FlushUnscaleOp op;
  op.flag = d_flag;
  op.scale = scale;
  op.nonzero = d_nonzero;
  const apex__cuda_list *lists[3] = {grad, sum, out};
  return launched(mt_apply(3, lists, op), "CUDA multi-tensor flush and unscale");
}
