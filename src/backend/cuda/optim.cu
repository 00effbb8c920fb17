/* optim.cu: the fused optimizer step on the GPU, one kernel for the elementwise kinds (SGD, Adam, AdamW,
 * Adadelta, Adagrad, RMSprop, RMSpropTF); LAMB, NovoGrad and AdamP, which need per-tensor norms or
 * sums between passes, are in lamb.cu, novograd.cu and adamp.cu.
 *
 * Each element's update is the CPU kernel's: SGD, Adam/AdamW, Adadelta, Adagrad and RMSprop/RMSpropTF
 * call the rules of backend/optim_rules.h that backend/cpu/optim_<kind>.c calls. The CUDA files are
 * compiled without contracting multiplies and adds into FMAs (-fmad=false), so
 * with the same inputs the GPU computes the CPU's bits: the parity test checks that. Per-tensor
 * coefficients (bias corrections, Adagrad's decayed lr, SGD's first-step momentum) are computed by
 * one thread per chunk from the step count, which lives on the device: a step skipped because the
 * device flag said overflow leaves the count, like everything else, unchanged, and nobody waits.
 *
 * The walk is mt_ilp.cuh's (four elements per thread, vectors where aligned): the update itself is
 * step_elem, one element in registers, whichever path loaded it, so every path gives the same bits.
 *
 * Lists: 0 gradient, 1 what is updated (f32 master or the parameter), 2 the f16/bf16 model copy
 * (NULL: none), 3..5 state, 6 the step count (int64, dtype ignored). */
#include <cuda_runtime.h>
#include <math.h>

extern "C" {
#include "core/internal.h"
#include "backend/cuda/cuda_internal.h"
}
#include "backend/cuda/mt_ilp.cuh"
#include "backend/cuda/optim_dev.cuh"
#include "backend/optim_rules.h"

struct OptParams {
  apex_optim_kind kind;
  float lr, beta1, beta2, eps, wd, momentum, dampening, alpha, rho, lr_decay;
  int amsgrad, adam_w, bias_correction, nesterov, wd_after, adagrad_w, centered, decoupled, lr_in_momentum, tf;
  int has_buf;
  int nstates; /* state lists 3..3+nstates that exist: exactly those the kind reads and writes */
};

enum { C_INV, C_A, C_B, C_LR }; /* C_LR: the learning rate, o.lr or the device's copy (d_lr) */

/* One element's update: g the gradient, p the value updated, s0..s2 the states (list 3..5) in and out.
 * The operations and their order are the CPU kernels'; do not reassociate. RMSprop's states are the
 * square average (s0), then the momentum buffer when there is one (s1), then the gradient average. */
__device__ __forceinline__ float step_elem(const OptParams &o, const float (&coef)[MT_COEFS], float g, float p,
                                           float &s0, float &s1, float &s2) {
  const float inv = coef[C_INV], lr = coef[C_LR];
  switch (o.kind) {
    case APEX_OPTIM_SGD: {
      float wb = o.wd_after ? 0.0f : o.wd, wa = o.wd_after ? o.wd : 0.0f;
      return apex__sgd_rule(g, p, &s0, o.momentum != 0.0f, inv, wb, wa, coef[C_A], coef[C_B], o.nesterov ? 1.0f : 0.0f,
                            o.nesterov ? o.momentum : 1.0f, lr);
    }
    case APEX_OPTIM_ADAM:
    case APEX_OPTIM_ADAMW: {
      float l2 = o.adam_w ? 0.0f : o.wd, decay = o.adam_w ? 1.0f - lr * o.wd : 1.0f;
      float d = apex__adam_moments(g, p, &s0, &s1, inv, l2, o.beta1, 1.0f - o.beta1, o.beta2, 1.0f - o.beta2);
      if (o.amsgrad) d = apex__adam_amsgrad(&s2, d);
      return apex__adam_apply(p, s0, sqrtf(d), decay, coef[C_A], coef[C_B], o.eps);
    }
    case APEX_OPTIM_ADADELTA: {
      float nrho = 1.0f - o.rho;
      float gi = apex__adadelta_accum(g, p, &s0, inv, o.wd, o.rho, nrho);
      return apex__adadelta_apply(p, gi, sqrtf(s1 + o.eps), sqrtf(s0 + o.eps), &s1, o.rho, nrho, lr);
    }
    case APEX_OPTIM_ADAGRAD: {
      float l2 = o.adagrad_w ? 0.0f : o.wd, ww = o.adagrad_w ? o.wd : 0.0f;
      float gi = apex__adagrad_accum(g, p, &s0, inv, l2);
      return apex__adagrad_apply(p, gi, sqrtf(s0), coef[C_A], o.eps, ww);
    }
    case APEX_OPTIM_RMSPROP:
    case APEX_OPTIM_RMSPROP_TF: {
      float a = o.alpha, na = 1.0f - o.alpha;
      float l2 = o.decoupled ? 0.0f : o.wd, decay = o.decoupled ? 1.0f - lr * o.wd : 1.0f;
      float gi;
      float d = apex__rmsprop_square(g, p, &s0, &gi, inv, l2, a, na, o.tf);
      if (o.centered) d = apex__rmsprop_center(d, gi, o.has_buf ? &s2 : &s1, a, na, o.tf);
      float root = sqrtf(d + (o.tf ? o.eps : 0.0f)), eps_out = o.tf ? 0.0f : o.eps;
      if (o.has_buf)
        return apex__rmsprop_apply_buf(p, gi, root, &s1, eps_out, decay, o.momentum, o.lr_in_momentum ? lr : 1.0f,
                                       o.lr_in_momentum ? 1.0f : lr);
      return apex__rmsprop_apply(p, gi, root, eps_out, decay, lr);
    }
    default: /* refused on the host */
      return p;
  }
}

/* The step over lists 0..5 (mt_ilp.cuh), with the gradient's dtype G, the updated value's P and the model
 * copy's M fixed at compile time for the common mixes (MT_DYN: the table's, per tensor). States are f32. */
template <int G, int P, int M>
struct StepOp {
  static constexpr bool vec = G != MT_DYN && P != MT_DYN && M != MT_DYN;
  OptParams o;
  float inv_scale;
  const float *d_scale;
  const int *d_skip;
  const float *d_lr;

  __device__ bool begin(const MtTable &t, int k, int64_t, float *coef) const {
    if (d_skip && *d_skip) return false;
    coef[C_INV] = d_scale ? inv_scale / *d_scale : inv_scale;
    const float lr = d_lr ? *d_lr : o.lr;
    coef[C_LR] = lr;
    int64_t step = *(const int64_t *)t.ptr[6][k] + 1;
    switch (o.kind) {
      case APEX_OPTIM_SGD: /* keep, take */
        coef[C_A] = step == 1 ? 0.0f : o.momentum;
        coef[C_B] = step == 1 ? 1.0f : 1.0f - o.dampening;
        break;
      case APEX_OPTIM_ADAM:
      case APEX_OPTIM_ADAMW: {
        double bc1 = o.bias_correction ? 1.0 - pow((double)o.beta1, (double)step) : 1.0;
        double bc2 = o.bias_correction ? 1.0 - pow((double)o.beta2, (double)step) : 1.0;
        coef[C_A] = (float)((double)lr / bc1);
        coef[C_B] = (float)(1.0 / sqrt(bc2));
        break;
      }
      case APEX_OPTIM_ADAGRAD:
        coef[C_A] = (float)((double)lr / (1.0 + (double)(step - 1) * (double)o.lr_decay));
        break;
      default:
        break;
    }
    return true;
  }

  __device__ bool aligned(const MtTable &t, int k) const {
    bool ok = mt_aligned<G>(t.ptr[0][k]) && mt_aligned<P>(t.ptr[1][k]);
    if constexpr (M != MT_NONE) ok = ok && mt_aligned<M>(t.ptr[2][k]);
    for (int l = 0; l < o.nstates; l++) ok = ok && mt_aligned<APEX_F32>(t.ptr[3 + l][k]);
    return ok;
  }

  template <bool VEC>
  __device__ void apply(const MtTable &t, int k, int64_t i0, int64_t stride, int64_t end,
                        const float (&coef)[MT_COEFS]) const {
    /* Lanes past end are computed on these zeros and never stored. */
    float g[MT_ILP] = {}, p[MT_ILP] = {}, s0[MT_ILP] = {}, s1[MT_ILP] = {}, s2[MT_ILP] = {};
    mt_load<G, VEC>(t.ptr[0][k], t.dtype[0][k], i0, stride, end, g);
    mt_load<P, VEC>(t.ptr[1][k], t.dtype[1][k], i0, stride, end, p);
    /* Only the states that exist: lists past nstates alias the parameters. */
    if (o.nstates > 0) mt_load<APEX_F32, VEC>(t.ptr[3][k], APEX_F32, i0, stride, end, s0);
    if (o.nstates > 1) mt_load<APEX_F32, VEC>(t.ptr[4][k], APEX_F32, i0, stride, end, s1);
    if (o.nstates > 2) mt_load<APEX_F32, VEC>(t.ptr[5][k], APEX_F32, i0, stride, end, s2);
#pragma unroll
    for (int j = 0; j < MT_ILP; j++) p[j] = step_elem(o, coef, g[j], p[j], s0[j], s1[j], s2[j]);
    if (o.nstates > 0) mt_store<APEX_F32, VEC>(t.ptr[3][k], APEX_F32, i0, stride, end, s0);
    if (o.nstates > 1) mt_store<APEX_F32, VEC>(t.ptr[4][k], APEX_F32, i0, stride, end, s1);
    if (o.nstates > 2) mt_store<APEX_F32, VEC>(t.ptr[5][k], APEX_F32, i0, stride, end, s2);
    mt_store<P, VEC>(t.ptr[1][k], t.dtype[1][k], i0, stride, end, p);
    /* The model copy from the same registers, in the same pass. */
    if constexpr (M == MT_DYN) {
      if (t.ptr[2][k]) mt_store<M, VEC>(t.ptr[2][k], t.dtype[2][k], i0, stride, end, p);
    } else if constexpr (M != MT_NONE) {
      mt_store<M, VEC>(t.ptr[2][k], t.dtype[2][k], i0, stride, end, p);
    }
  }
};

/* The dtype every entry of l has (MT_DYN when they differ); model lists: MT_NONE when every entry is NULL. */
static int list_dtype(const apex__cuda_list *l, int model) {
  int d = MT_DYN;
  for (int i = 0; i < l->n; i++) {
    int di = model && !l->ptr[i] ? MT_NONE : (int)l->dtype[i];
    if (i > 0 && di != d) return MT_DYN;
    d = di;
  }
  return d;
}

typedef cudaError_t (*step_launch_fn)(const apex__cuda_list *const *lists, const StepOp<MT_DYN, MT_DYN, MT_DYN> &base);

template <int G, int M>
static cudaError_t step_launch(const apex__cuda_list *const *lists, const StepOp<MT_DYN, MT_DYN, MT_DYN> &base) {
  StepOp<G, APEX_F32, M> op;
  op.o = base.o;
  op.inv_scale = base.inv_scale;
  op.d_scale = base.d_scale;
  op.d_skip = base.d_skip;
  op.d_lr = base.d_lr;
  return mt_apply_ilp(MT_LISTS, lists, op);
}

/* Compiled for f32 updated values (f32 parameters, or the f32 masters of f16/bf16 ones) with one gradient
 * dtype and one model copy dtype (or none) across the group: every mix apex_amp makes. Any other group
 * (dtypes mixed within it, f16/bf16 parameters without masters) runs the run-time-dtype instance, scalar
 * loads only. Indexed [gradient dtype][model copy: none, f16, bf16]. */
static const step_launch_fn step_launches[3][3] = {
    {step_launch<APEX_F32, MT_NONE>, step_launch<APEX_F32, APEX_F16>, step_launch<APEX_F32, APEX_BF16>},
    {step_launch<APEX_F16, MT_NONE>, step_launch<APEX_F16, APEX_F16>, step_launch<APEX_F16, APEX_BF16>},
    {step_launch<APEX_BF16, MT_NONE>, step_launch<APEX_BF16, APEX_F16>, step_launch<APEX_BF16, APEX_BF16>},
};

static cudaError_t step_dispatch(const apex__cuda_step *s, const apex__cuda_list *const *lists,
                                 const StepOp<MT_DYN, MT_DYN, MT_DYN> &base) {
  int g = list_dtype(&s->g, 0), p = list_dtype(&s->p, 0), m = list_dtype(&s->model, 1);
  int mi = m == MT_NONE ? 0 : m == APEX_F16 ? 1 : m == APEX_BF16 ? 2 : -1;
  if (p == APEX_F32 && g >= APEX_F32 && g <= APEX_BF16 && mi >= 0) return step_launches[g][mi](lists, base);
  return mt_apply_ilp(MT_LISTS, lists, base);
}

static int on(apex_optim_flag f) { return f == APEX_OPTIM_ON; }

extern "C" apex_status apex__cuda_optim_step(const apex__cuda_step *s) {
  /* Per-tensor norms between passes: their own files. */
  if (s->kind == APEX_OPTIM_LAMB) return apex__cuda_lamb_step(s);
  if (s->kind == APEX_OPTIM_NOVOGRAD) return apex__cuda_novograd_step(s);
  if (s->kind == APEX_OPTIM_ADAMP) return apex__cuda_adamp_step(s);
  const apex_optim_options *o = s->o;
  OptParams q = {};
  q.kind = s->kind;
  q.lr = o->lr;
  q.beta1 = o->beta1;
  q.beta2 = o->beta2;
  q.eps = o->eps;
  q.wd = o->weight_decay;
  q.momentum = o->momentum;
  q.dampening = o->dampening;
  q.alpha = o->alpha;
  q.rho = o->rho;
  q.lr_decay = o->lr_decay;
  q.amsgrad = on(o->amsgrad);
  q.adam_w = on(o->adam_w_mode);
  q.bias_correction = on(o->bias_correction);
  q.nesterov = on(o->nesterov);
  q.wd_after = on(o->wd_after_momentum);
  q.adagrad_w = on(o->adagrad_w_mode);
  q.centered = on(o->centered);
  q.tf = s->kind == APEX_OPTIM_RMSPROP_TF;
  q.decoupled = q.tf && on(o->decoupled_decay);
  q.lr_in_momentum = q.tf && on(o->lr_in_momentum);
  q.has_buf = o->momentum > 0.0f;
  q.nstates = s->nstates;
  switch (s->kind) {
    case APEX_OPTIM_SGD: case APEX_OPTIM_ADAM: case APEX_OPTIM_ADAMW: case APEX_OPTIM_ADADELTA:
    case APEX_OPTIM_ADAGRAD: case APEX_OPTIM_RMSPROP: case APEX_OPTIM_RMSPROP_TF:
      break;
    default:
      /* LAMB, NovoGrad and AdamP returned above: only a kind outside the enum gets here. */
      return apex__fail(APEX_ERR_UNSUPPORTED, "apex_optimizer_step: optimizer kind %d has no CUDA kernel; keep its "
                        "parameters on the CPU", (int)s->kind);
  }
  /* Lists 3..5 are the states that exist; list 6 the step counts as pointers into d_step. */
  apex__cuda_list none = s->p, steps;
  if (!step_count_list(s, &steps)) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_optimizer_step: out of memory");
  const apex__cuda_list *lists[MT_LISTS] = {&s->g, &s->p, &s->model, &none, &none, &none, &steps};
  for (int l = 0; l < s->nstates; l++) lists[3 + l] = &s->s[l];
  StepOp<MT_DYN, MT_DYN, MT_DYN> op;
  op.o = q;
  op.inv_scale = s->inv_scale;
  op.d_scale = s->d_scale;
  op.d_skip = s->d_skip;
  op.d_lr = s->d_lr;
  cudaError_t e = step_dispatch(s, lists, op);
  if (e == cudaSuccess) {
    CountOp c;
    c.d_skip = s->d_skip;
    e = mt_apply(MT_LISTS, lists, c);
  }
  free(steps.ptr);
  if (e != cudaSuccess)
    return apex__fail(APEX_ERR_DEVICE, "apex_optimizer_step: CUDA error %s (%s)", cudaGetErrorName(e),
                      cudaGetErrorString(e));
  return APEX_OK;
}
