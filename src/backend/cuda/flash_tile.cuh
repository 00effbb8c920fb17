/* flash_tile.cuh: the pieces of a fused attention tile that apex's two kernels share (flash_attention.cu on
 * mma.sync, flash_attention_sm90*.cu on wgmma): both hold a warp's scores and outputs in mma's m16n8 C layout
 * (lane l: rows l / 4 and l / 4 + 8 of the warp's 16, columns 2 (l % 4) and the next of each 8-wide tile), so
 * the softmax over a row is a thread's registers and then its quad (the four lanes of a row). */
#ifndef APEX_CUDA_FLASH_TILE_CUH
#define APEX_CUDA_FLASH_TILE_CUH

#include <cuda_fp16.h>
#include <stdint.h>

namespace {

/* Two f32 rounded to nearest even into one word of the operand dtype: lo in the low half. */
template <bool BF>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if (BF) asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  else asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/* One key tile of the online softmax, for the thread's rows i0 and i1: s (NT tiles of 8 keys from key k0) to
 * the log2 domain (x sl2), masked above the diagonal; the running maxima m0, m1 moved to the tile's; s replaced
 * by p = 2^(x - m); the running sums l0, l1 (this thread's share) and the outputs o (ND tiles) rescaled by
 * 2^(m_old - m_new) (0 on the first tile, m = -inf) and the tile's p added to l. */
template <int NT, int ND>
__device__ __forceinline__ void online_softmax_tile(float (&s)[NT][4], float (&o)[ND][4], float &m0, float &m1, float &l0, float &l1,
                                                    int k0, int i0, int i1, int tq, float sl2) {
  float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
  for (int n = 0; n < NT; n++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int j = k0 + n * 8 + 2 * tq + (e & 1), i = e < 2 ? i0 : i1;
      s[n][e] = j <= i ? s[n][e] * sl2 : -INFINITY;
    }
    mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
    mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
  }
  const float mn0 = fmaxf(m0, quad_max(mx0)), mn1 = fmaxf(m1, quad_max(mx1));
  const float al0 = exp2f(m0 - mn0), al1 = exp2f(m1 - mn1);
  m0 = mn0;
  m1 = mn1;
  float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
  for (int n = 0; n < NT; n++) {
    s[n][0] = exp2f(s[n][0] - m0);
    s[n][1] = exp2f(s[n][1] - m0);
    s[n][2] = exp2f(s[n][2] - m1);
    s[n][3] = exp2f(s[n][3] - m1);
    sum0 += s[n][0] + s[n][1];
    sum1 += s[n][2] + s[n][3];
  }
  l0 = l0 * al0 + sum0;
  l1 = l1 * al1 + sum1;
#pragma unroll
  for (int n = 0; n < ND; n++) {
    o[n][0] *= al0;
    o[n][1] *= al0;
    o[n][2] *= al1;
    o[n][3] *= al1;
  }
}

/* D_i = rowsum(dO o O) of one row of D elements (f16 or bf16, 4-byte aligned pairs), lane l taking pairs 2 l,
 * 2 l + 64, ...; every lane gets the warp's sum (a fixed butterfly order). */
template <int D, bool BF>
__device__ __forceinline__ float row_dot(const uint16_t *og, const uint16_t *dg, int lane) {
  float acc = 0.0f;
#pragma unroll
  for (int c = lane * 2; c < D; c += 64) {
    const uint32_t ow = *(const uint32_t *)(og + c), dw = *(const uint32_t *)(dg + c);
    float o0, o1, d0, d1;
    if (BF) {
      o0 = __uint_as_float(ow << 16);
      o1 = __uint_as_float(ow & 0xffff0000u);
      d0 = __uint_as_float(dw << 16);
      d1 = __uint_as_float(dw & 0xffff0000u);
    } else {
      o0 = __half2float(__ushort_as_half((unsigned short)(ow & 0xffffu)));
      o1 = __half2float(__ushort_as_half((unsigned short)(ow >> 16)));
      d0 = __half2float(__ushort_as_half((unsigned short)(dw & 0xffffu)));
      d1 = __half2float(__ushort_as_half((unsigned short)(dw >> 16)));
    }
    acc = __fmaf_rn(o0, d0, acc);
    acc = __fmaf_rn(o1, d1, acc);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  return acc;
}

/* Stores a warp's 16 x D f32 tile acc, this thread's rows r0 and r0 + 8 times mul0 and mul1, as rows of a head
 * matrix (f16/bf16, rows ld elements apart), rows at or past t skipped. */
template <bool BF, int D>
__device__ __forceinline__ void store_rows(uint16_t *g_, int64_t ld, int r0, int t, float acc[][4], float mul0, float mul1, int tq) {
  const int r1 = r0 + 8;
#pragma unroll
  for (int n = 0; n < D / 8; n++) {
    const int col = n * 8 + 2 * tq;
    if (r0 < t) *(uint32_t *)(g_ + (int64_t)r0 * ld + col) = pack2<BF>(acc[n][0] * mul0, acc[n][1] * mul0);
    if (r1 < t) *(uint32_t *)(g_ + (int64_t)r1 * ld + col) = pack2<BF>(acc[n][2] * mul1, acc[n][3] * mul1);
  }
}

/* The slot's stats (m, r) of rows i0 and i1 of a head (st: its [t][2]), those below t: m kept in the log2
 * domain, stored natural (x ln 2). */
__device__ __forceinline__ void store_stats(float *st, int t, int i0, int i1, float m0, float m1, float r0, float r1) {
  constexpr float LN2 = 0.6931471805599453f;
  if (i0 < t) {
    st[2 * (int64_t)i0] = m0 * LN2;
    st[2 * (int64_t)i0 + 1] = r0;
  }
  if (i1 < t) {
    st[2 * (int64_t)i1] = m1 * LN2;
    st[2 * (int64_t)i1 + 1] = r1;
  }
}

} /* namespace */

#endif
