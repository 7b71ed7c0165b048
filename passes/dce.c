/* passes/dce.c -- dead code elimination.
 *
 * Keeps every INPUT and PARAM (they are the program's interface even when
 * unused), and every node the results depend on: the loss, after autodiff
 * the parameters' gradients, after the optimizer its updates and the
 * gradient norm.  Renumbers the survivors densely,
 * preserving topological order. */
#include "passes/passes.h"

int pass_dce(IrModule *m) {
  if (!m->loss) return 0;
  unsigned char *live = arena_alloc(&m->arena, (size_t)m->nnodes + 1);
  live[m->loss->id] = 1;
  if (m->ce_loss) live[m->ce_loss->id] = 1;
  for (int i = 0; i < m->nnodes; i++) /* roots first: a gradient comes after its param */
    if (m->nodes[i]->grad) live[m->nodes[i]->grad->id] = 1;
  for (int i = 0; i < m->nupdates; i++) live[m->updates[i].value->id] = 1;
  if (m->grad_norm) live[m->grad_norm->id] = 1;
  for (int i = m->nnodes - 1; i >= 0; i--) {
    IrNode *n = m->nodes[i];
    if (ir_op_info[n->op].flags & IR_F_LEAF) live[i] = 1;
    if (!live[i]) continue;
    for (int j = 0; j < n->ninputs; j++) live[n->inputs[j]->id] = 1;
  }
  int k = 0;
  for (int i = 0; i < m->nnodes; i++) {
    if (!live[i]) continue;
    m->nodes[k] = m->nodes[i];
    m->nodes[k]->id = k;
    k++;
  }
  m->nnodes = k;
  return 0;
}
