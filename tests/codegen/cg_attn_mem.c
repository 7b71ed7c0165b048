/* tests/codegen/cg_attn_mem.c -- with passes/attn_delta.c, sdpa's out dies in
 * the forward and the trainer's arena shrinks.
 *
 *   cg_attn_mem MODEL.dsl [NAME=VALUE ...]
 *
 * The model is loaded twice as the driver does and differentiated; one copy
 * then runs pass_attn_delta, the other not (the plan of parc --keep-attn-out);
 * both get their optimizer and are planned as codegen/project.c plans them.
 * Requires:
 *   - every sdpa_grad of the rewritten module reads lse and D (the models'
 *     attention output goes through merge_heads), every sdpa_lse is forward
 *     and every sdpa_delta has the phase of its sdpa_grad;
 *   - in its plan (sound: bufplan_check) every sdpa's buffer dies in the
 *     forward: its last reader is a forward node;
 *   - the arena (cg_plan_arena: the report's figure) is smaller than the
 *     other module's, whose sdpa buffers live into the backward.
 * Prints both arenas and the bytes of the sdpa outputs. */
#include <stdio.h>
#include <stdlib.h>

#include "codegen/arena_plan.h"
#include "codegen/cg_kernels.h"
#include "codegen/host.h"
#include "passes/bufplan.h"
#include "passes/passes.h"
#include "tests/support/load.h"

static IrModule *load(int argc, char **argv, int rewrite) {
  IrModule *m = test_load(argv[1], (const char *const *)argv + 2, argc - 2);
  char err[512];
  if (!m || pass_autodiff(m) || (rewrite && pass_attn_delta(m)) || pass_optimizer(m) ||
      ir_verify(m, err, sizeof err)) {
    printf("FAIL: %s does not compile\n", argv[1]);
    exit(1);
  }
  return m;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: cg_attn_mem MODEL.dsl [NAME=VALUE ...]\n");
    return 2;
  }
  IrModule *m = load(argc, argv, 1), *keep = load(argc, argv, 0);
  int fails = 0, nsdpa = 0, nstats = 0, nold = 0;
  char err[512];
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *n = m->nodes[i];
    nsdpa += n->op == IR_OP_ATTENTION;
    if (n->op == IR_OP_ATTENTION_GRAD) {
      if (n->ninputs != 6) {
        printf("FAIL: %%%d sdpa_grad reads sdpa %%%d, not lse and D\n", i, n->inputs[4]->id);
        fails++;
        continue;
      }
      nstats++;
      if (n->inputs[4]->op != IR_OP_ATTENTION_LSE || n->inputs[4]->phase != IR_PHASE_FWD ||
          n->inputs[5]->op != IR_OP_ATTENTION_DELTA || n->inputs[5]->phase != n->phase) {
        printf("FAIL: %%%d sdpa_grad's lse %%%d or D %%%d is not sdpa_lse (forward) or "
               "sdpa_delta (its phase)\n", i, n->inputs[4]->id, n->inputs[5]->id);
        fails++;
      }
    }
  }
  for (int i = 0; i < keep->nnodes; i++)
    nold += keep->nodes[i]->op == IR_OP_ATTENTION_GRAD && keep->nodes[i]->ninputs == 5;
  if (!nsdpa || nstats != nsdpa || nold != nsdpa) {
    printf("FAIL: %d sdpa, %d sdpa_grad from lse and D (%d from out without the pass)\n", nsdpa,
           nstats, nold);
    fails++;
  }

  /* the plan as codegen/project.c makes it */
  CgKernelPlan kp;
  BufPlan bp;
  int *pos;
  if (cg_plan_step(m, 1, NULL, &kp, &pos, &bp, NULL, err, sizeof err)) {
    printf("FAIL: the step's plan: %s\n", err);
    return 1;
  }
  if (bufplan_check(m, &bp, pos, err, sizeof err)) {
    printf("FAIL: the plan: %s\n", err);
    fails++;
  }
  int64_t outs = 0;
  for (int i = 0; i < m->nnodes; i++) {
    if (m->nodes[i]->op != IR_OP_ATTENTION) continue;
    outs += bp.size[i];
    int last = bp.last_use[i];
    if (last < 0 || last >= m->nnodes || m->nodes[last]->phase != IR_PHASE_FWD) {
      printf("FAIL: sdpa %%%d is last read at position %d, %s\n", i, last,
             last >= 0 && last < m->nnodes ? ir_phase_name[m->nodes[last]->phase] : "none");
      fails++;
    }
  }
  cg_plan_free(&kp);

  int64_t now = 0, before = 0;
  if (cg_plan_arena(m, 1, NULL, &now, NULL, 0, NULL, 0, 1, NULL, err, sizeof err) ||
      cg_plan_arena(keep, 1, NULL, &before, NULL, 0, NULL, 0, 1, NULL, err, sizeof err)) {
    printf("FAIL: arena plan: %s\n", err);
    return 1;
  }
  if (now >= before) {
    printf("FAIL: arena %lld bytes with attn_delta, %lld without\n", (long long)now,
           (long long)before);
    fails++;
  }
  printf("%s %s: arena %lld bytes with attn_delta, %lld without (-%lld; %d sdpa, out and lse "
         "%lld bytes in all)\n", fails ? "FAIL" : "ok  ", m->name, (long long)now,
         (long long)before, (long long)(before - now), nsdpa, (long long)outs);
  ir_module_free(m);
  ir_module_free(keep);
  return fails != 0;
}
