/* gpt2_cuda.c: GPT-2's forward, backward and training step on the GPU over apex's CUDA kernels (see
 * gpt2_cuda.h). Memory is planned once in gpt2_cuda_create; a step allocates nothing of its own. The captured
 * step (gpt2_cuda_train_step_graph) records the same calls once into a CUDA graph (src/backend/cuda/graph.cu),
 * with the batch's ids read from device buffers (embedding.cu's _dev entries) instead of the host, and replays it.
 *
 * Shapes (BT = B * T rows; every matrix row-major; apex_kernel_matmul(a, ta, b, tb, c) is c = op(a) op(b),
 * and a linear y = x W^T + b with W [out, in] is matmul(x, 0, W, 1, y, bias)):
 *
 *   forward                                     a (op)            b (op)              c
 *   enc     = wte[tokens] + wpe[positions]      embedding lookups and apex_kernel_add       [BT, C]
 *   ln1     = layer_norm(res_in)                                                      [BT, C]
 *   qkv     = ln1 qkv_w^T + qkv_b               ln1 [BT, C]       qkv_w [3C, C]^T     [BT, 3C]
 *   atty    = attention(qkv)                    qkv viewed [B, T, 3C] -> [B, T, C]; in bf16 the fused kernel
 *                                               (flash_attention.cu, heads read in place, stats [B, H, T, 2]),
 *                                               else the materialised one (stats [B * H, T, 2])
 *   res_mid = res_in + atty proj_w^T + proj_b   atty [BT, C]      proj_w [C, C]^T     [BT, C]
 *   ln2     = layer_norm(res_mid)                                                     [BT, C]
 *   fch     = ln2 fc_w^T + fc_b                 ln2 [BT, C]       fc_w [4C, C]^T      [BT, 4C]
 *   fch_gelu = gelu(fch)                                                              [BT, 4C]
 *   res_out = res_mid + fch_gelu fcproj_w^T + fcproj_b  fch_gelu [BT, 4C]  fcproj_w [C, 4C]^T  [BT, C]
 *   lnf     = layer_norm(res_out of block L-1)                                        [BT, C]
 *   logits  = lnf wte^T                         lnf [BT, C]       wte [V, C]^T        [BT, V]
 *   loss    = mean over BT of cross_entropy(logits, targets); in bf16 the fused classifier (classifier.cu)
 *             also writes dlogits over the logits here, in the same pass
 *
 *   backward (dX is the loss's gradient with respect to X)
 *   dlogits = (softmax - onehot) / BT, in place over logits
 *   dlnf    = dlogits wte                       dlogits [BT, V]   wte [V, C]          [BT, C]
 *   dres    = layer_norm_backward(dlnf), dlnf_w, dlnf_b
 *   per block, last first (dres = d res_out on entry, d res_in on exit):
 *   dfcproj_w = dres^T fch_gelu                 dres [BT, C]^T    fch_gelu [BT, 4C]   [C, 4C]
 *   dfcproj_b = column sums of dres
 *   dfc     = dres fcproj_w                     dres [BT, C]      fcproj_w [C, 4C]    [BT, 4C]
 *   dfc     = gelu_backward(dfc, fch)  (in place)
 *   dfc_w   = dfc^T ln2                         dfc [BT, 4C]^T    ln2 [BT, C]         [4C, C]
 *   dfc_b   = column sums of dfc
 *   dln     = dfc fc_w                          dfc [BT, 4C]      fc_w [4C, C]        [BT, C]
 *   dres   += layer_norm_backward(dln) (x = res_mid), dln2_w, dln2_b      now d res_mid
 *   dproj_w = dres^T atty                       dres [BT, C]^T    atty [BT, C]        [C, C]
 *   dproj_b = column sums of dres
 *   datty   = dres proj_w                       dres [BT, C]      proj_w [C, C]       [BT, C]
 *   dqkv    = attention_backward(datty, qkv, atty, lse)                               [BT, 3C]
 *   dqkv_w  = dqkv^T ln1                        dqkv [BT, 3C]^T   ln1 [BT, C]         [3C, C]
 *   dqkv_b  = column sums of dqkv
 *   dln     = dqkv qkv_w                        dqkv [BT, 3C]     qkv_w [3C, C]       [BT, C]
 *   dres   += layer_norm_backward(dln) (x = res_in), dln1_w, dln1_b       now d res_in
 *   then dres = d enc:
 *   dwte    = embedding_backward(dres, tokens)  (overwrites: rows of absent tokens become 0)
 *   dwpe    = embedding_backward(dres, positions)
 *   dwte   += dlogits^T lnf  (beta = 1)         dlogits [BT, V]^T lnf [BT, C]          [V, C]
 *
 * In bf16, cuBLASLt's epilogues fuse: c_fc's bias and GELU (GELU_AUX_BIAS, fch kept as the aux), the bias
 * gradients into the dW products (BGRADB), and GELU's backward with c_fc's bias gradient into the mlp c_proj
 * dx product (DGELU_BGRAD); where cuBLASLt has no algorithm for one, the separate kernels above run instead.
 *
 * The tied lm_head's share of dwte is added last because the embedding backward overwrites its table;
 * dlogits stays alive until then (it is the logits buffer, which nothing else needs after the loss). */
#include "gpt2_cuda.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apex/cuda.h"
#include "apex/kernels.h"
#include "core/internal.h" /* apex__fail: the model's errors read like the library's */
#if APEX_GPT2_CUDA_INTERNAL
#include "backend/cuda/cuda_internal.h" /* the fused attention (flash_attention.cu), called by name */
#endif

#define LN_EPS 1e-5f

typedef struct gpt2_layer_acts {
  apex_tensor *ln1, *ln1_mean, *ln1_rstd; /* [BT, C]; f32 [BT] each */
  apex_tensor *qkv, *qkv3;                /* [BT, 3C] and the same storage as [B, T, 3C] */
  apex_tensor *atty, *atty3, *lse;        /* [BT, C], as [B, T, C]; f32 [B * H, T, 2] (max, 1 / sum) */
  apex_tensor *stats;                     /* the fused attention's f32 [B, H, T, 2] (m, r) per row, or NULL */
  apex_tensor *res_mid;                   /* [BT, C]: the residual stream after the attention */
  apex_tensor *ln2, *ln2_mean, *ln2_rstd;
  apex_tensor *fch, *fch_gelu;            /* [BT, 4C]: the MLP before and after GELU */
  apex_tensor *res_out;                   /* [BT, C]: the block's output */
} gpt2_layer_acts;

struct gpt2_acts {
  apex_device device;                    /* where every tensor below lives (gpt2_cuda_create_on) */
  int64_t *tokens, *targets, *positions; /* host [BT]: the embedding kernels take host ids, backward too */
  apex_tensor *h_targets, *d_targets;    /* the int64 targets as raw bytes: f32 [2 BT], host and device */
  apex_tensor *enc;                      /* [BT, C]: the residual into block 0 */
  apex_tensor *tmp;                      /* [BT, C] forward scratch: position rows, projections */
  gpt2_layer_acts *layer;
  apex_tensor *lnf, *lnf_mean, *lnf_rstd;
  apex_tensor *logits;        /* [BT, V]; their gradient after backward */
  apex_tensor *losses, *lse;  /* f32 [BT]; [BT, 2] (max, 1 / sum) */
  apex_tensor *loss;          /* f32 [1]: the mean */
  apex_tensor *dloss;         /* f32 [BT], each 1 / BT: the mean's gradient */
  apex_tensor *dres, *dln, *dx; /* [BT, C]: d residual, d layer-norm output, a layer norm's d input */
  apex_tensor *datty, *datty3;  /* [BT, C], as [B, T, C] */
  apex_tensor *dqkv, *dqkv3;    /* [BT, 3C], as [B, T, 3C] */
  apex_tensor *dfc;             /* [BT, 4C] */
  int forward_done;             /* a forward's activations wait for their backward */
  struct gpt2_prof *prof;       /* the per-call stopwatch (gpt2_cuda_profile_start), NULL when off */
  int flash;                    /* the attention is the fused kernel (bf16, head dim 64 or 128), not the
                                   materialised one; APEX_GPT2_ATTENTION=materialised in the environment
                                   turns it off (to compare) */
  int epilogues;                /* bf16: cuBLASLt's epilogues make GELU (keeping its pre-activation), its gradient and
                                   the bias gradients inside the products (APEX_GPT2_EPILOGUES=off: separate kernels;
                                   also turned off for good the first time cuBLASLt has no algorithm for one) */
  int fused_norms;              /* bf16: each residual add and the layer norm after it are one kernel
                                   (APEX_GPT2_NORMS=separate: two) */
  int fused_classifier;         /* the forward's cross entropy writes dlogits in place (classifier.cu), and the
                                   backward starts from them; bf16 only (APEX_GPT2_CLASSIFIER=separate: off) */
  /* Every tensor made here (parameters, gradients, activations, views), for destroy. */
  apex_tensor **owned;
  int n_owned, cap_owned;
  int dev_ids;                  /* the step reads its ids from device memory (the captured step's path) */
  struct gpt2_graph *graph;     /* the captured step (gpt2_cuda_train_step_graph), NULL until its first call */
};

#if APEX_GPT2_CUDA_INTERNAL
/* The captured step. Its graph replays fixed addresses, so the batch's ids live in device buffers that each
 * call refills (through a pinned staging ring) before it launches the graph; the embedding kernels read them
 * there (embedding.cu's _dev entries). */
struct gpt2_graph {
  apex__cuda_staging *staging; /* tokens then targets, 2 BT int64, copied into d_io before each launch */
  int64_t *d_io;               /* device [2 BT]: the tokens, then the targets */
  int64_t *d_positions;        /* device [BT]: i % T, uploaded once */
  void *scratch;               /* the device-id embedding backward's sort */
  size_t scratch_bytes;
  int warm;                    /* uncaptured steps run on this path so far */
  apex__cuda_graph *exec;      /* NULL until captured */
  const apex_optimizer *opt;   /* the optimizer of the warm-up and the capture */
  int n_groups;
  apex_optim_options opts[8];  /* each group's options at the capture: the step's kernels hold them */
};
#endif

static const char *const LAYER_NAMES[GPT2_TENSORS_PER_LAYER] = {
    "ln1_w", "ln1_b", "qkv_w", "qkv_b", "proj_w", "proj_b", "ln2_w", "ln2_b", "fc_w", "fc_b", "fcproj_w", "fcproj_b"};

/* Re-raises the current error with the model step that hit it in front. */
static apex_status fail_at(apex_status st, const char *fmt, ...) APEX_PRINTF(2, 3);
static apex_status fail_at(apex_status st, const char *fmt, ...) {
  char what[128], msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  snprintf(msg, sizeof msg, "%s", apex_last_error()); /* copied: apex__fail rewrites that buffer */
  return apex__fail(st, "gpt2_cuda: %s: %s", what, msg);
}

/* Each model call: its failure names the step; when profiling, an event after it closes the step's GPU
 * interval, labelled by the step's name (its format string: "h.%d c_attn" gathers every layer). */
#define CHECK(call, ...)                                  \
  do {                                                    \
    apex_status st_ = (call);                             \
    if (st_ != APEX_OK) return fail_at(st_, __VA_ARGS__); \
    prof_mark(m, FIRST_ARG(__VA_ARGS__, 0));              \
  } while (0)
#define FIRST_ARG(a, ...) a

/* ---- the per-call stopwatch ---------------------------------------------------------------------------------- */

enum { PROF_EVENTS = 2048, PROF_LABELS = 96 };
struct gpt2_prof {
#if APEX_GPT2_CUDA_INTERNAL
  apex__cuda_timer *timer;
#endif
  int n_marks, steps, n_labels;
  const char *mark_label[PROF_EVENTS]; /* what ran between mark k - 1 and mark k (NULL: a step's start) */
  const char *label[PROF_LABELS];
  double ms[PROF_LABELS];
};

/* An event after everything queued so far, closing the interval of `label`. */
static void prof_mark(gpt2_cuda *m, const char *label) {
  struct gpt2_prof *p = m->acts->prof;
#if APEX_GPT2_CUDA_INTERNAL
  if (p && p->n_marks < PROF_EVENTS && apex__cuda_timer_mark(p->timer, p->n_marks) == APEX_OK)
    p->mark_label[p->n_marks++] = label;
#else
  (void)p;
  (void)label;
#endif
}

/* The recorded intervals into the per-label sums (waits for the GPU), and the marks cleared. */
static apex_status prof_fold(struct gpt2_prof *p) {
  apex_status st = APEX_OK;
#if APEX_GPT2_CUDA_INTERNAL
  for (int k = 1; k < p->n_marks && st == APEX_OK; k++) {
    float ms = 0;
    if (!p->mark_label[k] || (st = apex__cuda_timer_elapsed(p->timer, k - 1, k, &ms)) != APEX_OK) continue;
    int j = 0;
    while (j < p->n_labels && p->label[j] != p->mark_label[k]) j++;
    if (j == PROF_LABELS) continue; /* more names than the table holds: not counted */
    if (j == p->n_labels) p->label[p->n_labels++] = p->mark_label[k];
    p->ms[j] += ms;
  }
#endif
  p->n_marks = 0;
  return st;
}

apex_status gpt2_cuda_profile_start(gpt2_cuda *m) {
  if (!m) return apex__fail(APEX_ERR_INVALID_ARG, "gpt2_cuda_profile_start: NULL model");
  if (m->device != APEX_DEVICE_CUDA)
    return apex__fail(APEX_ERR_UNSUPPORTED, "gpt2_cuda_profile_start: the profile times CUDA events; this model is on the CPU");
#if APEX_GPT2_CUDA_INTERNAL
  struct gpt2_prof *p = m->acts->prof;
  if (!p && !(p = calloc(1, sizeof *p))) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "gpt2_cuda_profile_start: out of memory");
  if (!p->timer) {
    apex_status st = apex__cuda_timer_create(PROF_EVENTS, &p->timer);
    if (st != APEX_OK) {
      free(p);
      return st;
    }
  }
  p->n_marks = p->steps = p->n_labels = 0;
  m->acts->prof = p;
  return APEX_OK;
#else
  return apex__fail(APEX_ERR_UNSUPPORTED, "gpt2_cuda_profile_start: built without the CUDA backend's timer");
#endif
}

int gpt2_cuda_profile_read(gpt2_cuda *m, const char **labels, double *ms, int max, int *steps) {
  struct gpt2_prof *p = m ? m->acts->prof : NULL;
  if (!p) return 0;
  prof_fold(p);
  int n = p->n_labels < max ? p->n_labels : max;
  for (int i = 0; i < n; i++) {
    labels[i] = p->label[i];
    ms[i] = p->ms[i];
  }
  if (steps) *steps = p->steps;
#if APEX_GPT2_CUDA_INTERNAL
  apex__cuda_timer_destroy(p->timer);
#endif
  free(p);
  m->acts->prof = NULL;
  return n;
}

/* ---- memory ---------------------------------------------------------------------------------------------- */

static apex_tensor *own(struct gpt2_acts *a, apex_tensor *t) {
  if (!t) return NULL;
  if (a->n_owned == a->cap_owned) {
    int cap = a->cap_owned ? 2 * a->cap_owned : 256;
    apex_tensor **p = realloc(a->owned, (size_t)cap * sizeof *p);
    if (!p) {
      apex_tensor_destroy(t);
      return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "gpt2_cuda: out of memory");
    }
    a->owned = p;
    a->cap_owned = cap;
  }
  a->owned[a->n_owned++] = t;
  return t;
}

/* A device tensor [d0] (d1 == 0), [d0, d1] or [d0, d1, d2] (d2 != 0), owned by the model. */
static apex_tensor *dev(struct gpt2_acts *a, apex_dtype dt, int64_t d0, int64_t d1, int64_t d2) {
  int64_t s[3] = {d0, d1, d2};
  return own(a, apex_tensor_create_on(a->device, dt, d2 ? 3 : d1 ? 2 : 1, s));
}

/* t seen as [d0, d1, d2] (the attention kernels take [B, T, ...] operands). */
static apex_tensor *view3(struct gpt2_acts *a, apex_tensor *t, int64_t d0, int64_t d1, int64_t d2) {
  int64_t s[3] = {d0, d1, d2};
  return t ? own(a, apex_tensor_view(t, 3, s)) : NULL;
}

static void list_tensors(const gpt2_params *p, int L, apex_tensor **out) {
  int k = 0;
  out[k++] = p->wte;
  out[k++] = p->wpe;
  for (int l = 0; l < L; l++) {
    const gpt2_layer *y = &p->layer[l];
    apex_tensor *t[GPT2_TENSORS_PER_LAYER] = {y->ln1_w, y->ln1_b, y->qkv_w,  y->qkv_b, y->proj_w,   y->proj_b,
                                              y->ln2_w, y->ln2_b, y->fc_w, y->fc_b,  y->fcproj_w, y->fcproj_b};
    for (int j = 0; j < GPT2_TENSORS_PER_LAYER; j++) out[k++] = t[j];
  }
  out[k++] = p->lnf_w;
  out[k++] = p->lnf_b;
}

/* Makes every tensor of p; 0 when one failed (the others are owned and freed by destroy). */
static int make_params(struct gpt2_acts *a, gpt2_params *p, const gpt2_config *c, apex_dtype dt) {
  int64_t C = c->n_embd;
  p->layer = calloc((size_t)c->n_layer, sizeof *p->layer);
  if (!p->layer) return 0;
  int ok = (p->wte = dev(a, dt, c->vocab, C, 0)) && (p->wpe = dev(a, dt, c->max_t, C, 0));
  for (int l = 0; ok && l < c->n_layer; l++) {
    gpt2_layer *y = &p->layer[l];
    ok = (y->ln1_w = dev(a, dt, C, 0, 0)) && (y->ln1_b = dev(a, dt, C, 0, 0)) && (y->qkv_w = dev(a, dt, 3 * C, C, 0)) &&
         (y->qkv_b = dev(a, dt, 3 * C, 0, 0)) && (y->proj_w = dev(a, dt, C, C, 0)) && (y->proj_b = dev(a, dt, C, 0, 0)) &&
         (y->ln2_w = dev(a, dt, C, 0, 0)) && (y->ln2_b = dev(a, dt, C, 0, 0)) && (y->fc_w = dev(a, dt, 4 * C, C, 0)) &&
         (y->fc_b = dev(a, dt, 4 * C, 0, 0)) && (y->fcproj_w = dev(a, dt, C, 4 * C, 0)) && (y->fcproj_b = dev(a, dt, C, 0, 0));
  }
  return ok && (p->lnf_w = dev(a, dt, C, 0, 0)) && (p->lnf_b = dev(a, dt, C, 0, 0));
}

/* Whether the fused attention takes this model: a CUDA build and a model on the GPU, bf16, head dim 64 or 128
 * (the packed qkv's rows of 3C elements are then 16-byte multiples, as its loads want), not turned off by the
 * environment. */
static int flash_applies(const gpt2_config *c, apex_dtype dt, apex_device device) {
#if APEX_GPT2_CUDA_INTERNAL
  const char *env = getenv("APEX_GPT2_ATTENTION");
  const int d = c->n_embd / c->n_head;
  return device == APEX_DEVICE_CUDA && dt == APEX_BF16 && (d == 64 || d == 128) && !(env && !strcmp(env, "materialised"));
#else
  (void)c;
  (void)dt;
  (void)device;
  return 0;
#endif
}

static int make_acts(struct gpt2_acts *a, const gpt2_config *c, apex_dtype dt, int B, int T) {
  int64_t C = c->n_embd, BT = (int64_t)B * T, H = c->n_head, two = 2 * BT;
  a->flash = flash_applies(c, dt, a->device);
#if APEX_GPT2_CUDA_INTERNAL
  /* the fused paths call CUDA kernels by name on the tensors' pointers: on the GPU only */
  const int fuse = dt == APEX_BF16 && a->device == APEX_DEVICE_CUDA;
  const char *cls = getenv("APEX_GPT2_CLASSIFIER");
  a->fused_classifier = fuse && !(cls && !strcmp(cls, "separate"));
  const char *nrm = getenv("APEX_GPT2_NORMS");
  a->fused_norms = fuse && !(nrm && !strcmp(nrm, "separate"));
  const char *epi = getenv("APEX_GPT2_EPILOGUES");
  a->epilogues = fuse && !(epi && !strcmp(epi, "off"));
#endif
  a->tokens = malloc((size_t)BT * sizeof(int64_t));
  a->targets = malloc((size_t)BT * sizeof(int64_t));
  a->positions = malloc((size_t)BT * sizeof(int64_t));
  a->layer = calloc((size_t)c->n_layer, sizeof *a->layer);
  if (!a->tokens || !a->targets || !a->positions || !a->layer) return 0;
  for (int64_t i = 0; i < BT; i++) a->positions[i] = i % T;
  const apex_dtype f = APEX_F32;
  int ok = (a->h_targets = own(a, apex_tensor_wrap(a->targets, f, 1, &two))) && (a->d_targets = dev(a, f, two, 0, 0)) &&
           (a->enc = dev(a, dt, BT, C, 0)) && (a->tmp = dev(a, dt, BT, C, 0));
  for (int l = 0; ok && l < c->n_layer; l++) {
    gpt2_layer_acts *y = &a->layer[l];
    ok = (y->ln1 = dev(a, dt, BT, C, 0)) && (y->ln1_mean = dev(a, f, BT, 0, 0)) && (y->ln1_rstd = dev(a, f, BT, 0, 0)) &&
         (y->qkv = dev(a, dt, BT, 3 * C, 0)) && (y->qkv3 = view3(a, y->qkv, B, T, 3 * C)) &&
         (y->atty = dev(a, dt, BT, C, 0)) && (y->atty3 = view3(a, y->atty, B, T, C)) && (y->lse = dev(a, f, B * H, T, 2)) &&
         (y->res_mid = dev(a, dt, BT, C, 0)) && (y->ln2 = dev(a, dt, BT, C, 0)) && (y->ln2_mean = dev(a, f, BT, 0, 0)) &&
         (y->ln2_rstd = dev(a, f, BT, 0, 0)) && (y->fch = dev(a, dt, BT, 4 * C, 0)) &&
         (y->fch_gelu = dev(a, dt, BT, 4 * C, 0)) && (y->res_out = dev(a, dt, BT, C, 0)) &&
         (!a->flash || (y->stats = dev(a, f, B, H, 2 * (int64_t)T)));
  }
  ok = ok && (a->lnf = dev(a, dt, BT, C, 0)) && (a->lnf_mean = dev(a, f, BT, 0, 0)) && (a->lnf_rstd = dev(a, f, BT, 0, 0)) &&
       (a->logits = dev(a, dt, BT, c->vocab, 0)) && (a->losses = dev(a, f, BT, 0, 0)) && (a->lse = dev(a, f, BT, 2, 0)) &&
       (a->loss = dev(a, f, 1, 0, 0)) && (a->dloss = dev(a, f, BT, 0, 0)) && (a->dres = dev(a, dt, BT, C, 0)) &&
       (a->dln = dev(a, dt, BT, C, 0)) && (a->dx = dev(a, dt, BT, C, 0)) && (a->datty = dev(a, dt, BT, C, 0)) &&
       (a->datty3 = view3(a, a->datty, B, T, C)) && (a->dqkv = dev(a, dt, BT, 3 * C, 0)) &&
       (a->dqkv3 = view3(a, a->dqkv, B, T, 3 * C)) && (a->dfc = dev(a, dt, BT, 4 * C, 0));
  /* The mean over BT positions: each position's loss has weight 1 / BT. */
  return ok && apex_tensor_fill(a->dloss, 1.0f / (float)BT) == APEX_OK;
}

/* ---- creation -------------------------------------------------------------------------------------------- */

gpt2_config gpt2_config_small(void) {
  return (gpt2_config){.vocab = 50304, .max_t = 1024, .n_layer = 12, .n_embd = 768, .n_head = 12};
}

/* values of tensor i of the list (see gpt2_cuda.h) drawn on the host, copied (and rounded) to the GPU. */
static apex_status init_tensor(gpt2_cuda *m, int i, apex_rng *rng, float *host) {
  apex_tensor *t = m->param_list[i];
  size_t n = apex_tensor_numel(t);
  char full[64];
  const char *name = gpt2_cuda_tensor_name(m, i, full, sizeof full), *dot = strrchr(name, '.');
  if (dot) name = dot + 1; /* "h.3.proj_w" -> "proj_w" */
  size_t len = strlen(name);
  if (!strcmp(name + len - 2, "_b")) return apex_tensor_fill(t, 0.0f); /* biases */
  if (!strncmp(name, "ln", 2)) return apex_tensor_fill(t, 1.0f);       /* layer-norm weights */
  /* GPT-2 scales the projections into the residual stream by 1 / sqrt(2 L): the stream's variance then
   * stays put as the 2 L residual additions pile up. */
  float std = !strcmp(name, "proj_w") || !strcmp(name, "fcproj_w") ? 0.02f / sqrtf(2.0f * (float)m->cfg.n_layer) : 0.02f;
  apex_status st = apex_rng_normal(rng, host, n, 0.0f, std);
  if (st != APEX_OK) return st;
  int64_t len64 = (int64_t)n;
  apex_tensor *h = apex_tensor_wrap(host, APEX_F32, 1, &len64);
  if (!h) return apex_last_status();
  st = apex_tensor_copy(t, h);
  apex_tensor_destroy(h);
  return st;
}

gpt2_cuda *gpt2_cuda_create(const gpt2_config *cfg, apex_dtype dtype, int B, int T, uint64_t seed) {
  return gpt2_cuda_create_on(APEX_DEVICE_CUDA, cfg, dtype, B, T, seed);
}

gpt2_cuda *gpt2_cuda_create_on(apex_device device, const gpt2_config *cfg, apex_dtype dtype, int B, int T, uint64_t seed) {
  if (!cfg) return apex__fail_null(APEX_ERR_INVALID_ARG, "gpt2_cuda_create: NULL config");
  if (device != APEX_DEVICE_CPU && device != APEX_DEVICE_CUDA)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "gpt2_cuda_create: device %d: APEX_DEVICE_CPU or APEX_DEVICE_CUDA", (int)device);
  const gpt2_config *c = cfg;
  if (c->vocab < 1 || c->max_t < 1 || c->n_layer < 1 || c->n_embd < 1 || c->n_head < 1 || c->n_embd % c->n_head)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "gpt2_cuda_create: bad config (vocab %d, max_t %d, n_layer %d, n_embd %d, "
                           "n_head %d): all must be >= 1 and n_embd a multiple of n_head", c->vocab, c->max_t, c->n_layer,
                           c->n_embd, c->n_head);
  if (B < 1 || T < 1 || T > c->max_t)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "gpt2_cuda_create: batch %d x %d: B must be >= 1 and T in [1, max_t = %d]",
                           B, T, c->max_t);
  if (dtype != APEX_F32 && dtype != APEX_BF16)
    return apex__fail_null(APEX_ERR_DTYPE, "gpt2_cuda_create: dtype %s: f32 or bf16 (f16 would need loss scaling)",
                           apex_dtype_name(dtype));
  gpt2_cuda *m = calloc(1, sizeof *m);
  struct gpt2_acts *a = m ? calloc(1, sizeof *a) : NULL;
  if (!a) {
    free(m);
    return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "gpt2_cuda_create: out of memory");
  }
  m->cfg = *c;
  m->dtype = dtype;
  m->B = B;
  m->T = T;
  m->acts = a;
  m->device = a->device = device;
  m->n_tensors = 2 + GPT2_TENSORS_PER_LAYER * c->n_layer + 2;
  m->param_list = calloc((size_t)m->n_tensors, sizeof *m->param_list);
  m->grad_list = calloc((size_t)m->n_tensors, sizeof *m->grad_list);
  float *host = NULL;
  apex_status st = APEX_OK;
  if (!m->param_list || !m->grad_list) st = apex__fail(APEX_ERR_OUT_OF_MEMORY, "gpt2_cuda_create: out of memory");
  else if (!make_params(a, &m->params, c, dtype) || !make_params(a, &m->grads, c, dtype) || !make_acts(a, c, dtype, B, T))
    st = fail_at(apex_last_status() != APEX_OK ? apex_last_status() : APEX_ERR_OUT_OF_MEMORY, "creating the tensors");
  if (st == APEX_OK) {
    list_tensors(&m->params, c->n_layer, m->param_list);
    list_tensors(&m->grads, c->n_layer, m->grad_list);
    size_t biggest = 0;
    for (int i = 0; i < m->n_tensors; i++)
      if (apex_tensor_numel(m->param_list[i]) > biggest) biggest = apex_tensor_numel(m->param_list[i]);
    if (!(host = malloc(biggest * sizeof *host))) st = apex__fail(APEX_ERR_OUT_OF_MEMORY, "gpt2_cuda_create: out of memory");
  }
  if (st == APEX_OK) {
    apex_rng rng = apex_rng_init(seed);
    for (int i = 0; st == APEX_OK && i < m->n_tensors; i++)
      if ((st = init_tensor(m, i, &rng, host)) != APEX_OK) st = fail_at(st, "initialising tensor %d", i);
    if (st == APEX_OK && (st = gpt2_cuda_zero_grad(m)) == APEX_OK && device == APEX_DEVICE_CUDA) st = apex_cuda_synchronize();
  }
  free(host);
  if (st != APEX_OK) {
    gpt2_cuda_destroy(m);
    return NULL;
  }
  return m;
}

void gpt2_cuda_destroy(gpt2_cuda *m) {
  if (!m) return;
  struct gpt2_acts *a = m->acts;
  if (a) {
    if (a->prof) gpt2_cuda_profile_read(m, NULL, NULL, 0, NULL); /* frees it */
    gpt2_cuda_graph_reset(m);                                     /* before the tensors its graph writes */
    for (int i = a->n_owned - 1; i >= 0; i--) apex_tensor_destroy(a->owned[i]); /* views before their bases */
    free(a->owned);
    free(a->tokens);
    free(a->targets);
    free(a->positions);
    free(a->layer);
    free(a);
  }
  free(m->params.layer);
  free(m->grads.layer);
  free(m->param_list);
  free(m->grad_list);
  free(m);
}

const char *gpt2_cuda_tensor_name(const gpt2_cuda *m, int i, char *buf, size_t size) {
  if (i == 0) snprintf(buf, size, "wte");
  else if (i == 1) snprintf(buf, size, "wpe");
  else if (i == m->n_tensors - 2) snprintf(buf, size, "lnf_w");
  else if (i == m->n_tensors - 1) snprintf(buf, size, "lnf_b");
  else snprintf(buf, size, "h.%d.%s", (i - 2) / GPT2_TENSORS_PER_LAYER, LAYER_NAMES[(i - 2) % GPT2_TENSORS_PER_LAYER]);
  return buf;
}

int64_t gpt2_cuda_num_params(const gpt2_cuda *m) {
  int64_t n = 0;
  for (int i = 0; i < m->n_tensors; i++) n += (int64_t)apex_tensor_numel(m->param_list[i]);
  return n;
}

int64_t gpt2_cuda_num_params_non_embedding(const gpt2_cuda *m) {
  return gpt2_cuda_num_params(m) - (int64_t)apex_tensor_numel(m->params.wpe);
}

double gpt2_cuda_flops_per_token(const gpt2_cuda *m) {
  /* 6 N: 2 N for the forward's multiply-adds, 4 N for the backward's two products per weight; 12 L C T:
   * the attention's q k^T and p v (2 L T C multiply-adds a token forward), times 3 with the backward. */
  return 6.0 * (double)gpt2_cuda_num_params_non_embedding(m) +
         12.0 * m->cfg.n_layer * (double)m->cfg.n_embd * (double)m->T;
}

/* ---- forward and backward --------------------------------------------------------------------------------- */

#if APEX_GPT2_CUDA_INTERNAL
/* The fused kernel's view of the packed qkv [B, T, 3C]: q, k, v at column offsets 0, C, 2C of rows of 3C,
 * the output and its gradient [B, T, C], the gradients packed as the qkv. */
static apex__cuda_flash flash_geometry(const gpt2_cuda *m) {
  const int64_t C = m->cfg.n_embd;
  return (apex__cuda_flash){m->B, m->cfg.n_head, m->T, (int)(C / m->cfg.n_head), 3 * C, 3 * C, 3 * C, C, C, 3 * C, 3 * C,
                            3 * C, m->dtype};
}
#endif

const char *gpt2_cuda_attention_path(const gpt2_cuda *m) {
  return m && m->acts->flash ? "fused (flash_attention.cu)" : "materialised (attention.cu)";
}

#if APEX_GPT2_CUDA_INTERNAL
/* After an epilogue product failed (cuBLASLt has no algorithm for it, or refused it): says so once on stderr
 * and runs the separate kernels from now on; a real device fault shows again in them. */
static void epilogues_off(gpt2_cuda *m) {
  fprintf(stderr, "gpt2_cuda: cuBLASLt epilogue product failed (%s); the separate kernels from now on\n", apex_last_error());
  m->acts->epilogues = 0;
}
#endif

/* xsum = x + x2 (the residual stream; xsum may be x), then y, mean, rstd = layer_norm(xsum; w, b): one kernel
 * in bf16, else the add and the norm. */
static apex_status add_norm(gpt2_cuda *m, apex_tensor *x, apex_tensor *x2, apex_tensor *xsum, apex_tensor *w, apex_tensor *b,
                            apex_tensor *y, apex_tensor *mean, apex_tensor *rstd) {
  (void)m; /* unused without the CUDA backend */
#if APEX_GPT2_CUDA_INTERNAL
  if (m->acts->fused_norms)
    return apex__cuda_add_layer_norm_fwd(apex_tensor_data(x), apex_tensor_data(x2), apex_tensor_data(xsum), m->dtype,
                                         apex_tensor_data(w), apex_tensor_data(b), m->dtype, (int64_t)m->B * m->T,
                                         m->cfg.n_embd, LN_EPS, apex_tensor_data(y), apex_tensor_data(mean),
                                         apex_tensor_data(rstd));
#endif
  apex_status st = apex_kernel_add(x, x2, xsum);
  return st == APEX_OK ? apex_kernel_layer_norm_forward(xsum, w, b, LN_EPS, 0, y, mean, rstd) : st;
}

/* fch_gelu = gelu(ln2 fc_w^T + fc_b), with fch (the pre-activation) kept for the backward: one product with
 * the GELU_AUX_BIAS epilogue, or the product and the GELU kernel. */
static apex_status fc_forward(gpt2_cuda *m, const gpt2_layer *w, gpt2_layer_acts *y) {
  (void)m; /* unused without the CUDA backend */
#if APEX_GPT2_CUDA_INTERNAL
  if (m->acts->epilogues) {
    const int64_t BT = (int64_t)m->B * m->T, C = m->cfg.n_embd;
    apex__cuda_epilogue x = {APEX__EPI_GELU_AUX_BIAS, apex_tensor_data(w->fc_b), apex_tensor_data(y->fch), NULL};
    apex_status st = apex__cuda_gemm_epilogue(0, 1, BT, 4 * C, C, apex_tensor_data(y->ln2), apex_tensor_data(w->fc_w),
                                              m->dtype, apex_tensor_data(y->fch_gelu), m->dtype, &x);
    if (st == APEX_OK) return st;
    epilogues_off(m); /* the same results by the separate kernels, from now on */
  }
#endif
  apex_status st = apex_kernel_matmul(y->ln2, 0, w->fc_w, 1, y->fch, 1.0f, 0.0f, w->fc_b, 0);
  return st == APEX_OK ? apex_kernel_gelu_forward(y->fch, y->fch_gelu) : st;
}

/* A linear layer's weight and bias gradients: dw [out, in] = dy^T x (dy [BT, out], x [BT, in]) and db [out]
 * = the column sums of dy; one product with the BGRADB epilogue, or the product and a column sum. */
static apex_status linear_backward_weights(gpt2_cuda *m, apex_tensor *dy, apex_tensor *x, apex_tensor *dw, apex_tensor *db) {
  (void)m; /* unused without the CUDA backend */
#if APEX_GPT2_CUDA_INTERNAL
  if (m->acts->epilogues) {
    const int64_t BT = (int64_t)m->B * m->T, out = apex_tensor_shape(dw)[0], in = apex_tensor_shape(dw)[1];
    apex__cuda_epilogue e = {APEX__EPI_BGRADB, NULL, NULL, apex_tensor_data(db)};
    apex_status st = apex__cuda_gemm_epilogue(1, 0, out, in, BT, apex_tensor_data(dy), apex_tensor_data(x), m->dtype,
                                              apex_tensor_data(dw), m->dtype, &e);
    if (st == APEX_OK) return st;
    epilogues_off(m);
  }
#endif
  apex_status st = apex_kernel_matmul(dy, 1, x, 0, dw, 1.0f, 0.0f, NULL, 0);
  return st == APEX_OK ? apex_kernel_sum_rows(dy, db, 0) : st;
}

/* The MLP's hidden gradient: dfc = (dres fcproj_w) * gelu'(fch), and c_fc's bias gradient dfc_b = the column
 * sums of dfc; one product with the DGELU_BGRAD epilogue, or the product, GELU's backward and a column sum. */
static apex_status mlp_backward_hidden(gpt2_cuda *m, const gpt2_layer *w, const gpt2_layer *gw, gpt2_layer_acts *y) {
  struct gpt2_acts *a = m->acts;
#if APEX_GPT2_CUDA_INTERNAL
  if (a->epilogues) {
    const int64_t BT = (int64_t)m->B * m->T, C = m->cfg.n_embd;
    apex__cuda_epilogue e = {APEX__EPI_DGELU_BGRAD, NULL, apex_tensor_data(y->fch), apex_tensor_data(gw->fc_b)};
    apex_status st = apex__cuda_gemm_epilogue(0, 0, BT, 4 * C, C, apex_tensor_data(a->dres), apex_tensor_data(w->fcproj_w),
                                              m->dtype, apex_tensor_data(a->dfc), m->dtype, &e);
    if (st == APEX_OK) return st;
    epilogues_off(m);
  }
#endif
  apex_status st = apex_kernel_matmul(a->dres, 0, w->fcproj_w, 0, a->dfc, 1.0f, 0.0f, NULL, 0);
  if (st == APEX_OK) st = apex_kernel_gelu_backward(a->dfc, y->fch, a->dfc);
  return st == APEX_OK ? apex_kernel_sum_rows(a->dfc, gw->fc_b, 0) : st;
}

/* atty (and the statistics for the backward) from qkv: the fused kernel when it applies, else the
 * materialised one (lse). */
static apex_status attention_forward(gpt2_cuda *m, gpt2_layer_acts *y) {
#if APEX_GPT2_CUDA_INTERNAL
  if (m->acts->flash) {
    const apex__cuda_flash g = flash_geometry(m);
    char *q = apex_tensor_data(y->qkv);
    const size_t off = (size_t)m->cfg.n_embd * apex_dtype_size(m->dtype);
    return apex__cuda_flash_attention_fwd(&g, q, q + off, q + 2 * off, apex_tensor_data(y->atty), apex_tensor_data(y->stats));
  }
#endif
  return apex_kernel_attention_forward(y->qkv3, m->cfg.n_head, y->atty3, y->lse);
}

/* dqkv from datty through the attention of layer y, by the path its forward took. */
static apex_status attention_backward(gpt2_cuda *m, gpt2_layer_acts *y) {
  struct gpt2_acts *a = m->acts;
#if APEX_GPT2_CUDA_INTERNAL
  if (a->flash) {
    const apex__cuda_flash g = flash_geometry(m);
    const char *q = apex_tensor_data(y->qkv);
    char *dq = apex_tensor_data(a->dqkv);
    const size_t off = (size_t)m->cfg.n_embd * apex_dtype_size(m->dtype);
    return apex__cuda_flash_attention_bwd(&g, q, q + off, q + 2 * off, apex_tensor_data(y->atty), apex_tensor_data(a->datty),
                                          apex_tensor_data(y->stats), dq, dq + off, dq + 2 * off);
  }
#endif
  return apex_kernel_attention_backward(a->datty3, y->qkv3, y->atty3, y->lse, m->cfg.n_head, a->dqkv3);
}

/* The device int64 targets [BT] the loss reads. */
static const int64_t *dev_targets(const gpt2_cuda *m) {
#if APEX_GPT2_CUDA_INTERNAL
  if (m->acts->dev_ids) return m->acts->graph->d_io + (int64_t)m->B * m->T;
#endif
  return apex_tensor_data(m->acts->d_targets);
}

/* y = rows of table at the tokens (positions = 0) or at the positions (1): host ids through apex's kernel, or
 * on the captured step's path the device ids through embedding.cu's _dev entries (the same bits). */
static apex_status embed_forward(gpt2_cuda *m, apex_tensor *table, int positions, apex_tensor *y) {
  struct gpt2_acts *a = m->acts;
  const int64_t BT = (int64_t)m->B * m->T;
#if APEX_GPT2_CUDA_INTERNAL
  if (a->dev_ids)
    return apex__cuda_embedding_fwd_dev(apex_tensor_data(table), m->dtype, m->cfg.n_embd,
                                        positions ? a->graph->d_positions : a->graph->d_io, BT, apex_tensor_data(y), m->dtype);
#endif
  return apex_kernel_embedding_forward(table, positions ? a->positions : a->tokens, BT, y);
}

/* dtable = the embedding backward of dres at the tokens (positions = 0) or the positions (1), overwritten. */
static apex_status embed_backward(gpt2_cuda *m, apex_tensor *dtable, int positions) {
  struct gpt2_acts *a = m->acts;
  const int64_t BT = (int64_t)m->B * m->T;
#if APEX_GPT2_CUDA_INTERNAL
  if (a->dev_ids) {
    struct gpt2_graph *g = a->graph;
    return apex__cuda_embedding_bwd_dev(apex_tensor_data(a->dres), m->dtype, positions ? g->d_positions : g->d_io, BT,
                                        apex_tensor_shape(dtable)[0], m->cfg.n_embd, apex_tensor_data(dtable), m->dtype,
                                        g->scratch, g->scratch_bytes);
  }
#endif
  return apex_kernel_embedding_backward(a->dres, positions ? a->positions : a->tokens, BT, dtable);
}

static apex_status forward_queue(gpt2_cuda *m);

/* APEX_OK when every id of ids [BT] (what: "token" or "target") is in [0, V), else which one is not. */
static apex_status check_ids(const gpt2_cuda *m, const int64_t *ids, const char *what, const char *fn) {
  const int64_t BT = (int64_t)m->B * m->T, V = m->cfg.vocab;
  for (int64_t i = 0; i < BT; i++)
    if (ids[i] < 0 || ids[i] >= V)
      return apex__fail(APEX_ERR_INVALID_ARG, "%s: %s %lld at %lld is outside [0, %lld)", fn, what, (long long)ids[i], (long long)i,
                        (long long)V);
  return APEX_OK;
}

apex_status gpt2_cuda_forward(gpt2_cuda *m, const int64_t *tokens, const int64_t *targets) {
  if (!m || !tokens || !targets) return apex__fail(APEX_ERR_INVALID_ARG, "gpt2_cuda_forward: NULL argument");
  struct gpt2_acts *a = m->acts;
  const int64_t BT = (int64_t)m->B * m->T;
  /* the loss kernel would give a NaN for a bad target; say which one instead (the tokens' kernel checks them) */
  apex_status st = check_ids(m, targets, "target", "gpt2_cuda_forward");
  if (st != APEX_OK) return st;
  memcpy(a->tokens, tokens, (size_t)BT * sizeof *tokens);
  memcpy(a->targets, targets, (size_t)BT * sizeof *targets);
  a->forward_done = 0;
  if (a->prof) { /* the previous step's intervals read before this step's first event: the wait is in none */
    CHECK(prof_fold(a->prof), "reading the profile");
    a->prof->steps++;
    prof_mark(m, NULL);
  }
  CHECK(apex_tensor_copy(a->d_targets, a->h_targets), "uploading the targets");
  return forward_queue(m);
}

/* The forward's GPU work, from the ids and targets already where its path reads them (a->tokens and
 * d_targets, or the captured step's device buffers). */
static apex_status forward_queue(gpt2_cuda *m) {
  struct gpt2_acts *a = m->acts;
  const gpt2_params *p = &m->params;
  CHECK(embed_forward(m, p->wte, 0, a->enc), "token embedding");
  CHECK(embed_forward(m, p->wpe, 1, a->tmp), "position embedding");
  /* each residual add goes with the layer norm after it: ln_1 of block l + 1 is made at the end of block l */
  CHECK(add_norm(m, a->enc, a->tmp, a->enc, p->layer[0].ln1_w, p->layer[0].ln1_b, a->layer[0].ln1, a->layer[0].ln1_mean,
                 a->layer[0].ln1_rstd),
        "embedding sum and h.0 ln_1");
  apex_tensor *res = a->enc;
  const int L = m->cfg.n_layer;
  for (int l = 0; l < L; l++) {
    const gpt2_layer *w = &p->layer[l];
    gpt2_layer_acts *y = &a->layer[l];
    CHECK(apex_kernel_matmul(y->ln1, 0, w->qkv_w, 1, y->qkv, 1.0f, 0.0f, w->qkv_b, 0), "h.%d c_attn", l);
    CHECK(attention_forward(m, y), "h.%d attention", l);
    CHECK(apex_kernel_matmul(y->atty, 0, w->proj_w, 1, a->tmp, 1.0f, 0.0f, w->proj_b, 0), "h.%d attn c_proj", l);
    CHECK(add_norm(m, res, a->tmp, y->res_mid, w->ln2_w, w->ln2_b, y->ln2, y->ln2_mean, y->ln2_rstd),
          "h.%d attention residual and ln_2", l);
    CHECK(fc_forward(m, w, y), "h.%d c_fc with its GELU", l);
    CHECK(apex_kernel_matmul(y->fch_gelu, 0, w->fcproj_w, 1, a->tmp, 1.0f, 0.0f, w->fcproj_b, 0), "h.%d mlp c_proj", l);
    if (l + 1 < L) {
      gpt2_layer_acts *z = &a->layer[l + 1];
      CHECK(add_norm(m, y->res_mid, a->tmp, y->res_out, p->layer[l + 1].ln1_w, p->layer[l + 1].ln1_b, z->ln1, z->ln1_mean,
                     z->ln1_rstd),
            "h.%d mlp residual and the next ln_1", l);
    } else {
      CHECK(add_norm(m, y->res_mid, a->tmp, y->res_out, p->lnf_w, p->lnf_b, a->lnf, a->lnf_mean, a->lnf_rstd),
            "h.%d mlp residual and ln_f", l);
    }
    res = y->res_out;
  }
  CHECK(apex_kernel_matmul(a->lnf, 0, p->wte, 1, a->logits, 1.0f, 0.0f, NULL, 0), "lm_head");
#if APEX_GPT2_CUDA_INTERNAL
  const int64_t BT = (int64_t)m->B * m->T, V = m->cfg.vocab;
  if (a->fused_classifier)
    CHECK(apex__cuda_classifier(apex_tensor_data(a->logits), m->dtype, dev_targets(m), BT, V, V,
                                1.0f / (float)BT, apex_tensor_data(a->losses)),
          "cross-entropy and its gradient (fused classifier)");
  else
#endif
    CHECK(apex_kernel_cross_entropy_forward(a->logits, dev_targets(m), 0.0f, a->losses, a->lse),
          "cross-entropy");
  CHECK(apex_kernel_sum_all(a->losses, 1, a->loss), "mean loss");
  a->forward_done = 1;
  return APEX_OK;
}

apex_status gpt2_cuda_loss(gpt2_cuda *m, float *loss) {
  if (!m || !loss) return apex__fail(APEX_ERR_INVALID_ARG, "gpt2_cuda_loss: NULL argument");
  int64_t one = 1;
  apex_tensor *h = apex_tensor_wrap(loss, APEX_F32, 1, &one);
  if (!h) return apex_last_status();
  apex_status st = apex_tensor_copy(h, m->acts->loss); /* waits for the GPU */
  apex_tensor_destroy(h);
  return st == APEX_OK ? APEX_OK : fail_at(st, "reading the loss");
}

const apex_tensor *gpt2_cuda_loss_tensor(const gpt2_cuda *m) { return m ? m->acts->loss : NULL; }

apex_status gpt2_cuda_backward(gpt2_cuda *m) {
  if (!m) return apex__fail(APEX_ERR_INVALID_ARG, "gpt2_cuda_backward: NULL model");
  struct gpt2_acts *a = m->acts;
  if (!a->forward_done)
    return apex__fail(APEX_ERR_STATE, "gpt2_cuda_backward: no forward to go back through (each forward allows one backward)");
  a->forward_done = 0; /* the logits become their gradient below */
  const gpt2_params *p = &m->params, *g = &m->grads;
  const int L = m->cfg.n_layer;
  const int64_t *d_targets = dev_targets(m);
  if (!a->fused_classifier) /* else the forward left dlogits in the logits already */
    CHECK(apex_kernel_cross_entropy_backward(a->dloss, a->logits, d_targets, a->lse, 0.0f, a->logits),
          "cross-entropy backward"); /* in place: each element is read, then written, by one thread */
  CHECK(apex_kernel_matmul(a->logits, 0, p->wte, 0, a->dln, 1.0f, 0.0f, NULL, 0), "lm_head backward (input)");
  CHECK(apex_kernel_layer_norm_backward(a->dln, a->layer[L - 1].res_out, p->lnf_w, a->lnf_mean, a->lnf_rstd, 0, a->dres,
                                      g->lnf_w, g->lnf_b),
        "ln_f backward");
  for (int l = L - 1; l >= 0; l--) {
    const gpt2_layer *w = &p->layer[l], *gw = &g->layer[l];
    gpt2_layer_acts *y = &a->layer[l];
    apex_tensor *res_in = l ? a->layer[l - 1].res_out : a->enc;
    /* the MLP: dres is the gradient of res_out = res_mid + mlp(ln_2(res_mid)) */
    CHECK(linear_backward_weights(m, a->dres, y->fch_gelu, gw->fcproj_w, gw->fcproj_b), "h.%d mlp c_proj dW and its bias's", l);
    CHECK(mlp_backward_hidden(m, w, gw, y), "h.%d mlp c_proj dx through GELU, and c_fc's bias gradient", l);
    CHECK(apex_kernel_matmul(a->dfc, 1, y->ln2, 0, gw->fc_w, 1.0f, 0.0f, NULL, 0), "h.%d c_fc dW", l);
    CHECK(apex_kernel_matmul(a->dfc, 0, w->fc_w, 0, a->dln, 1.0f, 0.0f, NULL, 0), "h.%d c_fc dx", l);
    CHECK(apex_kernel_layer_norm_backward(a->dln, y->res_mid, w->ln2_w, y->ln2_mean, y->ln2_rstd, 0, a->dx, gw->ln2_w, gw->ln2_b),
          "h.%d ln_2 backward", l);
    CHECK(apex_kernel_add(a->dres, a->dx, a->dres), "h.%d mlp residual backward", l);
    /* the attention: dres is now the gradient of res_mid = res_in + attn(ln_1(res_in)) */
    CHECK(linear_backward_weights(m, a->dres, y->atty, gw->proj_w, gw->proj_b), "h.%d attn c_proj dW and its bias's", l);
    CHECK(apex_kernel_matmul(a->dres, 0, w->proj_w, 0, a->datty, 1.0f, 0.0f, NULL, 0), "h.%d attn c_proj dx", l);
    CHECK(attention_backward(m, y), "h.%d attention backward", l);
    CHECK(linear_backward_weights(m, a->dqkv, y->ln1, gw->qkv_w, gw->qkv_b), "h.%d c_attn dW and its bias's", l);
    CHECK(apex_kernel_matmul(a->dqkv, 0, w->qkv_w, 0, a->dln, 1.0f, 0.0f, NULL, 0), "h.%d c_attn dx", l);
    CHECK(apex_kernel_layer_norm_backward(a->dln, res_in, w->ln1_w, y->ln1_mean, y->ln1_rstd, 0, a->dx, gw->ln1_w, gw->ln1_b),
          "h.%d ln_1 backward", l);
    CHECK(apex_kernel_add(a->dres, a->dx, a->dres), "h.%d attention residual backward", l);
  }
  /* dres is the gradient of enc = wte[tokens] + wpe[positions] */
  CHECK(embed_backward(m, g->wte, 0), "token embedding backward");
  CHECK(embed_backward(m, g->wpe, 1), "position embedding backward");
  CHECK(apex_kernel_matmul(a->logits, 1, a->lnf, 0, g->wte, 1.0f, 1.0f, NULL, 0), "lm_head backward (tied weight)");
  return APEX_OK;
}

apex_status gpt2_cuda_zero_grad(gpt2_cuda *m) {
  if (!m) return apex__fail(APEX_ERR_INVALID_ARG, "gpt2_cuda_zero_grad: NULL model");
  for (int i = 0; i < m->n_tensors; i++) CHECK(apex_tensor_fill(m->grad_list[i], 0.0f), "zeroing gradient %d", i);
  return APEX_OK;
}

/* ---- training --------------------------------------------------------------------------------------------- */

apex_optimizer *gpt2_cuda_optimizer_create(gpt2_cuda *m, float lr, float weight_decay) {
  if (!m) return apex__fail_null(APEX_ERR_INVALID_ARG, "gpt2_cuda_optimizer_create: NULL model");
  const apex_optim_options decay = {.lr = lr, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = weight_decay};
  apex_optim_options no_decay = decay;
  no_decay.weight_decay = 0.0f; /* AdamW's default: none */
  apex_optimizer *opt = apex_optimizer_create(APEX_OPTIM_ADAMW, &decay);
  apex_tensor **p = calloc((size_t)m->n_tensors, sizeof *p), **g = calloc((size_t)m->n_tensors, sizeof *g);
  if (!opt || !p || !g) {
    apex_optimizer_destroy(opt);
    free(p);
    free(g);
    return opt ? apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "gpt2_cuda_optimizer_create: out of memory") : NULL;
  }
  /* nanoGPT's groups: every tensor of 2 or more dimensions decays, biases and layer-norm weights do not. */
  int nd = 0, k = 0;
  for (int i = 0; i < m->n_tensors; i++)
    if (apex_tensor_ndim(m->param_list[i]) >= 2) p[nd] = m->param_list[i], g[nd++] = m->grad_list[i];
  k = nd;
  for (int i = 0; i < m->n_tensors; i++)
    if (apex_tensor_ndim(m->param_list[i]) < 2) p[k] = m->param_list[i], g[k++] = m->grad_list[i];
  apex_status st = apex_optimizer_add_group(opt, p, nd, g, nd, &decay, NULL);
  if (st == APEX_OK) st = apex_optimizer_add_group(opt, p + nd, k - nd, g + nd, k - nd, &no_decay, NULL);
  free(p);
  free(g);
  if (st != APEX_OK) {
    fail_at(st, "building AdamW");
    apex_optimizer_destroy(opt);
    return NULL;
  }
  return opt;
}

/* The backward and the optimizer's step after a forward. */
static apex_status backward_and_step(gpt2_cuda *m, apex_optimizer *opt) {
  apex_status st = gpt2_cuda_backward(m);
  /* bf16 gradients carry no loss scale (1) and cannot overflow to a skipped step for want of range. */
  if (st == APEX_OK && (st = apex_optimizer_step(opt, 1.0f, 0)) != APEX_OK) st = fail_at(st, "AdamW step");
  if (st == APEX_OK) prof_mark(m, "AdamW step");
  return st;
}

apex_status gpt2_cuda_train_step(gpt2_cuda *m, apex_optimizer *opt, const int64_t *tokens, const int64_t *targets) {
  apex_status st = gpt2_cuda_forward(m, tokens, targets);
  return st == APEX_OK ? backward_and_step(m, opt) : st;
}

/* ---- the captured step ---------------------------------------------------------------------------------------- */

#if APEX_GPT2_CUDA_INTERNAL
#define GRAPH_WARMUP 1 /* uncaptured steps on the device-id path before the capture */

static void graph_free(struct gpt2_graph *g) {
  if (!g) return;
  apex__cuda_graph_destroy(g->exec); /* waits for a queued replay */
  apex__cuda_staging_destroy(g->staging);
  apex__cuda_free(g->d_io);
  apex__cuda_free(g->d_positions);
  apex__cuda_free(g->scratch);
  free(g);
}

/* The device buffers of the captured step's path, made once, before any capture (none may be allocated in one). */
static apex_status graph_create(gpt2_cuda *m, struct gpt2_graph **out) {
  const int64_t BT = (int64_t)m->B * m->T;
  const size_t ids = (size_t)BT * sizeof(int64_t);
  struct gpt2_graph *g = calloc(1, sizeof *g);
  if (!g) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "gpt2_cuda_train_step_graph: out of memory");
  size_t s1 = apex__cuda_embedding_bwd_scratch(BT, m->cfg.vocab), s2 = apex__cuda_embedding_bwd_scratch(BT, m->cfg.max_t);
  g->scratch_bytes = s1 > s2 ? s1 : s2;
  apex_status st = apex__cuda_staging_create(2 * ids, &g->staging);
  if (st == APEX_OK) st = apex__cuda_alloc(2 * ids, 0, (void **)&g->d_io);
  if (st == APEX_OK) st = apex__cuda_alloc(ids, 0, (void **)&g->d_positions);
  if (st == APEX_OK) st = apex__cuda_alloc(g->scratch_bytes, 0, &g->scratch);
  /* from pageable memory: the copy has read it when it returns, and the positions never change */
  if (st == APEX_OK) st = apex__cuda_memcpy(g->d_positions, m->acts->positions, ids, APEX__H2D, 0);
  if (st != APEX_OK) {
    graph_free(g);
    return fail_at(st, "preparing the captured step's buffers");
  }
  *out = g;
  return APEX_OK;
}

/* One whole step on the device-id path, queued (run now, or recorded by a capture). */
static apex_status graph_step_queue(gpt2_cuda *m, apex_optimizer *opt) {
  struct gpt2_acts *a = m->acts;
  a->dev_ids = 1;
  a->forward_done = 0;
  apex_status st = forward_queue(m);
  if (st == APEX_OK) st = backward_and_step(m, opt);
  a->dev_ids = 0;
  a->forward_done = 0; /* the backward consumed the forward */
  return st;
}

/* APEX_OK when opt is the optimizer the step was captured with and its options are those it had then. */
static apex_status graph_same_optimizer(const struct gpt2_graph *g, const apex_optimizer *opt, const char *fn) {
  if (g->opt && g->opt != opt)
    return apex__fail(APEX_ERR_STATE, "%s: the step was warmed up and captured with another optimizer; call "
                      "gpt2_cuda_graph_reset to capture it with this one", fn);
  if (!g->exec) return APEX_OK;
  if (apex_optimizer_num_groups(opt) != g->n_groups)
    return apex__fail(APEX_ERR_STATE, "%s: the optimizer has %d groups, %d when the step was captured; call "
                      "gpt2_cuda_graph_reset to capture it again", fn, apex_optimizer_num_groups(opt), g->n_groups);
  for (int k = 0; k < g->n_groups; k++) {
    apex_optim_options o;
    const apex_optim_options *c = &g->opts[k];
    if (apex_optimizer_group_options(opt, k, &o) != APEX_OK) return apex_last_status();
    if (o.lr != c->lr || o.weight_decay != c->weight_decay || o.beta1 != c->beta1 || o.beta2 != c->beta2 || o.eps != c->eps)
      return apex__fail(APEX_ERR_STATE, "%s: group %d's options changed since the step was captured (lr %g -> %g, weight "
                        "decay %g -> %g): the graph's kernels hold the old ones; call gpt2_cuda_graph_reset to capture the "
                        "step again (or train this step with gpt2_cuda_train_step)", fn, k, (double)c->lr, (double)o.lr,
                        (double)c->weight_decay, (double)o.weight_decay);
  }
  return APEX_OK;
}
#endif

apex_status gpt2_cuda_train_step_graph(gpt2_cuda *m, apex_optimizer *opt, const int64_t *tokens, const int64_t *targets) {
  const char *fn = "gpt2_cuda_train_step_graph";
  if (!m || !opt || !tokens || !targets) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL argument", fn);
  if (m->device != APEX_DEVICE_CUDA)
    return apex__fail(APEX_ERR_UNSUPPORTED, "%s: a CUDA graph needs the model on the GPU; use gpt2_cuda_train_step", fn);
#if !APEX_GPT2_CUDA_INTERNAL
  return apex__fail(APEX_ERR_UNSUPPORTED, "%s: built without the CUDA backend (CUDA graphs); use gpt2_cuda_train_step", fn);
#else
  struct gpt2_acts *a = m->acts;
  if (a->prof)
    return apex__fail(APEX_ERR_STATE, "%s: the per-call profile is on (gpt2_cuda_profile_start): its events would be read "
                      "between the calls of a step that is one graph launch; end it with gpt2_cuda_profile_read, or profile "
                      "gpt2_cuda_train_step", fn);
  const int64_t BT = (int64_t)m->B * m->T;
  /* The graph's kernels index the tables with these without a check: every id is checked here. */
  apex_status st = check_ids(m, tokens, "token", fn);
  if (st == APEX_OK) st = check_ids(m, targets, "target", fn);
  if (st != APEX_OK) return st;
  if (a->graph && (st = graph_same_optimizer(a->graph, opt, fn)) != APEX_OK) return st;
  if (!a->graph && (st = graph_create(m, &a->graph)) != APEX_OK) return st;
  struct gpt2_graph *g = a->graph;
  /* This step's ids into the pinned buffer the GPU is done with, then queued for d_io ahead of the step. */
  void *h = NULL;
  const size_t ids = (size_t)BT * sizeof(int64_t);
  if ((st = apex__cuda_staging_next(g->staging, &h)) != APEX_OK) return fail_at(st, "staging the ids");
  memcpy(h, tokens, ids);
  memcpy((char *)h + ids, targets, ids);
  if ((st = apex__cuda_staging_upload(g->staging, g->d_io, 2 * ids)) != APEX_OK) return fail_at(st, "uploading the ids");
  if (!g->exec && g->warm < GRAPH_WARMUP) { /* uncaptured: the pool grows its blocks, cuBLASLt makes its plans */
    st = graph_step_queue(m, opt);
    if (st == APEX_OK) {
      g->warm++;
      g->opt = opt;
    }
    return st;
  }
  if (!g->exec) {
    const int n = apex_optimizer_num_groups(opt);
    if (n < 1 || n > (int)(sizeof g->opts / sizeof g->opts[0]))
      return apex__fail(APEX_ERR_UNSUPPORTED, "%s: an optimizer of %d groups (this model's has 2; at most %d)", fn, n,
                        (int)(sizeof g->opts / sizeof g->opts[0]));
    for (int k = 0; k < n; k++)
      if ((st = apex_optimizer_group_options(opt, k, &g->opts[k])) != APEX_OK) return st;
    if ((st = apex__cuda_capture_begin(fn)) == APEX_OK) st = apex__cuda_capture_end(fn, graph_step_queue(m, opt), &g->exec);
    if (st != APEX_OK) return fail_at(st, "capturing the step into a CUDA graph (gpt2_cuda_train_step still trains the model)");
    g->n_groups = n;
    g->opt = opt;
  }
  st = apex__cuda_graph_launch(g->exec, fn);
  return st == APEX_OK ? APEX_OK : fail_at(st, "replaying the captured step");
#endif
}

void gpt2_cuda_graph_reset(gpt2_cuda *m) {
  if (!m) return;
#if APEX_GPT2_CUDA_INTERNAL
  graph_free(m->acts->graph);
#endif
  m->acts->graph = NULL;
}

int gpt2_cuda_graph_captured(const gpt2_cuda *m) {
#if APEX_GPT2_CUDA_INTERNAL
  return m && m->acts->graph && m->acts->graph->exec;
#else
  (void)m;
  return 0;
#endif
}
