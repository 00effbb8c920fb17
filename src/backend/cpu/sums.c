/* sums.c: the CPU's thread-count-independent sums (sums.h) that are not inline. */
#include <stdint.h>
#include <stdlib.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/sums.h"

enum { SUM_BLOCK = 4096 };

/* serial over block [lo, lo + len) of x, widened into a stack block when x is half. */
static double block_sum(const void *x, apex_dtype dt, size_t lo, size_t len, double (*serial)(const float *x, size_t n)) {
  if (dt == APEX_F32) return serial((const float *)x + lo, len);
  float tmp[SUM_BLOCK];
  apex__convert_range(tmp, APEX_F32, (const uint16_t *)x + lo, dt, len);
  return serial(tmp, len);
}

double apex__blocked_sum_buf(const void *x, apex_dtype dt, size_t n, double (*serial)(const float *x, size_t n)) {
  size_t nb = (n + SUM_BLOCK - 1) / SUM_BLOCK;
  double *part = nb > 1 ? malloc(nb * sizeof *part) : NULL, s = 0;
  if (!part) { /* one block, or no memory: the same blocks in the same order on this thread */
    for (size_t b = 0, lo = 0; b < nb; b++, lo += SUM_BLOCK) s += block_sum(x, dt, lo, n - lo < SUM_BLOCK ? n - lo : SUM_BLOCK, serial);
    return s;
  }
#pragma omp parallel for schedule(static) if (n > APEX__CPU_PAR_MIN)
  for (size_t b = 0; b < nb; b++) {
    size_t lo = b * SUM_BLOCK;
    part[b] = block_sum(x, dt, lo, n - lo < SUM_BLOCK ? n - lo : SUM_BLOCK, serial);
  }
  for (size_t b = 0; b < nb; b++) s += part[b];
  free(part);
  return s;
}

double apex__blocked_sum(const float *x, size_t n, double (*serial)(const float *x, size_t n)) {
  return apex__blocked_sum_buf(x, APEX_F32, n, serial);
}

double apex__sum_f32(const float *x, size_t n) { return apex__blocked_sum(x, n, apex__sum_serial); }

void apex__colsum_add(const float *m, size_t rows, size_t cols, float *dst) {
  enum { CB = 64 };
  size_t nb = (cols + CB - 1) / CB;
#pragma omp parallel for schedule(static) if (rows * cols > APEX__CPU_PAR_MIN)
  for (size_t b = 0; b < nb; b++) {
    float acc[CB] = {0};
    size_t c0 = b * CB, w = cols - c0 < CB ? cols - c0 : CB;
    for (size_t r = 0; r < rows; r++)
      for (size_t c = 0; c < w; c++) acc[c] += m[r * cols + c0 + c];
    for (size_t c = 0; c < w; c++) dst[c0 + c] += acc[c];
  }
}
