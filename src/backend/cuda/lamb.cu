/* lamb.cu: LAMB on the GPU, the same two stages as backend/cpu/optim_lamb.c (read its header for the rule):
 *   stage 1  m, v and u = (m / bc1) / (sqrt(v / bc2) + eps) + wd_w * p, u into a device scratch;
 *   norms    ||p|| and ||u|| per tensor with the multi-tensor l2norm, which sums in the CPU's order (tiles
 *            of eight f32 lanes, f64 across tiles and chunks): the CPU's bits, so the trust ratio is the
 *            CPU's (the global gradient norm for clipping comes from the same l2norm);
 *   stage 2  p -= ratio * u, ratio = lr * ||p|| / ||u|| (weight decay or use_nvlamb, both norms non-zero)
 *            else lr; the f16/bf16 model copy written from p; then the step counts advance.
 * Everything reads the skip flag, the loss scale and the global gradient norm from the device, so the
 * step queues without a host synchronisation. Stage 1's element rule is the CPU's own: both call
 * apex__adam_moments and apex__lamb_update (backend/optim_rules.h), and the file is compiled with
 * -fmad=false like optim.cu. */
#include <cuda_runtime.h>
#include <math.h>

extern "C" {
#include "core/internal.h"
#include "backend/cuda/cuda_internal.h"
}
#include "backend/cuda/optim_dev.cuh"
#include "backend/optim_rules.h"

/* Lists: 0 g, 1 p (f32 master or parameter), 2 model copy, 3 m, 4 v, 5 u (scratch), 6 step counts. */
enum { L_G, L_P, L_MODEL, L_M, L_V, L_U, L_STEP };
enum { K_GRAD_MUL, K_INV_BC1, K_INV_BC2 };

struct LambStage1 {
  float inv_scale, max_norm, beta1, beta2, beta3, eps, l2, wd_w;
  int bias_correction;
  const float *d_scale, *d_grad_norm;
  const int *d_skip;

  __device__ bool begin(const MtTable &t, int k, int64_t, float *coef) const {
    if (d_skip && *d_skip) return false;
    float inv = d_scale ? inv_scale / *d_scale : inv_scale;
    float clip = 1.0f;
    if (d_grad_norm) { /* the norm was taken of g * inv_scale: the device scale is divided out here */
      float gn = d_scale ? *d_grad_norm / *d_scale : *d_grad_norm;
      if (max_norm > 0.0f && gn > max_norm) clip = gn / max_norm;
    }
    int64_t step = *(const int64_t *)t.ptr[L_STEP][k] + 1;
    double bc1 = bias_correction ? 1.0 - pow((double)beta1, (double)step) : 1.0;
    double bc2 = bias_correction ? 1.0 - pow((double)beta2, (double)step) : 1.0;
    coef[K_GRAD_MUL] = inv / clip;
    coef[K_INV_BC1] = (float)(1.0 / bc1);
    coef[K_INV_BC2] = (float)(1.0 / bc2);
    return true;
  }

  __device__ void elem(const MtTable &t, int k, int64_t i, bool &, const float *coef) const {
    float *m = (float *)t.ptr[L_M][k], *v = (float *)t.ptr[L_V][k], *u = (float *)t.ptr[L_U][k];
    float p = apex_ld(t.ptr[L_P][k], t.dtype[L_P][k], i);
    float g = apex_ld(t.ptr[L_G][k], t.dtype[L_G][k], i), mi = m[i], vi = v[i];
    apex__adam_moments(g, p, &mi, &vi, coef[K_GRAD_MUL], l2, beta1, beta3, beta2, 1.0f - beta2);
    m[i] = mi;
    v[i] = vi;
    u[i] = apex__lamb_update(mi, sqrtf(vi * coef[K_INV_BC2]), p, coef[K_INV_BC1], eps, wd_w);
  }

  __device__ void end_chunk(const MtTable &, int, int, bool) const {}
};

struct LambStage2 {
  float lr;
  const float *d_lr; /* when set, the learning rate is read there */
  int use_ratio;
  const float *d_pnorm, *d_unorm; /* per tensor of the call, by t.id */
  const int *d_skip;

  __device__ bool begin(const MtTable &t, int k, int64_t, float *coef) const {
    if (d_skip && *d_skip) return false;
    float pn = d_pnorm[t.id[k]], un = d_unorm[t.id[k]], l = d_lr ? *d_lr : lr;
    coef[0] = use_ratio && pn != 0.0f && un != 0.0f ? l * (pn / un) : l;
    return true;
  }

  __device__ void elem(const MtTable &t, int k, int64_t i, bool &, const float *coef) const {
    const float *u = (const float *)t.ptr[L_U][k];
    float p = apex_ld(t.ptr[L_P][k], t.dtype[L_P][k], i);
    p = p - coef[0] * u[i];
    apex_st(t.ptr[L_P][k], t.dtype[L_P][k], i, p);
    if (t.ptr[L_MODEL][k]) apex_st(t.ptr[L_MODEL][k], t.dtype[L_MODEL][k], i, p);
  }

  __device__ void end_chunk(const MtTable &, int, int, bool) const {}
};

static int on(apex_optim_flag f) { return f == APEX_OPTIM_ON; }

extern "C" apex_status apex__cuda_lamb_step(const apex__cuda_step *s) {
  const apex_optim_options *o = s->o;
  size_t total = 0;
  for (int i = 0; i < s->n; i++) total += s->p.numel[i];
  /* One device block: ||p|| and ||u|| per tensor, then u for every parameter. */
  void *d_mem = NULL;
  apex_status st = apex__cuda_alloc(sizeof(float) * (2 * (size_t)s->n + total + 1), 0, &d_mem);
  if (st != APEX_OK) return st;
  float *d_pnorm = (float *)d_mem, *d_unorm = d_pnorm + s->n, *d_u = d_unorm + s->n;
  apex__cuda_list u = s->p, steps;
  void **u_ptr = (void **)malloc(sizeof(void *) * (size_t)(s->n ? s->n : 1));
  apex_dtype *u_dt = (apex_dtype *)malloc(sizeof(apex_dtype) * (size_t)(s->n ? s->n : 1));
  int have_steps = step_count_list(s, &steps);
  if (!u_ptr || !u_dt || !have_steps) {
    st = apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_optimizer_step: out of memory");
  } else {
    size_t off = 0;
    for (int i = 0; i < s->n; i++) {
      u_ptr[i] = d_u + off;
      u_dt[i] = APEX_F32;
      off += s->p.numel[i];
    }
    u.ptr = u_ptr;
    u.dtype = u_dt;
    const apex__cuda_list *lists[MT_LISTS] = {&s->g, &s->p, &s->model, &s->s[0], &s->s[1], &u, &steps};
    int w = on(o->adam_w_mode);
    LambStage1 a;
    a.inv_scale = s->inv_scale;
    a.max_norm = isfinite(o->max_grad_norm) ? o->max_grad_norm : 0.0f;
    a.beta1 = o->beta1;
    a.beta2 = o->beta2;
    a.beta3 = on(o->grad_averaging) ? 1.0f - o->beta1 : 1.0f;
    a.eps = o->eps;
    a.l2 = w ? 0.0f : o->weight_decay;
    a.wd_w = w ? o->weight_decay : 0.0f;
    a.bias_correction = on(o->bias_correction);
    a.d_scale = s->d_scale;
    a.d_grad_norm = s->d_grad_norm;
    a.d_skip = s->d_skip;
    cudaError_t e = mt_apply(MT_LISTS, lists, a);
    if (e != cudaSuccess)
      st = apex__fail(APEX_ERR_DEVICE, "LAMB step (stage 1): CUDA error %s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
    if (st == APEX_OK) st = apex__cuda_mt_l2norm(&s->p, 1.0f, NULL, d_pnorm, NULL);
    if (st == APEX_OK) st = apex__cuda_mt_l2norm(&u, 1.0f, NULL, d_unorm, NULL);
    if (st == APEX_OK) {
      LambStage2 b;
      b.lr = o->lr;
      b.d_lr = s->d_lr;
      b.use_ratio = on(o->use_nvlamb) || o->weight_decay != 0.0f;
      b.d_pnorm = d_pnorm;
      b.d_unorm = d_unorm;
      b.d_skip = s->d_skip;
      e = mt_apply(MT_LISTS, lists, b);
      if (e == cudaSuccess) e = advance_counts(s);
      if (e != cudaSuccess)
        st = apex__fail(APEX_ERR_DEVICE, "LAMB step (stage 2): CUDA error %s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
    }
  }
  if (have_steps) free(steps.ptr);
  free(u_ptr);
  free(u_dt);
  apex__cuda_free(d_mem); /* stream-ordered: the cache hands it out again only to later work */
  return st;
}
