/* conv_onednn.h: the products of conv2d's images (conv.c) in bf16 through oneDNN's matmul primitive,
 * for bf16 (and, where oneDNN has it for this CPU, f16) operands. Internal to the CPU backend.
 *
 * conv.c keeps the image loop, im2col (into 16-bit cols here), col2im and the fixed sums over
 * images; each function below is one image's product, one single-threaded oneDNN matmul of a shape
 * fixed by the convolution (a primitive of conv_onednn.c's own, created single-threaded), so its bits do not depend on the
 * thread count. The operands go in as bf16 (the f32 output gradient rounded to bf16 to nearest
 * even, once per image) and accumulate in f32. */
#ifndef APEX_BACKEND_CPU_CONV_ONEDNN_H
#define APEX_BACKEND_CPU_CONV_ONEDNN_H

#include <stdint.h>

#include "apex/tensor.h"
#include "backend/args_nn.h"

/* One thread's scratch for its products, grown as the products ask (apex__conv_onednn_scratch), with
 * its oneDNN stream and per-product state, made on first use and kept until the release. */
typedef struct apex__conv_dnn_scratch {
  void *pad; /* the primitives' scratchpad */
  size_t pad_bytes;
  float *acc; /* the f32 result of a forward product whose output is not f32 */
  size_t acc_bytes;
  uint16_t *g16; /* an image's output gradient rounded to bf16 (apex__conv_onednn_round) */
  size_t g16_bytes;
  void *stream;  /* dnnl_stream_t */
  void *slot[6];
} apex__conv_dnn_scratch;

/* 1 when conv2d over x and w of these dtypes should try this path: built with oneDNN, the maximum
 * ISA (apex/cpu.h) at AVX512_BF16 or above, oneDNN not switched off (apex__onednn_set_enabled), and
 * both operands bf16 or both f16. */
int apex__conv_onednn_wanted(apex_dtype x, apex_dtype w);

/* Scratch for n threads, all empty (NULL after a message when there is no memory for it), and its
 * release. */
apex__conv_dnn_scratch *apex__conv_onednn_scratch(int n);
void apex__conv_onednn_release(apex__conv_dnn_scratch *s, int n);

/* One image's forward: out [o, p] (dtype out_dtype) = w [o, k] cols [k, p] + bias [o] (bias may be
 * NULL); w and cols of dtype dt. */
apex_status apex__conv_onednn_fwd(apex__conv_dnn_scratch *s, int o, int k, int p, const void *w, apex_dtype dt, const uint16_t *cols,
                                  const float *bias, void *out, apex_dtype out_dtype);

/* An image's f32 output gradient gout [o, p] rounded to bf16 (to nearest even) in s, for both of the
 * image's backward products; NULL (no message) when dt is not bf16, as an f32 gradient is never
 * rounded to f16, and NULL after a message when there is no memory. */
const uint16_t *apex__conv_onednn_round(apex__conv_dnn_scratch *s, int o, int p, const float *gout, apex_dtype dt);

/* One image's weight gradient: part [o, k] = gout16 [o, p] cols [k, p]^T, plus part when add. */
apex_status apex__conv_onednn_wgrad(apex__conv_dnn_scratch *s, int o, int k, int p, const uint16_t *gout16, const uint16_t *cols, apex_dtype dt,
                                    float *part, int add);

/* One image's gradient of its cols: gcols [k, p] = w [o, k]^T gout16 [o, p]. */
apex_status apex__conv_onednn_dgrad(apex__conv_dnn_scratch *s, int o, int k, int p, const void *w, apex_dtype dt, const uint16_t *gout16,
                                    float *gcols);

/* Every function above returns APEX_ERR_UNSUPPORTED, with nothing written and no message, when oneDNN
 * has no primitive for the product (f16 on a CPU without an f16 matmul, an f16 weight gradient whose
 * f32 operand would have to be rounded to f16); the caller then takes its f32 path. The same shape
 * always gives the same answer, so conv.c asks with the first image alone. */

/* The number of image products this path has run since the process started (tests use it to
 * confirm which path ran). */
unsigned long apex__conv_onednn_products(void);

#endif
