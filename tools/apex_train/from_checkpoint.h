/* from_checkpoint.h: --eval-only and --sample take the run's configuration from the checkpoint they
 * load (state.safetensors records the flags; the model sizes follow from its tensors' shapes), so
 * that `apex-train --checkpoint DIR --eval-only` needs no other flag. */
#ifndef APEX_TRAIN_FROM_CHECKPOINT_H
#define APEX_TRAIN_FROM_CHECKPOINT_H

#include "args.h"

/* Sets every recorded flag that the command line did not give from the checkpoint DIR/latest names
 * (flags given anyway are compared by ckpt_load, which names them). A missing or unreadable
 * checkpoint changes nothing (the load that follows reports it). Non-zero, with one line, when a
 * recorded value is not one the flag accepts. */
int from_checkpoint_fill(train_args *a);
/* --resume, --eval-only and --sample: the validation split of the checkpoint DIR/latest names
 * (state.safetensors' val_fraction; a checkpoint without it, made before the flag or with
 * --val-fraction 0, holds out nothing), so that its run goes on with the data it trained on. Taken
 * when --val-fraction is not given; when it is and differs, one line naming both and non-zero (1).
 * A missing or unreadable checkpoint changes nothing (the load that follows reports it). */
int from_checkpoint_val_fraction(train_args *a);

#endif
