/* dataset.c: image (IDX) and text loading, the held-out splits (images, text), and the per-epoch
 * permutation. */
#include "report.h"
#include "dataset.h"
#include "tokens.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* " x N ranks" after a batch size in messages, when there are several ranks. */
static const char *ranks_note(int world) {
  static char buf[32];
  buf[0] = 0;
  if (world > 1) snprintf(buf, sizeof buf, " x %d ranks", world);
  return buf;
}

static void init(dataset *d, int rank, int world) {
  memset(d, 0, sizeof *d);
  d->perm_epoch = -1;
  d->rank = rank;
  d->world = world;
}

/* The IDX names: Fashion-MNIST's and MNIST's distribution names, and the dotted names of common
 * re-packagings (train-images.idx3-ubyte). */
static const char *idx_names[4][2] = {{"train-images-idx3-ubyte", "train-images.idx3-ubyte"},
                                      {"train-labels-idx1-ubyte", "train-labels.idx1-ubyte"},
                                      {"t10k-images-idx3-ubyte", "t10k-images.idx3-ubyte"},
                                      {"t10k-labels-idx1-ubyte", "t10k-labels.idx1-ubyte"}};

/* The first of NAME.gz and NAME (either spelling) in dir that exists, into path; 0 when none. */
static int find_idx(const char *dir, int i, char *path, size_t size) {
  for (int v = 0; v < 2; v++)
    for (int gz = 1; gz >= 0; gz--) {
      snprintf(path, size, "%s/%s%s", dir, idx_names[i][v], gz ? ".gz" : "");
      FILE *f = fopen(path, "rb");
      if (f) {
        fclose(f);
        return 1;
      }
    }
  return 0;
}

size_t dataset_val_count(double val_fraction, size_t n) { return (size_t)floor(val_fraction * (double)n + 0.5); }

int dataset_load_images(dataset *d, const char *dir, int64_t batch, int rank, int world, double val_fraction) {
  init(d, rank, world);
  apex_idx **slot[4] = {&d->img[0], &d->lab[0], &d->img[1], &d->lab[1]};
  for (int i = 0; i < 4; i++) {
    char path[4200];
    if (!find_idx(dir, i, path, sizeof path)) {
      if (strcmp(dir, DEFAULT_FMNIST_DIR) == 0)
        fprintf(stderr, "apex-train: Fashion-MNIST is not installed (no %s/%s.gz); install it with `sudo apt-get install dataset-fashion-mnist` or point --data at a directory with the four IDX files\n", dir, idx_names[i][0]);
      else
        fprintf(stderr, "apex-train: --data %s: no %s(.gz) there (an IDX image/label set in the MNIST layout; Debian: `sudo apt-get install dataset-fashion-mnist` puts Fashion-MNIST in %s)\n", dir, idx_names[i][0], DEFAULT_FMNIST_DIR);
      dataset_free(d);
      return 1;
    }
    if (apex_idx_load(path, slot[i]) != APEX_OK) {
      fprintf(stderr, "apex-train: cannot read %s: %s\n", path, one_line(apex_last_error()));
      dataset_free(d);
      return 1;
    }
  }
  /* Images [N, H, W] of bytes with N labels each; the classes are 0 .. the largest training label. */
  for (int s = 0; s < 2; s++) {
    const char *what = NULL;
    char why[200];
    if (apex_idx_ndim(d->img[s]) != 3 || apex_idx_ndim(d->lab[s]) != 1) {
      what = "are not images [N, H, W] with labels [N]";
    } else if (apex_idx_dim(d->img[s], 0) == 0) {
      what = "are empty (no images)";
    } else if (apex_idx_dim(d->lab[s], 0) != apex_idx_dim(d->img[s], 0)) {
      snprintf(why, sizeof why, "have %lld images but %lld labels", (long long)apex_idx_dim(d->img[s], 0),
               (long long)apex_idx_dim(d->lab[s], 0));
      what = why;
    } else if (s == 1 && (apex_idx_dim(d->img[1], 1) != d->in_h || apex_idx_dim(d->img[1], 2) != d->in_w)) {
      snprintf(why, sizeof why, "have %lldx%lld images, the training files %lldx%lld", (long long)apex_idx_dim(d->img[1], 1),
               (long long)apex_idx_dim(d->img[1], 2), (long long)d->in_h, (long long)d->in_w);
      what = why;
    } else if (apex_idx_dim(d->img[s], 1) < 4 || apex_idx_dim(d->img[s], 2) < 4) {
      what = "have images smaller than 4x4 (the CNN pools twice)";
    }
    const uint8_t *lab = apex_idx_data(d->lab[s]);
    for (size_t i = 0; !what && i < apex_idx_numel(d->lab[s]); i++) {
      if (s == 0 && lab[i] >= d->classes) d->classes = lab[i] + 1;
      if (s == 1 && lab[i] >= d->classes) {
        snprintf(why, sizeof why, "have label %d, and the training labels stop at %lld", lab[i], (long long)d->classes - 1);
        what = why;
      }
    }
    if (!what && s == 0 && d->classes < 2) what = "have a single class (every label is 0)";
    if (what) {
      fprintf(stderr, "apex-train: --data %s: the %s files %s\n", dir, s ? "test" : "training", what);
      dataset_free(d);
      return 1;
    }
    if (s == 0) {
      d->in_h = apex_idx_dim(d->img[0], 1);
      d->in_w = apex_idx_dim(d->img[0], 2);
    }
  }
  size_t n = (size_t)apex_idx_dim(d->img[0], 0), global = (size_t)batch * (size_t)world;
  if (n / global == 0) {
    fprintf(stderr, "apex-train: --batch-size %lld%s is larger than the %zu training images\n", (long long)batch, ranks_note(world), n);
    dataset_free(d);
    return 1;
  }
  /* The split is the flag's fault when the whole set would give a batch: exit 2, as for a bad value. */
  d->n_val = dataset_val_count(val_fraction, n);
  d->n_items = n - d->n_val;
  d->steps_per_epoch = d->n_items / global;
  if (val_fraction > 0 && d->n_val == 0) {
    fprintf(stderr, "apex-train: --val-fraction %g holds out no image of the %zu training images (round(%g x %zu) = 0); give at least %.2g, or 0 for no validation split\n",
            val_fraction, n, val_fraction, n, 1.0 / (double)n);
    dataset_free(d);
    return 2;
  }
  if (d->steps_per_epoch == 0) {
    fprintf(stderr, "apex-train: --val-fraction %g leaves %zu of the %zu training images, less than one batch of %lld%s; give a smaller fraction or --batch-size\n",
            val_fraction, d->n_items, n, (long long)batch, ranks_note(world));
    dataset_free(d);
    return 2;
  }
  return 0;
}

int dataset_load_text(dataset *d, const char *path, int64_t batch, int64_t seq_len, int rank, int world) {
  init(d, rank, world);
  d->text = 1;
  batch *= world; /* the steps of an epoch count global batches */
  d->seq_len = seq_len;
  token_data td;
  if (tokens_load(path, &td) != 0) return 1;
  d->tok = td.tok;
  d->vocab = td.vocab;
  d->bytes = td.bytes;
  /* The last tenth (at least one window of seq_len + 1) is held out for the validation loss. */
  size_t need = 2 * (size_t)seq_len + 3;
  if (td.len < need) {
    fprintf(stderr, "apex-train: the data %s has %zu tokens; the GPT needs at least 2 x --seq-len + 3 = %zu (training and held-out windows)\n",
            path, td.len, need);
    dataset_free(d);
    return 1;
  }
  size_t val = td.len / 10 > (size_t)seq_len + 1 ? td.len / 10 : (size_t)seq_len + 1;
  d->len = td.len - val;
  d->val_len = val;
  d->n_items = d->len - (size_t)seq_len;
  d->steps_per_epoch = d->len / (size_t)(batch * seq_len);
  if (d->steps_per_epoch == 0) d->steps_per_epoch = 1;
  if (d->steps_per_epoch * (size_t)batch > d->n_items) d->steps_per_epoch = d->n_items / (size_t)batch;
  if (d->steps_per_epoch == 0) {
    fprintf(stderr, "apex-train: the text %s is too short for --batch-size %lld%s windows of --seq-len %lld\n", path,
            (long long)(batch / world), ranks_note(world), (long long)seq_len);
    dataset_free(d);
    return 1;
  }
  return 0;
}

void dataset_free(dataset *d) {
  for (int i = 0; i < 2; i++) {
    apex_idx_destroy(d->img[i]);
    apex_idx_destroy(d->lab[i]);
  }
  free(d->tok);
  free(d->perm);
  memset(d, 0, sizeof *d);
}

/* splitmix64: spreads (seed, epoch) over the generator's key space. */
static uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

int dataset_order(dataset *d, uint64_t seed, long epoch) {
  if (d->perm && d->perm_epoch == epoch) return 0;
  if (!d->perm) d->perm = malloc(d->n_items * sizeof *d->perm);
  float *u = malloc(d->n_items * sizeof *u);
  if (!d->perm || !u) {
    free(u);
    return -1;
  }
  for (size_t i = 0; i < d->n_items; i++) d->perm[i] = i;
  apex_rng rng = apex_rng_init(mix(mix(seed) ^ (uint64_t)epoch));
  apex_rng_uniform(&rng, u, d->n_items);
  for (size_t i = d->n_items - 1; i > 0; i--) { /* Fisher-Yates */
    size_t j = (size_t)(u[i] * (float)(i + 1));
    if (j > i) j = i;
    size_t t = d->perm[i];
    d->perm[i] = d->perm[j];
    d->perm[j] = t;
  }
  free(u);
  d->perm_epoch = epoch;
  return 0;
}

/* Item b of this rank's share of batch pos (the sharding in dataset.h). */
static size_t item(const dataset *d, size_t pos, int64_t B, int64_t b) {
  return d->perm[(pos * (size_t)d->world + (size_t)d->rank) * (size_t)B + (size_t)b];
}

void dataset_image_batch(const dataset *d, size_t pos, int64_t B, float *x, int64_t *labels) {
  const uint8_t *pix = apex_idx_data(d->img[0]), *lab = apex_idx_data(d->lab[0]);
  for (int64_t b = 0; b < B; b++) {
    size_t k = item(d, pos, B, b);
    size_t hw = (size_t)(d->in_h * d->in_w);
    for (size_t p = 0; p < hw; p++) x[(size_t)b * hw + p] = (float)pix[k * hw + p] / 255.0f * 2.0f - 1.0f;
    labels[b] = lab[k];
  }
}

void dataset_text_batch(const dataset *d, size_t pos, int64_t B, int64_t *ids, int64_t *targets) {
  int64_t T = d->seq_len;
  for (int64_t b = 0; b < B; b++) {
    size_t start = item(d, pos, B, b);
    for (int64_t t = 0; t < T; t++) {
      ids[b * T + t] = d->tok[start + (size_t)t];
      targets[b * T + t] = d->tok[start + (size_t)t + 1];
    }
  }
}
