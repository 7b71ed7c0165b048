/* codegen/grad_onto.c -- see grad_onto.h. */
#include "codegen/grad_onto.h"

#include <stdio.h>

/* The one reader of node id i, or NULL (none, or several, or twice). */
static const IrNode *only_reader(const IrModule *m, int i) {
  const IrNode *r = NULL;
  for (int j = i + 1; j < m->nnodes; j++)
    for (int q = 0; q < m->nodes[j]->ninputs; q++)
      if (m->nodes[j]->inputs[q]->id == i) {
        if (r) return NULL;
        r = m->nodes[j];
      }
  return r;
}

/* For y, the term z = add(x, y) whose bytes y's call may add onto (the
 * structural conditions, grad_onto.h), and *z; else -1. */
static int candidate(const IrModule *m, const CgKernelPlan *kp, const IrNode *y,
                     const IrNode **zp) {
  if ((y->op != IR_OP_EMBEDDING_GRAD && y->op != IR_OP_VOCAB_EMBEDDING_GRAD) ||
      kp->kernel_of[y->id] >= 0 || y->phase != IR_PHASE_W)
    return -1;
  const IrNode *z = only_reader(m, y->id);
  if (!z || z->op != IR_OP_ADD || z->ninputs != 2 || z->inputs[1] != y || z->id != y->id + 1)
    return -1;
  const IrNode *x = z->inputs[0];
  const int k = kp->kernel_of[z->id];
  if (x->id > y->id || only_reader(m, x->id) != z || k < 0 || kp->kernels[k].nnodes != 1 ||
      kp->kernels[k].root != z->id || !kp->materialize[x->id] || !ir_same_shape(x, y) ||
      !ir_same_shape(z, x) || x->dtype != IR_F32 || z->dtype != IR_F32 ||
      x->phase != IR_PHASE_W || z->phase != IR_PHASE_W)
    return -1;
  *zp = z;
  return x->id;
}

int cg_onto_candidates(IrModule *m, CgKernelPlan *kp) {
  int count = 0;
  for (int i = 0; !kp->acc_into && i < m->nnodes; i++) {
    const IrNode *z;
    const int x = candidate(m, kp, m->nodes[i], &z);
    if (x >= 0) kp->view_of[z->id] = x, count++;
  }
  return count;
}

int cg_plan_onto(IrModule *m, CgKernelPlan *kp, const BufPlan *bp, const BufPlan *gbp,
                 const CgCudaStore *store, char *err, size_t len) {
  int *onto = NULL, count = 0;
  for (int i = 0; !kp->acc_into && i < m->nnodes; i++) {
    const IrNode *z;
    const int x = candidate(m, kp, m->nodes[i], &z);
    if (x < 0 || kp->view_of[z->id] != x) continue;
    const int on = bp->alias[z->id] == x, gon = gbp->alias[z->id] == x;
    if (on != gon || (on && (store->bf16[x] || store->bf16[i] || store->bf16[z->id]))) {
      snprintf(err, len, "internal error: %%%d over %%%d in %s of the trainers' buffer plans "
               "(codegen/grad_onto.h)", z->id, x, on ? "one" : "neither");
      return -1;
    }
    if (!on) { /* (no plan wrote z over x: its add kernel runs) */
      kp->view_of[z->id] = -1;
      continue;
    }
    if (!onto) {
      onto = arena_alloc(&m->arena, sizeof(int) * (size_t)(m->nnodes + 1));
      for (int j = 0; j < m->nnodes; j++) onto[j] = -1;
    }
    onto[i] = x;
    count++;
  }
  kp->onto = onto;
  return count;
}
