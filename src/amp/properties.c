/* properties.c: opt levels and the validation of overrides (amp_config.h). The messages follow
 * Apex's own, so that an Apex user recognises them. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "apex/amp_config.h"
#include "core/internal.h"

static apex_status cast_to_dtype(apex_amp_cast c, apex_dtype *out) {
  switch (c) {
  case APEX_AMP_CAST_F32: *out = APEX_F32; return APEX_OK;
  case APEX_AMP_CAST_F16: *out = APEX_F16; return APEX_OK;
  case APEX_AMP_CAST_BF16: *out = APEX_BF16; return APEX_OK;
  default: return APEX_ERR_INVALID_ARG;
  }
}

static apex_status parse_level(const char *s, int *level) {
  if (!s) {
    *level = 1;
    return APEX_OK;
  }
  if ((s[0] == 'O' || s[0] == 'o') && s[1] >= '0' && s[1] <= '3' && s[2] == '\0') {
    *level = s[1] - '0';
    return APEX_OK;
  }
  return apex__fail(APEX_ERR_INVALID_ARG, "amp: unexpected optimization level '%s'; options are 'O0', 'O1', 'O2', 'O3'", s);
}

/* Sets *dst from an explicit cast override, or leaves the default; refuses values outside the enum. */
static apex_status apply_cast(apex_amp_cast c, const char *name, apex_dtype *dst) {
  if (c == APEX_AMP_CAST_DEFAULT) return APEX_OK;
  if (cast_to_dtype(c, dst) != APEX_OK) return apex__fail(APEX_ERR_INVALID_ARG, "amp: %s has the unknown value %d", name, (int)c);
  return APEX_OK;
}

static apex_status apply_flag(apex_amp_flag f, const char *name, int *dst) {
  if (f == APEX_AMP_DEFAULT) return APEX_OK;
  if (f != APEX_AMP_ON && f != APEX_AMP_OFF) return apex__fail(APEX_ERR_INVALID_ARG, "amp: %s has the unknown value %d", name, (int)f);
  *dst = f == APEX_AMP_ON;
  return APEX_OK;
}

/* The O1 rules: Apex's Properties refuse these with O1, because O1 casts around functions and leaves
 * the weights in f32. */
static apex_status check_o1(const apex_amp_config *c) {
  if (c->cast_model_type != APEX_AMP_CAST_DEFAULT && c->cast_model_type != APEX_AMP_CAST_F32)
    return apex__fail(APEX_ERR_INVALID_ARG,
                      "amp: cast_model_type: O1 inserts casts around functions rather than model weights, so with O1 the "
                      "model weights themselves should remain f32; to cast the model use opt_level O2 or O3");
  if (c->keep_batchnorm_fp32 != APEX_AMP_DEFAULT)
    return apex__fail(APEX_ERR_INVALID_ARG,
                      "amp: keep_batchnorm_fp32: with opt_level O1, batch norm runs in f32 by the autocast policy, so "
                      "keep_batchnorm_fp32 should be left unset");
  if (c->master_weights != APEX_AMP_DEFAULT)
    return apex__fail(APEX_ERR_INVALID_ARG,
                      "amp: master_weights: it doesn't make sense to use master_weights with O1; with O1 the model weights "
                      "themselves are f32");
  return APEX_OK;
}

/* The level's loss scaling when the user leaves loss_scale unset: dynamic at O1 and O2 when f16 is in
 * use, as Apex; none (a static 1.0) when the low-precision type is bf16 and the model is not cast to
 * f16. bf16 has f32's exponent range, so its gradients neither underflow nor overflow where f32's
 * would not: PyTorch's bf16 autocast uses no GradScaler, and Apex's scaling exists for f16's range. */
static int default_dynamic(const apex_amp_properties *p, int level) {
  int f16 = p->half_type == APEX_F16 || (p->cast_model && p->cast_model_type == APEX_F16);
  return (level == 1 || level == 2) && f16;
}

static apex_status resolve_scale(const apex_amp_config *c, apex_amp_properties *p, int level) {
  int dynamic = default_dynamic(p, level);
  float value = 1.0f;
  if (c->loss_scale == APEX_AMP_DYNAMIC) {
    dynamic = 1;
  } else if (c->loss_scale != 0) {
    if (!isfinite(c->loss_scale) || c->loss_scale < 0)
      return apex__fail(APEX_ERR_INVALID_ARG, "amp: loss_scale %g: a static loss scale must be a finite number > 0 (or APEX_AMP_DYNAMIC)",
                        c->loss_scale);
    dynamic = 0;
    value = c->loss_scale;
  }
  if (!dynamic && (c->init_scale != 0 || c->growth_factor != 0 || c->backoff_factor != 0 || c->scale_window != 0 || c->hysteresis != 0))
    return apex__fail(APEX_ERR_INVALID_ARG,
                      "amp: init_scale, growth_factor, backoff_factor, scale_window and hysteresis apply to dynamic loss scaling, "
                      "but the loss scale is static (%g)%s", value,
                      c->loss_scale == 0 && (level == 1 || level == 2)
                          ? "; with bf16 the default is no loss scaling: set loss_scale = APEX_AMP_DYNAMIC to scale dynamically"
                          : "");
  apex_loss_scaler_config s = {0};
  s.mode = dynamic ? APEX_SCALE_DYNAMIC : APEX_SCALE_STATIC;
  s.init_scale = dynamic ? c->init_scale : value;
  s.growth_factor = c->growth_factor;
  s.backoff_factor = c->backoff_factor;
  s.growth_interval = c->scale_window;
  s.min_scale = c->min_loss_scale;
  s.max_scale = c->max_loss_scale;
  s.hysteresis = c->hysteresis;
  /* Validate (and fill the defaults) the way the scaler itself will. */
  apex_loss_scaler *probe = apex_loss_scaler_create(&s);
  if (!probe) return APEX_ERR_INVALID_ARG;
  p->scaler = apex_loss_scaler_get_config(probe);
  apex_loss_scaler_destroy(probe);
  return APEX_OK;
}

apex_status apex_amp_resolve(const apex_amp_config *cfg, apex_amp_properties *out) {
  static const apex_amp_config defaults = {0};
  const apex_amp_config *c = cfg ? cfg : &defaults;
  if (!out) return apex__fail(APEX_ERR_INVALID_ARG, "apex_amp_resolve: NULL output");
  apex_amp_properties p = {0};
  int level = 1;
  apex_status st = parse_level(c->opt_level, &level);
  if (st != APEX_OK) return st;
  p.enabled = !c->disabled;
  p.opt_level = level;
  p.half_type = APEX_F16;
  if ((st = apply_cast(c->half_type, "half_type", &p.half_type)) != APEX_OK) return st;
  if (p.half_type == APEX_F32)
    return apex__fail(APEX_ERR_INVALID_ARG, "amp: half_type must be f16 or bf16 (it is the low-precision type)");
  if (level == 1 && (st = check_o1(c)) != APEX_OK) return st;

  /* The level's defaults (the table in amp_config.h). */
  p.cast_model = level >= 2;
  p.cast_model_type = level >= 2 ? p.half_type : APEX_F32;
  p.patch_functions = level == 1;
  p.keep_batchnorm_fp32 = level == 2;
  p.master_weights = level == 2;
  p.cast_model_outputs = APEX_F32;

  if (c->cast_model_type != APEX_AMP_CAST_DEFAULT) {
    if ((st = apply_cast(c->cast_model_type, "cast_model_type", &p.cast_model_type)) != APEX_OK) return st;
    p.cast_model = p.cast_model_type != APEX_F32;
  }
  if ((st = apply_flag(c->patch_functions, "patch_functions", &p.patch_functions)) != APEX_OK) return st;
  if ((st = apply_flag(c->keep_batchnorm_fp32, "keep_batchnorm_fp32", &p.keep_batchnorm_fp32)) != APEX_OK) return st;
  if ((st = apply_flag(c->master_weights, "master_weights", &p.master_weights)) != APEX_OK) return st;
  if ((st = apply_flag(c->combine_grad, "combine_grad", &p.combine_grad)) != APEX_OK) return st;
  if ((st = apply_cast(c->cast_model_outputs, "cast_model_outputs", &p.cast_model_outputs)) != APEX_OK) return st;
  if (c->num_losses < 0) return apex__fail(APEX_ERR_INVALID_ARG, "amp: num_losses is %d; it must be >= 1 (0 = default 1)", c->num_losses);
  if (c->verbosity < 0) return apex__fail(APEX_ERR_INVALID_ARG, "amp: verbosity is %d; it must be 0 or more", c->verbosity);
  p.num_losses = c->num_losses ? c->num_losses : 1;
  p.verbosity = c->verbosity;
  p.allow_banned = c->allow_banned != 0;
  if (c->half_grads != APEX_AMP_DEFAULT && c->half_grads != APEX_AMP_ON && c->half_grads != APEX_AMP_OFF)
    return apex__fail(APEX_ERR_INVALID_ARG, "amp: half_grads is %d; use APEX_AMP_ON, APEX_AMP_OFF or 0 (the default)", (int)c->half_grads);
  p.half_grads = c->half_grads;
  if ((st = resolve_scale(c, &p, level)) != APEX_OK) return st;
  *out = p;
  return APEX_OK;
}

static const char *on_off(int v) { return v ? "True" : "False"; }

char *apex_amp_properties_format(const apex_amp_properties *p, char *buf, size_t size) {
  static const char *const what[4] = {"pure f32 training", "insert automatic casts around functions (autocast policy)",
                                      "half model weights with f32 master weights and batch norm in f32",
                                      "pure half training"};
  if (!buf || size == 0) return buf;
  char scale[64];
  if (p->scaler.mode == APEX_SCALE_DYNAMIC) snprintf(scale, sizeof scale, "dynamic");
  else snprintf(scale, sizeof scale, "%.1f", p->scaler.init_scale);
  snprintf(buf, size,
           "Selected optimization level O%d:  %s.\n"
           "Defaults for this optimization level are applied, with overrides:\n"
           "enabled                : %s\n"
           "opt_level              : O%d\n"
           "cast_model_type        : %s\n"
           "patch_functions        : %s\n"
           "keep_batchnorm_fp32    : %s\n"
           "master_weights         : %s\n"
           "loss_scale             : %s\n",
           p->opt_level, what[p->opt_level & 3], on_off(p->enabled), p->opt_level,
           p->cast_model ? apex_dtype_name(p->cast_model_type) : "None", on_off(p->patch_functions),
           on_off(p->keep_batchnorm_fp32), on_off(p->master_weights), scale);
  return buf;
}
