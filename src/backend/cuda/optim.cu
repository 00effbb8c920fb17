/* optim.cu: the fused optimizer step on the GPU for the elementwise kinds (SGD, Adam, AdamW, Adadelta,
 * Adagrad, RMSprop, RMSpropTF); LAMB, NovoGrad and AdamP, which need per-tensor norms or sums between
 * passes, are in lamb.cu, novograd.cu and adamp.cu.
 *
 * Each element's update is the CPU kernel's: SGD, Adam/AdamW, Adadelta, Adagrad and RMSprop/RMSpropTF
 * call the rules of backend/optim_rules.h that backend/cpu/optim_<kind>.c calls. The CUDA files are
 * compiled without contracting multiplies and adds into FMAs (-fmad=false), so
 * with the same inputs the GPU computes the CPU's bits: the parity test checks that. Per-tensor
 * coefficients (bias corrections, Adagrad's decayed lr, SGD's first-step momentum) are computed on the
 * device from the step count, which lives there, once per tensor and block: a step skipped because the
 * device flag said overflow leaves the count, like everything else, unchanged, and nobody waits. The
 * counts advance in a launch of their own after the update (optim_dev.cuh's advance_counts).
 *
 * The step is bound by memory (AdamW on f32: 16 bytes read and 12 written per parameter), so the kernel is
 * one instance per kind and dtype mix (a rule struct below, a template argument of StepOp), whose element
 * update is straight-line code on registers, over mt_ilp.cuh's walk (even shares per block, vectors of
 * four where aligned, two vectors of every list in flight per thread). The update is the rule's, one
 * element in registers, whichever path loaded it, so every path gives the same bits.
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
  float lr, beta1, beta2, eps, wd, momentum, dampening, alpha, rho, lr_decay;
  int amsgrad, adam_w, bias_correction, nesterov, wd_after, adagrad_w, centered, decoupled, lr_in_momentum;
  int has_buf;
  int nstates; /* state lists 3..3+nstates that exist: exactly those the kind reads and writes */
};

enum { C_INV, C_A, C_B, C_LR }; /* C_LR: the learning rate, o.lr or the device's copy (d_lr) */

/* The rules, one struct per kind: coefs fills the per-tensor coefficients C_A, C_B from the step count (the
 * walk has set C_INV and C_LR), update is one element's update: g the gradient, p the value updated, s0..s2
 * the states (lists 3..5) in and out. The operations and their order are the CPU kernels'; do not
 * reassociate. The options a kind reads stay run-time values: they are the same for every thread, so each
 * costs a select, not a branch, and the states stay in registers. */
struct SgdRule {
  static __device__ void coefs(const OptParams &o, int64_t step, float *coef) { /* keep, take */
    coef[C_A] = step == 1 ? 0.0f : o.momentum;
    coef[C_B] = step == 1 ? 1.0f : 1.0f - o.dampening;
  }
  static __device__ __forceinline__ float update(const OptParams &o, const float *coef, float g, float p, float &s0,
                                                 float &, float &) {
    float wb = o.wd_after ? 0.0f : o.wd, wa = o.wd_after ? o.wd : 0.0f;
    return apex__sgd_rule(g, p, &s0, o.momentum != 0.0f, coef[C_INV], wb, wa, coef[C_A], coef[C_B],
                          o.nesterov ? 1.0f : 0.0f, o.nesterov ? o.momentum : 1.0f, coef[C_LR]);
  }
};

/* Adam and AdamW (adam_w). */
struct AdamRule {
  static __device__ void coefs(const OptParams &o, int64_t step, float *coef) {
    double bc1 = o.bias_correction ? 1.0 - pow((double)o.beta1, (double)step) : 1.0;
    double bc2 = o.bias_correction ? 1.0 - pow((double)o.beta2, (double)step) : 1.0;
    coef[C_A] = (float)((double)coef[C_LR] / bc1);
    coef[C_B] = (float)(1.0 / sqrt(bc2));
  }
  static __device__ __forceinline__ float update(const OptParams &o, const float *coef, float g, float p, float &s0,
                                                 float &s1, float &s2) {
    float l2 = o.adam_w ? 0.0f : o.wd, decay = o.adam_w ? 1.0f - coef[C_LR] * o.wd : 1.0f;
    float d = apex__adam_moments(g, p, &s0, &s1, coef[C_INV], l2, o.beta1, 1.0f - o.beta1, o.beta2, 1.0f - o.beta2);
    if (o.amsgrad) d = apex__adam_amsgrad(&s2, d);
    return apex__adam_apply(p, s0, sqrtf(d), decay, coef[C_A], coef[C_B], o.eps);
  }
};

struct AdadeltaRule {
  static __device__ void coefs(const OptParams &, int64_t, float *) {}
  static __device__ __forceinline__ float update(const OptParams &o, const float *coef, float g, float p, float &s0,
                                                 float &s1, float &) {
    float nrho = 1.0f - o.rho;
    float gi = apex__adadelta_accum(g, p, &s0, coef[C_INV], o.wd, o.rho, nrho);
    return apex__adadelta_apply(p, gi, sqrtf(s1 + o.eps), sqrtf(s0 + o.eps), &s1, o.rho, nrho, coef[C_LR]);
  }
};

struct AdagradRule {
  static __device__ void coefs(const OptParams &o, int64_t step, float *coef) {
    coef[C_A] = (float)((double)coef[C_LR] / (1.0 + (double)(step - 1) * (double)o.lr_decay));
  }
  static __device__ __forceinline__ float update(const OptParams &o, const float *coef, float g, float p, float &s0,
                                                 float &, float &) {
    float l2 = o.adagrad_w ? 0.0f : o.wd, ww = o.adagrad_w ? o.wd : 0.0f;
    float gi = apex__adagrad_accum(g, p, &s0, coef[C_INV], l2);
    return apex__adagrad_apply(p, gi, sqrtf(s0), coef[C_A], o.eps, ww);
  }
};

/* RMSprop (TF = 0) and RMSpropTF (TF = 1). The states: the square average (s0), then the momentum buffer
 * when there is one (s1), then the gradient average. */
template <int TF>
struct RmspropRule {
  static __device__ void coefs(const OptParams &, int64_t, float *) {}
  static __device__ __forceinline__ float update(const OptParams &o, const float *coef, float g, float p, float &s0,
                                                 float &s1, float &s2) {
    const float lr = coef[C_LR];
    float a = o.alpha, na = 1.0f - o.alpha;
    float l2 = o.decoupled ? 0.0f : o.wd, decay = o.decoupled ? 1.0f - lr * o.wd : 1.0f;
    float gi;
    float d = apex__rmsprop_square(g, p, &s0, &gi, coef[C_INV], l2, a, na, TF);
    if (o.centered) { /* the gradient average is s2 behind a momentum buffer, else s1: by value, kept in registers */
      float ga = o.has_buf ? s2 : s1;
      d = apex__rmsprop_center(d, gi, &ga, a, na, TF);
      if (o.has_buf) s2 = ga;
      else s1 = ga;
    }
    float root = sqrtf(d + (TF ? o.eps : 0.0f)), eps_out = TF ? 0.0f : o.eps;
    if (o.has_buf)
      return apex__rmsprop_apply_buf(p, gi, root, &s1, eps_out, decay, o.momentum, o.lr_in_momentum ? lr : 1.0f,
                                     o.lr_in_momentum ? 1.0f : lr);
    return apex__rmsprop_apply(p, gi, root, eps_out, decay, lr);
  }
};

/* One kind's step over lists 0..6 (mt_ilp.cuh's walk), with the gradient's dtype G, the updated value's P and
 * the model copy's M fixed at compile time for the common mixes (MT_DYN: the table's, per tensor). States are
 * f32. */
struct StepArgs {
  OptParams o;
  float inv_scale;
  const float *d_scale;
  const int *d_skip;
  const float *d_lr;
};

template <class Rule, int G, int P, int M>
struct StepOp {
  static constexpr bool vec = G != MT_DYN && P != MT_DYN && M != MT_DYN;
  StepArgs a;

  __device__ bool live() const { return !(a.d_skip && *a.d_skip); }

  __device__ void coefs(const MtWideTable &t, int k, float *coef) const {
    coef[C_INV] = a.d_scale ? a.inv_scale / *a.d_scale : a.inv_scale;
    coef[C_LR] = a.d_lr ? *a.d_lr : a.o.lr;
    Rule::coefs(a.o, *(const int64_t *)t.ptr[6][k] + 1, coef);
  }

  __device__ bool aligned(const MtWideTable &t, int k) const {
    bool ok = mt_aligned<G>(t.ptr[0][k]) && mt_aligned<P>(t.ptr[1][k]);
    if constexpr (M != MT_NONE) ok = ok && mt_aligned<M>(t.ptr[2][k]);
    for (int l = 0; l < a.o.nstates; l++) ok = ok && mt_aligned<APEX_F32>(t.ptr[3 + l][k]);
    return ok;
  }

  template <bool VEC>
  __device__ __forceinline__ void apply(const MtWideTable &t, int k, int64_t i0, int64_t stride, int64_t end,
                                        const float (&coef)[MT_COEFS]) const {
    const int ns = a.o.nstates;
    /* Lanes past end are computed on these zeros and never stored. */
    float g[MT_BATCH] = {}, p[MT_BATCH] = {}, s0[MT_BATCH] = {}, s1[MT_BATCH] = {}, s2[MT_BATCH] = {};
    mt_load<G, VEC>(t.ptr[0][k], (apex_dtype)t.dtype[0][k], i0, stride, end, g);
    mt_load<P, VEC>(t.ptr[1][k], (apex_dtype)t.dtype[1][k], i0, stride, end, p);
    /* Only the states that exist: lists past nstates alias the parameters. */
    if (ns > 0) mt_load<APEX_F32, VEC>(t.ptr[3][k], APEX_F32, i0, stride, end, s0);
    if (ns > 1) mt_load<APEX_F32, VEC>(t.ptr[4][k], APEX_F32, i0, stride, end, s1);
    if (ns > 2) mt_load<APEX_F32, VEC>(t.ptr[5][k], APEX_F32, i0, stride, end, s2);
#pragma unroll
    for (int j = 0; j < MT_BATCH; j++) p[j] = Rule::update(a.o, coef, g[j], p[j], s0[j], s1[j], s2[j]);
    if (ns > 0) mt_store<APEX_F32, VEC>(t.ptr[3][k], APEX_F32, i0, stride, end, s0);
    if (ns > 1) mt_store<APEX_F32, VEC>(t.ptr[4][k], APEX_F32, i0, stride, end, s1);
    if (ns > 2) mt_store<APEX_F32, VEC>(t.ptr[5][k], APEX_F32, i0, stride, end, s2);
    mt_store_param<P, M, VEC>(t, 1, 2, k, i0, stride, end, p);
  }
};

/* One kind's step over the lists, at the group's dtype mix (mt_ilp.cuh's mt_typed picks the instance). */
template <class Rule>
struct StepLaunch {
  const apex__cuda_list *const *lists;
  StepArgs a;
  template <int G, int P, int M>
  cudaError_t run() const {
    StepOp<Rule, G, P, M> op;
    op.a = a;
    return mt_apply_wide(MT_LISTS, lists, op);
  }
};

template <class Rule>
static cudaError_t step_rule(const apex__cuda_step *s, const apex__cuda_list *const *lists, const StepArgs &a) {
  return mt_typed(&s->g, &s->p, &s->model, StepLaunch<Rule>{lists, a});
}

static int on(apex_optim_flag f) { return f == APEX_OPTIM_ON; }

extern "C" apex_status apex__cuda_optim_step(const apex__cuda_step *s) {
  /* Per-tensor norms between passes: their own files. */
  if (s->kind == APEX_OPTIM_LAMB) return apex__cuda_lamb_step(s);
  if (s->kind == APEX_OPTIM_NOVOGRAD) return apex__cuda_novograd_step(s);
  if (s->kind == APEX_OPTIM_ADAMP) return apex__cuda_adamp_step(s);
  const apex_optim_options *o = s->o;
  OptParams q = {};
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
  const int tf = s->kind == APEX_OPTIM_RMSPROP_TF;
  q.decoupled = tf && on(o->decoupled_decay);
  q.lr_in_momentum = tf && on(o->lr_in_momentum);
  q.has_buf = o->momentum > 0.0f;
  q.nstates = s->nstates;
  /* Lists 3..5 are the states that exist; list 6 the step counts as pointers into d_step. */
  apex__cuda_list none = s->p, steps;
  if (!step_count_list(s, &steps)) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_optimizer_step: out of memory");
  const apex__cuda_list *lists[MT_LISTS] = {&s->g, &s->p, &s->model, &none, &none, &none, &steps};
  for (int l = 0; l < s->nstates; l++) lists[3 + l] = &s->s[l];
  StepArgs a;
  a.o = q;
  a.inv_scale = s->inv_scale;
  a.d_scale = s->d_scale;
  a.d_skip = s->d_skip;
  a.d_lr = s->d_lr;
  cudaError_t e;
  switch (s->kind) {
    case APEX_OPTIM_SGD: e = step_rule<SgdRule>(s, lists, a); break;
    case APEX_OPTIM_ADAM: case APEX_OPTIM_ADAMW: e = step_rule<AdamRule>(s, lists, a); break;
    case APEX_OPTIM_ADADELTA: e = step_rule<AdadeltaRule>(s, lists, a); break;
    case APEX_OPTIM_ADAGRAD: e = step_rule<AdagradRule>(s, lists, a); break;
    case APEX_OPTIM_RMSPROP: e = step_rule<RmspropRule<0>>(s, lists, a); break;
    case APEX_OPTIM_RMSPROP_TF: e = step_rule<RmspropRule<1>>(s, lists, a); break;
    default:
      /* LAMB, NovoGrad and AdamP returned above: only a kind outside the enum gets here. */
      free(steps.ptr);
      return apex__fail(APEX_ERR_UNSUPPORTED, "apex_optimizer_step: optimizer kind %d has no CUDA kernel; keep its "
                        "parameters on the CPU", (int)s->kind);
  }
  if (e == cudaSuccess) e = advance_counts(s);
  free(steps.ptr);
  if (e != cudaSuccess)
    return apex__fail(APEX_ERR_DEVICE, "apex_optimizer_step: CUDA error %s (%s)", cudaGetErrorName(e),
                      cudaGetErrorString(e));
  return APEX_OK;
}
