/* backend_ops_cases.h: the cases of test_backend_ops.c and the bound each one is held to.
 *
 * Op cases: every case of nn_cases.h (the shapes test_nn_golden checks against PyTorch), plus the
 * ops that have no case there and products big enough to run gemm.c's tile grid and more than one
 * 256-deep slice of the AVX-512 kernel. Multi-tensor and optimizer cases: every apex_mt_* kernel and
 * one two-step run of every optimizer kind.
 *
 * Bounds. A fast path compared with the portable reference (APEX_CPU_ISA_PORTABLE) gives the same
 * bits wherever the contract says so: conversions and the optimizer and multi-tensor tiles
 * (core/simd_kernel.h), and so every op without a matrix product. Cases with a matrix product state
 * `rel`: the portable product sums in double and the fast kernels in f32 in their own blocked
 * orders (and with FMA), so an element may differ by rel * max|reference| over its tensor, plus,
 * for an f16 or bf16 result, one unit in the last place of that dtype at the element (its final
 * rounding may go the other way). Measured on this project's machines (Zen 5; OpenBLAS on its
 * Haswell kernels at avx2, apex's AVX-512 kernel above), every row printing its worst: f32 errors
 * reach 0.14e-6 of max|reference| for the small cases and 0.72e-6 for the tiled ones, so rel is 1e-6
 * and 3e-6 (4x and more); f16 and bf16 results differ by at most the one ulp. */
#ifndef APEX_TESTS_BACKEND_OPS_CASES_H
#define APEX_TESTS_BACKEND_OPS_CASES_H

#include "apex/ddp.h"
#include "apex/optim.h"
#include "apex/parallel.h"
#include "nn_cases.h"

/* ---- op cases with no case in nn_cases.h ------------------------------------------------------------ */

static apex_pg *sbn_pg; /* a local process group (world size 1) for sync_batch_norm; see bo_setup */

/* to the other low-precision type, so each dtype's cast changes its values */
static apex_var *f_cast(apex_graph *g, apex_var **x) {
  return apex_cast(g, x[0], apex_tensor_dtype(apex_var_value(x[0])) == APEX_BF16 ? APEX_F16 : APEX_BF16);
}
static apex_var *f_bn_relu(apex_graph *g, apex_var **x) {
  return apex_batch_norm(g, x[0], x[1], x[2], NULL, NULL, &(apex_batch_norm_options){.training = 1, .relu = 1});
}
static apex_var *f_sync_bn(apex_graph *g, apex_var **x) { return apex_sync_batch_norm(g, sbn_pg, x[0], x[1], x[2], NULL, NULL, NULL); }
/* A comparison has no gradient: x * mask carries one back to x through the mask's values. */
static apex_var *f_gt(apex_graph *g, apex_var **x) { return apex_mul(g, x[0], apex_gt(g, x[0], x[1])); }
static apex_var *f_lt(apex_graph *g, apex_var **x) { return apex_mul(g, x[0], apex_lt(g, x[0], x[1])); }
static apex_var *f_eq(apex_graph *g, apex_var **x) { return apex_mul(g, x[0], apex_eq(g, apex_relu(g, x[0]), x[0])); }

/* the transformer MLP's fused product: 24 outputs, a multiple of 8, so that cuBLASLt's GELU_AUX_BIAS
 * epilogue takes the half cases on a GPU */
static apex_var *f_linear_gelu(apex_graph *g, apex_var **x) { return apex_linear_gelu(g, x[0], x[1], x[2]); }
/* the residual add and the layer norm after it, both results used: y * (x + r) */
static apex_var *f_add_ln(apex_graph *g, apex_var **x) {
  apex_var *sum = NULL, *y = apex_add_layer_norm(g, x[0], x[1], x[2], x[3], 0.0f, &sum);
  return y ? apex_mul(g, y, sum) : NULL;
}
/* the classifier over nn_cases.h's targets (6 rows, 4 classes), its backward in chunks of 4 rows and 2 */
static apex_var *f_linear_ce(apex_graph *g, apex_var **x) { return apex_linear_cross_entropy(g, x[0], x[1], ce_targets, NULL, 4); }

static apex_var *f_attention_heads(apex_graph *g, apex_var **x) { return apex_causal_attention_heads(g, x[0], x[1], x[2], 2); }

static const gc_case extra_cases[] = {
    {"cast", f_cast, 1, {2}, {{4, 5}}, 0, 0},
    {"batch_norm_relu", f_bn_relu, 3, {4, 1, 1}, {{3, 2, 2, 3}, {2}, {2}}, 0, 0},
    {"sync_batch_norm", f_sync_bn, 3, {4, 1, 1}, {{3, 2, 2, 3}, {2}, {2}}, 0, 0},
    {"gt", f_gt, 2, {2, 1}, {{4, 5}, {5}}, 0, 0},
    {"lt", f_lt, 2, {2, 1}, {{4, 5}, {5}}, 0, 0},
    {"eq", f_eq, 1, {2}, {{4, 5}}, 0, 0},
    /* 96 x 160 x 300 and 128 x 130 x 272 multiply-adds are past gemm.c's TILE_MIN_WORK (a tile grid
     * on threads), and K > 256 takes two of the AVX-512 kernel's slices */
    {"linear_tiled", f_linear, 3, {2, 2, 1}, {{96, 300}, {160, 300}, {160}}, 0, 0},
    {"matmul_tiled", f_matmul, 2, {3, 2}, {{2, 64, 272}, {272, 130}}, 0, 0},
    {"conv2d_wide", f_conv, 3, {4, 4, 1}, {{2, 8, 12, 10}, {16, 8, 3, 3}, {16}}, 0, 0},
    {"causal_attention_long", f_attention, 3, {4, 4, 4}, {{2, 2, 24, 16}, {2, 2, 24, 16}, {2, 2, 24, 16}}, 0, 0},
    /* two heads of 16 side by side in rows of 32, read in place (the strided heads of the slot) */
    {"causal_attention_heads", f_attention_heads, 3, {3, 3, 3}, {{2, 24, 32}, {2, 24, 32}, {2, 24, 32}}, 0, 0},
    {"linear_gelu", f_linear_gelu, 3, {2, 2, 1}, {{6, 40}, {24, 40}, {24}}, 0, 0},
    {"linear_cross_entropy", f_linear_ce, 2, {2, 2}, {{6, 40}, {4, 40}}, 0, 0},
    {"add_layer_norm", f_add_ln, 4, {3, 3, 1, 1}, {{3, 4, 24}, {3, 4, 24}, {24}, {24}}, 0, 0},
};

/* The op a case stands for, where it is not the op of the case's result (apex_var_op). */
static const struct {
  const char *name;
  apex_op op;
} case_op[] = {{"reshape", APEX_OP_RESHAPE}, {"gt", APEX_OP_GT}, {"lt", APEX_OP_LT}, {"eq", APEX_OP_EQ}};

/* rel bounds of the cases with a matrix product (see the top) and of tanh and the tanh GELU; every
 * other op case is bitwise. Above the portable ISA tanh and erf are vmath's vector functions
 * (backend/cpu/vmath.h), within 1 ulp of the exact value where the reference's glibc tanhf and erff
 * are within 2 (test_vmath measures them over every f32), so a tanh or erf differs from the
 * reference by at most 3 f32 ulps of itself; the rest of each formula is the same f32 operations,
 * which carry that difference to the output and the gradient multiplied by at most 2 for inputs in
 * [-1, 1] (0.5 x in the GELUs, go * (0.5 + ...) in their derivatives, 2 t in tanh's): under
 * 6 * 2^-24 of the result's magnitude, so rel 1e-6, the products' bound, holds it with room. */
static const struct {
  const char *name;
  double rel;
} case_rel[] = {
    {"matmul", 1e-6},          {"matmul_batched", 1e-6},        {"linear", 1e-6},      {"conv2d", 1e-6},
    {"causal_attention", 1e-6}, {"linear_tiled", 3e-6},          {"matmul_tiled", 3e-6}, {"conv2d_wide", 3e-6},
    {"causal_attention_long", 3e-6}, {"causal_attention_heads", 3e-6}, {"linear_gelu", 1e-6}, {"linear_cross_entropy", 1e-6},
    {"gelu_tanh", 1e-6},    {"tanh", 1e-6}, {"gelu", 1e-6},
};

/* The bound of a case with a matrix product on bf16 operands where oneDNN runs it (gemm_onednn.c, and
 * conv2d's per-image products in conv_onednn.c, at avx512_bf16 and above). The forward products see the same bf16 values as the portable path and
 * stay within the 1 ulp; a backward product first rounds the f32 gradient of the output to bf16
 * (relative error up to 2^-9 per element), and K terms with cancellation can turn that into a
 * larger part of max|reference|. Measured on this project's Zen 5 machine (AVX512_BF16, no AMX):
 * the worst row reached 0.33 of 2^-6 * max|reference| + 1 ulp (matmul_tiled), so the bound is
 * 2^-6. test_gemm_onednn holds the same products to an element-wise bound computed from |R| x |W|.
 * conv2d's backward products round the same gradient; there the worst reached 0.29 of the same
 * bound (conv2d) on the same machine. Attention runs its four products through apex__gemm too
 * (backend/cpu/attention.c), and on oneDNN its f32 probabilities P are rounded to bf16 for P v (as
 * PyTorch's bf16 CPU attention rounds them): each P differs by up to 2^-9 of itself, so an output
 * element by up to 2^-9 of the P-weighted mean of |v| along its row, which is at most max|v|, and the
 * backward's dS, P and output gradient are rounded the same way (dV = P^T dO too runs on bf16
 * there). Measured here: the worst row reached 0.26 of 2^-6 * max|reference| + 1 ulp
 * (causal_attention_long). */
#define BF16_ONEDNN_REL 0x1p-6
static const char *const bf16_onednn_cases[] = {"matmul", "matmul_batched", "linear", "linear_tiled", "matmul_tiled", "conv2d",
                                                "conv2d_wide", "causal_attention", "causal_attention_long", "causal_attention_heads",
                                                "linear_gelu", "linear_cross_entropy"};

/* ---- multi-tensor and optimizer cases --------------------------------------------------------------- */

/* The tensors a multi-tensor or optimizer case works on: ragged sizes around the tile and chunk
 * boundaries (MT_CHUNK elements a chunk), one of a single element. */
#define MT_N 4
#define MT_CHUNK 4096
static const int64_t mt_sizes[MT_N] = {1, 1000, 9000, 4097};

typedef enum mt_kind {
  MT_SCALE, MT_SCALE_TO_F32, MT_SCALE_INF, MT_AXPBY, MT_L2NORM, MT_UNSCALE_L2NORM, MT_UNSCALE_FLAT, MT_CHECK_FINITE, MT_CHECK_INF
} mt_kind;

/* cuda_rel: the bound a GPU result is held to against the portable CPU path (the CPU fast paths are
 * bitwise). A GPU kernel may contract a * x + b * y into one FMA, and sums its norms in another
 * order, so its results are not promised bit for bit. These bounds have not yet been checked against
 * a GPU run. */
static const struct {
  const char *name;
  mt_kind kind;
  double cuda_rel;
} mt_cases[] = {
    {"mt_scale", MT_SCALE, 0},
    {"mt_scale_to_f32", MT_SCALE_TO_F32, 0},
    {"mt_scale_overflow", MT_SCALE_INF, 0},
    {"mt_axpby", MT_AXPBY, 1e-6},
    {"mt_l2norm", MT_L2NORM, 1e-5},
    {"mt_unscale_l2norm", MT_UNSCALE_L2NORM, 1e-5},
    {"mt_unscale_flat", MT_UNSCALE_FLAT, 0},
    {"mt_check_finite", MT_CHECK_FINITE, 0},
    {"mt_check_finite_inf", MT_CHECK_INF, 0},
};

/* Two steps of every kind with its defaults, then the variants that take other branches of the
 * update rules; each with weight decay 0.01 and gradients scaled by 4 (unscaled inside the kernel). */
static const struct {
  const char *name;
  apex_optim_kind kind;
  apex_optim_options opts;
} optim_cases[] = {
    {"sgd", APEX_OPTIM_SGD, {.weight_decay = 0.01f}},
    {"adam", APEX_OPTIM_ADAM, {.weight_decay = 0.01f}},
    {"adamw", APEX_OPTIM_ADAMW, {.weight_decay = 0.01f}},
    {"adamp", APEX_OPTIM_ADAMP, {.weight_decay = 0.01f}},
    {"lamb", APEX_OPTIM_LAMB, {.weight_decay = 0.01f}},
    {"adadelta", APEX_OPTIM_ADADELTA, {.weight_decay = 0.01f}},
    {"adagrad", APEX_OPTIM_ADAGRAD, {.weight_decay = 0.01f}},
    {"rmsprop", APEX_OPTIM_RMSPROP, {.weight_decay = 0.01f}},
    {"rmsprop_tf", APEX_OPTIM_RMSPROP_TF, {.weight_decay = 0.01f}},
    {"novograd", APEX_OPTIM_NOVOGRAD, {.weight_decay = 0.01f}},
    {"sgd_nesterov", APEX_OPTIM_SGD, {.momentum = 0.9f, .nesterov = APEX_OPTIM_ON, .weight_decay = 0.01f}},
    {"adam_amsgrad", APEX_OPTIM_ADAM, {.amsgrad = APEX_OPTIM_ON, .weight_decay = 0.01f}},
    {"adamp_nesterov", APEX_OPTIM_ADAMP, {.nesterov = APEX_OPTIM_ON, .weight_decay = 0.01f}},
    {"lamb_nvlamb", APEX_OPTIM_LAMB, {.use_nvlamb = APEX_OPTIM_ON, .weight_decay = 0.01f}},
    {"adagrad_w_mode", APEX_OPTIM_ADAGRAD, {.adagrad_w_mode = APEX_OPTIM_ON, .weight_decay = 0.01f}},
    {"rmsprop_centered", APEX_OPTIM_RMSPROP, {.momentum = 0.9f, .centered = APEX_OPTIM_ON, .weight_decay = 0.01f}},
    {"rmsprop_tf_decoupled", APEX_OPTIM_RMSPROP_TF, {.momentum = 0.9f, .decoupled_decay = APEX_OPTIM_ON, .weight_decay = 0.01f}},
    {"novograd_inf", APEX_OPTIM_NOVOGRAD, {.norm_type = APEX_OPTIM_NORM_INF, .weight_decay = 0.01f}},
};

/* The cuda backend's bounds for the op cases (rel, plus one ulp of a half result as for every bound).
 * Its kernels repeat the CPU's f32 expressions (built with -fmad=false), but the device's expf, logf,
 * tanhf, erff and powf are not glibc's (within 2 ulps), its sums run in fixed trees rather than left
 * to right, and cuBLASLt and cuDNN sum products in their own blocked orders: so an op agrees with the
 * reference to a few f32 ulps of the tensor's largest element (CUDA_OP_REL leaves 100 of them), and a
 * product (the cases of case_rel) to its f32 accumulation over K, as the slot cases' 1e-4. Chosen from
 * those error sources, not yet measured on a GPU: the first run prints every row's worst error. */
#define CUDA_OP_REL 1e-5
#define CUDA_PRODUCT_REL 1e-4

/* The cuda backend's bound for the product cases of bf16_onednn_cases on f16 and bf16 operands. Like
 * oneDNN above, the GPU rounds an intermediate to the operands' dtype where the reference keeps f32:
 * attention's P before P v (as the fused kernel and PyTorch's SDPA do) and the output gradient before
 * the backward products; a convolution with a bias writes cuDNN's product in the dtype and adds the bias
 * to that (as PyTorch's cuDNN path does), so the result carries half an ulp of the pre-bias value, which
 * can exceed the result by the bias's size. Each rounding is at most the dtype's unit roundoff u
 * (2^-8 bf16, 2^-11 f16) of the value rounded, and those values are within a small multiple of
 * max|reference| (the pre-bias value by max|bias|, under 1 for these cases' inputs in [-1, 1]); so the
 * bound is 4 u: BF16_ONEDNN_REL for bf16, CUDA_F16_ROUNDED_REL for f16. Measured on an H200
 * (2026-11-26): the worst row of these cases reached 0.14-0.32 of its bound (causal_attention_long f16
 * 0.32), as oneDNN's reach 0.33 of theirs. */
#define CUDA_F16_ROUNDED_REL 0x1p-9

/* GPU bound as for mt_cases: transcendental and square-root rounding may differ there. */
#define OPTIM_CUDA_REL 1e-5

#endif
