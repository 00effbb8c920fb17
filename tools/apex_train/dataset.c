/* dataset.c: Fashion-MNIST and text loading, and the per-epoch permutation. */
#include "report.h"
#include "dataset.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *fmnist_files[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                                      "t10k-labels-idx1-ubyte"};

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

int dataset_load_images(dataset *d, const char *dir, int64_t batch, int rank, int world) {
  init(d, rank, world);
  apex_idx **slot[4] = {&d->img[0], &d->lab[0], &d->img[1], &d->lab[1]};
  for (int i = 0; i < 4; i++) {
    char gz[4096], plain[4096];
    snprintf(gz, sizeof gz, "%s/%s.gz", dir, fmnist_files[i]);
    snprintf(plain, sizeof plain, "%s/%s", dir, fmnist_files[i]);
    FILE *f = fopen(gz, "rb");
    const char *path = gz;
    if (!f) {
      f = fopen(plain, "rb");
      path = plain;
    }
    if (!f) {
      if (strcmp(dir, DEFAULT_FMNIST_DIR) == 0)
        fprintf(stderr, "apex-train: Fashion-MNIST is not installed (no %s); install it with `sudo apt-get install dataset-fashion-mnist` or point --data at a directory with the four IDX files\n", gz);
      else
        fprintf(stderr, "apex-train: --data %s: no %s(.gz) there (Fashion-MNIST's four IDX files; Debian: `sudo apt-get install dataset-fashion-mnist` puts them in %s)\n", dir, fmnist_files[i], DEFAULT_FMNIST_DIR);
      dataset_free(d);
      return 1;
    }
    fclose(f);
    if (apex_idx_load(path, slot[i]) != APEX_OK) {
      fprintf(stderr, "apex-train: cannot read %s: %s\n", path, one_line(apex_last_error()));
      dataset_free(d);
      return 1;
    }
  }
  for (int s = 0; s < 2; s++) {
    int ok = apex_idx_ndim(d->img[s]) == 3 && apex_idx_dim(d->img[s], 1) == 28 && apex_idx_dim(d->img[s], 2) == 28 &&
             apex_idx_ndim(d->lab[s]) == 1 && apex_idx_dim(d->lab[s], 0) == apex_idx_dim(d->img[s], 0);
    const uint8_t *lab = apex_idx_data(d->lab[s]);
    for (size_t i = 0; ok && i < apex_idx_numel(d->lab[s]); i++) ok = lab[i] < 10;
    if (!ok) {
      fprintf(stderr, "apex-train: --data %s: the %s files are not Fashion-MNIST (28x28 images with labels 0-9)\n", dir,
              s ? "test" : "training");
      dataset_free(d);
      return 1;
    }
  }
  d->n_items = (size_t)apex_idx_dim(d->img[0], 0);
  d->steps_per_epoch = d->n_items / ((size_t)batch * (size_t)world);
  if (d->steps_per_epoch == 0) {
    fprintf(stderr, "apex-train: --batch-size %lld%s is larger than the %zu training images\n", (long long)batch, ranks_note(world),
            d->n_items);
    dataset_free(d);
    return 1;
  }
  return 0;
}

int dataset_load_text(dataset *d, const char *path, int64_t batch, int64_t seq_len, int rank, int world) {
  init(d, rank, world);
  d->text = 1;
  batch *= world; /* the steps of an epoch count global batches */
  d->seq_len = seq_len;
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "apex-train: cannot read the text %s: %s%s\n", path, strerror(errno),
            strcmp(path, DEFAULT_TEXT_FILE) == 0 ? " (Debian's base-files installs it; or pass --data FILE)" : "");
    return 1;
  }
  size_t cap = 1 << 16;
  d->bytes = malloc(cap);
  for (;;) {
    if (!d->bytes) break;
    size_t n = fread(d->bytes + d->len, 1, cap - d->len, f);
    d->len += n;
    if (n == 0) break;
    if (d->len == cap) {
      if (cap >= ((size_t)1 << 31)) break;
      uint8_t *nb = realloc(d->bytes, cap *= 2);
      if (!nb) {
        free(d->bytes);
        d->bytes = NULL;
        break;
      }
      d->bytes = nb;
    }
  }
  int err = ferror(f) || !d->bytes;
  fclose(f);
  if (err) {
    fprintf(stderr, "apex-train: cannot read the text %s (a directory, or out of memory)\n", path);
    dataset_free(d);
    return 1;
  }
  if (d->len < (size_t)seq_len + 2) {
    fprintf(stderr, "apex-train: the text %s has %zu bytes; the GPT needs at least --seq-len + 2 = %lld\n", path, d->len,
            (long long)seq_len + 2);
    dataset_free(d);
    return 1;
  }
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
  free(d->bytes);
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
    for (int p = 0; p < 784; p++) x[b * 784 + p] = (float)pix[k * 784 + (size_t)p] / 255.0f * 2.0f - 1.0f;
    labels[b] = lab[k];
  }
}

void dataset_text_batch(const dataset *d, size_t pos, int64_t B, int64_t *ids, int64_t *targets) {
  int64_t T = d->seq_len;
  for (int64_t b = 0; b < B; b++) {
    size_t start = item(d, pos, B, b);
    for (int64_t t = 0; t < T; t++) {
      ids[b * T + t] = d->bytes[start + (size_t)t];
      targets[b * T + t] = d->bytes[start + (size_t)t + 1];
    }
  }
}
