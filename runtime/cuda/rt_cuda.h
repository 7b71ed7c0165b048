/* runtime/cuda/rt_cuda.h -- libparcrt_cuda: the GPU runtime a generated
 * train_cuda links against (C API; the implementation is CUDA C++).
 *
 * One RtCuda per rank: its device, its buffers and its streams.  The
 * generated trainer (codegen/host_cuda.c) makes it in its start hook
 * (RtModelDesc.start: rt_cuda_open, before the first step), then every step
 * enqueues, in IR order, fused kernels (kernels_cuda.h launchers on
 * rt_cuda_stream), GEMMs, attention and the runtime ops below on that one
 * compute stream; rt_cuda_step_end waits for it and returns the step's
 * scalars.
 *
 * Device memory (all cudaMalloc'd once, at open; sizes fixed by the plan):
 *   params       params_numel floats   (layout of RtModelDesc.params)
 *   state        state_numel floats
 *   arena        exactly arena_bytes   (the planned peak, ARENA_BYTES: every
 *                                       value of the step at its planned offset)
 *   io           tokens, targets [rows, seq] int32, 2 scalars (lr, step)
 *   workspace    the runtime's own scratch, outside the plan: cuBLASLt's
 *                workspace (RT_CUDA_GEMM_WORKSPACE), attention statistics
 *                (2 floats per query row), cross-entropy row statistics, the
 *                embedding gradient's sorted ids.  Grown on first use (the
 *                first step), never after: later steps allocate nothing.
 * Start-up checks (rt_cuda_open): the PARC_CUDA_* settings, the mesh's rank
 * count against the GPUs (see below), and params + state + arena + workspace
 * reserve against the device's free memory ("planned ... bytes, free ...
 * bytes" otherwise).  Every rank runs them all, before anything is allocated,
 * and the ranks agree on the outcome (rt_cuda_agree): a refusal is
 * RT_ERR_SETUP (rt_err.h: the user's setup, with what to change) on every
 * rank, with the message of the lowest world rank refused, so no rank goes
 * on into a collective the others never reach.  The allocations that follow
 * (buffers, streams, events, the cuBLASLt handle) are agreed the same way:
 * out of memory there (another process took memory after the check, or it is
 * fragmented) is RT_ERR_SETUP too, naming the rank, the GPU, the bytes asked
 * and the bytes free; another failure there is RT_ERR on every rank.
 *
 * Streams: `compute` runs everything of the step in order; collectives run
 * on `comm`, ordered after the compute work that produced their input by an
 * event, and the compute stream waits for their completion before reading
 * the result (so results are those of the serial order, and communication
 * may overlap independent compute once the schedule allows it).
 *
 * Collectives over one of the rank's groups (RT_CUDA_TP, DP, EP, EP_DP, PP;
 * pipeline transfers over PP, rt_cuda_pipe_step):
 *   NCCL       one process per GPU under mpirun, or a thread per GPU in one
 *              process: a world communicator from one unique id (made by
 *              world rank 0 and broadcast over the host mesh groups of the
 *              harness, rt_comm.h: so the same code serves threads and MPI),
 *              then every group of more than one member split from it
 *              (ncclCommSplit, rt_comm_mesh's colours and keys).
 *   host       the device-local backend: several ranks may share one GPU,
 *              its collectives in one of two ways (PARC_CUDA_LOCAL):
 *     host     (default) a collective copies the device buffer to the host,
 *              runs the harness's communicator (rt_comm.h: deterministic sums
 *              in rank order, its timeouts) and copies back.  Slow, exact: the
 *              sums are bit-identical to the CPU trainer's.
 *     device   the ranks are threads of one process on the first visible GPU;
 *              a collective reads the peers' send buffers in place once their
 *              streams reach it (events exchanged through the harness's group:
 *              no host synchronisation), sums them with a kernel in the same
 *              rank order (the same bits) or gathers them with device copies,
 *              and no peer writes a buffer another still reads
 *              (rt_cuda_local.cu, rt_cuda_local.h); pipeline transfers are
 *              device copies through buffers of the device's stream-ordered
 *              pool, the address and an event passed as a host message.  The
 *              thread communicator only (not MPI).  The expert all-to-all and
 *              the routing ops stay host-staged.
 *   Chosen by PARC_CUDA_COMM=nccl|host; by default nccl when every rank has
 *   a GPU of its own (thread backend: ranks <= GPUs; MPI: always), else host;
 *   PARC_CUDA_LOCAL=host|device (any value rules NCCL out; with
 *   PARC_CUDA_COMM=nccl it is an error) and world rank 0 then prints the
 *   choice ("parcrt_cuda: GPU 0 (...), ..., collectives device-local ...").
 *   With nccl, ranks > GPUs in one process is refused with a message.
 *   With nccl a pipeline's transfers run on a stream of their own, the compute
 *   stream waiting for them per slot (rt_cuda_pipe.cu: a send overlaps the next
 *   microbatch's work); PARC_CUDA_PIPE_STREAM=0 keeps them on the compute stream.
 * Watchdog (nccl): a thread per rank polls the last collective enqueued;
 * when NCCL reports an asynchronous error (ncclCommGetAsyncError) or the
 * collective has not finished rt_comm_timeout() seconds after it was
 * enqueued, it prints one line naming rank, group, op and size, aborts the
 * rank's communicators (ncclCommAbort: the peers' collectives then fail and
 * their watchdogs abort them in turn) and exits the process with status 3.
 *
 * Errors: every CUDA, cuBLAS and NCCL call is checked; a failure gives
 * RT_ERR with one line "FILE:LINE: rank R: OP: what the library said"
 * (rt_err.h).  Kernel launch errors are caught at the launch
 * (rt_cuda_launched); errors inside kernels at the next synchronising call.
 *
 * GEMM precision (RtCudaSetup.gemm or PARC_CUDA_GEMM=fp32|bf16|tf32): fp32
 * (CUBLAS_COMPUTE_32F, for verification against the CPU trainer), bf16 (fp32
 * tensors, bf16 tensor-core products with fp32 accumulation:
 * CUBLAS_COMPUTE_32F_FAST_16BF), tf32 likewise.  Everything else is fp32.
 *
 * Every op below has the layout and the meaning of its CPU counterpart in
 * rt_gemm.h, rt_attention.h and rt_route.h, on device pointers, enqueued on
 * the compute stream.  Sums may be ordered differently from the CPU's (so
 * results agree to rounding, not bitwise) but are fixed for given sizes:
 * runs are reproducible.  Ids and targets are not range-checked on the
 * device (the harness's data never exceeds the vocabulary); an id outside
 * [0, V) gives a zero row (embedding) or is ignored. */
#ifndef PARC_RT_CUDA_H
#define PARC_RT_CUDA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "runtime/cuda/rt_cuda_ws_plan.h"
#include "runtime/rt_comm.h"
#include "runtime/rt_pipe.h"

struct CUstream_st; /* cudaStream_t */

typedef struct RtCuda RtCuda;

/* Collective groups: the mesh axes of ir/ops.def (tp 0, dp 1, ep 2, ep_dp 3) in
 * their order, then the pipeline's stages.  Each is the harness's group of the
 * same name (RtStepIO, rt_comm_mesh): same members, same rank order. */
enum { RT_CUDA_TP = 0, RT_CUDA_DP = 1, RT_CUDA_EP = 2, RT_CUDA_EP_DP = 3, RT_CUDA_PP = 4,
       RT_CUDA_NGROUPS = 5 };
/* RT_CUDA_GEMM_* (the GEMM modes) and RtCudaGemm: rt_cuda_ws_plan.h */

/* RT_CUDA_GEMM_WORKSPACE (cuBLASLt's), rt_cuda_planned_bytes: rt_cuda_ws_plan.h */

typedef struct {
  int64_t params_numel, state_numel; /* floats */
  int64_t arena_bytes;               /* the planned arena */
  int64_t rows, seq;                 /* this rank's tokens: [rows, seq] */
  int tp, dp;                        /* the mesh (ranks = tp * dp * pp) */
  RtComm *tp_group, *dp_group;       /* the harness's host groups (NULL: one rank) */
  int tp_rank, dp_rank;
  int pp, ep;                        /* pipeline stages, expert groups (0 is read as 1) */
  RtComm *pp_group, *ep_group, *ep_dp_group; /* RtStepIO's (NULL: one member) */
  int pp_rank;                       /* the stage: world rank tp_rank + tp (dp_rank + dp pp_rank) */
  int gemm;                          /* RT_CUDA_GEMM_*; PARC_CUDA_GEMM overrides */
  const char *model;                 /* for messages */
  const RtCudaGemm *gemms;           /* the trainer's GEMM calls (may repeat): their */
  int ngemms;                        /* operand workspaces are planned (rt_cuda_ws_plan.h) */
  int params_bf16;                   /* 1: keep the params' bf16 copy (rt_cuda_params_bf16) */
  int64_t reduce_piece;              /* the largest piece (count / members) of its
                                        rt_cuda_all_reduce_bf16 calls, floats (0: none):
                                        their f32 scratch */
  int64_t attn_dq_bytes;             /* the attention backwards' dq partials scratch, the
                                        largest rt_cuda_attn_dq_ws of its calls (0: none
                                        planned; a backward then allocates its own) */
} RtCudaSetup;

/* Picks the rank's GPU, checks the mesh and memory, allocates, uploads params
 * and state (host, may be NULL for zeros) and sets up streams, cuBLASLt and
 * the communicators.  Collective over the mesh (every rank calls it).
 * RT_OK; RT_ERR_SETUP where the start-up checks refuse the setup or a
 * start-up allocation finds the GPU out of memory (on every rank alike, see
 * above); RT_ERR for a failing CUDA, cuBLAS or NCCL call.
 * On failure *ctx may hold the part made (rt_cuda_close frees it). */
int rt_cuda_open(RtCuda **ctx, const RtCudaSetup *s, const float *params, const float *state);
/* Frees everything (communicators destroyed).  NULL is a no-op. */
void rt_cuda_close(RtCuda *ctx);

float *rt_cuda_params(RtCuda *c);
float *rt_cuda_state(RtCuda *c);
char *rt_cuda_arena(RtCuda *c);
int32_t *rt_cuda_tokens(RtCuda *c);
int32_t *rt_cuda_targets(RtCuda *c);
float *rt_cuda_scalar(RtCuda *c, int i); /* 0: lr, 1: step (device floats) */
struct CUstream_st *rt_cuda_stream(RtCuda *c);
int rt_cuda_group_rank(RtCuda *c, int group);
int rt_cuda_group_size(RtCuda *c, int group);
const char *rt_cuda_describe(RtCuda *c); /* "GPU 0 (NVIDIA H200), nccl" */

/* Copies the step's inputs to the device (on the compute stream). */
int rt_cuda_step_begin(RtCuda *c, const int32_t *tokens, const int32_t *targets, float lr,
                       float step);
/* Waits for the step and reads its scalars (device floats; NULL -> 0 / NAN). */
int rt_cuda_step_end(RtCuda *c, const float *loss, const float *ce_loss, const float *grad_norm,
                     float *loss_out, float *ce_out, float *grad_norm_out);
/* The step's device work, between rt_cuda_step_begin and rt_cuda_step_end:
 * body(arg) enqueues it on the compute stream (RT_OK or RT_ERR).  Unless
 * PARC_CUDA_GRAPH=0 or something keeps the step out of a graph
 * (rt_cuda_graph.h), the first step runs plainly (the warm-up), the second
 * is captured into a CUDA graph and launched, later ones replay it; a step
 * with save_grads (it copies to the host) runs plainly.  host_ops: the
 * body's host-staged ops (routing, expert all-to-all), which keep it out of
 * a graph.  A capture that fails (an op that waits or allocates) prints one
 * notice, and the step and the rest of the run are plain launches. */
typedef int (*RtCudaBody)(void *arg);
int rt_cuda_graph_step(RtCuda *c, RtCudaBody body, void *arg, int host_ops, int save_grads);
/* After a kernel launcher: RT_ERR naming `kernel` if the launch failed. */
int rt_cuda_launched(RtCuda *c, const char *kernel);
/* Device params and state to the host buffers (waits for the device). */
int rt_cuda_download(RtCuda *c, float *params, float *state);
/* n floats device -> host (synchronous; --save-grads) and device -> device. */
int rt_cuda_to_host(RtCuda *c, float *dst, const float *src, int64_t n);
int rt_cuda_copy(RtCuda *c, float *dst, const float *src, int64_t n);

/* ---- GEMM (rt_gemm.h) ---- */
/* The params' bf16 copy (RtCudaSetup.params_bf16; "bf16 weights" of mixed
 * precision): the GEMMs of a bf16 trainer read a weight from it
 * (RT_CUDA_MM_A_BF16 / _B_BF16) instead of converting its fp32 master copy
 * at every call.  rt_cuda_params_to_bf16 rounds every param to nearest even
 * into it, the rounding of the GEMMs' own operand copies, so the results
 * keep their bits; one pass on the compute stream, which rt_cuda_open runs
 * after the upload and the generated step runs first (after the last step's
 * update, whatever set the params: checkpoint, all-gather), except where
 * its optimizer's kernels store each param's copy as they update it
 * (codegen/cuda_store.h mirror_all).  rt_cuda_params_bf16(c, off): the copy of
 * the param at float offset off (a multiple of 8: rows 16-byte aligned), as
 * the GEMMs take a bf16 operand (a float pointer to bf16 elements); NULL
 * without a copy or past the params. */
int rt_cuda_params_to_bf16(RtCuda *c);
const float *rt_cuda_params_bf16(RtCuda *c, int64_t off);
int rt_cuda_matmul(RtCuda *c, float *out, const float *a, const float *b, int64_t batch,
                   int64_t m, int64_t k, int64_t n, int flags);
int rt_cuda_matmul_ta(RtCuda *c, float *out, const float *a, const float *b, int64_t batch,
                      int64_t m, int64_t k, int64_t n, int flags);
/* rt_cuda_matmul_ta, and bgrad[n] = the sums of b's k rows (a linear layer's
 * bias gradient, from the dy its weight gradient reads) in cuBLASLt's
 * epilogue, where it can: *done = 1.  *done = 0, bgrad untouched, and the
 * caller sums, where it cannot: no algorithm with the epilogue for the shape;
 * a batch, transpose_b or a bf16 or rounded result; cuBLASLt
 * rounding fp32 operands itself (GEMM mode bf16 or tf32 where the call makes
 * no bf16 copy); PARC_CUDA_BGRAD=0.  In GEMM mode bf16 the sums are of b's
 * bf16 values (stored so, or the call's rounded copy), as the GEMM reads
 * them.  rt_cuda_gemm.cu's head says more. */
int rt_cuda_matmul_ta_bgrad(RtCuda *c, float *out, const float *a, const float *b, float *bgrad,
                            int64_t batch, int64_t m, int64_t k, int64_t n, int flags, int *done);
/* *out = the context's scratch of n floats for a stage program's bias
 * gradient term: its weight gradient's GEMM adds the product into the
 * accumulator (RT_MM_ACCUMULATE) while rt_cuda_matmul_ta_bgrad's epilogue, or
 * the sum's kernel after it, writes the bias sums here, which ACC_GRAD then
 * adds into the accumulator (codegen/cuda_batch.h).  One buffer a context,
 * reused by every such call on the compute stream; grown at first use (a
 * pipelined step is never a captured graph).  RT_OK, or RT_ERR with the
 * message set (no memory; n < 1). */
int rt_cuda_bgrad_ws(RtCuda *c, int64_t n, float **out);
/* rt_cuda_matmul plus bias[n] (fp32) on every row, in cuBLASLt's BIAS epilogue
 * where it can: the biased result to out, written as out_flags say (its
 * RT_CUDA_MM_C_BF16 or _C_ROUND, or 0: fp32), and *done = 1.  Where it cannot
 * (no algorithm with the epilogue for the shape; a batch member's own b,
 * accumulation; PARC_CUDA_BIAS=0): the plain product to plain as flags say,
 * *done = 0, and the caller adds the bias.  Each element of the biased
 * result is fl(product + bias[j]), the value the plain product and an fp32
 * add give, rounded once where out is bf16 (the plain product's bf16 copy
 * and the add round twice). */
int rt_cuda_matmul_bias(RtCuda *c, float *out, float *plain, const float *a, const float *b,
                        const float *bias, int64_t batch, int64_t m, int64_t k, int64_t n,
                        int flags, int out_flags, int *done);
/* The GELU epilogues (GPT-2's MLP; cuBLASLt's GELU_AUX_BIAS and DGELU), gelu
 * the IR's tanh form, gelu(x) = 0.5 x (1 + tanh(0.7978845608 (x + 0.044715 x^3))).
 * rt_cuda_matmul_gelu: h = a b + bias[n] (fp32) on every row to aux and gelu(h)
 * to out, both written as out_flags say (RT_CUDA_MM_C_BF16; _C_ROUND: fp32
 * values rounded to bf16, both; or 0: fp32), and *done = 1.
 * rt_cuda_matmul_dgelu: out = (a b) * gelu'(aux), aux [m, n] of the type
 * out_flags say (the forward's aux), and *done = 1.  Where either cannot (no
 * algorithm with the epilogue for the shape; n not a multiple of 8, the aux's
 * leading dimension; a batch member's own b, accumulation; PARC_CUDA_GELU=0):
 * the plain product to plain as flags say, out and aux untouched, *done = 0,
 * and the caller computes the rest.  One member (the batch folds into m). */
int rt_cuda_matmul_gelu(RtCuda *c, float *out, float *aux, float *plain, const float *a,
                        const float *b, const float *bias, int64_t batch, int64_t m, int64_t k,
                        int64_t n, int flags, int out_flags, int *done);
int rt_cuda_matmul_dgelu(RtCuda *c, float *out, float *plain, const float *a, const float *b,
                         const float *aux, int64_t batch, int64_t m, int64_t k, int64_t n,
                         int flags, int out_flags, int *done);

/* ---- attention (rt_attention.h): flash-style, no T x T matrix ---- */
int rt_cuda_sdpa(RtCuda *c, float *out, float *lse, const float *q, const float *k,
                 const float *v, int64_t B, int64_t H, int64_t KV, int64_t T, int64_t hd,
                 float scale, int causal);
/* out, lse: rt_cuda_sdpa's for the same q, k, v (the backward then reads lse and
 * computes D = dy . out, no forward again), or both NULL (recomputed).  The
 * trainers call rt_cuda_sdpa_grad_stats where sdpa's out has a merged copy
 * (passes/attn_delta.c), this where it has not. */
int rt_cuda_sdpa_grad(RtCuda *c, float *dqkv, const float *q, const float *k, const float *v,
                      const float *dy, const float *out, const float *lse, int64_t B, int64_t H,
                      int64_t KV, int64_t T, int64_t hd, float scale, int causal);
/* From the row statistics alone (rt_sdpa_grad_stats): lse (rt_cuda_sdpa's) and
 * d = dy . out per row [B, H, T] (rt_cuda_sdpa_delta); out is not read. */
int rt_cuda_sdpa_grad_stats(RtCuda *c, float *dqkv, const float *q, const float *k,
                            const float *v, const float *dy, const float *lse, const float *d,
                            int64_t B, int64_t H, int64_t KV, int64_t T, int64_t hd, float scale,
                            int causal);
/* The same, with some tensors stored as bf16 (io: RT_CUDA_ATTN_* flags,
 * rt_cuda_ws_plan.h; a bf16 tensor is passed as its buffer's float pointer,
 * its elements in the buffer's first half).  A bf16 flag needs the
 * tensor-core kernels (GEMM mode bf16, rt_cuda_attn_stored_ok's shapes,
 * compute capability 8.0, PARC_CUDA_ATTN unset or mma4): else an error that
 * says so.
 * The layout flags (RT_CUDA_ATTN_O_TOKENS, _DY_TOKENS: token-major result,
 * dy) go with any kernels. */
/* The warps a block of the mma.sync attention kernels has for head dimension
 * hd and tensors io (RT_CUDA_ATTN_* flags): 8; 4 under PARC_CUDA_ATTN=mma4 where
 * those are built (hd 64 or 128, some tensor bf16).  For checks and reports. */
int rt_cuda_attn_mma_warps(int64_t hd, unsigned io);
int rt_cuda_sdpa_io(RtCuda *c, float *out, float *lse, const float *q, const float *k,
                    const float *v, int64_t B, int64_t H, int64_t KV, int64_t T, int64_t hd,
                    float scale, int causal, unsigned io);
int rt_cuda_sdpa_grad_stats_io(RtCuda *c, float *dqkv, const float *q, const float *k,
                               const float *v, const float *dy, const float *lse, const float *d,
                               int64_t B, int64_t H, int64_t KV, int64_t T, int64_t hd,
                               float scale, int causal, unsigned io);
/* d [B, H, T] = row sums of m * dm over the merged [B, T, H hd] (rt_sdpa_delta). */
int rt_cuda_sdpa_delta(RtCuda *c, float *d, const float *m, const float *dm, int64_t B, int64_t H,
                       int64_t T, int64_t hd);
/* The same with m and / or dm stored as bf16 (io: RT_CUDA_ATTN_M_BF16, _DM_BF16). */
int rt_cuda_sdpa_delta_io(RtCuda *c, float *d, const float *m, const float *dm, int64_t B,
                          int64_t H, int64_t T, int64_t hd, unsigned io);

/* ---- embedding and cross-entropy (rt_route.h; as there, the gradients'
 * dlogits may be their logits: in place, rt_cuda_ops.cu) ---- */
int rt_cuda_embedding(RtCuda *c, float *out, const int32_t *ids, const float *table,
                      int64_t count, int64_t V, int64_t D);
int rt_cuda_embedding_grad(RtCuda *c, float *dtable, const int32_t *ids, const float *dy,
                           int64_t count, int64_t V, int64_t D);
/* onto what dtable holds, not zeroed first (rt_route.h's rt_embedding_grad_acc) */
int rt_cuda_embedding_grad_acc(RtCuda *c, float *dtable, const int32_t *ids, const float *dy,
                               int64_t count, int64_t V, int64_t D);
int rt_cuda_cross_entropy(RtCuda *c, float *loss, const float *logits, const int32_t *targets,
                          int64_t N, int64_t V);
int rt_cuda_cross_entropy_grad(RtCuda *c, float *dlogits, const float *logits,
                               const int32_t *targets, const float *dloss, int64_t N,
                               int64_t V);
/* The same with dlogits stored as bf16 (rounded to nearest even) for GEMMs
 * that read it so (RT_CUDA_MM_A_WIDE, rt_cuda_ws_plan.h): row p in the first
 * half of the bytes of the fp32 row p, so rows of 2 V bf16 elements; dlogits
 * may be logits, as above. */
int rt_cuda_cross_entropy_grad_bf16(RtCuda *c, float *dlogits, const float *logits,
                                    const int32_t *targets, const float *dloss, int64_t N,
                                    int64_t V);
/* cross_entropy and its gradient with the logits stored as bf16 (rows of V,
 * as their GEMM writes them: RT_CUDA_MM_C_BF16), and dlogits too (rows of V,
 * rounded to nearest even; may be the logits, in place): the values of the
 * fp32 ops on the widened logits, dlogits rounded.  codegen/cuda_store.h. */
int rt_cuda_cross_entropy_bf16(RtCuda *c, float *loss, const float *logits,
                               const int32_t *targets, int64_t N, int64_t V);
int rt_cuda_cross_entropy_grad_bf16io(RtCuda *c, float *dlogits, const float *logits,
                                      const int32_t *targets, const float *dloss, int64_t N,
                                      int64_t V);
int rt_cuda_vocab_embedding(RtCuda *c, float *out, const int32_t *ids, const float *table,
                            int64_t count, int64_t Vl, int64_t D, int part, int parts);
int rt_cuda_vocab_embedding_grad(RtCuda *c, float *dtable, const int32_t *ids, const float *dy,
                                 int64_t count, int64_t Vl, int64_t D, int part, int parts);
int rt_cuda_vocab_embedding_grad_acc(RtCuda *c, float *dtable, const int32_t *ids,
                                     const float *dy, int64_t count, int64_t Vl, int64_t D,
                                     int part, int parts); /* onto dtable, as above */
int rt_cuda_vocab_cross_entropy(RtCuda *c, int group, float *loss, const float *logits,
                                const int32_t *targets, int64_t N, int64_t Vl, int64_t V);
int rt_cuda_vocab_cross_entropy_grad(RtCuda *c, int group, float *dlogits, const float *logits,
                                     const int32_t *targets, const float *dloss, int64_t N,
                                     int64_t Vl, int64_t V);
/* The same with dlogits as bf16 rows of 2 Vl, as rt_cuda_cross_entropy_grad_bf16. */
int rt_cuda_vocab_cross_entropy_grad_bf16(RtCuda *c, int group, float *dlogits,
                                          const float *logits, const int32_t *targets,
                                          const float *dloss, int64_t N, int64_t Vl, int64_t V);
/* Logits (and dlogits) as bf16 rows of Vl, as rt_cuda_cross_entropy_bf16 and
 * rt_cuda_cross_entropy_grad_bf16io. */
int rt_cuda_vocab_cross_entropy_bf16(RtCuda *c, int group, float *loss, const float *logits,
                                     const int32_t *targets, int64_t N, int64_t Vl, int64_t V);
int rt_cuda_vocab_cross_entropy_grad_bf16io(RtCuda *c, int group, float *dlogits,
                                            const float *logits, const int32_t *targets,
                                            const float *dloss, int64_t N, int64_t Vl,
                                            int64_t V);
/* The forward's loss and the gradient in one call, the same bits as the two
 * calls above (each row's statistics taken once: the forward's own passes
 * over the logits saved).  group < 0: cross_entropy (Vl == V), else
 * vocab_cross_entropy over that group.  io: 0 (fp32 logits and dlogits),
 * RT_CUDA_XENT_BF16IO (both bf16, as the _bf16 / _bf16io calls) or
 * RT_CUDA_XENT_BF16OUT (fp32 logits, dlogits as bf16 rows of 2 Vl, as the
 * _grad_bf16 calls).  codegen/host_cuda.c makes the call where the loss is
 * read by nothing but the step's end (xent_pairs). */
enum { RT_CUDA_XENT_BF16IO = 1, RT_CUDA_XENT_BF16OUT = 2 };
int rt_cuda_cross_entropy_fused(RtCuda *c, int group, unsigned io, float *loss, float *dlogits,
                                const float *logits, const int32_t *targets, const float *dloss,
                                int64_t N, int64_t Vl, int64_t V);

/* ---- routing (rt_route.h): staged through the host and the CPU routines
 * (correct, not fast: a GPU version is future work) ---- */
int rt_cuda_topk(RtCuda *c, int32_t *out, const float *x, int64_t rows, int64_t n, int64_t k);
int rt_cuda_gather(RtCuda *c, float *out, const float *x, const int32_t *idx, int64_t rows,
                   int64_t n, int64_t k);
int rt_cuda_scatter_add(RtCuda *c, float *out, const int32_t *idx, const float *dy,
                        int64_t rows, int64_t k, int64_t n);
int rt_cuda_onehot(RtCuda *c, float *out, const int32_t *idx, int64_t count, int64_t n);
int rt_cuda_dispatch(RtCuda *c, float *out, const float *x, const int32_t *idx, int64_t N,
                     int64_t K, int64_t D, int64_t E, int64_t C);
int rt_cuda_combine(RtCuda *c, float *out, const float *y, const int32_t *idx, const float *w,
                    int64_t N, int64_t K, int64_t D, int64_t E, int64_t C);
int rt_cuda_combine_grad_y(RtCuda *c, float *dy, const float *dout, const int32_t *idx,
                           const float *w, int64_t N, int64_t K, int64_t D, int64_t E,
                           int64_t C);
/* capacity_drop: decided over the dp group (the harness's host group) */
int rt_cuda_capacity_drop(RtCuda *c, int32_t *out, const int32_t *idx, int64_t N, int64_t K,
                          int64_t E, int64_t C);
int rt_cuda_combine_grad_w(RtCuda *c, float *dw, const float *dout, const float *y,
                           const int32_t *idx, int64_t N, int64_t K, int64_t D, int64_t E,
                           int64_t C);

/* ---- expert parallelism (rt_expert.h): staged through the host and
 * rt_expert_all_to_all over the harness's group `group` (RT_CUDA_EP): copies
 * x and idx to the host, runs the CPU routine, copies out back.  Correct, not
 * fast (a device all-to-all is future work). ---- */
int rt_cuda_expert_all_to_all(RtCuda *c, int group, float *out, const float *x,
                              const int32_t *idx, int64_t nk, int64_t E, int64_t C,
                              int64_t inner, int back);

/* ---- pipelined trainers (rt_pipe.h on the device; rt_cuda_pipe.cu) ----
 * The generated stage functions are host.c's (codegen/host.h, cg_emit_pipe) on
 * device buffers; these are their statements that train.c writes as C on host
 * memory, and the step itself. */
int rt_cuda_zero(RtCuda *c, float *x, int64_t n);                 /* x[0, n) = 0 */
int rt_cuda_acc(RtCuda *c, float *dst, const float *src, int64_t n); /* dst += src */
/* The n device floats *x[i] each summed over `group` (one collective). */
int rt_cuda_sum_scalars(RtCuda *c, int group, float *const *x, int n);
/* The last chunk's forward: this microbatch's loss and cross-entropy (device
 * floats; ce NULL: the loss), read back when the step ends. */
int rt_cuda_pipe_loss(RtCuda *c, const float *loss, const float *ce);
/* The optimizer: the global gradient norm (device float; NULL: none). */
int rt_cuda_pipe_norm(RtCuda *c, const float *grad_norm);
/* rt_pipe_step's step on the device, after rt_cuda_step_begin uploaded all
 * the rank's microbatches: the stage's action list with io->arena, tokens,
 * targets, params, state and gacc pointing at device memory (microbatch mb's
 * slot rt_pipe_slot(p, s, mb) of the device arena, the accumulator after the
 * stage's slots), boundary values sent
 * and received over the pp group (NCCL point-to-point when the schedule is
 * safe with rendezvous sends -- checked once by simulating every stage's list
 * --, else staged through the host communicator, whose sends are buffered:
 * rt_pipe.h's semantics); the accumulator summed over dp (the expert-parallel
 * parameters' regions, RtPipeDesc.expert, over ep_dp instead), shared parameters
 * summed between their holders in stage order (the mean: the seed is 1 / (M dp)), stored
 * to io->grads when asked; the loss the mean of the microbatches' (summed in
 * double on the host, as rt_pipe_step); then the stage's optimizer on slot
 * 0.  Sets io->loss, ce_loss, grad_norm.  Under ZeRO-1 the accumulator is
 * reduce-scattered in rt_pipe.c's buckets instead of all-reduced (each bucket
 * one collective of unequal pieces, rt_cuda_reduce_scatter_v; the optimizer
 * reads the rank's pieces), and all-gathered the same way for io->grads.  0,
 * or -1 with rt_fail(). */
int rt_cuda_pipe_step(RtCuda *c, RtStepIO *io, const RtPipeDesc *p);

/* ---- collectives over a group (rt_comm.h, rt_route.h), device buffers ---- */
int rt_cuda_all_reduce(RtCuda *c, int group, const float *send, float *recv, int64_t count);
/* The same sum, rounded once to bf16 (to nearest even) as it is stored: as
 * bf16 in the first half of recv's bytes (recv holds count bf16 elements;
 * send stays f32), or with round, as f32 values in recv (the reference of
 * --bf16-store round).  count splits into pieces of an even number of
 * elements, one a member (count % (2 members) == 0).  A reduce-scatter of
 * the f32 partials puts the member's piece of the sum into an f32 scratch of
 * RtCudaSetup.reduce_piece floats (round: into its place in recv), a pass
 * rounds it into its place in recv, and an all-gather of the rounded pieces
 * (bf16: half the bytes) completes recv: 3/4 of an f32 all-reduce's bytes on
 * a ring.  Both modes make the same collectives, so their sums agree bit for
 * bit on every backend (codegen/cuda_store.h). */
int rt_cuda_all_reduce_bf16(RtCuda *c, int group, const float *send, float *recv,
                            int64_t count, int round);
/* equal blocks: `count` floats per member */
int rt_cuda_all_gather(RtCuda *c, int group, const float *send, float *recv, int64_t count);
int rt_cuda_reduce_scatter(RtCuda *c, int group, const float *send, float *recv, int64_t count);
/* unequal pieces: member r's is counts[r] floats, the members' side by side in
 * send (reduce-scatter: the member's sum lands in recv) or in recv (all-gather:
 * the member's own from send); recv may be the member's place in send (recv)
 * -- in place */
int rt_cuda_reduce_scatter_v(RtCuda *c, int group, const float *send, float *recv,
                             const int64_t *counts);
int rt_cuda_all_gather_v(RtCuda *c, int group, const float *send, float *recv,
                         const int64_t *counts);
int rt_cuda_all_gather_dim(RtCuda *c, int group, const float *x, float *out, int64_t outer,
                           int64_t n, int64_t inner);
int rt_cuda_reduce_scatter_dim(RtCuda *c, int group, const float *x, float *out, int64_t outer,
                               int64_t n, int64_t inner);
int rt_cuda_local_slice(RtCuda *c, float *out, const float *x, int64_t outer, int64_t n,
                        int64_t inner, int part, int parts);
int rt_cuda_flat_piece(RtCuda *c, int group, const float *x, int64_t n, float *out, int64_t s);

/* ---- the per-kernel profile (PARC_CUDA_PROFILE; rt_cuda_prof.h) ----
 * Every step after the first records CUDA events on the compute stream
 * around each op; the table (per rank, by total time) is printed at exit and
 * written as JSON lines when PARC_CUDA_PROFILE names a .json/.jsonl file.
 * The generated code brackets each fused kernel:
 *     if (prof_) rt_cuda_prof_begin(dev);  KERNEL_launch(...);
 *     ...; if (prof_) rt_cuda_prof_kernel(dev, "KERNEL", bytes);
 * with prof_ = rt_cuda_profiling(dev) read once per step (or stage
 * function) after rt_cuda_step_begin; the runtime ops above bracket
 * themselves (an op called inside another counts as the outer one), named
 * and measured as follows (4-byte elements; bytes each input read once and
 * each output written once, FLOPs the model's):
 *   matmul / matmul_ta "BxMxKxN" (B omitted at 1; a's batch folded into M
 *       where the GEMM does; "+=" when accumulating): 2 B M K N FLOPs;
 *       bytes a, b, out (out twice when accumulating); kind gemm (tensor
 *       cores: bf16, tf32) or gemm_fp32;
 *   sdpa, sdpa_grad "BxHxKVxTxhd[ causal]": 4 B H P hd FLOPs forward, 10 B H
 *       P hd backward (2.5 times; the kernels recompute more), P = T^2, or
 *       T (T + 1) / 2 causal; bytes q, k, v, out (and lse) / q, k, v, dy,
 *       dqkv (and the forward's out, lse when given); kind attention (fp32,
 *       CUDA cores) or attention_tc (the bf16 tensor-core kernels,
 *       rt_cuda_attn_tc.cu);
 *   embedding: ids, the rows read, out; embedding_grad: ids, dy, the whole
 *       dtable (zeroed and written); cross_entropy: logits, targets;
 *       cross_entropy_grad: logits, targets, dlogits; their vocab_ forms
 *       likewise on the local columns (their gathers included); copies,
 *       zero, acc, local_slice, flat_piece: what they read and write; kind op;
 *   collectives "all_reduce tp" ...: the larger side's payload (nccl-tests'
 *       algorithm bandwidth), pipeline transfers the values sent or received;
 *       kind comm, no ceiling;
 *   routing ops and the expert all-to-all (host-staged), rt_cuda_to_host:
 *       the bytes staged; kind host. */
/* 1 while this step records (or counts, the first step): read after
 * rt_cuda_step_begin. */
int rt_cuda_profiling(RtCuda *c);
/* Before a generated kernel's launch, when rt_cuda_profiling. */
void rt_cuda_prof_begin(RtCuda *c);
/* After it (after rt_cuda_launched): its name and the bytes it moves. */
void rt_cuda_prof_kernel(RtCuda *c, const char *kernel, int64_t bytes);

#ifdef __cplusplus
}
#endif

#endif
