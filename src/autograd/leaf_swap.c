/* leaf_swap.c: what amp needs from the engine beyond running ops: replacing a parameter's value by
 * a cast copy (O2/O3 cast the model after it was built), reading the autocast switch (regions that
 * disable casts restore it), refusing ops that autocast cannot run safely, the tag by which amp
 * knows the graphs it has prepared, and the leaf sink through which it takes over the end of a
 * backward for low-precision leaves (leaf_sink.h). */
#include "autograd/ag.h"
#include "autograd/leaf_sink.h"

apex_tensor *apex_var_swap_value(apex_var *v, apex_tensor *value) {
  if (!v || !value) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_var_swap_value: NULL %s", v ? "value" : "var");
  if (v->graph) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_var_swap_value: only a leaf's value can be replaced");
  if (value->device != v->value->device)
    return apex__fail_null(APEX_ERR_DEVICE, "apex_var_swap_value: the new value is on device %s but the leaf's value is on device %s; "
                           "copy it there first (apex_tensor_copy)", apex__device_name(value->device), apex__device_name(v->value->device));
  if (!apex_tensor_same_shape(value, v->value)) {
    char a[96], b[96];
    return apex__fail_null(APEX_ERR_SHAPE, "apex_var_swap_value: new value %s for a leaf of shape %s", apex_tensor_shape_str(value, a, sizeof a),
                           apex_tensor_shape_str(v->value, b, sizeof b));
  }
  apex_tensor *grad = NULL;
  if (v->requires_grad && !(grad = apex_tensor_create_on(value->device, value->dtype, value->ndim, value->shape)))
    return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex_var_swap_value: out of memory for the gradient");
  apex__tensor_set_releasable(grad);
  apex_tensor *old = v->value;
  apex_tensor_destroy(v->grad);
  v->grad = grad;
  v->value = value;
  return old;
}

int apex_graph_autocast_enabled(const apex_graph *g) {
  if (!g) apex__fail_null_arg(__func__, "graph");
  return g ? g->autocast : 0;
}

uint64_t apex_graph_config_tag(const apex_graph *g) {
  if (!g) apex__fail_null_arg(__func__, "graph");
  return g ? g->config_tag : 0;
}

apex_status apex_graph_set_config_tag(apex_graph *g, uint64_t tag) {
  if (!g) return apex__fail(APEX_ERR_INVALID_ARG, "apex_graph_set_config_tag: NULL graph");
  g->config_tag = tag;
  return APEX_OK;
}

apex_status apex_graph_set_op_banned(apex_graph *g, apex_op op, int banned) {
  if (!g) return apex__fail(APEX_ERR_INVALID_ARG, "apex_graph_set_op_banned: NULL graph");
  if ((int)op < 0 || op >= APEX_OP_COUNT) return apex__fail(APEX_ERR_INVALID_ARG, "apex_graph_set_op_banned: op %d is out of range", (int)op);
  g->banned[op] = banned != 0;
  return APEX_OK;
}

void apex__graph_set_leaf_sink(apex_graph *g, apex__leaf_sink fn, void *ctx) {
  g->leaf_sink = fn;
  g->leaf_sink_ctx = fn ? ctx : NULL;
}

apex_tensor *apex__leaf_take_sum(apex_var *v) {
  if (!v || v->graph || !v->gbuf || !v->gt || !v->grad || v->grad->dtype == APEX_F32) return NULL;
  apex_tensor *sum = v->gt;
  v->gbuf = NULL; /* flush_leaf now has nothing to add */
  v->gt = NULL;
  return sum;
}

void apex__leaf_sum_into(apex_var *v, apex_tensor *t) {
  if (!v || v->graph) return;
  v->sum_into = t && apex_tensor_dtype(t) == APEX_F32 && apex_tensor_numel(t) == ag_numel(v) && ag_numel(v) > 0 &&
                        apex_tensor_device(t) == apex_tensor_device(v->value)
                    ? t
                    : NULL;
}
