/* amp_internal.h: what the library's tests reach inside amp. */
#ifndef APEX_AMP_INTERNAL_H
#define APEX_AMP_INTERNAL_H

#include "apex/amp.h"

/* Puts an amp whose models are on the CPU on the device path that models on a GPU take (amp.c's top
 * comment): scalers and skip flags in the models' memory, the skip read by the optimizer's kernels.
 * For tests, to check the device path's logic against the host path on a machine without a GPU. Call
 * right after apex_amp_initialize. */
apex_status apex__amp_use_device_path(apex_amp *amp);

#endif
