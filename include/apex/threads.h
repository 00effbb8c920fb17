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

#ifdef __cplusplus
}
#endif
#endif
