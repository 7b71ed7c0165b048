/* tests/autodiff/ad_ops.c -- every VJP rule against finite differences.
 *
 * Each case builds a tiny module around one op (shapes drawn from a seeded
 * RNG, with broadcasting, GQA, causal and keepdim variants), takes as loss
 * sum(result * R) for a fixed random R, runs pass_autodiff and
 * pass_attn_delta (as the trainers do) and the IR verifier, and compares
 * every element of every parameter's gradient with a central difference of
 * the double-precision interpreter.
 *
 *   ad_ops CASE        run one case
 *   ad_ops             run them all
 *   ad_ops --list      print the case names (tests/autodiff/CMakeLists.txt)
 *   ad_ops --coverage  fail unless every differentiable op has a case
 *   ad_ops --flip      the check skips perturbations that flip a top-k choice
 *   ad_ops --errors    pass_autodiff refuses what it cannot differentiate
 *   ad_ops --phases    the B/W tags of a small two-layer network */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ad_check.h"
#include "passes/passes.h"

typedef IrNode *(*CaseFn)(Build *b);

/* Dimension in [lo, hi], drawn from the case's RNG. */
static int64_t dim(Build *b, int64_t lo, int64_t hi) { return lo + rng_int(&b->rng, hi - lo + 1); }

/* ---- dense algebra ---------------------------------------------------------- */

static IrNode *c_matmul_bcast(Build *b) {
  int64_t B = dim(b, 1, 3), T = dim(b, 2, 4), k = dim(b, 2, 5), n = dim(b, 2, 5);
  IrNode *x = t_param(b, LEAF_NORMAL, 1, 0, S(B, T, k));
  IrNode *w = t_param(b, LEAF_NORMAL, 1, 0, S(k, n));
  return t_weighted_sum(b, t_op2(b, IR_OP_MATMUL, x, w, 0, 0));
}

static IrNode *c_matmul_tb(Build *b) {
  int64_t B = dim(b, 1, 3), T = dim(b, 2, 4), k = dim(b, 2, 5), n = dim(b, 2, 5);
  IrNode *x = t_param(b, LEAF_NORMAL, 1, 0, S(2, B, T, k));
  IrNode *w = t_param(b, LEAF_NORMAL, 1, 0, S(n, k));
  return t_weighted_sum(b, t_op2(b, IR_OP_MATMUL, x, w, 1, 0));
}

static IrNode *c_matmul_batched(Build *b) {
  int64_t E = dim(b, 2, 3), C = dim(b, 2, 4), k = dim(b, 2, 4), n = dim(b, 2, 4);
  IrNode *x = t_param(b, LEAF_NORMAL, 1, 0, S(E, C, k));
  IrNode *w = t_param(b, LEAF_NORMAL, 1, 0, S(E, k, n));
  return t_weighted_sum(b, t_op2(b, IR_OP_MATMUL, x, w, 0, 0));
}

static IrNode *c_matmul_batched_tb(Build *b) {
  int64_t E = dim(b, 2, 3), C = dim(b, 2, 4), k = dim(b, 2, 4), n = dim(b, 2, 4);
  IrNode *x = t_param(b, LEAF_NORMAL, 1, 0, S(E, C, k));
  IrNode *w = t_param(b, LEAF_NORMAL, 1, 0, S(E, n, k));
  return t_weighted_sum(b, t_op2(b, IR_OP_MATMUL, x, w, 1, 0));
}

static IrNode *c_matmul_2d(Build *b) {
  IrNode *x = t_param(b, LEAF_NORMAL, 1, 0, S(dim(b, 1, 4), 3));
  IrNode *w = t_param(b, LEAF_NORMAL, 1, 0, S(3, 5));
  return t_weighted_sum(b, t_op2(b, IR_OP_MATMUL, x, w, 0, 0));
}

/* ---- elementwise ------------------------------------------------------------ */

static IrNode *c_add_bcast(Build *b) {
  int64_t A = dim(b, 1, 3), B = dim(b, 2, 4), C = dim(b, 2, 4);
  IrNode *x = t_param(b, LEAF_NORMAL, 1, 0, S(A, B, C));
  IrNode *y = t_param(b, LEAF_NORMAL, 1, 0, S(B, 1));
  return t_weighted_sum(b, t_op2(b, IR_OP_ADD, x, y, 0, 0));
}

static IrNode *c_add_both_bcast(Build *b) {
  IrNode *x = t_param(b, LEAF_NORMAL, 1, 0, S(1, 4)), *y = t_param(b, LEAF_NORMAL, 1, 0, S(3, 1));
  return t_weighted_sum(b, t_op2(b, IR_OP_ADD, x, y, 0, 0));
}

static IrNode *c_sub_bcast(Build *b) {
  int64_t B = dim(b, 2, 4), C = dim(b, 2, 4);
  IrNode *x = t_param(b, LEAF_NORMAL, 1, 0, S(B, 1));
  IrNode *y = t_param(b, LEAF_NORMAL, 1, 0, S(2, B, C));
  return t_weighted_sum(b, t_op2(b, IR_OP_SUB, x, y, 0, 0));
}

static IrNode *c_mul_bcast(Build *b) {
  int64_t C = dim(b, 2, 5);
  IrNode *x = t_param(b, LEAF_NORMAL, 1, 0, S(2, 3, C)), *y = t_param(b, LEAF_NORMAL, 1, 0, S(C));
  return t_weighted_sum(b, t_op2(b, IR_OP_MUL, x, y, 0, 0));
}

/* the same node as both operands: two contributions to one gradient */
static IrNode *c_mul_self(Build *b) {
  IrNode *x = t_param(b, LEAF_NORMAL, 1, 0, S(3, 4));
  return t_weighted_sum(b, t_op2(b, IR_OP_MUL, x, x, 0, 0));
}

static IrNode *c_div_bcast(Build *b) {
  IrNode *x = t_param(b, LEAF_NORMAL, 1, 0, S(2, 3, 4));
  IrNode *y = t_param(b, LEAF_AWAY, 0.5, 2, S(3, 1));
  return t_weighted_sum(b, t_op2(b, IR_OP_DIV, x, y, 0, 0));
}

static IrNode *c_scale(Build *b) {
  IrNode *x = t_param(b, LEAF_NORMAL, 1, 0, S(3, 4));
  return t_weighted_sum(b, t_op1(b, IR_OP_SCALE, x, 0, 0, 0, -0.37));
}

static IrNode *unary(Build *b, IrOp op, LeafKind kind, double lo, double hi) {
  IrNode *x = t_param(b, kind, lo, hi, S(2, dim(b, 2, 4), 5));
  return t_weighted_sum(b, t_op1(b, op, x, 0, 0, 0, 0));
}

static IrNode *c_gelu(Build *b) { return unary(b, IR_OP_GELU, LEAF_NORMAL, 1.5, 0); }
static IrNode *c_silu(Build *b) { return unary(b, IR_OP_SILU, LEAF_NORMAL, 1.5, 0); }
static IrNode *c_relu(Build *b) { return unary(b, IR_OP_RELU, LEAF_AWAY, 0.05, 2); }
static IrNode *c_exp(Build *b) { return unary(b, IR_OP_EXP, LEAF_NORMAL, 1, 0); }
static IrNode *c_log(Build *b) { return unary(b, IR_OP_LOG, LEAF_UNIFORM, 0.2, 3); }

/* ---- normalisation ---------------------------------------------------------- */

static IrNode *c_layer_norm(Build *b) {
  int64_t D = dim(b, 3, 8);
  IrNode *in[3];
  in[0] = t_param(b, LEAF_NORMAL, 1, 0.3, S(2, 3, D));
  in[1] = t_param(b, LEAF_NORMAL, 0.5, 1, S(D));
  in[2] = t_param(b, LEAF_NORMAL, 0.5, 0, S(D));
  return t_weighted_sum(b, t_op(b, IR_OP_LAYERNORM, in, 3, 0, 0, 0, 1e-5));
}

static IrNode *c_rms_norm(Build *b) {
  int64_t D = dim(b, 3, 8);
  IrNode *x = t_param(b, LEAF_NORMAL, 1, 0.3, S(3, D)), *w = t_param(b, LEAF_NORMAL, 0.5, 1, S(D));
  return t_weighted_sum(b, t_op2(b, IR_OP_RMSNORM, x, w, 0, 1e-5));
}

static IrNode *c_softmax(Build *b) {
  IrNode *x = t_param(b, LEAF_NORMAL, 1.5, 0, S(2, 3, dim(b, 2, 6)));
  return t_weighted_sum(b, t_op1(b, IR_OP_SOFTMAX, x, 0, 0, 0, 0));
}

/* ---- attention -------------------------------------------------------------- */

static IrNode *sdpa(Build *b, int64_t B, int64_t H, int64_t KV, int64_t T, int64_t hd,
                    int causal, double scale) {
  IrNode *in[3];
  in[0] = t_param(b, LEAF_NORMAL, 1, 0, S(B, H, T, hd));
  in[1] = t_param(b, LEAF_NORMAL, 1, 0, S(B, KV, T, hd));
  in[2] = t_param(b, LEAF_NORMAL, 1, 0, S(B, KV, T, hd));
  return t_weighted_sum(b, t_op(b, IR_OP_ATTENTION, in, 3, causal, 0, 0, scale));
}

static IrNode *c_sdpa_causal(Build *b) { return sdpa(b, 2, 2, 2, dim(b, 3, 5), 4, 1, 0.5); }
static IrNode *c_sdpa_gqa_causal(Build *b) { return sdpa(b, 1, 4, 2, dim(b, 3, 5), 4, 1, 0.5); }
static IrNode *c_sdpa_gqa_full(Build *b) { return sdpa(b, 2, 4, 1, 3, 2, 0, 0.7); }

/* sdpa read through merge_heads: attn_delta gives sdpa_grad lse and D
 * (sdpa_lse, sdpa_delta) instead of sdpa's out (run_case checks it did) */
static IrNode *sdpa_merged(Build *b, int64_t H, int64_t KV, int causal) {
  int64_t B = 2, T = dim(b, 3, 5), hd = 3;
  IrNode *in[3];
  in[0] = t_param(b, LEAF_NORMAL, 1, 0, S(B, H, T, hd));
  in[1] = t_param(b, LEAF_NORMAL, 1, 0, S(B, KV, T, hd));
  in[2] = t_param(b, LEAF_NORMAL, 1, 0, S(B, KV, T, hd));
  IrNode *y = t_op(b, IR_OP_ATTENTION, in, 3, causal, 0, 0, 0.6);
  return t_weighted_sum(b, t_op1(b, IR_OP_MERGE_HEADS, y, 0, 0, 0, 0));
}
static IrNode *c_sdpa_merged(Build *b) { return sdpa_merged(b, 2, 2, 1); }
static IrNode *c_sdpa_merged_gqa(Build *b) { return sdpa_merged(b, 4, 2, 0); }

static IrNode *c_rope(Build *b) {
  IrNode *x = t_param(b, LEAF_NORMAL, 1, 0, S(2, 2, dim(b, 3, 6), 8));
  return t_weighted_sum(b, t_op1(b, IR_OP_ROPE, x, 0, 0, 0, 10000.0));
}

static IrNode *c_rope_llama3(Build *b) {
  IrNode *x = t_param(b, LEAF_NORMAL, 1, 0, S(1, 3, 7, 6));
  return t_weighted_sum(b, t_op1(b, IR_OP_ROPE, x, 0, 0, 0, 500000.0));
}

/* ---- embedding and layout --------------------------------------------------- */

static IrNode *c_embedding(Build *b) {
  IrNode *ids = t_input(b, LEAF_IDS, 5, 0, S(2, 6)); /* 12 ids over 5 rows: repeats */
  IrNode *table = t_param(b, LEAF_NORMAL, 1, 0, S(7, 3));
  return t_weighted_sum(b, t_op2(b, IR_OP_EMBEDDING, ids, table, 0, 0));
}

static IrNode *c_reshape(Build *b) {
  IrNode *x = t_param(b, LEAF_NORMAL, 1, 0, S(2, 3, 4));
  return t_weighted_sum(b, t_shaped(b, IR_OP_RESHAPE, x, S(4, 6)));
}

static IrNode *c_split_heads(Build *b) {
  IrNode *x = t_param(b, LEAF_NORMAL, 1, 0, S(2, 3, 8));
  return t_weighted_sum(b, t_op1(b, IR_OP_SPLIT_HEADS, x, 2, 0, 0, 0));
}

static IrNode *c_merge_heads(Build *b) {
  IrNode *x = t_param(b, LEAF_NORMAL, 1, 0, S(2, 3, 2, 4));
  return t_weighted_sum(b, t_op1(b, IR_OP_MERGE_HEADS, x, 0, 0, 0, 0));
}

static IrNode *c_transpose(Build *b) {
  IrNode *x = t_param(b, LEAF_NORMAL, 1, 0, S(2, 3, 4));
  return t_weighted_sum(b, t_op1(b, IR_OP_TRANSPOSE, x, 0, 2, 0, 0));
}

/* one input twice, so its gradient is the sum of two slices of dy */
static IrNode *c_concat(Build *b) {
  IrNode *x = t_param(b, LEAF_NORMAL, 1, 0, S(2, 3)), *y = t_param(b, LEAF_NORMAL, 1, 0, S(2, 2));
  IrNode *in[3] = {x, y, x};
  return t_weighted_sum(b, t_op(b, IR_OP_CONCAT, in, 3, 1, 0, 0, 0));
}

static IrNode *add_losses(Build *b, IrNode **l, int n) {
  IrNode *s = l[0];
  for (int i = 1; i < n; i++) s = t_op2(b, IR_OP_ADD, s, l[i], 0, 0);
  return s;
}

/* three slices tiling the last axis, as a fused qkv projection is split */
static IrNode *c_slice_tiled(Build *b) {
  IrNode *x = t_param(b, LEAF_NORMAL, 1, 0, S(2, 9)), *l[3];
  for (int i = 0; i < 3; i++) l[i] = t_weighted_sum(b, t_op1(b, IR_OP_SLICE, x, 1, 3 * i, 3, 0));
  return add_losses(b, l, 3);
}

/* overlapping slices, gaps, two axes */
static IrNode *c_slice_mixed(Build *b) {
  IrNode *x = t_param(b, LEAF_NORMAL, 1, 0, S(3, 9)), *l[4];
  l[0] = t_weighted_sum(b, t_op1(b, IR_OP_SLICE, x, 1, 1, 2, 0));
  l[1] = t_weighted_sum(b, t_op1(b, IR_OP_SLICE, x, 1, 2, 4, 0));
  l[2] = t_weighted_sum(b, t_op1(b, IR_OP_SLICE, x, 1, 7, 2, 0));
  l[3] = t_weighted_sum(b, t_op1(b, IR_OP_SLICE, x, 0, 1, 1, 0));
  return add_losses(b, l, 4);
}

/* ---- reductions and broadcasting -------------------------------------------- */

static IrNode *reduce(Build *b, IrOp op, int axis, int keepdim) {
  IrNode *x = t_param(b, LEAF_NORMAL, 1, 0, S(2, dim(b, 2, 4), 3));
  return t_weighted_sum(b, t_op1(b, op, x, axis, keepdim, 0, 0));
}

static IrNode *c_sum(Build *b) { return reduce(b, IR_OP_SUM, 1, 0); }
static IrNode *c_mean(Build *b) { return reduce(b, IR_OP_MEAN, 2, 0); }
static IrNode *c_sum_keepdim(Build *b) { return reduce(b, IR_OP_SUM, 0, 1); }
static IrNode *c_mean_keepdim(Build *b) { return reduce(b, IR_OP_MEAN, 1, 1); }

static IrNode *c_broadcast(Build *b) {
  IrNode *x = t_param(b, LEAF_NORMAL, 1, 0, S(3, 1));
  return t_weighted_sum(b, t_shaped(b, IR_OP_BROADCAST, x, S(2, 3, 4)));
}

static IrNode *c_sum_to(Build *b) {
  IrNode *x = t_param(b, LEAF_NORMAL, 1, 0, S(2, 3, 4));
  return t_weighted_sum(b, t_shaped(b, IR_OP_SUM_TO, x, S(3, 1)));
}

/* ---- loss and routing ------------------------------------------------------- */

static IrNode *c_cross_entropy(Build *b) {
  int64_t V = dim(b, 3, 7);
  IrNode *logits = t_param(b, LEAF_NORMAL, 2, 0, S(2, 3, V));
  IrNode *targets = t_input(b, LEAF_IDS, (double)V, 0, S(2, 3));
  return t_weighted_sum(b, t_op2(b, IR_OP_CROSS_ENTROPY, logits, targets, 0, 0));
}

static IrNode *c_gather(Build *b) {
  IrNode *x = t_param(b, LEAF_NORMAL, 1, 0, S(4, 6)), *idx = t_input(b, LEAF_IDS, 6, 0, S(4, 3));
  return t_weighted_sum(b, t_op2(b, IR_OP_GATHER, x, idx, 0, 0));
}

/* 12 choices over 3 experts of capacity 3: some are dropped */
static IrNode *c_dispatch(Build *b) {
  IrNode *x = t_param(b, LEAF_NORMAL, 1, 0, S(6, 4)), *idx = t_input(b, LEAF_IDS, 3, 0, S(6, 2));
  IrNode *in[2] = {x, idx};
  return t_weighted_sum(b, t_op(b, IR_OP_DISPATCH, in, 2, 3, 3, 0, 0));
}

static IrNode *c_combine(Build *b) {
  IrNode *in[3];
  in[0] = t_param(b, LEAF_NORMAL, 1, 0, S(3, 3, 4));
  in[1] = t_input(b, LEAF_IDS, 3, 0, S(6, 2));
  in[2] = t_param(b, LEAF_NORMAL, 1, 0, S(6, 2));
  return t_weighted_sum(b, t_op(b, IR_OP_COMBINE, in, 3, 0, 0, 0, 0));
}

/* Mixtral's router: softmax, topk (no gradient), gather, renormalise. */
static IrNode *c_router(Build *b) {
  IrNode *probs = t_op1(b, IR_OP_SOFTMAX, t_param(b, LEAF_NORMAL, 2, 0, S(6, 4)), 0, 0, 0, 0);
  IrNode *idx = t_op1(b, IR_OP_TOPK, probs, 2, 0, 0, 0);
  IrNode *w = t_op2(b, IR_OP_GATHER, probs, idx, 0, 0);
  IrNode *s = t_op1(b, IR_OP_SUM, w, 1, 1, 0, 0);
  return t_weighted_sum(b, t_op2(b, IR_OP_DIV, w, s, 0, 0));
}

/* The prelude's logsumexp(z) = z_j - log softmax(z)_j at j = argmax, and the
 * router z-loss mean(lse^2) over it: the gradient flows through gather, log
 * and softmax (topk has none) and must come out as 2 lse softmax(z) / n. */
static IrNode *c_logsumexp(Build *b) {
  IrNode *z = t_param(b, LEAF_NORMAL, 3, 0, S(6, dim(b, 3, 5)));
  IrNode *p = t_op1(b, IR_OP_SOFTMAX, z, 0, 0, 0, 0);
  IrNode *j = t_op1(b, IR_OP_TOPK, p, 1, 0, 0, 0);
  IrNode *lse = t_op2(b, IR_OP_SUB, t_op2(b, IR_OP_GATHER, z, j, 0, 0),
                      t_op1(b, IR_OP_LOG, t_op2(b, IR_OP_GATHER, p, j, 0, 0), 0, 0, 0, 0), 0, 0);
  IrNode *sq = t_op1(b, IR_OP_SUM, t_op2(b, IR_OP_MUL, lse, lse, 0, 0), 1, 0, 0, 0);
  IrNode *l[2] = {t_weighted_sum(b, lse), t_op1(b, IR_OP_MEAN, sq, 0, 0, 0, 0)};
  return add_losses(b, l, 2);
}

/* one tensor feeding several ops, and a parameter the loss ignores */
static IrNode *c_fanout(Build *b) {
  IrNode *x = t_param(b, LEAF_NORMAL, 1, 0, S(3, 4));
  t_param(b, LEAF_NORMAL, 1, 0, S(2));
  IrNode *g = t_op1(b, IR_OP_GELU, x, 0, 0, 0, 0), *e = t_op1(b, IR_OP_EXP, x, 0, 0, 0, 0);
  IrNode *m = t_op2(b, IR_OP_MUL, g, x, 0, 0);
  IrNode *l[3];
  l[0] = t_weighted_sum(b, m);
  l[1] = t_weighted_sum(b, e);
  l[2] = t_weighted_sum(b, x);
  return add_losses(b, l, 3);
}

/* collectives over a group of one rank (identities); their VJPs on a real
 * multi-rank mesh are checked by tests/shard/shard_vjp.c */
static IrNode *c_collective(Build *b, IrOp op) {
  IrNode *x = t_param(b, LEAF_NORMAL, 1, 0, S(2, 3, 4));
  return t_weighted_sum(b, t_op1(b, op, t_op1(b, IR_OP_EXP, x, 0, 0, 0, 0), 0, 1, 1, 0));
}
/* vocabulary-parallel embedding and cross-entropy over a group of one rank
 * (the whole vocabulary); on a mesh, tests/shard/shard_models.c */
static IrNode *c_vocab_embedding(Build *b) {
  IrNode *ids = t_input(b, LEAF_IDS, 5, 0, S(2, 6));
  IrNode *table = t_param(b, LEAF_NORMAL, 1, 0, S(5, 3));
  return t_weighted_sum(b, t_op(b, IR_OP_VOCAB_EMBEDDING, (IrNode *[]){ids, table}, 2, 0, 1, 0, 0));
}
static IrNode *c_vocab_cross_entropy(Build *b) {
  IrNode *logits = t_param(b, LEAF_NORMAL, 2, 0, S(2, 3, 7));
  IrNode *targets = t_input(b, LEAF_IDS, 7, 0, S(2, 3));
  return t_weighted_sum(
      b, t_op(b, IR_OP_VOCAB_CROSS_ENTROPY, (IrNode *[]){logits, targets}, 2, 0, 1, 7, 0));
}
/* a padded vocabulary: 5 of the 7 columns are real; the padding columns
 * are masked (the loss does not depend on them: zero gradient) */
static IrNode *c_vocab_cross_entropy_padded(Build *b) {
  IrNode *logits = t_param(b, LEAF_NORMAL, 2, 0, S(2, 3, 7));
  IrNode *targets = t_input(b, LEAF_IDS, 5, 0, S(2, 3));
  return t_weighted_sum(
      b, t_op(b, IR_OP_VOCAB_CROSS_ENTROPY, (IrNode *[]){logits, targets}, 2, 0, 1, 5, 0));
}
static IrNode *c_all_reduce(Build *b) { return c_collective(b, IR_OP_ALL_REDUCE); }
static IrNode *c_group_copy(Build *b) { return c_collective(b, IR_OP_GROUP_COPY); }
static IrNode *c_all_gather(Build *b) { return c_collective(b, IR_OP_ALL_GATHER); }
static IrNode *c_reduce_scatter(Build *b) { return c_collective(b, IR_OP_REDUCE_SCATTER); }
static IrNode *c_local_slice(Build *b) { return c_collective(b, IR_OP_LOCAL_SLICE); }
static IrNode *c_replicate(Build *b) { return c_collective(b, IR_OP_REPLICATE); }

/* Dispatch, expert_all_to_all to the experts and back (a group of one:
 * the filled slots pass, the empty ones are zero), combine: both
 * directions' VJPs; some choices dropped by the capacity of 3. */
static IrNode *c_expert_all_to_all(Build *b) {
  IrNode *x = t_param(b, LEAF_NORMAL, 1, 0, S(6, 4)), *idx = t_input(b, LEAF_IDS, 3, 0, S(6, 2));
  IrNode *e = t_op(b, IR_OP_DISPATCH, (IrNode *[]){x, idx}, 2, 3, 3, 0, 0);
  IrNode *to = t_op(b, IR_OP_EXPERT_ALL_TO_ALL, (IrNode *[]){e, idx}, 2, 2, 1, 0, 0);
  IrNode *h = t_op2(b, IR_OP_MUL, to, t_param(b, LEAF_NORMAL, 1, 0, S(3, 3, 4)), 0, 0);
  IrNode *back = t_op(b, IR_OP_EXPERT_ALL_TO_ALL, (IrNode *[]){h, idx}, 2, 2, 1, 1, 0);
  IrNode *w = t_param(b, LEAF_NORMAL, 1, 0, S(6, 2));
  return t_weighted_sum(b, t_op(b, IR_OP_COMBINE, (IrNode *[]){back, idx, w}, 3, 0, 0, 0, 0));
}

typedef struct {
  const char *name;
  IrOp op; /* the op under test (coverage) */
  CaseFn fn;
} Case;

static const Case cases[] = {
    {"matmul_bcast", IR_OP_MATMUL, c_matmul_bcast},
    {"matmul_tb", IR_OP_MATMUL, c_matmul_tb},
    {"matmul_batched", IR_OP_MATMUL, c_matmul_batched},
    {"matmul_batched_tb", IR_OP_MATMUL, c_matmul_batched_tb},
    {"matmul_2d", IR_OP_MATMUL, c_matmul_2d},
    {"add_bcast", IR_OP_ADD, c_add_bcast},
    {"add_both_bcast", IR_OP_ADD, c_add_both_bcast},
    {"sub_bcast", IR_OP_SUB, c_sub_bcast},
    {"mul_bcast", IR_OP_MUL, c_mul_bcast},
    {"mul_self", IR_OP_MUL, c_mul_self},
    {"div_bcast", IR_OP_DIV, c_div_bcast},
    {"scale", IR_OP_SCALE, c_scale},
    {"gelu", IR_OP_GELU, c_gelu},
    {"silu", IR_OP_SILU, c_silu},
    {"relu", IR_OP_RELU, c_relu},
    {"exp", IR_OP_EXP, c_exp},
    {"log", IR_OP_LOG, c_log},
    {"layer_norm", IR_OP_LAYERNORM, c_layer_norm},
    {"rms_norm", IR_OP_RMSNORM, c_rms_norm},
    {"softmax", IR_OP_SOFTMAX, c_softmax},
    {"sdpa_causal", IR_OP_ATTENTION, c_sdpa_causal},
    {"sdpa_gqa_causal", IR_OP_ATTENTION, c_sdpa_gqa_causal},
    {"sdpa_gqa_full", IR_OP_ATTENTION, c_sdpa_gqa_full},
    {"sdpa_merged", IR_OP_ATTENTION, c_sdpa_merged},
    {"sdpa_merged_gqa", IR_OP_ATTENTION, c_sdpa_merged_gqa},
    {"rope", IR_OP_ROPE, c_rope},
    {"rope_llama3", IR_OP_ROPE, c_rope_llama3},
    {"embedding", IR_OP_EMBEDDING, c_embedding},
    {"reshape", IR_OP_RESHAPE, c_reshape},
    {"split_heads", IR_OP_SPLIT_HEADS, c_split_heads},
    {"merge_heads", IR_OP_MERGE_HEADS, c_merge_heads},
    {"transpose", IR_OP_TRANSPOSE, c_transpose},
    {"concat", IR_OP_CONCAT, c_concat},
    {"slice_tiled", IR_OP_SLICE, c_slice_tiled},
    {"slice_mixed", IR_OP_SLICE, c_slice_mixed},
    {"sum", IR_OP_SUM, c_sum},
    {"mean", IR_OP_MEAN, c_mean},
    {"sum_keepdim", IR_OP_SUM, c_sum_keepdim},
    {"mean_keepdim", IR_OP_MEAN, c_mean_keepdim},
    {"cross_entropy", IR_OP_CROSS_ENTROPY, c_cross_entropy},
    {"gather", IR_OP_GATHER, c_gather},
    {"dispatch", IR_OP_DISPATCH, c_dispatch},
    {"combine", IR_OP_COMBINE, c_combine},
    {"expert_all_to_all", IR_OP_EXPERT_ALL_TO_ALL, c_expert_all_to_all},
    {"broadcast", IR_OP_BROADCAST, c_broadcast},
    {"sum_to", IR_OP_SUM_TO, c_sum_to},
    {"router", IR_OP_TOPK, c_router},
    {"logsumexp", IR_OP_LOG, c_logsumexp},
    {"fanout", IR_OP_ADD, c_fanout},
    {"vocab_embedding", IR_OP_VOCAB_EMBEDDING, c_vocab_embedding},
    {"vocab_cross_entropy", IR_OP_VOCAB_CROSS_ENTROPY, c_vocab_cross_entropy},
    {"vocab_cross_entropy_padded", IR_OP_VOCAB_CROSS_ENTROPY, c_vocab_cross_entropy_padded},
    {"all_reduce", IR_OP_ALL_REDUCE, c_all_reduce},
    {"group_copy", IR_OP_GROUP_COPY, c_group_copy},
    {"all_gather", IR_OP_ALL_GATHER, c_all_gather},
    {"reduce_scatter", IR_OP_REDUCE_SCATTER, c_reduce_scatter},
    {"local_slice", IR_OP_LOCAL_SLICE, c_local_slice},
    {"replicate", IR_OP_REPLICATE, c_replicate},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

static int run_case(const Case *c, int verbose) {
  Build b;
  uint64_t seed = 1;
  for (const char *p = c->name; *p; p++) seed = seed * 131 + (unsigned char)*p;
  build_init(&b, c->name, seed);
  b.m->loss = c->fn(&b);
  must_verify(b.m, "before autodiff");
  int nfwd = b.m->nnodes;
  if (pass_autodiff(b.m) || pass_attn_delta(b.m)) {
    printf("FAIL %s: pass_autodiff or pass_attn_delta failed\n", c->name);
    return 1;
  }
  must_verify(b.m, "after autodiff");
  int stats = 0; /* sdpa_grads reading lse and D */
  for (int i = 0; i < b.m->nnodes; i++)
    stats += b.m->nodes[i]->op == IR_OP_ATTENTION_GRAD && b.m->nodes[i]->ninputs == 6;
  if (stats != !strncmp(c->name, "sdpa_merged", 11)) {
    printf("FAIL %s: %d sdpa_grads read lse and D\n", c->name, stats);
    return 1;
  }
  if (verbose) ir_print(stdout, b.m);
  int nparams = 0, ngrads = 0;
  for (int i = 0; i < nfwd; i++) {
    nparams += b.m->nodes[i]->op == IR_OP_PARAM;
    ngrads += b.m->nodes[i]->grad != NULL;
  }
  IrInterp *it = ir_interp_new(b.m);
  fill_leaves(&b, it);
  FdOptions o = {.per_param = 0, .eps = 1e-6, .rtol = 1e-6, .atol = 1e-8, .verbose = verbose};
  FdStats st;
  int rc = fd_check(b.m, it, &b.rng, &o, &st);
  printf("%s %-18s %d/%d params with gradients, %d elements, max rel %.2e, max abs %.2e, "
         "%d backward nodes\n",
         rc ? "FAIL" : "ok  ", c->name, ngrads, nparams, st.checked, st.max_rel, st.max_abs,
         b.m->nnodes - nfwd);
  if (!rc && (st.checked == 0 || st.skipped)) {
    printf("FAIL %s: %d elements checked, %d skipped\n", c->name, st.checked, st.skipped);
    rc = -1;
  }
  ir_interp_free(it);
  ir_module_free(b.m);
  return rc != 0;
}

/* Every differentiable op is the op under test of some case. */
static int coverage(void) {
  int bad = 0;
  for (int op = 0; op < IR_OP_COUNT; op++) {
    if (!(ir_op_info[op].flags & IR_F_DIFF)) continue;
    int found = 0;
    for (int i = 0; i < NCASES; i++) found |= cases[i].op == (IrOp)op;
    if (!found) {
      printf("FAIL: differentiable op %s has no case in ad_ops.c\n", ir_op_info[op].name);
      bad = 1;
    }
  }
  if (!bad) printf("ok   every differentiable op has a finite-difference case\n");
  return bad;
}

/* Router logits with a near tie (1e-7 apart, below the step): the check
 * must notice the flipped choice and skip those elements, not report a
 * false gradient.  Elements away from the tie are still checked. */
static int flip(void) {
  Build b;
  build_init(&b, "flip", 7);
  IrNode *x = t_param(&b, LEAF_FIXED, 0, 0, S(2, 3));
  IrNode *idx = t_op1(&b, IR_OP_TOPK, x, 1, 0, 0, 0);
  b.m->loss = t_weighted_sum(&b, t_op2(&b, IR_OP_GATHER, x, idx, 0, 0));
  if (pass_autodiff(b.m)) return 1;
  IrInterp *it = ir_interp_new(b.m);
  fill_leaves(&b, it);
  const double v[6] = {0.3, 0.3 + 1e-7, -1, 0.5, 0.1, 0.2};
  memcpy(it->f[x->id], v, sizeof v);
  FdOptions o = {.per_param = 0, .eps = 1e-6, .rtol = 1e-6, .atol = 1e-8};
  FdStats st;
  int rc = fd_check(b.m, it, &b.rng, &o, &st);
  int ok = rc == 0 && st.skipped == 2 && st.checked == 4;
  printf("%s top-k flips detected: %d skipped, %d checked\n", ok ? "ok  " : "FAIL", st.skipped,
         st.checked);
  ir_interp_free(it);
  ir_module_free(b.m);
  return !ok;
}

/* A backward-only op on the loss's path has no rule: an error, not a zero
 * gradient.  A module is differentiated once.  A loss no parameter reaches
 * gets no backward nodes. */
static int errors(void) {
  int bad = 0;
  Build b;
  build_init(&b, "norule", 8);
  IrNode *x = t_param(&b, LEAF_NORMAL, 1, 0, S(3, 2)), *y = t_param(&b, LEAF_NORMAL, 1, 0, S(3, 4));
  b.m->loss = t_weighted_sum(&b, t_op2(&b, IR_OP_MATMUL_TA, x, y, 0, 0));
  int rc = pass_autodiff(b.m);
  printf("%s backward-only op on the path is refused\n", rc ? "ok  " : "FAIL");
  bad += !rc;
  ir_module_free(b.m);

  build_init(&b, "twice", 9);
  x = t_param(&b, LEAF_NORMAL, 1, 0, S(3));
  b.m->loss = t_weighted_sum(&b, t_op1(&b, IR_OP_EXP, x, 0, 0, 0, 0));
  rc = pass_autodiff(b.m) == 0 && pass_autodiff(b.m) != 0;
  printf("%s a second autodiff is refused\n", rc ? "ok  " : "FAIL");
  bad += !rc;
  ir_module_free(b.m);

  build_init(&b, "constant", 10);
  t_param(&b, LEAF_NORMAL, 1, 0, S(3));
  IrNode *in = t_input(&b, LEAF_NORMAL, 1, 0, S(3));
  b.m->loss = t_weighted_sum(&b, in);
  int n = b.m->nnodes;
  rc = pass_autodiff(b.m) == 0 && b.m->nnodes == n;
  printf("%s a loss no parameter reaches gets no backward nodes\n", rc ? "ok  " : "FAIL");
  bad += !rc;
  ir_module_free(b.m);
  return bad != 0;
}

/* A weight used through a forward op of its own (scale) gets its gradient
 * in W; the gradients of activations (values that depend on an input) are
 * B, the weight-gradient matmuls W. */
static int phases(void) {
  Build b;
  build_init(&b, "phases", 11);
  IrNode *x = t_input(&b, LEAF_NORMAL, 1, 0, S(2, 3, 4));
  IrNode *w1 = t_param(&b, LEAF_NORMAL, 1, 0, S(4, 5));
  IrNode *w2 = t_param(&b, LEAF_NORMAL, 1, 0, S(5, 2));
  IrNode *h = t_op1(&b, IR_OP_GELU, t_op2(&b, IR_OP_MATMUL, x, w1, 0, 0), 0, 0, 0, 0);
  IrNode *w2s = t_op1(&b, IR_OP_SCALE, w2, 0, 0, 0, 0.5);
  b.m->loss = t_weighted_sum(&b, t_op2(&b, IR_OP_MATMUL, h, w2s, 0, 0));
  if (pass_autodiff(b.m)) return 1;
  must_verify(b.m, "after autodiff");
  int ok = w1->grad && w2->grad && w1->grad->phase == IR_PHASE_W && w2->grad->phase == IR_PHASE_W;
  int ngelu = 0;
  for (int i = 0; i < b.m->nnodes; i++) {
    IrNode *n = b.m->nodes[i];
    if (n->op == IR_OP_GELU_GRAD) ngelu++, ok &= n->phase == IR_PHASE_B;
    if (n->op == IR_OP_MATMUL_TA) ok &= n->phase == IR_PHASE_W;
    if (n->op == IR_OP_SCALE && n->phase != IR_PHASE_FWD) ok &= n->phase == IR_PHASE_W;
  }
  ok &= ngelu == 1;
  printf("%s weight-only work is W, activation gradients B\n", ok ? "ok  " : "FAIL");
  if (!ok) ir_print(stdout, b.m);
  ir_module_free(b.m);
  return !ok;
}

int main(int argc, char **argv) {
  int verbose = argc > 2 && !strcmp(argv[2], "-v");
  if (argc > 1 && !strcmp(argv[1], "--list")) {
    for (int i = 0; i < NCASES; i++) printf("%s\n", cases[i].name);
    return 0;
  }
  if (argc > 1 && !strcmp(argv[1], "--coverage")) return coverage();
  if (argc > 1 && !strcmp(argv[1], "--flip")) return flip();
  if (argc > 1 && !strcmp(argv[1], "--errors")) return errors();
  if (argc > 1 && !strcmp(argv[1], "--phases")) return phases();
  int fails = 0, ran = 0;
  for (int i = 0; i < NCASES; i++) {
    if (argc > 1 && strcmp(argv[1], cases[i].name)) continue;
    fails += run_case(&cases[i], verbose);
    ran++;
  }
  if (!ran) {
    fprintf(stderr, "no case named '%s' (see --list)\n", argv[1]);
    return 2;
  }
  return fails != 0;
}
