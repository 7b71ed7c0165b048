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

  printf("%d passed, %d failed\n", checks - failures, failures);
  return failures != 0;
}
