/* cpu_backend.h: the CPU backend's slot functions, for its table (backend.c). */
#ifndef APEX_BACKEND_CPU_BACKEND_H
#define APEX_BACKEND_CPU_BACKEND_H

#include "backend/backend.h"

/* multi_tensor.c */
apex_status apex__cpu_mt_scale(const apex_mt_scale_args *a);
apex_status apex__cpu_mt_axpby(const apex_mt_axpby_args *a);
apex_status apex__cpu_mt_flush_unscale(const apex_mt_flush_unscale_args *a);
apex_status apex__cpu_mt_l2norm(const apex_mt_l2norm_args *a);

/* optim.c */
apex_status apex__cpu_optim_step(const apex_optim_step_args *a);

/* elementwise.c */
apex_status apex__cpu_nn_binary(const apex_nn_binary_args *a);
apex_status apex__cpu_nn_binary_bwd(const apex_nn_binary_bwd_args *a);
apex_status apex__cpu_nn_unary(const apex_nn_unary_args *a);
apex_status apex__cpu_nn_unary_bwd(const apex_nn_unary_bwd_args *a);
apex_status apex__cpu_nn_scale(const apex_nn_scale_args *a);
apex_status apex__cpu_nn_scale_bwd(const apex_nn_scale_bwd_args *a);
apex_status apex__cpu_nn_dropout(const apex_nn_dropout_args *a);
apex_status apex__cpu_nn_dropout_bwd(const apex_nn_dropout_bwd_args *a);

/* loss.c */
apex_status apex__cpu_nn_softmax(const apex_nn_softmax_args *a);
apex_status apex__cpu_nn_softmax_bwd(const apex_nn_softmax_bwd_args *a);
apex_status apex__cpu_nn_cross_entropy(const apex_nn_cross_entropy_args *a);
apex_status apex__cpu_nn_cross_entropy_bwd(const apex_nn_cross_entropy_bwd_args *a);
apex_status apex__cpu_nn_pointwise_loss(const apex_nn_pointwise_loss_args *a);
apex_status apex__cpu_nn_pointwise_loss_bwd(const apex_nn_pointwise_loss_bwd_args *a);

/* norm.c */
apex_status apex__cpu_nn_batch_norm(const apex_nn_batch_norm_args *a);
apex_status apex__cpu_nn_batch_norm_bwd(const apex_nn_batch_norm_bwd_args *a);
apex_status apex__cpu_nn_batch_norm_sums(const apex_nn_batch_norm_sums_args *a);
apex_status apex__cpu_nn_batch_norm_dx(const apex_nn_batch_norm_dx_args *a);
apex_status apex__cpu_nn_row_norm(const apex_nn_row_norm_args *a);
apex_status apex__cpu_nn_row_norm_bwd(const apex_nn_row_norm_bwd_args *a);

/* shape.c */
apex_status apex__cpu_nn_reduce(const apex_nn_reduce_args *a);
apex_status apex__cpu_nn_reduce_bwd(const apex_nn_reduce_bwd_args *a);
apex_status apex__cpu_nn_permute(const apex_nn_permute_args *a);
apex_status apex__cpu_nn_permute_bwd(const apex_nn_permute_bwd_args *a);
apex_status apex__cpu_nn_concat(const apex_nn_concat_args *a);
apex_status apex__cpu_nn_concat_bwd(const apex_nn_concat_bwd_args *a);
apex_status apex__cpu_nn_embedding(const apex_nn_embedding_args *a);
apex_status apex__cpu_nn_embedding_bwd(const apex_nn_embedding_bwd_args *a);

/* linear.c */
apex_status apex__cpu_nn_matmul(const apex_nn_matmul_args *a);
apex_status apex__cpu_nn_matmul_bwd(const apex_nn_matmul_bwd_args *a);
apex_status apex__cpu_nn_linear(const apex_nn_linear_args *a);
apex_status apex__cpu_nn_linear_bwd(const apex_nn_linear_bwd_args *a);

/* attention.c */
apex_status apex__cpu_nn_attention(const apex_nn_attention_args *a);
apex_status apex__cpu_nn_attention_bwd(const apex_nn_attention_bwd_args *a);

/* conv.c */
apex_status apex__cpu_nn_conv2d(const apex_nn_conv2d_args *a);
apex_status apex__cpu_nn_conv2d_bwd(const apex_nn_conv2d_bwd_args *a);
apex_status apex__cpu_nn_pool2d(const apex_nn_pool2d_args *a);
apex_status apex__cpu_nn_pool2d_bwd(const apex_nn_pool2d_bwd_args *a);

#endif
