/* threads.h: how many threads apex uses.
 *
 * apex runs its loops with OpenMP. Every result is bitwise independent of the thread count: work is
 * split into fixed-size blocks whose boundaries do not depend on the number of threads, and partial
 * reductions are combined in a fixed order.
 *
 * By default apex follows the load: once per training step (at apex_backward and
 * apex_optimizer_step, at most every 0.1 s) it measures how much of the CPUs it may run on other
 * processes used since the last look, and runs on no more threads than the cores they leave free
 * (at least 1, at most the count set or OpenMP's default). A second CPU-bound process then costs a
 * step about the share of the cores it takes, not the collapse OpenMP's spin-waiting gives when a
 * thread waits on a descheduled sibling at every parallel region. Because results do not depend on
 * the thread count, following the load changes speed, never bits. */
#ifndef APEX_THREADS_H
#define APEX_THREADS_H

#include <stddef.h>

#include "apex/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sets the number of threads apex's loops use (>= 1). Returns APEX_ERR_INVALID_ARG otherwise. */
APEX_API apex_status apex_set_num_threads(int n);
/* The number the next parallel loop of the calling thread uses: the value set, or OpenMP's default
 * if none was set, lowered to the free cores while following the load. */
APEX_API int apex_get_num_threads(void);
/* The most threads apex uses: the value apex_set_num_threads set, or OpenMP's default. */
APEX_API int apex_get_max_threads(void);
/* on != 0 (the default): follow the load as described above. 0: always use apex_get_max_threads()
 * threads (for timing a fixed thread count, or a machine reserved for one job). */
APEX_API void apex_set_threads_follow_load(int on);

/* ---- where the threads run (places.c) ----------------------------------------------------------------
 *
 * Binding narrows each OpenMP thread's affinity mask to its own place: under OMP_PLACES=cores
 * OMP_PROC_BIND=close the main thread's mask holds one core, whatever the others hold, so the mask
 * cannot say how many CPUs a program's threads have. These say it from OpenMP's places instead. */

/* The CPUs apex's threads may run on, ascending: the union of OpenMP's places when it has any
 * (OMP_PLACES, or OMP_PROC_BIND set, which makes one place a CPU), which OpenMP built from the
 * process's mask at start; else the calling thread's affinity mask (taskset, a container's cpuset,
 * mpirun's binding of a rank); else the online CPUs. Writes the first `max` of them into cpus (cpus
 * may be NULL when max is 0) and returns how many there are (at least 1). */
APEX_API int apex_threads_cpus(int *cpus, int max);
/* The CPUs a team of n threads runs on (n < 1: apex_get_max_threads()): one parallel region of n
 * threads, each reading its own affinity mask as OpenMP bound it, and their union; the same form as
 * apex_threads_cpus. Unbound threads float over the process's mask, so without binding this is that
 * mask. Call it outside parallel regions. */
APEX_API int apex_threads_team_cpus(int n, int *cpus, int max);
/* Writes cpus[0..n) (ascending) as a list of ranges, "0-3,8,10-11", into out (size bytes, always
 * terminated; a list that does not fit ends in "..."). Returns out. */
APEX_API char *apex_cpus_format(const int *cpus, int n, char *out, size_t size);

#ifdef __cplusplus
}
#endif
#endif
