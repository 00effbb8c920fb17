/* conv_bound.h: the error bound a bf16 conv2d gradient gains where the CPU runs its products on
 * oneDNN (conv_onednn.c), for the tests that compare it with an f32-gradient reference
 * (test_nn_golden, test_conv_onednn). */
#ifndef APEX_TESTS_CONV_BOUND_H
#define APEX_TESTS_CONV_BOUND_H

#include <math.h>
#include <stdlib.h>

#include "apex/kernels.h"
#include "apex/tensor.h"
#include "testutil.h"

/* A backward product first rounds the f32 output gradient R [N, O, HO, WO] to bf16 (relative error
 * up to 2^-9 per element): each term R[n, o, oh, ow] x (w[o, c, ki, kj] for x's gradient (k = 0), x
 * at the patch for w's (k = 1)) adds 2^-9 of its size where it lands. Returns one double per element
 * of x (k = 0) or w (k = 1), computed in double from X [N, C, H, W] and W [O, C, KH, KW]. */
static inline double *conv_rounding_bound(int k, const apex_tensor *X, const apex_tensor *W, const apex_tensor *R,
                                          const apex_conv2d_options *o) {
  int N = (int)apex_tensor_dim(X, 0), C = (int)apex_tensor_dim(X, 1), H = (int)apex_tensor_dim(X, 2), Wd = (int)apex_tensor_dim(X, 3);
  int O = (int)apex_tensor_dim(W, 0), KH = (int)apex_tensor_dim(W, 2), KW = (int)apex_tensor_dim(W, 3);
  int sh = o->stride_h ? o->stride_h : 1, sw = o->stride_w ? o->stride_w : 1, ph = o->pad_h, pw = o->pad_w;
  int HO = (H + 2 * ph - KH) / sh + 1, WO = (Wd + 2 * pw - KW) / sw + 1;
  assert_int_equal(apex_tensor_numel(R), (size_t)N * O * HO * WO);
  double *out = calloc(apex_tensor_numel(k ? W : X), sizeof *out);
  assert_non_null(out);
  for (int n = 0; n < N; n++)
    for (int oc = 0; oc < O; oc++)
      for (int oh = 0; oh < HO; oh++)
        for (int ow = 0; ow < WO; ow++) {
          double r = fabs(apex_tensor_get(R, (((size_t)n * O + oc) * HO + oh) * WO + ow));
          for (int c = 0; c < C; c++)
            for (int ki = 0; ki < KH; ki++)
              for (int kj = 0; kj < KW; kj++) {
                int ih = oh * sh - ph + ki, iw = ow * sw - pw + kj;
                if (ih < 0 || ih >= H || iw < 0 || iw >= Wd) continue;
                size_t xi = (((size_t)n * C + c) * H + ih) * Wd + iw, wi = (((size_t)oc * C + c) * KH + ki) * KW + kj;
                if (k == 0)
                  out[xi] += ldexp(r * fabs(apex_tensor_get(W, wi)), -9);
                else
                  out[wi] += ldexp(r * fabs(apex_tensor_get(X, xi)), -9);
              }
        }
  return out;
}

#endif
