/* args.h: apex-train's command line. One table (args.c) lists every flag with its default and help;
 * parsing and --help both read it, so they never disagree. */
#ifndef APEX_TRAIN_ARGS_H
#define APEX_TRAIN_ARGS_H

#include <stdint.h>
#include <stdio.h>

#include "apex/apex.h"

typedef struct train_args {
  const char *model;        /* mlp | cnn | gpt */
  const char *data;         /* directory (IDX files) or text file; NULL = the model's default */
  const char *opt_level;    /* O0..O3 (o0..o3 accepted, as amp does, and stored upper-case) */
  const char *cast_type;    /* f16 | bf16 */
  const char *loss_scale;   /* "dynamic", a number, or NULL = the opt level's */
  const char *keep_batchnorm_fp32; /* true | false | NULL */
  const char *master_weights;      /* true | false | NULL */
  const char *optimizer;    /* any apex_optim_kind_name */
  double lr;                /* 0 = the optimizer's default for the model */
  double weight_decay;
  long batch_size;
  long epochs;
  long steps;               /* > 0: stop after this many steps from the start of training, or at the
                             * end of the epochs if that comes first (plan.h) */
  long seed;
  long threads;             /* 0 = OpenMP's default */
  const char *checkpoint;   /* directory or NULL */
  long save_every;          /* steps; 0 = at the end only */
  int resume;
  const char *log;          /* JSON-lines file or NULL */
  const char *device;       /* cpu | cuda */
  int no_capture;           /* step eagerly, never through a captured step (capture_step.h) */
  int distributed;          /* data-parallel over the ranks mpirun started (dist.h) */
  int sync_bn;              /* --distributed: batch norm statistics over every rank's batch */
  long zero;                /* --distributed: 0, or the ZeRO stage 1 or 2 (shard.h) */
  long max_bad_steps;       /* stop after this many bad steps in a row (divergence.h); 0: never */
  int help;
  int version;
  /* gpt only */
  long seq_len;
  long sample_bytes;
  const char *tokenizer;    /* directory of a GPT-2 vocab.json decoding the sample of a token file, or NULL */
  long n_layer, n_embd, n_head; /* 0 = the small default (models.h) */
  long vocab;               /* 0 = the data's (256 for bytes; 50257 or the largest token + 1) */
  /* mlp only */
  long hidden;              /* 0 = 512 (the second layer has half) */
  /* mlp and cnn */
  double val_fraction;      /* the last fraction of the training images held out for validation (dataset.h) */
  /* training knobs (schedule.h) */
  const char *lr_schedule;  /* linear | cosine | constant */
  long warmup;              /* steps of linear warmup */
  double clip_grad_norm;    /* 0 = no clipping */
  long grad_accum;          /* micro-batches per optimizer step */
  const char *init_from;    /* safetensors file of initial weights, or NULL */
  /* evaluation (evaluate.h) */
  long eval_every;          /* steps; 0 = at the end only */
  int eval_only;            /* evaluate the checkpoint in --checkpoint, no training */
  int sample;               /* gpt: generate from the checkpoint in --checkpoint, no training */
  uint64_t given;           /* the flags on the command line, one bit per entry of args.c's table */
} train_args;

/* Fills defaults, then parses argv (-h is --help). On a bad flag or value, or a gpt-only flag given
 * for another model, prints one line to stderr and returns non-zero (the exit code to use). */
int args_parse(int argc, char **argv, train_args *a);
/* 1 when the flag NAME (without --) was on the command line. */
int args_given(const train_args *a, const char *name);
/* Sets the flag NAME to value (which must outlive a), checked as on the command line; prints one
 * line and returns non-zero when the value is not one the flag accepts. */
int args_set(train_args *a, const char *name, const char *value);
/* The refusal of a flag for one model given for another, once the model is known (args_parse
 * leaves it for --eval-only and --sample without --model, whose model the checkpoint names). */
int args_check_model(const train_args *a);
/* Prints every flag with its default and meaning, the rule that ends training and the exit statuses. */
void args_usage(FILE *out);

#endif
