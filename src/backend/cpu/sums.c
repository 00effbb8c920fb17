/* sums.c: the CPU's thread-count-independent sums (sums.h) that are not inline. */
#include <stdint.h>
#include <stdlib.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/sums.h"

typedef struct {
  const void *x;
  apex_dtype dt;
} buf_ctx;

/* Block [lo, lo + len) of a buffer: in place when f32, else widened (exactly) into tmp. */
static const float *buf_block(const void *ctx, size_t lo, size_t len, float *tmp) {
  const buf_ctx *b = ctx;
  if (b->dt == APEX_F32) return (const float *)b->x + lo;
  apex__convert_range(tmp, APEX_F32, (const uint16_t *)b->x + lo, b->dt, len);
  return tmp;
}

/* serial over block [lo, lo + len) of what block() gives. */
static double block_sum(apex__sum_block_fn block, const void *ctx, size_t lo, size_t len, double (*serial)(const float *x, size_t n)) {
  float tmp[APEX__SUM_BLOCK];
  return serial(block(ctx, lo, len, tmp), len);
}

double apex__blocked_sum_fn(size_t n, apex__sum_block_fn block, const void *ctx, double (*serial)(const float *x, size_t n)) {
  enum { B = APEX__SUM_BLOCK };
  size_t nb = (n + B - 1) / B;
  double *part = nb > 1 ? malloc(nb * sizeof *part) : NULL, s = 0;
  if (!part) { /* one block, or no memory: the same blocks in the same order on this thread */
    for (size_t b = 0, lo = 0; b < nb; b++, lo += B) s += block_sum(block, ctx, lo, n - lo < B ? n - lo : B, serial);
    return s;
  }
#pragma omp parallel for schedule(static) if (n > APEX__CPU_PAR_MIN)
  for (size_t b = 0; b < nb; b++) {
    size_t lo = b * B;
    part[b] = block_sum(block, ctx, lo, n - lo < B ? n - lo : B, serial);
  }
  for (size_t b = 0; b < nb; b++) s += part[b];
  free(part);
  return s;
}

double apex__blocked_sum_buf(const void *x, apex_dtype dt, size_t n, double (*serial)(const float *x, size_t n)) {
  return apex__blocked_sum_fn(n, buf_block, &(buf_ctx){x, dt}, serial);
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
