/* host_memory.c: the memory slots of host memory (core/memory.h), core's own because apex_tensor_create
 * uses them; the CPU backend's table points at them. Host memory is 64-byte aligned (a cache line; also
 * what AVX-512 loads like) and padded to a whole number of lines, so that vector loops may read a full
 * line; copies, conversions and fills run on the calling thread's OpenMP team. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "core/memory.h"

#define CPU_ALIGN 64

static int cpu_ready(const char **why) {
  if (why) *why = NULL;
  return 1;
}

static apex_status cpu_alloc(size_t bytes, int zero, void **out) {
  size_t padded = (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
  void *p = aligned_alloc(CPU_ALIGN, padded ? padded : CPU_ALIGN);
  if (!p) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_tensor_create: cannot allocate %zu bytes", bytes);
  if (zero) memset(p, 0, padded);
  *out = p;
  return APEX_OK;
}

static void cpu_free(void *p) { free(p); }

static atomic_ullong cpu_waits; /* calls that would have waited on a device */

static apex_status cpu_copy(void *dst, const void *src, size_t bytes, apex_copy_kind kind, int wait) {
  /* every side is the host, and the copy is done on return */
  if (kind == APEX_COPY_D2H && wait) atomic_fetch_add_explicit(&cpu_waits, 1, memory_order_relaxed);
  memcpy(dst, src, bytes);
  return APEX_OK;
}

static apex_status cpu_convert(void *dst, apex_dtype dst_type, const void *src, apex_dtype src_type, size_t n) {
  return apex_convert(dst, dst_type, src, src_type, n);
}

static apex_status cpu_fill(void *dst, apex_dtype dtype, float value, size_t n) {
  uint32_t bits;
  if (dtype == APEX_F32) {
    memcpy(&bits, &value, sizeof bits);
  } else {
    uint16_t v;
    apex__convert_portable(&v, dtype, &value, APEX_F32, 1);
    bits = v;
  }
  apex__fill_bits(dst, apex_dtype_size(dtype), bits, n);
  return APEX_OK;
}

static apex_status cpu_sync(const char *what) {
  (void)what;
  atomic_fetch_add_explicit(&cpu_waits, 1, memory_order_relaxed);
  return APEX_OK;
}

static unsigned long long cpu_wait_count(void) { return atomic_load_explicit(&cpu_waits, memory_order_relaxed); }

const apex_memory apex__host_memory = {
    .device = APEX_DEVICE_CPU, .name = "CPU", .ready = cpu_ready, .alloc = cpu_alloc, .free = cpu_free,
    .copy = cpu_copy, .convert = cpu_convert, .fill = cpu_fill, .sync = cpu_sync, .waits = cpu_wait_count,
};

int apex__grow(void **arr, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 1;
  size_t c = *cap ? *cap * 2 : 64;
  while (c < need) c *= 2;
  void *p = realloc(*arr, c * elem);
  if (!p) return 0;
  *arr = p;
  *cap = c;
  return 1;
}
