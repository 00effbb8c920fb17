/* backward.c: running a graph backward.
 *
 * Vars are visited in reverse creation order; a var whose gradient buffer was never made is not on
 * a path from the output and is skipped. Gradients travel as tensors from the graph pool, on the
 * graph's device: f32, or an f16/bf16 value's own dtype on a graph with half gradients (ops whose
 * backward takes any dtype get them as they are; for the others the engine widens out's gradient into
 * an f32 copy and lands f32 stand-ins, rounding once per op). The engine fills, seeds and adds them only
 * through the backend's slots. A
 * leaf of dtype f32 accumulates straight into its grad tensor; a low-precision leaf collects its
 * gradient in f32 and adds it to its grad tensor once, at the end, so it is rounded once per
 * backward rather than once per use; amp's leaf sink (leaf_sink.h) may take that sum first, to fold the
 * flush into its unscale. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "autograd/ag.h"
#include "backend/grad_dtype.h"

/* ---- APEX_BACKWARD_PROFILE=1: the host's time in each op kind's backward ---------------------------
 * Where a backward's host time goes (on a GPU, the time to queue each op's kernels: when it is as long
 * as the GPU's work, the host is the bound), summed per op kind over every backward of the process and
 * printed to stderr at its exit. Read once; off, it costs one branch per op. */
static int profile_on = -1;
static double profile_s[APEX_OP_COUNT];
static long profile_n[APEX_OP_COUNT];
static double profile_finish_s; /* the leaves' flushes and amp's leaf sink, after the ops */
static long profile_dgelu_n;    /* linears whose product took their linear_gelu input's GELU backward (ops_linear.c) */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void profile_print(void) {
  double total = profile_finish_s;
  for (int op = 0; op < APEX_OP_COUNT; op++) total += profile_s[op];
  fprintf(stderr, "# APEX_BACKWARD_PROFILE: host seconds in each op kind's backward, %.3f s in all\n", total);
  for (int op = 0; op < APEX_OP_COUNT; op++)
    if (profile_n[op])
      fprintf(stderr, "#   %-20s %9.4f s %7ld calls %8.1f us a call\n", apex_op_name((apex_op)op), profile_s[op], profile_n[op],
              1e6 * profile_s[op] / (double)profile_n[op]);
  if (profile_dgelu_n)
    fprintf(stderr, "#   %-20s %7ld of the linear calls took the GELU backward of the linear_gelu before them\n", "linear dgelu",
            profile_dgelu_n);
  fprintf(stderr, "#   %-20s %9.4f s (the leaves' flushes, amp's leaf sink)\n", "finish", profile_finish_s);
}

static int profiling(void) {
  if (profile_on < 0) {
    const char *e = getenv("APEX_BACKWARD_PROFILE");
    profile_on = e && e[0] == '1';
    if (profile_on) atexit(profile_print);
  }
  return profile_on;
}

static int touch(apex_graph *g, apex_var *v) {
  if (!apex__grow((void **)&g->touched_leaves, &g->cap_touched, g->n_touched + 1, sizeof *g->touched_leaves)) return 0;
  g->touched_leaves[g->n_touched++] = v;
  return 1;
}

/* The dtype of v's gradient in this backward: its value's f16/bf16 on a graph with half gradients, for
 * an op's result that is not made from leaves alone; f32 otherwise (apex_graph_set_half_grads says why). */
static apex_dtype grad_dtype(const apex_graph *g, const apex_var *v) {
  if (v->gbuf) return v->gdt;
  apex_dtype t = v->value->dtype;
  if (!g->half_grads || !v->graph || v->op == APEX_OP_LEAF || v->grad || v->sum_into || (t != APEX_F16 && t != APEX_BF16))
    return APEX_F32;
  int from_leaves = v->n_in > 0;
  for (int i = 0; i < v->n_in && from_leaves; i++) from_leaves = !v->in[i] || !v->in[i]->graph;
  return from_leaves ? APEX_F32 : t;
}

/* A pool tensor for v's gradient in dtype dt (v's shape; one element for an empty v, so that the buffer
 * is never NULL), zero-filled when zero is set, made v's gbuf; its data, or NULL with g->oom set. */
static void *gbuf_tensor(apex_graph *g, apex_var *v, apex_dtype dt, int zero) {
  size_t n = ag_numel(v);
  int64_t one = 1;
  apex_tensor *t = v->sum_into ? v->sum_into
                   : n         ? apex__pool_tensor(g, dt, v->value->ndim, v->value->shape)
                               : apex__pool_tensor(g, dt, 1, &one);
  if (t && zero && g->mem->fill(apex_tensor_data(t), dt, 0.0f, ag_nz(n)) != APEX_OK) t = NULL;
  if (!t) {
    g->oom = 1;
    return NULL;
  }
  v->gt = t;
  v->gdt = dt;
  return v->gbuf = apex_tensor_data(t);
}

/* An f32 stand-in for v's half gradient during the running op, found again when the op asks twice.
 * With fresh NULL it is zero-filled; otherwise *fresh says whether the op must write it whole (1: new,
 * left unfilled) or add (0: asked before). NULL with g->oom set. */
static float *stage(apex_graph *g, apex_var *v, int *fresh) {
  for (size_t i = 0; i < g->n_stages; i++)
    if (g->stages[i].v == v) {
      if (fresh) *fresh = 0;
      return g->stages[i].buf;
    }
  size_t n = ag_nz(ag_numel(v));
  float *buf = apex__scratch_temp(g, n * sizeof(float));
  if (buf && !fresh && g->mem->fill(buf, APEX_F32, 0.0f, n) != APEX_OK) buf = NULL;
  if (!buf || !apex__grow((void **)&g->stages, &g->cap_stages, g->n_stages + 1, sizeof *g->stages)) {
    g->oom = 1;
    return NULL;
  }
  g->stages[g->n_stages].v = v;
  g->stages[g->n_stages++].buf = buf;
  if (fresh) *fresh = 1;
  return buf;
}

/* Lands the running op's stand-ins in their vars' half buffers: the first one made (it holds 0.0f + the
 * terms) is stored rounded; a later one adds, rounding once. */
static apex_status unstage(apex_graph *g) {
  apex_status st = APEX_OK;
  for (size_t i = 0; i < g->n_stages && st == APEX_OK; i++) {
    apex_var *v = g->stages[i].v;
    size_t n = ag_numel(v);
    int made = v->gbuf != NULL;
    apex_dtype dt = grad_dtype(g, v);
    if (!made && !gbuf_tensor(g, v, dt, 0)) st = APEX_ERR_OUT_OF_MEMORY;
    else if (n)
      st = made ? apex__grad_land(g->be, v->gbuf, dt, g->stages[i].buf, n, 1) : g->mem->convert(v->gbuf, dt, g->stages[i].buf, APEX_F32, n);
  }
  g->n_stages = 0;
  return st;
}

float *apex__gbuf(apex_graph *g, apex_var *v) {
  if (!v || !v->requires_grad) return NULL;
  if (grad_dtype(g, v) != APEX_F32) return stage(g, v, NULL);
  if (v->gbuf) return v->gbuf;
  if (v->grad && !touch(g, v)) {
    g->oom = 1;
    return NULL;
  }
  if (v->grad && v->grad->dtype == APEX_F32) {
    /* A gradient ZeRO stage 2 released reads as zeros: made again, zero-filled, to add to. */
    if (apex__tensor_remake(v->grad, 1, "apex_backward") != APEX_OK) {
      g->oom = 1;
      return NULL;
    }
    v->gbuf = ag_data(v->grad);
    v->gdt = APEX_F32;
  }
  else
    v->gbuf = gbuf_tensor(g, v, APEX_F32, 1);
  return v->gbuf;
}

float *apex__gbuf_w(apex_graph *g, apex_var *v, int *fresh) {
  *fresh = 0;
  if (!v || !v->requires_grad) return NULL;
  if (grad_dtype(g, v) != APEX_F32) return stage(g, v, fresh);
  /* f32 leaves accumulate in their grad tensor, and a buffer already begun must be added to. */
  if (v->gbuf || (v->grad && v->grad->dtype == APEX_F32)) return apex__gbuf(g, v);
  /* A low-precision leaf's buffer holds only this backward's sum (flush_leaf adds it to the grad
   * tensor), so a first writer that writes it whole needs no zeros either. */
  if (v->grad && !touch(g, v)) {
    g->oom = 1;
    return NULL;
  }
  v->gbuf = gbuf_tensor(g, v, APEX_F32, 0);
  *fresh = v->gbuf != NULL;
  return v->gbuf;
}

void *apex__gbuf_any(apex_graph *g, apex_var *v, apex_dtype *dt) {
  *dt = APEX_F32;
  if (!v || !v->requires_grad) return NULL;
  apex_dtype t = grad_dtype(g, v);
  if (t == APEX_F32) return apex__gbuf(g, v);
  *dt = t;
  return v->gbuf ? v->gbuf : gbuf_tensor(g, v, t, 1);
}

void *apex__gbuf_w_any(apex_graph *g, apex_var *v, int *fresh, apex_dtype *dt) {
  *dt = APEX_F32;
  *fresh = 0;
  if (!v || !v->requires_grad) return NULL;
  apex_dtype t = grad_dtype(g, v);
  if (t == APEX_F32) return apex__gbuf_w(g, v, fresh);
  *dt = t;
  if (v->gbuf) return v->gbuf;
  void *b = gbuf_tensor(g, v, t, 0);
  *fresh = b != NULL;
  return b;
}

/* Runs v's backward. An op that takes only f32 gradients gets an f32 copy of a half out->gbuf (in
 * transient scratch, released as the next op starts), and its stand-ins for half input gradients land
 * when it returns. */
static apex_status run_backward(apex_graph *g, apex_var *v) {
  const apex__op_info *info = apex__op(v->op);
  void *own = v->gbuf;
  if (v->gdt != APEX_F32 && !info->grads_any) {
    size_t n = ag_nz(ag_numel(v));
    float *wide = apex__scratch_temp(g, n * sizeof(float));
    if (!wide) return APEX_ERR_OUT_OF_MEMORY;
    apex_status st = g->mem->convert(wide, APEX_F32, own, v->gdt, n);
    if (st != APEX_OK) return st;
    v->gbuf = wide;
  }
  apex_status st = info->backward(g, v);
  v->gbuf = own;
  apex_status us = unstage(g);
  return st != APEX_OK ? st : us;
}

/* Adds a low-precision leaf's collected f32 gradient into its grad tensor, once, with the backend's
 * axpby at a = b = 1: grad = 1 * grad + 1 * sum in f32 (both products exact, so one f32 addition per
 * element, as if the grad were widened, added to and rounded back), in place, in one pass. The leaf
 * keeps no gbuf afterwards (finish() forgets both kinds). */
/* 1 when leaf v's grad is low precision and this backward collected a sum for it to add. */
static int flush_pending(const apex_var *v) { return v->grad->dtype != APEX_F32 && v->gbuf && v->grad->numel; }

/* Before a flush adds to a grad tensor that ZeRO stage 2 released: its zeros, made again (as apex_var_zero_grad
 * leaves them, so the bits are those of an unreleased gradient). */
static apex_status remake_pending(apex_var *v) { return flush_pending(v) ? apex__tensor_remake(v->grad, 1, "apex_backward") : APEX_OK; }

static apex_status flush_leaf(apex_graph *g, apex_var *v) {
  apex_tensor *gr = v->grad;
  apex_status st = remake_pending(v);
  if (st == APEX_OK && flush_pending(v)) {
    const apex_backend *be = g->be;
    if (!be->mt_axpby) return apex__backend_slot_missing(be, "apex_backward", "multi_tensor_axpby");
    st = be->mt_axpby(&(apex_mt_axpby_args){.fn = "apex_backward", .n = 1, .x = &gr, .y = &v->gt, .out = &gr, .a = 1.0f, .b = 1.0f,
                                            .arg_to_check = 0});
  }
  v->gbuf = NULL;
  v->gt = NULL;
  return st;
}

/* Adds the collected f32 gradients into low-precision grad tensors and forgets every buffer; the first
 * failure of a flush (the others still run, so that no buffer outlives the backward). After a backward
 * that succeeded, a leaf sink (leaf_sink.h; never with a grad hook) first takes the sums it consumes. */
static apex_status finish(apex_graph *g, int ok) {
  apex_status st = ok && g->leaf_sink && !g->grad_hook ? g->leaf_sink(g->leaf_sink_ctx, g) : APEX_OK;
  /* Every leaf's flush in one multi-tensor call (the same axpby per element as flush_leaf's, so the same
   * bits): on a GPU one launch for the model instead of one per parameter, each with its own host setup. */
  size_t n = 0;
  apex_status made = APEX_OK; /* on a failure the flushes run one by one below, each failing alike */
  for (size_t i = 0; i < g->n_touched; i++) {
    if (made == APEX_OK) made = remake_pending(g->touched_leaves[i]);
    n += flush_pending(g->touched_leaves[i]);
  }
  apex_tensor **list = made == APEX_OK && n > 0 && n <= INT32_MAX ? malloc(2 * n * sizeof *list) : NULL;
  if (list) {
    size_t k = 0;
    for (size_t i = 0; i < g->n_touched; i++) {
      apex_var *v = g->touched_leaves[i];
      if (flush_pending(v)) list[k] = v->grad, list[n + k++] = v->gt;
    }
    apex_status s = g->be->mt_axpby ? g->be->mt_axpby(&(apex_mt_axpby_args){.fn = "apex_backward", .n = (int)n, .x = list, .y = list + n,
                                                                          .out = list, .a = 1.0f, .b = 1.0f, .arg_to_check = 0})
                                    : apex__backend_slot_missing(g->be, "apex_backward", "multi_tensor_axpby");
    if (st == APEX_OK) st = s;
    free(list);
    for (size_t i = 0; i < g->n_touched; i++) g->touched_leaves[i]->gbuf = NULL, g->touched_leaves[i]->gt = NULL;
  }
  for (size_t i = 0; i < g->n_touched; i++) {
    apex_status s = flush_leaf(g, g->touched_leaves[i]); /* without the list: each leaf (a flushed one has no gbuf left) */
    if (st == APEX_OK) st = s;
  }
  g->n_touched = 0;
  for (size_t i = 0; i < g->n_vars; i++) g->vars[i]->gbuf = NULL, g->vars[i]->gt = NULL, g->vars[i]->gbuf_is_pre = 0;
  for (size_t i = 0; i < g->n_finals; i++) g->finals[i].leaf->hook_seen = 0;
  g->n_finals = 0;
  return st;
}

apex_status apex_graph_set_grad_hook(apex_graph *g, apex_grad_hook fn, void *ctx) {
  if (!g) return apex__fail(APEX_ERR_INVALID_ARG, "apex_graph_set_grad_hook: graph is NULL");
  g->grad_hook = fn;
  g->grad_hook_ctx = ctx;
  return APEX_OK;
}

/* For the grad hook: every leaf that requires gradients, with the index of the earliest var reading
 * it, in increasing index order (a forward scan, so each leaf is listed at its first reader). */
static int plan_finals(apex_graph *g) {
  g->n_finals = 0;
  for (size_t i = 0; i < g->n_vars; i++) {
    apex_var *v = g->vars[i];
    for (int k = 0; k < v->n_in; k++) {
      apex_var *l = v->in[k];
      if (!l || l->graph || l->op != APEX_OP_LEAF || !l->grad || l->hook_seen) continue;
      if (!apex__grow((void **)&g->finals, &g->cap_finals, g->n_finals + 1, sizeof *g->finals)) return 0;
      l->hook_seen = 1;
      g->finals[g->n_finals].at = i;
      g->finals[g->n_finals++].leaf = l;
    }
  }
  return 1;
}

/* Calls the hook for the leaves whose earliest reader has index >= i (all of them once i is 0). */
static apex_status fire_finals(apex_graph *g, size_t *k, size_t i) {
  while (*k > 0 && g->finals[*k - 1].at >= i) {
    apex_var *l = g->finals[--*k].leaf;
    if (!l->gbuf) continue; /* not reached by this backward */
    apex_status st = flush_leaf(g, l);
    if (st != APEX_OK) return st;
    st = g->grad_hook(g->grad_hook_ctx, l);
    if (st != APEX_OK) return st;
  }
  return APEX_OK;
}

apex_status apex_backward(apex_var *out, const apex_backward_options *opts) {
  static const apex_backward_options defaults = {0};
  if (!opts) opts = &defaults;
  if (!out) return apex__fail(APEX_ERR_INVALID_ARG, "apex_backward: NULL output (did the forward fail?)");
  apex__threads_follow_load();
  apex_graph *g = out->graph;
  const char *name = apex_op_name(out->op);
  if (!g || out->op == APEX_OP_LEAF)
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_backward: the output %s is a leaf or input, not the result of an op", apex__shape(out));
  if (out->step != g->step)
    return apex__fail(APEX_ERR_STATE, "apex_backward: the output of '%s' was made before apex_graph_reset; its graph is gone", name);
  if (g->freed)
    return apex__fail(APEX_ERR_STATE,
                      "apex_backward: backward through a freed graph (output of '%s' %s): backward already ran on this step; "
                      "pass retain_graph to the first backward, or reset the graph and run the forward again",
                      name, apex__shape(out));
  if (!out->requires_grad)
    return apex__fail(APEX_ERR_STATE,
                      "apex_backward: the output of '%s' %s does not require gradients (made in no-grad mode, or from no var that requires them)",
                      name, apex__shape(out));
  size_t n = ag_numel(out);
  if (!opts->grad_output && n != 1)
    return apex__fail(APEX_ERR_SHAPE,
                      "apex_backward: the output of '%s' has shape %s, not one element; pass apex_backward_options.grad_output "
                      "of that shape",
                      name, apex__shape(out));
  if (opts->grad_output && opts->grad_output->numel != n) {
    char buf[96];
    return apex__fail(APEX_ERR_SHAPE, "apex_backward: grad_output %s does not match the output of '%s' %s",
                      apex_tensor_shape_str(opts->grad_output, buf, sizeof buf), name, apex__shape(out));
  }
  if (opts->grad_output && apex__on_graph_device(g, opts->grad_output, "apex_backward", "grad_output") != APEX_OK) return apex_last_status();
  g->oom = 0;
  apex_dtype gdt;
  void *go = apex__gbuf_any(g, out, &gdt);
  if (!go) return APEX_ERR_OUT_OF_MEMORY;
  apex_status st = APEX_OK;
  if (n)
    st = opts->grad_output ? g->mem->convert(go, gdt, apex_tensor_data(opts->grad_output), opts->grad_output->dtype, n)
                           : g->mem->fill(go, gdt, 1.0f, 1);
  if (st != APEX_OK) return st;
  int hook = g->grad_hook != NULL;
  if (hook && !plan_finals(g)) st = apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_backward: out of memory for the grad hook's plan");
  size_t k = g->n_finals;
  int dropped = 0, prof = profiling();
  apex__release_pending(g);
  for (size_t i = g->n_vars; st == APEX_OK && i-- > 0;) {
    apex_var *v = g->vars[i];
    if (v->gbuf && v->op != APEX_OP_LEAF && v->n_in != 0) {
      apex__release_temps(g);
      double t0 = prof ? now_s() : 0;
      st = run_backward(g, v);
      if (prof && (int)v->op < APEX_OP_COUNT) profile_s[v->op] += now_s() - t0, profile_n[v->op]++;
      if (prof && v->op == APEX_OP_LINEAR && v->in[0] && v->in[0]->gbuf_is_pre) profile_dgelu_n++;
      if (st == APEX_OK && g->oom) st = APEX_ERR_OUT_OF_MEMORY;
      if (st != APEX_OK) break;
      /* Every op that adds into v's gradient came after v and has run: its buffer is spent. What the
       * op saved is spent too unless the graph must serve another backward. */
      apex__gbuf_put(g, v);
      if (!opts->retain_graph) {
        apex__unsave(g, v);
        dropped = 1;
      }
    }
    if (hook) st = fire_finals(g, &k, i);
  }
  double tf = prof ? now_s() : 0;
  apex_status fst = finish(g, st == APEX_OK);
  if (prof) profile_finish_s += now_s() - tf;
  if (st == APEX_OK) st = fst;
  /* The weight-cast cache ends with the backward, as Apex clears its cache when scale_loss exits: an
   * optimizer step may follow and change the leaves, and the cached copies' values may have been
   * released above. A later forward on this step (an evaluation before the reset) casts afresh. */
  g->n_casts = 0;
  /* Once saved values have gone, another backward would read freed memory: refuse it, failed or not. */
  if ((st == APEX_OK || dropped) && !opts->retain_graph) g->freed = 1;
  return st;
}
