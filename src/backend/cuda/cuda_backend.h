/* cuda_backend.h: the CUDA backend's slot functions (the C files beside the kernels: memory.c,
 * mt_slots.c, optim_slots.c), for its table (backend.c). They turn a slot's argument struct into the
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

#endif
