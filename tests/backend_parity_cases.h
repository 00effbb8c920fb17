/* backend_parity_cases.h: the parity cases (once tests/test_cuda.c's): each runs a kernel, an optimizer or
 * a model on a device other than the CPU and on the CPU over the same inputs, and asserts the bound
 * stated per check. test_backend_ops.c runs each on every backend present whose device is not the CPU
 * (a cmocka test per case; with no such backend, skipped with the reason).
 *
 * Bounds, per check: conversions, copies and the loss scaler bitwise; the elementwise optimizers bitwise too
 * (the CUDA files are built without FMA contraction and repeat the CPU kernels operation for operation;
 * Adam's bias corrections go through the device's pow, so those allow 2 f32 ulps); norms, layer norm,
 * cross-entropy, batch statistics against a double-precision reference computed here, to 1e-5
 * relative in f32 and to the dtype's rounding (2^-8 f16, 2^-7 bf16, relative to the row's scale) for
 * outputs stored in 16 bits; GEMM with bf16 inputs to 1e-2 relative (f32 accumulation of rounded
 * inputs); the attention block against the CPU autograd op on the same rounded inputs, to the
 * per-dtype tolerances stated at attention_case; the elementwise ops bitwise against the CPU autograd ops
 * and their backward (GELU within the bound cuda.h states: the device's tanhf is not glibc's); column sums
 * and sum/mean bitwise over values whose sums are exact in any order, else to 1e-5 of the sum of |x|
 * against double, and bitwise from run to run. The library's GPT (apex_gpt_create, a tiny
 * configuration in f32) against the same model on the CPU: the loss to 1e-4 relative, every gradient to 1e-3
 * of its largest magnitude; and under amp O2 with bf16, 5 AdamW steps lower the loss. */
#ifndef APEX_TESTS_BACKEND_PARITY_CASES_H
#define APEX_TESTS_BACKEND_PARITY_CASES_H

#include "backend_parity_gpt2.h"
#include "backend_parity_nn.h"
#include "backend_parity_optim.h"

typedef struct parity_case {
  const char *name;
  void (*run)(void); /* asserts (cmocka) on the device pc_dev */
} parity_case;

#define PC(name) {#name, pc_##name}
static const parity_case parity_cases[] = {
    PC(convert_bitwise),        PC(multi_tensor_parity),     PC(device_scaler_matches_cpu), PC(optimizers_match_cpu),
    PC(optimizer_vector_and_scalar_paths), PC(adamp_matches_cpu), PC(optimizer_state_on_gpu), PC(device_skip_changes_nothing),
    PC(layer_norm),             PC(cross_entropy),           PC(batch_norm_stats),          PC(conv2d),
    PC(embedding),              PC(matmul),                  PC(elementwise_binary),        PC(activations),
    PC(sum_rows),               PC(sum_all),                 PC(elementwise_bad_inputs),    PC(attention_matches_cpu),
    PC(autograd_refuses_device_tensors), PC(gpt2_matches_cpu), PC(gpt2_bf16_trains),
};
#undef PC
#define N_PARITY_CASES ((int)(sizeof parity_cases / sizeof parity_cases[0]))

#endif
