/* optim_shard.h: what a sharded optimizer (parallel/zero.c) needs of the optimizer beyond optim.h.
 *
 * A rank of a sharded optimizer steps only its shard of the parameters, but LAMB's max_grad_norm and
 * apex_optimizer_clip_grad_norm take the norm of every gradient of the model. So that norm has the
 * bits an unsharded optimizer computes, the shard's optimizer is told which tensors to take it over:
 * the model's whole gradients, in parameter order, after the sharded optimizer has gathered them. */
#ifndef APEX_OPTIM_SHARD_H
#define APEX_OPTIM_SHARD_H

#include "apex/optim.h"

/* From now on the global gradient norm (LAMB's max_grad_norm, apex_optimizer_clip_grad_norm) is taken
 * over grads[0..n) instead of the groups' own gradients; n == 0 goes back to the groups'. The list is
 * copied; the tensors are borrowed and must be on the groups' device. APEX_ERR_INVALID_ARG for NULL
 * opt, n < 0 or a NULL tensor; APEX_ERR_OUT_OF_MEMORY. */
apex_status apex__optimizer_set_norm_grads(apex_optimizer *opt, apex_tensor *const *grads, int n);
/* LAMB's global norm in a step is taken of those tensors' values times `scale` too (1 by default):
 * for a shard that steps unscaled copies of gradients whose whole tensors are still scaled. */
apex_status apex__optimizer_set_norm_scale(apex_optimizer *opt, float scale);
/* For a norm the caller computed itself (a sharded optimizer sums it from every rank's shard, with the
 * bits of apex_optimizer_clip_grad_norm's): the coefficient the gradients are unscaled by inside that
 * norm (the pending clip over grad_scale, as apex_optimizer_clip_grad_norm takes it), and the clipping
 * it then sets (the next step multiplies the gradients by max_norm / (norm + 1e-6) when below 1). */
float apex__optimizer_clip_coef(const apex_optimizer *opt);
void apex__optimizer_clip_by(apex_optimizer *opt, float max_norm, float norm);

/* The pieces of a parameter's state a sharded optimizer gathers into an unsharded optimizer for a
 * checkpoint, and takes back from one after a load. Each returns NULL / -1 / APEX_ERR_INVALID_ARG for
 * a bad group or index. State tensors are f32 with the parameter's shape (state_io.c's order). */
int apex__optimizer_nstates(const apex_optimizer *opt, int group);
int apex__optimizer_nscalars(const apex_optimizer *opt, int group);
apex_tensor *apex__optimizer_state(const apex_optimizer *opt, int group, int i, int s);
/* Parameter i's per-tensor scalars (nscalars floats): read into get when it is not NULL, then
 * written from set when that is not NULL. */
apex_status apex__optimizer_param_scalars(apex_optimizer *opt, int group, int i, float *get, const float *set);
apex_status apex__optimizer_set_step(apex_optimizer *opt, int group, int i, int64_t step);
/* Group dg of dst takes the resolved options of group sg of src (the same kind). */
apex_status apex__optimizer_copy_options(apex_optimizer *dst, int dg, const apex_optimizer *src, int sg);

#endif
