/* bench_ddp.c: data-parallel training of the benchmark CNN over MPI, on this machine's cores.
 *
 *   ddp_cnn_train_2x1          samples/s of an f32 training step of the CNN (bench_models.h: forward,
 *                              cross-entropy, backward, fused AdamW) at a global batch of 128 on 2 ranks
 *                              x 1 thread: 64 per rank, gradients averaged by apex_ddp with its default
 *                              buckets (as apex-train --distributed). Peer: the same global batch in one
 *                              process on 2 threads without DDP, measured by this program before it
 *                              re-runs itself under mpirun; ratio = 2x1 / 1x2.
 *   ddp_allreduce_hidden_BUCKET  the fraction of the gradient all-reduce hidden behind backward with
 *                              buckets of BUCKET bytes, 1 - wait_overlap / wait_delay. wait_* is the
 *                              time a step spends in apex_ddp_finish (the least over steps and ranks:
 *                              see measure_ddp). With
 *                              delay_allreduce nothing is reduced during backward, so finish does the
 *                              whole all-reduce (copies included): wait_delay is its full cost on the
 *                              step's critical path. With buckets posted during backward, finish only
 *                              waits for what backward did not cover. 1: all hidden; 0: none (a single
 *                              bucket, completed by the last gradient, overlaps only its copies).
 *                              ratio = wait_delay / wait_overlap, peer = delay_allreduce. The all-reduce
 *                              is a small part of this step (well under a millisecond for the CNN's
 *                              1.7 MB on one machine, against ~60-100 ms of compute), so overlap
 *                              barely moves samples/s here; it matters where the network is slower.
 *
 * Every rank runs the same fixed number of steps (collectives need the same sequence everywhere), and
 * the step figure is the best step, as bench_best's; bench/run starts this as a plain program, and it
 * re-runs itself under `mpirun -np 2` with OMP_NUM_THREADS=1 (bench_relaunch_mpi), handing the peer's
 * figure over in APEX_BENCH_DDP_PEER. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>

#include "apex/apex.h"
#include "bench_models.h"
#include "bench_util.h"

enum { GLOBAL_BATCH = 128, WARMUP = 3, REPS = 20 };

typedef struct step_ctx {
  apex_model *m;
  apex_module *net;
  apex_graph *g;
  apex_optimizer *opt;
  apex_ddp *ddp; /* NULL: one process */
  apex_tensor *x;
  int64_t labels[GLOBAL_BATCH];
} step_ctx;

/* A CNN training context for `batch` samples, wrapped in a DDP over pg when pg is not NULL. */
static int ctx_init(step_ctx *c, int64_t batch, apex_pg *pg, const apex_ddp_options *o) {
  c->m = apex_model_create(&(apex_model_options){.seed = 2});
  c->net = bench_cnn(c->m);
  c->g = apex_graph_create();
  c->ddp = pg ? apex_ddp_create(pg, c->m, o) : NULL;
  if (pg && (!c->ddp || apex_ddp_attach(c->ddp, c->g) != APEX_OK)) return -1;
  size_t np = apex_model_num_params(c->m);
  apex_tensor **ps = malloc(np * sizeof *ps), **gs = malloc(np * sizeof *gs);
  for (size_t i = 0; i < np; i++) {
    ps[i] = apex_var_value(apex_model_param(c->m, i, NULL));
    gs[i] = apex_var_grad(apex_model_param(c->m, i, NULL));
  }
  c->opt = apex_optimizer_create(APEX_OPTIM_ADAMW, &(apex_optim_options){.lr = 1e-3f, .weight_decay = 1e-2f});
  apex_status st = apex_optimizer_add_group(c->opt, ps, (int)np, gs, (int)np, NULL, NULL);
  free(ps);
  free(gs);
  c->x = apex_tensor_create(APEX_F32, 4, (int64_t[]){batch, 1, 28, 28});
  if (st != APEX_OK || !c->x) return -1;
  apex_rng r = apex_rng_init(3 + (uint64_t)(pg ? apex_pg_rank(pg) : 0));
  apex_rng_normal(&r, apex_tensor_data(c->x), apex_tensor_numel(c->x), 0.0f, 1.0f);
  for (int i = 0; i < batch; i++) c->labels[i] = (i * 7) % 10;
  return 0;
}

static void ctx_free(step_ctx *c) {
  apex_tensor_destroy(c->x);
  apex_optimizer_destroy(c->opt);
  apex_graph_destroy(c->g); /* before the DDP, whose hook it holds */
  apex_ddp_destroy(c->ddp);
  apex_model_destroy(c->m);
}

/* One training step; returns the seconds spent in apex_ddp_finish (0 without DDP), or -1. */
static double step(step_ctx *c) {
  apex_var *loss = apex_cross_entropy(c->g, apex_module_forward(c->net, c->g, apex_graph_input(c->g, c->x, 0)), c->labels, NULL);
  apex_model_zero_grad(c->m);
  if (!loss || apex_backward(loss, NULL) != APEX_OK) return -1;
  double t0 = bench_now();
  if (c->ddp && apex_ddp_finish(c->ddp) != APEX_OK) return -1;
  double wait = c->ddp ? bench_now() - t0 : 0;
  if (apex_optimizer_step(c->opt, 1.0f, 0) != APEX_OK) return -1;
  apex_graph_reset(c->g);
  return wait;
}

/* Runs WARMUP + REPS steps; *best is the fastest step, *wait the least time spent in finish. With
 * DDP the ranks meet at a barrier before each step (outside the timing), so that a step's wait is
 * not the other rank's lateness from the step before. */
static int measure(step_ctx *c, apex_pg *pg, double *best, double *wait) {
  *best = *wait = 1e300;
  for (int i = 0; i < WARMUP + REPS; i++) {
    if (pg) apex_pg_barrier(pg);
    double t0 = bench_now(), w = step(c), t = bench_now() - t0;
    if (w < 0) {
      fprintf(stderr, "bench_ddp: step failed: %s\n", apex_last_error());
      return -1;
    }
    if (i < WARMUP) continue;
    if (w < *wait) *wait = w;
    if (t < *best) *best = t;
  }
  return 0;
}

/* Best step time of CNN training with DDP options o on every rank of pg, and the least wait in
 * finish over steps and ranks. A rank's wait also holds the time it waits for a slower rank to reach
 * the all-reduce (other work on a shared machine slows one rank's backward more than the other's):
 * the least wait over steps and ranks is the one with the least such skew, the closest to the
 * all-reduce's own exposed cost. */
static int measure_ddp(apex_pg *pg, const apex_ddp_options *o, double *best, double *wait) {
  step_ctx c = {0};
  int rc = ctx_init(&c, GLOBAL_BATCH / apex_pg_world_size(pg), pg, o);
  if (rc == 0) rc = measure(&c, pg, best, wait);
  else fprintf(stderr, "bench_ddp: %s\n", apex_last_error());
  ctx_free(&c);
  apex_tensor *t = apex_tensor_create(APEX_F32, 0, NULL);
  if (rc == 0 && t) {
    apex_tensor_set(t, 0, (float)-*wait); /* the least over ranks, as a MAX of negatives */
    rc = apex_pg_allreduce(pg, t, APEX_REDUCE_MAX) == APEX_OK ? 0 : -1;
    *wait = -apex_tensor_get(t, 0);
  }
  apex_tensor_destroy(t);
  return rc;
}

/* Under mpirun: the 2x1 figure against the peer's, and the hidden fraction for two bucket sizes. */
static void ranks(int argc, char **argv) {
  apex_pg *pg = apex_pg_create_mpi(NULL);
  if (!pg) {
    bench_skip("ddp", apex_last_error());
    return;
  }
  int root = apex_pg_rank(pg) == 0;
  if (apex_pg_world_size(pg) != 2) {
    if (root) bench_skip("ddp", "needs exactly 2 ranks");
    apex_pg_destroy(pg);
    return;
  }
  double best, wait;
  if (bench_wanted(argc, argv, "ddp_cnn_train_2x1") && measure_ddp(pg, NULL, &best, &wait) == 0 && root) {
    const char *peer = getenv("APEX_BENCH_DDP_PEER");
    double peer_sps = peer ? atof(peer) : 0, sps = GLOBAL_BATCH / best;
    if (peer_sps > 0) bench_report("ddp_cnn_train_2x1", sps, "samples/s", sps / peer_sps, "1x2_threads");
    else bench_skip("ddp_cnn_train_2x1", "the 1-process peer was not measured (run this program without mpirun)");
  }
  /* The CNN's gradients are 1.7 MB: 25 MiB (the default) makes one bucket, 256 KiB about eight. */
  const size_t buckets[2] = {(size_t)25 << 20, (size_t)256 << 10};
  for (int k = 0; k < 2; k++) {
    char name[64];
    snprintf(name, sizeof name, "ddp_allreduce_hidden_%zu%s", buckets[k] >> (k ? 10 : 20), k ? "KB" : "MB");
    if (!bench_wanted(argc, argv, name)) continue;
    double best_o, wait_o, best_d, wait_d;
    if (measure_ddp(pg, &(apex_ddp_options){.bucket_bytes = buckets[k]}, &best_o, &wait_o) != 0 ||
        measure_ddp(pg, &(apex_ddp_options){.bucket_bytes = buckets[k], .delay_allreduce = 1}, &best_d, &wait_d) != 0)
      break;
    double hidden = wait_d > 0 ? 1.0 - wait_o / wait_d : 0;
    if (root) bench_report(name, hidden < 0 ? 0 : hidden, "fraction", wait_o > 0 ? wait_d / wait_o : 0, "delay_allreduce");
  }
  apex_pg_destroy(pg);
}

int main(int argc, char **argv) {
  if (!bench_wanted(argc, argv, "ddp_cnn_train_2x1") && !bench_wanted(argc, argv, "ddp_allreduce_hidden")) return 0;
  if (!apex_pg_mpi_available()) {
    bench_skip("ddp", "apex was built without MPI (APEX_MPI=OFF or MPI not found)");
    return 0;
  }
  if (bench_launched_by_mpi()) {
    ranks(argc, argv);
    return 0;
  }
  /* The peer: one process on 2 threads, measured before the ranks start so that they do not compete. */
  if (bench_wanted(argc, argv, "ddp_cnn_train_2x1")) {
    apex_set_num_threads(2);
    step_ctx c = {0};
    double best, wait;
    if (ctx_init(&c, GLOBAL_BATCH, NULL, NULL) == 0 && measure(&c, NULL, &best, &wait) == 0) {
      char v[64];
      snprintf(v, sizeof v, "%.6g", GLOBAL_BATCH / best);
      setenv("APEX_BENCH_DDP_PEER", v, 1);
    }
    ctx_free(&c);
  }
  bench_relaunch_mpi("ddp", 2, argc, argv);
  return 0;
}
