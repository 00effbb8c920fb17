/* backend.c: the CPU backend's table (backend/backend.h). Present in every build. The loss-scaler update
 * has no CPU slot: apex_loss_scaler keeps its state on the host and updates it there (optim/loss_scaler.c). */
#include "backend/cpu/cpu_backend.h"

const apex_backend apex__cpu_backend = {
    .name = "cpu",
    .device = APEX_DEVICE_CPU,
    .mem = &apex__host_memory,
    .mt_scale = apex__cpu_mt_scale,
    .mt_axpby = apex__cpu_mt_axpby,
    .mt_l2norm = apex__cpu_mt_l2norm,
    .optim_step = apex__cpu_optim_step,
};
