/* codegen/step_model.h -- a rank's predicted compute time a step, kernel by
 * kernel, on a machine (passes/machine.h). */
#ifndef PARC_CG_STEP_MODEL_H
#define PARC_CG_STEP_MODEL_H

#include "codegen/cg_kernels.h"
#include "passes/passes.h"

/* Fills *st for the step m runs (every pass done; kp its kernel plan, as
 * cg_write_project makes it).  Every call -- a generated kernel, or a
 * runtime op -- costs mc->kernel_s (one whose largest value or operand has
 * parallel_min_elements or more, split over threads, parallel_call_s more)
 * plus the longer of its FLOPs at the
 * rate that bounds it and the bytes it moves at mc->mem_bytes_per_s:
 *   matmul, matmul_ta      2 m n k FLOPs at gemm_flops (expert matmuls over
 *                          their whole capacity, the GEMM the runtime calls,
 *                          where passes/cost.c counts the filled slots only);
 *   sdpa                   4 B H T^2 hd FLOPs (halved when causal: the
 *                          kernels skip masked tiles) at attn_flops;
 *   sdpa_grad              2.5 times its forward's (five products to two);
 *   everything else        memory-bound: its buffers' bytes.
 * A generated kernel moves the bytes of its buffer arguments (inputs and
 * outputs, temporaries included) once, an argument larger than every value
 * it computes counted at that size (it reads a slice); a reshape the host
 * aliases (view_of), or a range of a dp bucket (range_view), or a dp bucket
 * its gradients are written into (assembles), costs nothing.  Collectives are
 * not compute: the report adds them from its CommCost.  bf16 picks the machine's bf16 rates.  store (NULL: the
 * CPU trainer's step) is the GPU trainer's (codegen/cuda_store.h): a value
 * is 4 bytes an element, 2 where store->bf16[id]; in bf16 each GEMM operand
 * the GPU trainer converts (rt_cuda_ws_plan.h: not stored as bf16, nor a
 * weight read from the params' bf16 copy, store->weights) costs a
 * memory-bound call more, 6 bytes an element (read 4, write 2); the copy of
 * the params, when a GEMM reads it, one call of 6 bytes a parameter, or,
 * where the kernels that update the params store it (store->mirror_all),
 * 2 bytes an element more for each of them.
 * batches (NULL: none; codegen/cuda_batch.h): a launch that runs in another's
 * batch costs its bytes, not a call; a bias sum computed by its GEMM's call
 * (in_gemm: cuBLASLt's epilogue) costs nothing of its own, nor does a bias
 * add, a GELU or its gradient, except a GELU's input, which the GELU
 * epilogue writes and its gradient's reads besides D: its bytes at
 * mem_bytes_per_s, no call.  The step is the
 * unpipelined one: a cross-entropy computed inside its gradient's call
 * (cg_cuda_xent_fused) costs nothing of its own.  Not counted: a padded result's copy
 * (n % 4 != 0 under PARC_CUDA_GEMM_OPERANDS=bf16 only). */
struct CgCudaStore;
struct CgCudaBatches;
void cg_step_model(const IrModule *m, const CgKernelPlan *kp, const Machine *mc, int bf16,
                   const struct CgCudaStore *store, const struct CgCudaBatches *batches,
                   StepTime *st);
/* As cg_step_model, also each node's call time into node_s[id] (0 where no
 * call is rooted), when node_s is not NULL; unpipelined: m is an unpipelined
 * step (else a pipelined trainer's microbatch: no cross-entropy fused). */
void cg_step_times(const IrModule *m, const CgKernelPlan *kp, const Machine *mc, int bf16,
                   const struct CgCudaStore *store, const struct CgCudaBatches *batches,
                   int unpipelined, StepTime *st, double *node_s);

/* A pipelined trainer's chunk durations from its kernels: m is its module
 * (one microbatch), pp its stage programs, plan the pipeline plan whose
 * timing (per chunk: F, B and W, one microbatch) this replaces with the sums
 * of the calls each chunk runs in each phase, the optimizer's (with a bf16
 * trainer's copy of the stage's params, which also runs once a step outside
 * the schedule) into plan->opt_s, then simulates again (pp_plan_simulate).  The kernels are
 * planned as cg_write_project plans them (fuse: its choice for pipelines),
 * and so are the values they store as bf16 (store: a CgStoreMode) and the
 * optimizer's batched launches (batch 0: --no-batch; codegen/cuda_batch.h).
 * 0, or -1 with a one-line reason in err. */
int cg_pipe_step_model(IrModule *m, const PpProgram *pp, int fuse, const Machine *mc, int bf16,
                       int store, int batch, PpPlan *plan, char *err, size_t len);

#endif
