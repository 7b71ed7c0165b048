/* runtime/cuda/rt_cuda_graph.cu -- the step's device work as a CUDA graph
 * (PARC_CUDA_GRAPH; rt_cuda_graph.h says when, rt_cuda.h how it is called).
 *
 * Invariants: the capture covers body() alone, on the compute stream, in
 * thread-local mode (other ranks' threads and the watchdog are not
 * affected); nothing is executed while capturing, so a capture that fails
 * leaves the device as it was and the step can run plainly instead; while
 * graph_capturing is set the workspaces refuse to grow (rt_cuda_ws), since
 * growing waits for the stream. */
#include <stdio.h>

#include "runtime/cuda/rt_cuda_graph.h"
#include "runtime/cuda/rt_cuda_impl.h"

/* Switches the graph off for the run; with PARC_CUDA_GRAPH=1 (or always)
 * one line of world rank 0 says why the steps are plain launches. */
static void notice(RtCuda *c, const char *why, int always) {
  if (c->wrank == 0 && (c->graph_on == RT_GRAPH_ON || always))
    fprintf(stderr, "parcrt_cuda: PARC_CUDA_GRAPH=%s: %s; the steps run as plain launches\n",
            c->graph_on == RT_GRAPH_ON ? "1" : "auto", why);
  c->graph_on = RT_GRAPH_OFF;
}

void rt_cuda_graph_check(RtCuda *c, int pipelined, int host_ops) {
  if (!c->graph_on || c->graph_checked) return;
  c->graph_checked = 1;
  RtGraphCase k = {c->ranks,
                   c->ranks == 1  ? RT_GRAPH_COMM_NONE
                   : c->use_nccl  ? RT_GRAPH_COMM_NCCL
                   : c->local_dev ? RT_GRAPH_COMM_LOCAL
                                  : RT_GRAPH_COMM_HOST,
                   pipelined, host_ops, c->prof != NULL};
  const char *why = rt_cuda_graph_blocker(&k);
  if (why) notice(c, why, 0); /* (silent by default: nothing went wrong) */
}

/* Captures body() into c->graph_exec: RT_OK, or RT_ERR with the failure in
 * why (nothing captured, nothing run, the stream out of capture mode). */
static int capture(RtCuda *c, RtCudaBody body, void *arg, char *why, size_t len) {
  cudaError_t e = cudaStreamBeginCapture(c->compute, cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) {
    snprintf(why, len, "cudaStreamBeginCapture: %s", cudaGetErrorString(e));
    return RT_ERR;
  }
  c->graph_capturing = 1;
  int rc = body(arg);
  c->graph_capturing = 0;
  cudaGraph_t g = NULL;
  e = cudaStreamEndCapture(c->compute, &g); /* ends it even after a failed op */
  if (rc == RT_OK && e != cudaSuccess)
    snprintf(why, len, "cudaStreamEndCapture: %s", cudaGetErrorString(e));
  else if (rc != RT_OK)
    snprintf(why, len, "%s", rt_last_error());
  if (rc == RT_OK && e == cudaSuccess) {
    e = cudaGraphInstantiateWithFlags(&c->graph_exec, g, 0);
    if (e != cudaSuccess) {
      snprintf(why, len, "cudaGraphInstantiateWithFlags: %s", cudaGetErrorString(e));
      c->graph_exec = NULL;
    }
  }
  if (g) cudaGraphDestroy(g);
  if (rc != RT_OK || e != cudaSuccess) {
    (void)cudaGetLastError(); /* the capture's error is not the next op's */
    return RT_ERR;
  }
  return RT_OK;
}

extern "C" int rt_cuda_graph_step(RtCuda *c, RtCudaBody body, void *arg, int host_ops,
                                  int save_grads) {
  rt_cuda_graph_check(c, 0, host_ops);
  int act = rt_cuda_graph_action(c->graph_on, c->graph_steps++, c->graph_exec != NULL,
                                 save_grads);
  if (act == RT_GRAPH_PLAIN) return body(arg);
  if (act == RT_GRAPH_CAPTURE) {
    char why[RT_ERR_MAX + 64];
    if (capture(c, body, arg, why, sizeof why)) {
      char line[RT_ERR_MAX + 128];
      snprintf(line, sizeof line, "the capture failed (%s)", why);
      notice(c, line, 1); /* (unexpected: said either way) */
      return body(arg); /* the captured work never ran: run it now */
    }
  }
  CU_CHECK(c, cudaGraphLaunch(c->graph_exec, c->compute), "cudaGraphLaunch (the step's graph)");
  return RT_OK;
}
