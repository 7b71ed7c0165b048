/* codegen/cuda_store.h -- which activations the bf16 GPU trainer stores as
 * bf16, and the kernel code that writes and reads them.
 *
 * In bf16 mode a GEMM reads bf16 copies of its operands
 * (runtime/cuda/rt_cuda_ws_plan.h): a pass per call reads the fp32 buffer
 * and writes the copy.  A value stored as bf16 needs no fp32 buffer: the
 * kernel that computes it rounds it to bf16 as it stores it (round to
 * nearest even, the copy's rounding), the GEMMs read it as it is
 * (RT_CUDA_MM_A_BF16 / _B_BF16) and the kernels that read it widen it to f32
 * as they load it (exact).  That is the "bf16 activations" of mixed
 * precision: half the bytes for every kernel that writes or reads the value,
 * and no copy pass for the GEMMs.
 *
 * A node n is stored as bf16 when
 *   - the train section's precision is bf16; in a trainer of stage programs
 *     (pipelined, or a routed model's microbatches) n is in a chunk and no
 *     parameter-gradient term added to the accumulator (the runtime adds
 *     those as f32), and no view of n is (a value sent between chunks may be:
 *     the transfers move its bf16 bytes, half the f32 ones);
 *   - n is f32, an activation or an activation's gradient (phase FWD or B;
 *     not W: a part of a weight gradient, e.g. the tied head's before the
 *     embedding's is added, stays f32; but a norm in W is an activation,
 *     the backward's recomputation of a forward one, passes/remat_norm.c,
 *     and so is a reshape in W of an FWD or B value: a weight gradient's
 *     operand, stored by the kernel that computes that value inline, e.g. a
 *     copy of passes/remat_act.c),
 *     computed by a generated kernel that
 *     stores it (a param of access out) or by a GEMM that may write it bf16
 *     (RT_CUDA_MM_C_BF16,
 *     rt_cuda_gemm_out_stored_ok: cuBLASLt rounds its fp32 accumulators to
 *     nearest even) or by attention (out; its gradient from the row
 *     statistics: dqkv) where the tensor-core kernels may write it bf16
 *     (RT_CUDA_ATTN_O_BF16, cg_cuda_attn_stored_ok) or by an all-reduce
 *     (rt_cuda_all_reduce_bf16: the f32 sum of the f32 partials, rounded
 *     once as it is stored, where its elements split into even pieces, one a
 *     member; not where the partials are a kernel's reduction, as for any
 *     kernel result below), has a buffer of its own (no view, no alias of another
 *     buffer: a bf16 store could land on an element not yet read) and is
 *     none of the step's results (loss, norms, updates), of the optimizer's
 *     values (IR_PHASE_OPT: its scalars, the clip coefficient) or of what
 *     it reads (the parameter gradients): they stay f32;
 *   - every reader of n is a matmul or matmul_ta that reads n as an operand
 *     that it converts (rt_cuda_gemm_stored_ok), a generated kernel (it reads
 *     n through a param; no kernel writes a buffer it reads, passes/bufplan.h,
 *     so n's bytes stay put while it runs), (vocab_)cross_entropy or its
 *     gradient as their logits (rt_cuda_(vocab_)cross_entropy_bf16 and
 *     _grad_bf16io, which writes the gradient bf16 too, in place: so only
 *     where GEMMs that may are all that read that gradient), attention (or
 *     its gradient from the row statistics) as q, k, v (dy) where
 *     cg_cuda_attn_stored_ok (RT_CUDA_ATTN_Q_BF16 ...: the kernels round
 *     them to bf16 anyway, so that costs no bit), sdpa_delta (it widens the
 *     merged out and its gradient as it reads them), sdpa_lse (it copies the
 *     lse after sdpa's out, which stays f32), or a reshape view of n whose
 *     readers are, or a group_copy or an all-gather of n whose readers are
 *     (tp's identity forward, sequence parallelism's gather: n dense, moved
 *     in pairs of elements -- cuda_store.c copy_of --, the result a buffer of
 *     its own; the trainer moves n's bytes, and the result is stored as n
 *     is); no other runtime op (the fp32 attention paths, the other
 *     collectives, routing ... read f32);
 *   - if a kernel reads n, n is no reduction's result: its kernel reads no
 *     buffer of more elements than n (row statistics such as a layer norm's
 *     mean and 1/std stay f32).
 * And (vocab_)cross_entropy_grad's dlogits of f32 logits when only such GEMMs
 * read them: rt_cuda_(vocab_)cross_entropy_grad_bf16 store them, in place of the logits
 * (as the buffer plan has it) or not, "wide": each row in the first half of
 * the bytes of its own fp32 row (RT_CUDA_MM_A_WIDE / _B_WIDE; views of them
 * must keep the rows); GPT-2's logits are bf16 themselves now, and so its
 * dlogits dense.
 * In train.c's buffer plan a value has its fp32 size, and the bf16 elements
 * fill the first half of its buffer (wide: of each row); the GPU trainer
 * plans its arena again with them at 2 bytes an element where it can
 * (codegen/cuda_arena.h: wide values keep their size).
 *
 * A kernel instance that stores or reads a bf16 node runs its code with those
 * params retyped KIR_BF16: a clone named "<instance's name>_bf16", shared by
 * the instances of the same code with the same bf16 params.
 *
 * The weights' bf16 copy (weights below; rt_cuda_params_bf16) holds every
 * param rounded to nearest even.  Where each param is updated in place by
 * one generated kernel and by nothing else (mirror_all: Adam's update, or
 * under --zero the copy of the all-gathered values into the param), that
 * kernel also stores the copy: its code is a clone "<name>_pb<P>" whose
 * last param is the copy, stored with the same value at the same index
 * right after each store of the update, so the copy the next step's GEMMs
 * read is that of the params it updates (2 bytes an element more for the
 * updates instead of a pass reading 4 and writing 2 at the step's start).
 *
 * Numerics.  A value a kernel reads is rounded where the f32 trainer would
 * have kept it exact, so the bf16 trainer's results are not the f32
 * trainer's.  CG_STORE_ROUND (parc --bf16-store round) makes their exact
 * reference: the same plan with f32 buffers, each stored value rounded to
 * bf16 as it is stored (KIR_BF16R, clones "_bf16r"; a GEMM's result rounded in
 * place after it, RT_CUDA_MM_C_ROUND; attention's as it writes it,
 * RT_CUDA_ATTN_O_ROUND) and everything else
 * computed as by the f32-buffer trainer (GEMMs convert, dlogits written f32).
 * Widening being exact, it computes the bf16-storing trainer's bits
 * (tests/cuda/trainer_emu.py, the store check). */
#ifndef PARC_CUDA_STORE_H
#define PARC_CUDA_STORE_H

#include "codegen/cg_kernels.h"
#include "passes/bufplan.h"
#include "passes/passes.h"

/* What the bf16 trainer does with the values above: store them as bf16
 * (the default: 0), keep them f32 (--bf16-store off), or keep f32 buffers
 * holding their values rounded to bf16 (round: the reference). */
typedef enum { CG_STORE_BF16, CG_STORE_OFF, CG_STORE_ROUND } CgStoreMode;

typedef struct CgCudaStore {
  unsigned char *bf16;   /* per node id: 1 if its buffer holds bf16 (its views too),
                            2 if wide: rows of 2 cols (cross_entropy_grad's dlogits);
                            all 0 when round */
  int round;             /* CG_STORE_ROUND: the values below rounded, in f32 buffers */
  unsigned char *rounded; /* round: per node id, what bf16 would have been (else NULL) */
  int count;             /* values stored as bf16, or rounded so (views not counted) */
  int64_t elements;      /* their elements, all together */
  int weights;           /* 1: the GEMMs read their weights from a bf16 copy of the
                            params (rt_cuda_params_bf16) where rt_cuda_gemm_stored_ok:
                            precision bf16, stores on (not round); stage programs:
                            each stage's copy of its own params */
  int64_t reduce_piece;  /* RtCudaSetup.reduce_piece: the largest piece (elements /
                            members) of the all-reduces stored as bf16 (or rounded
                            so), 0 where none is; its f32 scratch is 4 bytes an element */
  int64_t attn_dq;       /* RtCudaSetup.attn_dq_bytes: the largest dq partials scratch
                            (rt_cuda_attn_dq_ws) of the attention backwards, which run
                            the tensor-core kernels in precision bf16 (any store mode);
                            0 where none does */
  int *mirror;           /* per kernel instance: the param node whose bf16 copy
                            (rt_cuda_params_bf16) the instance also stores, each
                            element rounded as it stores the f32 update: its code's
                            last param (a clone "_pb<P>", P the param mirrored);
                            -1 for the others */
  int mirror_all;        /* 1 where mirror covers every param: then nothing else
                            writes a param in the step (no runtime op, no other
                            kernel) and each is updated in place by one kernel,
                            so the copy the GEMMs read stays that of the
                            params without rt_cuda_params_to_bf16 in the step
                            (rt_cuda_open fills it after the upload).  Only with
                            weights; a stage program's rank keeps the copy of
                            its stage's params, which its kernels update */
  int *canon;            /* per kernel instance: the instance whose CUDA code it runs */
  KirKernel **code;      /* per kernel instance i with canon[i] == i: that code */
} CgCudaStore;

/* Plans *out in m's arena.  canon: the kernels' shared code (project.c's
 * dedup; NULL: each its own); bf16: the train section's precision is bf16
 * (else nothing is stored); pp: the stage programs the trainer runs (m their
 * module), or NULL. */
void cg_cuda_store_plan(IrModule *m, const CgKernelPlan *kp, const BufPlan *bp, const int *canon,
                        int bf16, CgStoreMode mode, const PpProgram *pp, CgCudaStore *out);


#endif
