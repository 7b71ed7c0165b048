/* codegen/cuda_batch.h -- which of the GPU trainer's kernel launches run
 * together, as one batched launch (horizontal fusion: kir_cuda.h,
 * NAME_multi).
 *
 * A step launches many small kernels that share their code: the optimizer's
 * sum of squares and update of each small parameter (GPT-2: 74 layer-norm
 * vectors of 768, each two launches of a few microseconds that move 3 KB).
 * Launches of the same CUDA code (CgCudaStore.canon) over the same rows run
 * as instances of one launch when they are independent.
 *
 * The plan walks the unpipelined step's launches in order.  A runtime op
 * (GEMM, attention, collective, copy) and a change of phase close every open
 * batch: nothing moves across them.  Between those, launch k joins an open
 * batch of its code when
 *   - the batch has room (kir_cuda_multi_max of the code; a kernel with a
 *     split scratch batches as its shares of the stream's lane allow: the
 *     gradient norm's sums of squares, GPT-2: 48 launches in 3);
 *   - k is independent of each member of the batch (they run at once) and
 *     of each launch placed after the batch so far (k now runs before
 *     them): no byte k writes is read or written by the other, no byte k
 *     reads is written by it.  Bytes are buffer ranges: arena values (their
 *     planned offset and size, views and in-place values included),
 *     temporaries, parameters and state (the leaf plan), each input apart.
 * The batch then runs where its first member ran; each member computes what
 * its own launch would have (the same code, the same arguments).  Launches
 * absorbed this way run nothing where they were (train_cuda.c says where
 * they went).
 *
 * Bias sums with their GEMM (in_gemm): in the unpipelined step, a linear
 * layer's bias gradient -- a kernel that is one sum_to of dy [..., n] to
 * [n] -- is computed by the call of its weight gradient's GEMM, a later
 * matmul_ta (one member, b not transposed) whose b is dy or a view of it
 * sharing dy's bytes: rt_cuda_matmul_ta_bgrad sums dy in cuBLASLt's epilogue
 * where it can, and where it cannot the kernel is launched right after the
 * GEMM.  Either way the sum runs at the GEMM instead of at its own position,
 * so: nothing reads it before the GEMM, and it has a reader after it (the
 * optimizer, a clip, a collective), so its buffer, taken from its position
 * to its last reader (passes/bufplan.h), holds nothing else in between; dy's
 * bytes are live at the GEMM, which reads them.  Such a kernel never batches.
 * In stage programs (a pipelined trainer's, or a routed model's
 * microbatches), where the weight gradient's GEMM adds its product into the
 * gradient accumulator G (host.h, cg_pipe_acc_into) and the bias sum is a
 * gradient term that nothing reads but the accumulator (ACC_GRAD right after
 * its kernel), the same holds for a GEMM of the sum's own program (the same
 * chunk and phase): its call writes the sums to the runtime's scratch
 * (rt_cuda_bgrad_ws; the epilogue's, or the kernel's after the GEMM) and
 * ACC_GRAD adds them from there, so the sum's own buffer is never written
 * and its liveness is not stretched to the GEMM.
 *
 * Bias adds with their GEMM (in_gemm too): in the unpipelined step and in
 * stage programs (the GEMM's own: the same chunk and phase), a kernel
 * that is add(mm, bias) (or its reshape) of a forward matmul mm (or of
 * --recompute layers' copy of one, in the backward) read by
 * nothing else, bias an fp32 vector of mm's last dimension, run right after
 * mm (nothing between them but the kernel's own nodes and leaves), its result's
 * bytes apart from the GEMM's operands' (which may end their lives at the GEMM
 * and give the result their bytes: --recompute layers): mm's call writes the
 * kernel's result with the bias added in cuBLASLt's epilogue
 * (rt_cuda_matmul_bias) where it can, and where it cannot, the plain product
 * to mm's buffer and the kernel right after, as before.
 *
 * GELU and its gradient with their GEMMs (in_gemm too; passes/gelu_epilogue.c
 * keeps the GELU input h = add(mm, b) and moves each dg's matmul right
 * before its gelu_grad(h, dg)): in the unpipelined step and in stage
 * programs (as bias adds), the forward kernel
 * that is exactly [h, gelu(h)] (both stored alike: bf16, rounded fp32 or
 * fp32), right after mm, is mm's call (rt_cuda_matmul_gelu: h to the aux
 * output, gelu(h) to D), and the backward kernel that is exactly
 * [gelu_grad(h, dg)] (stored as h is), right after dg's matmul, is that call (rt_cuda_matmul_dgelu: h the aux
 * input); each where cuBLASLt has the algorithm, else the plain product to
 * mm's (dg's) buffer and the kernel right after.  Rows of a multiple of 8;
 * the results' bytes apart from the GEMM's operands, b and (backward) h.
 * Each of the two stands alone: h is a value of the plan either way. */
#ifndef PARC_CG_CUDA_BATCH_H
#define PARC_CG_CUDA_BATCH_H

#include "codegen/cg_kernels.h"
#include "codegen/cuda_store.h"
#include "codegen/host.h"
#include "passes/bufplan.h"

typedef struct CgCudaBatches {
  int *lead;            /* per kernel instance: the instance whose launch runs it
                           (itself when it leads or runs alone; -1: a view, no launch) */
  int *next;            /* per instance: the next member of its batch, or -1 */
  int *count;           /* per instance that leads: its members, itself included */
  unsigned char *multi; /* per instance whose code it is (store->canon[k] == k): some
                           batch of 2 or more runs that code (kir_cuda_write_multi) */
  int *in_gemm;         /* per instance: the GEMM node whose call computes it (a bias
                           sum, above), else -1 */
  unsigned char *epi;   /* per instance: what that call computes (CG_EPI_*) */
  int batches;          /* batches of 2 or more */
  int absorbed;         /* launches they took in (members that do not lead) */
} CgCudaBatches;

/* Plans *out in m's arena for the step of kp (its buffer plan bp, leaf plan
 * lp, CUDA code store).  batch 0 (--no-batch): nothing batches, every
 * instance launches alone.  pp: m's stage programs (a pipelined trainer's,
 * or a routed model's microbatches), or NULL for the unpipelined step.  In
 * stage programs only the optimizer's launches batch, each with those of
 * parameters the same one stage holds and of the same opt_pub (host.c's
 * emit_group runs them in the same stage functions, alike), never past a
 * node that reads the values summed over the stages (the sum is made right
 * before it); the chunks' programs launch alone.  In stage programs a bias
 * sum, bias add, GELU or GELU gradient joins a GEMM of its own program (the
 * same chunk and phase; a bias sum through the scratch, above). */
void cg_cuda_batch_plan(IrModule *m, const CgKernelPlan *kp, const BufPlan *bp,
                        const CgLeafPlan *lp, const CgCudaStore *store, int batch,
                        const PpProgram *pp, CgCudaBatches *out);
/* The GEMM node whose call computes sum_to node i (the bias sums above), else -1. */
int cg_cuda_bias_in_gemm(const IrModule *m, const CgKernelPlan *kp, const BufPlan *bp, int i);
/* The matmul node whose call adds kernel k's bias (the bias adds above), else -1. */
int cg_cuda_bias_add_gemm(const IrModule *m, const CgKernelPlan *kp, const BufPlan *bp,
                          const CgCudaStore *store, int k);
/* What a GEMM's call computes of kernel instance k (CgCudaBatches.epi). */
enum { CG_EPI_NONE, CG_EPI_BGRAD, CG_EPI_BIAS, CG_EPI_GELU, CG_EPI_DGELU };
/* For kernel k computed by a GEMM's call with epilogue epi: *vec the bias
 * (BIAS, GELU) or bias-gradient (BGRAD) node, *aux GELU's input h (GELU: an
 * output, DGELU: an input), *out the result the call writes (BIAS, GELU,
 * DGELU); NULL where the epilogue has none. */
void cg_cuda_epilogue_parts(const IrModule *m, const CgKernelPlan *kp, int k, int epi,
                            const IrNode **vec, const IrNode **aux, const IrNode **out);

#endif
