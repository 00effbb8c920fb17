/* graph.cu: capturing work queued on apex's stream into a CUDA graph and replaying it (capture.h).
 *
 * A graph replays the kernels it captured with the arguments they had: every pointer, size and scalar is
 * fixed at capture. Inputs that change from one replay to the next (a batch's token ids) must therefore be
 * read by the graph from device memory that the host refills before each launch (apex_index_set queues
 * that copy on the same stream).
 *
 * The capture is thread-local: a call of this thread that would make the host wait for the GPU inside it
 * (a synchronisation, a copy from pageable memory) breaks the capture and is reported by
 * apex__cuda_capture_end, rather than being recorded as something a replay could not honour. The
 * allocator takes part (runtime.cu): blocks handed out during the capture stay the graph's. */
#include <cuda_runtime.h>
#include <stdlib.h>

extern "C" {
#include "core/internal.h"
#include "backend/cuda/cuda_internal.h"
}

struct apex__cuda_graph {
  cudaGraphExec_t exec;
  int pool_id; /* the allocator's capture whose blocks the graph replays on */
};

static int g_pool_id; /* the capture between apex__cuda_capture_begin and _end (one at a time, as the pool's) */

static apex_status cuda_error(cudaError_t e, const char *what, const char *doing) {
  return apex__fail(e == cudaErrorMemoryAllocation ? APEX_ERR_OUT_OF_MEMORY : APEX_ERR_DEVICE, "%s: %s: CUDA error %s (%s)",
                    what, doing, cudaGetErrorName(e), cudaGetErrorString(e));
}

extern "C" apex_status apex__cuda_capture_begin(const char *what) {
  const char *why;
  if (!apex__cuda_ready(&why)) return apex__fail(APEX_ERR_UNSUPPORTED, "%s: %s", what, why);
  int id = 0;
  apex_status st = apex__cuda_pool_capture_begin(&id);
  if (st != APEX_OK) return st;
  cudaError_t e = cudaStreamBeginCapture((cudaStream_t)apex__cuda_stream(), cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) {
    cudaGetLastError();
    apex__cuda_pool_capture_end();
    apex__cuda_pool_release(id);
    return cuda_error(e, what, "starting the CUDA graph capture");
  }
  g_pool_id = id;
  return APEX_OK;
}

extern "C" apex_status apex__cuda_capture_end(const char *what, apex_status st, apex__cuda_graph **out) {
  *out = NULL;
  cudaGraph_t graph = NULL;
  cudaError_t e = cudaStreamEndCapture((cudaStream_t)apex__cuda_stream(), &graph);
  apex__cuda_pool_capture_end();
  const int id = g_pool_id;
  g_pool_id = 0;
  if (st == APEX_OK && e != cudaSuccess)
    st = apex__fail(APEX_ERR_DEVICE, "%s: the CUDA graph capture broke (%s: %s): something in the captured work waits for "
                    "the GPU, copies to or from pageable host memory or uses another stream", what, cudaGetErrorName(e),
                    cudaGetErrorString(e));
  cudaGraphExec_t exec = NULL;
  if (st == APEX_OK && (e = cudaGraphInstantiate(&exec, graph, 0)) != cudaSuccess) {
    exec = NULL;
    st = cuda_error(e, what, "instantiating the captured CUDA graph");
  }
  if (graph) cudaGraphDestroy(graph); /* the executable graph does not need it */
  cudaGetLastError();                 /* a broken capture's errors are not sticky: nothing later should see them */
  apex__cuda_graph *g = st == APEX_OK ? (apex__cuda_graph *)malloc(sizeof *g) : NULL;
  if (st == APEX_OK && !g) st = apex__fail(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
  if (st != APEX_OK) {
    if (exec) cudaGraphExecDestroy(exec);
    apex__cuda_pool_release(id); /* nothing captured will ever run on these blocks */
    return st;
  }
  g->exec = exec;
  g->pool_id = id;
  *out = g;
  return APEX_OK;
}

extern "C" apex_status apex__cuda_graph_launch(apex__cuda_graph *g, const char *what) {
  cudaError_t e = cudaGraphLaunch(g->exec, (cudaStream_t)apex__cuda_stream());
  return e == cudaSuccess ? APEX_OK : cuda_error(e, what, "launching the captured CUDA graph");
}

extern "C" void apex__cuda_graph_destroy(apex__cuda_graph *g) {
  if (!g) return;
  /* A queued replay still reads the blocks and the graph: let it finish before they go back. */
  apex__cuda_sync("destroying a CUDA graph");
  cudaGraphExecDestroy(g->exec);
  apex__cuda_pool_release(g->pool_id);
  free(g);
}
