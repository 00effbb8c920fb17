/* ddp.c: DistributedDataParallel over an apex model.
 *
 * A thin layer on the Reducer: creation checks and synchronises the model, and the autograd grad
 * hook (apex_graph_set_grad_hook) marks each parameter's gradient ready as soon as backward has
 * finished it, so bucket all-reduces overlap the rest of the backward. Reducer index k is parameter
 * n-1-k: backward finishes parameters roughly in reverse creation order, and the buckets are cut in
 * that order on every rank (by bytes, or after each of allreduce_trigger_params, mapped to their
 * reducer indices here). Parameters are found from the hook's leaf by binary search over their
 * addresses. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "apex/ddp.h"
#include "backend/backend.h"
#include "core/internal.h"

typedef struct ddp_entry {
  uintptr_t var;
  int k;
} ddp_entry;

struct apex_ddp {
  apex_pg *pg;
  apex_model *m;
  apex_reducer *red;
  int n;
  ddp_entry *lookup;     /* sorted by var address */
  unsigned char *marked; /* per reducer index, this step */
  int sync, delay;
};

static int cmp_entry(const void *a, const void *b) {
  uintptr_t x = ((const ddp_entry *)a)->var, y = ((const ddp_entry *)b)->var;
  return x < y ? -1 : x > y;
}

void apex_ddp_destroy(apex_ddp *ddp) {
  if (!ddp) return;
  apex_reducer_destroy(ddp->red);
  free(ddp->lookup);
  free(ddp->marked);
  free(ddp);
}

apex_ddp *apex_ddp_create(apex_pg *pg, apex_model *m, const apex_ddp_options *options) {
  static const apex_ddp_options defaults = {0};
  const apex_ddp_options *o = options ? options : &defaults;
  if (!pg || !m) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_ddp_create: %s is NULL", pg ? "model" : "pg");
  size_t np = apex_model_num_params(m);
  if (np < 1 || np > (size_t)INT32_MAX) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_ddp_create: the model has %zu parameters", np);
  int n = (int)np;
  apex_ddp *d = calloc(1, sizeof *d);
  const char **names = calloc(np, sizeof *names);
  apex_tensor **vals = calloc(np, sizeof *vals), **grads = calloc(np, sizeof *grads);
  if (d) {
    d->lookup = calloc(np, sizeof *d->lookup);
    d->marked = calloc(np, 1);
  }
  apex_status st = APEX_OK;
  if (!d || !names || !vals || !grads || !d->lookup || !d->marked) st = apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_ddp_create: out of memory");
  for (int i = 0; st == APEX_OK && i < n; i++) {
    apex_var *v = apex_model_param(m, (size_t)i, &names[i]);
    vals[i] = apex_var_value(v);
    grads[n - 1 - i] = apex_var_grad(v);
    d->lookup[i] = (ddp_entry){(uintptr_t)v, n - 1 - i};
  }
  /* Checked before any exchange, so that a model on the wrong device fails alike on every rank
   * (apex models are on the CPU; the NCCL group takes CUDA tensors only). */
  apex_device dev = apex_pg_device(pg);
  for (int i = 0; st == APEX_OK && i < n; i++)
    if (apex_tensor_device(vals[i]) != dev)
      st = apex__fail(APEX_ERR_DEVICE, "parameter %d ('%s') is on %s but the %s group works on %s tensors%s", i, names[i],
                      apex_tensor_device(vals[i]) == APEX_DEVICE_CPU ? "the CPU" : apex__device_name(apex_tensor_device(vals[i])),
                      apex_pg_backend(pg), apex__device_name(dev),
                      dev != APEX_DEVICE_CPU ? " (apex models train on the CPU: use apex_pg_create_mpi)" : "");
  /* Trigger parameters are checked before any exchange too, and become reducer indices. */
  int nt = o->num_allreduce_trigger_params, *triggers = NULL;
  if (st == APEX_OK && nt != 0) {
    if (o->delay_allreduce) st = apex__fail(APEX_ERR_INVALID_ARG, "allreduce_trigger_params is only valid without delay_allreduce");
    else if (nt < 0 || !o->allreduce_trigger_params)
      st = apex__fail(APEX_ERR_INVALID_ARG, "%d allreduce_trigger_params %s", nt, nt < 0 ? "(must be >= 0)" : "but the list is NULL");
    else if (!(triggers = malloc((size_t)nt * sizeof *triggers))) st = apex__fail(APEX_ERR_OUT_OF_MEMORY, "out of memory");
    for (int t = 0; st == APEX_OK && t < nt; t++) {
      triggers[t] = -1;
      for (int i = 0; i < n && triggers[t] < 0; i++)
        if (apex_model_param(m, (size_t)i, NULL) == o->allreduce_trigger_params[t]) triggers[t] = n - 1 - i;
      if (triggers[t] < 0) st = apex__fail(APEX_ERR_INVALID_ARG, "allreduce_trigger_params[%d] is not a parameter of the model", t);
    }
  }
  if (st == APEX_OK) st = apex_pg_check_consistent(pg, names, vals, n);
  if (st != APEX_OK) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", apex_last_error());
    free(names), free(vals), free(grads), free(triggers);
    apex_ddp_destroy(d);
    return apex__fail_null(st, "apex_ddp_create: %s", msg);
  }
  for (int i = 0; st == APEX_OK && i < n; i++) st = apex_pg_broadcast(pg, vals[i], 0);
  for (size_t i = 0; st == APEX_OK && i < apex_model_num_buffers(m); i++) st = apex_pg_broadcast(pg, apex_model_buffer(m, i, NULL), 0);
  if (st == APEX_OK) {
    apex_reducer_options ro = {.bucket_bytes = o->bucket_bytes, .sum_only = o->sum_only,
                               .gradient_predivide_factor = o->gradient_predivide_factor,
                               .allreduce_always_fp32 = o->allreduce_always_fp32,
                               .triggers = triggers, .num_triggers = triggers ? nt : 0};
    d->red = apex_reducer_create(pg, grads, n, &ro);
    if (!d->red) st = APEX_ERR_INVALID_ARG; /* its message stands */
  }
  free(names), free(vals), free(grads), free(triggers);
  if (st != APEX_OK) {
    apex_ddp_destroy(d);
    return NULL;
  }
  qsort(d->lookup, np, sizeof *d->lookup, cmp_entry);
  d->pg = pg;
  d->m = m;
  d->n = n;
  d->sync = 1;
  d->delay = o->delay_allreduce;
  return d;
}

static apex_status ddp_hook(void *ctx, apex_var *leaf) {
  apex_ddp *d = ctx;
  if (!d->sync || d->delay) return APEX_OK;
  ddp_entry key = {(uintptr_t)leaf, 0};
  const ddp_entry *e = bsearch(&key, d->lookup, (size_t)d->n, sizeof key, cmp_entry);
  if (!e) return APEX_OK; /* a leaf of another model */
  if (d->marked[e->k])
    return apex__fail(APEX_ERR_STATE, "apex_ddp: a second backward reached a parameter before apex_ddp_finish; call finish after each "
                                      "synced backward, turn sync off for accumulating backwards, or use delay_allreduce");
  d->marked[e->k] = 1;
  return apex_reducer_mark_ready(d->red, e->k);
}

apex_status apex_ddp_attach(apex_ddp *ddp, apex_graph *g) {
  if (!ddp || !g) return apex__fail(APEX_ERR_INVALID_ARG, "apex_ddp_attach: %s is NULL", ddp ? "graph" : "ddp");
  return apex_graph_set_grad_hook(g, ddp_hook, ddp);
}

apex_status apex_ddp_finish(apex_ddp *ddp) {
  if (!ddp) return apex__fail(APEX_ERR_INVALID_ARG, "apex_ddp_finish: ddp is NULL");
  if (!ddp->sync) return APEX_OK;
  apex_status st = APEX_OK;
  /* Gradients the backward did not reach (or all, with delay_allreduce) join in index order. */
  for (int k = 0; k < ddp->n; k++) {
    if (ddp->marked[k]) continue;
    apex_status s = apex_reducer_mark_ready(ddp->red, k);
    if (st == APEX_OK) st = s;
  }
  apex_status s = apex_reducer_finish(ddp->red);
  if (st == APEX_OK) st = s;
  for (int k = 0; k < ddp->n; k++) ddp->marked[k] = 0;
  return st;
}

int apex_ddp_set_sync(apex_ddp *ddp, int sync) {
  if (!ddp) return 0;
  int prev = ddp->sync;
  ddp->sync = sync != 0;
  return prev;
}

apex_status apex_ddp_allreduce_overflow(apex_ddp *ddp, int *flag) {
  if (!ddp) return apex__fail(APEX_ERR_INVALID_ARG, "apex_ddp_allreduce_overflow: ddp is NULL");
  return apex_pg_allreduce_flag(ddp->pg, flag);
}

apex_status apex_ddp_amp_before_unscale(void *ddp) { return apex_ddp_finish(ddp); }
apex_status apex_ddp_amp_reduce_overflow(void *ddp, int *flag) { return apex_ddp_allreduce_overflow(ddp, flag); }

apex_reducer *apex_ddp_reducer(const apex_ddp *ddp) {
  if (!ddp) apex__fail_null_arg(__func__, "ddp");
  return ddp ? ddp->red : NULL;
}
