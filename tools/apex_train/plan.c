/* plan.c: the steps a run trains (plan.h). */
#include "plan.h"

long plan_last_step(const train_args *a, long steps_per_epoch) {
  long epochs_end = a->epochs * steps_per_epoch;
  return a->steps > 0 && a->steps < epochs_end ? a->steps : epochs_end;
}

int plan_check_resume(const train_args *a, long steps_per_epoch, long checkpoint_step) {
  long last = plan_last_step(a, steps_per_epoch);
  if (checkpoint_step < last) return 0;
  const char *where = checkpoint_step == last ? "already at" : "already past";
  if (a->steps > 0 && a->steps == last)
    fprintf(stderr, "apex-train: --resume: the checkpoint in %s is at step %ld, %s --steps %ld: nothing to train; give --steps above %ld to train further\n",
            a->checkpoint, checkpoint_step, where, a->steps, checkpoint_step);
  else
    fprintf(stderr, "apex-train: --resume: the checkpoint in %s is at step %ld, %s the end of its %ld epochs (step %ld): nothing to train\n",
            a->checkpoint, checkpoint_step, where, a->epochs, last);
  return 2;
}
