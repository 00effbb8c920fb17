/* amp.c: initialize (casting models, telling the optimizers), the scaled backward with its fused
 * unscale + overflow check, the skipping step, and amp's state. The contract is in amp.h; the
 * configuration and its checks are in properties.c.
 *
 * Models on a GPU take the device path (backward_on_device and step_on_device below): the scalers live on the device, the backward's seed is the device scale, the
 * unscale reads the scale and raises found_inf there, the scaler's update raises the skip flag of each
 * optimizer the loss reached (one device int each), and the step reads that flag in its kernels. So a
 * step never waits for the GPU; only what hands a value to the host waits (the loss, the scale, the
 * state, *skipped), when asked. On the CPU the host path below runs, unchanged. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apex/amp.h"
#include "apex/multi_tensor.h"
#include "amp/amp_internal.h"
#include "autograd/leaf_sink.h"
#include "backend/backend.h"
#include "core/internal.h"
#include "core/tensor_internal.h" /* the parameters' offsets in a joint allocation */
#include "optim/optim_internal.h"

/* One optimizer parameter that amp manages. */
typedef struct {
  apex_var *var;           /* the model's parameter */
  int group, index;        /* its place in the optimizer */
  apex_tensor *master_grad; /* f32, when the optimizer keeps an f32 master of a low-precision param */
  apex_tensor *stash;      /* f32 copy of an in-place gradient while another loss runs backward */
  int fused;               /* this backward's leaf sink already unscaled it into master_grad */
} amp_param;

/* combine_grad: the gradients of one optimizer flattened into one buffer per (dtype, master or not),
 * so that the fresh unscale runs over a few long tensors instead of one per parameter. */
#define AMP_MAX_FLATS 6

typedef struct {
  apex_optimizer *opt;
  amp_param *params;
  int n;
  apex_tensor *flat_x[AMP_MAX_FLATS];   /* the model gradients, every one a view into one of these */
  apex_tensor *flat_out[AMP_MAX_FLATS]; /* where they unscale to: the flat master gradients, or flat_x */
  int n_flat;
  int failed;        /* the last backward failed after touching gradients: refuse the step */
  int skip;          /* an overflow since the last step: skip the next one */
  int scaled;        /* gradients still carry a loss scale (delay_unscale) */
  int dirty;         /* the unscaled gradients hold values (from an earlier loss, or a step without
                        apex_amp_zero_grad): the next backward adds to them */
} amp_opt;

typedef struct {
  apex_op op;
  apex_cast_category category;
} amp_reg;

struct apex_amp {
  uint64_t id; /* unique in the process, never 0: the tag of the graphs this configuration prepared */
  apex_amp_properties p;
  apex_model **models;
  int n_models;
  amp_opt *opts;
  int n_opts;
  apex_loss_scaler **scalers;
  amp_reg *regs;
  int n_regs, cap_regs;
  /* the device path (models on a GPU, or a CPU run asked for by apex__amp_use_device_path) */
  int on_device;
  const apex_backend *be; /* the models' device */
  int32_t *d_skip;        /* n_opts ints in its memory: optimizer o's next step is skipped when nonzero */
};

/* ---- the models initialised so far, to refuse a second initialize ------------------------------ */

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static const apex_model **registry;
static int registry_n, registry_cap;
static uint64_t last_id; /* ids are never reused, so a destroyed amp's tag on a graph matches no other */

static uint64_t fresh_id(void) {
  pthread_mutex_lock(&registry_lock);
  uint64_t id = ++last_id;
  pthread_mutex_unlock(&registry_lock);
  return id;
}

static int registry_has(const apex_model *m) {
  for (int i = 0; i < registry_n; i++)
    if (registry[i] == m) return 1;
  return 0;
}

/* Adds all models, or none if one is there already (returns its index) or memory runs out (-2). */
static int registry_add(apex_model *const *models, int n) {
  int clash = -1;
  pthread_mutex_lock(&registry_lock);
  for (int i = 0; i < n && clash < 0; i++)
    if (registry_has(models[i])) clash = i;
  if (clash < 0 && registry_n + n > registry_cap) {
    int cap = (registry_n + n) * 2;
    const apex_model **grown = realloc(registry, (size_t)cap * sizeof *grown);
    if (!grown) clash = -2;
    else {
      registry = grown;
      registry_cap = cap;
    }
  }
  if (clash == -1)
    for (int i = 0; i < n; i++) registry[registry_n++] = models[i];
  pthread_mutex_unlock(&registry_lock);
  return clash;
}

static void registry_remove(apex_model *const *models, int n) {
  pthread_mutex_lock(&registry_lock);
  for (int k = 0; k < n; k++)
    for (int i = 0; i < registry_n; i++)
      if (registry[i] == models[k]) {
        registry[i] = registry[--registry_n];
        break;
      }
  pthread_mutex_unlock(&registry_lock);
}

/* ---- initialize -------------------------------------------------------------------------------- */

/* The model parameter whose value is t, and which model and index it has. */
static apex_var *find_var(apex_model *const *models, int n_models, const apex_tensor *t, int *model, size_t *index) {
  for (int m = 0; m < n_models; m++)
    for (size_t i = 0; i < apex_model_num_params(models[m]); i++) {
      apex_var *v = apex_model_param(models[m], i, NULL);
      if (apex_var_value(v) == t) {
        *model = m;
        *index = i;
        return v;
      }
    }
  return NULL;
}

static void free_opts(apex_amp *amp) {
  for (int o = 0; o < amp->n_opts; o++) {
    for (int k = 0; k < amp->opts[o].n; k++) {
      apex_tensor_destroy(amp->opts[o].params[k].master_grad);
      apex_tensor_destroy(amp->opts[o].params[k].stash);
    }
    for (int f = 0; f < amp->opts[o].n_flat; f++) {
      if (amp->opts[o].flat_out[f] != amp->opts[o].flat_x[f]) apex_tensor_destroy(amp->opts[o].flat_out[f]);
      apex_tensor_destroy(amp->opts[o].flat_x[f]); /* the views keep the storage while they live */
    }
    free(amp->opts[o].params);
  }
  free(amp->opts);
}

void apex_amp_destroy(apex_amp *amp) {
  if (!amp) return;
  registry_remove(amp->models, amp->n_models);
  free_opts(amp);
  for (int i = 0; amp->scalers && i < amp->p.num_losses; i++) apex_loss_scaler_destroy(amp->scalers[i]);
  if (amp->d_skip) amp->be->mem->free(amp->d_skip);
  free(amp->scalers);
  free(amp->models);
  free(amp->regs);
  free(amp);
}

/* Maps every optimizer parameter to its model var (all must belong to the models). */
static apex_status map_optimizers(apex_amp *amp, apex_optimizer *const *opts) {
  for (int o = 0; o < amp->n_opts; o++) {
    amp_opt *ao = &amp->opts[o];
    ao->opt = opts[o];
    for (int g = 0; g < apex_optimizer_num_groups(opts[o]); g++) ao->n += apex_optimizer_group_size(opts[o], g);
    ao->params = calloc((size_t)ao->n + 1, sizeof *ao->params);
    if (!ao->params) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_amp_initialize: out of memory");
    int k = 0;
    for (int g = 0; g < apex_optimizer_num_groups(opts[o]); g++)
      for (int i = 0; i < apex_optimizer_group_size(opts[o], g); i++, k++) {
        int model;
        size_t index;
        apex_var *v = find_var(amp->models, amp->n_models, apex_optimizer_param(opts[o], g, i), &model, &index);
        if (!v)
          return apex__fail(APEX_ERR_INVALID_ARG,
                            "apex_amp_initialize: parameter %d of group %d of optimizer %d belongs to none of the models", i, g, o);
        ao->params[k] = (amp_param){.var = v, .group = g, .index = i};
      }
  }
  return APEX_OK;
}

/* Gives v the value fresh (its cast, O2/O3) and tells the optimizers, while the old f32 value is still
 * alive so that it becomes the optimizer's master. */
static apex_status cast_param(apex_amp *amp, apex_var *v, apex_tensor *fresh) {
  if (!fresh) return APEX_ERR_OUT_OF_MEMORY;
  apex_tensor *old = apex_var_swap_value(v, fresh);
  if (!old) {
    apex_tensor_destroy(fresh);
    return APEX_ERR_STATE;
  }
  apex_status st = APEX_OK;
  for (int o = 0; o < amp->n_opts && st == APEX_OK; o++)
    for (int k = 0; k < amp->opts[o].n && st == APEX_OK; k++) {
      amp_param *ap = &amp->opts[o].params[k];
      if (ap->var == v)
        st = apex_optimizer_replace_param(amp->opts[o].opt, ap->group, ap->index, fresh, apex_var_grad(v), amp->p.master_weights);
    }
  apex_tensor_destroy(old);
  return st;
}

/* The parameters of model m from i on that share parameter i's allocation and are cast (n of them,
 * into idx, i first), when they tile one span of it back to back: their offsets sorted into idx, the
 * span's first byte in *lo; 0 when they do not (then each is cast alone). */
static int joint_span(apex_amp *amp, const apex_model *m, size_t i, const char *done, size_t *idx, size_t *n, size_t *lo) {
  const apex_tensor *t0 = apex_var_value(apex_model_param(m, i, NULL));
  size_t k = 0;
  for (size_t j = i; j < apex_model_num_params(m); j++) {
    const apex_tensor *t = apex_var_value(apex_model_param(m, j, NULL));
    if (done[j] || t->storage != t0->storage || (amp->p.keep_batchnorm_fp32 && apex_model_param_in_batch_norm(m, j))) continue;
    if (t->dtype != t0->dtype) return 0;
    size_t at = k++;
    for (; at > 0 && apex_var_value(apex_model_param(m, idx[at - 1], NULL))->offset > t->offset; at--) idx[at] = idx[at - 1];
    idx[at] = j;
  }
  for (size_t a = 1; a < k; a++) {
    const apex_tensor *p = apex_var_value(apex_model_param(m, idx[a - 1], NULL)), *q = apex_var_value(apex_model_param(m, idx[a], NULL));
    if (q->offset != p->offset + p->numel * apex_dtype_size(p->dtype)) return 0;
  }
  *n = k;
  *lo = apex_var_value(apex_model_param(m, idx[0], NULL))->offset;
  return k > 1;
}

/* Casts the models' parameters (O2/O3). Parameters that are views of one allocation tiling a span of it
 * (nn's joint q/k/v weights and biases, apex__nn_linear_params_joint) are cast as that span, each
 * getting its view of the cast copy: they stay one allocation, so apex_concat keeps joining them in
 * place instead of copying them at every forward. A cast is elementwise: the values are the same. */
static apex_status cast_models(apex_amp *amp) {
  apex_status st = APEX_OK;
  for (int mi = 0; mi < amp->n_models && st == APEX_OK; mi++) {
    const apex_model *m = amp->models[mi];
    size_t np = apex_model_num_params(m), *idx = malloc((np + 1) * sizeof *idx), n, lo;
    char *done = calloc(np + 1, 1);
    if (!idx || !done) st = apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_amp_initialize: out of memory");
    for (size_t i = 0; i < np && st == APEX_OK; i++) {
      if (done[i] || (amp->p.keep_batchnorm_fp32 && apex_model_param_in_batch_norm(m, i))) continue;
      apex_tensor *t = apex_var_value(apex_model_param(m, i, NULL));
      if (!joint_span(amp, m, i, done, idx, &n, &lo)) {
        st = cast_param(amp, apex_model_param(m, i, NULL), apex_tensor_to(t, amp->p.cast_model_type));
        continue;
      }
      const apex_tensor *last = apex_var_value(apex_model_param(m, idx[n - 1], NULL));
      size_t es = apex_dtype_size(t->dtype), es_to = apex_dtype_size(amp->p.cast_model_type);
      int64_t total = (int64_t)((last->offset - lo) / es + last->numel);
      apex_tensor *span = apex__tensor_view_of(t->storage, lo, t->dtype, 1, &total), *cast = span ? apex_tensor_to(span, amp->p.cast_model_type) : NULL;
      apex_tensor_destroy(span);
      if (!cast) st = apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_amp_initialize: out of memory for the cast parameters");
      for (size_t a = 0; a < n && st == APEX_OK; a++) {
        apex_var *v = apex_model_param(m, idx[a], NULL);
        const apex_tensor *p = apex_var_value(v);
        st = cast_param(amp, v, apex__tensor_view_of(cast->storage, cast->offset + (p->offset - lo) / es * es_to, cast->dtype, p->ndim, p->shape));
        done[idx[a]] = 1;
      }
      apex_tensor_destroy(cast); /* the views keep the cast copy */
    }
    free(idx);
    free(done);
  }
  return st;
}

/* Points each optimizer at the gradients amp unscales into: an f32 master gradient for a parameter
 * the optimizer keeps an f32 master of, the parameter's own gradient otherwise. */
static apex_status attach_grads(apex_amp *amp) {
  for (int o = 0; o < amp->n_opts; o++)
    for (int k = 0; k < amp->opts[o].n; k++) {
      amp_param *ap = &amp->opts[o].params[k];
      apex_tensor *value = apex_var_value(ap->var), *grad = apex_var_grad(ap->var);
      if (apex_tensor_dtype(value) != APEX_F32 && amp->p.master_weights) {
        ap->master_grad = apex_tensor_create_on(apex_tensor_device(value), APEX_F32, apex_tensor_ndim(value), apex_tensor_shape(value));
        if (!ap->master_grad) return APEX_ERR_OUT_OF_MEMORY;
        grad = ap->master_grad;
      }
      apex_status st = apex_optimizer_set_grad(amp->opts[o].opt, ap->group, ap->index, grad);
      if (st != APEX_OK) return st;
    }
  return APEX_OK;
}

/* combine_grad: flattens each optimizer's gradients, one buffer per (gradient dtype, has a master
 * gradient): in-place gradients into one flat tensor that the unscale reads and writes; low-precision
 * model gradients and their f32 master gradients into two flat tensors in the same order. Every
 * gradient tensor stays the same object (a view now), so the optimizers and autograd see no change. */
static apex_status combine_grads(amp_opt *ao) {
  const apex_dtype dts[3] = {APEX_F32, APEX_F16, APEX_BF16};
  apex_tensor **x = malloc((size_t)(ao->n + 1) * sizeof *x), **m = malloc((size_t)(ao->n + 1) * sizeof *m);
  apex_status st = x && m ? APEX_OK : apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_amp_initialize: out of memory");
  for (int d = 0; d < 3 && st == APEX_OK; d++)
    for (int master = 0; master < 2 && st == APEX_OK; master++) {
      int k = 0;
      for (int i = 0; i < ao->n; i++) {
        apex_tensor *grad = apex_var_grad(ao->params[i].var);
        if (apex_tensor_dtype(grad) != dts[d] || !ao->params[i].master_grad != !master) continue;
        x[k] = grad;
        m[k++] = ao->params[i].master_grad;
      }
      if (k == 0) continue;
      int f = ao->n_flat;
      st = apex_tensor_flatten(x, k, &ao->flat_x[f]);
      if (st == APEX_OK && master && (st = apex_tensor_flatten(m, k, &ao->flat_out[f])) != APEX_OK) {
        apex_tensor_destroy(ao->flat_x[f]);
        ao->flat_x[f] = NULL;
      }
      if (st == APEX_OK) {
        if (!master) ao->flat_out[f] = ao->flat_x[f];
        ao->n_flat++;
      }
    }
  free(x);
  free(m);
  if (st != APEX_OK) {
    char why[512]; /* the message is rewritten below: copy it out first */
    snprintf(why, sizeof why, "%s", apex_last_error());
    return apex__fail(st, "apex_amp_initialize: combine_grad could not flatten the gradients: %s", why);
  }
  return APEX_OK;
}

static apex_status already_initialised(int m) {
  return apex__fail(APEX_ERR_INVALID_ARG,
                    "apex_amp_initialize: model %d was already initialised by another apex_amp; initialise each model once "
                    "(destroy the other apex_amp first)", m);
}

/* The device of every parameter of every model (they must share one), or APEX_ERR_DEVICE. */
static apex_status models_device(apex_model *const *models, int n_models, apex_device *dev) {
  int seen = 0;
  for (int m = 0; m < n_models; m++)
    for (size_t i = 0; i < apex_model_num_params(models[m]); i++) {
      const char *name;
      apex_device d = apex_tensor_device(apex_var_value(apex_model_param(models[m], i, &name)));
      if (!seen) *dev = d, seen = 1;
      else if (d != *dev)
        return apex__fail(APEX_ERR_DEVICE, "apex_amp_initialize: parameter '%s' of model %d is on the %s but the models' first "
                          "parameter on the %s; amp's models live on one device", name, m, apex__device_name(d),
                          apex__device_name(*dev));
    }
  if (!seen) *dev = APEX_DEVICE_CPU;
  return APEX_OK;
}

/* Puts amp on the device path for the models' device: scalers there, a zeroed skip flag per optimizer. */
static apex_status use_device_path(apex_amp *amp, apex_device dev) {
  const char *fn = "apex_amp_initialize";
  if (amp->n_opts > 64)
    return apex__fail(APEX_ERR_UNSUPPORTED, "%s: %d optimizers; amp on a device manages at most 64", fn, amp->n_opts);
  const apex_backend *be = apex__backend_need(dev, fn);
  if (!be) return apex_last_status();
  void *flags = NULL;
  apex_status st = be->mem->alloc(sizeof(int32_t) * (size_t)(amp->n_opts ? amp->n_opts : 1), 1, &flags);
  if (st != APEX_OK) return st;
  apex_loss_scaler **sc = calloc((size_t)amp->p.num_losses, sizeof *sc);
  if (!sc) st = apex__fail(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  for (int i = 0; st == APEX_OK && i < amp->p.num_losses; i++)
    if (!(sc[i] = apex_loss_scaler_create_on(dev, &amp->p.scaler))) st = apex_last_status();
  if (st != APEX_OK) {
    for (int i = 0; sc && i < amp->p.num_losses; i++) apex_loss_scaler_destroy(sc[i]);
    free(sc);
    be->mem->free(flags);
    return st;
  }
  /* the host scalers, untouched so far, give way to the device ones */
  for (int i = 0; i < amp->p.num_losses; i++) apex_loss_scaler_destroy(amp->scalers[i]);
  free(amp->scalers);
  amp->scalers = sc;
  amp->be = be;
  amp->d_skip = flags;
  amp->on_device = 1;
  return APEX_OK;
}

apex_status apex__amp_use_device_path(apex_amp *amp) {
  if (!amp) return apex__fail(APEX_ERR_INVALID_ARG, "apex__amp_use_device_path: NULL amp");
  if (amp->on_device) return APEX_OK;
  apex_device dev;
  apex_status st = models_device(amp->models, amp->n_models, &dev);
  return st == APEX_OK ? use_device_path(amp, dev) : st;
}

static apex_status check_models(apex_model *const *models, int n_models, apex_optimizer *const *opts, int n_opts) {
  if (!models || n_models < 1) return apex__fail(APEX_ERR_INVALID_ARG, "apex_amp_initialize: no model");
  if (n_opts < 0 || (n_opts > 0 && !opts)) return apex__fail(APEX_ERR_INVALID_ARG, "apex_amp_initialize: bad optimizer list");
  for (int m = 0; m < n_models; m++) {
    if (!models[m]) return apex__fail(APEX_ERR_INVALID_ARG, "apex_amp_initialize: model %d is NULL", m);
    for (int k = 0; k < m; k++)
      if (models[k] == models[m]) return apex__fail(APEX_ERR_INVALID_ARG, "apex_amp_initialize: model %d is given twice (also as %d)", m, k);
    pthread_mutex_lock(&registry_lock);
    int taken = registry_has(models[m]);
    pthread_mutex_unlock(&registry_lock);
    if (taken) return already_initialised(m);
    for (size_t i = 0; i < apex_model_num_params(models[m]); i++) {
      const char *name;
      apex_var *v = apex_model_param(models[m], i, &name);
      if (apex_tensor_dtype(apex_var_value(v)) != APEX_F32)
        return apex__fail(APEX_ERR_DTYPE, "apex_amp_initialize: parameter '%s' of model %d is %s; amp takes f32 models", name, m,
                          apex_dtype_name(apex_tensor_dtype(apex_var_value(v))));
    }
  }
  for (int o = 0; o < n_opts; o++) {
    if (!opts[o]) return apex__fail(APEX_ERR_INVALID_ARG, "apex_amp_initialize: optimizer %d is NULL", o);
    for (int k = 0; k < o; k++)
      if (opts[k] == opts[o]) return apex__fail(APEX_ERR_INVALID_ARG, "apex_amp_initialize: optimizer %d is given twice", o);
  }
  return APEX_OK;
}

apex_status apex_amp_initialize(apex_model *const *models, int n_models, apex_optimizer *const *opts, int n_opts,
                                const apex_amp_config *config, apex_amp **out) {
  if (!out) return apex__fail(APEX_ERR_INVALID_ARG, "apex_amp_initialize: NULL output");
  apex_amp_properties props;
  apex_status st = apex_amp_resolve(config, &props);
  if (st != APEX_OK) return st;
  if ((st = check_models(models, n_models, opts, n_opts)) != APEX_OK) return st;
  apex_amp *amp = calloc(1, sizeof *amp);
  if (!amp) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_amp_initialize: out of memory");
  amp->p = props;
  amp->id = fresh_id();
  amp->models = malloc((size_t)n_models * sizeof *amp->models);
  amp->opts = calloc((size_t)n_opts + 1, sizeof *amp->opts);
  amp->scalers = calloc((size_t)props.num_losses, sizeof *amp->scalers);
  if (!amp->models || !amp->opts || !amp->scalers) {
    free(amp->models);
    free(amp->opts);
    free(amp->scalers);
    free(amp);
    return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_amp_initialize: out of memory");
  }
  memcpy(amp->models, models, (size_t)n_models * sizeof *models);
  amp->n_opts = n_opts;
  int clash = registry_add(models, n_models); /* checked above; checked again here against a race */
  if (clash != -1) {
    amp->n_models = 0; /* not registered: nothing to remove */
    apex_amp_destroy(amp);
    if (clash == -2) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_amp_initialize: out of memory");
    return already_initialised(clash);
  }
  amp->n_models = n_models;
  for (int i = 0; i < props.num_losses; i++)
    if (!(amp->scalers[i] = apex_loss_scaler_create(&props.scaler))) st = APEX_ERR_OUT_OF_MEMORY;
  if (st == APEX_OK) st = map_optimizers(amp, opts);
  if (st == APEX_OK && props.enabled && props.cast_model) st = cast_models(amp);
  if (st == APEX_OK && props.enabled) st = attach_grads(amp);
  for (int o = 0; st == APEX_OK && props.enabled && props.combine_grad && o < amp->n_opts; o++) st = combine_grads(&amp->opts[o]);
  apex_device dev = APEX_DEVICE_CPU;
  if (st == APEX_OK) st = models_device(models, n_models, &dev);
  if (st == APEX_OK && props.enabled && dev != APEX_DEVICE_CPU) st = use_device_path(amp, dev);
  if (st != APEX_OK) {
    apex_amp_destroy(amp);
    return st;
  }
  if (props.enabled && props.verbosity >= 1) {
    char buf[1024];
    fputs(apex_amp_properties_format(&props, buf, sizeof buf), stderr);
  }
  *out = amp;
  return APEX_OK;
}

const apex_amp_properties *apex_amp_properties_of(const apex_amp *amp) {
  if (!amp) apex__fail_null_arg(__func__, "amp");
  return amp ? &amp->p : NULL;
}

/* ---- graphs and forward ------------------------------------------------------------------------- */

apex_status apex_amp_register_op(apex_amp *amp, apex_op op, apex_cast_category category) {
  if (!amp) return apex__fail(APEX_ERR_INVALID_ARG, "apex_amp_register_op: NULL amp");
  if ((int)op <= APEX_OP_CAST || op >= APEX_OP_COUNT || (int)category < 0 || category > APEX_CAST_PROMOTE)
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_amp_register_op: op %d or category %d is out of range", (int)op, (int)category);
  if (amp->n_regs == amp->cap_regs) {
    int cap = amp->cap_regs ? amp->cap_regs * 2 : 8;
    amp_reg *grown = realloc(amp->regs, (size_t)cap * sizeof *grown);
    if (!grown) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_amp_register_op: out of memory");
    amp->regs = grown;
    amp->cap_regs = cap;
  }
  amp->regs[amp->n_regs++] = (amp_reg){op, category};
  amp->id = fresh_id(); /* the graphs prepared so far lack this op: the next forward on each re-prepares it */
  return APEX_OK;
}

apex_status apex_amp_prepare_graph(apex_amp *amp, apex_graph *g) {
  if (!amp || !g) return apex__fail(APEX_ERR_INVALID_ARG, "apex_amp_prepare_graph: NULL argument");
  int on = amp->p.enabled && amp->p.patch_functions;
  apex_status st = apex_graph_set_autocast(g, on, amp->p.half_type);
  for (int i = 0; i < amp->n_regs && st == APEX_OK; i++) st = apex_graph_set_op_cast(g, amp->regs[i].op, amp->regs[i].category);
  if (st == APEX_OK) st = apex_graph_set_op_banned(g, APEX_OP_BCE, on && !amp->p.allow_banned);
  if (st == APEX_OK) st = apex_graph_set_config_tag(g, amp->id);
  return st;
}

/* Prepares g unless this configuration already did: once per graph, so that a region where the
 * caller turned casts off (apex_amp_casts_enabled) is left as it is. */
static apex_status ensure_prepared(apex_amp *amp, apex_graph *g) {
  return apex_graph_config_tag(g) == amp->id ? APEX_OK : apex_amp_prepare_graph(amp, g);
}

int apex_amp_casts_enabled(apex_amp *amp, apex_graph *g, int enabled) {
  if (!amp || !g || !amp->p.enabled || !amp->p.patch_functions) return 0;
  if (ensure_prepared(amp, g) != APEX_OK) return 0;
  int was = apex_graph_autocast_enabled(g);
  apex_graph_set_autocast(g, enabled, amp->p.half_type);
  return was;
}

static int is_float(apex_dtype t) { return t == APEX_F32 || t == APEX_F16 || t == APEX_BF16; }

apex_var *apex_amp_forward(apex_amp *amp, int model, apex_module *net, apex_graph *g, apex_var *x) {
  if (!amp || !net || !g || !x) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_amp_forward: NULL argument");
  if (model < 0 || model >= amp->n_models)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_amp_forward: model %d; amp manages %d", model, amp->n_models);
  if (ensure_prepared(amp, g) != APEX_OK) return NULL;
  if (!amp->p.enabled || !amp->p.cast_model) return apex_module_forward(net, g, x);
  apex_dtype in = apex_tensor_dtype(apex_var_value(x));
  apex_var *xc = x;
  if (is_float(in) && in != amp->p.cast_model_type && !(xc = apex_cast(g, x, amp->p.cast_model_type))) return NULL;
  apex_var *y = apex_module_forward(net, g, xc);
  /* The copies made here are nobody else's: release them, so each stays only while backward needs it. */
  if (xc != x && y != xc) apex_var_release(xc);
  if (y && apex_tensor_dtype(apex_var_value(y)) != amp->p.cast_model_outputs) {
    apex_var *yc = apex_cast(g, y, amp->p.cast_model_outputs);
    apex_var_release(y);
    y = yc;
  }
  return y;
}

/* ---- backward: scale, run, unscale + check ------------------------------------------------------- */

/* Gathers the lists of one optimizer's unscale launch: x the new (scaled) gradients, y what earlier
 * losses left (masters: the master gradients themselves; in place: the stash), out where the
 * unscaled sum goes. */
typedef struct {
  apex_tensor **x, **y, **out;
  int n;
} unscale_lists;

static apex_status lists_alloc(unscale_lists *l, int n) {
  l->x = calloc((size_t)n + 1, sizeof *l->x);
  l->y = calloc((size_t)n + 1, sizeof *l->y);
  l->out = calloc((size_t)n + 1, sizeof *l->out);
  l->n = 0;
  return l->x && l->y && l->out ? APEX_OK : apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_amp_backward: out of memory");
}

static void lists_free(unscale_lists *l) {
  free(l->x);
  free(l->y);
  free(l->out);
}

/* One optimizer's lists for both paths: fresh (no earlier loss: grad -> its destination) and accum
 * (grad + what earlier losses left -> the destination); parameters the leaf sink has done (fused) are
 * left out. */
static apex_status gather_lists(amp_opt *ao, unscale_lists *fresh, unscale_lists *accum) {
  apex_status st = lists_alloc(fresh, ao->n);
  if (st == APEX_OK) st = lists_alloc(accum, ao->n);
  for (int k = 0; k < ao->n && st == APEX_OK; k++) {
    amp_param *ap = &ao->params[k];
    apex_tensor *grad = apex_var_grad(ap->var), *dst = ap->master_grad ? ap->master_grad : grad;
    if (ap->fused) continue;
    if (!ao->dirty) {
      fresh->x[fresh->n] = grad;
      fresh->out[fresh->n++] = dst;
    } else {
      accum->x[accum->n] = grad;
      accum->y[accum->n] = ap->master_grad ? ap->master_grad : ap->stash;
      accum->out[accum->n++] = dst;
    }
  }
  return st;
}

/* After an unscale that returned st: the model gradients behind masters are zeroed, being consumed
 * (fused ones were by the sink), and the lists freed. */
static apex_status consumed(amp_opt *ao, apex_status st, unscale_lists *fresh, unscale_lists *accum) {
  for (int k = 0; k < ao->n && st == APEX_OK; k++)
    if (ao->params[k].master_grad && !ao->params[k].fused) st = apex_tensor_fill(apex_var_grad(ao->params[k].var), 0.0f);
  lists_free(fresh);
  lists_free(accum);
  return st;
}

/* Before a backward reaches gradients that already hold an earlier loss's unscaled values: in-place
 * gradients move to the stash (the backward must start from zero so that its result can be unscaled
 * alone); master gradients stay where they are and model gradients are already zero. */
static apex_status stash_grads(amp_opt *ao) {
  for (int k = 0; k < ao->n; k++) {
    amp_param *ap = &ao->params[k];
    if (ap->master_grad) continue;
    apex_tensor *grad = apex_var_grad(ap->var);
    if (!ap->stash && !(ap->stash = apex_tensor_create_on(apex_tensor_device(grad), APEX_F32, apex_tensor_ndim(grad), apex_tensor_shape(grad))))
      return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_amp_backward: out of memory for the gradient stash");
    apex_status st = apex_tensor_copy(ap->stash, grad);
    if (st == APEX_OK) st = apex_tensor_fill(grad, 0.0f);
    if (st != APEX_OK) return st;
  }
  return APEX_OK;
}

/* ---- the fused end of backward (O2 at bf16) ---------------------------------------------------- */

/* What the leaf sink needs from apex_amp_backward. */
typedef struct {
  amp_opt **sel;
  int n_sel;
  float inv_scale;
  int overflow;
} fuse_ctx;

/* An optimizer whose master gradients this backward overwrites (the first backward since zero_grad,
 * no scaled gradients waiting, no combine_grad buffers): the flush and the unscale may be one pass. */
static int fusable(const amp_opt *ao) { return !ao->scaled && !ao->dirty && !ao->n_flat; }

/* The leaf sink: for every bf16 model gradient behind an f32 master in a fusable optimizer, the
 * backward's f32 sum goes straight to the master, master = bf16(grad + sum) * inv_scale, in one
 * multi-tensor pass that also checks for Inf/NaN: the bits the engine's flush followed by the unscale
 * give, without writing the bf16 grad in between. The grad, which a clean iteration holds at zero,
 * is zeroed only where it was not, as the unscale would have. */
static apex_status fuse_sink(void *ctx, apex_graph *g) {
  (void)g;
  fuse_ctx *f = ctx;
  const char *fn = "apex_amp_backward";
  int cap = 0;
  for (int i = 0; i < f->n_sel; i++) cap += f->sel[i]->n;
  const apex_backend *be = NULL;
  for (int i = 0; i < f->n_sel && !be; i++)
    for (int k = 0; k < f->sel[i]->n && !be; k++)
      if (f->sel[i]->params[k].master_grad) be = apex__backend_need(apex_tensor_device(f->sel[i]->params[k].master_grad), fn);
  if (!be || !be->mt_flush_unscale || cap == 0) return APEX_OK; /* the engine flushes, unscale() follows */
  apex_tensor **grad = malloc((size_t)cap * sizeof *grad), **sum = malloc((size_t)cap * sizeof *sum),
              **out = malloc((size_t)cap * sizeof *out);
  unsigned char *nonzero = malloc((size_t)cap);
  if (!grad || !sum || !out || !nonzero) {
    free(grad), free(sum), free(out), free(nonzero);
    return APEX_OK; /* nothing taken: the unfused path still works */
  }
  int n = 0;
  for (int i = 0; i < f->n_sel; i++) {
    amp_opt *ao = f->sel[i];
    if (!fusable(ao)) continue;
    for (int k = 0; k < ao->n; k++) {
      amp_param *ap = &ao->params[k];
      apex_tensor *gr = apex_var_grad(ap->var);
      if (!ap->master_grad || apex_tensor_dtype(gr) != APEX_BF16) continue;
      apex_tensor *s = apex__leaf_take_sum(ap->var);
      if (!s) continue; /* not reached by this backward: unscale() writes its master */
      grad[n] = gr;
      sum[n] = s;
      out[n++] = ap->master_grad;
      ap->fused = 1;
    }
  }
  apex_status st = n ? be->mt_flush_unscale(&(apex_mt_flush_unscale_args){.fn = fn, .n = n, .grad = grad, .sum = sum, .out = out,
                                                                          .scale = f->inv_scale, .overflow = &f->overflow,
                                                                          .nonzero = nonzero})
                     : APEX_OK;
  for (int i = 0; i < n && st == APEX_OK; i++)
    if (nonzero[i]) st = apex_tensor_fill(grad[i], 0.0f);
  free(grad), free(sum), free(out), free(nonzero);
  return st;
}

/* Before (on) and after (off) a backward whose end the sink fuses: the bf16 leaves the sink will take
 * collect their f32 sums in their masters' gradients (apex__leaf_sum_into), which it then unscales in
 * place, so the graph's pool holds no f32 copy of them. The same leaves as fuse_sink's, chosen before the
 * backward by the same rule; one the sink leaves (no fused slot on the device) is flushed by the engine
 * from the master's buffer into its grad, and the unscale then writes the master from that grad. */
static void sum_into_masters(amp_opt **sel, int n_sel, int on) {
  for (int i = 0; i < n_sel; i++) {
    amp_opt *ao = sel[i];
    if (!fusable(ao)) continue;
    for (int k = 0; k < ao->n; k++) {
      amp_param *ap = &ao->params[k];
      if (ap->master_grad && apex_tensor_dtype(apex_var_grad(ap->var)) == APEX_BF16) apex__leaf_sum_into(ap->var, on ? ap->master_grad : NULL);
    }
  }
}

/* out = x * inv_scale with the Inf/NaN check, over n tensors. At scale 1 (bf16's default, a static 1.0)
 * a gradient unscaled in place needs only the check: x * 1 is x, so the pass reads and writes
 * nothing else (a widening into a master gradient still runs, as the plain conversion it is). */
static apex_status scale_grads(apex_tensor *const *x, apex_tensor *const *out, int n, float inv_scale, int *overflow) {
  if (inv_scale != 1.0f) return apex_mt_scale(0, overflow, x, out, n, inv_scale);
  apex_status st = APEX_OK;
  for (int i = 0; i < n && st == APEX_OK;) { /* runs of in-place and of widening tensors, in order */
    int j = i, in_place = x[i] == out[i];
    while (j < n && (x[j] == out[j]) == in_place) j++;
    int found = 0;
    st = in_place ? apex_mt_check_finite(x + i, j - i, &found) : apex_mt_scale(0, overflow, x + i, out + i, j - i, 1.0f);
    if (found) *overflow = 1;
    i = j;
  }
  return st;
}

/* grad * inv_scale (+ earlier values) into the optimizer's gradients, checking the new gradients for
 * Inf/NaN in the same pass; model gradients behind masters are zeroed once consumed. Parameters the
 * leaf sink has done (fused) are skipped. */
static apex_status unscale(amp_opt *ao, float inv_scale, int *overflow) {
  if (ao->n_flat && !ao->dirty) { /* combine_grad: the same elementwise pass over a few flat buffers */
    apex_status st = scale_grads(ao->flat_x, ao->flat_out, ao->n_flat, inv_scale, overflow);
    for (int f = 0; f < ao->n_flat && st == APEX_OK; f++)
      if (ao->flat_out[f] != ao->flat_x[f]) st = apex_tensor_fill(ao->flat_x[f], 0.0f);
    return st;
  }
  unscale_lists fresh = {0}, accum = {0};
  apex_status st = gather_lists(ao, &fresh, &accum);
  if (st == APEX_OK && fresh.n) st = scale_grads(fresh.x, fresh.out, fresh.n, inv_scale, overflow);
  if (st == APEX_OK && accum.n) st = apex_mt_axpby(0, overflow, accum.x, accum.y, accum.out, accum.n, inv_scale, 1.0f, 0);
  return consumed(ao, st, &fresh, &accum);
}

/* The optimizers a backward concerns: the listed ones (each must be amp's), or all. */
static apex_status select_opts(apex_amp *amp, const apex_amp_backward_options *o, amp_opt **sel, int *n) {
  *n = 0;
  if (!o || !o->optimizers) {
    for (int i = 0; i < amp->n_opts; i++) sel[(*n)++] = &amp->opts[i];
    return APEX_OK;
  }
  for (int k = 0; k < o->n_optimizers; k++) {
    int found = -1;
    for (int i = 0; i < amp->n_opts; i++)
      if (amp->opts[i].opt == o->optimizers[k]) found = i;
    if (found < 0) return apex__fail(APEX_ERR_INVALID_ARG, "apex_amp_backward: optimizer %d of the list is not managed by this amp", k);
    sel[(*n)++] = &amp->opts[found];
  }
  return APEX_OK;
}

/* Records a loss's overflow in its scaler and marks the optimizers' next step skipped. */
static apex_status record_overflow(apex_amp *amp, int loss_id, int overflow, amp_opt **sel, int n_sel) {
  int skip = 0;
  apex_status st = apex_loss_scaler_update(amp->scalers[loss_id], overflow, &skip);
  if (!skip) return st;
  for (int i = 0; i < n_sel; i++) sel[i]->skip = 1;
  if (amp->p.verbosity >= 1) {
    if (amp->p.scaler.mode == APEX_SCALE_DYNAMIC)
      fprintf(stderr, "Gradient overflow.  Skipping step, loss scaler %d reducing loss scale to %.1f\n", loss_id,
              (double)apex_loss_scaler_scale(amp->scalers[loss_id]));
    else
      fprintf(stderr, "Gradient overflow.  Skipping step (static loss scale %.1f)\n", (double)apex_loss_scaler_scale(amp->scalers[loss_id]));
  }
  return st;
}

/* ---- the device path: backward and step without waiting ------------------------------------------- */

/* The unscale of one optimizer's new gradients on the device: x / scale into the optimizer's gradients,
 * reading the scale and raising found_inf where the scaler's state is (the host path's unscale, with the
 * scale never brought to the host). Earlier values (another loss, accumulation) are added after the new
 * gradients were unscaled in place. */
static apex_status unscale_on_device(amp_opt *ao, apex_loss_scaler *sc) {
  if (ao->n_flat && !ao->dirty) {
    apex_status st = apex_loss_scaler_unscale(sc, ao->flat_x, ao->flat_out, ao->n_flat);
    for (int f = 0; f < ao->n_flat && st == APEX_OK; f++)
      if (ao->flat_out[f] != ao->flat_x[f]) st = apex_tensor_fill(ao->flat_x[f], 0.0f);
    return st;
  }
  unscale_lists fresh = {0}, accum = {0};
  apex_status st = gather_lists(ao, &fresh, &accum);
  if (st == APEX_OK && fresh.n) st = apex_loss_scaler_unscale(sc, fresh.x, fresh.out, fresh.n);
  if (st == APEX_OK && accum.n) st = apex_loss_scaler_unscale(sc, accum.x, accum.x, accum.n);
  if (st == APEX_OK && accum.n) st = apex_mt_axpby(0, NULL, accum.x, accum.y, accum.out, accum.n, 1.0f, 1.0f, 0);
  return consumed(ao, st, &fresh, &accum);
}

/* apex_amp_backward on the device path (the contract is amp.h's, with the differences it states: a
 * non-finite loss raises found_inf where the loss is, so the backward returns APEX_OK and the step is
 * skipped, and no overflow line is printed, since knowing it would wait). */
static apex_status backward_on_device(apex_amp *amp, apex_var *loss, int loss_id, const apex_amp_backward_options *opts,
                                      amp_opt **sel, int n_sel) {
  apex_loss_scaler *sc = amp->scalers[loss_id];
  int delay = opts && opts->delay_unscale;
  apex_status (*before_unscale)(void *) = opts ? opts->before_unscale : NULL;
  apex_status (*reduce_overflow)(void *, int *) = opts ? opts->reduce_overflow : NULL;
  void *hctx = opts ? opts->hook_ctx : NULL;
  apex_backward_options bo = {.retain_graph = opts ? opts->retain_graph : 0};
  /* an Inf/NaN loss counts as an overflow, found where the loss is */
  apex_tensor *lv = apex_var_value(loss);
  apex_status st = apex_loss_scaler_check(sc, &lv, 1);
  for (int i = 0; i < n_sel && st == APEX_OK; i++)
    if (!sel[i]->scaled && sel[i]->dirty) st = stash_grads(sel[i]);
  /* d(loss * scale) = scale * d(loss): the seed is 1 times the device scale */
  apex_tensor *seed = NULL;
  if (st == APEX_OK && !(seed = apex_tensor_create_on(apex_tensor_device(lv), APEX_F32, 0, NULL))) st = apex_last_status();
  if (st == APEX_OK) st = apex_tensor_fill(seed, 1.0f);
  if (st == APEX_OK) st = apex_loss_scaler_scale_tensor(sc, seed);
  bo.grad_output = seed;
  int ran = st == APEX_OK;
  if (ran) st = apex_backward(loss, &bo);
  apex_tensor_destroy(seed);
  if (ran && before_unscale) {
    apex_status hs = before_unscale(hctx);
    if (st == APEX_OK) st = hs;
  }
  for (int i = 0; i < n_sel && st == APEX_OK; i++) {
    if (delay) {
      sel[i]->scaled = 1;
      continue;
    }
    st = unscale_on_device(sel[i], sc);
    sel[i]->scaled = 0;
    sel[i]->dirty = 1;
  }
  int overflow = 0;
  if (ran && reduce_overflow && !delay && st == APEX_OK) {
    /* the ranks agree on the flag through the host: this is the one wait of such a step */
    int32_t h = 0;
    st = amp->be->mem->copy(&h, apex_loss_scaler_found_inf_ptr(sc), sizeof h, APEX_COPY_D2H, 1);
    overflow = h != 0;
    apex_status hs = reduce_overflow(hctx, &overflow);
    if (st == APEX_OK) st = hs;
  }
  if (st == APEX_OK && !delay) {
    uint64_t mask = 0;
    for (int i = 0; i < n_sel; i++) mask |= (uint64_t)1 << (sel[i] - amp->opts);
    st = apex__loss_scaler_update_raise(sc, overflow, amp->d_skip, mask);
  }
  if (ran && st != APEX_OK)
    for (int i = 0; i < n_sel; i++) sel[i]->failed = 1;
  return st;
}

/* apex_amp_step on the device path: the kernels read the optimizer's skip flag where it is, which is then
 * cleared there; *skipped, when asked for, is read from the device (the one wait). */
static apex_status step_on_device(apex_amp *amp, amp_opt *ao, int *skipped) {
  int32_t *flag = amp->d_skip + (ao - amp->opts);
  apex_status st = apex__optimizer_step_skip_at(ao->opt, (const int *)flag, "apex_amp_step");
  ao->skip = 0;
  if (st == APEX_OK && skipped) {
    int32_t h = 0;
    st = amp->be->mem->copy(&h, flag, sizeof h, APEX_COPY_D2H, 1);
    *skipped = h != 0;
  }
  if (st == APEX_OK) st = amp->be->mem->fill(flag, APEX_F32, 0.0f, 1);
  return st;
}

static apex_status amp_backward(apex_amp *amp, apex_var *loss, int loss_id, const apex_amp_backward_options *opts);

/* The backward with the graph's half gradients as the properties say (by default on for a graph on a GPU,
 * off on the CPU), for this backward only: the graph's own setting is back afterwards. */
apex_status apex_amp_backward(apex_amp *amp, apex_var *loss, int loss_id, const apex_amp_backward_options *opts) {
  apex_graph *lg = amp && loss && amp->p.enabled ? apex_var_graph(loss) : NULL;
  if (!lg) return amp_backward(amp, loss, loss_id, opts);
  int was = apex_graph_half_grads(lg);
  int on = amp->p.half_grads == APEX_AMP_ON || (amp->p.half_grads == APEX_AMP_DEFAULT && apex_graph_device(lg) != APEX_DEVICE_CPU);
  apex_graph_set_half_grads(lg, on);
  apex_status st = amp_backward(amp, loss, loss_id, opts);
  apex_graph_set_half_grads(lg, was);
  return st;
}

static apex_status amp_backward(apex_amp *amp, apex_var *loss, int loss_id, const apex_amp_backward_options *opts) {
  if (!amp || !loss) return apex__fail(APEX_ERR_INVALID_ARG, "apex_amp_backward: NULL amp or loss");
  if (loss_id < 0 || loss_id >= amp->p.num_losses)
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_amp_backward: loss_id %d; amp was initialised with num_losses = %d", loss_id,
                      amp->p.num_losses);
  apex_graph *lg = apex_var_graph(loss);
  if (lg && amp->p.enabled && amp->p.patch_functions && apex_graph_config_tag(lg) != amp->id)
    return apex__fail(APEX_ERR_STATE, "apex_amp_backward: the loss's graph was not prepared by this amp (or not since "
                                      "apex_amp_register_op), so its forward ran without O1's autocast policy; run the model "
                                      "through apex_amp_forward, or call apex_amp_prepare_graph(amp, g) before the forward");
  apex_backward_options bo = {.retain_graph = opts ? opts->retain_graph : 0};
  apex_status (*before_unscale)(void *) = opts ? opts->before_unscale : NULL;
  apex_status (*reduce_overflow)(void *, int *) = opts ? opts->reduce_overflow : NULL;
  void *hctx = opts ? opts->hook_ctx : NULL;
  if (!amp->p.enabled) {
    apex_status st = apex_backward(loss, &bo);
    apex_status hs = before_unscale ? before_unscale(hctx) : APEX_OK;
    return st != APEX_OK ? st : hs;
  }
  amp_opt *sel[64], **selp = sel;
  if (amp->n_opts > 64 && !(selp = malloc((size_t)amp->n_opts * sizeof *selp)))
    return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_amp_backward: out of memory");
  int n_sel = 0;
  apex_status st = select_opts(amp, opts, selp, &n_sel);
  if (amp->on_device) {
    if (st == APEX_OK) st = backward_on_device(amp, loss, loss_id, opts, selp, n_sel);
    if (selp != sel) free(selp);
    return st;
  }
  float scale = apex_loss_scaler_scale(amp->scalers[loss_id]);
  if (st == APEX_OK && !isfinite(apex_var_item(loss))) {
    /* Nothing to run backward through: treat as an overflow (back off, skip) and say so. The other
     * ranks of a data-parallel run still reduce: take part with this rank's gradients and flag. */
    int flag = 1;
    if (before_unscale) before_unscale(hctx);
    if (reduce_overflow) reduce_overflow(hctx, &flag);
    record_overflow(amp, loss_id, 1, selp, n_sel);
    st = apex__fail(APEX_ERR_NONFINITE, "apex_amp_backward: loss %d is %g before scaling; the step will be skipped", loss_id,
                    (double)apex_var_item(loss));
  }
  for (int i = 0; i < n_sel && st == APEX_OK; i++)
    if (!selp[i]->scaled && selp[i]->dirty) st = stash_grads(selp[i]);
  apex_tensor *seed = NULL;
  if (st == APEX_OK) {
    /* d(loss * scale) = scale * d(loss): seed backward with the scale instead of scaling the loss. */
    seed = apex_tensor_create_on(apex_graph_device(apex_var_graph(loss)), APEX_F32, 0, NULL); /* where the loss's gradient is */
    if (!seed) st = APEX_ERR_OUT_OF_MEMORY;
    else apex_tensor_fill(seed, scale);
    bo.grad_output = seed;
  }
  int ran = st == APEX_OK;
  /* One pass instead of flush, unscale and zeroing, where nothing must see the bf16 gradients between
   * the backward and the unscale: no before_unscale hook (DDP reduces them) and no delay_unscale. */
  fuse_ctx fc = {selp, n_sel, 1.0f / scale, 0};
  int fuse = st == APEX_OK && lg && !before_unscale && !(opts && opts->delay_unscale);
  if (fuse) apex__graph_set_leaf_sink(lg, fuse_sink, &fc), sum_into_masters(selp, n_sel, 1);
  if (st == APEX_OK) st = apex_backward(loss, &bo);
  if (fuse) apex__graph_set_leaf_sink(lg, NULL, NULL), sum_into_masters(selp, n_sel, 0);
  apex_tensor_destroy(seed);
  if (ran && before_unscale) {
    apex_status hs = before_unscale(hctx);
    if (st == APEX_OK) st = hs;
  }
  int overflow = fc.overflow;
  for (int i = 0; i < n_sel && st == APEX_OK; i++) {
    if (opts && opts->delay_unscale) {
      selp[i]->scaled = 1;
      continue;
    }
    st = unscale(selp[i], 1.0f / scale, &overflow);
    selp[i]->scaled = 0;
    selp[i]->dirty = 1;
  }
  for (int i = 0; i < n_sel; i++)
    for (int k = 0; k < selp[i]->n; k++) selp[i]->params[k].fused = 0;
  if (ran && reduce_overflow && !(opts && opts->delay_unscale)) {
    apex_status hs = reduce_overflow(hctx, &overflow);
    if (st == APEX_OK) st = hs;
  }
  if (st == APEX_OK && !(opts && opts->delay_unscale)) st = record_overflow(amp, loss_id, overflow, selp, n_sel);
  /* A backward that failed once it ran leaves gradients half made: the step must not use them. */
  if (ran && st != APEX_OK)
    for (int i = 0; i < n_sel; i++) selp[i]->failed = 1;
  if (selp != sel) free(selp);
  return st;
}

/* ---- step, zero_grad, masters, clipping ------------------------------------------------------------ */

static amp_opt *find_opt(apex_amp *amp, const apex_optimizer *opt) {
  for (int i = 0; amp && i < amp->n_opts; i++)
    if (amp->opts[i].opt == opt) return &amp->opts[i];
  return NULL;
}

apex_status apex_amp_step(apex_amp *amp, apex_optimizer *opt, int *skipped) {
  if (skipped) *skipped = 0;
  if (!amp || !opt) return apex__fail(APEX_ERR_INVALID_ARG, "apex_amp_step: NULL argument");
  amp_opt *ao = find_opt(amp, opt);
  if (!ao) return apex__fail(APEX_ERR_INVALID_ARG, "apex_amp_step: the optimizer is not managed by this amp");
  if (!amp->p.enabled) return apex_optimizer_step(opt, 1.0f, 0);
  if (ao->scaled)
    return apex__fail(APEX_ERR_STATE, "apex_amp_step: the gradients are still scaled: the last apex_amp_backward used delay_unscale; "
                                      "run the last micro-batch's backward without it");
  if (ao->failed)
    return apex__fail(APEX_ERR_STATE, "apex_amp_step: an apex_amp_backward since the last apex_amp_zero_grad failed, so the "
                                      "gradients are incomplete; call apex_amp_zero_grad and run the iteration again");
  if (amp->on_device) return step_on_device(amp, ao, skipped);
  int skip = ao->skip;
  ao->skip = 0;
  if (skipped) *skipped = skip;
  return apex_optimizer_step(opt, 1.0f, skip);
}

apex_status apex_amp_zero_grad(apex_amp *amp) {
  if (!amp) return apex__fail(APEX_ERR_INVALID_ARG, "apex_amp_zero_grad: NULL amp");
  for (int m = 0; m < amp->n_models; m++) {
    apex_status st = apex_model_zero_grad(amp->models[m]);
    if (st != APEX_OK) return st;
  }
  for (int o = 0; o < amp->n_opts; o++) {
    amp_opt *ao = &amp->opts[o];
    for (int k = 0; k < ao->n; k++)
      if (ao->params[k].master_grad) apex_tensor_fill(ao->params[k].master_grad, 0.0f);
    ao->skip = ao->scaled = ao->dirty = ao->failed = 0;
  }
  if (amp->on_device) return amp->be->mem->fill(amp->d_skip, APEX_F32, 0.0f, (size_t)amp->n_opts); /* 0.0f's bits are int 0 */
  return APEX_OK;
}

apex_loss_scaler *apex_amp_loss_scaler(const apex_amp *amp, int loss_id) {
  if (!amp || loss_id < 0 || loss_id >= amp->p.num_losses)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_amp_loss_scaler: no loss scaler %d%s", loss_id, amp ? "" : " (NULL amp)");
  return amp->scalers[loss_id];
}

int apex_amp_scale_at_min(const apex_amp *amp, int loss_id) {
  if (!amp || loss_id < 0 || loss_id >= amp->p.num_losses) {
    apex__fail(APEX_ERR_INVALID_ARG, "apex_amp_scale_at_min: no loss scaler %d", loss_id);
    return 0;
  }
  return amp->p.enabled && apex_loss_scaler_at_min(amp->scalers[loss_id]);
}

float apex_amp_loss_scale(const apex_amp *amp, int loss_id) {
  if (!amp || loss_id < 0 || loss_id >= amp->p.num_losses) {
    apex__fail(APEX_ERR_INVALID_ARG, "apex_amp_loss_scale: no loss scaler %d%s", loss_id, amp ? "" : " (NULL amp)");
    return NAN;
  }
  return amp->p.enabled ? apex_loss_scaler_scale(amp->scalers[loss_id]) : 1.0f;
}

apex_tensor *apex_amp_master_param(const apex_amp *amp, apex_optimizer *opt, int group, int i) {
  if (!amp || !find_opt((apex_amp *)amp, opt)) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_amp_master_param: unknown optimizer");
  return apex_optimizer_master(opt, group, i);
}

apex_tensor *apex_amp_master_of(const apex_amp *amp, const apex_var *param) {
  if (!amp || !param) apex__fail_null_arg(__func__, amp ? "param" : "amp");
  for (int o = 0; amp && param && o < amp->n_opts; o++)
    for (int k = 0; k < amp->opts[o].n; k++) {
      const amp_param *ap = &amp->opts[o].params[k];
      if (ap->var != param) continue;
      apex_tensor *m = apex_optimizer_master(amp->opts[o].opt, ap->group, ap->index);
      return m && m != apex_var_value(param) ? m : NULL; /* the optimizer updates the parameter itself */
    }
  return NULL;
}

apex_status apex_amp_clip_grad_norm(apex_amp *amp, apex_optimizer *opt, float max_norm, float *total_norm) {
  if (!amp || !find_opt(amp, opt)) return apex__fail(APEX_ERR_INVALID_ARG, "apex_amp_clip_grad_norm: unknown optimizer");
  return apex_optimizer_clip_grad_norm(opt, max_norm, 1.0f, total_norm);
}

/* ---- state ------------------------------------------------------------------------------------------ */

/* Layout: u32 number of losses, then each scaler's APEX_LOSS_SCALER_STATE_BYTES. */
size_t apex_amp_state_size(const apex_amp *amp) {
  if (!amp) apex__fail_null_arg(__func__, "amp");
  return amp ? 4 + (size_t)amp->p.num_losses * APEX_LOSS_SCALER_STATE_BYTES : 0;
}

apex_status apex_amp_state_save(const apex_amp *amp, uint8_t *buf, size_t size) {
  if (!amp || !buf) return apex__fail(APEX_ERR_INVALID_ARG, "apex_amp_state_save: NULL argument");
  if (size < apex_amp_state_size(amp))
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_amp_state_save: %zu bytes; the state needs %zu", size, apex_amp_state_size(amp));
  uint32_t n = (uint32_t)amp->p.num_losses;
  for (int i = 0; i < 4; i++) buf[i] = (uint8_t)(n >> (8 * i));
  for (int i = 0; i < amp->p.num_losses; i++) {
    apex_status st = apex_loss_scaler_save(amp->scalers[i], buf + 4 + (size_t)i * APEX_LOSS_SCALER_STATE_BYTES, APEX_LOSS_SCALER_STATE_BYTES);
    if (st != APEX_OK) return st;
  }
  return APEX_OK;
}

apex_status apex_amp_state_load(apex_amp *amp, const uint8_t *buf, size_t size) {
  if (!amp || !buf) return apex__fail(APEX_ERR_INVALID_ARG, "apex_amp_state_load: NULL argument");
  if (size != apex_amp_state_size(amp))
    return apex__fail(APEX_ERR_CORRUPT, "apex_amp_state_load: %zu bytes; amp with %d losses has %zu", size, amp->p.num_losses,
                      apex_amp_state_size(amp));
  uint32_t n = 0;
  for (int i = 0; i < 4; i++) n |= (uint32_t)buf[i] << (8 * i);
  if (n != (uint32_t)amp->p.num_losses)
    return apex__fail(APEX_ERR_STATE, "apex_amp_state_load: the state has %u loss scalers; this amp has %d", n, amp->p.num_losses);
  /* Check every scaler into scratch copies first, so that a bad one changes nothing. */
  apex_loss_scaler_state *saved = malloc((size_t)n * sizeof *saved);
  if (!saved) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_amp_state_load: out of memory");
  for (uint32_t i = 0; i < n; i++) saved[i] = apex_loss_scaler_get_state(amp->scalers[i]);
  apex_status st = APEX_OK;
  for (uint32_t i = 0; i < n && st == APEX_OK; i++)
    st = apex_loss_scaler_load(amp->scalers[i], buf + 4 + (size_t)i * APEX_LOSS_SCALER_STATE_BYTES, APEX_LOSS_SCALER_STATE_BYTES);
  if (st != APEX_OK)
    for (uint32_t i = 0; i < n; i++) apex_loss_scaler_set_state(amp->scalers[i], &saved[i]);
  free(saved);
  return st;
}
