/* graph.c: graphs, their memory pool, vars, and the dispatcher every op passes through.
 *
 * The pool hands out whole storages and takes them all back at reset. A training loop asks for the
 * same sizes every step, so after the first step each request finds a free block of exactly its
 * size and nothing is allocated; blocks a step did not use are freed at its reset, so a loop whose
 * shapes change does not grow without bound. The pool lives on the graph's device: its blocks come
 * from that backend's memory slots, and everything the engine does to them (zeroing, widening copies,
 * casts) goes through those slots too, so that a device graph never touches its memory from the host. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "autograd/ag.h"

/* ---- pool --------------------------------------------------------------------------------------- */

/* Best fit among free blocks at most a quarter larger than asked: a looser fit would let a big
 * transient f32 block hold a half-size f16 value for the rest of the step. */
static ag_block *take_block(apex_graph *g, size_t bytes) {
  ag_block *best = NULL;
  for (size_t i = 0; i < g->n_blocks; i++) {
    ag_block *b = &g->blocks[i];
    if (!b->used && !b->parked && b->bytes >= bytes && b->bytes <= bytes + bytes / 4 + 4096 && (!best || b->bytes < best->bytes)) best = b;
  }
  if (!best) {
    if (!apex__grow((void **)&g->blocks, &g->cap_blocks, g->n_blocks + 1, sizeof *g->blocks)) return NULL;
    apex_storage *s = apex__storage_alloc_with(g->mem, bytes, "apex graph");
    if (!s) return NULL;
    best = &g->blocks[g->n_blocks++];
    *best = (ag_block){.storage = s, .bytes = bytes};
  }
  best->used = best->used_last = 1;
  best->temp = best->refs = 0;
  return best;
}

void *apex__scratch(apex_graph *g, size_t bytes) {
  ag_block *b = take_block(g, bytes);
  if (!b) {
    g->oom = 1;
    return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex graph: cannot allocate %zu bytes of scratch", bytes);
  }
  return b->storage->data;
}

/* Widened copies of low-precision inputs live in transient scratch, so a half model keeps only its
 * half activations between ops. */
void *apex__scratch_temp(apex_graph *g, size_t bytes) {
  ag_block *b = take_block(g, bytes);
  if (!b) {
    g->oom = 1;
    return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex graph: cannot allocate %zu bytes of scratch", bytes);
  }
  b->temp = 1;
  return b->storage->data;
}

void apex__release_temps(apex_graph *g) {
  for (size_t i = 0; i < g->n_blocks; i++)
    if (g->blocks[i].temp) g->blocks[i].used = g->blocks[i].temp = 0;
}

void *apex__host_scratch(apex_graph *g, size_t bytes) {
  if (g->be->device == APEX_DEVICE_CPU) return apex__scratch(g, bytes);
  void *p = NULL;
  if (apex__grow((void **)&g->host_bufs, &g->cap_host_bufs, g->n_host_bufs + 1, sizeof *g->host_bufs) && (p = malloc(bytes ? bytes : 1)))
    g->host_bufs[g->n_host_bufs++] = p;
  if (!p) g->oom = 1;
  return p ? p : apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex graph: cannot allocate %zu bytes of host scratch", bytes);
}

void *apex__host_temp(apex_graph *g, size_t bytes) {
  return g->be->device == APEX_DEVICE_CPU ? apex__scratch_temp(g, bytes) : apex__host_scratch(g, bytes);
}

int apex__adopt(apex_graph *g, apex_tensor *t) {
  if (!apex__grow((void **)&g->headers, &g->cap_headers, g->n_headers + 1, sizeof *g->headers)) {
    apex_tensor_destroy(t);
    return 0;
  }
  g->headers[g->n_headers++] = t;
  return 1;
}

apex_tensor *apex__pool_tensor(apex_graph *g, apex_dtype dtype, int ndim, const int64_t *shape) {
  size_t n = 1;
  for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
  ag_block *b = take_block(g, n * apex_dtype_size(dtype));
  if (!b) return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex graph: cannot allocate a tensor %s", apex__shape_of(ndim, shape));
  apex_tensor *t = apex__tensor_view_of(b->storage, 0, dtype, ndim, shape);
  if (!t || !apex__adopt(g, t)) return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex graph: out of memory");
  return t;
}

size_t apex_graph_pool_bytes(const apex_graph *g) {
  if (!g) apex__fail_null_arg(__func__, "graph");
  size_t s = 0;
  for (size_t i = 0; g && i < g->n_blocks; i++) s += g->blocks[i].bytes;
  return s;
}

size_t apex_graph_live_bytes(const apex_graph *g) {
  if (!g) apex__fail_null_arg(__func__, "graph");
  size_t s = 0;
  for (size_t i = 0; g && i < g->n_blocks; i++)
    if (g->blocks[i].used && !g->blocks[i].temp) s += g->blocks[i].bytes;
  return s;
}

/* ---- graph lifecycle ---------------------------------------------------------------------------- */

apex_graph *apex_graph_create(void) { return apex_graph_create_on(APEX_DEVICE_CPU); }

apex_graph *apex_graph_create_on(apex_device device) {
  const char *fn = device == APEX_DEVICE_CPU ? "apex_graph_create" : "apex_graph_create_on";
  /* a device that is built in but cannot be used now (no GPU, no driver) is refused here, by name,
   * rather than at the first op's allocation */
  const apex_backend *be = apex__backend_need(device, fn);
  if (!be) return NULL;
  apex_graph *g = calloc(1, sizeof *g);
  if (!g) return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  g->be = be;
  g->mem = be->mem;
  g->grad_enabled = 1;
  g->autocast_dtype = APEX_F16;
  memset(g->cast_override, -1, sizeof g->cast_override);
  return g;
}

void apex_graph_reset(apex_graph *g) {
  if (!g) return;
  for (size_t i = 0; i < g->n_headers; i++) apex_tensor_destroy(g->headers[i]);
  g->n_headers = 0;
  for (size_t i = 0; i < g->n_host_bufs; i++) free(g->host_bufs[i]);
  g->n_host_bufs = 0;
  size_t kept = 0;
  for (size_t i = 0; i < g->n_blocks; i++) {
    ag_block b = g->blocks[i];
    if (b.parked) apex__block_unpark(&b);
    if (!b.used_last) {
      apex__storage_release(b.storage);
      continue;
    }
    b.used = b.used_last = b.refs = b.parked = 0;
    g->blocks[kept++] = b;
  }
  g->n_blocks = kept;
  g->n_vars = 0;
  g->n_casts = 0;
  g->n_pending = 0;
  g->n_ext_saved = g->ext_saved_bytes = 0;
  g->freed = 0;
  g->step++;
}

void apex_graph_destroy(apex_graph *g) {
  if (!g) return;
  apex_graph_reset(g);
  for (size_t i = 0; i < g->n_blocks; i++) apex__storage_release(g->blocks[i].storage);
  for (size_t i = 0; i < g->n_alloc; i++) free(g->vars[i]);
  free(g->vars);
  free(g->blocks);
  free(g->headers);
  free(g->host_bufs);
  free(g->touched_leaves);
  free(g->casts);
  free(g->finals);
  free(g->stages);
  free(g->ext_saved);
  free(g->pending);
  free(g);
}

int apex_graph_set_grad_enabled(apex_graph *g, int enabled) {
  if (!g) {
    apex__fail_null_arg(__func__, "graph");
    return 0;
  }
  int old = g->grad_enabled;
  g->grad_enabled = enabled != 0;
  return old;
}

apex_status apex_graph_set_autocast(apex_graph *g, int enabled, apex_dtype dtype) {
  if (!g) return apex__fail(APEX_ERR_INVALID_ARG, "apex_graph_set_autocast: NULL graph");
  if (enabled && dtype != APEX_F16 && dtype != APEX_BF16)
    return apex__fail(APEX_ERR_DTYPE, "apex_graph_set_autocast: autocast runs in f16 or bf16, not %s", apex_dtype_name(dtype));
  g->autocast = enabled != 0;
  if (enabled) g->autocast_dtype = dtype;
  return APEX_OK;
}

apex_status apex_graph_set_half_grads(apex_graph *g, int on) {
  if (!g) return apex__fail(APEX_ERR_INVALID_ARG, "apex_graph_set_half_grads: NULL graph");
  g->half_grads = on != 0;
  return APEX_OK;
}

int apex_graph_half_grads(const apex_graph *g) {
  if (!g) apex__fail_null_arg(__func__, "graph");
  return g ? g->half_grads : 0;
}

apex_status apex_graph_set_op_cast(apex_graph *g, apex_op op, apex_cast_category category) {
  if (!g) return apex__fail(APEX_ERR_INVALID_ARG, "apex_graph_set_op_cast: NULL graph");
  if ((int)op < 0 || op >= APEX_OP_COUNT) return apex__fail(APEX_ERR_INVALID_ARG, "apex_graph_set_op_cast: op %d is not an apex_op", (int)op);
  if ((int)category < 0 || category > APEX_CAST_PROMOTE)
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_graph_set_op_cast: category %d is not an apex_cast_category", (int)category);
  g->cast_override[op] = (signed char)category;
  return APEX_OK;
}

/* ---- vars --------------------------------------------------------------------------------------- */

static apex_var *new_graph_var(apex_graph *g) {
  if (g->n_vars == g->n_alloc) {
    if (!apex__grow((void **)&g->vars, &g->cap_vars, g->n_alloc + 1, sizeof *g->vars)) return NULL;
    apex_var *v = malloc(sizeof *v);
    if (!v) return NULL;
    g->vars[g->n_alloc++] = v;
  }
  apex_var *v = g->vars[g->n_vars];
  memset(v, 0, sizeof *v);
  v->at = g->n_vars++;
  v->graph = g;
  v->step = g->step;
  return v;
}

apex_device apex_graph_device(const apex_graph *g) {
  if (!g) apex__fail_null_arg(__func__, "graph");
  return g ? g->be->device : APEX_DEVICE_CPU;
}

apex_status apex__on_graph_device(const apex_graph *g, const apex_tensor *t, const char *fn, const char *what) {
  if (t->device == g->be->device) return APEX_OK;
  return apex__fail(APEX_ERR_DEVICE, "%s: %s is on device %s but the graph is on device %s; copy it there (apex_tensor_copy), or use a "
                    "graph made with apex_graph_create_on(its device)", fn, what, apex__device_name(t->device), apex__device_name(g->be->device));
}

apex_status apex__pool_copy(apex_graph *g, float *dst, const float *src, size_t n) {
  if (dst == src || !n) return APEX_OK;
  return g->mem->copy(dst, src, n * sizeof(float), APEX_COPY_D2D, 0); /* both in the graph's pool */
}

apex_var *apex_var_create(apex_tensor *value, int requires_grad) {
  if (!value) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_var_create: NULL value");
  apex_var *v = calloc(1, sizeof *v);
  if (!v) return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex_var_create: out of memory");
  v->value = value;
  v->op = APEX_OP_LEAF;
  if (requires_grad) {
    v->requires_grad = 1;
    v->grad = apex_tensor_create_on(value->device, value->dtype, value->ndim, value->shape);
    if (!v->grad) {
      free(v);
      return NULL;
    }
    apex__tensor_set_releasable(v->grad); /* ZeRO stage 2 may free it between backwards (backward.c remakes it) */
  }
  return v;
}

void apex_var_destroy(apex_var *v) {
  if (!v || v->graph) return;
  apex_tensor_destroy(v->value);
  apex_tensor_destroy(v->grad);
  free(v);
}

apex_var *apex_graph_input(apex_graph *g, apex_tensor *t, int requires_grad) {
  if (!g || !t) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_graph_input: NULL %s", g ? "tensor" : "graph");
  if (apex__on_graph_device(g, t, "apex_graph_input", "the tensor") != APEX_OK) return NULL;
  apex_tensor *view = apex__tensor_view_of(t->storage, t->offset, t->dtype, t->ndim, t->shape);
  if (!view || !apex__adopt(g, view)) return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex_graph_input: out of memory");
  apex_var *v = new_graph_var(g);
  if (!v) return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex_graph_input: out of memory");
  v->value = view;
  v->op = APEX_OP_LEAF;
  apex__hold(g, v);
  if (requires_grad) {
    v->requires_grad = 1;
    v->grad = apex__pool_tensor(g, t->dtype, t->ndim, t->shape);
    if (!v->grad) return NULL;
    if (t->numel && g->mem->fill(apex_tensor_data(v->grad), t->dtype, 0.0f, t->numel) != APEX_OK) return NULL;
  }
  return v;
}

/* The accessors answer NULL (a failed op earlier in a chain) with the value their header gives and
 * a message that keeps the earlier one. */
static int null_var(const apex_var *v, const char *fn) {
  if (v) return 0;
  apex__fail_null_arg(fn, "var");
  return 1;
}

apex_tensor *apex_var_value(const apex_var *v) { return null_var(v, __func__) ? NULL : v->value; }
apex_tensor *apex_var_grad(const apex_var *v) { return null_var(v, __func__) ? NULL : v->grad; }
int apex_var_requires_grad(const apex_var *v) { return null_var(v, __func__) ? 0 : v->requires_grad; }
apex_op apex_var_op(const apex_var *v) { return null_var(v, __func__) ? APEX_OP_COUNT : v->op; }
apex_graph *apex_var_graph(const apex_var *v) { return null_var(v, __func__) ? NULL : v->graph; }

apex_status apex_var_zero_grad(apex_var *v) {
  if (!v || !v->grad) return apex__fail(APEX_ERR_INVALID_ARG, "apex_var_zero_grad: %s", v ? "the var has no grad tensor (it does not require gradients or is not a leaf)" : "NULL var");
  size_t n = v->grad->numel;
  if (apex_tensor_released(v->grad)) return APEX_OK; /* released memory reads as zeros: it stays released */
  return n ? v->grad->storage->mem->fill(apex_tensor_data(v->grad), v->grad->dtype, 0.0f, n) : APEX_OK;
}

float apex_var_item(const apex_var *v) {
  if (null_var(v, __func__)) return (float)NAN;
  if (v->value->numel != 1) {
    apex__fail(APEX_ERR_SHAPE, "apex_var_item: the var has %zu elements; item reads a one-element var", v->value->numel);
    return (float)NAN;
  }
  return apex_tensor_get(v->value, 0);
}

/* ---- shapes in messages ------------------------------------------------------------------------- */

const char *apex__shape_of(int ndim, const int64_t *shape) {
  static _Thread_local char buf[4][96];
  static _Thread_local int next;
  char *b = buf[next++ & 3];
  size_t len = 0;
  len += (size_t)snprintf(b, sizeof buf[0], "[");
  for (int i = 0; i < ndim && len < sizeof buf[0]; i++)
    len += (size_t)snprintf(b + len, sizeof buf[0] - len, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (len < sizeof buf[0]) snprintf(b + len, sizeof buf[0] - len, "]");
  return b;
}

const char *apex__shape(const apex_var *v) { return v ? apex__shape_of(v->value->ndim, v->value->shape) : "(null)"; }

/* ---- dispatch ----------------------------------------------------------------------------------- */

apex_dtype apex__promote(apex_dtype a, apex_dtype b) { return a == b ? a : APEX_F32; }

static apex_var *cast_to(apex_graph *g, apex_var *x, apex_dtype dtype);

/* 1 when op, run in f32 by autocast, takes x uncast (op_table's reads_half on a backend that reads half
 * inputs; x is f16 or bf16, the only dtypes besides f32). */
static int reads_half(apex_op op, const apex_var *x) {
  const apex_backend *b = apex__backend_for(apex_tensor_device(x->value));
  return apex__op(op)->reads_half && b && b->float_ops_read_half;
}

int apex__dispatch_keeps(const apex_graph *g, apex_op op, const apex_var *v) {
  apex_cast_category cat = g->cast_override[op] >= 0 ? (apex_cast_category)g->cast_override[op] : apex__op(op)->cast;
  if (!g->autocast || (cat != APEX_CAST_HALF && cat != APEX_CAST_FLOAT)) return 1;
  apex_dtype dt = cat == APEX_CAST_HALF ? g->autocast_dtype : APEX_F32;
  return v->value->dtype == dt || (cat == APEX_CAST_FLOAT && reads_half(op, v));
}

apex_status apex__dispatch(apex_graph *g, apex_op op, int n, apex_var *const *in, unsigned optional, apex_var **use,
                           apex_dtype *dtype) {
  const char *name = apex_op_name(op);
  if (!g) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL graph", name);
  apex__release_temps(g); /* the previous op is done with its transient copies */
  apex__release_pending(g); /* and with the casts autocast made for it */
  int have = 0;
  apex_dtype dt = APEX_F32;
  for (int i = 0; i < n; i++) {
    use[i] = in[i];
    if (!in[i]) {
      if (i < 32 && (optional >> i & 1u)) continue;
      return apex__fail(APEX_ERR_INVALID_ARG, "%s: input %d is NULL (did an earlier op fail?)", name, i);
    }
    if (in[i]->graph && (in[i]->graph != g || in[i]->step != g->step))
      return apex__fail(APEX_ERR_STATE, "%s: input %d belongs to another graph or to a step before apex_graph_reset", name, i);
    if (in[i]->graph && !in[i]->held)
      return apex__fail(APEX_ERR_STATE, "%s: input %d %s was released (apex_var_release): its memory may hold another value now", name,
                        i, apex__shape(in[i]));
    if (in[i]->value->device != g->be->device) {
      char what[32];
      snprintf(what, sizeof what, "input %d", i);
      return apex__on_graph_device(g, in[i]->value, name, what);
    }
    dt = have ? apex__promote(dt, in[i]->value->dtype) : in[i]->value->dtype;
    have = 1;
  }
  if (g->autocast && g->banned[op])
    return apex__fail(APEX_ERR_UNSUPPORTED,
                      "%s: amp refuses this op under autocast: binary cross-entropy on probabilities saturates its log in half "
                      "precision; use apex_bce_with_logits (sigmoid and loss in one op), or set allow_banned in the amp config",
                      name);
  apex_cast_category cat = g->cast_override[op] >= 0 ? (apex_cast_category)g->cast_override[op] : apex__op(op)->cast;
  if (g->autocast && (cat == APEX_CAST_HALF || cat == APEX_CAST_FLOAT)) {
    dt = cat == APEX_CAST_HALF ? g->autocast_dtype : APEX_F32;
    for (int i = 0; i < n; i++) {
      if (!in[i] || apex__dispatch_keeps(g, op, in[i])) continue;
      use[i] = cast_to(g, in[i], dt);
      if (!use[i]) return APEX_ERR_OUT_OF_MEMORY;
    }
  }
  *dtype = dt;
  return APEX_OK;
}

apex_var *apex__result_value(apex_graph *g, apex_op op, apex_tensor *value, int n, apex_var *const *in) {
  apex_var *v = new_graph_var(g);
  if (!v) return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", apex_op_name(op));
  v->value = value;
  v->op = op;
  int rg = 0;
  for (int i = 0; i < n; i++) rg |= ag_needs(in[i]);
  if (rg && g->grad_enabled) {
    v->in = n <= AG_MAX_IN ? v->in_small : apex__host_scratch(g, (size_t)n * sizeof *v->in); /* read on the host */
    if (!v->in) return NULL;
    v->requires_grad = 1;
    v->n_in = n;
    for (int i = 0; i < n; i++) v->in[i] = in[i];
  }
  apex__hold(g, v);
  return v;
}

apex_var *apex__result(apex_graph *g, apex_op op, apex_dtype dtype, int ndim, const int64_t *shape, int n,
                       apex_var *const *in) {
  apex_tensor *t = apex__pool_tensor(g, dtype, ndim, shape);
  return t ? apex__result_value(g, op, t, n, in) : NULL;
}

/* ---- casts -------------------------------------------------------------------------------------- */

static apex_var *cast_kernel(apex_graph *g, apex_var *x, apex_dtype dtype) {
  apex_var *out = apex__result(g, APEX_OP_CAST, dtype, x->value->ndim, x->value->shape, 1, &x);
  if (out && ag_numel(x) &&
      g->mem->convert(apex_tensor_data(out->value), dtype, apex_tensor_data(x->value), x->value->dtype, ag_numel(x)) != APEX_OK)
    return NULL;
  return out;
}

/* Autocast's cast: a leaf's copy in a dtype is made once per step and shared (the weight-cast
 * cache); other vars are cast each time. */
static apex_var *cast_to(apex_graph *g, apex_var *x, apex_dtype dtype) {
  if (x->graph) {
    apex_var *c = cast_kernel(g, x, dtype);
    if (c) apex__pend(g, c);
    return c;
  }
  for (size_t i = 0; i < g->n_casts; i++)
    if (g->casts[i].leaf == x && g->casts[i].dtype == dtype) return g->casts[i].cast;
  apex_var *c = cast_kernel(g, x, dtype);
  if (c && apex__grow((void **)&g->casts, &g->cap_casts, g->n_casts + 1, sizeof *g->casts))
    g->casts[g->n_casts++] = (ag_cast_entry){x, dtype, c};
  return c;
}

apex_var *apex_cast(apex_graph *g, apex_var *x, apex_dtype dtype) {
  apex_var *u = NULL;
  apex_dtype dt;
  if (apex__dispatch(g, APEX_OP_CAST, 1, &x, 0, &u, &dt) != APEX_OK) return NULL;
  if (apex__check_dtype(dtype, "cast") != APEX_OK) return NULL;
  return cast_kernel(g, u, dtype);
}

/* The backward of ops that pass the gradient through unchanged (cast, reshape): the backend's scale
 * backward by 1, exact, so gx += go. */
apex_status apex__bwd_identity(apex_graph *g, apex_var *out) {
  const apex_backend *be = apex__ag_backend(out, out->op);
  if (!be || !AG_HAS(be, nn_scale_bwd, out->op)) return apex_last_status();
  apex_dtype dt;
  void *gx = apex__gbuf_any(g, out->in[0], &dt);
  if (!gx) return APEX_OK;
  return be->nn_scale_bwd(&(apex_nn_scale_bwd_args){.n = ag_numel(out), .gout = out->gbuf, .gout_dtype = out->gdt, .gx = gx, .gx_dtype = dt,
                                                    .s = 1.0f, .accumulate_x = 1});
}

/* ---- f32 views ---------------------------------------------------------------------------------- */

const float *apex__f32(apex_graph *g, const apex_tensor *t) {
  if (t->dtype == APEX_F32) return ag_data(t);
  float *buf = apex__scratch_temp(g, t->numel * sizeof(float));
  if (buf && t->numel && g->mem->convert(buf, APEX_F32, apex_tensor_data(t), t->dtype, t->numel) != APEX_OK) return NULL;
  return buf;
}

float *apex__out_f32(apex_graph *g, apex_var *v) {
  if (v->value->dtype == APEX_F32) return ag_data(v->value);
  return apex__scratch_temp(g, ag_numel(v) * sizeof(float));
}

void apex__store(apex_var *v, const float *buf) {
  if (v->value->dtype != APEX_F32 && ag_numel(v))
    v->value->storage->mem->convert(apex_tensor_data(v->value), v->value->dtype, buf, APEX_F32, ag_numel(v));
}

