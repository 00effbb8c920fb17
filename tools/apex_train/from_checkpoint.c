/* from_checkpoint.c: the run's flags from its checkpoint (from_checkpoint.h). */
#include "from_checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fileio.h"

/* The state.safetensors keys that are flags (the key with '-' for '_'), as ckpt_config records them. */
static const char *const recorded[] = {"model",     "opt_level", "cast_type",  "loss_scale", "keep_batchnorm_fp32", "master_weights",
                                       "optimizer", "lr",        "weight_decay", "batch_size", "epochs",           "seed",
                                       "seq_len",   "lr_schedule", "warmup",   "clip_grad_norm", "grad_accum",     "n_head"};

/* Values set from the file outlive it: train_args points at them until the process ends, so they live in
 * static storage (one slot per recorded flag and per size), not on the heap where nothing would free them. */
static char kept[sizeof recorded / sizeof recorded[0] + 4][128];
static size_t n_kept;

static int set_kept(train_args *a, const char *flag, const char *value) {
  if (n_kept == sizeof kept / sizeof kept[0] || strlen(value) >= sizeof kept[0]) return 1;
  char *v = kept[n_kept++];
  snprintf(v, sizeof kept[0], "%s", value);
  return args_set(a, flag, v);
}

/* The first dimension of name's shape in "name[d0, d1];..." (dim 0 or 1), or 0. */
static long shape_dim(const char *shapes, const char *name, int dim) {
  size_t n = strlen(name);
  for (const char *p = shapes; p && *p; p = strchr(p, ';') ? strchr(p, ';') + 1 : NULL)
    if (strncmp(p, name, n) == 0 && p[n] == '[') {
      long d0 = 0, d1 = 0;
      int got = sscanf(p + n, "[%ld, %ld]", &d0, &d1);
      return dim == 0 ? (got >= 1 ? d0 : 0) : (got == 2 ? d1 : 0);
    }
  return 0;
}

int from_checkpoint_fill(train_args *a) {
  char path[4700], sub[256] = "";
  snprintf(path, sizeof path, "%s/latest", a->checkpoint);
  size_t len;
  uint8_t *lb = file_read_all(path, &len, 0);
  if (!lb) return 0;
  snprintf(sub, sizeof sub, "%.*s", (int)(len < 200 ? len : 200), (char *)lb);
  free(lb);
  sub[strcspn(sub, "\n")] = 0;
  snprintf(path, sizeof path, "%s/%s/state.safetensors", a->checkpoint, sub);
  apex_safetensors *st = apex_safetensors_open(path);
  if (!st) {
    apex_clear_error();
    return 0;
  }
  int rc = 0;
  for (size_t i = 0; !rc && i < sizeof recorded / sizeof recorded[0]; i++) {
    const char *v = apex_safetensors_metadata(st, recorded[i]);
    char flag[32];
    snprintf(flag, sizeof flag, "%s", recorded[i]);
    for (char *c = flag; *c; c++)
      if (*c == '_') *c = '-';
    /* "default" and the 0 of a flag the model does not read are the flags' own defaults. */
    if (!v || args_given(a, flag) || strcmp(v, "default") == 0 || (strcmp(v, "0") == 0 && (!strcmp(flag, "seq-len") || !strcmp(flag, "n-head"))))
      continue;
    if (set_kept(a, flag, v) != 0) {
      fprintf(stderr, "apex-train: --%s: checkpoint %s records '%s', which this apex-train does not accept\n", a->eval_only ? "eval-only" : "sample",
              path, v);
      rc = 1;
    }
  }
  /* The sizes that the shapes show: the width and blocks of a GPT, the hidden width of the MLP. */
  const char *shapes = apex_safetensors_metadata(st, "shapes");
  char num[32];
  if (!rc && shapes && strcmp(a->model, "gpt") == 0) {
    long embd = shape_dim(shapes, "wte.weight", 1), layers = 0;
    char name[48];
    for (;; layers++) {
      snprintf(name, sizeof name, "h%ld.ln1.weight", layers);
      if (!shape_dim(shapes, name, 0)) break;
    }
    long vocab = shape_dim(shapes, "wte.weight", 0);
    if (vocab > 0 && !args_given(a, "vocab")) snprintf(num, sizeof num, "%ld", vocab), rc = set_kept(a, "vocab", num);
    if (!rc && embd > 0 && !args_given(a, "n-embd")) snprintf(num, sizeof num, "%ld", embd), rc = set_kept(a, "n-embd", num);
    if (!rc && layers > 0 && !args_given(a, "n-layer")) snprintf(num, sizeof num, "%ld", layers), rc = set_kept(a, "n-layer", num);
  }
  if (!rc && shapes && strcmp(a->model, "mlp") == 0) {
    long hidden = shape_dim(shapes, "0.weight", 0);
    if (hidden > 0 && !args_given(a, "hidden")) snprintf(num, sizeof num, "%ld", hidden), rc = set_kept(a, "hidden", num);
  }
  apex_safetensors_close(st);
  return rc ? 2 : 0;
}
