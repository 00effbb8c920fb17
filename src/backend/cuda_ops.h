/* cuda_ops.h: what only the CUDA backend has beyond the slots of backend.h: its device, stream and
 * allocator services (apex/cuda.h) and the raw kernels (apex/kernels.h), as one table of its runtime's and
 * kernels' entry points (cuda/cuda_internal.h, same arguments). backend/cuda/backend.c fills it in a
 * build with CUDA; apex__cuda_ops() is NULL in one without, so that the public fronts (cuda_api.c) are
 * plain C in every build and say why there is no GPU instead of linking stubs. */
#ifndef APEX_BACKEND_CUDA_OPS_H
#define APEX_BACKEND_CUDA_OPS_H

#include "backend/cuda/cuda_internal.h"

typedef struct apex_cuda_ops {
  int (*ready)(const char **why);
  void *(*stream)(void);
  apex_status (*sync)(const char *what);
  apex_status (*device_name)(char *buf, size_t size);
  void (*stats)(apex_cuda_memory_stats *out, int reset_peak);
  void (*empty_cache)(void);
  void *(*host_alloc)(size_t bytes);
  void (*host_free)(void *p);
  apex_status (*layer_norm_fwd)(const void *x, apex_dtype xt, const void *w, const void *b, apex_dtype wt,
                                int64_t rows, int64_t cols, float eps, int rms, void *y, float *mean, float *rstd);
  apex_status (*layer_norm_bwd)(const void *dy, const void *x, apex_dtype xt, const void *w, apex_dtype wt,
                                const float *mean, const float *rstd, int64_t rows, int64_t cols, int rms, void *dx,
                                void *dw, void *db);
  apex_status (*xent_fwd)(const void *logits, apex_dtype lt, const int64_t *target, int64_t rows, int64_t cols,
                          int64_t ignore_index, float smoothing, float *loss, float *lse);
  apex_status (*xent_bwd)(const float *dloss, const void *logits, apex_dtype lt, const int64_t *target,
                          const float *lse, int64_t rows, int64_t cols, int64_t ignore_index, float smoothing,
                          void *dlogits);
  apex_status (*bn_stats)(const void *x, apex_dtype xt, int64_t n, int64_t c, int64_t hw, float *mean, float *var,
                          float *m2);
  apex_status (*gemm)(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void *a,
                      const void *b, apex_dtype in_type, float beta, void *c, apex_dtype c_type, const void *bias,
                      int gelu);
  apex_status (*gemm_batched)(const char *fn, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                              float alpha, const void *a, int64_t lda, int64_t stride_a, const void *b, int64_t ldb,
                              int64_t stride_b, apex_dtype in_type, float beta, void *c, int64_t ldc,
                              int64_t stride_c, apex_dtype c_type, int batch);
  apex_status (*conv2d_fwd)(const apex__cuda_conv *g, const void *x, const void *w, const void *b, apex_dtype bt,
                            void *y);
  apex_status (*conv2d_bwd)(const apex__cuda_conv *g, const void *dy, const void *x, const void *w, void *dx,
                            void *dw, void *db, apex_dtype bt);
  apex_status (*embedding_fwd)(const void *table, apex_dtype tt, int64_t v, int64_t d, const int64_t *ids,
                               int64_t n, void *y, apex_dtype yt);
  apex_status (*embedding_bwd)(const void *dy, apex_dtype dt, const int64_t *ids, int64_t n, int64_t v, int64_t d,
                               void *dtable, apex_dtype gt);
  apex_status (*attention_fwd)(const apex__cuda_attn *a, const void *qkv, void *y, float *lse);
  apex_status (*attention_bwd)(const apex__cuda_attn *a, const void *dy, const void *qkv, const void *y,
                               const float *lse, void *dqkv);
  apex_status (*ew)(apex__cuda_ew_op op, const void *a, apex_dtype at, const void *b, apex_dtype bt, float alpha,
                    void *y, apex_dtype yt, int64_t n);
  apex_status (*sum_rows)(const void *x, apex_dtype xt, int64_t rows, int64_t cols, void *y, apex_dtype yt,
                          int accumulate);
  apex_status (*sum_all)(const void *x, apex_dtype xt, int64_t n, int mean, float *y);
} apex_cuda_ops;

/* The CUDA backend's table, or NULL in a build without CUDA (registry.c). */
const apex_cuda_ops *apex__cuda_ops(void);
/* The table once a GPU can be used; NULL after APEX_ERR_UNSUPPORTED naming fn and saying why not
 * (cuda_api.c). */
const apex_cuda_ops *apex__cuda_need(const char *fn);
extern const apex_cuda_ops apex__cuda_ops_table;

#endif
