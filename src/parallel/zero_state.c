/* zero_state.c: checkpoints of the sharded optimizer (zero.h): every rank's shard gathered into one
 * unsharded optimizer, whose bytes an unsharded run saves, and a rank's shard taken back from one. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "optim/optim_shard.h"
#include "parallel/pg_internal.h"
#include "parallel/zero_internal.h"

/* ---- checkpoints: the whole state in an unsharded optimizer -------------------------------------- */

/* The tensor of quantity q of parameter i of opt: q 0 is the f32 master, q >= 1 state q - 1. */
static apex_tensor *quantity(const apex_optimizer *opt, int i, int q) {
  return q == 0 ? apex_optimizer_master(opt, 0, i) : apex__optimizer_state(opt, 0, i, q - 1);
}

/* An unsharded optimizer over z's parameters with z's kind and options, its state not yet filled. */
static apex_optimizer *full_optimizer(const apex_zero *z) {
  apex_optimizer *f = apex_optimizer_create(z->kind, &z->optim);
  apex_status st = f ? apex_optimizer_add_group(f, z->params, z->n, NULL, 0, NULL, NULL) : APEX_ERR_OUT_OF_MEMORY;
  if (st == APEX_OK && z->owned > 0) st = apex__optimizer_copy_options(f, 0, z->opt, 0);
  if (st == APEX_OK) st = apex_optimizer_set_lr(f, 0, z->lr);
  if (st != APEX_OK) {
    apex_optimizer_destroy(f);
    return NULL;
  }
  return f;
}

/* Moves every piece's quantities from its owner into f on every rank: each quantity of the owned
 * pieces is packed into one f32 segment per rank and all-gathered (exact: no arithmetic). */
static apex_status gather_state(apex_zero *z, apex_optimizer *f) {
  size_t *pos = calloc((size_t)z->npieces, sizeof *pos), seg = 0;
  size_t *fill = calloc((size_t)z->world, sizeof *fill);
  apex_status st = pos && fill ? APEX_OK : apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_zero_consolidate: out of memory");
  for (int k = 0; st == APEX_OK && k < z->npieces; k++) {
    pos[k] = fill[z->pieces[k].owner];
    fill[z->pieces[k].owner] += z->pieces[k].len;
    if (fill[z->pieces[k].owner] > seg) seg = fill[z->pieces[k].owner];
  }
  int64_t one = (int64_t)seg, all = (int64_t)(seg * (size_t)z->world);
  apex_device dev = apex_pg_device(z->pg);
  apex_tensor *mine = NULL, *flat = NULL;
  if (st == APEX_OK && seg) {
    mine = apex_tensor_create_on(dev, APEX_F32, 1, &one);
    flat = apex_tensor_create_on(dev, APEX_F32, 1, &all);
    if (!mine || !flat) st = APEX_ERR_OUT_OF_MEMORY;
    if (st == APEX_OK) st = apex_tensor_fill(mine, 0.0f);
  }
  int nq = 1 + apex__optimizer_nstates(f, 0);
  for (int q = 0; st == APEX_OK && seg && q < nq; q++) {
    int own = 0;
    for (int k = 0; st == APEX_OK && k < z->npieces; k++) {
      piece *p = &z->pieces[k];
      if (p->owner != z->rank) continue;
      int64_t len = (int64_t)p->len;
      apex_tensor *src = quantity(z->opt, own++, q), *dst = apex_tensor_slice_view(mine, pos[k], 1, &len);
      st = src && dst ? apex_tensor_copy(dst, src) : APEX_ERR_OUT_OF_MEMORY;
      apex_tensor_destroy(dst);
    }
    if (st == APEX_OK) st = apex_pg_allgather(z->pg, mine, flat);
    for (int k = 0; st == APEX_OK && k < z->npieces; k++) {
      piece *p = &z->pieces[k];
      /* An f32 parameter is its own master: the parameters are already equal on every rank. */
      if (q == 0 && apex_tensor_dtype(z->params[p->i]) == APEX_F32) continue;
      apex_tensor *whole = quantity(f, p->i, q);
      int64_t len = (int64_t)p->len;
      apex_tensor *src = apex_tensor_slice_view(flat, (size_t)p->owner * seg + pos[k], 1, &len);
      apex_tensor *dst = whole ? apex_tensor_slice_view(whole, p->off, 1, &len) : NULL;
      st = src && dst ? apex_tensor_copy(dst, src) : APEX_ERR_OUT_OF_MEMORY;
      apex_tensor_destroy(src);
      apex_tensor_destroy(dst);
    }
  }
  apex_tensor_destroy(mine);
  apex_tensor_destroy(flat);
  free(pos);
  free(fill);
  return st;
}

/* Step counts and per-tensor scalars: the rank owning a parameter's first element speaks for it. */
static apex_status gather_counts(apex_zero *z, apex_optimizer *f) {
  int nsc = apex__optimizer_nscalars(f, 0), words = 2 + nsc; /* an int64 step, then the scalars */
  size_t row = (size_t)words * 4, bytes = row * (size_t)z->n;
  uint32_t *mine = calloc((size_t)z->n, row), *all = calloc((size_t)z->n * (size_t)z->world, row);
  int *first = calloc((size_t)z->n, sizeof *first);
  apex_status st = mine && all && first ? APEX_OK : apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_zero_consolidate: out of memory");
  for (int k = 0, own = 0; st == APEX_OK && k < z->npieces; k++) {
    piece *p = &z->pieces[k];
    if (p->off == 0) first[p->i] = p->owner;
    if (p->owner != z->rank) continue;
    int64_t step = apex_optimizer_step_count(z->opt, 0, own);
    memcpy(&mine[(size_t)p->i * (size_t)words], &step, sizeof step);
    st = apex__optimizer_param_scalars(z->opt, 0, own, (float *)&mine[(size_t)p->i * (size_t)words + 2], NULL);
    own++;
  }
  if (st == APEX_OK) st = apex__pg_allgather_bytes(z->pg, mine, all, bytes);
  for (int i = 0; st == APEX_OK && i < z->n; i++) {
    const uint32_t *r = &all[((size_t)first[i] * (size_t)z->n + (size_t)i) * (size_t)words];
    int64_t step;
    memcpy(&step, r, sizeof step);
    st = apex__optimizer_set_step(f, 0, i, step);
    if (st == APEX_OK && nsc) st = apex__optimizer_param_scalars(f, 0, i, NULL, (const float *)(r + 2));
  }
  free(mine);
  free(all);
  free(first);
  return st;
}

apex_optimizer *apex_zero_consolidate(apex_zero *z) {
  if (!z) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_zero_consolidate: z is NULL");
  apex_optimizer *f = full_optimizer(z);
  apex_status st = f ? gather_state(z, f) : APEX_ERR_OUT_OF_MEMORY;
  if (st == APEX_OK) st = gather_counts(z, f);
  if (st != APEX_OK) {
    char msg[APEX_PG_MESSAGE];
    snprintf(msg, sizeof msg, "%s", apex_last_error());
    apex_optimizer_destroy(f);
    return apex__fail_null(st, "apex_zero_consolidate: %s", msg);
  }
  return f;
}

apex_status apex_zero_load_state(apex_zero *z, const apex_optimizer *full) {
  const char *fn = "apex_zero_load_state";
  if (!z || !full) return apex__fail(APEX_ERR_INVALID_ARG, "%s: %s is NULL", fn, z ? "full" : "z");
  if (apex_optimizer_kind(full) != z->kind)
    return apex__fail(APEX_ERR_STATE, "%s: the optimizer is %s but this sharded optimizer %s", fn, apex_optim_kind_name(apex_optimizer_kind(full)),
                      apex_optim_kind_name(z->kind));
  if (apex_optimizer_num_groups(full) != 1 || apex_optimizer_group_size(full, 0) != z->n)
    return apex__fail(APEX_ERR_STATE, "%s: the optimizer has %d group(s) of %d parameters; this one 1 of %d", fn,
                      apex_optimizer_num_groups(full), apex_optimizer_group_size(full, 0), z->n);
  for (int i = 0; i < z->n; i++) {
    apex_tensor *p = apex_optimizer_param(full, 0, i);
    if (!apex_tensor_same_shape(p, z->params[i])) return apex__fail(APEX_ERR_SHAPE, "%s: parameter %d has another shape", fn, i);
    if (apex_tensor_dtype(p) != apex_tensor_dtype(z->params[i]))
      return apex__fail(APEX_ERR_DTYPE, "%s: parameter %d is %s there but %s here", fn, i, apex_dtype_name(apex_tensor_dtype(p)),
                        apex_dtype_name(apex_tensor_dtype(z->params[i])));
  }
  if (z->owned > 0 && apex__optimizer_nstates(full, 0) != apex__optimizer_nstates(z->opt, 0))
    return apex__fail(APEX_ERR_STATE, "%s: the optimizer keeps %d state tensors per parameter, this one %d (another amsgrad or "
                      "momentum setting)", fn, apex__optimizer_nstates(full, 0), apex__optimizer_nstates(z->opt, 0));
  apex_status st = APEX_OK;
  for (int i = 0; st == APEX_OK && i < z->n; i++)
    if (apex_optimizer_param(full, 0, i) != z->params[i]) st = apex_tensor_copy(z->params[i], apex_optimizer_param(full, 0, i));
  if (st == APEX_OK && z->owned > 0) st = apex__optimizer_copy_options(z->opt, 0, full, 0);
  int nq = 1 + (z->owned > 0 ? apex__optimizer_nstates(z->opt, 0) : 0);
  for (int k = 0, own = 0; st == APEX_OK && k < z->npieces; k++) {
    piece *p = &z->pieces[k];
    if (p->owner != z->rank) continue;
    for (int q = 0; st == APEX_OK && q < nq; q++) {
      if (q == 0 && apex_tensor_dtype(z->params[p->i]) == APEX_F32) continue; /* the parameter itself, copied above */
      int64_t len = (int64_t)p->len;
      apex_tensor *whole = quantity(full, p->i, q), *dst = quantity(z->opt, own, q);
      apex_tensor *src = whole ? apex_tensor_slice_view(whole, p->off, 1, &len) : NULL;
      st = src && dst ? apex_tensor_copy(dst, src) : APEX_ERR_OUT_OF_MEMORY;
      apex_tensor_destroy(src);
    }
    if (st == APEX_OK) st = apex__optimizer_set_step(z->opt, 0, own, apex_optimizer_step_count(full, 0, p->i));
    float sc[8];
    if (st == APEX_OK && apex__optimizer_nscalars(z->opt, 0) > 0 && apex__optimizer_nscalars(z->opt, 0) <= 8) {
      st = apex__optimizer_param_scalars((apex_optimizer *)full, 0, p->i, sc, NULL);
      if (st == APEX_OK) st = apex__optimizer_param_scalars(z->opt, 0, own, NULL, sc);
    }
    own++;
  }
  if (st == APEX_OK) z->lr = apex_optimizer_get_lr(full, 0);
  return st;
}
