/* cpu_backend.h: the CPU backend's slot functions, for its table (backend.c). */
#ifndef APEX_BACKEND_CPU_BACKEND_H
#define APEX_BACKEND_CPU_BACKEND_H

#include "backend/backend.h"

/* multi_tensor.c */
apex_status apex__cpu_mt_scale(const apex_mt_scale_args *a);
apex_status apex__cpu_mt_axpby(const apex_mt_axpby_args *a);
apex_status apex__cpu_mt_l2norm(const apex_mt_l2norm_args *a);

/* optim.c */
apex_status apex__cpu_optim_step(const apex_optim_step_args *a);

#endif
