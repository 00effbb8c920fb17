/* internal.h: what the layers of apex share but do not publish.
 *
 * Error reporting (apex__fail), the single-threaded conversion kernels that the bulk converter and
 * the multi-tensor applier are built on, and the tensor internals. */
#ifndef APEX_CORE_INTERNAL_H
#define APEX_CORE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "apex/dtype.h"
#include "apex/status.h"
#include "apex/tensor.h"

#if defined(__GNUC__)
#define APEX_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define APEX_PRINTF(a, b)
#endif

/* Records a message for apex_last_error() on this thread and returns status, so that a failure is
 * one line: `return apex__fail(APEX_ERR_SHAPE, "x: %zu elements, y: %zu", nx, ny);`. */
apex_status apex__fail(apex_status status, const char *fmt, ...) APEX_PRINTF(2, 3);
/* As apex__fail for constructors: records the message and returns NULL. */
void *apex__fail_null(apex_status status, const char *fmt, ...) APEX_PRINTF(2, 3);
/* Records APEX_ERR_INVALID_ARG for an accessor handed NULL ("fn: NULL what"). Such a NULL is most
 * often the result of a failed call earlier in a chain (apex_tensor_dtype(apex_var_value(op(...)))),
 * so the message already recorded on this thread, the likely cause, is kept after it. */
void apex__fail_null_arg(const char *fn, const char *what);

/* Converts n elements on the calling thread only, with the active SIMD path. Same contract as
 * apex_convert, without argument checks. */
void apex__convert_range(void *dst, apex_dtype dst_type, const void *src, apex_dtype src_type, size_t n);

/* The portable kernels (the reference), and the AVX2/F16C and AVX-512F ones (only defined on x86;
 * only called when the ISA level, apex_cpu_max_isa, includes them). */
void apex__convert_portable(void *dst, apex_dtype dst_type, const void *src, apex_dtype src_type, size_t n);
void apex__convert_avx2(void *dst, apex_dtype dst_type, const void *src, apex_dtype src_type, size_t n);
void apex__convert_avx512(void *dst, apex_dtype dst_type, const void *src, apex_dtype src_type, size_t n);
/* 1 when the CPU has AVX2, F16C and FMA. */
int apex__cpu_has_avx2(void);
/* 1 when the maximum-ISA cap (apex/cpu.h) was set to APEX_CPU_ISA_PORTABLE, by the call or by
 * APEX_CPU_ISA: the matrix products then leave OpenBLAS for apex's reference product. A CPU that is
 * portable by nature (no AVX2, or not x86) keeps OpenBLAS. */
int apex__cpu_capped_portable(void);

/* Grows the host array *arr (of *cap elements of elem bytes, doubling) to hold need; 0 on allocation
 * failure (*arr and *cap unchanged). host_memory.c. */
int apex__grow(void **arr, size_t *cap, size_t need, size_t elem);

/* Validates a dtype argument; on error the message names `what`. */
apex_status apex__check_dtype(apex_dtype dtype, const char *what);

/* Once per training step (apex_backward, apex_optimizer_step): lowers the calling thread's OpenMP
 * thread count to the cores other processes leave free, or restores it (threads.c says why). Cheap
 * when called more often than every 0.1 s. */
void apex__threads_follow_load(void);
/* The thread count for ncpu usable CPUs of which others use others_cores, at most cap, at least 1. */
int apex__threads_fit(int ncpu, double others_cores, int cap);
/* The shortest window, in seconds, over which it measures others' use of ncpu CPUs whose /proc/stat
 * counts in 1/hz ticks: long enough that the ticks' rounding stays under a quarter of a core. */
double apex__threads_window(int ncpu, long hz);

/* Block size for splitting elementwise loops over threads. Fixed, so results never depend on the
 * number of threads. */
#define APEX_THREAD_BLOCK ((size_t)1 << 16)

/* Sets n elements of `size` bytes (1, 2 or 4) at p to the bit pattern `bits`, in parallel blocks
 * when n is large (zeroing a model's gradients serially left one thread idle for a millisecond). */
void apex__fill_bits(void *p, size_t size, uint32_t bits, size_t n);

/* ---- releasable memory (releasable.c) ----------------------------------------------------------------
 * A tensor whose memory can be freed while the tensor object stays, for whoever holds pointers to it,
 * and made again when next needed. autograd marks every leaf's gradient so (graph.c), and ZeRO stage 2
 * frees those it has reduce-scattered (zero.h): a rank then holds the gradients of the buckets in flight,
 * not of the model. A released tensor reads as zeros (apex_tensor_released in tensor.h says how); a
 * kernel must be handed memory made with apex__tensor_remake. Views share the state (it is the
 * storage's). */

/* Marks t's storage releasable: t must be apex's own memory (not apex_tensor_wrap'd) and cover all of it,
 * as a tensor from apex_tensor_create does; anything else stays unmarked (the call does nothing). */
void apex__tensor_set_releasable(apex_tensor *t);
/* Frees t's memory when t is releasable and whole (the views of a flattened buffer are not); 1 when it
 * is released afterwards (also when it already was), 0 when t keeps its memory. */
int apex__tensor_release(apex_tensor *t);
/* Makes a released t's memory again, zero-filled when zero is set (leave it unset only when the caller
 * writes every element of the storage); APEX_OK without doing anything otherwise. fn names the caller in
 * the out-of-memory message. */
apex_status apex__tensor_remake(apex_tensor *t, int zero, const char *fn);

#endif
