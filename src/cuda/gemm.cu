/* gemm.cu: matrix products through cuBLASLt (Apex's fused_dense): f16/bf16 inputs on the tensor cores
 * with f32 accumulation, and the bias and GELU epilogues that save a pass over the output.
 *
 * apex's tensors are row-major and cuBLASLt's column-major. A row-major [m, n] matrix is the
 * column-major [n, m] one, so C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T: B goes in as
 * cuBLASLt's A and A as its B, with the sizes swapped. A bias per column of C is then a bias per row
 * of C^T, which is what the epilogue adds. */
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

static apex_status lt_fail(cublasStatus_t s, const char *step) {
  return apex__fail(APEX_ERR_DEVICE, "apex_cuda_matmul: cuBLASLt %s failed (status %d)", step, (int)s);
}

#define LT(call, step)                                  \
  do {                                                  \
    cublasStatus_t s_ = (call);                         \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                  \
      st = lt_fail(s_, step);                           \
      goto done;                                        \
    }                                                   \
  } while (0)

extern "C" apex_status apex__cuda_gemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                                       const void *a, const void *b, apex_dtype in_type, float beta, void *c,
                                       apex_dtype c_type, const void *bias, int gelu) {
  pthread_once(&g_once, init_lt);
  if (g_init_status != CUBLAS_STATUS_SUCCESS) return lt_fail(g_init_status, "handle creation");
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
  LT(cublasLtMatrixLayoutCreate(&la, it, trans_b ? k : n, trans_b ? n : k, trans_b ? k : n), "layout B");
  LT(cublasLtMatrixLayoutCreate(&lb, it, trans_a ? m : k, trans_a ? k : m, trans_a ? m : k), "layout A");
  LT(cublasLtMatrixLayoutCreate(&lc, ct, n, m, n), "layout C");
  LT(cublasLtMatmulPreferenceCreate(&pref), "preference");
  LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws), "workspace");
  LT(cublasLtMatmulAlgoGetHeuristic(g_lt, op, la, lb, lc, lc, pref, 1, &heur, &found), "heuristic");
  if (!found) {
    st = apex__fail(APEX_ERR_UNSUPPORTED, "apex_cuda_matmul: cuBLASLt has no algorithm for %s inputs with a %s output "
                    "and this epilogue", apex_dtype_name(in_type), apex_dtype_name(c_type));
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
