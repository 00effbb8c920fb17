/* plan.h: how many steps a run trains. One rule: training ends at the first limit reached, the end
 * of --epochs (epochs x steps per epoch) or --steps when given. The learning rate decays over the
 * epochs either way, so a run stopped by --steps matches the start of the full run step for step. */
#ifndef APEX_TRAIN_PLAN_H
#define APEX_TRAIN_PLAN_H

#include "args.h"

/* The step at which training ends (counted from the start of training). */
long plan_last_step(const train_args *a, long steps_per_epoch);
/* --resume: refuses, with one line on stderr and non-zero, a checkpoint at or past the last step
 * (nothing would be trained), naming the limit that ends the run and how to go further. */
int plan_check_resume(const train_args *a, long steps_per_epoch, long checkpoint_step);

#endif
