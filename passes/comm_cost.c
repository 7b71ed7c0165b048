/* passes/comm_cost.c -- the communication a rank-local module does per step.
 *
 * Every collective node is counted in its group (the axis attribute: 0 tp,
 * 1 dp, 2 ep (e.g. the routing statistics under expert parallelism), 3 ep_dp
 * (the sum of expert gradients over the dp ranks holding the same experts)) with its payload (the full tensor the group combines) and the bytes
 * each rank sends under ring schedules: an all-reduce sends 2 (n-1)/n of
 * the payload, an all-gather or a reduce-scatter (n-1)/n.  group_copy moves
 * nothing, nor does local_slice; replicate is an all-gather.  The vocab-parallel loss gathers per-row statistics (a max, then
 * a sum of exponentials kept as two floats and the target logit), forward
 * and backward: counted as all-gathers of 4 floats per row.  The vocab-
 * parallel embedding's result is all-reduced by an all_reduce node.  An
 * expert_all_to_all (expert parallelism) is counted apart (a2a_*): every
 * slot's row at most, the rank's own experts' share staying local.
 * A pipelined trainer (pp > 1, or a routed model's microbatches at pp 1) runs
 * another module: comm_analyze_pipe counts what its stage's rank runs, the
 * runtime's own collectives (runtime/rt_pipe.c) included. */
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

/* times collectives of one kind in a group of n ranks, payload bytes each */
static void add(CommCost *c, int axis, CommKind kind, int n, double payload, int times) {
  if (axis < 0 || axis >= COMM_GROUPS || n < 2 || times < 1) return;
  CommEntry *e = &c->e[axis][kind];
  double share = kind == COMM_ALL_REDUCE ? 2.0 * (n - 1) / n
                 : kind == COMM_SEND     ? 1.0
                 : kind == COMM_RECV     ? 0.0
                                         : (double)(n - 1) / n;
  e->count += times;
  e->payload_bytes += payload * times;
  e->sent_bytes += payload * share * times;
  c->group_size[axis] = n;
}

/* Node n's collective, run `times` times a step (nothing for other ops). */
static void count_node(CommCost *c, const IrNode *n, int times) {
  int axis = (int)n->ia[0], size = (int)n->ia[1];
  switch (n->op) {
  case IR_OP_ALL_REDUCE:
    add(c, axis, COMM_ALL_REDUCE, size, 4.0 * (double)ir_numel(n), times);
    break;
  case IR_OP_ALL_GATHER: case IR_OP_REPLICATE:
    add(c, axis, COMM_ALL_GATHER, size, 4.0 * (double)ir_numel(n), times);
    break;
  case IR_OP_REDUCE_SCATTER:
    add(c, axis, COMM_REDUCE_SCATTER, size, 4.0 * (double)ir_numel(n->inputs[0]), times);
    break;
  case IR_OP_VOCAB_CROSS_ENTROPY:
  case IR_OP_VOCAB_CROSS_ENTROPY_GRAD: { /* rt_vocab_cross_entropy's two gathers: the rows'
                                          * maxima, then 3 floats a row */
    const IrNode *logits = n->inputs[0];
    double rows = (double)ir_numel(logits) / (double)logits->shape[logits->rank - 1];
    add(c, axis, COMM_ALL_GATHER, size, 4.0 * rows * size, times);
    add(c, axis, COMM_ALL_GATHER, size, 3.0 * 4.0 * rows * size, times);
    break;
  }
  case IR_OP_EXPERT_ALL_TO_ALL: {
    /* the slots of every expert; a rank keeps its own experts' 1/size */
    double payload = 4.0 * (double)ir_numel(n->inputs[0]);
    if (times < 1) break;
    c->a2a_count += times;
    c->a2a_group = size;
    c->a2a_payload_bytes += payload * times;
    c->a2a_sent_bytes += payload * (size - 1) / size * times;
    break;
  }
  default:
    break;
  }
}

void comm_analyze(const IrModule *m, CommCost *c) {
  memset(c, 0, sizeof *c);
  for (int i = 0; i < m->nnodes; i++) count_node(c, m->nodes[i], 1);
}

void comm_gpu_bf16(CommGpu *d, const IrNode *n, int times) {
  int axis = (int)n->ia[0], size = (int)n->ia[1];
  if ((n->op != IR_OP_ALL_REDUCE && n->op != IR_OP_ALL_GATHER) || axis < 0 ||
      axis >= COMM_GROUPS || size < 2 || times < 1)
    return;
  *(n->op == IR_OP_ALL_REDUCE ? &d->sums[axis] : &d->gathers[axis]) += times;
  d->saved_bytes[axis] += 2.0 * (double)ir_numel(n) * (size - 1) / size * times;
}

void comm_gpu_fused(CommGpu *d, const IrNode *n) {
  CommCost c;
  memset(&c, 0, sizeof c);
  count_node(&c, n, 1);
  for (int g = 0; g < COMM_GROUPS; g++)
    for (int k = 0; k < COMM_KINDS; k++) {
      d->fused[g] += c.e[g][k].count;
      d->saved_bytes[g] += c.e[g][k].sent_bytes;
    }
}

/* ---- a pipelined trainer's stage ---------------------------------------- */

static int by_offset(const void *a, const void *b) {
  const int64_t *x = a, *y = b;
  return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* rt_pipe_step's reduction of stage s's accumulator (gn floats): the runs
 * between the expert regions over dp, each run of adjacent expert regions
 * over ep_dp (rt_pipe_expert_run's walk); under ZeRO-1 one reduce-scatter
 * per bucket of pp_zero_buckets. */
static void grad_reduction(CommCost *c, const IrModule *m, const PpProgram *pp,
                           const Layout *lay, int s) {
  int dp = lay->dp, ep_dp = lay->ep > 1 ? lay->dp / lay->ep : 1, n = 0;
  int64_t gn = pp->stage_params_numel[s];
  if (lay->zero >= 1 && dp > 1) { /* ZeRO-1: one reduce-scatter per bucket (pp_zero.c) */
    int nb = pp->zero_nbuckets ? pp->zero_nbuckets[s] : 0;
    double *bytes = calloc((size_t)nb + 1, sizeof *bytes);
    int *axis = calloc((size_t)nb + 1, sizeof *axis);
    for (int i = 0; bytes && axis && i < m->nnodes; i++) {
      int b = pp->zero_bucket[s][i];
      if (b < 0 || b >= nb) continue;
      bytes[b] += 4.0 * (double)ir_numel(m->nodes[i]);
      axis[b] = ep_sharded(m->nodes[i]) ? 3 : 1;
    }
    for (int b = 0; bytes && axis && b < nb; b++)
      add(c, axis[b], COMM_REDUCE_SCATTER, axis[b] == 3 ? ep_dp : dp, bytes[b], 1);
    free(bytes), free(axis);
    return;
  }
  int64_t *r = malloc(sizeof(int64_t) * 2 * ((size_t)m->nnodes + 1)); /* [offset, numel] */
  if (!r || dp < 2) {
    free(r);
    return;
  }
  for (int i = 0; i < m->nnodes; i++)
    if (ep_sharded(m->nodes[i]) && pp->stage_offset[s][i] >= 0 && ir_numel(m->nodes[i]) > 0)
      r[2 * n] = pp->stage_offset[s][i], r[2 * n + 1] = ir_numel(m->nodes[i]), n++;
  qsort(r, (size_t)n, 2 * sizeof *r, by_offset);
  int64_t at = 0;
  for (int k = 0; at < gn;) {
    int64_t lo = k < n ? r[2 * k] : gn, hi = lo;
    for (; k < n && r[2 * k] == hi; k++) hi += r[2 * k + 1];
    if (lo > at) add(c, 1, COMM_ALL_REDUCE, dp, 4.0 * (double)(lo - at), 1);
    if (hi > lo) add(c, 3, COMM_ALL_REDUCE, ep_dp, 4.0 * (double)(hi - lo), 1);
    if (hi <= at) break; /* (a region overlapping the last: never in a valid layout) */
    at = hi;
  }
  free(r);
}

/* The floats of boundary list ids[0..n) (each value its own send). */
static void transfers(CommCost *c, const IrModule *m, const int *ids, int n, CommKind kind,
                      int P) {
  for (int i = 0; i < n; i++) add(c, 4, kind, P, 4.0 * (double)ir_buf_numel(m->nodes[ids[i]]), 1);
}

void comm_analyze_pipe(const IrModule *m, const PpProgram *pp, const Layout *lay, int stage,
                       CommCost *c) {
  memset(c, 0, sizeof *c);
  int P = pp->nstages, M = pp->microbatches, npend = 0;
  /* the chunks' forward, B and W: once per microbatch; the optimizer once,
   * the stage's part of it as codegen/host.c's emit_group picks it, with its
   * sums over pp (one all-reduce of the pending per-parameter values) */
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *n = m->nodes[i];
    int ch = pp->chunk[i];
    if (ch >= 0 && ch % P == stage && n->phase != IR_PHASE_OPT) {
      count_node(c, n, M);
      continue;
    }
    if (ch != PP_NODE_OPT || n->phase != IR_PHASE_OPT) continue;
    int p = pp->opt_owner[i];
    uint64_t h = p >= 0 ? pp->holders[p] : 0;
    int held = p >= 0 && (h >> stage & 1);
    int lowest = held && !(h & ((UINT64_C(1) << stage) - 1));
    if (pp->opt_pub[i] == 2 && !lowest) continue;
    if (pp->opt_pub[i] == 1 && !lowest) {
      npend++;
      continue;
    }
    if (p >= 0 && !held) continue;
    int reads = 0;
    for (int k = 0; p < 0 && k < n->ninputs; k++) reads |= pp->opt_pub[n->inputs[k]->id] == 1;
    if (reads && npend) {
      add(c, 4, COMM_ALL_REDUCE, P, 4.0 * npend, 1);
      npend = 0;
    }
    if (pp->opt_pub[i] == 1) npend++;
    count_node(c, n, 1);
  }
  grad_reduction(c, m, pp, lay, stage);
  /* parameters several stages hold: every holder sends its part to the others
   * (under ZeRO-1 its piece: dp rank 0's, the largest) */
  int zdp = lay->zero >= 1 && lay->dp > 1 ? lay->dp : 1;
  for (int i = 0; P > 1 && i < m->nnodes; i++) {
    uint64_t h = pp->holders[i];
    if (m->nodes[i]->op != IR_OP_PARAM || !(h & (h - 1)) || !(h >> stage & 1)) continue;
    int64_t n = (ir_numel(m->nodes[i]) + zdp - 1) / zdp;
    for (int k = 0; k < P; k++)
      if (k != stage && (h >> k & 1)) {
        add(c, 4, COMM_SEND, P, 4.0 * (double)n, 1);
        add(c, 4, COMM_RECV, P, 4.0 * (double)n, 1);
      }
  }
  if (P > 1) add(c, 4, COMM_ALL_REDUCE, P, 4.0 * 2, 1); /* the loss and ce_loss */
  /* the boundaries: each action moves every value of its list */
  const PpSchedule *sc = pp->sched;
  for (int a = 0; sc && stage < sc->nstages && a < sc->nactions[stage]; a++) {
    const PpAction *x = &sc->actions[stage][a];
    int b = x->chunk;
    switch (x->kind) {
    case PP_SEND_ACT: transfers(c, m, pp->act[b], pp->nact[b], COMM_SEND, P); break;
    case PP_RECV_ACT: transfers(c, m, pp->act[b - 1], pp->nact[b - 1], COMM_RECV, P); break;
    case PP_SEND_GRAD: transfers(c, m, pp->grad[b - 1], pp->ngrad[b - 1], COMM_SEND, P); break;
    case PP_RECV_GRAD: transfers(c, m, pp->grad[b], pp->ngrad[b], COMM_RECV, P); break;
    default: break;
    }
  }
}
