/* codegen/arena_plan.h -- the activation arena a trainer would allocate,
 * without writing the trainer (for the report of a compile without -o). */
#ifndef PARC_CG_ARENA_PLAN_H
#define PARC_CG_ARENA_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "codegen/cg_kernels.h"
#include "codegen/cuda_batch.h"
#include "codegen/cuda_store.h"
#include "codegen/host.h"
#include "ir/ir.h"
#include "passes/bufplan.h"
#include "passes/passes.h"

/* The step's kernels and buffers as cg_write_project plans them: *kp fused
 * when fuse, kept to the stage programs' colours where pp is not NULL (a
 * trainer of stage programs, cg_pipe_colours); *pos (m's arena), each
 * node's position, its kernel's root (a kernel's nodes are written, and its
 * inputs read, where its root runs); *bp with the kernel plan's views and,
 * with pp, one arena per stage (pp_node_arenas: a slot of stage s holds the
 * values of stage s), without pp the asynchronous dp collectives reading
 * their inputs until their waits (cg_async_waits), which *held gets when not
 * NULL (the caller frees it; NULL when none).  0, or -1 with a one-line
 * reason in err (nothing to free then). */
int cg_plan_step(IrModule *m, int fuse, const PpProgram *pp, CgKernelPlan *kp, int **pos,
                 BufPlan *bp, int **held, char *err, size_t len);

/* A step as cg_write_project plans it: kp its kernels (fused when fuse;
 * pp, a trainer of stage programs, or NULL: as cg_plan_step plans them),
 * pos each node's position, held cg_plan_step's, bp train.c's arena (with
 * pp, a slot of every stage's at once), canon the kernels' shared code
 * (cg_dedup_kernels), store
 * the bf16 GPU trainer's stored values (bf16, store: a CgStoreMode), gbp its
 * arena (cg_cuda_arena_plan), lp its leaves, batches its batched launches
 * (batch 0: --no-batch; in stage programs the optimizer's alone).  Arrays in m's arena but
 * held; cg_step_plan_free when done. */
typedef struct {
  CgKernelPlan kp;
  int *pos, *held, *canon;
  BufPlan bp, gbp;
  CgCudaStore store;
  CgLeafPlan lp;
  CgCudaBatches batches;
} CgStepPlan;
int cg_plan_whole_step(IrModule *m, int fuse, const PpProgram *pp, int bf16, int store, int batch,
                       CgStepPlan *sp, char *err, size_t len);
void cg_step_plan_free(CgStepPlan *sp);

/* m must have been through every pass (autodiff and the optimizer), as for
 * cg_write_project; pp its stage programs, or NULL.  Plans the kernels
 * (fused when fuse) and the buffers exactly as cg_write_project does, so
 * *arena_bytes equals the ARENA_BYTES of the trainer `-o` would write for the
 * same module (pp: every slot and the accumulators, cg_pipe_arena_bytes);
 * with st (not for pp: the pipeline's timeline is the step), also its
 * predicted compute time on mc (codegen/step_model.h; bf16: the bf16 rates,
 * and the bf16 values of store);
 * with gpu, its GPU trainer's bytes (cg_gpu_bytes; store: a CgStoreMode,
 * codegen/cuda_store.h; the values it stores as bf16 planned as
 * cg_write_project plans them; pp: each stage's); batch: the step model
 * counts the batched launches (codegen/cuda_batch.h; 0: --no-batch).
 * Returns 0, or -1 with a one-line reason in err. */
int cg_plan_arena(IrModule *m, int fuse, const PpProgram *pp, int64_t *arena_bytes,
                  const Machine *mc, int bf16, StepTime *st, int store, int batch, GpuBytes *gpu,
                  char *err, size_t len);

/* *out for the GPU trainer of m's step: kp its kernels, gbp its arena's plan
 * (cg_cuda_arena_plan: narrow where gbp->narrow), lp its leaves, store its
 * bf16 values, bf16 the train section's precision; pp: m is the module of a
 * trainer of stage programs (pipelined, or a routed model's accumulated
 * microbatches), gbp its slot's plan: out->stage_device per stage, as that
 * stage's start gives rt_cuda_open (host_cuda.c), and out->device the
 * largest of them. */
void cg_gpu_bytes(const IrModule *m, const CgKernelPlan *kp, const BufPlan *gbp,
                  const CgLeafPlan *lp, const CgCudaStore *store, int bf16, const PpProgram *pp,
                  GpuBytes *out);

/* The bytes the GPU trainer of module m allocates for its GEMMs' bf16 operand
 * copies (runtime/cuda/rt_cuda_ws_plan.h: the largest need of each slot over
 * m's GEMM calls, GEMM mode bf16 when bf16, the default operands), which
 * rt_cuda_open plans and allocates at start; 0 in fp32.  stored (NULL: none):
 * per node, 1 where the trainer stores the value as bf16 (codegen/cuda_store.h:
 * no copy of it); weights: CgCudaStore.weights (no copy of a weight read from
 * the params' bf16 copy; the copy itself, the params in bf16, is counted,
 * as rt_cuda_open counts it). */
int64_t cg_gemm_ws_bytes(const IrModule *m, int bf16, const unsigned char *stored, int weights);

#endif
