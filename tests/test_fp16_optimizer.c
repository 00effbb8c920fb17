/* test_fp16_optimizer.c: FP16_Optimizer semantics for a bring-your-own model: f16 parameter and
 * gradient buffers owned by the program (wrapped, not copied), a hand-written gradient, dynamic loss
 * scaling, f32 masters.
 *
 * The model is w in R^64 with loss 0.5 * |w - t|^2, so the gradient is w - t. The reference is the
 * same arithmetic written out here in f32: the program's scaled gradient rounded to f16, divided by
 * the scale (exact: a power of two), and plain SGD on an f32 copy. */
#include <math.h>
#include <stdlib.h>

#include "apex/fp16_optimizer.h"
#include "testutil.h"

enum { N = 64 };

typedef struct {
  uint16_t w[N], g[N];    /* the program's own buffers */
  apex_tensor *wt, *gt;   /* apex's views of them */
  apex_optimizer *opt;
  apex_fp16_optimizer *fo;
} byo;

static float target(int i) { return (float)((i % 7) - 3) * 2.5f; }

static void byo_init(byo *b, const apex_loss_scaler_config *sc) {
  for (int i = 0; i < N; i++) b->w[i] = apex_f32_to_f16(0.01f * (float)i);
  int64_t n = N;
  b->wt = apex_tensor_wrap(b->w, APEX_F16, 1, &n);
  b->gt = apex_tensor_wrap(b->g, APEX_F16, 1, &n);
  b->opt = apex_optimizer_create(APEX_OPTIM_SGD, &(apex_optim_options){.lr = 0.25f});
  TU_OK(apex_optimizer_add_group(b->opt, &b->wt, 1, &b->gt, 1, NULL, NULL));
  b->fo = apex_fp16_optimizer_create(b->opt, sc);
  assert_non_null(b->fo);
}

static void byo_free(byo *b) {
  apex_fp16_optimizer_destroy(b->fo);
  apex_optimizer_destroy(b->opt);
  apex_tensor_destroy(b->wt);
  apex_tensor_destroy(b->gt);
}

/* The program's backward: the gradient of loss * scale at the f16 weights, rounded to f16. */
static void backward(byo *b, float scale) {
  for (int i = 0; i < N; i++) b->g[i] = apex_f32_to_f16((apex_f16_to_f32(b->w[i]) - target(i)) * scale);
}

static void test_follows_f32_reference_and_skips(void **state) {
  (void)state;
  byo b;
  byo_init(&b, NULL); /* dynamic, 2^16 */
  float master[N];
  for (int i = 0; i < N; i++) master[i] = apex_f16_to_f32(b.w[i]); /* masters start as the f16 weights widened */
  /* |w - t| reaches 10.5: 10.5 * 2^13 overflows f16 (65504), 10.5 * 2^12 does not: 4 skips, then steps. */
  float expect_scale = 65536.0f;
  for (int step = 0; step < 12; step++) {
    float s = apex_fp16_optimizer_loss_scale(b.fo);
    assert_true(s == expect_scale);
    backward(&b, s);
    int overflow = 0;
    for (int i = 0; i < N; i++) overflow |= isinf(apex_f16_to_f32(b.g[i])) != 0;
    int skipped;
    TU_OK(apex_fp16_optimizer_step(b.fo, &skipped));
    assert_int_equal(skipped, overflow);
    if (overflow) {
      expect_scale /= 2;
    } else {
      for (int i = 0; i < N; i++) master[i] = master[i] - 0.25f * (apex_f16_to_f32(b.g[i]) * (1.0f / s));
    }
    apex_tensor *m = apex_optimizer_master(b.opt, 0, 0);
    for (int i = 0; i < N; i++) {
      float got = apex_tensor_get(m, i);
      if (fabsf(got - master[i]) > 1e-6f * fmaxf(fabsf(master[i]), 1.0f)) fail_msg("step %d element %d: %g vs %g", step, i, got, master[i]);
      assert_int_equal(b.w[i], apex_f32_to_f16(got)); /* the program's buffer is the master rounded */
    }
  }
  assert_true(expect_scale == 4096.0f);
  /* An Inf from the program skips the step and leaves the masters as they were. */
  float before[N];
  memcpy(before, apex_tensor_data(apex_optimizer_master(b.opt, 0, 0)), sizeof before);
  backward(&b, apex_fp16_optimizer_loss_scale(b.fo));
  b.g[17] = 0x7C00;
  int skipped;
  TU_OK(apex_fp16_optimizer_step(b.fo, &skipped));
  assert_int_equal(skipped, 1);
  assert_memory_equal(before, apex_tensor_data(apex_optimizer_master(b.opt, 0, 0)), sizeof before);
  assert_true(apex_fp16_optimizer_loss_scale(b.fo) == 2048.0f);
  byo_free(&b);
}

/* An overflow with the scale already at its minimum: the step is skipped and reported as for any
 * overflow (APEX_OK, *skipped = 1, masters unchanged), and the scaler's query says the minimum was
 * hit, so a generic "stop unless APEX_OK" loop keeps going while one that cares can stop. */
static void test_overflow_at_min_scale(void **state) {
  (void)state;
  byo b;
  byo_init(&b, &(apex_loss_scaler_config){.init_scale = 4096, .min_scale = 4096});
  apex_loss_scaler *sc = apex_fp16_optimizer_scaler(b.fo);
  float before[N];
  for (int round = 0; round < 2; round++) {
    memcpy(before, apex_tensor_data(apex_optimizer_master(b.opt, 0, 0)), sizeof before);
    backward(&b, apex_fp16_optimizer_loss_scale(b.fo));
    b.g[5] = 0x7E00; /* NaN from the program */
    int skipped = 0;
    TU_OK(apex_fp16_optimizer_step(b.fo, &skipped));
    assert_int_equal(skipped, 1);
    assert_int_equal(apex_loss_scaler_at_min(sc), 1);
    assert_true(apex_fp16_optimizer_loss_scale(b.fo) == 4096.0f);
    assert_memory_equal(before, apex_tensor_data(apex_optimizer_master(b.opt, 0, 0)), sizeof before);
  }
  /* |w - t| * 4096 <= 10.5 * 4096 fits f16: a real step, and the query is clear. */
  backward(&b, apex_fp16_optimizer_loss_scale(b.fo));
  int skipped = 1;
  TU_OK(apex_fp16_optimizer_step(b.fo, &skipped));
  assert_int_equal(skipped, 0);
  assert_int_equal(apex_loss_scaler_at_min(sc), 0);
  assert_true(memcmp(before, apex_tensor_data(apex_optimizer_master(b.opt, 0, 0)), sizeof before) != 0);
  byo_free(&b);
}

static void test_clip_master_grads(void **state) {
  (void)state;
  byo b;
  byo_init(&b, &(apex_loss_scaler_config){.mode = APEX_SCALE_STATIC, .init_scale = 256});
  backward(&b, 256);
  double sq = 0;
  for (int i = 0; i < N; i++) {
    double g = apex_f16_to_f32(b.g[i]) / 256.0;
    sq += g * g;
  }
  float norm;
  TU_OK(apex_fp16_optimizer_clip_master_grads(b.fo, 1.0f, &norm));
  assert_true(fabs(norm - sqrt(sq)) < 1e-4 * sqrt(sq));
  float w0[N];
  memcpy(w0, apex_tensor_data(apex_optimizer_master(b.opt, 0, 0)), sizeof w0);
  TU_OK(apex_fp16_optimizer_step(b.fo, NULL));
  /* The step moved by lr * clipped gradient: its norm is lr * 1. */
  double moved = 0;
  for (int i = 0; i < N; i++) {
    double d = apex_tensor_get(apex_optimizer_master(b.opt, 0, 0), i) - w0[i];
    moved += d * d;
  }
  assert_true(fabs(sqrt(moved) - 0.25) < 1e-4);
  byo_free(&b);
}

/* Save after 6 steps, load into fresh objects, 6 more: the same bits as 12 straight. */
static void test_save_load_bitwise(void **state) {
  (void)state;
  byo a, b, c;
  byo_init(&a, NULL);
  for (int s = 0; s < 12; s++) {
    backward(&a, apex_fp16_optimizer_loss_scale(a.fo));
    TU_OK(apex_fp16_optimizer_step(a.fo, NULL));
  }
  byo_init(&b, NULL);
  for (int s = 0; s < 6; s++) {
    backward(&b, apex_fp16_optimizer_loss_scale(b.fo));
    TU_OK(apex_fp16_optimizer_step(b.fo, NULL));
  }
  size_t size, written;
  TU_OK(apex_fp16_optimizer_state_size(b.fo, &size));
  uint8_t *buf = malloc(size);
  TU_OK(apex_fp16_optimizer_save(b.fo, buf, size, &written));
  assert_int_equal(written, size);
  byo_init(&c, NULL);
  TU_OK(apex_fp16_optimizer_load(c.fo, buf, size));
  for (int s = 0; s < 6; s++) {
    backward(&c, apex_fp16_optimizer_loss_scale(c.fo));
    TU_OK(apex_fp16_optimizer_step(c.fo, NULL));
  }
  assert_memory_equal(a.w, c.w, sizeof a.w);
  assert_memory_equal(apex_tensor_data(apex_optimizer_master(a.opt, 0, 0)), apex_tensor_data(apex_optimizer_master(c.opt, 0, 0)), N * 4);
  assert_true(apex_fp16_optimizer_loss_scale(a.fo) == apex_fp16_optimizer_loss_scale(c.fo));
  /* A corrupted buffer is refused and changes nothing. */
  apex_loss_scaler_state before = apex_loss_scaler_get_state(apex_fp16_optimizer_scaler(c.fo));
  buf[size - 3] ^= 0x40;
  assert_int_not_equal(apex_fp16_optimizer_load(c.fo, buf, size), APEX_OK);
  apex_loss_scaler_state after = apex_loss_scaler_get_state(apex_fp16_optimizer_scaler(c.fo));
  tu_assert_scaler_state_equal(&before, &after);
  TU_FAILS(apex_fp16_optimizer_load(c.fo, buf, 8), APEX_ERR_CORRUPT, "too short");
  free(buf);
  byo_free(&a);
  byo_free(&b);
  byo_free(&c);
}

static void test_bad_input(void **state) {
  (void)state;
  assert_null(apex_fp16_optimizer_create(NULL, NULL));
  tu_assert_message("NULL optimizer");
  byo b;
  byo_init(&b, NULL);
  assert_null(apex_fp16_optimizer_create(b.opt, &(apex_loss_scaler_config){.growth_factor = 0.5f}));
  tu_assert_message("growth_factor");
  TU_FAILS(apex_fp16_optimizer_step(NULL, NULL), APEX_ERR_INVALID_ARG, "NULL");
  TU_FAILS(apex_fp16_optimizer_clip_master_grads(b.fo, -1.0f, NULL), APEX_ERR_INVALID_ARG, "max_norm");
  byo_free(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_follows_f32_reference_and_skips),
      cmocka_unit_test(test_clip_master_grads),
      cmocka_unit_test(test_overflow_at_min_scale),
      cmocka_unit_test(test_save_load_bitwise),
      cmocka_unit_test(test_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
