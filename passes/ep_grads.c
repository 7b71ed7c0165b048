/* passes/ep_grads.c -- gradient averaging of expert-parallel weights.
 *
 * Under expert parallelism (passes/shard.c) a PARAM with shard
 * IR_SHARD_EXPERT and shard_degree ep > 1 holds experts / ep experts, and the
 * rank's gradient of it already sums the contributions of every token its
 * ep group routed there (expert_all_to_all's adjoint brings them back).
 * The ranks holding the same experts are the ep_dp group (axis 3, dp / ep
 * members); the gradient of the global objective (the mean of the dp
 * ranks' losses) is the sum over that group divided by dp:
 *   g' = scale(all_reduce(g) axis=3 size=dp/ep, 1/dp)
 * (no all_reduce when dp == ep).  Dense gradients stay with pass_dp_grads,
 * which leaves these alone (ep_sharded) and calls this first.  New nodes
 * are W-phase, appended, with their gradient's layer and location. */
#include <stdio.h>
#include <string.h>

#include "passes/passes.h"

int ep_sharded(const IrNode *p) {
  return p->op == IR_OP_PARAM && p->shard == IR_SHARD_EXPERT && p->shard_degree > 1;
}

static IrNode *add(IrModule *m, IrOp op, IrNode *x, int64_t ia0, int64_t ia1, double fa) {
  IrNode p = {.op = op, .inputs = &x, .ninputs = 1, .ia = {ia0, ia1, 0}, .fa = fa};
  char why[256];
  if (!ir_infer(&p, why, sizeof why)) {
    fprintf(stderr, "parc: internal error: expert gradients: %s\n", why);
    return NULL;
  }
  IrNode *n = ir_add_like(m, &p);
  n->shard_dim = -1;
  n->layer = x->layer;
  n->loc = x->loc;
  n->phase = IR_PHASE_W;
  return n;
}

int pass_ep_grads(IrModule *m, int dp) {
  int nold = m->nnodes;
  for (int i = 0; i < nold; i++) {
    IrNode *p = m->nodes[i];
    if (!ep_sharded(p) || !p->grad) continue;
    int ep = p->shard_degree;
    if (dp % ep) {
      fprintf(stderr, "parc: internal error: %s split over ep = %d, which does not divide "
                      "dp = %d\n", p->name, ep, dp);
      return -1;
    }
    IrNode *g = p->grad;
    if (dp / ep > 1 && !(g = add(m, IR_OP_ALL_REDUCE, g, 3, dp / ep, 0))) return -1;
    if (!(g = add(m, IR_OP_SCALE, g, 0, 0, 1.0 / dp))) return -1;
    p->grad = g;
  }
  return 0;
}
