/* flash_attention_sm90_bwd.cu: the backward of the Hopper attention (flash_attention_sm90.cu's forward; the
 * contract of apex__cuda_flash_attention_bwd: dq, dk, dv from q, k, v, o, dO and the (m, r) stats), on Hopper's
 * warpgroup MMA (wgmma) fed by TMA through mbarrier rings (cuda_internal.h, apex__cuda_flash_sm90_bwd). The
 * scheme is flash_attention.cu's: deterministic, no atomics, dQ in a pass of its own that recomputes S and dP.
 *
 *   aux:   per query row (m log2(e), r, D = rowsum(dO o O), 0), one warp a row, rows padded to a multiple of 64
 *          per head with zeros (so a tile of 64 rows is always 1024 contiguous bytes);
 *   dK dV: a block per 128 keys of a head, consumer warpgroup w (w = 0, 1) owning keys 64 w .. 64 w + 63; its K
 *          and V rows stay in shared memory, and the query tiles (64 rows of Q and dO, and their aux) from the
 *          key block's diagonal on stream through a two-stage ring. Per tile: S^T = K Q^T and dP^T = V dO^T
 *          (wgmma, both operands K-major), P^T = 2^(S^T scale log2(e) - m2) r where query i >= key j and i < t,
 *          dS^T = P^T o (dP^T - D), then dV += P^T dO and dK += dS^T Q (P^T, dS^T from registers, dO and Q
 *          MN-major); dK is scaled once at the end;
 *   dQ:    a block per 128 queries (the forward's split: warpgroup w owns rows 64 w ..), Q and dO kept, the key
 *          tiles (64 rows of K and V) up to the diagonal streaming through the ring. Per tile: S = Q K^T, dP =
 *          dO V^T, dS = P o (dP - D), dQ += dS K (K MN-major); dQ is scaled at the end.
 * The tiles, descriptors and register layouts are sm90.cuh's; a producer warpgroup (one thread) issues every
 * load. Masked entries are selected to zero, so the rows past t (zero rows from TMA, zero aux) give nothing.
 *
 * Built for sm_90a only (CMakeLists.txt, as the forward); elsewhere the kernels are stubs the host never
 * launches (apex__sm90_usable decides). */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

extern "C" {
#include "core/internal.h"
}
#include "backend/cuda/flash_tile.cuh"
#include "backend/cuda/sm90.cuh"

#define H3_BWD "apex__cuda_flash_sm90_bwd"

namespace {

constexpr int BK = 128;      /* keys of a dK/dV block, and queries of a dQ block */
constexpr int BT = 64;       /* rows of a streamed tile: queries (dK/dV) or keys (dQ) */
constexpr int STAGES = 2;    /* the ring of streamed tiles */
constexpr int THREADS = 384; /* warpgroup 0 produces, 1 and 2 consume */
constexpr float LOG2E = 1.4426950408889634f;

struct BwdParams {
  const uint16_t *o, *dout; /* aux's inputs */
  const float *stats;
  float *aux;               /* [batch * heads][tpad][4] */
  uint16_t *dq, *dk, *dv;
  int64_t ld_o, ld_do, ld_dq, ld_dk, ld_dv;
  int t, tpad, heads;
  float scale, sl2; /* 1 / sqrt(d), and scale * log2(e) */
};

/* Shared memory (bytes after the 1024-byte aligned base), with 1024 bytes of slack for the alignment.
 * dK/dV: K, V (BK rows each), then per stage Q, dO (BT rows each) and aux (BT x 16 bytes), then 1 + 2 STAGES
 * mbarriers. dQ: Q, dO (BK rows each), then per stage K, V (BT rows each), then the mbarriers. */
template <int D> __host__ __device__ constexpr int dkdv_smem() {
  return 1024 + 2 * BK * D * 2 + STAGES * (2 * BT * D * 2 + BT * 16) + 8 * (1 + 2 * STAGES);
}
template <int D> __host__ __device__ constexpr int dq_smem() {
  return 1024 + 2 * BK * D * 2 + STAGES * 2 * BT * D * 2 + 8 * (1 + 2 * STAGES);
}

/* ---- aux ----------------------------------------------------------------------------------------------------- */

/* aux[bh][i] = (m log2(e), r, sum_c dO[i, c] O[i, c], 0) for i < t, zeros for t <= i < tpad: a warp per row, lanes
 * over the channels, then a butterfly (a fixed order). */
template <int D, bool BF>
__global__ void sm90_bwd_aux(BwdParams P, int64_t rows) {
  const int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (r >= rows) return; /* the whole warp leaves together */
  const int lane = threadIdx.x & 31, t = P.t;
  const int64_t i = r % P.tpad, bh = r / P.tpad, b = bh / P.heads, h = bh % P.heads;
  float4 out = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (i < t) {
    const uint16_t *og = P.o + (b * t + i) * P.ld_o + h * D, *dg = P.dout + (b * t + i) * P.ld_do + h * D;
    const float acc = row_dot<D, BF>(og, dg, lane);
    const float *st = P.stats + (bh * t + i) * 2;
    out = make_float4(st[0] * LOG2E, st[1], acc, 0.0f);
  }
  if (lane == 0) ((float4 *)P.aux)[r] = out;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* A 1-d bulk copy of bytes (a multiple of 16) from global to shared memory, completing on bar. */
__device__ __forceinline__ void bulk_load(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst), "l"(src),
               "r"(bytes), "r"(bar)
               : "memory");
}

/* The K-major descriptor of k step kk (16 columns) of rows row0.. of a tile of `rows`-row boxes at base. */
__device__ __forceinline__ uint64_t kmajor(uint32_t base, int rows, int row0, int kk) {
  return sw128_desc(base + (kk / 4) * (rows * 128) + row0 * 128 + (kk % 4) * 32, 16, 1024);
}
/* The MN-major descriptor of k step kc (rows 16 kc ..) of a tile of `rows`-row boxes at base. */
__device__ __forceinline__ uint64_t mnmajor(uint32_t base, int rows, int kc) { return sw128_desc(base + kc * 2048, rows * 128, 1024); }

/* Both passes' barriers, by thread 0: `once` for the block's resident tiles (the producer's one arrival), and per
 * stage of the ring a full barrier (the producer's arrival and its TMA bytes) and an empty one (every consumer
 * thread's arrival), 8 bytes apart. */
__device__ __forceinline__ void ring_init(uint32_t once, uint32_t full, uint32_t empty, int consumers) {
  mbar_init(once, 1);
  for (int s = 0; s < STAGES; s++) {
    mbar_init(full + 8 * s, 1);
    mbar_init(empty + 8 * s, consumers);
  }
  mbar_init_fence();
}

#endif /* __CUDA_ARCH_FEAT_SM90_ALL */

/* ---- dK, dV ----------------------------------------------------------------------------------------------------- */

/* Grid (key blocks, batch * heads); the first key blocks have the most query tiles. Maps: K and V with BK-row
 * boxes, Q and dO with BT-row boxes. */
template <int D, bool BF>
__global__ void __launch_bounds__(THREADS, 1)
    sm90_bwd_dkdv(const __grid_constant__ CUtensorMap tk, const __grid_constant__ CUtensorMap tv,
                  const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tdo, const BwdParams P) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BOXES = D / 64, CONSUMERS = 256;
  constexpr uint32_t KB = BK * D * 2, TB = BT * D * 2, STAGE = 2 * TB + BT * 16;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sk = base, sv = sk + KB, s0 = sv + KB; /* stage s: Q at s0 + s STAGE, dO after it, then aux */
  const uint32_t bar_kv = s0 + STAGES * STAGE, bar_f = bar_kv + 8, bar_e = bar_f + 8 * STAGES;
  const int t = P.t, bh = blockIdx.y, b = bh / P.heads, h = bh % P.heads;
  const int kb = blockIdx.x, k0 = kb * BK;
  const int qt0 = k0 / BT, ntiles = (t + BT - 1) / BT - qt0; /* the query tiles from the diagonal on */
  const int wg = threadIdx.x / 128;
  const float *auxg = P.aux + ((int64_t)bh * P.tpad) * 4;

  if (threadIdx.x == 0) ring_init(bar_kv, bar_f, bar_e, CONSUMERS);
  __syncthreads();

  if (wg == 0) {
    producer_regs();
    if (threadIdx.x == 0) {
      mbar_expect(bar_kv, 2 * KB);
      for (int c = 0; c < BOXES; c++) {
        tma_load(sk + c * (BK * 128), &tk, h * D + 64 * c, k0, b, bar_kv);
        tma_load(sv + c * (BK * 128), &tv, h * D + 64 * c, k0, b, bar_kv);
      }
      for (int it = 0; it < ntiles; it++) {
        const int s = it % STAGES, n = it / STAGES, q0 = (qt0 + it) * BT;
        const uint32_t st = s0 + s * STAGE;
        if (n > 0) mbar_wait(bar_e + 8 * s, (uint32_t)((n - 1) & 1));
        mbar_expect(bar_f + 8 * s, STAGE);
        for (int c = 0; c < BOXES; c++) {
          tma_load(st + c * (BT * 128), &tq, h * D + 64 * c, q0, b, bar_f + 8 * s);
          tma_load(st + TB + c * (BT * 128), &tdo, h * D + 64 * c, q0, b, bar_f + 8 * s);
        }
        bulk_load(st + 2 * TB, auxg + (int64_t)q0 * 4, BT * 16, bar_f + 8 * s);
      }
    }
    return;
  }
  consumer_regs();

  const int cw = wg - 1, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x & 31, g = lane >> 2, tq4 = lane & 3;
  const int j0 = k0 + cw * 64 + warp * 16 + g, j1 = j0 + 8; /* this thread's two keys */
  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; n++) {
    dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = 0.0f;
    dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.0f;
  }
  mbar_wait(bar_kv, 0);

  for (int it = 0; it < ntiles; it++) {
    const int s = it % STAGES, q0 = (qt0 + it) * BT;
    const uint32_t st = s0 + s * STAGE, sq = st, sdo = st + TB;
    const float4 *aux = (const float4 *)(smem_raw + (st + 2 * TB - smem_u32(smem_raw)));
    float p[BT / 8][4], dp[BT / 8][4];
#pragma unroll
    for (int n = 0; n < BT / 8; n++) p[n][0] = p[n][1] = p[n][2] = p[n][3] = dp[n][0] = dp[n][1] = dp[n][2] = dp[n][3] = 0.0f;
    mbar_wait(bar_f + 8 * s, (uint32_t)((it / STAGES) & 1));
    /* S^T = K_w Q^T and dP^T = V_w dO^T */
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) wgmma_ss<BT, BF>(&p[0][0], kmajor(sk, BK, cw * 64, kk), kmajor(sq, BT, 0, kk), kk > 0);
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) wgmma_ss<BT, BF>(&dp[0][0], kmajor(sv, BK, cw * 64, kk), kmajor(sdo, BT, 0, kk), kk > 0);
    wgmma_commit();
    wgmma_wait0();
    fence_regs<BT / 2>(&p[0][0]);
    fence_regs<BT / 2>(&dp[0][0]);
    /* P^T and dS^T (query i = column), rounded to the operand dtype as the A fragments of the two products */
    uint32_t pa[BT / 16][4], da[BT / 16][4];
#pragma unroll
    for (int n = 0; n < BT / 8; n++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int il = n * 8 + 2 * tq4 + (e & 1), i = q0 + il, j = e < 2 ? j0 : j1;
        const float4 a = aux[il];
        const bool in = i >= j && i < t;
        const float pe = in ? exp2f(__fmaf_rn(p[n][e], P.sl2, -a.x)) * a.y : 0.0f;
        dp[n][e] = in ? pe * (dp[n][e] - a.z) : 0.0f;
        p[n][e] = pe;
      }
    }
#pragma unroll
    for (int kc = 0; kc < BT / 16; kc++) {
      pa[kc][0] = pack2<BF>(p[2 * kc][0], p[2 * kc][1]);
      pa[kc][1] = pack2<BF>(p[2 * kc][2], p[2 * kc][3]);
      pa[kc][2] = pack2<BF>(p[2 * kc + 1][0], p[2 * kc + 1][1]);
      pa[kc][3] = pack2<BF>(p[2 * kc + 1][2], p[2 * kc + 1][3]);
      da[kc][0] = pack2<BF>(dp[2 * kc][0], dp[2 * kc][1]);
      da[kc][1] = pack2<BF>(dp[2 * kc][2], dp[2 * kc][3]);
      da[kc][2] = pack2<BF>(dp[2 * kc + 1][0], dp[2 * kc + 1][1]);
      da[kc][3] = pack2<BF>(dp[2 * kc + 1][2], dp[2 * kc + 1][3]);
    }
    /* dV += P^T dO, dK += dS^T Q: dO and Q MN-major (16 query rows a k step) */
    fence_regs<D / 2>(&dv[0][0]);
    fence_regs<D / 2>(&dk[0][0]);
    wgmma_fence();
#pragma unroll
    for (int kc = 0; kc < BT / 16; kc++) wgmma_rs<D, BF>(&dv[0][0], pa[kc], mnmajor(sdo, BT, kc));
#pragma unroll
    for (int kc = 0; kc < BT / 16; kc++) wgmma_rs<D, BF>(&dk[0][0], da[kc], mnmajor(sq, BT, kc));
    wgmma_commit();
    wgmma_wait0();
    fence_regs<D / 2>(&dv[0][0]);
    fence_regs<D / 2>(&dk[0][0]);
    mbar_arrive(bar_e + 8 * s);
  }
  const int row0 = k0 + cw * 64 + warp * 16 + g;
  store_rows<BF, D>(P.dk + (int64_t)b * t * P.ld_dk + (int64_t)h * D, P.ld_dk, row0, t, dk, P.scale, P.scale, tq4);
  store_rows<BF, D>(P.dv + (int64_t)b * t * P.ld_dv + (int64_t)h * D, P.ld_dv, row0, t, dv, 1.0f, 1.0f, tq4);
#else
  (void)tk, (void)tv, (void)tq, (void)tdo, (void)P;
#endif
}

/* ---- dQ -------------------------------------------------------------------------------------------------------- */

/* Grid (query blocks, batch * heads), the last (longest) first. Maps: Q and dO with BK-row boxes, K and V with
 * BT-row boxes. */
template <int D, bool BF>
__global__ void __launch_bounds__(THREADS, 1)
    sm90_bwd_dq(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tdo,
                const __grid_constant__ CUtensorMap tk, const __grid_constant__ CUtensorMap tv, const BwdParams P) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BOXES = D / 64, CONSUMERS = 256;
  constexpr uint32_t QB = BK * D * 2, TB = BT * D * 2, STAGE = 2 * TB;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sq = base, sdo = sq + QB, s0 = sdo + QB; /* stage s: K at s0 + s STAGE, V after it */
  const uint32_t bar_q = s0 + STAGES * STAGE, bar_f = bar_q + 8, bar_e = bar_f + 8 * STAGES;
  const int t = P.t, bh = blockIdx.y, b = bh / P.heads, h = bh % P.heads;
  const int nqb = (t + BK - 1) / BK, qb = nqb - 1 - (int)blockIdx.x, q0 = qb * BK;
  const int ntiles = (min(q0 + BK, t) - 1) / BT + 1; /* the key tiles up to the block's last row */
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) ring_init(bar_q, bar_f, bar_e, CONSUMERS);
  __syncthreads();

  if (wg == 0) {
    producer_regs();
    if (threadIdx.x == 0) {
      mbar_expect(bar_q, 2 * QB);
      for (int c = 0; c < BOXES; c++) {
        tma_load(sq + c * (BK * 128), &tq, h * D + 64 * c, q0, b, bar_q);
        tma_load(sdo + c * (BK * 128), &tdo, h * D + 64 * c, q0, b, bar_q);
      }
      for (int it = 0; it < ntiles; it++) {
        const int s = it % STAGES, n = it / STAGES;
        const uint32_t st = s0 + s * STAGE;
        if (n > 0) mbar_wait(bar_e + 8 * s, (uint32_t)((n - 1) & 1));
        mbar_expect(bar_f + 8 * s, STAGE);
        for (int c = 0; c < BOXES; c++) {
          tma_load(st + c * (BT * 128), &tk, h * D + 64 * c, it * BT, b, bar_f + 8 * s);
          tma_load(st + TB + c * (BT * 128), &tv, h * D + 64 * c, it * BT, b, bar_f + 8 * s);
        }
      }
    }
    return;
  }
  consumer_regs();

  const int cw = wg - 1, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x & 31, g = lane >> 2, tq4 = lane & 3;
  const int i0 = q0 + cw * 64 + warp * 16 + g, i1 = i0 + 8; /* this thread's two rows */
  const float4 *auxg = (const float4 *)P.aux + (int64_t)bh * P.tpad;
  const float4 a0 = auxg[i0], a1 = auxg[i1]; /* i1 < q0 + BK <= tpad rounded up to 64: inside the padding */
  float dq[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
  mbar_wait(bar_q, 0);

  for (int it = 0; it < ntiles; it++) {
    const int s = it % STAGES, k0 = it * BT;
    const uint32_t skt = s0 + s * STAGE, svt = skt + TB;
    float p[BT / 8][4], dp[BT / 8][4];
#pragma unroll
    for (int n = 0; n < BT / 8; n++) p[n][0] = p[n][1] = p[n][2] = p[n][3] = dp[n][0] = dp[n][1] = dp[n][2] = dp[n][3] = 0.0f;
    mbar_wait(bar_f + 8 * s, (uint32_t)((it / STAGES) & 1));
    /* S = Q_w K^T and dP = dO_w V^T */
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) wgmma_ss<BT, BF>(&p[0][0], kmajor(sq, BK, cw * 64, kk), kmajor(skt, BT, 0, kk), kk > 0);
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) wgmma_ss<BT, BF>(&dp[0][0], kmajor(sdo, BK, cw * 64, kk), kmajor(svt, BT, 0, kk), kk > 0);
    wgmma_commit();
    wgmma_wait0();
    fence_regs<BT / 2>(&p[0][0]);
    fence_regs<BT / 2>(&dp[0][0]);
    /* dS = P o (dP - D), P = 2^(S scale log2(e) - m2) r where key j <= query i */
    uint32_t da[BT / 16][4];
#pragma unroll
    for (int n = 0; n < BT / 8; n++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int j = k0 + n * 8 + 2 * tq4 + (e & 1), i = e < 2 ? i0 : i1;
        const float4 a = e < 2 ? a0 : a1;
        const bool in = j <= i && i < t;
        dp[n][e] = in ? exp2f(__fmaf_rn(p[n][e], P.sl2, -a.x)) * a.y * (dp[n][e] - a.z) : 0.0f;
      }
    }
#pragma unroll
    for (int kc = 0; kc < BT / 16; kc++) {
      da[kc][0] = pack2<BF>(dp[2 * kc][0], dp[2 * kc][1]);
      da[kc][1] = pack2<BF>(dp[2 * kc][2], dp[2 * kc][3]);
      da[kc][2] = pack2<BF>(dp[2 * kc + 1][0], dp[2 * kc + 1][1]);
      da[kc][3] = pack2<BF>(dp[2 * kc + 1][2], dp[2 * kc + 1][3]);
    }
    /* dQ += dS K: K MN-major (16 key rows a k step) */
    fence_regs<D / 2>(&dq[0][0]);
    wgmma_fence();
#pragma unroll
    for (int kc = 0; kc < BT / 16; kc++) wgmma_rs<D, BF>(&dq[0][0], da[kc], mnmajor(skt, BT, kc));
    wgmma_commit();
    wgmma_wait0();
    fence_regs<D / 2>(&dq[0][0]);
    mbar_arrive(bar_e + 8 * s);
  }
  store_rows<BF, D>(P.dq + (int64_t)b * t * P.ld_dq + (int64_t)h * D, P.ld_dq, i0, t, dq, P.scale, P.scale, tq4);
#else
  (void)tq, (void)tdo, (void)tk, (void)tv, (void)P;
#endif
}

/* ---- launch ------------------------------------------------------------------------------------------------- */

/* Sets a kernel's dynamic shared memory limit to bytes, once per kernel. */
template <typename K>
static apex_status smem_limit(K kernel, int bytes, int *done) {
  if (*done >= bytes) return APEX_OK;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) return apex__fail(APEX_ERR_DEVICE, "%s: shared memory of %d bytes: %s", H3_BWD, bytes, cudaGetErrorString(e));
  *done = bytes;
  return APEX_OK;
}

/* maps: K, V (BK rows), Q, dO (BT rows), then Q, dO (BK rows), K, V (BT rows). */
template <int D, bool BF>
static apex_status launch(const CUtensorMap *m, const BwdParams &p, int bh) {
  static int limit_kv = 0, limit_q = 0;
  apex_status st = smem_limit(sm90_bwd_dkdv<D, BF>, dkdv_smem<D>(), &limit_kv);
  if (st == APEX_OK) st = smem_limit(sm90_bwd_dq<D, BF>, dq_smem<D>(), &limit_q);
  if (st != APEX_OK) return st;
  cudaStream_t s = (cudaStream_t)apex__cuda_stream();
  const int64_t rows = (int64_t)bh * p.tpad;
  sm90_bwd_aux<D, BF><<<(unsigned)((rows + 7) / 8), 256, 0, s>>>(p, rows);
  if ((st = apex__cuda_check_launch(H3_BWD)) != APEX_OK) return st;
  const dim3 grid((unsigned)((p.t + BK - 1) / BK), (unsigned)bh);
  sm90_bwd_dkdv<D, BF><<<grid, THREADS, dkdv_smem<D>(), s>>>(m[0], m[1], m[2], m[3], p);
  if ((st = apex__cuda_check_launch(H3_BWD)) != APEX_OK) return st;
  sm90_bwd_dq<D, BF><<<grid, THREADS, dq_smem<D>(), s>>>(m[4], m[5], m[6], m[7], p);
  return apex__cuda_check_launch(H3_BWD);
}

} /* namespace */

extern "C" apex_status apex__cuda_flash_sm90_bwd(const apex__cuda_flash *g, const void *q, const void *k, const void *v, const void *o,
                                                 const void *dout, const float *stats, void *dq, void *dk, void *dv) {
  if (!g) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL geometry", H3_BWD);
  const void *ptrs[] = {q, k, v, o, dout, dq, dk, dv};
  const int64_t lds[] = {g->ld_q, g->ld_k, g->ld_v, g->ld_o, g->ld_do, g->ld_dq, g->ld_dk, g->ld_dv};
  apex_status st = apex__cuda_attn_operands_check(H3_BWD, "the Hopper kernel", g, ptrs, lds, 8);
  if (st != APEX_OK) return st;
  if (!stats) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL stats", H3_BWD);
  if (g->d != 64 && g->d != 128)
    return apex__fail(APEX_ERR_UNSUPPORTED, "%s: head dim %d: the Hopper kernel takes 64 or 128", H3_BWD, g->d);
  if ((int64_t)g->batch * g->heads > 65535)
    return apex__fail(APEX_ERR_UNSUPPORTED, "%s: batch %d x heads %d above 65535 (the grid's second dimension)", H3_BWD, g->batch,
                      g->heads);
  if ((st = apex__sm90_usable(H3_BWD)) != APEX_OK) return st;
  CUtensorMap m[8];
  const void *mp[8] = {k, v, q, dout, q, dout, k, v};
  const int64_t ml[8] = {g->ld_k, g->ld_v, g->ld_q, g->ld_do, g->ld_q, g->ld_do, g->ld_k, g->ld_v};
  const int mr[8] = {BK, BK, BT, BT, BK, BK, BT, BT};
  const char *mn[8] = {"k", "v", "q", "dout", "q", "dout", "k", "v"};
  for (int i = 0; i < 8; i++)
    if ((st = apex__sm90_map(&m[i], mp[i], ml[i], g, mr[i], H3_BWD, mn[i])) != APEX_OK) return st;
  BwdParams p = {};
  p.o = (const uint16_t *)o;
  p.dout = (const uint16_t *)dout;
  p.stats = stats;
  p.dq = (uint16_t *)dq;
  p.dk = (uint16_t *)dk;
  p.dv = (uint16_t *)dv;
  p.ld_o = g->ld_o;
  p.ld_do = g->ld_do;
  p.ld_dq = g->ld_dq;
  p.ld_dk = g->ld_dk;
  p.ld_dv = g->ld_dv;
  p.t = g->t;
  p.tpad = (g->t + BK - 1) / BK * BK; /* whole dQ blocks: their rows' aux, and whole query tiles, exist */
  p.heads = g->heads;
  p.scale = 1.0f / sqrtf((float)g->d);
  p.sl2 = p.scale * LOG2E;
  const int bh = g->batch * g->heads;
  void *aux = NULL;
  if ((st = apex__cuda_alloc((size_t)bh * (size_t)p.tpad * 16, 0, &aux)) != APEX_OK) return st;
  p.aux = (float *)aux;
  const bool bf = g->dtype == APEX_BF16;
  if (g->d == 64) st = bf ? launch<64, true>(m, p, bh) : launch<64, false>(m, p, bh);
  else st = bf ? launch<128, true>(m, p, bh) : launch<128, false>(m, p, bh);
  apex__cuda_free(aux); /* the stream orders its reuse after the kernels queued above */
  return st;
}
