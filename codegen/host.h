/* codegen/host.h -- the generated host C: one readable file per rank program.
 *
 * The file holds the model's description for the runtime's harness
 * (runtime/rt_model.h: parameters, optimizer state, buffer plan, settings)
 * and `step`: forward, backward, clipping and the optimizer update as
 * straight-line calls -- GEMMs and the irregular ops into libparcrt, fused
 * kernels from kernels.h over rows split across the thread pool -- each
 * preceded by the IR line it implements. */
#ifndef PARC_CG_HOST_H
#define PARC_CG_HOST_H

#include <stdio.h>

#include "codegen/cg_kernels.h"
#include "passes/bufplan.h"
#include "passes/passes.h"

typedef struct {
  const char *source;        /* the DSL file, as given */
  const char *version;       /* parc's version */
  double flops_per_step;     /* forward + backward */
  const int *canon;          /* per kernel: the kernel whose code it runs (the
                                same code compiled once); NULL: itself */
  const PpProgram *pipe;     /* NULL, or the stage programs (passes/pp_split.c) of a
                                module of one microbatch: train.c then has per chunk
                                fwd_c, bwd_c, wgt_c, an optimizer, the schedule's
                                action tables, and step = rt_pipe_step
                                (runtime/rt_pipe.h); a stage's arena = its slots *
                                slot + the gradient accumulator */
  const char *desc_extra;    /* NULL, or RtModelDesc field initialisers (".x = y,\n"
                                lines) written before .step (codegen/host_cuda.c) */
  const struct CgCudaStore *store; /* train_cuda.c: the bf16 activations and the CUDA
                                code of each kernel (codegen/cuda_store.h); else NULL */
  const struct CgCudaBatches *batches; /* train_cuda.c: its batched launches
                                (codegen/cuda_batch.h); NULL: none */
} CgHostInfo;

/* A colour per node of a pipelined module for cg_plan_kernels (colour[m->nnodes]):
 * the nodes its stage functions run together (host.c). */
void cg_pipe_colours(const IrModule *m, const PpProgram *pp, int *colour);

/* The optimizer of a pipelined trainer reads each parameter's gradient
 * (p->grad) from the accumulator G, where the microbatches summed it, not
 * from p->grad's bytes: via_acc[id] = 1 for those nodes, opt[r] = 1 for the
 * optimizer's nodes (bufplan's BufArenas.via_acc, acc_reader: that read keeps
 * no bytes alive).  So a gradient takes room in a slot only from its kernel
 * to its ACC_GRAD, a skipped gradient sum none at all (cg_plan_step clears
 * its materialize), where before every gradient of the stage was copied out
 * of G into the slot for the optimizer and held there from the backward on
 * (GPT-2 --pp 4: all of stage 0's slot at its peak).  m->nnodes entries. */
void cg_pipe_grads_in_acc(const IrModule *m, const PpProgram *pp, unsigned char *via_acc,
                          unsigned char *opt);

/* Per node of m (from m's arena): for a parameter-gradient term that a
 * runtime op able to add into its output computes -- a GEMM (matmul,
 * matmul_ta: RT_MM_ACCUMULATE) or an embedding's gradient ((vocab_)
 * embedding_grad_acc) -- and that nothing but its skipped gradient sums
 * reads, or the optimizer from the accumulator (via_acc,
 * cg_pipe_grads_in_acc), none of keep's nodes (cg_results): its PARAM; else
 * -1.  Such a term needs no buffer: the stage function's op adds it into the
 * accumulator itself, at the parameter's offset in G, where ACC_GRAD would
 * add a buffer's copy of it.  So a weight gradient takes no room in a slot:
 * the tied head's [V, D] product on GPT-2's last stage, the embedding's [V, D]
 * on its first.  (The op sums onto G in its own order -- a GEMM K block by K
 * block, an embedding row by row -- not as one addition of the whole term:
 * the same value to rounding.)  cg_plan_step clears these nodes' materialize
 * and sets kp->acc_into. */
int *cg_pipe_acc_into(IrModule *m, const PpProgram *pp, const unsigned char *keep,
                      const unsigned char *via_acc);

/* A slot of each stage of a pipelined trainer whose arena plan is bp (one
 * offset a value, the same on every stage holding it: BufArenas): into
 * slot_bytes[s] (pp->nstages of them, multiples of 64) the end of the last
 * buffer whose bytes stage s's arena holds (bufplan_group_where; a plan
 * without arenas: every buffer), then the kernel temporaries of kp that
 * stage s's kernels write and read; into temp_off (NULL: not wanted) each
 * temporary's offset, after its stage's buffers.  A temporary whose writer
 * and reader are not of one stage's chunks goes after every stage's buffers
 * and temporaries so far, in every slot.  A rank allocates its own stage's
 * slots only (rt_pipe.h), so a stage whose values end lower allocates less
 * than the largest slot (GPT-2's first stages beside the head's). */
void cg_pipe_slot_bytes(const IrModule *m, const PpProgram *pp, const CgKernelPlan *kp,
                        const BufPlan *bp, int64_t *slot_bytes, int64_t *temp_off);

/* ARENA_BYTES of the trainer of m whose kernels and arena plan are kp, bp:
 * cg_arena_bytes; pp (stage programs, else NULL): its largest stage's arena,
 * cg_pipe_arena_bytes of its cg_pipe_slot_bytes. */
int64_t cg_trainer_arena_bytes(const IrModule *m, const PpProgram *pp, const CgKernelPlan *kp,
                               const BufPlan *bp);

/* The whole arena of stage s of a pipelined trainer whose slots are
 * slot_bytes[s] (cg_pipe_slot_bytes; runtime/rt_pipe.h): the stage's slots
 * (PpProgram.stage_slots), the accumulator, two shared vectors, and the
 * ZeRO-1 bucket scratch (PpProgram.zero_bucket_max floats) where the slots
 * are too small to hold it; s = -1: the largest stage's (ARENA_BYTES). */
int64_t cg_pipe_arena_bytes(const PpProgram *pp, const int64_t *slot_bytes, int s);

/* Offsets (in floats) of every PARAM and STATE leaf in their buffers, in
 * node order, each 16-float aligned; -1 for other nodes. */
typedef struct {
  int64_t *offset;           /* per node id */
  int64_t params_numel, state_numel;
} CgLeafPlan;

void cg_plan_leaves(IrModule *m, CgLeafPlan *out);
/* cg_plan_leaves' params_numel (the PARAM leaves' aligned sizes), without a plan. */
int64_t cg_params_numel(const IrModule *m);

/* The step's batch of token ids, the input "tokens" of i32 [batch, seq] the
 * trainers feed (rows x seq), or NULL. */
const IrNode *cg_tokens_input(const IrModule *m);

/* Nodes whose buffers must survive to the end of the step: the loss, the
 * cross-entropy, the gradient norm and every update value (keep[id] = 1). */
unsigned char *cg_results(IrModule *m);

/* Per node id of m: the PARAM whose gradient (p->grad) it is, else -1.
 * malloc'd (the caller frees it); NULL when out of memory. */
int *cg_grad_of(const IrModule *m);

/* The arguments every attention call (rt_sdpa, rt_sdpa_grad and their CUDA
 * forms) ends with, for sdpa or sdpa_grad node n: "B, H, KV, T, hd, scale,
 * causal" into s (160 bytes suffice); returns s. */
const char *cg_sdpa_dims(const IrNode *n, char *s, size_t len);

/* 1 if kernel k of kp runs nowhere: a reshape the buffer plan made a view of
 * its input (bp->alias[root] == kp->view_of[root]: bufplan_build_views), whose
 * bytes already hold its value.  Every host skips its call. */
int cg_kernel_is_view(const CgKernelPlan *kp, const BufPlan *bp, int k);

/* When kernel k is such a view: a comment saying so in its place, and 1;
 * else 0 (nothing written). */
int cg_view_note(FILE *out, const CgKernelPlan *kp, const BufPlan *bp, int k);

/* 1 if node id, a group_copy (a runtime op), runs nowhere: the buffer plan
 * made it a view of its input (bp->alias[id] == kp->view_of[id]).  Every host
 * skips its call; cg_runtime_view_note writes the comment in its place and
 * returns 1 where it is one, else writes nothing and returns 0. */
int cg_runtime_is_view(const CgKernelPlan *kp, const BufPlan *bp, int id);
int cg_runtime_view_note(FILE *out, const CgKernelPlan *kp, const BufPlan *bp, int id);

/* Places the plan's temporaries after the planned peak (temp_off[t], bytes,
 * 64-byte aligned; temp_off may be NULL) and returns the whole arena size. */
int64_t cg_arena_bytes(const CgKernelPlan *kp, const BufPlan *bp, int64_t *temp_off);

/* A collective along dimension ia[2] (all_gather, replicate, reduce_scatter,
 * local_slice) sees its whole tensor as [outer, len, inner]. */
void cg_dim_split(const IrNode *n, int64_t *outer, int64_t *len, int64_t *inner);

/* For codegen/host_cuda.c: the IR comment above a call ("%12 = gelu %11 :
 * f32[..]  (file:line)"), and everything after the step function -- the
 * parameter and state tables, the config, the RtModelDesc `model` (whose
 * .step is `step` and .arena_bytes ARENA_BYTES, plus info->desc_extra) and
 * main -- exactly as train.c has them.  0, or -1 with err. */
void cg_host_comment(FILE *out, const IrNode *n, const char *indent);
int cg_emit_host_desc(FILE *out, const IrModule *m, const CgLeafPlan *lp,
                      const CgHostInfo *info, char *err, size_t errlen);

/* The pipelined trainer's stage functions and tables for codegen/host_cuda.c:
 * host.c's own emission (the same chunk functions fwd_c / bwd_c / wgt_c and
 * optimizer_s, the same nodes in the same order, the same action, boundary and
 * stage-buffer tables and RtPipeDesc `pipe`), with each statement that touches
 * memory in the hooks' form.  Strings are buffer expressions as host.c writes
 * them ("F(128)", "P + 64", "G + 64"); lp is the leaf plan of the stage whose
 * function is being written.  ACC_GRAD(off, g, n) lines are written as in
 * train.c: the hooks' file defines the macro. */
typedef struct {
  void *ctx;
  /* "static int name(io) {" of a function of pipeline stage `stage`; opt: an
   * optimizer function, whose reads of a gradient (p->grad) are of G
   * (cg_pipe_grads_in_acc) */
  void (*fn_head)(void *ctx, const char *name, const char *what, int stage, int opt);
  void (*runtime)(void *ctx, const CgLeafPlan *lp, const IrNode *n);
  /* kp->kernels[k]; returns 1 where a later GEMM's call computes it and adds its
   * gradient terms into the accumulator itself (no ACC_GRAD after it), else 0 */
  int (*kernel)(void *ctx, const CgLeafPlan *lp, int k);
  void (*zero)(void *ctx, const char *x, const char *who, const char *param); /* one float */
  void (*pp_sum)(void *ctx, const int *ids, int n); /* these nodes' one floats summed over pp */
  void (*loss)(void *ctx, const char *loss, const char *ce); /* last chunk's forward; ce may be NULL */
  void (*copy)(void *ctx, const char *dst, const char *src, int64_t n, const char *name);
  void (*grad_norm)(void *ctx, const char *x);                     /* NULL: none */
  const char *step;          /* the step function, after `pipe` */
} CgPipeHooks;

/* Writes those into out (info->pipe set; slot_bytes: a slot's arena per
 * stage, cg_pipe_slot_bytes).  0, or -1 with err. */
int cg_emit_pipe(FILE *out, const IrModule *m, const CgKernelPlan *kp, const BufPlan *bp,
                 const CgLeafPlan *lp, const CgHostInfo *info, const int64_t *slot_bytes,
                 const CgPipeHooks *hooks, char *err, size_t errlen);

/* The dp bucket collectives (passes/dp_grads.c) the straight-line step runs
 * asynchronously: started where the node stands, waited for right before the
 * first position that reads the result (a kernel reads where its root runs;
 * the end of the step, nnodes or more, when nothing reads it).  Returns, per
 * node id, that wait position, -1 for every other node; NULL when there is
 * none (no buckets, or m->dp_blocking).  malloc'd: the caller frees it.  The
 * buffer plan takes it as bufplan_build_views's held (the collective's input
 * must survive until the wait); cg_emit_host emits the same waits. */
int *cg_async_waits(const IrModule *m, const CgKernelPlan *kp);

/* Writes train.c.  Returns 0, or -1 with a one-line reason in err (an op
 * or an input the trainer cannot feed). */
int cg_emit_host(FILE *out, const IrModule *m, const CgKernelPlan *kp, const BufPlan *bp,
                 const CgLeafPlan *lp, const CgHostInfo *info, char *err, size_t errlen);

#endif
