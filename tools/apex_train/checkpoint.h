/* checkpoint.h: apex-train's checkpoints. A checkpoint directory holds
 *
 *   DIR/latest                    "step-<N>\n": the last complete checkpoint, replaced atomically
 *   DIR/step-<N>/model.safetensors  the weights in f32 (the f32 masters at O2/O3) and the batch norm
 *                                 running statistics, by their PyTorch state_dict names: any
 *                                 safetensors reader loads them
 *   DIR/step-<N>/optimizer.bin    the optimizer state, apex_optimizer_save's layout (optim.h)
 *   DIR/step-<N>/state.safetensors  no tensors; its metadata (strings) holds the run's identity
 *                                 (model, opt level, cast type, optimizer, loss scale, overrides,
 *                                 lr, weight decay, batch size per rank, epochs, seed, seq len,
 *                                 world size, sync bn, the validation fraction when a run holds out
 *                                 images, parameter shapes), the amp state (hex of apex_amp_state_save), the RNG
 *                                 states (the model's dropout generator; the data order is a
 *                                 function of seed and epoch), the data position (step, epoch,
 *                                 batch within the epoch), FNV-1a 64 hashes of the two other files
 *                                 and a checksum of the metadata itself.
 *   DIR/step-<N>/timing.json      {"elapsed_s": S}: training time up to this step, resumed runs
 *                                 included, so that a resumed log's elapsed_s goes on. Kept apart
 *                                 from the state: it is not training state and differs between
 *                                 runs; a checkpoint without it resumes with 0.
 *
 * A save writes DIR/step-<N>.partial/ in full (each file through a temporary, fsync, rename), renames
 * it to step-<N>, fsyncs DIR, replaces DIR/latest atomically, and only then removes step dirs other
 * than the new one and the one latest named before. A save killed at any point leaves the previous
 * checkpoint intact and named by latest. Nothing in the three state files depends on the time or the
 * run: the same training state gives the same bytes. */
#ifndef APEX_TRAIN_CHECKPOINT_H
#define APEX_TRAIN_CHECKPOINT_H

#include <stdint.h>

#include "apex/apex.h"
#include "models.h"

#define CKPT_NCONFIG 32

/* The run's identity: each must match on resume. */
typedef struct ckpt_config {
  const char *key[CKPT_NCONFIG];
  char value[CKPT_NCONFIG][64];
  char is_float[CKPT_NCONFIG]; /* compared as f32 values (ckpt_config_add_float) */
  int n;
} ckpt_config;

typedef struct ckpt_position {
  long step;   /* steps done from the start of training */
  long epoch;  /* epoch of the next step */
  long pos;    /* batch within that epoch of the next step */
  double elapsed_s; /* training time up to step (timing.json) */
  /* The step at which the lr schedule ends, when not the end of the epochs (state.safetensors'
   * lr_schedule_total, written only then, so that other checkpoints keep their bytes); 0: the end of
   * the epochs, the rule of every checkpoint written before the key existed. */
  long lr_total;
} ckpt_position;

void ckpt_config_add(ckpt_config *c, const char *key, const char *fmt, ...);
/* An f32 entry, written in the fewest digits that read back to the same f32 ("0.001", not
 * "0.00100000005"), and compared by value on resume, so checkpoints written with more digits still
 * match and a refusal shows the values as the user typed them. */
void ckpt_config_add_float(ckpt_config *c, const char *key, float v);

/* Checks that dir can hold checkpoints, creating it and any missing parents (*created counts the
 * directories made, dir's own included). Prints one line naming the path at fault and returns
 * non-zero otherwise, having removed what it made. */
int ckpt_prepare_dir(const char *dir, int *created);
/* Removes the `created` directories ckpt_prepare_dir made for dir (empty ones only), after a
 * failed setup, so that a refused run leaves nothing behind. */
void ckpt_unprepare_dir(const char *dir, int created);
/* 1 when dir has a `latest` file. */
int ckpt_exists(const char *dir);
/* Saves the state after p->step steps. Prints one line and returns non-zero on failure; the
 * previous checkpoint is intact then. */
int ckpt_save(const char *dir, const train_model *tm, apex_amp *amp, apex_optimizer *opt, const ckpt_config *cfg,
              const ckpt_position *p);
/* Loads the checkpoint DIR/latest names into the model, optimizer and amp after checking that it is
 * whole and was made by the same configuration. Prints one line and returns non-zero otherwise. */
/* The flag ckpt_load's messages name: "--resume" (the default), "--eval-only" or "--sample". */
void ckpt_set_context(const char *flag);
int ckpt_load(const char *dir, train_model *tm, apex_amp *amp, apex_optimizer *opt, const ckpt_config *cfg, ckpt_position *p);
/* FNV-1a 64 of the training state a checkpoint holds (parameters, f32 masters, buffers, optimizer
 * and amp state, the dropout generator), as this process has it in memory: equal hashes on two
 * ranks mean they would save the same checkpoint. Non-zero when out of memory. */
int ckpt_state_hash(const train_model *tm, apex_amp *amp, apex_optimizer *opt, uint64_t *hash);

#endif
