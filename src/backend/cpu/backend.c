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
};
