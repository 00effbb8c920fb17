/* dist.h: apex-train --distributed, data-parallel training on the ranks that `mpirun -np N` starts.
 *
 * Every rank builds the same model from the same seed (or loads the same checkpoint), trains on its
 * shard of each step's items (dataset.h) and all-reduces the gradients through apex_ddp, whose amp
 * callbacks make every rank skip the same overflow steps; so every rank holds the same training
 * state after every step, and dist_check_identical verifies it at the end.
 *
 * Output: only rank 0 prints progress, writes the log and the checkpoints. Setup (flags, data,
 * model, checkpoint checks) runs alike on every rank and so fails alike: ranks other than 0 capture
 * their stderr until dist_agree, which prints a rank's own message only when rank 0 did not fail,
 * so a bad input is still one line. Without --distributed the same code runs with a one-process
 * group (apex_pg_create_local) and no DDP, and trains exactly as before.
 *
 * Every dist_* call that communicates is collective: every rank calls it at the same point. */
#ifndef APEX_TRAIN_DIST_H
#define APEX_TRAIN_DIST_H

#include <stdint.h>
#include <stdio.h>

#include "apex/apex.h"
#include "args.h"
#include "models.h"

typedef struct dist {
  int on;                 /* --distributed */
  int rank, world;
  apex_pg *pg;            /* MPI with --distributed, else local (world size 1): the host's agreements */
  apex_pg *dev_pg;        /* --distributed --device cuda: NCCL, for the gradients, SyncBatchNorm and buffers */
  apex_ddp *ddp;          /* --distributed: the model's DDP, from dist_wrap */
  apex_amp_backward_options bo; /* the DDP's amp callbacks */
  int saved_stderr;       /* while capturing: the real stderr; -1 otherwise */
  FILE *capture;
} dist;

/* Starts capturing stderr when the launcher says this process is a rank other than 0. Call first
 * in main, before any message can be printed. */
void dist_begin(dist *d);
/* 1 when this process should stay quiet (rank > 0 of an mpirun job), also before dist_init. */
int dist_quiet(const dist *d);
/* Makes the process group: MPI for --distributed, local otherwise. Refuses, with one line on stderr
 * and non-zero: --distributed in a build without MPI or outside mpirun, and a run without
 * --distributed that mpirun started as one of several ranks (each would train alone and write the
 * same files). */
int dist_init(dist *d, const train_args *a);
/* Collective: every rank says whether its setup failed; returns 1 when any rank's did. Then, or
 * with `last`, ends the capture of stderr: a rank other than 0 whose setup failed prints what it
 * captured when rank 0 did not fail (rank 0 has said it otherwise). */
int dist_agree(dist *d, int failed, int last);
/* --sync-bn: makes the model's batch norms SyncBatchNorm over the ranks. One line and non-zero when
 * the model has none. */
int dist_sync_bn(dist *d, train_model *tm, const char *model_name);
/* --distributed: wraps the model in a DDP (collective: checks that every rank's model agrees and
 * copies rank 0's weights) and attaches it to g. Call after apex_amp_initialize and after resuming.
 * Nothing without --distributed. One line and non-zero on failure. */
int dist_wrap(dist *d, train_model *tm, apex_graph *g);
/* The group the model's own tensors travel on: NCCL for --device cuda with --distributed, else pg. */
apex_pg *dist_model_pg(dist *d);
/* Options for apex_amp_backward: the DDP's callbacks, or NULL without --distributed. */
const apex_amp_backward_options *dist_backward_options(dist *d);
/* Collective: v[0..n) summed over the ranks in place (f32: exact for whole numbers below 2^24). */
int dist_sum(dist *d, double *v, int n);
/* Collective: copies rank 0's buffers (batch norm running statistics) to every rank. Without
 * --sync-bn each rank's follow its own batches, as in PyTorch's DDP, whose broadcast_buffers also
 * makes rank 0's win; this is done before evaluating and before saving. */
int dist_sync_buffers(dist *d, train_model *tm);
/* Collective: checks that every rank holds the same training state (ckpt_state_hash). Sets *hash;
 * on a difference rank 0 prints one line naming the first rank that differs, and all return
 * non-zero. */
int dist_check_identical(dist *d, const train_model *tm, apex_amp *amp, apex_optimizer *opt, uint64_t *hash);
/* Frees the DDP (after the graphs it was attached to) and the group; ends a capture still open. */
void dist_free(dist *d);

#endif
