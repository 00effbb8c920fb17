/* flash_attention.cu: fused causal attention (FlashAttention-2's scheme) on f16/bf16 heads read in place,
 * forward and backward, with no [T, T] matrix in memory (cuda_internal.h, apex__cuda_flash).
 *
 * Element (b, h, i, j) of q sits at q + (b * t + i) * ld_q + h * d + j (the packed qkv of GPT: ld = 3C).
 * Per head, with scale = 1 / sqrt(d), S = scale q k^T masked to j <= i:
 *   forward:  a block of 64 query rows (4 warps, 16 rows each) walks the key blocks 0..its diagonal; each
 *             warp keeps its rows' running max m and sum l (online softmax) and its O in registers, so
 *             that P exists only as a register tile; stats per row = (m, r = 1 / l), O = (sum_j p_j v_j) r;
 *   backward: D_i = rowsum(dO o O) first (one warp a row); then one kernel per 64-key block walks the
 *             query blocks from its diagonal on, recomputes P^T = exp(S^T - m) r and accumulates
 *             dV = P^T dO and dK = scale dS^T q with dS = P o (dP - D), dP = dO v^T; a second kernel per
 *             64-query block walks the key blocks up to its diagonal and accumulates dQ = scale dS k.
 *             Each output row is summed by one warp in a fixed order: no atomics, the same inputs give the
 *             same bits. dQ's pass recomputes S and dP (7 products instead of FlashAttention-2's 5 with
 *             atomic dQ): the price of determinism.
 * The products are tensor-core mma.sync m16n8k16 (f16 or bf16 operands, f32 accumulation); an f32
 * accumulator tile of S (16 x 8, its C fragment) is, after the softmax, exactly the A fragment of the next
 * product, so P and dS go from one product to the next in registers, rounded once to the operand dtype
 * (as the materialised path in attention.cu rounds them). The softmax runs in the log2 domain: x = s *
 * scale * log2(e), p = 2^(x - m2), and the stored m is m2 / log2(e). K/V (forward) tiles are loaded with
 * cp.async, double-buffered; rows past t are zero-filled and masked, so any t >= 1 works.
 *
 * Fragment loads: each warp reads its operand fragments from shared memory with ldmatrix (.trans for the
 * transposed operand of P V, dS k, P^T dO, dS^T q), four 8 x 8 matrices an instruction. On an H200 (the run of
 * f4316f8) that made the forward and backward 1.20x as fast as 32-bit shared loads at T 1024 (0.449 against
 * 0.538 ms, B 8, H 12, d 64, bf16) and 1.21x at T 2048, with the same bits (the fragments hold the same
 * elements; test_flash_attention compared the two ways bit for bit there), so the 32-bit loads went.
 *
 * Covered: f16 and bf16, d = 64 or 128, every ld a multiple of 8 elements and every base 16-byte aligned
 * (16-byte loads), batch * heads <= 65535. Anything else is APEX_ERR_UNSUPPORTED with a message, and the
 * caller takes the materialised path. */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

extern "C" {
#include "core/internal.h"
#include "backend/cuda/cuda_internal.h"
}
#include "backend/cuda/flash_tile.cuh"

#define FA_FWD "apex__cuda_flash_attention_fwd"
#define FA_BWD "apex__cuda_flash_attention_bwd"

namespace {

constexpr int BM = 64;     /* query rows of a block, and keys of a key block */
constexpr int THREADS = 128; /* 4 warps, 16 rows each */
constexpr int PAD = 8;     /* elements after each shared row: rows 16 bytes apart modulo 128, no bank conflicts */
constexpr float LOG2E = 1.4426950408889634f;

/* What every kernel needs; pointers of 16-bit elements. */
struct FaParams {
  const uint16_t *q, *k, *v, *o, *dout;
  uint16_t *out, *dq, *dk, *dv;
  float *stats;       /* forward: written */
  const float *cstats; /* backward: read */
  float *dvec;        /* backward: D_i per row, [batch * heads * t] */
  int64_t ld_q, ld_k, ld_v, ld_o, ld_do, ld_dq, ld_dk, ld_dv;
  int t, heads;
  float scale, sl2; /* 1 / sqrt(d), and scale * log2(e) */
};

/* ---- device helpers -------------------------------------------------------------------------------------- */

template <bool BF>
__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  if (BF)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool full) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  const int n = full ? 16 : 0; /* 0: nothing read, the 16 bytes zero-filled */
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

/* Rows r0 .. r0 + BM of a head matrix (row i at g + i * ld, D elements) into shared [BM][D + PAD], rows
 * at or past t zero-filled; queued with cp.async (the caller commits and waits). */
template <int D>
__device__ __forceinline__ void load_tile(uint16_t *s, const uint16_t *g, int64_t ld, int r0, int t) {
  constexpr int CH = D / 8, LDS = D + PAD;
  for (int c = threadIdx.x; c < BM * CH; c += THREADS) {
    const int r = c / CH, col = (c % CH) * 8;
    const bool in = r0 + r < t;
    cp_async16(s + r * LDS + col, g + (in ? (int64_t)(r0 + r) * ld + col : 0), in);
  }
}

/* ldmatrix: four 8 x 8 matrices of 16-bit elements from shared memory; lanes 8 i .. 8 i + 7 give the
 * addresses of matrix i's rows (16-byte aligned), and register i of lane l receives matrix i's elements
 * (l / 4, 2 (l % 4)) and (l / 4, 2 (l % 4) + 1), the mma fragment layout; .trans gives (2 (l % 4), l / 4) and
 * (2 (l % 4) + 1, l / 4): a column pair of the transposed operand. */
template <bool TRANS>
__device__ __forceinline__ void ldsm4(uint32_t r[4], const uint16_t *p) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(p);
  if (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}

/* The A fragment (16 x 16, rows row0.., columns col0..) of a row-major shared tile. With ldmatrix, lane l
 * points at row l % 16, column half l / 16: matrices (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15)
 * are a[0..3]. */
template <int LDS>
__device__ __forceinline__ void frag_a(uint32_t a[4], const uint16_t *s, int row0, int col0, int g, int tq) {
  const int lane = g * 4 + tq;
  ldsm4<false>(a, s + (row0 + (lane & 15)) * LDS + col0 + (lane >> 4) * 8);
}

/* The A fragment of a 16 x 16 f32 C-tile pair (columns 0..7 in c0, 8..15 in c1), rounded to the dtype. */
template <bool BF>
__device__ __forceinline__ void c_to_a(uint32_t a[4], const float c0[4], const float c1[4]) {
  a[0] = pack2<BF>(c0[0], c0[1]);
  a[1] = pack2<BF>(c0[2], c0[3]);
  a[2] = pack2<BF>(c1[0], c1[1]);
  a[3] = pack2<BF>(c1[2], c1[3]);
}

/* acc[n] (16 x 8 tiles, n over N / 8) += A (16 x KD, rows of the warp in shared sa) times B^T where B is
 * the shared tile sb [N rows][KD] (row-major): the "q k^T" shape. */
template <bool BF, int KD, int N, int LDS>
__device__ __forceinline__ void mma_abt(float acc[][4], const uint16_t *sa, int arow0, const uint16_t *sb, int g, int tq) {
  const int lane = g * 4 + tq;
#pragma unroll
  for (int kc = 0; kc < KD / 16; kc++) {
    uint32_t a[4];
    frag_a<LDS>(a, sa, arow0, kc * 16, g, tq);
    /* two n tiles an instruction: matrices (rows n 8.., k 0-7), (n 8.., k 8-15), ((n + 1) 8.., 0-7), ((n + 1) 8.., 8-15)
     * are b0, b1 of tile n and b0, b1 of tile n + 1; lane l points at row (l % 8) + 8 (l / 16), k half (l / 8) % 2 */
#pragma unroll
    for (int n = 0; n < N / 8; n += 2) {
      uint32_t b[4];
      ldsm4<false>(b, sb + (n * 8 + (lane & 7) + (lane >> 4) * 8) * LDS + kc * 16 + ((lane >> 3) & 1) * 8);
      mma16816<BF>(acc[n], a, b[0], b[1]);
      mma16816<BF>(acc[n + 1], a, b[2], b[3]);
    }
  }
}

/* acc[n] (16 x 8 tiles over D) += P (16 x BM, as f32 C tiles pc[BM / 8], rounded here) times the shared
 * tile sb [BM rows][D]: the "p v" shape. */
template <bool BF, int D, int LDS>
__device__ __forceinline__ void mma_pb(float acc[][4], float pc[][4], const uint16_t *sb, int g, int tq) {
  const int lane = g * 4 + tq;
#pragma unroll
  for (int kc = 0; kc < BM / 16; kc++) {
    uint32_t a[4];
    c_to_a<BF>(a, pc[2 * kc], pc[2 * kc + 1]);
    /* transposed, two n tiles an instruction: matrices (rows k 0-7, columns n 8..), (k 8-15, n 8..), (k 0-7,
     * (n + 1) 8..), (k 8-15, (n + 1) 8..) are b0, b1 of tile n and of tile n + 1; lane l points at row
     * (l % 8) + 8 ((l / 8) % 2), column block l / 16 */
#pragma unroll
    for (int n = 0; n < D / 8; n += 2) {
      uint32_t b[4];
      ldsm4<true>(b, sb + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDS + n * 8 + (lane >> 4) * 8);
      mma16816<BF>(acc[n], a, b[0], b[1]);
      mma16816<BF>(acc[n + 1], a, b[2], b[3]);
    }
  }
}

/* ---- forward ---------------------------------------------------------------------------------------------- */

/* Grid (query blocks, batch * heads); the blocks with the most keys (the last query blocks) first. Shared:
 * Q [BM][LDS], then K and V, two buffers each. */
template <int D, bool BF>
__global__ void __launch_bounds__(THREADS) flash_fwd(FaParams P) {
  constexpr int LDS = D + PAD, TILE = BM * LDS;
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t *qs = smem, *ks = smem + TILE, *vs = smem + 3 * TILE; /* ks[buf * TILE], vs[buf * TILE] */
  const int t = P.t, bh = blockIdx.y, b = bh / P.heads, h = bh % P.heads;
  const int nqb = (t + BM - 1) / BM, qb = nqb - 1 - (int)blockIdx.x, q0 = qb * BM;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const uint16_t *qg = P.q + (int64_t)b * t * P.ld_q + (int64_t)h * D;
  const uint16_t *kg = P.k + (int64_t)b * t * P.ld_k + (int64_t)h * D;
  const uint16_t *vg = P.v + (int64_t)b * t * P.ld_v + (int64_t)h * D;

  load_tile<D>(qs, qg, P.ld_q, q0, t);
  load_tile<D>(ks, kg, P.ld_k, 0, t);
  load_tile<D>(vs, vg, P.ld_v, 0, t);
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();

  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f; /* rows g and g + 8 of the warp, log2 domain */
  const int i0 = q0 + warp * 16 + g, i1 = i0 + 8;

  for (int kb = 0; kb <= qb; kb++) {
    const int buf = kb & 1;
    if (kb < qb) { /* the next key block into the other buffer, read by nobody since the last barrier */
      load_tile<D>(ks + (buf ^ 1) * TILE, kg, P.ld_k, (kb + 1) * BM, t);
      load_tile<D>(vs + (buf ^ 1) * TILE, vg, P.ld_v, (kb + 1) * BM, t);
      cp_async_commit();
    }
    const uint16_t *kt = ks + buf * TILE, *vt = vs + buf * TILE;
    float s[BM / 8][4];
#pragma unroll
    for (int n = 0; n < BM / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    mma_abt<BF, D, BM, LDS>(s, qs, warp * 16, kt, g, tq);
    /* to the log2 domain, masked above the diagonal (only the diagonal block has such keys; keys past t
     * are past every row's diagonal); every row has key k0 <= i unmasked in each block it visits, so the
     * maxima are finite */
    online_softmax_tile(s, o, m0, m1, l0, l1, kb * BM, i0, i1, tq, P.sl2);
    mma_pb<BF, D, LDS>(o, s, vt, g, tq);
    cp_async_wait_all();
    __syncthreads();
  }
  l0 = quad_sum(l0);
  l1 = quad_sum(l1);
  const float r0 = 1.0f / l0, r1 = 1.0f / l1;
  store_rows<BF, D>(P.out + (int64_t)b * t * P.ld_o + (int64_t)h * D, P.ld_o, i0, t, o, r0, r1, tq);
  if (tq == 0) store_stats(P.stats + ((int64_t)bh * t) * 2, t, i0, i1, m0, m1, r0, r1);
}

/* ---- backward ----------------------------------------------------------------------------------------------- */

/* dvec[bh * t + i] = sum_c dO[i, c] O[i, c] (f32 from the dtype's values): a warp per row, lanes over the
 * channels, then a butterfly (a fixed order). */
template <int D, bool BF>
__global__ void flash_bwd_dot(FaParams P, int64_t rows) {
  const int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (r >= rows) return; /* the whole warp leaves together: r is the same for its 32 lanes */
  const int lane = threadIdx.x & 31, t = P.t;
  const int64_t i = r % t, bh = r / t, b = bh / P.heads, h = bh % P.heads;
  const uint16_t *og = P.o + (b * t + i) * P.ld_o + h * D, *dg = P.dout + (b * t + i) * P.ld_do + h * D;
  const float acc = row_dot<D, BF>(og, dg, lane);
  if (lane == 0) P.dvec[r] = acc;
}

/* dK and dV of one 64-key block (grid (key blocks, batch * heads)); warp w owns keys k0 + 16 w ... Shared:
 * K, V, Q, dO tiles and the 64 query rows' m * log2(e), r and D. */
template <int D, bool BF>
__global__ void __launch_bounds__(THREADS) flash_bwd_dkdv(FaParams P) {
  constexpr int LDS = D + PAD, TILE = BM * LDS;
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t *ks = smem, *vs = smem + TILE, *qs = smem + 2 * TILE, *dos = smem + 3 * TILE;
  float *sm_m = (float *)(smem + 4 * TILE), *sm_r = sm_m + BM, *sm_d = sm_r + BM;
  const int t = P.t, bh = blockIdx.y, b = bh / P.heads, h = bh % P.heads;
  const int nb = (t + BM - 1) / BM, kb = blockIdx.x, k0 = kb * BM; /* the first key blocks have the most queries */
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const uint16_t *qg = P.q + (int64_t)b * t * P.ld_q + (int64_t)h * D;
  const uint16_t *dog = P.dout + (int64_t)b * t * P.ld_do + (int64_t)h * D;
  const float *stg = P.cstats + (int64_t)bh * t * 2, *dvg = P.dvec + (int64_t)bh * t;
  load_tile<D>(ks, P.k + (int64_t)b * t * P.ld_k + (int64_t)h * D, P.ld_k, k0, t);
  load_tile<D>(vs, P.v + (int64_t)b * t * P.ld_v + (int64_t)h * D, P.ld_v, k0, t);
  cp_async_commit();

  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; n++) {
    dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = 0.0f;
    dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.0f;
  }
  const int j0 = k0 + warp * 16 + g, j1 = j0 + 8; /* this thread's two keys */

  for (int qb = kb; qb < nb; qb++) {
    const int q0 = qb * BM;
    if (qb > kb) __syncthreads(); /* every warp is done with the previous Q, dO and stats */
    load_tile<D>(qs, qg, P.ld_q, q0, t);
    load_tile<D>(dos, dog, P.ld_do, q0, t);
    cp_async_commit();
    if (threadIdx.x < BM) {
      const int i = q0 + threadIdx.x;
      const bool in = i < t;
      sm_m[threadIdx.x] = in ? stg[2 * (int64_t)i] * LOG2E : 0.0f;
      sm_r[threadIdx.x] = in ? stg[2 * (int64_t)i + 1] : 0.0f;
      sm_d[threadIdx.x] = in ? dvg[i] : 0.0f;
    }
    cp_async_wait_all();
    __syncthreads();

    /* P^T (16 keys x 64 queries): S^T = K_w Q^T, then p = 2^(x - m2) r where query i >= key j and i < t */
    float p[BM / 8][4];
#pragma unroll
    for (int n = 0; n < BM / 8; n++) p[n][0] = p[n][1] = p[n][2] = p[n][3] = 0.0f;
    mma_abt<BF, D, BM, LDS>(p, ks, warp * 16, qs, g, tq);
#pragma unroll
    for (int n = 0; n < BM / 8; n++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int il = n * 8 + 2 * tq + (e & 1), i = q0 + il, j = e < 2 ? j0 : j1;
        p[n][e] = (i >= j && i < t) ? exp2f(__fmaf_rn(p[n][e], P.sl2, -sm_m[il])) * sm_r[il] : 0.0f;
      }
    }
    /* dV += P^T dO */
    mma_pb<BF, D, LDS>(dv, p, dos, g, tq);
    /* dP^T = V_w dO^T, then dS^T = P^T o (dP^T - D_i), in place */
    float ds[BM / 8][4];
#pragma unroll
    for (int n = 0; n < BM / 8; n++) ds[n][0] = ds[n][1] = ds[n][2] = ds[n][3] = 0.0f;
    mma_abt<BF, D, BM, LDS>(ds, vs, warp * 16, dos, g, tq);
#pragma unroll
    for (int n = 0; n < BM / 8; n++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int il = n * 8 + 2 * tq + (e & 1);
        ds[n][e] = p[n][e] * (ds[n][e] - sm_d[il]);
      }
    }
    /* dK += dS^T Q (the scale at the end) */
    mma_pb<BF, D, LDS>(dk, ds, qs, g, tq);
  }
  const int row0 = k0 + warp * 16;
  store_rows<BF, D>(P.dk + (int64_t)b * t * P.ld_dk + (int64_t)h * D, P.ld_dk, row0 + g, t, dk, P.scale, P.scale, tq);
  store_rows<BF, D>(P.dv + (int64_t)b * t * P.ld_dv + (int64_t)h * D, P.ld_dv, row0 + g, t, dv, 1.0f, 1.0f, tq);
}

/* dQ of one 64-query block (grid (query blocks, batch * heads), the last, longest, first); warp w owns
 * rows q0 + 16 w ... Shared: Q, dO, then K and V tiles. */
template <int D, bool BF>
__global__ void __launch_bounds__(THREADS) flash_bwd_dq(FaParams P) {
  constexpr int LDS = D + PAD, TILE = BM * LDS;
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t *qs = smem, *dos = smem + TILE, *ks = smem + 2 * TILE, *vs = smem + 3 * TILE;
  const int t = P.t, bh = blockIdx.y, b = bh / P.heads, h = bh % P.heads;
  const int nqb = (t + BM - 1) / BM, qb = nqb - 1 - (int)blockIdx.x, q0 = qb * BM;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const uint16_t *kg = P.k + (int64_t)b * t * P.ld_k + (int64_t)h * D;
  const uint16_t *vg = P.v + (int64_t)b * t * P.ld_v + (int64_t)h * D;
  load_tile<D>(qs, P.q + (int64_t)b * t * P.ld_q + (int64_t)h * D, P.ld_q, q0, t);
  load_tile<D>(dos, P.dout + (int64_t)b * t * P.ld_do + (int64_t)h * D, P.ld_do, q0, t);
  cp_async_commit();
  const int i0 = q0 + warp * 16 + g, i1 = i0 + 8;
  const float *stg = P.cstats + (int64_t)bh * t * 2, *dvg = P.dvec + (int64_t)bh * t;
  /* rows past t: m = r = D = 0 with a zero Q row give p = 0 */
  const float mm0 = i0 < t ? stg[2 * (int64_t)i0] * LOG2E : 0.0f, rr0 = i0 < t ? stg[2 * (int64_t)i0 + 1] : 0.0f;
  const float mm1 = i1 < t ? stg[2 * (int64_t)i1] * LOG2E : 0.0f, rr1 = i1 < t ? stg[2 * (int64_t)i1 + 1] : 0.0f;
  const float dd0 = i0 < t ? dvg[i0] : 0.0f, dd1 = i1 < t ? dvg[i1] : 0.0f;

  float dq[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
  for (int kb = 0; kb <= qb; kb++) {
    const int k0 = kb * BM;
    if (kb > 0) __syncthreads(); /* every warp is done with the previous K and V */
    load_tile<D>(ks, kg, P.ld_k, k0, t);
    load_tile<D>(vs, vg, P.ld_v, k0, t);
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();
    float p[BM / 8][4], ds[BM / 8][4];
#pragma unroll
    for (int n = 0; n < BM / 8; n++) {
      p[n][0] = p[n][1] = p[n][2] = p[n][3] = 0.0f;
      ds[n][0] = ds[n][1] = ds[n][2] = ds[n][3] = 0.0f;
    }
    mma_abt<BF, D, BM, LDS>(p, qs, warp * 16, ks, g, tq);
    mma_abt<BF, D, BM, LDS>(ds, dos, warp * 16, vs, g, tq);
#pragma unroll
    for (int n = 0; n < BM / 8; n++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int j = k0 + n * 8 + 2 * tq + (e & 1), i = e < 2 ? i0 : i1;
        const float pe = j <= i ? exp2f(__fmaf_rn(p[n][e], P.sl2, -(e < 2 ? mm0 : mm1))) * (e < 2 ? rr0 : rr1) : 0.0f;
        ds[n][e] = pe * (ds[n][e] - (e < 2 ? dd0 : dd1));
      }
    }
    mma_pb<BF, D, LDS>(dq, ds, ks, g, tq);
  }
  store_rows<BF, D>(P.dq + (int64_t)b * t * P.ld_dq + (int64_t)h * D, P.ld_dq, i0, t, dq, P.scale, P.scale, tq);
}

/* ---- launches ----------------------------------------------------------------------------------------------- */

/* Sets a kernel's dynamic shared memory limit to bytes (above 48 KiB needs it), once per kernel. */
template <typename K>
static apex_status smem_limit(K kernel, int bytes, int *done, const char *fn) {
  if (*done >= bytes) return APEX_OK;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) return apex__fail(APEX_ERR_DEVICE, "%s: shared memory of %d bytes: %s", fn, bytes, cudaGetErrorString(e));
  *done = bytes;
  return APEX_OK;
}

template <int D> constexpr int tile_bytes() { return BM * (D + PAD) * 2; }

template <int D, bool BF>
static apex_status fwd(const FaParams &p, int batch_heads) {
  static int limit = 0;
  const int bytes = 5 * tile_bytes<D>();
  apex_status st = smem_limit(flash_fwd<D, BF>, bytes, &limit, FA_FWD);
  if (st != APEX_OK) return st;
  dim3 grid((unsigned)((p.t + BM - 1) / BM), (unsigned)batch_heads);
  flash_fwd<D, BF><<<grid, THREADS, bytes, (cudaStream_t)apex__cuda_stream()>>>(p);
  return apex__cuda_check_launch(FA_FWD);
}

template <int D, bool BF>
static apex_status bwd(const FaParams &p, int batch_heads) {
  static int limit_kv = 0, limit_q = 0;
  const int bytes_kv = 4 * tile_bytes<D>() + 3 * BM * (int)sizeof(float), bytes_q = 4 * tile_bytes<D>();
  apex_status st = smem_limit(flash_bwd_dkdv<D, BF>, bytes_kv, &limit_kv, FA_BWD);
  if (st == APEX_OK) st = smem_limit(flash_bwd_dq<D, BF>, bytes_q, &limit_q, FA_BWD);
  if (st != APEX_OK) return st;
  cudaStream_t s = (cudaStream_t)apex__cuda_stream();
  const int64_t rows = (int64_t)batch_heads * p.t;
  flash_bwd_dot<D, BF><<<(unsigned)((rows + 7) / 8), 256, 0, s>>>(p, rows);
  if ((st = apex__cuda_check_launch(FA_BWD)) != APEX_OK) return st;
  dim3 grid((unsigned)((p.t + BM - 1) / BM), (unsigned)batch_heads);
  flash_bwd_dkdv<D, BF><<<grid, THREADS, bytes_kv, s>>>(p);
  if ((st = apex__cuda_check_launch(FA_BWD)) != APEX_OK) return st;
  flash_bwd_dq<D, BF><<<grid, THREADS, bytes_q, s>>>(p);
  return apex__cuda_check_launch(FA_BWD);
}

/* Whether the geometry is covered; APEX_ERR_UNSUPPORTED with the reason if not, APEX_ERR_INVALID_ARG for a
 * geometry that is wrong on every path. ptrs/lds: the operands (NULL-free) and their row strides. */
static apex_status check(const char *fn, const apex__cuda_flash *g, const void *const *ptrs, const int64_t *lds, int n) {
  apex_status st = apex__cuda_attn_operands_check(fn, "the fused kernel", g, ptrs, lds, n);
  if (st != APEX_OK) return st;
  if (g->d != 64 && g->d != 128)
    return apex__fail(APEX_ERR_UNSUPPORTED, "%s: head dim %d: the fused kernel takes 64 or 128", fn, g->d);
  if ((int64_t)g->batch * g->heads > 65535)
    return apex__fail(APEX_ERR_UNSUPPORTED, "%s: batch %d x heads %d above 65535 (the grid's second dimension)", fn,
                      g->batch, g->heads);
  return APEX_OK;
}

static apex_status fwd_of(const FaParams &p, int bh, int d, bool bf) {
  if (d == 64) return bf ? fwd<64, true>(p, bh) : fwd<64, false>(p, bh);
  return bf ? fwd<128, true>(p, bh) : fwd<128, false>(p, bh);
}

static apex_status bwd_of(const FaParams &p, int bh, int d, bool bf) {
  if (d == 64) return bf ? bwd<64, true>(p, bh) : bwd<64, false>(p, bh);
  return bf ? bwd<128, true>(p, bh) : bwd<128, false>(p, bh);
}

static FaParams params_of(const apex__cuda_flash *g) {
  FaParams p = {};
  p.ld_q = g->ld_q;
  p.ld_k = g->ld_k;
  p.ld_v = g->ld_v;
  p.ld_o = g->ld_o;
  p.ld_do = g->ld_do;
  p.ld_dq = g->ld_dq;
  p.ld_dk = g->ld_dk;
  p.ld_dv = g->ld_dv;
  p.t = g->t;
  p.heads = g->heads;
  p.scale = 1.0f / sqrtf((float)g->d);
  p.sl2 = p.scale * LOG2E;
  return p;
}

} /* namespace */

extern "C" apex_status apex__cuda_attn_operands_check(const char *fn, const char *who, const apex__cuda_flash *g,
                                                      const void *const *ptrs, const int64_t *lds, int n) {
  if (!g) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL geometry", fn);
  if (g->batch < 1 || g->heads < 1 || g->t < 1 || g->d < 1)
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: batch %d, heads %d, t %d, d %d: each must be >= 1", fn, g->batch, g->heads,
                      g->t, g->d);
  if (g->dtype != APEX_F16 && g->dtype != APEX_BF16)
    return apex__fail(APEX_ERR_UNSUPPORTED, "%s: dtype %s: %s takes f16 or bf16", fn, apex_dtype_name(g->dtype), who);
  for (int i = 0; i < n; i++) {
    if (!ptrs[i]) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL operand %d", fn, i);
    if (lds[i] < (int64_t)g->heads * g->d)
      return apex__fail(APEX_ERR_INVALID_ARG, "%s: operand %d: row stride %lld below heads x d = %lld", fn, i,
                        (long long)lds[i], (long long)g->heads * g->d);
    if (lds[i] % 8 != 0 || ((uintptr_t)ptrs[i] & 15u) != 0)
      return apex__fail(APEX_ERR_UNSUPPORTED, "%s: operand %d: row stride %lld or base not 16-byte aligned", fn, i,
                        (long long)lds[i]);
  }
  return APEX_OK;
}

extern "C" apex_status apex__cuda_flash_attention_fwd(const apex__cuda_flash *g, const void *q, const void *k, const void *v,
                                                      void *o, float *stats) {
  const void *ptrs[] = {q, k, v, o};
  if (!g) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL geometry", FA_FWD);
  const int64_t lds[] = {g->ld_q, g->ld_k, g->ld_v, g->ld_o};
  apex_status st = check(FA_FWD, g, ptrs, lds, 4);
  if (st != APEX_OK) return st;
  if (!stats) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL stats", FA_FWD);
  FaParams p = params_of(g);
  p.q = (const uint16_t *)q;
  p.k = (const uint16_t *)k;
  p.v = (const uint16_t *)v;
  p.out = (uint16_t *)o;
  p.stats = stats;
  const int bh = g->batch * g->heads;
  const bool bf = g->dtype == APEX_BF16;
  return fwd_of(p, bh, g->d, bf);
}

extern "C" apex_status apex__cuda_flash_attention_bwd(const apex__cuda_flash *g, const void *q, const void *k, const void *v,
                                                      const void *o, const void *dout, const float *stats, void *dq,
                                                      void *dk, void *dv) {
  const void *ptrs[] = {q, k, v, o, dout, dq, dk, dv};
  if (!g) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL geometry", FA_BWD);
  const int64_t lds[] = {g->ld_q, g->ld_k, g->ld_v, g->ld_o, g->ld_do, g->ld_dq, g->ld_dk, g->ld_dv};
  apex_status st = check(FA_BWD, g, ptrs, lds, 8);
  if (st != APEX_OK) return st;
  if (!stats) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL stats", FA_BWD);
  FaParams p = params_of(g);
  p.q = (const uint16_t *)q;
  p.k = (const uint16_t *)k;
  p.v = (const uint16_t *)v;
  p.o = (const uint16_t *)o;
  p.dout = (const uint16_t *)dout;
  p.dq = (uint16_t *)dq;
  p.dk = (uint16_t *)dk;
  p.dv = (uint16_t *)dv;
  p.cstats = stats;
  const int bh = g->batch * g->heads;
  void *dvec = NULL;
  if ((st = apex__cuda_alloc((size_t)bh * (size_t)g->t * sizeof(float), 0, &dvec)) != APEX_OK) return st;
  p.dvec = (float *)dvec;
  const bool bf = g->dtype == APEX_BF16;
  st = bwd_of(p, bh, g->d, bf);
  apex__cuda_free(dvec); /* the stream orders its reuse after the kernels queued above */
  return st;
}
