/* optim_options.h: the optimizer kinds and their hyperparameters (apex_optim_options), the types that
 * both the optimizers (optim.h) and the backends' fused step kernels take. They sit in a header of their
 * own, below optim.h, so that a backend can read a group's options without depending on the optimizer
 * above it; optim.h includes this header, so a program includes optim.h alone. */
#ifndef APEX_OPTIM_OPTIONS_H
#define APEX_OPTIM_OPTIONS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum apex_optim_kind {
  APEX_OPTIM_SGD = 0,     /* torch.optim.SGD / Apex FusedSGD */
  APEX_OPTIM_ADAM,        /* torch.optim.Adam (L2 weight decay) / Apex FusedAdam(adam_w_mode=False) */
  APEX_OPTIM_ADAMW,       /* torch.optim.AdamW (decoupled decay) / Apex FusedAdam */
  APEX_OPTIM_ADAMP,       /* AdamP (Heo et al. 2021, clovaai/AdamP) */
  APEX_OPTIM_LAMB,        /* Apex FusedLAMB */
  APEX_OPTIM_ADADELTA,    /* torch.optim.Adadelta */
  APEX_OPTIM_ADAGRAD,     /* torch.optim.Adagrad / Apex FusedAdagrad */
  APEX_OPTIM_RMSPROP,     /* torch.optim.RMSprop */
  APEX_OPTIM_RMSPROP_TF,  /* timm's RMSpropTF (TensorFlow's RMSprop) */
  APEX_OPTIM_NOVOGRAD,    /* Apex FusedNovoGrad */
  APEX_OPTIM_KIND_COUNT
} apex_optim_kind;

/* A yes/no option whose zero value means "the optimizer's default". */
typedef enum apex_optim_flag {
  APEX_OPTIM_DEFAULT = 0,
  APEX_OPTIM_ON = 1,
  APEX_OPTIM_OFF = -1
} apex_optim_flag;

/* Bits of apex_optim_options.zero: the float options whose default is not zero. Setting a bit asks
 * for an explicit 0 in that field (the field itself must then be 0), e.g. Adam without momentum:
 *     (apex_optim_options){.zero = APEX_OPTIM_ZERO_BETA1}                                        */
enum {
  APEX_OPTIM_ZERO_LR = 1u << 0,
  APEX_OPTIM_ZERO_BETA1 = 1u << 1,
  APEX_OPTIM_ZERO_BETA2 = 1u << 2,
  APEX_OPTIM_ZERO_EPS = 1u << 3,
  APEX_OPTIM_ZERO_ALPHA = 1u << 4,
  APEX_OPTIM_ZERO_RHO = 1u << 5,
  APEX_OPTIM_ZERO_DELTA = 1u << 6,
  APEX_OPTIM_ZERO_WD_RATIO = 1u << 7
};

/* NovoGrad's norm_type: 0 and 2 mean the L2 norm (the default); this asks for the infinity norm
 * (Apex spells it norm_type=0). */
#define APEX_OPTIM_NORM_INF (-1)

/* Hyperparameters. The zero value of every field means the optimizer's default (in brackets below,
 * per kind). Setting a field that the kind does not use is an error (APEX_ERR_INVALID_ARG naming the
 * field), so that a typo never passes silently. */
typedef struct apex_optim_options {
  float lr;            /* >= 0. Adadelta 1.0; Adagrad, RMSprop, RMSpropTF 1e-2; all others 1e-3 */
  float beta1, beta2;  /* in [0, 1). Adam, AdamW, AdamP, LAMB, NovoGrad: 0.9 and 0.999 */
  float eps;           /* >= 0. Adam, AdamW, AdamP, NovoGrad, RMSprop 1e-8; LAMB, Adadelta 1e-6;
                          Adagrad, RMSpropTF 1e-10 */
  float weight_decay;  /* >= 0, every kind [0]. L2 (added to the gradient) or decoupled, see the flags.
                          Note torch.optim.AdamW defaults to 1e-2; apex, like Apex's FusedAdam, to 0. */
  float momentum;      /* >= 0. SGD, RMSprop, RMSpropTF [0] */
  float dampening;     /* SGD [0]; not applied at the first momentum step (PyTorch) */
  float alpha;         /* >= 0, square-average smoothing. RMSprop 0.99, RMSpropTF 0.9 */
  float rho;           /* in [0, 1]. Adadelta 0.9 */
  float delta;         /* >= 0. AdamP: projection threshold [0.1] */
  float wd_ratio;      /* >= 0. AdamP: weight decay factor for projected tensors [0.1] */
  float initial_accumulator_value; /* >= 0. Adagrad [0] */
  float lr_decay;      /* >= 0. Adagrad [0]: lr / (1 + (step - 1) * lr_decay) */
  float max_grad_norm; /* LAMB [1.0]: the global gradient norm (of all groups) is clipped to this
                          before the update; negative or +Inf means no clipping */
  int norm_type;       /* NovoGrad: 0 or 2 = L2 [default], APEX_OPTIM_NORM_INF */
  apex_optim_flag nesterov;          /* SGD [off; needs momentum > 0 and dampening 0], AdamP [off] */
  apex_optim_flag wd_after_momentum; /* SGD [off]: add weight decay after the momentum update (Apex) */
  apex_optim_flag bias_correction;   /* Adam, AdamW, LAMB, NovoGrad [on] */
  apex_optim_flag amsgrad;           /* Adam, AdamW [off] */
  apex_optim_flag adam_w_mode;       /* decoupled weight decay: Adam [off], AdamW [on], LAMB [on] */
  apex_optim_flag grad_averaging;    /* LAMB, NovoGrad [on]: scale the gradient by (1 - beta1) in m */
  apex_optim_flag use_nvlamb;        /* LAMB [off]: apply the trust ratio even when weight_decay == 0 */
  apex_optim_flag adagrad_w_mode;    /* Adagrad [off]: decoupled weight decay (Apex FusedAdagrad) */
  apex_optim_flag centered;          /* RMSprop, RMSpropTF [off] */
  apex_optim_flag decoupled_decay;   /* RMSpropTF [off] */
  apex_optim_flag lr_in_momentum;    /* RMSpropTF [on]: the momentum buffer accumulates lr * update */
  apex_optim_flag init_zero;         /* NovoGrad [off]: start the second moment at 0, not at the first
                                        gradient's norm */
  apex_optim_flag reg_inside_moment; /* NovoGrad [off]: weight decay inside the first moment */
  unsigned zero;                     /* APEX_OPTIM_ZERO_* bits: explicit zeros, see above */
} apex_optim_options;

#ifdef __cplusplus
}
#endif
#endif
