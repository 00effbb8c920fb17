/* optimizer.c: the optimizer object. Options (defaults, ranges), parameter groups with their masters
 * and state, the step (skip on overflow, unscale, per-parameter step counts) and gradient clipping.
 * The update rules live in one file per kind, reached through the apex__optim_ops tables. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/internal.h"
#include "apex/multi_tensor.h"
#include "backend/backend.h"
#include "optim/optim_internal.h"
#include "optim/optim_shard.h"

static const apex__optim_ops *const KINDS[APEX_OPTIM_KIND_COUNT] = {
    [APEX_OPTIM_SGD] = &apex__sgd_ops,           [APEX_OPTIM_ADAM] = &apex__adam_ops,
    [APEX_OPTIM_ADAMW] = &apex__adamw_ops,       [APEX_OPTIM_ADAMP] = &apex__adamp_ops,
    [APEX_OPTIM_LAMB] = &apex__lamb_ops,         [APEX_OPTIM_ADADELTA] = &apex__adadelta_ops,
    [APEX_OPTIM_ADAGRAD] = &apex__adagrad_ops,   [APEX_OPTIM_RMSPROP] = &apex__rmsprop_ops,
    [APEX_OPTIM_RMSPROP_TF] = &apex__rmsprop_tf_ops, [APEX_OPTIM_NOVOGRAD] = &apex__novograd_ops};

static const char *const KIND_NAMES[APEX_OPTIM_KIND_COUNT] = {
    "sgd", "adam", "adamw", "adamp", "lamb", "adadelta", "adagrad", "rmsprop", "rmsprop_tf", "novograd"};

const char *apex_optim_kind_name(apex_optim_kind kind) {
  return (unsigned)kind < APEX_OPTIM_KIND_COUNT ? KIND_NAMES[kind] : "invalid";
}

apex_status apex_optim_kind_parse(const char *name, apex_optim_kind *out) {
  for (int k = 0; name && k < APEX_OPTIM_KIND_COUNT; k++)
    if (!strcasecmp(name, KIND_NAMES[k])) {
      if (out) *out = (apex_optim_kind)k;
      return APEX_OK;
    }
  return apex__fail(APEX_ERR_INVALID_ARG,
                    "unknown optimizer '%s'; use sgd, adam, adamw, adamp, lamb, adadelta, adagrad, rmsprop, "
                    "rmsprop_tf or novograd", name ? name : "(null)");
}

/* ---- the option fields ----------------------------------------------------------------------------- */

/* range: 'n' finite and >= 0, 'b' in [0, 1), 'u' in [0, 1], 'a' any finite, 'x' not NaN, 'f' a flag,
 * 'i' NovoGrad's norm_type. */
typedef struct {
  const char *name;
  size_t off;
  char range;
  unsigned zero_bit;
} field_desc;

#define FLOAT_FIELD(f, member, range, zero) [APEX__F_##f] = {#member, offsetof(apex_optim_options, member), range, zero}
static const field_desc FIELDS[APEX__F_COUNT] = {
    FLOAT_FIELD(LR, lr, 'n', APEX_OPTIM_ZERO_LR),
    FLOAT_FIELD(BETA1, beta1, 'b', APEX_OPTIM_ZERO_BETA1),
    FLOAT_FIELD(BETA2, beta2, 'b', APEX_OPTIM_ZERO_BETA2),
    FLOAT_FIELD(EPS, eps, 'n', APEX_OPTIM_ZERO_EPS),
    FLOAT_FIELD(WEIGHT_DECAY, weight_decay, 'n', 0),
    FLOAT_FIELD(MOMENTUM, momentum, 'n', 0),
    FLOAT_FIELD(DAMPENING, dampening, 'a', 0),
    FLOAT_FIELD(ALPHA, alpha, 'n', APEX_OPTIM_ZERO_ALPHA),
    FLOAT_FIELD(RHO, rho, 'u', APEX_OPTIM_ZERO_RHO),
    FLOAT_FIELD(DELTA, delta, 'n', APEX_OPTIM_ZERO_DELTA),
    FLOAT_FIELD(WD_RATIO, wd_ratio, 'n', APEX_OPTIM_ZERO_WD_RATIO),
    FLOAT_FIELD(INITIAL_ACC, initial_accumulator_value, 'n', 0),
    FLOAT_FIELD(LR_DECAY, lr_decay, 'n', 0),
    FLOAT_FIELD(MAX_GRAD_NORM, max_grad_norm, 'x', 0),
    FLOAT_FIELD(NORM_TYPE, norm_type, 'i', 0),
    FLOAT_FIELD(NESTEROV, nesterov, 'f', 0),
    FLOAT_FIELD(WD_AFTER_MOMENTUM, wd_after_momentum, 'f', 0),
    FLOAT_FIELD(BIAS_CORRECTION, bias_correction, 'f', 0),
    FLOAT_FIELD(AMSGRAD, amsgrad, 'f', 0),
    FLOAT_FIELD(ADAM_W_MODE, adam_w_mode, 'f', 0),
    FLOAT_FIELD(GRAD_AVERAGING, grad_averaging, 'f', 0),
    FLOAT_FIELD(USE_NVLAMB, use_nvlamb, 'f', 0),
    FLOAT_FIELD(ADAGRAD_W_MODE, adagrad_w_mode, 'f', 0),
    FLOAT_FIELD(CENTERED, centered, 'f', 0),
    FLOAT_FIELD(DECOUPLED_DECAY, decoupled_decay, 'f', 0),
    FLOAT_FIELD(LR_IN_MOMENTUM, lr_in_momentum, 'f', 0),
    FLOAT_FIELD(INIT_ZERO, init_zero, 'f', 0),
    FLOAT_FIELD(REG_INSIDE_MOMENT, reg_inside_moment, 'f', 0),
};
#define ALL_ZERO_BITS 0xFFu

static int is_float_field(const field_desc *f) { return f->range != 'f' && f->range != 'i'; }
static float *float_at(apex_optim_options *o, const field_desc *f) { return (float *)((char *)o + f->off); }
static int *int_at(apex_optim_options *o, const field_desc *f) { return (int *)((char *)o + f->off); }
/* Copies field f of src into dst. */
static void copy_field(apex_optim_options *dst, const apex_optim_options *src, const field_desc *f) {
  memcpy((char *)dst + f->off, (const char *)src + f->off, 4);
}
static int field_is_zero(apex_optim_options *o, const field_desc *f) {
  return is_float_field(f) ? *float_at(o, f) == 0.0f : *int_at(o, f) == 0;
}

apex_status apex_optim_options_set(apex_optim_options *opts, const char *name, double value) {
  if (!opts || !name) return apex__fail(APEX_ERR_INVALID_ARG, "apex_optim_options_set: NULL options or name");
  for (int i = 0; i < APEX__F_COUNT; i++) {
    const field_desc *f = &FIELDS[i];
    if (strcasecmp(name, f->name)) continue;
    if (f->range == 'f') {
      if (value != 0 && value != 1)
        return apex__fail(APEX_ERR_INVALID_ARG, "apex_optim_options_set: %s is a flag; give 0 or 1, not %g", name, value);
      *int_at(opts, f) = value == 1 ? APEX_OPTIM_ON : APEX_OPTIM_OFF;
    } else if (f->range == 'i') {
      *int_at(opts, f) = (int)value;
    } else {
      *float_at(opts, f) = (float)value;
      if (value == 0) opts->zero |= f->zero_bit;
      else opts->zero &= ~f->zero_bit;
    }
    return APEX_OK;
  }
  return apex__fail(APEX_ERR_INVALID_ARG,
                    "apex_optim_options_set: unknown option '%s'; the options are the fields of apex_optim_options "
                    "(lr, beta1, beta2, eps, weight_decay, momentum, dampening, alpha, rho, delta, wd_ratio, "
                    "initial_accumulator_value, lr_decay, max_grad_norm, norm_type and the flags)", name);
}

static apex_status check_range(const char *kind, const field_desc *f, apex_optim_options *o) {
  if (f->range == 'f') {
    int v = *int_at(o, f);
    if (v != APEX_OPTIM_ON && v != APEX_OPTIM_OFF)
      return apex__fail(APEX_ERR_INVALID_ARG, "%s: flag %s is %d; use APEX_OPTIM_ON, APEX_OPTIM_OFF or 0 (default)",
                        kind, f->name, v);
    return APEX_OK;
  }
  if (f->range == 'i') {
    int *v = int_at(o, f);
    if (*v == 0) *v = 2;
    if (*v != 2 && *v != APEX_OPTIM_NORM_INF)
      return apex__fail(APEX_ERR_INVALID_ARG, "%s: norm_type is %d; use 2 (L2) or APEX_OPTIM_NORM_INF", kind, *v);
    return APEX_OK;
  }
  float v = *float_at(o, f);
  const char *want = NULL;
  switch (f->range) {
    case 'n': if (!(v >= 0.0f && isfinite(v))) want = "must be finite and >= 0"; break;
    case 'b': if (!(v >= 0.0f && v < 1.0f)) want = "must be in [0, 1)"; break;
    case 'u': if (!(v >= 0.0f && v <= 1.0f)) want = "must be in [0, 1]"; break;
    case 'a': if (!isfinite(v)) want = "must be finite"; break;
    default: if (isnan(v)) want = "must not be NaN"; break;
  }
  return want ? apex__fail(APEX_ERR_INVALID_ARG, "%s: %s is %g; it %s", kind, f->name, (double)v, want) : APEX_OK;
}

apex_status apex__optim_resolve(const apex__optim_ops *ops, const apex_optim_options *in, apex_optim_options *out) {
  apex_optim_options o = in ? *in : (apex_optim_options){0};
  if (o.zero & ~ALL_ZERO_BITS)
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: unknown bits 0x%x in options.zero; use APEX_OPTIM_ZERO_*", ops->name,
                      o.zero & ~ALL_ZERO_BITS);
  for (int i = 0; i < APEX__F_COUNT; i++) {
    const field_desc *f = &FIELDS[i];
    int zero = field_is_zero(&o, f), zero_bit = (o.zero & f->zero_bit) != 0;
    if (!(ops->fields >> i & 1u)) {
      if (!zero || zero_bit)
        return apex__fail(APEX_ERR_INVALID_ARG, "%s: option %s does not apply to %s; leave it 0", ops->name, f->name,
                          ops->name);
      continue;
    }
    if (zero_bit && !zero)
      return apex__fail(APEX_ERR_INVALID_ARG, "%s: %s is set but its APEX_OPTIM_ZERO bit asks for 0", ops->name, f->name);
    if (zero && !zero_bit) copy_field(&o, &ops->defaults, f);
    apex_status st = check_range(ops->name, f, &o);
    if (st != APEX_OK) return st;
    if (is_float_field(f) && *float_at(&o, f) == 0.0f) o.zero |= f->zero_bit; /* resolving twice changes nothing */
  }
  if (ops->validate) {
    apex_status st = ops->validate(&o);
    if (st != APEX_OK) return st;
  }
  *out = o;
  return APEX_OK;
}

/* ---- create, destroy, groups ------------------------------------------------------------------------- */

apex_optimizer *apex_optimizer_create(apex_optim_kind kind, const apex_optim_options *defaults) {
  if ((unsigned)kind >= APEX_OPTIM_KIND_COUNT)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_optimizer_create: invalid optimizer kind %d", (int)kind);
  apex_optim_options resolved;
  if (apex__optim_resolve(KINDS[kind], defaults, &resolved) != APEX_OK) return NULL;
  apex_optimizer *opt = calloc(1, sizeof *opt);
  if (!opt) return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex_optimizer_create: out of memory");
  opt->kind = kind;
  opt->ops = KINDS[kind];
  opt->defaults = defaults ? *defaults : (apex_optim_options){0};
  opt->clip_coef = 1.0f;
  opt->norm_scale = 1.0f;
  return opt;
}

static void group_free(apex__group *g) {
  for (int i = 0; i < g->n; i++) {
    if (g->master) apex_tensor_destroy(g->master[i]);
    for (int s = 0; g->state && s < g->nstates; s++) apex_tensor_destroy(g->state[(size_t)i * g->nstates + s]);
  }
  free(g->params);
  free(g->grads);
  free(g->master);
  free(g->state);
  free(g->scalars);
  free(g->step);
  if (g->d_step) g->backend->mem->free(g->d_step);
  if (g->d_scalars) g->backend->mem->free(g->d_scalars);
  if (g->d_lr) g->backend->mem->free(g->d_lr);
}

void apex_optimizer_destroy(apex_optimizer *opt) {
  if (!opt) return;
  for (int k = 0; k < opt->ngroups; k++) group_free(&opt->groups[k]);
  free(opt->groups);
  free(opt->norm_grads);
  free(opt);
}

/* Every tensor of a group lives on its first parameter's device (the CPU, or a GPU that can be used). */
static apex_status check_tensor_on(const char *what, int i, const apex_tensor *t, apex_device device) {
  if (apex_tensor_device(t) != device)
    return apex__fail(APEX_ERR_DEVICE, "apex_optimizer: %s %d is on the %s but the group's parameters are on the %s",
                      what, i, apex_tensor_device(t) == APEX_DEVICE_CPU ? "CPU" : "GPU",
                      device == APEX_DEVICE_CPU ? "CPU" : "GPU");
  apex_dtype dt = apex_tensor_dtype(t);
  if (dt != APEX_F32 && dt != APEX_F16 && dt != APEX_BF16)
    return apex__fail(APEX_ERR_DTYPE, "apex_optimizer: %s %d has dtype %s; use f32, f16 or bf16", what, i,
                      apex_dtype_name(dt));
  return APEX_OK;
}

static apex_status check_grad(int i, const apex_tensor *param, const apex_tensor *grad) {
  if (!grad) return APEX_OK;
  apex_status st = check_tensor_on("gradient", i, grad, apex_tensor_device(param));
  if (st != APEX_OK) return st;
  if (!apex_tensor_same_shape(param, grad)) {
    char a[96], b[96];
    return apex__fail(APEX_ERR_SHAPE, "apex_optimizer: gradient %d has shape %s but its parameter %s", i,
                      apex_tensor_shape_str(grad, a, sizeof a), apex_tensor_shape_str(param, b, sizeof b));
  }
  return APEX_OK;
}

static int param_known(const apex_optimizer *opt, const apex_tensor *p) {
  for (int k = 0; k < opt->ngroups; k++)
    for (int i = 0; i < opt->groups[k].n; i++)
      if (opt->groups[k].params[i] == p) return k;
  return -1;
}

static apex_status check_group_args(const apex_optimizer *opt, apex_tensor *const *params, int n_params,
                                    apex_tensor *const *grads, int n_grads) {
  if (!params || n_params < 1)
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_optimizer_add_group: empty parameter list (%d parameters); a group "
                      "needs at least one", n_params);
  if (!(n_grads == 0 && !grads) && n_grads != n_params)
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_optimizer_add_group: %d parameters but %d gradients; the lists "
                      "must have the same length (or pass NULL, 0 for no gradients yet)", n_params, n_grads);
  for (int i = 0; i < n_params; i++) {
    if (!params[i]) return apex__fail(APEX_ERR_INVALID_ARG, "apex_optimizer_add_group: parameter %d is NULL", i);
    apex_status st = check_tensor_on("parameter", i, params[i], apex_tensor_device(params[0]));
    if (st == APEX_OK && grads) st = check_grad(i, params[i], grads[i]);
    if (st != APEX_OK) return st;
    for (int j = 0; j < i; j++)
      if (params[j] == params[i])
        return apex__fail(APEX_ERR_INVALID_ARG, "apex_optimizer_add_group: parameter %d is parameter %d again", i, j);
    int k = param_known(opt, params[i]);
    if (k >= 0)
      return apex__fail(APEX_ERR_INVALID_ARG, "apex_optimizer_add_group: parameter %d is already in group %d", i, k);
  }
  return APEX_OK;
}

/* Allocates a group's masters and state (all or nothing). */
static apex_status group_alloc(const apex__optim_ops *ops, apex__group *g, apex_tensor *const *params,
                               apex_tensor *const *grads) {
  int n = g->n;
  g->nstates = ops->nstates(&g->o);
  g->nscalars = ops->nscalars;
  g->params = calloc((size_t)n, sizeof *g->params);
  g->grads = calloc((size_t)n, sizeof *g->grads);
  g->master = calloc((size_t)n, sizeof *g->master);
  g->state = calloc((size_t)n * (size_t)(g->nstates ? g->nstates : 1), sizeof *g->state);
  g->scalars = calloc((size_t)n * (size_t)(g->nscalars ? g->nscalars : 1), sizeof *g->scalars);
  g->step = calloc((size_t)n, sizeof *g->step);
  g->device = apex_tensor_device(params[0]);
  g->backend = apex__backend_for(g->device); /* the tensors exist, so their backend does */
  if (!g->params || !g->grads || !g->master || !g->state || !g->scalars || !g->step) goto oom;
  /* The counts and scalars live where the tensors are, for the backend's step. */
  const apex_memory *mem = g->backend->mem;
  if (mem->alloc((size_t)n * sizeof(int64_t), 1, (void **)&g->d_step) != APEX_OK) goto oom;
  if (g->nscalars && mem->alloc((size_t)n * (size_t)g->nscalars * sizeof(float), 1, (void **)&g->d_scalars) != APEX_OK)
    goto oom;
  if (mem->alloc(sizeof(float), 0, (void **)&g->d_lr) != APEX_OK || apex__optim_lr_to_device(g) != APEX_OK) goto oom;
  for (int i = 0; i < n; i++) {
    apex_tensor *p = params[i];
    g->params[i] = p;
    g->grads[i] = grads ? grads[i] : NULL;
    if (apex_tensor_dtype(p) != APEX_F32 && !(g->master[i] = apex_tensor_to(p, APEX_F32))) goto oom;
    for (int s = 0; s < g->nstates; s++) {
      apex_tensor *t = apex_tensor_create_on(g->device, APEX_F32, apex_tensor_ndim(p), apex_tensor_shape(p));
      g->state[(size_t)i * g->nstates + s] = t;
      float init = ops->state_init ? ops->state_init(&g->o, s) : 0.0f;
      if (!t || (init != 0.0f && apex_tensor_fill(t, init) != APEX_OK)) goto oom;
    }
  }
  return APEX_OK;
oom:
  group_free(g);
  return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_optimizer_add_group: out of memory for masters and state");
}

apex_status apex_optimizer_add_group(apex_optimizer *opt, apex_tensor *const *params, int n_params,
                                     apex_tensor *const *grads, int n_grads, const apex_optim_options *opts,
                                     int *group_out) {
  if (!opt) return apex__fail(APEX_ERR_INVALID_ARG, "apex_optimizer_add_group: NULL optimizer");
  apex_status st = check_group_args(opt, params, n_params, grads, n_grads);
  if (st != APEX_OK) return st;
  apex__group g = {.n = n_params};
  st = apex__optim_resolve(opt->ops, opts ? opts : &opt->defaults, &g.o);
  if (st != APEX_OK) return st;
  apex__group *groups = realloc(opt->groups, (size_t)(opt->ngroups + 1) * sizeof *groups);
  if (!groups) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_optimizer_add_group: out of memory");
  opt->groups = groups;
  st = group_alloc(opt->ops, &g, params, grads);
  if (st != APEX_OK) return st;
  opt->groups[opt->ngroups] = g;
  if (group_out) *group_out = opt->ngroups;
  opt->ngroups++;
  return APEX_OK;
}

/* ---- accessors ---------------------------------------------------------------------------------------- */

static apex__group *group_at(const apex_optimizer *opt, int group, const char *fn) {
  if (!opt) return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: NULL optimizer", fn);
  if (group < 0 || group >= opt->ngroups)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: group %d out of range (the optimizer has %d)", fn, group,
                           opt->ngroups);
  return &opt->groups[group];
}

static apex__group *param_at(const apex_optimizer *opt, int group, int i, const char *fn) {
  apex__group *g = group_at(opt, group, fn);
  if (g && (i < 0 || i >= g->n))
    return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: parameter %d out of range (group %d has %d)", fn, i, group, g->n);
  return g;
}

apex_status apex_optimizer_set_grad(apex_optimizer *opt, int group, int i, apex_tensor *grad) {
  apex__group *g = param_at(opt, group, i, "apex_optimizer_set_grad");
  if (!g) return APEX_ERR_INVALID_ARG;
  apex_status st = check_grad(i, g->params[i], grad);
  if (st == APEX_OK) g->grads[i] = grad;
  return st;
}

apex_status apex_optimizer_set_lr(apex_optimizer *opt, int group, float lr) {
  apex__group *g = group_at(opt, group, "apex_optimizer_set_lr");
  if (!g) return APEX_ERR_INVALID_ARG;
  if (!(lr >= 0.0f && isfinite(lr)))
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_optimizer_set_lr: lr is %g; it must be finite and >= 0", (double)lr);
  g->o.lr = lr;
  if (lr == 0.0f) g->o.zero |= APEX_OPTIM_ZERO_LR;
  else g->o.zero &= ~(unsigned)APEX_OPTIM_ZERO_LR;
  return apex__optim_lr_to_device(g);
}

float apex_optimizer_get_lr(const apex_optimizer *opt, int group) {
  apex__group *g = group_at(opt, group, "apex_optimizer_get_lr");
  return g ? g->o.lr : NAN;
}

apex_status apex_optimizer_group_options(const apex_optimizer *opt, int group, apex_optim_options *out) {
  apex__group *g = group_at(opt, group, "apex_optimizer_group_options");
  if (!g) return APEX_ERR_INVALID_ARG;
  if (!out) return apex__fail(APEX_ERR_INVALID_ARG, "apex_optimizer_group_options: NULL out");
  *out = g->o;
  return APEX_OK;
}

apex_optim_kind apex_optimizer_kind(const apex_optimizer *opt) {
  if (!opt) apex__fail_null_arg(__func__, "optimizer");
  return opt ? opt->kind : APEX_OPTIM_KIND_COUNT;
}
int apex_optimizer_num_groups(const apex_optimizer *opt) {
  if (!opt) apex__fail_null_arg(__func__, "optimizer");
  return opt ? opt->ngroups : 0;
}

int apex_optimizer_group_size(const apex_optimizer *opt, int group) {
  apex__group *g = group_at(opt, group, "apex_optimizer_group_size");
  return g ? g->n : -1;
}

apex_tensor *apex_optimizer_master(const apex_optimizer *opt, int group, int i) {
  apex__group *g = param_at(opt, group, i, "apex_optimizer_master");
  if (!g) return NULL;
  return g->master[i] ? g->master[i] : g->params[i];
}

apex_tensor *apex_optimizer_param(const apex_optimizer *opt, int group, int i) {
  apex__group *g = param_at(opt, group, i, "apex_optimizer_param");
  return g ? g->params[i] : NULL;
}

apex_tensor *apex_optimizer_grad(const apex_optimizer *opt, int group, int i) {
  apex__group *g = param_at(opt, group, i, "apex_optimizer_grad");
  return g ? g->grads[i] : NULL;
}

apex_status apex_optimizer_replace_param(apex_optimizer *opt, int group, int i, apex_tensor *param, apex_tensor *grad,
                                         int master_weights) {
  apex__group *g = param_at(opt, group, i, "apex_optimizer_replace_param");
  if (!g) return APEX_ERR_INVALID_ARG;
  if (!param) return apex__fail(APEX_ERR_INVALID_ARG, "apex_optimizer_replace_param: NULL parameter");
  int k = param == g->params[i] ? -1 : param_known(opt, param);
  if (k >= 0)
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_optimizer_replace_param: the new parameter is already in group %d", k);
  apex_status st = check_tensor_on("parameter", i, param, g->device);
  if (st == APEX_OK && !apex_tensor_same_shape(param, g->params[i])) {
    char a[96], b[96];
    st = apex__fail(APEX_ERR_SHAPE, "apex_optimizer_replace_param: the new parameter has shape %s, the old %s",
                    apex_tensor_shape_str(param, a, sizeof a), apex_tensor_shape_str(g->params[i], b, sizeof b));
  }
  if (st == APEX_OK) st = check_grad(i, param, grad);
  if (st != APEX_OK) return st;
  apex_tensor *master = g->master[i];
  if (!master_weights || apex_tensor_dtype(param) == APEX_F32) master = NULL;
  else if (!master && !(master = apex_tensor_to(g->params[i], APEX_F32)))
    return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_optimizer_replace_param: out of memory for the master");
  if (master != g->master[i]) apex_tensor_destroy(g->master[i]);
  g->master[i] = master;
  g->params[i] = param;
  g->grads[i] = grad;
  return APEX_OK;
}

int64_t apex_optimizer_step_count(const apex_optimizer *opt, int group, int i) {
  apex__group *g = param_at(opt, group, i, "apex_optimizer_step_count");
  if (!g || apex__optim_steps_to_host(g) != APEX_OK) return -1;
  return g->step[i];
}

apex_status apex__optim_steps_to_host(apex__group *g) {
  if (!g->d_step) return APEX_OK;
  const apex_memory *m = g->backend->mem;
  size_t nsc = (size_t)g->n * (size_t)g->nscalars * sizeof *g->scalars;
  apex_status st = nsc ? m->copy(g->scalars, g->d_scalars, nsc, APEX_COPY_D2H, 0) : APEX_OK;
  return st != APEX_OK ? st : m->copy(g->step, g->d_step, (size_t)g->n * sizeof *g->step, APEX_COPY_D2H, 1);
}

apex_status apex__optim_lr_to_device(apex__group *g) {
  return g->d_lr ? g->backend->mem->copy(g->d_lr, &g->o.lr, sizeof g->o.lr, APEX_COPY_H2D, 0) : APEX_OK;
}

apex_status apex__optim_steps_to_device(apex__group *g) {
  if (!g->d_step) return APEX_OK;
  const apex_memory *m = g->backend->mem;
  size_t nsc = (size_t)g->n * (size_t)g->nscalars * sizeof *g->scalars;
  apex_status st = nsc ? m->copy(g->d_scalars, g->scalars, nsc, APEX_COPY_H2D, 0) : APEX_OK;
  return st != APEX_OK ? st : m->copy(g->d_step, g->step, (size_t)g->n * sizeof *g->step, APEX_COPY_H2D, 1);
}

/* ---- the step ------------------------------------------------------------------------------------------- */

static void active_free(apex__active *a) {
  free(a->idx);
  free(a->g);
  free(a->p);
  free(a->model);
  for (int s = 0; s < APEX__OPTIM_MAX_STATES; s++) free(a->s[s]);
}

/* The lists of a group's parameters that have a gradient. */
static apex_status active_build(const apex__group *g, apex__active *a) {
  *a = (apex__active){0};
  for (int i = 0; i < g->n; i++) a->n += g->grads[i] != NULL;
  size_t n = a->n ? (size_t)a->n : 1;
  a->idx = malloc(n * sizeof *a->idx);
  a->g = malloc(n * sizeof *a->g);
  a->p = malloc(n * sizeof *a->p);
  a->model = malloc(n * sizeof *a->model);
  int ok = a->idx && a->g && a->p && a->model;
  for (int s = 0; s < g->nstates; s++) ok = ok && (a->s[s] = malloc(n * sizeof *a->s[s]));
  if (!ok) {
    active_free(a);
    return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_optimizer_step: out of memory");
  }
  int k = 0;
  for (int i = 0; i < g->n; i++) {
    if (!g->grads[i]) continue;
    a->idx[k] = i;
    a->g[k] = g->grads[i];
    a->p[k] = g->master[i] ? g->master[i] : g->params[i];
    a->model[k] = g->master[i] ? g->params[i] : NULL;
    for (int s = 0; s < g->nstates; s++) a->s[s][k] = g->state[(size_t)i * g->nstates + s];
    k++;
  }
  return APEX_OK;
}

static apex_status check_scale(const char *fn, float grad_scale) {
  if (!(grad_scale > 0.0f && isfinite(grad_scale)))
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: grad_scale is %g; it must be finite and > 0 (1 for unscaled "
                      "gradients)", fn, (double)grad_scale);
  return APEX_OK;
}

/* LAMB: the global norm of every group's gradients times inv_scale, for max_grad_norm, into one float
 * *d_norm where the tensors are (left NULL when no group clips), so that a GPU step never waits for it. */
static apex_status global_norm(const apex_optimizer *opt, const apex__active *act, float inv_scale,
                               const apex_backend *b, float **d_norm) {
  int n = 0, clips = 0;
  for (int k = 0; k < opt->ngroups; k++) {
    const apex_optim_options *o = &opt->groups[k].o;
    n += act[k].n;
    clips |= o->max_grad_norm > 0.0f && isfinite(o->max_grad_norm);
  }
  *d_norm = NULL;
  if (!clips || n == 0) return APEX_OK;
  if (!b->mt_l2norm) return apex__backend_slot_missing(b, "apex_optimizer_step", "the multi-tensor L2 norm");
  if (opt->norm_grads) { /* a shard's optimizer: the norm of the whole model's gradients */
    apex_status st = b->mem->alloc(sizeof(float), 1, (void **)d_norm);
    if (st != APEX_OK) return st;
    return b->mt_l2norm(&(apex_mt_l2norm_args){.fn = "apex_optimizer_step", .n = opt->n_norm_grads, .x = opt->norm_grads,
                                               .inv_scale = inv_scale * opt->norm_scale, .dev_global_norm = *d_norm});
  }
  if (!b->mt_l2norm) return apex__backend_slot_missing(b, "apex_optimizer_step", "the multi-tensor L2 norm");
  apex_tensor **g = malloc((size_t)n * sizeof *g);
  if (!g) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_optimizer_step: out of memory");
  n = 0;
  for (int k = 0; k < opt->ngroups; k++)
    for (int j = 0; j < act[k].n; j++) g[n++] = act[k].g[j];
  apex_status st = b->mem->alloc(sizeof(float), 1, (void **)d_norm);
  if (st == APEX_OK)
    st = b->mt_l2norm(&(apex_mt_l2norm_args){.fn = "apex_optimizer_step", .n = n, .x = g, .inv_scale = inv_scale,
                                             .dev_global_norm = *d_norm});
  free(g);
  return st;
}

/* The step, with the skip decided on the host (the caller returned before, on overflow) or where the
 * tensors are (d_skip, read by the backend's kernels). */
static apex_status step_impl(apex_optimizer *opt, float inv_scale, const float *d_scale, const int *d_skip,
                             const char *fn) {
  apex_status st = APEX_OK;
  const apex_backend *b0 = opt->groups[0].backend;
  for (int k = 1; k < opt->ngroups; k++)
    if (opt->groups[k].backend != b0 && opt->ops->global_norm) /* one norm over every group: one device */
      return apex__fail(APEX_ERR_DEVICE, "%s: %s has groups on the %s and on %s; its global gradient norm needs "
                        "them all on one device", fn, opt->ops->name, apex__device_name(b0->device),
                        apex__device_name(opt->groups[k].backend->device));
  apex__threads_follow_load(); /* once per step: the CPU's share for the next step (threads.c) */
  apex__active *act = calloc((size_t)opt->ngroups, sizeof *act);
  if (!act) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  int built = 0;
  for (; st == APEX_OK && built < opt->ngroups; built++) st = active_build(&opt->groups[built], &act[built]);
  float *d_grad_norm = NULL;
  if (st == APEX_OK && opt->ops->global_norm) st = global_norm(opt, act, inv_scale, b0, &d_grad_norm);
  for (int k = 0; st == APEX_OK && k < opt->ngroups; k++) {
    apex__group *g = &opt->groups[k];
    const apex__active *a = &act[k];
    if (a->n == 0) continue;
    if (!g->backend->optim_step) {
      st = apex__backend_slot_missing(g->backend, fn, "the optimizer step");
      break;
    }
    /* The backend reads the step counts where they live and advances them unless the step is skipped. */
    apex_optim_step_args sa = {.fn = fn, .kind = opt->kind, .o = &g->o, .n = a->n, .g = a->g, .p = a->p,
                               .model = a->model, .nstates = g->nstates, .idx = a->idx, .inv_scale = inv_scale,
                               .dev_step = g->d_step, .dev_scalars = g->d_scalars, .dev_scale = d_scale,
                               .dev_skip = d_skip, .dev_lr = g->d_lr, .dev_grad_norm = d_grad_norm};
    for (int s = 0; s < g->nstates; s++) sa.s[s] = a->s[s];
    st = g->backend->optim_step(&sa);
  }
  for (int k = 0; k < built; k++) active_free(&act[k]);
  if (d_grad_norm) b0->mem->free(d_grad_norm);
  free(act);
  return st;
}

apex_status apex_optimizer_step(apex_optimizer *opt, float grad_scale, int overflow) {
  if (!opt) return apex__fail(APEX_ERR_INVALID_ARG, "apex_optimizer_step: NULL optimizer");
  apex_status st = check_scale("apex_optimizer_step", grad_scale);
  if (st != APEX_OK) return st;
  if (opt->ngroups == 0)
    return apex__fail(APEX_ERR_STATE, "apex_optimizer_step: the optimizer has no parameter groups; add one first");
  float inv_scale = opt->clip_coef / grad_scale;
  opt->clip_coef = 1.0f;
  if (overflow) return APEX_OK;
  return step_impl(opt, inv_scale, NULL, NULL, "apex_optimizer_step");
}

apex_status apex__optimizer_step_skip_at(apex_optimizer *opt, const int *d_skip, const char *fn) {
  if (!opt) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL optimizer", fn);
  if (opt->ngroups == 0) return apex__fail(APEX_ERR_STATE, "%s: the optimizer has no parameter groups; add one first", fn);
  float clip = opt->clip_coef;
  opt->clip_coef = 1.0f;
  return step_impl(opt, clip, NULL, d_skip, fn);
}

apex_status apex_optimizer_step_scaled(apex_optimizer *opt, apex_loss_scaler *scaler) {
  const char *fn = "apex_optimizer_step_scaled";
  if (!opt || !scaler) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL %s", fn, opt ? "scaler" : "optimizer");
  if (opt->ngroups == 0)
    return apex__fail(APEX_ERR_STATE, "%s: the optimizer has no parameter groups; add one first", fn);
  const float *d_scale = NULL;
  const int *d_skip = NULL;
  const apex_backend *where = apex__loss_scaler_where(scaler, &d_scale, &d_skip);
  for (int k = 0; k < opt->ngroups; k++)
    if (opt->groups[k].backend != where) /* the kernels read the scale and the skip flag where they are */
      return apex__fail(APEX_ERR_DEVICE, "%s: the optimizer's parameters are on the %s but the scaler's state on the "
                        "%s; create the scaler on the parameters' device (apex_loss_scaler_create_on)", fn,
                        apex__device_name(opt->groups[k].device), apex__device_name(where->device));
  float clip = opt->clip_coef;
  opt->clip_coef = 1.0f;
  return step_impl(opt, clip, d_scale, d_skip, fn);
}

/* ---- clipping ------------------------------------------------------------------------------------------ */

apex_status apex_optimizer_clip_grad_norm(apex_optimizer *opt, float max_norm, float grad_scale, float *total_norm) {
  if (!opt) return apex__fail(APEX_ERR_INVALID_ARG, "apex_optimizer_clip_grad_norm: NULL optimizer");
  if (!(max_norm > 0.0f && isfinite(max_norm)))
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_optimizer_clip_grad_norm: max_norm is %g; it must be finite and > 0",
                      (double)max_norm);
  apex_status st = check_scale("apex_optimizer_clip_grad_norm", grad_scale);
  if (st != APEX_OK) return st;
  int n = 0;
  for (int k = 0; k < opt->ngroups; k++)
    for (int i = 0; i < opt->groups[k].n; i++) n += opt->groups[k].grads[i] != NULL;
  if (opt->norm_grads) n = opt->n_norm_grads;
  apex_tensor **grads = calloc(n ? (size_t)n : 1, sizeof *grads);
  if (!grads) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_optimizer_clip_grad_norm: out of memory");
  n = 0;
  if (opt->norm_grads)
    for (n = 0; n < opt->n_norm_grads; n++) grads[n] = opt->norm_grads[n];
  for (int k = 0; !opt->norm_grads && k < opt->ngroups; k++)
    for (int i = 0; i < opt->groups[k].n; i++)
      if (opt->groups[k].grads[i]) grads[n++] = opt->groups[k].grads[i];
  float norm = 0.0f;
  st = apex_mt_unscale_l2norm(0, NULL, grads, n, opt->clip_coef / grad_scale, &norm, NULL);
  free(grads);
  if (st != APEX_OK) return st;
  if (total_norm) *total_norm = norm;
  apex__optimizer_clip_by(opt, max_norm, norm);
  return APEX_OK;
}

float apex__optimizer_clip_coef(const apex_optimizer *opt) { return opt->clip_coef; }

void apex__optimizer_clip_by(apex_optimizer *opt, float max_norm, float norm) {
  double coef = (double)max_norm / ((double)norm + 1e-6);
  if (isfinite(norm) && coef < 1.0) opt->clip_coef *= (float)coef;
}

apex_status apex__optimizer_set_norm_grads(apex_optimizer *opt, apex_tensor *const *grads, int n) {
  if (!opt || n < 0 || (n > 0 && !grads))
    return apex__fail(APEX_ERR_INVALID_ARG, "apex__optimizer_set_norm_grads: %s", !opt ? "NULL optimizer" : "bad tensor list");
  for (int i = 0; i < n; i++)
    if (!grads[i]) return apex__fail(APEX_ERR_INVALID_ARG, "apex__optimizer_set_norm_grads: tensor %d is NULL", i);
  apex_tensor **copy = NULL;
  if (n > 0) {
    if (!(copy = malloc((size_t)n * sizeof *copy))) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex__optimizer_set_norm_grads: out of memory");
    memcpy(copy, grads, (size_t)n * sizeof *copy);
  }
  free(opt->norm_grads);
  opt->norm_grads = copy;
  opt->n_norm_grads = n;
  return APEX_OK;
}

apex_status apex__optimizer_set_norm_scale(apex_optimizer *opt, float scale) {
  if (!opt || !(scale > 0.0f) || !isfinite(scale))
    return apex__fail(APEX_ERR_INVALID_ARG, "apex__optimizer_set_norm_scale: %s", opt ? "the scale must be finite and > 0" : "NULL optimizer");
  opt->norm_scale = scale;
  return APEX_OK;
}

int apex__optimizer_nstates(const apex_optimizer *opt, int group) {
  apex__group *g = group_at(opt, group, "apex__optimizer_nstates");
  return g ? g->nstates : -1;
}

int apex__optimizer_nscalars(const apex_optimizer *opt, int group) {
  apex__group *g = group_at(opt, group, "apex__optimizer_nscalars");
  return g ? g->nscalars : -1;
}

apex_tensor *apex__optimizer_state(const apex_optimizer *opt, int group, int i, int s) {
  apex__group *g = param_at(opt, group, i, "apex__optimizer_state");
  if (!g) return NULL;
  if (s < 0 || s >= g->nstates) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex__optimizer_state: state %d of %d", s, g->nstates);
  return g->state[(size_t)i * g->nstates + s];
}

apex_status apex__optimizer_param_scalars(apex_optimizer *opt, int group, int i, float *get, const float *set) {
  apex__group *g = param_at(opt, group, i, "apex__optimizer_param_scalars");
  if (!g) return APEX_ERR_INVALID_ARG;
  apex_status st = apex__optim_steps_to_host(g);
  if (st != APEX_OK || !g->nscalars) return st;
  float *at = g->scalars + (size_t)i * g->nscalars;
  if (get) memcpy(get, at, (size_t)g->nscalars * sizeof *at);
  if (!set) return APEX_OK;
  memcpy(at, set, (size_t)g->nscalars * sizeof *at);
  return apex__optim_steps_to_device(g);
}

apex_status apex__optimizer_set_step(apex_optimizer *opt, int group, int i, int64_t step) {
  apex__group *g = param_at(opt, group, i, "apex__optimizer_set_step");
  if (!g) return APEX_ERR_INVALID_ARG;
  apex_status st = apex__optim_steps_to_host(g);
  if (st != APEX_OK) return st;
  g->step[i] = step;
  return apex__optim_steps_to_device(g);
}

apex_status apex__optimizer_copy_options(apex_optimizer *dst, int dg, const apex_optimizer *src, int sg) {
  apex__group *d = group_at(dst, dg, "apex__optimizer_copy_options"), *s = group_at(src, sg, "apex__optimizer_copy_options");
  if (!d || !s) return APEX_ERR_INVALID_ARG;
  if (dst->kind != src->kind) return apex__fail(APEX_ERR_INVALID_ARG, "apex__optimizer_copy_options: another kind");
  d->o = s->o;
  return apex__optim_lr_to_device(d);
}
