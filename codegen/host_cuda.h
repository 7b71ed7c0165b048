/* codegen/host_cuda.h -- the GPU trainer's host program, train_cuda.c.
 *
 * The same plan as train.c (codegen/host.h): the same kernels in the same
 * order, the same arena offsets (ARENA_BYTES), the same parameter and state
 * layout, the same RtModelDesc (tables and settings written by host.c's
 * cg_emit_host_desc), so the harness -- options, data, init, checkpoints,
 * logs -- is rt_train_main's.  What differs is where things run: `step`
 * calls the CUDA kernel launchers of kernels_cuda.h on the rank's compute
 * stream, GEMMs through cuBLASLt and the runtime ops of
 * runtime/cuda/rt_cuda.h, on device buffers (P, S and the arena A are
 * device pointers; tokens, targets, lr and the step count are copied to the
 * device at the start of every step).
 *
 * Device state: one RtCuda per rank, made on the first call of step (a
 * thread-local pointer: ranks are threads or processes), which uploads the
 * host parameters and state the harness set up; RtModelDesc.to_host copies
 * them back whenever the harness reads them (weights, checkpoints).
 * --save-grads copies each gradient to the host as the CPU trainer does. */
#ifndef PARC_CG_HOST_CUDA_H
#define PARC_CG_HOST_CUDA_H

#include <stdio.h>

#include "codegen/host.h"
#include "runtime/cuda/rt_cuda_ws_plan.h"

/* The rt_cuda_matmul(_ta) call train_cuda.c makes for MATMUL / MATMUL_TA node n
 * (without the RT_CUDA_MM_*_BF16 flags of operands stored as bf16). */
RtCudaGemm cg_cuda_gemm(const IrNode *n);

/* The RT_CUDA_MM_*_BF16 / _WIDE flags of that call where its operands or its
 * result are stored as bf16 (bf16: CgCudaStore.bf16; NULL: none), or an
 * operand is a parameter the GEMM reads from the trainer's bf16 copy of the
 * params (weights: CgCudaStore.weights; where rt_cuda_gemm_stored_ok), and
 * RT_CUDA_MM_C_ROUND where its result is rounded (rounded: CgCudaStore.rounded). */
int cg_cuda_stored_flags(const IrNode *n, const unsigned char *bf16, const unsigned char *rounded,
                         int weights);

/* 1 if the trainer keeps the params' bf16 copy (weights: CgCudaStore.weights)
 * and a GEMM of m reads a weight from it: the trainer allocates it and
 * refreshes it first thing in each step. */
int cg_cuda_weights_read(const IrModule *m, int weights);

/* 1 if operand j of GEMM n is read from the params' bf16 copy
 * (rt_cuda_params_bf16): a parameter, weights on and rt_cuda_gemm_stored_ok. */
int cg_cuda_gemm_weight(const IrNode *n, int j, int weights);

/* 1 if attention node n (IR_OP_ATTENTION, or IR_OP_ATTENTION_GRAD from the
 * row statistics: rt_cuda_sdpa_grad_stats) may read or write tensors stored
 * as bf16 (rt_cuda_attn_stored_ok of its head dimension and length). */
int cg_cuda_attn_stored_ok(const IrNode *n);

/* The RT_CUDA_ATTN_* flags of such a node's call: its q, k, v (dy) stored as
 * bf16, its result stored as bf16 or rounded so (bf16, rounded: as above),
 * its token-major result or dy (IR_SDPA_*, passes/attn_layout.c); of an
 * IR_OP_ATTENTION_DELTA's, its m, dm stored as bf16. */
unsigned cg_cuda_attn_flags(const IrNode *n, const unsigned char *bf16,
                            const unsigned char *rounded);

/* Writes train_cuda.c (info->store: which buffers hold bf16, and each kernel's
 * CUDA code).  0, or -1 with a one-line reason in err (an op the GPU trainer
 * has no routine for). */
/* The unpipelined GPU step computes cross-entropy node i (cross_entropy or
 * vocab_cross_entropy) inside its gradient's call (rt_cuda_cross_entropy_fused)
 * when i is the loss or the cross-entropy loss (so its buffer lives to the
 * step's end: passes/bufplan.c), no node reads it, and a later gradient node
 * takes the same logits and targets (the same group and vocabulary): that
 * node's index, else -1.  Over several tp members the call gathers the rows'
 * statistics once for both, so the forward's gathers, which the plan counts
 * (passes/comm_cost.c) and the CPU trainer runs, are not run: the report
 * says so (passes.h CommGpu.fused).  (Pipelined steps read the loss after
 * each microbatch's forward: they keep the two calls.) */
int cg_cuda_xent_fused(const IrModule *m, int i);

int cg_emit_host_cuda(FILE *out, const IrModule *m, const CgKernelPlan *kp, const BufPlan *bp,
                      const CgLeafPlan *lp, const CgHostInfo *info, char *err, size_t errlen);

#endif
