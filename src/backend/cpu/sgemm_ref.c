/* sgemm_ref.c: the portable reference matrix product, which gemm.c runs when the maximum ISA
 * (apex/cpu.h) is APEX_CPU_ISA_PORTABLE.
 *
 * Why apex has one beside OpenBLAS: OpenBLAS is itself a set of SIMD kernels chosen at run time, so
 * it cannot be the reference that the AVX-512 kernel and the low-precision widening paths are checked
 * against. This one is plain C with no blocking: every element of op(A) op(B) is a double sum over
 * k in increasing order, rounded once to f32, so its only error is that rounding (alpha and beta then
 * apply in f32), and it shares no summation order with either fast kernel. It is far slower than a BLAS;
 * it exists to be obviously right. */
#include <stddef.h>

#include "backend/cpu/gemm.h"

/* Columns of C summed together: a row of op(B) is read once per block of this many accumulators. */
enum { JB = 64 };

void apex__sgemm_ref(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
                     float beta, float *c, int ldc) {
  double acc[JB];
  for (int i = 0; i < m; i++)
    for (int j0 = 0; j0 < n; j0 += JB) {
      int w = n - j0 < JB ? n - j0 : JB;
      for (int j = 0; j < w; j++) acc[j] = 0.0;
      for (int p = 0; p < k; p++) {
        double aip = trans_a ? a[(size_t)p * lda + i] : a[(size_t)i * lda + p];
        if (trans_b)
          for (int j = 0; j < w; j++) acc[j] += aip * b[(size_t)(j0 + j) * ldb + p];
        else
          for (int j = 0; j < w; j++) acc[j] += aip * b[(size_t)p * ldb + j0 + j];
      }
      /* The product is rounded to f32 before alpha and beta apply, in f32, as in the fast kernels: so
       * C += A B accumulating a gradient gives the bits of A B computed apart and added (test_amp
       * relies on it). beta 0 never reads C, which may hold garbage (apex__gbuf_w). */
      float *ci = c + (size_t)i * ldc + j0;
      for (int j = 0; j < w; j++) {
        float p = (float)acc[j];
        ci[j] = beta == 0.0f ? alpha * p : beta == 1.0f ? ci[j] + alpha * p : beta * ci[j] + alpha * p;
      }
    }
}
