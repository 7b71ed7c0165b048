/* tests/ir/verify_test.c -- the verifier accepts a sound module and names
 * the broken invariant in each corrupted copy. */
#include <stdio.h>
#include <string.h>

#include "ir/ir.h"

static int failures;

static IrNode *leaf(IrModule *m, IrOp op, const char *name, IrDType dt, int rank,
                    const int64_t *shape) {
  IrNode *n = ir_add(m, op, NULL, 0);
  n->name = name;
  n->dtype = dt;
  n->rank = rank;
  memcpy(n->shape, shape, sizeof(int64_t) * (size_t)rank);
  n->shard_dim = -1;
  return n;
}

/* A module of q [2, 4, 8, 16], k, v [2, 2, 8, 16], dm [2, 8, 64] and y =
 * sdpa(q, k, v) causal scale 0.25 (untyped): x[0..4] = q, k, v, dm, y. */
static IrModule *attn_module(IrNode *x[5]) {
  IrModule *m = ir_module_new("t");
  int64_t s4[4] = {2, 4, 8, 16}, kv4[4] = {2, 2, 8, 16}, s3[3] = {2, 8, 64};
  x[0] = leaf(m, IR_OP_INPUT, "q", IR_F32, 4, s4);
  x[1] = leaf(m, IR_OP_INPUT, "k", IR_F32, 4, kv4);
  x[2] = leaf(m, IR_OP_INPUT, "v", IR_F32, 4, kv4);
  x[3] = leaf(m, IR_OP_INPUT, "dm", IR_F32, 3, s3);
  x[4] = ir_add(m, IR_OP_ATTENTION, x, 3);
  x[4]->ia[0] = 1, x[4]->fa = 0.25;
  return m;
}

static IrNode *node(IrModule *m, IrOp op, IrNode *a, IrNode *b) {
  IrNode *in[2] = {a, b};
  IrNode *n = ir_add(m, op, in, b ? 2 : 1);
  char why[256];
  if (!ir_infer(n, why, sizeof why)) {
    printf("FAIL building: %s\n", why);
    failures++;
  }
  return n;
}

/* A small sound module: loss = cross_entropy(x @ w, t). */
static IrModule *build(IrNode **mm) {
  IrModule *m = ir_module_new("t");
  IrNode *x = leaf(m, IR_OP_INPUT, "x", IR_F32, 2, (int64_t[]){4, 3});
  IrNode *t = leaf(m, IR_OP_INPUT, "t", IR_I32, 1, (int64_t[]){4});
  IrNode *w = leaf(m, IR_OP_PARAM, "w", IR_F32, 2, (int64_t[]){3, 5});
  *mm = node(m, IR_OP_MATMUL, x, w);
  m->loss = node(m, IR_OP_CROSS_ENTROPY, *mm, t);
  return m;
}

static void expect(const char *what, IrModule *m, const char *needle) {
  char why[512] = "";
  int rc = ir_verify(m, why, sizeof why);
  int ok = needle ? rc != 0 && strstr(why, needle) : rc == 0;
  if (!ok) {
    printf("FAIL %s: verify returned %d (%s), expected %s\n", what, rc, why,
           needle ? needle : "success");
    failures++;
  }
  ir_module_free(m);
}

int main(void) {
  IrNode *mm;
  int checks = 0;
  IrModule *m = build(&mm);
  expect("sound module", m, NULL), checks++;

  m = build(&mm);
  mm->shape[1] = 6;
  expect("stale shape", m, "stored type differs"), checks++;

  m = build(&mm);
  mm->shape[0] = 0;
  expect("zero dimension", m, "dimension out of range"), checks++;

  m = build(&mm);
  m->nodes[2]->name = "x";
  expect("duplicate name", m, "duplicate name"), checks++;

  m = build(&mm);
  m->nodes[2]->name = NULL;
  expect("unnamed parameter", m, "without a name"), checks++;

  m = build(&mm);
  IrNode *tmp = m->nodes[3];
  m->nodes[3] = m->nodes[4], m->nodes[4] = tmp;
  m->nodes[3]->id = 3, m->nodes[4]->id = 4;
  expect("order", m, "not an earlier node"), checks++;

  m = build(&mm);
  m->nodes[1]->id = 7;
  expect("id", m, "id does not match"), checks++;

  m = build(&mm);
  m->loss = mm;
  expect("non-scalar loss", m, "loss is not a scalar"), checks++;

  m = build(&mm);
  mm->inputs[1] = m->nodes[1]; /* matmul of f32 by an i32 input */
  expect("operand type", m, "must be f32"), checks++;

  /* sdpa_grad's fifth operand is the sdpa of its q, k, v (its buffer holds lse
   * after out: B H T extra floats, none for other ops) */
  for (int bad = 0; bad < 3; bad++) {
    m = ir_module_new("t");
    int64_t s4[4] = {2, 4, 8, 16}, kv4[4] = {2, 2, 8, 16};
    IrNode *q = leaf(m, IR_OP_INPUT, "q", IR_F32, 4, s4);
    IrNode *k = leaf(m, IR_OP_INPUT, "k", IR_F32, 4, kv4);
    IrNode *v = leaf(m, IR_OP_INPUT, "v", IR_F32, 4, kv4);
    IrNode *dy = leaf(m, IR_OP_INPUT, "dy", IR_F32, 4, s4);
    IrNode *y = ir_add(m, IR_OP_ATTENTION, (IrNode *[]){q, k, v}, 3);
    y->ia[0] = 1, y->fa = 0.25;
    IrNode *other = ir_add(m, IR_OP_ATTENTION, (IrNode *[]){q, v, k}, 3);
    other->ia[0] = 1, other->fa = 0.25;
    char why[256];
    checks++;
    if (!ir_infer(y, why, sizeof why) || !ir_infer(other, why, sizeof why) ||
        ir_aux_numel(y) != 2 * 4 * 8 || ir_buf_numel(y) != 2 * 4 * 8 * 17 || ir_aux_numel(q))
      printf("FAIL sdpa's lse: aux %lld\n", (long long)ir_aux_numel(y)), failures++;
    IrNode *g = ir_add(m, IR_OP_ATTENTION_GRAD,
                       (IrNode *[]){q, k, v, dy, bad == 1 ? other : bad == 2 ? dy : y}, 5);
    g->ia[0] = 1, g->fa = 0.25;
    g->dtype = IR_F32, g->rank = 4;
    memcpy(g->shape, (int64_t[]){2, 8, 8, 16}, sizeof(int64_t) * 4);
    expect(bad ? "sdpa_grad of another sdpa" : "sdpa_grad", m,
           bad ? "fifth operand must be the sdpa of q, k, v" : NULL), checks++;
  }

  /* the six-operand sdpa_grad (q, k, v, dy, lse, d): lse and d [B, H, T];
   * sdpa_lse reads an sdpa; sdpa_delta's width splits into its heads */
  for (int bad = 0; bad < 5; bad++) {
    IrNode *x[5];
    m = attn_module(x);
    int64_t s4[4] = {2, 4, 8, 16};
    IrNode *q = x[0], *k = x[1], *v = x[2], *dm = x[3], *y = x[4];
    IrNode *mh = ir_add(m, IR_OP_MERGE_HEADS, &y, 1);
    IrNode *dy = ir_add(m, IR_OP_SPLIT_HEADS, &dm, 1);
    dy->ia[0] = 4;
    IrNode *lse = ir_add(m, IR_OP_ATTENTION_LSE, bad == 2 ? &mh : &y, 1);
    IrNode *d = ir_add(m, IR_OP_ATTENTION_DELTA, (IrNode *[]){mh, dm}, 2);
    d->ia[0] = bad == 3 ? 5 : 4;
    char why[256];
    int typed = ir_infer(y, why, sizeof why) && ir_infer(mh, why, sizeof why) &&
                ir_infer(dy, why, sizeof why);
    if (!typed) printf("FAIL sdpa_lse/sdpa_delta setup: %s\n", why), failures++;
    ir_infer(lse, why, sizeof why), ir_infer(d, why, sizeof why);
    if (bad == 2) lse->dtype = IR_F32, lse->rank = 3, memcpy(lse->shape, s4, 3 * sizeof(int64_t));
    if (bad == 3) d->dtype = IR_F32, d->rank = 3, memcpy(d->shape, s4, 3 * sizeof(int64_t));
    IrNode *in[6] = {q, k, v, dy, bad == 1 ? dm : lse, d};
    IrNode *g = ir_add(m, IR_OP_ATTENTION_GRAD, in, bad == 4 ? 4 : 6);
    g->ia[0] = 1, g->fa = 0.25;
    g->dtype = IR_F32, g->rank = 4;
    memcpy(g->shape, (int64_t[]){2, 8, 8, 16}, sizeof(int64_t) * 4);
    static const char *const what[5] = {"sdpa_grad from lse and d", "sdpa_grad's lse shape",
                                        "sdpa_lse of a non-sdpa", "sdpa_delta heads",
                                        "sdpa_grad of 4 operands"};
    static const char *const needle[5] = {NULL, "lse f32[2, 8, 64] is not [batch, heads, seq]",
                                          "needs an sdpa result", "not divisible by 5 heads",
                                          "takes 5 operands"};
    expect(what[bad], m, needle[bad]), checks++;
  }

  /* layout bits (IR_SDPA_*, passes/attn_layout.c): a token-major sdpa is
   * [B, T, H hd] and keeps its lse; a token-major sdpa_grad reads dy as
   * [B, T, H hd] and is [B, T, (H + 2 KV) hd]; unknown bits, a head-major dy
   * under DY_TOKENS and the five-operand form with a layout are refused */
  for (int bad = 0; bad < 4; bad++) {
    IrNode *x[5];
    m = attn_module(x);
    int64_t s4[4] = {2, 4, 8, 16}, s3[3] = {2, 8, 64};
    IrNode *q = x[0], *k = x[1], *v = x[2], *dm = x[3], *y = x[4];
    IrNode *dh = leaf(m, IR_OP_INPUT, "dh", IR_F32, 4, s4);
    y->ia[1] = bad == 1 ? 8 : IR_SDPA_OUT_TOKENS;
    IrNode *lse = ir_add(m, IR_OP_ATTENTION_LSE, &y, 1);
    IrNode *d = ir_add(m, IR_OP_ATTENTION_DELTA, (IrNode *[]){dm, dm}, 2);
    d->ia[0] = 4;
    char why[256];
    if (bad == 1) { /* the type a valid layout would give */
      y->dtype = IR_F32, y->rank = 3, memcpy(y->shape, s3, sizeof s3);
    } else if (!ir_infer(y, why, sizeof why) || y->rank != 3 ||
               memcmp(y->shape, s3, sizeof s3) || ir_aux_numel(y) != 2 * 4 * 8) {
      printf("FAIL token-major sdpa: %s\n", why), failures++;
    }
    if (!ir_infer(lse, why, sizeof why) || !ir_infer(d, why, sizeof why))
      printf("FAIL token-major sdpa_lse: %s\n", why), failures++;
    IrNode *in[6] = {q, k, v, bad == 2 ? dh : dm, lse, d};
    IrNode *g = ir_add(m, IR_OP_ATTENTION_GRAD, in, 6);
    if (bad == 3) g->inputs[4] = y, g->ninputs = 5;
    g->ia[0] = 1, g->ia[1] = IR_SDPA_OUT_TOKENS | IR_SDPA_DY_TOKENS, g->fa = 0.25;
    g->dtype = IR_F32, g->rank = 3;
    memcpy(g->shape, (int64_t[]){2, 8, 128}, sizeof(int64_t) * 3);
    static const char *const what[4] = {"token-major sdpa and sdpa_grad", "unknown layout bits",
                                        "head-major dy under DY_TOKENS",
                                        "five-operand sdpa_grad with a layout"};
    static const char *const needle[4] = {NULL, "layout bits 8 not understood",
                                          "token-major dy f32[2, 4, 8, 16] is not",
                                          "five-operand form reads the sdpa's out head-major"};
    expect(what[bad], m, needle[bad]), checks++;
  }

  /* packed q|k|v (IR_SDPA_QKV_TOKENS, KV in ia[2]): sdpa and sdpa_grad read
   * one [B, T, H + 2 KV, hd] given three times; refused: two different
   * operands, kv heads that leave no multiple as query heads, kv heads
   * without the bit */
  for (int bad = 0; bad < 4; bad++) {
    IrModule *pm = ir_module_new("t");
    int64_t sp[4] = {2, 8, 8, 16}, s3[3] = {2, 8, 64}, bht[3] = {2, 4, 8};
    IrNode *p = leaf(pm, IR_OP_INPUT, "qkv", IR_F32, 4, sp); /* H 4, KV 2 */
    IrNode *o = leaf(pm, IR_OP_INPUT, "other", IR_F32, 4, sp);
    IrNode *dm = leaf(pm, IR_OP_INPUT, "dm", IR_F32, 3, s3);
    IrNode *st = leaf(pm, IR_OP_INPUT, "st", IR_F32, 3, bht);
    IrNode *y = ir_add(pm, IR_OP_ATTENTION, (IrNode *[]){p, p, bad == 1 ? o : p}, 3);
    y->ia[0] = 1, y->ia[1] = bad == 3 ? 0 : IR_SDPA_QKV_TOKENS, y->ia[2] = bad == 2 ? 3 : 2;
    y->fa = 0.25;
    char why[256] = "";
    if (bad == 0 && (!ir_infer(y, why, sizeof why) || y->rank != 4 || y->shape[1] != 4 ||
                     y->shape[2] != 8 || y->shape[3] != 16 || ir_aux_numel(y) != 2 * 4 * 8))
      printf("FAIL packed sdpa: %s\n", why), failures++;
    if (bad) y->dtype = IR_F32, y->rank = 4, memcpy(y->shape, (int64_t[]){2, 4, 8, 16}, sizeof sp);
    IrNode *g = ir_add(pm, IR_OP_ATTENTION_GRAD, (IrNode *[]){p, p, p, dm, st, st}, 6);
    g->ia[0] = 1, g->ia[1] = IR_SDPA_QKV_TOKENS | IR_SDPA_OUT_TOKENS | IR_SDPA_DY_TOKENS;
    g->ia[2] = 2, g->fa = 0.25;
    if (!ir_infer(g, why, sizeof why) || g->rank != 3 || g->shape[1] != 8 || g->shape[2] != 128)
      printf("FAIL packed sdpa_grad: %s\n", why), failures++;
    static const char *const what[4] = {"packed sdpa and sdpa_grad", "packed q|k|v of two operands",
                                        "packed q|k|v of 3 kv heads", "kv heads without packing"};
    static const char *const needle[4] = {NULL, "one [batch, seq, heads, head_dim] operand",
                                          "3 kv heads leave no multiple", "kv heads 2 given"};
    expect(what[bad], pm, needle[bad]), checks++;
  }

  printf("%d passed, %d failed\n", checks - failures, failures);
  return failures != 0;
}
