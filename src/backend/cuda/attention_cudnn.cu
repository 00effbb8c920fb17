/* attention_cudnn.cu: scaled-dot-product attention, forward and backward, through cuDNN 9's fused
 * attention engine (its backend API, in C: no cudnn-frontend), on the heads-in-place geometry of
 * flash_attention.cu (cuda_internal.h, apex__cuda_sdpa_fwd/bwd).
 *
 * cuDNN has no single attention call before 9.13 and its unified SDPA operation takes a causal mask only
 * from 9.21, so the operation is written as the graph of matmul, pointwise and reduction operations that
 * cuDNN's runtime fusion recognises as "fused flash attention" and runs as one kernel (the graph that
 * cudnn-frontend's SDPA nodes lower to on every cuDNN 9, which llm.c and PyTorch's cuDNN attention use).
 * Per head, with s = 1 / sqrt(d):
 *   forward:  S = q k^T (f32), S *= s, [causal: S = select(row >= col, S, -inf)], M = rowmax(S),
 *             E = exp(S - M), Z = rowsum(E), L = M + log Z (written: the "stats"), P = E / Z (f16/bf16),
 *             o = P v;
 *   backward: Dsum = rowsum(dO o O) (a workspace tensor cuDNN writes and reads), S = s q k^T - L,
 *             [causal mask], P = exp(S), dV = P^T dO, dP = dO v^T, dS = s P (dP - Dsum), dK = dS^T q,
 *             dQ = dS k (straight into dq: cuDNN's deterministic variant; or into an f32 accumulator that
 *             cuDNN adds to with atomics, then copied: its faster one).
 * The strides put element (b, h, i, j) of q at (b t + i) ld_q + h d + j, so GPT's packed qkv is read in
 * place; k and v enter transposed ([b, h, d, t] views of the same memory) where the graph multiplies by
 * k^T, v^T. Intermediate tensors are virtual (never in memory), f32, except P, P^T and dS^T, which enter
 * their products in the inputs' dtype (as the fused kernel rounds them). Scalars go by value.
 *
 * The stats slot holds (m, r) per row with L = m - log r (args_nn.h); cuDNN reads and writes L, so a small
 * kernel turns L into (L, 1) after the forward and (m, r) into L before the backward.
 *
 * Plans: the graph is built, its engine chosen (heuristics mode A, then the fallback list; the first
 * configuration that finalises) and its execution plan kept, once per geometry, dtype, causal flag and
 * direction, under a lock; a refusal is kept as well, with its reason, so that a shape cuDNN does not take
 * costs one attempt. A call builds only a variant pack (the pointers) and executes the plan on apex's
 * stream; the workspace (cuDNN's and the graph's own tensors) comes from the caching allocator and goes
 * back once the work is queued. */
#include <cuda_runtime.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "core/internal.h"
#include "backend/cuda/cuda_internal.h"
}
#include "backend/cuda/cudnn_lib.h"
#include "backend/cuda/dtype_dev.cuh"

#define SDPA_FWD "apex__cuda_sdpa_fwd"
#define SDPA_BWD "apex__cuda_sdpa_bwd"

namespace {

/* CUDNN_ATTR_OPERATIONGRAPH_HANDLE and CUDNN_ATTR_EXECUTION_PLAN_HANDLE: marked deprecated in cuDNN 9.x's
 * headers (their replacement, the device-properties descriptor, exists from 9.8 only), yet cuDNN before 9.8
 * needs them; named by value so that the deprecation does not stop a warning-free build. */
const cudnnBackendAttributeName_t ATTR_GRAPH_HANDLE = (cudnnBackendAttributeName_t)800;
const cudnnBackendAttributeName_t ATTR_PLAN_HANDLE = (cudnnBackendAttributeName_t)400;

/* The tensors a call passes (unique ids of the graph); virtual tensors are numbered from VIRTUAL up. */
enum {
  UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG_INF, UID_DO, UID_DQ, UID_DK, UID_DV, UID_DSUM, UID_ONE,
  UID_DQ_ACC, VIRTUAL = 100
};

enum { MAX_DESC = 224, MAX_OPS = 48, MAX_CFG = 16, CACHE_SIZE = 64 };

/* A graph under construction: every descriptor made for it (destroyed together, or kept with the plan),
 * its operations in order, and the first cuDNN failure (later calls do nothing once one failed). */
struct Graph {
  cudnnBackendDescriptor_t desc[MAX_DESC];
  int n;
  cudnnBackendDescriptor_t ops[MAX_OPS];
  int nops;
  int64_t next_uid;
  cudnnStatus_t bad;
  const char *what; /* what failed */
};

cudnnBackendDescriptor_t make(Graph *g, cudnnBackendDescriptorType_t type, const char *what) {
  cudnnBackendDescriptor_t d = NULL;
  if (g->bad != CUDNN_STATUS_SUCCESS) return NULL;
  if (g->n == MAX_DESC) {
    g->bad = CUDNN_STATUS_NOT_SUPPORTED, g->what = "descriptor count";
    return NULL;
  }
  cudnnStatus_t s = apex__dnn.cudnnBackendCreateDescriptor(type, &d);
  if (s != CUDNN_STATUS_SUCCESS) {
    g->bad = s, g->what = what;
    return NULL;
  }
  return g->desc[g->n++] = d;
}

void set(Graph *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
         const void *value, const char *what) {
  if (g->bad != CUDNN_STATUS_SUCCESS) return;
  cudnnStatus_t s = apex__dnn.cudnnBackendSetAttribute(d, name, type, count, value);
  if (s != CUDNN_STATUS_SUCCESS) g->bad = s, g->what = what;
}

void finish(Graph *g, cudnnBackendDescriptor_t d, const char *what) {
  if (g->bad != CUDNN_STATUS_SUCCESS) return;
  cudnnStatus_t s = apex__dnn.cudnnBackendFinalize(d);
  if (s != CUDNN_STATUS_SUCCESS) g->bad = s, g->what = what;
}

void add_op(Graph *g, cudnnBackendDescriptor_t op) {
  if (g->bad != CUDNN_STATUS_SUCCESS) return;
  if (g->nops == MAX_OPS) g->bad = CUDNN_STATUS_NOT_SUPPORTED, g->what = "operation count";
  else g->ops[g->nops++] = op;
}

void destroy_all(Graph *g) {
  for (int i = g->n - 1; i >= 0; i--) apex__dnn.cudnnBackendDestroyDescriptor(g->desc[i]);
  g->n = 0;
}

/* A 4-d tensor: uid 0 makes a virtual one (a fresh id); by_value: a host scalar passed in the variant pack. */
cudnnBackendDescriptor_t tensor(Graph *g, int64_t uid, cudnnDataType_t dt, const int64_t dim[4], const int64_t stride[4],
                                bool by_value = false) {
  const bool virt = uid == 0;
  if (virt) uid = g->next_uid++;
  const int64_t align = 16;
  cudnnBackendDescriptor_t t = make(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor descriptor");
  set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor id");
  set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor data type");
  set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim, "tensor dimensions");
  set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, stride, "tensor strides");
  set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
  set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt, "tensor virtual flag");
  if (by_value) set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, "tensor by-value flag");
  finish(g, t, "tensor");
  return t;
}

/* y = mode(x[, b[, t]]) elementwise, computed in prec; axis for GEN_INDEX (the index along that dimension). */
void pointwise(Graph *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
               cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, int64_t axis = -1) {
  cudnnBackendDescriptor_t pw = make(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise descriptor");
  set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
  set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise precision");
  if (mode == CUDNN_POINTWISE_GEN_INDEX) set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
  finish(g, pw, "pointwise descriptor");
  cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise operation");
  const float one = 1.0f;
  set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw, "pointwise op descriptor");
  set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "pointwise x");
  if (b) set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, "pointwise b");
  if (t) set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, "pointwise t");
  set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "pointwise y");
  set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one, "pointwise alpha1");
  set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one, "pointwise alpha2");
  finish(g, op, "pointwise operation");
  add_op(g, op);
}

/* An operation of type `type` whose attributes names[i] are the descriptors descs[i], added to the graph. */
void operation(Graph *g, cudnnBackendDescriptorType_t type, const char *what, int n, const cudnnBackendAttributeName_t *names,
               const cudnnBackendDescriptor_t *descs) {
  cudnnBackendDescriptor_t op = make(g, type, what);
  for (int i = 0; i < n; i++) set(g, op, names[i], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &descs[i], what);
  finish(g, op, what);
  add_op(g, op);
}

/* y = the reduction of x over the dimensions where y has extent 1, in f32. */
void reduction(Graph *g, cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t r = make(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction descriptor");
  set(g, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, "reduction precision");
  set(g, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, "reduction operator");
  finish(g, r, "reduction descriptor");
  const cudnnBackendAttributeName_t names[] = {CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_ATTR_OPERATION_REDUCTION_XDESC,
                                               CUDNN_ATTR_OPERATION_REDUCTION_YDESC};
  const cudnnBackendDescriptor_t descs[] = {r, x, y};
  operation(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction operation", 3, names, descs);
}

/* c = a b over the last two dimensions, batched over the first two, accumulated in f32. */
void matmul(Graph *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t mm = make(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul descriptor");
  set(g, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, "matmul precision");
  finish(g, mm, "matmul descriptor");
  const cudnnBackendAttributeName_t names[] = {CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_ATTR_OPERATION_MATMUL_BDESC,
                                               CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_ATTR_OPERATION_MATMUL_DESC};
  const cudnnBackendDescriptor_t descs[] = {a, b, c, mm};
  operation(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul operation", 4, names, descs);
}

/* y = x seen through y's dimensions and strides (the transposes of P, dS and k). */
void reshape(Graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
  const cudnnBackendAttributeName_t names[] = {CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_ATTR_OPERATION_RESHAPE_YDESC};
  const cudnnBackendDescriptor_t descs[] = {x, y};
  operation(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape operation", 2, names, descs);
}

/* What a plan is kept for. Zero-filled before use, so that memcmp compares it. */
struct Key {
  int backward, causal, nondet, dtype;
  int batch, heads, t, d;
  int64_t ld[8]; /* q, k, v, o, dout, dq, dk, dv (the forward's last four 0) */
};

struct Entry {
  Key key;
  Graph *graph; /* the descriptors the plan was made from; NULL for a refusal */
  cudnnBackendDescriptor_t plan;
  int64_t workspace; /* cuDNN's, in bytes */
  char why[256];     /* the refusal */
};

Entry cache[CACHE_SIZE];
int cache_n;
pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;

/* The dimensions and strides of the head tensors [b, h, t, d] and of their transposes [b, h, d, t]. */
struct Shapes {
  int64_t bhtd[4], bhdt[4], bhtt[4], bht1[4], one[4];
  int64_t tt[4], tt_t[4], t1[4], dense_d[4]; /* [t, t] row-major and transposed, [t, 1], a packed [b, h, t, d] */
};

Shapes shapes_of(const Key &k) {
  const int64_t B = k.batch, H = k.heads, T = k.t, D = k.d;
  Shapes s = {{B, H, T, D}, {B, H, D, T}, {B, H, T, T}, {B, H, T, 1}, {1, 1, 1, 1},
              {H * T * T, T * T, T, 1}, {H * T * T, T * T, 1, T}, {H * T, T, 1, 1}, {H * T * D, T * D, D, 1}};
  return s;
}

/* The strides of an operand in place (row stride ld), as [b, h, t, d], or transposed as [b, h, d, t]. */
void heads_stride(const Key &k, int64_t ld, int transposed, int64_t out[4]) {
  out[0] = (int64_t)k.t * ld;
  out[1] = k.d;
  out[2] = transposed ? 1 : ld;
  out[3] = transposed ? ld : 1;
}

/* S (f32, virtual) masked above the diagonal: select(row >= col, S, -inf). */
cudnnBackendDescriptor_t causal_mask(Graph *g, const Shapes &s, cudnnBackendDescriptor_t S) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT, i32 = CUDNN_DATA_INT32, b8 = CUDNN_DATA_BOOLEAN;
  cudnnBackendDescriptor_t row = tensor(g, 0, i32, s.bhtt, s.tt), col = tensor(g, 0, i32, s.bhtt, s.tt);
  pointwise(g, CUDNN_POINTWISE_GEN_INDEX, f32, S, NULL, NULL, row, 2);
  pointwise(g, CUDNN_POINTWISE_GEN_INDEX, f32, S, NULL, NULL, col, 3);
  cudnnBackendDescriptor_t keep = tensor(g, 0, b8, s.bhtt, s.tt);
  pointwise(g, CUDNN_POINTWISE_CMP_GE, b8, row, col, NULL, keep);
  cudnnBackendDescriptor_t neg = tensor(g, UID_NEG_INF, f32, s.one, s.one, true);
  cudnnBackendDescriptor_t out = tensor(g, 0, f32, s.bhtt, s.tt);
  pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, f32, S, neg, keep, out);
  return out;
}

cudnnDataType_t io_type(const Key &k) { return k.dtype == APEX_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF; }

void build_forward(Graph *g, const Key &k) {
  const Shapes s = shapes_of(k);
  const cudnnDataType_t io = io_type(k), f32 = CUDNN_DATA_FLOAT;
  int64_t sq[4], skt[4], sv[4], so[4];
  heads_stride(k, k.ld[0], 0, sq), heads_stride(k, k.ld[1], 1, skt), heads_stride(k, k.ld[2], 0, sv), heads_stride(k, k.ld[3], 0, so);
  cudnnBackendDescriptor_t q = tensor(g, UID_Q, io, s.bhtd, sq), kt = tensor(g, UID_K, io, s.bhdt, skt);
  cudnnBackendDescriptor_t v = tensor(g, UID_V, io, s.bhtd, sv), o = tensor(g, UID_O, io, s.bhtd, so);
  cudnnBackendDescriptor_t stats = tensor(g, UID_STATS, f32, s.bht1, s.t1);
  cudnnBackendDescriptor_t scale = tensor(g, UID_SCALE, f32, s.one, s.one, true);
  cudnnBackendDescriptor_t S = tensor(g, 0, f32, s.bhtt, s.tt), S1 = tensor(g, 0, f32, s.bhtt, s.tt);
  matmul(g, q, kt, S);
  pointwise(g, CUDNN_POINTWISE_MUL, f32, S, scale, NULL, S1);
  if (k.causal) S1 = causal_mask(g, s, S1);
  cudnnBackendDescriptor_t mx = tensor(g, 0, f32, s.bht1, s.t1), sub = tensor(g, 0, f32, s.bhtt, s.tt);
  cudnnBackendDescriptor_t ex = tensor(g, 0, f32, s.bhtt, s.tt), sum = tensor(g, 0, f32, s.bht1, s.t1);
  cudnnBackendDescriptor_t lg = tensor(g, 0, f32, s.bht1, s.t1), p = tensor(g, 0, io, s.bhtt, s.tt);
  reduction(g, CUDNN_REDUCE_TENSOR_MAX, S1, mx);
  pointwise(g, CUDNN_POINTWISE_SUB, f32, S1, mx, NULL, sub);
  pointwise(g, CUDNN_POINTWISE_EXP, f32, sub, NULL, NULL, ex);
  reduction(g, CUDNN_REDUCE_TENSOR_ADD, ex, sum);
  pointwise(g, CUDNN_POINTWISE_LOG, f32, sum, NULL, NULL, lg);
  pointwise(g, CUDNN_POINTWISE_ADD, f32, mx, lg, NULL, stats);
  pointwise(g, CUDNN_POINTWISE_DIV, f32, ex, sum, NULL, p);
  matmul(g, p, v, o);
}

void build_backward(Graph *g, const Key &k) {
  const Shapes s = shapes_of(k);
  const cudnnDataType_t io = io_type(k), f32 = CUDNN_DATA_FLOAT;
  int64_t sq[4], skt[4], sk[4], svt[4], so[4], sdo[4], sdq[4], sdk[4], sdv[4];
  heads_stride(k, k.ld[0], 0, sq), heads_stride(k, k.ld[1], 1, skt), heads_stride(k, k.ld[1], 0, sk);
  heads_stride(k, k.ld[2], 1, svt), heads_stride(k, k.ld[3], 0, so), heads_stride(k, k.ld[4], 0, sdo);
  heads_stride(k, k.ld[5], 0, sdq), heads_stride(k, k.ld[6], 0, sdk), heads_stride(k, k.ld[7], 0, sdv);
  cudnnBackendDescriptor_t q = tensor(g, UID_Q, io, s.bhtd, sq), kt = tensor(g, UID_K, io, s.bhdt, skt);
  cudnnBackendDescriptor_t vt = tensor(g, UID_V, io, s.bhdt, svt), o = tensor(g, UID_O, io, s.bhtd, so);
  cudnnBackendDescriptor_t dout = tensor(g, UID_DO, io, s.bhtd, sdo), stats = tensor(g, UID_STATS, f32, s.bht1, s.t1);
  cudnnBackendDescriptor_t dq = tensor(g, UID_DQ, io, s.bhtd, sdq), dk = tensor(g, UID_DK, io, s.bhtd, sdk);
  cudnnBackendDescriptor_t dv = tensor(g, UID_DV, io, s.bhtd, sdv);
  cudnnBackendDescriptor_t scale = tensor(g, UID_SCALE, f32, s.one, s.one, true);
  /* Dsum = rowsum(dO o O), times 1 into the workspace tensor (the pattern cuDNN matches) */
  const int64_t odd[4] = {s.bhtd[1] * s.bhtd[2] * s.bhtd[3], s.bhtd[2] * s.bhtd[3], s.bhtd[1] * s.bhtd[3], 1};
  cudnnBackendDescriptor_t doo = tensor(g, 0, f32, s.bhtd, odd), red = tensor(g, 0, f32, s.bht1, s.t1);
  cudnnBackendDescriptor_t one = tensor(g, UID_ONE, f32, s.one, s.one, true), dsum = tensor(g, UID_DSUM, f32, s.bht1, s.t1);
  pointwise(g, CUDNN_POINTWISE_MUL, f32, dout, o, NULL, doo);
  reduction(g, CUDNN_REDUCE_TENSOR_ADD, doo, red);
  pointwise(g, CUDNN_POINTWISE_MUL, f32, red, one, NULL, dsum);
  /* P = exp(s q k^T - L), masked */
  cudnnBackendDescriptor_t S = tensor(g, 0, f32, s.bhtt, s.tt), S1 = tensor(g, 0, f32, s.bhtt, s.tt);
  cudnnBackendDescriptor_t S2 = tensor(g, 0, f32, s.bhtt, s.tt);
  matmul(g, q, kt, S);
  pointwise(g, CUDNN_POINTWISE_MUL, f32, S, scale, NULL, S1);
  pointwise(g, CUDNN_POINTWISE_SUB, f32, S1, stats, NULL, S2);
  if (k.causal) S2 = causal_mask(g, s, S2);
  cudnnBackendDescriptor_t p = tensor(g, 0, f32, s.bhtt, s.tt), pt = tensor(g, 0, io, s.bhtt, s.tt_t);
  pointwise(g, CUDNN_POINTWISE_EXP, f32, S2, NULL, NULL, p);
  reshape(g, p, pt);
  matmul(g, pt, dout, dv);
  /* dS = s P (dO v^T - Dsum) */
  cudnnBackendDescriptor_t dp = tensor(g, 0, f32, s.bhtt, s.tt), a1 = tensor(g, 0, f32, s.bhtt, s.tt);
  cudnnBackendDescriptor_t a2 = tensor(g, 0, f32, s.bhtt, s.tt), ds = tensor(g, 0, f32, s.bhtt, s.tt);
  matmul(g, dout, vt, dp);
  pointwise(g, CUDNN_POINTWISE_SUB, f32, dp, dsum, NULL, a1);
  pointwise(g, CUDNN_POINTWISE_MUL, f32, a1, p, NULL, a2);
  pointwise(g, CUDNN_POINTWISE_MUL, f32, a2, scale, NULL, ds);
  cudnnBackendDescriptor_t dst = tensor(g, 0, io, s.bhtt, s.tt_t);
  reshape(g, ds, dst);
  matmul(g, dst, q, dk);
  /* dQ = dS k, k read through the transpose of k^T */
  cudnnBackendDescriptor_t kk = tensor(g, 0, io, s.bhtd, sk);
  reshape(g, kt, kk);
  if (!k.nondet) {
    matmul(g, ds, kk, dq);
  } else {
    cudnnBackendDescriptor_t acc = tensor(g, UID_DQ_ACC, f32, s.bhtd, s.dense_d);
    matmul(g, ds, kk, acc);
    pointwise(g, CUDNN_POINTWISE_IDENTITY, f32, acc, NULL, NULL, dq);
  }
}

/* The operation graph of g's operations, its engine and its execution plan into e; on a refusal, e->why. */
void plan_graph(Graph *g, Entry *e) {
  cudnnHandle_t h = apex__dnn.handle;
  cudnnBackendDescriptor_t og = make(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
  set(g, og, ATTR_GRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h, "operation graph handle");
  set(g, og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->nops, g->ops, "operation graph operations");
  finish(g, og, "operation graph");
  if (g->bad != CUDNN_STATUS_SUCCESS) {
    snprintf(e->why, sizeof e->why, "cuDNN refused the attention graph at its %s: %s", g->what,
             apex__dnn.cudnnGetErrorString(g->bad));
    return;
  }
  const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
  cudnnStatus_t last = CUDNN_STATUS_NOT_SUPPORTED;
  /* the heuristics and engine configurations are made in g, so that they live as long as the plan does */
  for (int m = 0; m < 2 && !e->plan && g->bad == CUDNN_STATUS_SUCCESS; m++) {
    cudnnBackendDescriptor_t heur = make(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
    set(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &og, "heuristics graph");
    set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[m], "heuristics mode");
    finish(g, heur, "heuristics");
    cudnnBackendDescriptor_t cfg[MAX_CFG];
    for (int i = 0; i < MAX_CFG; i++) cfg[i] = make(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine configuration");
    int64_t n = 0;
    if (g->bad == CUDNN_STATUS_SUCCESS) {
      cudnnStatus_t s = apex__dnn.cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                                           MAX_CFG, &n, cfg);
      if (s != CUDNN_STATUS_SUCCESS) last = s, n = 0;
    } else {
      last = g->bad;
    }
    for (int64_t i = 0; i < n && i < MAX_CFG && !e->plan; i++) {
      cudnnBackendDescriptor_t plan = NULL;
      cudnnStatus_t s = apex__dnn.cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan);
      if (s == CUDNN_STATUS_SUCCESS) s = apex__dnn.cudnnBackendSetAttribute(plan, ATTR_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
      if (s == CUDNN_STATUS_SUCCESS)
        s = apex__dnn.cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                               &cfg[i]);
      if (s == CUDNN_STATUS_SUCCESS) s = apex__dnn.cudnnBackendFinalize(plan);
      int64_t ws = 0, got = 0;
      if (s == CUDNN_STATUS_SUCCESS)
        s = apex__dnn.cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got, &ws);
      if (s == CUDNN_STATUS_SUCCESS && ws >= 0) {
        e->plan = plan, e->workspace = ws;
      } else {
        last = s == CUDNN_STATUS_SUCCESS ? CUDNN_STATUS_NOT_SUPPORTED : s;
        if (plan) apex__dnn.cudnnBackendDestroyDescriptor(plan);
      }
    }
  }
  if (!e->plan)
    snprintf(e->why, sizeof e->why, "cuDNN has no engine for this attention (%s)", apex__dnn.cudnnGetErrorString(last));
}

/* The entry for k: found, or built now (a plan or a refusal). NULL only when the cache is full. */
Entry *lookup(const Key &k) {
  pthread_mutex_lock(&cache_lock);
  Entry *e = NULL;
  for (int i = 0; i < cache_n && !e; i++)
    if (!memcmp(&cache[i].key, &k, sizeof k)) e = &cache[i];
  if (!e && cache_n < CACHE_SIZE) {
    e = &cache[cache_n];
    memset(e, 0, sizeof *e);
    e->key = k;
    Graph *g = (Graph *)calloc(1, sizeof(Graph));
    if (!g) {
      snprintf(e->why, sizeof e->why, "out of host memory for the attention graph");
    } else {
      g->next_uid = VIRTUAL;
      if (k.backward) build_backward(g, k);
      else build_forward(g, k);
      plan_graph(g, e);
      if (e->plan) {
        e->graph = g;
      } else {
        destroy_all(g);
        free(g);
      }
    }
    cache_n++;
  }
  pthread_mutex_unlock(&cache_lock);
  return e;
}

Key key_of(const apex__cuda_flash *g, int backward, int causal, int nondet) {
  Key k;
  memset(&k, 0, sizeof k);
  k.backward = backward, k.causal = !!causal, k.nondet = backward && nondet, k.dtype = (int)g->dtype;
  k.batch = g->batch, k.heads = g->heads, k.t = g->t, k.d = g->d;
  const int64_t ld[8] = {g->ld_q, g->ld_k, g->ld_v, g->ld_o, g->ld_do, g->ld_dq, g->ld_dk, g->ld_dv};
  memcpy(k.ld, ld, (backward ? 8 : 4) * sizeof(int64_t));
  return k;
}

/* The plan for g, or APEX_ERR_UNSUPPORTED saying why not (cuDNN missing, the head dim, the refusal). */
apex_status plan_for(const char *fn, const apex__cuda_flash *g, int backward, int causal, int nondet, Entry **out) {
  apex_status st = apex__cudnn_ready(fn);
  if (st != APEX_OK) return st;
  if (g->d % 8 != 0 || g->d > 128)
    return apex__fail(APEX_ERR_UNSUPPORTED, "%s: head dim %d: cuDNN's fused attention takes multiples of 8 up to 128", fn, g->d);
  Entry *e = lookup(key_of(g, backward, causal, nondet));
  if (!e)
    return apex__fail(APEX_ERR_UNSUPPORTED, "%s: %d attention plans are kept already; this shape takes another path", fn,
                      CACHE_SIZE);
  if (!e->plan) return apex__fail(APEX_ERR_UNSUPPORTED, "%s: %s", fn, e->why);
  *out = e;
  return APEX_OK;
}

/* Executes e's plan on the tensors uids[i] at ptrs[i] with workspace ws. A refusal (a bad parameter, a
 * case not supported) is APEX_ERR_UNSUPPORTED, before anything ran; anything else APEX_ERR_DEVICE. */
apex_status execute(const char *fn, const Entry *e, const int64_t *uids, void *const *ptrs, int n, void *ws) {
  cudnnBackendDescriptor_t vp = NULL;
  cudnnStatus_t s = apex__dnn.cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
  if (s == CUDNN_STATUS_SUCCESS)
    s = apex__dnn.cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
  if (s == CUDNN_STATUS_SUCCESS)
    s = apex__dnn.cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
  if (s == CUDNN_STATUS_SUCCESS) s = apex__dnn.cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
  if (s == CUDNN_STATUS_SUCCESS) s = apex__dnn.cudnnBackendFinalize(vp);
  if (s == CUDNN_STATUS_SUCCESS) s = apex__dnn.cudnnBackendExecute(apex__dnn.handle, e->plan, vp);
  if (vp) apex__dnn.cudnnBackendDestroyDescriptor(vp);
  if (s == CUDNN_STATUS_SUCCESS) return apex__cuda_check_launch(fn);
  const int family = (int)s / 1000; /* 2: bad parameter, 3: not supported, 4: internal, 5: execution failed */
  return apex__fail(family == 2 || family == 3 ? APEX_ERR_UNSUPPORTED : APEX_ERR_DEVICE, "%s: cuDNN's attention plan: %s", fn,
                    apex__dnn.cudnnGetErrorString(s));
}

/* Bytes of a workspace part, rounded up so that the next part starts 256-byte aligned. */
size_t part(size_t bytes) { return (bytes + 255) & ~(size_t)255; }

__global__ void lse_to_stats(const float *lse, float *stats, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    stats[2 * i] = lse[i];
    stats[2 * i + 1] = 1.0f;
  }
}

__global__ void stats_to_lse(const float *stats, float *lse, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    lse[i] = stats[2 * i] - logf(stats[2 * i + 1]);
}

} /* namespace */

extern "C" apex_status apex__cuda_sdpa_check(const apex__cuda_flash *g, int causal, int backward, int nondeterministic) {
  const char *fn = backward ? SDPA_BWD : SDPA_FWD;
  if (!g) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL geometry", fn);
  /* the pointers do not matter here: aligned stand-ins, so that only the geometry is judged */
  alignas(16) static const char align_probe[16] = {0};
  const void *p = align_probe;
  const void *ptrs[8] = {p, p, p, p, p, p, p, p};
  const int64_t lds[8] = {g->ld_q, g->ld_k, g->ld_v, g->ld_o, g->ld_do, g->ld_dq, g->ld_dk, g->ld_dv};
  apex_status st = apex__cuda_attn_operands_check(fn, "cuDNN's fused attention", g, ptrs, lds, backward ? 8 : 4);
  Entry *e = NULL;
  return st != APEX_OK ? st : plan_for(fn, g, backward, causal, nondeterministic, &e);
}

extern "C" apex_status apex__cuda_sdpa_fwd(const apex__cuda_flash *g, int causal, const void *q, const void *k, const void *v, void *o,
                                           float *stats) {
  if (!g) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL geometry", SDPA_FWD);
  const void *ptrs[] = {q, k, v, o};
  const int64_t lds[] = {g->ld_q, g->ld_k, g->ld_v, g->ld_o};
  apex_status st = apex__cuda_attn_operands_check(SDPA_FWD, "cuDNN's fused attention", g, ptrs, lds, 4);
  if (st != APEX_OK) return st;
  if (!stats) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL stats", SDPA_FWD);
  Entry *e = NULL;
  if ((st = plan_for(SDPA_FWD, g, 0, causal, 0, &e)) != APEX_OK) return st;
  const int64_t rows = (int64_t)g->batch * g->heads * g->t;
  const size_t ws_cudnn = part((size_t)e->workspace);
  void *ws = NULL;
  if ((st = apex__cuda_alloc(ws_cudnn + part((size_t)rows * sizeof(float)), 0, &ws)) != APEX_OK) return st;
  float *lse = (float *)((char *)ws + ws_cudnn);
  float scale = 1.0f / sqrtf((float)g->d);
  /* -inf masks from cuDNN 9.1 on; before it the most negative float is what its softmax expects */
  float neg = apex__dnn.version >= 90100 ? -INFINITY : -3.402823466e38f;
  const int64_t uids[] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG_INF};
  void *const dptr[] = {(void *)q, (void *)k, (void *)v, o, lse, &scale, &neg};
  st = execute(SDPA_FWD, e, uids, dptr, causal ? 7 : 6, ws);
  if (st == APEX_OK) {
    lse_to_stats<<<apex_grid(rows, 256, 4), 256, 0, (cudaStream_t)apex__cuda_stream()>>>(lse, stats, rows);
    st = apex__cuda_check_launch(SDPA_FWD);
  }
  apex__cuda_free(ws);
  return st;
}

extern "C" apex_status apex__cuda_sdpa_bwd(const apex__cuda_flash *g, int causal, int nondeterministic, const void *q, const void *k,
                                           const void *v, const void *o, const void *dout, const float *stats, void *dq, void *dk,
                                           void *dv) {
  if (!g) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL geometry", SDPA_BWD);
  const void *ptrs[] = {q, k, v, o, dout, dq, dk, dv};
  const int64_t lds[] = {g->ld_q, g->ld_k, g->ld_v, g->ld_o, g->ld_do, g->ld_dq, g->ld_dk, g->ld_dv};
  apex_status st = apex__cuda_attn_operands_check(SDPA_BWD, "cuDNN's fused attention", g, ptrs, lds, 8);
  if (st != APEX_OK) return st;
  if (!stats) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL stats", SDPA_BWD);
  Entry *e = NULL;
  if ((st = plan_for(SDPA_BWD, g, 1, causal, nondeterministic, &e)) != APEX_OK) return st;
  const int64_t rows = (int64_t)g->batch * g->heads * g->t;
  const size_t ws_cudnn = part((size_t)e->workspace), row_bytes = part((size_t)rows * sizeof(float));
  const size_t acc_bytes = nondeterministic ? (size_t)rows * (size_t)g->d * sizeof(float) : 0;
  void *ws = NULL;
  if ((st = apex__cuda_alloc(ws_cudnn + 2 * row_bytes + acc_bytes, 0, &ws)) != APEX_OK) return st;
  float *lse = (float *)((char *)ws + ws_cudnn), *dsum = (float *)((char *)lse + row_bytes);
  float *acc = (float *)((char *)dsum + row_bytes);
  cudaStream_t stream = (cudaStream_t)apex__cuda_stream();
  stats_to_lse<<<apex_grid(rows, 256, 4), 256, 0, stream>>>(stats, lse, rows);
  st = apex__cuda_check_launch(SDPA_BWD);
  /* cuDNN before 9.6 adds dQ into its accumulator without clearing it first */
  if (st == APEX_OK && acc_bytes) {
    cudaError_t ce = cudaMemsetAsync(acc, 0, acc_bytes, stream);
    if (ce != cudaSuccess) st = apex__fail(APEX_ERR_DEVICE, "%s: clearing the dQ accumulator: %s", SDPA_BWD, cudaGetErrorString(ce));
  }
  float scale = 1.0f / sqrtf((float)g->d), one = 1.0f;
  float neg = apex__dnn.version >= 90100 ? -INFINITY : -3.402823466e38f;
  int64_t uids[14] = {UID_Q, UID_K, UID_V, UID_O, UID_DO, UID_STATS, UID_DQ, UID_DK, UID_DV, UID_DSUM, UID_SCALE, UID_ONE};
  void *dptr[14] = {(void *)q, (void *)k, (void *)v, (void *)o, (void *)dout, lse, dq, dk, dv, dsum, &scale, &one};
  int n = 12; /* then the mask's -inf and the accumulator, when the graph has them */
  if (causal) uids[n] = UID_NEG_INF, dptr[n++] = &neg;
  if (acc_bytes) uids[n] = UID_DQ_ACC, dptr[n++] = acc;
  if (st == APEX_OK) st = execute(SDPA_BWD, e, uids, dptr, n, ws);
  apex__cuda_free(ws);
  return st;
}
