/* cuda_backend.h: the CUDA backend's slot functions (the C files beside the kernels: memory.c,
 * mt_slots.c, optim_slots.c, nn_slots.c), for its table (backend.c). They turn a slot's argument struct into the
 * device lists and pointers of the kernels' entry points (cuda_internal.h). */
#ifndef APEX_BACKEND_CUDA_BACKEND_H
#define APEX_BACKEND_CUDA_BACKEND_H

#include "backend/backend.h"
#include "backend/cuda/cuda_internal.h"

/* mt_slots.c */
apex_status apex__cuda_slot_mt_scale(const apex_mt_scale_args *a);
apex_status apex__cuda_slot_mt_axpby(const apex_mt_axpby_args *a);
apex_status apex__cuda_slot_mt_l2norm(const apex_mt_l2norm_args *a);
/* optim_slots.c */
apex_status apex__cuda_slot_optim_step(const apex_optim_step_args *a);
apex_status apex__cuda_slot_scaler_update(const apex_scaler_update_args *a);

/* nn_slots.c */
apex_status apex__cuda_slot_nn_binary(const apex_nn_binary_args *a);
apex_status apex__cuda_slot_nn_binary_bwd(const apex_nn_binary_bwd_args *a);
apex_status apex__cuda_slot_nn_unary(const apex_nn_unary_args *a);
apex_status apex__cuda_slot_nn_unary_bwd(const apex_nn_unary_bwd_args *a);
apex_status apex__cuda_slot_nn_scale(const apex_nn_scale_args *a);
apex_status apex__cuda_slot_nn_scale_bwd(const apex_nn_scale_bwd_args *a);
apex_status apex__cuda_slot_nn_row_norm(const apex_nn_row_norm_args *a);
apex_status apex__cuda_slot_nn_row_norm_bwd(const apex_nn_row_norm_bwd_args *a);
apex_status apex__cuda_slot_nn_reduce(const apex_nn_reduce_args *a);
apex_status apex__cuda_slot_nn_embedding(const apex_nn_embedding_args *a);
apex_status apex__cuda_slot_nn_embedding_bwd(const apex_nn_embedding_bwd_args *a);
apex_status apex__cuda_slot_nn_matmul(const apex_nn_matmul_args *a);
apex_status apex__cuda_slot_nn_matmul_bwd(const apex_nn_matmul_bwd_args *a);
apex_status apex__cuda_slot_nn_linear(const apex_nn_linear_args *a);
apex_status apex__cuda_slot_nn_linear_bwd(const apex_nn_linear_bwd_args *a);
apex_status apex__cuda_slot_nn_conv2d(const apex_nn_conv2d_args *a);
apex_status apex__cuda_slot_nn_conv2d_bwd(const apex_nn_conv2d_bwd_args *a);
apex_status apex__cuda_slot_nn_attention(const apex_nn_attention_args *a);
apex_status apex__cuda_slot_nn_attention_bwd(const apex_nn_attention_bwd_args *a);
apex_status apex__cuda_slot_nn_cross_entropy(const apex_nn_cross_entropy_args *a);
apex_status apex__cuda_slot_nn_cross_entropy_bwd(const apex_nn_cross_entropy_bwd_args *a);
apex_status apex__cuda_slot_nn_dropout(const apex_nn_dropout_args *a);
apex_status apex__cuda_slot_nn_dropout_bwd(const apex_nn_dropout_bwd_args *a);
apex_status apex__cuda_slot_nn_batch_norm(const apex_nn_batch_norm_args *a);

#endif
