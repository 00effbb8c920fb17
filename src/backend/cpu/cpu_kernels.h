/* cpu_kernels.h: what the CPU backend's nn kernels (cpu/<family>.c) share: when a loop runs on
 * threads, and the start of a gradient output that may not be accumulated into (args_nn.h). */
#ifndef APEX_BACKEND_CPU_KERNELS_H
#define APEX_BACKEND_CPU_KERNELS_H

#include <stddef.h>
#include <string.h>

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

#endif
