/* fp16_optimizer.c: FP16_Optimizer semantics over an apex_optimizer and a loss scaler. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "apex/fp16_optimizer.h"
#include "apex/multi_tensor.h"
#include "core/internal.h"

struct apex_fp16_optimizer {
  apex_optimizer *opt;
  apex_loss_scaler *scaler;
  int clip_overflow; /* the last clip found a non-finite norm */
};

apex_fp16_optimizer *apex_fp16_optimizer_create(apex_optimizer *opt, const apex_loss_scaler_config *scaling) {
  if (!opt) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_fp16_optimizer_create: NULL optimizer");
  apex_loss_scaler *s = apex_loss_scaler_create(scaling);
  if (!s) return NULL;
  apex_fp16_optimizer *fo = calloc(1, sizeof *fo);
  if (!fo) {
    apex_loss_scaler_destroy(s);
    return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex_fp16_optimizer_create: out of memory");
  }
  fo->opt = opt;
  fo->scaler = s;
  return fo;
}

void apex_fp16_optimizer_destroy(apex_fp16_optimizer *fo) {
  if (!fo) return;
  apex_loss_scaler_destroy(fo->scaler);
  free(fo);
}

/* The accessors answer NULL with the value fp16_optimizer.h gives and a message. */
static int null_fo(const apex_fp16_optimizer *fo, const char *fn) {
  if (fo) return 0;
  apex__fail_null_arg(fn, "FP16_Optimizer");
  return 1;
}

float apex_fp16_optimizer_loss_scale(const apex_fp16_optimizer *fo) {
  return null_fo(fo, __func__) ? NAN : apex_loss_scaler_scale(fo->scaler);
}
apex_optimizer *apex_fp16_optimizer_optimizer(const apex_fp16_optimizer *fo) { return null_fo(fo, __func__) ? NULL : fo->opt; }
apex_loss_scaler *apex_fp16_optimizer_scaler(const apex_fp16_optimizer *fo) { return null_fo(fo, __func__) ? NULL : fo->scaler; }

apex_status apex_fp16_optimizer_clip_master_grads(apex_fp16_optimizer *fo, float max_norm, float *total_norm) {
  if (!fo) return apex__fail(APEX_ERR_INVALID_ARG, "apex_fp16_optimizer_clip_master_grads: NULL wrapper");
  float norm = 0;
  apex_status st = apex_optimizer_clip_grad_norm(fo->opt, max_norm, apex_loss_scaler_scale(fo->scaler), &norm);
  if (st == APEX_OK) fo->clip_overflow = !isfinite(norm);
  if (total_norm) *total_norm = norm;
  return st;
}

/* One read pass over every gradient of every group: 1 if any element is Inf or NaN. */
static apex_status check_overflow(apex_optimizer *opt, int *overflow) {
  int total = 0;
  for (int g = 0; g < apex_optimizer_num_groups(opt); g++) total += apex_optimizer_group_size(opt, g);
  apex_tensor **grads = calloc((size_t)total + 1, sizeof *grads);
  if (!grads) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_fp16_optimizer_step: out of memory");
  int n = 0;
  for (int g = 0; g < apex_optimizer_num_groups(opt); g++)
    for (int i = 0; i < apex_optimizer_group_size(opt, g); i++) {
      apex_tensor *grad = apex_optimizer_grad(opt, g, i);
      if (grad) grads[n++] = grad;
    }
  apex_status st = apex_mt_check_finite(grads, n, overflow);
  free(grads);
  return st;
}

apex_status apex_fp16_optimizer_step(apex_fp16_optimizer *fo, int *skipped) {
  if (skipped) *skipped = 0;
  if (!fo) return apex__fail(APEX_ERR_INVALID_ARG, "apex_fp16_optimizer_step: NULL wrapper");
  int overflow = fo->clip_overflow;
  fo->clip_overflow = 0;
  apex_status st = overflow ? APEX_OK : check_overflow(fo->opt, &overflow);
  if (st != APEX_OK) return st;
  float scale = apex_loss_scaler_scale(fo->scaler); /* the scale these gradients carry */
  int skip = 0;
  st = apex_loss_scaler_update(fo->scaler, overflow, &skip);
  if (st != APEX_OK) return st;
  if (skipped) *skipped = skip;
  return apex_optimizer_step(fo->opt, scale, skip);
}

apex_status apex_fp16_optimizer_state_size(const apex_fp16_optimizer *fo, size_t *bytes) {
  if (!fo || !bytes) return apex__fail(APEX_ERR_INVALID_ARG, "apex_fp16_optimizer_state_size: NULL argument");
  size_t opt_bytes;
  apex_status st = apex_optimizer_state_size(fo->opt, &opt_bytes);
  if (st == APEX_OK) *bytes = APEX_LOSS_SCALER_STATE_BYTES + opt_bytes;
  return st;
}

apex_status apex_fp16_optimizer_save(const apex_fp16_optimizer *fo, void *buf, size_t size, size_t *written) {
  if (!fo || !buf) return apex__fail(APEX_ERR_INVALID_ARG, "apex_fp16_optimizer_save: NULL argument");
  if (size < APEX_LOSS_SCALER_STATE_BYTES)
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_fp16_optimizer_save: buffer of %zu bytes is too small", size);
  apex_status st = apex_loss_scaler_save(fo->scaler, buf, APEX_LOSS_SCALER_STATE_BYTES);
  size_t opt_written = 0;
  if (st == APEX_OK)
    st = apex_optimizer_save(fo->opt, (uint8_t *)buf + APEX_LOSS_SCALER_STATE_BYTES, size - APEX_LOSS_SCALER_STATE_BYTES, &opt_written);
  if (st == APEX_OK && written) *written = APEX_LOSS_SCALER_STATE_BYTES + opt_written;
  return st;
}

apex_status apex_fp16_optimizer_load(apex_fp16_optimizer *fo, const void *buf, size_t size) {
  if (!fo || !buf) return apex__fail(APEX_ERR_INVALID_ARG, "apex_fp16_optimizer_load: NULL argument");
  if (size < APEX_LOSS_SCALER_STATE_BYTES)
    return apex__fail(APEX_ERR_CORRUPT, "apex_fp16_optimizer_load: %zu bytes is too short for a saved state", size);
  apex_loss_scaler_state before = apex_loss_scaler_get_state(fo->scaler);
  apex_status st = apex_loss_scaler_load(fo->scaler, buf, APEX_LOSS_SCALER_STATE_BYTES);
  if (st != APEX_OK) return st;
  st = apex_optimizer_load(fo->opt, (const uint8_t *)buf + APEX_LOSS_SCALER_STATE_BYTES, size - APEX_LOSS_SCALER_STATE_BYTES);
  if (st != APEX_OK) apex_loss_scaler_set_state(fo->scaler, &before); /* the optimizer changed nothing either */
  return st;
}
