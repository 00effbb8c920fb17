/* novograd.cu: NovoGrad on the GPU, the rule of backend/cpu/optim_novograd.c (read its header), in three launches
 * that queue without a host synchronisation:
 *   norms    per tensor, ||g * inv_scale||: the multi-tensor l2norm (its sums run in another order than
 *            the CPU's, so the last bits may differ), or the infinity norm max |g| * inv_scale (a max:
 *            the same bits as the CPU in any order);
 *   moments  one thread per tensor (novo_moments, a launch of one block) blends the second moment v, kept
 *            on the device with the step counts, and writes the tensor's 1 / bc1 and 1 / (v / bc2 + eps);
 *   update   per element, the rule the CPU calls (apex__novograd_rule, backend/optim_rules.h; -fmad=false),
 *            then the counts.
 * The skip flag and the loss scale are read on the device.
 *
 * The step moves, per f32 parameter, 24 bytes: the norm reads g (4), the update reads g, p, m and writes m,
 * p (20); f16/bf16 gradients and model copies take 2 bytes where f32 ones take 4. The update is the bulk,
 * elementwise, and walks as optim.cu's kinds do (mt_ilp.cuh, instantiated per dtype mix by mt_typed),
 * reading its tensor's two coefficients once per block (t.id[k]). The norms are reductions and stay where
 * they were: the l2norm's (multi_tensor.cu), and for the infinity norm MaxAbsOp on mt_apply.cuh's walk; the
 * moments are one thread's work per tensor. */
#include <cuda_runtime.h>
#include <math.h>

extern "C" {
#include "core/internal.h"
#include "backend/cuda/cuda_internal.h"
}
#include "backend/cuda/mt_ilp.cuh"
#include "backend/cuda/optim_dev.cuh"
#include "backend/optim_rules.h"

/* Lists: 0 g, 1 p (f32 master or parameter), 2 model copy, 3 m, 5 v (one float per tensor), 6 step counts. */
enum { L_G, L_P, L_MODEL, L_M, L_V = 5, L_STEP };

/* max |g| per tensor into d_max (zeroed before; non-negative floats order as their bit patterns, so an
 * integer atomicMax is exact): a warp's maximum first, one atomic per warp. */
struct MaxAbsOp {
  unsigned *d_max;
  __device__ bool begin(const MtTable &, int, int64_t, float *) const { return true; }
  __device__ void elem(const MtTable &t, int k, int64_t i, bool &, const float *) const {
    unsigned a = __float_as_uint(fabsf(apex_ld(t.ptr[L_G][k], t.dtype[L_G][k], i)));
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 /* warp reductions exist from sm_80, our oldest target */
    unsigned mask = __activemask();
    unsigned m = __reduce_max_sync(mask, a);
    if ((int)(threadIdx.x & 31) == __ffs(mask) - 1) atomicMax(&d_max[t.id[k]], m);
#else
    atomicMax(&d_max[t.id[k]], a);
#endif
  }
  __device__ void end_chunk(const MtTable &, int, int, bool) const {}
};

struct NovoMoments {
  float inv_scale, beta1, beta2, eps;
  int l2, inf_raw, bias_correction, init_zero;
  const float *d_norm; /* per tensor: the L2 norm of g * inv_scale, or max |g| (inf_raw) */
  float *d_coef;       /* per tensor: 1 / bc1, 1 / (v / bc2 + eps) */
  const float *d_scale;
  const int *d_skip;
};

/* The moments of up to MOMENT_BATCH tensors, a thread each: entry id[k] of the call, its v and step count. */
#define MOMENT_BATCH 256
struct MomentBatch {
  float *v[MOMENT_BATCH];
  const int64_t *step[MOMENT_BATCH];
  int id[MOMENT_BATCH];
  int n;
};

static __global__ void novo_moments(const __grid_constant__ MomentBatch b, NovoMoments a) {
  const int k = (int)threadIdx.x;
  if (k >= b.n || (a.d_skip && *a.d_skip)) return;
  const int i = b.id[k];
  float nf = a.inf_raw ? a.d_norm[i] * a.inv_scale : a.d_norm[i];
  if (a.d_scale) nf = nf / *a.d_scale;
  float *v = b.v[k];
  int64_t step = *b.step[k] + 1;
  double n = nf, b2 = a.beta2;
  if (step == 1) *v = a.init_zero ? 0.0f : (float)n;
  *v = a.l2 ? (float)sqrt(b2 * (double)*v * (double)*v + (1.0 - b2) * n * n) : (float)(b2 * (double)*v + (1.0 - b2) * n);
  double bc1 = a.bias_correction ? 1.0 - pow((double)a.beta1, (double)step) : 1.0;
  double bc2 = a.bias_correction ? sqrt(1.0 - pow(b2, (double)step)) : 1.0;
  a.d_coef[2 * i] = (float)(1.0 / bc1);
  a.d_coef[2 * i + 1] = (float)(1.0 / ((double)*v / bc2 + (double)a.eps));
}

/* Launches novo_moments over the entries with elements (an empty tensor's moment stays, as the chunk walk that
 * ran this before left it). */
static cudaError_t moments_launch(const apex__cuda_step *s, const apex__cuda_list &v, const apex__cuda_list &steps,
                                  const NovoMoments &a) {
  MomentBatch b;
  b.n = 0;
  for (int i = 0; i < s->n; i++) {
    if (s->g.numel[i] > 0) {
      b.v[b.n] = (float *)v.ptr[i];
      b.step[b.n] = (const int64_t *)steps.ptr[i];
      b.id[b.n++] = i;
    }
    if (b.n > 0 && (b.n == MOMENT_BATCH || i == s->n - 1)) {
      novo_moments<<<1, (b.n + 31) / 32 * 32, 0, (cudaStream_t)apex__cuda_stream()>>>(b, a);
      cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess) return e;
      b.n = 0;
    }
  }
  return cudaSuccess;
}

struct UpdateArgs {
  float inv_scale, lr, beta1, beta3, wd;
  int reg_inside;
  const float *d_coef, *d_scale;
  const float *d_lr; /* when set, the learning rate is read there */
  const int *d_skip;
};

enum { K_IB1, K_ID, K_INV, K_LR };

/* The update for gradients of dtype G, updated values of dtype P and model copies of dtype M (MT_NONE: none). */
template <int G, int P, int M>
struct NovoUpdate {
  static constexpr bool vec = G != MT_DYN && P != MT_DYN && M != MT_DYN;
  UpdateArgs a;

  __device__ bool live() const { return !(a.d_skip && *a.d_skip); }

  __device__ void coefs(const MtWideTable &t, int k, float *coef) const {
    coef[K_IB1] = a.d_coef[2 * t.id[k]];
    coef[K_ID] = a.d_coef[2 * t.id[k] + 1];
    coef[K_INV] = a.d_scale ? a.inv_scale / *a.d_scale : a.inv_scale;
    coef[K_LR] = a.d_lr ? *a.d_lr : a.lr;
  }

  __device__ bool aligned(const MtWideTable &t, int k) const {
    bool ok = mt_aligned<G>(t.ptr[L_G][k]) && mt_aligned<P>(t.ptr[L_P][k]) && mt_aligned<APEX_F32>(t.ptr[L_M][k]);
    if constexpr (M != MT_NONE) ok = ok && mt_aligned<M>(t.ptr[L_MODEL][k]);
    return ok;
  }

  template <bool VEC>
  __device__ __forceinline__ void apply(const MtWideTable &t, int k, int64_t i0, int64_t stride, int64_t end,
                                        const float (&coef)[MT_COEFS]) const {
    float g[MT_BATCH] = {}, p[MT_BATCH] = {}, m[MT_BATCH] = {};
    mt_load<G, VEC>(t.ptr[L_G][k], (apex_dtype)t.dtype[L_G][k], i0, stride, end, g);
    mt_load<P, VEC>(t.ptr[L_P][k], (apex_dtype)t.dtype[L_P][k], i0, stride, end, p);
    mt_load<APEX_F32, VEC>(t.ptr[L_M][k], APEX_F32, i0, stride, end, m);
#pragma unroll
    for (int j = 0; j < MT_BATCH; j++)
      p[j] = apex__novograd_rule(g[j], p[j], &m[j], coef[K_INV], coef[K_ID], coef[K_IB1], coef[K_LR], a.beta1, a.beta3,
                                 a.wd, a.reg_inside);
    mt_store<APEX_F32, VEC>(t.ptr[L_M][k], APEX_F32, i0, stride, end, m);
    mt_store_param<P, M, VEC>(t, L_P, L_MODEL, k, i0, stride, end, p);
  }
};

/* mt_typed's launch of the update. */
struct UpdateLaunch {
  const apex__cuda_list *const *lists;
  UpdateArgs a;
  template <int G, int P, int M>
  cudaError_t run() const {
    NovoUpdate<G, P, M> op;
    op.a = a;
    return mt_apply_wide(MT_LISTS, lists, op);
  }
};

static int on(apex_optim_flag f) { return f == APEX_OPTIM_ON; }

static apex_status cuda_failed(cudaError_t e) {
  if (e == cudaSuccess) return APEX_OK;
  return apex__fail(APEX_ERR_DEVICE, "NovoGrad step: CUDA error %s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
}

extern "C" apex_status apex__cuda_novograd_step(const apex__cuda_step *s) {
  const apex_optim_options *o = s->o;
  int l2 = o->norm_type != APEX_OPTIM_NORM_INF;
  /* One zeroed device block: a norm per tensor, then two coefficients per tensor. */
  void *d_mem = NULL;
  apex_status st = apex__cuda_alloc(sizeof(float) * (3 * (size_t)s->n + 1), 1, &d_mem);
  if (st != APEX_OK) return st;
  float *d_norm = (float *)d_mem, *d_coef = d_norm + s->n;
  apex__cuda_list steps, v;
  int have_steps = step_count_list(s, &steps), have_v = per_param_list(s, s->d_scalars, sizeof(float), &v);
  if (!have_steps || !have_v) st = apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_optimizer_step: out of memory");
  apex__cuda_list none = s->p;
  const apex__cuda_list *lists[MT_LISTS] = {&s->g, &s->p, &s->model, &s->s[0], &none, &v, &steps};
  if (st == APEX_OK) {
    if (l2) {
      st = apex__cuda_mt_l2norm(&s->g, s->inv_scale, NULL, d_norm, NULL);
    } else {
      MaxAbsOp mx;
      mx.d_max = (unsigned *)d_norm;
      st = cuda_failed(mt_apply(1, lists, mx));
    }
  }
  if (st == APEX_OK) {
    NovoMoments a;
    a.inv_scale = s->inv_scale;
    a.beta1 = o->beta1;
    a.beta2 = o->beta2;
    a.eps = o->eps;
    a.l2 = l2;
    a.inf_raw = !l2;
    a.bias_correction = on(o->bias_correction);
    a.init_zero = on(o->init_zero);
    a.d_norm = d_norm;
    a.d_coef = d_coef;
    a.d_scale = s->d_scale;
    a.d_skip = s->d_skip;
    st = cuda_failed(moments_launch(s, v, steps, a));
  }
  if (st == APEX_OK) {
    UpdateArgs b;
    b.inv_scale = s->inv_scale;
    b.lr = o->lr;
    b.d_lr = s->d_lr;
    b.beta1 = o->beta1;
    b.beta3 = on(o->grad_averaging) ? 1.0f - o->beta1 : 1.0f;
    b.wd = o->weight_decay;
    b.reg_inside = on(o->reg_inside_moment);
    b.d_coef = d_coef;
    b.d_scale = s->d_scale;
    b.d_skip = s->d_skip;
    st = cuda_failed(mt_typed(&s->g, &s->p, &s->model, UpdateLaunch{lists, b}));
  }
  if (st == APEX_OK) st = cuda_failed(advance_counts(s));
  if (have_steps) free(steps.ptr);
  if (have_v) free(v.ptr);
  apex__cuda_free(d_mem); /* stream-ordered: the cache hands it out again only to later work */
  return st;
}
