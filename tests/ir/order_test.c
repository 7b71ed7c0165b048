/* tests/ir/order_test.c -- ir_insert_before puts each new node right before
 * its old node, keeps the new nodes' order within a place, puts place nold
 * at the end, and renumbers ids. */
#include <stdio.h>
#include <string.h>

#include "ir/ir.h"

static IrNode *named(IrModule *m, const char *name) {
  IrNode *n = ir_add(m, IR_OP_INPUT, NULL, 0);
  n->name = name;
  n->dtype = IR_F32;
  n->rank = 1;
  n->shape[0] = 1;
  n->shard_dim = -1;
  return n;
}

/* old nodes a b c; new nodes p..t placed as at[] says: the node names in
 * order, concatenated, against want */
static int check(const int *at, int nmade, const char *want) {
  IrModule *m = ir_module_new("t");
  const char *old[3] = {"a", "b", "c"}, *new[5] = {"p", "q", "r", "s", "t"};
  for (int i = 0; i < 3; i++) named(m, old[i]);
  IrNode *made[5];
  for (int c = 0; c < nmade; c++) made[c] = named(m, new[c]);
  ir_insert_before(m, 3, made, at, nmade);
  char got[16] = "";
  int ok = m->nnodes == 3 + nmade;
  for (int i = 0; i < m->nnodes; i++) {
    strncat(got, m->nodes[i]->name, 1);
    ok &= m->nodes[i]->id == i;
  }
  ok &= strcmp(got, want) == 0;
  if (!ok) printf("FAIL: got %s (%d nodes), want %s (ids renumbered?)\n", got, m->nnodes, want);
  ir_module_free(m);
  return ok;
}

int main(void) {
  int ok = 1;
  ok &= check((const int[]){1, 0, 1, 3, 1}, 5, "qaprtbcs"); /* stable, end */
  ok &= check((const int[]){2, 2, 0}, 3, "rabpqc");         /* places out of order */
  ok &= check((const int[]){0}, 0, "abc");                  /* nothing new */
  ok &= check((const int[]){3, 3}, 2, "abcpq");             /* all at the end */
  printf("%s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
