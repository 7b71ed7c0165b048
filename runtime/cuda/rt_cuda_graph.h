/* runtime/cuda/rt_cuda_graph.h -- the GPU trainer's step as a CUDA graph
 * (PARC_CUDA_GRAPH, on by default): the decisions, in plain C (rt_cuda_graph_plan.c),
 * shared by the device side (rt_cuda_graph.cu) and the CPU test
 * tests/cuda/cu_graph.c.
 *
 * What a graph holds: the step's device work between the uploads of
 * rt_cuda_step_begin (tokens, targets, lr and step, copied into fixed device
 * buffers the kernels read) and the read-backs of rt_cuda_step_end (loss,
 * cross-entropy, grad norm).  Every pointer of that work is fixed for the run
 * (parameters, state, arena, io buffers, workspaces grown in the first step),
 * so a replay runs the same kernels with the same arguments in the same
 * order as a plain step: the losses are bit-identical.
 *
 * Per step (rt_cuda_graph_action): plain when the switch is off or refused,
 * for the first step (the warm-up: cuBLASLt plans and heuristics, workspace
 * growth, lazy module loads happen outside any capture) and for a step that
 * copies gradients to the host mid-step (--save-grads); capture on the first
 * later step, which is then launched; replay (cudaGraphLaunch) after it.
 *
 * Refused for the whole run (rt_cuda_graph_blocker: plain launches, and with
 * PARC_CUDA_GRAPH=1 one notice line at the first step saying why), where the step synchronises with the
 * host or allocates: the profile (PARC_CUDA_PROFILE: events around each op,
 * read per step), pipelined steps (stream-ordered pool allocations,
 * host-staged sends and receives), more than one rank (host-staged
 * collectives copy through the host; device-local ones exchange events
 * through host messages; NCCL ones are watched by the watchdog's per-
 * collective events: not captured yet), and host-staged ops in the step
 * (the MoE routing ops and the expert all-to-all of rt_cuda_ops.cu). */
#ifndef PARC_RT_CUDA_GRAPH_H
#define PARC_RT_CUDA_GRAPH_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The collectives of a mesh of more than one rank (RtCuda's choice). */
enum { RT_GRAPH_COMM_NONE, RT_GRAPH_COMM_NCCL, RT_GRAPH_COMM_LOCAL, RT_GRAPH_COMM_HOST };

typedef struct {
  int ranks;      /* the mesh's ranks */
  int comm;       /* RT_GRAPH_COMM_*: NONE for one rank */
  int pipelined;  /* the step is rt_cuda_pipe_step */
  int host_ops;   /* the step's host-staged ops (routing, expert all-to-all) */
  int profiling;  /* PARC_CUDA_PROFILE is on */
} RtGraphCase;

/* PARC_CUDA_GRAPH's values: "0" off (plain launches), "1" on (a run the
 * blockers keep plain says why, once), unset, "" or "auto" (the default) on
 * where nothing blocks it, silently plain where something does. */
enum { RT_GRAPH_OFF, RT_GRAPH_ON, RT_GRAPH_AUTO };
/* *on = RT_GRAPH_OFF, _ON or _AUTO for value; RT_OK, or RT_ERR_SETUP (the
 * user's setting) with a one-line message naming the variable, its value and
 * the values allowed. */
int rt_cuda_graph_parse(const char *value, int *on);

/* What keeps the step out of a graph for the whole run, as a phrase for the
 * notice ("the profile (PARC_CUDA_PROFILE) ..."); NULL when nothing does. */
const char *rt_cuda_graph_blocker(const RtGraphCase *k);

enum { RT_GRAPH_PLAIN, RT_GRAPH_CAPTURE, RT_GRAPH_REPLAY };
/* This step's action: on (switch on and not refused), steps_done (steps run
 * before this one), captured (a graph exists), save_grads (this step copies
 * gradients to the host). */
int rt_cuda_graph_action(int on, int64_t steps_done, int captured, int save_grads);

#ifdef __cplusplus
}
#endif

#endif
