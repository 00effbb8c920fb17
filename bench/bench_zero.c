/* bench_zero.c: the sharded optimizer (zero.h) against DDP, over MPI on this machine's cores.
 *
 *   zero_state_bytes_gpt_c256_O2_Nx1  the optimizer state one rank holds (the most over ranks: f32
 *                              masters and AdamW's two moments) for bench_models.h's gpt_c256 in bf16
 *                              with f32 masters (O2), sharded over N = 1, 2, 4 ranks. Peer: the unsharded
 *                              optimizer a DDP rank holds (apex_optimizer_state_size of the same AdamW);
 *                              ratio = peer / sharded, ideally N. bound_ok=1 when it is at most 1/N of the
 *                              peer plus one bucket of the collectives (the bar; the bucket is
 *                              bucket_bytes of the sharded optimizer, 512 KiB here).
 *   zero_grad_bytes_gpt_c256_O2_Nx1  the gradient memory one rank holds while training gpt_c256 in bf16
 *                              (a few steps of batch 1 each; the most over ranks), measured by the library:
 *                              stage 2 with overlap attached to the backward and clipping, the most bytes the
 *                              gradient tensors held at once during the last step (apex_zero_grad_bytes: they
 *                              are released as their buckets start) plus the shard and the collectives'
 *                              buffers (apex_zero_buffer_bytes). Peer: DDP in the same run on the same
 *                              model, its gradient tensors after the backward (all whole) plus its
 *                              Reducer's buckets (apex_reducer_buffer_bytes); ratio = peer / sharded.
 *                              bound_ok=1 when the sharded figure is at most 1/N of DDP's plus one bucket
 *                              and the rounding of the cuts (a rank's range may exceed 1/N by half a
 *                              multi-tensor tile, and every segment is padded to the largest: one tile of
 *                              f32 allowed). amp's f32 master gradients, which a DDP program under O2
 *                              also holds, are not counted (neither run makes them here).
 *   zero_cnn_train_2x1         samples/s of an f32 training step of the CNN (bench_models.h: forward,
 *                              cross-entropy, backward, fused AdamW) at a global batch of 128 on 2 ranks
 *                              x 1 thread, the optimizer sharded (stage 2: reduce-scatter in buckets
 *                              overlapped with the backward, each bucket's gradients released as it
 *                              starts, the shard's step, the all-gather of the parameters). Peer: the
 *                              same step with apex_ddp (its default buckets, overlapped with backward)
 *                              in the same run, alternating blocks of steps so that both see the same
 *                              machine; ratio = sharded / DDP (>= 1/1.1 is the bar), the
 *                              range of each block's best step beside it.
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

/* Bytes the gradient tensors hold now: those stage 2 released hold none (apex_tensor_released). */
static size_t held_bytes(apex_tensor *const *gs, size_t n) {
  size_t b = 0;
  for (size_t i = 0; i < n; i++)
    if (!apex_tensor_released(gs[i])) b += apex_tensor_nbytes(gs[i]);
  return b;
}

enum { MEM_BATCH = 1, MEM_STEPS = 3 };
static const size_t MEM_BUCKET = (size_t)512 << 10; /* the largest gradient of gpt_c256 in bf16 (fc: 256 x 1024) */

/* DDP's rank in training: the gradient tensors after the backward (every one, whole) and the Reducer's
 * buckets; its optimizer's state (f32 masters and AdamW's moments). */
static int ddp_memory(apex_pg *pg, size_t *grads, size_t *buckets, size_t *state) {
  bench_train r;
  bench_train_init(&r, BENCH_GPT_C256, MEM_BATCH, "O2"); /* bf16 parameters, AdamW with f32 masters */
  size_t np = apex_model_num_params(r.m);
  apex_tensor **ps = malloc(np * sizeof *ps), **gs = malloc(np * sizeof *gs);
  params_of(r.m, ps, gs);
  apex_ddp *ddp = apex_ddp_create(pg, r.m, NULL);
  int rc = ddp && apex_ddp_attach(ddp, r.g) == APEX_OK && apex_optimizer_state_size(r.opt, state) == APEX_OK ? 0 : -1;
  for (int s = 0; rc == 0 && s < MEM_STEPS; s++) {
    apex_var *loss = bench_train_loss(&r);
    apex_model_zero_grad(r.m);
    rc = apex_backward(loss, NULL) == APEX_OK && apex_ddp_finish(ddp) == APEX_OK ? 0 : -1;
    *grads = held_bytes(gs, np);
    apex_graph_reset(r.g);
  }
  if (rc == 0) *buckets = apex_reducer_buffer_bytes(apex_ddp_reducer(ddp));
  apex_ddp_destroy(ddp);
  free(ps);
  free(gs);
  bench_train_free(&r);
  return rc;
}

/* The sharded rank in training, stage 2 with overlap attached to the backward and clipping: the most
 * the gradient tensors held at once during the last step (apex_zero_grad_bytes), the shard and the collectives'
 * buffers, and the shard's optimizer state. */
static int zero_memory(apex_pg *pg, size_t *grads, size_t *buffers, size_t *state) {
  bench_train r;
  bench_train_init(&r, BENCH_GPT_C256, MEM_BATCH, "O2");
  size_t np = apex_model_num_params(r.m);
  apex_tensor **ps = malloc(np * sizeof *ps), **gs = malloc(np * sizeof *gs);
  params_of(r.m, ps, gs);
  apex_zero *z = apex_zero_create(pg, ps, gs, (int)np, APEX_OPTIM_ADAMW, &(apex_optim_options){.lr = 1e-3f, .weight_decay = 1e-2f},
                                  &(apex_zero_options){.stage = 2, .bucket_bytes = MEM_BUCKET, .overlap = 1});
  int rc = z && apex_zero_attach(z, r.g) == APEX_OK ? 0 : -1;
  for (int s = 0; rc == 0 && s < MEM_STEPS; s++) { /* the first backward starts from the whole gradients made with the model */
    apex_var *loss = bench_train_loss(&r);
    apex_model_zero_grad(r.m);
    rc = apex_backward(loss, NULL) == APEX_OK && apex_zero_reduce_grads(z) == APEX_OK ? 0 : -1;
    /* clipped, as apex-train's steps are: its norm is summed from the shards, no gradient made whole */
    if (rc == 0) rc = apex_zero_clip_grad_norm(z, 1.0f, 1.0f, NULL) == APEX_OK ? 0 : -1;
    apex_zero_grad_bytes(z, grads);
    if (rc == 0) rc = apex_zero_step(z, 1.0f, NULL) == APEX_OK ? 0 : -1;
    apex_graph_reset(r.g);
  }
  if (rc == 0) *buffers = apex_zero_buffer_bytes(z), *state = apex_zero_state_bytes(z);
  apex_zero_destroy(z);
  free(ps);
  free(gs);
  bench_train_free(&r);
  return rc;
}

static void memory(apex_pg *pg) {
  int world = apex_pg_world_size(pg), root = apex_pg_rank(pg) == 0;
  char name[64];
  snprintf(name, sizeof name, "zero_state_bytes_gpt_c256_O2_%dx1", world);
  size_t dg = 0, db = 0, ds = 0, zg = 0, zb = 0, zs = 0;
  if (ddp_memory(pg, &dg, &db, &ds) != 0 || zero_memory(pg, &zg, &zb, &zs) != 0) {
    if (root) bench_skip(name, apex_last_error());
    return;
  }
  double state = rank_max(pg, (double)zs), zgrad = rank_max(pg, (double)zg), zbuf = rank_max(pg, (double)zb);
  double dgrad = rank_max(pg, (double)dg), dbuck = rank_max(pg, (double)db);
  double bucket = (double)MEM_BUCKET, slack = (double)APEX_MT_TILE * 4.0;
  if (!root) return;
  bench_report(name, state, "bytes", state > 0 ? (double)ds / state : 0, "ddp_unsharded_state");
  printf("  %s: DDP rank %zu bytes, sharded rank %.0f bytes, bound 1/%d + one bucket = %.0f bytes: bound_ok=%d\n", name, ds, state,
         world, (double)ds / world + bucket, state <= (double)ds / world + bucket);
  snprintf(name, sizeof name, "zero_grad_bytes_gpt_c256_O2_%dx1", world);
  double zall = zgrad + zbuf, dall = dgrad + dbuck, bound = dall / world + bucket + slack;
  bench_report(name, zall, "bytes", zall > 0 ? dall / zall : 0, "ddp_grads_and_buckets");
  printf("  %s: gradient memory of a rank in training (bf16, %d steps of batch %d, the most over ranks): DDP %.0f bytes "
         "(gradient tensors %.0f, whole after each backward, + Reducer buckets %.0f); sharded stage 2 with overlap %.0f bytes "
         "(gradient tensors at most %.0f at once during the last step, clipped, released as their %.0f-byte buckets start, + shard "
         "and buffers %.0f); bound 1/%d of DDP's + one bucket + one tile = %.0f bytes: bound_ok=%d\n",
         name, MEM_STEPS, MEM_BATCH, dall, dgrad, dbuck, zall, zgrad, bucket, zbuf, world, bound, zall <= bound);
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
    /* Blocks of REPS steps, DDP's and the sharded one's in turn: each block's best step, and their range. */
    double bd = 1e300, bz = 1e300, wd = 1e300, wz = 1e300, hd = 0, hz = 0;
    int rc = best_of(&d, pg, WARMUP, &wd) | best_of(&z, pg, WARMUP, &wz);
    for (int b = 0; rc == 0 && b < BLOCKS; b++) {
      double kd = 1e300, kz = 1e300;
      rc = best_of(&d, pg, REPS, &kd) | best_of(&z, pg, REPS, &kz);
      bd = kd < bd ? kd : bd, bz = kz < bz ? kz : bz, hd = kd > hd ? kd : hd, hz = kz > hz ? kz : hz;
    }
    if (rc != 0) {
      if (root) bench_skip(name, apex_last_error());
    } else if (root) {
      bench_report(name, GLOBAL_BATCH / bz, "samples/s", bd / bz, "ddp_2x1");
      printf("  %s: best step %.2f ms sharded (stage 2, gradients released), %.2f ms DDP: sharded / DDP = %.3f; each of %d "
             "alternating blocks' best: sharded %.2f-%.2f ms, DDP %.2f-%.2f ms\n",
             name, 1e3 * bz, 1e3 * bd, bz / bd, BLOCKS, 1e3 * bz, 1e3 * hz, 1e3 * bd, 1e3 * hd);
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
    if (mem) memory(pg);
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
