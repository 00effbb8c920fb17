/* releasable.c: tensors whose memory is freed while the tensor objects stay, and made again when next
 * needed (core/internal.h). The state is the storage's: a released storage has data NULL and bytes kept,
 * so every view of it (ZeRO's pieces of a gradient) follows, and remaking it through any view makes all
 * of them valid again at their offsets. Why not destroy and recreate the gradient tensors: optimizers'
 * groups, amp's masters, DDP's Reducer and ZeRO hold pointers to them. */
#include <stdio.h>

#include "core/internal.h"
#include "core/tensor_internal.h"

static int whole(const apex_tensor *t) { return t->offset == 0 && t->numel * apex_dtype_size(t->dtype) == t->storage->bytes; }

void apex__tensor_set_releasable(apex_tensor *t) {
  if (t && t->storage->owned && t->storage->bytes > 0 && whole(t)) t->storage->releasable = 1;
}

int apex_tensor_released(const apex_tensor *t) {
  if (!t) apex__fail_null_arg(__func__, "tensor");
  return t && t->storage->releasable && !t->storage->data;
}

int apex__tensor_release(apex_tensor *t) {
  if (!t || !t->storage->releasable || !whole(t)) return 0;
  apex_storage *s = t->storage;
  s->mem->free(s->data); /* NULL is fine: released already */
  s->data = NULL;
  return 1;
}

apex_status apex__tensor_remake(apex_tensor *t, int zero, const char *fn) {
  if (!apex_tensor_released(t)) return APEX_OK;
  void *data = NULL;
  apex_status st = t->storage->mem->alloc(t->storage->bytes, zero, &data);
  if (st != APEX_OK) {
    char why[256]; /* the message is rewritten below: copy it out first */
    snprintf(why, sizeof why, "%s", apex_last_error());
    return apex__fail(st, "%s: cannot make the %zu bytes of a released tensor again: %s", fn, t->storage->bytes, why);
  }
  t->storage->data = data;
  return APEX_OK;
}
