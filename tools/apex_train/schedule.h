/* schedule.h: apex-train's learning rate as a function of the step alone, so that a resumed run sets
 * the same rates as the straight one: a linear warmup, then a linear or cosine decay to 5% of the
 * peak at the last step of the run, or a constant rate. */
#ifndef APEX_TRAIN_SCHEDULE_H
#define APEX_TRAIN_SCHEDULE_H

typedef enum { SCHEDULE_LINEAR, SCHEDULE_COSINE, SCHEDULE_CONSTANT } schedule_kind;

typedef struct schedule {
  schedule_kind kind;
  float peak;    /* --lr */
  long warmup;   /* steps rising linearly to peak: step s (0-based) gets peak * (s + 1) / warmup */
  long total;    /* steps of the whole run (epochs * steps per epoch) */
} schedule;

/* linear | cosine | constant (the names --lr-schedule accepts); the kind via *out, 0 on success. */
int schedule_parse(const char *name, schedule_kind *out);
/* The learning rate of step s (0-based). */
float schedule_lr(const schedule *sc, long s);

#endif
