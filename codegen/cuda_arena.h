/* codegen/cuda_arena.h -- the GPU trainer's activation arena.
 *
 * train.c's buffer plan gives every value 4 bytes an element.  The bf16 GPU
 * trainer stores many of them as bf16 (codegen/cuda_store.h), which used the
 * first half of that fp32 buffer.  This plans the GPU trainer's arena again
 * with those values at 2 bytes an element (bufplan_build_like: train.c's
 * plan's arenas and mode): the same kernels, positions, lives, views and
 * in-place values, other offsets.
 *
 * Narrow: a value stored bf16 densely (CgCudaStore.bf16 == 1; its views are
 * too); one with an aux part (sdpa's out, then its fp32 lse) only where its
 * elements are even in number, so that the lse, from byte 2 ir_numel on, is
 * 4-byte aligned (the trainer addresses it so: BufPlan.narrow).  Wide values
 * (rows of 2 cols, the dlogits) keep their size.
 *
 * Invariant the store plan relies on: a value stored as bf16 has a buffer of
 * its own, and a view shares its value's bytes (cuda_store.h), as train.c's
 * plan has them.  So the narrow plan is kept only when every node has the
 * same alias (In place, shared view) or none as in train.c's plan, and only
 * when it is smaller; otherwise the GPU trainer takes train.c's plan as it is. */
#ifndef PARC_CG_CUDA_ARENA_H
#define PARC_CG_CUDA_ARENA_H

#include "codegen/cg_kernels.h"
#include "codegen/cuda_store.h"
#include "passes/bufplan.h"

/* *out: the GPU trainer's plan for kp's step, whose train.c plan is bp
 * (cg_plan_step's pos and held); arrays in m's arena, or bp's own where it
 * is bp.  Returns 1 when *out is the narrow plan, 0 when it is *bp. */
int cg_cuda_arena_plan(IrModule *m, const CgKernelPlan *kp, const int *pos, const int *held,
                       const BufPlan *bp, const CgCudaStore *store, BufPlan *out);

#endif
