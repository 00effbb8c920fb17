/* simd_pick.c: chooses a multi-tensor tile kernel's copy for the SIMD path core picked at run time
 * (see simd_kernel.h). It lives in the CPU backend, beside the kernels and the applier. */
#include "apex/cpu.h"
#include "backend/cpu/simd_kernel.h"

apex_mt_kernel apex__simd_pick(const apex__simd_kernel *k) {
  apex_cpu_isa isa = apex_cpu_max_isa();
  return isa >= APEX_CPU_ISA_AVX512 ? k->avx512 : isa >= APEX_CPU_ISA_AVX2 ? k->avx2 : k->portable;
}
