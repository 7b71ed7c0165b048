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
 * slot's row at most, the rank's own experts' share staying local. */
#include <string.h>

#include "passes/passes.h"

static void add(CommCost *c, int axis, CommKind kind, int n, double payload) {
  if (axis < 0 || axis >= COMM_GROUPS || n < 2) return;
  CommEntry *e = &c->e[axis][kind];
  double share = kind == COMM_ALL_REDUCE ? 2.0 * (n - 1) / n : (double)(n - 1) / n;
  e->count++;
  e->payload_bytes += payload;
  e->sent_bytes += payload * share;
  c->group_size[axis] = n;
}

void comm_analyze(const IrModule *m, CommCost *c) {
  memset(c, 0, sizeof *c);
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *n = m->nodes[i];
    int axis = (int)n->ia[0], size = (int)n->ia[1];
    switch (n->op) {
    case IR_OP_ALL_REDUCE:
      add(c, axis, COMM_ALL_REDUCE, size, 4.0 * (double)ir_numel(n));
      break;
    case IR_OP_ALL_GATHER: case IR_OP_REPLICATE:
      add(c, axis, COMM_ALL_GATHER, size, 4.0 * (double)ir_numel(n));
      break;
    case IR_OP_REDUCE_SCATTER:
      add(c, axis, COMM_REDUCE_SCATTER, size, 4.0 * (double)ir_numel(n->inputs[0]));
      break;
    case IR_OP_VOCAB_CROSS_ENTROPY:
    case IR_OP_VOCAB_CROSS_ENTROPY_GRAD: {
      const IrNode *logits = n->inputs[0];
      double rows = (double)ir_numel(logits) / (double)logits->shape[logits->rank - 1];
      add(c, axis, COMM_ALL_GATHER, size, 4.0 * 4.0 * rows * size);
      break;
    }
    case IR_OP_EXPERT_ALL_TO_ALL: {
      /* the slots of every expert; a rank keeps its own experts' 1/size */
      double payload = 4.0 * (double)ir_numel(n->inputs[0]);
      c->a2a_count++;
      c->a2a_group = size;
      c->a2a_payload_bytes += payload;
      c->a2a_sent_bytes += payload * (size - 1) / size;
      break;
    }
    default:
      break;
    }
  }
}
