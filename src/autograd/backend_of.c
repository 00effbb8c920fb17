/* backend_of.c: how an op's front finds the backend that runs its kernels (the one of its value
 * tensors' device, through the registry: backend/backend.h), and the workspace it lends them. */
#include "autograd/ag.h"

const apex_backend *apex__ag_backend(const apex_var *v, apex_op op) {
  apex_device d = apex_tensor_device(v->value);
  const apex_backend *b = apex__backend_for(d);
  return b ? b : apex__backend_need(d, apex_op_name(op));
}

apex_status apex__ag_slot_missing(const apex_backend *b, apex_op op) {
  return apex__fail(APEX_ERR_UNSUPPORTED, "%s: the %s backend has no kernel for this op (tensors on %s); run it on the CPU",
                    apex_op_name(op), b->name, apex__device_name(b->device));
}

/* A kernel's workspace is the graph's transient scratch: back to the pool when the next op starts. */
static void *workspace_get(void *g, size_t bytes) { return apex__scratch_temp(g, bytes); }

apex_nn_workspace apex__ag_workspace(apex_graph *g) { return (apex_nn_workspace){workspace_get, g}; }
