/* adamp.cu: AdamP on the GPU, the rule of backend/cpu/optim_adamp.c (read its header), one parameter at a time
 * in three launches that queue without a host synchronisation:
 *   rows     one block per row of the channel view (the first dimension; the whole tensor for 0/1-D):
 *            m, v and perturb u (u into a scratch), and the row's sums <g,p>, <g,g>, <p,p>, <p,u> in
 *            f64 (each thread in index order, then the block in a fixed tree: another order than the
 *            CPU's, so the sums, and the projection coefficients made from them, may differ from it
 *            in the last bits; the parity test allows for that);
 *   decide   one block: the largest |cos(g, p)| over rows against delta / sqrt(row length), then the
 *            layer view (the rows' sums added in row order, as the CPU does), the per-row projection
 *            coefficients, the decay, lr / bc1; then the step count advances;
 *   apply    per element: p = p * decay - lr / bc1 * (u - coef[row] * p), the model copy written too.
 * Element rules are the CPU's own (apex__adamp_moments, _perturb and _apply in backend/optim_rules.h; compiled
 * with -fmad=false like optim.cu).
 * Every launch reads the skip flag and the loss scale on the device. AdamP is not among the benchmarks:
 * a launch per parameter keeps this simple. */
#include <cuda_runtime.h>
#include <math.h>

extern "C" {
#include "core/internal.h"
#include "backend/cuda/cuda_internal.h"
#include "backend/optim_rules.h"
}
#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/dtype_dev.cuh"

#define ROW_THREADS 256

/* What decide leaves for apply: the mode (0 no projection, 1 per row, 2 whole tensor) and two floats. */
struct AdampMeta {
  int mode;
  float step_size, decay;
};

struct AdampRule {
  float inv_scale, beta1, beta2, eps, lr, weight_decay, delta, wd_ratio;
  int nesterov;
  const float *d_lr; /* when set, the learning rate is read there */
  const float *d_scale;
  const int *d_skip;
};

static __device__ bool skipped(const AdampRule &r) { return r.d_skip && *r.d_skip; }

/* A sum of four doubles over the block in a fixed order: warps by shuffles, then warp 0 over warps. */
static __device__ void block_sum4(double v[4], double (*scratch)[ROW_THREADS / 32]) {
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int j = 0; j < 4; j++) {
    v[j] = warp_sum(v[j]);
    if (lane == 0) scratch[j][warp] = v[j];
  }
  __syncthreads();
  if (warp == 0)
    for (int j = 0; j < 4; j++) {
      v[j] = warp_sum(lane < ROW_THREADS / 32 ? scratch[j][lane] : 0.0);
    }
}

__global__ void __launch_bounds__(ROW_THREADS)
    adamp_rows(AdampRule r, const void *g, apex_dtype gt, const void *p, apex_dtype pt, float *m, float *v, float *u,
               int64_t len, const int64_t *d_step, double *stats) {
  if (skipped(r)) return;
  __shared__ double scratch[4][ROW_THREADS / 32];
  const float inv = r.d_scale ? r.inv_scale / *r.d_scale : r.inv_scale;
  const int64_t step = *d_step + 1;
  const float ib = (float)(1.0 / sqrt(1.0 - pow((double)r.beta2, (double)step)));
  const float b1 = r.beta1, b2 = r.beta2, nb1 = 1.0f - r.beta1, nb2 = 1.0f - r.beta2;
  const float ng = r.nesterov ? nb1 : 0.0f, nm = r.nesterov ? b1 : 1.0f;
  double s[4] = {0, 0, 0, 0};
  const int64_t base = (int64_t)blockIdx.x * len;
  for (int64_t j = threadIdx.x; j < len; j += ROW_THREADS) {
    int64_t i = base + j;
    float gi = apex_ld(g, gt, i) * inv, pi = apex_ld(p, pt, i);
    float mi = m[i], vi = v[i];
    apex__adamp_moments(gi, &mi, &vi, b1, nb1, b2, nb2);
    m[i] = mi;
    v[i] = vi;
    float ui = apex__adamp_perturb(mi, gi, sqrtf(vi), ib, r.eps, nm, ng);
    u[i] = ui;
    s[0] += (double)gi * (double)pi;
    s[1] += (double)gi * (double)gi;
    s[2] += (double)pi * (double)pi;
    s[3] += (double)pi * (double)ui;
  }
  block_sum4(s, scratch);
  if (threadIdx.x == 0)
    for (int j = 0; j < 4; j++) stats[4 * blockIdx.x + j] = s[j];
}

static __device__ double row_cos(const double *s, double eps) {
  return fabs(s[0]) / (fmax(sqrt(s[1]), eps) * fmax(sqrt(s[2]), eps));
}

/* One block. project: the tensor has 2+ dimensions and elements (else no projection is tried). rows and
 * len: the channel view (rows 1, len numel when project is 0). */
__global__ void __launch_bounds__(ROW_THREADS)
    adamp_decide(AdampRule r, const double *stats, int64_t rows, int64_t len, int project, int64_t *d_step,
                 float *coef, AdampMeta *meta) {
  if (skipped(r)) return;
  __shared__ int s_mode;
  __shared__ unsigned long long s_max;
  const double eps = r.eps;
  /* The largest row cosine: non-negative doubles order as their 64-bit patterns, so an integer
   * atomicMax finds it exactly, in any order. */
  double mine = 0.0;
  for (int64_t k = threadIdx.x; k < rows && project; k += ROW_THREADS) mine = fmax(mine, row_cos(stats + 4 * k, eps));
  if (threadIdx.x == 0) s_max = 0ull;
  __syncthreads();
  atomicMax(&s_max, (unsigned long long)__double_as_longlong(mine));
  __syncthreads();
  const double max_row = __longlong_as_double((long long)s_max);
  if (threadIdx.x == 0) {
    int mode = 0;
    if (project && max_row < (double)r.delta / sqrt((double)len)) {
      mode = 1;
    } else if (project) {
      double layer[4] = {0, 0, 0, 0};
      for (int64_t k = 0; k < rows; k++)
        for (int j = 0; j < 4; j++) layer[j] += stats[4 * k + j];
      if (row_cos(layer, eps) < (double)r.delta / sqrt((double)(len * rows))) {
        double n = sqrt(layer[2]) + eps;
        coef[0] = (float)(layer[3] / (n * n));
        mode = 2;
      }
    }
    int64_t step = *d_step + 1;
    double bc1 = 1.0 - pow((double)r.beta1, (double)step);
    float wd = mode ? r.wd_ratio : 1.0f;
    meta->mode = mode;
    const float lr = r.d_lr ? *r.d_lr : r.lr;
    meta->step_size = (float)(lr / bc1);
    meta->decay = r.weight_decay > 0.0f ? 1.0f - lr * r.weight_decay * wd : 1.0f;
    *d_step = step;
    s_mode = mode;
  }
  __syncthreads();
  if (s_mode == 1)
    for (int64_t k = threadIdx.x; k < rows; k += ROW_THREADS) {
      double n = sqrt(stats[4 * k + 2]) + eps;
      coef[k] = (float)(stats[4 * k + 3] / (n * n));
    }
}

__global__ void adamp_apply(AdampRule r, void *p, apex_dtype pt, void *model, apex_dtype mt, const float *u,
                            int64_t numel, int64_t len, const float *coef, const AdampMeta *meta) {
  if (skipped(r)) return;
  const int mode = meta->mode;
  const float ss = meta->step_size, decay = meta->decay;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < numel; i += (int64_t)gridDim.x * blockDim.x) {
    float rc = mode == 1 ? coef[i / len] : mode == 2 ? coef[0] : 0.0f;
    float pi = apex_ld(p, pt, i);
    pi = apex__adamp_apply(pi, u[i], rc, decay, ss);
    apex_st(p, pt, i, pi);
    if (model) apex_st(model, mt, i, pi);
  }
}

extern "C" apex_status apex__cuda_adamp_step(const apex__cuda_step *s) {
  const apex_optim_options *o = s->o;
  size_t most = 1, most_rows = 1;
  for (int i = 0; i < s->n; i++) {
    most = s->p.numel[i] > most ? s->p.numel[i] : most;
    most_rows = s->rows[i] > (int64_t)most_rows ? (size_t)s->rows[i] : most_rows;
  }
  /* One scratch for every parameter, reused: the launches run in order on the one stream. */
  void *d_mem = NULL;
  size_t bytes = sizeof(double) * 4 * most_rows + sizeof(AdampMeta) + sizeof(float) * (most_rows + most);
  apex_status st = apex__cuda_alloc(bytes, 0, &d_mem);
  if (st != APEX_OK) return st;
  double *d_stats = (double *)d_mem;
  AdampMeta *d_meta = (AdampMeta *)(d_stats + 4 * most_rows);
  float *d_coef = (float *)(d_meta + 1), *d_u = d_coef + most_rows;
  AdampRule r;
  r.inv_scale = s->inv_scale;
  r.beta1 = o->beta1;
  r.beta2 = o->beta2;
  r.eps = o->eps;
  r.lr = o->lr;
  r.d_lr = s->d_lr;
  r.weight_decay = o->weight_decay;
  r.delta = o->delta;
  r.wd_ratio = o->wd_ratio;
  r.nesterov = o->nesterov == APEX_OPTIM_ON;
  r.d_scale = s->d_scale;
  r.d_skip = s->d_skip;
  cudaStream_t stream = (cudaStream_t)apex__cuda_stream();
  cudaError_t e = cudaSuccess;
  for (int i = 0; i < s->n && e == cudaSuccess; i++) {
    int64_t numel = (int64_t)s->p.numel[i];
    int project = s->rows[i] > 0 && numel > 0;
    int64_t rows = project ? s->rows[i] : 1, len = numel / rows;
    int64_t *d_step = s->d_step + s->idx[i];
    adamp_rows<<<(unsigned)rows, ROW_THREADS, 0, stream>>>(r, s->g.ptr[i], s->g.dtype[i], s->p.ptr[i], s->p.dtype[i],
                                                          (float *)s->s[0].ptr[i], (float *)s->s[1].ptr[i], d_u, len,
                                                          d_step, d_stats);
    adamp_decide<<<1, ROW_THREADS, 0, stream>>>(r, d_stats, rows, len, project,
                                                d_step, d_coef, d_meta);
    if (numel > 0) {
      int64_t blocks = (numel + 255) / 256;
      adamp_apply<<<(unsigned)(blocks < 4096 ? blocks : 4096), 256, 0, stream>>>(
          r, s->p.ptr[i], s->p.dtype[i], s->model.ptr[i], s->model.dtype[i], d_u, numel, len, d_coef, d_meta);
    }
    e = cudaGetLastError();
  }
  apex__cuda_free(d_mem); /* stream-ordered: the cache hands it out again only to later work */
  if (e != cudaSuccess)
    return apex__fail(APEX_ERR_DEVICE, "AdamP step: CUDA error %s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
  return APEX_OK;
}
