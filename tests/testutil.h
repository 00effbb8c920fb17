/* testutil.h: what the cmocka tests share: the includes cmocka needs, bit-exact float comparisons,
 * running a check at 1 and 2 threads, and reading golden files made by the scripts in tests/. */
#ifndef APEX_TESTUTIL_H
#define APEX_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
/* cmocka.h needs the four headers above first. */
#include <cmocka.h>

#include "apex/apex.h"

/* The bits of a float, for bitwise comparisons. */
static inline uint32_t tu_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
static inline float tu_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Asserts that an apex call returned APEX_OK, printing the library's message if not. */
/* Selects the AVX2 copies of the kernels (core/simd_kernel.h); 0, with the reason printed, on a CPU
 * without them, where a test comparing the two paths has nothing to compare. */
static inline int tu_have_avx2(void) {
  if (apex_simd_set(APEX_SIMD_AVX2) == APEX_OK) return 1;
  printf("skipped: this CPU has no AVX2/F16C/FMA, so there is one path only\n");
  apex_simd_set(APEX_SIMD_AUTO);
  return 0;
}

/* The ISA levels the multi-tensor kernels have a copy for (backend/cpu/simd_kernel.h) that this CPU
 * runs, lowest first, into levels[3]; returns how many (1 on a CPU without AVX2, which prints why the
 * comparison has nothing to compare). The caller restores APEX_CPU_ISA_NATIVE when done. */
static inline int tu_kernel_isa_levels(apex_cpu_isa levels[3]) {
  const apex_cpu_isa all[3] = {APEX_CPU_ISA_PORTABLE, APEX_CPU_ISA_AVX2, APEX_CPU_ISA_AVX512};
  int n = 0;
  for (int k = 0; k < 3; k++)
    if (apex_cpu_native_isa() >= all[k]) levels[n++] = all[k];
  if (n == 1) printf("skipped: this CPU has no AVX2/F16C/FMA, so there is one path only\n");
  return n;
}

#define TU_OK(call)                                                                                        \
  do {                                                                                                     \
    apex_status tu_st_ = (call);                                                                           \
    if (tu_st_ != APEX_OK) fail_msg("%s returned %s: %s", #call, apex_status_name(tu_st_), apex_last_error()); \
  } while (0)

/* Asserts that a call failed with the given status and that its message contains `needle`. */
#define TU_FAILS(call, status, needle)                                                                     \
  do {                                                                                                     \
    apex_status tu_st_ = (call);                                                                           \
    if (tu_st_ != (status))                                                                                \
      fail_msg("%s returned %s, expected %s (%s)", #call, apex_status_name(tu_st_), apex_status_name(status), apex_last_error()); \
    if (!strstr(apex_last_error(), (needle)))                                                              \
      fail_msg("%s: message '%s' does not mention '%s'", #call, apex_last_error(), (needle));             \
  } while (0)

/* Asserts two loss-scaler states are equal field by field (bitwise for the scale); comparing the
 * structs' bytes would also compare their padding, which holds no defined value. */
void tu_assert_scaler_state_equal(const apex_loss_scaler_state *a, const apex_loss_scaler_state *b);

/* Asserts that the last error message contains needle. */
void tu_assert_message(const char *needle);

/* A 1-d tensor of n elements of dtype, filled with deterministic values in [-range, range]. */
apex_tensor *tu_random_tensor(apex_dtype dtype, size_t n, uint64_t seed, float range);

/* A leaf var of the given shape holding tu_random_tensor's values in [-1, 1] (the var owns it). */
apex_var *tu_random_leaf(apex_dtype dtype, int ndim, const int64_t *shape, uint64_t seed, int requires_grad);

/* 1 when dev can run here (the CPU always); else 0 after printing "skipped: <why>" (a test's device case
 * then returns: a missing accelerator is a skip, never a failure). */
int tu_device_present(apex_device dev);

/* A host copy of t (same dtype and shape); the test fails if it cannot be made. */
apex_tensor *tu_host_copy(const apex_tensor *t);

/* A tensor of the given shape on dev holding tu_random_tensor's values in [-range, range], in dtype. */
apex_tensor *tu_random_on(apex_device dev, apex_dtype dtype, int ndim, const int64_t *shape, uint64_t seed, float range);

/* Reads a whole file under $APEX_TEST_DATA (tests/data) into a malloc'd buffer; NULL (and the test
 * fails with the path) if missing. */
void *tu_read_data(const char *name, size_t *size);

/* cmocka group setup and teardown for a test over one process group: tu_pg is the MPI group under
 * mpirun, else the local one (world size 1), so the test runs without MPI too. */
extern apex_pg *tu_pg;
int tu_pg_setup(void **state);
int tu_pg_teardown(void **state);

/* Maximum relative difference |a-b| / max(|b|, floor) over n floats. */
double tu_max_rel_diff(const float *a, const float *b, size_t n, double floor);

#endif
