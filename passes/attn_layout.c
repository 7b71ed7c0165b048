/* passes/attn_layout.c -- attention reads and writes token-major tensors
 * where its neighbours only move heads in and out of that layout.
 *
 * The model's attention works in the token-major [B, T, H hd] of the
 * projections around it, and sdpa in head-major [B, H, T, hd]; split_heads
 * and merge_heads are the copies between them.  Three of those copies only
 * re-lay a result or operand of the attention itself, and vanish when the
 * attention kernel indexes the token-major tensor instead (ir.h IR_SDPA_*,
 * kept in ia[1]):
 *
 *   merge_heads(y), y = sdpa(q, k, v)        y takes IR_SDPA_OUT_TOKENS: y is
 *                                            [B, T, H hd], each merge_heads
 *                                            is replaced by y
 *   sdpa_grad(.., split_heads(dm), lse, d)   IR_SDPA_DY_TOKENS: it reads dm
 *   concat(merge_heads(slice(g, 1, 0, H)),   g = sdpa_grad takes
 *          merge_heads(slice(g, 1, H, KV)),  IR_SDPA_OUT_TOKENS: g is
 *          merge_heads(slice(g, 1, H+KV, KV)), [B, T, (H + 2 KV) hd], the
 *          axis = last)                      concat is replaced by g
 *
 * The last is GPT-2's backward into its fused q|k|v projection: the packed
 * dq|dk|dv was cut, re-laid and concatenated, a pass over 3 C columns.
 * Every element is the same value computed the same way, at another
 * address: the same bits.
 *
 * Conditions: y is read by merge_heads and sdpa_lse only (sdpa_lse copies
 * lse, which stays after out); g has six operands (lse and D given,
 * passes/attn_delta.c: the five-operand form reads y's out head-major);
 * the slices and merge_heads have no other reader; nothing rewritten or
 * removed is held (ir_node_held).  Runs last, on the module codegen writes.
 * The removed copies are read by nothing and dropped; ids follow. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

typedef struct {
  IrModule *m;
  int *readers;        /* per node: how many input slots read it */
  IrNode **only;       /* per node read exactly once: its reader */
  unsigned char *dead; /* per node: removed by this pass */
} Lay;

/* 1 if n is read once, by its own single reader, and may be removed. */
static int sole(const Lay *L, const IrNode *n) {
  return L->readers[n->id] == 1 && !ir_node_held(L->m, n);
}

/* Every input slot reading `from` reads `to` instead. */
static void redirect(IrModule *m, IrNode *from, IrNode *to) {
  for (int i = from->id + 1; i < m->nnodes; i++)
    for (int j = 0; j < m->nodes[i]->ninputs; j++)
      if (m->nodes[i]->inputs[j] == from) m->nodes[i]->inputs[j] = to;
}

/* n's layout becomes layout | bit; its new type must be `want`'s (the node it
 * replaces), or, want NULL, any.  0, or -1 after an internal error. */
static int relayout(IrNode *n, int bit, const IrNode *want) {
  char why[256] = "its type is not the one it replaces";
  n->ia[1] |= bit;
  if (ir_infer(n, why, sizeof why) &&
      (!want || (n->rank == want->rank &&
                 !memcmp(n->shape, want->shape, sizeof(int64_t) * (size_t)n->rank))))
    return 0;
  fprintf(stderr, "parc: internal error: attn_layout: node %d: %s\n", n->id, why);
  return -1;
}

/* sdpa y: out token-major when only merge_heads and sdpa_lse read it. */
static int out_tokens(Lay *L, IrNode *y) {
  IrModule *m = L->m;
  int merges = 0;
  for (int i = y->id + 1; i < m->nnodes; i++)
    for (int j = 0; j < m->nodes[i]->ninputs; j++) {
      const IrNode *r = m->nodes[i];
      if (r->inputs[j] != y) continue;
      if (r->op == IR_OP_MERGE_HEADS && !ir_node_held(m, r)) merges++;
      else if (r->op != IR_OP_ATTENTION_LSE) return 0;
    }
  if (!merges || ir_node_held(m, y)) return 0;
  IrNode *was = NULL;
  for (int i = y->id + 1; i < m->nnodes; i++)
    if (m->nodes[i]->op == IR_OP_MERGE_HEADS && m->nodes[i]->inputs[0] == y) was = m->nodes[i];
  if (relayout(y, IR_SDPA_OUT_TOKENS, was)) return -1;
  for (int i = y->id + 1; i < m->nnodes; i++) {
    IrNode *r = m->nodes[i];
    if (r->op != IR_OP_MERGE_HEADS || r->inputs[0] != y) continue;
    redirect(m, r, y);
    L->dead[r->id] = 1;
  }
  return 0;
}

/* sdpa_grad g (six operands): dy from the token-major tensor it was cut from. */
static int dy_tokens(Lay *L, IrNode *g) {
  IrNode *s = g->inputs[3];
  if (s->op != IR_OP_SPLIT_HEADS || s->inputs[0]->rank != 3) return 0;
  const IrNode was = *g;
  g->inputs[3] = s->inputs[0];
  if (relayout(g, IR_SDPA_DY_TOKENS, &was)) return -1;
  if (--L->readers[s->id] == 0 && !ir_node_held(L->m, s)) L->dead[s->id] = 1;
  return 0;
}

/* sdpa_grad g (six operands): its result token-major when only the concat of
 * its merged dq, dk, dv (in that order, along the last axis) reads it. */
static int dqkv_tokens(Lay *L, IrNode *g) {
  IrModule *m = L->m;
  int64_t H = g->inputs[0]->shape[1], KV = g->inputs[1]->shape[1];
  const int64_t start[3] = {0, H, H + KV}, len[3] = {H, KV, KV};
  IrNode *cat = NULL, *part[3][2]; /* [dq|dk|dv][slice, merge_heads] */
  int found = 0; /* slices of g: all three of its readers, or no rewrite */
  if (L->readers[g->id] != 3 || ir_node_held(m, g)) return 0;
  for (int i = g->id + 1; i < m->nnodes && found < 3; i++) {
    IrNode *s = m->nodes[i];
    if (s->ninputs < 1 || s->inputs[0] != g) continue;
    if (s->op != IR_OP_SLICE || s->ia[0] != 1 || !sole(L, s)) return 0;
    IrNode *mh = L->only[s->id];
    if (mh->op != IR_OP_MERGE_HEADS || !sole(L, mh)) return 0;
    IrNode *c = L->only[mh->id];
    if (c->op != IR_OP_CONCAT || c->ninputs != 3 || c->ia[0] != c->rank - 1 || (cat && c != cat))
      return 0;
    cat = c;
    int k = 0;
    while (k < 3 && c->inputs[k] != mh) k++;
    if (k == 3 || s->ia[1] != start[k] || s->ia[2] != len[k]) return 0;
    part[k][0] = s, part[k][1] = mh;
    found++;
  }
  if (found < 3 || ir_node_held(m, cat)) return 0;
  if (relayout(g, IR_SDPA_OUT_TOKENS, cat)) return -1;
  redirect(m, cat, g);
  for (int k = 0; k < 3; k++) L->dead[part[k][0]->id] = L->dead[part[k][1]->id] = 1;
  L->dead[cat->id] = 1;
  return 0;
}

int pass_attn_layout(IrModule *m) {
  int n = m->nnodes, rc = 0, removed = 0;
  Lay L = {m, ir_xcalloc((size_t)n, sizeof(int)), ir_xcalloc((size_t)n, sizeof(IrNode *)),
           ir_xcalloc((size_t)n, 1)};
  for (int i = 0; i < n; i++)
    for (int j = 0; j < m->nodes[i]->ninputs; j++) {
      const IrNode *x = m->nodes[i]->inputs[j];
      L.readers[x->id]++;
      L.only[x->id] = m->nodes[i];
    }
  for (int i = 0; i < n && !rc; i++) {
    IrNode *x = m->nodes[i];
    if (x->op == IR_OP_ATTENTION && !x->ia[1]) rc = out_tokens(&L, x);
    else if (x->op == IR_OP_ATTENTION_GRAD && x->ninputs == 6 && !x->ia[1])
      rc = dy_tokens(&L, x) || dqkv_tokens(&L, x);
  }
  IrNode **order = ir_xcalloc((size_t)n, sizeof *order);
  int k = 0;
  for (int i = 0; i < n; i++)
    if (!L.dead[i]) order[k++] = m->nodes[i];
    else removed++;
  if (!rc && removed) ir_set_order(m, order, k);
  free(order);
  free(L.readers);
  free(L.only);
  free(L.dead);
  return rc;
}
