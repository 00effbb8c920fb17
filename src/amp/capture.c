/* capture.c: a training step recorded once and replayed (capture.h), in the amp layer since a step is
 * amp's and its optimizers', whose options it watches. The recording itself is the
 * device's (its services' capture_begin/_end: a CUDA graph of apex's stream, with the allocator keeping
 * the blocks the graph replays on); here are the first run, the optimizers whose options the recorded
 * kernels hold (all but the learning rate, which they read from the device), and the CPU's plain replay. */
#include <stdlib.h>
#include <string.h>

#include "apex/capture.h"
#include "backend/backend.h"
#include "backend/device_services.h"
#include "core/internal.h"

struct apex_captured_step {
  const apex_device_services *sv; /* NULL: nothing recorded, a replay runs the step */
  void *graph;
  apex_step_fn step;
  void *ctx;
  int n_opt;
  apex_optimizer **opt;
  int *n_groups;               /* each optimizer's group count at the capture */
  apex_optim_options **opts;   /* and each group's options */
};

void apex_captured_step_destroy(apex_captured_step *s) {
  if (!s) return;
  if (s->graph) s->sv->graph_destroy(s->graph);
  for (int i = 0; i < s->n_opt; i++) free(s->opts ? s->opts[i] : NULL);
  free(s->opts);
  free(s->n_groups);
  free(s->opt);
  free(s);
}

/* The watched optimizers' options as the recorded kernels hold them. */
static apex_status snapshot(apex_captured_step *s, const char *fn) {
  for (int i = 0; i < s->n_opt; i++) {
    int n = apex_optimizer_num_groups(s->opt[i]);
    s->n_groups[i] = n;
    s->opts[i] = calloc((size_t)(n > 0 ? n : 1), sizeof **s->opts);
    if (!s->opts[i]) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    for (int k = 0; k < n; k++) {
      apex_status st = apex_optimizer_group_options(s->opt[i], k, &s->opts[i][k]);
      if (st != APEX_OK) return st;
    }
  }
  return APEX_OK;
}

apex_status apex_step_capture(apex_device device, apex_step_fn step, void *ctx, const apex_capture_options *opts,
                              apex_captured_step **out) {
  const char *fn = "apex_step_capture";
  if (out) *out = NULL;
  if (!step || !out) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL %s", fn, !step ? "step" : "out");
  int n_opt = opts ? opts->n_optimizers : 0;
  if (n_opt < 0 || (n_opt > 0 && !opts->optimizers))
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: %d optimizers%s", fn, n_opt, n_opt < 0 ? "" : " and a NULL list");
  for (int i = 0; i < n_opt; i++)
    if (!opts->optimizers[i]) return apex__fail(APEX_ERR_INVALID_ARG, "%s: optimizer %d is NULL", fn, i);
  const apex_backend *be = apex__backend_need(device, fn);
  if (!be) return apex_last_status();
  apex_captured_step *s = calloc(1, sizeof *s);
  if (s && n_opt > 0) {
    s->opt = calloc((size_t)n_opt, sizeof *s->opt);
    s->n_groups = calloc((size_t)n_opt, sizeof *s->n_groups);
    s->opts = calloc((size_t)n_opt, sizeof *s->opts);
  }
  if (!s || (n_opt > 0 && (!s->opt || !s->n_groups || !s->opts))) {
    apex_captured_step_destroy(s);
    return apex__fail(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  }
  s->n_opt = n_opt;
  for (int i = 0; i < n_opt; i++) s->opt[i] = opts->optimizers[i];
  s->step = step;
  s->ctx = ctx;
  const apex_device_services *sv = be->services;
  s->sv = sv && sv->capture_begin ? sv : NULL;
  /* the first run: a real step, which also grows the pool and makes the plans the recording reuses (no
   * device allocation can be recorded) */
  apex_status st = step(ctx);
  if (st == APEX_OK && s->sv && (st = s->sv->capture_begin(fn)) == APEX_OK) st = s->sv->capture_end(fn, step(ctx), &s->graph);
  /* after the recording: what its kernels were given is what a replay holds */
  if (st == APEX_OK) st = snapshot(s, fn);
  if (st != APEX_OK) {
    apex_captured_step_destroy(s);
    return st;
  }
  *out = s;
  return APEX_OK;
}

apex_status apex_step_replay(apex_captured_step *s) {
  const char *fn = "apex_step_replay";
  if (!s) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL step", fn);
  for (int i = 0; i < s->n_opt; i++) {
    int n = apex_optimizer_num_groups(s->opt[i]);
    if (n != s->n_groups[i])
      return apex__fail(APEX_ERR_STATE, "%s: optimizer %d has %d groups, %d when the step was captured: capture it again", fn, i, n,
                        s->n_groups[i]);
    for (int k = 0; k < n; k++) {
      apex_optim_options o;
      apex_status st = apex_optimizer_group_options(s->opt[i], k, &o);
      if (st != APEX_OK) return st;
      /* The learning rate is read from the group's device copy, which apex_optimizer_set_lr keeps: any value
       * goes, except to or from 0, which changes what the host queues (a zero-lr group's update is skipped). */
      const apex_optim_options *c = &s->opts[i][k];
      if ((o.lr == 0.0f) != (c->lr == 0.0f))
        return apex__fail(APEX_ERR_STATE, "%s: optimizer %d group %d's learning rate went from %g to %g since the capture: a zero "
                          "learning rate changes the recorded work; capture the step again", fn, i, k, (double)c->lr, (double)o.lr);
      o.lr = c->lr;
      /* every field is a 4-byte float, int or enum: no padding, so the bytes compare the values */
      if (memcmp(&o, c, sizeof o) != 0)
        return apex__fail(APEX_ERR_STATE, "%s: optimizer %d group %d's options changed since the capture (weight decay %g -> %g, "
                          "betas %g, %g -> %g, %g, ...): the recorded kernels hold the old ones; capture the step again", fn, i, k,
                          (double)c->weight_decay, (double)o.weight_decay, (double)c->beta1, (double)c->beta2, (double)o.beta1,
                          (double)o.beta2);
    }
  }
  return s->graph ? s->sv->graph_launch(s->graph, fn) : s->step(s->ctx);
}
