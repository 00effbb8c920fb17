/* kinds.c: what the optimizer front (optimizer.c) knows of each kind: its name, the option fields it
 * uses and their defaults, its own checks, how many state tensors it keeps and what they start at. The
 * update rules themselves are the backends' (backend/cpu/optim_<kind>.c, backend/cuda/optim.cu and
 * friends), reached through the optim_step slot. */
#include "core/internal.h"
#include "optim/optim_internal.h"

/* ---- sgd ---- */
static apex_status sgd_validate(const apex_optim_options *o) {
  if (apex__on(o->nesterov) && (o->momentum <= 0.0f || o->dampening != 0.0f))
    return apex__fail(APEX_ERR_INVALID_ARG, "SGD: nesterov needs momentum > 0 and dampening 0 (momentum %g, "
                      "dampening %g)", (double)o->momentum, (double)o->dampening);
  return APEX_OK;
}
static int sgd_nstates(const apex_optim_options *o) { return o->momentum != 0.0f; }
const apex__optim_ops apex__sgd_ops = {
    .name = "SGD",
    .fields = APEX__FIELD(LR) | APEX__FIELD(MOMENTUM) | APEX__FIELD(DAMPENING) | APEX__FIELD(WEIGHT_DECAY) |
              APEX__FIELD(NESTEROV) | APEX__FIELD(WD_AFTER_MOMENTUM),
    .defaults = {.lr = 1e-3f, .nesterov = APEX_OPTIM_OFF, .wd_after_momentum = APEX_OPTIM_OFF},
    .validate = sgd_validate,
    .nstates = sgd_nstates,
};

/* ---- adam ---- */
static int adam_nstates(const apex_optim_options *o) { return apex__on(o->amsgrad) ? 3 : 2; }
#define ADAM_FIELDS                                                                                            \
  (APEX__FIELD(LR) | APEX__FIELD(BETA1) | APEX__FIELD(BETA2) | APEX__FIELD(EPS) | APEX__FIELD(WEIGHT_DECAY) | \
   APEX__FIELD(BIAS_CORRECTION) | APEX__FIELD(AMSGRAD) | APEX__FIELD(ADAM_W_MODE))
#define ADAM_DEFAULTS(w_mode)                                                                                    \
  {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .bias_correction = APEX_OPTIM_ON,                 \
   .amsgrad = APEX_OPTIM_OFF, .adam_w_mode = (w_mode)}
const apex__optim_ops apex__adam_ops = {
    .name = "Adam", .fields = ADAM_FIELDS, .defaults = ADAM_DEFAULTS(APEX_OPTIM_OFF),
    .nstates = adam_nstates,
};
const apex__optim_ops apex__adamw_ops = {
    .name = "AdamW", .fields = ADAM_FIELDS, .defaults = ADAM_DEFAULTS(APEX_OPTIM_ON),
    .nstates = adam_nstates,
};

/* ---- adamp ---- */
static int adamp_nstates(const apex_optim_options *o) { (void)o; return 2; }
const apex__optim_ops apex__adamp_ops = {
    .name = "AdamP",
    .fields = APEX__FIELD(LR) | APEX__FIELD(BETA1) | APEX__FIELD(BETA2) | APEX__FIELD(EPS) |
              APEX__FIELD(WEIGHT_DECAY) | APEX__FIELD(DELTA) | APEX__FIELD(WD_RATIO) | APEX__FIELD(NESTEROV),
    .defaults = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .delta = 0.1f, .wd_ratio = 0.1f,
                 .nesterov = APEX_OPTIM_OFF},
    .nstates = adamp_nstates,
};

/* ---- lamb ---- */
static int lamb_nstates(const apex_optim_options *o) { (void)o; return 2; }
const apex__optim_ops apex__lamb_ops = {
    .name = "LAMB",
    .fields = APEX__FIELD(LR) | APEX__FIELD(BETA1) | APEX__FIELD(BETA2) | APEX__FIELD(EPS) |
              APEX__FIELD(WEIGHT_DECAY) | APEX__FIELD(BIAS_CORRECTION) | APEX__FIELD(GRAD_AVERAGING) |
              APEX__FIELD(MAX_GRAD_NORM) | APEX__FIELD(USE_NVLAMB) | APEX__FIELD(ADAM_W_MODE),
    .defaults = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-6f, .max_grad_norm = 1.0f,
                 .bias_correction = APEX_OPTIM_ON, .grad_averaging = APEX_OPTIM_ON, .use_nvlamb = APEX_OPTIM_OFF,
                 .adam_w_mode = APEX_OPTIM_ON},
    .nstates = lamb_nstates,
    .global_norm = 1,
};

/* ---- adadelta ---- */
static int adadelta_nstates(const apex_optim_options *o) { (void)o; return 2; }
const apex__optim_ops apex__adadelta_ops = {
    .name = "Adadelta",
    .fields = APEX__FIELD(LR) | APEX__FIELD(RHO) | APEX__FIELD(EPS) | APEX__FIELD(WEIGHT_DECAY),
    .defaults = {.lr = 1.0f, .rho = 0.9f, .eps = 1e-6f},
    .nstates = adadelta_nstates,
};

/* ---- adagrad ---- */
static int adagrad_nstates(const apex_optim_options *o) { (void)o; return 1; }
static float adagrad_init(const apex_optim_options *o, int s) { (void)s; return o->initial_accumulator_value; }
const apex__optim_ops apex__adagrad_ops = {
    .name = "Adagrad",
    .fields = APEX__FIELD(LR) | APEX__FIELD(EPS) | APEX__FIELD(WEIGHT_DECAY) | APEX__FIELD(INITIAL_ACC) |
              APEX__FIELD(LR_DECAY) | APEX__FIELD(ADAGRAD_W_MODE),
    .defaults = {.lr = 1e-2f, .eps = 1e-10f, .adagrad_w_mode = APEX_OPTIM_OFF},
    .nstates = adagrad_nstates,
    .state_init = adagrad_init,
};

/* ---- rmsprop ---- */
static int rms_nstates(const apex_optim_options *o) { return 1 + (o->momentum > 0.0f) + apex__on(o->centered); }
/* TensorFlow starts the square average at one, PyTorch at zero. */
static float rms_tf_init(const apex_optim_options *o, int s) { (void)o; return s == 0 ? 1.0f : 0.0f; }
#define RMS_FIELDS \
  (APEX__FIELD(LR) | APEX__FIELD(ALPHA) | APEX__FIELD(EPS) | APEX__FIELD(WEIGHT_DECAY) | APEX__FIELD(MOMENTUM) | \
   APEX__FIELD(CENTERED))
const apex__optim_ops apex__rmsprop_ops = {
    .name = "RMSprop",
    .fields = RMS_FIELDS,
    .defaults = {.lr = 1e-2f, .alpha = 0.99f, .eps = 1e-8f, .centered = APEX_OPTIM_OFF},
    .nstates = rms_nstates,
};
const apex__optim_ops apex__rmsprop_tf_ops = {
    .name = "RMSpropTF",
    .fields = RMS_FIELDS | APEX__FIELD(DECOUPLED_DECAY) | APEX__FIELD(LR_IN_MOMENTUM),
    .defaults = {.lr = 1e-2f, .alpha = 0.9f, .eps = 1e-10f, .centered = APEX_OPTIM_OFF,
                 .decoupled_decay = APEX_OPTIM_OFF, .lr_in_momentum = APEX_OPTIM_ON},
    .nstates = rms_nstates,
    .state_init = rms_tf_init,
};

/* ---- novograd ---- */
static int novo_nstates(const apex_optim_options *o) { (void)o; return 1; }
const apex__optim_ops apex__novograd_ops = {
    .name = "NovoGrad",
    .fields = APEX__FIELD(LR) | APEX__FIELD(BETA1) | APEX__FIELD(BETA2) | APEX__FIELD(EPS) |
              APEX__FIELD(WEIGHT_DECAY) | APEX__FIELD(BIAS_CORRECTION) | APEX__FIELD(GRAD_AVERAGING) |
              APEX__FIELD(NORM_TYPE) | APEX__FIELD(INIT_ZERO) | APEX__FIELD(REG_INSIDE_MOMENT),
    .defaults = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .norm_type = 2,
                 .bias_correction = APEX_OPTIM_ON, .grad_averaging = APEX_OPTIM_ON, .init_zero = APEX_OPTIM_OFF,
                 .reg_inside_moment = APEX_OPTIM_OFF},
    .nstates = novo_nstates,
    .nscalars = 1,
};
