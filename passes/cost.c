/* passes/cost.c -- parameter counts, FLOPs and the per-stage split.
 *
 * FLOPs count multiply and add separately (2 per MAC) for every matmul
 * (expert matmuls for the routed tokens only, not the empty capacity) and
 * for attention's two products (q k^T and p v, not halved for the causal
 * mask, as in PaLM's MFU convention); backward is twice forward.
 * Layers go to pipeline stages in contiguous runs, the first stages taking
 * one extra layer when pp does not divide them (cost_analyze_split takes
 * the pipeline planner's split instead); parameters outside the
 * repeat live on every stage that reads them (the embedding on the first,
 * the head on the last, a tied table on both).  FLOPs are counted on the
 * forward nodes only: the backward's are defined as twice those, whatever
 * the autodiff pass emitted. */
#include <string.h>

#include "passes/passes.h"

static int stage_of_layer(const Cost *c, int layer) {
  for (int s = 0; s < c->nstages; s++)
    if (layer < c->stages[s].first_layer + c->stages[s].nlayers) return s;
  return c->nstages - 1;
}

/* Parameters one tensor-parallel (or expert-parallel) rank holds of n. */
static int64_t per_rank(const IrNode *n, const Layout *lay, int64_t padded_vocab) {
  int64_t numel = ir_numel(n);
  switch (n->shard) {
  case IR_SHARD_COLUMN:
  case IR_SHARD_ROW:
    return n->shard_dim >= 0 ? numel / lay->tp : numel;
  case IR_SHARD_VOCAB:
    return numel / n->shape[0] * (padded_vocab / lay->tp);
  case IR_SHARD_EXPERT: /* experts over ep, each split over tp when shard_dim says */
    return numel / lay->ep / (n->shard_dim >= 0 ? lay->tp : 1);
  default:
    return numel;
  }
}

int cost_analyze(IrModule *m, const Layout *lay, Cost *c) {
  return cost_analyze_split(m, lay, NULL, lay->pp, c);
}

int cost_analyze_split(IrModule *m, const Layout *lay, const int *stage_layers, int nstages,
                       Cost *c) {
  memset(c, 0, sizeof *c);
  int pp = nstages < 1 ? 1 : nstages;
  c->nstages = pp;
  c->stages = arena_alloc(&m->arena, sizeof(StageCost) * (size_t)pp);
  for (int s = 0, first = 0; s < pp; s++) {
    int n = stage_layers ? stage_layers[s] : m->nlayers / pp + (s < m->nlayers % pp);
    c->stages[s] = (StageCost){first, n, 0};
    first += n;
  }
  /* fill[i]: expected fraction of node i's rows that hold real tokens.
   * Expert slots after a dispatch are only partly filled (tokens * top_k
   * routed slots over experts * capacity); FLOPs count the filled ones. */
  double *fill = arena_alloc(&m->arena, sizeof(double) * (size_t)m->nnodes + 1);
  int first_layer_node = m->nnodes, last_layer_node = -1;
  for (int i = 0; i < m->nnodes; i++) {
    IrNode *n = m->nodes[i];
    fill[i] = 1;
    for (int k = 0; k < n->ninputs; k++)
      if (fill[n->inputs[k]->id] < fill[i]) fill[i] = fill[n->inputs[k]->id];
    if (n->op == IR_OP_COMBINE) fill[i] = 1;
    if (n->op == IR_OP_DISPATCH) {
      double slots = (double)n->shape[0] * (double)n->shape[1];
      double routed = (double)ir_numel(n->inputs[1]);
      fill[i] = routed < slots ? routed / slots : 1;
    }
    if (n->layer >= 0 && n->op != IR_OP_PARAM && n->phase == IR_PHASE_FWD) {
      if (i < first_layer_node) first_layer_node = i;
      last_layer_node = i;
    }
    if (n->op == IR_OP_PARAM) {
      c->params += ir_numel(n);
      c->nparam_tensors++;
      if (n->shard == IR_SHARD_VOCAB && !c->vocab) c->vocab = n->shape[0];
    }
    if (n->op == IR_OP_MATMUL && n->phase == IR_PHASE_FWD) {
      int64_t k = n->inputs[0]->shape[n->inputs[0]->rank - 1];
      c->flops_fwd += 2.0 * (double)ir_numel(n) * (double)k * fill[i];
    }
    if (n->op == IR_OP_ATTENTION && n->phase == IR_PHASE_FWD) {
      const IrSdpaDims d = ir_sdpa_dims(n);
      double f = 4.0 * (double)d.B * (double)d.H * (double)d.T * (double)d.T * (double)d.hd;
      c->flops_fwd += f;
      c->flops_attn_fwd += f;
    }
  }
  c->padded_vocab = c->vocab ? ir_padded_vocab(c->vocab, lay->tp, m->pad_vocab) : 0;
  if (m->ce_loss && m->ce_loss->op == IR_OP_CROSS_ENTROPY) c->tokens = ir_numel(m->ce_loss->inputs[1]);
  for (int i = 0; !c->tokens && i < m->nnodes; i++)
    if (m->nodes[i]->op == IR_OP_INPUT) c->tokens = ir_numel(m->nodes[i]);

  /* which stages read each parameter: a range of layer stages, plus the
   * first and/or last stage for reads outside the repeat */
  int *lo = arena_alloc(&m->arena, sizeof(int) * (size_t)m->nnodes);
  int *hi = arena_alloc(&m->arena, sizeof(int) * (size_t)m->nnodes);
  unsigned char *edge = arena_alloc(&m->arena, (size_t)m->nnodes); /* 1 first, 2 last */
  for (int i = 0; i < m->nnodes; i++) lo[i] = pp, hi[i] = -1;
  for (int j = 0; j < m->nnodes; j++) {
    IrNode *u = m->nodes[j];
    if (u->phase != IR_PHASE_FWD) continue; /* the backward mirrors the forward */
    for (int k = 0; k < u->ninputs; k++) {
      IrNode *p = u->inputs[k];
      if (p->op != IR_OP_PARAM) continue;
      if (u->layer >= 0) {
        int s = stage_of_layer(c, u->layer);
        if (s < lo[p->id]) lo[p->id] = s;
        if (s > hi[p->id]) hi[p->id] = s;
      } else {
        edge[p->id] |= j < first_layer_node || last_layer_node < 0 ? 1 : 2;
      }
    }
  }
  for (int i = 0; i < m->nnodes; i++) {
    IrNode *p = m->nodes[i];
    if (p->op != IR_OP_PARAM) continue;
    if (p->shard == IR_SHARD_VOCAB)
      c->padding_params += (c->padded_vocab - p->shape[0]) * ir_numel(p) / p->shape[0];
    if (hi[i] < 0 && !edge[i]) { /* unread: it lives where it was declared */
      int s = p->layer >= 0 ? stage_of_layer(c, p->layer) : 0;
      lo[i] = hi[i] = s;
    }
    int64_t share = per_rank(p, lay, c->padded_vocab);
    for (int s = 0; s < pp; s++) {
      int in = (s >= lo[i] && s <= hi[i]) || (s == 0 && (edge[i] & 1)) ||
               (s == pp - 1 && (edge[i] & 2));
      if (in) c->stages[s].params += share;
    }
  }
  return 0;
}
