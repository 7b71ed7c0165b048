/* runtime/rt_trace.h -- `train --trace FILE`: what each rank actually did, with
 * wall-clock times, written as Chrome trace JSON (Perfetto, chrome://tracing).
 *
 * Recording.  Each rank owns one RtTrace (RtStepIO.trace; NULL when --trace
 * is absent, and then nothing reads the clock: the only cost is the NULL test).
 * An event is one interval [start, end) of the rank's monotonic clock, in
 * seconds since the rank's origin, with its kind, chunk, microbatch and the
 * step it belongs to (set by rt_trace_step before the harness calls step).
 * Events are appended in the order the rank ends them; on one rank the
 * compute kinds (F, B, W, OPTIMIZER, STEP) never overlap each other, nor do
 * the communication kinds (SEND_*, RECV_*, REDUCE_*): the rank runs them one
 * after another.
 *
 * Clocks.  Every rank takes its origin right after the barrier that ends the
 * harness's setup (rt_trace_open), so the ranks' timelines line up to within
 * that barrier's exit skew (microseconds on one machine; clocks are never
 * compared across processes).
 *
 * Writing (rt_trace_write, a collective over world): every rank sends its
 * events to world rank 0 (point to point on the world communicator, each
 * number as two floats, hi + lo, so times keep about 48 bits), which writes
 * ONE merged file:
 *   {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}
 * with, per world rank r, metadata naming process r ("rank r: stage s, tp t,
 * dp d") and its threads, then one complete event (ph "X", ts and dur in
 * microseconds) per recorded event: pid r; tid 0 "compute" (F, B, W,
 * optimizer; a trainer without a pipeline: one "step" event, with the
 * "compute" between its collectives inside it), tid 1
 * "communication" (send, recv = time blocked waiting for the message and
 * copying it, the gradient and loss all-reduces; without a pipeline every
 * collective of the step, rt_trace_comm), tid 2 "idle" (derived: the
 * parts of a step's window, from the earliest start of that step on any rank
 * to its latest end, when the rank ran neither compute nor communication;
 * gaps under a microsecond, the harness's bookkeeping between two events, are
 * left out).
 * Names follow `parc --emit trace` ("F(mb 0, chunk 1)"), so the predicted and
 * the measured timelines read alike; args carry step, mb, chunk and, for
 * transfers, the floats moved.  otherData: backend, ranks, tp, dp, pp, the
 * schedule, microbatches and per-stage action counts (pipelined trainers). */
#ifndef PARC_RT_TRACE_H
#define PARC_RT_TRACE_H

#include <stdint.h>

typedef struct RtComm RtComm;

/* The first seven are RtPipeKind's (runtime/rt_pipe.h), in its order. */
typedef enum {
  RT_TRACE_F, RT_TRACE_B, RT_TRACE_W, RT_TRACE_SEND_ACT, RT_TRACE_RECV_ACT,
  RT_TRACE_SEND_GRAD, RT_TRACE_RECV_GRAD,
  RT_TRACE_REDUCE_DP,        /* the gradient accumulator's all-reduce over dp */
  RT_TRACE_SCATTER_DP,       /* ZeRO-1: its reduce-scatters over dp (and ep_dp) */
  RT_TRACE_REDUCE_PP,        /* the gradients of parameters several stages hold (the
                                tied embedding), summed between those stages */
  RT_TRACE_REDUCE_LOSS,      /* the microbatches' loss to every stage */
  RT_TRACE_OPTIMIZER,        /* clipping and the update */
  RT_TRACE_STEP,             /* a whole step (trainers without a pipeline) */
  /* a trainer without a pipeline: every collective its step calls (rt_trace_comm) */
  RT_TRACE_ALL_REDUCE, RT_TRACE_ALL_GATHER, RT_TRACE_REDUCE_SCATTER,
  RT_TRACE_ALL_TO_ALL,       /* the experts' all-to-all (rt_expert_all_to_all) */
  RT_TRACE_NKINDS
} RtTraceKind;

typedef struct RtTrace RtTrace;

/* Seconds on the monotonic clock. */
double rt_trace_clock(void);

/* A recorder whose origin is now; NULL when out of memory (rt_fail called). */
RtTrace *rt_trace_open(int world_rank, int tp_rank, int dp_rank, int pp_rank);
void rt_trace_free(RtTrace *t);

/* The step (0-based, as the log counts) the following events belong to. */
void rt_trace_step(RtTrace *t, int64_t step);
/* Events recorded so far, collectives (rt_trace_comm) not counted (a harness
 * records a whole-step event only where the step recorded none itself). */
int64_t rt_trace_count(const RtTrace *t);

/* Pipelined trainers describe their schedule once (the first step does). */
void rt_trace_pipe(RtTrace *t, const char *schedule, int stages, int chunks, int microbatches,
                   int nactions);

/* One event; start and end from rt_trace_clock.  count: floats moved, or 0.
 * Out of memory stops the recording (rt_trace_write then fails). */
void rt_trace_add(RtTrace *t, RtTraceKind kind, int chunk, int mb, double start, double end,
                  int64_t count);

/* The groups of rt_trace_comm, in codegen/host.c's order (group_of). */
enum { RT_TRACE_TP, RT_TRACE_DP, RT_TRACE_EP, RT_TRACE_EP_DP, RT_TRACE_PP, RT_TRACE_NGROUPS };
/* How a collective ran: a blocking call; the start of an asynchronous one (the
 * time the start call took); its wait (the time blocked until it completed). */
enum { RT_TRACE_BLOCKING, RT_TRACE_START, RT_TRACE_WAIT };

/* One collective of a step, from start to now: kind RT_TRACE_ALL_REDUCE ..
 * RT_TRACE_ALL_TO_ALL, group RT_TRACE_TP.., how RT_TRACE_BLOCKING..; count: the
 * collective's floats (all-reduce: the vector; all-gather, reduce-scatter: the
 * whole, all ranks' blocks; all-to-all: the floats this rank sent to the other
 * members).  Called by the generated step (codegen/host.c, COMM) only when
 * RtStepIO.trace is set.  Not counted by rt_trace_count.  In the file: tid 1,
 * named "all_reduce dp" ("... (start)", "... (wait)"), cat the kind as
 * plan.json's communication names it ("all_reduce", "all_gather",
 * "reduce_scatter", "all_to_all"; "async_start" for a start), args group,
 * floats and async ("start", "wait").  The step event's parts no collective
 * covers are drawn inside it as "compute" events (tid 0, cat "compute"). */
void rt_trace_comm(RtTrace *t, RtTraceKind kind, int group, int how, double start,
                   int64_t count);

/* The collective above: world NULL for a one-rank trainer; tp, dp, pp the
 * mesh.  World rank 0 writes path.  0, or -1 with rt_fail() called (on rank 0
 * for a file that cannot be written). */
int rt_trace_write(RtTrace *t, RtComm *world, const char *path, int tp, int dp, int pp);

#endif
