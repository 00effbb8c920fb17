/* mt_ilp.cuh: the multi-tensor walk for the memory-bound kernels that must move their bytes at a device copy's
 * bandwidth (the elementwise optimizers, optim.cu). mt_apply.cuh's walk suits kernels that do little per
 * element; here the kernel's time is its memory traffic, so the walk is shaped so that nothing but that traffic
 * costs time:
 *   - Every block gets an equal share of the launch's elements, to MT_GRAIN: no block has a chunk more than
 *     another, and a block is as wide as the GPU holds at once (mt_resident), so there is no second wave
 *     and no tail of a few blocks finishing alone.
 *   - Per-tensor values (Op::coefs: the optimizers' bias corrections from the step count, in double) are
 *     computed once per block before the walk, one thread per tensor of the block's share in parallel,
 *     behind the block's only barrier; the walk itself has no barrier and no per-chunk work.
 *   - Each thread has MT_UNROLL vectors of MT_ILP elements of every list in flight (each list's loads are
 *     issued before any element is computed: the lists may alias as far as the compiler knows, so one
 *     vector at a time would wait for each); a warp's access is 32 neighbouring vectors, 512 bytes of f32
 *     or 256 of f16/bf16, so every 32-byte sector it touches it moves whole, loads and stores alike.
 *   - Tables of up to MT_WIDE_TENSORS tensors, so a model's parameter group is one or two launches.
 * The walk serves the passes of LAMB, NovoGrad and AdamP too (lamb.cu, novograd.cu, adamp.cu), some of whose
 * per-tensor values an earlier launch left in a device buffer indexed by the tensor's entry in the call (LAMB's
 * norms, NovoGrad's coefficients, AdamP's AdampMeta): coefs reads them through t.id[k], once per tensor and
 * block, like the step counts.
 * The op is compiled per update rule and dtype mix (mt_typed, at the bottom, picks the instance for a group),
 * so that an element's update is straight-line code on registers.
 *
 * Alignment: a tensor takes the vector path when the op's dtypes are compile-time ones and every pointer it
 * touches is aligned to MT_ILP elements (Op::aligned); block shares start at multiples of MT_GRAIN elements of
 * a tensor, so every vector of an aligned tensor is aligned. A tensor's last numel % MT_ILP elements, and every
 * element of a misaligned tensor or of an op with run-time dtypes, take the scalar path: MT_BATCH elements
 * blockDim apart per thread, bounds-checked one by one. Both paths hand the op's apply the same registers,
 * so both compute the same bits.
 *
 * An Op supplies
 *     static constexpr bool vec            its dtypes are compile-time ones (else never vectorised)
 *     bool live() const                    false: the launch does nothing (a skipped step), read by every thread
 *     void coefs(const MtWideTable &t, int k, float *coef) const      coef[0..MT_COEFS) for tensor k (t.id[k]: its
 *                                                                     entry in the call's lists)
 *     bool aligned(const MtWideTable &t, int k) const                 every pointer it touches aligned
 *     template <bool VEC> void apply(const MtWideTable &t, int k, int64_t i0, int64_t stride, int64_t end,
 *                                    const float (&coef)[MT_COEFS]) const
 *         VEC: the vectors (MT_ILP elements) i0 + r * stride of tensor k, r < MT_UNROLL, those below end
 *         (vector indices); else the elements i0 + j * stride, j < MT_BATCH, those below end. */
#ifndef APEX_CUDA_MT_ILP_CUH
#define APEX_CUDA_MT_ILP_CUH

#include "backend/cuda/mt_apply.cuh"

#define MT_ILP 4                       /* elements in one vector access: 16 bytes of f32, 8 of f16/bf16 */
#define MT_UNROLL 2                    /* vectors of each list a thread has in flight */
#define MT_BATCH (MT_ILP * MT_UNROLL)  /* elements a thread computes between its loads and its stores */
#define MT_GRAIN 64                    /* block shares start at multiples of this many elements of a tensor */
#define MT_WIDE_TENSORS 256            /* a table's tensors: about 21 KB of kernel parameters (the limit is 32 KB) */
#define MT_WIDE_THREADS 256
static_assert(MT_GRAIN % MT_ILP == 0, "block shares must keep a tensor's vector alignment");

/* Compile-time dtypes: apex_dtype values, or one of these. */
enum { MT_DYN = -1 /* the table's run-time dtype */, MT_NONE = -2 /* no such list (NULL pointers) */ };

struct MtWideTable {
  void *ptr[MT_LISTS][MT_WIDE_TENSORS];
  int64_t numel[MT_WIDE_TENSORS];
  int64_t gstart[MT_WIDE_TENSORS + 1]; /* first grain (MT_GRAIN elements) of each tensor; gstart[n]: all grains */
  int id[MT_WIDE_TENSORS];             /* each tensor's entry among the call's lists (empty ones counted) */
  uint8_t dtype[MT_LISTS][MT_WIDE_TENSORS];
  int n;
};

template <int D>
__device__ __forceinline__ float mt_ld1(const void *p, apex_dtype rt, int64_t i) {
  if constexpr (D == APEX_F32) return ((const float *)p)[i];
  else if constexpr (D == APEX_F16) return apex__f16_to_f32(((const uint16_t *)p)[i]);
  else if constexpr (D == APEX_BF16) return apex__bf16_to_f32(((const uint16_t *)p)[i]);
  else return apex_ld(p, rt, i);
}

template <int D>
__device__ __forceinline__ void mt_st1(void *p, apex_dtype rt, int64_t i, float v) {
  if constexpr (D == APEX_F32) ((float *)p)[i] = v;
  else if constexpr (D == APEX_F16) ((uint16_t *)p)[i] = apex__f32_to_f16(v);
  else if constexpr (D == APEX_BF16) ((uint16_t *)p)[i] = apex__f32_to_bf16(v);
  else apex_st(p, rt, i, v);
}

template <int D>
__device__ __forceinline__ float mt_from16(uint16_t h) {
  if constexpr (D == APEX_F16) return apex__f16_to_f32(h);
  else return apex__bf16_to_f32(h);
}

template <int D>
__device__ __forceinline__ uint16_t mt_to16(float v) {
  if constexpr (D == APEX_F16) return apex__f32_to_f16(v);
  else return apex__f32_to_bf16(v);
}

/* p can be read and written MT_ILP elements of dtype D at a time (a compile-time dtype only). */
template <int D>
__device__ __forceinline__ bool mt_aligned(const void *p) {
  return (uintptr_t)p % (uintptr_t)(MT_ILP * (D == APEX_F32 ? 4 : 2)) == 0;
}

/* v = the batch at i0 (apply's contract: vectors for VEC, else elements), those below end (the others keep
 * their value). */
template <int D, bool VEC>
__device__ __forceinline__ void mt_load(const void *p, apex_dtype rt, int64_t i0, int64_t stride, int64_t end,
                                        float (&v)[MT_BATCH]) {
  static_assert(MT_ILP == 4, "the vector loads below move four elements");
  if constexpr (VEC) {
#pragma unroll
    for (int r = 0; r < MT_UNROLL; r++) {
      const int64_t u = i0 + r * stride;
      if (u >= end) continue;
      float *o = v + r * MT_ILP;
      if constexpr (D == APEX_F32) {
        float4 x = ((const float4 *)p)[u];
        o[0] = x.x, o[1] = x.y, o[2] = x.z, o[3] = x.w;
      } else { /* four 16-bit elements, the first in the low half of the first word */
        uint2 x = ((const uint2 *)p)[u];
        o[0] = mt_from16<D>((uint16_t)(x.x & 0xFFFFu)), o[1] = mt_from16<D>((uint16_t)(x.x >> 16));
        o[2] = mt_from16<D>((uint16_t)(x.y & 0xFFFFu)), o[3] = mt_from16<D>((uint16_t)(x.y >> 16));
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < MT_BATCH; j++)
      if (i0 + j * stride < end) v[j] = mt_ld1<D>(p, rt, i0 + j * stride);
  }
}

/* The batch at i0 of p = v, those below end. */
template <int D, bool VEC>
__device__ __forceinline__ void mt_store(void *p, apex_dtype rt, int64_t i0, int64_t stride, int64_t end,
                                         const float (&v)[MT_BATCH]) {
  if constexpr (VEC) {
#pragma unroll
    for (int r = 0; r < MT_UNROLL; r++) {
      const int64_t u = i0 + r * stride;
      if (u >= end) continue;
      const float *o = v + r * MT_ILP;
      if constexpr (D == APEX_F32) {
        ((float4 *)p)[u] = make_float4(o[0], o[1], o[2], o[3]);
      } else {
        uint2 x;
        x.x = (uint32_t)mt_to16<D>(o[0]) | (uint32_t)mt_to16<D>(o[1]) << 16;
        x.y = (uint32_t)mt_to16<D>(o[2]) | (uint32_t)mt_to16<D>(o[3]) << 16;
        ((uint2 *)p)[u] = x;
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < MT_BATCH; j++)
      if (i0 + j * stride < end) mt_st1<D>(p, rt, i0 + j * stride, v[j]);
  }
}

/* An update's results v into tensor k's values (list lp, dtype P) and, from the same registers, its model copy
 * (list lm, dtype M: MT_NONE none, MT_DYN the tensor's own, whose copy may be absent). */
template <int P, int M, bool VEC>
__device__ __forceinline__ void mt_store_param(const MtWideTable &t, int lp, int lm, int k, int64_t i0, int64_t stride, int64_t end,
                                               const float (&v)[MT_BATCH]) {
  mt_store<P, VEC>(t.ptr[lp][k], (apex_dtype)t.dtype[lp][k], i0, stride, end, v);
  if constexpr (M == MT_DYN) {
    if (t.ptr[lm][k]) mt_store<M, VEC>(t.ptr[lm][k], (apex_dtype)t.dtype[lm][k], i0, stride, end, v);
  } else if constexpr (M != MT_NONE) {
    mt_store<M, VEC>(t.ptr[lm][k], (apex_dtype)t.dtype[lm][k], i0, stride, end, v);
  }
}

/* The tensor holding grain g < gstart[n]: the last k with gstart[k] <= g (tables hold no empty tensor). */
__device__ __forceinline__ int mt_wide_tensor_of(const MtWideTable &t, int64_t g) {
  int lo = 0, hi = t.n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (t.gstart[mid] <= g) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

template <class Op>
__global__ void __launch_bounds__(MT_WIDE_THREADS) mt_wide_kernel(const __grid_constant__ MtWideTable t, Op op) {
  __shared__ float s_coef[MT_WIDE_TENSORS][MT_COEFS];
  if (!op.live()) return; /* the same answer in every thread: no barrier is left waiting */
  const int64_t grains = t.gstart[t.n];
  const int64_t g0 = grains * blockIdx.x / gridDim.x, g1 = grains * (blockIdx.x + 1) / gridDim.x;
  if (g0 == g1) return;
  const int k0 = mt_wide_tensor_of(t, g0), k1 = mt_wide_tensor_of(t, g1 - 1);
  for (int k = k0 + (int)threadIdx.x; k <= k1; k += MT_WIDE_THREADS) op.coefs(t, k, s_coef[k]);
  __syncthreads();
  for (int k = k0; k <= k1; k++) {
    float coef[MT_COEFS];
#pragma unroll
    for (int m = 0; m < MT_COEFS; m++) coef[m] = s_coef[k][m];
    /* This block's elements of tensor k: [i0, i1), i0 a multiple of MT_GRAIN. */
    const int64_t i0 = (g0 > t.gstart[k] ? g0 - t.gstart[k] : 0) * MT_GRAIN;
    const int64_t e = (g1 < t.gstart[k + 1] ? g1 : t.gstart[k + 1]) - t.gstart[k];
    const int64_t i1 = e * MT_GRAIN < t.numel[k] ? e * MT_GRAIN : t.numel[k];
    int64_t scalar_from = i0;
    if constexpr (Op::vec) {
      if (op.aligned(t, k)) {
        const int64_t v1 = i1 / MT_ILP; /* whole vectors; what is left is the tensor's last numel % MT_ILP */
        for (int64_t v = i0 / MT_ILP + threadIdx.x; v < v1; v += (int64_t)MT_UNROLL * MT_WIDE_THREADS)
          op.template apply<true>(t, k, v, MT_WIDE_THREADS, v1, coef);
        scalar_from = v1 * MT_ILP;
      }
    }
    for (int64_t i = scalar_from + threadIdx.x; i < i1; i += (int64_t)MT_BATCH * MT_WIDE_THREADS)
      op.template apply<false>(t, k, i, MT_WIDE_THREADS, i1, coef);
  }
}

/* Runs op over lists[0..nlists) (each n tensors; element counts from list 0, empty tensors left out) with
 * mt_wide_kernel, one launch per MT_WIDE_TENSORS tensors: as many blocks as the device holds at once, fewer
 * when a block would have under one batch per thread. */
template <class Op>
static cudaError_t mt_apply_wide(int nlists, const apex__cuda_list *const *lists, const Op &op) {
  static const int cap = mt_resident((const void *)mt_wide_kernel<Op>, MT_WIDE_THREADS);
  cudaStream_t stream = (cudaStream_t)apex__cuda_stream();
  MtWideTable t;
  t.n = 0;
  t.gstart[0] = 0;
  const int n = lists[0]->n;
  for (int i = 0; i < n; i++) {
    const int64_t numel = (int64_t)lists[0]->numel[i];
    if (numel > 0) {
      const int k = t.n++;
      for (int l = 0; l < nlists; l++) {
        t.ptr[l][k] = lists[l]->ptr[i];
        t.dtype[l][k] = (uint8_t)lists[l]->dtype[i];
      }
      t.numel[k] = numel;
      t.id[k] = i;
      t.gstart[k + 1] = t.gstart[k] + (numel + MT_GRAIN - 1) / MT_GRAIN;
    }
    if (t.n > 0 && (t.n == MT_WIDE_TENSORS || i == n - 1)) {
      const int64_t per_block = (int64_t)MT_BATCH * MT_WIDE_THREADS / MT_GRAIN;
      const int64_t want = (t.gstart[t.n] + per_block - 1) / per_block;
      mt_wide_kernel<Op><<<(unsigned)(want < cap ? want : cap), MT_WIDE_THREADS, 0, stream>>>(t, op);
      cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess) return e;
      t.n = 0;
    }
  }
  return cudaSuccess;
}

/* The dtype every entry of l has (MT_DYN when they differ); model lists: MT_NONE when every entry is NULL. */
static int mt_list_dtype(const apex__cuda_list *l, int model) {
  int d = MT_DYN;
  for (int i = 0; i < l->n; i++) {
    int di = model && !l->ptr[i] ? MT_NONE : (int)l->dtype[i];
    if (i > 0 && di != d) return MT_DYN;
    d = di;
  }
  return d;
}

template <int G, class F>
static cudaError_t mt_typed_model(int m, const F &f) {
  if (m == APEX_F16) return f.template run<G, APEX_F32, APEX_F16>();
  if (m == APEX_BF16) return f.template run<G, APEX_F32, APEX_BF16>();
  return f.template run<G, APEX_F32, MT_NONE>();
}

/* f.run<G, P, M>() with the gradient's, the updated value's and the model copy's dtypes as compile-time ones:
 * f32 updated values (f32 parameters, or the f32 masters of f16/bf16 ones) with one gradient dtype and one
 * model copy dtype (or none) across the group, every mix apex_amp makes; any other group (dtypes mixed
 * within it, f16/bf16 parameters without masters) runs run<MT_DYN, MT_DYN, MT_DYN>, scalar loads only. */
template <class F>
static cudaError_t mt_typed(const apex__cuda_list *g, const apex__cuda_list *p, const apex__cuda_list *model,
                            const F &f) {
  const int gd = mt_list_dtype(g, 0), pd = mt_list_dtype(p, 0), md = mt_list_dtype(model, 1);
  if (pd == APEX_F32 && (md == MT_NONE || md == APEX_F16 || md == APEX_BF16)) {
    if (gd == APEX_F32) return mt_typed_model<APEX_F32>(md, f);
    if (gd == APEX_F16) return mt_typed_model<APEX_F16>(md, f);
    if (gd == APEX_BF16) return mt_typed_model<APEX_BF16>(md, f);
  }
  return f.template run<MT_DYN, MT_DYN, MT_DYN>();
}

#endif
