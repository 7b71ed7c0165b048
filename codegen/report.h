/* codegen/report.h -- the compile report a user reads before asking for GPUs. */
#ifndef PARC_REPORT_H
#define PARC_REPORT_H

#include <stdio.h>

#include "passes/passes.h"

void cg_report(FILE *out, const IrModule *m, const Layout *lay, const Cost *c);

/* b bytes as the report writes them ("512 B", "3.21 GiB"), into buf. */
const char *cg_bytes_text(char *buf, size_t len, double b);

/* A rank's predicted step time on c->machine (the default when NULL).
 * pp = 1: the compute time of c->step when valid (codegen/step_model.h), else
 * the forward + backward FLOPs at the machine's GEMM rate; plus each
 * collective of c->comm at its ring bytes over the link its group spans
 * (passes/machine.h) and the machine's latency, the dp group's hidden behind
 * the backward up to its length when c->overlap_dp and c->step is valid
 * (buckets start as they fill).  The expert all-to-alls count at their upper
 * bound (every slot filled).
 * c->pipe (pp > 1), or c->accum (pp 1, a routed model's microbatches
 * accumulated: a one-stage schedule): the simulated schedule's makespan (chunks timed by their
 * kernels when c->pipe->kernel_timed, cg_pipe_step_model; with the stage
 * boundaries' transfers), then the slowest stage's optimizer, plus the tp /
 * dp / ep collectives of the stage that has the most, not overlapped. */
typedef struct {
  double total_s, compute_s, comm_s, hidden_s;
  double pipeline_s, opt_s;  /* pp > 1: compute_s is their sum */
  int collectives;
  double mfu;                /* model FLOPs (3 x forward, a rank) / total / peak */
} CgPredicted;
void cg_predict_step(const Layout *lay, const Cost *c, CgPredicted *out);

/* One mixture-of-experts layer (a dispatch) as one rank runs it: the
 * activation cost of its capacity and its expert-parallel all-to-all. */
typedef struct {
  int layer;                 /* the dispatch's layer, -1 outside a repeat */
  int64_t experts, top_k, d_model;
  int microbatches;          /* a step runs the routing once per microbatch */
  int64_t batch_tokens;      /* tokens one microbatch routes, over all dp ranks */
  int64_t tokens;            /* of which one rank's (batch_tokens / dp) */
  int dropless;              /* no choice is ever dropped */
  int64_t capacity;          /* slots an expert, for the microbatch (dropless:
                                batch_tokens) */
  int64_t rank_capacity;     /* slots an expert in a rank's dispatch buffer:
                                min(capacity, tokens) (passes/shard.c) */
  double dispatch_bytes;     /* experts x rank_capacity x d_model, fp32 */
  double dropless_bytes;     /* experts x tokens x d_model, fp32: dropless's
                                worst case (every token may pick any expert) */
  int ep;                    /* experts over ep ranks; 1: no all-to-all */
  int a2a_count;             /* expert all-to-alls a step: dispatch and combine,
                                forward and backward, per microbatch */
  double a2a_payload_bytes;  /* a step: each one moves a dispatch buffer */
  double a2a_sent_bytes;     /* a step, at most (filled slots only travel): the
                                (ep - 1) / ep leaving the rank */
} CgMoeLayer;

/* The MoE layers of m (one entry per dispatch, in node order) for layout
 * lay, into out[0..max); returns how many there are (which may be above
 * max).  m is the whole batch (the logical module, or its dp shard) when
 * whole_batch is 1; one microbatch of the M (a pipelined trainer's module)
 * when 0.  Either way the figures are those of one microbatch a rank, and
 * the all-to-all counts and bytes those of a whole step. */
int cg_moe_layers(const IrModule *m, const Layout *lay, int microbatches, int whole_batch,
                  CgMoeLayer *out, int max);

#endif
