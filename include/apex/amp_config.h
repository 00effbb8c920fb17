/* amp_config.h: amp's configuration and its opt levels (Apex's amp.initialize arguments and
 * Properties, in C).
 *
 * An opt level is a set of five properties; a configuration picks a level and may override any
 * property. apex_amp_resolve turns a configuration into the resolved properties, refusing overrides
 * that make no sense with a message that names the property and says why (as Apex does).
 *
 *   level  cast_model_type  patch_functions  keep_batchnorm_fp32  master_weights  loss_scale
 *   O0     f32              off              (n/a)                off             1.0 static
 *   O1     (no cast)        on               (n/a)                (n/a)           dynamic (f16)
 *   O2     half             off              on                   on              dynamic (f16)
 *   O3     half             off              off                  off             1.0 static
 *
 * "half" is the configuration's half_type: f16 by default, as in Apex, or bf16 (beyond Apex: the same
 * levels on bf16). Under O1 the autocast policy casts ops to half_type.
 *
 * Loss scaling at bf16: with half_type bf16 (and cast_model_type not f16) an unset loss_scale means
 * a static 1.0 at every level, i.e. no scaling, as PyTorch's bf16 autocast runs without a
 * GradScaler: bf16 has f32's exponent range, and loss scaling exists for f16's. The unscale is
 * then a plain conversion of the gradients. loss_scale = APEX_AMP_DYNAMIC, or an explicit static
 * value, still applies at bf16. */
#ifndef APEX_AMP_CONFIG_H
#define APEX_AMP_CONFIG_H

#include <stddef.h>

#include "apex/dtype.h"
#include "apex/loss_scaler.h"
#include "apex/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An override whose zero value means "the opt level's default". */
typedef enum apex_amp_flag {
  APEX_AMP_DEFAULT = 0,
  APEX_AMP_ON = 1,
  APEX_AMP_OFF = -1
} apex_amp_flag;

/* A dtype override whose zero value means "the default". */
typedef enum apex_amp_cast {
  APEX_AMP_CAST_DEFAULT = 0,
  APEX_AMP_CAST_F32,
  APEX_AMP_CAST_F16,
  APEX_AMP_CAST_BF16
} apex_amp_cast;

/* loss_scale value asking for dynamic loss scaling (Apex's loss_scale="dynamic"). */
#define APEX_AMP_DYNAMIC (-1.0f)

typedef struct apex_amp_config {
  int disabled;                   /* 1: amp is off and every amp call is an identity (Apex enabled=False) */
  const char *opt_level;          /* "O0", "O1", "O2" or "O3"; NULL means "O1" (Apex's default) */
  apex_amp_cast half_type;        /* the low-precision type: F16 [default] or BF16 */
  apex_amp_cast cast_model_type;  /* override: F32, F16 or BF16 */
  apex_amp_flag patch_functions;  /* override: the O1 autocast policy on or off */
  apex_amp_flag keep_batchnorm_fp32;
  apex_amp_flag master_weights;
  float loss_scale;               /* override: > 0 a static scale, APEX_AMP_DYNAMIC, 0 the level's (none at bf16) */
  apex_amp_cast cast_model_outputs; /* O2/O3: the dtype model outputs are returned in [F32] */
  int num_losses;                 /* losses with their own scaler, >= 1 [1] */
  int verbosity;                  /* 0 [silent: a library never prints unless asked; Apex's default
                                     is 1], 1: print the properties and each skipped step to stderr */
  /* Dynamic loss scaling tunables (the Ascend edition's), 0 = default (see loss_scaler.h): */
  float init_scale;               /* [2^16] */
  float growth_factor;            /* [2] */
  float backoff_factor;           /* [0.5] */
  int scale_window;               /* [2000] steps without overflow before the scale grows */
  float min_loss_scale;           /* [2^-24] */
  float max_loss_scale;           /* [2^24] */
  int hysteresis;                 /* [1] */
  apex_amp_flag combine_grad;     /* [off] (Ascend) flatten each optimizer's gradients into one buffer
                                     per dtype (and the f32 master gradients into another) at initialize,
                                     so the unscale + overflow check runs over a few long buffers; the
                                     gradient tensors stay the same objects (views), the results the
                                     same bits. Create a DDP or Reducer after initialize. */
  int allow_banned;               /* 1: allow ops amp refuses under O1 (plain binary cross-entropy) */
  apex_amp_flag half_grads;       /* [on for models on a GPU, off on the CPU] amp's backward keeps the
                                     gradients of f16/bf16 activations in their own dtype, as PyTorch's
                                     autocast and llm.c do (apex_graph_set_half_grads: parameters still
                                     receive f32 sums). On a GPU this halves the bytes the backward's
                                     kernels move; the CPU's kernels widen every gradient anyway, so
                                     there it would add only roundings. */
} apex_amp_config;

/* The resolved properties. */
typedef struct apex_amp_properties {
  int enabled;
  int opt_level;                  /* 0..3 */
  apex_dtype half_type;           /* f16 or bf16 */
  int cast_model;                 /* 1 when model weights are cast (O2, O3, or an override) */
  apex_dtype cast_model_type;     /* the weights' dtype when cast_model (f32 otherwise) */
  int patch_functions;            /* the O1 autocast policy */
  int keep_batchnorm_fp32;
  int master_weights;
  apex_dtype cast_model_outputs;
  int num_losses;
  int verbosity;
  int combine_grad;
  int allow_banned;
  apex_loss_scaler_config scaler; /* mode, scale and tunables, defaults filled in */
  apex_amp_flag half_grads;       /* as configured: DEFAULT is decided per backward by the model's device */
} apex_amp_properties;

/* Resolves cfg (NULL: all defaults, i.e. O1) into *out. Errors (APEX_ERR_INVALID_ARG, the message
 * naming the property), each leaving *out untouched:
 *   an unknown opt level; half_type F32;
 *   O1 with cast_model_type other than F32, with keep_batchnorm_fp32 set, with master_weights set;
 *   loss_scale negative (other than APEX_AMP_DYNAMIC) or not finite;
 *   dynamic-scaling tunables with a static loss scale;
 *   num_losses or verbosity negative;
 *   invalid scaler tunables (as apex_loss_scaler_create). */
APEX_API apex_status apex_amp_resolve(const apex_amp_config *cfg, apex_amp_properties *out);

/* Writes Apex's description of the properties ("Selected optimization level O2: ..." and one line per
 * property) into buf (always NUL-terminated). Returns buf. */
APEX_API char *apex_amp_properties_format(const apex_amp_properties *p, char *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif
