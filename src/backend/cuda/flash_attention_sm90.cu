/* flash_attention_sm90.cu: fused causal attention forward for Hopper (sm_90a), FlashAttention-3's scheme:
 * TMA loads, a producer warpgroup feeding a two-stage ring of key/value tiles through mbarriers, and two
 * consumer warpgroups running warpgroup MMA (wgmma) with the softmax in registers (cuda_internal.h,
 * apex__cuda_flash_sm90_fwd). The contract is flash_attention.cu's forward: the same heads read in place,
 * the same (m, r) stats per row, so that its backward (and cuDNN's) reads what this one writes.
 *
 * A block owns 128 query rows of one head; consumer warpgroup w (w = 0, 1) owns rows 64 w .. 64 w + 63 of
 * them, and each of its warps 16 rows, in wgmma's accumulator layout (the layout of mma.sync's m16n8 C
 * tile, repeated over the columns). Per key tile of BN = 128 keys:
 *   S = Q K^T       wgmma m64nBNk16, Q and K both read from shared memory through matrix descriptors;
 *   softmax         masked to j <= i, in the log2 domain, running max m and sum l per row (as flash_attention.cu);
 *   O = O alpha + P V   P rounded to the operand dtype in registers, which are exactly wgmma's A fragment
 *                   (again mma.sync's), V read from shared memory "transposed" (MN-major: d contiguous).
 * The producer (one thread of the first warpgroup) loads Q once and the K and V tiles of the ring with
 * cp.async.bulk.tensor (TMA), each stage guarded by a "full" mbarrier (TMA's byte count) for K and for V,
 * and an "empty" one that the 256 consumer threads arrive at once their wgmma reads of the stage are done.
 *
 * TMA reads each operand through a 3-d tensor map [batch][t][heads * d] with row stride ld (so a packed
 * qkv is read in place) and boxes of 64 columns (128 bytes) by the tile's rows; rows at or past t (of this
 * batch) arrive as zeros, so any t >= 1 works and no tile reads another sequence. The boxes are written
 * with the 128-byte swizzle (16-byte chunk c of row r lands at chunk c ^ (r % 8)), which is the layout
 * wgmma's descriptors name with swizzle mode 1: K-major (Q, K) with 8-row groups 1024 bytes apart, and
 * MN-major (V) with 8-key groups 1024 bytes apart and the 64-column halves of d = 128 one box apart. Every
 * tile starts on a 1024-byte boundary, where the swizzle pattern starts.
 *
 * Masking: a key tile kb visited by a block of queries q0.. has k0 = kb BN <= q0, so every row has an
 * unmasked key in every tile and its running max is finite; rows past t compute on zero rows and are
 * not written. Deterministic: each output row is written by one thread set in a fixed order, no atomics.
 *
 * Built only for sm_90a (wgmma and setmaxnreg exist nowhere else): CMakeLists.txt compiles this file for
 * 90a in place of 90, and for the other architectures the kernel is an empty stub that the host never
 * launches (APEX_SM90A says whether the 90a code exists; the device's compute capability, read once, whether
 * it can run). The helpers it shares with the backward (flash_attention_sm90_bwd.cu) are in sm90.cuh; the
 * host's half of them is here: the tensor maps are made with the driver's cuTensorMapEncodeTiled, reached
 * through the runtime (cudaGetDriverEntryPointByVersion), so that the library does not link libcuda. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

extern "C" {
#include "core/internal.h"
}
#include "backend/cuda/flash_tile.cuh"
#include "backend/cuda/sm90.cuh"

#ifndef APEX_SM90A
#define APEX_SM90A 0
#endif

#define H3_FWD "apex__cuda_flash_sm90_fwd"

namespace {

constexpr int BM = 128;      /* query rows of a block: two consumer warpgroups of 64 */
constexpr int BN = 128;      /* keys of a tile */
constexpr int STAGES = 2;    /* the K/V ring */
constexpr int THREADS = 384; /* warpgroup 0 produces, 1 and 2 consume */
constexpr float LOG2E = 1.4426950408889634f;

struct H3Params {
  uint16_t *out;
  float *stats;
  int64_t ld_o;
  int t, heads;
  float sl2; /* 1 / sqrt(d) * log2(e) */
};

/* Shared memory of a block (bytes after the 1024-byte aligned base): Q, the K stages, the V stages, then
 * the mbarriers; plus 1024 bytes of slack for the alignment. */
template <int D> __host__ __device__ constexpr int q_bytes() { return BM * D * 2; }
template <int D> __host__ __device__ constexpr int kv_bytes() { return BN * D * 2; }
template <int D> __host__ __device__ constexpr int smem_bytes() {
  return 1024 + q_bytes<D>() + 2 * STAGES * kv_bytes<D>() + 8 * (1 + 3 * STAGES);
}

/* ---- the kernel --------------------------------------------------------------------------------------------- */

/* Grid (query blocks, batch * heads), the blocks with the most keys (the last query blocks) first. */
template <int D, bool BF>
__global__ void __launch_bounds__(THREADS, 1)
    flash_sm90_fwd(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                   const __grid_constant__ CUtensorMap tv, const H3Params P) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int CONSUMERS = 256; /* the threads of the two consumer warpgroups */
  constexpr uint32_t QB = q_bytes<D>(), KVB = kv_bytes<D>();
  constexpr int BOXES = D / 64; /* 64-column boxes of a row */
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sq = base, sk = sq + QB, sv = sk + STAGES * KVB;
  const uint32_t bar_q = sv + STAGES * KVB; /* then kfull[s], vfull[s], empty[s], 8 bytes each */
  const uint32_t bar_k = bar_q + 8, bar_v = bar_k + 8 * STAGES, bar_e = bar_v + 8 * STAGES;
  const int t = P.t, bh = blockIdx.y, b = bh / P.heads, h = bh % P.heads;
  const int nqb = (t + BM - 1) / BM, qb = nqb - 1 - (int)blockIdx.x, q0 = qb * BM;
  /* the key tiles up to the block's last row (q0 + BM - 1) and below t */
  const int last = min(q0 + BM, t) - 1, nkb = last / BN + 1;
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    mbar_init(bar_q, 1);
    for (int s = 0; s < STAGES; s++) {
      mbar_init(bar_k + 8 * s, 1);
      mbar_init(bar_v + 8 * s, 1);
      mbar_init(bar_e + 8 * s, CONSUMERS);
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {
    producer_regs();
    if (threadIdx.x == 0) {
      mbar_expect(bar_q, QB);
      for (int c = 0; c < BOXES; c++) tma_load(sq + c * (BM * 128), &tq, h * D + 64 * c, q0, b, bar_q);
      for (int it = 0; it < nkb; it++) {
        const int s = it % STAGES, n = it / STAGES;
        /* the stage's previous tiles (use n - 1) fully read by both consumer warpgroups */
        if (n > 0) mbar_wait(bar_e + 8 * s, (uint32_t)((n - 1) & 1));
        mbar_expect(bar_k + 8 * s, KVB);
        for (int c = 0; c < BOXES; c++) tma_load(sk + s * KVB + c * (BN * 128), &tk, h * D + 64 * c, it * BN, b, bar_k + 8 * s);
        mbar_expect(bar_v + 8 * s, KVB);
        for (int c = 0; c < BOXES; c++) tma_load(sv + s * KVB + c * (BN * 128), &tv, h * D + 64 * c, it * BN, b, bar_v + 8 * s);
      }
    }
    return;
  }
  consumer_regs();

  const int cw = wg - 1, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x & 31, g = lane >> 2, tq4 = lane & 3;
  const int i0 = q0 + cw * 64 + warp * 16 + g, i1 = i0 + 8; /* this thread's two rows */
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f; /* log2 domain */
  /* this warpgroup's 64 rows of Q: 64 rows x 128 bytes into each box */
  const uint32_t qrows = sq + cw * 64 * 128;
  mbar_wait(bar_q, 0);

  for (int it = 0; it < nkb; it++) {
    const int s = it % STAGES;
    const uint32_t par = (uint32_t)((it / STAGES) & 1);
    const uint32_t kt = sk + s * KVB, vt = sv + s * KVB;
    float sc[BN / 8][4];
#pragma unroll
    for (int n = 0; n < BN / 8; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f; /* not read (k step 0 overwrites) */
    mbar_wait(bar_k + 8 * s, par);
    /* S = Q K^T: k steps of 16 columns, 4 to a 128-byte box row (32 bytes apart), then the next box */
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
      const uint32_t off = (kk % 4) * 32;
      const uint64_t da = sw128_desc(qrows + (kk / 4) * (BM * 128) + off, 16, 1024);
      const uint64_t db = sw128_desc(kt + (kk / 4) * (BN * 128) + off, 16, 1024);
      wgmma_ss<BN, BF>(&sc[0][0], da, db, kk > 0);
    }
    wgmma_commit();
    wgmma_wait0();
    fence_regs<BN / 2>(&sc[0][0]);

    /* to the log2 domain, masked above the diagonal; the running max and sums moved on */
    online_softmax_tile(sc, o, m0, m1, l0, l1, it * BN, i0, i1, tq4, P.sl2);
    /* P in the operand dtype: the accumulator tiles 2 kc and 2 kc + 1 are the A fragment of k step kc */
    uint32_t pa[BN / 16][4];
#pragma unroll
    for (int kc = 0; kc < BN / 16; kc++) {
      pa[kc][0] = pack2<BF>(sc[2 * kc][0], sc[2 * kc][1]);
      pa[kc][1] = pack2<BF>(sc[2 * kc][2], sc[2 * kc][3]);
      pa[kc][2] = pack2<BF>(sc[2 * kc + 1][0], sc[2 * kc + 1][1]);
      pa[kc][3] = pack2<BF>(sc[2 * kc + 1][2], sc[2 * kc + 1][3]);
    }
    /* O += P V: k steps of 16 keys (16 rows of 128 bytes = 2048 bytes apart); V is MN-major: 8-key groups 1024
     * bytes apart (the stride offset), the second 64 columns of d = 128 one box (BN rows) away (the leading offset) */
    mbar_wait(bar_v + 8 * s, par);
    fence_regs<D / 2>(&o[0][0]);
    wgmma_fence();
#pragma unroll
    for (int kc = 0; kc < BN / 16; kc++) wgmma_rs<D, BF>(&o[0][0], pa[kc], sw128_desc(vt + kc * 2048, BN * 128, 1024));
    wgmma_commit();
    wgmma_wait0();
    fence_regs<D / 2>(&o[0][0]);
    mbar_arrive(bar_e + 8 * s); /* this thread's reads of the stage are done */
  }

  l0 = quad_sum(l0);
  l1 = quad_sum(l1);
  const float r0 = 1.0f / l0, r1 = 1.0f / l1;
  store_rows<BF, D>(P.out + (int64_t)b * t * P.ld_o + (int64_t)h * D, P.ld_o, i0, t, o, r0, r1, tq4);
  if (tq4 == 0) store_stats(P.stats + (int64_t)bh * t * 2, t, i0, i1, m0, m1, r0, r1);
#else
  (void)tq, (void)tk, (void)tv, (void)P; /* not built for this architecture: the host never launches it here */
#endif
}

/* ---- launch ------------------------------------------------------------------------------------------------- */

template <int D, bool BF>
static apex_status launch(const CUtensorMap &q, const CUtensorMap &k, const CUtensorMap &v, const H3Params &p, int bh) {
  static int limit = 0;
  const int bytes = smem_bytes<D>();
  if (limit < bytes) {
    cudaError_t e = cudaFuncSetAttribute(flash_sm90_fwd<D, BF>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e != cudaSuccess) return apex__fail(APEX_ERR_DEVICE, "%s: shared memory of %d bytes: %s", H3_FWD, bytes, cudaGetErrorString(e));
    limit = bytes;
  }
  dim3 grid((unsigned)((p.t + BM - 1) / BM), (unsigned)bh);
  flash_sm90_fwd<D, BF><<<grid, THREADS, bytes, (cudaStream_t)apex__cuda_stream()>>>(q, k, v, p);
  return apex__cuda_check_launch(H3_FWD);
}

} /* namespace */

/* ---- host: what sm90.cuh declares ---------------------------------------------------------------------------- */

namespace {

typedef CUresult (*EncodeTiled)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *, const cuuint64_t *,
                                const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

struct Hopper {
  int ok;
  char why[240];
  EncodeTiled encode;
};

const Hopper &hopper() {
  static const Hopper hw = [] {
    Hopper r = {};
    if (!APEX_SM90A) {
      snprintf(r.why, sizeof r.why, "the library was built without sm_90a code (CMAKE_CUDA_ARCHITECTURES did not include 90)");
      return r;
    }
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
      snprintf(r.why, sizeof r.why, "no CUDA device could be queried (%s)", cudaGetErrorString(cudaGetLastError()));
      return r;
    }
    if (major != 9 || minor != 0) {
      snprintf(r.why, sizeof r.why, "device of compute capability %d.%d: the Hopper kernels (wgmma, sm_90a) run on 9.0 only", major,
               minor);
      return r;
    }
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !fn) {
      cudaGetLastError();
      snprintf(r.why, sizeof r.why, "the CUDA driver has no cuTensorMapEncodeTiled (a driver for CUDA 12 or later is needed)");
      return r;
    }
    r.encode = (EncodeTiled)fn;
    r.ok = 1;
    return r;
  }();
  return hw;
}

} /* namespace */

extern "C" apex_status apex__sm90_usable(const char *fn) {
  const Hopper &hw = hopper();
  return hw.ok ? APEX_OK : apex__fail(APEX_ERR_UNSUPPORTED, "%s: %s", fn, hw.why);
}

extern "C" apex_status apex__sm90_map(CUtensorMap *map, const void *ptr, int64_t ld, const apex__cuda_flash *g, int rows,
                                      const char *fn, const char *what) {
  const Hopper &hw = hopper();
  if (!hw.ok) return apex__fail(APEX_ERR_UNSUPPORTED, "%s: %s", fn, hw.why);
  const cuuint64_t dims[3] = {(cuuint64_t)g->heads * (cuuint64_t)g->d, (cuuint64_t)g->t, (cuuint64_t)g->batch};
  const cuuint64_t strides[2] = {(cuuint64_t)ld * 2u, (cuuint64_t)ld * 2u * (cuuint64_t)g->t};
  const cuuint32_t box[3] = {64, (cuuint32_t)rows, 1}, unit[3] = {1, 1, 1};
  const CUresult r = hw.encode(map, g->dtype == APEX_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
                               (void *)ptr, dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return apex__fail(APEX_ERR_UNSUPPORTED, "%s: the driver refused the tensor map of %s (row stride %lld, t %d, batch %d): CUresult %d",
                      fn, what, (long long)ld, g->t, g->batch, (int)r);
  return APEX_OK;
}

extern "C" apex_status apex__cuda_flash_sm90_fwd(const apex__cuda_flash *g, const void *q, const void *k, const void *v, void *o,
                                                 float *stats) {
  if (!g) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL geometry", H3_FWD);
  const void *ptrs[] = {q, k, v, o};
  const int64_t lds[] = {g->ld_q, g->ld_k, g->ld_v, g->ld_o};
  apex_status st = apex__cuda_attn_operands_check(H3_FWD, "the Hopper kernel", g, ptrs, lds, 4);
  if (st != APEX_OK) return st;
  if (!stats) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL stats", H3_FWD);
  if (g->d != 64 && g->d != 128)
    return apex__fail(APEX_ERR_UNSUPPORTED, "%s: head dim %d: the Hopper kernel takes 64 or 128", H3_FWD, g->d);
  if ((int64_t)g->batch * g->heads > 65535)
    return apex__fail(APEX_ERR_UNSUPPORTED, "%s: batch %d x heads %d above 65535 (the grid's second dimension)", H3_FWD, g->batch,
                      g->heads);
  if ((st = apex__sm90_usable(H3_FWD)) != APEX_OK) return st;
  CUtensorMap mq, mk, mv;
  if ((st = apex__sm90_map(&mq, q, g->ld_q, g, BM, H3_FWD, "q")) != APEX_OK ||
      (st = apex__sm90_map(&mk, k, g->ld_k, g, BN, H3_FWD, "k")) != APEX_OK ||
      (st = apex__sm90_map(&mv, v, g->ld_v, g, BN, H3_FWD, "v")) != APEX_OK)
    return st;
  H3Params p = {};
  p.out = (uint16_t *)o;
  p.stats = stats;
  p.ld_o = g->ld_o;
  p.t = g->t;
  p.heads = g->heads;
  p.sl2 = 1.0f / sqrtf((float)g->d) * LOG2E;
  const int bh = g->batch * g->heads;
  const bool bf = g->dtype == APEX_BF16;
  if (g->d == 64) return bf ? launch<64, true>(mq, mk, mv, p, bh) : launch<64, false>(mq, mk, mv, p, bh);
  return bf ? launch<128, true>(mq, mk, mv, p, bh) : launch<128, false>(mq, mk, mv, p, bh);
}
