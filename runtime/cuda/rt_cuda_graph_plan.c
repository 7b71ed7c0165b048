/* runtime/cuda/rt_cuda_graph_plan.c -- when the step runs as a CUDA graph
 * (rt_cuda_graph.h).  Plain C: tests/cuda/cu_graph.c builds it without CUDA. */
#include "runtime/cuda/rt_cuda_graph.h"

#include <string.h>

#include "runtime/rt_err.h"

int rt_cuda_graph_parse(const char *value, int *on) {
  *on = RT_GRAPH_OFF;
  if (!value || !*value || !strcmp(value, "auto")) {
    *on = RT_GRAPH_AUTO;
    return RT_OK;
  }
  if (!strcmp(value, "0")) return RT_OK;
  if (!strcmp(value, "1")) {
    *on = RT_GRAPH_ON;
    return RT_OK;
  }
  return rt_fail_setup("PARC_CUDA_GRAPH='%s': expected 0 (plain launches), 1 (the step as a "
                       "CUDA graph, or a notice why not) or auto (the default: a graph where "
                       "nothing keeps the step out of one)", value);
}

const char *rt_cuda_graph_blocker(const RtGraphCase *k) {
  if (k->profiling) return "the profile (PARC_CUDA_PROFILE) records events around each op";
  if (k->pipelined)
    return "pipelined steps allocate from the stream-ordered pool and stage sends through the "
           "host";
  if (k->ranks > 1) switch (k->comm) {
    case RT_GRAPH_COMM_NCCL:
      return "NCCL collectives are watched through per-collective events (not captured yet)";
    case RT_GRAPH_COMM_LOCAL:
      return "device-local collectives exchange events through host messages";
    default:
      return "host-staged collectives (PARC_CUDA_COMM=host) copy through the host";
    }
  if (k->host_ops) return "the step's routing ops (MoE) are staged through the host";
  return NULL;
}

int rt_cuda_graph_action(int on, int64_t steps_done, int captured, int save_grads) {
  if (!on || steps_done < 1 || save_grads) return RT_GRAPH_PLAIN;
  return captured ? RT_GRAPH_REPLAY : RT_GRAPH_CAPTURE;
}
