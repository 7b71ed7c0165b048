/* passes/intent.c -- resolve sharding intents to dimensions.
 *
 * `column` and `row` are roles, not dimensions: a column-parallel weight
 * splits the output features of the matmul that reads it, a row-parallel
 * one the input features.  For matmul(x, w) with w [..., k, n] that is n
 * (column) or k (row); with transpose_b, w is [..., n, k].  A column or row
 * parameter no matmul reads as its weight (a bias) follows its weight: a
 * column bias splits its last dimension, a row bias stays replicated. */
#include "passes/passes.h"

static int matmul_dim(const IrNode *mm, IrShard shard) {
  int r = mm->inputs[1]->rank;
  int out = mm->ia[0] ? r - 2 : r - 1, in = mm->ia[0] ? r - 1 : r - 2;
  return shard == IR_SHARD_COLUMN ? out : in;
}

int pass_intent(IrModule *m) {
  for (int i = 0; i < m->nnodes; i++) {
    IrNode *n = m->nodes[i];
    if (n->op != IR_OP_MATMUL) continue;
    IrNode *w = n->inputs[1];
    if (w->op == IR_OP_PARAM && w->shard_dim < 0 &&
        (w->shard == IR_SHARD_COLUMN || w->shard == IR_SHARD_ROW))
      w->shard_dim = matmul_dim(n, w->shard);
  }
  for (int i = 0; i < m->nnodes; i++) {
    IrNode *n = m->nodes[i];
    if (n->op == IR_OP_PARAM && n->shard == IR_SHARD_COLUMN && n->shard_dim < 0)
      n->shard_dim = n->rank - 1;
  }
  return 0;
}
