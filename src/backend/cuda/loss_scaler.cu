/* loss_scaler.cu: the device scaler's update, one thread running backend/scale_rule.h (the CPU scaler's own
 * rule) on the state in device memory, so that a training step never waits to learn its scale. */
#include <cuda_runtime.h>

extern "C" {
#include "core/internal.h"
#include "backend/cuda/cuda_internal.h"
}
#include "backend/scale_rule.h"

__global__ void scaler_update_kernel(apex__cuda_scaler_dev *d, apex_loss_scaler_config c, int32_t *raise,
                                     uint64_t raise_mask) {
  int found = d->found_inf != 0;
  apex__scale_rule(&d->st, &c, found);
  d->found_inf = 0;
  for (int i = 0; found && raise && i < 64; i++) /* the skip flags of the optimizers the loss reached */
    if (raise_mask >> i & 1u) raise[i] = 1;
}

extern "C" apex_status apex__cuda_scaler_update(apex__cuda_scaler_dev *d, const apex_loss_scaler_config *c, int32_t *raise,
                                                uint64_t raise_mask) {
  scaler_update_kernel<<<1, 1, 0, (cudaStream_t)apex__cuda_stream()>>>(d, *c, raise, raise_mask);
  return apex__cuda_check_launch("apex_loss_scaler_update");
}
