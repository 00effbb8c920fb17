/* zero_release.c: stage 2 frees the gradient outside the shard (zero.h). Once a gradient has been
 * reduce-scattered (copied into a bucket of the collectives) this rank needs nothing of it: the sums it
 * owns are in its shard. So the gradient tensor's memory is released (core/internal.h: the tensor stays,
 * for everyone holding a pointer to it, and reads as zeros), and the next backward's first accumulation
 * makes it again, zero-filled, as apex_var_zero_grad would have left it: the same bits. With overlap a
 * rank then holds, during a backward, the gradients of the buckets not yet started, not the model's.
 * Only autograd's leaf gradients are releasable (a caller's own tensors, and the views amp's combine_grad
 * makes, keep their memory). */
#include "core/internal.h"
#include "parallel/reducer_internal.h"
#include "parallel/zero_internal.h"

size_t apex__zero_grad_held(const apex_zero *z) {
  size_t bytes = 0;
  for (int i = 0; i < z->n; i++)
    if (!apex_tensor_released(z->grads[i])) bytes += apex_tensor_nbytes(z->grads[i]);
  return bytes;
}

/* Memory only grows between releases (the backward makes gradients), so its peak is just before one. */
static void note_peak(apex_zero *z) {
  size_t held = apex__zero_grad_held(z);
  if (held > z->grad_peak) z->grad_peak = held;
}

void apex__zero_release(apex_zero *z, int lo, int hi) {
  if (!z->release || lo >= hi) return;
  note_peak(z);
  for (int i = lo; i < hi; i++) apex__tensor_release(z->grads[i]);
}

void apex__zero_release_started(apex_zero *z) {
  int started = apex_reducer_buckets_started(z->red);
  if (!z->release || started <= z->released_upto) return;
  note_peak(z);
  /* The Reducer's gradient k is params[n - 1 - k] (the flat vector's order). */
  for (int k = 0; k < z->n; k++) {
    int b = apex_reducer_bucket_of(z->red, k);
    if (b >= z->released_upto && b < started) apex__tensor_release(z->grads[z->n - 1 - k]);
  }
  z->released_upto = started;
}
