/* optim.cu: the fused optimizer step on the GPU, one kernel for the elementwise kinds (SGD, Adam, AdamW,
 * Adadelta, Adagrad, RMSprop, RMSpropTF); LAMB, NovoGrad and AdamP, which need per-tensor norms or
 * sums between passes, are in lamb.cu, novograd.cu and adamp.cu.
 *
 * Each element's update repeats, operation for operation, the CPU kernel in src/optim/<kind>.c, and
 * the CUDA files are compiled without contracting multiplies and adds into FMAs (-fmad=false), so
 * with the same inputs the GPU computes the CPU's bits: the parity test checks that. Per-tensor
 * coefficients (bias corrections, Adagrad's decayed lr, SGD's first-step momentum) are computed by
 * one thread per chunk from the step count, which lives on the device: a step skipped because the
 * device flag said overflow leaves the count, like everything else, unchanged, and nobody waits.
 *
 * Lists: 0 gradient, 1 what is updated (f32 master or the parameter), 2 the f16/bf16 model copy
 * (NULL: none), 3..5 state, 6 the step count (int64, dtype ignored). */
#include <cuda_runtime.h>
#include <math.h>

extern "C" {
#include "core/internal.h"
#include "cuda/cuda_internal.h"
}
#include "cuda/optim_dev.cuh"

struct OptParams {
  apex_optim_kind kind;
  float lr, beta1, beta2, eps, wd, momentum, dampening, alpha, rho, lr_decay;
  int amsgrad, adam_w, bias_correction, nesterov, wd_after, adagrad_w, centered, decoupled, lr_in_momentum, tf;
  int has_buf, buf_list, avg_list;
};

enum { C_INV, C_A, C_B, C_C };

struct StepOp {
  OptParams o;
  float inv_scale;
  const float *d_scale;
  const int *d_skip;

  __device__ bool begin(const MtTable &t, int k, int64_t, float *coef) const {
    if (d_skip && *d_skip) return false;
    coef[C_INV] = d_scale ? inv_scale / *d_scale : inv_scale;
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
        coef[C_A] = (float)((double)o.lr / bc1);
        coef[C_B] = (float)(1.0 / sqrt(bc2));
        break;
      }
      case APEX_OPTIM_ADAGRAD:
        coef[C_A] = (float)((double)o.lr / (1.0 + (double)(step - 1) * (double)o.lr_decay));
        break;
      default:
        break;
    }
    return true;
  }

  __device__ void elem(const MtTable &t, int k, int64_t i, bool &, const float *coef) const {
    const float inv = coef[C_INV];
    const apex_dtype pt = t.dtype[1][k];
    float g = apex_ld(t.ptr[0][k], t.dtype[0][k], i);
    float p = apex_ld(t.ptr[1][k], pt, i);
    float *s0 = (float *)t.ptr[3][k], *s1 = (float *)t.ptr[4][k], *s2 = (float *)t.ptr[5][k];
    switch (o.kind) {
      case APEX_OPTIM_SGD: {
        float wb = o.wd_after ? 0.0f : o.wd, wa = o.wd_after ? o.wd : 0.0f;
        float d = g * inv + wb * p;
        if (o.momentum != 0.0f) {
          float b = coef[C_A] * s0[i] + coef[C_B] * d;
          s0[i] = b;
          d = (o.nesterov ? 1.0f : 0.0f) * d + (o.nesterov ? o.momentum : 1.0f) * b;
        }
        p = p - o.lr * (d + wa * p);
        break;
      }
      case APEX_OPTIM_ADAM:
      case APEX_OPTIM_ADAMW: {
        float l2 = o.adam_w ? 0.0f : o.wd, decay = o.adam_w ? 1.0f - o.lr * o.wd : 1.0f;
        float gi = g * inv + l2 * p;
        float mi = o.beta1 * s0[i] + (1.0f - o.beta1) * gi;
        float vi = o.beta2 * s1[i] + (1.0f - o.beta2) * gi * gi;
        s0[i] = mi;
        s1[i] = vi;
        float d = vi;
        if (o.amsgrad) {
          d = s2[i] > vi ? s2[i] : vi;
          s2[i] = d;
        }
        d = sqrtf(d);
        p = p * decay - coef[C_A] * (mi / (d * coef[C_B] + o.eps));
        break;
      }
      case APEX_OPTIM_ADADELTA: {
        float nrho = 1.0f - o.rho;
        float gi = g * inv + o.wd * p;
        float sq = o.rho * s0[i] + nrho * gi * gi;
        s0[i] = sq;
        float delta = sqrtf(s1[i] + o.eps) / sqrtf(sq + o.eps) * gi;
        s1[i] = o.rho * s1[i] + nrho * delta * delta;
        p = p - o.lr * delta;
        break;
      }
      case APEX_OPTIM_ADAGRAD: {
        float l2 = o.adagrad_w ? 0.0f : o.wd, ww = o.adagrad_w ? o.wd : 0.0f;
        float gi = g * inv + l2 * p;
        float h = s0[i] + gi * gi;
        s0[i] = h;
        p = p - coef[C_A] * (gi / (sqrtf(h) + o.eps) + ww * p);
        break;
      }
      case APEX_OPTIM_RMSPROP:
      case APEX_OPTIM_RMSPROP_TF: {
        float a = o.alpha, na = 1.0f - o.alpha;
        float l2 = o.decoupled ? 0.0f : o.wd, decay = o.decoupled ? 1.0f - o.lr * o.wd : 1.0f;
        float gi = g * inv + l2 * p;
        float sq = o.tf ? s0[i] + na * (gi * gi - s0[i]) : a * s0[i] + na * gi * gi;
        s0[i] = sq;
        float d = sq;
        if (o.centered) {
          float *ga = (float *)t.ptr[o.avg_list][k];
          float x = o.tf ? ga[i] + na * (gi - ga[i]) : a * ga[i] + na * gi;
          ga[i] = x;
          d = d - x * x;
        }
        d = sqrtf(d + (o.tf ? o.eps : 0.0f));
        float q = gi / (d + (o.tf ? 0.0f : o.eps));
        if (o.has_buf) {
          float *buf = (float *)t.ptr[o.buf_list][k];
          float b = o.momentum * buf[i] + (o.lr_in_momentum ? o.lr : 1.0f) * q;
          buf[i] = b;
          p = p * decay - (o.lr_in_momentum ? 1.0f : o.lr) * b;
        } else {
          p = p * decay - o.lr * q;
        }
        break;
      }
      default:
        return;
    }
    apex_st(t.ptr[1][k], pt, i, p);
    if (t.ptr[2][k]) apex_st(t.ptr[2][k], t.dtype[2][k], i, p);
  }

  __device__ void end_chunk(const MtTable &, int, int, bool) const {}
};

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
  /* RMSprop's state slots: square average, then the momentum buffer, then the gradient average. */
  q.has_buf = o->momentum > 0.0f;
  q.buf_list = 4;
  q.avg_list = 4 + q.has_buf;
  switch (s->kind) {
    case APEX_OPTIM_SGD: case APEX_OPTIM_ADAM: case APEX_OPTIM_ADAMW: case APEX_OPTIM_ADADELTA:
    case APEX_OPTIM_ADAGRAD: case APEX_OPTIM_RMSPROP: case APEX_OPTIM_RMSPROP_TF:
      break;
    default:
      return apex__fail(APEX_ERR_UNSUPPORTED, "apex_optimizer_step: %s has no CUDA kernel yet; keep its parameters on "
                        "the CPU", apex_optim_kind_name(s->kind));
  }
  /* Lists 3..5 are the states that exist; list 6 the step counts as pointers into d_step. */
  apex__cuda_list none = s->p, steps;
  if (!step_count_list(s, &steps)) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_optimizer_step: out of memory");
  const apex__cuda_list *lists[MT_LISTS] = {&s->g, &s->p, &s->model, &none, &none, &none, &steps};
  for (int l = 0; l < s->nstates; l++) lists[3 + l] = &s->s[l];
  StepOp op;
  op.o = q;
  op.inv_scale = s->inv_scale;
  op.d_scale = s->d_scale;
  op.d_skip = s->d_skip;
  cudaError_t e = mt_apply(MT_LISTS, lists, op);
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
