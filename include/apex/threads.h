/* threads.h: how many threads apex uses.
 *
 * apex runs its loops with OpenMP. Every result is bitwise independent of the thread count: work is
 * split into fixed-size blocks whose boundaries do not depend on the number of threads, and partial
 * reductions are combined in a fixed order. */
#ifndef APEX_THREADS_H
#define APEX_THREADS_H

#include "apex/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sets the number of threads apex's loops use (>= 1). Returns APEX_ERR_INVALID_ARG otherwise. */
APEX_API apex_status apex_set_num_threads(int n);
/* The number in use: the value set, or OpenMP's default if none was set. */
APEX_API int apex_get_num_threads(void);

#ifdef __cplusplus
}
#endif
#endif
