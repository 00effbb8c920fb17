/* lamb.cu: LAMB on the GPU, the same two stages as backend/cpu/optim_lamb.c (read its header for the rule):
 *   stage 1  m, v and u = (m / bc1) / (sqrt(v / bc2) + eps) + wd_w * p, u into a device scratch;
 *   norms    ||p|| and ||u|| per tensor with the multi-tensor l2norm (one call over both lists), which sums
 *            in the CPU's order (tiles of eight f32 lanes, f64 across tiles and chunks): the CPU's bits, so
 *            the trust ratio is the CPU's (the global gradient norm for clipping comes from the same l2norm);
 *   stage 2  p -= ratio * u, ratio = lr * ||p|| / ||u|| (weight decay or use_nvlamb, both norms non-zero)
 *            else lr; the f16/bf16 model copy written from p; then the step counts advance.
 * Everything reads the skip flag, the loss scale and the global gradient norm from the device, so the
 * step queues without a host synchronisation. Stage 1's element rule is the CPU's own: both call
 * apex__adam_moments and apex__lamb_update (backend/optim_rules.h), and the file is compiled with
 * -fmad=false like optim.cu.
 *
 * The step moves, per f32 parameter, 48 bytes: stage 1 reads g, p, m, v and writes m, v, u (28), the
 * norms read p and u (8), stage 2 reads p, u and writes p (12), and 4 more with clipping (the global
 * gradient norm, taken before the step by optim/optimizer.c); f16/bf16 gradients and model copies take
 * 2 bytes where f32 ones take 4. Both stages are elementwise, so they walk as optim.cu's kinds do
 * (mt_ilp.cuh: even shares per block, vectors of four, two vectors of every list in flight), instantiated
 * per dtype mix (mt_typed); stage 2 reads its tensor's two norms once per block (t.id[k]). Each tensor's
 * u starts at a multiple of MT_ILP floats of the scratch, so u never keeps a tensor off the vector path. */
#include <cuda_runtime.h>
#include <math.h>

extern "C" {
#include "core/internal.h"
#include "backend/cuda/cuda_internal.h"
}
#include "backend/cuda/mt_ilp.cuh"
#include "backend/cuda/optim_dev.cuh"
#include "backend/optim_rules.h"

/* Lists: 0 g, 1 p (f32 master or parameter), 2 model copy, 3 m, 4 v, 5 u (scratch), 6 step counts. */
enum { L_G, L_P, L_MODEL, L_M, L_V, L_U, L_STEP };
enum { K_GRAD_MUL, K_INV_BC1, K_INV_BC2 };

struct Stage1Args {
  float inv_scale, max_norm, beta1, beta2, beta3, eps, l2, wd_w;
  int bias_correction;
  const float *d_scale, *d_grad_norm;
  const int *d_skip;
};

/* Stage 1 for gradients of dtype G and updated values of dtype P (compile-time ones, or MT_DYN). */
template <int G, int P>
struct LambStage1 {
  static constexpr bool vec = G != MT_DYN && P != MT_DYN;
  Stage1Args a;

  __device__ bool live() const { return !(a.d_skip && *a.d_skip); }

  __device__ void coefs(const MtWideTable &t, int k, float *coef) const {
    float inv = a.d_scale ? a.inv_scale / *a.d_scale : a.inv_scale;
    float clip = 1.0f;
    if (a.d_grad_norm) { /* the norm was taken of g * inv_scale: the device scale is divided out here */
      float gn = a.d_scale ? *a.d_grad_norm / *a.d_scale : *a.d_grad_norm;
      if (a.max_norm > 0.0f && gn > a.max_norm) clip = gn / a.max_norm;
    }
    int64_t step = *(const int64_t *)t.ptr[L_STEP][k] + 1;
    double bc1 = a.bias_correction ? 1.0 - pow((double)a.beta1, (double)step) : 1.0;
    double bc2 = a.bias_correction ? 1.0 - pow((double)a.beta2, (double)step) : 1.0;
    coef[K_GRAD_MUL] = inv / clip;
    coef[K_INV_BC1] = (float)(1.0 / bc1);
    coef[K_INV_BC2] = (float)(1.0 / bc2);
  }

  __device__ bool aligned(const MtWideTable &t, int k) const {
    return mt_aligned<G>(t.ptr[L_G][k]) && mt_aligned<P>(t.ptr[L_P][k]) && mt_aligned<APEX_F32>(t.ptr[L_M][k]) &&
           mt_aligned<APEX_F32>(t.ptr[L_V][k]) && mt_aligned<APEX_F32>(t.ptr[L_U][k]);
  }

  template <bool VEC>
  __device__ __forceinline__ void apply(const MtWideTable &t, int k, int64_t i0, int64_t stride, int64_t end,
                                        const float (&coef)[MT_COEFS]) const {
    float g[MT_BATCH] = {}, p[MT_BATCH] = {}, m[MT_BATCH] = {}, v[MT_BATCH] = {}, u[MT_BATCH];
    mt_load<G, VEC>(t.ptr[L_G][k], (apex_dtype)t.dtype[L_G][k], i0, stride, end, g);
    mt_load<P, VEC>(t.ptr[L_P][k], (apex_dtype)t.dtype[L_P][k], i0, stride, end, p);
    mt_load<APEX_F32, VEC>(t.ptr[L_M][k], APEX_F32, i0, stride, end, m);
    mt_load<APEX_F32, VEC>(t.ptr[L_V][k], APEX_F32, i0, stride, end, v);
#pragma unroll
    for (int j = 0; j < MT_BATCH; j++) {
      apex__adam_moments(g[j], p[j], &m[j], &v[j], coef[K_GRAD_MUL], a.l2, a.beta1, a.beta3, a.beta2, 1.0f - a.beta2);
      u[j] = apex__lamb_update(m[j], sqrtf(v[j] * coef[K_INV_BC2]), p[j], coef[K_INV_BC1], a.eps, a.wd_w);
    }
    mt_store<APEX_F32, VEC>(t.ptr[L_M][k], APEX_F32, i0, stride, end, m);
    mt_store<APEX_F32, VEC>(t.ptr[L_V][k], APEX_F32, i0, stride, end, v);
    mt_store<APEX_F32, VEC>(t.ptr[L_U][k], APEX_F32, i0, stride, end, u);
  }
};

struct Stage2Args {
  float lr;
  const float *d_lr; /* when set, the learning rate is read there */
  int use_ratio;
  const float *d_pnorm, *d_unorm; /* per entry of the call's lists (t.id) */
  const int *d_skip;
};

/* Stage 2 for updated values of dtype P and model copies of dtype M (MT_NONE: none). */
template <int P, int M>
struct LambStage2 {
  static constexpr bool vec = P != MT_DYN && M != MT_DYN;
  Stage2Args a;

  __device__ bool live() const { return !(a.d_skip && *a.d_skip); }

  __device__ void coefs(const MtWideTable &t, int k, float *coef) const {
    float pn = a.d_pnorm[t.id[k]], un = a.d_unorm[t.id[k]], l = a.d_lr ? *a.d_lr : a.lr;
    coef[0] = a.use_ratio && pn != 0.0f && un != 0.0f ? l * (pn / un) : l;
  }

  __device__ bool aligned(const MtWideTable &t, int k) const {
    bool ok = mt_aligned<P>(t.ptr[L_P][k]) && mt_aligned<APEX_F32>(t.ptr[L_U][k]);
    if constexpr (M != MT_NONE) ok = ok && mt_aligned<M>(t.ptr[L_MODEL][k]);
    return ok;
  }

  template <bool VEC>
  __device__ __forceinline__ void apply(const MtWideTable &t, int k, int64_t i0, int64_t stride, int64_t end,
                                        const float (&coef)[MT_COEFS]) const {
    float p[MT_BATCH] = {}, u[MT_BATCH] = {};
    mt_load<P, VEC>(t.ptr[L_P][k], (apex_dtype)t.dtype[L_P][k], i0, stride, end, p);
    mt_load<APEX_F32, VEC>(t.ptr[L_U][k], APEX_F32, i0, stride, end, u);
#pragma unroll
    for (int j = 0; j < MT_BATCH; j++) p[j] = p[j] - coef[0] * u[j];
    mt_store_param<P, M, VEC>(t, L_P, L_MODEL, k, i0, stride, end, p);
  }
};

/* mt_typed's launches of the two stages. */
struct Stage1Launch {
  const apex__cuda_list *const *lists;
  Stage1Args a;
  template <int G, int P, int M>
  cudaError_t run() const {
    LambStage1<G, P> op;
    op.a = a;
    return mt_apply_wide(MT_LISTS, lists, op);
  }
};

struct Stage2Launch {
  const apex__cuda_list *const *lists;
  Stage2Args a;
  template <int G, int P, int M>
  cudaError_t run() const {
    LambStage2<P, M> op;
    op.a = a;
    return mt_apply_wide(MT_LISTS, lists, op);
  }
};

static int on(apex_optim_flag f) { return f == APEX_OPTIM_ON; }

extern "C" apex_status apex__cuda_lamb_step(const apex__cuda_step *s) {
  const apex_optim_options *o = s->o;
  /* Each tensor's u from a multiple of MT_ILP floats, so that its vectors are aligned. */
  size_t total = 0;
  for (int i = 0; i < s->n; i++) total += (s->p.numel[i] + MT_ILP - 1) / MT_ILP * MT_ILP;
  /* One device block: u for every parameter, then ||p|| and ||u|| per tensor. */
  void *d_mem = NULL;
  apex_status st = apex__cuda_alloc(sizeof(float) * (total + 2 * (size_t)s->n + 1), 0, &d_mem);
  if (st != APEX_OK) return st;
  float *d_u = (float *)d_mem, *d_pnorm = d_u + total, *d_unorm = d_pnorm + s->n;
  apex__cuda_list u = s->p, steps;
  /* p's and u's tensors as one list of 2n for the norms (one l2norm call: ||p|| into d_pnorm, ||u|| into
   * d_unorm right after it; each tensor's sum is its own, so the bits are those of two calls); u is its
   * second half. */
  const size_t n2 = 2 * (size_t)s->n + 1;
  void **pu_ptr = (void **)malloc(sizeof(void *) * n2);
  apex_dtype *pu_dt = (apex_dtype *)malloc(sizeof(apex_dtype) * n2);
  size_t *pu_numel = (size_t *)malloc(sizeof(size_t) * n2);
  int have_steps = step_count_list(s, &steps);
  if (!pu_ptr || !pu_dt || !pu_numel || !have_steps) {
    st = apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_optimizer_step: out of memory");
  } else {
    size_t off = 0;
    for (int i = 0; i < s->n; i++) {
      pu_ptr[i] = s->p.ptr[i];
      pu_dt[i] = s->p.dtype[i];
      pu_numel[i] = pu_numel[s->n + i] = s->p.numel[i];
      pu_ptr[s->n + i] = d_u + off;
      pu_dt[s->n + i] = APEX_F32;
      off += (s->p.numel[i] + MT_ILP - 1) / MT_ILP * MT_ILP;
    }
    u.ptr = pu_ptr + s->n;
    u.dtype = pu_dt + s->n;
    const apex__cuda_list pu = {2 * s->n, pu_ptr, pu_dt, pu_numel};
    const apex__cuda_list *lists[MT_LISTS] = {&s->g, &s->p, &s->model, &s->s[0], &s->s[1], &u, &steps};
    int w = on(o->adam_w_mode);
    Stage1Args a;
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
    cudaError_t e = mt_typed(&s->g, &s->p, &s->model, Stage1Launch{lists, a});
    if (e != cudaSuccess)
      st = apex__fail(APEX_ERR_DEVICE, "LAMB step (stage 1): CUDA error %s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
    if (st == APEX_OK) st = apex__cuda_mt_l2norm(&pu, 1.0f, NULL, d_pnorm, NULL);
    if (st == APEX_OK) {
      Stage2Args b;
      b.lr = o->lr;
      b.d_lr = s->d_lr;
      b.use_ratio = on(o->use_nvlamb) || o->weight_decay != 0.0f;
      b.d_pnorm = d_pnorm;
      b.d_unorm = d_unorm;
      b.d_skip = s->d_skip;
      e = mt_typed(&s->g, &s->p, &s->model, Stage2Launch{lists, b});
      if (e == cudaSuccess) e = advance_counts(s);
      if (e != cudaSuccess)
        st = apex__fail(APEX_ERR_DEVICE, "LAMB step (stage 2): CUDA error %s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
    }
  }
  if (have_steps) free(steps.ptr);
  free(pu_ptr);
  free(pu_dt);
  free(pu_numel);
  apex__cuda_free(d_mem); /* stream-ordered: the cache hands it out again only to later work */
  return st;
}
