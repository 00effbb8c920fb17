/* sm90.cuh: what the Hopper kernels (flash_attention_sm90.cu, flash_attention_sm90_bwd.cu) share: on the device
 * (sm_90a code only), mbarriers, TMA loads, wgmma's shared-memory descriptors and the wgmma forms they use; on
 * the host, whether the kernels can run here and the TMA tensor maps of an attention operand.
 *
 * wgmma forms: "ss" reads A and B from shared memory, both K-major (rows of the reduction dimension
 * contiguous: q and k for S = q k^T); "rs" takes A from registers in mma.sync's m16n8k16 A fragment (the
 * accumulator tiles of a previous product, rounded: P, dS) and B MN-major (the output dimension contiguous:
 * v for P v). Accumulators are f32 in wgmma's m64nN layout: warp w of the warpgroup holds rows 16 w .. 16 w +
 * 15, register 4 n + e of lane l holds row 16 w + l / 4 + 8 (e / 2), column 8 n + 2 (l % 4) + e % 2 (mma.sync's
 * m16n8 C tile, repeated over the columns). Shared tiles are TMA boxes of 64 columns (128 bytes) by R rows
 * with the 128-byte swizzle, each starting on a 1024-byte boundary; a matrix of more than 64 columns is
 * several boxes, R x 128 bytes apart. */
#ifndef APEX_CUDA_SM90_CUH
#define APEX_CUDA_SM90_CUH

#include <cuda.h> /* CUtensorMap and its enums: types only, the one driver function is looked up at run time */
#include <stdint.h>

extern "C" {
#include "backend/cuda/cuda_internal.h"

/* APEX_ERR_UNSUPPORTED, with the reason, for fn's message, unless the Hopper kernels can run here: the sm_90a
 * code built (APEX_SM90A), a device of compute capability 9.0 and the driver's tensor-map encoder, decided once
 * (the device apex uses is fixed once it holds memory, which every attention operand is). */
apex_status apex__sm90_usable(const char *fn);
/* The tensor map of one attention operand (the geometry of g: element (b, h, i, j) at ptr + (b t + i) ld + h d + j)
 * as [batch][t][heads * d], read in boxes of 64 columns by `rows` rows with the 128-byte swizzle; rows past t
 * (of each batch) read as zeros. APEX_ERR_UNSUPPORTED, naming `what`, when the driver refuses it. Call only
 * after apex__sm90_usable said yes. */
apex_status apex__sm90_map(CUtensorMap *map, const void *ptr, int64_t ld, const apex__cuda_flash *g, int rows, const char *fn,
                           const char *what);
}

namespace {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
/* After thread 0's mbar_init calls: the initialisations visible to the other threads and to the async proxy (TMA). */
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
/* A producer warpgroup needs few registers: it gives them to the consumer warpgroups, which take them (setmaxnreg
 * is per warpgroup; 24 + 2 x 240 fits the 168 a thread of 384 had at launch). */
__device__ __forceinline__ void producer_regs() { asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory"); }
__device__ __forceinline__ void consumer_regs() { asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory"); }
/* Arms bar for `bytes` of TMA transfers and counts this thread's arrival. */
__device__ __forceinline__ void mbar_expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* Waits until the phase of bar with this parity has completed. */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
  } while (!done);
}

/* One box of a 3-d tensor map (coordinates: column, row, batch) into shared memory, completing on bar. */
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap *map, int c0, int c1, int c2, uint32_t bar) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
               ::"r"(dst), "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
               : "memory");
}

/* A shared-memory matrix descriptor with the 128-byte swizzle: start address, leading and stride byte
 * offsets, each in 16-byte units (bits 0-13, 16-29, 32-45), base offset 0 (tiles start on 1024-byte
 * boundaries), swizzle mode 1 (bits 62-63). */
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((addr >> 4) & 0x3fffu) | ((uint64_t)((lbo >> 4) & 0x3fffu) << 16) | ((uint64_t)((sbo >> 4) & 0x3fffu) << 32) |
         (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
/* Tells the compiler that the accumulators change here (the asynchronous wgmma writes them between its issue and
 * the wait), so that no read of them moves above the wait and no write below the issue. */
template <int N>
__device__ __forceinline__ void fence_regs(float *r) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}

/* Each wgmma form below is one asm block for both operand dtypes: a local macro takes the type's name.
 *
 * d (m64n64k16, f32) = A B^T, plus d when accumulate is set; A and B K-major in shared memory (descriptors da, db). */
template <bool BF>
__device__ __forceinline__ void wgmma_ss64(float *d, uint64_t da, uint64_t db, int accumulate) {
#define APEX_WGMMA_0(TY) \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
    "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " \
    "{" \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
    "}, %32, %33, p, 1, 1, 0, 0;\n}\n" \
    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
    : "l"(da), "l"(db), "r"(accumulate))
  if (BF) APEX_WGMMA_0("bf16");
  else APEX_WGMMA_0("f16");
#undef APEX_WGMMA_0
}

/* d (m64n64k16, f32) += A B, A from registers (a[4], the fragment of mma.sync's A), B MN-major in shared memory. */
template <bool BF>
__device__ __forceinline__ void wgmma_rs64(float *d, const uint32_t a[4], uint64_t db) {
#define APEX_WGMMA_1(TY) \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n" \
    "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " \
    "{" \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
    "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n" \
    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1))
  if (BF) APEX_WGMMA_1("bf16");
  else APEX_WGMMA_1("f16");
#undef APEX_WGMMA_1
}

/* d (m64n128k16, f32) = A B^T, plus d when accumulate is set; A and B K-major in shared memory (descriptors da, db). */
template <bool BF>
__device__ __forceinline__ void wgmma_ss128(float *d, uint64_t da, uint64_t db, int accumulate) {
#define APEX_WGMMA_2(TY) \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
    "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " \
    "{" \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31," \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47," \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" \
    "}, %64, %65, p, 1, 1, 0, 0;\n}\n" \
    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
    : "l"(da), "l"(db), "r"(accumulate))
  if (BF) APEX_WGMMA_2("bf16");
  else APEX_WGMMA_2("f16");
#undef APEX_WGMMA_2
}

/* d (m64n128k16, f32) += A B, A from registers (a[4], the fragment of mma.sync's A), B MN-major in shared memory. */
template <bool BF>
__device__ __forceinline__ void wgmma_rs128(float *d, const uint32_t a[4], uint64_t db) {
#define APEX_WGMMA_3(TY) \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n" \
    "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " \
    "{" \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31," \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47," \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" \
    "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n" \
    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1))
  if (BF) APEX_WGMMA_3("bf16");
  else APEX_WGMMA_3("f16");
#undef APEX_WGMMA_3
}

template <int N, bool BF>
__device__ __forceinline__ void wgmma_ss(float *d, uint64_t da, uint64_t db, int accumulate) {
  if constexpr (N == 64) wgmma_ss64<BF>(d, da, db, accumulate);
  else wgmma_ss128<BF>(d, da, db, accumulate);
}
template <int N, bool BF>
__device__ __forceinline__ void wgmma_rs(float *d, const uint32_t a[4], uint64_t db) {
  if constexpr (N == 64) wgmma_rs64<BF>(d, a, db);
  else wgmma_rs128<BF>(d, a, db);
}

#endif /* __CUDA_ARCH_FEAT_SM90_ALL */

} /* namespace */

#endif
