/* tests/codegen/cg_inplace.c -- the trainer's buffer plan writes dlogits over
 * the logits, and the weight gradient's reshape of them is a view
 * (passes/bufplan.h, In place).
 *
 *   cg_inplace MODEL.dsl [NAME=VALUE ...]
 *
 * The model is loaded as the driver does, differentiated, given its
 * optimizer and planned as codegen/project.c plans it (fused kernels, their
 * roots' positions, bufplan_build_views with the kernel plan's views).  The
 * test plans the same buffers again with no node written over another
 * (bufplan_build_apart) and requires, for a model whose logits dominate (a
 * large vocabulary):
 *   - the plan is sound (bufplan_check);
 *   - every cross_entropy_grad (or its vocabulary-parallel form) is written
 *     over its logits, and every reshape of its result that codegen marks as
 *     a view is written over it and runs no kernel;
 *   - every other reshape marked as a view of a value with a buffer of its
 *     size shares that buffer and runs no kernel, some of them while the
 *     value is read after them (Shared views);
 *   - the arena, and the most bytes live at once, are smaller than apart
 *     (both computed here; with no alias the two plans are one), and
 *     cg_plan_arena (the report's figure) is the in-place one.
 * Prints both arenas and the logits' bytes.  Fails if the aliasing stops
 * happening. */
#include <stdio.h>
#include <stdlib.h>

#include "codegen/arena_plan.h"
#include "codegen/cg_kernels.h"
#include "codegen/host.h"
#include "passes/bufplan.h"
#include "passes/passes.h"
#include "tests/support/load.h"

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: cg_inplace MODEL.dsl [NAME=VALUE ...]\n");
    return 2;
  }
  IrModule *m = test_load_step(argv[1], (const char *const *)argv + 2, argc - 2);
  char err[512];
  if (!m) return 1;
  CgKernelPlan kp;
  BufPlan bp, ap;
  int *pos, *held;
  if (cg_plan_step(m, 1, NULL, &kp, &pos, &bp, &held, err, sizeof err)) {
    printf("FAIL: the step's plan: %s\n", err);
    return 1;
  }
  bufplan_build_apart(m, kp.materialize, cg_results(m), pos, held, NULL, &ap);
  free(held);
  int fails = 0, grads = 0, views = 0;
  int64_t logits = 0;
  if (bufplan_check(m, &bp, pos, err, sizeof err)) {
    printf("FAIL: the plan: %s\n", err);
    fails++;
  }
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *g = m->nodes[i];
    if (g->op != IR_OP_CROSS_ENTROPY_GRAD && g->op != IR_OP_VOCAB_CROSS_ENTROPY_GRAD) continue;
    const IrNode *x = g->inputs[0];
    grads++;
    if (bp.size[x->id] > logits) logits = bp.size[x->id];
    if (bp.alias[i] != x->id) {
      printf("FAIL: %%%d %s is not written over its logits %%%d\n", i, ir_op_info[g->op].name,
             x->id);
      fails++;
    }
    for (int r = 0; r < m->nnodes; r++) {
      if (m->nodes[r]->op != IR_OP_RESHAPE || m->nodes[r]->inputs[0] != g || kp.view_of[r] != i)
        continue;
      views++;
      if (bp.alias[r] != i || !cg_kernel_is_view(&kp, &bp, kp.kernel_of[r])) {
        printf("FAIL: reshape %%%d of %%%d is not a view\n", r, i);
        fails++;
      }
    }
  }
  /* Shared views: every reshape codegen marks as a view of a value with a
   * buffer of its size, written earlier, runs no kernel, even where that
   * value is read after it (a residual gradient reshaped for a weight
   * gradient's GEMM) */
  int shared = 0;
  for (int r = 0; r < m->nnodes; r++) {
    int x = kp.view_of[r];
    if (x < 0 || bp.offset[r] < 0 || bp.offset[x] < 0 || bp.size[x] != bp.size[r] ||
        pos[x] >= pos[r])
      continue;
    if (bp.alias[r] != x || !cg_kernel_is_view(&kp, &bp, kp.kernel_of[r])) {
      printf("FAIL: reshape %%%d of %%%d copies it\n", r, x);
      fails++;
    }
    shared += bp.last_use[x] > pos[r];
  }
  if (!shared) {
    printf("FAIL: no view shares bytes with a value read after it: nothing to test\n");
    fails++;
  }
  if (!grads || !views) {
    printf("FAIL: %d cross-entropy gradients, %d views of them: nothing to test\n", grads, views);
    fails++;
  }
  int64_t now = cg_arena_bytes(&kp, &bp, NULL), apart = cg_arena_bytes(&kp, &ap, NULL), rep = 0;
  /* without an alias the two plans are the same plan: equal arenas */
  if (now >= apart || bp.live_peak >= ap.live_peak) {
    printf("FAIL: arena %lld in place, %lld apart; live peak %lld, %lld apart\n",
           (long long)now, (long long)apart, (long long)bp.live_peak, (long long)ap.live_peak);
    fails++;
  }
  cg_plan_free(&kp);
  if (cg_plan_arena(m, 1, NULL, &rep, NULL, 0, NULL, 0, 1, NULL, err, sizeof err) || rep != now) {
    printf("FAIL: the report's arena %lld is not the plan's %lld\n", (long long)rep,
           (long long)now);
    fails++;
  }
  printf("%s %s: arena %lld bytes in place, %lld apart (logits %lld bytes; %d gradient%s, %d "
         "view%s written over; %d shared view%s)\n", fails ? "FAIL" : "ok  ", m->name,
         (long long)now, (long long)apart, (long long)logits, grads, grads == 1 ? "" : "s", views,
         views == 1 ? "" : "s", shared, shared == 1 ? "" : "s");
  ir_module_free(m);
  return fails != 0;
}
