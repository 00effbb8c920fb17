/* op_table.c: every op's name, autocast category and backward, in one table.
 *
 * The categories follow PyTorch's CPU/CUDA autocast lists: GEMM-bound ops run in the low-precision
 * dtype, ops whose accuracy suffers in it (reductions, norms, softmax, losses, exp/log based
 * activations) run in f32, ops combining several inputs promote, and everything else runs in the
 * dtype it is given. */
#include "autograd/ag.h"

#define BWD(name) apex_status apex__bwd_##name(apex_graph *g, apex_var *out);
BWD(identity) BWD(binary) BWD(scale) BWD(unary) BWD(dropout) BWD(matmul) BWD(linear) BWD(conv2d)
BWD(max_pool2d) BWD(avg_pool2d) BWD(batch_norm) BWD(layer_norm) BWD(rms_norm) BWD(embedding)
BWD(softmax) BWD(log_softmax) BWD(cross_entropy) BWD(pointwise_loss) BWD(sum)
BWD(permute) BWD(concat) BWD(attention) BWD(sync_batch_norm) BWD(norm) BWD(linear_gelu) BWD(linear_cross_entropy)
#undef BWD

/* The unread masks (ag.h): which inputs' values each backward never reads. */
#define IN(i) (1u << (i))
#define ALL_IN 0xFFFFFFFFu


/* Every op once, in any order: OP(name, its info). The table below is made from it with designated
 * initializers (a duplicate fails the build: -Woverride-init), and the assertion after it checks that
 * the list has APEX_OP_COUNT entries, so an op added to apex_op without an entry here fails the build
 * instead of leaving a zero entry (no name, no backward). */
#define OPS(OP) \
    OP(LEAF, {"leaf", APEX_CAST_NONE, NULL})                                                             \
    OP(CAST, {"cast", APEX_CAST_NONE, apex__bwd_identity, ALL_IN, .grads_any = 1})                                       \
    OP(ADD, {"add", APEX_CAST_PROMOTE, apex__bwd_binary, ALL_IN, .grads_any = 1})                                        \
    OP(SUB, {"sub", APEX_CAST_PROMOTE, apex__bwd_binary, ALL_IN, .grads_any = 1})                                        \
    OP(MUL, {"mul", APEX_CAST_PROMOTE, apex__bwd_binary, .grads_any = 1})                                                \
    OP(DIV, {"div", APEX_CAST_PROMOTE, apex__bwd_binary, .grads_any = 1})                                                \
    OP(SCALE, {"scale", APEX_CAST_NONE, apex__bwd_scale, ALL_IN, .grads_any = 1})                                        \
    OP(RELU, {"relu", APEX_CAST_NONE, apex__bwd_unary, ALL_IN, 1, .grads_any = 1})                                       \
    OP(GELU, {"gelu", APEX_CAST_FLOAT, apex__bwd_unary, .reads_half = 1, .grads_any = 1}) /* Apex's FP32_FUNCS */        \
    OP(GELU_TANH, {"gelu_tanh", APEX_CAST_FLOAT, apex__bwd_unary, .reads_half = 1, .grads_any = 1})                      \
    OP(TANH, {"tanh", APEX_CAST_NONE, apex__bwd_unary, .grads_any = 1})                                                  \
    OP(SIGMOID, {"sigmoid", APEX_CAST_NONE, apex__bwd_unary, .grads_any = 1})                                            \
    OP(DROPOUT, {"dropout", APEX_CAST_NONE, apex__bwd_dropout, ALL_IN, .grads_any = 1})                                  \
    OP(MATMUL, {"matmul", APEX_CAST_HALF, apex__bwd_matmul})                                             \
    OP(LINEAR, {"linear", APEX_CAST_HALF, apex__bwd_linear, IN(2), .grads_any = 1})                                      \
    /* the backward recomputes each image's patches from the input (ops_conv.c) */                       \
    OP(CONV2D, {"conv2d", APEX_CAST_HALF, apex__bwd_conv2d, IN(2)})                                      \
    OP(MAX_POOL2D, {"max_pool2d", APEX_CAST_NONE, apex__bwd_max_pool2d, ALL_IN})                         \
    OP(AVG_POOL2D, {"avg_pool2d", APEX_CAST_NONE, apex__bwd_avg_pool2d, ALL_IN})                         \
    /* Runs in its input's type with f32 parameters and statistics (cuDNN's and Apex's O1/O2 batch       \
     * norm): the output takes the input's dtype, see ops_norm.c. */                                     \
    OP(BATCH_NORM, {"batch_norm", APEX_CAST_NONE, apex__bwd_batch_norm, IN(2)})                          \
    OP(LAYER_NORM, {"layer_norm", APEX_CAST_FLOAT, apex__bwd_layer_norm, IN(2), .reads_half = 1, .grads_any = 1})        \
    OP(RMS_NORM, {"rms_norm", APEX_CAST_FLOAT, apex__bwd_rms_norm, .reads_half = 1, .grads_any = 1})                     \
    OP(EMBEDDING, {"embedding", APEX_CAST_NONE, apex__bwd_embedding, ALL_IN, .grads_any = 1})                            \
    /* their f32 result is their aux, the value itself when it is f32 */                                 \
    OP(SOFTMAX, {"softmax", APEX_CAST_FLOAT, apex__bwd_softmax, ALL_IN, 1, .reads_half = 1})             \
    OP(LOG_SOFTMAX, {"log_softmax", APEX_CAST_FLOAT, apex__bwd_log_softmax, ALL_IN, 1, .reads_half = 1}) \
    /* it keeps each row's (max, 1 / sum) and reads the logits again (ops_loss.c) */                     \
    OP(CROSS_ENTROPY, {"cross_entropy", APEX_CAST_FLOAT, apex__bwd_cross_entropy, 0, .reads_half = 1})   \
    OP(MSE, {"mse_loss", APEX_CAST_FLOAT, apex__bwd_pointwise_loss, .reads_half = 1})                    \
    OP(BCE_WITH_LOGITS, {"bce_with_logits", APEX_CAST_FLOAT, apex__bwd_pointwise_loss, .reads_half = 1}) \
    OP(BCE, {"bce", APEX_CAST_FLOAT, apex__bwd_pointwise_loss, .reads_half = 1})                         \
    OP(SUM, {"sum", APEX_CAST_FLOAT, apex__bwd_sum, ALL_IN, .reads_half = 1})                            \
    OP(MEAN, {"mean", APEX_CAST_FLOAT, apex__bwd_sum, ALL_IN, .reads_half = 1})                          \
    OP(RESHAPE, {"reshape", APEX_CAST_NONE, apex__bwd_identity, ALL_IN, .grads_any = 1})                                 \
    OP(PERMUTE, {"permute", APEX_CAST_NONE, apex__bwd_permute, ALL_IN})                                  \
    OP(CONCAT, {"concat", APEX_CAST_PROMOTE, apex__bwd_concat, ALL_IN})                                  \
    /* the backward recomputes P from q, k and each row's (max, 1 / sum); a backend may read the output  \
     * for rowsum(dO * O) (args_nn.h) */                                                                 \
    OP(ATTENTION, {"causal_attention", APEX_CAST_HALF, apex__bwd_attention, 0, 1, .grads_any = 1})                       \
    /* Same category as batch_norm: batch norm with its statistics from a hook (ops_norm.c), which       \
     * src/parallel/sync_batch_norm.c installs */                                                        \
    OP(SYNC_BATCH_NORM, {"sync_batch_norm", APEX_CAST_NONE, apex__bwd_sync_batch_norm})                  \
    /* its backward masks the gradient where the output is non-zero: a half output's bits, or for f32    \
     * the output recomputed from x, weight and bias (ops_norm.c), so it reads every input */            \
    OP(BATCH_NORM_RELU, {"batch_norm_relu", APEX_CAST_NONE, apex__bwd_batch_norm, 0, 1})                 \
    /* Apex's FP32_FUNCS: in half precision exp overflows past 11, log and pow lose their small          \
     * differences, and a norm's sum of squares overflows at 256 */                                      \
    OP(EXP, {"exp", APEX_CAST_FLOAT, apex__bwd_unary, .grads_any = 1})                                                   \
    OP(LOG, {"log", APEX_CAST_FLOAT, apex__bwd_unary, .grads_any = 1})                                                   \
    OP(POW, {"pow", APEX_CAST_FLOAT, apex__bwd_unary, .grads_any = 1})                                                   \
    OP(POW_TENSOR, {"pow_tensor", APEX_CAST_FLOAT, apex__bwd_binary, .grads_any = 1})                                    \
    /* its f32 norms are its aux; the backward reads x */                                                \
    OP(NORM, {"norm", APEX_CAST_FLOAT, apex__bwd_norm, .reads_half = 1})                                 \
    /* Apex's CASTS (promote). A mask records no inputs (ops_elementwise.c), so no backward ever runs    \
     * for one: it has none, and reads nothing. */                                                       \
    OP(GT, {"gt", APEX_CAST_PROMOTE, NULL, ALL_IN})                                                      \
    OP(LT, {"lt", APEX_CAST_PROMOTE, NULL, ALL_IN})                                                      \
    OP(EQ, {"eq", APEX_CAST_PROMOTE, NULL, ALL_IN})                                                      \
    /* a linear with GELU in its epilogue: the backward reads x, w and the pre-activation (its aux) */    \
    OP(LINEAR_GELU, {"linear_gelu", APEX_CAST_HALF, apex__bwd_linear_gelu, IN(2), .grads_any = 1})                       \
    /* the head's product in half, the loss in f32 from the half logits (kept, with the targets and each  \
     * row's statistics: ops_classifier.c); the backward reads x, w and those */                         \
    OP(LINEAR_CROSS_ENTROPY, {"linear_cross_entropy", APEX_CAST_HALF, apex__bwd_linear_cross_entropy, .grads_any = 1})  \
  /* end of OPS */

#define OP_ENTRY(name, ...) [APEX_OP_##name] = __VA_ARGS__,
#define OP_ONE(name, ...) +1
static const apex__op_info table[APEX_OP_COUNT] = {OPS(OP_ENTRY)};
_Static_assert(0 OPS(OP_ONE) == APEX_OP_COUNT, "op_table.c: OPS must list every apex_op once (autograd.h)");
#undef OP_ENTRY
#undef OP_ONE

static const apex__op_info invalid = {.name = "invalid", .cast = APEX_CAST_NONE};

const apex__op_info *apex__op(apex_op op) { return (int)op >= 0 && op < APEX_OP_COUNT ? &table[op] : &invalid; }
const char *apex_op_name(apex_op op) { return apex__op(op)->name; }
apex_cast_category apex_op_cast_category(apex_op op) { return apex__op(op)->cast; }
