/* shard.c: apex-train --zero (shard.h). */
#include "shard.h"

#include <stdio.h>
#include <stdlib.h>

#include "report.h"

apex_tensor **shard_snapshot(const train_model *tm) {
  size_t n = apex_model_num_params(tm->m);
  apex_tensor **v = calloc(n ? n : 1, sizeof *v);
  for (size_t i = 0; v && i < n; i++)
    if (!(v[i] = apex_tensor_clone(apex_var_value(apex_model_param(tm->m, i, NULL))))) {
      shard_snapshot_free(v, tm);
      return NULL;
    }
  return v;
}

void shard_snapshot_free(apex_tensor **vals, const train_model *tm) {
  for (size_t i = 0; vals && i < apex_model_num_params(tm->m); i++) apex_tensor_destroy(vals[i]);
  free(vals);
}

/* After each backward: the reduce-scatter; between micro-batches stage 2 gathers the reduced
 * gradients back too, so that the next micro-batch adds to what DDP's would. */
static apex_status before_unscale(void *ctx) {
  shard *s = ctx;
  apex_status st = apex_zero_reduce_grads(s->z);
  if (st == APEX_OK && s->stage == 2 && !s->last) st = apex_zero_gather_grads(s->z);
  return st;
}

/* amp's flag (a non-finite loss) with this rank's shard checked, over every rank. */
static apex_status reduce_overflow(void *ctx, int *flag) {
  shard *s = ctx;
  apex_status st = apex_zero_reduce_overflow(s->z, flag);
  s->overflow = *flag;
  return st;
}

int shard_create(shard *s, apex_pg *pg, train_model *tm, apex_graph *g, apex_tensor *const *vals, apex_optim_kind kind,
                 const apex_optim_options *oo, int stage) {
  size_t n = apex_model_num_params(tm->m);
  apex_tensor **ps = malloc(n * sizeof *ps), **gs = malloc(n * sizeof *gs);
  for (size_t i = 0; ps && gs && i < n; i++) {
    ps[i] = apex_var_value(apex_model_param(tm->m, i, NULL));
    gs[i] = apex_var_grad(apex_model_param(tm->m, i, NULL));
  }
  s->kind = kind;
  s->oo = *oo;
  s->stage = stage;
  /* The reduce-scatter runs during the backward, bucket by bucket, as DDP's all-reduce does; a group
   * without a reduce-scatter of unequal parts (NCCL's) runs it after the backward instead (before_unscale),
   * the same sums. */
  apex_zero_options zo = {.stage = stage, .master_values = vals, .amp_unscale = 1, .overlap = 1};
  s->z = ps && gs ? apex_zero_create(pg, ps, gs, (int)n, kind, oo, &zo) : NULL;
  if (!s->z && ps && gs && apex_last_status() == APEX_ERR_UNSUPPORTED) {
    zo.overlap = 0;
    s->z = apex_zero_create(pg, ps, gs, (int)n, kind, oo, &zo);
  }
  free(ps);
  free(gs);
  if (s->z && zo.overlap && apex_zero_attach(s->z, g) != APEX_OK) {
    apex_zero_destroy(s->z);
    s->z = NULL;
  }
  if (!s->z) {
    fprintf(stderr, "apex-train: --zero %d: %s\n", stage, one_line(apex_last_error()));
    return 1;
  }
  s->bo = (apex_amp_backward_options){.before_unscale = before_unscale, .reduce_overflow = reduce_overflow, .hook_ctx = s};
  /* The largest rank's state (a MAX over the ranks), and an unsharded optimizer's, sized on a fresh
   * one: for the progress line. */
  float most = (float)apex_zero_state_bytes(s->z);
  int64_t one = 1;
  apex_tensor *t = apex_tensor_wrap(&most, APEX_F32, 1, &one);
  apex_status st = t ? apex_pg_allreduce(pg, t, APEX_REDUCE_MAX) : APEX_ERR_OUT_OF_MEMORY;
  apex_tensor_destroy(t);
  apex_optimizer *full = st == APEX_OK ? shard_full(s, tm) : NULL;
  if (!full || apex_optimizer_state_size(full, &s->full_bytes) != APEX_OK) {
    apex_optimizer_destroy(full);
    fprintf(stderr, "apex-train: --zero %d: %s\n", stage, one_line(apex_last_error()));
    return 1;
  }
  apex_optimizer_destroy(full);
  s->state_bytes = (size_t)most;
  return 0;
}

apex_optimizer *shard_full(const shard *s, train_model *tm) {
  size_t n = apex_model_num_params(tm->m);
  apex_tensor **ps = malloc(n * sizeof *ps);
  apex_optimizer *f = ps ? apex_optimizer_create(s->kind, &s->oo) : NULL;
  for (size_t i = 0; f && i < n; i++) ps[i] = apex_var_value(apex_model_param(tm->m, i, NULL));
  if (f && apex_optimizer_add_group(f, ps, (int)n, NULL, 0, NULL, NULL) != APEX_OK) {
    apex_optimizer_destroy(f);
    f = NULL;
  }
  free(ps);
  return f;
}

void shard_free(shard *s) {
  apex_zero_destroy(s->z);
  s->z = NULL;
}
