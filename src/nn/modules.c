/* modules.c: the module constructors and their forward passes.
 *
 * A module is a small record (kind, parameters, options); its forward is a few op calls from
 * nn_ops.h. Composite modules (attention, transformer block) are built from child modules whose
 * names carry the parent's name as a prefix. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "autograd/ag.h" /* apex__bn_options */
#include "core/internal.h"
#include "nn/nn_internal.h"

static const char *child_name(char *buf, const apex_module *parent, const char *local) { return apex__nn_join(buf, parent->name, local); }

apex_module *apex_linear_create(apex_model *m, const char *name, int64_t in, int64_t out, int bias) {
  if (in < 1 || out < 1) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_linear_create: sizes %lld -> %lld must be >= 1", (long long)in, (long long)out);
  apex_module *mod = apex__nn_module(m, NN_LINEAR, name, "apex_linear_create");
  if (!mod) return NULL;
  int64_t ws[2] = {out, in};
  float bound = 1.0f / sqrtf((float)in);
  if (!(mod->p[0] = apex__nn_param(mod, "weight", 2, ws, 'u', bound))) return NULL;
  if (bias && !(mod->p[1] = apex__nn_param(mod, "bias", 1, &out, 'u', bound))) return NULL;
  return mod;
}

apex_module *apex_conv2d_create(apex_model *m, const char *name, int64_t in_ch, int64_t out_ch, int kh, int kw,
                                const apex_conv2d_options *opts, int bias) {
  if (in_ch < 1 || out_ch < 1 || kh < 1 || kw < 1)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_conv2d_create: channels %lld -> %lld, kernel %dx%d must be >= 1", (long long)in_ch,
                           (long long)out_ch, kh, kw);
  apex_module *mod = apex__nn_module(m, NN_CONV2D, name, "apex_conv2d_create");
  if (!mod) return NULL;
  if (opts) mod->conv = *opts;
  int64_t ws[4] = {out_ch, in_ch, kh, kw};
  float bound = 1.0f / sqrtf((float)(in_ch * kh * kw));
  if (!(mod->p[0] = apex__nn_param(mod, "weight", 4, ws, 'u', bound))) return NULL;
  if (bias && !(mod->p[1] = apex__nn_param(mod, "bias", 1, &out_ch, 'u', bound))) return NULL;
  return mod;
}

static apex_module *batch_norm_create(apex_model *m, nn_kind kind, const char *name, int64_t c, const apex_batch_norm_options *opts,
                                      const char *who) {
  if (c < 1) return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: %lld channels; need at least 1", who, (long long)c);
  float mom, eps; /* checked here, so that a bad option fails at creation rather than at the first forward */
  if (opts && apex__bn_options(opts, who, &mom, &eps) != APEX_OK) return NULL;
  apex_module *mod = apex__nn_module(m, kind, name, who);
  if (!mod) return NULL;
  if (opts) mod->bn = *opts;
  if (!(mod->p[0] = apex__nn_param(mod, "weight", 1, &c, '1', 0))) return NULL;
  if (!(mod->p[1] = apex__nn_param(mod, "bias", 1, &c, '0', 0))) return NULL;
  if (!(mod->buf[0] = apex__nn_buffer(mod, "running_mean", c, 0.0f))) return NULL;
  if (!(mod->buf[1] = apex__nn_buffer(mod, "running_var", c, 1.0f))) return NULL;
  return mod;
}

apex_module *apex_batch_norm1d_create(apex_model *m, const char *name, int64_t c, const apex_batch_norm_options *opts) {
  return batch_norm_create(m, NN_BATCH_NORM1D, name, c, opts, "apex_batch_norm1d_create");
}
apex_module *apex_batch_norm2d_create(apex_model *m, const char *name, int64_t c, const apex_batch_norm_options *opts) {
  return batch_norm_create(m, NN_BATCH_NORM2D, name, c, opts, "apex_batch_norm2d_create");
}

/* Weight (and bias) take the normalized shape; forward reads it back from the weight, which every
 * norm module has, so the module needs no field of its own. */
static apex_module *row_norm_create(apex_model *m, nn_kind kind, const char *name, int nd, const int64_t *shape, float eps, const char *who) {
  if (nd < 1 || nd > APEX_MAX_DIMS || !shape)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: normalized_shape of %d dimensions%s (need 1 to %d)", who, nd, shape ? "" : ", NULL",
                           APEX_MAX_DIMS);
  for (int i = 0; i < nd; i++)
    if (shape[i] < 1) return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: normalized_shape entry %d is %lld; it must be >= 1", who, i, (long long)shape[i]);
  apex_module *mod = apex__nn_module(m, kind, name, who);
  if (!mod) return NULL;
  mod->f = eps;
  if (!(mod->p[0] = apex__nn_param(mod, "weight", nd, shape, '1', 0))) return NULL;
  if (kind == NN_LAYER_NORM && !(mod->p[1] = apex__nn_param(mod, "bias", nd, shape, '0', 0))) return NULL;
  return mod;
}

apex_module *apex_layer_norm_create(apex_model *m, const char *name, int64_t dim, float eps) {
  return row_norm_create(m, NN_LAYER_NORM, name, 1, &dim, eps, "apex_layer_norm_create");
}
apex_module *apex_rms_norm_create(apex_model *m, const char *name, int64_t dim, float eps) {
  return row_norm_create(m, NN_RMS_NORM, name, 1, &dim, eps, "apex_rms_norm_create");
}
apex_module *apex_layer_norm_nd_create(apex_model *m, const char *name, int ndim, const int64_t *normalized_shape, float eps) {
  return row_norm_create(m, NN_LAYER_NORM, name, ndim, normalized_shape, eps, "apex_layer_norm_nd_create");
}
apex_module *apex_rms_norm_nd_create(apex_model *m, const char *name, int ndim, const int64_t *normalized_shape, float eps) {
  return row_norm_create(m, NN_RMS_NORM, name, ndim, normalized_shape, eps, "apex_rms_norm_nd_create");
}

apex_module *apex_embedding_create(apex_model *m, const char *name, int64_t num, int64_t dim) {
  return apex__nn_embedding(m, name, num, dim, 0);
}

apex_module *apex__nn_embedding(apex_model *m, const char *name, int64_t num, int64_t dim, float std) {
  if (num < 1 || dim < 1)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_embedding_create: %lld x %lld must be >= 1", (long long)num, (long long)dim);
  apex_module *mod = apex__nn_module(m, NN_EMBEDDING, name, "apex_embedding_create");
  if (!mod) return NULL;
  int64_t ws[2] = {num, dim};
  return (mod->p[0] = apex__nn_param(mod, "weight", 2, ws, 'n', std)) ? mod : NULL;
}

apex_var *apex_embedding_forward(apex_module *mod, apex_graph *g, const int64_t *ids, int ndim, const int64_t *shape) {
  if (!mod || mod->kind != NN_EMBEDDING) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_embedding_forward: not an embedding module");
  return apex_embedding(g, mod->p[0], ids, ndim, shape);
}

apex_var *apex_embedding_forward_index(apex_module *mod, apex_graph *g, const apex_index *ids) {
  if (!mod || mod->kind != NN_EMBEDDING)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_embedding_forward_index: not an embedding module");
  return apex_embedding_index(g, mod->p[0], ids);
}

/* q, k and v are linear children as before (their parameters keep their names), made with one
 * allocation for the three weights and one for the three biases (apex__nn_linear_params_joint), so that
 * the forward runs one [., dim] x [dim, 3 dim] product, as GPT-2's c_attn does, over the weights where
 * they are. */
apex_module *apex_attention_create(apex_model *m, const char *name, int64_t dim, int n_heads) {
  if (dim < 1 || n_heads < 1 || dim % n_heads)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_attention_create: %d heads do not divide dim %lld", n_heads, (long long)dim);
  apex_module *mod = apex__nn_module(m, NN_ATTENTION, name, "apex_attention_create");
  if (!mod) return NULL;
  mod->n_heads = n_heads;
  static const char *parts[3] = {"q", "k", "v"};
  char buf[APEX_NAME_MAX];
  for (int i = 0; i < 3; i++) {
    apex_module *c = apex__nn_module(m, NN_LINEAR, child_name(buf, mod, parts[i]), "apex_attention_create");
    if (!c || !apex__nn_add_child(mod, c)) return c ? apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex_attention_create: out of memory") : NULL;
  }
  if (apex__nn_linear_params_joint(mod->children, 3, dim, dim) != APEX_OK) return NULL;
  apex_module *c = apex_linear_create(m, child_name(buf, mod, "proj"), dim, dim, 1);
  if (!c || !apex__nn_add_child(mod, c)) return c ? apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex_attention_create: out of memory") : NULL;
  return mod;
}

apex_module *apex_transformer_block_create(apex_model *m, const char *name, int64_t dim, int n_heads) {
  apex_module *mod = apex__nn_module(m, NN_BLOCK, name, "apex_transformer_block_create");
  if (!mod) return NULL;
  char buf[APEX_NAME_MAX];
  apex_module *parts[5] = {
      apex_layer_norm_create(m, child_name(buf, mod, "ln1"), dim, 0),
      apex_attention_create(m, child_name(buf, mod, "attn"), dim, n_heads),
      apex_layer_norm_create(m, child_name(buf, mod, "ln2"), dim, 0),
      apex_linear_create(m, child_name(buf, mod, "fc"), dim, 4 * dim, 1),
      apex_linear_create(m, child_name(buf, mod, "proj"), 4 * dim, dim, 1),
  };
  for (int i = 0; i < 5; i++)
    if (!parts[i] || !apex__nn_add_child(mod, parts[i])) return parts[i] ? apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "out of memory") : NULL;
  return mod;
}

apex_module *apex_activation_create(apex_model *m, apex_op op) {
  if (op != APEX_OP_RELU && op != APEX_OP_GELU && op != APEX_OP_GELU_TANH && op != APEX_OP_TANH && op != APEX_OP_SIGMOID)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_activation_create: op '%s' is not an activation", apex_op_name(op));
  apex_module *mod = apex__nn_module(m, NN_ACTIVATION, NULL, "apex_activation_create");
  if (mod) mod->act = op;
  return mod;
}

static apex_module *pool_create(apex_model *m, nn_kind kind, const apex_pool2d_options *opts, const char *who) {
  if (!opts || opts->kernel_h < 1 || opts->kernel_w < 1) return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: a kernel size >= 1 is required", who);
  apex_module *mod = apex__nn_module(m, kind, NULL, who);
  if (mod) mod->pool = *opts;
  return mod;
}
apex_module *apex_max_pool2d_create(apex_model *m, const apex_pool2d_options *o) { return pool_create(m, NN_MAX_POOL, o, "apex_max_pool2d_create"); }
apex_module *apex_avg_pool2d_create(apex_model *m, const apex_pool2d_options *o) { return pool_create(m, NN_AVG_POOL, o, "apex_avg_pool2d_create"); }
apex_module *apex_flatten_create(apex_model *m) { return apex__nn_module(m, NN_FLATTEN, NULL, "apex_flatten_create"); }

apex_module *apex_dropout_create(apex_model *m, float p) {
  if (!(p >= 0.0f && p < 1.0f)) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_dropout_create: p = %g; it must be in [0, 1)", p);
  apex_module *mod = apex__nn_module(m, NN_DROPOUT, NULL, "apex_dropout_create");
  if (mod) mod->f = p;
  return mod;
}

apex_module *apex_sequential_create(apex_model *m, const char *name) { return apex__nn_module(m, NN_SEQUENTIAL, name, "apex_sequential_create"); }

apex_status apex_sequential_add(apex_module *seq, apex_module *child) {
  if (!seq || !child) return apex__fail(APEX_ERR_INVALID_ARG, "apex_sequential_add: NULL %s (did its constructor fail?)", seq ? "child" : "sequential");
  if (seq->kind != NN_SEQUENTIAL) return apex__fail(APEX_ERR_INVALID_ARG, "apex_sequential_add: '%s' is not a sequential", seq->name);
  if (child->model != seq->model) return apex__fail(APEX_ERR_INVALID_ARG, "apex_sequential_add: '%s' belongs to another model", child->name);
  if (child == seq) return apex__fail(APEX_ERR_INVALID_ARG, "apex_sequential_add: a sequential cannot contain itself");
  return apex__nn_add_child(seq, child) ? APEX_OK : apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_sequential_add: out of memory");
}

const char *apex_module_name(const apex_module *mod) {
  if (mod) return mod->name;
  apex__fail_null_arg(__func__, "module");
  return "";
}

apex_var *apex_module_param(const apex_module *mod, const char *local) {
  if (!mod) apex__fail_null_arg(__func__, "module");
  if (!mod || !local) return NULL;
  if (!strcmp(local, "weight")) return mod->p[0];
  if (!strcmp(local, "bias")) return mod->p[1];
  return NULL;
}

/* ---- forward ------------------------------------------------------------------------------------ */

/* q, k and v in one product: the three weights (and biases) joined along their rows, [3 C, C] and [3 C],
 * which apex_concat views in place while they are the one allocation the module made (an amp cast to
 * half since has given each its own: then a copy), then the attention on the packed [B, T, 3 C].
 * Bits against three products (apex_causal_attention_heads on three linears, as before): the forward
 * and the weight and bias gradients are the same sums (each output column over C, each weight gradient
 * element over the B T rows, whatever the product's width), so the same bits on the CPU, except f32
 * weight gradients on oneDNN's f32 matmul where the joint product's tiles differ from the three's (its
 * order follows the call's shape); the input's gradient is one product over 3 C instead of three over
 * C added in turn, which rounds differently. test_nn_qkv checks each, the differences within their
 * bounds. */
static apex_var *attention_forward(apex_module *mod, apex_graph *g, apex_var *x) {
  const apex_tensor *X = apex_var_value(x);
  if (apex_tensor_ndim(X) != 3)
    return apex__fail_null(APEX_ERR_SHAPE, "attention '%s': input must be [B, T, C], not %d-d", mod->name, apex_tensor_ndim(X));
  apex_module **c = mod->children;
  apex_var *w3[3] = {c[0]->p[0], c[1]->p[0], c[2]->p[0]}, *b3[3] = {c[0]->p[1], c[1]->p[1], c[2]->p[1]};
  apex_var *w = apex_concat(g, 3, w3, 0), *b = w ? apex_concat(g, 3, b3, 0) : NULL;
  apex_var *qkv = b ? apex_linear(g, x, w, b) : NULL;
  apex_var_release(w), apex_var_release(b);
  apex_var *y = qkv ? apex__nn_drop(apex_causal_attention_qkv(g, qkv, mod->n_heads), qkv) : NULL;
  return y ? apex__nn_drop(apex_module_forward(c[3], g, y), y) : NULL;
}

/* The block's two residual adds each go into the layer norm after them (apex_add_layer_norm): the
 * block's input is a + b (b NULL: a alone), normalised by ln1 as it is summed, and the block ends unsummed,
 * returning x1 and *p_out, whose sum is its output: the next block's ln1, or the model's final norm, adds
 * them as it normalises (apex__nn_block_forward2 in nn_internal.h). */
apex_var *apex__nn_block_forward2(apex_module *mod, apex_graph *g, apex_var *a, apex_var *b, apex_var **p_out) {
  apex_module **c = mod->children;
  *p_out = NULL;
  apex_var *x = a, *h;
  if (b) {
    h = apex_add_layer_norm(g, a, b, c[0]->p[0], c[0]->p[1], c[0]->f, &x);
    if (h) apex_var_release(a), apex_var_release(b);
  } else {
    h = apex_module_forward(c[0], g, x);
  }
  apex_var *att = h ? apex__nn_drop(apex_module_forward(c[1], g, h), h) : NULL, *x1 = NULL;
  h = att ? apex_add_layer_norm(g, x, att, c[2]->p[0], c[2]->p[1], c[2]->f, &x1) : NULL;
  if (!h) return NULL;
  apex_var_release(att);
  if (b) apex_var_release(x); /* the sum made here; a caller's a stays the caller's */
  /* fc and its GELU as one op: the GELU in the product's epilogue, the pre-activation kept as its aux */
  apex_var *f = apex__nn_drop(apex_linear_gelu(g, h, c[3]->p[0], c[3]->p[1]), h);
  apex_var *p = f ? apex__nn_drop(apex_module_forward(c[4], g, f), f) : NULL;
  if (!p) return NULL;
  *p_out = p;
  return x1;
}

static apex_var *block_forward(apex_module *mod, apex_graph *g, apex_var *x) {
  apex_var *p, *x1 = apex__nn_block_forward2(mod, g, x, NULL, &p);
  return x1 ? apex__nn_drop(apex__nn_drop(apex_add(g, x1, p), p), x1) : NULL;
}

static int is_batch_norm(const apex_module *mod) { return mod->kind == NN_BATCH_NORM1D || mod->kind == NN_BATCH_NORM2D; }

/* A batch norm module's forward; relu: its result through relu, fused (apex_batch_norm_options.relu). */
static apex_var *batch_norm_forward(apex_module *mod, apex_graph *g, apex_var *x, int relu) {
  int nd = apex_tensor_ndim(apex_var_value(x)), training = mod->model->training;
  if (mod->kind == NN_BATCH_NORM2D ? nd != 4 : (nd != 2 && nd != 3))
    return apex__fail_null(APEX_ERR_SHAPE, "%s '%s': input has %d dimensions; it takes %s", mod->kind == NN_BATCH_NORM2D ? "BatchNorm2d" : "BatchNorm1d",
                           mod->name, nd, mod->kind == NN_BATCH_NORM2D ? "[N, C, H, W]" : "[N, C] or [N, C, L]");
  apex_batch_norm_options o = mod->bn;
  o.training = training;
  o.relu = relu;
  if (training && mod->bn_hook.stats) return apex__batch_norm_hooked(g, &mod->bn_hook, x, mod->p[0], mod->p[1], mod->buf[0], mod->buf[1], &o);
  return apex_batch_norm(g, x, mod->p[0], mod->p[1], mod->buf[0], mod->buf[1], &o);
}

/* A sequential runs a batch norm followed by a ReLU as one fused op: the ReLU's pass over the
 * activations (and its backward's) is gone. Measured on the benchmark CNN (2 threads): the two
 * ReLUs after batch norm took 2.2 ms of a 26 ms step. Not with a SyncBatchNorm (its op has no fused
 * form). */
static int fuses_relu(const apex_module *bn, const apex_module *next) {
  return is_batch_norm(bn) && !(bn->model->training && bn->bn_hook.stats) && next->kind == NN_ACTIVATION && next->act == APEX_OP_RELU;
}

apex_var *apex_module_forward(apex_module *mod, apex_graph *g, apex_var *x) {
  if (!mod) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_module_forward: NULL module (did its constructor fail?)");
  if (!x) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_module_forward: '%s' got a NULL input (did an earlier op fail?)", mod->name);
  int training = mod->model->training;
  switch (mod->kind) {
  case NN_LINEAR: return apex_linear(g, x, mod->p[0], mod->p[1]);
  case NN_CONV2D: return apex_conv2d(g, x, mod->p[0], mod->p[1], &mod->conv);
  case NN_BATCH_NORM1D:
  case NN_BATCH_NORM2D: return batch_norm_forward(mod, g, x, 0);
  case NN_LAYER_NORM:
  case NN_RMS_NORM: {
    const apex_tensor *w = apex_var_value(mod->p[0]);
    if (mod->kind == NN_RMS_NORM) return apex_rms_norm_nd(g, x, apex_tensor_ndim(w), apex_tensor_shape(w), mod->p[0], mod->f);
    return apex_layer_norm_nd(g, x, apex_tensor_ndim(w), apex_tensor_shape(w), mod->p[0], mod->p[1], mod->f);
  }
  case NN_EMBEDDING:
    return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_module_forward: embedding '%s' takes ids: use apex_embedding_forward", mod->name);
  case NN_GPT: return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_module_forward: a GPT takes token ids: use apex_gpt_forward");
  case NN_ATTENTION: return attention_forward(mod, g, x);
  case NN_BLOCK: return block_forward(mod, g, x);
  case NN_ACTIVATION:
    switch (mod->act) {
    case APEX_OP_RELU: return apex_relu(g, x);
    case APEX_OP_GELU: return apex_gelu(g, x);
    case APEX_OP_GELU_TANH: return apex_gelu_tanh(g, x);
    case APEX_OP_TANH: return apex_tanh(g, x);
    default: return apex_sigmoid(g, x);
    }
  case NN_MAX_POOL: return apex_max_pool2d(g, x, &mod->pool);
  case NN_AVG_POOL: return apex_avg_pool2d(g, x, &mod->pool);
  case NN_FLATTEN: {
    int64_t s[2] = {apex_tensor_dim(apex_var_value(x), 0), -1};
    return apex_reshape(g, x, 2, s);
  }
  case NN_DROPOUT: return apex_dropout(g, x, mod->f, training, &mod->model->rng);
  case NN_SEQUENTIAL: {
    apex_var *in = x; /* the caller's: kept */
    for (size_t i = 0; i < mod->n_children && x; i++) {
      apex_module *c = mod->children[i];
      int fuse = i + 1 < mod->n_children && fuses_relu(c, mod->children[i + 1]);
      apex_var *y = fuse ? batch_norm_forward(c, g, x, 1) : apex_module_forward(c, g, x);
      i += fuse;
      x = x == in ? y : apex__nn_drop(y, x);
    }
    return x;
  }
  }
  return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_module_forward: unknown module kind %d", (int)mod->kind);
}
