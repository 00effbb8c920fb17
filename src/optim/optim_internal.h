/* optim_internal.h: what the optimizer files share. optimizer.c owns groups, validation, masters and
 * dispatch; each kind lives in its own file and is described to optimizer.c by an apex__optim_ops
 * table; launch.c runs a kind's tile kernel over a group with the model copies refreshed in the
 * same pass. */
#ifndef APEX_OPTIM_INTERNAL_H
#define APEX_OPTIM_INTERNAL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"
#include "backend/cpu/simd_kernel.h"

#include "apex/multi_tensor.h"
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
  float *scalars;         /* n * nscalars per-tensor values (NovoGrad's second moment) */
  int nscalars;
  int64_t *step;          /* per parameter (CPU groups) */
  apex_device device;     /* where every tensor of the group lives */
  const apex_backend *backend; /* that device's */
  /* Groups whose backend has an optim_step slot (backend/args_optim.h): the step counts and the scalars
   * where the tensors are, n and n * nscalars of them, which the slot reads and advances. NULL for groups
   * stepped by this layer's kernels, which keep them in step and scalars. */
  int64_t *d_step;
  float *d_scalars;
} apex__group;

/* The parameters of one group that have a gradient in this step, as applier lists. */
typedef struct apex__active {
  int n;
  int *idx;               /* index in the group */
  apex_tensor **g;        /* gradients */
  apex_tensor **p;        /* what is updated: the master or the f32 parameter */
  apex_tensor **model;    /* the f16/bf16 parameter behind a master, NULL for f32 */
  apex_tensor **s[APEX__OPTIM_MAX_STATES];
  int64_t *step;          /* step counts, already including this step */
} apex__active;

typedef struct apex_optimizer apex_optimizer;

/* What a kind's step gets for one group. */
typedef struct apex__step_args {
  apex_optimizer *opt;
  apex__group *group;
  apex__active *a;
  float inv_scale;        /* 1 / grad_scale, times any clip coefficient */
  float global_grad_norm; /* set by a kind's prepare (LAMB: the norm of all groups' gradients) */
} apex__step_args;

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
  /* Called once per step before the groups, with every group's active lists (may be NULL). */
  apex_status (*prepare)(apex__step_args *groups, int ngroups);
  apex_status (*step)(apex__step_args *s);
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
};

/* ---- optimizer.c --------------------------------------------------------------------------------- */

/* Fills defaults into o and checks every range; the message starts with the kind's name. */
apex_status apex__optim_resolve(const apex__optim_ops *ops, const apex_optim_options *in, apex_optim_options *out);
/* 1 when a resolved flag is on. */
static inline int apex__on(apex_optim_flag f) { return f == APEX_OPTIM_ON; }

/* The step with the loss scale and the skip flag in device memory (apex_cuda_optimizer_step). */
apex_status apex__optimizer_step_device(apex_optimizer *opt, const float *d_scale, const int *d_skip);
/* A group's step counts and per-tensor scalars on the host (copied from the device for a CUDA group). */
apex_status apex__optim_steps_to_host(apex__group *g);
/* The reverse, after a load. */
apex_status apex__optim_steps_to_device(apex__group *g);

/* ---- launch.c ------------------------------------------------------------------------------------ */

/* Runs kernel k over the active tensors with the lists {g, p, s[0], s[1], ...} starting at list
 * `first` (0, or 1 to leave the gradients out), `nlists` of them. written: bits of the lists (counted
 * from `first`) the kernel writes. When the p list is written, each model copy is refreshed from the
 * tile of p in the same pass (rounded to nearest even). */
apex_status apex__optim_run(const apex__active *a, int first, int nlists, unsigned written, const apex__simd_kernel *k,
                            void *ctx, const char *name);
/* x[i] = sqrt(x[i]) for a tile, correctly rounded; vectorised by the compiler (apex builds with
 * -fno-math-errno, without which the errno-setting sqrtf keeps loops scalar). */
APEX__INLINE void apex__optim_sqrt(float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = sqrtf(x[i]);
}
/* Sum of x[i]^2 in a fixed order (eight f32 lanes), as the multi-tensor l2norm sums a tile: the
 * same bits whatever the vector width. */
APEX__INLINE float apex__optim_sumsq(const float *x, size_t n) {
  float acc[8] = {0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; k++) acc[k] += x[i + k] * x[i + k];
  for (int k = 0; i < n; i++, k++) acc[k] += x[i] * x[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}
/* ---- lamb.c ---- */

/* Sets how many parameters one LAMB batch holds (both stages run batch by batch; see lamb.c) and
 * returns the old value: for tests, to reach the path for tensors larger than a batch. */
size_t apex__lamb_set_batch_params(size_t n);

/* beta^step in double, the bias corrections' base. */
double apex__optim_pow(double beta, int64_t step);

#endif
