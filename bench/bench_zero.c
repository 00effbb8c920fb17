/* bench_zero.c: the sharded optimizer (zero.h) against DDP, over MPI on this machine's cores.
 *
 *   zero_state_bytes_gpt_c256_O2_Nx1  the optimizer state one rank holds (the most over ranks: f32
 *                              masters and AdamW's two moments) for bench_models.h's gpt_c256 in bf16
 *                              with f32 masters (O2), sharded over N = 1, 2, 4 ranks. Peer: the unsharded
 *                              optimizer a DDP rank holds (apex_optimizer_state_size of the same AdamW);
 *                              ratio = peer / sharded, ideally N. bound_ok=1 when it is at most 1/N of the
 *                              peer plus one bucket of the collectives (the bar; the bucket is
 *                              bucket_bytes of the sharded optimizer, 1 MiB here).
 *   zero_grad_bytes_gpt_c256_O2_Nx1  the gradient memory one rank holds beside the model's own gradient
 *                              tensors (which autograd keeps whole on every rank, sharded or not): the
 *                              shard of the reduced gradients and one 1 MiB bucket for the collectives
 *                              (apex_zero_buffer_bytes, the most over ranks). Peer: DDP's Reducer, whose
 *                              buckets hold every gradient once in its dtype; ratio = peer / sharded.
 *                              bound_ok=1 when it is at most 1/N of the peer plus one bucket and the
 *                              rounding of the cuts (a rank's range may exceed 1/N by half a multi-tensor
 *                              tile, and every segment is padded to the largest: one tile of f32 allowed).
 *   zero_cnn_train_2x1         samples/s of an f32 training step of the CNN (bench_models.h: forward,
 *                              cross-entropy, backward, fused AdamW) at a global batch of 128 on 2 ranks
 *                              x 1 thread, the optimizer sharded (stage 2: reduce-scatter in buckets
 *                              overlapped with the backward, the shard's step, the all-gather of the
 *                              parameters). Peer: the
 *                              same step with apex_ddp (its default buckets, overlapped with backward)
 *                              in the same run, alternating blocks of steps so that both see the same
 *                              machine; ratio = sharded / DDP (>= 1/1.1 is the bar).
 *
 * bench/run starts this as a plain program; it runs itself under `mpirun -np N` (one OpenMP thread
 * per rank) once per rank count, waiting for each. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "apex/apex.h"
#include "apex/mt_apply.h"
#include "bench_models.h"
#include "bench_util.h"

enum { GLOBAL_BATCH = 128, WARMUP = 3, BLOCKS = 4, REPS = 5 };

/* The most of a value over the ranks. */
static double rank_max(apex_pg *pg, double v) {
  apex_tensor *t = apex_tensor_create(APEX_F32, 0, NULL);
  apex_tensor_set(t, 0, (float)v);
  apex_pg_allreduce(pg, t, APEX_REDUCE_MAX);
  v = apex_tensor_get(t, 0);
  apex_tensor_destroy(t);
  return v;
}

static void params_of(apex_model *m, apex_tensor **ps, apex_tensor **gs) {
  for (size_t i = 0; i < apex_model_num_params(m); i++) {
    ps[i] = apex_var_value(apex_model_param(m, i, NULL));
    gs[i] = apex_var_grad(apex_model_param(m, i, NULL));
  }
}

static void state_bytes(apex_pg *pg) {
  int world = apex_pg_world_size(pg), root = apex_pg_rank(pg) == 0;
  char name[64];
  snprintf(name, sizeof name, "zero_state_bytes_gpt_c256_O2_%dx1", world);
  bench_train r;
  bench_train_init(&r, BENCH_GPT_C256, 0, "O2"); /* bf16 parameters, AdamW with f32 masters: the DDP rank's */
  size_t np = apex_model_num_params(r.m), full = 0;
  apex_tensor **ps = malloc(np * sizeof *ps), **gs = malloc(np * sizeof *gs);
  params_of(r.m, ps, gs);
  apex_optimizer_state_size(r.opt, &full);
  size_t grads = 0, bucket = (size_t)1 << 20;
  for (size_t i = 0; i < np; i++) grads += apex_tensor_numel(gs[i]) * apex_dtype_size(apex_tensor_dtype(gs[i]));
  apex_zero *z = apex_zero_create(pg, ps, gs, (int)np, APEX_OPTIM_ADAMW, &(apex_optim_options){.lr = 1e-3f, .weight_decay = 1e-2f},
                                  &(apex_zero_options){.stage = 2, .bucket_bytes = bucket});
  if (!z) {
    if (root) bench_skip(name, apex_last_error());
  } else {
    double mine = rank_max(pg, (double)apex_zero_state_bytes(z)), held = rank_max(pg, (double)apex_zero_buffer_bytes(z));
    double slack = (double)APEX_MT_TILE * 4.0;
    if (root) {
      bench_report(name, mine, "bytes", mine > 0 ? (double)full / mine : 0, "ddp_unsharded_state");
      printf("  %s: %zu parameters, DDP rank %zu bytes, sharded rank %.0f bytes, bound 1/%d + one bucket = %.0f bytes: bound_ok=%d\n",
             name, np, full, mine, world, (double)full / world + (double)bucket, mine <= (double)full / world + (double)bucket);
      snprintf(name, sizeof name, "zero_grad_bytes_gpt_c256_O2_%dx1", world);
      bench_report(name, held, "bytes", held > 0 ? (double)grads / held : 0, "ddp_reducer_buckets");
      printf("  %s: reduced gradients and collectives: DDP rank %zu bytes (buckets of the whole model), sharded rank %.0f bytes "
             "(shard + one bucket), bound 1/%d + one bucket + one tile = %.0f bytes: bound_ok=%d; the model's own gradients, %zu bytes, on "
             "every rank in both\n",
             name, grads, held, world, (double)grads / world + (double)bucket + slack, held <= (double)grads / world + (double)bucket + slack, grads);
    }
  }
  apex_zero_destroy(z);
  free(ps);
  free(gs);
  bench_train_free(&r);
}

typedef struct ctx {
  apex_model *m;
  apex_module *net;
  apex_graph *g;
  apex_optimizer *opt; /* DDP's */
  apex_ddp *ddp;
  apex_zero *zero;
  apex_tensor *x;
  int64_t labels[GLOBAL_BATCH];
} ctx;

static int ctx_init(ctx *c, apex_pg *pg, int sharded) {
  int64_t batch = GLOBAL_BATCH / apex_pg_world_size(pg);
  c->m = apex_model_create(&(apex_model_options){.seed = 2});
  c->net = bench_cnn(c->m);
  c->g = apex_graph_create();
  size_t np = apex_model_num_params(c->m);
  apex_tensor **ps = malloc(np * sizeof *ps), **gs = malloc(np * sizeof *gs);
  params_of(c->m, ps, gs);
  const apex_optim_options oo = {.lr = 1e-3f, .weight_decay = 1e-2f};
  int rc = 0;
  if (sharded) {
    c->zero = apex_zero_create(pg, ps, gs, (int)np, APEX_OPTIM_ADAMW, &oo, &(apex_zero_options){.stage = 2, .overlap = 1});
    rc = c->zero && apex_zero_attach(c->zero, c->g) == APEX_OK ? 0 : -1;
  } else {
    c->ddp = apex_ddp_create(pg, c->m, NULL);
    c->opt = apex_optimizer_create(APEX_OPTIM_ADAMW, &oo);
    rc = c->ddp && apex_ddp_attach(c->ddp, c->g) == APEX_OK && c->opt &&
                 apex_optimizer_add_group(c->opt, ps, (int)np, gs, (int)np, NULL, NULL) == APEX_OK
             ? 0
             : -1;
  }
  free(ps);
  free(gs);
  c->x = apex_tensor_create(APEX_F32, 4, (int64_t[]){batch, 1, 28, 28});
  if (rc != 0 || !c->x) return -1;
  apex_rng r = apex_rng_init(3 + (uint64_t)apex_pg_rank(pg));
  apex_rng_normal(&r, apex_tensor_data(c->x), apex_tensor_numel(c->x), 0.0f, 1.0f);
  for (int i = 0; i < batch; i++) c->labels[i] = (i * 7) % 10;
  return 0;
}

static void ctx_free(ctx *c) {
  apex_tensor_destroy(c->x);
  apex_optimizer_destroy(c->opt);
  apex_graph_destroy(c->g);
  apex_ddp_destroy(c->ddp);
  apex_zero_destroy(c->zero);
  apex_model_destroy(c->m);
}

static int step(ctx *c) {
  apex_var *loss = apex_cross_entropy(c->g, apex_module_forward(c->net, c->g, apex_graph_input(c->g, c->x, 0)), c->labels, NULL);
  apex_model_zero_grad(c->m);
  if (!loss || apex_backward(loss, NULL) != APEX_OK) return -1;
  apex_status st;
  if (c->zero) {
    st = apex_zero_reduce_grads(c->zero);
    if (st == APEX_OK) st = apex_zero_step(c->zero, 1.0f, NULL);
  } else {
    st = apex_ddp_finish(c->ddp);
    if (st == APEX_OK) st = apex_optimizer_step(c->opt, 1.0f, 0);
  }
  apex_graph_reset(c->g);
  return st == APEX_OK ? 0 : -1;
}

/* Best step time of REPS steps (after a barrier each, outside the timing). */
static int best_of(ctx *c, apex_pg *pg, int reps, double *best) {
  for (int i = 0; i < reps; i++) {
    apex_pg_barrier(pg);
    double t0 = bench_now();
    if (step(c) != 0) return -1;
    double t = rank_max(pg, bench_now() - t0);
    if (t < *best) *best = t;
  }
  return 0;
}

static void step_time(apex_pg *pg) {
  const char *name = "zero_cnn_train_2x1";
  int root = apex_pg_rank(pg) == 0;
  ctx d = {0}, z = {0};
  if (ctx_init(&d, pg, 0) != 0 || ctx_init(&z, pg, 1) != 0) {
    if (root) bench_skip(name, apex_last_error());
  } else {
    double bd = 1e300, bz = 1e300, wd = 1e300, wz = 1e300;
    int rc = best_of(&d, pg, WARMUP, &wd) | best_of(&z, pg, WARMUP, &wz);
    for (int b = 0; rc == 0 && b < BLOCKS; b++) rc = best_of(&d, pg, REPS, &bd) | best_of(&z, pg, REPS, &bz);
    if (rc != 0) {
      if (root) bench_skip(name, apex_last_error());
    } else if (root) {
      bench_report(name, GLOBAL_BATCH / bz, "samples/s", bd / bz, "ddp_2x1");
      printf("  %s: best step %.2f ms sharded, %.2f ms DDP\n", name, 1e3 * bz, 1e3 * bd);
    }
  }
  ctx_free(&d);
  ctx_free(&z);
}

int main(int argc, char **argv) {
  int mem = bench_wanted(argc, argv, "zero_state_bytes") || bench_wanted(argc, argv, "zero_grad_bytes"), time = bench_wanted(argc, argv, "zero_cnn_train_2x1");
  if (!mem && !time) return 0;
  if (!apex_pg_mpi_available()) {
    bench_skip("zero", "apex was built without MPI (APEX_MPI=OFF or MPI not found)");
    return 0;
  }
  if (bench_launched_by_mpi()) {
    apex_pg *pg = apex_pg_create_mpi(NULL);
    if (!pg) {
      bench_skip("zero", apex_last_error());
      return 0;
    }
    if (mem) state_bytes(pg);
    if (time && apex_pg_world_size(pg) == 2) step_time(pg);
    apex_pg_destroy(pg);
    return 0;
  }
  /* One mpirun per rank count, one after the other, so that they do not compete for the cores. */
  const int counts[3] = {1, 2, 4};
  for (int k = 0; k < 3; k++) {
    if (!mem && counts[k] != 2) continue;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      bench_relaunch_mpi("zero", counts[k], argc, argv);
      _exit(0);
    }
    int status = 0;
    if (pid > 0) waitpid(pid, &status, 0);
  }
  return 0;
}
