/* convert.cu: dtype conversion and fill on the GPU, with the CPU's exact rounding (dtype_dev.cuh). */
#include <cuda_runtime.h>

extern "C" {
#include "core/internal.h"
#include "backend/cuda/cuda_internal.h"
}
#include "backend/cuda/dtype_dev.cuh"

__global__ void convert_kernel(void *dst, apex_dtype dt, const void *src, apex_dtype st, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    apex_st(dst, dt, i, apex_ld(src, st, i));
}

__global__ void fill_kernel(void *dst, apex_dtype dt, float v, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    apex_st(dst, dt, i, v);
}

extern "C" apex_status apex__cuda_convert(void *d_dst, apex_dtype dst_type, const void *d_src, apex_dtype src_type,
                                          size_t n) {
  if (n == 0) return APEX_OK;
  if (dst_type == src_type)
    return apex__cuda_memcpy(d_dst, d_src, n * apex_dtype_size(src_type), APEX__D2D, 0);
  convert_kernel<<<apex_grid((int64_t)n, 256, 4), 256, 0, (cudaStream_t)apex__cuda_stream()>>>(d_dst, dst_type, d_src,
                                                                                              src_type, (int64_t)n);
  return apex__cuda_check_launch("CUDA convert");
}

extern "C" apex_status apex__cuda_fill(void *d_dst, apex_dtype dtype, float value, size_t n) {
  if (n == 0) return APEX_OK;
  fill_kernel<<<apex_grid((int64_t)n, 256, 4), 256, 0, (cudaStream_t)apex__cuda_stream()>>>(d_dst, dtype, value,
                                                                                           (int64_t)n);
  return apex__cuda_check_launch("CUDA fill");
}
