/* tests/codegen/cg_cuda_arena.c -- the GPU trainer's arena (codegen/cuda_arena.h):
 * the values the bf16 trainer stores as bf16 take 2 bytes an element.
 *
 *   cg_cuda_arena MODEL.dsl [NAME=VALUE ...]
 *
 * The model, through every pass as `parc -o` compiles it at one rank, is
 * planned as codegen/project.c plans it.  With the train section's precision
 * bf16 the plan must be the narrow one and smaller; every buffer's size is
 * worked out here from its node (2 bytes an element where stored bf16
 * densely, with an aux part only where the elements are even in number,
 * else 4; an aux part 4; aligned to BUFPLAN_ALIGN), and the plan must say
 * which (BufPlan.narrow, where the trainer looks for sdpa's lse); every node
 * keeps train.c's alias (In place, shared view) or none; bufplan_check holds
 * with the plan's positions; the report's figure (cg_plan_arena) is this
 * plan's arena.  In fp32, and for the bf16 store modes off and round, the
 * plan must be train.c's.  (The trainer's bits on this arena: the emulated
 * store checks, tests/cuda/trainer_emu.py.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/arena_plan.h"
#include "codegen/cg_kernels.h"
#include "codegen/cuda_arena.h"
#include "codegen/cuda_store.h"
#include "codegen/host.h"
#include "passes/bufplan.h"
#include "passes/machine.h"
#include "tests/support/load.h"

static int64_t aligned(int64_t bytes) {
  return (bytes + BUFPLAN_ALIGN - 1) / BUFPLAN_ALIGN * BUFPLAN_ALIGN;
}

/* The plan of mode's store against train.c's (fp32); the number of failures. */
static int check_mode(IrModule *m, CgKernelPlan *kp, const int *pos, const int *held,
                      const BufPlan *fp32, const int *canon, CgStoreMode mode, int64_t *gpu) {
  static const char *const names[] = {"bf16", "off", "round"};
  CgCudaStore store;
  cg_cuda_store_plan(m, kp, fp32, canon, machine_bf16(m), mode, NULL, &store);
  BufPlan g;
  int narrow = cg_cuda_arena_plan(m, kp, pos, held, fp32, &store, &g);
  int want = machine_bf16(m) && mode == CG_STORE_BF16, fails = 0;
  *gpu = cg_arena_bytes(kp, &g, NULL);
  if (narrow != want || (want && g.peak >= fp32->peak) || (!want && g.peak != fp32->peak)) {
    printf("FAIL: store %s: narrow %d (want %d), arena %lld against train.c's %lld\n",
           names[mode], narrow, want, (long long)g.peak, (long long)fp32->peak);
    return 1;
  }
  int halved = 0;
  for (int i = 0; i < m->nnodes && fails < 5; i++) {
    const IrNode *n = m->nodes[i];
    if ((g.offset[i] < 0) != (fp32->offset[i] < 0) || g.alias[i] != fp32->alias[i]) {
      printf("FAIL: store %s: node %%%d has alias %d, %d in train.c's plan\n", names[mode], i,
             g.alias[i], fp32->alias[i]);
      fails++;
    }
    if (g.offset[i] < 0) continue;
    int two = want && store.bf16[i] == 1 && (ir_aux_numel(n) == 0 || ir_numel(n) % 2 == 0);
    /* (a view of a value with an aux part, sdpa's out, takes that value's
     * bytes, the aux part included: bufplan.h) */
    const IrNode *own = n->op == IR_OP_RESHAPE && g.alias[i] >= 0 ? m->nodes[g.alias[i]] : n;
    int64_t size = aligned((two ? 2 : 4) * ir_numel(n) + 4 * ir_aux_numel(own));
    halved += two;
    if (want && !g.narrow[i] != !two) {
      printf("FAIL: store %s: node %%%d narrow %d in the plan, %d here\n", names[mode], i,
             g.narrow[i], two);
      fails++;
    }
    if (g.size[i] != size) {
      printf("FAIL: store %s: node %%%d (%s) takes %lld bytes, not %lld\n", names[mode], i,
             ir_op_info[n->op].name, (long long)g.size[i], (long long)size);
      fails++;
    }
  }
  char why[256];
  if (bufplan_check(m, &g, pos, why, sizeof why)) {
    printf("FAIL: store %s: %s\n", names[mode], why);
    fails++;
  }
  if (want && !halved) {
    printf("FAIL: store %s: no value at 2 bytes an element: nothing to test\n", names[mode]);
    fails++;
  }
  return fails;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: cg_cuda_arena MODEL.dsl [NAME=VALUE ...]\n");
    return 2;
  }
  IrModule *m = test_load_full(argv[1], (const char *const *)argv + 2, argc - 2);
  if (!m) return 1;
  char err[512];
  CgKernelPlan kp;
  BufPlan fp32;
  int *pos, *held;
  if (cg_plan_step(m, 1, NULL, &kp, &pos, &fp32, &held, err, sizeof err)) {
    printf("FAIL: the step's plan: %s\n", err);
    return 1;
  }
  int *canon = arena_alloc(&m->arena, sizeof(int) * (size_t)(kp.nkernels + 1));
  cg_dedup_kernels(&kp, canon);
  int fails = 0;
  int64_t gpu[3];
  for (int mode = CG_STORE_BF16; mode <= CG_STORE_ROUND; mode++)
    fails += check_mode(m, &kp, pos, held, &fp32, canon, (CgStoreMode)mode, &gpu[mode]);
  int64_t train = cg_arena_bytes(&kp, &fp32, NULL), rep = 0;
  free(held);
  cg_plan_free(&kp);
  /* the report: train.c's arena, and the GPU trainer's where it is not that */
  GpuBytes rg = {.arena = -1};
  if (cg_plan_arena(m, 1, NULL, &rep, NULL, machine_bf16(m), NULL, CG_STORE_BF16, 1, &rg, err,
                    sizeof err) ||
      rep != train || rg.arena != (gpu[CG_STORE_BF16] != train ? gpu[CG_STORE_BF16] : 0)) {
    printf("FAIL: the report's arenas %lld, %lld; the plans' %lld, %lld\n", (long long)rep,
           (long long)rg.arena, (long long)train, (long long)gpu[CG_STORE_BF16]);
    fails++;
  }
  printf("%s %s (%s): arena %lld bytes in train.c, %lld in the GPU trainer\n",
         fails ? "FAIL" : "ok  ", m->name, machine_bf16(m) ? "bf16" : "fp32", (long long)train,
         (long long)gpu[CG_STORE_BF16]);
  ir_module_free(m);
  return fails != 0;
}
