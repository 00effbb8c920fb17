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

#endif
