/* backend.c: the CPU backend's table (backend/backend.h). Present in every build. The optimizer step
 * and the loss-scaler update have no CPU slot: a CPU group's step runs the optim layer's own kernels
 * (optim/<kind>.c), and apex_loss_scaler updates on the host (amp/loss_scaler.c). */
#include "backend/cpu/cpu_backend.h"

const apex_backend apex__cpu_backend = {
    .name = "cpu",
    .device = APEX_DEVICE_CPU,
    .mem = &apex__cpu_memory,
    .mt_scale = apex__cpu_mt_scale,
    .mt_axpby = apex__cpu_mt_axpby,
    .mt_l2norm = apex__cpu_mt_l2norm,
    .nn_binary = apex__cpu_nn_binary,
    .nn_binary_bwd = apex__cpu_nn_binary_bwd,
    .nn_unary = apex__cpu_nn_unary,
    .nn_unary_bwd = apex__cpu_nn_unary_bwd,
    .nn_scale = apex__cpu_nn_scale,
    .nn_scale_bwd = apex__cpu_nn_scale_bwd,
    .nn_dropout = apex__cpu_nn_dropout,
    .nn_dropout_bwd = apex__cpu_nn_dropout_bwd,
    .nn_softmax = apex__cpu_nn_softmax,
    .nn_softmax_bwd = apex__cpu_nn_softmax_bwd,
    .nn_cross_entropy = apex__cpu_nn_cross_entropy,
    .nn_cross_entropy_bwd = apex__cpu_nn_cross_entropy_bwd,
    .nn_pointwise_loss = apex__cpu_nn_pointwise_loss,
    .nn_pointwise_loss_bwd = apex__cpu_nn_pointwise_loss_bwd,
    .nn_batch_norm = apex__cpu_nn_batch_norm,
    .nn_batch_norm_bwd = apex__cpu_nn_batch_norm_bwd,
    .nn_batch_norm_sums = apex__cpu_nn_batch_norm_sums,
    .nn_batch_norm_dx = apex__cpu_nn_batch_norm_dx,
    .nn_row_norm = apex__cpu_nn_row_norm,
    .nn_row_norm_bwd = apex__cpu_nn_row_norm_bwd,
};
