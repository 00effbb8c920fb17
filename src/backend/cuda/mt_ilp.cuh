/* mt_ilp.cuh: the multi-tensor walk of mt_apply.cuh for memory-bound kernels that must reach the
 * copy bandwidth (the elementwise optimizers), as Apex's multi_tensor_apply does it: each thread takes
 * MT_ILP elements at a time, loading all of them from every list before computing and storing any. The
 * lists may alias as far as the compiler knows, so a loop of one-element updates issues one element's
 * loads at a time; batching them by hand keeps MT_ILP times as many loads in flight.
 *
 * Where the op's dtypes are known at compile time and every pointer of the tensor is aligned to MT_ILP
 * elements, the MT_ILP elements are contiguous and move as one vector per list (16 bytes of f32, 8 of
 * f16/bf16); the chunk's last (end - start) % MT_ILP elements, and every element of a misaligned tensor
 * or of an op with run-time dtypes, take the scalar path: MT_ILP elements MT_THREADS apart per thread.
 * Chunk starts are multiples of MT_CHUNK, itself a multiple of MT_ILP, so an aligned tensor has aligned
 * chunks. An Op supplies begin (as for mt_apply, but depending on the tensor only: see mt_ilp_kernel) and
 *     static constexpr bool vec          whether its dtypes are compile-time ones (else never vectorized)
 *     bool aligned(const MtTable &t, int k)                          every pointer it touches aligned
 *     template <bool VEC> void apply(const MtTable &t, int k, int64_t i0, int64_t stride, int64_t end,
 *                                    const float (&coef)[MT_COEFS])
 *         the elements i0 + j * stride (j < MT_ILP) below end; VEC: stride 1, all in range, aligned. */
#ifndef APEX_CUDA_MT_ILP_CUH
#define APEX_CUDA_MT_ILP_CUH

#include "backend/cuda/mt_apply.cuh"

#define MT_ILP 4
static_assert(MT_CHUNK % MT_ILP == 0, "chunk starts must keep a tensor's vector alignment");

/* Compile-time dtypes: apex_dtype values, or one of these. */
enum { MT_DYN = -1 /* the table's run-time dtype */, MT_NONE = -2 /* no such list (NULL pointers) */ };

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

/* v[j] = element i0 + j * stride of p, for those below end (the others keep their value). */
template <int D, bool VEC>
__device__ __forceinline__ void mt_load(const void *p, apex_dtype rt, int64_t i0, int64_t stride, int64_t end,
                                        float (&v)[MT_ILP]) {
  static_assert(MT_ILP == 4, "the vector loads below move four elements");
  if constexpr (VEC && D == APEX_F32) {
    float4 x = *(const float4 *)((const float *)p + i0);
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
  } else if constexpr (VEC) { /* four 16-bit elements, the first in the low half of the first word */
    uint2 x = *(const uint2 *)((const uint16_t *)p + i0);
    v[0] = mt_from16<D>((uint16_t)(x.x & 0xFFFFu)), v[1] = mt_from16<D>((uint16_t)(x.x >> 16));
    v[2] = mt_from16<D>((uint16_t)(x.y & 0xFFFFu)), v[3] = mt_from16<D>((uint16_t)(x.y >> 16));
  } else {
#pragma unroll
    for (int j = 0; j < MT_ILP; j++)
      if (i0 + j * stride < end) v[j] = mt_ld1<D>(p, rt, i0 + j * stride);
  }
}

/* Element i0 + j * stride of p = v[j], for those below end. */
template <int D, bool VEC>
__device__ __forceinline__ void mt_store(void *p, apex_dtype rt, int64_t i0, int64_t stride, int64_t end,
                                         const float (&v)[MT_ILP]) {
  if constexpr (VEC && D == APEX_F32) {
    *(float4 *)((float *)p + i0) = make_float4(v[0], v[1], v[2], v[3]);
  } else if constexpr (VEC) {
    uint2 x;
    x.x = (uint32_t)mt_to16<D>(v[0]) | (uint32_t)mt_to16<D>(v[1]) << 16;
    x.y = (uint32_t)mt_to16<D>(v[2]) | (uint32_t)mt_to16<D>(v[3]) << 16;
    *(uint2 *)((uint16_t *)p + i0) = x;
  } else {
#pragma unroll
    for (int j = 0; j < MT_ILP; j++)
      if (i0 + j * stride < end) mt_st1<D>(p, rt, i0 + j * stride, v[j]);
  }
}

/* Each block takes one contiguous run of the launch's chunks (an equal share, to within one) rather than
 * every gridDim.x-th: a run crosses few tensors, so begin (which here may depend only on the tensor, as
 * it runs once per tensor and block) stalls the block once or twice instead of at every chunk, and the
 * part of a tensor in the run is one loop. */
template <class Op>
__global__ void __launch_bounds__(MT_THREADS) mt_ilp_kernel(const __grid_constant__ MtTable t, Op op) {
  __shared__ int s_go;
  __shared__ float s_coef[MT_COEFS];
  const int chunks = t.cstart[t.n];
  const int c0 = (int)((int64_t)chunks * blockIdx.x / gridDim.x);
  const int c1 = (int)((int64_t)chunks * (blockIdx.x + 1) / gridDim.x);
  int k = 0;
  while (t.cstart[k + 1] <= c0) k++;
  for (; k < t.n && t.cstart[k] < c1; k++) {
    const int a = c0 > t.cstart[k] ? c0 : t.cstart[k], b = c1 < t.cstart[k + 1] ? c1 : t.cstart[k + 1];
    const int64_t start = (int64_t)(a - t.cstart[k]) * MT_CHUNK;
    const int64_t end = (int64_t)(b - t.cstart[k]) * MT_CHUNK < t.numel[k] ? (int64_t)(b - t.cstart[k]) * MT_CHUNK
                                                                               : t.numel[k];
    __syncthreads(); /* s_go and s_coef of the previous tensor are read by everyone */
    if (threadIdx.x == 0) s_go = op.begin(t, k, start, s_coef);
    __syncthreads();
    if (!s_go) continue;
    float coef[MT_COEFS];
#pragma unroll
    for (int m = 0; m < MT_COEFS; m++) coef[m] = s_coef[m];
    int64_t scalar_from = start;
    if constexpr (Op::vec) {
      if (op.aligned(t, k)) {
        int64_t nvec = (end - start) / MT_ILP;
        for (int64_t v = threadIdx.x; v < nvec; v += MT_THREADS)
          op.template apply<true>(t, k, start + v * MT_ILP, 1, end, coef);
        scalar_from = start + nvec * MT_ILP;
      }
    }
    for (int64_t i = scalar_from + threadIdx.x; i < end; i += (int64_t)MT_ILP * MT_THREADS)
      op.template apply<false>(t, k, i, MT_THREADS, end, coef);
  }
}

/* Runs op over lists[0..nlists) with mt_ilp_kernel. Ops here have no per-chunk outputs. */
template <class Op>
static cudaError_t mt_apply_ilp(int nlists, const apex__cuda_list *const *lists, Op op) {
  static const int cap = mt_resident((const void *)mt_ilp_kernel<Op>);
  return mt_launch(mt_ilp_kernel<Op>, cap, nlists, lists, op);
}

#endif
