/* test_vmath.c: the vector tanh and erf behind the GELUs and tanh (backend/cpu/vmath.h), each:
 *  - special values: +-0, +-inf, NaN, subnormals, the clamp and Taylor boundaries, huge |x|;
 *  - every 97th f32 bit pattern (44M inputs) at each vector ISA this CPU has: within 1 ulp of the
 *    exact function, within 3 of glibc's tanhf or erff, and the AVX2 and AVX-512 copies bit for bit
 *    the same
 *    (test_vmath_exhaustive, label long, covers all 2^32);
 *  - the portable ISA writes nothing and says so (the caller's libm loop runs);
 *  - the CPU backend's GELU, GELU_TANH and tanh forward and backward give the same bits on 1, 2 and
 *    3 threads, f32 and bf16 inputs, and on every f16 and bf16 value the bits of the f32 op (their
 *    tables). */
#include <stdlib.h>
#include <string.h>

#include "apex/cpu.h"
#include "apex/threads.h"
#include "backend/cpu/cpu_backend.h"
#include "vmath_check.h"

static const float special_x[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 0x1p-149f, -0x1p-149f, 0x1p-126f, 1e-20f, 0.0625f,
                                  nextafterf(0.0625f, 0), -nextafterf(0.0625f, 1), 0.5f, 1.0f, -3.0f, 9.0f, 9.02f, -19.99f, 20.0f,
                                  20.01f, 1e30f, -3.4e38f, 0x1p-12f};
#define N_SPECIAL (sizeof special_x / sizeof special_x[0])

/* f over special_x under the cap isa. */
static void check_special(const vc_fn *f, apex_cpu_isa isa) {
  const float *x = special_x;
  float out[N_SPECIAL];
  TU_OK(apex_cpu_set_max_isa(isa));
  assert_int_equal(f->vec(x, out, N_SPECIAL), 1);
  vc_stats s = {0};
  vc_check(f, x, out, N_SPECIAL, &s);
  vc_print(f, apex_cpu_isa_name(isa), &s);
  assert_int_equal(s.bad, 0);
  assert_true(s.max_ulp <= VC_MAX_ULP);
  assert_true(tu_bits(out[1]) == 0x80000000u && tu_bits(out[0]) == 0);
  assert_true(out[2] == 1.0f && out[3] == -1.0f && isnan(out[4]) && isnan(out[5]));
  if (f->vec == apex__vtanh) assert_true(out[6] == x[6] && out[7] == x[7] && out[9] == x[9]); /* tanh(x) rounds to x this small */
  for (size_t i = 17; i < N_SPECIAL - 1; i++) assert_true(fabsf(out[i]) == 1.0f); /* |x| >= 9.02: both round to +-1 */
  /* in place, and a length that is no multiple of the vector */
  float y[5];
  memcpy(y, x + 13, sizeof y);
  assert_int_equal(f->vec(y, y, 5), 1);
  assert_memory_equal(y, out + 13, sizeof y);
  TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_NATIVE));
}

static void test_special(void **state) {
  (void)state;
  if (apex_cpu_native_isa() < APEX_CPU_ISA_AVX2) skip();
  for (int fi = 0; fi < 2; fi++)
    for (apex_cpu_isa isa = APEX_CPU_ISA_AVX2; isa <= apex_cpu_native_isa() && isa <= APEX_CPU_ISA_AVX512; isa++) check_special(&vc_fns[fi], isa);
}

static void test_portable_declines(void **state) {
  (void)state;
  float x[3] = {0.5f, 1.0f, 2.0f}, out[3] = {7.0f, 7.0f, 7.0f};
  TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_PORTABLE));
  for (int fi = 0; fi < 2; fi++) {
    assert_int_equal(vc_fns[fi].vec(x, out, 3), 0);
    assert_true(out[0] == 7.0f && out[1] == 7.0f && out[2] == 7.0f);
  }
  TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_NATIVE));
}

#define STRIDE 97u
#define CHUNK 65536

static void test_sampled(void **state) {
  (void)state;
  if (apex_cpu_native_isa() < APEX_CPU_ISA_AVX2) skip();
  int both = apex_cpu_native_isa() >= APEX_CPU_ISA_AVX512;
  float *x = malloc(CHUNK * sizeof *x), *o2 = malloc(CHUNK * sizeof *o2), *o5 = malloc(CHUNK * sizeof *o5);
  for (int fi = 0; fi < 2; fi++) {
    const vc_fn *f = &vc_fns[fi];
    vc_stats s = {0};
    uint64_t differ = 0;
    for (uint64_t p = 0; p < (1ull << 32);) {
      size_t n = 0;
      for (; n < CHUNK && p < (1ull << 32); n++, p += STRIDE) x[n] = tu_float((uint32_t)p);
      TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_AVX2));
      assert_int_equal(f->vec(x, o2, n), 1);
      vc_check(f, x, o2, n, &s);
      if (both) {
        TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_AVX512));
        assert_int_equal(f->vec(x, o5, n), 1);
        for (size_t i = 0; i < n; i++) differ += tu_bits(o2[i]) != tu_bits(o5[i]);
      }
    }
    TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_NATIVE));
    vc_print(f, "every 97th f32", &s);
    if (both) printf("# %s: AVX2 and AVX-512 results differ at %llu inputs\n", f->name, (unsigned long long)differ);
    assert_int_equal(s.bad, 0);
    assert_true(s.max_ulp <= VC_MAX_ULP);
    assert_true(s.max_vs_libm <= VC_MAX_VS_LIBM);
    assert_true(differ == 0);
  }
  free(x), free(o2), free(o5);
}

/* A GELU or tanh forward and backward over n elements of x (dtype dt) on `threads` threads. */
#define NT (5 * 16384 + 7) /* past APEX__CPU_PAR_MIN, so the threads split it */
static void run_unary(apex_nn_unary_kind kind, const void *x, apex_dtype dt, const float *go, int threads, float *out, float *gx) {
  TU_OK(apex_set_num_threads(threads));
  TU_OK(apex__cpu_nn_unary(&(apex_nn_unary_args){.kind = kind, .n = NT, .x = {x, dt}, .out = out, .out_dtype = APEX_F32}));
  TU_OK(apex__cpu_nn_unary_bwd(&(apex_nn_unary_bwd_args){.kind = kind, .n = NT, .x = {x, dt}, .gout = go, .gx = gx}));
}

static void test_threads(void **state) {
  (void)state;
  apex_tensor *xf = tu_random_tensor(APEX_F32, NT, 17, 6.0f), *xb = apex_tensor_to(xf, APEX_BF16);
  apex_tensor *g = tu_random_tensor(APEX_F32, NT, 18, 1.0f);
  float *o[3], *gx[3];
  for (int k = 0; k < 3; k++) o[k] = malloc(NT * sizeof(float)), gx[k] = malloc(NT * sizeof(float));
  int saved = apex_get_num_threads();
  const apex_nn_unary_kind kinds[3] = {APEX_NN_GELU, APEX_NN_GELU_TANH, APEX_NN_TANH};
  const apex_tensor *xs[2] = {xf, xb};
  for (int ki = 0; ki < 3; ki++)
    for (int d = 0; d < 2; d++) {
      for (int k = 0; k < 3; k++)
        run_unary(kinds[ki], apex_tensor_data(xs[d]), apex_tensor_dtype(xs[d]), apex_tensor_data(g), k + 1, o[k], gx[k]);
      for (int k = 1; k < 3; k++) {
        assert_memory_equal(o[0], o[k], NT * sizeof(float));
        assert_memory_equal(gx[0], gx[k], NT * sizeof(float));
      }
    }
  TU_OK(apex_set_num_threads(saved));
  for (int k = 0; k < 3; k++) free(o[k]), free(gx[k]);
  apex_tensor_destroy(xf), apex_tensor_destroy(xb), apex_tensor_destroy(g);
}

/* GELU, GELU_TANH and tanh of an f16 or bf16 input come from tables over its 65536 values
 * (cpu/elementwise.c): every one of them, forward (f32 result, and one in the input's dtype) and
 * backward, has the bits of the same op on the widened f32 input (computed, no table), at the
 * portable, AVX2 and AVX-512 caps
 * (libm's tanh/erf bits at the first, the vector code's above). */
static void test_half_tables(void **state) {
  (void)state;
  enum { NV = 65536 };
  uint16_t *h = malloc(NV * sizeof *h), *oh = malloc(NV * sizeof *oh), *want = malloc(NV * sizeof *want);
  float *xf = malloc(NV * sizeof *xf), *go = malloc(NV * sizeof *go), *o[2], *gx[2];
  for (int k = 0; k < 2; k++) o[k] = malloc(NV * sizeof(float)), gx[k] = malloc(NV * sizeof(float));
  for (size_t i = 0; i < NV; i++) h[i] = (uint16_t)i, go[i] = 0.01f * (float)((i * 7919) % 97) - 0.4f;
  const apex_nn_unary_kind kinds[3] = {APEX_NN_GELU, APEX_NN_GELU_TANH, APEX_NN_TANH};
  const apex_cpu_isa isas[3] = {APEX_CPU_ISA_PORTABLE, APEX_CPU_ISA_AVX2, APEX_CPU_ISA_AVX512};
  for (int ii = 0; ii < 3; ii++)
    for (int d = 0; d < 2; d++) {
      apex_dtype dt = d ? APEX_BF16 : APEX_F16;
      TU_OK(apex_cpu_set_max_isa(isas[ii]));
      TU_OK(apex_convert(xf, APEX_F32, h, dt, NV));
      for (int ki = 0; ki < 3; ki++) {
        for (int k = 0; k < 2; k++) {
          apex_nn_buf x = k ? (apex_nn_buf){xf, APEX_F32} : (apex_nn_buf){h, dt};
          TU_OK(apex__cpu_nn_unary(&(apex_nn_unary_args){.kind = kinds[ki], .n = NV, .x = x, .out = o[k], .out_dtype = APEX_F32}));
          TU_OK(apex__cpu_nn_unary_bwd(&(apex_nn_unary_bwd_args){.kind = kinds[ki], .n = NV, .x = x, .gout = go, .gx = gx[k]}));
        }
        /* a result in the input's dtype: the f32 op's rounded once */
        TU_OK(apex__cpu_nn_unary(&(apex_nn_unary_args){.kind = kinds[ki], .n = NV, .x = {h, dt}, .out = oh, .out_dtype = dt}));
        TU_OK(apex_convert(want, dt, o[1], APEX_F32, NV));
        assert_memory_equal(oh, want, NV * sizeof *oh);
        for (size_t i = 0; i < NV; i++)
          if (tu_bits(o[0][i]) != tu_bits(o[1][i]) || tu_bits(gx[0][i]) != tu_bits(gx[1][i]))
            fail_msg("kind %d, %s, isa %d: at %s bits 0x%04zx the half input gives %a (slope-term %a), the f32 one %a (%a)", (int)kinds[ki],
                     apex_dtype_name(dt), (int)isas[ii], apex_dtype_name(dt), i, (double)o[0][i], (double)gx[0][i], (double)o[1][i],
                     (double)gx[1][i]);
      }
    }
  TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_NATIVE));
  for (int k = 0; k < 2; k++) free(o[k]), free(gx[k]);
  free(h), free(oh), free(want), free(xf), free(go);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_special), cmocka_unit_test(test_portable_declines), cmocka_unit_test(test_sampled),
                                     cmocka_unit_test(test_threads), cmocka_unit_test(test_half_tables)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
