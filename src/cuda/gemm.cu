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

extern "C" {
#include "core/internal.h"
#include "cuda/cuda_internal.h"
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

/* One product, or `batch` of them (batch >= 1) at the given element strides; ld*: the row-major row
 * lengths of the stored operands (their leading dimensions); fn names the public call in messages. */
static apex_status gemm(const char *fn, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                        const void *a, int64_t lda, int64_t stride_a, const void *b, int64_t ldb, int64_t stride_b,
                        apex_dtype in_type, float beta, void *c, int64_t ldc, int64_t stride_c, apex_dtype c_type,
                        int batch, const void *bias, int gelu) {
  pthread_once(&g_once, init_lt);
  if (g_init_status != CUBLAS_STATUS_SUCCESS) return lt_fail(fn, g_init_status, "handle creation");
  apex_status st = APEX_OK;
  cublasLtMatmulDesc_t op = NULL;
  cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
  cublasLtMatmulPreference_t pref = NULL;
  cublasLtMatmulHeuristicResult_t heur;
  int found = 0;
  cublasOperation_t ta = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, tb = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasLtEpilogue_t epi = bias ? (gelu ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                                : (gelu ? CUBLASLT_EPILOGUE_GELU : CUBLASLT_EPILOGUE_DEFAULT);
  cudaDataType_t it = cuda_type(in_type), ct = cuda_type(c_type);
  size_t ws = g_ws ? GEMM_WORKSPACE : 0;
  LT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "descriptor");
  LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "transa");
  LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "transb");
  LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), "epilogue");
  if (bias) {
    LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias), "bias");
    LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &ct, sizeof ct), "bias type");
  }
  /* cuBLASLt's A is our B: stored [k, n] row-major = [n, k] column-major (or [k, n] when transposed). */
  LT(cublasLtMatrixLayoutCreate(&la, it, trans_b ? k : n, trans_b ? n : k, ldb), "layout B");
  LT(cublasLtMatrixLayoutCreate(&lb, it, trans_a ? m : k, trans_a ? k : m, lda), "layout A");
  LT(cublasLtMatrixLayoutCreate(&lc, ct, n, m, ldc), "layout C");
  if (batch > 1) {
    int32_t count = batch;
    int64_t sa = stride_b, sb = stride_a, sc = stride_c; /* cuBLASLt's A is our B (above) */
    LT(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count), "batch count B");
    LT(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sa, sizeof sa), "batch stride B");
    LT(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count), "batch count A");
    LT(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sb, sizeof sb), "batch stride A");
    LT(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count), "batch count C");
    LT(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sc, sizeof sc), "batch stride C");
  }
  LT(cublasLtMatmulPreferenceCreate(&pref), "preference");
  LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws), "workspace");
  {
    size_t ie = apex_dtype_size(in_type), ce = apex_dtype_size(c_type);
    uint32_t al_a = alignment(b, stride_b * (int64_t)ie, batch), al_b = alignment(a, stride_a * (int64_t)ie, batch);
    uint32_t al_c = alignment(c, stride_c * (int64_t)ce, batch);
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a), "alignment A");
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b), "alignment B");
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c), "alignment C");
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c), "alignment D");
  }
  LT(cublasLtMatmulAlgoGetHeuristic(g_lt, op, la, lb, lc, lc, pref, 1, &heur, &found), "heuristic");
  if (!found) {
    st = apex__fail(APEX_ERR_UNSUPPORTED, "%s: cuBLASLt has no algorithm for %s inputs with a %s output "
                    "and this epilogue", fn, apex_dtype_name(in_type), apex_dtype_name(c_type));
    goto done;
  }
  LT(cublasLtMatmul(g_lt, op, &alpha, b, la, a, lb, &beta, c, lc, c, lc, &heur.algo, g_ws, ws,
                    (cudaStream_t)apex__cuda_stream()),
     "matmul");
done:
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (lc) cublasLtMatrixLayoutDestroy(lc);
  if (lb) cublasLtMatrixLayoutDestroy(lb);
  if (la) cublasLtMatrixLayoutDestroy(la);
  if (op) cublasLtMatmulDescDestroy(op);
  return st;
}

extern "C" apex_status apex__cuda_gemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                                       const void *a, const void *b, apex_dtype in_type, float beta, void *c,
                                       apex_dtype c_type, const void *bias, int gelu) {
  return gemm("apex_cuda_matmul", trans_a, trans_b, m, n, k, alpha, a, trans_a ? m : k, 0, b, trans_b ? k : n, 0,
              in_type, beta, c, n, 0, c_type, 1, bias, gelu);
}

extern "C" apex_status apex__cuda_gemm_batched(const char *fn, int trans_a, int trans_b, int64_t m, int64_t n,
                                               int64_t k, float alpha, const void *a, int64_t lda, int64_t stride_a,
                                               const void *b, int64_t ldb, int64_t stride_b, apex_dtype in_type,
                                               float beta, void *c, int64_t ldc, int64_t stride_c, apex_dtype c_type,
                                               int batch) {
  if (batch < 1 || m < 1 || n < 1) return APEX_OK; /* an empty result: nothing to compute */
  return gemm(fn, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, in_type, beta, c, ldc, stride_c,
              c_type, batch, NULL, 0);
}
