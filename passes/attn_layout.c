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
 *   sdpa(split_heads(slice(p, 2, 0, H hd)),  y and its gradients take
 *        split_heads(slice(p, .., KV hd)),   IR_SDPA_QKV_TOKENS: all three
 *        split_heads(slice(p, .., KV hd)))   read r = reshape(p) [B, T, H +
 *                                            2 KV, hd], a view of p's bytes
 *
 * The third is GPT-2's backward into its fused q|k|v projection: the packed
 * dq|dk|dv was cut, re-laid and concatenated, a pass over 3 C columns; the
 * fourth its forward out of it (three copies, each a pass over C columns
 * read and written), where the attention reads q, k, v where the projection
 * put them.  Every element is the same value computed the same way, at
 * another address: the same bits.
 *
 * Conditions: y is read by merge_heads and sdpa_lse only (sdpa_lse copies
 * lse, which stays after out); g has six operands (lse and D given,
 * passes/attn_delta.c: the five-operand form reads y's out head-major);
 * the slices and merge_heads have no other reader; q, k, v's split_heads
 * are read by y and by six-operand sdpa_grads of the same q, k, v only;
 * nothing rewritten or removed is held (ir_node_held).  Runs after the
 * optimizer, on the module codegen writes, before slice_sink (which would
 * move the projection's bias add into the three slices, and p with it).
 * The removed copies are read by nothing and dropped; the new reshapes go
 * right before their sdpa; ids follow. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

typedef struct {
  IrModule *m;
  int n;               /* nodes before the pass (the arrays' length) */
  int *readers;        /* per node: how many input slots read it */
  IrNode **only;       /* per node read exactly once: its reader */
  unsigned char *dead; /* per node: removed by this pass */
  IrNode **before;     /* per node: a new node placed right before it */
  int made;            /* new nodes */
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

/* sdpa y: q, k, v from the one [B, T, (H + 2 KV) hd] tensor p their slices
 * cut, in q|k|v order along its last axis, through a reshape of p; the same
 * for the six-operand sdpa_grads of y's q, k, v. */
static int qkv_tokens(Lay *L, IrNode *y) {
  IrModule *m = L->m;
  const IrSdpaDims d = ir_sdpa_dims(y);
  const int64_t start[3] = {0, d.H, d.H + d.KV}, len[3] = {d.H, d.KV, d.KV};
  IrNode *sh[3], *p = NULL;
  for (int j = 0; j < 3; j++) {
    sh[j] = y->inputs[j];
    if (sh[j]->op != IR_OP_SPLIT_HEADS || ir_node_held(m, sh[j])) return 0;
    IrNode *s = sh[j]->inputs[0];
    if (s->op != IR_OP_SLICE || !sole(L, s) || (p && s->inputs[0] != p) ||
        s->ia[0] != s->rank - 1 || s->ia[1] != start[j] * d.hd || s->ia[2] != len[j] * d.hd)
      return 0;
    p = s->inputs[0];
  }
  if (p->rank != 3 || p->shape[2] != (d.H + 2 * d.KV) * d.hd) return 0;
  /* every reader of q, k, v: y, or a six-operand gradient reading all three in place */
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *r = m->nodes[i];
    for (int k = 0; k < r->ninputs; k++) {
      int j = 0;
      while (j < 3 && r->inputs[k] != sh[j]) j++;
      if (j == 3 || r == y) continue;
      if (r->op != IR_OP_ATTENTION_GRAD || r->ninputs != 6 || k != j || r->ia[1] ||
          r->inputs[0] != sh[0] || r->inputs[1] != sh[1] || r->inputs[2] != sh[2])
        return 0;
    }
  }
  int64_t rs[4] = {d.B, d.T, d.H + 2 * d.KV, d.hd};
  IrNode proto = {.op = IR_OP_RESHAPE, .inputs = &p, .ninputs = 1, .rank = 4};
  memcpy(proto.shape, rs, sizeof rs);
  IrNode *r = ir_add_inferred(m, &proto, y, y->phase, "attn_layout");
  if (!r) return -1;
  L->before[y->id] = r;
  L->made++;
  for (int i = y->id; i < L->n; i++) {
    IrNode *g = m->nodes[i];
    if (g != y && (g->op != IR_OP_ATTENTION_GRAD || g->inputs[0] != sh[0])) continue;
    const IrNode was = *g;
    g->inputs[0] = g->inputs[1] = g->inputs[2] = r;
    g->ia[2] = d.KV;
    if (relayout(g, IR_SDPA_QKV_TOKENS, &was)) return -1;
  }
  for (int j = 0; j < 3; j++) L->dead[sh[j]->id] = L->dead[sh[j]->inputs[0]->id] = 1;
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
  const int64_t H = ir_sdpa_dims(g).H, KV = ir_sdpa_dims(g).KV;
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
  Lay L = {m, n, ir_xcalloc((size_t)n, sizeof(int)), ir_xcalloc((size_t)n, sizeof(IrNode *)),
           ir_xcalloc((size_t)n, 1), ir_xcalloc((size_t)n, sizeof(IrNode *)), 0};
  for (int i = 0; i < n; i++)
    for (int j = 0; j < m->nodes[i]->ninputs; j++) {
      const IrNode *x = m->nodes[i]->inputs[j];
      L.readers[x->id]++;
      L.only[x->id] = m->nodes[i];
    }
  const int tokens = IR_SDPA_OUT_TOKENS | IR_SDPA_DY_TOKENS;
  for (int i = 0; i < n && !rc; i++) {
    IrNode *x = m->nodes[i];
    if (x->op == IR_OP_ATTENTION && !x->ia[1]) rc = qkv_tokens(&L, x) || out_tokens(&L, x);
    else if (x->op == IR_OP_ATTENTION_GRAD && x->ninputs == 6 && !(x->ia[1] & tokens))
      rc = dy_tokens(&L, x) || dqkv_tokens(&L, x);
  }
  IrNode **order = ir_xcalloc((size_t)m->nnodes, sizeof *order);
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (L.before[i]) order[k++] = L.before[i];
    if (!L.dead[i]) order[k++] = m->nodes[i];
    else removed++;
  }
  if (!rc && (removed || L.made)) ir_set_order(m, order, k);
  free(order);
  free(L.readers);
  free(L.only);
  free(L.dead);
  free(L.before);
  return rc;
}
