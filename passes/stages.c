/* passes/stages.c -- the pipeline's stage split and what each chunk costs.
 *
 * Every node gets a position: its layer (IrNode.layer) inside the repeat;
 * outside it, "before" (the embedding: forward nodes ahead of the first
 * layer node, and the backward nodes autodiff emitted after the layers'
 * ones) or "after" (head and loss: the other forward nodes, and the
 * backward nodes emitted before any layer's).  Autodiff appends backward
 * nodes in reverse order of the forward node whose rule made them, so a
 * layer-less backward node is the head's exactly when no layer's backward
 * node precedes it.  Positions map to chunks: before -> chunk 0, after ->
 * the last chunk, layer l -> the chunk holding l.
 *
 * Costs, for the whole batch, then divided into one microbatch on one rank:
 *   FLOPs as passes/cost.c counts them (matmul 2 m n k, attention 4 B H T^2
 *   hd, expert matmuls for the routed rows); backward = 2 x forward, cut
 *   into B and W in the proportion of the matmul and attention FLOPs of
 *   the chunk's B- and W-phase nodes (IrNode.phase);
 *   stash: distinct forward values (not parameters) any backward node of
 *   the chunk reads, 4 bytes an element;
 *   boundary after chunk c: distinct forward values made at or before c and
 *   read by a forward node after c (inputs and parameters excepted: the
 *   loader and the stage supply those).
 * Activations are divided by dp * M only (an upper bound with --tp:
 * Megatron's residual stream is whole on every tp rank). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

/* FLOPs of one node (0 for all but matmuls and attention), before fill. */
static double node_flops(const IrNode *n) {
  const IrNode *a = n->ninputs ? n->inputs[0] : NULL;
  switch (n->op) {
  case IR_OP_MATMUL: return 2.0 * (double)ir_numel(n) * (double)a->shape[a->rank - 1];
  case IR_OP_MATMUL_TA: return 2.0 * (double)ir_numel(n) * (double)a->shape[a->rank - 2];
  case IR_OP_ATTENTION:
  case IR_OP_ATTENTION_GRAD: {
    const IrSdpaDims d = ir_sdpa_dims(n);
    double f = 4.0 * (double)d.B * (double)d.H * (double)d.T * (double)d.T * (double)d.hd;
    return n->op == IR_OP_ATTENTION ? f : 2 * f; /* dq, dk, dv: two products each side */
  }
  default: return 0;
  }
}

/* Elements of parameter p as its stage holds it over the tp group: a
 * vocabulary table with its padding rows (ir_padded_vocab), as pass_shard
 * will lay it out. */
static int64_t param_numel(const IrModule *m, const Layout *lay, const IrNode *p) {
  int64_t n = ir_numel(p);
  if (p->shard != IR_SHARD_VOCAB || p->rank < 1 || p->shape[0] < 1) return n;
  return n / p->shape[0] * ir_padded_vocab(p->shape[0], lay->tp, m->pad_vocab);
}

/* Cost of chunk s of n holding layers [j, k): the layers' plus the ends'. */
static double seg_cost(const double *prefix, int j, int k, int s, int n, double pre, double post) {
  return prefix[k] - prefix[j] + (s == 0 ? pre : 0) + (s == n - 1 ? post : 0);
}

/* Front-greedy split under a cap: each chunk takes as many layers as fit
 * in cap while leaving one for every later chunk.  Returns 1 if all L
 * layers were placed (then counts[] holds the split). */
static int greedy(const double *prefix, int L, int n, double pre, double post, double cap,
                  int *counts) {
  int j = 0;
  for (int s = 0; s < n; s++) {
    int most = L - (n - 1 - s), k = j + 1;
    if (k > most || seg_cost(prefix, j, k, s, n, pre, post) > cap) return 0;
    while (k < most && seg_cost(prefix, j, k + 1, s, n, pre, post) <= cap) k++;
    counts[s] = k - j;
    j = k;
  }
  return j == L;
}

/* Among the splits whose chunks all cost at most cap, the one with the
 * least sum of squared chunk costs (the most even), earlier chunks taking
 * more layers on ties.  Exact dynamic programme over (chunk, first layer)
 * suffixes.  Returns 0, or -1 if out of memory. */
static int even_split(const double *prefix, int L, int n, double pre, double post, double cap,
                      int *counts) {
  size_t cells = (size_t)(n + 1) * (size_t)(L + 1);
  double *f = malloc(sizeof *f * cells);
  int *pick = malloc(sizeof *pick * cells);
  if (!f || !pick) {
    free(f), free(pick);
    return -1;
  }
#define AT(s, j) ((size_t)(s) * (size_t)(L + 1) + (size_t)(j))
  for (size_t i = 0; i < cells; i++) f[i] = INFINITY, pick[i] = -1;
  f[AT(n, L)] = 0;
  for (int s = n - 1; s >= 0; s--)
    for (int j = s; j <= L - (n - s); j++)
      for (int k = j + 1; k <= L - (n - 1 - s); k++) {
        double c = seg_cost(prefix, j, k, s, n, pre, post);
        if (c > cap) break; /* costs only grow with k */
        double v = c * c + f[AT(s + 1, k)];
        if (isfinite(v) && v <= f[AT(s, j)] * (1 + 1e-12)) f[AT(s, j)] = v, pick[AT(s, j)] = k;
      }
  int ok = pick[AT(0, 0)] >= 0;
  for (int s = 0, j = 0; ok && s < n; s++) {
    int k = pick[AT(s, j)];
    counts[s] = k - j;
    j = k;
  }
#undef AT
  free(f), free(pick);
  return ok ? 0 : -1;
}

/* The split of L layers into n chunks (n <= L, each at least one layer)
 * minimising the largest chunk cost; among those the most even one (when
 * the table stays small: n L^2 below 5e7), else the front-greedy one. */
static void balance(const double *prefix, int L, int n, double pre, double post, int *counts) {
  double lo = 0, hi = prefix[L] + pre + post;
  for (int it = 0; it < 200 && hi - lo > 1e-12 * hi; it++) {
    double mid = 0.5 * (lo + hi);
    if (greedy(prefix, L, n, pre, post, mid, counts)) hi = mid;
    else lo = mid;
  }
  greedy(prefix, L, n, pre, post, hi, counts);
  /* the optimum is the largest cost of that split */
  double best = 0;
  for (int s = 0, j = 0; s < n; j += counts[s++]) {
    double c = seg_cost(prefix, j, j + counts[s], s, n, pre, post);
    if (c > best) best = c;
  }
  if ((double)n * L * L < 5e7 && !even_split(prefix, L, n, pre, post, best * (1 + 1e-12), counts))
    return;
  greedy(prefix, L, n, pre, post, best, counts);
}

/* Every node's position (see the head comment): its layer, -1 before the
 * layers, L = m->nlayers after them. */
static void node_positions(const IrModule *m, int *pos) {
  int L = m->nlayers, N = m->nnodes;
  int first_layer_node = N, seen_layer_bwd = 0;
  for (int i = 0; i < N; i++) {
    const IrNode *x = m->nodes[i];
    if (x->layer >= 0 && x->op != IR_OP_PARAM && x->phase == IR_PHASE_FWD && i < first_layer_node)
      first_layer_node = i;
  }
  for (int i = 0; i < N; i++) {
    const IrNode *x = m->nodes[i];
    if (x->layer >= 0) {
      pos[i] = x->layer;
      if (x->phase == IR_PHASE_B || x->phase == IR_PHASE_W) seen_layer_bwd = 1;
    } else if (x->phase == IR_PHASE_FWD) {
      pos[i] = i < first_layer_node ? -1 : L;
    } else {
      pos[i] = seen_layer_bwd ? -1 : L;
    }
  }
}

int pp_node_chunks(const IrModule *m, const PpStages *st, int *chunk) {
  int L = m->nlayers, n = st->nchunks;
  int *pos = malloc(sizeof(int) * (size_t)(m->nnodes + 1));
  if (!pos) return -1;
  node_positions(m, pos);
  for (int i = 0; i < m->nnodes; i++) {
    int c = 0;
    if (pos[i] >= L) c = n - 1;
    else if (pos[i] >= 0)
      while (c < n - 1 && pos[i] >= st->chunks[c].first_layer + st->chunks[c].nlayers) c++;
    chunk[i] = c;
  }
  free(pos);
  return 0;
}

int pass_stages(IrModule *m, const Layout *lay, const PpRequest *req, PpStages *out, char *err,
                size_t len) {
  int P = lay->pp, V = req->virtual_stages < 1 ? 1 : req->virtual_stages, n = P * V;
  int L = m->nlayers, N = m->nnodes;
  memset(out, 0, sizeof *out);
  if (L < n || P < 1) { /* P == 1: a routed model's one-stage pipeline */
    snprintf(err, len, "stages: %d layers cannot fill %d chunks", L, n);
    return -1;
  }
  /* positions: -1 before the layers, L after them */
  int *pos = arena_alloc(&m->arena, sizeof(int) * (size_t)N);
  double *fill = arena_alloc(&m->arena, sizeof(double) * (size_t)N);
  node_positions(m, pos);
  for (int i = 0; i < N; i++) {
    const IrNode *x = m->nodes[i];
    /* expected filled fraction of the rows, as passes/cost.c */
    fill[i] = 1;
    for (int k = 0; k < x->ninputs; k++)
      if (fill[x->inputs[k]->id] < fill[i]) fill[i] = fill[x->inputs[k]->id];
    if (x->op == IR_OP_COMBINE) fill[i] = 1;
    if (x->op == IR_OP_DISPATCH) {
      double slots = (double)x->shape[0] * (double)x->shape[1];
      double routed = (double)ir_numel(x->inputs[1]);
      fill[i] = routed < slots ? routed / slots : 1;
    }
  }
  /* forward FLOPs per layer and at the ends: the balance's weights */
  double *prefix = arena_alloc(&m->arena, sizeof(double) * (size_t)(L + 1));
  double *layer_f = arena_alloc(&m->arena, sizeof(double) * (size_t)(L + 2)); /* [0] before */
  for (int i = 0; i < N; i++)
    if (m->nodes[i]->phase == IR_PHASE_FWD)
      layer_f[pos[i] + 1] += node_flops(m->nodes[i]) * fill[i];
  for (int l = 0; l < L; l++) prefix[l + 1] = prefix[l] + 3 * layer_f[l + 1];
  double pre = 3 * layer_f[0], post = 3 * layer_f[L + 1];

  int *counts = arena_alloc(&m->arena, sizeof(int) * (size_t)n);
  if (req->stage_layers) {
    if (req->nstage_layers != n) {
      snprintf(err, len, "stages: %d layer counts for %d chunks", req->nstage_layers, n);
      return -1;
    }
    memcpy(counts, req->stage_layers, sizeof(int) * (size_t)n);
  } else if (req->schedule == PP_INTERLEAVED) {
    for (int c = 0; c < n; c++) counts[c] = L / n; /* pp_request_check: n divides L */
  } else {
    balance(prefix, L, n, pre, post, counts);
  }
  PpChunk *ch = arena_alloc(&m->arena, sizeof(PpChunk) * (size_t)n);
  int *chunk_of_layer = arena_alloc(&m->arena, sizeof(int) * (size_t)L);
  for (int c = 0, first = 0; c < n; c++) {
    if (counts[c] < 1 || first + counts[c] > L) {
      snprintf(err, len, "stages: chunk %d of %d layers does not fit", c, counts[c]);
      return -1;
    }
    ch[c] = (PpChunk){.stage = c % P, .first_layer = first, .nlayers = counts[c],
                      .embedding = c == 0, .head = c == n - 1};
    for (int l = first; l < first + counts[c]; l++) chunk_of_layer[l] = c;
    first += counts[c];
  }
  int *chunk = arena_alloc(&m->arena, sizeof(int) * (size_t)N);
  for (int i = 0; i < N; i++)
    chunk[i] = pos[i] < 0 ? 0 : pos[i] >= L ? n - 1 : chunk_of_layer[pos[i]];

  /* FLOPs, parameters, stash, boundaries */
  double *bw_b = arena_alloc(&m->arena, sizeof(double) * (size_t)n);
  double *bw_w = arena_alloc(&m->arena, sizeof(double) * (size_t)n);
  double *f = arena_alloc(&m->arena, sizeof(double) * (size_t)n);
  double *stash = arena_alloc(&m->arena, sizeof(double) * (size_t)n);
  double *bound = arena_alloc(&m->arena, sizeof(double) * (size_t)n);
  int *last_reader = arena_alloc(&m->arena, sizeof(int) * (size_t)N); /* chunk + 1 */
  int *stamp = arena_alloc(&m->arena, sizeof(int) * (size_t)N);       /* chunk + 1 */
  for (int i = 0; i < N; i++) {
    const IrNode *x = m->nodes[i];
    int c = chunk[i];
    if (x->phase == IR_PHASE_FWD) {
      f[c] += node_flops(x) * fill[i];
      for (int k = 0; k < x->ninputs; k++) {
        const IrNode *in = x->inputs[k];
        if (c + 1 > last_reader[in->id]) last_reader[in->id] = c + 1;
        /* forward nodes run in chunk order: a parameter counts once a chunk */
        if (in->op == IR_OP_PARAM && stamp[in->id] != c + 1) {
          stamp[in->id] = c + 1;
          ch[c].params += param_numel(m, lay, in);
        }
      }
    } else if (x->phase == IR_PHASE_B || x->phase == IR_PHASE_W) {
      (x->phase == IR_PHASE_B ? bw_b : bw_w)[c] += node_flops(x);
    }
  }
  memset(stamp, 0, sizeof(int) * (size_t)N);
  for (int i = 0; i < N; i++) {
    const IrNode *x = m->nodes[i];
    if (x->phase != IR_PHASE_B && x->phase != IR_PHASE_W) continue;
    for (int k = 0; k < x->ninputs; k++) {
      const IrNode *in = x->inputs[k];
      if (in->phase != IR_PHASE_FWD || in->op == IR_OP_PARAM) continue;
      /* backward nodes run in reverse chunk order: one stamp suffices */
      if (stamp[in->id] == chunk[i] + 1) continue;
      stamp[in->id] = chunk[i] + 1;
      stash[chunk[i]] += 4.0 * (double)ir_buf_numel(in);
    }
  }
  for (int i = 0; i < N; i++) {
    const IrNode *x = m->nodes[i];
    if (x->phase != IR_PHASE_FWD || (ir_op_info[x->op].flags & IR_F_LEAF)) continue;
    for (int c = chunk[i]; c < last_reader[i] - 1; c++) bound[c] += 4.0 * (double)ir_buf_numel(x);
  }
  /* one microbatch on one rank */
  double rows = (double)(m->mesh_dp > 1 ? 1 : lay->dp) * req->microbatches;
  double split = rows * (m->mesh_tp > 1 ? 1 : lay->tp);
  for (int c = 0; c < n; c++) {
    double back = 2 * f[c], raw = bw_b[c] + bw_w[c];
    ch[c].flops_f = f[c] / split;
    ch[c].flops_b = (raw > 0 ? back * bw_b[c] / raw : back) / split;
    ch[c].flops_w = (raw > 0 ? back * bw_w[c] / raw : 0) / split;
    ch[c].param_bytes = 4 * ch[c].params;
    ch[c].stash_bytes = (int64_t)ceil(stash[c] / rows);
    ch[c].boundary_bytes = c < n - 1 ? (int64_t)ceil(bound[c] / rows) : 0;
  }
  *out = (PpStages){P, V, n, req->microbatches, ch, counts};
  return 0;
}
