/* args_optim.h: the argument structs of the optimizer step and loss-scaler update slots (backend.h).
 *
 * Fields named dev_* point where the tensors are (device memory on a GPU): the kernels read and write
 * them there, so that a GPU step never waits for the host to learn the loss scale or whether to skip. */
#ifndef APEX_BACKEND_ARGS_OPTIM_H
#define APEX_BACKEND_ARGS_OPTIM_H

#include <stdint.h>

#include "apex/loss_scaler_config.h"
#include "apex/optim_options.h"
#include "apex/tensor.h"

/* Elementwise f32 state tensors per parameter, at most (Adam with amsgrad: m, v, max v). */
#define APEX_OPTIM_MAX_STATES 3

/* 1 when a resolved option flag is on. */
static inline int apex__on(apex_optim_flag f) { return f == APEX_OPTIM_ON; }

/* One parameter group's step over the n parameters that have a gradient (the entries). */
typedef struct apex_optim_step_args {
  const char *fn;              /* the public call, for messages */
  apex_optim_kind kind;
  const apex_optim_options *o; /* resolved: every default filled in, every flag ON or OFF */
  int n;
  apex_tensor **g;             /* gradients, any of f32/f16/bf16 */
  apex_tensor **p;             /* what is updated: the f32 master, or the f32 parameter itself */
  apex_tensor **model;         /* the f16/bf16 parameter written from its master p; NULL entries for f32 */
  apex_tensor **s[APEX_OPTIM_MAX_STATES]; /* f32 state tensors, nstates lists */
  int nstates;
  const int *idx;              /* entry j is parameter idx[j] of the group */
  float inv_scale;             /* multiplied into every gradient (1 / loss scale, times a clip coefficient) */
  /* Where the tensors are: */
  int64_t *dev_step;           /* the group's step counts, by parameter; advanced unless the step is skipped */
  float *dev_scalars;          /* per-parameter scalars of the group (NovoGrad's second moment), by parameter */
  const float *dev_scale;      /* when set, the gradients are also divided by *dev_scale */
  const int *dev_skip;         /* when set and nonzero, the step changes nothing */
  const float *dev_lr;         /* when set, the learning rate is read there (the group's copy of o->lr in the
                                  device's memory, so that a recorded step takes a later apex_optimizer_set_lr) */
  const float *dev_grad_norm;  /* LAMB: the global norm of every group's g * inv_scale (NULL: no clipping) */
} apex_optim_step_args;

/* The loss scaler's state as it lives where the gradients are. */
typedef struct apex_scaler_dev {
  apex_loss_scaler_state st;
  int32_t found_inf; /* raised by the unscale/check kernels, cleared by the update */
} apex_scaler_dev;

/* One update of the scale (backend/scale_rule.h) from state->found_inf, which it then clears. When it
 * found an overflow it also sets dev_raise[i] = 1 for every bit i of raise_mask (device ints beside the
 * state: the skip flags of the optimizers the loss reached, which amp's step reads where they are). */
typedef struct apex_scaler_update_args {
  const char *fn;
  apex_scaler_dev *dev_state;       /* where the gradients are */
  const apex_loss_scaler_config *c; /* host */
  int32_t *dev_raise;               /* may be NULL (then raise_mask is ignored) */
  uint64_t raise_mask;
} apex_scaler_update_args;

#endif
