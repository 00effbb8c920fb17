/* optim_internal.h: what the optimizer files share. optimizer.c owns groups, validation, masters and
 * the step's one dispatch, to the optim_step slot of the group's backend (backend/args_optim.h); kinds.c
 * describes each kind to it (options, defaults, states); state_io.c saves and loads. */
#ifndef APEX_OPTIM_INTERNAL_H
#define APEX_OPTIM_INTERNAL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"

#include "apex/optim.h"
#include "backend/backend.h"

/* Elementwise f32 state tensors per parameter, at most (Adam with amsgrad: m, v, max v). */
#define APEX__OPTIM_MAX_STATES APEX_OPTIM_MAX_STATES

/* The option fields, for tables: bit i of apex__optim_ops.fields says field i applies. */
enum {
  APEX__F_LR, APEX__F_BETA1, APEX__F_BETA2, APEX__F_EPS, APEX__F_WEIGHT_DECAY, APEX__F_MOMENTUM,
  APEX__F_DAMPENING, APEX__F_ALPHA, APEX__F_RHO, APEX__F_DELTA, APEX__F_WD_RATIO, APEX__F_INITIAL_ACC,
  APEX__F_LR_DECAY, APEX__F_MAX_GRAD_NORM, APEX__F_NORM_TYPE, APEX__F_NESTEROV, APEX__F_WD_AFTER_MOMENTUM,
  APEX__F_BIAS_CORRECTION, APEX__F_AMSGRAD, APEX__F_ADAM_W_MODE, APEX__F_GRAD_AVERAGING, APEX__F_USE_NVLAMB,
  APEX__F_ADAGRAD_W_MODE, APEX__F_CENTERED, APEX__F_DECOUPLED_DECAY, APEX__F_LR_IN_MOMENTUM, APEX__F_INIT_ZERO,
  APEX__F_REG_INSIDE_MOMENT, APEX__F_COUNT
};
#define APEX__FIELD(f) (1u << APEX__F_##f)

typedef struct apex__group {
  apex_optim_options o; /* resolved: every default filled in, every flag ON or OFF */
  int n;
  apex_tensor **params, **grads;
  apex_tensor **master;   /* f32 copy of an f16/bf16 parameter; NULL for f32 */
  apex_tensor **state;    /* n * nstates f32 tensors: state[i * nstates + s] */
  int nstates;
  float *scalars;         /* n * nscalars per-tensor values (NovoGrad's second moment): the host copy */
  int nscalars;
  int64_t *step;          /* per parameter: the host copy */
  apex_device device;     /* where every tensor of the group lives */
  const apex_backend *backend; /* that device's */
  /* The step counts and the scalars where the tensors are, n and n * nscalars of them, which the
   * backend's step reads and advances; step and scalars above follow them through
   * apex__optim_steps_to_host / _to_device (a copy on the host, for a CPU group). */
  int64_t *d_step;
  float *d_scalars;
  /* o.lr where the tensors are, which the backend's step reads (apex__optim_lr_to_device keeps it equal to
   * o.lr): a step recorded once (capture.h) then takes each later apex_optimizer_set_lr. */
  float *d_lr;
} apex__group;

/* The parameters of one group that have a gradient in this step, as the lists of its optim_step slot. */
typedef struct apex__active {
  int n;
  int *idx;               /* index in the group */
  apex_tensor **g;        /* gradients */
  apex_tensor **p;        /* what is updated: the master or the f32 parameter */
  apex_tensor **model;    /* the f16/bf16 parameter behind a master, NULL for f32 */
  apex_tensor **s[APEX__OPTIM_MAX_STATES];
} apex__active;

typedef struct apex_optimizer apex_optimizer;

typedef struct apex__optim_ops {
  const char *name;                   /* for messages: "Adam" */
  unsigned fields;                    /* APEX__FIELD bits the kind uses */
  apex_optim_options defaults;        /* flags ON or OFF; fields it does not use left 0 */
  /* Kind-specific checks on resolved options beyond the common ranges (may be NULL). */
  apex_status (*validate)(const apex_optim_options *o);
  int (*nstates)(const apex_optim_options *o);
  /* The value state slot s starts at (zero for most). */
  float (*state_init)(const apex_optim_options *o, int s);
  int nscalars;
  /* The step needs the global norm of every group's gradients first (LAMB's max_grad_norm). */
  int global_norm;
} apex__optim_ops;

extern const apex__optim_ops apex__sgd_ops, apex__adam_ops, apex__adamw_ops, apex__adamp_ops, apex__lamb_ops,
    apex__adadelta_ops, apex__adagrad_ops, apex__rmsprop_ops, apex__rmsprop_tf_ops, apex__novograd_ops;

struct apex_optimizer {
  apex_optim_kind kind;
  const apex__optim_ops *ops;
  apex_optim_options defaults; /* as given (unresolved), for groups added without options */
  int ngroups;
  apex__group *groups;
  float clip_coef;             /* pending from apex_optimizer_clip_grad_norm; 1 = none */
  /* The tensors the global gradient norm is taken over in place of the groups' gradients (a shard's
   * optimizer: optim_shard.h); NULL for the groups' own. */
  apex_tensor **norm_grads;
  int n_norm_grads;
  float norm_scale;  /* LAMB's global norm over norm_grads is of their values times this too (1) */
};

/* ---- optimizer.c --------------------------------------------------------------------------------- */

/* Fills defaults into o and checks every range; the message starts with the kind's name. */
apex_status apex__optim_resolve(const apex__optim_ops *ops, const apex_optim_options *in, apex_optim_options *out);

/* ---- loss_scaler.c ------------------------------------------------------------------------------- */

/* The backend a scaler's state lives on, and where in its memory the scale and found_inf flag are (for
 * apex_optimizer_step_scaled's kernels). */
const apex_backend *apex__loss_scaler_where(apex_loss_scaler *s, const float **scale, const int **found_inf);
/* apex_loss_scaler_update(s, found_inf, NULL) that, when it finds an overflow, also sets raise[i] = 1 for
 * every bit i of mask: ints in the memory of the scaler's device (amp's per-optimizer skip flags), so that
 * the update and the skip stay where the state is and nobody waits. */
apex_status apex__loss_scaler_update_raise(apex_loss_scaler *s, int found_inf, int32_t *raise, uint64_t mask);

/* ---- optimizer.c: the step with the skip read where the tensors are ---- */

/* apex_optimizer_step for gradients already unscaled, skipped when *d_skip (an int in the memory of
 * the optimizer's device) is nonzero: read by the backend's kernels, so a GPU step does not wait. */
apex_status apex__optimizer_step_skip_at(apex_optimizer *opt, const int *d_skip, const char *fn);

/* A group's step counts and per-tensor scalars on the host (copied from the device for a CUDA group). */
apex_status apex__optim_steps_to_host(apex__group *g);
/* Copies g->o.lr to g->d_lr (queued on a device, after the work queued before it). */
apex_status apex__optim_lr_to_device(apex__group *g);
/* The reverse, after a load. */
apex_status apex__optim_steps_to_device(apex__group *g);

/* Sets how many parameters one LAMB batch of the CPU backend holds and returns the old value: for tests
 * (defined in backend/cpu/optim_lamb.c). */
size_t apex__lamb_set_batch_params(size_t n);

#endif
