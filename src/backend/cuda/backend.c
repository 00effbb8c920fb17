/* backend.c: the CUDA backend's tables, compiled only in a build with CUDA: its slots (backend/backend.h)
 * and what only it has (backend/cuda_ops.h). */
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda_ops.h"

const apex_backend apex__cuda_backend = {
    .name = "cuda",
    .device = APEX_DEVICE_CUDA,
    .mem = &apex__cuda_memory,
    .mt_scale = apex__cuda_slot_mt_scale,
    .mt_axpby = apex__cuda_slot_mt_axpby,
    .mt_l2norm = apex__cuda_slot_mt_l2norm,
    .optim_step = apex__cuda_slot_optim_step,
    .scaler_update = apex__cuda_slot_scaler_update,
};

const apex_cuda_ops apex__cuda_ops_table = {
    .ready = apex__cuda_ready,
    .stream = apex__cuda_stream,
    .sync = apex__cuda_sync,
    .device_name = apex__cuda_device_name,
    .stats = apex__cuda_stats,
    .empty_cache = apex__cuda_empty_cache,
    .host_alloc = apex__cuda_host_alloc,
    .host_free = apex__cuda_host_free,
    .layer_norm_fwd = apex__cuda_layer_norm_fwd,
    .layer_norm_bwd = apex__cuda_layer_norm_bwd,
    .xent_fwd = apex__cuda_xent_fwd,
    .xent_bwd = apex__cuda_xent_bwd,
    .bn_stats = apex__cuda_bn_stats,
    .gemm = apex__cuda_gemm,
    .gemm_batched = apex__cuda_gemm_batched,
    .conv2d_fwd = apex__cuda_conv2d_fwd,
    .conv2d_bwd = apex__cuda_conv2d_bwd,
    .embedding_fwd = apex__cuda_embedding_fwd,
    .embedding_bwd = apex__cuda_embedding_bwd,
    .attention_fwd = apex__cuda_attention_fwd,
    .attention_bwd = apex__cuda_attention_bwd,
    .ew = apex__cuda_ew,
    .sum_rows = apex__cuda_sum_rows,
    .sum_all = apex__cuda_sum_all,
};
