/* test_null_handles.c: every public function that takes a handle (the accessors, the ops, the module
 * constructors, destroy) is called with NULL for every pointer, as happens when an earlier call of a
 * chain failed (apex_tensor_dtype(apex_var_value(apex_amp_forward(...)))). Each call runs in a child
 * process, so a crash fails the test naming the function; a call that returns a pointer must return
 * NULL (apex_module_name and apex_pg_backend: "", as documented). The list covers every APEX_API function of include/apex/ that returns something other than
 * apex_status and takes an apex_ handle first: test_list_is_complete reads the headers and fails on one
 * missing from the list. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "apex/apex.h"
#include "apex/cpu.h"
#include "apex/cuda.h"
#include "apex/ddp.h"
#include "apex/data.h"
#include "apex/fp16_optimizer.h"
#include "apex/mt_apply.h"
#include "testutil.h"

static int call_amp_destroy(void) { apex_amp_destroy(NULL); return 0; }
static int call_amp_properties_of(void) { return apex_amp_properties_of(NULL) == NULL ? 0 : 1; }
static int call_amp_casts_enabled(void) { (void)apex_amp_casts_enabled(NULL, NULL, 0); return 0; }
static int call_amp_forward(void) { return apex_amp_forward(NULL, 0, NULL, NULL, NULL) == NULL ? 0 : 1; }
static int call_amp_loss_scaler(void) { return apex_amp_loss_scaler(NULL, 0) == NULL ? 0 : 1; }
static int call_amp_scale_at_min(void) { (void)apex_amp_scale_at_min(NULL, 0); return 0; }
static int call_amp_loss_scale(void) { (void)apex_amp_loss_scale(NULL, 0); return 0; }
static int call_amp_master_param(void) { return apex_amp_master_param(NULL, NULL, 0, 0) == NULL ? 0 : 1; }
static int call_amp_master_of(void) { return apex_amp_master_of(NULL, NULL) == NULL ? 0 : 1; }
static int call_amp_state_size(void) { (void)apex_amp_state_size(NULL); return 0; }
static int call_amp_properties_format(void) { return apex_amp_properties_format(NULL, NULL, 0) == NULL ? 0 : 1; }
static int call_graph_destroy(void) { apex_graph_destroy(NULL); return 0; }
static int call_graph_reset(void) { apex_graph_reset(NULL); return 0; }
static int call_graph_set_grad_enabled(void) { (void)apex_graph_set_grad_enabled(NULL, 0); return 0; }
static int call_graph_pool_bytes(void) { (void)apex_graph_pool_bytes(NULL); return 0; }
static int call_graph_live_bytes(void) { (void)apex_graph_live_bytes(NULL); return 0; }
static int call_graph_saved_bytes(void) { (void)apex_graph_saved_bytes(NULL); return 0; }
static int call_var_create(void) { return apex_var_create(NULL, 0) == NULL ? 0 : 1; }
static int call_var_destroy(void) { apex_var_destroy(NULL); return 0; }
static int call_var_release(void) { apex_var_release(NULL); return 0; }
static int call_graph_input(void) { return apex_graph_input(NULL, NULL, 0) == NULL ? 0 : 1; }
static int call_var_value(void) { return apex_var_value(NULL) == NULL ? 0 : 1; }
static int call_var_grad(void) { return apex_var_grad(NULL) == NULL ? 0 : 1; }
static int call_var_requires_grad(void) { (void)apex_var_requires_grad(NULL); return 0; }
static int call_var_op(void) { (void)apex_var_op(NULL); return 0; }
static int call_var_graph(void) { return apex_var_graph(NULL) == NULL ? 0 : 1; }
static int call_var_item(void) { (void)apex_var_item(NULL); return 0; }
static int call_var_swap_value(void) { return apex_var_swap_value(NULL, NULL) == NULL ? 0 : 1; }
static int call_graph_autocast_enabled(void) { (void)apex_graph_autocast_enabled(NULL); return 0; }
static int call_graph_half_grads(void) { (void)apex_graph_half_grads(NULL); return 0; }
static int call_graph_config_tag(void) { (void)apex_graph_config_tag(NULL); return 0; }
static int call_graph_device(void) { return apex_graph_device(NULL) == APEX_DEVICE_CPU ? 0 : 1; }
static int call_idx_destroy(void) { apex_idx_destroy(NULL); return 0; }
static int call_idx_ndim(void) { (void)apex_idx_ndim(NULL); return 0; }
static int call_idx_dim(void) { (void)apex_idx_dim(NULL, 0); return 0; }
static int call_idx_numel(void) { (void)apex_idx_numel(NULL); return 0; }
static int call_idx_data(void) { return apex_idx_data(NULL) == NULL ? 0 : 1; }
static int call_idx_to_f32(void) { return apex_idx_to_f32(NULL, 0, 0, 0, NULL, 0.0f, 0.0f) == NULL ? 0 : 1; }
static int call_ddp_create(void) { return apex_ddp_create(NULL, NULL, NULL) == NULL ? 0 : 1; }
static int call_ddp_destroy(void) { apex_ddp_destroy(NULL); return 0; }
static int call_ddp_set_sync(void) { (void)apex_ddp_set_sync(NULL, 0); return 0; }
static int call_ddp_reducer(void) { return apex_ddp_reducer(NULL) == NULL ? 0 : 1; }
static int call_sync_batch_norm(void) { return apex_sync_batch_norm(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL) == NULL ? 0 : 1; }
static int call_fp16_optimizer_create(void) { return apex_fp16_optimizer_create(NULL, NULL) == NULL ? 0 : 1; }
static int call_fp16_optimizer_destroy(void) { apex_fp16_optimizer_destroy(NULL); return 0; }
static int call_fp16_optimizer_loss_scale(void) { (void)apex_fp16_optimizer_loss_scale(NULL); return 0; }
static int call_fp16_optimizer_optimizer(void) { return apex_fp16_optimizer_optimizer(NULL) == NULL ? 0 : 1; }
static int call_fp16_optimizer_scaler(void) { return apex_fp16_optimizer_scaler(NULL) == NULL ? 0 : 1; }
static int call_loss_scaler_destroy(void) { apex_loss_scaler_destroy(NULL); return 0; }
static int call_loss_scaler_get_config(void) { (void)apex_loss_scaler_get_config(NULL); return 0; }
static int call_loss_scaler_scale(void) { (void)apex_loss_scaler_scale(NULL); return 0; }
static int call_loss_scaler_inv_scale(void) { (void)apex_loss_scaler_inv_scale(NULL); return 0; }
static int call_loss_scaler_at_min(void) { (void)apex_loss_scaler_at_min(NULL); return 0; }
static int call_loss_scaler_get_state(void) { (void)apex_loss_scaler_get_state(NULL); return 0; }
static int call_loss_scaler_device(void) { (void)apex_loss_scaler_device(NULL); return 0; }
static int call_loss_scaler_scale_ptr(void) { return apex_loss_scaler_scale_ptr(NULL) == NULL ? 0 : 1; }
static int call_loss_scaler_found_inf_ptr(void) { return apex_loss_scaler_found_inf_ptr(NULL) == NULL ? 0 : 1; }
static int call_model_destroy(void) { apex_model_destroy(NULL); return 0; }
static int call_model_train(void) { apex_model_train(NULL, 0); return 0; }
static int call_model_is_training(void) { (void)apex_model_is_training(NULL); return 0; }
static int call_model_rng(void) { return apex_model_rng(NULL) == NULL ? 0 : 1; }
static int call_model_num_params(void) { (void)apex_model_num_params(NULL); return 0; }
static int call_model_param(void) { return apex_model_param(NULL, 0, NULL) == NULL ? 0 : 1; }
static int call_model_find_param(void) { return apex_model_find_param(NULL, NULL) == NULL ? 0 : 1; }
static int call_model_param_elements(void) { (void)apex_model_param_elements(NULL); return 0; }
static int call_model_num_buffers(void) { (void)apex_model_num_buffers(NULL); return 0; }
static int call_model_buffer(void) { return apex_model_buffer(NULL, 0, NULL) == NULL ? 0 : 1; }
static int call_model_find_buffer(void) { return apex_model_find_buffer(NULL, NULL) == NULL ? 0 : 1; }
static int call_model_param_in_batch_norm(void) { (void)apex_model_param_in_batch_norm(NULL, 0); return 0; }
static int call_module_forward(void) { return apex_module_forward(NULL, NULL, NULL) == NULL ? 0 : 1; }
static int call_module_name(void) { return strcmp(apex_module_name(NULL), "") != 0; } /* documented: "" */
static int call_module_param(void) { return apex_module_param(NULL, NULL) == NULL ? 0 : 1; }
static int call_linear_create(void) { return apex_linear_create(NULL, NULL, 0, 0, 0) == NULL ? 0 : 1; }
static int call_conv2d_create(void) { return apex_conv2d_create(NULL, NULL, 0, 0, 0, 0, NULL, 0) == NULL ? 0 : 1; }
static int call_batch_norm1d_create(void) { return apex_batch_norm1d_create(NULL, NULL, 0, NULL) == NULL ? 0 : 1; }
static int call_batch_norm2d_create(void) { return apex_batch_norm2d_create(NULL, NULL, 0, NULL) == NULL ? 0 : 1; }
static int call_layer_norm_create(void) { return apex_layer_norm_create(NULL, NULL, 0, 0.0f) == NULL ? 0 : 1; }
static int call_layer_norm_nd_create(void) { return apex_layer_norm_nd_create(NULL, NULL, 0, NULL, 0.0f) == NULL ? 0 : 1; }
static int call_rms_norm_create(void) { return apex_rms_norm_create(NULL, NULL, 0, 0.0f) == NULL ? 0 : 1; }
static int call_rms_norm_nd_create(void) { return apex_rms_norm_nd_create(NULL, NULL, 0, NULL, 0.0f) == NULL ? 0 : 1; }
static int call_embedding_create(void) { return apex_embedding_create(NULL, NULL, 0, 0) == NULL ? 0 : 1; }
static int call_embedding_forward(void) { return apex_embedding_forward(NULL, NULL, NULL, 0, NULL) == NULL ? 0 : 1; }
static int call_attention_create(void) { return apex_attention_create(NULL, NULL, 0, 0) == NULL ? 0 : 1; }
static int call_transformer_block_create(void) { return apex_transformer_block_create(NULL, NULL, 0, 0) == NULL ? 0 : 1; }
static int call_mlp_create(void) { return apex_mlp_create(NULL, NULL) == NULL ? 0 : 1; }
static int call_cnn_create(void) { return apex_cnn_create(NULL, NULL) == NULL ? 0 : 1; }
static int call_gpt_create(void) { return apex_gpt_create(NULL, NULL) == NULL ? 0 : 1; }
static int call_gpt_forward(void) { return apex_gpt_forward(NULL, NULL, NULL, 0, 0) == NULL ? 0 : 1; }
static int call_gpt_loss(void) { return apex_gpt_loss(NULL, NULL, NULL, NULL, 0, 0) == NULL ? 0 : 1; }
static int call_gpt_forward_index(void) { return apex_gpt_forward_index(NULL, NULL, NULL) == NULL ? 0 : 1; }
static int call_gpt_loss_index(void) { return apex_gpt_loss_index(NULL, NULL, NULL, NULL) == NULL ? 0 : 1; }
static int call_embedding_forward_index(void) { return apex_embedding_forward_index(NULL, NULL, NULL) == NULL ? 0 : 1; }
static int call_embedding_index(void) { return apex_embedding_index(NULL, NULL, NULL) == NULL ? 0 : 1; }
static int call_cross_entropy_index(void) { return apex_cross_entropy_index(NULL, NULL, NULL, NULL) == NULL ? 0 : 1; }
static int call_linear_cross_entropy_index(void) { return apex_linear_cross_entropy_index(NULL, NULL, NULL, NULL, NULL, 0) == NULL ? 0 : 1; }
static int call_index_destroy(void) { apex_index_destroy(NULL); return 0; }
static int call_index_device(void) { return apex_index_device(NULL) == APEX_DEVICE_NONE ? 0 : 1; }
static int call_index_ndim(void) { return apex_index_ndim(NULL) == -1 ? 0 : 1; }
static int call_index_dim(void) { return apex_index_dim(NULL, 0) == -1 ? 0 : 1; }
static int call_index_numel(void) { return apex_index_numel(NULL) == -1 ? 0 : 1; }
static int call_index_bound(void) { return apex_index_bound(NULL) == -1 ? 0 : 1; }
static int call_captured_step_destroy(void) { apex_captured_step_destroy(NULL); return 0; }
static int call_gpt_sizes(void) { return apex_gpt_sizes(NULL, NULL) == APEX_ERR_INVALID_ARG ? 0 : 1; }
static int call_gpt_hf_sizes(void) { return apex_gpt_hf_sizes(NULL, NULL) == APEX_ERR_INVALID_ARG ? 0 : 1; }
static int call_gpt_load_hf(void) { return apex_gpt_load_hf(NULL, NULL, NULL, NULL) == APEX_ERR_INVALID_ARG ? 0 : 1; }
static int call_gpt_save_hf(void) { return apex_gpt_save_hf(NULL, NULL, NULL, NULL) == APEX_ERR_INVALID_ARG ? 0 : 1; }
static int call_activation_create(void) { return apex_activation_create(NULL, 0) == NULL ? 0 : 1; }
static int call_max_pool2d_create(void) { return apex_max_pool2d_create(NULL, NULL) == NULL ? 0 : 1; }
static int call_avg_pool2d_create(void) { return apex_avg_pool2d_create(NULL, NULL) == NULL ? 0 : 1; }
static int call_flatten_create(void) { return apex_flatten_create(NULL) == NULL ? 0 : 1; }
static int call_dropout_create(void) { return apex_dropout_create(NULL, 0.0f) == NULL ? 0 : 1; }
static int call_sequential_create(void) { return apex_sequential_create(NULL, NULL) == NULL ? 0 : 1; }
static int call_add(void) { return apex_add(NULL, NULL, NULL) == NULL ? 0 : 1; }
static int call_sub(void) { return apex_sub(NULL, NULL, NULL) == NULL ? 0 : 1; }
static int call_mul(void) { return apex_mul(NULL, NULL, NULL) == NULL ? 0 : 1; }
static int call_div(void) { return apex_div(NULL, NULL, NULL) == NULL ? 0 : 1; }
static int call_scale(void) { return apex_scale(NULL, NULL, 0.0f) == NULL ? 0 : 1; }
static int call_cast(void) { return apex_cast(NULL, NULL, 0) == NULL ? 0 : 1; }
static int call_relu(void) { return apex_relu(NULL, NULL) == NULL ? 0 : 1; }
static int call_gelu(void) { return apex_gelu(NULL, NULL) == NULL ? 0 : 1; }
static int call_gelu_tanh(void) { return apex_gelu_tanh(NULL, NULL) == NULL ? 0 : 1; }
static int call_tanh(void) { return apex_tanh(NULL, NULL) == NULL ? 0 : 1; }
static int call_sigmoid(void) { return apex_sigmoid(NULL, NULL) == NULL ? 0 : 1; }
static int call_exp(void) { return apex_exp(NULL, NULL) == NULL ? 0 : 1; }
static int call_log(void) { return apex_log(NULL, NULL) == NULL ? 0 : 1; }
static int call_pow(void) { return apex_pow(NULL, NULL, 0.0f) == NULL ? 0 : 1; }
static int call_pow_tensor(void) { return apex_pow_tensor(NULL, NULL, NULL) == NULL ? 0 : 1; }
static int call_gt(void) { return apex_gt(NULL, NULL, NULL) == NULL ? 0 : 1; }
static int call_lt(void) { return apex_lt(NULL, NULL, NULL) == NULL ? 0 : 1; }
static int call_eq(void) { return apex_eq(NULL, NULL, NULL) == NULL ? 0 : 1; }
static int call_dropout(void) { return apex_dropout(NULL, NULL, 0.0f, 0, NULL) == NULL ? 0 : 1; }
static int call_matmul(void) { return apex_matmul(NULL, NULL, NULL) == NULL ? 0 : 1; }
static int call_linear(void) { return apex_linear(NULL, NULL, NULL, NULL) == NULL ? 0 : 1; }
static int call_linear_gelu(void) { return apex_linear_gelu(NULL, NULL, NULL, NULL) == NULL ? 0 : 1; }
static int call_linear_cross_entropy(void) { return apex_linear_cross_entropy(NULL, NULL, NULL, NULL, NULL, 0) == NULL ? 0 : 1; }
static int call_add_layer_norm(void) {
  apex_var *sum = NULL;
  return apex_add_layer_norm(NULL, NULL, NULL, NULL, NULL, 0.0f, &sum) == NULL && !sum ? 0 : 1;
}
static int call_conv2d(void) { return apex_conv2d(NULL, NULL, NULL, NULL, NULL) == NULL ? 0 : 1; }
static int call_max_pool2d(void) { return apex_max_pool2d(NULL, NULL, NULL) == NULL ? 0 : 1; }
static int call_avg_pool2d(void) { return apex_avg_pool2d(NULL, NULL, NULL) == NULL ? 0 : 1; }
static int call_batch_norm(void) { return apex_batch_norm(NULL, NULL, NULL, NULL, NULL, NULL, NULL) == NULL ? 0 : 1; }
static int call_layer_norm(void) { return apex_layer_norm(NULL, NULL, NULL, NULL, 0.0f) == NULL ? 0 : 1; }
static int call_layer_norm_nd(void) { return apex_layer_norm_nd(NULL, NULL, 0, NULL, NULL, NULL, 0.0f) == NULL ? 0 : 1; }
static int call_rms_norm(void) { return apex_rms_norm(NULL, NULL, NULL, 0.0f) == NULL ? 0 : 1; }
static int call_rms_norm_nd(void) { return apex_rms_norm_nd(NULL, NULL, 0, NULL, NULL, 0.0f) == NULL ? 0 : 1; }
static int call_embedding(void) { return apex_embedding(NULL, NULL, NULL, 0, NULL) == NULL ? 0 : 1; }
static int call_softmax(void) { return apex_softmax(NULL, NULL, 0) == NULL ? 0 : 1; }
static int call_log_softmax(void) { return apex_log_softmax(NULL, NULL, 0) == NULL ? 0 : 1; }
static int call_cross_entropy(void) { return apex_cross_entropy(NULL, NULL, NULL, NULL) == NULL ? 0 : 1; }
static int call_mse_loss(void) { return apex_mse_loss(NULL, NULL, NULL, 0) == NULL ? 0 : 1; }
static int call_bce_with_logits(void) { return apex_bce_with_logits(NULL, NULL, NULL, 0) == NULL ? 0 : 1; }
static int call_bce(void) { return apex_bce(NULL, NULL, NULL, 0) == NULL ? 0 : 1; }
static int call_sum_all(void) { return apex_sum_all(NULL, NULL) == NULL ? 0 : 1; }
static int call_mean_all(void) { return apex_mean_all(NULL, NULL) == NULL ? 0 : 1; }
static int call_sum(void) { return apex_sum(NULL, NULL, 0, 0) == NULL ? 0 : 1; }
static int call_mean(void) { return apex_mean(NULL, NULL, 0, 0) == NULL ? 0 : 1; }
static int call_norm_all(void) { return apex_norm_all(NULL, NULL) == NULL ? 0 : 1; }
static int call_norm(void) { return apex_norm(NULL, NULL, 0, 0) == NULL ? 0 : 1; }
static int call_reshape(void) { return apex_reshape(NULL, NULL, 0, NULL) == NULL ? 0 : 1; }
static int call_permute(void) { return apex_permute(NULL, NULL, NULL) == NULL ? 0 : 1; }
static int call_transpose(void) { return apex_transpose(NULL, NULL, 0, 0) == NULL ? 0 : 1; }
static int call_concat(void) { return apex_concat(NULL, 0, NULL, 0) == NULL ? 0 : 1; }
static int call_causal_attention(void) { return apex_causal_attention(NULL, NULL, NULL, NULL) == NULL ? 0 : 1; }
static int call_causal_attention_heads(void) { return apex_causal_attention_heads(NULL, NULL, NULL, NULL, 2) == NULL ? 0 : 1; }
static int call_causal_attention_qkv(void) { return apex_causal_attention_qkv(NULL, NULL, 2) == NULL ? 0 : 1; }
static int call_optimizer_destroy(void) { apex_optimizer_destroy(NULL); return 0; }
static int call_optimizer_get_lr(void) { (void)apex_optimizer_get_lr(NULL, 0); return 0; }
static int call_optimizer_kind(void) { (void)apex_optimizer_kind(NULL); return 0; }
static int call_optimizer_num_groups(void) { (void)apex_optimizer_num_groups(NULL); return 0; }
static int call_optimizer_group_size(void) { (void)apex_optimizer_group_size(NULL, 0); return 0; }
static int call_optimizer_master(void) { return apex_optimizer_master(NULL, 0, 0) == NULL ? 0 : 1; }
static int call_optimizer_param(void) { return apex_optimizer_param(NULL, 0, 0) == NULL ? 0 : 1; }
static int call_optimizer_grad(void) { return apex_optimizer_grad(NULL, 0, 0) == NULL ? 0 : 1; }
static int call_optimizer_step_count(void) { (void)apex_optimizer_step_count(NULL, 0, 0); return 0; }
static int call_pg_destroy(void) { apex_pg_destroy(NULL); return 0; }
static int call_pg_rank(void) { (void)apex_pg_rank(NULL); return 0; }
static int call_pg_world_size(void) { (void)apex_pg_world_size(NULL); return 0; }
static int call_pg_backend(void) { return strcmp(apex_pg_backend(NULL), "") != 0; } /* documented: "" */
static int call_pg_device(void) { (void)apex_pg_device(NULL); return 0; }
static int call_reducer_create(void) { return apex_reducer_create(NULL, NULL, 0, NULL) == NULL ? 0 : 1; }
static int call_reducer_destroy(void) { apex_reducer_destroy(NULL); return 0; }
static int call_reducer_bucket_count(void) { (void)apex_reducer_bucket_count(NULL); return 0; }
static int call_reducer_bucket_of(void) { (void)apex_reducer_bucket_of(NULL, 0); return 0; }
static int call_reducer_buckets_started(void) { (void)apex_reducer_buckets_started(NULL); return 0; }
static int call_zero_create(void) { return apex_zero_create(NULL, NULL, NULL, 0, APEX_OPTIM_ADAM, NULL, NULL) == NULL ? 0 : 1; }
static int call_zero_destroy(void) { apex_zero_destroy(NULL); return 0; }
static int call_zero_get_lr(void) { (void)apex_zero_get_lr(NULL); return 0; }
static int call_zero_state_bytes(void) { (void)apex_zero_state_bytes(NULL); return 0; }
static int call_zero_buffer_bytes(void) { (void)apex_zero_buffer_bytes(NULL); return 0; }
static int call_zero_grad_bytes(void) { (void)apex_zero_grad_bytes(NULL, NULL); return 0; }
static int call_reducer_buffer_bytes(void) { (void)apex_reducer_buffer_bytes(NULL); return 0; }
static int call_tensor_released(void) { (void)apex_tensor_released(NULL); return 0; }
static int call_zero_consolidate(void) { return apex_zero_consolidate(NULL) == NULL ? 0 : 1; }
static int call_safetensors_close(void) { apex_safetensors_close(NULL); return 0; }
static int call_safetensors_count(void) { (void)apex_safetensors_count(NULL); return 0; }
static int call_safetensors_name(void) { return apex_safetensors_name(NULL, 0) == NULL ? 0 : 1; }
static int call_safetensors_has(void) { (void)apex_safetensors_has(NULL, NULL); return 0; }
static int call_safetensors_metadata(void) { return apex_safetensors_metadata(NULL, NULL) == NULL ? 0 : 1; }
static int call_safetensors_get(void) { return apex_safetensors_get(NULL, NULL) == NULL ? 0 : 1; }
static int call_tensor_clone(void) { return apex_tensor_clone(NULL) == NULL ? 0 : 1; }
static int call_tensor_destroy(void) { apex_tensor_destroy(NULL); return 0; }
static int call_tensor_dtype(void) { (void)apex_tensor_dtype(NULL); return 0; }
static int call_tensor_device(void) { (void)apex_tensor_device(NULL); return 0; }
static int call_tensor_ndim(void) { (void)apex_tensor_ndim(NULL); return 0; }
static int call_tensor_dim(void) { (void)apex_tensor_dim(NULL, 0); return 0; }
static int call_tensor_shape(void) { return apex_tensor_shape(NULL) == NULL ? 0 : 1; }
static int call_tensor_numel(void) { (void)apex_tensor_numel(NULL); return 0; }
static int call_tensor_nbytes(void) { (void)apex_tensor_nbytes(NULL); return 0; }
static int call_tensor_data(void) { return apex_tensor_data(NULL) == NULL ? 0 : 1; }
static int call_tensor_same_shape(void) { (void)apex_tensor_same_shape(NULL, NULL); return 0; }
static int call_tensor_shape_str(void) { return apex_tensor_shape_str(NULL, NULL, 0) == NULL ? 0 : 1; }
static int call_tensor_to(void) { return apex_tensor_to(NULL, 0) == NULL ? 0 : 1; }
static int call_tensor_get(void) { (void)apex_tensor_get(NULL, 0); return 0; }
static int call_tensor_set(void) { apex_tensor_set(NULL, 0, 0.0f); return 0; }
static int call_tensor_view(void) { return apex_tensor_view(NULL, 0, NULL) == NULL ? 0 : 1; }
static int call_tensor_slice_view(void) { return apex_tensor_slice_view(NULL, 0, 0, NULL) == NULL ? 0 : 1; }
static int call_tensor_shares_storage(void) { (void)apex_tensor_shares_storage(NULL, NULL); return 0; }
/* Not a handle first, but a list of them: a NULL list, and a list holding NULL. */
static int call_mt_chunk_count(void) {
  apex_tensor *one_null[1] = {NULL};
  size_t start[2] = {7, 7};
  return apex_mt_chunk_count(0, NULL, 1, NULL) != 0 || apex_mt_chunk_count(0, one_null, 1, start) != 0 || start[0] != 7;
}
static const struct { const char *name; int (*call)(void); } calls[] = {
    {"apex_mt_chunk_count", call_mt_chunk_count},
    {"apex_amp_destroy", call_amp_destroy},
    {"apex_amp_properties_of", call_amp_properties_of},
    {"apex_amp_casts_enabled", call_amp_casts_enabled},
    {"apex_amp_forward", call_amp_forward},
    {"apex_amp_loss_scaler", call_amp_loss_scaler},
    {"apex_amp_scale_at_min", call_amp_scale_at_min},
    {"apex_amp_loss_scale", call_amp_loss_scale},
    {"apex_amp_master_param", call_amp_master_param},
    {"apex_amp_master_of", call_amp_master_of},
    {"apex_amp_state_size", call_amp_state_size},
    {"apex_amp_properties_format", call_amp_properties_format},
    {"apex_graph_destroy", call_graph_destroy},
    {"apex_graph_reset", call_graph_reset},
    {"apex_graph_set_grad_enabled", call_graph_set_grad_enabled},
    {"apex_graph_pool_bytes", call_graph_pool_bytes},
    {"apex_graph_live_bytes", call_graph_live_bytes},
    {"apex_graph_saved_bytes", call_graph_saved_bytes},
    {"apex_var_create", call_var_create},
    {"apex_var_destroy", call_var_destroy},
    {"apex_var_release", call_var_release},
    {"apex_graph_input", call_graph_input},
    {"apex_var_value", call_var_value},
    {"apex_var_grad", call_var_grad},
    {"apex_var_requires_grad", call_var_requires_grad},
    {"apex_var_op", call_var_op},
    {"apex_var_graph", call_var_graph},
    {"apex_var_item", call_var_item},
    {"apex_var_swap_value", call_var_swap_value},
    {"apex_graph_autocast_enabled", call_graph_autocast_enabled},
    {"apex_graph_half_grads", call_graph_half_grads},
    {"apex_graph_config_tag", call_graph_config_tag},
    {"apex_graph_device", call_graph_device},
    {"apex_idx_destroy", call_idx_destroy},
    {"apex_idx_ndim", call_idx_ndim},
    {"apex_idx_dim", call_idx_dim},
    {"apex_idx_numel", call_idx_numel},
    {"apex_idx_data", call_idx_data},
    {"apex_idx_to_f32", call_idx_to_f32},
    {"apex_ddp_create", call_ddp_create},
    {"apex_ddp_destroy", call_ddp_destroy},
    {"apex_ddp_set_sync", call_ddp_set_sync},
    {"apex_ddp_reducer", call_ddp_reducer},
    {"apex_sync_batch_norm", call_sync_batch_norm},
    {"apex_fp16_optimizer_create", call_fp16_optimizer_create},
    {"apex_fp16_optimizer_destroy", call_fp16_optimizer_destroy},
    {"apex_fp16_optimizer_loss_scale", call_fp16_optimizer_loss_scale},
    {"apex_fp16_optimizer_optimizer", call_fp16_optimizer_optimizer},
    {"apex_fp16_optimizer_scaler", call_fp16_optimizer_scaler},
    {"apex_loss_scaler_destroy", call_loss_scaler_destroy},
    {"apex_loss_scaler_get_config", call_loss_scaler_get_config},
    {"apex_loss_scaler_scale", call_loss_scaler_scale},
    {"apex_loss_scaler_inv_scale", call_loss_scaler_inv_scale},
    {"apex_loss_scaler_at_min", call_loss_scaler_at_min},
    {"apex_loss_scaler_get_state", call_loss_scaler_get_state},
    {"apex_loss_scaler_device", call_loss_scaler_device},
    {"apex_loss_scaler_scale_ptr", call_loss_scaler_scale_ptr},
    {"apex_loss_scaler_found_inf_ptr", call_loss_scaler_found_inf_ptr},
    {"apex_model_destroy", call_model_destroy},
    {"apex_model_train", call_model_train},
    {"apex_model_is_training", call_model_is_training},
    {"apex_model_rng", call_model_rng},
    {"apex_model_num_params", call_model_num_params},
    {"apex_model_param", call_model_param},
    {"apex_model_find_param", call_model_find_param},
    {"apex_model_param_elements", call_model_param_elements},
    {"apex_model_num_buffers", call_model_num_buffers},
    {"apex_model_buffer", call_model_buffer},
    {"apex_model_find_buffer", call_model_find_buffer},
    {"apex_model_param_in_batch_norm", call_model_param_in_batch_norm},
    {"apex_module_forward", call_module_forward},
    {"apex_module_name", call_module_name},
    {"apex_module_param", call_module_param},
    {"apex_linear_create", call_linear_create},
    {"apex_conv2d_create", call_conv2d_create},
    {"apex_batch_norm1d_create", call_batch_norm1d_create},
    {"apex_batch_norm2d_create", call_batch_norm2d_create},
    {"apex_layer_norm_create", call_layer_norm_create},
    {"apex_layer_norm_nd_create", call_layer_norm_nd_create},
    {"apex_rms_norm_create", call_rms_norm_create},
    {"apex_rms_norm_nd_create", call_rms_norm_nd_create},
    {"apex_embedding_create", call_embedding_create},
    {"apex_embedding_forward", call_embedding_forward},
    {"apex_attention_create", call_attention_create},
    {"apex_transformer_block_create", call_transformer_block_create},
    {"apex_mlp_create", call_mlp_create},
    {"apex_cnn_create", call_cnn_create},
    {"apex_gpt_create", call_gpt_create},
    {"apex_gpt_forward", call_gpt_forward},
    {"apex_gpt_loss", call_gpt_loss},
    {"apex_gpt_sizes", call_gpt_sizes},
    {"apex_gpt_forward_index", call_gpt_forward_index},
    {"apex_gpt_loss_index", call_gpt_loss_index},
    {"apex_embedding_forward_index", call_embedding_forward_index},
    {"apex_embedding_index", call_embedding_index},
    {"apex_cross_entropy_index", call_cross_entropy_index},
    {"apex_linear_cross_entropy_index", call_linear_cross_entropy_index},
    {"apex_index_destroy", call_index_destroy},
    {"apex_index_device", call_index_device},
    {"apex_index_ndim", call_index_ndim},
    {"apex_index_dim", call_index_dim},
    {"apex_index_numel", call_index_numel},
    {"apex_index_bound", call_index_bound},
    {"apex_captured_step_destroy", call_captured_step_destroy},
    {"apex_gpt_hf_sizes", call_gpt_hf_sizes},
    {"apex_gpt_load_hf", call_gpt_load_hf},
    {"apex_gpt_save_hf", call_gpt_save_hf},
    {"apex_activation_create", call_activation_create},
    {"apex_max_pool2d_create", call_max_pool2d_create},
    {"apex_avg_pool2d_create", call_avg_pool2d_create},
    {"apex_flatten_create", call_flatten_create},
    {"apex_dropout_create", call_dropout_create},
    {"apex_sequential_create", call_sequential_create},
    {"apex_add", call_add},
    {"apex_sub", call_sub},
    {"apex_mul", call_mul},
    {"apex_div", call_div},
    {"apex_scale", call_scale},
    {"apex_cast", call_cast},
    {"apex_relu", call_relu},
    {"apex_gelu", call_gelu},
    {"apex_gelu_tanh", call_gelu_tanh},
    {"apex_tanh", call_tanh},
    {"apex_sigmoid", call_sigmoid},
    {"apex_exp", call_exp},
    {"apex_log", call_log},
    {"apex_pow", call_pow},
    {"apex_pow_tensor", call_pow_tensor},
    {"apex_gt", call_gt},
    {"apex_lt", call_lt},
    {"apex_eq", call_eq},
    {"apex_dropout", call_dropout},
    {"apex_matmul", call_matmul},
    {"apex_linear", call_linear},
    {"apex_linear_gelu", call_linear_gelu},
    {"apex_linear_cross_entropy", call_linear_cross_entropy},
    {"apex_add_layer_norm", call_add_layer_norm},
    {"apex_conv2d", call_conv2d},
    {"apex_max_pool2d", call_max_pool2d},
    {"apex_avg_pool2d", call_avg_pool2d},
    {"apex_batch_norm", call_batch_norm},
    {"apex_layer_norm", call_layer_norm},
    {"apex_layer_norm_nd", call_layer_norm_nd},
    {"apex_rms_norm", call_rms_norm},
    {"apex_rms_norm_nd", call_rms_norm_nd},
    {"apex_embedding", call_embedding},
    {"apex_softmax", call_softmax},
    {"apex_log_softmax", call_log_softmax},
    {"apex_cross_entropy", call_cross_entropy},
    {"apex_mse_loss", call_mse_loss},
    {"apex_bce_with_logits", call_bce_with_logits},
    {"apex_bce", call_bce},
    {"apex_sum_all", call_sum_all},
    {"apex_mean_all", call_mean_all},
    {"apex_sum", call_sum},
    {"apex_mean", call_mean},
    {"apex_norm_all", call_norm_all},
    {"apex_norm", call_norm},
    {"apex_reshape", call_reshape},
    {"apex_permute", call_permute},
    {"apex_transpose", call_transpose},
    {"apex_concat", call_concat},
    {"apex_causal_attention", call_causal_attention},
    {"apex_causal_attention_heads", call_causal_attention_heads},
    {"apex_causal_attention_qkv", call_causal_attention_qkv},
    {"apex_optimizer_destroy", call_optimizer_destroy},
    {"apex_optimizer_get_lr", call_optimizer_get_lr},
    {"apex_optimizer_kind", call_optimizer_kind},
    {"apex_optimizer_num_groups", call_optimizer_num_groups},
    {"apex_optimizer_group_size", call_optimizer_group_size},
    {"apex_optimizer_master", call_optimizer_master},
    {"apex_optimizer_param", call_optimizer_param},
    {"apex_optimizer_grad", call_optimizer_grad},
    {"apex_optimizer_step_count", call_optimizer_step_count},
    {"apex_pg_destroy", call_pg_destroy},
    {"apex_pg_rank", call_pg_rank},
    {"apex_pg_world_size", call_pg_world_size},
    {"apex_pg_backend", call_pg_backend},
    {"apex_pg_device", call_pg_device},
    {"apex_reducer_create", call_reducer_create},
    {"apex_reducer_destroy", call_reducer_destroy},
    {"apex_reducer_bucket_count", call_reducer_bucket_count},
    {"apex_reducer_bucket_of", call_reducer_bucket_of},
    {"apex_reducer_buckets_started", call_reducer_buckets_started},
    {"apex_safetensors_close", call_safetensors_close},
    {"apex_safetensors_count", call_safetensors_count},
    {"apex_safetensors_name", call_safetensors_name},
    {"apex_safetensors_has", call_safetensors_has},
    {"apex_safetensors_metadata", call_safetensors_metadata},
    {"apex_safetensors_get", call_safetensors_get},
    {"apex_tensor_clone", call_tensor_clone},
    {"apex_tensor_destroy", call_tensor_destroy},
    {"apex_tensor_dtype", call_tensor_dtype},
    {"apex_tensor_device", call_tensor_device},
    {"apex_tensor_ndim", call_tensor_ndim},
    {"apex_tensor_dim", call_tensor_dim},
    {"apex_tensor_shape", call_tensor_shape},
    {"apex_tensor_numel", call_tensor_numel},
    {"apex_tensor_nbytes", call_tensor_nbytes},
    {"apex_tensor_data", call_tensor_data},
    {"apex_tensor_same_shape", call_tensor_same_shape},
    {"apex_tensor_shape_str", call_tensor_shape_str},
    {"apex_tensor_to", call_tensor_to},
    {"apex_tensor_get", call_tensor_get},
    {"apex_tensor_set", call_tensor_set},
    {"apex_tensor_view", call_tensor_view},
    {"apex_tensor_slice_view", call_tensor_slice_view},
    {"apex_tensor_shares_storage", call_tensor_shares_storage},
    {"apex_zero_create", call_zero_create},
    {"apex_zero_destroy", call_zero_destroy},
    {"apex_zero_get_lr", call_zero_get_lr},
    {"apex_zero_state_bytes", call_zero_state_bytes},
    {"apex_zero_buffer_bytes", call_zero_buffer_bytes},
    {"apex_zero_grad_bytes", call_zero_grad_bytes},
    {"apex_reducer_buffer_bytes", call_reducer_buffer_bytes},
    {"apex_tensor_released", call_tensor_released},
    {"apex_zero_consolidate", call_zero_consolidate},
};

/* The headers' functions that the list must hold: APEX_API declarations not returning apex_status
 * whose first parameter is a pointer to an apex_ type; the handle-less constructors that take only
 * an options pointer (NULL there means defaults) are the exceptions. */
static const char *const not_handles[] = {"apex_model_create", "apex_loss_scaler_create",
                                          "apex_pg_create_mpi", "apex_pg_create_nccl", "apex_pg_create"};

static int listed(const char *name) {
  for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++)
    if (strcmp(calls[i].name, name) == 0) return 1;
  for (size_t i = 0; i < sizeof not_handles / sizeof not_handles[0]; i++)
    if (strcmp(not_handles[i], name) == 0) return 1;
  return 0;
}

static void test_list_is_complete(void **state) {
  (void)state;
  int missing = 0, seen = 0;
  DIR *dir = opendir(APEX_TEST_INCLUDE_DIR); /* every header, so that a new one is read too */
  assert_non_null(dir);
  for (struct dirent *de; (de = readdir(dir));) {
    size_t len = strlen(de->d_name);
    if (len < 3 || strcmp(de->d_name + len - 2, ".h") != 0) continue;
    const char *header = de->d_name;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", APEX_TEST_INCLUDE_DIR, header);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char text[1 << 20];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    for (char *p = strstr(text, "APEX_API "); p; p = strstr(p + 1, "APEX_API ")) {
      char decl[1024];
      size_t k = 0;
      for (const char *q = p + 9; *q && *q != ';' && k < sizeof decl - 1; q++) decl[k++] = *q == '\n' ? ' ' : *q;
      decl[k] = 0;
      char *paren = strchr(decl, '(');
      if (!paren || strncmp(decl, "apex_status ", 12) == 0) continue;
      const char *arg = paren + 1;
      while (*arg == ' ') arg++;
      if (strncmp(arg, "const ", 6) == 0) arg += 6;
      const char *end = strpbrk(arg, ",)");
      if (strncmp(arg, "apex_", 5) != 0 || !end || !memchr(arg, '*', (size_t)(end - arg))) continue;
      char *name = paren;
      while (name > decl && (name[-1] == '_' || (name[-1] >= 'a' && name[-1] <= 'z') || (name[-1] >= '0' && name[-1] <= '9')))
        name--;
      *paren = 0;
      seen++;
      if (!listed(name)) {
        fprintf(stderr, "%s: %s takes a handle and is not in test_null_handles's list\n", header, name);
        missing++;
      }
    }
  }
  closedir(dir);
  assert_true(seen >= 150); /* the parse found the declarations */
  assert_int_equal(missing, 0);
}

static void test_null_handles(void **state) {
  (void)state;
  int failed = 0;
  for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(calls[i].call());
    int ws = 0;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    if (WIFSIGNALED(ws)) {
      fprintf(stderr, "%s(NULL...): killed by signal %d\n", calls[i].name, WTERMSIG(ws));
      failed++;
    } else if (WEXITSTATUS(ws) != 0) {
      fprintf(stderr, "%s(NULL...): returned a non-NULL pointer (or another value than documented)\n", calls[i].name);
      failed++;
    }
  }
  assert_int_equal(failed, 0);
}

/* A chain of 50 failing calls on a NULL result: each call names itself, the call before it and the
 * root cause once, and the message stays short; a failing call that is not a NULL (a dimension out of range) sets its own. */
static void test_error_chain(void **state) {
  (void)state;
  apex_clear_error();
  int64_t shape[1] = {-3};
  apex_tensor *t = apex_tensor_create(APEX_F32, 1, shape); /* the root cause */
  assert_null(t);
  char root[256];
  snprintf(root, sizeof root, "%s", apex_last_error());
  assert_true(strlen(root) > 0);
  for (int i = 0; i < 50; i++) assert_int_equal(apex_tensor_ndim(t), -1);
  char want[512];
  snprintf(want, sizeof want, "apex_tensor_ndim: NULL tensor (the last error before it: apex_tensor_ndim: NULL tensor; the first: %s)", root);
  assert_string_equal(apex_last_error(), want);
  assert_int_equal(apex_tensor_dim(t, 0), -1);
  snprintf(want, sizeof want, "apex_tensor_dim: NULL tensor (the last error before it: apex_tensor_ndim: NULL tensor; the first: %s)", root);
  assert_string_equal(apex_last_error(), want);
  /* A valid 1-d tensor: dimension 5 (and -2) fail with their own message, not the chain's. */
  int64_t four[1] = {4};
  apex_tensor *v = apex_tensor_create(APEX_F32, 1, four);
  assert_non_null(v);
  assert_int_equal(apex_tensor_dim(v, 5), -1);
  assert_string_equal(apex_last_error(), "apex_tensor_dim: dimension 5 of a 1-d tensor");
  assert_int_equal(apex_last_status(), APEX_ERR_INVALID_ARG);
  assert_int_equal(apex_tensor_dim(v, -2), -1);
  assert_string_equal(apex_last_error(), "apex_tensor_dim: dimension -2 of a 1-d tensor");
  /* A new chain after another failure takes that failure as its root. */
  assert_int_equal(apex_tensor_ndim(NULL), -1);
  assert_string_equal(apex_last_error(), "apex_tensor_ndim: NULL tensor (the last error before it: apex_tensor_dim: dimension -2 of a 1-d tensor)");
  assert_int_equal(apex_tensor_dim(v, 0), 4);
  apex_tensor_destroy(v);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_list_is_complete), cmocka_unit_test(test_null_handles),
                                     cmocka_unit_test(test_error_chain)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
