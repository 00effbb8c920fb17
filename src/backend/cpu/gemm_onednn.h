/* gemm_onednn.h: the bf16 (and, where oneDNN has it, f16) matrix products through oneDNN's matmul
 * primitive, as an optional fast path in front of gemm.c's f32 products. Internal to the CPU backend. */
#ifndef APEX_BACKEND_CPU_GEMM_ONEDNN_H
#define APEX_BACKEND_CPU_GEMM_ONEDNN_H

#include "backend/cpu/gemm.h"

/* apex__gemm's contract (ag.h), run on oneDNN in a tile grid fixed by the product's shape (gemm.c's
 * tiles of tm x tn for f32 operands; for half operands, apex__onednn_half_grid's: tiles as wide as the
 * product up to 4096 columns, 16 row tiles of 32 rows or more, then columns halved towards 64 tiles): each tile is one
 * single-threaded oneDNN matmul over all of K on the thread OpenMP's static schedule gives it, so
 * the bits do not depend on the thread count. The operands go
 * in as bf16 (an f32 operand beside a bf16 one is rounded to bf16, to nearest even, a panel at a
 * time) or both as f16; the products accumulate in f32. APEX_ERR_UNSUPPORTED, with nothing written
 * and no message, whenever this path does not run: oneDNN absent from the build, a maximum ISA
 * (apex/cpu.h) below AVX512_BF16, operands of other dtypes, or a shape oneDNN has no primitive for;
 * the caller then takes its own path. APEX_ERR_OUT_OF_MEMORY when ws has no scratch to give. */
apex_status apex__gemm_onednn(const apex_nn_workspace *ws, int m, int n, int k, float alpha, apex__mat a, apex__mat b, float beta, void *c,
                              apex_dtype ct, int ldc, const float *bias, int tm, int tn);

/* 1 when apex__gemm_onednn runs bf16 products now (built with oneDNN, and the maximum ISA in effect
 * is AVX512_BF16 or above); else 0, with *why (when why is not NULL) saying which is missing. */
int apex__onednn_active(const char **why);

/* The oneDNN CPU engine every apex primitive runs on (created once, after oneDNN's ISA cap follows
 * apex's; see gemm_onednn.c), as a dnnl_engine_t; NULL when this build has no oneDNN or the engine
 * could not be created. conv_onednn.c builds its own primitives on it. */
void *apex__onednn_engine(void);

#if APEX_HAVE_DNNL
#include <dnnl.h>
/* A matmul primitive for md on apex__onednn_engine(), as every apex product uses them: run on one
 * thread (created with OpenMP's thread count at 1, since oneDNN plans its split over the threads it
 * sees at creation), a user-managed scratchpad whose size goes to *scratch, and, when sum is set, a
 * sum post-op (C += op(A) op(B)). NULL when oneDNN has no primitive for it, or only its reference
 * implementation (plain loops, slower than apex's own f32 path). */
dnnl_primitive_t apex__onednn_matmul(const dnnl_matmul_desc_t *md, int sum, size_t *scratch);
#endif

/* For tests and benchmarks: 0 turns the oneDNN path off (gemm.c's f32 products run instead); returns
 * the previous setting (1 by default). Not thread-safe. */
int apex__onednn_set_enabled(int on);

/* Which products with both operands f32 apex__gemm_onednn takes (oneDNN's f32 matmul, per tile as
 * for bf16, so as deterministic): none, all (the default: oneDNN measured faster than apex's AVX-512
 * kernel on most of the models' products, bench_gemm's gemm_f32_* lines), or only those whose op(B)
 * is transposed (x w^T, where it was faster on each). */
enum { APEX__ONEDNN_F32_NONE, APEX__ONEDNN_F32_ALL, APEX__ONEDNN_F32_TRANS_B };
/* For tests and benchmarks: sets that choice; returns the previous one. Not thread-safe. */
int apex__onednn_set_f32(int mode);
/* The number of products apex__gemm_onednn has run since the process started (tests use it to
 * confirm which path ran). */
unsigned long apex__onednn_products(void);
/* The tiles of a half product on oneDNN from gemm.c's grid tm x tn (clamped to m x n): as wide as the
 * product up to a limit, rows halved to 16 row tiles, then columns halved towards 64 tiles while a tile
 * keeps enough work (see gemm_onednn.c). A function of the shape alone; benchmarks call it to count
 * tiles without a bf16 CPU. */
void apex__onednn_half_grid(int m, int n, int k, int *tm, int *tn);
/* For benchmarks: half products' rows are halved (to 32 at least) until there are n row tiles, not
 * the default 16 (n < 1: the default). Still a function of the shape; returns the previous count. Not
 * thread-safe. */
int apex__onednn_set_half_min_tiles(int n);
/* For benchmarks: 0 leaves half products' tiles as wide as the product (no column split towards 64
 * tiles); returns the previous setting (1 by default). Bits follow the grid: set it before a run. */
int apex__onednn_set_half_cols(int on);
/* The settings above in one word (for apex__gemm_settings). */
long apex__onednn_settings(void);

#endif
