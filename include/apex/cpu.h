/* cpu.h: the most advanced CPU instruction set apex's fast paths may use.
 *
 * Every CPU fast path (the AVX2 conversions and optimizer tiles, the AVX-512 matrix product and
 * conversions, and any later AVX512_BF16 or AMX path) has a portable C path beside it as its
 * reference. A maximum ISA caps which of them run, as oneDNN's ONEDNN_MAX_CPU_ISA does: apex uses
 * the highest level that is at most the cap and that the CPU supports. test_backend_ops runs every
 * op under the portable cap and under the CPU's own level and compares the two.
 *
 * The cap comes from apex_cpu_set_max_isa if it was called, else from the environment variable
 * APEX_CPU_ISA (portable, avx2, avx512, avx512_bf16, amx or native), read once on first use. */
#ifndef APEX_CPU_H
#define APEX_CPU_H

#include "apex/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Levels in increasing order; each includes the ones below it. The zero value is NATIVE: no cap.
 *   PORTABLE     plain C everywhere. As a cap, it also moves the matrix products from OpenBLAS to
 *                apex's reference product (plain C with a double accumulator per element: correct
 *                but far slower than a BLAS); a CPU that is portable by nature (no AVX2, or not
 *                x86) keeps OpenBLAS.
 *   AVX2         AVX2 + F16C + FMA conversions and optimizer tiles; matrix products by OpenBLAS
 *                (whose own kernel choice OPENBLAS_CORETYPE governs).
 *   AVX512       AVX-512F: apex's own matrix product kernel and the 16-lane f32<->bf16/f16
 *                conversions (the same bits as the portable ones, denormals kept).
 *   AVX512_BF16  AVX-512 with the bf16 dot-product instructions.
 *   AMX          AMX tiles (AMX-TILE and AMX-BF16). */
typedef enum apex_cpu_isa {
  APEX_CPU_ISA_NATIVE = 0,
  APEX_CPU_ISA_PORTABLE = 1,
  APEX_CPU_ISA_AVX2 = 2,
  APEX_CPU_ISA_AVX512 = 3,
  APEX_CPU_ISA_AVX512_BF16 = 4,
  APEX_CPU_ISA_AMX = 5
} apex_cpu_isa;

/* Caps the fast paths for the whole process; NATIVE removes the cap. A cap above what the CPU has
 * is allowed (the CPU's own level is used). Meant to be set before work starts, not while other
 * threads run apex calls. Takes precedence over APEX_CPU_ISA. APEX_ERR_INVALID_ARG for a value
 * outside the enum. */
APEX_API apex_status apex_cpu_set_max_isa(apex_cpu_isa isa);

/* The level in effect: the highest level that is at most the cap and that this CPU supports (never
 * NATIVE). Reads APEX_CPU_ISA on the first call if no cap was set; an unknown value there is
 * ignored (no cap), as oneDNN ignores one: apex_cpu_isa_env says what was wrong with it. */
APEX_API apex_cpu_isa apex_cpu_max_isa(void);

/* The highest level this CPU (and this build) supports, whatever the cap. */
APEX_API apex_cpu_isa apex_cpu_native_isa(void);

/* "portable", "avx2", "avx512", "avx512_bf16", "amx" or "native"; "invalid" for other values. */
APEX_API const char *apex_cpu_isa_name(apex_cpu_isa isa);

/* Parses one of apex_cpu_isa_name's names, in any case. APEX_ERR_INVALID_ARG, with a message listing
 * the accepted names, for anything else (NULL included). */
APEX_API apex_status apex_cpu_isa_parse(const char *name, apex_cpu_isa *out);

/* Parses the environment variable APEX_CPU_ISA into *out: NATIVE when it is unset or empty.
 * APEX_ERR_INVALID_ARG naming the value for an unknown one (*out is then NATIVE). */
APEX_API apex_status apex_cpu_isa_env(apex_cpu_isa *out);

#ifdef __cplusplus
}
#endif
#endif
