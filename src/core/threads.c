/* threads.c: the thread count apex's OpenMP loops use. */
#include <omp.h>

#include "apex/threads.h"
#include "core/internal.h"

apex_status apex_set_num_threads(int n) {
  if (n < 1) return apex__fail(APEX_ERR_INVALID_ARG, "apex_set_num_threads: %d threads; need at least 1", n);
  omp_set_num_threads(n);
  return APEX_OK;
}

int apex_get_num_threads(void) { return omp_get_max_threads(); }
