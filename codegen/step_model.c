/* codegen/step_model.c -- a rank's predicted compute time a step
 * (codegen/step_model.h). */
#include "codegen/step_model.h"

static double node_bytes(const IrNode *n) { return 4.0 * (double)ir_numel(n); }

/* A collective or a rank-coordinate op: communication, not compute. */
static int is_comm(IrOp op) {
  switch (op) {
  case IR_OP_ALL_REDUCE: case IR_OP_GROUP_COPY: case IR_OP_ALL_GATHER: case IR_OP_REDUCE_SCATTER:
  case IR_OP_REPLICATE: case IR_OP_EXPERT_ALL_TO_ALL:
    return 1;
  default:
    return 0;
  }
}

/* FLOPs of a runtime op's products (0 for a memory-bound op); *attn set
 * when they run at the attention rate. */
static double op_flops(const IrNode *n, int *attn) {
  *attn = 0;
  const IrNode *a = n->ninputs ? n->inputs[0] : NULL;
  switch (n->op) {
  case IR_OP_MATMUL: /* a[..., m, k] */
    return 2.0 * (double)ir_numel(n) * (double)a->shape[a->rank - 1];
  case IR_OP_MATMUL_TA: /* a[..., k, m] */
    return 2.0 * (double)ir_numel(n) * (double)a->shape[a->rank - 2];
  case IR_OP_ATTENTION:
  case IR_OP_ATTENTION_GRAD: { /* q [B, H, T, hd] */
    double f = 4.0 * (double)a->shape[0] * (double)a->shape[1] * (double)a->shape[2] *
               (double)a->shape[2] * (double)a->shape[3];
    if (n->ia[0]) f *= 0.5; /* causal */
    *attn = 1;
    return n->op == IR_OP_ATTENTION ? f : 2.5 * f;
  }
  default:
    return 0;
  }
}

static void add_call(StepTime *st, IrPhase phase, double t, int kind) {
  st->calls++;
  double *by_kind[] = {&st->mem_s, &st->gemm_s, &st->attn_s};
  *by_kind[kind] += t;
  if (phase == IR_PHASE_FWD) st->fwd_s += t;
  else if (phase == IR_PHASE_OPT) st->opt_s += t;
  else st->bwd_s += t;
}

void cg_step_model(const IrModule *m, const CgKernelPlan *kp, const Machine *mc, int bf16,
                   StepTime *st) {
  *st = (StepTime){0};
  st->valid = 1;
  int p = bf16 ? 1 : 0;
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *n = m->nodes[i];
    int k = kp->kernel_of[i];
    if (k >= 0) { /* a generated kernel, counted once, where it runs */
      const CgKernel *kr = &kp->kernels[k];
      if (kr->root != i || (kp->view_of[i] >= 0 && kr->nnodes == 1)) continue;
      /* an argument larger than every value the kernel computes is read in
       * part (a slice of a flat gradient bucket): count at most that much */
      double bytes = 0, cap = 0;
      for (int j = 0; j < kr->nnodes; j++)
        if (node_bytes(m->nodes[kr->nodes[j]]) > cap) cap = node_bytes(m->nodes[kr->nodes[j]]);
      for (int a = 0; a < kr->nargs; a++) {
        int id = kr->arg_node[a];
        double b = id >= 0 ? node_bytes(m->nodes[id]) : 4.0 * (double)kp->temps[-1 - id].numel;
        bytes += cap > 0 && b > cap ? cap : b;
      }
      st->bytes += bytes;
      add_call(st, n->phase, mc->kernel_s + bytes / mc->mem_bytes_per_s, 0);
      continue;
    }
    if (!cg_runtime_op(n->op) || is_comm(n->op)) continue; /* leaves, collectives */
    double bytes = node_bytes(n);
    for (int j = 0; j < n->ninputs; j++) bytes += node_bytes(n->inputs[j]);
    int attn;
    double f = op_flops(n, &attn), rate = attn ? mc->attn_flops[p] : mc->gemm_flops[p];
    double tf = f / rate, tm = bytes / mc->mem_bytes_per_s;
    st->bytes += bytes;
    if (attn) st->attn_flops += f;
    else st->gemm_flops += f;
    add_call(st, n->phase, mc->kernel_s + (tf > tm ? tf : tm), f > 0 ? 1 + attn : 0);
  }
}
