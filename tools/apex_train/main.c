/* main.c: apex-train, the main job. Trains the CNN (or the MLP) on Fashion-MNIST or another IDX set,
 * or a GPT on a text file or llm.c tokens, with amp at any opt level and any fused optimizer;
 * checkpoints atomically and resumes bitwise; evaluates during training on held-out data (the
 * images' validation split, --val-fraction, or the GPT's held-out text) and at the end on the test
 * set too (images), generates a sample (text), and draws the loss curve next to the log.
 * `apex-train plot LOG...` (plot.h) draws logs without training; `apex-train export` (export.h) writes
 * a GPT checkpoint as a Hugging Face GPT-2.
 *
 * Everything a run does is a function of its flags: the data order comes from (seed, epoch), the
 * learning rate from the step, so --steps N stops a run where a straight run of N steps stops, and a
 * resumed run continues with the same bits. Bad input is one line on stderr and a non-zero exit,
 * before any file is written. A run stops early, with one line and its own exit status, when it
 * diverges (divergence.h) or when Ctrl-C or SIGTERM asks it to (signals.h: after the step, saving a
 * checkpoint to resume from).
 *
 * With --distributed (under mpirun) every rank runs this same program on its shard of the data; the
 * collectives are in dist.c. Setup is checked on every rank, the ranks agree that it worked
 * (dist_agree) before rank 0 writes anything, and every save is agreed the same way, so that all
 * ranks stop together. */
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "capture_step.h"
#include "checkpoint.h"
#include "dataset.h"
#include "device.h"
#include "dist.h"
#include "divergence.h"
#include "evaluate.h"
#include "export.h"
#include "from_checkpoint.h"
#include "hf_init.h"
#include "models.h"
#include "plan.h"
#include "plot.h"
#include "progress.h"
#include "report.h"
#include "schedule.h"
#include "shard.h"
#include "signals.h"
#include "step.h"
#include "tokenizer.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

enum { CPU_LIST_MAX = 4096 };

/* Whether OpenMP has places (OMP_PLACES, or OMP_PROC_BIND set): then they bound the CPUs this process's
 * threads may run on, not the main thread's mask, which binding narrows to one place; without them the
 * affinity mask that taskset, a container or mpirun's binding narrows does (apex_threads_cpus). */
static int omp_places(void) { return omp_get_num_places() > 0; }

/* One line saying how many threads this process trains on and on which CPUs, when they are fewer
 * than the machine's: a run pinned by OpenMP or mpirun, or given --threads, says where it runs. */
static void print_threads(const dist *ds) {
  long machine = sysconf(_SC_NPROCESSORS_ONLN);
  int n = apex_get_max_threads();
  if (machine > 0 && n >= machine) return;
  int ids[CPU_LIST_MAX], k = apex_threads_team_cpus(n, ids, CPU_LIST_MAX);
  char list[256];
  apex_cpus_format(ids, k < CPU_LIST_MAX ? k : CPU_LIST_MAX, list, sizeof list);
  const char *bind = omp_get_proc_bind() == omp_proc_bind_false ? "" : ", bound by OpenMP";
  printf("apex-train: %d thread%s on CPU%s %s (of the machine's %ld%s)%s\n", n, n == 1 ? "" : "s", k == 1 ? "" : "s", list, machine, bind,
         ds->on ? ", on rank 0" : "");
}

static apex_amp_flag tristate(const char *v) {
  return !v ? APEX_AMP_DEFAULT : strcmp(v, "true") == 0 ? APEX_AMP_ON : APEX_AMP_OFF;
}

static float default_lr(apex_optim_kind k, model_kind m) {
  switch (k) {
  case APEX_OPTIM_SGD: return 0.05f;
  case APEX_OPTIM_ADAGRAD: return 1e-2f;
  case APEX_OPTIM_ADADELTA: return 1.0f;
  default: return m == MODEL_GPT ? 3e-3f : 1e-3f;
  }
}

/* Everything a run makes, so that any exit frees what exists (run_free). */
typedef struct run {
  train_args a;
  apex_device dev;     /* --device: the model, its state and its graph live there */
  model_kind kind;
  const char *data;
  float lr;
  apex_optimizer *opt;  /* with --zero: only the unsharded optimizer a checkpoint loads into, until zero_wrap */
  shard zs;             /* --zero */
  apex_tensor **zvals;  /* --zero: the model's f32 values from before amp's cast, until zero_wrap */
  dataset d;
  int have_data;
  train_model tm;
  int have_model;
  apex_amp *amp;
  apex_graph *g;
  ckpt_config cc;
  ckpt_position at;
  schedule sched;
  report *rep;         /* rank 0 only */
  int created;         /* directories rank 0 made for the checkpoint (ckpt_prepare_dir) */
  double t0;           /* when this process began training */
  long saved_step;     /* the checkpoint latest names, or -1 */
  divergence dv;
  int diverged;        /* stopped by the bad-step rule */
  int stop_signal;     /* stopped by SIGINT or SIGTERM */
  tokenizer tok;       /* --tokenizer: the sample's decoding */
  int have_tok;
} run;

static void run_free(run *r) {
  report_destroy(r->rep);
  apex_graph_destroy(r->g); /* before the DDP (dist_free): it holds the DDP's hook */
  apex_amp_destroy(r->amp);
  apex_optimizer_destroy(r->opt);
  shard_free(&r->zs);
  if (r->have_model) shard_snapshot_free(r->zvals, &r->tm);
  if (r->have_model) model_free(&r->tm);
  if (r->have_data) dataset_free(&r->d);
  if (r->have_tok) tokenizer_free(&r->tok);
}

/* The flags' checks that need no data: amp's configuration and the optimizer. */
static int check_flags(run *r) {
  train_args *a = &r->a;
  int rc = device_open(a->device, &r->dev);
  if (rc) return rc;
  /* More threads than CPUs gains nothing, and tens of thousands exhaust the memory for stacks. */
  int ids[CPU_LIST_MAX];
  long cpus = apex_threads_cpus(ids, CPU_LIST_MAX);
  if (a->threads > cpus) {
    char list[128];
    apex_cpus_format(ids, cpus < CPU_LIST_MAX ? (int)cpus : CPU_LIST_MAX, list, sizeof list);
    char range[32] = "1";
    if (cpus > 1) snprintf(range, sizeof range, "1 to %ld", cpus);
    fprintf(stderr, "apex-train: --threads %ld: this process runs %ld thread%s at once (%s CPU%s %s); give %s, or 0 for OpenMP's default\n",
            a->threads, cpus, cpus == 1 ? "" : "s", omp_places() ? "OpenMP's places hold" : "its affinity mask holds", cpus == 1 ? "" : "s",
            list, range);
    return 2;
  }
  if (a->threads > 0 && apex_set_num_threads((int)a->threads) != APEX_OK) {
    fprintf(stderr, "apex-train: --threads %ld: %s\n", a->threads, one_line(apex_last_error()));
    return 2;
  }
  r->kind = strcmp(a->model, "mlp") == 0 ? MODEL_MLP : strcmp(a->model, "cnn") == 0 ? MODEL_CNN : MODEL_GPT;
  if (a->epochs == 0) a->epochs = r->kind == MODEL_GPT ? 30 : 2;
  if (a->batch_size == 0) a->batch_size = r->kind == MODEL_GPT ? 16 : 64;
  r->data = a->data ? a->data : r->kind == MODEL_GPT ? DEFAULT_TEXT_FILE : DEFAULT_FMNIST_DIR;
  if (r->kind == MODEL_GPT) {
    if (a->seq_len > 1024) {
      fprintf(stderr, "apex-train: --seq-len %ld: at most 1024\n", a->seq_len);
      return 2;
    }
    long embd = a->n_embd ? a->n_embd : 64, head = a->n_head ? a->n_head : 4;
    if (embd % head && !hf_is_file(a->init_from)) { /* a Hugging Face GPT-2's width is the file's (hf_init.h) */
      fprintf(stderr, "apex-train: --n-embd %ld is not a multiple of --n-head %ld\n", embd, head);
      return 2;
    }
  }
  return 0;
}

/* Loads the data (this rank's shard), builds the model, amp and the optimizer, and resumes: the
 * same on every rank. One line on stderr and non-zero on failure. */
static int setup(run *r, dist *ds) {
  train_args *a = &r->a;
  apex_amp_config acfg = {
      .opt_level = a->opt_level,
      .half_type = strcmp(a->cast_type, "bf16") == 0 ? APEX_AMP_CAST_BF16 : APEX_AMP_CAST_F16,
      .keep_batchnorm_fp32 = tristate(a->keep_batchnorm_fp32),
      .master_weights = tristate(a->master_weights),
      .loss_scale = !a->loss_scale ? 0.0f : strcmp(a->loss_scale, "dynamic") == 0 ? APEX_AMP_DYNAMIC : (float)atof(a->loss_scale),
  };
  apex_amp_properties props;
  if (apex_amp_resolve(&acfg, &props) != APEX_OK) {
    fprintf(stderr, "apex-train: %s\n", one_line(apex_last_error()));
    return 2;
  }
  if (a->zero && r->dev != APEX_DEVICE_CPU) {
    fprintf(stderr, "apex-train: --zero trains on the CPU for now; leave out --device cuda or --zero\n");
    return 2;
  }
  if (a->zero && props.cast_model && !props.master_weights) {
    fprintf(stderr, "apex-train: --zero keeps f32 masters of the %s parameters: not with %s (use O2, or leave out --zero)\n",
            a->cast_type, strcmp(a->opt_level, "O3") == 0 ? "O3" : "--master-weights off");
    return 2;
  }
  if (a->zero && a->init_from) {
    fprintf(stderr, "apex-train: --zero with --init-from is not supported yet: start the run without --zero and resume its checkpoint with it\n");
    return 2;
  }
  apex_optim_kind okind;
  apex_optim_kind_parse(a->optimizer, &okind); /* the table admits only valid names */
  r->lr = a->lr > 0 ? (float)a->lr : default_lr(okind, r->kind);
  apex_optim_options oo = {.lr = r->lr, .weight_decay = (float)a->weight_decay};
  if (a->lr == 0 && okind == APEX_OPTIM_SGD) oo.momentum = 0.9f;
  r->opt = apex_optimizer_create(okind, &oo);
  if (!r->opt) {
    fprintf(stderr, "apex-train: --optimizer %s: %s\n", a->optimizer, one_line(apex_last_error()));
    return 2;
  }

  /* The split from the f32 that the checkpoint records (ckpt_config_add_float): a resumed run holds
   * out the same images. */
  int lrc = r->kind == MODEL_GPT ? dataset_load_text(&r->d, r->data, a->batch_size, a->seq_len, ds->rank, ds->world)
                                 : dataset_load_images(&r->d, r->data, a->batch_size, ds->rank, ds->world, (double)(float)a->val_fraction);
  if (lrc) return lrc;
  r->have_data = 1;
  if (r->kind == MODEL_GPT && a->vocab > 0) {
    /* A smaller head for token files whose ids are all small (GPT-2's 50257 is the default). */
    uint16_t mx = 0;
    for (size_t i = 0; i < r->d.len + r->d.val_len; i++)
      if (r->d.tok[i] > mx) mx = r->d.tok[i];
    if (mx >= a->vocab) {
      fprintf(stderr, "apex-train: --vocab %ld: %s has token %u; give at least %u\n", a->vocab, r->data, (unsigned)mx, (unsigned)mx + 1);
      return 2;
    }
    r->d.vocab = a->vocab;
  }
  /* An optimizer step takes --grad-accum micro-batches; an epoch is whole steps. */
  if (a->grad_accum > 1) {
    if (r->d.steps_per_epoch < (size_t)a->grad_accum) {
      fprintf(stderr, "apex-train: --grad-accum %ld x --batch-size %ld is more than an epoch of %s (%zu batches)\n", a->grad_accum,
              a->batch_size, r->data, r->d.steps_per_epoch);
      return 1;
    }
    r->d.steps_per_epoch /= (size_t)a->grad_accum;
  }
  model_dims dims = {.in_h = r->d.in_h, .in_w = r->d.in_w, .classes = r->d.classes, .hidden = a->hidden, .vocab = r->d.vocab,
                     .n_layer = a->n_layer, .n_embd = a->n_embd, .n_head = a->n_head, .seq_len = a->seq_len, .device = r->dev};
  int hf = 0, rc = a->init_from ? hf_init_dims(a, r->kind, r->data, &r->d, &dims, &hf) : 0;
  if (rc) return rc;
  if (model_build(&r->tm, r->kind, (uint64_t)a->seed, &dims) != 0) {
    fprintf(stderr, "apex-train: cannot build the %s: %s\n", a->model, one_line(apex_last_error()));
    return 1;
  }
  r->have_model = 1;
  if (a->tokenizer) {
    if (r->d.bytes) {
      fprintf(stderr, "apex-train: --tokenizer decodes the tokens of an llm.c .bin file; %s is read as bytes, and its sample prints as text already\n",
              r->data);
      return 2;
    }
    if ((rc = tokenizer_load(a->tokenizer, &r->tok)) != 0) return rc;
    r->have_tok = 1;
    if (r->tok.n < r->tm.vocab) {
      fprintf(stderr, "apex-train: --tokenizer: %s/vocab.json has %lld tokens, fewer than the model's vocabulary of %lld: is it the tokenizer the data was made with?\n",
              a->tokenizer, (long long)r->tok.n, (long long)r->tm.vocab);
      return 2;
    }
  }
  size_t np = apex_model_num_params(r->tm.m);
  apex_tensor **pv = malloc(np * sizeof *pv), **gv = malloc(np * sizeof *gv);
  int made = pv && gv;
  for (size_t i = 0; made && i < np; i++) {
    pv[i] = apex_var_value(apex_model_param(r->tm.m, i, NULL));
    gv[i] = apex_var_grad(apex_model_param(r->tm.m, i, NULL));
  }
  if (a->zero) {
    /* amp manages no optimizer: the masters start from the values before its cast (shard.h). The
     * sharded optimizer is made after the ranks agree (zero_wrap); until then r->opt is the unsharded
     * optimizer a checkpoint loads into. */
    apex_optimizer_destroy(r->opt);
    r->opt = NULL;
    r->zs.kind = okind, r->zs.oo = oo, r->zs.stage = (int)a->zero;
    made = made && (r->zvals = shard_snapshot(&r->tm)) != NULL && apex_amp_initialize(&r->tm.m, 1, NULL, 0, &acfg, &r->amp) == APEX_OK &&
           (r->opt = shard_full(&r->zs, &r->tm)) != NULL;
  } else {
    made = made && apex_optimizer_add_group(r->opt, pv, (int)np, gv, (int)np, NULL, NULL) == APEX_OK &&
           apex_amp_initialize(&r->tm.m, 1, &r->opt, 1, &acfg, &r->amp) == APEX_OK;
  }
  free(pv);
  free(gv);
  if (!made) {
    fprintf(stderr, "apex-train: %s\n", one_line(apex_last_error()));
    return 1;
  }
  /* After amp: the f32 masters (O2) get the file's values too. Every name and shape is checked
   * before anything is written. */
  if (hf) {
    if (hf_init_load(a, &r->tm, r->amp) != 0) return 1;
  } else if (a->init_from && apex_model_load_f32(r->tm.m, r->amp, a->init_from) != APEX_OK) {
    fprintf(stderr, "apex-train: --init-from %s: %s\n", a->init_from, one_line(apex_last_error()));
    return 1;
  }
  if (a->sync_bn && dist_sync_bn(ds, &r->tm, a->model) != 0) return 2;
  r->g = apex_graph_create_on(r->dev);
  if (!r->g || apex_amp_prepare_graph(r->amp, r->g) != APEX_OK) {
    fprintf(stderr, "apex-train: %s\n", one_line(apex_last_error()));
    return 1;
  }

  ckpt_config *cc = &r->cc;
  ckpt_config_add(cc, "model", "%s", a->model);
  ckpt_config_add(cc, "opt_level", "%s", a->opt_level);
  ckpt_config_add(cc, "cast_type", "%s", a->cast_type);
  ckpt_config_add(cc, "loss_scale", "%s", a->loss_scale ? a->loss_scale : "default");
  ckpt_config_add(cc, "keep_batchnorm_fp32", "%s", a->keep_batchnorm_fp32 ? a->keep_batchnorm_fp32 : "default");
  ckpt_config_add(cc, "master_weights", "%s", a->master_weights ? a->master_weights : "default");
  ckpt_config_add(cc, "optimizer", "%s", a->optimizer);
  ckpt_config_add_float(cc, "lr", r->lr);
  ckpt_config_add_float(cc, "weight_decay", (float)a->weight_decay);
  ckpt_config_add(cc, "batch_size", "%ld", a->batch_size);
  ckpt_config_add(cc, "epochs", "%ld", a->epochs);
  ckpt_config_add(cc, "seed", "%ld", a->seed);
  ckpt_config_add(cc, "seq_len", "%ld", r->kind == MODEL_GPT ? a->seq_len : 0L);
  /* The world size fixes the data each step sees (the global batch and the shards). */
  ckpt_config_add(cc, "world_size", "%d", ds->world);
  ckpt_config_add(cc, "sync_bn", "%s", a->sync_bn ? "on" : "off");
  /* The training knobs, and the model size that the parameter shapes do not show. */
  ckpt_config_add(cc, "lr_schedule", "%s", a->lr_schedule);
  ckpt_config_add(cc, "warmup", "%ld", a->warmup);
  ckpt_config_add_float(cc, "clip_grad_norm", (float)a->clip_grad_norm);
  ckpt_config_add(cc, "grad_accum", "%ld", a->grad_accum);
  ckpt_config_add(cc, "n_head", "%ld", r->kind == MODEL_GPT ? (long)r->tm.n_head : 0L);
  /* Only a split is recorded: a checkpoint without one (older ones included) trained on every image. */
  if (r->kind != MODEL_GPT && r->d.n_val > 0) ckpt_config_add_float(cc, "val_fraction", (float)a->val_fraction);
  schedule_parse(a->lr_schedule, &r->sched.kind); /* the flag table admits only valid names */
  r->sched.peak = r->lr;
  r->sched.warmup = a->warmup;
  /* The schedule ends at the run's last step: the first limit reached of --epochs and --steps. A
   * resumed run keeps its checkpoint's end (one without lr_schedule_total ends at the epochs'). */
  long epochs_end = a->epochs * (long)r->d.steps_per_epoch;
  r->sched.total = plan_last_step(a, (long)r->d.steps_per_epoch);
  if (a->checkpoint) {
    if ((a->eval_only || a->sample) && !ckpt_exists(a->checkpoint)) {
      fprintf(stderr, "apex-train: --%s: no checkpoint in %s (no latest file); train with --checkpoint %s first\n",
              a->eval_only ? "eval-only" : "sample", a->checkpoint, a->checkpoint);
      return 1;
    }
    if (a->eval_only || a->sample) return ckpt_load(a->checkpoint, &r->tm, r->amp, r->opt, cc, &r->at);
    if (a->resume) {
      if (ckpt_load(a->checkpoint, &r->tm, r->amp, r->opt, cc, &r->at) != 0) return 1;
      r->sched.total = r->at.lr_total > 0 ? r->at.lr_total : epochs_end;
      r->saved_step = r->at.step;
      return plan_check_resume(a, (long)r->d.steps_per_epoch, r->at.step);
    }
    if (ckpt_exists(a->checkpoint)) {
      fprintf(stderr, "apex-train: --checkpoint %s already holds a checkpoint; add --resume to continue it, or choose another directory\n",
              a->checkpoint);
      return 1;
    }
  }
  return 0;
}

/* Rank 0's outputs: the checkpoint directory and the log. */
static int open_outputs(run *r) {
  if (r->a.checkpoint && ckpt_prepare_dir(r->a.checkpoint, &r->created) != 0) return 1;
  r->rep = report_create(stdout, r->a.log, r->a.resume);
  return r->rep ? 0 : 1;
}

/* Collective: with --zero, every rank's shard in one unsharded optimizer (destroy it); NULL without
 * --zero, and with a message on failure. */
static apex_optimizer *zero_full(run *r) {
  if (!r->zs.z) return NULL;
  apex_optimizer *f = apex_zero_consolidate(r->zs.z);
  if (!f) fprintf(stderr, "apex-train: --zero: %s\n", one_line(apex_last_error()));
  return f;
}

/* Collective, after the ranks agree on their setup: --zero's sharded optimizer (masters from the
 * values before amp's cast), which takes the loaded checkpoint's state when there is one. */
static int zero_wrap(run *r, dist *ds) {
  if (shard_create(&r->zs, ds->pg, &r->tm, r->g, r->zvals, r->zs.kind, &r->zs.oo, r->zs.stage) != 0) return 1;
  shard_snapshot_free(r->zvals, &r->tm);
  r->zvals = NULL;
  int loaded = r->a.resume || r->a.eval_only || r->a.sample;
  if (loaded && apex_zero_load_state(r->zs.z, r->opt) != APEX_OK) {
    fprintf(stderr, "apex-train: --zero: %s\n", one_line(apex_last_error()));
    return 1;
  }
  apex_optimizer_destroy(r->opt);
  r->opt = NULL;
  return 0;
}

/* Collective: rank 0 saves the state after `step` steps (with rank 0's batch norm statistics on
 * every rank: dist_sync_buffers); every rank learns whether the save worked. */
static int save(run *r, dist *ds, long step) {
  long spe = (long)r->d.steps_per_epoch;
  int failed = dist_sync_buffers(ds, &r->tm);
  /* --zero: the shards gathered into the unsharded optimizer, whose files every run reads. */
  apex_optimizer *full = zero_full(r);
  if (r->zs.z && !full) failed = 1;
  if (!failed && ds->rank == 0) {
    ckpt_position p = {step, step / spe, step % spe, r->at.elapsed_s + (now_s() - r->t0),
                       /* a constant schedule has no end to record */
                       r->sched.kind != SCHEDULE_CONSTANT && r->sched.total != r->a.epochs * spe ? r->sched.total : 0};
    failed = ckpt_save(r->a.checkpoint, &r->tm, r->amp, full ? full : r->opt, &r->cc, &p) != 0;
  }
  apex_optimizer_destroy(full);
  if (apex_pg_allreduce_flag(ds->pg, &failed) != APEX_OK) failed = 1;
  if (!failed) r->saved_step = step;
  return failed;
}

/* Collective: the evaluation after `step` steps, printed and logged by rank 0. */
static int eval_point(run *r, dist *ds, long step) {
  eval_result e;
  /* Images: the validation split where there is one (the test set waits for the end). */
  int val = r->kind != MODEL_GPT && r->d.n_val > 0;
  if (dist_sync_buffers(ds, &r->tm) != 0) return 1;
  if (evaluate(&r->tm, r->amp, r->g, &r->d, ds, val ? EVAL_VALIDATION : EVAL_TEST, &e) != 0) {
    fprintf(stderr, "apex-train: evaluation failed: %s\n", one_line(apex_last_error()));
    return 1;
  }
  int failed = 0;
  if (ds->rank == 0) {
    char line[160];
    if (r->kind == MODEL_GPT) snprintf(line, sizeof line, "apex-train: step %ld: validation loss %.4f perplexity %.2f", step, e.loss, e.perplexity);
    else snprintf(line, sizeof line, "apex-train: step %ld: %s loss %.4f accuracy %.4f", step, val ? "validation" : "test", e.loss, e.accuracy);
    if (r->rep) {
      report_message(r->rep, "%s", line);
      failed = report_eval(r->rep, step, r->kind == MODEL_GPT, &e) != 0;
    }
  }
  /* A log that cannot be written stops every rank at the same step. */
  if (apex_pg_allreduce_flag(ds->pg, &failed) != APEX_OK) failed = 1;
  return failed;
}

/* Collective: a --save-every save after `step`, with one line saying so; withheld when the step's loss
 * is not finite, so that a diverging run never replaces the last good checkpoint (said once per
 * streak: *withheld). Non-zero when the save failed. */
static int save_every(run *r, dist *ds, long step, int *withheld) {
  if (divergence_loss_bad(&r->dv)) {
    if (r->rep && !*withheld)
      report_message(r->rep, "apex-train: step %ld not saved: its loss is not finite; saves go on at the next step whose loss is", step);
    *withheld = 1;
    return 0;
  }
  if (save(r, ds, step) != 0) return 1;
  if (r->rep) report_message(r->rep, "apex-train: checkpoint %s/step-%ld", r->a.checkpoint, step);
  *withheld = 0;
  return 0;
}

/* Collective: whether any rank was asked to stop by a signal (SIGTERM over SIGINT) or failed to
 * write the log, so that all ranks stop at the same step. */
static int agree_stop(dist *ds, int *sig, int *log_failed) {
  if (!ds->on) return 0;
  double v[3] = {*sig == SIGINT, *sig == SIGTERM, *log_failed};
  if (dist_sum(ds, v, 3) != 0) return 1;
  *sig = v[1] > 0 ? SIGTERM : v[0] > 0 ? SIGINT : 0;
  *log_failed = v[2] > 0;
  return 0;
}

/* Trains from r->at to the end (or --steps); returns the steps reached via *end. Non-zero on failure. */
static int train(run *r, dist *ds, long *end) {
  train_args *a = &r->a;
  long spe = (long)r->d.steps_per_epoch;
  long stop = plan_last_step(a, spe);
  int64_t B = a->batch_size, T = a->seq_len;
  step_ctx sc = {.tm = &r->tm, .amp = r->amp, .opt = r->opt, .zs = r->zs.z ? &r->zs : NULL, .g = r->g, .d = &r->d,
                 .bo = r->zs.z ? &r->zs.bo : dist_backward_options(ds), .dev = r->dev,
                 .B = B, .T = T, .accum = a->grad_accum, .clip = (float)a->clip_grad_norm};
  apex_loss_scaler *scaler = apex_amp_loss_scaler(r->amp, 0);
  double t0 = r->t0 = now_s();
  progress_rate rate = {0};
  progress_rate_push(&rate, t0);
  r->dv.max_bad = a->max_bad_steps;
  long first = r->at.step, s = r->at.step;
  int withheld = 0; /* a --save-every save was skipped for a non-finite loss */
  long K = a->grad_accum; /* micro-batches per step */
  int failed = step_ctx_alloc(&sc) != 0;
  if (failed) fprintf(stderr, "apex-train: out of memory for the batch\n");
  /* The step is captured once and replayed (capture_step.h) unless the run needs the host inside it. */
  const char *eager_why = captured_step_refusal(a);
  captured_step cap = {0};
  if (!failed && !eager_why) failed = captured_step_init(&cap, &sc, r->rep && a->log) != 0;
  for (; !failed && s < stop; s++) {
    long epoch = s / spe, pos = s % spe;
    if (dataset_order(&r->d, (uint64_t)a->seed, epoch) != 0) {
      fprintf(stderr, "apex-train: out of memory for the data order\n");
      failed = 1;
      break;
    }
    float lr = schedule_lr(&r->sched, s);
    if (r->zs.z) apex_zero_set_lr(r->zs.z, lr);
    else apex_optimizer_set_lr(r->opt, 0, lr);
    step_result res;
    int captured = !eager_why && !cap.eager;
    if ((captured ? captured_step_run(&cap, pos, s + 1, &res) : train_step(&sc, pos, s + 1, &res)) != 0) {
      failed = 1;
      break;
    }
    double lv = res.loss;
    /* The loss reported is the global batch's: the mean of the ranks' losses. */
    if (ds->on && dist_sum(ds, &lv, 1) != 0) {
      failed = 1;
      break;
    }
    double tnow = now_s();
    progress_rate_push(&rate, tnow);
    report_point rp = {.epoch = epoch + 1, .epochs = a->epochs, .step = s + 1, .total_steps = stop,
                       .loss = lv / ds->world, .loss_scale = apex_amp_loss_scale(r->amp, 0),
                       .skipped = (long)apex_loss_scaler_get_state(scaler).skipped, .step_skipped = res.skipped, .lr = lr,
                       .grad_norm = res.grad_norm, .step_s = progress_rate_step_s(&rate), .samples_per_step = (long)B * ds->world * K,
                       .tokens_per_step = r->kind == MODEL_GPT ? (long)(B * T) * ds->world * K : 0,
                       .elapsed_s = r->at.elapsed_s + (tnow - t0)};
    device_memory(r->dev, &rp.device_bytes, &rp.device_peak_bytes);
    if (r->zs.z) rp.optim_bytes = (double)r->zs.state_bytes;
    int log_failed = r->rep && report_step(r->rep, &rp) != 0, sig = signals_pending();
    if (agree_stop(ds, &sig, &log_failed) != 0 || log_failed) {
      failed = 1;
      s++;
      break;
    }
    if (divergence_step(&r->dv, s + 1, rp.loss, res.skipped, apex_amp_scale_at_min(r->amp, 0))) {
      r->diverged = 1;
      s++;
      break;
    }
    if (sig) {
      r->stop_signal = sig;
      s++;
      break;
    }
    if (a->eval_every > 0 && (s + 1) % a->eval_every == 0 && s + 1 < stop && eval_point(r, ds, s + 1) != 0) {
      failed = 1;
      s++;
      break;
    }
    if (a->checkpoint && a->save_every > 0 && (s + 1) % a->save_every == 0 && s + 1 < stop && save_every(r, ds, s + 1, &withheld) != 0) {
      failed = 1;
      s++;
      break;
    }
  }
  int log_failed = r->rep && report_finish(r->rep) != 0;
  if (ds->on && apex_pg_allreduce_flag(ds->pg, &log_failed) != APEX_OK) log_failed = 1;
  failed = failed || log_failed;
  double train_s = now_s() - t0;
  *end = s;
  if (!failed && !r->diverged && ds->rank == 0) {
    double per_s = train_s > 0 ? (double)(s - first) / train_s : 0.0;
    char rates[96];
    if (r->kind == MODEL_GPT)
      snprintf(rates, sizeof rates, "%.0f tokens/s, %.1f ms/step", per_s * (double)(B * T * ds->world * K), per_s > 0 ? 1e3 / per_s : 0.0);
    else
      snprintf(rates, sizeof rates, "%.0f samples/s", per_s * (double)(B * ds->world * K));
    double mem, peak;
    char gpu[64] = "";
    device_memory(r->dev, &mem, &peak);
    if (peak > 0) snprintf(gpu, sizeof gpu, ", GPU memory peak %.2f GB", peak / 1e9);
    char mode[128] = "captured step";
    if (eager_why || cap.eager) snprintf(mode, sizeof mode, "eager step (%s)", eager_why ? eager_why : "the capture failed");
    printf("apex-train: %ld steps in %.1f s (%s), %ld skipped%s, %s\n", s - first, train_s, rates,
           (long)apex_loss_scaler_get_state(scaler).skipped, gpu, mode);
  }
  captured_step_free(&cap);
  step_ctx_free(&sc);
  return failed;
}

/* Rank 0, with --log: closes the log and draws its loss curve beside it (also after a run that ended
 * badly: the curve shows how). Non-zero, with one line, when the plot cannot be written. */
static int write_plot(run *r) {
  if (!r->rep || !r->a.log) return 0;
  report_destroy(r->rep); /* closes the log: the plot reads it whole */
  r->rep = NULL;
  /* A log that is a pipe or a terminal cannot be read back: no plot. */
  struct stat sb;
  if (stat(r->a.log, &sb) != 0 || !S_ISREG(sb.st_mode)) return 0;
  char svg[4200];
  if (plot_path_for(r->a.log, svg, sizeof svg) != 0 || plot_logs(&r->a.log, 1, svg) != 0) return 1;
  printf("apex-train: loss curve %s\n", svg);
  return 0;
}

/* After training (or loading, for --eval-only and --sample): the ranks' states compared, the final
 * checkpoint, the test or validation metrics, a sample (gpt), and the loss curve next to the log. */
static int finish(run *r, dist *ds, long s) {
  train_args *a = &r->a;
  int load_only = a->eval_only || a->sample;
  int failed = dist_sync_buffers(ds, &r->tm);
  if (!failed && ds->on) {
    uint64_t h;
    apex_optimizer *full = zero_full(r);
    failed = r->zs.z && !full;
    if (!failed) failed = dist_check_identical(ds, &r->tm, r->amp, full ? full : r->opt, &h);
    apex_optimizer_destroy(full);
    if (!failed && ds->rank == 0)
      printf("apex-train: training state identical on all %d ranks (fnv1a64 %016llx)\n", ds->world, (unsigned long long)h);
  }
  if (!failed && a->checkpoint && !load_only) {
    failed = save(r, ds, s);
    if (!failed && ds->rank == 0) printf("apex-train: checkpoint %s/step-%ld\n", a->checkpoint, s);
  }
  if (failed) return 1;
  /* The handlers stay until the last save is written; a stop asked for during it ends the run
   * there (the ranks agree), after that a signal ends the process as usual. */
  signals_restore();
  int sig = signals_pending(), log_failed = 0;
  if (!load_only && agree_stop(ds, &sig, &log_failed) != 0) return 1;
  if (!load_only && sig) {
    if (ds->rank == 0) {
      if (a->checkpoint) printf("apex-train: interrupted after the last step %ld; checkpoint %s/step-%ld\n", s, a->checkpoint, s);
      else printf("apex-train: interrupted after the last step %ld; nothing saved (no --checkpoint)\n", s);
      fflush(stdout);
    }
    return signals_exit_status(sig);
  }
  if (!a->sample) {
    /* Images with a split: the validation figures (the curve's last point), then the test set's. */
    eval_result e, v;
    int val = r->kind != MODEL_GPT && r->d.n_val > 0;
    if ((val && evaluate(&r->tm, r->amp, r->g, &r->d, ds, EVAL_VALIDATION, &v) != 0) ||
        evaluate(&r->tm, r->amp, r->g, &r->d, ds, EVAL_TEST, &e) != 0) {
      fprintf(stderr, "apex-train: evaluation failed: %s\n", one_line(apex_last_error()));
      return 1;
    }
    if (ds->rank == 0) {
      if (r->kind == MODEL_GPT) {
        printf("apex-train: validation loss %.4f perplexity %.2f (%zu held-out tokens)\n", e.loss, e.perplexity, r->d.val_len);
      } else {
        if (val) printf("apex-train: validation loss %.4f accuracy %.4f (%zu held-out training images)\n", v.loss, v.accuracy, r->d.n_val);
        printf("apex-train: test loss %.4f\n", e.loss);
        printf("apex-train: test accuracy %.4f\n", e.accuracy);
      }
      /* With --eval-every the curve gets its last point (and a split run the test figures in a line
       * of their own); otherwise the log holds the steps only. */
      if (r->rep && a->eval_every > 0 &&
          (report_eval(r->rep, s, r->kind == MODEL_GPT, val ? &v : &e) != 0 || (val && report_test(r->rep, s, &e) != 0)))
        return 1;
    }
  }
  if (ds->rank == 0 && write_plot(r) != 0) return 1;
  if (r->kind == MODEL_GPT && (a->sample || !a->eval_only) && ds->rank == 0) {
    printf("apex-train: sample:\n");
    if (generate(&r->tm, r->g, (uint64_t)a->seed, a->sample_bytes, r->d.bytes, r->have_tok ? &r->tok : NULL, stdout) != 0) {
      fprintf(stderr, "apex-train: generation failed: %s\n", one_line(apex_last_error()));
      return 1;
    }
  }
  return 0;
}

/* A diverged run (divergence.h; also a last step whose loss is not finite): one line, no checkpoint
 * over the last good one, exit 3. */
static int stop_diverged(run *r, dist *ds) {
  if (ds->rank != 0) return 3;
  write_plot(r); /* a plot that fails says so; the exit stays the divergence's */
  /* Nothing saved: the directories this run made for the checkpoint go (empty ones only). */
  if (r->a.checkpoint && r->saved_step < 0 && r->created) ckpt_unprepare_dir(r->a.checkpoint, r->created);
  char why[320], kept[4300] = "no checkpoint written";
  divergence_describe(&r->dv, apex_amp_loss_scale(r->amp, 0), why, sizeof why);
  if (r->a.checkpoint && r->saved_step >= 0)
    snprintf(kept, sizeof kept, "no checkpoint written: %s/step-%ld stays the latest", r->a.checkpoint, r->saved_step);
  fflush(stdout);
  /* Overflows alone under a static scale are the scale's fault; a non-finite loss is the weights'. */
  char advice[96];
  const char *ls = r->a.loss_scale;
  if (r->dv.nonfinite == 0 && ls && strcmp(ls, "dynamic") != 0)
    snprintf(advice, sizeof advice, "use a smaller --loss-scale than %s, or --loss-scale dynamic", ls);
  else
    snprintf(advice, sizeof advice, "lower --lr (it is %g)", (double)r->lr);
  fprintf(stderr, "apex-train: stopped at step %ld: the run diverged: %s; %s; %s\n", r->dv.last_step, why, advice, kept);
  return 3;
}

/* Stopped by a signal after a whole step: saves (collective) where --checkpoint is given and the step
 * is sound, says how to go on, and exits as the signal would (130, 143). */
static int stop_interrupted(run *r, dist *ds, long s) {
  const char *dir = r->a.checkpoint;
  int code = signals_exit_status(r->stop_signal);
  if (dir && !divergence_loss_bad(&r->dv) && save(r, ds, s) != 0) return 1;
  if (ds->rank != 0) return code;
  write_plot(r);
  if (!dir)
    printf("apex-train: interrupted at step %ld; nothing saved (no --checkpoint)\n", s);
  else if (r->saved_step == s)
    printf("apex-train: interrupted at step %ld; checkpoint %s/step-%ld; add --resume to continue\n", s, dir, s);
  else if (r->saved_step >= 0)
    printf("apex-train: interrupted at step %ld; not saved (its loss is not finite); checkpoint %s/step-%ld; add --resume to continue from it\n",
           s, dir, r->saved_step);
  else
    printf("apex-train: interrupted at step %ld; not saved (its loss is not finite); no checkpoint\n", s);
  fflush(stdout);
  return code;
}

static int run_main(run *r, dist *ds, int argc, char **argv) {
  int rc = args_parse(argc, argv, &r->a);
  if (rc) return rc;
  train_args *a = &r->a;
  if (a->help) {
    if (!dist_quiet(ds)) args_usage(stdout);
    return 0;
  }
  if (a->version) {
    if (!dist_quiet(ds)) printf("apex-train %s (apex library %s)\n", APEX_VERSION_STRING, apex_version());
    return 0;
  }
  r->saved_step = -1;
  if (a->eval_only || a->sample) {
    /* The configuration is the checkpoint's; flags given anyway are checked against it. */
    ckpt_set_context(a->eval_only ? "--eval-only" : "--sample");
    if ((rc = from_checkpoint_fill(a)) != 0 || (rc = args_check_model(a)) != 0) return rc;
    if (a->sample && strcmp(a->model, "gpt") != 0) {
      fprintf(stderr, "apex-train: --sample: the checkpoint in %s holds a %s; --sample generates text from a gpt\n", a->checkpoint, a->model);
      return 2;
    }
  }
  /* A resumed or loaded run keeps its checkpoint's validation split (none in one made before the flag). */
  if ((a->resume || a->eval_only || a->sample) && (rc = from_checkpoint_val_fraction(a)) != 0) return rc;
  if ((rc = dist_init(ds, a)) != 0 || (rc = check_flags(r)) != 0) return rc;
  /* From here every rank takes part in each agreement, also after its own failure. */
  rc = setup(r, ds);
  if (dist_agree(ds, rc, 0)) return rc ? rc : 1;
  rc = a->zero ? zero_wrap(r, ds) : dist_wrap(ds, &r->tm, r->g);
  if (a->eval_only || a->sample) {
    /* A loaded checkpoint, evaluated or sampled: nothing is trained or written. */
    if (dist_agree(ds, rc, 1)) return rc ? rc : 1;
    if (ds->rank == 0) printf("apex-train: loaded %s/step-%ld\n", a->checkpoint, r->at.step);
    return finish(r, ds, r->at.step);
  }
  /* Before the checkpoint directory exists: from here a signal stops the run after a step, saved. */
  if (signals_install(ds->rank != 0) != 0) fprintf(stderr, "apex-train: warning: cannot handle Ctrl-C (sigaction failed); it will stop without saving\n");
  if (rc == 0 && ds->rank == 0) rc = open_outputs(r);
  if (dist_agree(ds, rc, 1)) {
    if (r->created) ckpt_unprepare_dir(a->checkpoint, r->created);
    return rc ? rc : 1;
  }

  if (ds->rank == 0) {
    const char *what = r->kind != MODEL_GPT ? "training images" : r->d.bytes ? "bytes of text for training" : "tokens for training";
    char ranks[64] = "";
    if (ds->on) snprintf(ranks, sizeof ranks, " per rank x %d ranks", ds->world);
    char extra[96] = "";
    if (r->kind == MODEL_GPT && !r->d.bytes) snprintf(extra, sizeof extra, ", vocabulary %lld", (long long)r->d.vocab);
    if (r->kind != MODEL_GPT) {
      int k = snprintf(extra, sizeof extra, " of %lldx%lld, %lld classes", (long long)r->d.in_h, (long long)r->d.in_w, (long long)r->d.classes);
      if (r->d.n_val) snprintf(extra + k, sizeof extra - (size_t)k, "; the last %zu held out for validation", r->d.n_val);
    }
    long spe = (long)r->d.steps_per_epoch, last = plan_last_step(a, spe);
    /* O0 trains in f32 whatever --cast-type says. */
    printf("apex-train: %s on %s (%zu %s%s), %s %s, %s lr %g, batch %ld%s, %ld epochs of %ld steps, ending at step %ld (%s)%s\n",
           a->model, r->data, r->kind == MODEL_GPT ? r->d.len : r->d.n_items, what, extra, a->opt_level,
           strcmp(a->opt_level, "O0") == 0 ? "f32" : a->cast_type, a->optimizer, (double)r->lr, a->batch_size, ranks, a->epochs, spe,
           last, last < a->epochs * spe ? "--steps" : "end of the epochs", a->sync_bn ? ", SyncBatchNorm" : "");
    if (r->zs.z)
      printf("apex-train: ZeRO stage %ld: optimizer state %.2f MB per rank (the most over the %d ranks; %.2f MB unsharded)\n", a->zero,
             (double)r->zs.state_bytes / 1e6, ds->world, (double)r->zs.full_bytes / 1e6);
    if (a->resume) printf("apex-train: resumed from %s/step-%ld\n", a->checkpoint, r->at.step);
    print_threads(ds);
    fflush(stdout);
  }
  long end;
  if (train(r, ds, &end) != 0) return 1;
  if (r->diverged || divergence_loss_bad(&r->dv)) return stop_diverged(r, ds);
  if (r->stop_signal) return stop_interrupted(r, ds, end);
  return finish(r, ds, end);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "plot") == 0) return plot_main(argc - 1, argv + 1);
  if (argc > 1 && strcmp(argv[1], "export") == 0) return export_main(argc - 1, argv + 1);
  dist ds;
  dist_begin(&ds);
  run r;
  memset(&r, 0, sizeof r);
  int rc = run_main(&r, &ds, argc, argv);
  run_free(&r);
  dist_free(&ds);
  return rc;
}
