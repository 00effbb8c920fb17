/* sums.h: the CPU's sums whose bits depend on the data alone, never on the thread count: serial f64
 * sums, fixed-block sums over threads, the vectorised lane sums, column sums. Shared by the CPU
 * backend's kernels and the autograd fronts that reduce a loss. */
#ifndef APEX_BACKEND_CPU_SUMS_H
#define APEX_BACKEND_CPU_SUMS_H

#include <stddef.h>
#include <string.h>

#include "apex/dtype.h"

/* dst[c] += sum over rows of m[r, c] (m is rows x cols), each column summed in row order. */
void apex__colsum_add(const float *m, size_t rows, size_t cols, float *dst);

/* Sum of n floats in double on the calling thread, in order. */
static inline double apex__sum_serial(const float *x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += x[i];
  return s;
}

/* Sums that vectorise: element i of a run goes to lane i % APEX__LANES, each lane sums a block of up
 * to APEX__LANE_BLOCK elements in f32 (at most 64 terms a lane) and adds that to its f64 total, and the
 * totals are combined in a fixed order; so the value depends on the data alone (not the thread that
 * runs it), and long runs lose no more than f64 sums of short f32 ones. One chain of dependent adds
 * costs its 4-cycle latency an element; sixteen f32 lanes run at the speed of loading the floats.
 * Measured on batch norm's statistics over [128, 32, 28, 28] from memory, one thread: 2.6 ms with
 * eight f64 lanes, 1.7 ms with f32 blocks. Runs can be added one after another into the same lanes. */
#define APEX__LANES 16
#define APEX__LANE_BLOCK 1024
/* The lanes live in four 4-float vectors (GCC/Clang vector extensions, lowered to whatever the target
 * has): as arrays gcc kept them on the stack and ran at 0.5-0.7 ns an element, as vectors 0.13 (the
 * batch norm backward's sums, one thread, in cache). Lane l sums the same elements in the same
 * order either way, so the portable loop below gives the same bits. */
#if defined(__GNUC__)
typedef float apex__v4 __attribute__((vector_size(16)));
#define APEX__LANE_VEC 1
static inline apex__v4 apex__ld4(const float *p) {
  apex__v4 v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline void apex__st16(float *f, apex__v4 a, apex__v4 b, apex__v4 c, apex__v4 d) {
  memcpy(f, &a, sizeof a);
  memcpy(f + 4, &b, sizeof b);
  memcpy(f + 8, &c, sizeof c);
  memcpy(f + 12, &d, sizeof d);
}
#else
#define APEX__LANE_VEC 0
#endif
/* One block [i, e) of x into f32 lanes f (zeroed by the caller); returns where the whole groups end. */
static inline size_t apex__lanes_block(float f[APEX__LANES], const float *restrict x, size_t i, size_t e) {
#if APEX__LANE_VEC
  apex__v4 a = {0}, b = {0}, c = {0}, d = {0};
  for (; i + APEX__LANES <= e; i += APEX__LANES) {
    a += apex__ld4(x + i);
    b += apex__ld4(x + i + 4);
    c += apex__ld4(x + i + 8);
    d += apex__ld4(x + i + 12);
  }
  apex__st16(f, a, b, c, d);
#else
  for (; i + APEX__LANES <= e; i += APEX__LANES)
    for (int l = 0; l < APEX__LANES; l++) f[l] += x[i + l];
#endif
  return i;
}
static inline void apex__lanes_add(double acc[APEX__LANES], const float *restrict x, size_t n) {
  for (size_t b0 = 0; b0 < n; b0 += APEX__LANE_BLOCK) {
    size_t e = n - b0 < APEX__LANE_BLOCK ? n : b0 + APEX__LANE_BLOCK;
    float f[APEX__LANES] = {0};
    size_t i = apex__lanes_block(f, x, b0, e);
    for (size_t l = 0; i + l < e; l++) f[l] += x[i + l];
    for (int l = 0; l < APEX__LANES; l++) acc[l] += f[l];
  }
}
static inline double apex__lanes_total(const double acc[APEX__LANES]) {
  double s[APEX__LANES / 2];
  for (int l = 0; l < APEX__LANES / 2; l++) s[l] = acc[2 * l] + acc[2 * l + 1];
  return (((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])));
}

/* The fixed blocks of the blocked sums below. */
#define APEX__SUM_BLOCK 4096
/* serial(block) over the fixed blocks of APEX__SUM_BLOCK floats of x (run on several threads), the
 * block results added in order in double: the value does not depend on the thread count. */
double apex__blocked_sum(const float *x, size_t n, double (*serial)(const float *x, size_t n));
/* Where a blocked sum's floats come from: block [lo, lo + len) (len <= APEX__SUM_BLOCK) of the n
 * summed, either in place (a pointer into the caller's data) or written into tmp (APEX__SUM_BLOCK
 * floats on the summing thread's stack) and tmp returned. Called on threads, once per block. */
typedef const float *(*apex__sum_block_fn)(const void *ctx, size_t lo, size_t len, float *tmp);
/* apex__blocked_sum over the n floats that block() gives, block by block: the same blocks, order and
 * value as apex__blocked_sum over all n of them in one buffer, which is never made (a loss's
 * per-element terms are computed a block at a time and summed). */
double apex__blocked_sum_fn(size_t n, apex__sum_block_fn block, const void *ctx, double (*serial)(const float *x, size_t n));
/* The same over n elements of dtype dt at x: a block of f16 or bf16 is widened (exactly) into a block on
 * the stack before serial reads it, so the value is that of apex__blocked_sum over an f32 copy and no
 * copy is made. Call apex_simd_active() first (the blocks widen on threads). */
double apex__blocked_sum_buf(const void *x, apex_dtype dt, size_t n, double (*serial)(const float *x, size_t n));
/* Sum of n floats in double, in apex__blocked_sum's blocks, each summed by apex__sum_serial. */
double apex__sum_f32(const float *x, size_t n);

#endif
