/* gemm.cu: matrix products through cuBLASLt (Apex's fused_dense): f16/bf16 inputs on the tensor cores
 * with f32 accumulation, and the bias and GELU epilogues that save a pass over the output.
 *
 * apex's tensors are row-major and cuBLASLt's column-major. A row-major [m, n] matrix is the
 * column-major [n, m] one, so C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T: B goes in as
 * cuBLASLt's A and A as its B, with the sizes swapped. A bias per column of C is then a bias per row
 * of C^T, which is what the epilogue adds.
 *
 * The strided-batched form (attention's per-head products) runs `batch` such products, matrix i of
 * each operand at base + i * stride elements. cuBLASLt assumes 256-byte aligned operands unless told
 * otherwise, and a batch stride such as T * T half-precision elements rarely is, so every call states
 * the alignment its pointers and strides really have, and the heuristic only offers algorithms that
 * work with it. */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <string.h>

extern "C" {
#include "core/internal.h"
#include "backend/cuda/cuda_internal.h"
}

#define GEMM_WORKSPACE ((size_t)32 << 20)

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static cublasLtHandle_t g_lt;
static void *g_ws;
static cublasStatus_t g_init_status = CUBLAS_STATUS_NOT_INITIALIZED;

static void init_lt(void) {
  g_init_status = cublasLtCreate(&g_lt);
  if (g_init_status == CUBLAS_STATUS_SUCCESS && apex__cuda_alloc(GEMM_WORKSPACE, 0, &g_ws) != APEX_OK) g_ws = NULL;
}

static cudaDataType_t cuda_type(apex_dtype t) {
  return t == APEX_F16 ? CUDA_R_16F : t == APEX_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

static apex_status lt_fail(const char *fn, cublasStatus_t s, const char *step) {
  return apex__fail(APEX_ERR_DEVICE, "%s: cuBLASLt %s failed (status %d)", fn, step, (int)s);
}

#define LT(call, step)                                  \
  do {                                                  \
    cublasStatus_t s_ = (call);                         \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                  \
      st = lt_fail(fn, s_, step);                       \
      goto done;                                        \
    }                                                   \
  } while (0)

/* The alignment (a power of two, at most the 256 bytes cuBLASLt asks for by default) that every
 * matrix of an operand has: its base pointer's, and its batch stride's when there are several. */
static uint32_t alignment(const void *p, int64_t stride_bytes, int batch) {
  uint64_t bits = (uint64_t)(uintptr_t)p | 256u;
  if (batch > 1) bits |= (uint64_t)stride_bytes;
  return (uint32_t)(bits & (~bits + 1)); /* the lowest set bit */
}

static apex_status no_algorithm(const char *fn, apex_dtype in_type, apex_dtype c_type) {
  return apex__fail(APEX_ERR_UNSUPPORTED, "%s: cuBLASLt has no algorithm for %s inputs with a %s output and this epilogue", fn,
                    apex_dtype_name(in_type), apex_dtype_name(c_type));
}

/* ---- the plan cache ---------------------------------------------------------------------------------
 * A product's host work before its launch is cuBLASLt's: a matmul descriptor with its attributes, three
 * matrix layouts and, the dearest, the heuristic query (tens of microseconds), and a training step makes the
 * same few dozen products every step (GPT-2 small: about 150 calls). So the whole plan is kept per
 * problem: everything the descriptors and the heuristic see (sizes, leading dimensions, strides, batch,
 * dtypes, transposes, epilogue, alignments, device) is the key, and a call with a known key only sets the
 * epilogue's pointers (the bias or bias gradient, GELU's aux: they change from call to call) on the kept
 * descriptor and launches. That also pins one algorithm per problem for the process's lifetime, which the
 * bitwise run-to-run determinism of the GEMMs relies on. A kept descriptor is used under the table's lock
 * (its pointers are set, then the launch is queued), so two threads never launch on each other's pointers. */
typedef struct gemm_key {
  int64_t m, n, k, lda, ldb, ldc, stride_a, stride_b, stride_c;
  int32_t batch, trans_a, trans_b, in_type, c_type, epilogue;
  uint32_t al_a, al_b, al_c;
  int32_t device;    /* the algorithm is chosen for one GPU */
  int32_t vec_type;  /* the epilogue vector's cudaDataType (-1: none) */
  int32_t alpha_dev; /* alpha and beta read from device memory (the descriptor's pointer mode) */
} gemm_key; /* 120 bytes, no implicit padding */

typedef struct gemm_plan {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatmulAlgo_t algo;
} gemm_plan;

#define ALGO_SLOTS 1024 /* a power of two; when full, further problems make their plan every time */
static struct {
  gemm_key key;
  gemm_plan plan;
  int used;
  int refused; /* cuBLASLt has no algorithm for the problem: no plan, and the heuristic is not asked again */
} g_algos[ALGO_SLOTS];
static pthread_mutex_t g_algo_mu = PTHREAD_MUTEX_INITIALIZER;

static uint64_t key_hash(const gemm_key *k) {
  const unsigned char *p = (const unsigned char *)k;
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (size_t i = 0; i < sizeof *k; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

/* The slot holding key, or the empty slot where it would go; -1 when the table is full. */
static int algo_slot(const gemm_key *k) {
  uint64_t h = key_hash(k);
  for (int i = 0; i < ALGO_SLOTS; i++) {
    int s = (int)((h + (uint64_t)i) & (ALGO_SLOTS - 1));
    if (!g_algos[s].used || !memcmp(&g_algos[s].key, k, sizeof *k)) return s;
  }
  return -1;
}

static void plan_destroy(gemm_plan *p) {
  if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
  if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
  if (p->la) cublasLtMatrixLayoutDestroy(p->la);
  if (p->op) cublasLtMatmulDescDestroy(p->op);
  memset(p, 0, sizeof *p);
}

/* The epilogue's per-call pointers on a plan's descriptor: the bias (or bias gradient) and GELU's aux. */
static cublasStatus_t set_pointers(cublasLtMatmulDesc_t op, const void *vec, void *aux) {
  cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
  if (vec) s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec, sizeof vec);
  if (s == CUBLAS_STATUS_SUCCESS && aux) s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux);
  return s;
}

/* beta for a product whose alpha is read on the device: 0 or 1 from this constant, whose address (for
 * the current device) the runtime knows without a transfer, so that a captured step may make the call. */
__device__ const float g_betas[2] = {0.0f, 1.0f};

#define BETA_DEVICES 64
static const float *g_beta_at[BETA_DEVICES]; /* per device, once: no runtime call inside a captured step's later calls */

static apex_status device_beta(const char *fn, int dev, float beta, const float **p) {
  if (beta != 0.0f && beta != 1.0f)
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: beta %g with a device alpha: 0 or 1", fn, (double)beta);
  const float *base = dev >= 0 && dev < BETA_DEVICES ? __atomic_load_n(&g_beta_at[dev], __ATOMIC_ACQUIRE) : NULL;
  if (!base) {
    void *b = NULL;
    cudaError_t e = cudaGetSymbolAddress(&b, g_betas);
    if (e != cudaSuccess) return apex__fail(APEX_ERR_DEVICE, "%s: the device's beta constant: %s", fn, cudaGetErrorString(e));
    base = (const float *)b;
    if (dev >= 0 && dev < BETA_DEVICES) __atomic_store_n(&g_beta_at[dev], base, __ATOMIC_RELEASE); /* racers store the same */
  }
  *p = base + (beta == 1.0f);
  return APEX_OK;
}

/* One product, or `batch` of them (batch >= 1) at the given element strides; ld*: the row-major row
 * lengths of the stored operands (their leading dimensions); fn names the public call in messages. */
static apex_status gemm(const char *fn, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                        const void *a, int64_t lda, int64_t stride_a, const void *b, int64_t ldb, int64_t stride_b,
                        apex_dtype in_type, float beta, void *c, int64_t ldc, int64_t stride_c, apex_dtype c_type,
                        int batch, const void *bias, int gelu, const apex__cuda_epilogue *x, const float *alpha_dev) {
  pthread_once(&g_once, init_lt);
  if (g_init_status != CUBLAS_STATUS_SUCCESS) return lt_fail(fn, g_init_status, "handle creation");
  apex_status st = APEX_OK;
  gemm_plan plan = {};
  cublasLtMatmulPreference_t pref = NULL;
  cublasLtMatmulHeuristicResult_t heur;
  int found = 0, kept = 0;
  cublasOperation_t ta = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, tb = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasLtEpilogue_t epi = bias ? (gelu ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                                : (gelu ? CUBLASLT_EPILOGUE_GELU : CUBLASLT_EPILOGUE_DEFAULT);
  const void *vec = bias; /* the epilogue's vector: the bias added, or the bias gradient written */
  void *aux = NULL;       /* GELU's pre-activation, [m, n] row-major = cuBLASLt's column-major [n, m], ld n */
  if (x) {
    switch (x->kind) {
    case APEX__EPI_GELU_AUX_BIAS: epi = CUBLASLT_EPILOGUE_GELU_AUX_BIAS, vec = x->bias, aux = x->aux; break;
    case APEX__EPI_DGELU_BGRAD: epi = CUBLASLT_EPILOGUE_DGELU_BGRAD, vec = x->bgrad, aux = x->aux; break;
    case APEX__EPI_BGRADB: epi = CUBLASLT_EPILOGUE_BGRADB, vec = x->bgrad; break;
    case APEX__EPI_DGELU: epi = CUBLASLT_EPILOGUE_DGELU, aux = x->aux; break;
    }
    if ((!vec && x->kind != APEX__EPI_DGELU) || (!aux && x->kind != APEX__EPI_BGRADB) || batch != 1)
      return apex__fail(APEX_ERR_INVALID_ARG, "%s: epilogue %d without its vector or aux, or on a batched product", fn,
                        (int)x->kind);
  }
  cudaDataType_t it = cuda_type(in_type), ct = cuda_type(c_type);
  const int32_t vt = !vec ? -1 : x && x->bgrad_f32 ? (int32_t)CUDA_R_32F : (int32_t)ct; /* the vector's type */
  size_t ws = g_ws ? GEMM_WORKSPACE : 0;
  gemm_key key;
  memset(&key, 0, sizeof key); /* no padding is left unset: keys are compared and hashed as bytes */
  key.m = m, key.n = n, key.k = k, key.lda = lda, key.ldb = ldb, key.ldc = ldc;
  if (batch > 1) key.stride_a = stride_a, key.stride_b = stride_b, key.stride_c = stride_c;
  key.batch = batch, key.trans_a = trans_a, key.trans_b = trans_b;
  key.in_type = (int32_t)in_type, key.c_type = (int32_t)c_type, key.epilogue = (int32_t)epi, key.vec_type = vt;
  int dev = 0;
  cudaGetDevice(&dev);
  key.device = dev;
  key.alpha_dev = alpha_dev != NULL;
  /* with alpha on the device, beta must be there too (cuBLASLt's pointer mode covers both) */
  const float *pa = &alpha, *pb = &beta;
  if (alpha_dev) {
    pa = alpha_dev;
    if ((st = device_beta(fn, dev, beta, &pb)) != APEX_OK) return st;
  }
  size_t ie = apex_dtype_size(in_type), ce = apex_dtype_size(c_type);
  key.al_a = alignment(b, stride_b * (int64_t)ie, batch);
  key.al_b = alignment(a, stride_a * (int64_t)ie, batch);
  key.al_c = alignment(c, stride_c * (int64_t)ce, batch);
  /* a known problem: its kept plan, the pointers set and the launch queued under the lock */
  pthread_mutex_lock(&g_algo_mu);
  int slot = algo_slot(&key);
  if (slot >= 0 && g_algos[slot].used && g_algos[slot].refused) {
    pthread_mutex_unlock(&g_algo_mu);
    return no_algorithm(fn, in_type, c_type);
  }
  if (slot >= 0 && g_algos[slot].used) {
    gemm_plan *p = &g_algos[slot].plan;
    cublasStatus_t s = set_pointers(p->op, vec, aux);
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmul(g_lt, p->op, pa, b, p->la, a, p->lb, pb, c, p->lc, c, p->lc, &p->algo, g_ws, ws,
                         (cudaStream_t)apex__cuda_stream());
    pthread_mutex_unlock(&g_algo_mu);
    return s == CUBLAS_STATUS_SUCCESS ? APEX_OK : lt_fail(fn, s, "matmul");
  }
  pthread_mutex_unlock(&g_algo_mu);
  LT(cublasLtMatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "descriptor");
  LT(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "transa");
  LT(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "transb");
  LT(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), "epilogue");
  if (alpha_dev) {
    const cublasLtPointerMode_t pm = CUBLASLT_POINTER_MODE_DEVICE;
    LT(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof pm), "pointer mode");
  }
  if (vec) LT(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &vt, sizeof vt), "bias type");
  if (aux) {
    const int64_t aux_ld = n;
    LT(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld), "aux ld");
  }
  LT(set_pointers(plan.op, vec, aux), "bias or aux pointer");
  /* cuBLASLt's A is our B: stored [k, n] row-major = [n, k] column-major (or [k, n] when transposed). */
  LT(cublasLtMatrixLayoutCreate(&plan.la, it, trans_b ? k : n, trans_b ? n : k, ldb), "layout B");
  LT(cublasLtMatrixLayoutCreate(&plan.lb, it, trans_a ? m : k, trans_a ? k : m, lda), "layout A");
  LT(cublasLtMatrixLayoutCreate(&plan.lc, ct, n, m, ldc), "layout C");
  if (batch > 1) {
    int32_t count = batch;
    int64_t sa = stride_b, sb = stride_a, sc = stride_c; /* cuBLASLt's A is our B (above) */
    LT(cublasLtMatrixLayoutSetAttribute(plan.la, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count), "batch count B");
    LT(cublasLtMatrixLayoutSetAttribute(plan.la, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sa, sizeof sa), "batch stride B");
    LT(cublasLtMatrixLayoutSetAttribute(plan.lb, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count), "batch count A");
    LT(cublasLtMatrixLayoutSetAttribute(plan.lb, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sb, sizeof sb), "batch stride A");
    LT(cublasLtMatrixLayoutSetAttribute(plan.lc, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count), "batch count C");
    LT(cublasLtMatrixLayoutSetAttribute(plan.lc, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sc, sizeof sc), "batch stride C");
  }
  LT(cublasLtMatmulPreferenceCreate(&pref), "preference");
  LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws), "workspace");
  LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.al_a, sizeof key.al_a), "alignment A");
  LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.al_b, sizeof key.al_b), "alignment B");
  LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.al_c, sizeof key.al_c), "alignment C");
  LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.al_c, sizeof key.al_c), "alignment D");
  {
    /* NOT_SUPPORTED is the heuristic's other way of saying that it has no algorithm */
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(g_lt, plan.op, plan.la, plan.lb, plan.lc, plan.lc, pref, 1, &heur, &found);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED) found = 0;
    else LT(s, "heuristic");
  }
  if (!found) {
    pthread_mutex_lock(&g_algo_mu);
    slot = algo_slot(&key);
    if (slot >= 0 && !g_algos[slot].used) {
      g_algos[slot].key = key;
      g_algos[slot].used = g_algos[slot].refused = 1;
    }
    pthread_mutex_unlock(&g_algo_mu);
    st = no_algorithm(fn, in_type, c_type);
    goto done;
  }
  plan.algo = heur.algo;
  /* the plan goes into the table (another thread may have filled the slot meanwhile: then this one is
   * used once and destroyed); the launch is queued under the lock either way, as for a kept plan */
  pthread_mutex_lock(&g_algo_mu);
  slot = algo_slot(&key);
  if (slot >= 0 && !g_algos[slot].used) {
    g_algos[slot].key = key;
    g_algos[slot].plan = plan;
    g_algos[slot].used = 1;
    kept = 1;
  }
  {
    cublasStatus_t s = cublasLtMatmul(g_lt, plan.op, pa, b, plan.la, a, plan.lb, pb, c, plan.lc, c, plan.lc, &plan.algo, g_ws,
                                      ws, (cudaStream_t)apex__cuda_stream());
    if (s != CUBLAS_STATUS_SUCCESS) st = lt_fail(fn, s, "matmul");
  }
  pthread_mutex_unlock(&g_algo_mu);
done:
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (!kept) plan_destroy(&plan);
  return st;
}

extern "C" apex_status apex__cuda_gemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                                       const void *a, const void *b, apex_dtype in_type, float beta, void *c,
                                       apex_dtype c_type, const void *bias, int gelu) {
  return gemm("apex_kernel_matmul", trans_a, trans_b, m, n, k, alpha, a, trans_a ? m : k, 0, b, trans_b ? k : n, 0,
              in_type, beta, c, n, 0, c_type, 1, bias, gelu, NULL, NULL);
}

extern "C" apex_status apex__cuda_gemm_scaled(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, const float *alpha,
                                              const void *a, const void *b, apex_dtype in_type, float beta, void *c, apex_dtype c_type) {
  return gemm("apex_kernel_matmul", trans_a, trans_b, m, n, k, 1.0f, a, trans_a ? m : k, 0, b, trans_b ? k : n, 0, in_type, beta, c,
              n, 0, c_type, 1, NULL, 0, NULL, alpha);
}

extern "C" apex_status apex__cuda_gemm_epilogue(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, const void *a,
                                                const void *b, apex_dtype in_type, void *c, apex_dtype c_type,
                                                const apex__cuda_epilogue *x) {
  if (!x) return apex__fail(APEX_ERR_INVALID_ARG, "apex__cuda_gemm_epilogue: NULL epilogue");
  if (in_type == APEX_F32 || c_type != in_type || n % 8 != 0)
    return apex__fail(APEX_ERR_UNSUPPORTED, "apex__cuda_gemm_epilogue: %s inputs, %s output, n = %lld: the epilogues take "
                      "f16/bf16 in and out and n a multiple of 8", apex_dtype_name(in_type), apex_dtype_name(c_type),
                      (long long)n);
  return gemm("apex__cuda_gemm_epilogue", trans_a, trans_b, m, n, k, 1.0f, a, trans_a ? m : k, 0, b, trans_b ? k : n, 0,
              in_type, 0.0f, c, n, 0, c_type, 1, NULL, 0, x, NULL);
}

extern "C" apex_status apex__cuda_gemm_batched(const char *fn, int trans_a, int trans_b, int64_t m, int64_t n,
                                               int64_t k, float alpha, const void *a, int64_t lda, int64_t stride_a,
                                               const void *b, int64_t ldb, int64_t stride_b, apex_dtype in_type,
                                               float beta, void *c, int64_t ldc, int64_t stride_c, apex_dtype c_type,
                                               int batch) {
  if (batch < 1 || m < 1 || n < 1) return APEX_OK; /* an empty result: nothing to compute */
  return gemm(fn, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, in_type, beta, c, ldc, stride_c,
              c_type, batch, NULL, 0, NULL, NULL);
}
