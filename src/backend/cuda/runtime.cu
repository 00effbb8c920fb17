/* runtime.cu: the CUDA device, apex's stream, the caching allocator and copies.
 *
 * The allocator keeps every block it got from cudaMalloc. A freed block goes back to a free list and
 * serves the next request of a size it fits (best fit, at most twice the request, so a small tensor
 * never pins a huge block). cudaMalloc and cudaFree synchronise the whole device, so a training loop
 * whose tensor sizes repeat makes none after its first step. Because every apex kernel runs on one
 * stream, a block freed by the host while a kernel still reads it can be handed out again at once:
 * the next user's work is queued behind that kernel. Sizes are rounded up to 512 bytes (small) or
 * 2 MiB (large) so that slightly different sizes share blocks.
 *
 * A CUDA graph captured on the stream bakes the addresses of the blocks its work used into the graph, and
 * replays them long after the host freed them: while a capture is on (apex__cuda_pool_capture_begin), every
 * block handed out is marked as the capture's, comes back to it (and only to it) when freed during the
 * capture, and stays out of everyone else's reach until apex__cuda_pool_release, however often the graph
 * is replayed. The capture's requests are served from blocks the pool already holds: cudaMalloc is not a
 * call to make inside a capture, so the work is run once before it is captured. */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "core/internal.h"
#include "backend/cuda/cuda_internal.h"
#include "core/block_pool.h"
}

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_ready;
static const char *g_why = "apex has not looked for a GPU yet";
static cudaStream_t g_stream;
/* The device apex works on: 0 unless apex__cuda_use_device chose another (the NCCL process group
 * gives each rank of a host its own GPU). */
static pthread_mutex_t g_want_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_want_device;
static int g_device;
/* The current device is per host thread in CUDA: each thread that calls apex is moved to apex's
 * device once per choice of device (g_gen counts them), or its allocations and kernels would land
 * on device 0. */
static int g_gen = 1;
static thread_local int t_gen;

static void init_device(void) {
  pthread_mutex_lock(&g_want_mu);
  int want = g_want_device;
  pthread_mutex_unlock(&g_want_mu);
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    g_why = e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice || count == 0
                ? "no CUDA GPU or driver on this machine"
                : "the CUDA runtime could not start (cudaGetDeviceCount failed)";
    cudaGetLastError();
    return;
  }
  if (want >= count) want = 0; /* apex__cuda_use_device reports it */
  if (cudaSetDevice(want) != cudaSuccess || cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) != cudaSuccess) {
    g_why = "the CUDA device could not be opened";
    cudaGetLastError();
    return;
  }
  g_device = want;
  t_gen = g_gen;
  g_ready = 1;
  g_why = "";
}

extern "C" int apex__cuda_ready(const char **why) {
  pthread_once(&g_once, init_device);
  if (why) *why = g_why;
  if (g_ready) {
    int gen = __atomic_load_n(&g_gen, __ATOMIC_ACQUIRE);
    if (t_gen != gen) {
      cudaSetDevice(g_device);
      t_gen = gen;
    }
  }
  return g_ready;
}

static apex_status cuda_fail(cudaError_t e, const char *what);
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static apex_cuda_memory_stats g_stats;

extern "C" apex_status apex__cuda_use_device(int device) {
  pthread_mutex_lock(&g_want_mu);
  g_want_device = device;
  pthread_mutex_unlock(&g_want_mu);
  const char *why;
  if (!apex__cuda_ready(&why)) return apex__fail(APEX_ERR_UNSUPPORTED, "CUDA device %d: %s", device, why);
  if (g_device == device) return APEX_OK;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count)
    return apex__fail(APEX_ERR_INVALID_ARG, "CUDA device %d: only %d device%s visible", device, count, count == 1 ? " is" : "s are");
  /* apex opened device 0 on its first CUDA call (apex_cuda_available, say). Moving is safe while
   * nothing lives there yet: no memory was ever allocated, so only the stream must be remade. */
  pthread_mutex_lock(&g_mu);
  apex_status st = APEX_OK;
  if (g_stats.device_allocs != 0) {
    st = apex__fail(APEX_ERR_STATE,
                    "CUDA device %d is needed but apex already holds memory on device %d; create the NCCL process group "
                    "before any CUDA tensor",
                    device, g_device);
  } else {
    cudaStream_t s = NULL;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
      st = cuda_fail(e, "opening the CUDA device");
      cudaSetDevice(g_device);
    } else {
      cudaStreamDestroy(g_stream);
      g_stream = s;
      g_device = device;
      t_gen = __atomic_add_fetch(&g_gen, 1, __ATOMIC_ACQ_REL);
    }
  }
  pthread_mutex_unlock(&g_mu);
  return st;
}

extern "C" void *apex__cuda_stream(void) { return apex__cuda_ready(NULL) ? (void *)g_stream : NULL; }

static apex_status cuda_fail(cudaError_t e, const char *what) {
  return apex__fail(e == cudaErrorMemoryAllocation ? APEX_ERR_OUT_OF_MEMORY : APEX_ERR_DEVICE, "%s: CUDA error %s (%s)",
                    what, cudaGetErrorName(e), cudaGetErrorString(e));
}

extern "C" apex_status apex__cuda_check_launch(const char *what) {
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? APEX_OK : cuda_fail(e, what);
}

/* The host's waits for the GPU (apex_memory.waits): stream synchronisations and copies to the host
 * (which wait even when queued: the destination is pageable memory). */
static unsigned long long g_waits;

extern "C" unsigned long long apex__cuda_waits(void) { return __atomic_load_n(&g_waits, __ATOMIC_RELAXED); }

static void count_wait(void) { __atomic_fetch_add(&g_waits, 1ull, __ATOMIC_RELAXED); }

extern "C" apex_status apex__cuda_sync(const char *what) {
  if (!apex__cuda_ready(NULL)) return apex__fail(APEX_ERR_UNSUPPORTED, "%s: %s", what, g_why);
  count_wait();
  cudaError_t e = cudaStreamSynchronize(g_stream);
  return e == cudaSuccess ? APEX_OK : cuda_fail(e, what);
}

/* ---- the caching allocator ------------------------------------------------------------------------- */

/* The blocks and which of them are free: core/block_pool.h (best fit, captures' ownership), plain C so
 * that it is tested without a GPU; here the cudaMalloc and cudaFree around it. */
static apex__block_pool g_pool;
static int g_capture, g_captures; /* the capture on (0: none), and the last id given */

static size_t round_size(size_t bytes) {
  const size_t small = 512, large = (size_t)2 << 20;
  if (bytes == 0) bytes = 1;
  return bytes < ((size_t)1 << 20) ? (bytes + small - 1) / small * small : (bytes + large - 1) / large * large;
}

static void free_block(void *ptr, size_t size, void *ctx) {
  (void)size, (void)ctx;
  cudaFree(ptr);
}

/* Gives every free block back to the GPU (a graph's blocks stay: it replays on them). Caller holds g_mu. */
static void release_cached(void) { g_stats.reserved -= apex__bp_trim(&g_pool, free_block, NULL); }

extern "C" apex_status apex__cuda_alloc(size_t bytes, int zero, void **out) {
  const char *why;
  if (!apex__cuda_ready(&why)) return apex__fail(APEX_ERR_UNSUPPORTED, "CUDA tensor: %s", why);
  size_t size = round_size(bytes);
  pthread_mutex_lock(&g_mu);
  long bi = apex__bp_take(&g_pool, size, g_capture);
  if (bi < 0 && g_capture) {
    pthread_mutex_unlock(&g_mu);
    return apex__fail(APEX_ERR_STATE, "CUDA allocator: %zu bytes asked for during a CUDA graph capture, and no cached block "
                      "fits (cudaMalloc cannot be captured); run the work once uncaptured first so the pool holds its blocks",
                      size);
  }
  if (bi < 0) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaErrorMemoryAllocation) { /* give the cache back and try once more */
      cudaGetLastError();
      cudaStreamSynchronize(g_stream);
      release_cached();
      e = cudaMalloc(&p, size);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      pthread_mutex_unlock(&g_mu);
      return apex__fail(APEX_ERR_OUT_OF_MEMORY, "CUDA allocator: cudaMalloc of %zu bytes failed (%s); %zu bytes in use, %zu reserved",
                        size, cudaGetErrorString(e), g_stats.allocated, g_stats.reserved);
    }
    if (!apex__bp_add(&g_pool, p, size, 0)) {
      cudaFree(p);
      pthread_mutex_unlock(&g_mu);
      return apex__fail(APEX_ERR_OUT_OF_MEMORY, "CUDA allocator: out of host memory");
    }
    bi = (long)g_pool.n - 1;
    g_stats.reserved += size;
    g_stats.device_allocs++;
  }
  const apex__bp_block *best = &g_pool.blocks[bi];
  g_stats.allocated += best->size;
  if (g_stats.allocated > g_stats.peak_allocated) g_stats.peak_allocated = g_stats.allocated;
  void *p = best->ptr;
  pthread_mutex_unlock(&g_mu);
  if (zero) {
    cudaError_t e = cudaMemsetAsync(p, 0, bytes ? bytes : 1, g_stream);
    if (e != cudaSuccess) {
      apex__cuda_free(p);
      return cuda_fail(e, "CUDA allocator: zero-fill");
    }
  }
  *out = p;
  return APEX_OK;
}

extern "C" void apex__cuda_free(void *d_ptr) {
  if (!d_ptr) return;
  pthread_mutex_lock(&g_mu);
  g_stats.allocated -= apex__bp_put(&g_pool, d_ptr);
  pthread_mutex_unlock(&g_mu);
}

extern "C" void *apex__cuda_ws_scratch(apex_nn_workspace ws, size_t bytes, void **owned, apex_status *st) {
  *owned = NULL;
  if (ws.get) {
    void *p = ws.get(ws.ctx, bytes ? bytes : 1);
    *st = p ? APEX_OK : APEX_ERR_OUT_OF_MEMORY;
    return p;
  }
  *st = apex__cuda_alloc(bytes ? bytes : 1, 0, owned);
  return *st == APEX_OK ? *owned : NULL;
}

extern "C" apex_status apex__cuda_pool_capture_begin(int *id) {
  pthread_mutex_lock(&g_mu);
  apex_status st = APEX_OK;
  if (g_capture) st = apex__fail(APEX_ERR_STATE, "CUDA allocator: a CUDA graph capture is already on (one at a time)");
  else *id = g_capture = ++g_captures;
  pthread_mutex_unlock(&g_mu);
  return st;
}

extern "C" void apex__cuda_pool_capture_end(void) {
  pthread_mutex_lock(&g_mu);
  g_capture = 0;
  pthread_mutex_unlock(&g_mu);
}

extern "C" void apex__cuda_pool_release(int id) {
  if (!id) return;
  pthread_mutex_lock(&g_mu);
  apex__bp_release_owner(&g_pool, id);
  pthread_mutex_unlock(&g_mu);
}

extern "C" void apex__cuda_note_wait(void) { count_wait(); }

extern "C" apex_status apex__cuda_memcpy(void *dst, const void *src, size_t bytes, int direction, int wait) {
  const char *why;
  if (!apex__cuda_ready(&why)) return apex__fail(APEX_ERR_UNSUPPORTED, "CUDA copy: %s", why);
  if (bytes == 0) return APEX_OK;
  cudaMemcpyKind kind = direction == APEX__H2D ? cudaMemcpyHostToDevice
                        : direction == APEX__D2H ? cudaMemcpyDeviceToHost
                                                 : cudaMemcpyDeviceToDevice;
  if (wait || kind == cudaMemcpyDeviceToHost) count_wait();
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, g_stream);
  if (e == cudaSuccess && wait) e = cudaStreamSynchronize(g_stream);
  return e == cudaSuccess ? APEX_OK : cuda_fail(e, "CUDA copy");
}

/* ---- what api.c publishes ------------------------------------------------------------------------------ */

extern "C" apex_status apex__cuda_device_name(char *buf, size_t size) {
  cudaDeviceProp prop;
  cudaError_t e = cudaGetDeviceProperties(&prop, g_device);
  if (e != cudaSuccess) return cuda_fail(e, "apex_cuda_device_name");
  snprintf(buf, size, "%s, sm_%d%d", prop.name, prop.major, prop.minor);
  return APEX_OK;
}

extern "C" void apex__cuda_stats(apex_cuda_memory_stats *out, int reset_peak) {
  pthread_mutex_lock(&g_mu);
  if (reset_peak) g_stats.peak_allocated = g_stats.allocated;
  if (out) *out = g_stats;
  pthread_mutex_unlock(&g_mu);
  if (out) out->host_waits = (size_t)apex__cuda_waits();
}

extern "C" void apex__cuda_empty_cache(void) {
  count_wait();
  cudaStreamSynchronize(g_stream);
  pthread_mutex_lock(&g_mu);
  release_cached();
  pthread_mutex_unlock(&g_mu);
}

extern "C" void *apex__cuda_host_alloc(size_t bytes) {
  void *p = NULL;
  cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    cuda_fail(e, "apex_cuda_host_alloc");
    return NULL;
  }
  return p;
}

extern "C" void apex__cuda_host_free(void *p) { cudaFreeHost(p); }
