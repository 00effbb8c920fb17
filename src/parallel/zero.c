/* zero.c: the sharded optimizer (zero.h): the shard plan, the reduce-scatter of gradients, the step
 * of this rank's shard and the all-gather of parameters.
 *
 * Layout: the flat parameter vector is cut into world ranges (plan_ranges). A parameter cut by range
 * boundaries becomes pieces, one per owning rank. Each gradient dtype has one segment of S elements
 * per rank (S is the largest rank's share): rank r's holds the pieces r owns, in parameter order,
 * then zeros up to S; this rank keeps only its own, the shard buffer. Equal segments are what a
 * reduce-scatter and an all-gather take (NCCL's included), and the padding costs at most the
 * imbalance of the ranges; zero_comm.c moves them a bucket at a time. The same buffers carry the
 * parameters back: a rank packs its updated pieces into its shard buffer and the all-gather spreads
 * them.
 *
 * This rank's optimizer is an ordinary apex_optimizer whose parameters are views of the pieces it owns
 * (1-D, or the parameter's own shape for a whole parameter) and whose gradients are views of the
 * shard buffer, so every kernel, master and state is the unsharded optimizer's, on fewer elements. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apex/multi_tensor.h"
#include "apex/mt_apply.h"
#include "apex/zero.h"
#include "core/internal.h"
#include "optim/optim_shard.h"
#include "parallel/pg_internal.h"

#include "parallel/reducer_internal.h"
#include "parallel/zero_internal.h"

static int whole_params_only(apex_optim_kind kind) {
  return kind == APEX_OPTIM_LAMB || kind == APEX_OPTIM_NOVOGRAD || kind == APEX_OPTIM_ADAMP;
}

void apex_zero_destroy(apex_zero *z) {
  if (!z) return;
  for (int k = 0; z->pieces && k < z->npieces; k++) {
    apex_tensor_destroy(z->pieces[k].param);
    apex_tensor_destroy(z->pieces[k].grad);
    apex_tensor_destroy(z->pieces[k].shard);
  }
  apex__zero_free_chunks(z);
  apex__zero_free_overlap(z);
  for (int d = 0; d < APEX_DTYPE_COUNT; d++) apex_tensor_destroy(z->shard[d]);
  apex_optimizer_destroy(z->opt);
  if (z->step_grads != z->own_grads)
    for (int k = 0; z->step_grads && k < z->owned; k++) apex_tensor_destroy(z->step_grads[k]);
  if (z->step_grads != z->own_grads) free(z->step_grads);
  apex_tensor_destroy(z->unscaled);
  free(z->own_grads);
  free(z->pieces);
  free(z->bound);
  free(z->params);
  free(z->grads);
  free(z);
}

/* The j-th parameter of the flat vector: the last first, the order in which backward finishes the
 * gradients (DDP's bucket order), so that a bucket the backward has finished is one stretch of it. */
static int flat_param(const apex_zero *z, int j) { return z->n - 1 - j; }

/* Range boundaries: rank r's range starts near r * total / world. Inside a parameter a boundary is
 * rounded to the nearest multiple of the multi-tensor tile from the parameter's start (every tile of
 * a piece is then a tile of the whole parameter, so the kernels see the same elements together);
 * with whole set, to the nearer end of the parameter. */
static void plan_ranges(apex_zero *z, int whole) {
  size_t total = 0;
  for (int i = 0; i < z->n; i++) total += apex_tensor_numel(z->params[i]);
  z->bound[0] = 0;
  z->bound[z->world] = total;
  for (int r = 1; r < z->world; r++) {
    size_t want = (size_t)((uint64_t)r * total / (uint64_t)z->world), start = 0, b = total;
    for (int j = 0; j < z->n; j++) {
      size_t numel = apex_tensor_numel(z->params[flat_param(z, j)]);
      if (want < start + numel) {
        size_t off = want - start, cut;
        if (whole) cut = 2 * off < numel ? 0 : numel;
        else {
          cut = (off + APEX_MT_TILE / 2) / APEX_MT_TILE * APEX_MT_TILE;
          if (cut > numel) cut = numel;
        }
        b = start + cut;
        break;
      }
      start += numel;
    }
    z->bound[r] = b < z->bound[r - 1] ? z->bound[r - 1] : b;
  }
}

/* Cuts the parameters at the range boundaries and places each piece in its owner's segment. */
static apex_status plan_pieces(apex_zero *z) {
  size_t cap = (size_t)z->n + (size_t)z->world;
  z->pieces = calloc(cap, sizeof *z->pieces);
  if (!z->pieces) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_zero_create: out of memory");
  size_t *fill = calloc((size_t)z->world * APEX_DTYPE_COUNT, sizeof *fill);
  if (!fill) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_zero_create: out of memory");
  size_t start = 0;
  int r = 0;
  for (int j = 0; j < z->n; j++) {
    int i = flat_param(z, j);
    size_t numel = apex_tensor_numel(z->params[i]), end = start + numel;
    int d = (int)apex_tensor_dtype(z->params[i]);
    for (size_t at = start; at < end;) {
      while (z->bound[r + 1] <= at) r++;
      size_t stop = z->bound[r + 1] < end ? z->bound[r + 1] : end;
      piece *p = &z->pieces[z->npieces++];
      p->i = i, p->off = at - start, p->len = stop - at, p->owner = r;
      p->pos = fill[(size_t)r * APEX_DTYPE_COUNT + d];
      fill[(size_t)r * APEX_DTYPE_COUNT + d] += p->len;
      at = stop;
    }
    start = end;
  }
  for (int d = 0; d < APEX_DTYPE_COUNT; d++)
    for (int q = 0; q < z->world; q++)
      if (fill[(size_t)q * APEX_DTYPE_COUNT + d] > z->seg[d]) z->seg[d] = fill[(size_t)q * APEX_DTYPE_COUNT + d];
  free(fill);
  return APEX_OK;
}

/* A view of elements [off, off + len) of t: t's own shape when that is all of t, else 1-D. */
static apex_tensor *piece_view(apex_tensor *t, size_t off, size_t len) {
  if (off == 0 && len == apex_tensor_numel(t)) return apex_tensor_slice_view(t, 0, apex_tensor_ndim(t), apex_tensor_shape(t));
  int64_t n = (int64_t)len;
  return apex_tensor_slice_view(t, off, 1, &n);
}

static apex_status make_buffers(apex_zero *z) {
  apex_device dev = apex_pg_device(z->pg);
  for (int d = 0; d < APEX_DTYPE_COUNT; d++) {
    if (!z->seg[d]) continue;
    int64_t one = (int64_t)z->seg[d];
    z->shard[d] = apex_tensor_create_on(dev, (apex_dtype)d, 1, &one);
    if (!z->shard[d]) return APEX_ERR_OUT_OF_MEMORY;
    apex_status st = apex_tensor_fill(z->shard[d], 0.0f); /* the padding is gathered: keep it zero */
    if (st != APEX_OK) return st;
  }
  for (int k = 0; k < z->npieces; k++) {
    piece *p = &z->pieces[k];
    int d = (int)apex_tensor_dtype(z->params[p->i]);
    p->param = piece_view(z->params[p->i], p->off, p->len);
    p->grad = piece_view(z->grads[p->i], p->off, p->len);
    if (!p->param || !p->grad) return APEX_ERR_OUT_OF_MEMORY;
    if (p->owner == z->rank) {
      /* The gradient the optimizer reads has the shape of the parameter view it steps. */
      p->shard = apex_tensor_slice_view(z->shard[d], p->pos, apex_tensor_ndim(p->param), apex_tensor_shape(p->param));
      if (!p->shard) return APEX_ERR_OUT_OF_MEMORY;
    }
  }
  return APEX_OK;
}

/* This rank's optimizer: one group over the pieces it owns (none when it owns nothing). */
/* amp_unscale: one f32 buffer of the owned elements, viewed as each owned piece. */
static apex_status make_unscaled(apex_zero *z) {
  size_t total = 0;
  for (int k = 0; k < z->owned; k++) total += apex_tensor_numel(z->own_grads[k]);
  int64_t len = (int64_t)total;
  z->step_grads = calloc((size_t)z->owned, sizeof *z->step_grads);
  z->unscaled = total ? apex_tensor_create_on(apex_pg_device(z->pg), APEX_F32, 1, &len) : NULL;
  if (!z->step_grads || (total && !z->unscaled)) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_zero_create: out of memory");
  size_t at = 0;
  for (int k = 0; k < z->owned; k++) {
    const apex_tensor *g = z->own_grads[k];
    if (!(z->step_grads[k] = apex_tensor_slice_view(z->unscaled, at, apex_tensor_ndim(g), apex_tensor_shape(g)))) return APEX_ERR_OUT_OF_MEMORY;
    at += apex_tensor_numel(g);
  }
  return APEX_OK;
}

static apex_status make_optimizer(apex_zero *z, apex_optim_kind kind, const apex_optim_options *optim, int amp_unscale) {
  z->opt = apex_optimizer_create(kind, optim);
  if (!z->opt) return APEX_ERR_INVALID_ARG; /* its message stands */
  z->own_grads = calloc((size_t)z->npieces, sizeof *z->own_grads);
  apex_tensor **own_params = calloc((size_t)z->npieces, sizeof *own_params);
  apex_status st = z->own_grads && own_params ? APEX_OK : apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_zero_create: out of memory");
  for (int k = 0; st == APEX_OK && k < z->npieces; k++)
    if (z->pieces[k].owner == z->rank) {
      own_params[z->owned] = z->pieces[k].param;
      z->own_grads[z->owned++] = z->pieces[k].shard;
    }
  z->step_grads = z->own_grads;
  if (st == APEX_OK && amp_unscale && z->owned > 0) st = make_unscaled(z);
  if (st == APEX_OK && z->owned > 0) st = apex_optimizer_add_group(z->opt, own_params, z->owned, z->step_grads, z->owned, NULL, NULL);
  free(own_params);
  /* Clipping and LAMB's max_grad_norm take the norm of the whole model's gradients. */
  if (st == APEX_OK) st = apex__optimizer_set_norm_grads(z->opt, z->grads, z->n);
  if (st == APEX_OK && kind == APEX_OPTIM_LAMB) {
    float m = optim ? optim->max_grad_norm : 0.0f;
    z->lamb_norm = m == 0.0f || (m > 0.0f && isfinite(m));
  }
  return st;
}

/* The masters of this rank's f16/bf16 pieces from the caller's f32 values. */
static apex_status set_masters(apex_zero *z, apex_tensor *const *values) {
  apex_status st = APEX_OK;
  for (int k = 0, own = 0; st == APEX_OK && k < z->npieces; k++) {
    piece *p = &z->pieces[k];
    if (p->owner != z->rank) continue;
    apex_tensor *master = apex_optimizer_master(z->opt, 0, own++);
    if (apex_tensor_dtype(z->params[p->i]) == APEX_F32) continue;
    apex_tensor *src = piece_view(values[p->i], p->off, p->len);
    st = src ? apex_tensor_copy(master, src) : APEX_ERR_OUT_OF_MEMORY;
    apex_tensor_destroy(src);
  }
  return st;
}

static apex_zero *fail_create(apex_zero *z, apex_status st) {
  char msg[APEX_PG_MESSAGE];
  snprintf(msg, sizeof msg, "%s", apex_last_error());
  apex_zero_destroy(z);
  return apex__fail_null(st, "apex_zero_create: %s", msg);
}

/* Argument checks that need no communication, so a program that passes the same arguments on every
 * rank fails alike on every rank. */
static apex_status check_args(apex_pg *pg, apex_tensor *const *params, apex_tensor *const *grads, int n,
                              apex_optim_kind kind, const apex_zero_options *o) {
  if (!pg || !params || !grads)
    return apex__fail(APEX_ERR_INVALID_ARG, "%s is NULL", !pg ? "pg" : !params ? "params" : "grads");
  if (n < 1) return apex__fail(APEX_ERR_INVALID_ARG, "need at least one parameter (n = %d)", n);
  if ((unsigned)kind >= APEX_OPTIM_KIND_COUNT) return apex__fail(APEX_ERR_INVALID_ARG, "invalid optimizer kind %d", (int)kind);
  if (o->stage != 0 && o->stage != 1 && o->stage != 2)
    return apex__fail(APEX_ERR_INVALID_ARG, "stage %d is not implemented (use 1 or 2: stage 3, sharding the parameters too, "
                      "is not)", o->stage);
  apex_device dev = apex_pg_device(pg);
  for (int i = 0; i < n; i++) {
    if (!params[i] || !grads[i]) return apex__fail(APEX_ERR_INVALID_ARG, "%s %d is NULL", params[i] ? "gradient" : "parameter", i);
    if (apex_tensor_device(params[i]) != dev || apex_tensor_device(grads[i]) != dev)
      return apex__fail(APEX_ERR_DEVICE, "parameter %d or its gradient is not on the device of the %s group", i, apex_pg_backend(pg));
    if (!apex_tensor_same_shape(params[i], grads[i]))
      return apex__fail(APEX_ERR_SHAPE, "gradient %d has another shape than its parameter", i);
    if (apex_tensor_dtype(params[i]) != apex_tensor_dtype(grads[i]))
      return apex__fail(APEX_ERR_DTYPE, "gradient %d is %s but its parameter %s (give each parameter a gradient of its dtype)", i,
                        apex_dtype_name(apex_tensor_dtype(grads[i])), apex_dtype_name(apex_tensor_dtype(params[i])));
    if (o->master_values && apex_tensor_dtype(params[i]) != APEX_F32) {
      const apex_tensor *m = o->master_values[i];
      if (!m) return apex__fail(APEX_ERR_INVALID_ARG, "master_values[%d] is NULL (parameter %d is %s)", i, i, apex_dtype_name(apex_tensor_dtype(params[i])));
      if (apex_tensor_dtype(m) != APEX_F32)
        return apex__fail(APEX_ERR_DTYPE, "master_values[%d] is %s; masters are f32", i, apex_dtype_name(apex_tensor_dtype(m)));
      if (!apex_tensor_same_shape(m, params[i]) || apex_tensor_device(m) != dev)
        return apex__fail(APEX_ERR_SHAPE, "master_values[%d] has another shape or device than parameter %d", i, i);
    }
    for (int j = 0; j < i; j++)
      if (params[j] == params[i] || grads[j] == grads[i])
        return apex__fail(APEX_ERR_INVALID_ARG, "%s %d is listed twice (also at %d)", params[j] == params[i] ? "parameter" : "gradient", i, j);
  }
  return APEX_OK;
}

apex_zero *apex_zero_create(apex_pg *pg, apex_tensor *const *params, apex_tensor *const *grads, int n, apex_optim_kind kind,
                            const apex_optim_options *optim, const apex_zero_options *options) {
  apex_zero_options o = options ? *options : (apex_zero_options){0};
  apex_status st = check_args(pg, params, grads, n, kind, &o);
  /* The options too are checked before any exchange, on a one-element group that also says the lr a
   * rank owning nothing reports. */
  float lr = NAN;
  if (st == APEX_OK) {
    apex_optimizer *probe = apex_optimizer_create(kind, optim);
    int64_t one = 1;
    apex_tensor *t = probe ? apex_tensor_create(APEX_F32, 1, &one) : NULL;
    st = !probe ? APEX_ERR_INVALID_ARG : t ? apex_optimizer_add_group(probe, &t, 1, NULL, 0, NULL, NULL) : APEX_ERR_OUT_OF_MEMORY;
    if (st == APEX_OK) lr = apex_optimizer_get_lr(probe, 0);
    apex_optimizer_destroy(probe);
    apex_tensor_destroy(t);
  }
  if (st != APEX_OK) return fail_create(NULL, st);
  apex_zero *z = calloc(1, sizeof *z);
  if (!z) return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex_zero_create: out of memory");
  z->pg = pg;
  z->rank = apex_pg_rank(pg);
  z->world = apex_pg_world_size(pg);
  z->stage = o.stage ? o.stage : 1;
  z->release = z->stage == 2 && !o.keep_grads;
  z->n = n;
  z->post = o.sum_only ? 1.0f : 1.0f / (float)z->world;
  z->kind = kind;
  if (optim) z->optim = *optim;
  z->params = malloc((size_t)n * sizeof *z->params);
  z->grads = malloc((size_t)n * sizeof *z->grads);
  z->bound = calloc((size_t)z->world + 1, sizeof *z->bound);
  if (!z->params || !z->grads || !z->bound) return fail_create(z, apex__fail(APEX_ERR_OUT_OF_MEMORY, "out of memory"));
  memcpy(z->params, params, (size_t)n * sizeof *params);
  memcpy(z->grads, grads, (size_t)n * sizeof *grads);
  /* The ranks must hold the same parameters, or the collectives would not match. */
  st = apex_pg_check_consistent(pg, NULL, params, n);
  for (int i = 0; st == APEX_OK && i < n; i++) st = apex_pg_broadcast(pg, params[i], 0);
  if (st != APEX_OK) return fail_create(z, st);
  plan_ranges(z, whole_params_only(kind));
  st = plan_pieces(z);
  if (st == APEX_OK) st = make_buffers(z);
  /* The overlap's buffers first: the chunks of the all-gathers borrow one (zero_comm.c). */
  if (st == APEX_OK && o.overlap) st = apex__zero_make_overlap(z, o.bucket_bytes);
  if (st == APEX_OK) st = apex__zero_plan_chunks(z, o.bucket_bytes);
  if (st == APEX_OK) st = make_optimizer(z, kind, optim, o.amp_unscale);
  if (st == APEX_OK && o.master_values) st = set_masters(z, o.master_values);
  if (st != APEX_OK) return fail_create(z, st);
  z->lr = lr;
  return z;
}

/* stage 1 and the global norm: the reduced shards of every rank into grads[]. */
static apex_status gather_grads(apex_zero *z) {
  apex_status st = APEX_OK;
  /* Released gradients are made again, unfilled: the all-gather writes every element of them. */
  for (int i = 0; st == APEX_OK && i < z->n; i++) st = apex__tensor_remake(z->grads[i], 0, "apex_zero_gather_grads");
  if (st == APEX_OK) st = apex__zero_allgather(z, 0);
  if (st == APEX_OK) z->gathered = 1;
  return st;
}

apex_status apex_zero_reduce_grads(apex_zero *z) {
  if (!z) return apex__fail(APEX_ERR_INVALID_ARG, "apex_zero_reduce_grads: z is NULL");
  apex_status st = z->red ? apex__zero_overlap_reduce(z) : apex__zero_reduce_scatter(z);
  /* As the Reducer writes its sums back: times f / world_size in f32, rounded once to the dtype. */
  for (int d = 0; st == APEX_OK && d < APEX_DTYPE_COUNT; d++)
    if (z->seg[d] && z->post != 1.0f) st = apex_mt_scale(0, NULL, &z->shard[d], &z->shard[d], 1, z->post);
  z->gathered = 0;
  /* Stage 2: every gradient is in this rank's shard or another's now. */
  if (st == APEX_OK) apex__zero_release(z, 0, z->n);
  z->released_upto = 0;
  if (st == APEX_OK && z->stage == 1) st = gather_grads(z);
  z->reduced = st == APEX_OK;
  return st;
}

apex_status apex_zero_gather_grads(apex_zero *z) {
  if (!z) return apex__fail(APEX_ERR_INVALID_ARG, "apex_zero_gather_grads: z is NULL");
  if (!z->reduced) return apex__fail(APEX_ERR_STATE, "apex_zero_gather_grads: call apex_zero_reduce_grads first");
  return z->gathered ? APEX_OK : gather_grads(z);
}

static apex_status check_scale(const char *fn, float grad_scale) {
  if (!(grad_scale > 0.0f && isfinite(grad_scale)))
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: grad_scale is %g; it must be finite and > 0 (1 for unscaled gradients)", fn,
                      (double)grad_scale);
  return APEX_OK;
}

apex_status apex_zero_clip_grad_norm(apex_zero *z, float max_norm, float grad_scale, float *total_norm) {
  const char *fn = "apex_zero_clip_grad_norm";
  if (!z) return apex__fail(APEX_ERR_INVALID_ARG, "%s: z is NULL", fn);
  if (!(max_norm > 0.0f && isfinite(max_norm)))
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: max_norm is %g; it must be finite and > 0", fn, (double)max_norm);
  apex_status st = check_scale(fn, grad_scale);
  if (st != APEX_OK) return st;
  if (!z->reduced) return apex__fail(APEX_ERR_STATE, "%s: call apex_zero_reduce_grads first (the norm is of the reduced gradients)", fn);
  /* LAMB's step takes a norm of the whole gradients itself: gathered for it anyway. */
  if (z->gathered || z->lamb_norm) {
    if (!z->gathered && (st = gather_grads(z)) != APEX_OK) return st;
    return apex_optimizer_clip_grad_norm(z->opt, max_norm, grad_scale, total_norm);
  }
  float norm = 0.0f;
  st = apex__zero_global_norm(z, apex__optimizer_clip_coef(z->opt) / grad_scale, &norm);
  if (st != APEX_OK) return st;
  if (total_norm) *total_norm = norm;
  apex__optimizer_clip_by(z->opt, max_norm, norm);
  return APEX_OK;
}

/* Every rank's updated pieces into params[] on every rank, in the parameters' dtype. */
static apex_status gather_params(apex_zero *z) {
  apex_status st = APEX_OK;
  for (int k = 0; st == APEX_OK && k < z->npieces; k++)
    if (z->pieces[k].owner == z->rank) st = apex_tensor_copy(z->pieces[k].shard, z->pieces[k].param);
  return st == APEX_OK ? apex__zero_allgather(z, 1) : st;
}

apex_status apex_zero_reduce_overflow(apex_zero *z, int *flag) {
  if (!z || !flag) return apex__fail(APEX_ERR_INVALID_ARG, "apex_zero_reduce_overflow: %s is NULL", z ? "flag" : "z");
  if (!z->reduced) return apex__fail(APEX_ERR_STATE, "apex_zero_reduce_overflow: call apex_zero_reduce_grads first");
  int f = *flag ? 1 : 0;
  if (z->owned > 0) {
    int found = 0;
    apex_status st = apex_mt_check_finite(z->own_grads, z->owned, &found);
    if (st != APEX_OK) return st;
    f |= found;
  }
  /* One reduction of the flag: every rank skips, or none does. */
  apex_status st = apex_pg_allreduce_flag(z->pg, &f);
  if (st == APEX_OK) *flag = f;
  return st;
}

static apex_status step_shard(apex_zero *z, float grad_scale, int *overflow);

apex_status apex_zero_step(apex_zero *z, float grad_scale, int *overflow) {
  int pending = z && z->reduced;
  apex_status st = step_shard(z, grad_scale, overflow);
  if (pending && !z->reduced) { /* the step took this reduce, whatever came of it */
    /* Stage 2: gradients gathered for a norm are spent too; the next step's peak starts here. */
    apex__zero_release(z, 0, z->n);
    z->grad_peak = apex__zero_grad_held(z);
  }
  return st;
}

static apex_status step_shard(apex_zero *z, float grad_scale, int *overflow) {
  const char *fn = "apex_zero_step";
  if (!z) return apex__fail(APEX_ERR_INVALID_ARG, "%s: z is NULL", fn);
  apex_status st = check_scale(fn, grad_scale);
  if (st != APEX_OK) return st;
  if (!z->reduced)
    return apex__fail(APEX_ERR_STATE, "%s: call apex_zero_reduce_grads before each step (the shard has no reduced gradients)", fn);
  int flag = overflow && *overflow ? 1 : 0;
  if ((st = apex_zero_reduce_overflow(z, &flag)) != APEX_OK) return st;
  if (overflow) *overflow = flag;
  z->reduced = 0;
  if (flag) return z->owned > 0 ? apex_optimizer_step(z->opt, grad_scale, 1) : APEX_OK; /* drops a pending clip */
  if (z->lamb_norm && !z->gathered && (st = gather_grads(z)) != APEX_OK) return st;
  if (z->owned > 0 && z->unscaled) {
    /* As amp: the f32 unscaled gradients first, then a step that applies only the clipping. */
    st = apex_mt_scale(0, NULL, z->own_grads, z->step_grads, z->owned, 1.0f / grad_scale);
    /* LAMB's global norm is of the whole gradients, still scaled: unscaled inside its norm. */
    if (st == APEX_OK) st = apex__optimizer_set_norm_scale(z->opt, 1.0f / grad_scale);
    if (st == APEX_OK) st = apex_optimizer_step(z->opt, 1.0f, 0);
  } else if (z->owned > 0) {
    st = apex_optimizer_step(z->opt, grad_scale, 0);
  }
  if (st != APEX_OK) return st;
  return gather_params(z);
}

apex_status apex_zero_set_lr(apex_zero *z, float lr) {
  if (!z) return apex__fail(APEX_ERR_INVALID_ARG, "apex_zero_set_lr: z is NULL");
  if (!(lr >= 0.0f && isfinite(lr))) return apex__fail(APEX_ERR_INVALID_ARG, "apex_zero_set_lr: lr is %g; it must be finite and >= 0", (double)lr);
  apex_status st = z->owned > 0 ? apex_optimizer_set_lr(z->opt, 0, lr) : APEX_OK;
  if (st == APEX_OK) z->lr = lr;
  return st;
}

float apex_zero_get_lr(const apex_zero *z) {
  if (!z) return apex__fail(APEX_ERR_INVALID_ARG, "apex_zero_get_lr: z is NULL"), NAN;
  return z->owned > 0 ? apex_optimizer_get_lr(z->opt, 0) : z->lr;
}

apex_status apex_zero_shard_range(const apex_zero *z, int rank, size_t *begin, size_t *end) {
  if (!z || !begin || !end) return apex__fail(APEX_ERR_INVALID_ARG, "apex_zero_shard_range: %s is NULL", !z ? "z" : !begin ? "begin" : "end");
  if (rank < 0 || rank >= z->world)
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_zero_shard_range: rank %d is outside [0, %d)", rank, z->world);
  *begin = z->bound[rank];
  *end = z->bound[rank + 1];
  return APEX_OK;
}

size_t apex_zero_state_bytes(const apex_zero *z) {
  if (!z) return apex__fail(APEX_ERR_INVALID_ARG, "apex_zero_state_bytes: z is NULL"), 0;
  size_t bytes = 0;
  if (z->owned > 0 && apex_optimizer_state_size(z->opt, &bytes) != APEX_OK) return 0;
  return bytes;
}

size_t apex_zero_grad_bytes(const apex_zero *z, size_t *peak) {
  if (!z) {
    if (peak) *peak = 0;
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_zero_grad_bytes: z is NULL"), 0;
  }
  size_t now = apex__zero_grad_held(z);
  if (peak) *peak = z->grad_peak > now ? z->grad_peak : now;
  return now;
}

size_t apex_zero_buffer_bytes(const apex_zero *z) {
  if (!z) return apex__fail(APEX_ERR_INVALID_ARG, "apex_zero_buffer_bytes: z is NULL"), 0;
  size_t bytes = 0;
  for (int d = 0; d < APEX_DTYPE_COUNT; d++)
    bytes += (z->seg[d] + (z->staging_borrowed[d] ? 0 : z->chunk_elems[d] * (size_t)z->world)) * apex_dtype_size((apex_dtype)d);
  if (z->red) bytes += apex_reducer_buffer_bytes(z->red);
  return bytes;
}
