/* test_gemm_onednn.c: the bf16 and f32 matrix products through oneDNN (src/backend/cpu/gemm_onednn.c).
 *
 * What is checked: that APEX_CPU_ISA=avx512 (and the cap below avx512_bf16) keeps the path off; that
 * matmul and linear, forward and both backward products, on bf16 and on f32 operands run through it and agree
 * with the portable reference path (APEX_CPU_ISA_PORTABLE: a double sum per element) within bounds
 * computed here element by element; and that its bits do not depend on the thread count (1, 2, 3).
 * Every test skips, saying why, on a CPU without AVX512_BF16 or a build without oneDNN.
 *
 * Bounds. Forward: both paths multiply the same bf16 values exactly and sum in f32 (oneDNN) or
 * double (portable), then round to bf16 once: |got - ref| <= 1e-5 * max|ref| + one bf16 ulp at the
 * element. Backward: the f32 gradient of the output is rounded to bf16 before the product (relative
 * error at most 2^-9 per element), so an element of R x W may move by 2^-9 * (|R| x |W|) at that
 * element, computed here in double, plus the f32 accumulation term 1e-5 * max|ref|, plus one bf16
 * ulp where the gradient is stored in bf16 (a bf16 leaf's gradient is). f32 operands: every product
 * and sum rounds in f32, in whatever order oneDNN takes, so an element of a product over K terms
 * moves by at most (K + 2) u (|P| x |Q|) at that element (u = 2^-24; the 2 covers the bias and the
 * accumulation into C), plus 1e-5 * max|ref|. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <stdlib.h>

#include "apex/cpu.h"
#include "backend/cpu/gemm_onednn.h"
#include "onednn_check.h"
#include "testutil.h"

/* linear(x [m, k], w [n, k], b [n]) or matmul(x [m, k], w [k, n]) on bf16 leaves; backward with
 * grad_output r (f32 [m, n]). Copies out the output and the gradients of x and w as f32. */
typedef struct run {
  apex_tensor *y, *gx, *gw;
} run;

static run run_op(int linear, apex_var *x, apex_var *w, apex_var *b, const apex_tensor *r) {
  TU_OK(apex_tensor_fill(apex_var_grad(x), 0.0f));
  TU_OK(apex_tensor_fill(apex_var_grad(w), 0.0f));
  apex_graph *g = apex_graph_create();
  apex_var *y = linear ? apex_linear(g, x, w, b) : apex_matmul(g, x, w);
  if (!y) fail_msg("%s", apex_last_error());
  TU_OK(apex_backward(y, &(apex_backward_options){.grad_output = r}));
  run out = {apex_tensor_to(apex_var_value(y), APEX_F32), apex_tensor_to(apex_var_grad(x), APEX_F32),
             apex_tensor_to(apex_var_grad(w), APEX_F32)};
  apex_graph_destroy(g);
  return out;
}

static void free_run(run *q) {
  apex_tensor_destroy(q->y);
  apex_tensor_destroy(q->gx);
  apex_tensor_destroy(q->gw);
}

/* rel * (|P| x |Q|) where P is [rows, inner] and Q [inner, cols], each read through (ld, trans). */
static double *rounding_bound(const apex_tensor *p, int pt, const apex_tensor *q, int qt, int rows, int inner, int cols, double rel) {
  double *out = calloc((size_t)rows * cols, sizeof *out);
  assert_non_null(out);
  for (int i = 0; i < rows; i++)
    for (int j = 0; j < cols; j++) {
      double s = 0;
      for (int t = 0; t < inner; t++)
        s += fabs(apex_tensor_get(p, pt ? (size_t)t * rows + i : (size_t)i * inner + t)) *
             fabs(apex_tensor_get(q, qt ? (size_t)j * inner + t : (size_t)t * cols + j));
      out[(size_t)i * cols + j] = rel * s;
    }
  return out;
}

/* Shapes: one below gemm.c's tile threshold (one call), one with ragged tiles, one with K = 1500, and
 * the MLP's batch of 128 on a ragged width, whose half products split their columns (4 x 2 tiles of
 * 32 x 512, the last 488 wide: C strided, so the f32 scratch and the epilogue run; gemm_onednn.c). */
static const struct {
  int m, k, n;
} shapes[] = {{30, 20, 10}, {300, 130, 270}, {260, 1500, 100}, {128, 784, 1000}};

/* The bound's factor on |P| x |Q| for a product over `inner` terms: bf16 operands, the f32 gradient's
 * rounding to bf16; f32 operands, f32 rounding of every product and sum. */
static double rel_bound(apex_dtype dt, int inner) { return dt == APEX_BF16 ? ldexp(1.0, -9) : (inner + 2) * ldexp(1.0, -24); }

static void test_matches_portable(void **state) {
  (void)state;
  if (skip_without_path()) return;
  const apex_dtype dts[2] = {APEX_BF16, APEX_F32};
  for (int dl = 0; dl < 4; dl++) /* bf16, f32 x matmul, linear */
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
      int linear = dl % 2, m = shapes[s].m, k = shapes[s].k, n = shapes[s].n;
      apex_dtype dt = dts[dl / 2];
      apex_var *x = tu_random_leaf(dt, 2, (int64_t[]){m, k}, 11 + s, 1);
      apex_var *w = tu_random_leaf(dt, 2, linear ? (int64_t[]){n, k} : (int64_t[]){k, n}, 23 + s, 1);
      apex_var *b = linear ? tu_random_leaf(APEX_F32, 1, (int64_t[]){n}, 31 + s, 0) : NULL;
      apex_tensor *r = apex_tensor_create(APEX_F32, 2, (int64_t[]){m, n});
      apex_tensor *rr = tu_random_tensor(APEX_F32, (size_t)m * n, 41 + s, 1.0f);
      for (size_t i = 0; i < (size_t)m * n; i++) apex_tensor_set(r, i, apex_tensor_get(rr, i));
      apex_tensor_destroy(rr);

      TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_PORTABLE));
      unsigned long before = apex__onednn_products();
      run ref = run_op(linear, x, w, b, r);
      assert_true(apex__onednn_products() == before); /* the reference never takes the path */
      TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_NATIVE));
      run got = run_op(linear, x, w, b, r);
      assert_true(apex__onednn_products() == before + 3); /* forward and both backward products */

      char what[96];
      const char *op = linear ? "linear" : "matmul", *tn = apex_dtype_name(dt);
      const apex_tensor *W = apex_var_value(w), *X = apex_var_value(x);
      /* bf16 forward: exact products, one rounding of the output (the ulp); f32: the f32 bound */
      double *by = dt == APEX_F32 ? rounding_bound(X, 0, W, linear, m, k, n, rel_bound(dt, k)) : NULL;
      snprintf(what, sizeof what, "%s %s [%d, %d] x [%d, %d] output", tn, op, m, k, k, n);
      check(what, got.y, ref.y, 1e-5, by, dt == APEX_BF16);
      free(by);
      /* gx = R W (linear: w [n, k] as stored; matmul: w [k, n] transposed), gw = R^T x or x^T R */
      double *bx = rounding_bound(r, 0, W, !linear, m, n, k, rel_bound(dt, n));
      double *bw = linear ? rounding_bound(r, 1, X, 0, n, m, k, rel_bound(dt, m)) : rounding_bound(X, 1, r, 0, k, m, n, rel_bound(dt, m));
      snprintf(what, sizeof what, "%s %s [%d, %d] x [%d, %d] grad x", tn, op, m, k, k, n);
      check(what, got.gx, ref.gx, 1e-5, bx, apex_tensor_dtype(apex_var_grad(x)) != APEX_F32);
      snprintf(what, sizeof what, "%s %s [%d, %d] x [%d, %d] grad w", tn, op, m, k, k, n);
      check(what, got.gw, ref.gw, 1e-5, bw, apex_tensor_dtype(apex_var_grad(w)) != APEX_F32);
      free(bx);
      free(bw);
      free_run(&ref);
      free_run(&got);
      apex_tensor_destroy(r);
      apex_var_destroy(x);
      apex_var_destroy(w);
      if (b) apex_var_destroy(b);
    }
}

/* 1, 2 and 3 threads give the same bits, forward and backward, on every shape, bf16 and f32, linear
 * and matmul (whose x^T R reads x transposed: a strided operand gemm_onednn.c packs). */
static void test_thread_count_bitwise(void **state) {
  (void)state;
  if (skip_without_path()) return;
  int saved = apex_get_num_threads();
  const size_t nshapes = sizeof shapes / sizeof shapes[0];
  for (size_t ds = 0; ds < 4 * nshapes; ds++) { /* every shape in bf16, then in f32; linear, then matmul */
    size_t s = ds % nshapes;
    int m = shapes[s].m, k = shapes[s].k, n = shapes[s].n, linear = ds < 2 * nshapes;
    apex_dtype dt = ds % (2 * nshapes) < nshapes ? APEX_BF16 : APEX_F32;
    apex_var *x = tu_random_leaf(dt, 2, (int64_t[]){m, k}, 5 + s, 1);
    apex_var *w = tu_random_leaf(dt, 2, linear ? (int64_t[]){n, k} : (int64_t[]){k, n}, 7 + s, 1);
    apex_var *b = linear ? tu_random_leaf(APEX_F32, 1, (int64_t[]){n}, 9 + s, 0) : NULL;
    apex_tensor *r = tu_random_tensor(APEX_F32, (size_t)m * n, 13 + s, 1.0f);
    run first = {0};
    for (int threads = 1; threads <= 3; threads++) {
      TU_OK(apex_set_num_threads(threads));
      unsigned long before = apex__onednn_products();
      run q = run_op(linear, x, w, b, r);
      assert_true(apex__onednn_products() == before + 3);
      if (threads == 1) {
        first = q;
        continue;
      }
      const apex_tensor *pairs[3][2] = {{q.y, first.y}, {q.gx, first.gx}, {q.gw, first.gw}};
      for (int p = 0; p < 3; p++)
        for (size_t i = 0; i < apex_tensor_numel(pairs[p][1]); i++)
          if (tu_bits(apex_tensor_get(pairs[p][0], i)) != tu_bits(apex_tensor_get(pairs[p][1], i)))
            fail_msg("%s shape %zu, result %d, element %zu: %d threads give %.9g, 1 thread %.9g", linear ? "linear" : "matmul", s, p, i, threads,
                     apex_tensor_get(pairs[p][0], i), apex_tensor_get(pairs[p][1], i));
      free_run(&q);
    }
    free_run(&first);
    apex_tensor_destroy(r);
    apex_var_destroy(x);
    apex_var_destroy(w);
    if (b) apex_var_destroy(b);
  }
  TU_OK(apex_set_num_threads(saved));
}

/* Runs first, before anything resolves the cap: APEX_CPU_ISA=avx512 turns the path off, and the
 * product still runs (on the f32 path). */
static void test_env_avx512_disables(void **state) {
  (void)state;
  if (!env_avx512_begin()) return;
  const char *why = NULL;
  apex_var *x = tu_random_leaf(APEX_BF16, 2, (int64_t[]){300, 130}, 1, 1);
  apex_var *w = tu_random_leaf(APEX_BF16, 2, (int64_t[]){270, 130}, 2, 1);
  apex_tensor *r = tu_random_tensor(APEX_F32, 300 * 270, 3, 1.0f);
  unsigned long before = apex__onednn_products();
  run q = run_op(1, x, w, NULL, r);
  assert_true(apex__onednn_products() == before);
  /* the cap set in code wins over the environment: the path comes back */
  TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_AVX512_BF16));
  if (apex__onednn_active(&why)) {
    run p = run_op(1, x, w, NULL, r);
    assert_true(apex__onednn_products() == before + 3);
    free_run(&p);
  } else {
    printf("# oneDNN path absent at avx512_bf16: %s\n", why);
  }
  free_run(&q);
  apex_tensor_destroy(r);
  apex_var_destroy(x);
  apex_var_destroy(w);
  env_avx512_end();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_env_avx512_disables),
      cmocka_unit_test(test_matches_portable),
      cmocka_unit_test(test_thread_count_bitwise),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
