/* lifetime.c: when a value's memory can go back to the pool before the step ends.
 *
 * Backward reads only some values: linear reads its input and weight, not its output; ReLU reads
 * its output, not its input (op_table.c lists what each op reads). A value that no recorded
 * backward reads and that no caller will read again (its maker released it: apex_var_release, as
 * the modules do with the intermediates nobody else sees) is garbage long before apex_graph_reset.
 * Each value block therefore counts its references: the maker's handle, one per recorded op whose
 * backward reads it, one per view var sharing it. At zero the block goes back to the pool and a
 * later op of the same step reuses it, so what a forward keeps is what its backward needs (as in
 * PyTorch), and the saved references themselves go as backward passes each op. */
#include "autograd/ag.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define AG_PARK 1 /* keep released blocks poisoned and unused until reset: a late read faults */
#else
#define AG_PARK 0
#define ASAN_POISON_MEMORY_REGION(p, n) ((void)(p), (void)(n))
#define ASAN_UNPOISON_MEMORY_REGION(p, n) ((void)(p), (void)(n))
#endif

size_t apex__block_of(const apex_graph *g, const apex_storage *s) {
  for (size_t i = g->n_blocks; i-- > 0;) /* newest first: a value's block is usually recent */
    if (g->blocks[i].storage == s) return i + 1;
  return 0;
}

void apex__block_put(apex_graph *g, size_t blk) {
  ag_block *b = &g->blocks[blk - 1];
  b->used = 0;
  b->refs = 0;
  if (AG_PARK) {
    b->parked = 1;
    /* the sanitizer watches host addresses only; a device block is still kept out of use */
    if (b->storage->device == APEX_DEVICE_CPU) ASAN_POISON_MEMORY_REGION(b->storage->data, b->bytes);
  }
}

void apex__block_unpark(ag_block *b) {
  if (b->storage->device == APEX_DEVICE_CPU) ASAN_UNPOISON_MEMORY_REGION(b->storage->data, b->bytes);
  b->parked = 0;
}

static void ref(apex_graph *g, apex_var *x) {
  if (x->blk) {
    g->blocks[x->blk - 1].refs++;
    return;
  }
  /* a leaf (parameter), or a concat viewing leaves in place (ops_shape.c): not activation memory */
  if (!x->graph || (x->op == APEX_OP_CONCAT && !x->blk)) return;
  /* A graph input's value is the caller's memory; backward reading it keeps it alive all the same,
   * so it counts as saved (once per storage). */
  const apex_storage *s = x->value->storage;
  for (size_t i = 0; i < g->n_ext_saved; i++)
    if (g->ext_saved[i] == s) return;
  if (!apex__grow((void **)&g->ext_saved, &g->cap_ext_saved, g->n_ext_saved + 1, sizeof *g->ext_saved)) return;
  g->ext_saved[g->n_ext_saved++] = s;
  g->ext_saved_bytes += s->bytes;
}

static void unref(apex_graph *g, apex_var *x) {
  if (x->blk && --g->blocks[x->blk - 1].refs == 0) apex__block_put(g, x->blk);
}

static int in_mask(uint32_t mask, int i) { return (mask >> (i < 31 ? i : 31)) & 1u; }

/* Calls f on every input of v whose bit is in mask. */
static void each_input(apex_graph *g, apex_var *v, uint32_t mask, void (*f)(apex_graph *, apex_var *)) {
  for (int i = 0; i < v->n_in; i++)
    if (v->in[i] && in_mask(mask, i)) f(g, v->in[i]);
}

/* Calls f on every value v's op reads in backward. */
static void each_saved(apex_graph *g, apex_var *v, void (*f)(apex_graph *, apex_var *)) {
  const apex__op_info *op = apex__op(v->op);
  each_input(g, v, ~(op->unread & ~v->reads_also), f);
  if (op->reads_out) f(g, v);
}

void apex__save_also(apex_graph *g, apex_var *v, uint32_t inputs) {
  uint32_t added = inputs & apex__op(v->op)->unread & ~v->reads_also;
  v->reads_also |= inputs;
  if (v->saves) each_input(g, v, added, ref); /* apex__unsave drops them with the rest */
}

void apex__hold(apex_graph *g, apex_var *v) {
  v->blk = apex__block_of(g, v->value->storage);
  v->held = 1;
  if (v->blk) g->blocks[v->blk - 1].refs++;
  if (v->n_in) {
    v->saves = 1;
    each_saved(g, v, ref);
  }
}

void apex__unsave(apex_graph *g, apex_var *v) {
  if (!v->saves) return;
  v->saves = 0;
  each_saved(g, v, unref);
}

void apex_var_release(apex_var *v) {
  if (!v || !v->graph || !v->held || v->step != v->graph->step) return;
  v->held = 0;
  unref(v->graph, v);
}

void apex__pend(apex_graph *g, apex_var *cast) {
  /* without room it is simply kept to the end of the step, as before */
  if (apex__grow((void **)&g->pending, &g->cap_pending, g->n_pending + 1, sizeof *g->pending)) g->pending[g->n_pending++] = cast;
}

void apex__release_pending(apex_graph *g) {
  for (size_t i = 0; i < g->n_pending; i++) apex_var_release(g->pending[i]);
  g->n_pending = 0;
}

void apex__claim(apex_graph *g, apex_var *v) {
  for (size_t i = 0; i < g->n_pending; i++)
    if (g->pending[i] == v) g->pending[i] = g->pending[--g->n_pending];
}

void apex__gbuf_put(apex_graph *g, apex_var *v) {
  for (size_t i = g->n_blocks; v->gbuf && i-- > 0;)
    if (g->blocks[i].storage->data == (void *)v->gbuf) {
      apex__block_put(g, i + 1);
      break;
    }
  v->gbuf = NULL;
  v->gt = NULL;
}

size_t apex_graph_saved_bytes(const apex_graph *g) {
  if (!g) {
    apex__fail_null_arg(__func__, "graph");
    return 0;
  }
  return apex_graph_live_bytes(g) + g->ext_saved_bytes;
}
