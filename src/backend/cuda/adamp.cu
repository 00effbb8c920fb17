/* adamp.cu: AdamP on the GPU, the rule of backend/cpu/optim_adamp.c (read its header), in launches that queue
 * without a host synchronisation, each over up to ADAMP_TABLE parameters (apply: all of them):
 *   rows     one block per row of each parameter's channel view (the first dimension; the whole tensor for
 *            0/1-D): m, v and perturb u (u into a scratch that holds every parameter's), and the row's sums
 *            <g,p>, <g,g>, <p,p>, <p,u> in f64 (each thread in index order, then the block in a fixed tree:
 *            another order than the CPU's, so the sums, and the projection coefficients made from them, may
 *            differ from it in the last bits; the parity test allows for that);
 *   decide   one block per parameter: the largest |cos(g, p)| over rows against delta / sqrt(row length),
 *            then the layer view (the rows' sums added in row order, as the CPU does, by one thread from
 *            rows the block stages in shared memory), the per-row projection coefficients, the decay,
 *            lr / bc1, into the parameter's AdampMeta; then its step count advances;
 *   apply    every parameter in one walk (mt_ilp.cuh, as optim.cu's kinds): p = p * decay - lr / bc1 *
 *            (u - coef[row] * p), the model copy written too.
 * Element rules are the CPU's own (apex__adamp_moments, _perturb and _apply in backend/optim_rules.h; compiled
 * with -fmad=false like optim.cu). Every launch reads the skip flag and the loss scale on the device.
 *
 * The step moves, per f32 parameter, 40 bytes: rows reads g, p, m, v and writes m, v, u (28), apply reads p,
 * u and writes p (12); f16/bf16 gradients and model copies take 2 bytes where f32 ones take 4. Apply is
 * elementwise and walks every parameter at once (t.id[k] finds its AdampMeta; a row's coefficient, when the
 * channel view projects, is looked up per element). Rows stays a block per row: its sums are per row, which
 * the walk has no place for, and taking them in a pass of their own would read g, p and u again (12 bytes
 * more per parameter, 40 where the fused pass moves 28). Its threads load ROW_BATCH elements of every list
 * before computing any, with the dtypes compiled in for f32 values (rows_kernel). */
#include <cuda_runtime.h>
#include <math.h>

extern "C" {
#include "core/internal.h"
#include "backend/cuda/cuda_internal.h"
#include "backend/optim_rules.h"
}
#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/dtype_dev.cuh"
#include "backend/cuda/mt_ilp.cuh"

#define ROW_THREADS 256
#define ROW_BATCH 4 /* elements of each list a thread of the rows pass has in flight */
#define DECIDE_ROWS 256 /* rows' sums decide stages in shared memory at a time (8 KB) */

/* What decide leaves for apply, per parameter: the mode (0 no projection, 1 per row, 2 whole tensor), lr / bc1,
 * the decay, the whole tensor's coefficient (mode 2), and for mode 1 the rows' coefficients and the row
 * length (with its reciprocal, to find an element's row without a 64-bit division). */
struct AdampMeta {
  int mode;
  float step_size, decay, rc;
  int64_t len;
  double inv_len;
  const float *row_coef;
};

struct AdampRule {
  float inv_scale, beta1, beta2, eps, lr, weight_decay, delta, wd_ratio;
  int nesterov;
  const float *d_lr; /* when set, the learning rate is read there */
  const float *d_scale;
  const int *d_skip;
};

static __device__ bool skipped(const AdampRule &r) { return r.d_skip && *r.d_skip; }

/* One rows launch and one decide launch cover up to ADAMP_TABLE parameters, their pointers in the kernels'
 * parameters (about 10 KB): a launch per parameter would run each parameter's few waves of rows, and its tail,
 * alone. A parameter that is not projected is one row (len: numel); an empty one a row of length 0. */
#define ADAMP_TABLE 128
struct AdampTable {
  const void *g[ADAMP_TABLE], *p[ADAMP_TABLE];
  float *m[ADAMP_TABLE], *v[ADAMP_TABLE], *u[ADAMP_TABLE];
  int64_t *step[ADAMP_TABLE];
  int64_t len[ADAMP_TABLE];
  int64_t row0[ADAMP_TABLE + 1]; /* each parameter's first row among the table's; row0[n]: all its rows */
  uint8_t gt[ADAMP_TABLE], pt[ADAMP_TABLE], project[ADAMP_TABLE];
  int n;
};

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

/* Rows for gradients of dtype G and values of dtype P (compile-time ones, or MT_DYN: the run-time gt, pt). */
template <int G, int P>
__global__ void __launch_bounds__(ROW_THREADS)
    adamp_rows(AdampRule r, const __grid_constant__ AdampTable t, double *stats) {
  if (skipped(r)) return;
  __shared__ double scratch[4][ROW_THREADS / 32];
  /* This block's row: of parameter k, the last one whose first row is not past it. */
  int k = 0, hi = t.n - 1;
  while (k < hi) {
    const int mid = (k + hi + 1) / 2;
    if (t.row0[mid] <= (int64_t)blockIdx.x) k = mid;
    else hi = mid - 1;
  }
  const void *__restrict__ g = t.g[k];
  const void *__restrict__ p = t.p[k];
  float *__restrict__ m = t.m[k];
  float *__restrict__ v = t.v[k];
  float *__restrict__ u = t.u[k];
  const apex_dtype gt = (apex_dtype)t.gt[k], pt = (apex_dtype)t.pt[k];
  const int64_t len = t.len[k], *d_step = t.step[k];
  const float inv = r.d_scale ? r.inv_scale / *r.d_scale : r.inv_scale;
  const int64_t step = *d_step + 1;
  const float ib = (float)(1.0 / sqrt(1.0 - pow((double)r.beta2, (double)step)));
  const float b1 = r.beta1, b2 = r.beta2, nb1 = 1.0f - r.beta1, nb2 = 1.0f - r.beta2;
  const float ng = r.nesterov ? nb1 : 0.0f, nm = r.nesterov ? b1 : 1.0f;
  double s[4] = {0, 0, 0, 0};
  const int64_t base = ((int64_t)blockIdx.x - t.row0[k]) * len;
  /* ROW_BATCH elements a thread, ROW_THREADS apart, loaded before any is computed (the buffers do not overlap:
   * restrict; the dtypes are compiled in), so their loads are in flight together; each thread still adds its
   * elements to the sums in index order. */
  for (int64_t j0 = threadIdx.x; j0 < len; j0 += (int64_t)ROW_BATCH * ROW_THREADS) {
    float gv[ROW_BATCH] = {}, pv[ROW_BATCH] = {}, mv[ROW_BATCH] = {}, vv[ROW_BATCH] = {};
#pragma unroll
    for (int b = 0; b < ROW_BATCH; b++) {
      const int64_t j = j0 + (int64_t)b * ROW_THREADS, i = base + j;
      if (j >= len) continue;
      gv[b] = mt_ld1<G>(g, gt, i);
      pv[b] = mt_ld1<P>(p, pt, i);
      mv[b] = m[i];
      vv[b] = v[i];
    }
#pragma unroll
    for (int b = 0; b < ROW_BATCH; b++) {
      const int64_t j = j0 + (int64_t)b * ROW_THREADS, i = base + j;
      if (j >= len) continue;
      float gi = gv[b] * inv, pi = pv[b], mi = mv[b], vi = vv[b];
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
  }
  block_sum4(s, scratch);
  if (threadIdx.x == 0)
    for (int j = 0; j < 4; j++) stats[4 * blockIdx.x + j] = s[j];
}

static __device__ double row_cos(const double *s, double eps) {
  return fabs(s[0]) / (fmax(sqrt(s[1]), eps) * fmax(sqrt(s[2]), eps));
}

/* One block per parameter of the table, with the stats, coef and meta of the table's first row and parameter.
 * project: the tensor has 2+ dimensions and elements (else no projection is tried). rows and len: the channel
 * view (rows 1, len numel when project is 0). */
__global__ void __launch_bounds__(ROW_THREADS)
    adamp_decide(AdampRule r, const __grid_constant__ AdampTable t, const double *stats, float *coef,
                 AdampMeta *meta) {
  if (skipped(r)) return;
  const int kk = (int)blockIdx.x;
  const int64_t rows = t.row0[kk + 1] - t.row0[kk], len = t.len[kk];
  const int project = t.project[kk];
  int64_t *d_step = t.step[kk];
  stats += 4 * t.row0[kk];
  coef += t.row0[kk];
  meta += kk;
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
  const bool per_row = project && max_row < (double)r.delta / sqrt((double)len), whole = project && !per_row;
  /* The layer view: thread 0 adds the rows' sums in row order (the CPU's), from DECIDE_ROWS rows at a time
   * that the block has staged in shared memory, so that its serial adds wait on shared memory rather than on
   * one L2 read after another. (whole is the same in every thread: every thread reaches the barriers.) */
  __shared__ double s_rows[DECIDE_ROWS * 4];
  double layer[4] = {0, 0, 0, 0};
  for (int64_t k0 = 0; whole && k0 < rows; k0 += DECIDE_ROWS) {
    const int nr = rows - k0 < DECIDE_ROWS ? (int)(rows - k0) : DECIDE_ROWS;
    for (int x = threadIdx.x; x < 4 * nr; x += ROW_THREADS) s_rows[x] = stats[4 * k0 + x];
    __syncthreads();
    if (threadIdx.x == 0)
      for (int k = 0; k < nr; k++)
        for (int j = 0; j < 4; j++) layer[j] += s_rows[4 * k + j];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    int mode = 0;
    if (per_row) {
      mode = 1;
    } else if (whole) {
      if (row_cos(layer, eps) < (double)r.delta / sqrt((double)(len * rows))) {
        double n = sqrt(layer[2]) + eps;
        meta->rc = (float)(layer[3] / (n * n));
        mode = 2;
      }
    }
    int64_t step = *d_step + 1;
    double bc1 = 1.0 - pow((double)r.beta1, (double)step);
    float wd = mode ? r.wd_ratio : 1.0f;
    meta->mode = mode;
    if (mode != 2) meta->rc = 0.0f;
    meta->len = len;
    meta->inv_len = len > 0 ? 1.0 / (double)len : 0.0;
    meta->row_coef = coef;
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

typedef void (*rows_fn)(AdampRule, AdampTable, double *);

/* The rows instance for a group: f32 values (the parameters or their masters) with one gradient dtype, f32,
 * f16 or bf16, compiled in; any other group read by run-time dtypes. */
static rows_fn rows_kernel(const apex__cuda_step *s) {
  const int gd = mt_list_dtype(&s->g, 0), pd = mt_list_dtype(&s->p, 0);
  if (pd == APEX_F32 && gd == APEX_F32) return adamp_rows<APEX_F32, APEX_F32>;
  if (pd == APEX_F32 && gd == APEX_F16) return adamp_rows<APEX_F16, APEX_F32>;
  if (pd == APEX_F32 && gd == APEX_BF16) return adamp_rows<APEX_BF16, APEX_F32>;
  return adamp_rows<MT_DYN, MT_DYN>;
}

/* Lists of the apply walk: 0 g (element counts), 1 p (f32 master or parameter), 2 model copy, 5 u. */
enum { L_G, L_P, L_MODEL, L_U = 5 };
enum { K_SS, K_DECAY, K_MODE, K_RC };

/* Apply for updated values of dtype P and model copies of dtype M (MT_NONE: none). */
template <int P, int M>
struct AdampApply {
  static constexpr bool vec = P != MT_DYN && M != MT_DYN;
  const AdampMeta *d_meta; /* per entry of the call's lists (t.id) */
  const int *d_skip;

  __device__ bool live() const { return !(d_skip && *d_skip); }

  __device__ void coefs(const MtWideTable &t, int k, float *coef) const {
    const AdampMeta &m = d_meta[t.id[k]];
    coef[K_SS] = m.step_size;
    coef[K_DECAY] = m.decay;
    coef[K_MODE] = (float)m.mode;
    coef[K_RC] = m.rc;
  }

  __device__ bool aligned(const MtWideTable &t, int k) const {
    bool ok = mt_aligned<P>(t.ptr[L_P][k]) && mt_aligned<APEX_F32>(t.ptr[L_U][k]);
    if constexpr (M != MT_NONE) ok = ok && mt_aligned<M>(t.ptr[L_MODEL][k]);
    return ok;
  }

  template <bool VEC>
  __device__ __forceinline__ void apply(const MtWideTable &t, int k, int64_t i0, int64_t stride, int64_t end,
                                        const float (&coef)[MT_COEFS]) const {
    float p[MT_BATCH] = {}, u[MT_BATCH] = {}, rc[MT_BATCH];
    mt_load<P, VEC>(t.ptr[L_P][k], (apex_dtype)t.dtype[L_P][k], i0, stride, end, p);
    mt_load<APEX_F32, VEC>(t.ptr[L_U][k], APEX_F32, i0, stride, end, u);
#pragma unroll
    for (int j = 0; j < MT_BATCH; j++) rc[j] = coef[K_RC];
    if (coef[K_MODE] == 1.0f) { /* per row: element e's row is e / len, from the reciprocal and one correction */
      const AdampMeta &m = d_meta[t.id[k]];
#pragma unroll
      for (int j = 0; j < MT_BATCH; j++) {
        const int64_t lane = VEC ? i0 + (j / MT_ILP) * stride : i0 + j * stride;
        if (lane >= end) continue;
        const int64_t e = VEC ? lane * MT_ILP + j % MT_ILP : lane;
        int64_t row = (int64_t)((double)e * m.inv_len); /* within one of e / len below 2^52 elements */
        if (row * m.len > e) row--;
        else if ((row + 1) * m.len <= e) row++;
        rc[j] = m.row_coef[row];
      }
    }
#pragma unroll
    for (int j = 0; j < MT_BATCH; j++) p[j] = apex__adamp_apply(p[j], u[j], rc[j], coef[K_DECAY], coef[K_SS]);
    mt_store_param<P, M, VEC>(t, L_P, L_MODEL, k, i0, stride, end, p);
  }
};

/* mt_typed's launch of apply (the gradient's dtype does not enter it). */
struct ApplyLaunch {
  const apex__cuda_list *const *lists;
  const AdampMeta *d_meta;
  const int *d_skip;
  template <int G, int P, int M>
  cudaError_t run() const {
    AdampApply<P, M> op;
    op.d_meta = d_meta;
    op.d_skip = d_skip;
    return mt_apply_wide(MT_LISTS, lists, op);
  }
};

extern "C" apex_status apex__cuda_adamp_step(const apex__cuda_step *s) {
  const apex_optim_options *o = s->o;
  /* One scratch: u for every parameter (each from a multiple of MT_ILP floats, so that apply's vectors are
   * aligned), the rows' sums, each parameter's AdampMeta, the rows' coefficients. */
  size_t total = 0, all_rows = 0;
  for (int i = 0; i < s->n; i++) {
    total += (s->p.numel[i] + MT_ILP - 1) / MT_ILP * MT_ILP;
    all_rows += s->rows[i] > 0 && s->p.numel[i] > 0 ? (size_t)s->rows[i] : 1;
  }
  void *d_mem = NULL;
  size_t bytes = sizeof(float) * total + sizeof(double) * 4 * all_rows + sizeof(AdampMeta) * (size_t)(s->n ? s->n : 1) +
                 sizeof(float) * all_rows;
  apex_status st = apex__cuda_alloc(bytes, 0, &d_mem);
  if (st != APEX_OK) return st;
  float *d_u = (float *)d_mem;
  double *d_stats = (double *)(d_u + total);
  AdampMeta *d_meta = (AdampMeta *)(d_stats + 4 * all_rows);
  float *d_coef = (float *)(d_meta + (s->n ? s->n : 1));
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
  apex__cuda_list u = s->p, none = s->p;
  void **u_ptr = (void **)malloc(sizeof(void *) * (size_t)(s->n ? s->n : 1));
  apex_dtype *u_dt = (apex_dtype *)malloc(sizeof(apex_dtype) * (size_t)(s->n ? s->n : 1));
  if (!u_ptr || !u_dt) {
    free(u_ptr);
    free(u_dt);
    apex__cuda_free(d_mem);
    return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_optimizer_step: out of memory");
  }
  cudaStream_t stream = (cudaStream_t)apex__cuda_stream();
  cudaError_t e = cudaSuccess;
  const rows_fn rows_launch = rows_kernel(s);
  AdampTable t;
  t.n = 0;
  t.row0[0] = 0;
  size_t off = 0, first_row = 0; /* u's next offset; the table's first row among the call's */
  int first = 0;                 /* the table's first parameter */
  for (int i = 0; i < s->n && e == cudaSuccess; i++) {
    int64_t numel = (int64_t)s->p.numel[i];
    int project = s->rows[i] > 0 && numel > 0;
    int64_t rows = project ? s->rows[i] : 1;
    const int k = t.n++;
    t.g[k] = s->g.ptr[i];
    t.p[k] = s->p.ptr[i];
    t.m[k] = (float *)s->s[0].ptr[i];
    t.v[k] = (float *)s->s[1].ptr[i];
    t.u[k] = d_u + off;
    t.step[k] = s->d_step + s->idx[i];
    t.len[k] = numel / rows;
    t.row0[k + 1] = t.row0[k] + rows;
    t.gt[k] = (uint8_t)s->g.dtype[i];
    t.pt[k] = (uint8_t)s->p.dtype[i];
    t.project[k] = (uint8_t)project;
    u_ptr[i] = d_u + off;
    u_dt[i] = APEX_F32;
    off += (s->p.numel[i] + MT_ILP - 1) / MT_ILP * MT_ILP;
    if (t.n == ADAMP_TABLE || i == s->n - 1) {
      rows_launch<<<(unsigned)t.row0[t.n], ROW_THREADS, 0, stream>>>(r, t, d_stats + 4 * first_row);
      adamp_decide<<<(unsigned)t.n, ROW_THREADS, 0, stream>>>(r, t, d_stats + 4 * first_row, d_coef + first_row,
                                                             d_meta + first);
      e = cudaGetLastError();
      first_row += (size_t)t.row0[t.n];
      first += t.n;
      t.n = 0;
    }
  }
  if (e == cudaSuccess) {
    u.ptr = u_ptr;
    u.dtype = u_dt;
    const apex__cuda_list *lists[MT_LISTS] = {&s->g, &s->p, &s->model, &none, &none, &u, &none};
    e = mt_typed(&s->g, &s->p, &s->model, ApplyLaunch{lists, d_meta, s->d_skip});
  }
  free(u_ptr);
  free(u_dt);
  apex__cuda_free(d_mem); /* stream-ordered: the cache hands it out again only to later work */
  if (e != cudaSuccess)
    return apex__fail(APEX_ERR_DEVICE, "AdamP step: CUDA error %s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
  return APEX_OK;
}
