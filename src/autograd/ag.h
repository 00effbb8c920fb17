/* ag.h: what the autograd engine and the op files share.
 *
 * The var and graph structs, the memory pool, the dispatcher that every op passes through, the op
 * table, and small helpers for working in f32 on tensors of any dtype. An op file implements the
 * public forward function and a backward of type apex__backward_fn, and lists it in op_table.c. */
#ifndef APEX_AUTOGRAD_AG_H
#define APEX_AUTOGRAD_AG_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "apex/autograd.h"
#include "apex/nn_ops.h"
#include "backend/backend.h"
#include "backend/index_internal.h"
#include "core/internal.h"
#include "core/tensor_internal.h"

#define AG_MAX_IN 4

/* Where batch norm's statistics come from when they are not this process's batch alone. parallel/
 * installs one that reduces over the ranks of a process group (SyncBatchNorm), so the op and its
 * backward live here and autograd never calls up into parallel/. Both calls are collective: every
 * rank makes them, in the same order. */
typedef struct apex__bn_stats_hook {
  /* Forward: per-channel mean, 1 / sqrt(var + eps) and unbiased variance (f32 [C] each) of x
   * [N, C, ...] over the whole batch, and the number of values per channel behind them. */
  apex_status (*stats)(void *ctx, const apex_tensor *x, apex_tensor *mean, apex_tensor *invstd, apex_tensor *unbiased_var, float eps,
                       int64_t *count);
  /* Backward: sums (f32 [2C]) holds this process's per-channel sums of dy, then of dy * xhat; on
   * return, their totals over the whole batch. */
  apex_status (*reduce)(void *ctx, apex_tensor *sums);
  void *ctx;
} apex__bn_stats_hook;

/* Convolution and pooling geometry (backend/args_nn.h). */
typedef apex_nn_conv_geom ag_conv_geom;

/* What an op keeps for its backward besides its inputs and aux, one member per op family; the var's
 * op says which member is set. */
typedef union ag_op_params {
  ag_conv_geom conv; /* conv2d, max_pool2d, avg_pool2d */
  struct {
    float s; /* scale: the factor; dropout: 1 / (1 - p); pow: the exponent */
  } scale;
  struct {
    int dim; /* softmax, log_softmax: the normalised dimension (non-negative) */
  } softmax;
  struct {
    apex_reduction reduction; /* every loss */
    int64_t rows, classes;    /* cross entropy: the logits are [rows, classes] */
    int64_t count;            /* cross entropy: rows with a target (not ignored), MEAN's divisor */
    float smoothing;          /* cross entropy: label smoothing */
  } loss;
  struct {
    int training;                /* batch norm: batch statistics (else the running ones) */
    int64_t channels, plane;     /* x is [N, channels, plane] */
    int64_t count;               /* hooked: values per channel over the whole batch */
    apex__bn_stats_hook hook;    /* hooked: where the statistics came from */
  } bn;
  struct {
    int64_t rows, cols; /* layer norm, RMS norm: x is [rows, cols] with cols normalised */
  } row_norm;
  struct {
    void *logits;             /* linear_cross_entropy: [rows, classes] in dtype, the product's; with one_pass
                                 their gradient for a loss gradient of 1, written over them by the forward */
    apex_dtype dtype;
    int one_pass;
    int64_t rows, classes, count, chunk_rows; /* count: rows with a target; chunk_rows: the backward's */
    float smoothing;
    apex_reduction reduction; /* MEAN or SUM */
  } classifier;
  struct {
    int64_t outer, dim, inner; /* sum, mean, norm: x is [outer, dim, inner], reduced over dim */
    float scale;               /* sum: 1, mean: 1 / dim (rounded to f32, as the backward uses it) */
  } reduce;
  struct {
    int perm[APEX_MAX_DIMS]; /* permute: output dimension i is input dimension perm[i] */
  } permute;
  struct {
    int dim; /* concat: the joined dimension (non-negative) */
  } concat;
  struct {
    int ids_on_device; /* embedding: aux holds the ids in the graph's device memory (an apex_index's) */
  } embedding;
  struct {
    size_t batch;   /* attention: the leading extents' product */
    int heads, t, d; /* heads side by side in each row of heads * d (1 for [..., T, D] inputs) */
  } attention;
} ag_op_params;

struct apex_var {
  apex_tensor *value;
  apex_tensor *grad;   /* leaves and inputs that require gradients; NULL otherwise */
  void *gbuf;          /* the gradient during one backward, on the graph's device; NULL when not reached */
  apex_dtype gdt;      /* gbuf's dtype: f32, or the value's f16/bf16 on a graph with half gradients */
  apex_tensor *gt;     /* the pool tensor holding gbuf; NULL when gbuf is an f32 leaf's own grad tensor */
  apex_graph *graph;   /* NULL for leaves */
  uint64_t step;       /* the graph step that made it */
  int requires_grad;
  apex_op op;
  int n_in;
  apex_var **in;               /* the n_in inputs: in_small, or the graph pool past AG_MAX_IN (concat) */
  apex_var *in_small[AG_MAX_IN];
  void *aux;           /* op-owned scratch from the graph pool (masks, indices, statistics) */
  ag_op_params p;      /* the op's parameters (ag_op_params) */
  int hook_seen;       /* queued for the grad-ready hook in the running backward */
  size_t blk;          /* 1 + index of the pool block holding value's data; 0 when it is not the pool's */
  int held;            /* graph vars: the maker's handle on value is live (until apex_var_release) */
  int saves;           /* this var's op took references for backward (dropped when backward has run) */
  uint32_t reads_also; /* inputs its backward reads that its op's `unread` mask leaves out (apex__save_also) */
  apex_tensor *sum_into; /* low-precision leaves: where a backward collects the f32 sum, instead of the pool
                            (apex__leaf_sum_into); NULL: a pool buffer */
  size_t at;           /* graph vars: the index in the graph's vars (its creation order) */
  int gbuf_is_pre;     /* linear_gelu results: gbuf holds the gradient of the pre-activation, and the bias's is
                          added, as the consuming linear's backward took GELU's backward (ops_linear.c); cleared
                          as each backward ends */
};

typedef struct ag_block {
  apex_storage *storage;
  size_t bytes;
  int used;       /* handed out this step */
  int used_last;  /* handed out at some point since the previous reset */
  int temp;       /* an op's transient f32 copy: back to the pool when the next op starts */
  int refs;       /* value blocks: handles and backward references on the data (lifetime.c) */
  int parked;     /* sanitizer builds: released this step, poisoned and not handed out until reset */
} ag_block;

typedef struct ag_cast_entry {
  apex_var *leaf;
  apex_dtype dtype;
  apex_var *cast;
} ag_cast_entry;

struct apex_graph {
  const apex_backend *be;  /* the backend of the graph's device: its pool and every op's kernels */
  const apex_memory *mem;  /* be->mem: every engine access to pool memory goes through these slots */
  apex_var **vars; /* this step's vars in creation order; [n_vars, n_alloc) are spare structs */
  size_t n_vars, n_alloc, cap_vars;
  ag_block *blocks;
  size_t n_blocks, cap_blocks;
  apex_tensor **headers; /* tensor headers made this step, destroyed at reset */
  size_t n_headers, cap_headers;
  apex_var **touched_leaves; /* leaves given a gradient buffer in the running backward */
  size_t n_touched, cap_touched;
  ag_cast_entry *casts;
  size_t n_casts, cap_casts;
  apex_grad_hook grad_hook; /* apex_graph_set_grad_hook */
  void *grad_hook_ctx;
  apex_status (*leaf_sink)(void *ctx, apex_graph *g); /* leaf_sink.h */
  void *leaf_sink_ctx;
  struct ag_final { size_t at; apex_var *leaf; } *finals; /* leaves and the var after which they are final */
  size_t n_finals, cap_finals;
  apex_var **pending; /* casts autocast made for the op now running: released when the next starts */
  size_t n_pending, cap_pending;
  void **host_bufs; /* apex__host_scratch of a device graph: freed at reset */
  size_t n_host_bufs, cap_host_bufs;
  const apex_storage **ext_saved; /* caller storages (graph inputs) that backward reads: apex_graph_saved_bytes */
  size_t n_ext_saved, cap_ext_saved, ext_saved_bytes;
  uint64_t step;
  int grad_enabled;
  int freed; /* backward ran without retain_graph since the last reset */
  int oom;   /* a pool allocation failed during the running backward */
  int autocast;
  apex_dtype autocast_dtype;
  int half_grads; /* apex_graph_set_half_grads */
  /* f32 stand-ins that an op's backward made for half gradients (apex__gbuf), landed when it returns */
  struct ag_stage { apex_var *v; float *buf; } *stages;
  size_t n_stages, cap_stages;
  signed char cast_override[APEX_OP_COUNT]; /* -1: the table's category */
  unsigned char banned[APEX_OP_COUNT];      /* refused while autocast is on (amp's banned list) */
  uint64_t config_tag;                      /* apex_graph_set_config_tag */
};

/* ---- op table ---------------------------------------------------------------------------------- */

/* Adds the gradients of out's inputs, given out->gbuf (out's element count; f32 unless the op's
 * grads_any is set, then out->gdt). */
typedef apex_status (*apex__backward_fn)(apex_graph *g, apex_var *out);

/* What an op's backward reads of values, beyond their shapes and the op's own aux and ext: every
 * input's value unless its bit (1 << i) is set in `unread` (bit 31 stands for inputs 31 and up),
 * and the output's value when reads_out is set (also when aux points into the output). The zero
 * default (all inputs, not the output) is always safe; a tighter entry lets a value that no
 * backward reads go back to the pool once its holder releases it (lifetime.c). A wrong entry is
 * caught by test_autograd_memory under the sanitizer build.
 *
 * The mask is per op, but what a backward reads can depend on the inputs: cross entropy keeps its
 * f32 softmax for f32 logits (as cheap to keep as the logits, and its backward then needs no expf)
 * but only two floats a row for f16/bf16 logits, recomputing the softmax from them. So `unread`
 * lists what the op's backward reads at the least, and a forward that finds, for the node it makes,
 * that its backward will also read some of those inputs says so with apex__save_also (the var's
 * reads_also bits clear those of `unread`). No other op needs it: their zero reads_also is the
 * table's entry. */
typedef struct apex__op_info {
  const char *name;
  apex_cast_category cast;
  apex__backward_fn backward;
  uint32_t unread;
  unsigned char reads_out;
  /* Under autocast's FLOAT category, on a backend with float_ops_read_half, the op takes f16/bf16
   * inputs uncast: its kernels widen them exactly and compute in f32 as on the cast's f32 copy, so
   * the result has the same bits; the backward adds the same f32 terms into the input's f32 gradient
   * buffer that the cast's identity backward would have added (0 + t, then g + (0 + t), is g + t
   * bitwise, a gradient buffer never holding -0), and the whole-tensor f32 copy is never made. */
  unsigned char reads_half;
  /* The backward takes gradients in any dtype: it reads out->gbuf as out->gdt and asks its inputs'
   * buffers of apex__gbuf_any, handing the dtypes to its slot (args_nn.h). Without it, the engine gives
   * the backward an f32 copy of a half out->gbuf, and apex__gbuf f32 stand-ins for half gradients. */
  unsigned char grads_any;
} apex__op_info;

const apex__op_info *apex__op(apex_op op);

/* ---- pool -------------------------------------------------------------------------------------- */

/* `bytes` of uninitialised scratch valid until reset; NULL (with a message) on failure. */
void *apex__scratch(apex_graph *g, size_t bytes);
/* `bytes` of transient scratch: valid until the next op (forward or backward) starts, then back to
 * the pool; NULL (with a message) on failure. */
void *apex__scratch_temp(apex_graph *g, size_t bytes);
/* `bytes` of host memory valid until reset, for what a slot reads on the host whatever the device
 * (args_nn.h: the embedding's ids): the pool's own scratch on a CPU graph. NULL (with a message) on
 * failure. */
void *apex__host_scratch(apex_graph *g, size_t bytes);
/* `bytes` of host memory for what a slot reads on the host during one op (concat's lists of inputs):
 * the pool's transient scratch on a CPU graph, apex__host_scratch on a device graph (whose pool is
 * device memory, which the host must not write). NULL (with a message) on failure. */
void *apex__host_temp(apex_graph *g, size_t bytes);
/* A tensor from the pool, valid until reset (contents unspecified). */
apex_tensor *apex__pool_tensor(apex_graph *g, apex_dtype dtype, int ndim, const int64_t *shape);

/* Makes t the graph's: destroyed at reset. 0 (t destroyed, message set) on allocation failure. */
int apex__adopt(apex_graph *g, apex_tensor *t);

/* ---- value lifetimes (lifetime.c) ---------------------------------------------------------------- */

/* 1 + the index of the pool block whose storage is s; 0 when s is not the pool's. */
size_t apex__block_of(const apex_graph *g, const apex_storage *s);
/* Gives the pool block blk (1 + index) back for reuse in this step (sanitizer builds poison it and
 * keep it out of use until reset, so that a read of a released value is caught). */
void apex__block_put(apex_graph *g, size_t blk);
/* Makes a parked block usable again (at reset). */
void apex__block_unpark(ag_block *b);
/* Takes v's references as it is made: its maker's handle on its value and, when v is recorded for
 * backward, one on each value its op's backward reads (apex__op_info). */
void apex__hold(apex_graph *g, apex_var *v);
/* Records that v's backward also reads the inputs whose bits (1 << i, bit 31 for 31 and up) are in
 * `inputs`, though its op's `unread` mask leaves them out, and takes references on them when v is
 * recorded for backward. Called by the forward that made v, after apex__result. */
void apex__save_also(apex_graph *g, apex_var *v, uint32_t inputs);
/* Drops the backward references v's op took (after its backward ran, unless the graph is kept). */
void apex__unsave(apex_graph *g, apex_var *v);
/* A cast autocast made for the op now running: nobody else holds it, so it is released when the
 * next op starts (apex__release_pending), its value kept only if the op saved it. */
void apex__pend(apex_graph *g, apex_var *cast);
void apex__release_pending(apex_graph *g);
/* An op hands out one of its autocast inputs as its own result (dropout in eval): keep it. */
void apex__claim(apex_graph *g, apex_var *v);
/* Gives a gradient buffer from the pool back once nothing will read it again. */
void apex__gbuf_put(apex_graph *g, apex_var *v);

/* ---- dispatch ---------------------------------------------------------------------------------- */

/* The one entry of every op: checks that g and the n inputs are valid (NULL inputs allowed where
 * `optional` has bit i set), applies autocast per the op's category and writes the inputs the kernel
 * must use into `use` (casts recorded as ops), and the op's result dtype into *dtype. */
apex_status apex__dispatch(apex_graph *g, apex_op op, int n, apex_var *const *in, unsigned optional,
                           apex_var **use, apex_dtype *dtype);
/* A new graph var holding a fresh pool tensor of the given dtype and shape, recording op and its
 * inputs when one of them requires gradients and grad mode is on. */
apex_var *apex__result(apex_graph *g, apex_op op, apex_dtype dtype, int ndim, const int64_t *shape, int n,
                       apex_var *const *in);
/* As apex__result, with a given value (which must already belong to the graph: apex__adopt). */
apex_var *apex__result_value(apex_graph *g, apex_op op, apex_tensor *value, int n, apex_var *const *in);

/* The f32 gradient buffer of v (zeroed when first made), or NULL when v needs no gradient. Ops add
 * into it. An allocation failure also gives NULL and sets g->oom, which apex_backward checks after
 * every op. When v's gradient is half (apex_graph_set_half_grads), an f32 stand-in valid during the
 * running op's backward, which the engine then adds into v's own buffer (rounding once). */
float *apex__gbuf(apex_graph *g, apex_var *v);
/* v's gradient buffer in its own dtype (*dt: f32, or v's f16/bf16 on a graph with half gradients),
 * zeroed when first made; for ops whose info has grads_any. NULL as apex__gbuf. */
void *apex__gbuf_any(apex_graph *g, apex_var *v, apex_dtype *dt);
/* As apex__gbuf_any, with apex__gbuf_w's fresh rule. */
void *apex__gbuf_w_any(apex_graph *g, apex_var *v, int *fresh, apex_dtype *dt);
/* As apex__gbuf, for an op that writes every element of the gradient: when *fresh comes back 1 this
 * is the first gradient v receives and the buffer is not zeroed: the op stores 0.0f + its term (the
 * bits of adding into zeros, -0 included) instead of adding. Saves a pass that zeroes the buffer and
 * one that reads the zeros back: on the benchmark CNN, 60 MB of the backward's traffic. */
float *apex__gbuf_w(apex_graph *g, apex_var *v, int *fresh);

/* ---- backends (backend_of.c) -------------------------------------------------------------------- */

/* The backend that runs op's kernels on v's value: the one of its device. NULL after a message naming
 * op when this build has none for the device. */
const apex_backend *apex__ag_backend(const apex_var *v, apex_op op);
/* APEX_ERR_UNSUPPORTED: op has no kernel (a NULL slot) on backend b, naming op and b's device. */
apex_status apex__ag_slot_missing(const apex_backend *b, apex_op op);
/* The workspace lent to a kernel (args_nn.h): g's transient scratch, valid until the next op starts. */
apex_nn_workspace apex__ag_workspace(apex_graph *g);
/* 1 when b's slot is set; else 0 after apex__ag_slot_missing. */
#define AG_HAS(b, slot, op) ((b)->slot != NULL || (apex__ag_slot_missing((b), (op)), 0))

/* ---- f32 views --------------------------------------------------------------------------------- */

/* t's elements as f32: its own data if f32, else a converted copy in transient scratch, which goes
 * back to the pool when the next op (forward or backward) starts: never keep it in aux. */
const float *apex__f32(apex_graph *g, const apex_tensor *t);
/* Where to compute v's value in f32: its data if f32, else transient scratch; then apex__store.
 * Also never kept past the op (an op that needs its f32 output in backward takes apex__scratch). */
float *apex__out_f32(apex_graph *g, apex_var *v);
/* Returns every transient scratch block to the pool (called as each op starts). */
void apex__release_temps(apex_graph *g);
/* Converts buf into v's value when v is not f32 (no-op otherwise). */
void apex__store(apex_var *v, const float *buf);
/* The widest of two dtypes (f16 with bf16 gives f32). */
apex_dtype apex__promote(apex_dtype a, apex_dtype b);

/* ---- helpers ----------------------------------------------------------------------------------- */

/* APEX_OK when t is on g's device; else APEX_ERR_DEVICE naming fn, what t is, and both devices. Every
 * entry point that brings a caller's tensor into a graph checks this, so no op reads memory of another
 * device. */
apex_status apex__on_graph_device(const apex_graph *g, const apex_tensor *t, const char *fn, const char *what);
/* Copies n f32 from src to dst, both in g's pool memory. */
apex_status apex__pool_copy(apex_graph *g, float *dst, const float *src, size_t n);

/* Batch norm's momentum and eps from its options (defaults 0.1 and 1e-5 for zeros, unless
 * momentum_exact); APEX_ERR_INVALID_ARG naming fn for a momentum outside [0, 1] or a bad eps. Shared
 * by batch norm and SyncBatchNorm, so both read their options alike. */
static inline apex_status apex__bn_options(const apex_batch_norm_options *o, const char *fn, float *mom, float *eps) {
  if (!(o->momentum >= 0.0f && o->momentum <= 1.0f))
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: momentum is %g; it must be in [0, 1]", fn, (double)o->momentum);
  if (!(o->eps >= 0.0f) || !isfinite(o->eps))
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: eps is %g; it must be finite and >= 0", fn, (double)o->eps);
  *mom = o->momentum != 0.0f || o->momentum_exact ? o->momentum : 0.1f;
  *eps = o->eps != 0.0f ? o->eps : 1e-5f;
  return APEX_OK;
}

/* a + b recorded as apex_add records it (autocast, shapes, the graph), its value allocated but not yet
 * computed: for a fused kernel that writes the sum itself (apex_add_layer_norm). NULL after a message. */
apex_var *apex__add_unfilled(apex_graph *g, apex_var *a, apex_var *b);
/* 1 when autocast (as g is set now) would give op the input v uncast. */
int apex__dispatch_keeps(const apex_graph *g, apex_op op, const apex_var *v);

/* Cross entropy's targets, from the host array targets (each checked here: in [0, C) unless opts ignores
 * it) or, with targets NULL, from the index ix (checked when set: its bound must be at most C, it must
 * hold N values on the graph's device, and opts may not ignore any, since their count would need a read
 * of the device), copied into the graph's device pool scratch of N int64 (-1 where ignored) followed by
 * room for 2N floats (each row's max and 1 / sum of exp, the statistics the backward reads): what
 * apex_cross_entropy and apex_linear_cross_entropy keep as their aux. An index's copy is made on the
 * device (nothing through the host). *count receives the rows with a target. fn and logits name the call
 * in messages. NULL after a message. */
int64_t *apex__ce_targets(apex_graph *g, const int64_t *targets, const apex_index *ix, size_t N, size_t C,
                          const apex_cross_entropy_options *opts, const char *fn, const apex_var *logits, int64_t *count);

/* Batch norm whose statistics come from hook (APEX_OP_SYNC_BATCH_NORM): always the batch's
 * statistics, updating the running ones when given; no fused relu. Errors name sync_batch_norm. */
apex_var *apex__batch_norm_hooked(apex_graph *g, const apex__bn_stats_hook *hook, apex_var *x, apex_var *weight, apex_var *bias,
                                  apex_tensor *running_mean, apex_tensor *running_var, const apex_batch_norm_options *opts);

static inline float *ag_data(const apex_tensor *t) { return (float *)apex_tensor_data(t); }
/* t's elements as stored, for a slot that reads them in their own dtype (args_nn.h); a var's value,
 * or no data when the var is absent (an optional input). */
static inline apex_nn_buf ag_buf(const apex_tensor *t) { return (apex_nn_buf){apex_tensor_data(t), t->dtype}; }
static inline apex_nn_buf ag_buf_of(const apex_var *v) { return v ? ag_buf(v->value) : (apex_nn_buf){NULL, APEX_F32}; }
static inline size_t ag_numel(const apex_var *v) { return v->value->numel; }
static inline size_t ag_nz(size_t n) { return n ? n : 1; }
static inline int ag_needs(const apex_var *v) { return v && v->requires_grad; }
/* Normalises a dim against ndim (negative counts from the end); -1 when out of range. */
static inline int ag_dim(int dim, int ndim) {
  if (dim < 0) dim += ndim;
  return dim >= 0 && dim < ndim ? dim : -1;
}
/* t seen as [outer, D, inner] around dimension dim (already normalised). */
static inline void ag_lines(const apex_tensor *t, int dim, size_t *outer, size_t *d, size_t *inner) {
  *outer = *inner = 1;
  for (int i = 0; i < dim; i++) *outer *= (size_t)t->shape[i];
  for (int i = dim + 1; i < t->ndim; i++) *inner *= (size_t)t->shape[i];
  *d = (size_t)t->shape[dim];
}
/* "[2, 3]" for messages; two rotating buffers per thread, so two shapes fit in one message. */
const char *apex__shape(const apex_var *v);
const char *apex__shape_of(int ndim, const int64_t *shape);


#endif
