/* bench_util.h: timing and reporting shared by the benchmarks.
 *
 * Every figure is printed as one line
 *     bench NAME VALUE UNIT ratio=R peer=PEER isa=ISA threads=N
 * where R = apex's speed / the peer's speed, both measured in the same run, so that a noisy shared
 * machine moves both alike, ISA is the CPU path apex ran (apex_cpu_isa_name of apex_cpu_max_isa)
 * and N the threads apex's next loop uses (fewer than asked when other processes hold cores). */
#ifndef APEX_BENCH_UTIL_H
#define APEX_BENCH_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* Monotonic wall time in seconds. */
double bench_now(void);

/* Runs fn(ctx) `warmup` times, then repeatedly until at least min_seconds and min_reps have passed;
 * returns the best (smallest) time of one call in seconds. Best-of is the figure least disturbed by
 * other work on the machine. */
double bench_best(void (*fn)(void *), void *ctx, int warmup, int min_reps, double min_seconds);

/* Prints the bench line for a throughput: apex moved `bytes` in apex_s seconds, the peer moved
 * peer_bytes in peer_s seconds. Value is apex's GB/s. */
void bench_report_gbs(const char *name, double bytes, double apex_s, double peer_bytes, double peer_s, const char *peer);

/* Prints a bench line for a measured value and a ratio computed by the caller. */
void bench_report(const char *name, double value, const char *unit, double ratio, const char *peer);

/* The Python with today's PyTorch from PyPI (bench/setup_peers.sh): $APEX_PEERS_PYTHON, else
 * $APEX_ROOT/.peers/bin/python; NULL when neither exists (the peer lines then say "skipped: no PyPI
 * torch"). Debian's /usr/bin/python3 (torch 1.13) is the tests' oracle, never a peer. */
const char *bench_peer_python(void);

/* Runs `bench_peer_python() bench/peer_nn.py --measure ARGS` and returns the number it prints
 * (samples/s), 0 when it cannot run or prints none. */
double bench_peer_measure(const char *args);

/* Prints a line saying a figure was skipped and why. */
void bench_skip(const char *name, const char *why);

/* memcpy split over the OpenMP threads in fixed blocks: the bandwidth peer. */
void bench_parallel_memcpy(void *dst, const void *src, size_t bytes);

/* 1 when this process was started by mpirun (Open MPI, MPICH/PMI or PMIx environment). */
int bench_launched_by_mpi(void);

/* Re-runs this program with its arguments under `mpirun --allow-run-as-root --oversubscribe -np np`,
 * one OpenMP thread per rank (the benchmarks that need MPI ranks are started as plain programs by
 * bench/run). Returns only when that is impossible, after printing a skip line for `name` saying why. */
void bench_relaunch_mpi(const char *name, int np, int argc, char **argv);

/* 1 if NAME was asked for on the command line (or nothing was asked for). */
int bench_wanted(int argc, char **argv, const char *name);

/* The GPT-2 benchmarks' fixed batch (bench_gpt2_stack, gpt2_loss_dump): bt tokens of a
 * uniform random stream from apex's RNG seeded 42, over GPT-2's 50,257 real tokens (or the vocabulary, when
 * smaller: the padded rows up to 50,304 are never drawn), each position's target the token after it. 1 when
 * out of memory, else 0. */
int bench_gpt2_batch(int64_t *tokens, int64_t *targets, size_t bt, int vocab);

/* The times the host has waited for the GPU so far (apex_memory.waits of the CUDA backend); only where a
 * GPU is in use. */
unsigned long long bench_cuda_waits(void);

#endif
