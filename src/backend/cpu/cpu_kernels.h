/* cpu_kernels.h: what the CPU backend's nn kernels (cpu/<family>.c) share: when a loop runs on
 * threads, the start of a gradient output that may not be accumulated into (args_nn.h), and the f32
 * views of native-dtype buffers that the kernels compute on: whole (small tensors: weights, biases)
 * or a row at a time (activations, so that no whole-tensor f32 copy is made). */
#ifndef APEX_BACKEND_CPU_KERNELS_H
#define APEX_BACKEND_CPU_KERNELS_H

#include <omp.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "apex/dtype.h"
#include "apex/threads.h"
#include "backend/args_nn.h"
#include "core/internal.h"

/* Elementwise loops run on threads when they are big enough to pay. Each element's result does not
 * depend on the thread count. */
#define APEX__CPU_PAR_MIN 16384
#define APEX__CPU_PFOR _Pragma("omp parallel for schedule(static) if (n > APEX__CPU_PAR_MIN)")

/* A gradient buffer of n floats that a kernel adds into: one it may not accumulate into holds nothing
 * yet, so it is zeroed first (adding into zeros gives the bits of 0.0f + term, as args_nn.h asks).
 * Kernels with a store path of their own skip this pass. */
static inline void apex__cpu_grad_begin(float *g, size_t n, int accumulate) {
  if (g && !accumulate) memset(g, 0, n * sizeof *g);
}

/* b's n elements as f32: its own data when f32 (or when there is none), else a copy converted by
 * apex_convert into the workspace. NULL when the workspace had no room (it said why). */
static inline const float *apex__cpu_f32(apex_nn_buf b, size_t n, const apex_nn_workspace *ws) {
  if (!b.data || b.dtype == APEX_F32) return (const float *)b.data;
  float *f = ws->get(ws->ctx, (n ? n : 1) * sizeof *f);
  if (f) apex_convert(f, APEX_F32, b.data, b.dtype, n);
  return f;
}

/* Where a kernel computes a result of n elements of dtype dt in f32: out itself when f32, else the
 * workspace (NULL when it had no room); apex__cpu_store then rounds it into out. */
static inline float *apex__cpu_out_f32(void *out, apex_dtype dt, size_t n, const apex_nn_workspace *ws) {
  return dt == APEX_F32 ? (float *)out : (float *)ws->get(ws->ctx, (n ? n : 1) * sizeof(float));
}
static inline void apex__cpu_store(void *out, apex_dtype dt, const float *f, size_t n) {
  if (dt != APEX_F32) apex_convert(out, dt, f, APEX_F32, n);
}

/* ---- a row at a time ---------------------------------------------------------------------------
 * A kernel over rows (lines, planes) of a half-precision tensor widens each row into a buffer of its
 * thread (L1/L2-resident) and rounds its result row from one, through apex__convert_range: the SIMD
 * conversion of the CPU's ISA cap (AVX2/F16C, or the portable loop under APEX_CPU_ISA=portable),
 * which gives the portable path's bits. So a row's f32 math is the same as on a whole-tensor f32
 * copy, and its bits too, with half the memory traffic and no copy. */

/* Per-thread row buffers: `rows` buffers of n floats for each thread a parallel loop may use, or NULL
 * with *fail 0 when `needed` is 0 (every buffer f32: the kernel reads and writes in place). *fail 1
 * when the workspace had no room (it said why). Resolves the SIMD path before the threads read it. */
static inline float *apex__cpu_thread_rows(const apex_nn_workspace *ws, int needed, size_t rows, size_t n, int *fail) {
  *fail = 0;
  if (!needed) return NULL;
  apex_simd_active();
  size_t nt = (size_t)apex_get_num_threads();
  size_t total = nt * rows * n;
  float *f = ws->get(ws->ctx, (total ? total : 1) * sizeof *f);
  *fail = !f;
  return f;
}

/* This thread's k-th buffer of n floats among the `rows` per thread of apex__cpu_thread_rows. */
static inline float *apex__cpu_my_row(float *rows_base, size_t rows, size_t n, size_t k) {
  return rows_base ? rows_base + ((size_t)omp_get_thread_num() * rows + k) * n : NULL;
}

/* The running maximum of a softmax line (softmax, cross entropy, attention's scores): fmaxf's result
 * where it matters, without its library call (a seventh of cross entropy's time, 5% of attention's).
 * mx starts at -INFINITY, so a NaN x leaves it as fmaxf does; the two may differ only in the sign of a
 * zero maximum, which x - mx and mx + logf(s) (s >= 1) do not carry into any result. */
static inline float apex__cpu_line_max(float mx, float x) { return x > mx ? x : mx; }

/* Elements [off, off + n) of b as f32: b's own when f32 (or no data), else widened into tmp. */
static inline const float *apex__cpu_row_f32(apex_nn_buf b, size_t off, size_t n, float *tmp) {
  if (!b.data || b.dtype == APEX_F32) return b.data ? (const float *)b.data + off : NULL;
  apex__convert_range(tmp, APEX_F32, (const uint16_t *)b.data + off, b.dtype, n);
  return tmp;
}

/* Where a row [off, off + n) of a result of dtype dt is computed in f32: in out itself when f32, else
 * in tmp, which apex__cpu_row_store then rounds into out. */
static inline float *apex__cpu_row_out(void *out, apex_dtype dt, size_t off, float *tmp) {
  return dt == APEX_F32 ? (float *)out + off : tmp;
}
static inline void apex__cpu_row_store(void *out, apex_dtype dt, size_t off, const float *f, size_t n) {
  if (dt != APEX_F32) apex__convert_range((uint16_t *)out + off, dt, f, APEX_F32, n);
}

#endif
