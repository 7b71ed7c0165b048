/* codegen/cuda_store.h -- which activations the bf16 GPU trainer stores as
 * bf16, and the kernel code that writes them.
 *
 * In bf16 mode a GEMM reads bf16 copies of its operands
 * (runtime/cuda/rt_cuda_ws_plan.h): a pass per call reads the fp32 buffer
 * and writes the copy.  A value whose every reader is such a GEMM needs no
 * fp32 buffer at all: the kernel that computes it rounds it to bf16 as it
 * stores it (the same rounding, round to nearest even, as the copy), and the
 * GEMMs read it as it is (RT_CUDA_MM_A_BF16 / _B_BF16).  The products are the
 * same bits; the fp32 write and every copy pass (4 bytes read, 2 written, per
 * element and GEMM) are gone.  In GPT-2 these are the layer norms' outputs and
 * the GELU outputs, each read by its forward GEMM and its weight gradient's
 * (not the merged attention heads: the attention backward's D reads them).
 *
 * A node n is stored as bf16 when
 *   - the train section's precision is bf16 and the trainer is not pipelined
 *     (stage programs copy values between chunks; not handled yet);
 *   - n is f32, computed by a generated kernel that stores it (a param of
 *     access out), has a buffer of its own (no view, no alias of another
 *     buffer: a bf16 store could land on an element not yet read) and is
 *     none of the step's results (loss, norms, updates);
 *   - every reader of n is a matmul or matmul_ta that reads n as an operand
 *     that it converts (rt_cuda_gemm_stored_ok), or a reshape view of n whose
 *     readers are; so no kernel reads it (a kernel reads its nodes' inputs).
 * And (vocab_)cross_entropy_grad's dlogits under the same conditions for
 * its readers: rt_cuda_(vocab_)cross_entropy_grad_bf16 store them, in place of
 * the logits (as the buffer plan has it) or not, "wide": each row in the
 * first half of the bytes of its own fp32 row (RT_CUDA_MM_A_WIDE / _B_WIDE;
 * views of them must keep the rows).  GPT-2 small: 8192 x 50304, read by the
 * tied head's dx and weight-gradient GEMMs.
 * A value keeps its fp32 buffer's size and offset (the same arena as
 * train.c); the bf16 elements fill its first half (wide: each row's).
 *
 * A kernel instance that stores a bf16 node runs its code with that param
 * retyped KIR_BF16: a clone named "<instance's name>_bf16", shared by the
 * instances of the same code that store bf16 at the same params. */
#ifndef PARC_CUDA_STORE_H
#define PARC_CUDA_STORE_H

#include "codegen/cg_kernels.h"
#include "passes/bufplan.h"

typedef struct CgCudaStore {
  unsigned char *bf16;   /* per node id: 1 if its buffer holds bf16 (its views too),
                            2 if wide: rows of 2 cols (cross_entropy_grad's dlogits) */
  int count;             /* values stored as bf16 (views not counted) */
  int64_t elements;      /* their elements, all together */
  int *canon;            /* per kernel instance: the instance whose CUDA code it runs */
  KirKernel **code;      /* per kernel instance i with canon[i] == i: that code */
} CgCudaStore;

/* Plans *out in m's arena.  canon: the kernels' shared code (project.c's
 * dedup; NULL: each its own); bf16: the train section's precision is bf16;
 * pipelined: the trainer runs stage programs. */
void cg_cuda_store_plan(IrModule *m, const CgKernelPlan *kp, const BufPlan *bp, const int *canon,
                        int bf16, int pipelined, CgCudaStore *out);

#endif
