/* ir/verify.c -- checks every invariant stated in ir/ir.h. */
#include <string.h>

#include "ir/ir.h"
#include "ir/strmap.h"

static int bad(char *why, size_t len, const IrNode *n, const char *what) {
  snprintf(why, len, "node %%%d (%s): %s", n ? n->id : -1,
           n && (unsigned)n->op < IR_OP_COUNT ? ir_op_info[n->op].name : "?",
           what);
  return -1;
}

static int verify_nodes(const IrModule *m, Arena *scratch, char *why, size_t len) {
  StrMap names = {0};
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
    if ((unsigned)n->phase >= IR_PHASE_COUNT) return bad(why, len, n, "unknown phase");
    for (int j = 0; j < n->ninputs; j++) {
      const IrNode *in = n->inputs[j];
      if (!in || in->id >= i || m->nodes[in->id] != in)
        return bad(why, len, n, "input is not an earlier node of this module");
      if (n->phase != IR_PHASE_OPT && in->phase == IR_PHASE_OPT)
        return bad(why, len, n, "a forward or backward node reads an optimizer node");
      if (n->phase == IR_PHASE_FWD && in->phase != IR_PHASE_FWD)
        return bad(why, len, n, "forward node reads a backward node");
      if (n->phase == IR_PHASE_B && in->phase == IR_PHASE_W)
        return bad(why, len, n, "B node reads a W node");
    }
    if (n->grad && (n->op != IR_OP_PARAM || n->grad->id < 0 || n->grad->id >= m->nnodes ||
                    m->nodes[n->grad->id] != n->grad))
      return bad(why, len, n, "gradient is not a node of this module, or not of a parameter");
    if (n->grad && ir_zero_pieces(m, n) > 1 && !m->grads_whole) {
      int64_t s = ir_zero_piece_numel(m, n);
      if (n->grad->dtype != IR_F32 || n->grad->rank != 1 || n->grad->shape[0] != s)
        return bad(why, len, n, "gradient is not the parameter's ZeRO-1 piece");
    } else if (n->grad && (n->grad->dtype != IR_F32 || n->grad->rank != n->rank ||
                    memcmp(n->grad->shape, n->shape, sizeof(int64_t) * (size_t)n->rank) != 0))
      return bad(why, len, n, "gradient differs from the parameter in type");
    if (n->flat_shards > 1 && (n->op != IR_OP_STATE || n->flat_shards != ir_zero_pieces(m, n) ||
                               n->rank != 1))
      return bad(why, len, n, "flat_shards on a node that is not ZeRO-1 optimizer state");
    int leaf = ir_op_info[n->op].flags & IR_F_LEAF;
    if (leaf && (!n->name || !n->name[0]))
      return bad(why, len, n, "graph value without a name");
    if (n->op == IR_OP_STATE && n->dtype != IR_F32)
      return bad(why, len, n, "optimizer state is not f32");
    int epd = n->op == IR_OP_PARAM && n->ep_degree > 1 ? n->ep_degree : 0;
    if (epd && (n->shard != IR_SHARD_EXPERT || n->rank < 1 || n->shard_dim == 0))
      return bad(why, len, n, "split over ep but not an expert weight with experts on dim 0");
    if (((n->op == IR_OP_PARAM || n->op == IR_OP_INPUT) && (n->shard_degree > 1 || epd)) ||
        ir_param_padded(n)) {
      int d = n->shard_degree > 1 || ir_param_padded(n) ? n->shard_dim : -1;
      int ok = (d == -1 && epd) || (d >= 0 && d < n->rank && n->shard_blocks >= 1);
      int64_t deg = n->shard_degree;
      for (int k = 0; ok && k < n->rank; k++)
        ok = k == 0 && epd ? n->global_shape[0] == n->shape[0] * epd
             : k == d ? (n->global_shape[k] == n->shape[k] * deg &&
                       n->global_shape[k] % ((int64_t)n->shard_blocks * deg) == 0) ||
                          (n->op == IR_OP_PARAM && n->shard_blocks == 1 && /* padded */
                           n->global_shape[k] < n->shape[k] * deg &&
                           n->shape[k] * deg - n->global_shape[k] < IR_PAD_VOCAB_MAX * deg)
                    : n->global_shape[k] == n->shape[k];
      if (!ok) return bad(why, len, n, "sharded parameter's local and global shapes disagree");
    }
    if (leaf) {
      if (strmap_get(&names, n->name)) return bad(why, len, n, "duplicate name");
      strmap_put(scratch, &names, n->name, (void *)n);
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

static int of_module(const IrModule *m, const IrNode *n) {
  return n && n->id >= 0 && n->id < m->nnodes && m->nodes[n->id] == n;
}

static int bad_update(char *why, size_t len, int k, const IrNode *leaf, const char *what) {
  if (leaf && leaf->name) snprintf(why, len, "update %d (%s): %s", k, leaf->name, what);
  else if (leaf) snprintf(why, len, "update %d (%%%d): %s", k, leaf->id, what);
  else snprintf(why, len, "update %d: %s", k, what);
  return -1;
}

/* The update list and the recorded gradient norm (see ir/ir.h). */
static int verify_updates(const IrModule *m, Arena *scratch, char *why, size_t len) {
  if (m->nupdates < 0 || (m->nupdates > 0 && !m->updates))
    return bad_update(why, len, 0, NULL, "malformed update list");
  unsigned char *seen = arena_alloc(scratch, (size_t)m->nnodes + 1);
  for (int k = 0; k < m->nupdates; k++) {
    const IrNode *leaf = m->updates[k].leaf, *v = m->updates[k].value;
    if (!of_module(m, leaf)) return bad_update(why, len, k, NULL, "leaf is not a node of this module");
    if (leaf->op != IR_OP_PARAM && leaf->op != IR_OP_STATE)
      return bad_update(why, len, k, leaf, "leaf is not a parameter or optimizer state");
    if (seen[leaf->id]) return bad_update(why, len, k, leaf, "leaf updated more than once");
    seen[leaf->id] = 1;
    if (!of_module(m, v)) return bad_update(why, len, k, leaf, "value is not a node of this module");
    if (v->dtype != leaf->dtype || v->rank != leaf->rank ||
        memcmp(v->shape, leaf->shape, sizeof(int64_t) * (size_t)leaf->rank) != 0) {
      char a[160], b[160], what[400];
      snprintf(what, sizeof what, "value %%%d is %s, the leaf %s", v->id,
               ir_type_str(v, a, sizeof a), ir_type_str(leaf, b, sizeof b));
      return bad_update(why, len, k, leaf, what);
    }
  }
  const IrNode *g = m->grad_norm;
  if (g && (!of_module(m, g) || g->rank != 0 || g->dtype != IR_F32))
    return bad(why, len, of_module(m, g) ? g : NULL,
               "grad_norm is not a scalar f32 node of this module");
  return 0;
}

int ir_verify(const IrModule *m, char *why, size_t len) {
  Arena scratch = {0};
  int rc = verify_nodes(m, &scratch, why, len);
  if (rc == 0) rc = verify_updates(m, &scratch, why, len);
  arena_free(&scratch);
  return rc;
}
