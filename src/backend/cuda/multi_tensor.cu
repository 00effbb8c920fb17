/* multi_tensor.cu: the multi-tensor kernels of multi_tensor.h on device tensors: scale (the unscale
 * with overflow check), axpby over mt_apply.cuh, and the L2 norms in the CPU's summation order. The overflow flag is a device int
 * that kernels only ever set, so one flag gathers many launches with no host round trip. */
#include <cuda_runtime.h>

extern "C" {
#include "core/internal.h"
#include "backend/cuda/cuda_internal.h"
}
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

/* The L2 norms in the CPU's order, so that they are its bits (backend/cpu/multi_tensor.c, norm_tile, and
 * LAMB's per-tensor norms, which sum the same way): each tensor is cut into chunks of chunk_size elements
 * and each chunk into tiles of APEX_MT_TILE; a tile's squares go into eight f32 lanes (element i of the
 * tile into lane i % 8, in order), which are added as ((0+1)+(2+3))+((4+5)+(6+7)); a chunk's tiles are
 * added in f64 in order, a tensor's chunks in order, the tensors in order. -fmad=false keeps every
 * multiply and add rounded as on the CPU. Eight threads take a tile (a lane each), so a GPU keeps many
 * tiles in flight; each chunk owns tpc tile slots (the slots past a short chunk's end hold 0).
 * Tables of NS_TENSORS tensors travel in the kernels' parameters. */
#define NS_TENSORS 64
#define NS_BLOCK 256

struct NormTable {
  const void *ptr[NS_TENSORS];
  int64_t numel[NS_TENSORS];
  int64_t chunk0[NS_TENSORS + 1]; /* first chunk (of the whole call) of each tensor; chunk0[n]: the end */
  apex_dtype dtype[NS_TENSORS];
  int n;
};

__global__ void __launch_bounds__(NS_BLOCK) tile_sumsq_kernel(const __grid_constant__ NormTable t, int64_t cs, int tpc,
                                                                float scale, float *slots, int *flag) {
  const int lane = threadIdx.x & 7;
  const int64_t slot = t.chunk0[0] * tpc + ((int64_t)blockIdx.x * NS_BLOCK + threadIdx.x) / 8;
  const bool live = slot < t.chunk0[t.n] * tpc;
  float acc = 0.0f;
  bool bad = false;
  if (live) {
    int64_t gc = slot / tpc;
    int j = (int)(slot % tpc), k = 0;
    while (t.chunk0[k + 1] <= gc) k++;
    int64_t c = gc - t.chunk0[k], numel = t.numel[k];
    int64_t cend = (c + 1) * cs < numel ? (c + 1) * cs : numel;
    int64_t start = c * cs + (int64_t)j * APEX_MT_TILE;
    int64_t end = start + APEX_MT_TILE < cend ? start + APEX_MT_TILE : cend;
    for (int64_t i = start + lane; i < end; i += 8) {
      float x = apex_ld(t.ptr[k], t.dtype[k], i);
      bad |= !apex_finite(x);
      float v = x * scale;
      acc = acc + v * v;
    }
  }
  /* every lane of the warp takes part in the shuffles; the tree is the CPU's */
  float o = __shfl_down_sync(0xffffffffu, acc, 1);
  if ((lane & 1) == 0) acc = acc + o;
  o = __shfl_down_sync(0xffffffffu, acc, 2);
  if ((lane & 3) == 0) acc = acc + o;
  o = __shfl_down_sync(0xffffffffu, acc, 4);
  if (lane == 0) acc = acc + o;
  if (bad && flag) *flag = 1;
  if (live && lane == 0) slots[slot] = acc;
}

/* part[c] = the f64 sum, in order, of chunk c's tpc tile slots. */
__global__ void chunk_sum_kernel(const float *slots, int64_t nchunks, int tpc, double *part) {
  int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= nchunks) return;
  double s = 0.0;
  for (int j = 0; j < tpc; j++) s += (double)slots[c * tpc + j];
  part[c] = s;
}

/* Per tensor: its chunks' sums in order; the global norm: the tensors' sums in order. */
__global__ void norm_finish_kernel(const double *part, const int64_t *first, int n, float *global, float *per) {
  __shared__ double tsum[1024];
  double g = 0.0;
  for (int base = 0; base < n; base += blockDim.x) {
    int i = base + threadIdx.x;
    if (i < n) {
      double s = 0.0;
      for (int64_t c = first[i]; c < first[i + 1]; c++) s += part[c];
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

extern "C" apex_status apex__cuda_mt_l2norm_chunked(const apex__cuda_list *x, size_t chunk_size, float inv_scale,
                                                    float *d_global, float *d_per, int *d_flag, double *h_chunks) {
  int n = x->n;
  int64_t cs = chunk_size ? (int64_t)chunk_size : APEX_MT_DEFAULT_CHUNK;
  int tpc = (int)((cs + APEX_MT_TILE - 1) / APEX_MT_TILE);
  int64_t *first = (int64_t *)malloc(sizeof(int64_t) * (size_t)(n + 1));
  if (!first) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "CUDA l2norm: out of memory");
  int64_t chunks = 0;
  for (int i = 0; i < n; i++) {
    first[i] = chunks;
    chunks += ((int64_t)x->numel[i] + cs - 1) / cs;
  }
  first[n] = chunks;
  /* one block: the tile slots, the chunk sums (f64), the first chunk of each tensor */
  size_t slot_bytes = sizeof(float) * (size_t)(chunks * tpc), part_off = (slot_bytes + 7) / 8 * 8;
  size_t first_off = part_off + sizeof(double) * (size_t)chunks;
  void *d_mem = NULL;
  apex_status st = apex__cuda_alloc(first_off + sizeof(int64_t) * (size_t)(n + 1), 0, &d_mem);
  float *d_slots = (float *)d_mem;
  double *d_part = (double *)((char *)d_mem + part_off);
  int64_t *d_first = (int64_t *)((char *)d_mem + first_off);
  if (st == APEX_OK) st = apex__cuda_memcpy(d_first, first, sizeof(int64_t) * (size_t)(n + 1), APEX__H2D, 0);
  cudaStream_t stream = (cudaStream_t)apex__cuda_stream();
  cudaError_t e = cudaSuccess;
  NormTable t;
  t.n = 0;
  for (int i = 0; st == APEX_OK && e == cudaSuccess && i < n; i++) {
    if (x->numel[i] > 0) {
      int k = t.n++;
      t.ptr[k] = x->ptr[i];
      t.numel[k] = (int64_t)x->numel[i];
      t.dtype[k] = x->dtype[i];
      t.chunk0[k] = first[i];
      t.chunk0[k + 1] = first[i + 1];
    }
    if (t.n > 0 && (t.n == NS_TENSORS || i == n - 1)) {
      int64_t threads = (t.chunk0[t.n] - t.chunk0[0]) * tpc * 8;
      tile_sumsq_kernel<<<(unsigned)((threads + NS_BLOCK - 1) / NS_BLOCK), NS_BLOCK, 0, stream>>>(t, cs, tpc, inv_scale,
                                                                                                 d_slots, d_flag);
      e = cudaGetLastError();
      t.n = 0;
    }
  }
  if (st == APEX_OK && e == cudaSuccess && chunks > 0) {
    chunk_sum_kernel<<<(unsigned)((chunks + 255) / 256), 256, 0, stream>>>(d_slots, chunks, tpc, d_part);
    e = cudaGetLastError();
  }
  if (st == APEX_OK && e == cudaSuccess) {
    norm_finish_kernel<<<1, 1024, 0, stream>>>(d_part, d_first, n, d_global, d_per);
    e = cudaGetLastError();
  }
  if (st == APEX_OK) st = launched(e, "CUDA l2norm");
  if (st == APEX_OK && h_chunks && chunks > 0) st = apex__cuda_memcpy(h_chunks, d_part, sizeof(double) * (size_t)chunks, APEX__D2H, 1);
  apex__cuda_free(d_mem); /* stream-ordered: reused only by later work */
  free(first);
  return st;
}

extern "C" apex_status apex__cuda_mt_l2norm(const apex__cuda_list *x, float inv_scale, float *d_global, float *d_per,
                                            int *d_flag) {
  return apex__cuda_mt_l2norm_chunked(x, 0, inv_scale, d_global, d_per, d_flag, NULL);
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
