/* passes/slice_sink.c -- slices moved above the pointwise op they cut, so
 * that the op is computed inside each slice's reader and never stored.
 *
 * GPT-2's attention projects q|k|v with one GEMM and one bias add,
 *
 *   y = add(matmul(x, w), b)                      [B, T, 3C]
 *   q = slice(y, axis 2, 0, C)   k = slice(y, .., C, C)   v = slice(y, .., 2C, C)
 *
 * and each slice feeds its own split_heads kernel.  The fusion planner
 * (codegen/cg_kernels.h) computes a value in one kernel only, and a kernel
 * visiting a third of y cannot store y: so y was a kernel of its own, a
 * pass over 3C columns written and read back.  Slicing commutes with a
 * pointwise op, so this pass rewrites each such slice s = slice(p, a, o, n)
 * of a pointwise p = OP(x_1, .., x_k) into
 *
 *   s' = OP(x_1', .., x_k')   x_j' = slice(x_j, a_j, o, n) where x_j spans
 *                             p's axis a (a_j: that axis in x_j, numpy
 *                             broadcasting aligns the last dims), else x_j
 *
 * which computes every element of s from the same operands with the same
 * op: the same bits.  p is then read by nothing and removed; each s' fuses
 * into its reader like any pointwise op.
 *
 * p is rewritten only when every reader of p is such a slice and nothing
 * else holds p (the loss, the gradient norm, an update, a parameter's
 * gradient), and some x_j is cut (p's axis a is not a broadcast one).  The
 * slices of x_j and s' are placed right before s, in s's phase and layer;
 * s keeps its id position (the ids are renumbered after).  Runs after
 * autodiff and the optimizer, on the module codegen writes: the backward
 * pass was built from the unrewritten forward, and reads none of these
 * values (a pointwise op's gradient reading its own result keeps p, which
 * then has a reader that is not a slice). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

/* The axis of input x of pointwise p that p's axis a reads, or -1 where x
 * is broadcast along it (absent or of size 1 against a larger p). */
static int input_axis(const IrNode *p, const IrNode *x, int a) {
  int ax = a - (p->rank - x->rank);
  if (ax < 0 || x->shape[ax] != p->shape[a]) return -1;
  return ax;
}

int pass_slice_sink(IrModule *m) {
  int nold = m->nnodes;
  int *readers = ir_xcalloc((size_t)nold, sizeof *readers); /* per node: its readers */
  int *others = ir_xcalloc((size_t)nold, sizeof *others);   /* ... that are no slice */
  for (int i = 0; i < nold; i++) {
    const IrNode *n = m->nodes[i];
    for (int j = 0; j < n->ninputs; j++) {
      readers[n->inputs[j]->id]++;
      if (n->op != IR_OP_SLICE) others[n->inputs[j]->id]++;
    }
  }
  /* before[s]: the slices of the inputs placed right before slice s; dead[p] */
  IrNode ***before = ir_xcalloc((size_t)nold, sizeof *before);
  int *nbefore = ir_xcalloc((size_t)nold, sizeof *nbefore);
  unsigned char *dead = ir_xcalloc((size_t)nold, 1);
  int rc = 0, moved = 0;
  for (int i = 0; i < nold && !rc; i++) {
    IrNode *s = m->nodes[i];
    if (s->op != IR_OP_SLICE) continue;
    IrNode *p = s->inputs[0];
    if (!(ir_op_info[p->op].flags & IR_F_POINTWISE) || others[p->id] || !readers[p->id] ||
        p->dtype != IR_F32 || ir_node_held(m, p))
      continue;
    int a = (int)s->ia[0], cut = 0;
    for (int j = 0; j < p->ninputs; j++) cut |= input_axis(p, p->inputs[j], a) >= 0;
    if (!cut) continue;
    IrNode **in = arena_alloc(&m->arena, sizeof *in * (size_t)p->ninputs);
    before[i] = arena_alloc(&m->arena, sizeof(IrNode *) * (size_t)p->ninputs);
    for (int j = 0; j < p->ninputs && !rc; j++) {
      IrNode *x = p->inputs[j];
      int ax = input_axis(p, x, a);
      in[j] = x;
      if (ax < 0) continue;
      IrNode proto = {.op = IR_OP_SLICE, .inputs = &in[j], .ninputs = 1,
                      .ia = {ax, s->ia[1], s->ia[2]}};
      IrNode *c = ir_add_inferred(m, &proto, s, s->phase, "slice_sink");
      if (!c) rc = -1;
      else before[i][nbefore[i]++] = in[j] = c;
    }
    if (rc) break;
    /* s becomes OP(x_1', ..) itself: its readers, id and shape stay */
    s->op = p->op;
    s->inputs = in;
    s->ninputs = p->ninputs;
    s->ia[0] = p->ia[0], s->ia[1] = p->ia[1], s->ia[2] = p->ia[2];
    s->fa = p->fa;
    char why[256] = "its shape changed";
    IrNode was = *s;
    if (!ir_infer(s, why, sizeof why) || s->rank != was.rank ||
        memcmp(s->shape, was.shape, sizeof(int64_t) * (size_t)was.rank)) {
      fprintf(stderr, "parc: internal error: slice_sink: node %d: %s\n", i, why);
      rc = -1;
      break;
    }
    if (--readers[p->id] == 0) dead[p->id] = 1;
    moved++;
  }
  if (!rc && moved) { /* the new slices into place, the dead ops out; ids follow */
    IrNode **order = ir_xcalloc((size_t)m->nnodes, sizeof *order);
    int k = 0;
    for (int i = 0; i < nold; i++) {
      for (int j = 0; j < nbefore[i]; j++) order[k++] = before[i][j];
      if (!dead[i]) order[k++] = m->nodes[i];
    }
    ir_set_order(m, order, k);
    free(order);
  }
  free(readers);
  free(others);
  free(before);
  free(nbefore);
  free(dead);
  return rc;
}
