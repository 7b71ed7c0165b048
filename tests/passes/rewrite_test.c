/* tests/passes/rewrite_test.c -- a rewriting pass on a model's step:
 * passes/slice_sink.c, passes/remat.c, passes/remat_act.c,
 * passes/attn_layout.c or passes/gelu_epilogue.c (then remat).
 *
 *   rewrite_test slice_sink|remat|remat_after_act|remat_act|remat_layer|attn_layout|
 *                gelu_epilogue[_after_act|_after_layer] MODEL.dsl MIN [NAME=VALUE ...]
 *
 * (remat_after_act, gelu_epilogue_after_act: on modules that ran remat_act
 * first, as parc --recompute pointwise does; gelu_epilogue_after_layer:
 * remat_layer first, --recompute layers.)
 * The model is loaded twice, differentiated, given its optimizer; one copy
 * then runs the pass.  Requires:
 *   - the rewritten module verifies, and in it nothing is left to rewrite:
 *     slice_sink, no pointwise f32 op read by slices only; remat, no forward
 *     pointwise op of one activation and leaves with pointwise readers in
 *     the forward and the backward; remat_act, no forward pointwise op of a
 *     layer read in the backward whose inputs the backward has anyway (or can
 *     recompute so) -- and no node is read later than before (the copies
 *     keep nothing longer); remat_layer, no backward node reading a forward
 *     value of its own layer (the layer's copies: its count of copies made,
 *     every layer counted); attn_layout, no head copy around an
 *     attention that its rules remove (this file's own reading of the rules);
 *     gelu_epilogue, in a bf16 module, every gelu_grad of a linear layer's
 *     GELU input (this file's reading: gelu_inputs) right after its dy's
 *     matmul and reading the forward's input itself, not remat's copy (in an
 *     fp32 module: none moved, remat copies as before);
 *   - the other module had at least MIN of them (the pass is exercised) and
 *     the rewritten one has exactly the nodes the rules say: slice_sink,
 *     those ops fewer plus the new operand slices (each rewritten slice
 *     becomes its op, each cut operand one new slice); remat, one copy more
 *     for each backward reader of each, every copy read by one node;
 *     remat_act, one copy more for each; attn_layout, the copies (and
 *     GPT-2's concat) fewer; gelu_epilogue, remat's copies of the others;
 *   - two training steps of both modules in the reference interpreter, from
 *     the same parameters and batch, give the same loss and the same value of
 *     every update, bit for bit (slicing commutes with a pointwise op; the
 *     token-major attention computes each value as the head-major one;
 *     gelu_epilogue's reference is the module before remat, whose backward
 *     reads the GELU input itself).
 * Prints the counts and the losses. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/interp.h"
#include "passes/machine.h"
#include "passes/passes.h"
#include "tests/support/load.h"

static int fails;

static void expect(int ok, const char *what) {
  if (!ok) {
    printf("FAIL: %s\n", what);
    fails++;
  }
}

/* Pointwise f32 ops of m read by one or more slices and by nothing else:
 * their count, *slices the slices reading them, *cut the operands those
 * slices will cut (the operands spanning the sliced axis: numpy broadcasting
 * aligns the last dims). */
static int sliced_only(const IrModule *m, int *slices, int *cut) {
  int *readers = calloc((size_t)m->nnodes + 1, sizeof *readers);
  int *others = calloc((size_t)m->nnodes + 1, sizeof *others);
  for (int i = 0; i < m->nnodes; i++)
    for (int j = 0; j < m->nodes[i]->ninputs; j++) {
      readers[m->nodes[i]->inputs[j]->id]++;
      others[m->nodes[i]->inputs[j]->id] += m->nodes[i]->op != IR_OP_SLICE;
    }
  int n = 0;
  *slices = *cut = 0;
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *p = m->nodes[i];
    if ((ir_op_info[p->op].flags & IR_F_POINTWISE) && p->dtype == IR_F32 && readers[i] &&
        !others[i]) {
      n++;
      *slices += readers[i];
    }
  }
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *s = m->nodes[i], *p = s->op == IR_OP_SLICE ? s->inputs[0] : NULL;
    if (!p || !(ir_op_info[p->op].flags & IR_F_POINTWISE) || p->dtype != IR_F32 ||
        others[p->id])
      continue;
    for (int j = 0; j < p->ninputs; j++) {
      int ax = (int)s->ia[0] - (p->rank - p->inputs[j]->rank);
      *cut += ax >= 0 && p->inputs[j]->shape[ax] == p->shape[s->ia[0]];
    }
  }
  free(readers);
  free(others);
  return n;
}

/* remat's candidates (passes/remat.c's rules, read again here): forward
 * pointwise f32 ops of one non-leaf input of their element count and leaves,
 * read in the forward and in the backward, by pointwise ops only, and held
 * by nothing else.  *copies: the copies the pass makes, one for each of a
 * candidate's backward readers. */
static int rematerializable(const IrModule *m, int *copies) {
  int n = 0;
  *copies = 0;
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *p = m->nodes[i];
    if (p->phase != IR_PHASE_FWD || !(ir_op_info[p->op].flags & IR_F_POINTWISE) ||
        p->dtype != IR_F32 || p == m->loss || p == m->ce_loss)
      continue;
    int acts = 0, ok = 1, fwd = 0, bwd = 0, readers = 0;
    for (int j = 0; j < p->ninputs; j++) {
      const IrNode *x = p->inputs[j];
      if (ir_op_info[x->op].flags & IR_F_LEAF) continue;
      acts++;
      ok &= ir_numel(x) == ir_numel(p);
    }
    for (int r = i + 1; r < m->nnodes && ok; r++) {
      const IrNode *q = m->nodes[r];
      int back = q->phase == IR_PHASE_B || q->phase == IR_PHASE_W, reads = 0;
      for (int j = 0; j < q->ninputs; j++) {
        if (q->inputs[j] != p) continue;
        ok &= (ir_op_info[q->op].flags & IR_F_POINTWISE) != 0 && q->phase != IR_PHASE_OPT;
        fwd += q->phase == IR_PHASE_FWD;
        bwd += back;
        reads = 1;
      }
      readers += back && reads;
    }
    for (int u = 0; u < m->nupdates; u++) ok &= m->updates[u].value != p;
    for (int k = 0; k < m->nnodes; k++) ok &= m->nodes[k]->grad != p;
    ok &= !gelu_epilogue_input(m, p); /* kept for the GEMM epilogues (bf16) */
    if (ok && acts == 1 && fwd && bwd) n++, *copies += readers;
  }
  return n;
}

/* 1 if r is gelu_grad(h, dg) of a linear layer's GELU input: h = add(matmul,
 * param) in the forward (or remat_layer's copy in the backward), read by one
 * gelu of its phase, gelu_grads and later gelus (remat_act's copies) alone;
 * dg a backward matmul that r alone reads.  (passes/gelu_epilogue.c's rule, read
 * again.) */
static int gelu_grad_of_linear(const IrModule *m, const IrNode *r) {
  if (r->op != IR_OP_GELU_GRAD || r->phase != IR_PHASE_B) return 0;
  const IrNode *h = r->inputs[0], *dg = r->inputs[1];
  if (h->op != IR_OP_ADD || (h->phase != IR_PHASE_FWD && h->phase != IR_PHASE_B) ||
      dg->op != IR_OP_MATMUL || dg->phase != IR_PHASE_B)
    return 0;
  int mm = h->inputs[0]->op == IR_OP_MATMUL ? 0 : 1;
  if (h->inputs[mm]->op != IR_OP_MATMUL || h->inputs[mm]->phase != h->phase ||
      h->inputs[1 - mm]->op != IR_OP_PARAM)
    return 0;
  int gelus = 0, dg_readers = 0, mm_readers = 0;
  for (int i = 0; i < m->nnodes; i++)
    for (int j = 0; j < m->nodes[i]->ninputs; j++) {
      const IrNode *q = m->nodes[i], *x = q->inputs[j];
      if (x == dg) dg_readers++;
      if (x == h->inputs[mm]) mm_readers++;
      if (x != h) continue;
      if (q->op == IR_OP_GELU) gelus += q->phase == h->phase; /* (or remat_act's copy) */
      else if (q->op != IR_OP_GELU_GRAD || j != 0) return 0;
    }
  return gelus == 1 && dg_readers == 1 && mm_readers == 1;
}

/* gelu_epilogue: the gelu_grads of linear layers' GELU inputs; *placed those
 * right after their dg */
static int gelu_inputs(const IrModule *m, int *placed) {
  int n = 0;
  *placed = 0;
  for (int i = 0; i < m->nnodes; i++)
    if (gelu_grad_of_linear(m, m->nodes[i])) {
      n++;
      *placed += m->nodes[i]->inputs[1]->id == i - 1;
    }
  return n;
}

/* remat_layer's candidates: the layers with a backward node (phase B or W)
 * reading a forward value of its own layer that is not a leaf */
static int layer_readers(const IrModule *m) {
  int nl = 0, n = 0;
  for (int i = 0; i < m->nnodes; i++)
    if (m->nodes[i]->layer + 1 > nl) nl = m->nodes[i]->layer + 1;
  unsigned char *seen = calloc((size_t)nl + 1, 1);
  for (int r = 0; r < m->nnodes; r++) {
    const IrNode *q = m->nodes[r];
    if ((q->phase != IR_PHASE_B && q->phase != IR_PHASE_W) || q->layer < 0) continue;
    for (int j = 0; j < q->ninputs; j++) {
      const IrNode *x = q->inputs[j];
      if (x->phase == IR_PHASE_FWD && x->layer == q->layer &&
          !(ir_op_info[x->op].flags & IR_F_LEAF) && !seen[q->layer])
        seen[q->layer] = 1, n++;
    }
  }
  free(seen);
  return n;
}

/* The nodes of m not in old[0..nold) (the pass's copies): each read by
 * exactly one node (remat: a copy per backward reader).  Their count. */
static int copies_one_reader(const IrModule *m, IrNode *const *old, int nold) {
  unsigned char *is_old = calloc((size_t)m->nnodes + 1, 1);
  int *readers = calloc((size_t)m->nnodes + 1, sizeof *readers), n = 0;
  for (int k = 0; k < nold; k++) is_old[old[k]->id] = 1;
  for (int i = 0; i < m->nnodes; i++)
    for (int j = 0; j < m->nodes[i]->ninputs; j++) {
      int x = m->nodes[i]->inputs[j]->id;
      int again = 0; /* a node reading x twice counts once */
      for (int k = 0; k < j; k++) again |= m->nodes[i]->inputs[k]->id == x;
      readers[x] += !again;
    }
  for (int i = 0; i < m->nnodes; i++) {
    if (is_old[i]) continue;
    n++;
    if (readers[i] != 1) {
      char msg[160];
      snprintf(msg, sizeof msg, "copy %%%d (%s) has %d readers, not 1", i,
               ir_op_info[m->nodes[i]->op].name, readers[i]);
      expect(0, msg);
    }
  }
  free(is_old);
  free(readers);
  return n;
}

/* remat_act's candidates (passes/remat_act.c's rules, read again here):
 * forward pointwise f32 ops of a layer, held by nothing, read in the
 * backward, each input a leaf, such a candidate, or read in the backward at
 * or after the op's first backward reader */
static int act_candidates(const IrModule *m) {
  int n = 0;
  unsigned char *cand = calloc((size_t)m->nnodes + 1, 1);
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *p = m->nodes[i];
    if (p->phase != IR_PHASE_FWD || p->layer < 0 ||
        !(ir_op_info[p->op].flags & IR_F_POINTWISE) || p->dtype != IR_F32 || p == m->loss ||
        p == m->ce_loss)
      continue;
    int held = 0, first = -1;
    for (int u = 0; u < m->nupdates; u++) held |= m->updates[u].value == p;
    for (int k = 0; k < m->nnodes; k++) held |= m->nodes[k]->grad == p;
    for (int r = i + 1; r < m->nnodes && first < 0; r++)
      for (int j = 0; j < m->nodes[r]->ninputs; j++)
        if (m->nodes[r]->inputs[j] == p && ir_backward(m->nodes[r])) first = r;
    int ok = !held && first >= 0;
    for (int j = 0; ok && j < p->ninputs; j++) {
      const IrNode *x = p->inputs[j];
      int later = (ir_op_info[x->op].flags & IR_F_LEAF) || cand[x->id];
      for (int r = first; r < m->nnodes && !later; r++)
        for (int k = 0; k < m->nodes[r]->ninputs; k++)
          later |= m->nodes[r]->inputs[k] == x && ir_backward(m->nodes[r]);
      ok = later;
    }
    cand[i] = (unsigned char)ok;
    n += ok;
  }
  free(cand);
  return n;
}

/* Per node old[k] of m (m's nodes before remat_act, by pointer): where it is
 * last read, as a position in old, a node the pass made counting as the
 * old node it goes before (-1: never read).  remat_act keeps nothing
 * longer: no node's last read moves later. */
static void last_reads(const IrModule *m, IrNode *const *old, int nold, int *last) {
  int *at = calloc((size_t)m->nnodes + 1, sizeof *at);
  int *idx = calloc((size_t)m->nnodes + 1, sizeof *idx);
  for (int i = 0; i < m->nnodes; i++) idx[i] = -1;
  for (int k = 0; k < nold; k++) idx[old[k]->id] = k; /* (ids follow m's order) */
  for (int i = m->nnodes - 1, next = nold; i >= 0; i--)
    at[i] = idx[i] >= 0 ? (next = idx[i]) : next;
  for (int k = 0; k < nold; k++) last[k] = -1;
  for (int i = 0; i < m->nnodes; i++)
    for (int j = 0; j < m->nodes[i]->ninputs; j++) {
      int x = idx[m->nodes[i]->inputs[j]->id];
      if (x >= 0 && at[i] > last[x]) last[x] = at[i];
    }
  free(at);
  free(idx);
}

/* attn_layout's candidates (passes/attn_layout.c's rules, read again here):
 * sdpa read by merge_heads and sdpa_lse only; six-operand sdpa_grad with a
 * split_heads dy; six-operand sdpa_grad read by three slices along 1, each by
 * a merge_heads, all by one concat along the last axis in dq, dk, dv order;
 * sdpa whose q, k, v are split_heads of slices (each read once) of one tensor,
 * along its last axis, in q|k|v order, read by it and six-operand sdpa_grads
 * (in the same operand) only.  Returns their count; *gone: the nodes their
 * rewrites remove, less the reshapes they add. */
static int attn_copies(const IrModule *m, int *gone) {
  int *readers = calloc((size_t)m->nnodes + 1, sizeof *readers), n = 0;
  for (int i = 0; i < m->nnodes; i++)
    for (int j = 0; j < m->nodes[i]->ninputs; j++) readers[m->nodes[i]->inputs[j]->id]++;
  *gone = 0;
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *x = m->nodes[i];
    if (x->op == IR_OP_ATTENTION && !(x->ia[1] & IR_SDPA_QKV_TOKENS)) {
      const int64_t H = x->inputs[0]->shape[1], KV = x->inputs[1]->shape[1];
      const int64_t hd = x->inputs[0]->shape[3];
      const IrNode *p = NULL;
      int ok = 1;
      for (int j = 0; j < 3 && ok; j++) {
        const IrNode *sh = x->inputs[j], *s = sh->inputs[0];
        ok = sh->op == IR_OP_SPLIT_HEADS && s->op == IR_OP_SLICE && readers[s->id] == 1 &&
             s->ia[0] == 2 && s->ia[1] == (j == 0 ? 0 : j == 1 ? H : H + KV) * hd &&
             s->ia[2] == (j ? KV : H) * hd && (!p || s->inputs[0] == p);
        p = s->inputs[0];
        for (int r = 0; r < m->nnodes && ok; r++)
          for (int k = 0; k < m->nodes[r]->ninputs; k++)
            if (m->nodes[r]->inputs[k] == sh && m->nodes[r] != x)
              ok &= m->nodes[r]->op == IR_OP_ATTENTION_GRAD && m->nodes[r]->ninputs == 6 && k == j;
      }
      if (ok) n++, *gone += 5; /* 3 slices, 3 split_heads; 1 reshape */
    }
    if (x->op == IR_OP_ATTENTION && !(x->ia[1] & IR_SDPA_OUT_TOKENS)) {
      int merges = 0, other = 0;
      for (int r = i + 1; r < m->nnodes; r++)
        for (int j = 0; j < m->nodes[r]->ninputs; j++)
          if (m->nodes[r]->inputs[j] == x) {
            merges += m->nodes[r]->op == IR_OP_MERGE_HEADS;
            other += m->nodes[r]->op != IR_OP_MERGE_HEADS &&
                     m->nodes[r]->op != IR_OP_ATTENTION_LSE;
          }
      if (merges && !other) n++, *gone += merges;
    }
    if (x->op != IR_OP_ATTENTION_GRAD || x->ninputs != 6) continue;
    if (!(x->ia[1] & IR_SDPA_DY_TOKENS) && x->inputs[3]->op == IR_OP_SPLIT_HEADS)
      n++, *gone += readers[x->inputs[3]->id] == 1;
    if (x->ia[1] & IR_SDPA_OUT_TOKENS || readers[i] != 3) continue;
    const int64_t H = ir_sdpa_dims(x).H, KV = ir_sdpa_dims(x).KV;
    const IrNode *cat = NULL;
    int ok = 1, cuts = 0;
    for (int r = i + 1; r < m->nnodes; r++) {
      const IrNode *s = m->nodes[r];
      if (s->ninputs < 1 || s->inputs[0] != x) continue;
      const IrNode *mh = NULL, *c = NULL;
      for (int u = r + 1; u < m->nnodes; u++)
        if (m->nodes[u]->op == IR_OP_MERGE_HEADS && m->nodes[u]->inputs[0] == s) mh = m->nodes[u];
      for (int u = mh ? mh->id + 1 : m->nnodes; u < m->nnodes; u++)
        if (m->nodes[u]->op == IR_OP_CONCAT)
          for (int j = 0; j < m->nodes[u]->ninputs; j++)
            if (m->nodes[u]->inputs[j] == mh) c = m->nodes[u];
      int k = -1;
      for (int j = 0; c && j < c->ninputs; j++)
        if (c->inputs[j] == mh) k = j;
      const int64_t start = k == 0 ? 0 : k == 1 ? H : H + KV, len = k == 0 ? H : KV;
      ok &= s->op == IR_OP_SLICE && s->ia[0] == 1 && readers[s->id] == 1 && mh &&
            readers[mh->id] == 1 && c && c->ninputs == 3 && c->ia[0] == c->rank - 1 &&
            (!cat || c == cat) && s->ia[1] == start && s->ia[2] == len;
      cat = c;
      cuts++;
    }
    if (ok && cat && cuts == 3) n++, *gone += 7;
  }
  free(readers);
  return n;
}

static uint64_t rng = 88172645463325252ull;
static double uniform(double lo, double hi) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return lo + (hi - lo) * (double)(rng >> 11) / 9007199254740992.0;
}

static const IrNode *named(const IrModule *m, const char *name) {
  for (int i = 0; i < m->nnodes; i++)
    if (m->nodes[i]->name && !strcmp(m->nodes[i]->name, name)) return m->nodes[i];
  return NULL;
}

/* Fills it's leaves as the seed says: parameters by their init, ids in [0, 16). */
static void fill(IrInterp *it, uint64_t seed) {
  const IrModule *m = it->m;
  rng = seed;
  for (int k = 0; k < m->nnodes; k++) { /* leaves in id order: the same in both modules */
    const IrNode *n = m->nodes[k];
    if (n->op == IR_OP_INPUT && n->dtype == IR_I32)
      for (int64_t e = 0; e < ir_numel(n); e++) it->i[k][e] = (int32_t)uniform(0, 16);
    if (n->op != IR_OP_PARAM) continue;
    for (int64_t e = 0; e < ir_numel(n); e++)
      it->f[k][e] = n->init == IR_INIT_ONES    ? 1
                    : n->init == IR_INIT_ZEROS ? uniform(-0.1, 0.1)
                                               : n->init_std * sqrt(3) * uniform(-1, 1);
  }
}

int main(int argc, char **argv) {
  const char *pass = argc >= 2 ? argv[1] : "";
  int sink = !strcmp(pass, "slice_sink"), lay = !strcmp(pass, "attn_layout");
  int act = !strcmp(pass, "remat_act"), after_act = !strcmp(pass, "remat_after_act");
  int remat = after_act || !strcmp(pass, "remat"), layer = !strcmp(pass, "remat_layer");
  int gelu_after_act = !strcmp(pass, "gelu_epilogue_after_act");
  int gelu_after_layer = !strcmp(pass, "gelu_epilogue_after_layer");
  int gelu = gelu_after_act || gelu_after_layer || !strcmp(pass, "gelu_epilogue");
  if (argc < 4 || (!sink && !lay && !act && !remat && !layer && !gelu)) {
    fprintf(stderr, "usage: rewrite_test slice_sink|remat|remat_after_act|remat_act|remat_layer|"
            "attn_layout|gelu_epilogue[_after_act|_after_layer] MODEL.dsl MIN [NAME=VALUE ...]\n");
    return 2;
  }
  const char *const *defs = (const char *const *)argv + 4;
  IrModule *m = test_load_step(argv[2], defs, argc - 4);
  IrModule *ref = test_load_step(argv[2], defs, argc - 4);
  if (!m || !ref) return 1;
  /* attn_layout's backward rewrites need sdpa_grad from lse and D: both modules
   * first run attn_delta (its own bits are tests/passes' and the trainers') */
  if (lay && (pass_attn_delta(m) || pass_attn_delta(ref))) return 1;
  /* remat_after_act: both modules first recompute the pointwise values
   * (--recompute pointwise), whose copies read remat's candidates in the
   * backward beside their old readers, in other kernels */
  if ((after_act || gelu_after_act) && (pass_remat_act(m) || pass_remat_act(ref))) return 1;
  if (gelu_after_layer && (pass_remat_layer(m) || pass_remat_layer(ref))) return 1;
  int before = m->nnodes, slices, cut, gone = 0, copies = 0, placed = 0;
  /* gelu_epilogue: the GELU gradients it places (none in fp32), the others remat copies */
  int ops = sink ? sliced_only(m, &slices, &cut) : lay ? attn_copies(m, &gone)
            : act ? act_candidates(m) : layer ? layer_readers(m)
            : gelu ? (machine_bf16(m) ? gelu_inputs(m, &placed) : 0)
                   : rematerializable(m, &copies);
  if (gelu) rematerializable(m, &copies);
  int want = sink ? before - ops + cut : lay ? before - gone
             : before + (remat || gelu ? copies : ops);
  IrNode **old = malloc(sizeof *old * (size_t)before);
  int *last0 = malloc(sizeof(int) * (size_t)before);
  int *last1 = malloc(sizeof(int) * (size_t)before);
  memcpy(old, m->nodes, sizeof *old * (size_t)before);
  last_reads(m, old, before, last0);
  char why[512] = "";
  int rc = sink ? pass_slice_sink(m) : lay ? pass_attn_layout(m) : act ? pass_remat_act(m)
           : layer ? pass_remat_layer(m) : gelu ? pass_gelu_epilogue(m) || pass_remat(m)
                                                : pass_remat(m);
  if (rc || ir_verify(m, why, sizeof why)) {
    printf("FAIL: %s: %s\n", argv[1], why);
    return 1;
  }
  int left = sink ? sliced_only(m, &slices, &cut) : lay ? attn_copies(m, &gone)
             : act ? act_candidates(m) : layer ? layer_readers(m)
             : gelu ? ops - (gelu_inputs(m, &placed), placed) + rematerializable(m, &copies)
                    : rematerializable(m, &copies);
  if (layer) { /* every such layer's forward copied: the copies the pass counts */
    want = before + m->remat_layer_nodes;
    expect(m->remat_layers == ops, "m->remat_layers is not the layers read by their backward");
  }
  char msg[256];
  if (act) { /* nothing read later than before; the count the report shows */
    last_reads(m, old, before, last1);
    for (int k = 0; k < before; k++)
      if (last1[k] > last0[k]) {
        snprintf(msg, sizeof msg, "node %%%d (%s) last read at %d, before at %d", k,
                 ir_op_info[old[k]->op].name, last1[k], last0[k]);
        expect(0, msg);
      }
    expect(m->remat_act == ops, "m->remat_act is not the copies made");
  }
  if (remat) /* a copy per backward reader, each computed inside its reader's kernel */
    printf("%d copies, each read once\n", copies_one_reader(m, old, before));
  free(old), free(last0), free(last1);
  snprintf(msg, sizeof msg, "%d left to rewrite after %s", left, argv[1]);
  expect(left == 0, msg);
  snprintf(msg, sizeof msg, "%d to rewrite, at least %s wanted", ops, argv[3]);
  expect(ops >= atoi(argv[3]), msg);
  snprintf(msg, sizeof msg, "%d nodes after, %d expected (%d before)", m->nnodes, want, before);
  expect(m->nnodes == want, msg);
  printf("%s %s: %d rewritten; %d -> %d nodes\n", argv[1], argv[2], ops, before, m->nnodes);

  IrInterp *a = ir_interp_new(ref), *b = ir_interp_new(m);
  fill(a, 7), fill(b, 7);
  const IrNode *lra = named(ref, "lr"), *lrb = named(m, "lr");
  const IrNode *sta = named(ref, "step"), *stb = named(m, "step");
  expect(lra && lrb && sta && stb, "lr and step inputs");
  for (int t = 0; t < 2 && lra && lrb && sta && stb; t++) {
    a->f[lra->id][0] = b->f[lrb->id][0] = 1e-2;
    a->f[sta->id][0] = b->f[stb->id][0] = t + 1;
    if (ir_interp_run(a, 0, ref->nnodes, why, sizeof why) ||
        ir_interp_run(b, 0, m->nnodes, why, sizeof why)) {
      printf("FAIL: interpreter: %s\n", why);
      return 1;
    }
    double la = a->f[ref->loss->id][0], lb = b->f[m->loss->id][0];
    printf("step %d: loss %.17g rewritten %.17g\n", t + 1, la, lb);
    expect(memcmp(&la, &lb, sizeof la) == 0, "the loss differs");
    expect(ref->nupdates == m->nupdates, "the updates differ in number");
    for (int u = 0; u < ref->nupdates && u < m->nupdates; u++) {
      const IrNode *x = ref->updates[u].value, *y = m->updates[u].value;
      int same = ir_numel(x) == ir_numel(y) &&
                 !memcmp(a->f[x->id], b->f[y->id], sizeof(double) * (size_t)ir_numel(x));
      if (!same) {
        snprintf(msg, sizeof msg, "step %d: the update of %s differs", t + 1,
                 ref->updates[u].leaf->name);
        expect(0, msg);
      }
    }
    ir_interp_end_step(a);
    ir_interp_end_step(b);
  }
  ir_interp_free(a);
  ir_interp_free(b);
  ir_module_free(m);
  ir_module_free(ref);
  if (!fails) printf("PASS\n");
  return fails != 0;
}
