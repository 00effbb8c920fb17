/* dataset.h: apex-train's data: an IDX image/label set (Fashion-MNIST, MNIST, any [N, H, W] bytes
 * with byte labels) or the GPT's tokens (tokens.h: byte-level text or an llm.c .bin file), and the
 * deterministic order in which training visits them. The last tenth of the tokens (at least
 * seq_len + 1) is held out for the validation loss and never trained on; so are the last
 * n_val = round(val_fraction x N) of the N training images (--val-fraction), which training never
 * visits: the order ranges over the first N - n_val only.
 *
 * Order: epoch e visits a permutation of the items drawn with apex_rng from (seed, e) alone, so a run
 * resumed at (epoch, position) sees exactly the batches the straight run saw. For text an item is a
 * start offset of a window of seq_len + 1 tokens of the training part, and an epoch is
 * len / (batch * seq_len) steps.
 *
 * Sharding (--distributed): with `world` ranks a step consumes world * batch consecutive items of the
 * permutation, rank r taking the r-th run of `batch` of them. Every rank computes the same
 * permutation, so the shards are disjoint and together are exactly the global batch, and an epoch
 * has world times fewer steps. With world 1 this is the single-process order. */
#ifndef APEX_TRAIN_DATASET_H
#define APEX_TRAIN_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "apex/apex.h"

#define DEFAULT_FMNIST_DIR "/usr/share/datasets/fashion-mnist"
/* The GPT's default corpus: the GNU GPL version 3, which Debian's base-files (Essential: yes)
 * installs on every system. */
#define DEFAULT_TEXT_FILE "/usr/share/common-licenses/GPL-3"

typedef struct dataset {
  int text;
  /* images */
  apex_idx *img[2], *lab[2]; /* train, test */
  int64_t in_h, in_w, classes;
  size_t n_val;              /* the validation split: training images [n_items, n_items + n_val) */
  /* text: tok[0, len) trains, tok[len, len + val_len) is held out */
  uint16_t *tok;
  size_t len, val_len;
  int64_t vocab;
  int bytes;                 /* byte-level text (printable samples) */
  int64_t seq_len;
  /* order */
  size_t n_items;            /* items a permutation ranges over */
  size_t steps_per_epoch;
  int rank, world;           /* this process's shard of each step's items */
  size_t *perm;
  long perm_epoch;           /* epoch perm belongs to, -1 none */
} dataset;

/* Loads the IDX set (train-images-idx3-ubyte[.gz] and the three others) from dir, for `batch` images
 * per step on each of `world` ranks, this one being `rank`, holding out the last
 * dataset_val_count(val_fraction, N) training images for validation (0: none). On failure prints
 * one line to stderr saying what is missing and how to install it, and returns non-zero: 2 when
 * val_fraction leaves no validation image or not one training batch, 1 otherwise. */
int dataset_load_images(dataset *d, const char *dir, int64_t batch, int rank, int world, double val_fraction);
/* The validation images of a set of n training images: round(val_fraction x n), halves up. */
size_t dataset_val_count(double val_fraction, size_t n);
/* Loads a token file (tokens.h; at least 2 seq_len + 3 tokens) and splits off the held-out part.
 * Same arguments and error convention. */
int dataset_load_text(dataset *d, const char *path, int64_t batch, int64_t seq_len, int rank, int world);
void dataset_free(dataset *d);

/* The permutation of epoch e for this seed (recomputed only when the epoch changes). */
int dataset_order(dataset *d, uint64_t seed, long epoch);
/* This rank's share of batch `pos` of the current epoch: images into x ([B, H * W] or [B, 1, H, W] f32) and labels; text
 * into ids [B, T] and targets [B, T]. */
void dataset_image_batch(const dataset *d, size_t pos, int64_t B, float *x, int64_t *labels);
void dataset_text_batch(const dataset *d, size_t pos, int64_t B, int64_t *ids, int64_t *targets);

#endif
