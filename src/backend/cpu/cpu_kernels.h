/* cpu_kernels.h: what the CPU backend's nn kernels (cpu/<family>.c) share: when a loop runs on
 * threads, the start of a gradient output that may not be accumulated into (args_nn.h), and the f32
 * views of native-dtype buffers that the kernels compute on. */
#ifndef APEX_BACKEND_CPU_KERNELS_H
#define APEX_BACKEND_CPU_KERNELS_H

#include <stddef.h>
#include <string.h>

#include "apex/dtype.h"
#include "backend/args_nn.h"

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

#endif
