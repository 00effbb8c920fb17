/* test_loss_scaler.c: static and dynamic loss scaling.
 *
 * Expected scales are written in closed form from the rule in loss_scaler.h (halving per overflow,
 * doubling after each full window, clamps, hysteresis), not by re-running the scaler's code. */
#include <math.h>

#include "apex/cuda.h"
#include "apex/optim.h"
#include "testutil.h"

static apex_loss_scaler *make(apex_loss_scaler_config c) {
  apex_loss_scaler *s = apex_loss_scaler_create(&c);
  if (!s) fail_msg("create failed: %s", apex_last_error());
  return s;
}

static void test_defaults_are_apex(void **state) {
  (void)state;
  apex_loss_scaler *s = apex_loss_scaler_create(NULL);
  apex_loss_scaler_config c = apex_loss_scaler_get_config(s);
  assert_true(c.init_scale == 65536.0f && c.growth_factor == 2.0f && c.backoff_factor == 0.5f);
  assert_int_equal(c.growth_interval, 2000);
  assert_true(c.max_scale == 16777216.0f);
  assert_int_equal(c.hysteresis, 1);
  /* 1999 clean steps: no growth yet; the 2000th doubles. */
  for (int i = 0; i < 1999; i++) TU_OK(apex_loss_scaler_update(s, 0, NULL));
  assert_true(apex_loss_scaler_scale(s) == 65536.0f);
  TU_OK(apex_loss_scaler_update(s, 0, NULL));
  assert_true(apex_loss_scaler_scale(s) == 131072.0f);
  assert_true(apex_loss_scaler_inv_scale(s) == 1.0f / 131072.0f);
  apex_loss_scaler_destroy(s);
}

/* After k overflows the scale is init / 2^k and the unskipped count is 0 (Apex's L0 test). */
static void test_halving_per_overflow(void **state) {
  (void)state;
  apex_loss_scaler *s = make((apex_loss_scaler_config){.growth_interval = 5});
  TU_OK(apex_loss_scaler_update(s, 0, NULL));
  TU_OK(apex_loss_scaler_update(s, 0, NULL));
  for (int k = 1; k <= 10; k++) {
    int skip = 0;
    TU_OK(apex_loss_scaler_update(s, 1, &skip));
    assert_int_equal(skip, 1);
    assert_true(apex_loss_scaler_scale(s) == ldexpf(65536.0f, -k));
    assert_int_equal(apex_loss_scaler_get_state(s).growth_tracker, 0);
  }
  assert_int_equal(apex_loss_scaler_get_state(s).skipped, 10);
  apex_loss_scaler_destroy(s);
}

static void test_growth_and_max_clamp(void **state) {
  (void)state;
  apex_loss_scaler *s = make((apex_loss_scaler_config){.init_scale = 0x1p22f, .growth_interval = 3, .growth_factor = 2});
  const float expect[12] = {0x1p22f, 0x1p22f, 0x1p23f, 0x1p23f, 0x1p23f, 0x1p24f,
                            0x1p24f, 0x1p24f, 0x1p24f, 0x1p24f, 0x1p24f, 0x1p24f};
  for (int i = 0; i < 12; i++) {
    int skip = 1;
    TU_OK(apex_loss_scaler_update(s, 0, &skip));
    assert_int_equal(skip, 0);
    if (apex_loss_scaler_scale(s) != expect[i]) fail_msg("step %d: scale %g, expected %g", i, apex_loss_scaler_scale(s), expect[i]);
  }
  apex_loss_scaler_destroy(s);
  /* An overflow restarts the window: 2 clean, overflow, 2 clean -> no growth; 1 more -> growth. */
  s = make((apex_loss_scaler_config){.init_scale = 1024, .growth_interval = 3, .growth_factor = 4, .backoff_factor = 0.25f});
  int pattern[6] = {0, 0, 1, 0, 0, 0};
  float scales[6] = {1024, 1024, 256, 256, 256, 1024};
  for (int i = 0; i < 6; i++) {
    TU_OK(apex_loss_scaler_update(s, pattern[i], NULL));
    assert_true(apex_loss_scaler_scale(s) == scales[i]);
  }
  apex_loss_scaler_destroy(s);
}

static void test_min_clamp_and_status(void **state) {
  (void)state;
  apex_loss_scaler *s = make((apex_loss_scaler_config){.init_scale = 0x1p16f, .min_scale = 0x1p14f});
  int skip;
  assert_int_equal(apex_loss_scaler_at_min(s), 0); /* no update yet */
  TU_OK(apex_loss_scaler_update(s, 1, &skip));
  assert_int_equal(apex_loss_scaler_at_min(s), 0); /* 2^16 -> 2^15: above the minimum when it overflowed */
  TU_OK(apex_loss_scaler_update(s, 1, &skip));
  assert_int_equal(apex_loss_scaler_at_min(s), 0); /* 2^15 -> 2^14: reaching the minimum is not being at it */
  assert_true(apex_loss_scaler_scale(s) == 0x1p14f);
  /* Already at the minimum: still skipped, the call succeeds (a generic "abort unless OK" loop goes
   * on), and the query tells the caller. */
  skip = 0;
  TU_OK(apex_loss_scaler_update(s, 1, &skip));
  assert_int_equal(skip, 1);
  assert_int_equal(apex_loss_scaler_at_min(s), 1);
  assert_true(apex_loss_scaler_scale(s) == 0x1p14f);
  apex_loss_scaler_state st = apex_loss_scaler_get_state(s);
  assert_int_equal(st.skipped, 3);
  assert_int_equal(st.steps, 3);
  /* A clean step afterwards is fine and clears the query. */
  TU_OK(apex_loss_scaler_update(s, 0, &skip));
  assert_int_equal(skip, 0);
  assert_int_equal(apex_loss_scaler_at_min(s), 0);
  /* Another overflow at the minimum sets it again; restoring a state clears it (no last update). */
  TU_OK(apex_loss_scaler_update(s, 1, &skip));
  assert_int_equal(apex_loss_scaler_at_min(s), 1);
  TU_OK(apex_loss_scaler_set_state(s, &st));
  assert_int_equal(apex_loss_scaler_at_min(s), 0);
  apex_loss_scaler_destroy(s);
  /* A static scaler never backs off, so it is never "at the minimum", even with its scale there. */
  s = make((apex_loss_scaler_config){.mode = APEX_SCALE_STATIC, .init_scale = 0x1p-24f});
  TU_OK(apex_loss_scaler_update(s, 1, &skip));
  assert_int_equal(skip, 1);
  assert_int_equal(apex_loss_scaler_at_min(s), 0);
  apex_loss_scaler_destroy(s);
}

/* Every accessor takes NULL without crashing: a value no scaler has, and a message. */
static void test_null_accessors(void **state) {
  (void)state;
  apex_clear_error();
  assert_true(isnan(apex_loss_scaler_scale(NULL)));
  tu_assert_message("apex_loss_scaler_scale: NULL loss scaler");
  assert_int_equal(apex_last_status(), APEX_ERR_INVALID_ARG);
  assert_true(isnan(apex_loss_scaler_inv_scale(NULL)));
  tu_assert_message("apex_loss_scaler_inv_scale: NULL");
  apex_loss_scaler_config c = apex_loss_scaler_get_config(NULL);
  assert_true(c.init_scale == 0 && c.growth_interval == 0 && c.min_scale == 0);
  tu_assert_message("apex_loss_scaler_get_config: NULL");
  apex_loss_scaler_state st = apex_loss_scaler_get_state(NULL);
  assert_true(st.scale == 0 && st.steps == 0 && st.skipped == 0);
  tu_assert_message("apex_loss_scaler_get_state: NULL");
  assert_int_equal(apex_loss_scaler_at_min(NULL), 0);
}

/* Hysteresis 2: the first overflow after a reset is tolerated (skipped, no backoff), later ones back
 * off until a growth resets the counter. */
static void test_hysteresis(void **state) {
  (void)state;
  apex_loss_scaler *s = make((apex_loss_scaler_config){.init_scale = 1024, .growth_interval = 2, .hysteresis = 2});
  const int pattern[9] = {1, 1, 1, 0, 0, 1, 1, 0, 1};
  const float expect[9] = {1024, 512, 256, 256, 512, 512, 256, 256, 128};
  const int skips[9] = {1, 1, 1, 0, 0, 1, 1, 0, 1};
  for (int i = 0; i < 9; i++) {
    int skip = -1;
    TU_OK(apex_loss_scaler_update(s, pattern[i], &skip));
    assert_int_equal(skip, skips[i]);
    if (apex_loss_scaler_scale(s) != expect[i]) fail_msg("step %d: scale %g, expected %g", i, apex_loss_scaler_scale(s), expect[i]);
  }
  apex_loss_scaler_destroy(s);
}

static void test_static(void **state) {
  (void)state;
  apex_loss_scaler *s = make((apex_loss_scaler_config){.mode = APEX_SCALE_STATIC, .init_scale = 128});
  for (int i = 0; i < 10; i++) {
    int skip;
    TU_OK(apex_loss_scaler_update(s, i == 4, &skip));
    assert_int_equal(skip, i == 4);
    assert_true(apex_loss_scaler_scale(s) == 128.0f);
  }
  apex_loss_scaler_destroy(s);
  s = make((apex_loss_scaler_config){.mode = APEX_SCALE_STATIC});
  assert_true(apex_loss_scaler_scale(s) == 1.0f);
  apex_loss_scaler_destroy(s);
}

static void test_save_load_bitwise(void **state) {
  (void)state;
  apex_loss_scaler_config c = {.init_scale = 4096, .growth_interval = 3, .hysteresis = 2, .growth_factor = 1.5f};
  apex_loss_scaler *a = make(c), *b = make(c);
  apex_rng rng = apex_rng_init(5);
  float u[64];
  TU_OK(apex_rng_uniform(&rng, u, 64));
  for (int i = 0; i < 32; i++) TU_OK(apex_loss_scaler_update(a, u[i] < 0.3f, NULL));
  uint8_t buf[APEX_LOSS_SCALER_STATE_BYTES];
  TU_OK(apex_loss_scaler_save(a, buf, sizeof buf));
  TU_OK(apex_loss_scaler_load(b, buf, sizeof buf));
  for (int i = 32; i < 64; i++) {
    TU_OK(apex_loss_scaler_update(a, u[i] < 0.3f, NULL));
    TU_OK(apex_loss_scaler_update(b, u[i] < 0.3f, NULL));
    apex_loss_scaler_state sa = apex_loss_scaler_get_state(a), sb = apex_loss_scaler_get_state(b);
    tu_assert_scaler_state_equal(&sa, &sb);
  }
  /* Corrupted, truncated or foreign buffers are refused and change nothing. */
  apex_loss_scaler_state before = apex_loss_scaler_get_state(b);
  uint8_t bad[APEX_LOSS_SCALER_STATE_BYTES];
  memcpy(bad, buf, sizeof bad);
  bad[0] ^= 1;
  TU_FAILS(apex_loss_scaler_load(b, bad, sizeof bad), APEX_ERR_CORRUPT, "magic");
  TU_FAILS(apex_loss_scaler_load(b, buf, 12), APEX_ERR_CORRUPT, "12 bytes");
  memcpy(bad, buf, sizeof bad);
  bad[4] = 9;
  TU_FAILS(apex_loss_scaler_load(b, bad, sizeof bad), APEX_ERR_CORRUPT, "version 9");
  memcpy(bad, buf, sizeof bad);
  memset(bad + 8, 0xFF, 4); /* scale = NaN */
  TU_FAILS(apex_loss_scaler_load(b, bad, sizeof bad), APEX_ERR_CORRUPT, "scale");
  apex_loss_scaler_state after = apex_loss_scaler_get_state(b);
  tu_assert_scaler_state_equal(&before, &after);
  TU_FAILS(apex_loss_scaler_save(a, buf, 8), APEX_ERR_INVALID_ARG, "need 40");
  apex_loss_scaler_destroy(a);
  apex_loss_scaler_destroy(b);
}

static void test_invalid_settings(void **state) {
  (void)state;
  struct {
    apex_loss_scaler_config c;
    const char *needle;
  } cases[] = {
      {{.growth_factor = 1.0f}, "growth_factor"},
      {{.growth_factor = 0.5f}, "growth_factor"},
      {{.backoff_factor = 1.0f}, "backoff_factor"},
      {{.backoff_factor = 2.0f}, "backoff_factor"},
      {{.backoff_factor = -0.5f}, "backoff_factor"},
      {{.growth_interval = -1}, "growth_interval"},
      {{.hysteresis = -2}, "hysteresis"},
      {{.min_scale = 100, .max_scale = 10, .init_scale = 50}, "min_scale 100 is above max_scale 10"},
      {{.init_scale = 1e9f}, "init_scale"},
      {{.init_scale = 1.0f, .min_scale = 2.0f}, "init_scale"},
      {{.init_scale = INFINITY}, "init_scale"},
      {{.max_scale = NAN}, "max_scale"},
      {{.mode = (apex_scale_mode)7}, "mode"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    apex_loss_scaler *s = apex_loss_scaler_create(&cases[i].c);
    if (s) fail_msg("case %zu (%s) was accepted", i, cases[i].needle);
    tu_assert_message(cases[i].needle);
  }
  apex_loss_scaler *s = apex_loss_scaler_create(NULL);
  apex_loss_scaler_state st = apex_loss_scaler_get_state(s);
  st.scale = -1;
  TU_FAILS(apex_loss_scaler_set_state(s, &st), APEX_ERR_INVALID_ARG, "scale -1");
  TU_FAILS(apex_loss_scaler_update(NULL, 0, NULL), APEX_ERR_INVALID_ARG, "NULL");
  apex_loss_scaler_destroy(s);
}

/* The scaler's own found_inf flag (raised by apex_loss_scaler_check) drives the rule exactly as a
 * found_inf handed to update does: a scaler fed the flags by hand is the reference. */
static void test_check_raises_flag_like_host_found_inf(void **state) {
  (void)state;
  apex_loss_scaler_config c = {.init_scale = 1024.0f, .growth_interval = 3, .hysteresis = 2, .min_scale = 1.0f};
  apex_loss_scaler *ref = make(c);
  apex_loss_scaler *s = apex_loss_scaler_create_on(APEX_DEVICE_CPU, &c);
  assert_non_null(s);
  assert_int_equal(apex_loss_scaler_device(s), APEX_DEVICE_CPU);
  int64_t n = 100;
  apex_tensor *g = apex_tensor_create(APEX_F16, 1, &n), *gl[1] = {g};
  uint32_t x = 12345;
  for (int step = 0; step < 200; step++) {
    x = x * 1103515245u + 12345u;
    int inf = (x >> 16) % 4 == 0;
    TU_OK(apex_tensor_fill(g, 1.0f));
    if (inf) apex_tensor_set(g, (size_t)(x % 100), (x & 1) ? NAN : -INFINITY);
    TU_OK(apex_loss_scaler_check(s, gl, 1));
    assert_int_equal(*apex_loss_scaler_found_inf_ptr(s) != 0, inf);
    int skip_ref = -1, skip = -1;
    TU_OK(apex_loss_scaler_update(ref, inf, &skip_ref));
    TU_OK(apex_loss_scaler_update(s, 0, &skip));
    assert_int_equal(skip, inf);
    assert_int_equal(skip, skip_ref);
    assert_int_equal(*apex_loss_scaler_found_inf_ptr(s), 0); /* the update clears it */
    assert_int_equal(apex_loss_scaler_at_min(s), apex_loss_scaler_at_min(ref));
  }
  apex_loss_scaler_state a = apex_loss_scaler_get_state(ref), b = apex_loss_scaler_get_state(s);
  tu_assert_scaler_state_equal(&b, &a);
  assert_true(a.skipped > 0 && a.skipped < a.steps);
  assert_true(*apex_loss_scaler_scale_ptr(s) == a.scale);
  /* unscale divides by the scale, scale_tensor multiplies: closed forms in f16 and f32 */
  TU_OK(apex_tensor_fill(g, 3.0f));
  TU_OK(apex_loss_scaler_unscale(s, gl, gl, 1));
  assert_true(apex_tensor_get(g, 5) == apex_f16_to_f32(apex_f32_to_f16(3.0f / a.scale)));
  assert_int_equal(*apex_loss_scaler_found_inf_ptr(s), 0);
  apex_tensor *l = apex_tensor_create(APEX_F32, 1, &n);
  TU_OK(apex_tensor_fill(l, 1.5f));
  TU_OK(apex_loss_scaler_scale_tensor(s, l));
  assert_true(apex_tensor_get(l, 99) == 1.5f * a.scale);
  /* a found_inf from the host and one raised by a check are one overflow, not two */
  apex_tensor_set(g, 0, INFINITY);
  TU_OK(apex_loss_scaler_check(s, gl, 1));
  int skip = 0;
  TU_OK(apex_loss_scaler_update(s, 1, &skip));
  TU_OK(apex_loss_scaler_update(ref, 1, NULL));
  a = apex_loss_scaler_get_state(ref);
  b = apex_loss_scaler_get_state(s);
  tu_assert_scaler_state_equal(&b, &a);
  /* set_state clears a raised flag */
  TU_OK(apex_loss_scaler_check(s, gl, 1));
  TU_OK(apex_loss_scaler_set_state(s, &a));
  assert_int_equal(*apex_loss_scaler_found_inf_ptr(s), 0);
  /* bad arguments: refused, nothing changed */
  TU_FAILS(apex_loss_scaler_check(NULL, gl, 1), APEX_ERR_INVALID_ARG, "apex_loss_scaler_check: NULL scaler");
  TU_FAILS(apex_loss_scaler_check(s, NULL, 1), APEX_ERR_INVALID_ARG, "bad tensor list");
  TU_FAILS(apex_loss_scaler_check(s, gl, -1), APEX_ERR_INVALID_ARG, "bad tensor list (-1 tensors)");
  TU_FAILS(apex_loss_scaler_unscale(s, gl, NULL, 1), APEX_ERR_INVALID_ARG, "NULL output list");
  TU_FAILS(apex_loss_scaler_scale_tensor(s, NULL), APEX_ERR_INVALID_ARG, "apex_loss_scaler_scale_tensor");
  b = apex_loss_scaler_get_state(s);
  tu_assert_scaler_state_equal(&b, &a);
  assert_int_equal(*apex_loss_scaler_found_inf_ptr(s), 0);
  assert_null(apex_loss_scaler_scale_ptr(NULL));
  tu_assert_message("apex_loss_scaler_scale_ptr: NULL");
  assert_null(apex_loss_scaler_found_inf_ptr(NULL));
  apex_clear_error();
  assert_int_equal(apex_loss_scaler_device(NULL), APEX_DEVICE_CPU);
  tu_assert_message("apex_loss_scaler_device: NULL");
  apex_tensor_destroy(l);
  apex_tensor_destroy(g);
  apex_loss_scaler_destroy(s);
  apex_loss_scaler_destroy(ref);
}

/* create_on refuses a device it cannot use, saying why. */
static void test_create_on_bad_device(void **state) {
  (void)state;
  assert_null(apex_loss_scaler_create_on((apex_device)7, NULL));
  tu_assert_message("apex_loss_scaler_create_on: unknown device 7");
  assert_int_equal(apex_last_status(), APEX_ERR_INVALID_ARG);
  const char *why = NULL;
  apex_loss_scaler *g = apex_loss_scaler_create_on(APEX_DEVICE_CUDA, NULL);
  if (g) { /* a GPU: the device scaler is tested in test_cuda */
    assert_int_equal(apex_loss_scaler_device(g), APEX_DEVICE_CUDA);
    apex_loss_scaler_destroy(g);
    return;
  }
  assert_int_equal(apex_last_status(), APEX_ERR_UNSUPPORTED);
  assert_false(apex_cuda_available(&why));
  tu_assert_message(why);
  /* the configuration is still checked first on a device that can be used */
  assert_null(apex_loss_scaler_create_on(APEX_DEVICE_CPU, &(apex_loss_scaler_config){.growth_factor = 0.5f}));
  tu_assert_message("growth_factor");
}

/* apex_optimizer_step_scaled reads the scale and the skip where the scaler keeps them: on the CPU it
 * gives the bits apex_optimizer_step gives with the same scale, for every kind, and a raised flag
 * changes nothing at all, step counts included. The scale is a power of two, so LAMB's global norm with
 * the scale divided out after the sums (as the backends do) is exactly the norm of the unscaled gradients:
 * LAMB failed here while the CPU backend forgot to divide it out. */
static void test_step_scaled_matches_step(void **state) {
  (void)state;
  const int64_t n = 1000;
  apex_tensor *f = tu_random_tensor(APEX_F32, (size_t)n, 11, 1.0f);
  apex_tensor *gf = tu_random_tensor(APEX_F32, (size_t)n, 12, 1.0f);
  const float scale = 4096.0f;
  for (int kind = 0; kind < APEX_OPTIM_KIND_COUNT; kind++) {
    apex_optim_options o = {.lr = 1e-2f, .weight_decay = 1e-2f};
    apex_optimizer *a = apex_optimizer_create((apex_optim_kind)kind, &o), *b = apex_optimizer_create((apex_optim_kind)kind, &o);
    apex_tensor *pa = apex_tensor_create(APEX_BF16, 1, &n), *pb = apex_tensor_create(APEX_BF16, 1, &n);
    apex_tensor *g = apex_tensor_create(APEX_F16, 1, &n);
    TU_OK(apex_tensor_copy(pa, f));
    TU_OK(apex_tensor_copy(pb, f));
    TU_OK(apex_tensor_copy(g, gf));
    TU_OK(apex_optimizer_add_group(a, &pa, 1, &g, 1, NULL, NULL));
    TU_OK(apex_optimizer_add_group(b, &pb, 1, &g, 1, NULL, NULL));
    apex_loss_scaler *s = apex_loss_scaler_create(&(apex_loss_scaler_config){.init_scale = scale});
    for (int step = 0; step < 3; step++) {
      TU_OK(apex_optimizer_step(a, scale, 0));
      TU_OK(apex_loss_scaler_check(s, &g, 1));
      TU_OK(apex_optimizer_step_scaled(b, s));
      int skip = 1;
      TU_OK(apex_loss_scaler_update(s, 0, &skip));
      assert_int_equal(skip, 0);
    }
    for (int64_t i = 0; i < n; i++)
      if (tu_bits(apex_tensor_get(pa, (size_t)i)) != tu_bits(apex_tensor_get(pb, (size_t)i)))
        fail_msg("%s: element %lld differs between apex_optimizer_step and apex_optimizer_step_scaled",
                 apex_optim_kind_name((apex_optim_kind)kind), (long long)i);
    assert_int_equal(apex_optimizer_step_count(b, 0, 0), 3);
    /* an overflow: the flag raised by the check skips the step where the scaler keeps it */
    apex_tensor_set(g, 7, NAN);
    TU_OK(apex_loss_scaler_check(s, &g, 1));
    TU_OK(apex_optimizer_step_scaled(b, s));
    for (int64_t i = 0; i < n; i++)
      if (tu_bits(apex_tensor_get(pa, (size_t)i)) != tu_bits(apex_tensor_get(pb, (size_t)i)))
        fail_msg("%s: a skipped step changed element %lld", apex_optim_kind_name((apex_optim_kind)kind), (long long)i);
    assert_int_equal(apex_optimizer_step_count(b, 0, 0), 3);
    int skip = 0;
    TU_OK(apex_loss_scaler_update(s, 0, &skip));
    assert_int_equal(skip, 1);
    assert_true(apex_loss_scaler_scale(s) == scale / 2);
    apex_loss_scaler_destroy(s);
    apex_optimizer_destroy(a);
    apex_optimizer_destroy(b);
    apex_tensor_destroy(pa);
    apex_tensor_destroy(pb);
    apex_tensor_destroy(g);
  }
  apex_loss_scaler *s = apex_loss_scaler_create(NULL);
  apex_optimizer *empty = apex_optimizer_create(APEX_OPTIM_SGD, NULL);
  TU_FAILS(apex_optimizer_step_scaled(NULL, s), APEX_ERR_INVALID_ARG, "apex_optimizer_step_scaled: NULL optimizer");
  TU_FAILS(apex_optimizer_step_scaled(empty, NULL), APEX_ERR_INVALID_ARG, "apex_optimizer_step_scaled: NULL scaler");
  TU_FAILS(apex_optimizer_step_scaled(empty, s), APEX_ERR_STATE, "no parameter groups");
  apex_optimizer_destroy(empty);
  apex_loss_scaler_destroy(s);
  apex_tensor_destroy(gf);
  apex_tensor_destroy(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults_are_apex),  cmocka_unit_test(test_halving_per_overflow),
      cmocka_unit_test(test_growth_and_max_clamp), cmocka_unit_test(test_min_clamp_and_status),
      cmocka_unit_test(test_hysteresis),         cmocka_unit_test(test_static),
      cmocka_unit_test(test_save_load_bitwise),  cmocka_unit_test(test_invalid_settings),
      cmocka_unit_test(test_null_accessors),
      cmocka_unit_test(test_check_raises_flag_like_host_found_inf),
      cmocka_unit_test(test_create_on_bad_device),
      cmocka_unit_test(test_step_scaled_matches_step),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
