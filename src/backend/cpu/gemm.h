/* gemm.h: the CPU backend's matrix products (gemm.c, sgemm_avx512.c), for its kernels: f32 sgemm in a
 * tile grid fixed by the shape (so the bits do not depend on the thread count), and apex__gemm over
 * operands of any float dtype. */
#ifndef APEX_BACKEND_CPU_GEMM_H
#define APEX_BACKEND_CPU_GEMM_H

#include "apex/tensor.h"
#include "backend/args_nn.h"

/* C = alpha * op(A) op(B) + beta * C, row-major, through OpenBLAS on apex's threads, in a tile grid
 * fixed by m, n, k so that the bits do not depend on the thread count (see gemm.c). */
void apex__sgemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
                 const float *b, int ldb, float beta, float *c, int ldc);

/* For ops that run their own threads over independent products (conv2d's images): one sgemm call
 * on the calling thread, its bits fixed by its shape. apex__blas_serial() must have been called
 * first, outside the parallel region, so that OpenBLAS does not start threads of its own. */
void apex__blas_serial(void);
void apex__sgemm_call(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
                      float beta, float *c, int ldc);

/* An operand of apex__gemm as stored: row-major, ld elements between rows, any float dtype; trans
 * as for sgemm (1: the stored matrix is the transpose of the operand). */
typedef struct apex__mat {
  const void *data;
  apex_dtype dtype;
  int ld, trans;
} apex__mat;

/* sgemm_avx512.c: apex's own single-threaded f32 product C = alpha op(A) op(B) + beta C (row-major,
 * beta 0 never reads C), and whether this CPU can run it. gemm.c uses it instead of OpenBLAS when it can. */
int apex__sgemm_avx512_ok(void);
void apex__sgemm_avx512(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
                        const float *b, int ldb, float beta, float *c, int ldc);
/* For tests and benchmarks: 0 makes gemm.c use OpenBLAS even where the own kernel can run; returns
 * the previous setting (1 by default). */
int apex__gemm_set_own_kernel(int on);
/* sgemm_ref.c: the portable reference product (same contract as apex__sgemm_avx512), which gemm.c
 * runs under APEX_CPU_ISA_PORTABLE. */
void apex__sgemm_ref(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
                     const float *b, int ldb, float beta, float *c, int ldc);

/* C [m, n] (dtype ct, ldc) = alpha * op(A) [m, k] op(B) [k, n] + beta * C, for operands of any float
 * dtype, accumulated in f32, in apex__sgemm's grid. With bias (f32 [n]), C = bias + alpha * op(A)
 * op(B) instead. C that is not f32 is written, never read: beta must then be 0. Low-precision
 * operands are widened a tile's panel at a time into transient scratch, never whole, with the bits of
 * widening whole, in scratch from ws; bf16 operands on a CPU with AVX512_BF16 or AMX run through
 * oneDNN instead, in the same grid (gemm_onednn.h). APEX_ERR_OUT_OF_MEMORY when ws has none to give. */
apex_status apex__gemm(const apex_nn_workspace *ws, int m, int n, int k, float alpha, apex__mat a, apex__mat b, float beta, void *c, apex_dtype ct, int ldc,
                       const float *bias);
/* 1: apex__gemm widens whole tensors first (the reference way, for tests and benchmarks); 0: per
 * tile (the default). Returns the previous setting. Not thread-safe. */
int apex__gemm_set_whole_widening(int on);

/* The grid apex__gemm runs an [m, k] x [k, n] product in, as tiles down (*ti) and across (*tj): f32
 * products and those off oneDNN in gemm.c's grid, half products on oneDNN (half_onednn 1) in its wide
 * tiles. A function of the shape alone, so a benchmark on any CPU can count the tiles a thread gets. */
void apex__gemm_grid(int m, int n, int k, int half_onednn, int *ti, int *tj);
/* For benchmarks: fn (NULL: none, the default) is called with the shape and operand dtypes of every
 * apex__gemm product, on the calling thread, before it runs. Not thread-safe to change mid-step. */
/* For benchmarks: 0 keeps f32 products in the grid of few tiles they had before the split for many
 * threads (gemm.c's plan), to measure what that split costs or gains on a CPU; returns the previous
 * setting (1 by default). Bits follow the grid, so set it before a run, never within one. */
int apex__gemm_set_many_tiles(int on);
typedef void (*apex__gemm_observer)(int m, int n, int k, apex_dtype a, apex_dtype b);
/* The test and benchmark settings above and gemm_onednn.h's, packed in one word: a product's grid and
 * scratch are a function of its shape and these (cpu/attention.c keys the scratch it has measured by
 * them). */
long apex__gemm_settings(void);
void apex__gemm_set_observer(apex__gemm_observer fn);

#endif
