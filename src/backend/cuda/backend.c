/* backend.c: the CUDA backend's tables, compiled only in a build with CUDA: its slots (backend/backend.h),
 * its stream and event slots (backend/streams.h) and its runtime services (backend/device_services.h). */
#include "backend/cuda/cuda_backend.h"

const apex_backend apex__cuda_backend = {
    .name = "cuda",
    .device = APEX_DEVICE_CUDA,
    .mem = &apex__cuda_memory,
    .streams = &apex__cuda_streams,
    .services = &apex__cuda_services,
    .mt_scale = apex__cuda_slot_mt_scale,
    .mt_axpby = apex__cuda_slot_mt_axpby,
    .mt_l2norm = apex__cuda_slot_mt_l2norm,
    .optim_step = apex__cuda_slot_optim_step,
    .scaler_update = apex__cuda_slot_scaler_update,
    .nn_binary = apex__cuda_slot_nn_binary,
    .nn_binary_bwd = apex__cuda_slot_nn_binary_bwd,
    .nn_unary = apex__cuda_slot_nn_unary,
    .nn_unary_bwd = apex__cuda_slot_nn_unary_bwd,
    .nn_scale = apex__cuda_slot_nn_scale,
    .nn_scale_bwd = apex__cuda_slot_nn_scale_bwd,
    .nn_row_norm = apex__cuda_slot_nn_row_norm,
    .nn_row_norm_bwd = apex__cuda_slot_nn_row_norm_bwd,
    .nn_reduce = apex__cuda_slot_nn_reduce,
    .nn_embedding = apex__cuda_slot_nn_embedding,
    .nn_embedding_bwd = apex__cuda_slot_nn_embedding_bwd,
    .nn_matmul = apex__cuda_slot_nn_matmul,
    .nn_matmul_bwd = apex__cuda_slot_nn_matmul_bwd,
    .nn_linear = apex__cuda_slot_nn_linear,
    .nn_linear_bwd = apex__cuda_slot_nn_linear_bwd,
    .nn_conv2d = apex__cuda_slot_nn_conv2d,
    .nn_conv2d_bwd = apex__cuda_slot_nn_conv2d_bwd,
    .nn_attention = apex__cuda_slot_nn_attention,
    .nn_attention_bwd = apex__cuda_slot_nn_attention_bwd,
    .nn_cross_entropy = apex__cuda_slot_nn_cross_entropy,
    .nn_cross_entropy_bwd = apex__cuda_slot_nn_cross_entropy_bwd,
    .nn_dropout = apex__cuda_slot_nn_dropout,
    .nn_dropout_bwd = apex__cuda_slot_nn_dropout_bwd,
    .nn_batch_norm = apex__cuda_slot_nn_batch_norm,
    /* the cudaslots group: loss.cu, shape.cu, conv.cu's pooling, norm.cu's batch norm backward, mt_slots.c */
    .mt_flush_unscale = apex__cuda_slot_mt_flush_unscale,
    .nn_softmax = apex__cuda_slot_nn_softmax,
    .nn_softmax_bwd = apex__cuda_slot_nn_softmax_bwd,
    .nn_pointwise_loss = apex__cuda_slot_nn_pointwise_loss,
    .nn_pointwise_loss_bwd = apex__cuda_slot_nn_pointwise_loss_bwd,
    .nn_batch_norm_bwd = apex__cuda_slot_nn_batch_norm_bwd,
    .nn_batch_norm_sums = apex__cuda_slot_nn_batch_norm_sums,
    .nn_batch_norm_dx = apex__cuda_slot_nn_batch_norm_dx,
    .nn_reduce_bwd = apex__cuda_slot_nn_reduce_bwd,
    .nn_permute = apex__cuda_slot_nn_permute,
    .nn_permute_bwd = apex__cuda_slot_nn_permute_bwd,
    .nn_concat = apex__cuda_slot_nn_concat,
    .nn_concat_bwd = apex__cuda_slot_nn_concat_bwd,
    .nn_pool2d = apex__cuda_slot_nn_pool2d,
    .nn_pool2d_bwd = apex__cuda_slot_nn_pool2d_bwd,
};

const apex_streams apex__cuda_streams = {
    .device_count = apex__cuda_device_count,
    .use_device = apex__cuda_use_device,
    .enter = apex__cuda_enter,
    .stream_create = apex__cuda_stream_create,
    .stream_destroy = apex__cuda_stream_destroy,
    .event_create = apex__cuda_event_create,
    .event_destroy = apex__cuda_event_destroy,
    .event_record = apex__cuda_event_record,
    .stream_wait = apex__cuda_stream_wait,
    .event_query = apex__cuda_event_query,
};

/* graph.cu's graph under the services' opaque pointer */
static apex_status capture_end(const char *what, apex_status st, void **graph) {
  apex__cuda_graph *gr = NULL;
  st = apex__cuda_capture_end(what, st, &gr);
  *graph = gr;
  return st;
}
static apex_status graph_launch(void *graph, const char *what) { return apex__cuda_graph_launch(graph, what); }
static void graph_destroy(void *graph) { apex__cuda_graph_destroy(graph); }

const apex_device_services apex__cuda_services = {
    .device_name = apex__cuda_device_name,
    .stream = apex__cuda_stream,
    .memory_stats = apex__cuda_stats,
    .empty_cache = apex__cuda_empty_cache,
    .host_alloc = apex__cuda_host_alloc,
    .host_free = apex__cuda_host_free,
    .capture_begin = apex__cuda_capture_begin,
    .capture_end = capture_end,
    .graph_launch = graph_launch,
    .graph_destroy = graph_destroy,
};
