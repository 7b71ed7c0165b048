/* codegen/cuda_arena.c -- see cuda_arena.h. */
#include "codegen/cuda_arena.h"

#include "codegen/host.h"

int cg_cuda_arena_plan(IrModule *m, const CgKernelPlan *kp, const int *pos, const int *held,
                       const BufPlan *bp, const CgCudaStore *store, BufPlan *out) {
  *out = *bp;
  if (store->round || !store->count) return 0;
  unsigned char *narrow = arena_alloc(&m->arena, (size_t)m->nnodes + 1);
  for (int i = 0; i < m->nnodes; i++)
    narrow[i] = store->bf16[i] == 1 &&
                (ir_aux_numel(m->nodes[i]) == 0 || ir_numel(m->nodes[i]) % 2 == 0);
  BufPlan np;
  bufplan_build_like(m, kp->materialize, cg_results(m), pos, held, kp->view_of, narrow, bp, &np);
  if (np.peak >= bp->peak) return 0;
  for (int i = 0; i < m->nnodes; i++)
    if (np.alias[i] != bp->alias[i] || (np.offset[i] < 0) != (bp->offset[i] < 0) ||
        np.part_of[i] != bp->part_of[i])
      return 0;
  *out = np;
  return 1;
}
