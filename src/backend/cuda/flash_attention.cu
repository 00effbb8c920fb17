/* flash_attention.cu: the fused causal attention kernel (cuda_internal.h's apex__cuda_flash_*). No
 * shape is covered yet: both entry points answer APEX_ERR_UNSUPPORTED, and the attention slot
 * (nn_slots.c) takes the materialised path (attention.cu). */
#include <cuda_runtime.h>

extern "C" {
#include "core/internal.h"
#include "backend/cuda/cuda_internal.h"
}

extern "C" apex_status apex__cuda_flash_attention_fwd(const apex__cuda_flash *g, const void *q, const void *k, const void *v,
                                                      void *o, float *stats) {
  (void)q, (void)k, (void)v, (void)o, (void)stats;
  return apex__fail(APEX_ERR_UNSUPPORTED, "flash attention: no fused kernel for d = %d in %s", g->d, apex_dtype_name(g->dtype));
}

extern "C" apex_status apex__cuda_flash_attention_bwd(const apex__cuda_flash *g, const void *q, const void *k, const void *v,
                                                      const void *o, const void *dout, const float *stats, void *dq,
                                                      void *dk, void *dv) {
  (void)q, (void)k, (void)v, (void)o, (void)dout, (void)stats, (void)dq, (void)dk, (void)dv;
  return apex__fail(APEX_ERR_UNSUPPORTED, "flash attention: no fused kernel for d = %d in %s", g->d, apex_dtype_name(g->dtype));
}
