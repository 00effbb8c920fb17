/* mt_cuda.h: the multi-tensor kernels of multi_tensor.h for lists whose tensors are on the GPU
 * (mt_cuda.c). The public functions check the first tensor and come here; the host overflow flag and
 * the returned norms are values the caller asked for, so these wait for the GPU at the end. */
#ifndef APEX_MULTI_TENSOR_MT_CUDA_H
#define APEX_MULTI_TENSOR_MT_CUDA_H

#include "apex/tensor.h"

/* 1 when the list is non-empty and its first tensor is a CUDA tensor. */
int apex__mt_on_cuda(apex_tensor *const *t, int n);
apex_status apex__mt_cuda_scale(int *overflow, apex_tensor *const *in, apex_tensor *const *out, int n, float scale);
apex_status apex__mt_cuda_axpby(int *overflow, apex_tensor *const *x, apex_tensor *const *y, apex_tensor *const *out,
                                int n, float a, float b, int arg_to_check);
apex_status apex__mt_cuda_check_finite(int *found_inf, apex_tensor *const *x, int n);
apex_status apex__mt_cuda_l2norm(const char *fn, int *overflow, apex_tensor *const *x, int n, float inv_scale,
                                 float *global_norm, float *per_tensor);

#endif
