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

/* The state.safetensors of the checkpoint dir/latest names (its path into path), or NULL, with no
 * message, when there is none or it is unreadable. */
static apex_safetensors *open_state(const char *dir, char *path, size_t size) {
  char sub[256] = "";
  snprintf(path, size, "%s/latest", dir);
  size_t len;
  uint8_t *lb = file_read_all(path, &len, 0);
  if (!lb) return NULL;
  snprintf(sub, sizeof sub, "%.*s", (int)(len < 200 ? len : 200), (char *)lb);
  free(lb);
  sub[strcspn(sub, "\n")] = 0;
  snprintf(path, size, "%s/%s/state.safetensors", dir, sub);
  apex_safetensors *st = apex_safetensors_open(path);
  if (!st) apex_clear_error();
  return st;
}

int from_checkpoint_val_fraction(train_args *a) {
  char path[4700];
  apex_safetensors *st = open_state(a->checkpoint, path, sizeof path);
  if (!st) return 0;
  const char *v = apex_safetensors_metadata(st, "val_fraction");
  char *end = NULL;
  double f = v ? strtod(v, &end) : 0.0;
  int rc = 0;
  if (v && (end == v || *end || !(f > 0 && f < 1))) {
    fprintf(stderr, "apex-train: %s: %s records val_fraction '%s', which is not a fraction in (0, 1)\n",
            a->eval_only ? "--eval-only" : a->sample ? "--sample" : "--resume", path, v);
    rc = 1;
  } else if (!args_given(a, "val-fraction")) {
    a->val_fraction = f;
  } else if ((float)a->val_fraction != (float)f) {
    /* The recorded value is the f32 the run used (main.c), written in its shortest digits. */
    fprintf(stderr, "apex-train: %s: checkpoint %.*s was made with --val-fraction %s%s, this run gives --val-fraction %g; drop --val-fraction (the checkpoint's split is used)\n",
            a->eval_only ? "--eval-only" : a->sample ? "--sample" : "--resume", (int)(strrchr(path, '/') - path), path, v ? v : "0", v ? "" : " (no validation split)",
            a->val_fraction);
    rc = 1;
  }
  apex_safetensors_close(st);
  return rc;
}

int from_checkpoint_fill(train_args *a) {
  char path[4700];
  apex_safetensors *st = open_state(a->checkpoint, path, sizeof path);
  if (!st) return 0;
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
