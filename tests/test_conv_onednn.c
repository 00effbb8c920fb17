/* test_conv_onednn.c: conv2d's bf16 products through oneDNN (src/backend/cpu/conv_onednn.c).
 *
 * What is checked: that APEX_CPU_ISA=avx512 keeps the path off; that conv2d on bf16 operands,
 * forward, input gradient and weight gradient, runs through it (its product counter moves by one per
 * image and product) and agrees with the portable reference path (APEX_CPU_ISA_PORTABLE: f32 im2col
 * products with a double sum per element) within bounds computed here element by element; and that
 * its bits do not depend on the thread count (1, 2, 3), on shapes small enough to run on one thread
 * and large enough (the benchmark CNN's second convolution) to run images on threads. Every test skips,
 * saying why, on a CPU without AVX512_BF16 or a build without oneDNN.
 *
 * Bounds. Forward: both paths multiply the same bf16 values exactly and sum in f32 (oneDNN) or double
 * (portable), add the f32 bias and round to bf16 once: |got - ref| <= 1e-5 * max|ref| + one bf16 ulp.
 * Backward: the f32 output gradient R is rounded to bf16 before each product (relative error at most
 * 2^-9 per element), which moves an element by at most conv_bound.h's 2^-9 * (|R| x |other operand|)
 * there, plus 1e-5 * max|ref| for the f32 sums, plus one bf16 ulp where the gradient is stored in
 * bf16 (a bf16 leaf's gradient is). The bias gradient is f32 sums of R alone on both paths: bitwise. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <stdlib.h>

#include "apex/cpu.h"
#include "backend/cpu/conv_onednn.h"
#include "backend/cpu/gemm_onednn.h"
#include "conv_bound.h"
#include "onednn_check.h"
#include "testutil.h"

/* x [n, c, h, w], w [o, c, kh, kw] bf16, bias [o] f32, with the geometry's stride and padding. */
typedef struct shape {
  int n, c, h, w, o, kh, kw;
  apex_conv2d_options opt;
} shape;

static const shape shapes[] = {
    {2, 3, 9, 7, 5, 3, 3, {.stride_h = 2, .stride_w = 1, .pad_h = 1, .pad_w = 1}}, /* one thread, odd sizes, strided */
    {8, 32, 14, 14, 64, 3, 3, {.pad_h = 1, .pad_w = 1}},                            /* the benchmark CNN's second conv */
    {6, 1, 28, 28, 32, 3, 3, {.pad_h = 1, .pad_w = 1}},                             /* its first */
    /* more images than conv.c's 16 weight-gradient runs: runs of 2 and 3 images, whose later images
     * add into the run's partial (the sum post-op), on threads */
    {40, 8, 12, 12, 16, 3, 3, {.pad_h = 1, .pad_w = 1}},
};

typedef struct run {
  apex_tensor *y, *gx, *gw, *gb;
} run;

static run run_conv(const shape *s, apex_var *x, apex_var *w, apex_var *b, const apex_tensor *r) {
  TU_OK(apex_tensor_fill(apex_var_grad(x), 0.0f));
  TU_OK(apex_tensor_fill(apex_var_grad(w), 0.0f));
  TU_OK(apex_tensor_fill(apex_var_grad(b), 0.0f));
  apex_graph *g = apex_graph_create();
  apex_var *y = apex_conv2d(g, x, w, b, &s->opt);
  if (!y) fail_msg("%s", apex_last_error());
  assert_int_equal(apex_tensor_numel(apex_var_value(y)), apex_tensor_numel(r));
  TU_OK(apex_backward(y, &(apex_backward_options){.grad_output = r}));
  run out = {apex_tensor_to(apex_var_value(y), APEX_F32), apex_tensor_to(apex_var_grad(x), APEX_F32),
             apex_tensor_to(apex_var_grad(w), APEX_F32), apex_tensor_to(apex_var_grad(b), APEX_F32)};
  apex_graph_destroy(g);
  return out;
}

static void free_run(run *q) {
  apex_tensor_destroy(q->y);
  apex_tensor_destroy(q->gx);
  apex_tensor_destroy(q->gw);
  apex_tensor_destroy(q->gb);
}

static size_t out_numel(const shape *s) {
  int sh = s->opt.stride_h ? s->opt.stride_h : 1, sw = s->opt.stride_w ? s->opt.stride_w : 1;
  size_t ho = (size_t)(s->h + 2 * s->opt.pad_h - s->kh) / sh + 1, wo = (size_t)(s->w + 2 * s->opt.pad_w - s->kw) / sw + 1;
  return (size_t)s->n * s->o * ho * wo;
}

typedef struct operands {
  apex_var *x, *w, *b;
  apex_tensor *r;
} operands;

static operands make(const shape *s, uint64_t seed) {
  operands p = {tu_random_leaf(APEX_BF16, 4, (int64_t[]){s->n, s->c, s->h, s->w}, seed, 1),
                tu_random_leaf(APEX_BF16, 4, (int64_t[]){s->o, s->c, s->kh, s->kw}, seed + 1, 1),
                tu_random_leaf(APEX_F32, 1, (int64_t[]){s->o}, seed + 2, 1), tu_random_tensor(APEX_F32, out_numel(s), seed + 3, 1.0f)};
  return p;
}

static void drop(operands *p) {
  apex_var_destroy(p->x);
  apex_var_destroy(p->w);
  apex_var_destroy(p->b);
  apex_tensor_destroy(p->r);
}

static void test_matches_portable(void **state) {
  (void)state;
  if (skip_without_path()) return;
  for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
    const shape *s = &shapes[k];
    operands p = make(s, 100 + 10 * k);
    TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_PORTABLE));
    unsigned long before = apex__conv_onednn_products();
    run ref = run_conv(s, p.x, p.w, p.b, p.r);
    assert_true(apex__conv_onednn_products() == before); /* the reference never takes the path */
    TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_NATIVE));
    run got = run_conv(s, p.x, p.w, p.b, p.r);
    assert_true(apex__conv_onednn_products() == before + 3 * (unsigned long)s->n); /* three products per image */

    char what[96];
    const apex_tensor *X = apex_var_value(p.x), *W = apex_var_value(p.w);
    double *bx = conv_rounding_bound(0, X, W, p.r, &s->opt), *bw = conv_rounding_bound(1, X, W, p.r, &s->opt);
    snprintf(what, sizeof what, "shape %zu output", k);
    check(what, got.y, ref.y, 1e-5, NULL, 1);
    snprintf(what, sizeof what, "shape %zu grad x", k);
    check(what, got.gx, ref.gx, 1e-5, bx, apex_tensor_dtype(apex_var_grad(p.x)) != APEX_F32);
    snprintf(what, sizeof what, "shape %zu grad w", k);
    check(what, got.gw, ref.gw, 1e-5, bw, apex_tensor_dtype(apex_var_grad(p.w)) != APEX_F32);
    snprintf(what, sizeof what, "shape %zu grad bias", k);
    check(what, got.gb, ref.gb, 0, NULL, 0);
    free(bx);
    free(bw);
    free_run(&ref);
    free_run(&got);
    drop(&p);
  }
}

/* 1, 2 and 3 threads give the same bits for the output and every gradient, on every shape. */
static void test_thread_count_bitwise(void **state) {
  (void)state;
  if (skip_without_path()) return;
  int saved = apex_get_num_threads();
  for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
    const shape *s = &shapes[k];
    operands p = make(s, 7 + 10 * k);
    run first = {0};
    for (int threads = 1; threads <= 3; threads++) {
      TU_OK(apex_set_num_threads(threads));
      unsigned long before = apex__conv_onednn_products();
      run q = run_conv(s, p.x, p.w, p.b, p.r);
      assert_true(apex__conv_onednn_products() == before + 3 * (unsigned long)s->n);
      if (threads == 1) {
        first = q;
        continue;
      }
      const apex_tensor *pairs[4][2] = {{q.y, first.y}, {q.gx, first.gx}, {q.gw, first.gw}, {q.gb, first.gb}};
      for (int r = 0; r < 4; r++)
        for (size_t i = 0; i < apex_tensor_numel(pairs[r][1]); i++)
          if (tu_bits(apex_tensor_get(pairs[r][0], i)) != tu_bits(apex_tensor_get(pairs[r][1], i)))
            fail_msg("shape %zu, result %d, element %zu: %d threads give %.9g, 1 thread %.9g", k, r, i, threads,
                     apex_tensor_get(pairs[r][0], i), apex_tensor_get(pairs[r][1], i));
      free_run(&q);
    }
    free_run(&first);
    drop(&p);
  }
  TU_OK(apex_set_num_threads(saved));
}

/* f16 operands: oneDNN has no f16 matmul on a CPU without AVX512_FP16, and the weight gradient's f32
 * operand is never rounded to f16; whatever runs must agree with the f32 path on the same values. */
static void test_f16_takes_a_working_path(void **state) {
  (void)state;
  if (skip_without_path()) return;
  const shape *s = &shapes[0];
  apex_var *x = tu_random_leaf(APEX_F16, 4, (int64_t[]){s->n, s->c, s->h, s->w}, 3, 1);
  apex_var *w = tu_random_leaf(APEX_F16, 4, (int64_t[]){s->o, s->c, s->kh, s->kw}, 4, 1);
  apex_var *b = tu_random_leaf(APEX_F32, 1, (int64_t[]){s->o}, 5, 1);
  apex_tensor *r = tu_random_tensor(APEX_F32, out_numel(s), 6, 1.0f);
  run got = run_conv(s, x, w, b, r);
  TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_PORTABLE));
  run ref = run_conv(s, x, w, b, r);
  TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_NATIVE));
  /* one f16 ulp at the element (2^-10 relative) where either path rounds to f16 */
  for (size_t i = 0; i < apex_tensor_numel(ref.y); i++) {
    double a = apex_tensor_get(ref.y, i), g = apex_tensor_get(got.y, i);
    if (!(fabs(a - g) <= 1e-5 + ldexp(fabs(a), -10))) fail_msg("f16 output[%zu]: %.9g vs reference %.9g", i, g, a);
  }
  check("f16 grad bias", got.gb, ref.gb, 0, NULL, 0);
  free_run(&got);
  free_run(&ref);
  apex_tensor_destroy(r);
  apex_var_destroy(x);
  apex_var_destroy(w);
  apex_var_destroy(b);
}

/* Runs first, before anything resolves the cap: APEX_CPU_ISA=avx512 turns the path off, and conv2d
 * still runs (on the f32 path) with the bits of avx512's f32 path. */
static void test_env_avx512_disables(void **state) {
  (void)state;
  if (!env_avx512_begin()) return;
  const char *why = NULL;
  const shape *s = &shapes[1];
  operands p = make(s, 77);
  unsigned long before = apex__conv_onednn_products();
  run off = run_conv(s, p.x, p.w, p.b, p.r);
  assert_true(apex__conv_onednn_products() == before);
  TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_AVX512_BF16));
  if (apex__onednn_active(&why)) {
    run on = run_conv(s, p.x, p.w, p.b, p.r);
    assert_true(apex__conv_onednn_products() == before + 3 * (unsigned long)s->n);
    free_run(&on);
  } else {
    printf("# oneDNN path absent at avx512_bf16: %s\n", why);
  }
  free_run(&off);
  drop(&p);
  env_avx512_end();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_env_avx512_disables),
      cmocka_unit_test(test_matches_portable),
      cmocka_unit_test(test_thread_count_bitwise),
      cmocka_unit_test(test_f16_takes_a_working_path),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
