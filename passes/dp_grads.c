/* passes/dp_grads.c -- data-parallel gradient averaging, after autodiff.
 *
 * Every parameter gradient of a module pass_shard made for dp > 1 is the
 * gradient of the rank's local batch; the gradient of the global batch is
 * their mean: all_reduce over the dp axis (axis 1), then scale 1/dp.  The
 * parameter's grad pointer moves to the averaged value, so the optimizer
 * reads only averaged gradients.  The new nodes are W-phase. */
#include <stdio.h>

#include "passes/passes.h"

int pass_dp_grads(IrModule *m, int dp) {
  if (m->mesh_dp && dp != m->mesh_dp) {
    fprintf(stderr, "parc: internal error: dp gradients over %d ranks for a module sharded "
                    "for dp = %d\n", dp, m->mesh_dp);
    return -1;
  }
  if (dp <= 1) return 0;
  for (int i = 0, n = m->nnodes; i < n; i++) {
    IrNode *p = m->nodes[i];
    if (p->op != IR_OP_PARAM || !p->grad) continue;
    IrNode *g = p->grad;
    IrNode *ar = ir_add(m, IR_OP_ALL_REDUCE, &g, 1);
    ar->ia[0] = 1;
    ar->ia[1] = dp;
    IrNode *sc = ir_add(m, IR_OP_SCALE, &ar, 1);
    sc->fa = 1.0 / dp;
    IrNode *made[2] = {ar, sc};
    for (int k = 0; k < 2; k++) {
      IrNode *x = made[k];
      char why[256];
      if (!ir_infer(x, why, sizeof why)) {
        fprintf(stderr, "parc: internal error: dp gradients: %s\n", why);
        return -1;
      }
      x->shard_dim = -1;
      x->layer = g->layer;
      x->loc = g->loc;
      x->phase = IR_PHASE_W;
    }
    p->grad = sc;
  }
  return 0;
}
