/* test_amp_properties.c: opt levels resolve to Apex's table (apex/amp/frontend.py, O0-O3 classes),
 * overrides apply, and the overrides Apex refuses are refused with the property named. */
#include <math.h>

#include "apex/amp_config.h"
#include "testutil.h"

static apex_amp_properties resolve(apex_amp_config c) {
  apex_amp_properties p;
  apex_status st = apex_amp_resolve(&c, &p);
  if (st != APEX_OK) fail_msg("resolve failed: %s", apex_last_error());
  return p;
}

static void test_level_table(void **state) {
  (void)state;
  /* Expected values typed from Apex's O0..O3 property classes. */
  struct {
    const char *level;
    int cast_model;
    apex_dtype cast_type;
    int patch, keep_bn, master;
    apex_scale_mode mode;
    float scale;
  } table[4] = {
      {"O0", 0, APEX_F32, 0, 0, 0, APEX_SCALE_STATIC, 1.0f},
      {"O1", 0, APEX_F32, 1, 0, 0, APEX_SCALE_DYNAMIC, 65536.0f},
      {"O2", 1, APEX_F16, 0, 1, 1, APEX_SCALE_DYNAMIC, 65536.0f},
      {"O3", 1, APEX_F16, 0, 0, 0, APEX_SCALE_STATIC, 1.0f},
  };
  for (int i = 0; i < 4; i++) {
    apex_amp_properties p = resolve((apex_amp_config){.opt_level = table[i].level});
    assert_int_equal(p.opt_level, i);
    assert_int_equal(p.enabled, 1);
    assert_int_equal(p.cast_model, table[i].cast_model);
    assert_int_equal(p.cast_model_type, table[i].cast_type);
    assert_int_equal(p.patch_functions, table[i].patch);
    assert_int_equal(p.keep_batchnorm_fp32, table[i].keep_bn);
    assert_int_equal(p.master_weights, table[i].master);
    assert_int_equal(p.scaler.mode, table[i].mode);
    assert_true(p.scaler.init_scale == table[i].scale);
    assert_int_equal(p.cast_model_outputs, APEX_F32);
    assert_int_equal(p.num_losses, 1);
  }
  /* NULL config = O1, Apex's default level. */
  apex_amp_properties p;
  TU_OK(apex_amp_resolve(NULL, &p));
  assert_int_equal(p.opt_level, 1);
  /* bf16: the same levels with bf16 as the low-precision type. */
  p = resolve((apex_amp_config){.opt_level = "O2", .half_type = APEX_AMP_CAST_BF16});
  assert_int_equal(p.cast_model_type, APEX_BF16);
  p = resolve((apex_amp_config){.opt_level = "O1", .half_type = APEX_AMP_CAST_BF16});
  assert_int_equal(p.half_type, APEX_BF16);
  assert_int_equal(p.cast_model, 0);
  p = resolve((apex_amp_config){.disabled = 1, .opt_level = "O2"});
  assert_int_equal(p.enabled, 0);
}

static void test_overrides(void **state) {
  (void)state;
  apex_amp_properties p = resolve((apex_amp_config){.opt_level = "O2", .keep_batchnorm_fp32 = APEX_AMP_OFF, .loss_scale = 128.0f});
  assert_int_equal(p.keep_batchnorm_fp32, 0);
  assert_int_equal(p.scaler.mode, APEX_SCALE_STATIC);
  assert_true(p.scaler.init_scale == 128.0f);
  p = resolve((apex_amp_config){.opt_level = "O3", .loss_scale = APEX_AMP_DYNAMIC, .master_weights = APEX_AMP_ON});
  assert_int_equal(p.scaler.mode, APEX_SCALE_DYNAMIC);
  assert_int_equal(p.master_weights, 1);
  p = resolve((apex_amp_config){.opt_level = "O2", .cast_model_type = APEX_AMP_CAST_F32});
  assert_int_equal(p.cast_model, 0);
  p = resolve((apex_amp_config){.opt_level = "O1", .cast_model_type = APEX_AMP_CAST_F32}); /* f32 is fine with O1 */
  assert_int_equal(p.cast_model, 0);
  p = resolve((apex_amp_config){.opt_level = "O2", .init_scale = 1024, .scale_window = 10, .growth_factor = 4, .backoff_factor = 0.25f,
                                .min_loss_scale = 1, .max_loss_scale = 4096, .hysteresis = 3, .num_losses = 2,
                                .cast_model_outputs = APEX_AMP_CAST_F16, .combine_grad = APEX_AMP_ON});
  assert_true(p.scaler.init_scale == 1024 && p.scaler.growth_factor == 4 && p.scaler.backoff_factor == 0.25f);
  assert_int_equal(p.scaler.growth_interval, 10);
  assert_true(p.scaler.min_scale == 1 && p.scaler.max_scale == 4096);
  assert_int_equal(p.scaler.hysteresis, 3);
  assert_int_equal(p.num_losses, 2);
  assert_int_equal(p.cast_model_outputs, APEX_F16);
  assert_int_equal(p.combine_grad, 1);
  char buf[1024];
  apex_amp_properties_format(&p, buf, sizeof buf);
  assert_non_null(strstr(buf, "Selected optimization level O2"));
  assert_non_null(strstr(buf, "master_weights         : True"));
  assert_non_null(strstr(buf, "loss_scale             : dynamic"));
}

/* bf16's loss-scaling default: no scaling (a static 1.0) at every level, where f16 scales
 * dynamically at O1 and O2; an explicit APEX_AMP_DYNAMIC or static value still applies at bf16, and
 * a model cast to f16 keeps the dynamic default whatever half_type says. */
static void test_bf16_scale_default(void **state) {
  (void)state;
  const char *levels[4] = {"O0", "O1", "O2", "O3"};
  for (int l = 0; l < 4; l++) {
    apex_amp_properties bf = resolve((apex_amp_config){.opt_level = levels[l], .half_type = APEX_AMP_CAST_BF16});
    assert_int_equal(bf.scaler.mode, APEX_SCALE_STATIC);
    assert_true(bf.scaler.init_scale == 1.0f);
    apex_amp_properties f16 = resolve((apex_amp_config){.opt_level = levels[l], .half_type = APEX_AMP_CAST_F16});
    assert_int_equal(f16.scaler.mode, l == 1 || l == 2 ? APEX_SCALE_DYNAMIC : APEX_SCALE_STATIC);
    apex_amp_properties dyn = resolve((apex_amp_config){.opt_level = levels[l], .half_type = APEX_AMP_CAST_BF16, .loss_scale = APEX_AMP_DYNAMIC});
    assert_int_equal(dyn.scaler.mode, APEX_SCALE_DYNAMIC);
    assert_true(dyn.scaler.init_scale == 65536.0f);
    apex_amp_properties st = resolve((apex_amp_config){.opt_level = levels[l], .half_type = APEX_AMP_CAST_BF16, .loss_scale = 128.0f});
    assert_int_equal(st.scaler.mode, APEX_SCALE_STATIC);
    assert_true(st.scaler.init_scale == 128.0f);
  }
  apex_amp_properties mixed = resolve((apex_amp_config){.opt_level = "O2", .half_type = APEX_AMP_CAST_BF16, .cast_model_type = APEX_AMP_CAST_F16});
  assert_int_equal(mixed.scaler.mode, APEX_SCALE_DYNAMIC);
  char buf[1024];
  apex_amp_properties p = resolve((apex_amp_config){.opt_level = "O2", .half_type = APEX_AMP_CAST_BF16});
  apex_amp_properties_format(&p, buf, sizeof buf);
  assert_non_null(strstr(buf, "loss_scale             : 1.0"));
  /* Dynamic tunables with bf16's static default are refused, saying how to ask for dynamic scaling. */
  apex_amp_config tun = {.opt_level = "O2", .half_type = APEX_AMP_CAST_BF16, .init_scale = 1024.0f};
  TU_FAILS(apex_amp_resolve(&tun, &p), APEX_ERR_INVALID_ARG, "APEX_AMP_DYNAMIC");
  tun.loss_scale = APEX_AMP_DYNAMIC;
  TU_OK(apex_amp_resolve(&tun, &p));
  assert_true(p.scaler.init_scale == 1024.0f);
}

static void test_refusals(void **state) {
  (void)state;
  struct {
    apex_amp_config c;
    const char *needle;
  } cases[] = {
      {{.opt_level = "O4"}, "unexpected optimization level 'O4'"},
      {{.opt_level = "fast"}, "'fast'"},
      {{.opt_level = "O1", .master_weights = APEX_AMP_ON}, "master_weights"},
      {{.opt_level = "O1", .master_weights = APEX_AMP_OFF}, "master_weights"},
      {{.opt_level = "O1", .keep_batchnorm_fp32 = APEX_AMP_ON}, "keep_batchnorm_fp32"},
      {{.opt_level = "O1", .cast_model_type = APEX_AMP_CAST_F16}, "cast_model_type"},
      {{.opt_level = "O1", .cast_model_type = APEX_AMP_CAST_BF16}, "cast_model_type"},
      {{.opt_level = "O2", .loss_scale = -4.0f}, "loss_scale -4"},
      {{.opt_level = "O2", .loss_scale = INFINITY}, "loss_scale inf"},
      {{.opt_level = "O2", .loss_scale = NAN}, "loss_scale"},
      {{.opt_level = "O0", .growth_factor = 3}, "static"},
      {{.opt_level = "O2", .growth_factor = 0.5f}, "growth_factor"},
      {{.opt_level = "O2", .min_loss_scale = 8, .max_loss_scale = 4}, "min_scale 8 is above max_scale 4"},
      {{.opt_level = "O2", .half_type = APEX_AMP_CAST_F32}, "half_type"},
      {{.opt_level = "O2", .num_losses = -1}, "num_losses"},
      {{.opt_level = "O2", .keep_batchnorm_fp32 = (apex_amp_flag)5}, "keep_batchnorm_fp32"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    apex_amp_properties p = {.opt_level = 77};
    apex_status st = apex_amp_resolve(&cases[i].c, &p);
    if (st != APEX_ERR_INVALID_ARG) fail_msg("case %zu (%s): status %s", i, cases[i].needle, apex_status_name(st));
    tu_assert_message(cases[i].needle);
    assert_int_equal(p.opt_level, 77); /* untouched */
  }
  TU_FAILS(apex_amp_resolve(NULL, NULL), APEX_ERR_INVALID_ARG, "NULL");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_level_table),
      cmocka_unit_test(test_overrides),
      cmocka_unit_test(test_bf16_scale_default),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
