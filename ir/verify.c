/* ir/verify.c -- checks every invariant stated in ir/ir.h. */
#include <string.h>

#include "ir/ir.h"

static int bad(char *why, size_t len, const IrNode *n, const char *what) {
  snprintf(why, len, "node %%%d (%s): %s", n ? n->id : -1,
           n && (unsigned)n->op < IR_OP_COUNT ? ir_op_info[n->op].name : "?",
           what);
  return -1;
}

int ir_verify(const IrModule *m, char *why, size_t len) {
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *n = m->nodes[i];
    if (!n || n->id != i) return bad(why, len, n, "id does not match its position");
    if ((unsigned)n->op >= IR_OP_COUNT) return bad(why, len, n, "unknown op");
    if (n->rank < 0 || n->rank > IR_MAX_RANK) return bad(why, len, n, "rank out of range");
    int64_t numel = 1;
    for (int d = 0; d < n->rank; d++) {
      if (n->shape[d] < 1 || n->shape[d] > IR_MAX_DIM)
        return bad(why, len, n, "dimension out of range");
      if (numel > INT64_MAX / n->shape[d]) return bad(why, len, n, "element count overflows");
      numel *= n->shape[d];
    }
    for (int j = 0; j < n->ninputs; j++) {
      const IrNode *in = n->inputs[j];
      if (!in || in->id >= i || m->nodes[in->id] != in)
        return bad(why, len, n, "input is not an earlier node of this module");
    }
    int leaf = ir_op_info[n->op].flags & IR_F_LEAF;
    if (leaf != (n->name != NULL && n->name[0] != 0) && leaf)
      return bad(why, len, n, "graph value without a name");
    if (leaf) {
      for (int j = 0; j < i; j++)
        if (m->nodes[j]->name && strcmp(m->nodes[j]->name, n->name) == 0)
          return bad(why, len, n, "duplicate name");
      continue;
    }
    IrNode copy = *n;
    char reason[256];
    if (!ir_infer(&copy, reason, sizeof reason)) return bad(why, len, n, reason);
    if (copy.dtype != n->dtype || copy.rank != n->rank ||
        memcmp(copy.shape, n->shape, sizeof(int64_t) * (size_t)n->rank) != 0)
      return bad(why, len, n, "stored type differs from the inferred type");
  }
  if (m->loss && (m->loss->rank != 0 || m->nodes[m->loss->id] != m->loss))
    return bad(why, len, m->loss, "loss is not a scalar node of this module");
  return 0;
}
