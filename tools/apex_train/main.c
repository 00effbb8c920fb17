/* main.c: apex-train, the main job. Trains the CNN (or the MLP) on Fashion-MNIST, or a byte-level
 * GPT on a text file, with amp at any opt level and any fused optimizer; checkpoints atomically and
 * resumes bitwise; reports test accuracy (images) or a generated sample (text).
 *
 * Everything a run does is a function of its flags: the data order comes from (seed, epoch), the
 * learning rate from the step, so --steps N stops a run where a straight run of N steps stops, and a
 * resumed run continues with the same bits. Bad input is one line on stderr and a non-zero exit,
 * before any file is written. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "checkpoint.h"
#include "dataset.h"
#include "models.h"
#include "report.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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

/* Test accuracy of an image model over the 10,000 test images. */
static double evaluate(train_model *tm, apex_amp *amp, apex_graph *g, const dataset *d) {
  const int64_t flat[1] = {784}, img[3] = {1, 28, 28};
  int ndim = tm->kind == MODEL_MLP ? 1 : 3;
  size_t n = (size_t)apex_idx_dim(d->img[1], 0), correct = 0;
  apex_model_train(tm->m, 0);
  int prev = apex_graph_set_grad_enabled(g, 0);
  for (size_t s = 0; s < n; s += 500) {
    size_t cnt = n - s < 500 ? n - s : 500;
    apex_tensor *tx = apex_idx_to_f32(d->img[1], s, cnt, ndim, ndim == 1 ? flat : img, 0.5f, 0.5f);
    int64_t tl[500];
    apex_idx_labels(d->lab[1], s, cnt, tl);
    apex_var *logits = tx ? model_forward_images(tm, amp, g, apex_graph_input(g, tx, 0)) : NULL;
    if (!logits) {
      apex_tensor_destroy(tx);
      return -1;
    }
    apex_tensor *lt = apex_var_value(logits);
    for (size_t i = 0; i < cnt; i++) {
      int best = 0;
      for (int c = 1; c < 10; c++)
        if (apex_tensor_get(lt, i * 10 + (size_t)c) > apex_tensor_get(lt, i * 10 + (size_t)best)) best = c;
      correct += best == tl[i];
    }
    apex_graph_reset(g);
    apex_tensor_destroy(tx);
  }
  apex_graph_set_grad_enabled(g, prev);
  apex_model_train(tm->m, 1);
  return (double)correct / (double)n;
}

/* Generates n bytes after a prompt, sampling at temperature 0.8 from a generator seeded by seed. */
static int generate(train_model *tm, apex_graph *g, uint64_t seed, long n, FILE *out) {
  const char *prompt = "The ";
  int64_t T = tm->seq_len, len = 0;
  size_t cap = strlen(prompt) + (size_t)n;
  int64_t *buf = malloc(cap * sizeof *buf);
  if (!buf) return -1;
  for (const char *c = prompt; *c; c++) buf[len++] = (uint8_t)*c;
  apex_rng rng = apex_rng_init(seed ^ 0x5A3D1E5ull);
  apex_model_train(tm->m, 0);
  int prev = apex_graph_set_grad_enabled(g, 0);
  fputs(prompt, out);
  for (long k = 0; k < n; k++) {
    int64_t w = len < T ? len : T;
    apex_var *logits = model_forward_text(tm, g, buf + len - w, 1, w);
    if (!logits) {
      free(buf);
      return -1;
    }
    apex_tensor *lt = apex_var_value(logits);
    double p[256], mx = -INFINITY, sum = 0;
    for (int v = 0; v < 256; v++) {
      p[v] = apex_tensor_get(lt, (size_t)(w - 1) * 256 + (size_t)v) / 0.8;
      if (p[v] > mx) mx = p[v];
    }
    for (int v = 0; v < 256; v++) sum += p[v] = exp(p[v] - mx);
    float u;
    apex_rng_uniform(&rng, &u, 1);
    double r = u * sum;
    int pick = 255;
    for (int v = 0; v < 256; v++) {
      r -= p[v];
      if (r < 0) {
        pick = v;
        break;
      }
    }
    buf[len++] = pick;
    fputc(pick == '\n' || pick == '\t' || (pick >= 32 && pick < 127) ? pick : '?', out);
    apex_graph_reset(g);
  }
  fputc('\n', out);
  apex_graph_set_grad_enabled(g, prev);
  apex_model_train(tm->m, 1);
  free(buf);
  return 0;
}

int main(int argc, char **argv) {
  train_args a;
  int rc = args_parse(argc, argv, &a);
  if (rc) return rc;
  if (a.help) {
    args_usage(stdout);
    return 0;
  }
  if (strcmp(a.device, "cuda") == 0) {
    apex_tensor *t = apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_F32, 0, NULL);
    if (!t) {
      fprintf(stderr, "apex-train: --device cuda: this build of apex has no CUDA backend (or no GPU is visible); use --device cpu\n");
      return 2;
    }
    apex_tensor_destroy(t);
    fprintf(stderr, "apex-train: --device cuda: apex-train does not train on CUDA yet; use --device cpu\n");
    return 2;
  }
  if (a.threads > 0 && apex_set_num_threads((int)a.threads) != APEX_OK) {
    fprintf(stderr, "apex-train: --threads %ld: %s\n", a.threads, one_line(apex_last_error()));
    return 2;
  }
  model_kind kind = strcmp(a.model, "mlp") == 0 ? MODEL_MLP : strcmp(a.model, "cnn") == 0 ? MODEL_CNN : MODEL_GPT;
  if (a.epochs == 0) a.epochs = kind == MODEL_GPT ? 30 : 2;
  if (a.batch_size == 0) a.batch_size = kind == MODEL_GPT ? 16 : 64;
  const char *data = a.data ? a.data : kind == MODEL_GPT ? DEFAULT_TEXT_FILE : DEFAULT_FMNIST_DIR;

  /* amp's configuration and the optimizer's options, checked before anything is loaded. */
  apex_amp_config acfg = {
      .opt_level = a.opt_level,
      .half_type = strcmp(a.cast_type, "bf16") == 0 ? APEX_AMP_CAST_BF16 : APEX_AMP_CAST_F16,
      .keep_batchnorm_fp32 = tristate(a.keep_batchnorm_fp32),
      .master_weights = tristate(a.master_weights),
      .loss_scale = !a.loss_scale ? 0.0f : strcmp(a.loss_scale, "dynamic") == 0 ? APEX_AMP_DYNAMIC : (float)atof(a.loss_scale),
  };
  apex_amp_properties props;
  if (apex_amp_resolve(&acfg, &props) != APEX_OK) {
    fprintf(stderr, "apex-train: %s\n", one_line(apex_last_error()));
    return 2;
  }
  apex_optim_kind okind;
  apex_optim_kind_parse(a.optimizer, &okind); /* the table admits only valid names */
  float lr = a.lr > 0 ? (float)a.lr : default_lr(okind, kind);
  apex_optim_options oo = {.lr = lr, .weight_decay = (float)a.weight_decay};
  if (a.lr == 0 && okind == APEX_OPTIM_SGD) oo.momentum = 0.9f;
  apex_optimizer *opt = apex_optimizer_create(okind, &oo);
  if (!opt) {
    fprintf(stderr, "apex-train: --optimizer %s: %s\n", a.optimizer, one_line(apex_last_error()));
    return 2;
  }

  /* From here on a failure frees what was made (at `fail`), so that an error exit leaks nothing. */
  dataset d;
  train_model tm;
  apex_amp *amp = NULL;
  int have_data = 0, have_model = 0;
  if (kind == MODEL_GPT ? dataset_load_text(&d, data, a.batch_size, a.seq_len) : dataset_load_images(&d, data, a.batch_size))
    goto fail;
  have_data = 1;
  if (model_build(&tm, kind, (uint64_t)a.seed, a.seq_len) != 0) {
    fprintf(stderr, "apex-train: cannot build the %s: %s\n", a.model, one_line(apex_last_error()));
    goto fail;
  }
  have_model = 1;
  size_t np = apex_model_num_params(tm.m);
  apex_tensor **pv = malloc(np * sizeof *pv), **gv = malloc(np * sizeof *gv);
  for (size_t i = 0; i < np; i++) {
    pv[i] = apex_var_value(apex_model_param(tm.m, i, NULL));
    gv[i] = apex_var_grad(apex_model_param(tm.m, i, NULL));
  }
  int made = apex_optimizer_add_group(opt, pv, (int)np, gv, (int)np, NULL, NULL) == APEX_OK &&
             apex_amp_initialize(&tm.m, 1, &opt, 1, &acfg, &amp) == APEX_OK;
  free(pv);
  free(gv);
  if (!made) {
    fprintf(stderr, "apex-train: %s\n", one_line(apex_last_error()));
    goto fail;
  }

  ckpt_config cc = {0};
  ckpt_config_add(&cc, "model", "%s", a.model);
  ckpt_config_add(&cc, "opt_level", "%s", a.opt_level);
  ckpt_config_add(&cc, "cast_type", "%s", a.cast_type);
  ckpt_config_add(&cc, "loss_scale", "%s", a.loss_scale ? a.loss_scale : "default");
  ckpt_config_add(&cc, "keep_batchnorm_fp32", "%s", a.keep_batchnorm_fp32 ? a.keep_batchnorm_fp32 : "default");
  ckpt_config_add(&cc, "master_weights", "%s", a.master_weights ? a.master_weights : "default");
  ckpt_config_add(&cc, "optimizer", "%s", a.optimizer);
  ckpt_config_add(&cc, "lr", "%.9g", (double)lr);
  ckpt_config_add(&cc, "weight_decay", "%.9g", (double)(float)a.weight_decay);
  ckpt_config_add(&cc, "batch_size", "%ld", a.batch_size);
  ckpt_config_add(&cc, "epochs", "%ld", a.epochs);
  ckpt_config_add(&cc, "seed", "%ld", a.seed);
  ckpt_config_add(&cc, "seq_len", "%ld", kind == MODEL_GPT ? a.seq_len : 0L);

  long spe = (long)d.steps_per_epoch, sched_total = a.epochs * spe;
  long stop = a.steps > 0 ? a.steps : sched_total;
  ckpt_position at = {0, 0, 0};
  int created = 0;
  if (a.checkpoint) {
    if (a.resume) {
      if (ckpt_load(a.checkpoint, &tm, amp, opt, &cc, &at) != 0) goto fail;
    } else if (ckpt_exists(a.checkpoint)) {
      fprintf(stderr, "apex-train: --checkpoint %s already holds a checkpoint; add --resume to continue it, or choose another directory\n",
              a.checkpoint);
      goto fail;
    }
    if (ckpt_prepare_dir(a.checkpoint, &created) != 0) goto fail;
  }
  report *rep = report_create(stdout, a.log, a.resume);
  if (!rep) {
    if (created) remove(a.checkpoint);
    goto fail;
  }

  const char *what = kind == MODEL_GPT ? "bytes of text" : "training images";
  printf("apex-train: %s on %s (%zu %s), %s %s, %s lr %g, batch %ld, %ld epochs of %ld steps%s\n", a.model, data,
         kind == MODEL_GPT ? d.len : d.n_items, what, a.opt_level, a.cast_type, a.optimizer, (double)lr, a.batch_size,
         a.epochs, spe, a.steps > 0 ? ", stopping early (--steps)" : "");
  if (a.resume) printf("apex-train: resumed from %s/step-%ld\n", a.checkpoint, at.step);
  fflush(stdout);

  apex_graph *g = apex_graph_create();
  apex_amp_prepare_graph(amp, g);
  int64_t B = a.batch_size, T = a.seq_len;
  apex_tensor *x = NULL;
  int64_t *labels = NULL, *ids = NULL;
  if (kind == MODEL_GPT) {
    ids = malloc((size_t)(B * T) * sizeof *ids);
    labels = malloc((size_t)(B * T) * sizeof *labels);
  } else {
    labels = malloc((size_t)B * sizeof *labels);
    x = kind == MODEL_MLP ? apex_tensor_create(APEX_F32, 2, (int64_t[]){B, 784}) : apex_tensor_create(APEX_F32, 4, (int64_t[]){B, 1, 28, 28});
  }
  apex_loss_scaler *scaler = apex_amp_loss_scaler(amp, 0);
  double t0 = now_s();
  long first = at.step, s = at.step;
  int failed = 0;
  for (; s < stop; s++) {
    long epoch = s / spe, pos = s % spe;
    if (dataset_order(&d, (uint64_t)a.seed, epoch) != 0) {
      fprintf(stderr, "apex-train: out of memory for the data order\n");
      failed = 1;
      break;
    }
    double frac = (double)s / (double)sched_total;
    apex_optimizer_set_lr(opt, 0, lr * (float)(frac < 0.95 ? 1.0 - frac : 0.05));
    apex_var *logits;
    if (kind == MODEL_GPT) {
      dataset_text_batch(&d, (size_t)pos, B, ids, labels);
      logits = model_forward_text(&tm, g, ids, B, T);
    } else {
      dataset_image_batch(&d, (size_t)pos, B, apex_tensor_data(x), labels);
      logits = model_forward_images(&tm, amp, g, apex_graph_input(g, x, 0));
    }
    apex_var *loss = apex_cross_entropy(g, logits, labels, NULL);
    if (!loss) {
      fprintf(stderr, "apex-train: forward failed at step %ld: %s\n", s + 1, one_line(apex_last_error()));
      failed = 1;
      break;
    }
    float lv = apex_var_item(loss);
    apex_status st = apex_amp_backward(amp, loss, 0, NULL);
    if (st == APEX_ERR_SCALE_AT_MIN) {
      fprintf(stderr, "apex-train: step %ld: %s\n", s + 1, one_line(apex_last_error()));
      failed = 1;
      break;
    }
    if (st != APEX_OK && st != APEX_ERR_NONFINITE) {
      fprintf(stderr, "apex-train: backward failed at step %ld: %s\n", s + 1, one_line(apex_last_error()));
      failed = 1;
      break;
    }
    if (apex_amp_step(amp, opt, NULL) != APEX_OK) {
      fprintf(stderr, "apex-train: optimizer step %ld failed: %s\n", s + 1, one_line(apex_last_error()));
      failed = 1;
      break;
    }
    apex_amp_zero_grad(amp);
    apex_graph_reset(g);
    double el = now_s() - t0;
    report_point rp = {.epoch = epoch + 1, .epochs = a.epochs, .step = s + 1, .total_steps = stop, .first_step = first,
                       .loss = lv, .loss_scale = apex_amp_loss_scale(amp, 0),
                       .skipped = (long)apex_loss_scaler_get_state(scaler).skipped,
                       .samples_per_s = el > 0 ? (double)(s + 1 - first) * (double)B / el : 0, .elapsed_s = el};
    report_step(rep, &rp);
    if (a.checkpoint && a.save_every > 0 && (s + 1) % a.save_every == 0 && s + 1 < stop) {
      ckpt_position p = {s + 1, (s + 1) / spe, (s + 1) % spe};
      if (ckpt_save(a.checkpoint, &tm, amp, opt, &cc, &p) != 0) {
        failed = 1;
        s++;
        break;
      }
    }
  }
  report_finish(rep);
  double train_s = now_s() - t0;
  if (!failed && a.checkpoint) {
    ckpt_position p = {s, s / spe, s % spe};
    if (ckpt_save(a.checkpoint, &tm, amp, opt, &cc, &p) != 0) failed = 1;
    else printf("apex-train: checkpoint %s/step-%ld\n", a.checkpoint, s);
  }
  if (!failed) {
    printf("apex-train: %ld steps in %.1f s (%.0f samples/s), %ld skipped\n", s - first, train_s,
           train_s > 0 ? (double)(s - first) * (double)B / train_s : 0.0, (long)apex_loss_scaler_get_state(scaler).skipped);
    if (kind == MODEL_GPT) {
      printf("apex-train: sample:\n");
      if (generate(&tm, g, (uint64_t)a.seed, a.sample_bytes, stdout) != 0) {
        fprintf(stderr, "apex-train: generation failed: %s\n", one_line(apex_last_error()));
        failed = 1;
      }
    } else {
      double acc = evaluate(&tm, amp, g, &d);
      if (acc < 0) {
        fprintf(stderr, "apex-train: evaluation failed: %s\n", one_line(apex_last_error()));
        failed = 1;
      } else {
        printf("apex-train: test accuracy %.4f\n", acc);
      }
    }
  }
  report_destroy(rep);
  apex_tensor_destroy(x);
  free(labels);
  free(ids);
  apex_graph_destroy(g);
  apex_amp_destroy(amp);
  apex_optimizer_destroy(opt);
  model_free(&tm);
  dataset_free(&d);
  return failed;

fail:
  apex_amp_destroy(amp);
  apex_optimizer_destroy(opt);
  if (have_model) model_free(&tm);
  if (have_data) dataset_free(&d);
  return 1;
}
