/* passes/pp_split.c -- what each pipeline stage computes, and what crosses
 * between stages.
 *
 * The input is the rank-local module of ONE microbatch (batch / (dp M)
 * rows, tp-sharded), differentiated, with its optimizer, without dp_grads.
 * Every rank of every stage holds this whole module's code and buffer plan;
 * a stage runs the part of it that belongs to its chunks.
 *
 * Stages.  Every non-leaf, non-optimizer node belongs to one chunk
 * (pp_node_chunks: forward nodes by layer, backward nodes with their forward
 * node).  Chunk c's program is three node lists, each in node order:
 *   F(c)  its forward nodes;  B(c)  its input-gradient nodes;  W(c)  its
 *   weight-gradient nodes (a schedule that does not split W runs B(c) and
 *   W(c) as its B action, as one list in node order: each weight gradient
 *   right where autodiff made it, so the output gradients it reads die
 *   there, not at the end of the chunk's backward).
 * The optimizer nodes run after the microbatches (below).
 *
 * Node order.  The nodes are reordered to [leaves] [F(0)] ... [F(n-1)]
 * [B(n-1) W(n-1)] ... [B(0) W(0)] [gradient sums] [optimizer] (stable
 * within a group, B(c) and W(c) one group where W is not split; -1 if that
 * is not a topological order).  A rank then runs,
 * for one microbatch, a subsequence of node order (kernels at their roots: a
 * fused kernel keeps to one chunk and phase, codegen/host.c cg_pipe_colours,
 * and a value another chunk or phase reads has a buffer), so one buffer plan
 * (bufplan: liveness in node order) is sound for it: a value is never
 * overwritten between its definition and its last use in node order, and a
 * stage's own subsequence keeps that order.  Values received from another
 * stage are written into their own planned buffers, which are reserved
 * from their definition (earlier in node order) to their last use.  The plan
 * is of one arena per stage at once (bufplan's BufArenas, pp_node_arenas):
 * a stage's arena holds the values its chunks make, receive, send or read,
 * each at the one offset every stage holding it uses (a sent value is
 * received where it was sent from), and two values no stage holds both of
 * may share bytes whatever their lives.
 *
 * Stash.  Each microbatch in flight on a stage has its own copy of the
 * arena (a slot): everything its backward reads stays where the forward
 * left it.  A microbatch holds its slot on a stage from its first action
 * there to its last, and takes the lowest slot free then (pp_assign_slots:
 * the fewest slots, the most microbatches the stage holds at once; GPipe M,
 * 1F1B P - s on stage s, ZB-H1 no more though its W actions come late).
 * Each stage's arena has its own slots; all slots are one size (one plan).
 *
 * Boundaries.  Forward value v of chunk a read by chunk b > a crosses every
 * boundary c in [a, b): it is in act[c], sent after F(mb, c) by chunk c's
 * stage and received before F(mb, c + 1).  A backward value v of chunk a
 * read by chunk b < a is in grad[c] for c in [b, a), sent after B(mb, c + 1)
 * and received before B(mb, c) (a sum of gradients made by later chunks runs
 * on the earliest of them: hoist_grad_sums).  Anything else crossing chunks (a forward
 * value read by an earlier chunk, a gradient read by a later one, a W value
 * read by an earlier chunk under a split schedule) is refused.  A forward
 * all-reduce read only by later chunks runs on the earliest of them when its
 * input crosses anyway (sink_all_reduces).
 *
 * Stage-local parameters.  A stage holds the parameters its chunks' nodes
 * read (a parameter no chunk reads: stage 0) and their optimizer state
 * (STATE "<param>.<key>"), nothing else: GPT-2's tied wte is held by the
 * first stage (embedding) and the last (head).  Each stage's buffers pack
 * its PARAMs, and separately its STATEs, in node order at 16-float aligned
 * offsets (stage_offset; cg_plan_leaves' rule, applied to the held ones).
 *
 * Gradient accumulation.  A parameter's gradient p->grad is a tree of W
 * adds over terms (GPT-2's tied wte: the embedding's term on chunk 0, the
 * head's on the last).  The adds are not run (PP_NODE_SKIP); each term is
 * added, where it is computed, into the rank's accumulator (laid out like
 * the stage's parameter buffer) at the parameter's offset (grad_param).
 * After the microbatches the trainer sums the accumulator over dp (an
 * expert-parallel parameter's part, ep_sharded, over the ep_dp group
 * instead: the dp ranks holding the same experts, whose gradients already
 * sum every token of their ep group routed there; passes/ep_grads.c), sums
 * each parameter held by several stages between those stages alone (in
 * stage order, so every holder gets the same bits): the mean gradient of
 * the global batch, the one-rank trainer's, since the loss's seed (m->seed)
 * is 1 / (M dp), set before this pass (driver/main.c), and every term comes
 * out divided.  The optimizer then reads it from p->grad's buffer.  Under
 * ZeRO-1 (m->mesh_zero, m->grads_whole) the CPU trainer reduce-scatters the
 * parameters' regions over their group instead, in buckets of several
 * parameters of one stage and group (pp_zero.c), and sums only the rank's piece
 * between the stages: the optimizer reads that piece alone (flat_shard of
 * p->grad, passes/optimizer.c).
 *
 * Optimizer.  An optimizer node computes for one parameter (opt_owner: it
 * reads, directly or through such nodes, only that parameter, its state or
 * its gradient, besides shared values) or is shared (the global norm, the
 * clipping coefficient, bias corrections).  A stage runs the owned nodes
 * of the parameters it holds and every shared node.  An owned node a
 * shared one reads (opt_pub: the per-parameter sums of squares of the
 * global norm) is computed first by the parameter's lowest holder alone,
 * set to zero on every other stage, and summed over pp, so every stage
 * reads every value exactly (x + 0 = x) and the norm is counted once per
 * parameter, tied ones included (an expert-parallel parameter's sum of
 * squares is first summed over its ep group by its all_reduce, an owned
 * opt_pub 1 node of that one stage).  The owned nodes those read (opt_pub 2)
 * run on the lowest holder alone too.  No other owned node may read either
 * kind (refused).  Everything runs in node order.
 *
 * A non-scalar optimizer node that reads owned values of several parameters,
 * all held by the same stages (a ZeRO-1 gather bucket: passes/optimizer.c
 * makes them per set of stages, from pp_param_stages), computes for those
 * stages: its owner is the first such parameter.  Scalars reading several
 * parameters' values, and scalar adds to a shared value (the global norm's
 * partial sums), are shared. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

static int fail(char *err, size_t len, const char *what, const IrNode *n) {
  snprintf(err, len, "pipeline split: node %%%d (%s, layer %d): %s", n->id,
           ir_op_info[n->op].name, n->layer, what);
  return -1;
}

/* Marks the add tree under node t (p's gradient or part of it): the adds are
 * skipped, the terms accumulate into p. */
static int mark_terms(IrNode *t, const IrNode *p, const int *nusers, int *chunk, int *grad_param,
                      int root, char *err, size_t len) {
  if (t->op == IR_OP_ADD && t->phase == IR_PHASE_W && (root || nusers[t->id] == 1) &&
      t->inputs[0] != t->inputs[1]) {
    chunk[t->id] = PP_NODE_SKIP;
    for (int k = 0; k < 2; k++)
      if (mark_terms(t->inputs[k], p, nusers, chunk, grad_param, 0, err, len)) return -1;
    return 0;
  }
  if (chunk[t->id] < 0 || grad_param[t->id] >= 0)
    return fail(err, len, "a gradient term that is a leaf or already a term", t);
  grad_param[t->id] = p->id;
  return 0;
}

/* Moves each input-gradient sum whose terms are all computed by later chunks
 * up to the earliest of those chunks (a residual stream's gradient is the sum
 * of the skip path's and the block's, both made by the layer after the
 * boundary): one value then crosses the boundaries in between instead of
 * every term.  The same add of the same operands runs, so results do not
 * change.  Sound: a backward value is read only by chunks at or before its
 * own (refused otherwise below), so the add's readers, at or before its old
 * chunk, are at or before the new one, which still sees every term.  Node
 * order is topological, so a chain of such sums moves as a whole. */
static void hoist_grad_sums(const IrModule *m, int *chunk) {
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *n = m->nodes[i];
    if (n->op != IR_OP_ADD || n->phase != IR_PHASE_B || chunk[i] < 0) continue;
    int to = INT_MAX, ok = n->ninputs > 0;
    for (int k = 0; k < n->ninputs && ok; k++) {
      const IrNode *x = n->inputs[k];
      ok = x->phase == IR_PHASE_B && chunk[x->id] >= 0 && ir_numel(x) == ir_numel(n);
      if (ok && chunk[x->id] < to) to = chunk[x->id];
    }
    if (ok && to > chunk[i]) chunk[i] = to;
  }
}

/* Moves a forward all-reduce whose readers all belong to later chunks onto
 * the earliest of them, when its input crosses there anyway (read there by
 * another node).  Megatron's residual stream under --tp is held as per-rank
 * partial sums; the norm reads their all-reduce, the next residual add the
 * partial sum itself, so without this both would cross the boundary.  The same
 * collective runs over the same tp group (every stage has one), one stage
 * later, so results do not change.  Computed from the readers before any move
 * (an all-reduce never reads another here: its input is a sum). */
static void sink_all_reduces(const IrModule *m, int *chunk) {
  int N = m->nnodes;
  int *lo = malloc(sizeof(int) * (size_t)(N + 1)), *hi = malloc(sizeof(int) * (size_t)(N + 1));
  if (!lo || !hi) { /* an optimisation only */
    free(lo), free(hi);
    return;
  }
  for (int i = 0; i < N; i++) lo[i] = INT_MAX, hi[i] = INT_MIN;
  for (int i = 0; i < N; i++)
    for (int k = 0; k < m->nodes[i]->ninputs; k++) {
      int v = m->nodes[i]->inputs[k]->id, c = chunk[i] < 0 ? INT_MIN : chunk[i];
      if (c < lo[v]) lo[v] = c;
      if (c > hi[v]) hi[v] = c;
    }
  for (int i = 0; i < N; i++) {
    const IrNode *n = m->nodes[i];
    if (n->op != IR_OP_ALL_REDUCE || n->phase != IR_PHASE_FWD || chunk[i] < 0 ||
        lo[i] == INT_MAX || lo[i] <= chunk[i])
      continue;
    const IrNode *x = n->inputs[0];
    if (chunk[x->id] >= 0 && x->phase == IR_PHASE_FWD && hi[x->id] >= lo[i]) chunk[i] = lo[i];
  }
  free(lo), free(hi);
}

/* Sort key: the groups of the head comment (split_w: W(c) after B(c); else
 * one group, B(c) and W(c) in the order autodiff made them). */
static int group_key(const IrNode *n, int chunk, int nchunks, int split_w) {
  if (chunk == PP_NODE_LEAF) return 0;
  if (chunk == PP_NODE_SKIP) return 1 + 3 * nchunks;
  if (chunk == PP_NODE_OPT) return 2 + 3 * nchunks;
  if (n->phase == IR_PHASE_FWD) return 1 + chunk;
  return 1 + nchunks + 2 * (nchunks - 1 - chunk) + (split_w && n->phase == IR_PHASE_W);
}

typedef struct {
  int key, id;
} Keyed;

static int by_key(const void *a, const void *b) {
  const Keyed *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return (x->id > y->id) - (x->id < y->id);
}

/* (passes.h) interval colouring, in order of start: the fewest slots */
int pp_assign_slots(const PpSchedule *s, int *slot, int *stage_slots) {
  int M = s->microbatches, most = 1;
  int *first = malloc(sizeof(int) * (size_t)M), *last = malloc(sizeof(int) * (size_t)M);
  int *order = malloc(sizeof(int) * (size_t)M), *until = malloc(sizeof(int) * (size_t)M);
  if (!first || !last || !order || !until) {
    free(first), free(last), free(order), free(until);
    return -1;
  }
  for (int st = 0; st < s->nstages; st++) {
    int n = 0, used = 0;
    for (int mb = 0; mb < M; mb++) first[mb] = -1, last[mb] = -1, slot[st * M + mb] = 0;
    for (int i = 0; i < s->nactions[st]; i++) {
      int mb = s->actions[st][i].mb;
      if (first[mb] < 0) first[mb] = i, order[n++] = mb;
      last[mb] = i;
    }
    /* (order: the microbatches by first action, as the list meets them) */
    for (int k = 0; k < n; k++) {
      int mb = order[k], free_slot = used;
      for (int j = 0; j < used && free_slot == used; j++)
        if (until[j] < first[mb]) free_slot = j;
      if (free_slot == used) used++;
      until[free_slot] = last[mb];
      slot[st * M + mb] = free_slot;
    }
    if (used > most) most = used;
    if (stage_slots) stage_slots[st] = used;
  }
  free(first), free(last), free(order), free(until);
  return most;
}

/* The stages holding each PARAM: bit s for every stage whose chunk nodes
 * (chunk[i] >= 0) read it, stage 0 for one no chunk reads; 0 for other nodes
 * (stage_local's rule, shared with pp_param_stages). */
static void param_holders(const IrModule *m, const int *chunk, int P, uint64_t *h) {
  for (int i = 0; i < m->nnodes; i++) h[i] = 0;
  for (int i = 0; i < m->nnodes; i++)
    for (int k = 0; chunk[i] >= 0 && k < m->nodes[i]->ninputs; k++)
      if (m->nodes[i]->inputs[k]->op == IR_OP_PARAM)
        h[m->nodes[i]->inputs[k]->id] |= UINT64_C(1) << (chunk[i] % P);
  for (int i = 0; i < m->nnodes; i++)
    if (m->nodes[i]->op == IR_OP_PARAM && !h[i]) h[i] = 1;
}

int pp_param_stages(const IrModule *m, const PpStages *st, uint64_t *h) {
  int N = m->nnodes, P = st->nstages;
  int *chunk = malloc(sizeof(int) * ((size_t)N + 1));
  if (!chunk || P > PP_MAX_STAGES || pp_node_chunks(m, st, chunk)) {
    free(chunk);
    return -1;
  }
  for (int i = 0; i < N; i++) /* as pass_pp_split: leaves and the optimizer in no chunk */
    if ((ir_op_info[m->nodes[i]->op].flags & IR_F_LEAF) || m->nodes[i]->phase == IR_PHASE_OPT)
      chunk[i] = -1;
  param_holders(m, chunk, P, h);
  free(chunk);
  return 0;
}

/* The parameter a STATE node belongs to ("<param>.<key>"), or -1. */
static int state_param(const IrModule *m, const IrNode *st) {
  size_t len = strlen(st->name);
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *p = m->nodes[i];
    size_t k = p->op == IR_OP_PARAM ? strlen(p->name) : 0;
    if (k && k < len && st->name[k] == '.' && !strncmp(st->name, p->name, k) &&
        !strchr(st->name + k + 1, '.'))
      return i;
  }
  return -1;
}

#define STAGE_ALIGN 16 /* floats, as cg_plan_leaves */

/* Holders, stage layouts and the optimizer's owners (head comment); after
 * the reordering, with out->chunk set. */
static int stage_local(IrModule *m, PpProgram *out, char *err, size_t len) {
  int N = m->nnodes, P = out->nstages;
  size_t n1 = (size_t)N + 1;
  if (P > PP_MAX_STAGES) {
    snprintf(err, len, "pipeline split: stage-local parameters support at most %d stages, "
             "not %d", PP_MAX_STAGES, P);
    return -1;
  }
  const int *chunk = out->chunk;
  uint64_t *h = arena_alloc(&m->arena, sizeof(uint64_t) * n1);
  int *grad_of = arena_alloc(&m->arena, sizeof(int) * n1); /* p->grad's node -> p */
  int *sparam = arena_alloc(&m->arena, sizeof(int) * n1);  /* STATE -> its PARAM */
  for (int i = 0; i < N; i++) grad_of[i] = sparam[i] = -1;
  for (int i = 0; i < N; i++) {
    const IrNode *n = m->nodes[i];
    if (n->op == IR_OP_PARAM && n->grad) grad_of[n->grad->id] = i;
    if (n->op == IR_OP_STATE && (sparam[i] = state_param(m, n)) < 0)
      return fail(err, len, "optimizer state of no parameter", n);
  }
  param_holders(m, chunk, P, h);
  for (int i = 0; i < N; i++)
    if (m->nodes[i]->op == IR_OP_STATE) h[i] = h[sparam[i]];
  out->holders = h;
  out->stage_offset = arena_alloc(&m->arena, sizeof(int64_t *) * (size_t)P);
  out->stage_params_numel = arena_alloc(&m->arena, sizeof(int64_t) * (size_t)P);
  out->stage_state_numel = arena_alloc(&m->arena, sizeof(int64_t) * (size_t)P);
  for (int st = 0; st < P; st++) {
    int64_t *off = out->stage_offset[st] = arena_alloc(&m->arena, sizeof(int64_t) * n1);
    for (int i = 0; i < N; i++) {
      const IrNode *n = m->nodes[i];
      int64_t *end = n->op == IR_OP_PARAM   ? &out->stage_params_numel[st]
                     : n->op == IR_OP_STATE ? &out->stage_state_numel[st]
                                            : NULL;
      off[i] = -1;
      if (!end || !(h[i] >> st & 1)) continue;
      off[i] = *end;
      *end += (ir_numel(n) + STAGE_ALIGN - 1) / STAGE_ALIGN * STAGE_ALIGN;
    }
  }
  for (int i = 0; i < N; i++)
    if (m->nodes[i]->op == IR_OP_PARAM && (h[i] & (h[i] - 1)) &&
        ir_numel(m->nodes[i]) > out->shared_numel_max)
      out->shared_numel_max = ir_numel(m->nodes[i]);

  /* the optimizer: owners, then the published values */
  int *own = arena_alloc(&m->arena, sizeof(int) * n1);
  unsigned char *pub = arena_alloc(&m->arena, n1);
  for (int i = 0; i < N; i++) {
    const IrNode *n = m->nodes[i];
    own[i] = -1;
    if (chunk[i] != PP_NODE_OPT) continue;
    int o = -1, distinct = 0, mixed = 0;
    for (int k = 0; k < n->ninputs; k++) {
      const IrNode *v = n->inputs[k];
      int j = v->id;
      if (n->op == IR_OP_ADD && ir_numel(n) == 1 && chunk[j] == PP_NODE_OPT && own[j] < 0)
        mixed = 1; /* a partial sum of the norm's: shared, as what it adds to */
      int ov = v->op == IR_OP_PARAM   ? j
               : v->op == IR_OP_STATE ? sparam[j]
               : chunk[j] >= 0 || chunk[j] == PP_NODE_SKIP ? grad_of[j]
               : chunk[j] == PP_NODE_OPT ? own[j]
                                         : -1;
      if (ov < 0) continue;
      if (o < 0) o = ov;
      else if (o != ov) distinct = 1, mixed |= h[o] != h[ov];
    }
    own[i] = mixed || (distinct && ir_numel(n) == 1) ? -1 : o;
  }
  for (int i = 0; i < N; i++) {
    const IrNode *n = m->nodes[i];
    if (chunk[i] != PP_NODE_OPT || own[i] >= 0) continue;
    for (int k = 0; k < n->ninputs; k++) {
      const IrNode *v = n->inputs[k];
      if (chunk[v->id] == PP_NODE_OPT && own[v->id] >= 0) pub[v->id] = 1;
    }
  }
  for (int i = N - 1; i >= 0; i--) { /* what those read of their parameter's: 2 */
    const IrNode *n = m->nodes[i];
    if (pub[i] == 1 && ir_numel(n) != 1)
      return fail(err, len, "a per-parameter optimizer value the shared ones read is not a "
                  "scalar", n);
    for (int k = 0; pub[i] && k < n->ninputs; k++) {
      const IrNode *v = n->inputs[k];
      if (chunk[v->id] == PP_NODE_OPT && own[v->id] >= 0 && !pub[v->id]) pub[v->id] = 2;
    }
  }
  for (int i = 0; i < N; i++) {
    const IrNode *n = m->nodes[i];
    if (chunk[i] != PP_NODE_OPT || own[i] < 0 || pub[i]) continue;
    for (int k = 0; k < n->ninputs; k++)
      if (pub[n->inputs[k]->id])
        return fail(err, len, "a per-parameter optimizer node reads a value of the global "
                    "norm's", n);
  }
  out->opt_owner = own;
  out->opt_pub = pub;
  return 0;
}

int pass_pp_split(IrModule *m, const PpPlan *plan, PpProgram *out, char *err, size_t len) {
  const PpStages *st = &plan->st;
  int N = m->nnodes, C = st->nchunks;
  size_t n1 = (size_t)N + 1;
  memset(out, 0, sizeof *out);
  int *chunk = arena_alloc(&m->arena, sizeof(int) * n1);
  int *grad_param = arena_alloc(&m->arena, sizeof(int) * n1);
  int *nusers = arena_alloc(&m->arena, sizeof(int) * n1);
  if (pp_node_chunks(m, st, chunk)) {
    snprintf(err, len, "pipeline split: out of memory");
    return -1;
  }
  for (int i = 0; i < N; i++) {
    const IrNode *n = m->nodes[i];
    grad_param[i] = -1;
    if (ir_op_info[n->op].flags & IR_F_LEAF) chunk[i] = PP_NODE_LEAF;
    else if (n->phase == IR_PHASE_OPT) chunk[i] = PP_NODE_OPT;
    for (int k = 0; k < n->ninputs; k++) nusers[n->inputs[k]->id]++;
  }
  hoist_grad_sums(m, chunk);
  sink_all_reduces(m, chunk);
  for (int i = 0; i < N; i++) {
    const IrNode *p = m->nodes[i];
    if (p->op != IR_OP_PARAM || !p->grad) continue;
    if (chunk[p->grad->id] < 0) return fail(err, len, "a gradient computed by no chunk", p->grad);
    if (mark_terms(p->grad, p, nusers, chunk, grad_param, 1, err, len)) return -1;
  }

  /* the node order of the head comment */
  Keyed *order = malloc(sizeof(Keyed) * n1);
  IrNode **nodes = malloc(sizeof(IrNode *) * n1);
  int *tmp = malloc(sizeof(int) * 2 * n1);
  if (!order || !nodes || !tmp) {
    free(order), free(nodes), free(tmp);
    snprintf(err, len, "pipeline split: out of memory");
    return -1;
  }
  for (int i = 0; i < N; i++)
    order[i] = (Keyed){group_key(m->nodes[i], chunk[i], C, plan->sched.split_w), i};
  qsort(order, (size_t)N, sizeof *order, by_key);
  for (int i = 0; i < N; i++) {
    nodes[i] = m->nodes[order[i].id];
    tmp[i] = chunk[order[i].id];
    tmp[N + i] = grad_param[order[i].id];
  }
  for (int i = 0; i < N; i++) {
    m->nodes[i] = nodes[i];
    m->nodes[i]->id = i;
    chunk[i] = tmp[i];
  }
  for (int i = 0; i < N; i++) order[order[i].id].key = i; /* key: the old id's new id */
  for (int i = 0; i < N; i++) /* the parameters moved too */
    grad_param[i] = tmp[N + i] < 0 ? -1 : order[tmp[N + i]].key;
  free(order), free(nodes), free(tmp);
  for (int i = 0; i < N; i++)
    for (int k = 0; k < m->nodes[i]->ninputs; k++)
      if (m->nodes[i]->inputs[k]->id >= i)
        return fail(err, len, "chunks in pipeline order are not a topological order",
                    m->nodes[i]);

  /* what crosses which boundary */
  int *lo = arena_alloc(&m->arena, sizeof(int) * n1), *hi = arena_alloc(&m->arena, sizeof(int) * n1);
  for (int i = 0; i < N; i++) lo[i] = hi[i] = chunk[i];
  for (int i = 0; i < N; i++) {
    const IrNode *u = m->nodes[i];
    for (int k = 0; k < u->ninputs; k++) {
      const IrNode *v = u->inputs[k];
      int a = chunk[v->id], b = chunk[i];
      if (b == PP_NODE_OPT && a != PP_NODE_LEAF && a != PP_NODE_OPT) {
        int is_grad = 0;
        for (int j = 0; j < N && !is_grad; j++)
          is_grad = m->nodes[j]->op == IR_OP_PARAM && m->nodes[j]->grad == v;
        if (!is_grad) return fail(err, len, "the optimizer reads a value of a chunk", u);
        continue;
      }
      if (a < 0 || b < 0 || a == b) continue;
      if (a < b && v->phase != IR_PHASE_FWD)
        return fail(err, len, "a gradient read by a later chunk", v);
      if (a > b && v->phase == IR_PHASE_FWD)
        return fail(err, len, "a forward value read by an earlier chunk", v);
      if (a > b && v->phase == IR_PHASE_W && plan->sched.split_w)
        return fail(err, len, "a weight-gradient value read by an earlier chunk (ZB-H1 defers it)",
                    v);
      if (b > hi[v->id]) hi[v->id] = b;
      if (b < lo[v->id]) lo[v->id] = b;
    }
  }
  if (!m->loss || chunk[m->loss->id] != C - 1 ||
      (m->ce_loss && chunk[m->ce_loss->id] != C - 1)) {
    snprintf(err, len, "pipeline split: the loss is not on the last chunk");
    return -1;
  }
  out->nact = arena_alloc(&m->arena, sizeof(int) * (size_t)C);
  out->ngrad = arena_alloc(&m->arena, sizeof(int) * (size_t)C);
  out->act = arena_alloc(&m->arena, sizeof(int *) * (size_t)C);
  out->grad = arena_alloc(&m->arena, sizeof(int *) * (size_t)C);
  for (int i = 0; i < N; i++) /* counts: forward c0 .. hi - 1, backward lo .. c0 - 1 */
    for (int c = 0; chunk[i] >= 0 && c < C; c++) {
      out->nact[c] += c >= chunk[i] && c < hi[i];
      out->ngrad[c] += c >= lo[i] && c < chunk[i];
    }
  for (int c = 0; c < C; c++) {
    out->act[c] = arena_alloc(&m->arena, sizeof(int) * (size_t)(out->nact[c] + 1));
    out->grad[c] = arena_alloc(&m->arena, sizeof(int) * (size_t)(out->ngrad[c] + 1));
    out->nact[c] = out->ngrad[c] = 0;
  }
  for (int i = 0; i < N; i++)
    for (int c = 0; chunk[i] >= 0 && c < C; c++) {
      if (c >= chunk[i] && c < hi[i]) out->act[c][out->nact[c]++] = i;
      if (c >= lo[i] && c < chunk[i]) out->grad[c][out->ngrad[c]++] = i;
    }
  out->nstages = st->nstages;
  out->nchunks = C;
  out->microbatches = st->microbatches;
  out->split_w = plan->sched.split_w;
  out->slot = arena_alloc(&m->arena, sizeof(int) * (size_t)(st->nstages * st->microbatches));
  out->stage_slots = arena_alloc(&m->arena, sizeof(int) * (size_t)st->nstages);
  if ((out->slots = pp_assign_slots(&plan->sched, out->slot, out->stage_slots)) < 0) {
    snprintf(err, len, "pipeline split: out of memory");
    return -1;
  }
  out->chunk = chunk;
  out->grad_param = grad_param;
  out->sched = &plan->sched;
  if (stage_local(m, out, err, len)) return -1;
  pp_zero_buckets(m, out); /* ZeRO-1's gradient buckets: pp_zero.c */
  return 0;
}

/* The stages where node i runs: a chunk's node on its chunk's stage, an
 * owned optimizer node on its parameter's holders, the rest everywhere. */
static uint64_t runs_on(const PpProgram *pp, int i, uint64_t all) {
  int c = pp->chunk[i], own = pp->opt_owner[i];
  if (c >= 0) return (uint64_t)1 << (c % pp->nstages);
  return c == PP_NODE_OPT && own >= 0 ? pp->holders[own] & all : all;
}

void pp_node_arenas(const IrModule *m, const PpProgram *pp, uint64_t *where,
                    unsigned char *unread) {
  int P = pp->nstages, n = m->nnodes;
  uint64_t all = P >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << P) - 1;
  for (int i = 0; i < n; i++) {
    /* (an opt_pub 1 node is also zeroed on the stages not holding it) */
    where[i] = pp->opt_pub[i] == 1 ? all : runs_on(pp, i, all);
    unread[i] = pp->chunk[i] == PP_NODE_SKIP;
  }
  for (int c = 0; c + 1 < pp->nchunks; c++) {
    uint64_t both = (uint64_t)1 << (c % P) | (uint64_t)1 << ((c + 1) % P);
    for (int k = 0; k < pp->nact[c]; k++) where[pp->act[c][k]] |= both;
    for (int k = 0; k < pp->ngrad[c]; k++) where[pp->grad[c][k]] |= both;
  }
  /* what a node reads is held where the node runs (the lists above carry
   * every value that crosses stages; this keeps the rule whatever made the
   * value), and a parameter's gradient buffer where the optimizer writes
   * it, its holders */
  for (int i = 0; i < n; i++) {
    const IrNode *x = m->nodes[i];
    if (unread[i]) continue;
    for (int k = 0; k < x->ninputs; k++) where[x->inputs[k]->id] |= runs_on(pp, i, all);
    if (x->op == IR_OP_PARAM && x->grad) where[x->grad->id] |= pp->holders[i] & all;
  }
}
