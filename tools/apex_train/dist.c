/* dist.c: apex-train's data parallelism over MPI (see dist.h): the process group, the capture of
 * setup errors on ranks other than 0, the DDP and the collectives the training loop needs. */
#define _POSIX_C_SOURCE 200809L
#include "dist.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "report.h"

/* The rank or world size the launcher put in the environment (Open MPI, MPICH/PMI, PMIx), or -1.
 * MPI is not initialised yet when this is needed: the flags are parsed first. */
static long launcher_value(int size) {
  static const char *const rank_vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"};
  static const char *const size_vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"};
  const char *const *vars = size ? size_vars : rank_vars;
  int n = size ? 2 : 3;
  for (int i = 0; i < n; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v) return strtol(v, NULL, 10);
  }
  return -1;
}

void dist_begin(dist *d) {
  memset(d, 0, sizeof *d);
  d->world = 1;
  d->saved_stderr = -1;
  if (launcher_value(0) <= 0) return;
  fflush(stderr);
  d->capture = tmpfile();
  d->saved_stderr = d->capture ? dup(STDERR_FILENO) : -1;
  if (d->saved_stderr < 0 || dup2(fileno(d->capture), STDERR_FILENO) < 0) {
    /* Cannot capture: this rank prints too, which is only noisier. */
    if (d->saved_stderr >= 0) close(d->saved_stderr);
    if (d->capture) fclose(d->capture);
    d->capture = NULL;
    d->saved_stderr = -1;
  }
}

int dist_quiet(const dist *d) { return d->rank > 0 || launcher_value(0) > 0; }

/* Restores stderr; with `print`, first copies what was captured to it. */
static void end_capture(dist *d, int print) {
  if (d->saved_stderr < 0) return;
  fflush(stderr);
  dup2(d->saved_stderr, STDERR_FILENO);
  close(d->saved_stderr);
  d->saved_stderr = -1;
  if (print) {
    char buf[4096];
    size_t n, total = 0;
    rewind(d->capture);
    while ((n = fread(buf, 1, sizeof buf, d->capture)) > 0) total += fwrite(buf, 1, n, stderr);
    if (total == 0) fprintf(stderr, "apex-train: rank %d: setup failed\n", d->rank);
  }
  fclose(d->capture);
  d->capture = NULL;
}

int dist_init(dist *d, const train_args *a) {
  if (!a->distributed) {
    long world = launcher_value(1);
    if (world > 1) {
      fprintf(stderr, "apex-train: started by mpirun as one of %ld ranks without --distributed: each would train alone and write "
                      "the same files; add --distributed, or run a single process\n", world);
      return 2;
    }
    d->pg = apex_pg_create_local();
    if (!d->pg) {
      fprintf(stderr, "apex-train: out of memory\n");
      return 1;
    }
    return 0;
  }
  if (!apex_pg_mpi_available()) {
    fprintf(stderr, "apex-train: --distributed: this build of apex has no MPI (install Open MPI, e.g. `apt-get install "
                    "libopenmpi-dev openmpi-bin`, and configure again: MPI is detected at every configure unless -DAPEX_MPI=OFF)\n");
    return 2;
  }
  if (launcher_value(0) < 0) {
    fprintf(stderr, "apex-train: --distributed: not started by mpirun; run `mpirun -np N apex-train --distributed ...`\n");
    return 2;
  }
  d->pg = apex_pg_create_mpi(NULL);
  if (!d->pg) {
    fprintf(stderr, "apex-train: --distributed: %s\n", one_line(apex_last_error()));
    return 1;
  }
  /* On GPUs the model's tensors go over NCCL (which also gives each rank of a host its own GPU, so it
   * comes before any CUDA allocation); the host's small agreements stay on MPI. */
  if (strcmp(a->device, "cuda") == 0) {
    if (!apex_pg_nccl_available()) {
      fprintf(stderr, "apex-train: --distributed --device cuda: this build of apex has no NCCL process group (configure with CUDA, MPI and NCCL)\n");
      return 2;
    }
    d->dev_pg = apex_pg_create_nccl(NULL);
    if (!d->dev_pg) {
      fprintf(stderr, "apex-train: --distributed --device cuda: %s\n", one_line(apex_last_error()));
      return 1;
    }
  }
  d->on = 1;
  d->rank = apex_pg_rank(d->pg);
  d->world = apex_pg_world_size(d->pg);
  return 0;
}

int dist_agree(dist *d, int failed, int last) {
  int64_t n = d->world;
  apex_tensor *mine = apex_tensor_create(APEX_F32, 0, NULL), *all = apex_tensor_create(APEX_F32, 1, &n);
  int any = 1, rank0 = 1;
  if (mine && all) {
    apex_tensor_set(mine, 0, failed ? 1.0f : 0.0f);
    if (apex_pg_allgather(d->pg, mine, all) == APEX_OK) {
      any = 0;
      for (int r = 0; r < d->world; r++) any |= apex_tensor_get(all, (size_t)r) != 0;
      rank0 = apex_tensor_get(all, 0) != 0;
    } else if (!failed) {
      fprintf(stderr, "apex-train: %s\n", one_line(apex_last_error()));
    }
  }
  apex_tensor_destroy(mine);
  apex_tensor_destroy(all);
  if (any || last) end_capture(d, failed && !rank0);
  return any;
}

apex_pg *dist_model_pg(dist *d) { return d->dev_pg ? d->dev_pg : d->pg; }

int dist_sync_bn(dist *d, train_model *tm, const char *model_name) {
  int count = 0;
  if (apex_convert_sync_batchnorm(tm->m, dist_model_pg(d), &count) != APEX_OK) {
    fprintf(stderr, "apex-train: --sync-bn: %s\n", one_line(apex_last_error()));
    return 1;
  }
  if (count == 0) {
    fprintf(stderr, "apex-train: --sync-bn: the %s has no batch norm to synchronise (the cnn has)\n", model_name);
    return 2;
  }
  return 0;
}

int dist_wrap(dist *d, train_model *tm, apex_graph *g) {
  if (!d->on) return 0;
  d->ddp = apex_ddp_create(dist_model_pg(d), tm->m, NULL);
  if (!d->ddp || apex_ddp_attach(d->ddp, g) != APEX_OK) {
    fprintf(stderr, "apex-train: --distributed: %s\n", one_line(apex_last_error()));
    return 1;
  }
  d->bo = (apex_amp_backward_options){.before_unscale = apex_ddp_amp_before_unscale,
                                      .reduce_overflow = apex_ddp_amp_reduce_overflow, .hook_ctx = d->ddp};
  return 0;
}

const apex_amp_backward_options *dist_backward_options(dist *d) { return d->ddp ? &d->bo : NULL; }

int dist_sum(dist *d, double *v, int n) {
  int64_t len = n;
  apex_tensor *t = apex_tensor_create(APEX_F32, 1, &len);
  apex_status st = t ? APEX_OK : APEX_ERR_OUT_OF_MEMORY;
  for (int i = 0; st == APEX_OK && i < n; i++) apex_tensor_set(t, (size_t)i, (float)v[i]);
  if (st == APEX_OK) st = apex_pg_allreduce(d->pg, t, APEX_REDUCE_SUM);
  for (int i = 0; st == APEX_OK && i < n; i++) v[i] = apex_tensor_get(t, (size_t)i);
  apex_tensor_destroy(t);
  if (st != APEX_OK) fprintf(stderr, "apex-train: rank %d: %s\n", d->rank, one_line(apex_last_error()));
  return st != APEX_OK;
}

int dist_sync_buffers(dist *d, train_model *tm) {
  if (!d->on) return 0;
  for (size_t i = 0; i < apex_model_num_buffers(tm->m); i++)
    if (apex_pg_broadcast(dist_model_pg(d), apex_model_buffer(tm->m, i, NULL), 0) != APEX_OK) {
      fprintf(stderr, "apex-train: rank %d: %s\n", d->rank, one_line(apex_last_error()));
      return 1;
    }
  return 0;
}

int dist_check_identical(dist *d, const train_model *tm, apex_amp *amp, apex_optimizer *opt, uint64_t *hash) {
  /* The 64-bit hash travels as four 16-bit pieces, which f32 holds exactly. A rank that cannot hash
   * sends -1 pieces, so that it differs rather than leaves the others waiting. */
  double h[4] = {-1, -1, -1, -1};
  int failed = ckpt_state_hash(tm, amp, opt, hash) != 0;
  for (int k = 0; k < 4 && !failed; k++) h[k] = (double)((*hash >> (16 * k)) & 0xffff);
  int64_t n4 = 4, nall = 4 * (int64_t)d->world;
  apex_tensor *mine = apex_tensor_create(APEX_F32, 1, &n4), *all = apex_tensor_create(APEX_F32, 1, &nall);
  int differs = -1; /* the first rank whose state differs from rank 0's, 0 for none, -1: unknown */
  if (mine && all) {
    for (int k = 0; k < 4; k++) apex_tensor_set(mine, (size_t)k, (float)h[k]);
    if (apex_pg_allgather(d->pg, mine, all) == APEX_OK) {
      differs = 0;
      for (int r = 0; r < d->world && !differs; r++)
        for (int k = 0; k < 4; k++) {
          float piece = apex_tensor_get(all, (size_t)(4 * r + k));
          if (piece < 0) differs = -1; /* that rank could not hash its state */
          else if (piece != apex_tensor_get(all, (size_t)k)) differs = r;
          if (differs) break;
        }
    }
  }
  apex_tensor_destroy(mine);
  apex_tensor_destroy(all);
  if (differs < 0) fprintf(stderr, "apex-train: rank %d: cannot compare the training states: %s\n", d->rank, one_line(apex_last_error()));
  else if (differs > 0 && d->rank == 0)
    fprintf(stderr, "apex-train: --distributed: rank %d's training state (weights, optimizer, loss scale) differs from rank 0's\n", differs);
  return differs != 0;
}

void dist_free(dist *d) {
  end_capture(d, 0);
  apex_ddp_destroy(d->ddp);
  apex_pg_destroy(d->dev_pg);
  apex_pg_destroy(d->pg);
  d->ddp = NULL;
  d->dev_pg = NULL;
  d->pg = NULL;
}
