/* shape.cu: the CUDA backend's reductions and layout ops, the slots of args_nn.h beside their CPU
 * reference, cpu/shape.c: sum and L2 norm over one dimension and their backward, permute and concat
 * with theirs.
 *
 * A reduction gives each line one block of 256 threads that sums in double (as the CPU does) in a fixed
 * tree (a single line over a whole tensor: a grid sized by its length, the blocks' partials added in
 * index order), so every run gives the same bits; the CPU sums left to right, so the two agree to the rounding
 * of the f32 result, not bitwise. Layout ops move elements as they are (permute) or convert them as
 * apex_convert does (concat), and their backwards add each gradient element once, in no race (a
 * permutation and a concatenation map every output to one input), so those are the CPU's bits. */
#include <math.h>

extern "C" {
#include "backend/cuda/cuda_backend.h"
#include "core/internal.h"
}
#include "backend/cuda/grad_dev.cuh"

/* ---- sum and L2 norm over a line of dim elements, `inner` apart ----------------------------------------- */

__global__ void reduce_kernel(int sq, int64_t D, int64_t inner, double scale, const void *x, apex_dtype xt, float *res) {
  __shared__ double red[8];
  int64_t l = blockIdx.x, base = (l / inner) * D * inner + l % inner;
  double s = 0;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    double v = apex_ld(x, xt, base + j * inner);
    s += sq ? v * v : v;
  }
  s = block_total256(s, red);
  if (threadIdx.x == 0) res[l] = sq ? (float)sqrt(s) : (float)(s * scale);
}

/* A single line over a whole tensor: blocks of a grid set by its length alone sum grid-stride shares
 * into partial[block], and one thread adds those in index order and finishes the value. */
#define RED_ALL_MAX_BLOCKS 1024

__global__ void reduce_all_kernel(int sq, int64_t n, const void *x, apex_dtype xt, double *partial) {
  __shared__ double red[8];
  double s = 0;
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    double v = apex_ld(x, xt, i);
    s += sq ? v * v : v;
  }
  s = block_total256(s, red);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void reduce_all_finish(int sq, const double *partial, int blocks, double scale, float *res) {
  double s = 0;
  for (int b = 0; b < blocks; b++) s += partial[b];
  *res = sq ? (float)sqrt(s) : (float)(s * scale);
}

static apex_status reduce_all(int sq, int64_t n, double scale, const void *x, apex_dtype xt, float *res) {
  int64_t want = (n + 256 * 8 - 1) / (256 * 8);
  int blocks = (int)(want < 1 ? 1 : want > RED_ALL_MAX_BLOCKS ? RED_ALL_MAX_BLOCKS : want);
  double *partial = NULL;
  apex_status st = apex__cuda_alloc((size_t)blocks * sizeof(double), 0, (void **)&partial);
  if (st != APEX_OK) return st;
  reduce_all_kernel<<<blocks, 256, 0, nn_stream()>>>(sq, n, x, xt, partial);
  reduce_all_finish<<<1, 1, 0, nn_stream()>>>(sq, partial, blocks, scale, res);
  st = apex__cuda_check_launch("nn_reduce");
  apex__cuda_free(partial); /* the caching allocator reuses it only for work queued after these kernels */
  return st;
}

extern "C" apex_status apex__cuda_slot_nn_reduce(const apex_nn_reduce_args *a) {
  size_t nl = a->outer * a->inner;
  int sq = a->kind == APEX_NN_REDUCE_NORM;
  float *res = sq ? a->norms : a->out;
  if (!nl) return APEX_OK;
  if (nl > (size_t)INT32_MAX) return apex__fail(APEX_ERR_UNSUPPORTED, "nn_reduce: %zu lines on the cuda backend (at most %d)", nl, INT32_MAX);
  apex_status st;
  if (nl == 1) {
    st = reduce_all(sq, (int64_t)a->dim, a->scale, a->x.data, a->x.dtype, res);
  } else {
    reduce_kernel<<<(unsigned)nl, 256, 0, nn_stream()>>>(sq, (int64_t)a->dim, (int64_t)a->inner, a->scale, a->x.data, a->x.dtype, res);
    st = apex__cuda_check_launch("nn_reduce");
  }
  if (st == APEX_OK && sq && a->out != res) st = apex__cuda_memcpy(a->out, res, nl * sizeof(float), APEX__D2D, 0);
  return st;
}

/* gx += gout of the line times scale (SUM), or times x / norm, nothing where the norm is 0 (NORM). */
__global__ void reduce_bwd_kernel(int sq, int64_t n, int64_t D, int64_t inner, float s, const void *x, apex_dtype xt,
                                  const float *nrm, const float *go, float *gx, int acc) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t l = (i / (D * inner)) * inner + i % inner;
    if (!sq) {
      grad_put(gx, i, go[l] * s, acc);
    } else if (nrm[l] != 0.0f) {
      grad_put(gx, i, go[l] * (apex_ld(x, xt, i) / nrm[l]), acc);
    } else if (!acc) {
      gx[i] = 0.0f;
    }
  }
}

extern "C" apex_status apex__cuda_slot_nn_reduce_bwd(const apex_nn_reduce_bwd_args *a) {
  int64_t n = (int64_t)(a->outer * a->dim * a->inner);
  if (!n) return APEX_OK;
  reduce_bwd_kernel<<<apex_grid(n, 256, 4), 256, 0, nn_stream()>>>(a->kind == APEX_NN_REDUCE_NORM, n, (int64_t)a->dim,
                                                                    (int64_t)a->inner, a->scale, a->x.data, a->x.dtype, a->norms,
                                                                    a->gout, a->gx, a->accumulate_x);
  return apex__cuda_check_launch("nn_reduce_bwd");
}

/* ---- permute ------------------------------------------------------------------------------------------- */

/* The geometry by value: the output's shape and the input's strides in the output's dimension order. */
struct PermGeom {
  int nd;
  int64_t shape[APEX_MAX_DIMS], st[APEX_MAX_DIMS];
};

/* The input offset of output element oi. */
__device__ __forceinline__ int64_t perm_src(const PermGeom &g, int64_t oi) {
  int64_t ii = 0;
  for (int d = g.nd - 1; d >= 0; d--) {
    ii += (oi % g.shape[d]) * g.st[d];
    oi /= g.shape[d];
  }
  return ii;
}

template <typename W>
__global__ void permute_kernel(PermGeom g, int64_t n, const W *x, W *out) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = x[perm_src(g, i)];
}

/* Each input element is one output's: its gradient is written by one thread. */
__global__ void permute_bwd_kernel(PermGeom g, int64_t n, const float *go, float *gx, int acc) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) grad_put(gx, perm_src(g, i), go[i], acc);
}

static PermGeom perm_geom(int nd, const int64_t *shape, const int64_t *st) {
  PermGeom g;
  g.nd = nd;
  for (int d = 0; d < nd; d++) g.shape[d] = shape[d], g.st[d] = st[d];
  return g;
}

extern "C" apex_status apex__cuda_slot_nn_permute(const apex_nn_permute_args *a) {
  int64_t n = (int64_t)a->n;
  if (!n) return APEX_OK;
  PermGeom g = perm_geom(a->ndim, a->shape, a->strides);
  if (apex_dtype_size(a->dtype) == 2)
    permute_kernel<uint16_t><<<apex_grid(n, 256, 4), 256, 0, nn_stream()>>>(g, n, (const uint16_t *)a->x, (uint16_t *)a->out);
  else
    permute_kernel<uint32_t><<<apex_grid(n, 256, 4), 256, 0, nn_stream()>>>(g, n, (const uint32_t *)a->x, (uint32_t *)a->out);
  return apex__cuda_check_launch("nn_permute");
}

extern "C" apex_status apex__cuda_slot_nn_permute_bwd(const apex_nn_permute_bwd_args *a) {
  int64_t n = (int64_t)a->n;
  if (!n) return APEX_OK;
  permute_bwd_kernel<<<apex_grid(n, 256, 4), 256, 0, nn_stream()>>>(perm_geom(a->ndim, a->shape, a->strides), n, a->gout, a->gx,
                                                                     a->accumulate_x);
  return apex__cuda_check_launch("nn_permute_bwd");
}

/* ---- concat: one launch per input, into its columns [at, at + w) of each of the outer rows ------------- */

__global__ void concat_kernel(int64_t total, int64_t w, int64_t row, int64_t at, const void *x, apex_dtype xt, void *out,
                              apex_dtype ot) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
    int64_t o = (e / w) * row + at + e % w;
    if (xt == ot && ot != APEX_F32) ((uint16_t *)out)[o] = ((const uint16_t *)x)[e]; /* same dtype: the bits as they are */
    else apex_st(out, ot, o, apex_ld(x, xt, e));
  }
}

__global__ void concat_bwd_kernel(int64_t total, int64_t w, int64_t row, int64_t at, const float *go, float *gx, int acc) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride)
    grad_put(gx, e, go[(e / w) * row + at + e % w], acc);
}

extern "C" apex_status apex__cuda_slot_nn_concat(const apex_nn_concat_args *a) {
  size_t at = 0;
  apex_status st = APEX_OK;
  for (int k = 0; k < a->n && st == APEX_OK; k++) {
    int64_t w = (int64_t)a->width[k], total = (int64_t)a->outer * w;
    if (total) {
      concat_kernel<<<apex_grid(total, 256, 4), 256, 0, nn_stream()>>>(total, w, (int64_t)a->row, (int64_t)at, a->x[k], a->x_dtype[k],
                                                                      a->out, a->out_dtype);
      st = apex__cuda_check_launch("nn_concat");
    }
    at += a->width[k];
  }
  return st;
}

extern "C" apex_status apex__cuda_slot_nn_concat_bwd(const apex_nn_concat_bwd_args *a) {
  size_t at = 0;
  apex_status st = APEX_OK;
  for (int k = 0; k < a->n && st == APEX_OK; k++) {
    int64_t w = (int64_t)a->width[k], total = (int64_t)a->outer * w;
    if (total && a->gx[k]) {
      concat_bwd_kernel<<<apex_grid(total, 256, 4), 256, 0, nn_stream()>>>(total, w, (int64_t)a->row, (int64_t)at, a->gout, a->gx[k],
                                                                          a->accumulate[k]);
      st = apex__cuda_check_launch("nn_concat_bwd");
    }
    at += a->width[k];
  }
  return st;
}
