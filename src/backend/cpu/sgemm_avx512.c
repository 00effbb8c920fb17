/* sgemm_avx512.c: apex's own single-threaded f32 matrix product for CPUs with AVX-512, used by
 * gemm.c in place of OpenBLAS's sgemm when the CPU has it (apex__sgemm_avx512_ok).
 *
 * Why: the OpenBLAS that Debian ships picks its kernels at run time, and this project's machines pin
 * it to the Haswell (AVX2) ones through OPENBLAS_CORETYPE, which apex respects. On their AVX-512 CPU
 * (Zen 5, full-width 512-bit FMA) that leaves half the multiply-add rate unused. This kernel is not
 * governed by that setting. bench_gemm's gemm_f32_* lines (peer openblas-tiles) show why it stays:
 * 1.2x to 1.9x OpenBLAS on every f32 product of the four models but the [., 10] and [., 9] ones
 * (0.6x there, microseconds a call). oneDNN's f32 matmul beat it on most of the linear products
 * (peer onednn-f32-tiles), so on AVX512_BF16 CPUs apex__gemm runs those on oneDNN (gemm_onednn.c);
 * this kernel keeps the per-image conv and per-head attention products and AVX-512 CPUs without
 * bf16.
 *
 * The usual blocked scheme: C is cut into NC-column blocks; K into KC-deep slices; for each slice
 * op(B) (KC x NC) is packed into NR-column strips and op(A) (MC x KC) into MR-row strips, zero-padded
 * at the edges, and an 8 x 32 register tile (16 zmm accumulators) runs over the slice. Every element
 * of C is summed in one fixed order: within a slice in increasing k, slices added to C in increasing
 * k. That order depends on nothing but KC, so the bits are the same whatever the shape of the call's
 * caller tile grid (gemm.c) or the thread count.
 * C = alpha * op(A) op(B) + beta * C; beta == 0 never reads C (it may hold garbage, see apex__gbuf_w). */
#include <stddef.h>
#include <string.h>

#include "backend/cpu/gemm.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_KERNEL 1
#else
#define HAVE_KERNEL 0
#endif

/* 8 rows: the conv products' 32, 64 and 288 rows fill whole strips (12 left a third of the last one
 * empty: 148 -> 162 GFLOP/s on [64, 288] x [288, 196]); 2 x 8 FMAs a step keep Zen 5's two FMA pipes
 * busy. 256 columns a B block (256 KiB): the per-image conv products pack their A once. */
enum { MR = 8, NR = 32, KC = 256, MC = 96, NC = 256 };

int apex__sgemm_avx512_ok(void) {
#if HAVE_KERNEL
  static int ok = -1;
  if (ok < 0) ok = __builtin_cpu_supports("avx512f") != 0;
  return ok;
#else
  return 0;
#endif
}

#if HAVE_KERNEL
#define AVX512 __attribute__((target("avx512f")))

/* Packing reads each operand along its contiguous direction (a row of a row-major matrix), so the
 * loop order depends on the transpose: the writes into a strip (at most 32 KiB) stay in cache. */

/* op(A) rows [i0, i0 + mc), depth [p0, p0 + kc) into MR-row strips: strip s, depth p, row r at
 * ((s * kc) + p) * MR + r; rows past mc are zeros. */
static void pack_a(const float *a, int lda, int trans, int i0, int mc, int p0, int kc, float *restrict out) {
  for (int s = 0; s * MR < mc; s++) {
    int rows = mc - s * MR < MR ? mc - s * MR : MR;
    float *o = out + (size_t)s * kc * MR;
    if (trans) { /* op(A)[i][p] = a[p][i]: a row of a holds MR consecutive i */
      for (int p = 0; p < kc; p++) {
        const float *src = a + (size_t)(p0 + p) * lda + i0 + s * MR;
        for (int r = 0; r < rows; r++) o[p * MR + r] = src[r];
        for (int r = rows; r < MR; r++) o[p * MR + r] = 0.0f;
      }
    } else { /* op(A)[i][p] = a[i][p]: walk each row along p */
      for (int r = 0; r < rows; r++) {
        const float *src = a + (size_t)(i0 + s * MR + r) * lda + p0;
        for (int p = 0; p < kc; p++) o[p * MR + r] = src[p];
      }
      for (int r = rows; r < MR; r++)
        for (int p = 0; p < kc; p++) o[p * MR + r] = 0.0f;
    }
  }
}

/* op(B) depth [p0, p0 + kc), columns [j0, j0 + nc) into NR-column strips: strip s, depth p, column c
 * at ((s * kc) + p) * NR + c; columns past nc are zeros. */
static void pack_b(const float *b, int ldb, int trans, int p0, int kc, int j0, int nc, float *restrict out) {
  for (int s = 0; s * NR < nc; s++) {
    int cols = nc - s * NR < NR ? nc - s * NR : NR;
    float *o = out + (size_t)s * kc * NR;
    if (trans) { /* op(B)[p][j] = b[j][p]: walk each row of b along p */
      for (int c = 0; c < cols; c++) {
        const float *src = b + (size_t)(j0 + s * NR + c) * ldb + p0;
        for (int p = 0; p < kc; p++) o[p * NR + c] = src[p];
      }
      for (int c = cols; c < NR; c++)
        for (int p = 0; p < kc; p++) o[p * NR + c] = 0.0f;
    } else { /* op(B)[p][j] = b[p][j]: NR consecutive j per row */
      for (int p = 0; p < kc; p++) {
        const float *src = b + (size_t)(p0 + p) * ldb + j0 + s * NR;
        if (cols == NR) {
          memcpy(o + p * NR, src, NR * sizeof(float));
          continue;
        }
        for (int c = 0; c < cols; c++) o[p * NR + c] = src[c];
        for (int c = cols; c < NR; c++) o[p * NR + c] = 0.0f;
      }
    }
  }
}

/* The register tile: acc (MR x NR, row-major) = sum over p < kc of a strip times b strip. */
AVX512 static void tile_mr_x32(int kc, const float *restrict ap, const float *restrict bp, float *restrict acc) {
  __m512 c[MR][2];
  for (int r = 0; r < MR; r++) c[r][0] = c[r][1] = _mm512_setzero_ps();
  for (int p = 0; p < kc; p++) {
    __m512 b0 = _mm512_load_ps(bp + p * NR), b1 = _mm512_load_ps(bp + p * NR + 16);
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
      __m512 a = _mm512_set1_ps(ap[p * MR + r]);
      c[r][0] = _mm512_fmadd_ps(a, b0, c[r][0]);
      c[r][1] = _mm512_fmadd_ps(a, b1, c[r][1]);
    }
  }
  for (int r = 0; r < MR; r++) {
    _mm512_store_ps(acc + r * NR, c[r][0]);
    _mm512_store_ps(acc + r * NR + 16, c[r][1]);
  }
}

/* C's rows x cols corner of a tile from acc: the first slice applies beta (0: C not read), later
 * slices add. */
static void store(float *c, int ldc, int rows, int cols, const float *acc, float alpha, float beta, int first) {
  for (int r = 0; r < rows; r++) {
    float *cr = c + (size_t)r * ldc;
    const float *ar = acc + r * NR;
    if (!first || beta == 1.0f)
      for (int j = 0; j < cols; j++) cr[j] = cr[j] + alpha * ar[j];
    else if (beta == 0.0f)
      for (int j = 0; j < cols; j++) cr[j] = alpha * ar[j];
    else
      for (int j = 0; j < cols; j++) cr[j] = beta * cr[j] + alpha * ar[j];
  }
}

AVX512 void apex__sgemm_avx512(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
                               const float *b, int ldb, float beta, float *c, int ldc) {
  /* 96 KiB of A strips and 256 KiB of B strips on the stack: no allocation per call, as products are
   * called per tile from every thread. */
  _Alignas(64) float ap[MC * KC], bp[KC * NC], acc[MR * NR];
  if (k == 0) { /* no products: C = beta * C, as sgemm */
    for (int i = 0; i < m; i++)
      for (int j = 0; j < n; j++) c[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[(size_t)i * ldc + j];
    return;
  }
  for (int j0 = 0; j0 < n; j0 += NC) {
    int nc = n - j0 < NC ? n - j0 : NC;
    for (int p0 = 0; p0 < k; p0 += KC) {
      int kc = k - p0 < KC ? k - p0 : KC;
      pack_b(b, ldb, trans_b, p0, kc, j0, nc, bp);
      for (int i0 = 0; i0 < m; i0 += MC) {
        int mc = m - i0 < MC ? m - i0 : MC;
        pack_a(a, lda, trans_a, i0, mc, p0, kc, ap);
        for (int js = 0; js * NR < nc; js++)
          for (int is = 0; is * MR < mc; is++) {
            tile_mr_x32(kc, ap + (size_t)is * kc * MR, bp + (size_t)js * kc * NR, acc);
            int rows = mc - is * MR < MR ? mc - is * MR : MR, cols = nc - js * NR < NR ? nc - js * NR : NR;
            store(c + (size_t)(i0 + is * MR) * ldc + j0 + js * NR, ldc, rows, cols, acc, alpha, beta, p0 == 0);
          }
      }
    }
  }
}
#else
void apex__sgemm_avx512(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
                        const float *b, int ldb, float beta, float *c, int ldc) {
  (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda, (void)b, (void)ldb,
      (void)beta, (void)c, (void)ldc;
}
#endif
