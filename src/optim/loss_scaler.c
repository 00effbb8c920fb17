/* loss_scaler.c: static and dynamic loss scaling (the rule is documented in loss_scaler.h), with the
 * state kept where the gradients are.
 *
 * The scaler lives in the optim layer, not in amp where Apex keeps it, because the optimizer step reads
 * its scale and skip flag (apex_optimizer_step_scaled) and optim stands below amp; amp, fp16_optimizer
 * and bring-your-own-model programs all use it from above. A scaler's state (scale, trackers, counters and
 * the found_inf flag, backend/args_optim.h's apex_scaler_dev) lives in its device's memory: in the struct
 * itself on the CPU, in device memory on a GPU, where the multi-tensor scale slot raises found_inf and the
 * scaler-update slot applies the rule (backend/scale_rule.h, the same function on both) without the host
 * waiting. Only the calls that hand a value to the host (scale, inv_scale, get_state, save) wait. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apex/loss_scaler.h"
#include "backend/backend.h"
#include "backend/scale_rule.h"
#include "core/internal.h"
#include "optim/optim_internal.h"

struct apex_loss_scaler {
  apex_loss_scaler_config cfg;
  const apex_backend *b;
  apex_scaler_dev *d;    /* the state, where it lives: &host on the CPU, device memory elsewhere */
  apex_scaler_dev host;
  int at_min;            /* the last update (on the CPU) overflowed with the scale already at min_scale */
};

static int on_cpu(const apex_loss_scaler *s) { return s->d == &s->host; }

static apex_status fill_defaults(apex_loss_scaler_config *c) {
  const char *who = "apex_loss_scaler_create";
  if (c->mode != APEX_SCALE_DYNAMIC && c->mode != APEX_SCALE_STATIC)
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: unknown mode %d (use APEX_SCALE_DYNAMIC or APEX_SCALE_STATIC)", who, (int)c->mode);
  const struct { const char *name; float v; } floats[] = {
      {"init_scale", c->init_scale}, {"growth_factor", c->growth_factor}, {"backoff_factor", c->backoff_factor},
      {"min_scale", c->min_scale},   {"max_scale", c->max_scale}};
  for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++)
    if (!isfinite(floats[i].v) || floats[i].v < 0)
      return apex__fail(APEX_ERR_INVALID_ARG, "%s: %s is %g; it must be finite and positive (0 = default)", who, floats[i].name, floats[i].v);
  if (c->growth_interval < 0)
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: growth_interval (window) is %d; it must be >= 1 (0 = default 2000)", who, c->growth_interval);
  if (c->hysteresis < 0)
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: hysteresis is %d; it must be >= 1 (0 = default 1)", who, c->hysteresis);
  if (c->init_scale == 0) c->init_scale = c->mode == APEX_SCALE_STATIC ? 1.0f : 65536.0f;
  if (c->growth_factor == 0) c->growth_factor = 2.0f;
  if (c->backoff_factor == 0) c->backoff_factor = 0.5f;
  if (c->growth_interval == 0) c->growth_interval = 2000;
  if (c->min_scale == 0) c->min_scale = 0x1p-24f;
  if (c->max_scale == 0) c->max_scale = 0x1p24f;
  if (c->hysteresis == 0) c->hysteresis = 1;
  if (c->growth_factor <= 1.0f)
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: growth_factor is %g; it must be > 1", who, c->growth_factor);
  if (c->backoff_factor >= 1.0f)
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: backoff_factor is %g; it must be in (0, 1)", who, c->backoff_factor);
  if (c->min_scale > c->max_scale)
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: min_scale %g is above max_scale %g", who, c->min_scale, c->max_scale);
  if (c->mode == APEX_SCALE_DYNAMIC && (c->init_scale < c->min_scale || c->init_scale > c->max_scale))
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: init_scale %g is outside [min_scale %g, max_scale %g]", who, c->init_scale,
                      c->min_scale, c->max_scale);
  return APEX_OK;
}

apex_loss_scaler *apex_loss_scaler_create_on(apex_device device, const apex_loss_scaler_config *config) {
  const char *fn = "apex_loss_scaler_create_on";
  const apex_backend *b = apex__backend_need(device, fn);
  if (!b) return NULL;
  apex_loss_scaler_config c = {0};
  if (config) c = *config;
  if (fill_defaults(&c) != APEX_OK) return NULL;
  apex_loss_scaler *s = calloc(1, sizeof *s);
  if (!s) return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex_loss_scaler_create: out of memory");
  s->cfg = c;
  s->b = b;
  s->host.st.scale = c.init_scale;
  s->host.st.hysteresis_tracker = c.hysteresis;
  s->d = &s->host;
  if (b->device != APEX_DEVICE_CPU) {
    void *d = NULL;
    if (b->mem->alloc(sizeof(apex_scaler_dev), 1, &d) != APEX_OK) {
      free(s);
      return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "%s: out of %s memory for the scaler's state", fn,
                             apex__device_name(device));
    }
    if (b->mem->copy(d, &s->host, sizeof s->host, APEX_COPY_H2D, 1) != APEX_OK) {
      b->mem->free(d);
      free(s);
      return NULL;
    }
    s->d = d;
  }
  return s;
}

apex_loss_scaler *apex_loss_scaler_create(const apex_loss_scaler_config *config) {
  return apex_loss_scaler_create_on(APEX_DEVICE_CPU, config);
}

void apex_loss_scaler_destroy(apex_loss_scaler *s) {
  if (!s) return;
  if (!on_cpu(s)) s->b->mem->free(s->d);
  free(s);
}

/* The accessors answer NULL with a value no scaler has and a message, instead of crashing. */
static int null_scaler(const apex_loss_scaler *s, const char *fn) {
  if (s) return 0;
  apex__fail_null_arg(fn, "loss scaler");
  return 1;
}

/* The state as the host sees it: read from the device (waiting for it) when it lives there. */
static apex_status read_state(const apex_loss_scaler *s, apex_scaler_dev *out) {
  if (on_cpu(s)) {
    *out = s->host;
    return APEX_OK;
  }
  return s->b->mem->copy(out, s->d, sizeof *out, APEX_COPY_D2H, 1);
}

apex_loss_scaler_config apex_loss_scaler_get_config(const apex_loss_scaler *s) {
  return null_scaler(s, __func__) ? (apex_loss_scaler_config){0} : s->cfg;
}

apex_device apex_loss_scaler_device(const apex_loss_scaler *s) {
  return null_scaler(s, __func__) ? APEX_DEVICE_CPU : s->b->device;
}

float apex_loss_scaler_scale(const apex_loss_scaler *s) {
  apex_scaler_dev h;
  if (null_scaler(s, __func__) || read_state(s, &h) != APEX_OK) return NAN;
  return h.st.scale;
}

float apex_loss_scaler_inv_scale(const apex_loss_scaler *s) {
  apex_scaler_dev h;
  if (null_scaler(s, __func__) || read_state(s, &h) != APEX_OK) return NAN;
  return 1.0f / h.st.scale;
}

const float *apex_loss_scaler_scale_ptr(const apex_loss_scaler *s) {
  return null_scaler(s, __func__) ? NULL : &s->d->st.scale;
}

int32_t *apex_loss_scaler_found_inf_ptr(apex_loss_scaler *s) {
  return null_scaler(s, __func__) ? NULL : &s->d->found_inf;
}

/* One pass of the multi-tensor scale slot of the scaler's backend: out = in / scale (inverse) or in *
 * scale, reading the scale and raising found_inf where they live. out NULL only checks. */
static apex_status scale_lists(apex_loss_scaler *s, apex_tensor *const *in, apex_tensor *const *out, int n,
                               int inverse, const char *fn) {
  if (!s) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL scaler", fn);
  if (n < 0 || (n > 0 && !in)) return apex__fail(APEX_ERR_INVALID_ARG, "%s: bad tensor list (%d tensors)", fn, n);
  if (!s->b->mt_scale) return apex__backend_slot_missing(s->b, fn, "the multi-tensor scale");
  return s->b->mt_scale(&(apex_mt_scale_args){.fn = fn, .n = n, .in = in, .out = out, .scale = 1.0f,
                                              .dev_scale = &s->d->st.scale, .dev_inverse = inverse,
                                              .dev_found_inf = (int *)&s->d->found_inf});
}

apex_status apex_loss_scaler_check(apex_loss_scaler *s, apex_tensor *const *grads, int n) {
  return scale_lists(s, grads, NULL, n, 1, "apex_loss_scaler_check");
}

apex_status apex_loss_scaler_unscale(apex_loss_scaler *s, apex_tensor *const *in, apex_tensor *const *out, int n) {
  if (!out)
    return apex__fail(APEX_ERR_INVALID_ARG,
                      "apex_loss_scaler_unscale: NULL output list (pass the inputs to unscale in place)");
  return scale_lists(s, in, out, n, 1, "apex_loss_scaler_unscale");
}

apex_status apex_loss_scaler_scale_tensor(apex_loss_scaler *s, apex_tensor *t) {
  apex_tensor *one[1] = {t};
  return scale_lists(s, one, one, 1, 0, "apex_loss_scaler_scale_tensor");
}

static apex_status update_impl(apex_loss_scaler *s, int found_inf, int *skip, int32_t *raise, uint64_t mask) {
  const char *fn = "apex_loss_scaler_update";
  if (!s) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL scaler", fn);
  if (on_cpu(s)) {
    int found = found_inf != 0 || s->host.found_inf != 0;
    if (skip) *skip = found;
    s->at_min = apex__scale_rule(&s->host.st, &s->cfg, found);
    s->host.found_inf = 0;
    for (int i = 0; found && raise && i < 64; i++)
      if (mask >> i & 1u) raise[i] = 1;
    return APEX_OK;
  }
  if (skip)
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: the scaler's state is on the %s, where the skip is decided without "
                      "the host waiting; pass skip = NULL and step with apex_optimizer_step_scaled, which reads it there",
                      fn, apex__device_name(s->b->device));
  if (!s->b->scaler_update) return apex__backend_slot_missing(s->b, fn, "the loss-scaler update");
  /* The host's own finding joins the device's flag before the rule reads it. The copy does not wait for
   * the device: a copy from pageable memory is staged before it returns, so `one` may then go. */
  if (found_inf) {
    int32_t one = 1;
    apex_status st = s->b->mem->copy(&s->d->found_inf, &one, sizeof one, APEX_COPY_H2D, 0);
    if (st != APEX_OK) return st;
  }
  return s->b->scaler_update(&(apex_scaler_update_args){.fn = fn, .dev_state = s->d, .c = &s->cfg, .dev_raise = raise,
                                                        .raise_mask = mask});
}

apex_status apex_loss_scaler_update(apex_loss_scaler *s, int found_inf, int *skip) {
  return update_impl(s, found_inf, skip, NULL, 0);
}

apex_status apex__loss_scaler_update_raise(apex_loss_scaler *s, int found_inf, int32_t *raise, uint64_t mask) {
  return update_impl(s, found_inf, NULL, raise, mask);
}

int apex_loss_scaler_at_min(const apex_loss_scaler *s) { return s ? s->at_min : 0; }

apex_loss_scaler_state apex_loss_scaler_get_state(const apex_loss_scaler *s) {
  apex_scaler_dev h;
  if (null_scaler(s, __func__) || read_state(s, &h) != APEX_OK) return (apex_loss_scaler_state){0};
  return h.st;
}

apex_status apex_loss_scaler_set_state(apex_loss_scaler *s, const apex_loss_scaler_state *state) {
  if (!s || !state) return apex__fail(APEX_ERR_INVALID_ARG, "apex_loss_scaler_set_state: NULL argument");
  if (!isfinite(state->scale) || state->scale <= 0)
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_loss_scaler_set_state: scale %g is not a positive finite number", state->scale);
  if (s->cfg.mode == APEX_SCALE_DYNAMIC && (state->scale < s->cfg.min_scale || state->scale > s->cfg.max_scale))
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_loss_scaler_set_state: scale %g is outside this scaler's [%g, %g]", state->scale,
                      s->cfg.min_scale, s->cfg.max_scale);
  if (state->growth_tracker < 0 || state->hysteresis_tracker < 0 || state->steps < 0 || state->skipped < 0 ||
      state->skipped > state->steps)
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_loss_scaler_set_state: negative or inconsistent counters");
  apex_scaler_dev h = {.st = *state, .found_inf = 0};
  if (!on_cpu(s)) {
    apex_status st = s->b->mem->copy(s->d, &h, sizeof h, APEX_COPY_H2D, 1);
    if (st != APEX_OK) return st;
  }
  s->host = h;
  s->at_min = 0; /* a restored state carries no last update */
  return APEX_OK;
}

const apex_backend *apex__loss_scaler_where(apex_loss_scaler *s, const float **scale, const int **found_inf) {
  *scale = &s->d->st.scale;
  *found_inf = (const int *)&s->d->found_inf;
  return s->b;
}

/* Layout: "APXS" magic, u32 version 1, f32 scale, i32 growth, i32 hysteresis, u32 reserved, i64
 * steps, i64 skipped; little-endian. */
#define SCALER_MAGIC 0x53585041u /* "APXS" read as little-endian u32 */
#define SCALER_VERSION 1u

static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}
static uint64_t get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

apex_status apex_loss_scaler_save(const apex_loss_scaler *s, uint8_t *buf, size_t size) {
  if (!s || !buf) return apex__fail(APEX_ERR_INVALID_ARG, "apex_loss_scaler_save: NULL argument");
  if (size < APEX_LOSS_SCALER_STATE_BYTES)
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_loss_scaler_save: buffer of %zu bytes; need %d", size, APEX_LOSS_SCALER_STATE_BYTES);
  apex_scaler_dev h;
  apex_status st = read_state(s, &h);
  if (st != APEX_OK) return st;
  uint32_t scale_bits;
  memcpy(&scale_bits, &h.st.scale, 4);
  put_u32(buf, SCALER_MAGIC);
  put_u32(buf + 4, SCALER_VERSION);
  put_u32(buf + 8, scale_bits);
  put_u32(buf + 12, (uint32_t)h.st.growth_tracker);
  put_u32(buf + 16, (uint32_t)h.st.hysteresis_tracker);
  put_u32(buf + 20, 0);
  put_u64(buf + 24, (uint64_t)h.st.steps);
  put_u64(buf + 32, (uint64_t)h.st.skipped);
  return APEX_OK;
}

apex_status apex_loss_scaler_load(apex_loss_scaler *s, const uint8_t *buf, size_t size) {
  if (!s || !buf) return apex__fail(APEX_ERR_INVALID_ARG, "apex_loss_scaler_load: NULL argument");
  if (size < APEX_LOSS_SCALER_STATE_BYTES)
    return apex__fail(APEX_ERR_CORRUPT, "apex_loss_scaler_load: %zu bytes; a scaler state has %d", size, APEX_LOSS_SCALER_STATE_BYTES);
  if (get_u32(buf) != SCALER_MAGIC) return apex__fail(APEX_ERR_CORRUPT, "apex_loss_scaler_load: not a loss scaler state (bad magic)");
  if (get_u32(buf + 4) != SCALER_VERSION)
    return apex__fail(APEX_ERR_CORRUPT, "apex_loss_scaler_load: state version %u; this library reads version %u", get_u32(buf + 4), SCALER_VERSION);
  apex_loss_scaler_state st;
  uint32_t scale_bits = get_u32(buf + 8);
  memcpy(&st.scale, &scale_bits, 4);
  st.growth_tracker = (int32_t)get_u32(buf + 12);
  st.hysteresis_tracker = (int32_t)get_u32(buf + 16);
  st.steps = (int64_t)get_u64(buf + 24);
  st.skipped = (int64_t)get_u64(buf + 32);
  if (apex_loss_scaler_set_state(s, &st) != APEX_OK) {
    char why[512]; /* copied: the message buffer is about to be rewritten */
    snprintf(why, sizeof why, "%s", apex_last_error());
    return apex__fail(APEX_ERR_CORRUPT, "apex_loss_scaler_load: corrupt state: %s", why);
  }
  return APEX_OK;
}
