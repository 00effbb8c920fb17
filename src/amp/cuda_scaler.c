/* cuda_scaler.c: apex_cuda_scaler (apex/cuda.h), the loss scaler whose scale and found-inf flag live in
 * GPU memory, and apex_cuda_optimizer_step, which skips there. Device-neutral C over the backend's
 * table: the state is allocated and copied with the memory slots, checked and unscaled with the
 * multi-tensor scale slot (reading the scale and raising the flag where they are), updated with the
 * scaler slot, so nothing here waits for the GPU except get_state. The configuration is validated by the
 * host scaler (loss_scaler.c), which also keeps it. */
#include <stdlib.h>

#include "apex/cuda.h"
#include "backend/backend.h"
#include "core/internal.h"
#include "optim/optim_internal.h"

struct apex_cuda_scaler {
  apex_loss_scaler *host;       /* the configuration, validated by apex_loss_scaler_create */
  apex_loss_scaler_config cfg;
  const apex_backend *b;        /* where the state lives */
  apex_scaler_dev *d;           /* state + found_inf there */
};

apex_cuda_scaler *apex_cuda_scaler_create(const apex_loss_scaler_config *config) {
  const apex_backend *b = apex__backend_named("cuda", "apex_cuda_scaler_create");
  if (!b) return NULL;
  apex_loss_scaler *host = apex_loss_scaler_create(config);
  if (!host) return NULL;
  apex_cuda_scaler *s = calloc(1, sizeof *s);
  void *d = NULL;
  if (!s || b->mem->alloc(sizeof(apex_scaler_dev), 1, &d) != APEX_OK) {
    free(s);
    apex_loss_scaler_destroy(host);
    return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex_cuda_scaler_create: out of memory");
  }
  s->host = host;
  s->cfg = apex_loss_scaler_get_config(host);
  s->b = b;
  s->d = d;
  apex_scaler_dev init = {.st = apex_loss_scaler_get_state(host), .found_inf = 0};
  if (b->mem->copy(s->d, &init, sizeof init, APEX_COPY_H2D, 1) != APEX_OK) {
    apex_cuda_scaler_destroy(s);
    return NULL;
  }
  return s;
}

void apex_cuda_scaler_destroy(apex_cuda_scaler *s) {
  if (!s) return;
  s->b->mem->free(s->d);
  apex_loss_scaler_destroy(s->host);
  free(s);
}

const float *apex_cuda_scaler_scale_ptr(const apex_cuda_scaler *s) { return s ? &s->d->st.scale : NULL; }
int *apex_cuda_scaler_found_inf_ptr(apex_cuda_scaler *s) { return s ? (int *)&s->d->found_inf : NULL; }

static apex_status scale_lists(apex_cuda_scaler *s, apex_tensor *const *in, apex_tensor *const *out, int n,
                               int inverse, const char *fn) {
  if (!s) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL scaler", fn);
  if (n < 0 || (n > 0 && !in)) return apex__fail(APEX_ERR_INVALID_ARG, "%s: bad tensor list (%d tensors)", fn, n);
  if (!s->b->mt_scale) return apex__backend_slot_missing(s->b, fn, "the multi-tensor scale");
  return s->b->mt_scale(&(apex_mt_scale_args){.fn = fn, .n = n, .in = in, .out = out, .scale = 1.0f,
                                              .dev_scale = &s->d->st.scale, .dev_inverse = inverse,
                                              .dev_found_inf = (int *)&s->d->found_inf});
}

apex_status apex_cuda_scaler_check(apex_cuda_scaler *s, apex_tensor *const *grads, int n) {
  return scale_lists(s, grads, NULL, n, 1, "apex_cuda_scaler_check");
}

apex_status apex_cuda_scaler_unscale(apex_cuda_scaler *s, apex_tensor *const *in, apex_tensor *const *out, int n) {
  if (!out) return apex__fail(APEX_ERR_INVALID_ARG, "apex_cuda_scaler_unscale: NULL output list (pass the inputs to unscale in place)");
  return scale_lists(s, in, out, n, 1, "apex_cuda_scaler_unscale");
}

apex_status apex_cuda_scaler_scale_tensor(apex_cuda_scaler *s, apex_tensor *t) {
  apex_tensor *one[1] = {t};
  return scale_lists(s, one, one, 1, 0, "apex_cuda_scaler_scale_tensor");
}

apex_status apex_cuda_scaler_update(apex_cuda_scaler *s) {
  const char *fn = "apex_cuda_scaler_update";
  if (!s) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL scaler", fn);
  if (!s->b->scaler_update) return apex__backend_slot_missing(s->b, fn, "the loss-scaler update");
  return s->b->scaler_update(&(apex_scaler_update_args){.fn = fn, .dev_state = s->d, .c = &s->cfg});
}

apex_status apex_cuda_scaler_get_state(apex_cuda_scaler *s, apex_loss_scaler_state *out) {
  if (!s || !out) return apex__fail(APEX_ERR_INVALID_ARG, "apex_cuda_scaler_get_state: NULL argument");
  apex_scaler_dev h;
  apex_status st = s->b->mem->copy(&h, s->d, sizeof h, APEX_COPY_D2H, 1);
  if (st == APEX_OK) *out = h.st;
  return st;
}

apex_status apex_cuda_scaler_set_state(apex_cuda_scaler *s, const apex_loss_scaler_state *state) {
  if (!s || !state) return apex__fail(APEX_ERR_INVALID_ARG, "apex_cuda_scaler_set_state: NULL argument");
  apex_status st = apex_loss_scaler_set_state(s->host, state); /* the CPU scaler's checks */
  if (st != APEX_OK) return st;
  apex_scaler_dev h = {.st = *state, .found_inf = 0};
  return s->b->mem->copy(s->d, &h, sizeof h, APEX_COPY_H2D, 1);
}

apex_status apex_cuda_optimizer_step(apex_optimizer *opt, apex_cuda_scaler *s) {
  if (!opt || !s) return apex__fail(APEX_ERR_INVALID_ARG, "apex_cuda_optimizer_step: NULL argument");
  return apex__optimizer_step_device(opt, s->b, &s->d->st.scale, (const int *)&s->d->found_inf);
}
