/* stubs.c: the CUDA backend's internal entry points in a build without CUDA (CMake compiles this file
 * instead of the .cu files). apex__cuda_ready says why there is no GPU, and the public calls check it
 * first (api.c, tensor.c), so the others are never reached; they fail cleanly all the same. */
#include "core/internal.h"
#include "cuda/cuda_internal.h"

#define NO_CUDA(what) apex__fail(APEX_ERR_UNSUPPORTED, "%s: this apex was built without CUDA", what)

int apex__cuda_ready(const char **why) {
  if (why) *why = "this apex was built without CUDA (configure with nvcc on the PATH, or -DAPEX_CUDA=ON)";
  return 0;
}
void *apex__cuda_stream(void) { return NULL; }
apex_status apex__cuda_use_device(int device) {
  (void)device;
  return NO_CUDA("CUDA device selection");
}
apex_status apex__cuda_alloc(size_t bytes, int zero, void **out) {
  (void)bytes, (void)zero, (void)out;
  return NO_CUDA("CUDA allocation");
}
void apex__cuda_free(void *d_ptr) { (void)d_ptr; }
apex_status apex__cuda_memcpy(void *dst, const void *src, size_t bytes, int direction, int wait) {
  (void)dst, (void)src, (void)bytes, (void)direction, (void)wait;
  return NO_CUDA("CUDA copy");
}
apex_status apex__cuda_sync(const char *what) { return NO_CUDA(what); }
apex_status apex__cuda_check_launch(const char *what) { return NO_CUDA(what); }
apex_status apex__cuda_device_name(char *buf, size_t size) {
  (void)buf, (void)size;
  return NO_CUDA("apex_cuda_device_name");
}
void apex__cuda_stats(apex_cuda_memory_stats *out, int reset_peak) {
  (void)reset_peak;
  if (out) *out = (apex_cuda_memory_stats){0};
}
void apex__cuda_empty_cache(void) {}
void *apex__cuda_host_alloc(size_t bytes) {
  (void)bytes;
  return NULL;
}
void apex__cuda_host_free(void *p) { (void)p; }
apex_status apex__cuda_convert(void *d, apex_dtype dt, const void *s, apex_dtype st, size_t n) {
  (void)d, (void)dt, (void)s, (void)st, (void)n;
  return NO_CUDA("CUDA convert");
}
apex_status apex__cuda_fill(void *d, apex_dtype dt, float v, size_t n) {
  (void)d, (void)dt, (void)v, (void)n;
  return NO_CUDA("CUDA fill");
}
apex_status apex__cuda_mt_scale(const apex__cuda_list *in, const apex__cuda_list *out, float scale, const float *d_scale,
                                int d_inverse, int *d_flag) {
  (void)in, (void)out, (void)scale, (void)d_scale, (void)d_inverse, (void)d_flag;
  return NO_CUDA("CUDA multi-tensor scale");
}
apex_status apex__cuda_mt_axpby(const apex__cuda_list *x, const apex__cuda_list *y, const apex__cuda_list *out, float a,
                                float b, int arg_to_check, int *d_flag) {
  (void)x, (void)y, (void)out, (void)a, (void)b, (void)arg_to_check, (void)d_flag;
  return NO_CUDA("CUDA multi-tensor axpby");
}
apex_status apex__cuda_mt_l2norm(const apex__cuda_list *x, float inv_scale, float *d_global, float *d_per, int *d_flag) {
  (void)x, (void)inv_scale, (void)d_global, (void)d_per, (void)d_flag;
  return NO_CUDA("CUDA l2norm");
}
apex_status apex__cuda_optim_step(const apex__cuda_step *s) {
  (void)s;
  return NO_CUDA("CUDA optimizer step");
}
apex_status apex__cuda_scaler_update(apex__cuda_scaler_dev *d, const apex_loss_scaler_config *c) {
  (void)d, (void)c;
  return NO_CUDA("apex_cuda_scaler_update");
}
apex_status apex__cuda_layer_norm_fwd(const void *x, apex_dtype xt, const void *w, const void *b, apex_dtype wt,
                                      int64_t rows, int64_t cols, float eps, int rms, void *y, float *mean,
                                      float *rstd) {
  (void)x, (void)xt, (void)w, (void)b, (void)wt, (void)rows, (void)cols, (void)eps, (void)rms, (void)y, (void)mean,
      (void)rstd;
  return NO_CUDA("apex_cuda_layer_norm_forward");
}
apex_status apex__cuda_layer_norm_bwd(const void *dy, const void *x, apex_dtype xt, const void *w, apex_dtype wt,
                                      const float *mean, const float *rstd, int64_t rows, int64_t cols, int rms,
                                      void *dx, void *dw, void *db) {
  (void)dy, (void)x, (void)xt, (void)w, (void)wt, (void)mean, (void)rstd, (void)rows, (void)cols, (void)rms, (void)dx,
      (void)dw, (void)db;
  return NO_CUDA("apex_cuda_layer_norm_backward");
}
apex_status apex__cuda_xent_fwd(const void *logits, apex_dtype lt, const int64_t *target, int64_t rows, int64_t cols,
                                int64_t ignore_index, float smoothing, float *loss, float *lse) {
  (void)logits, (void)lt, (void)target, (void)rows, (void)cols, (void)ignore_index, (void)smoothing, (void)loss,
      (void)lse;
  return NO_CUDA("apex_cuda_cross_entropy_forward");
}
apex_status apex__cuda_xent_bwd(const float *dloss, const void *logits, apex_dtype lt, const int64_t *target,
                                const float *lse, int64_t rows, int64_t cols, int64_t ignore_index, float smoothing,
                                void *dlogits) {
  (void)dloss, (void)logits, (void)lt, (void)target, (void)lse, (void)rows, (void)cols, (void)ignore_index,
      (void)smoothing, (void)dlogits;
  return NO_CUDA("apex_cuda_cross_entropy_backward");
}
apex_status apex__cuda_bn_stats(const void *x, apex_dtype xt, int64_t n, int64_t c, int64_t hw, float *mean, float *var,
                                float *m2) {
  (void)x, (void)xt, (void)n, (void)c, (void)hw, (void)mean, (void)var, (void)m2;
  return NO_CUDA("apex_cuda_batch_norm_stats");
}
apex_status apex__cuda_gemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void *a,
                            const void *b, apex_dtype in_type, float beta, void *c, apex_dtype c_type,
                            const void *bias, int gelu) {
  (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)b, (void)in_type, (void)beta,
      (void)c, (void)c_type, (void)bias, (void)gelu;
  return NO_CUDA("apex_cuda_matmul");
}
apex_status apex__cuda_conv2d_fwd(const apex__cuda_conv *g, const void *x, const void *w, const void *b, apex_dtype bt,
                                  void *y) {
  (void)g, (void)x, (void)w, (void)b, (void)bt, (void)y;
  return NO_CUDA("apex_cuda_conv2d_forward");
}
apex_status apex__cuda_conv2d_bwd(const apex__cuda_conv *g, const void *dy, const void *x, const void *w, void *dx,
                                  void *dw, void *db, apex_dtype bt) {
  (void)g, (void)dy, (void)x, (void)w, (void)dx, (void)dw, (void)db, (void)bt;
  return NO_CUDA("apex_cuda_conv2d_backward");
}
apex_status apex__cuda_embedding_fwd(const void *table, apex_dtype tt, int64_t v, int64_t d, const int64_t *ids, int64_t n,
                                     void *y, apex_dtype yt) {
  (void)table, (void)tt, (void)v, (void)d, (void)ids, (void)n, (void)y, (void)yt;
  return NO_CUDA("apex_cuda_embedding_forward");
}
apex_status apex__cuda_embedding_bwd(const void *dy, apex_dtype dt, const int64_t *ids, int64_t n, int64_t v, int64_t d,
                                     void *dtable, apex_dtype gt) {
  (void)dy, (void)dt, (void)ids, (void)n, (void)v, (void)d, (void)dtable, (void)gt;
  return NO_CUDA("apex_cuda_embedding_backward");
}
apex_status apex__cuda_gemm_batched(const char *fn, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                                    const void *a, int64_t lda, int64_t stride_a, const void *b, int64_t ldb,
                                    int64_t stride_b, apex_dtype in_type, float beta, void *c, int64_t ldc,
                                    int64_t stride_c, apex_dtype c_type, int batch) {
  (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda, (void)stride_a, (void)b,
      (void)ldb, (void)stride_b, (void)in_type, (void)beta, (void)c, (void)ldc, (void)stride_c, (void)c_type, (void)batch;
  return NO_CUDA(fn);
}
apex_status apex__cuda_attention_fwd(const apex__cuda_attn *a, const void *qkv, void *y, float *lse) {
  (void)a, (void)qkv, (void)y, (void)lse;
  return NO_CUDA("apex_cuda_attention_forward");
}
apex_status apex__cuda_attention_bwd(const apex__cuda_attn *a, const void *dy, const void *qkv, const void *y,
                                     const float *lse, void *dqkv) {
  (void)a, (void)dy, (void)qkv, (void)y, (void)lse, (void)dqkv;
  return NO_CUDA("apex_cuda_attention_backward");
}
apex_status apex__cuda_ew(apex__cuda_ew_op op, const void *a, apex_dtype at, const void *b, apex_dtype bt, float alpha,
                          void *y, apex_dtype yt, int64_t n) {
  (void)op, (void)a, (void)at, (void)b, (void)bt, (void)alpha, (void)y, (void)yt, (void)n;
  return NO_CUDA("CUDA elementwise op");
}
apex_status apex__cuda_sum_rows(const void *x, apex_dtype xt, int64_t rows, int64_t cols, void *y, apex_dtype yt,
                                int accumulate) {
  (void)x, (void)xt, (void)rows, (void)cols, (void)y, (void)yt, (void)accumulate;
  return NO_CUDA("apex_cuda_sum_rows");
}
apex_status apex__cuda_sum_all(const void *x, apex_dtype xt, int64_t n, int mean, float *y) {
  (void)x, (void)xt, (void)n, (void)mean, (void)y;
  return NO_CUDA("apex_cuda_sum_all");
}
