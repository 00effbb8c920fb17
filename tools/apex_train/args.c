/* args.c: the flag table, parsing (--flag value and --flag=value) and --help. Every bad input is one
 * line on stderr naming the flag and what it accepts. */
#include "args.h"

#include "divergence.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef enum { T_STR, T_LONG, T_DOUBLE, T_SWITCH } flag_type;

typedef struct {
  const char *name;
  flag_type type;
  size_t offset;           /* into train_args */
  const char *def;         /* default as text ("" = none) */
  const char *choices;     /* space-separated accepted values, or NULL */
  long min;                /* T_LONG: smallest accepted */
  const char *help;
} flag;

#define F(field) offsetof(train_args, field)
#define STR_(x) #x
#define STR(x) STR_(x)

static const flag flags[] = {
    {"model", T_STR, F(model), "cnn", "mlp cnn gpt", 0, "model to train"},
    {"data", T_STR, F(data), "", NULL, 0,
     "data: a directory of IDX image/label files in the MNIST layout (default: Fashion-MNIST in "
     "/usr/share/datasets/fashion-mnist) or, for gpt, any file read as bytes or an llm.c .bin of uint16 tokens "
     "(default /usr/share/common-licenses/GPL-3)"},
    {"opt-level", T_STR, F(opt_level), "O1", "O0 O1 O2 O3", 0, "amp optimization level"},
    {"cast-type", T_STR, F(cast_type), "f16", "f16 bf16", 0, "low-precision type of O1-O3"},
    {"loss-scale", T_STR, F(loss_scale), "", NULL, 0, "dynamic, or a static scale > 0 (default: the opt level's; none with bf16)"},
    {"keep-batchnorm-fp32", T_STR, F(keep_batchnorm_fp32), "", "true false", 0, "override (default: the opt level's)"},
    {"master-weights", T_STR, F(master_weights), "", "true false", 0, "override (default: the opt level's)"},
    {"optimizer", T_STR, F(optimizer), "adamw", "sgd adam adamw adamp lamb adadelta adagrad rmsprop rmsprop_tf novograd", 0,
     "fused optimizer"},
    {"lr", T_DOUBLE, F(lr), "0", NULL, 0, "peak learning rate, shaped by --warmup and --lr-schedule (0: 1e-3 for the Adam family, LAMB, NovoGrad and RMSprop; 3e-3 for gpt; SGD 0.05 with momentum 0.9; Adagrad 1e-2; Adadelta 1.0)"},
    {"lr-schedule", T_STR, F(lr_schedule), "linear", "linear cosine constant", 0,
     "after the warmup: linear or cosine decay to 5% of --lr at the last step, or constant"},
    {"warmup", T_LONG, F(warmup), "0", NULL, 0, "steps of linear warmup from --lr / N to --lr"},
    {"clip-grad-norm", T_DOUBLE, F(clip_grad_norm), "0", NULL, 0,
     "clip the global norm of the unscaled f32 master gradients to X before each step (0: no clipping)"},
    {"grad-accum", T_LONG, F(grad_accum), "1", NULL, 1,
     "micro-batches of --batch-size per optimizer step (amp's delay_unscale: the gradients stay scaled until the last)"},
    {"init-from", T_STR, F(init_from), "", NULL, 0,
     "start from the weights in FILE.safetensors (state-dict names; every name and shape must match the model), or, for gpt, a Hugging Face "
     "GPT2LMHeadModel's model.safetensors, whose sizes and vocabulary are the model's"},
    {"eval-every", T_LONG, F(eval_every), "0", NULL, 0,
     "evaluate every N steps: validation loss and accuracy (mlp, cnn; the test set's with --val-fraction 0), validation loss and "
     "perplexity (gpt); 0: at the end only"},
    {"val-fraction", T_DOUBLE, F(val_fraction), "0.1", NULL, 0,
     "mlp, cnn: hold out the last F of the training images for validation (never trained on; --eval-every reports it, "
     "the test set is evaluated at the end only); 0: no split. A resumed run keeps its checkpoint's (none for one made before this flag)"},
    {"eval-only", T_SWITCH, F(eval_only), "off", NULL, 0, "evaluate the checkpoint in --checkpoint and exit, no training (its configuration comes from the checkpoint)"},
    {"sample", T_SWITCH, F(sample), "off", NULL, 0, "gpt: generate --sample-bytes from the checkpoint in --checkpoint and exit"},
    {"weight-decay", T_DOUBLE, F(weight_decay), "0", NULL, 0, "weight decay"},
    {"batch-size", T_LONG, F(batch_size), "", NULL, 1, "samples (gpt: sequences) per step (default: 64; gpt: 16)"},
    {"epochs", T_LONG, F(epochs), "", NULL, 1,
     "passes over the training data (default: 2; gpt: 30); training ends at --epochs or --steps, whichever comes first"},
    {"steps", T_LONG, F(steps), "0", NULL, 0,
     "stop after N steps counted from the start of training, or at the end of --epochs if that comes first (0: run the epochs)"},
    {"seed", T_LONG, F(seed), "1", NULL, 0, "seed of initialisation, shuffling and dropout"},
    {"threads", T_LONG, F(threads), "0", NULL, 0, "CPU threads (0: OpenMP's default)"},
    {"checkpoint", T_STR, F(checkpoint), "", NULL, 0, "directory for checkpoints"},
    {"save-every", T_LONG, F(save_every), "0", NULL, 0, "save a checkpoint every N steps (0: at the end only)"},
    {"resume", T_SWITCH, F(resume), "off", NULL, 0, "continue from the checkpoint in --checkpoint (with --distributed on any number of ranks that keeps the global batch, "
     "ranks x --batch-size)"},
    {"log", T_STR, F(log), "", NULL, 0, "write JSON lines (step, epoch, loss, loss_scale, skipped, step_skipped, lr, grad_norm, samples_per_s, "
     "gpt: tokens_per_s, ms_per_step, elapsed_s; with --eval-every also step, eval_loss, eval_accuracy (the validation split's) "
     "or gpt: eval_perplexity, and at the end of a split run step, test_loss, test_accuracy; "
     "Inf and NaN as null) to FILE, and at the end its loss curve to FILE's name with .svg (see `apex-train plot -h`)"},
    {"device", T_STR, F(device), "cpu", "cpu cuda", 0, "where to train"},
    {"no-capture", T_SWITCH, F(no_capture), "off", NULL, 0,
     "run every step eagerly instead of capturing it: by default the first step is captured (on a GPU one CUDA graph "
     "that each later step replays; on the CPU the same calls run each step) and the checkpoints are the eager run's, byte for "
     "byte; --distributed, --zero and --clip-grad-norm step eagerly anyway (they agree on an overflow, or compute the clip "
     "coefficient, on the host)"},
    {"distributed", T_SWITCH, F(distributed), "off", NULL, 0,
     "data-parallel training on the ranks of `mpirun -np N`: each rank trains on its shard of every step, --batch-size "
     "is per rank (the global batch is N times it)"},
    {"sync-bn", T_SWITCH, F(sync_bn), "off", NULL, 0, "--distributed: batch norm statistics over every rank's batch (SyncBatchNorm)"},
    {"zero", T_LONG, F(zero), "0", NULL, 0,
     "--distributed: shard the optimizer over the ranks (ZeRO): 1 the f32 masters and optimizer state, 2 also the reduced "
     "gradients; each rank holds 1/N of the state (0: off, every rank holds all of it)"},
    {"max-bad-steps", T_LONG, F(max_bad_steps), STR(DIVERGENCE_DEFAULT_MAX_BAD), NULL, 0,
     "stop (exit 3) when this many steps in a row had a non-finite loss or were skipped for an overflow, or at once when "
     "one overflows at the minimum loss scale (0: never)"},
    {"seq-len", T_LONG, F(seq_len), "64", NULL, 2, "gpt: tokens per sequence (at most 1024)"},
    {"n-layer", T_LONG, F(n_layer), "", NULL, 1, "gpt: transformer blocks (default: 2)"},
    {"n-embd", T_LONG, F(n_embd), "", NULL, 1, "gpt: embedding width, a multiple of --n-head (default: 64)"},
    {"n-head", T_LONG, F(n_head), "", NULL, 1, "gpt: attention heads (default: 4; with a Hugging Face --init-from, width / 64, GPT-2's head width)"},
    {"vocab", T_LONG, F(vocab), "", NULL, 2,
     "gpt: the model's vocabulary, above every token of the data (default: 256 for bytes; for an llm.c .bin 50257, or its largest token + 1)"},
    {"hidden", T_LONG, F(hidden), "", NULL, 2, "mlp: width of the first hidden layer; the second has half (default: 512)"},
    {"sample-bytes", T_LONG, F(sample_bytes), "200", NULL, 0, "gpt: tokens to generate at the end (bytes for text data)"},
    {"tokenizer", T_STR, F(tokenizer), "", NULL, 0,
     "gpt on a token file: print the sample as text, decoded with the GPT-2 byte-level BPE vocabulary DIR/vocab.json (a Hugging Face "
     "tokenizer's directory); without it the sample is token ids"},
    {"help", T_SWITCH, F(help), "off", NULL, 0, "print this list and exit (also -h)"},
    {"version", T_SWITCH, F(version), "off", NULL, 0, "print apex-train's and the apex library's versions and exit"},
};
#define NFLAGS (sizeof flags / sizeof flags[0])
_Static_assert(NFLAGS <= 64, "train_args.given has one bit per flag");

/* Flags that only one model reads: refused for the others rather than silently ignored. */
static const struct {
  const char *flag, *model;
} model_only[] = {{"seq-len", "gpt"}, {"sample-bytes", "gpt"}, {"n-layer", "gpt"}, {"n-embd", "gpt"},
                  {"n-head", "gpt"},  {"sample", "gpt"}, {"vocab", "gpt"},       {"hidden", "mlp"},
                  {"tokenizer", "gpt"}};

/* The model flag f is for, or NULL when any model reads it. */
static const char *model_of(const flag *f) {
  for (size_t i = 0; i < sizeof model_only / sizeof model_only[0]; i++)
    if (strcmp(f->name, model_only[i].flag) == 0) return model_only[i].model;
  return NULL;
}

static int in_choices(const char *value, const char *choices) {
  size_t n = strlen(value);
  for (const char *c = choices; *c;) {
    const char *end = strchr(c, ' ');
    size_t len = end ? (size_t)(end - c) : strlen(c);
    if (len == n && strncmp(c, value, n) == 0) return 1;
    c += len + (end ? 1 : 0);
  }
  return 0;
}

static int set_value(train_args *a, const flag *f, const char *value) {
  char *field = (char *)a + f->offset;
  char *end;
  switch (f->type) {
  case T_STR:
    if (f->offset == F(opt_level) && (value[0] == 'o' || value[0] == 'O') && value[1] >= '0' && value[1] <= '3' && !value[2]) {
      /* amp takes o1 as O1; one spelling goes into the checkpoint's identity. */
      static const char *const levels[] = {"O0", "O1", "O2", "O3"};
      value = levels[value[1] - '0'];
    }
    if (f->choices && !in_choices(value, f->choices)) {
      fprintf(stderr, "apex-train: --%s: '%s' is not one of: %s\n", f->name, value, f->choices);
      return 2;
    }
    *(const char **)field = value;
    return 0;
  case T_LONG: {
    errno = 0;
    long v = strtol(value, &end, 10);
    if (errno || end == value || *end || v < f->min) {
      fprintf(stderr, "apex-train: --%s: '%s' is not a whole number >= %ld\n", f->name, value, f->min);
      return 2;
    }
    *(long *)field = v;
    return 0;
  }
  case T_DOUBLE: {
    errno = 0;
    double v = strtod(value, &end);
    if (errno || end == value || *end || !(v >= 0) || v > 1e30) {
      fprintf(stderr, "apex-train: --%s: '%s' is not a number >= 0\n", f->name, value);
      return 2;
    }
    *(double *)field = v;
    return 0;
  }
  case T_SWITCH: *(int *)field = 1; return 0;
  }
  return 2;
}

static void set_defaults(train_args *a) {
  memset(a, 0, sizeof *a);
  for (size_t i = 0; i < NFLAGS; i++) {
    const flag *f = &flags[i];
    if (f->type == T_SWITCH || !f->def[0]) continue;
    set_value(a, f, f->def);
  }
}

/* --loss-scale and the booleans have values that the table's choices cannot describe alone. */
static int check_values(const train_args *a) {
  if (a->loss_scale && strcmp(a->loss_scale, "dynamic") != 0) {
    char *end;
    double v = strtod(a->loss_scale, &end);
    if (end == a->loss_scale || *end || !(v > 0) || v > 3.4e38) {
      fprintf(stderr, "apex-train: --loss-scale: '%s' is neither 'dynamic' nor a number > 0\n", a->loss_scale);
      return 2;
    }
  }
  if (a->save_every > 0 && !a->checkpoint) {
    fprintf(stderr, "apex-train: --save-every needs --checkpoint DIR\n");
    return 2;
  }
  if (a->sync_bn && !a->distributed) {
    fprintf(stderr, "apex-train: --sync-bn needs --distributed\n");
    return 2;
  }
  if (a->zero != 0 && a->zero != 1 && a->zero != 2) {
    fprintf(stderr, "apex-train: --zero %ld: use 1 (shard the optimizer state) or 2 (also the gradients); stage 3 is not implemented\n", a->zero);
    return 2;
  }
  if (a->zero && !a->distributed) {
    fprintf(stderr, "apex-train: --zero needs --distributed (it shards the optimizer over the ranks of mpirun)\n");
    return 2;
  }
  if ((a->eval_only || a->sample) && !a->checkpoint) {
    fprintf(stderr, "apex-train: --%s needs --checkpoint DIR (the run to load)\n", a->eval_only ? "eval-only" : "sample");
    return 2;
  }
  if (a->eval_only && a->sample) {
    fprintf(stderr, "apex-train: --eval-only and --sample are two runs; give one\n");
    return 2;
  }
  if (a->resume && a->init_from) {
    fprintf(stderr, "apex-train: --init-from starts a new run; --resume continues one: give one\n");
    return 2;
  }
  /* DDP would reduce the gradients after every micro-batch: refused rather than trusted untested. */
  if (a->grad_accum > 1 && a->distributed) {
    fprintf(stderr, "apex-train: --grad-accum with --distributed is not supported; use a larger --batch-size or more ranks\n");
    return 2;
  }
  if (a->clip_grad_norm > 0 && !(a->clip_grad_norm < 3.4e38)) {
    fprintf(stderr, "apex-train: --clip-grad-norm: %g is not a finite float\n", a->clip_grad_norm);
    return 2;
  }
  if (a->val_fraction >= 1) {
    fprintf(stderr, "apex-train: --val-fraction %g: the share of the training images held out for validation must be below 1 (0: no split)\n",
            a->val_fraction);
    return 2;
  }
  if (a->resume && !a->checkpoint) {
    fprintf(stderr, "apex-train: --resume needs --checkpoint DIR\n");
    return 2;
  }
  return 0;
}

int args_parse(int argc, char **argv, train_args *a) {
  set_defaults(a);
  const flag *model_flag = NULL; /* a flag for one model only, given */
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (strcmp(arg, "-h") == 0) arg = "--help";
    if (strncmp(arg, "--", 2) != 0) {
      fprintf(stderr, "apex-train: unexpected argument '%s' (flags start with --; see --help)\n", arg);
      return 2;
    }
    const char *name = arg + 2, *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    const flag *f = NULL;
    for (size_t k = 0; k < NFLAGS; k++)
      if (strlen(flags[k].name) == len && strncmp(flags[k].name, name, len) == 0) f = &flags[k];
    if (!f) {
      fprintf(stderr, "apex-train: unknown flag --%.*s (see --help)\n", (int)len, name);
      return 2;
    }
    const char *value;
    if (f->type == T_SWITCH) {
      if (eq) {
        fprintf(stderr, "apex-train: --%s takes no value\n", f->name);
        return 2;
      }
      value = "";
    } else if (eq) {
      value = eq + 1;
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      fprintf(stderr, "apex-train: --%s needs a value\n", f->name);
      return 2;
    }
    int rc = set_value(a, f, value);
    if (rc) return rc;
    a->given |= 1ull << (f - flags);
    if (model_of(f) || f->offset == F(val_fraction)) model_flag = f;
  }
  if (a->help || a->version) return 0;
  /* --eval-only and --sample without --model: the checkpoint names the model (main.c). */
  if (model_flag && !((a->eval_only || a->sample) && !args_given(a, "model")) && args_check_model(a)) return 2;
  return check_values(a);
}

static const flag *find_flag(const char *name) {
  for (size_t k = 0; k < NFLAGS; k++)
    if (strcmp(flags[k].name, name) == 0) return &flags[k];
  return NULL;
}

int args_given(const train_args *a, const char *name) {
  const flag *f = find_flag(name);
  return f && (a->given >> (f - flags) & 1);
}

int args_set(train_args *a, const char *name, const char *value) {
  const flag *f = find_flag(name);
  return f ? set_value(a, f, value) : 2;
}

int args_check_model(const train_args *a) {
  if (args_given(a, "val-fraction") && strcmp(a->model, "gpt") == 0) {
    fprintf(stderr, "apex-train: --val-fraction is for --model mlp and cnn (the gpt holds out the last tenth of its text); drop the flag\n");
    return 2;
  }
  for (size_t k = 0; k < NFLAGS; k++) {
    const flag *f = &flags[k];
    if ((a->given >> k & 1) && model_of(f) && strcmp(a->model, model_of(f)) != 0) {
      fprintf(stderr, "apex-train: --%s is for --model %s only; this run %s %s: drop the flag\n", f->name, model_of(f),
              a->eval_only || a->sample ? "loads a" : "trains", a->model);
      return 2;
    }
  }
  return 0;
}

void args_usage(FILE *out) {
  fprintf(out, "usage: apex-train [--flag value]...\n"
               "       apex-train plot [-o OUT.svg] LOG.jsonl...   (loss curves of one or several --log files as SVG)\n"
               "       apex-train export --format hf --checkpoint DIR --out OUT   (a gpt checkpoint as a Hugging Face GPT-2)\n"
               "Trains a model with apex's mixed precision; with no flags, the CNN on Fashion-MNIST at O1.\n\n");
  for (size_t i = 0; i < NFLAGS; i++) {
    const flag *f = &flags[i];
    char left[64];
    snprintf(left, sizeof left, "--%s%s", f->name, f->type == T_SWITCH ? "" : " V");
    fprintf(out, "  %-24s %s", left, f->help);
    if (f->choices) fprintf(out, " [%s]", f->choices);
    if (f->def[0]) fprintf(out, " (default: %s)", f->def);
    fputc('\n', out);
  }
  fprintf(out, "\nTraining ends at the first limit reached: the end of --epochs, or --steps when given.\n"
               "Exit status: 0 trained; 1 failed (a message says why); 2 bad flags; 3 diverged (--max-bad-steps);\n"
               "4 stopped at once by a second Ctrl-C;\n"
               "130 stopped by Ctrl-C, 143 by SIGTERM (after the step in progress, with a checkpoint when --checkpoint is given).\n");
}
