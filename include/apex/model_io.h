/* model_io.h: a model's parameters and buffers in a safetensors file, always in f32 whatever the opt
 * level (Apex: the model's state dict is fp32 under every opt level, so a checkpoint written at O2
 * loads into an O0 program and back).
 *
 *     apex_model_save_f32(model, amp, "model.safetensors");     amp may be NULL (plain f32 training)
 *     apex_model_load_f32(model, amp, "model.safetensors");
 *
 * The file holds one tensor per parameter and buffer under its model name (apex_model_param's and
 * apex_model_buffer's names). */
#ifndef APEX_MODEL_IO_H
#define APEX_MODEL_IO_H

#include "apex/amp.h"
#include "apex/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes every parameter and buffer of m as f32 to path (atomically; a failed save leaves an earlier
 * file whole). A parameter of which amp keeps an f32 master (apex_amp_master_of) is saved as the
 * master, the others as their values widened to f32 (exact). amp may be NULL. Errors: NULL m or path
 * (APEX_ERR_INVALID_ARG), what apex_safetensors_save returns (APEX_ERR_IO with the OS's reason). */
APEX_API apex_status apex_model_save_f32(const apex_model *m, const apex_amp *amp, const char *path);

/* Reads path into m: each parameter and buffer gets the file's tensor of its name (any float dtype),
 * rounded to nearest even into the model's dtype, and a parameter's f32 master (when amp keeps one)
 * gets the value itself, so training resumes from the saved f32 values at any opt level. Every name,
 * shape and dtype is checked before anything is written: a missing tensor or another shape
 * (APEX_ERR_INVALID_ARG / APEX_ERR_SHAPE, naming it) leaves the model and the masters unchanged; so
 * does an unreadable or malformed file (APEX_ERR_IO / APEX_ERR_CORRUPT). Tensors in the file that the
 * model does not have are ignored. */
APEX_API apex_status apex_model_load_f32(apex_model *m, apex_amp *amp, const char *path);

#ifdef __cplusplus
}
#endif

#endif
