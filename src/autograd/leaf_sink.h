/* leaf_sink.h: how amp takes over the end of a backward for low-precision leaves (O2's chain).
 *
 * A backward collects a bf16/f16 leaf's gradient in an f32 pool buffer and, at its end, adds that
 * sum into the leaf's grad tensor (rounding once). amp then unscales the grad into the f32 master
 * gradient and zeroes the grad: three passes over the gradient. A leaf sink lets amp do all of it
 * in one pass: at the end of a backward that succeeded, and before the engine flushes, the engine
 * calls the sink, which takes the sums it can consume (apex__leaf_take_sum) and leaves the others
 * to the engine's flush. It is internal: amp sets it around its own backward only. */
#ifndef APEX_AUTOGRAD_LEAF_SINK_H
#define APEX_AUTOGRAD_LEAF_SINK_H

#include "apex/autograd.h"

/* Called once per backward of g that ran without error, before the engine's flush, and only when g
 * has no grad hook (a hook has already read flushed gradients). Its error fails the backward. */
typedef apex_status (*apex__leaf_sink)(void *ctx, apex_graph *g);

/* Sets (fn non-NULL) or clears g's sink. */
void apex__graph_set_leaf_sink(apex_graph *g, apex__leaf_sink fn, void *ctx);

/* For a sink: the f32 sum that the running backward collected for leaf v, when v's grad tensor is
 * low precision and v was reached; the engine then adds nothing to v's grad (the caller owns that
 * step). The tensor lives in g's pool until the graph's reset. NULL otherwise (nothing changes). */
apex_tensor *apex__leaf_take_sum(apex_var *v);

/* For the sink's owner, before a backward: collect leaf v's f32 sum in t (f32, v's element count, on v's
 * device; anything else clears it) instead of a pool buffer, and NULL clears it. apex__leaf_take_sum then
 * hands out t. Why: amp's O2 sink writes the unscaled sum into the leaf's f32 master gradient anyway, so
 * the sum can be collected there and unscaled in place: the pool then holds no f32 copy of the model's
 * gradients (a third of GPT-2 small's O2 gradient memory). Leaves only; the caller clears it after. */
void apex__leaf_sum_into(apex_var *v, apex_tensor *t);

#endif
