/* passes/passes.h -- the compiler's passes, each one file with one entry
 * point, run in order from the table in passes/pipeline.c.  Passes never
 * include a backend header. */
#ifndef PARC_PASSES_H
#define PARC_PASSES_H

#include <stdint.h>
#include <stdio.h>

#include "ir/ir.h"
#include "passes/machine.h"

/* The device mesh the user asked for.  Rank order: tp fastest, then dp
 * (ep carved from it), then pp. */
typedef struct {
  int tp, pp, dp, ep;
  int zero;                /* ZeRO stage: 1 shards the optimizer state over dp */
} Layout;

#define LAYOUT_MAX_DEGREE 65536
#define LAYOUT_MAX_RANKS  (1 << 20)
#define PP_MAX_STAGES     64 /* pipeline stages with stage-local parameters (passes/pp_split.c:
                                 a parameter's holders are the bits of a uint64_t) */

/* Options the pass pipeline reads. */
typedef struct {
  int verify;             /* run ir_verify after every pass */
  const char *dump_after; /* print the IR after the pass of this name */
  FILE *dump;             /* where --dump-after writes */
  const char *stop_after; /* NULL: every pass; else stop after this one */
  const char *start_after; /* NULL: from the first pass; else after this one */
  int zero;               /* ZeRO stage (0 or 1): 1 sets m->mesh_zero = mesh_dp on a
                             module sharded for dp > 1, before dp_grads */
  int64_t bucket_bytes;   /* dp gradient bucket bytes (m->dp_bucket_bytes); 0: default */
  int no_overlap;         /* 1 sets m->dp_blocking (blocking dp bucket collectives) */
  int keep_attn_out;      /* 1 skips attn_delta: sdpa_grad reads sdpa's out (the
                             plan before that pass, for comparison) */
  int head_major_attn;    /* 1 skips attn_layout: head copies around attention stay */
  int recompute_norms;    /* 1 runs remat_norm: the backward recomputes the layers' norm
                             outputs instead of keeping them (parc --recompute norms) */
  int recompute_pointwise; /* 1 runs remat_act: the backward recomputes the layers'
                             pointwise values from ones it keeps anyway (parc
                             --recompute pointwise) */
  int recompute_layers;   /* 1 runs remat_layer: the backward runs each layer's
                             forward again (parc --recompute layers) */
} PassOptions;

/* Runs every pass in order.  Returns 0, or -1 after printing an internal
 * error that names the pass whose output failed verification. */
int pass_run_all(IrModule *m, const PassOptions *opt);
/* Name of pass i, NULL past the end (for --help and --dump-after checks). */
const char *pass_name(int i);

/* passes/intent.c: resolves each column/row parameter's intent to the
 * tensor dimension it splits, from the matmul that consumes it. */
int pass_intent(IrModule *m);

/* passes/dce.c: removes nodes that the loss does not depend on, keeping
 * every graph value (inputs and parameters). */
int pass_dce(IrModule *m);

/* passes/autodiff.c: appends the backward pass: d(loss)/d(p) for every
 * parameter p the loss depends on, recorded as p->grad, every new node
 * tagged IR_PHASE_B or IR_PHASE_W (see ir/ir.h).  Not in the default pass
 * list yet.  Returns -1 after printing why (an op with no gradient rule,
 * a module already differentiated). */
int pass_autodiff(IrModule *m);

/* passes/attn_delta.c: where sdpa's out has a merge_heads copy and its
 * gradient arrives through split_heads, sdpa_grad(q, k, v, dy, y) becomes
 * sdpa_grad(q, k, v, dy, sdpa_lse(y), sdpa_delta(merged, dmerged)), so out
 * dies in the forward.  Returns -1 after printing an internal error. */
int pass_attn_delta(IrModule *m);

/* passes/gelu_epilogue.c: in bf16 mixed precision, a linear layer's GELU
 * input h = add(matmul, bias) is kept for its gradient instead of
 * recomputed (remat leaves it: gelu_epilogue_input), and each dg's matmul
 * moves to right before its gelu_grad(h, dg), so that the GPU trainer's
 * GEMMs can compute gelu(h), h and dh in their epilogues.  Returns 0. */
int pass_gelu_epilogue(IrModule *m);
/* 1 if p is such an h of m (in a bf16 mixed-precision module). */
int gelu_epilogue_input(const IrModule *m, const IrNode *p);

/* passes/remat.c: a forward pointwise op of one activation and leaves (a bias
 * add), read by pointwise ops in the forward and the backward, gets a copy
 * that the backward readers read instead, so that neither is stored (GPT-2's
 * MLP pre-activation).  Returns -1 after printing an internal error. */
int pass_remat(IrModule *m);

/* passes/remat_norm.c: a layer's norm output (and its forward group_copy),
 * read by the backward, is recomputed there from the norm's input, which
 * the norm's gradient keeps anyway: the forward's value dies early (parc
 * --recompute norms; PassOptions.recompute_norms).  Returns -1 after
 * printing an internal error. */
int pass_remat_norm(IrModule *m);

/* passes/remat_layer.c: each layer's forward run again at the start of its
 * backward, which reads the copies instead of values kept from the forward
 * (parc --recompute layers; PassOptions.recompute_layers).  Sets
 * m->remat_layers and m->remat_layer_nodes.  Returns -1 after printing an
 * internal error. */
int pass_remat_layer(IrModule *m);

/* passes/remat_act.c: the layers' forward pointwise values the backward
 * reads, recomputed there from values it keeps anyway (gelu(h), silu(g) *
 * u) instead of kept from the forward (parc --recompute pointwise;
 * PassOptions.recompute_pointwise).  Sets m->remat_act.  Returns -1 after
 * printing an internal error. */
int pass_remat_act(IrModule *m);
/* The forward pointwise values of m's layers that the backward reads and
 * could recompute from leaves and values it keeps anyway (directly or
 * through other pointwise values): 0 where --recompute pointwise would do
 * nothing (the report's hint reads it on the module after every pass). */
int remat_act_candidates(const IrModule *m);

/* passes/optimizer.c: appends the optimizer step after autodiff, with
 * PyTorch's semantics: global-norm clipping (train setting clip), then
 * AdamW or SGD with momentum (m->optimizer, m->optim) for every parameter
 * with a gradient; records the updates (IrModule.updates: each parameter
 * and optimizer state leaf with its value for the next step) and the
 * gradient norm before clipping (m->grad_norm).  Adds the scalar INPUTs
 * `lr` (the scheduled learning rate) and `step` (1-based), which the host
 * fills every step.  Every new node is IR_PHASE_OPT.  Not in the default
 * pass list yet.  Returns -1 after printing why (missing or out-of-range
 * settings, a name taken, a module that already has its optimizer). */
int pass_optimizer(IrModule *m);

/* passes/slice_sink.c: a pointwise op read only by slices becomes, at each
 * slice, the op over slices of its operands (the same bits), so that it is
 * computed in the slices' readers and never stored (GPT-2's q|k|v bias add).
 * Runs last, after the optimizer.  Returns -1 after printing an internal
 * error. */
int pass_slice_sink(IrModule *m);

/* passes/attn_layout.c: sdpa writes its out, and sdpa_grad reads dy and
 * writes dq|dk|dv, token-major (IR_SDPA_*) where the neighbours only
 * split or merge heads: those copies go.  Runs last. */
int pass_attn_layout(IrModule *m);

/* passes/shard.c: tensor (Megatron column/row), sequence (sp != 0, with
 * tp > 1; a no-op with tp == 1) and data parallelism, and vocabulary
 * padding (m->pad_vocab, at tp 1 too).
 * Rewrites the forward module (after intent and dce, before autodiff) into
 * the rank-local module every rank of a tp x dp mesh runs: local shapes,
 * sharded PARAMs recording shard_degree, shard_blocks and global_shape
 * (vocabulary tables padded), INPUTs with batch / dp rows, all_reduce
 * (Megatron's g), group_copy (Megatron's f), and under sp reduce_scatter /
 * all_gather on the sequence, on the tp axis where layouts meet.  Not in
 * the default pass list.  Returns 0, or -1 with a one-line reason in err
 * for what it cannot shard yet (the module must then be freed, not used). */
int pass_shard(IrModule *m, int tp, int dp, int sp, char *err, size_t len);
/* What pass_shard's messages append at tp 1 when the padding is the reason
 * (IrModule.pad_refused): how to drop it. */
#define PASS_SHARD_PAD_HINT " (at tp 1 the padding is --pad-vocab's; --pad-vocab 1 leaves the " \
                            "vocabulary unpadded)"

/* passes/ep_grads.c: expert-parallel weights' gradients (ep_sharded: shard
 * IR_SHARD_EXPERT split over ep > 1) summed over the ranks holding the same
 * experts (axis 3) and divided by dp.  pass_dp_grads calls it and leaves
 * those weights out of its buckets.  0, or -1 after a message. */
int ep_sharded(const IrNode *p);
int pass_ep_grads(IrModule *m, int dp);

/* passes/dp_grads.c: after pass_autodiff on a module pass_shard made with
 * dp > 1, before the optimizer: every parameter gradient becomes the mean
 * over the dp ranks, reduced in buckets of about m->dp_bucket_bytes (one
 * all_reduce(dp) per bucket over a flat buffer, placed right after the
 * bucket's last gradient in node order; the scale 1/dp and per-parameter
 * views after the backward pass; phase W).  Under ZeRO-1 (m->mesh_zero ==
 * dp) each bucket is reduce_scattered instead and p->grad becomes the
 * rank's piece of the flattened mean gradient (ir/ir.h flat_shards).  No-op
 * when dp == 1.  Returns 0, or -1 after printing an internal error. */
#define DP_BUCKET_BYTES_DEFAULT ((int64_t)25 << 20) /* PyTorch DDP's 25 MiB */
int pass_dp_grads(IrModule *m, int dp);
/* 1 if n is the collective of a bucket pass_dp_grads made (all_reduce, or
 * reduce_scatter under ZeRO-1, over the dp axis, in the backward pass), whose
 * result nothing reads before the backward pass ends: codegen may run it
 * asynchronously. */
int dp_grads_is_bucket(const IrNode *n);

/* passes/layout.c: checks the degrees against the model; prints one line
 * per problem to err and returns how many there were. */
int layout_check(const IrModule *m, const Layout *lay, FILE *err);

/* passes/cost.c: what a layout costs, per rank and stage. */
typedef struct {
  int first_layer, nlayers;  /* layers held, [first, first + n) */
  int64_t params;            /* parameters one rank of this stage holds */
} StageCost;

/* passes/comm_cost.c: collectives per step of a rank-local module, by
 * group (the mesh axes: 0 tp, 1 dp, 2 ep, 3 ep_dp; 4 pp: a pipelined
 * trainer's stage boundaries, shared gradients, loss and norm) and kind (send
 * and receive: point to point, pp only). */
#define COMM_GROUPS 5
#define COMM_PP 4 /* the pp group's index */
typedef enum {
  COMM_ALL_REDUCE, COMM_ALL_GATHER, COMM_REDUCE_SCATTER, COMM_SEND, COMM_RECV, COMM_KINDS
} CommKind;
typedef struct {
  int count;
  double payload_bytes;      /* the tensors the group combines */
  double sent_bytes;         /* what one rank sends, ring schedules */
} CommEntry;
typedef struct {
  CommEntry e[COMM_GROUPS][COMM_KINDS];
  int group_size[COMM_GROUPS]; /* 0 where the group does not communicate */
  /* expert parallelism: expert_all_to_all per step over the ep group (only
   * filled slots travel, so the bytes are an upper bound: every slot full) */
  int a2a_count, a2a_group;
  double a2a_payload_bytes, a2a_sent_bytes;
} CommCost;

void comm_analyze(const IrModule *m, CommCost *out);

/* Where the GPU trainer's collectives differ from the plan's (codegen/
 * cuda_store.h), per group: an all-reduce whose sum it stores as bf16 runs as
 * a reduce-scatter of the f32 partials and an all-gather of the bf16 pieces
 * (rt_cuda_all_reduce_bf16) -- one collective more, and (n-1)/n of 2 bytes an
 * element less sent by a rank (ring); an all-gather of bf16 values sends
 * (n-1)/n of 2 bytes an element less; a vocabulary-parallel loss computed in
 * its gradient's call (codegen/host_cuda.h, cg_cuda_xent_fused) gathers its
 * statistics once for both: the forward's gathers are not run. */
typedef struct {
  int sums[COMM_GROUPS];           /* such all-reduces a step: a collective more each */
  int gathers[COMM_GROUPS];        /* such all-gathers a step */
  int fused[COMM_GROUPS];          /* collectives of the plan's not run (the fused loss's) */
  int sends[COMM_GROUPS];          /* sends of bf16 values a step (pp: a stage's boundary
                                    * values the GPU trainer stores as bf16, 2 bytes an
                                    * element less each) */
  double saved_bytes[COMM_GROUPS]; /* the bytes a rank sends less */
} CommGpu;

/* Adds collective n, run `times` times a step, to d: an all-reduce whose sum
 * the GPU trainer stores as bf16, or an all-gather of bf16 values (other
 * ops: nothing). */
void comm_gpu_bf16(CommGpu *d, const IrNode *n, int times);
/* Adds to d node n's collectives (a vocab_cross_entropy's gathers, as
 * comm_analyze counts them), which the GPU trainer does not run. */
void comm_gpu_fused(CommGpu *d, const IrNode *n);

/* codegen/step_model.c: a rank's predicted compute time a step (a rank of
 * a layout at pp = 1: the rank-local module's kernels and runtime calls), and
 * how its collectives differ from the plan's. */
typedef struct {
  int valid;                 /* 0: not predicted (the report falls back on FLOPs) */
  double gemm_s, attn_s, mem_s; /* time of the GEMM, attention and memory-bound calls */
  double fwd_s, bwd_s, opt_s;   /* the same time by phase (bwd: B and W) */
  double gemm_flops, attn_flops, bytes;
  int calls;                 /* kernels and runtime calls a step */
  CommGpu comm;              /* the GPU trainer's collectives against the plan's */
} StepTime;

/* What the GPU trainer of a rank allocates, planned before launch
 * (codegen/arena_plan.h: cg_plan_arena, cg_write_project). */
typedef struct {
  int64_t gemm_ws;  /* its bf16 GEMM operand workspaces and the params' bf16 copy
                       (cg_gemm_ws_bytes; 0 in fp32) */
  int64_t reduce_ws; /* the f32 scratch of its all-reduces stored as bf16
                        (4 bytes a float of CgCudaStore.reduce_piece; 0: none) */
  int64_t attn_dq_ws; /* the f32 scratch of its attention backwards' dq partial sums
                         (CgCudaStore.attn_dq; 0: none) */
  int64_t arena;    /* its activation arena where it is not train.c's (codegen/cuda_arena.h:
                       values stored as bf16 at 2 bytes), else 0; a trainer of stage
                       programs: its largest stage's */
  int64_t device;   /* everything rt_cuda_open plans and checks against the GPU's free
                       memory (rt_cuda_planned_bytes); a trainer of stage programs: its
                       largest stage's; 0: not planned */
  int nstages;      /* a trainer of stage programs (pipelined, or a routed model's
                       accumulated microbatches): its stages, else 0 */
  int64_t stage_device[PP_MAX_STAGES]; /* per stage: device of a rank of that stage */
  /* a trainer of stage programs (nstages > 0): its arenas' slots (a slot holds a
   * stage's values of one microbatch) */
  int stage_slots[PP_MAX_STAGES]; /* per stage: its slots */
  int64_t slot;     /* the largest stage's slot bytes (stage_slot's largest) */
  int64_t stage_slot[PP_MAX_STAGES]; /* per stage: a slot's bytes, its values'
                       offsets' end and its kernels' temporaries (cg_pipe_slot_bytes) */
  int64_t stage_live[PP_MAX_STAGES]; /* per stage: the most bytes its values of one
                       microbatch hold at once in a slot (BufPlan.arena_live) */
} GpuBytes;

typedef struct {
  int64_t params;            /* the model as written */
  int nparam_tensors;
  int64_t vocab, padded_vocab, padding_params; /* the vocab tables' rows, padded
                                (ir_padded_vocab with m->pad_vocab), and the
                                padding's parameters over the whole mesh */
  double flops_fwd;          /* one forward pass over the whole batch */
  double flops_attn_fwd;     /* of which the attention score/value products */
  int64_t tokens;            /* tokens in one batch */
  int nstages;
  StageCost *stages;         /* nstages entries, in the module's arena */
  int64_t arena_bytes;       /* the trainer's planned activation arena; 0 until
                                code generation has planned it */
  GpuBytes gpu;              /* with it: the GPU trainer's (codegen/arena_plan.h) */
  int has_comm;              /* comm holds the collectives one rank runs a step: the
                                rank-local module's, or a pipelined trainer's
                                (comm_analyze_pipe; with pp > 1, stage 0's) */
  CommCost comm;
  const CommCost *stage_comm; /* pp > 1 with has_comm: per stage (nstage_comm of them:
                                 pp, not the chunks), else NULL */
  int nstage_comm;
  const struct PpPlan *pipe; /* --pp > 1: the pipeline plan (report section), else NULL */
  const struct PpPlan *accum; /* pp 1, a routed model's M > 1 microbatches: their
                                 one-stage plan when timed by its kernels (the
                                 predicted step), else NULL */
  int microbatches;          /* microbatches a step routes (pp_request_check's, so
                                --microbatches at pp 1 too); 0: unknown, the report
                                then takes the train section's.  Set by the caller */
  const Machine *machine;    /* the step time's machine (the caller's; NULL: the default) */
  int bf16;                  /* the train section's precision is bf16 */
  int overlap_dp;            /* dp collectives overlap the backward (not --no-overlap) */
  int sp;                    /* sequence parallelism over tp (--sp); set by the caller */
  StepTime step;             /* set by the caller from the kernel plan, when it has one */
} Cost;

int cost_analyze(IrModule *m, const Layout *lay, Cost *out);
/* As cost_analyze, with the layers split into nstages contiguous stages of
 * stage_layers[s] layers each (NULL: the even split over lay->pp). */
int cost_analyze_split(IrModule *m, const Layout *lay, const int *stage_layers, int nstages,
                       Cost *out);

/* ---- pipeline parallelism: compile-time plan --------------------------------
 * passes/pp_plan.c checks the request and glues the three steps together;
 * passes/stages.c splits the layers into stages, passes/schedule.c writes
 * each stage's action list, passes/schedule_check.c simulates and checks it.
 * A chunk is a contiguous run of layers; with V virtual stages (interleaved)
 * there are P*V chunks and chunk c runs on stage (rank) c % P, else chunk c
 * is stage c. */
typedef enum { PP_GPIPE, PP_1F1B, PP_INTERLEAVED, PP_ZB_H1, PP_NSCHEDULES } PpScheduleKind;
extern const char *const pp_schedule_name[PP_NSCHEDULES]; /* "gpipe", "1f1b", ... */

/* What the user asked for; 0 / NULL means "the default" until
 * pp_request_check fills it in. */
typedef struct {
  PpScheduleKind schedule;
  int schedule_given;        /* --schedule was on the command line */
  int microbatches;          /* M */
  int virtual_stages;        /* V: chunks per stage, 1 but for interleaved */
  const int *stage_layers;   /* layer counts per chunk, or NULL: balanced */
  int nstage_layers;
  int memory;                /* --stage-layers memory: the driver chose stage_layers by
                                pp_split_search (NULL until it has) */
  const int *time_layers;    /* then: the split balanced by FLOPs it started from */
  const struct PpSplitSearch *search; /* then: its outcome (the report says it) */
  const char *emit;          /* --emit value, for "timeline"/"trace" needing a pipeline */
  const Machine *machine;    /* --machine, for the simulation's rates (NULL: the default) */
} PpRequest;

typedef struct {
  int stage;                 /* rank that runs it: c % P */
  int first_layer, nlayers;  /* layers [first, first + n) */
  int embedding, head;       /* holds the nodes before the first layer / after the last */
  /* one microbatch on one rank of the stage (batch / (dp M), matmuls / tp) */
  double flops_f, flops_b, flops_w; /* forward, input-gradient (B), weight-gradient (W) */
  int64_t params;            /* parameters its forward reads (all tp ranks together) */
  int64_t param_bytes;       /* fp32 bytes of those */
  int64_t stash_bytes;       /* forward values its backward reads, one microbatch */
  int64_t boundary_bytes;    /* activations it sends to chunk c + 1, one microbatch
                                (its gradients come back the same size); 0 on the last */
} PpChunk;

typedef struct {
  int nstages, nvirtual, nchunks; /* P, V, P * V */
  int microbatches;
  PpChunk *chunks;           /* nchunks, in the module's arena */
  int *chunk_layers;         /* nchunks layer counts (for cost_analyze_split) */
} PpStages;

/* Splits the layers of a differentiated module (after pass_autodiff) into
 * req->virtual_stages * lay->pp chunks: req->stage_layers when given, equal
 * chunks for interleaved, else the split minimising the largest chunk's
 * forward+backward FLOPs (the embedding's cost on chunk 0, the head's and
 * loss's on the last; among those the most even, earlier chunks taking
 * more layers on ties).  req must have passed pp_request_check.  Returns 0, or -1 with an internal error in err. */
int pass_stages(IrModule *m, const Layout *lay, const PpRequest *req, PpStages *out,
                char *err, size_t len);

/* One step of a stage's action list.  Sends are asynchronous (posted, then
 * the stage goes on); a receive waits until its data has arrived.
 *   F(mb, c)          forward of microbatch mb through chunk c (needs
 *                     RECV_ACT(mb, c) earlier on the stage unless c == 0)
 *   B(mb, c)          backward: input gradients, and weight gradients too
 *                     unless the schedule splits W (needs F(mb, c), and
 *                     RECV_GRAD(mb, c) unless c is the last chunk)
 *   W(mb, c)          weight gradients (split schedules only; needs B(mb, c))
 *   SEND_ACT(mb, c)   chunk c's output to chunk c + 1 (needs F(mb, c))
 *   RECV_ACT(mb, c)   chunk c's input from chunk c - 1
 *   SEND_GRAD(mb, c)  chunk c's input gradient to chunk c - 1 (needs B(mb, c))
 *   RECV_GRAD(mb, c)  chunk c's output gradient from chunk c + 1 */
typedef enum {
  PP_F, PP_B, PP_W, PP_SEND_ACT, PP_RECV_ACT, PP_SEND_GRAD, PP_RECV_GRAD, PP_NKINDS
} PpKind;
extern const char *const pp_kind_name[PP_NKINDS];

typedef struct {
  PpKind kind;
  int mb, chunk;
} PpAction;

typedef struct {
  PpScheduleKind kind;
  int nstages, nvirtual, nchunks, microbatches;
  int split_w;               /* B and W are separate actions (ZB-H1) */
  int *nactions;             /* per stage */
  PpAction **actions;        /* per stage, nactions[s] each */
} PpSchedule;

/* Writes every stage's action list (malloc'd; pp_schedule_free).  Needs
 * P >= 1 (1: a routed model's accumulation on one stage), M >= 1, V >= 1
 * (V > 1 for interleaved only, with M % P == 0).
 * Returns 0, or -1 when out of memory. */
int pp_schedule_build(PpScheduleKind kind, int P, int V, int M, PpSchedule *out);
void pp_schedule_free(PpSchedule *s);

/* Per-chunk durations of one microbatch, in seconds. */
typedef struct {
  double f, b, w;            /* compute; a non-split schedule's B takes b + w */
  double send;               /* one boundary transfer to the next chunk (either way) */
  int64_t stash_bytes;       /* held from F until B (W when split) */
  int64_t send_bytes;        /* send's bytes: the chunk's boundary_bytes, or (a GPU
                              * trainer's, cg_pipe_step_model) 2 an element less for
                              * the values it stores as bf16 */
} PpTiming;

/* One executed action: where and when. */
typedef struct {
  int stage, index;          /* actions[stage][index] */
  double start, end;         /* seconds; a RECV's span is its wait */
} PpEvent;

typedef struct {
  PpEvent *events;           /* every action, in the order each stage ran them */
  int nevents;
  double makespan;           /* seconds from the first start to the last end */
  double *busy;              /* per stage: seconds of F/B/W */
  int *peak_inflight;        /* per stage: most microbatch-chunks stashed at once */
  int64_t *peak_stash_bytes; /* per stage: most stash bytes held at once */
  double bubble;             /* idle / busy over all stages: sum(makespan - busy) / sum(busy) */
} PpSim;

/* The schedule checker: runs every stage's list against the others with the
 * given per-chunk timing and checks that each action's dependences hold
 * when it runs, every send has its receive and every receive its send, no
 * stage waits forever (deadlock), every microbatch runs F, B (and W) once
 * on every chunk, and, when stash_limit > 0, no stage holds more stash
 * bytes than that.  Returns 0 with the timeline in out (pp_sim_free), or -1
 * with err naming the stage, the action's index and the action. */
int pp_simulate(const PpSchedule *s, const PpTiming *timing, int64_t stash_limit, PpSim *out,
                char *err, size_t len);
void pp_sim_free(PpSim *sim);

/* "F(mb 3, chunk 1)" into buf. */
const char *pp_action_str(const PpAction *a, char *buf, size_t len);


/* Everything the compiler decided about a pipeline. */
typedef struct PpPlan {
  PpRequest req;             /* as checked, defaults filled in */
  PpStages st;
  PpSchedule sched;
  PpTiming *timing;          /* nchunks, malloc'd */
  PpSim sim;
  double analytic_bubble;    /* (P-1)/M, (P-1)/(V M), or ZB-H1's (P-1)(F+B-W)/(M(F+B+W)) */
  double flops_per_s, link_bytes_per_s, latency_s; /* the simulation's rates (the
                                report states them): req.machine's */
  int kernel_timed;          /* timing holds each chunk's kernels' times
                                (cg_pipe_step_model), not its FLOPs at flops_per_s */
  double opt_s;              /* then: the optimizer's time a step, after the pipeline */
  CommGpu stage_comm[PP_MAX_STAGES]; /* then: a rank of each stage's GPU collectives
                                against the plan's (StepTime.comm) */
} PpPlan;

/* Checks the pipeline options against the model and fills in defaults:
 * schedule 1f1b; M = the train section's microbatches when above 1, else
 * P; V = 2 for interleaved.  Prints one line per problem to err and returns
 * how many there were.  With lay->pp == 1, any pipeline option is one
 * (but --microbatches for a routed model, pp_split_matters). */
int pp_request_check(const IrModule *m, const Layout *lay, PpRequest *req, FILE *err);
/* 1 if the model's function depends on how the batch is split into
 * microbatches (expert routing: top-k / dispatch see a whole microbatch's
 * statistics and capacity).  For such a model pp_request_check also takes
 * --microbatches at pp 1 and fills req->microbatches in there (the train
 * section's value by default; 1: no pipeline needed), and with pp > 1 never
 * defaults M to P. */
int pp_split_matters(const IrModule *m);

/* Every node's chunk under the split st (chunk[id], m->nnodes entries):
 * forward nodes by their layer, backward nodes with the forward node whose
 * rule made them (autodiff gives them its layer), layer-less nodes on the
 * first chunk (embedding) or the last (head, loss), as pass_stages costs
 * them.  Optimizer nodes get a chunk too, which means nothing.  m need not
 * be the module st was planned on, only have the same layers.  0, or -1
 * when out of memory. */
int pp_node_chunks(const IrModule *m, const PpStages *st, int *chunk);

/* Stages, schedule, simulation for a differentiated module.  Returns 0, or
 * -1 with an internal error in err (a schedule the checker refused). */
int pp_plan(IrModule *m, const Layout *lay, const PpRequest *req, PpPlan *out, char *err,
            size_t len);
/* Simulates p->timing again (after a caller set it from better durations:
 * cg_pipe_step_model) into p->sim and p->analytic_bubble.  0, or -1 with
 * the checker's error in err. */
int pp_plan_simulate(PpPlan *p, char *err, size_t len);
void pp_plan_free(PpPlan *p);

/* passes/stage_search.c: layers per chunk chosen for memory (--stage-layers
 * memory).  What one split costs, as the caller planned it: */
typedef struct {
  int64_t stage_bytes[PP_MAX_STAGES]; /* device bytes of a rank of each stage */
  double step_s;             /* the predicted step */
} PpSplitCost;
/* Plans the split counts[0..nchunks) into out: 0, or -1 (the search stops). */
typedef int (*PpSplitEval)(void *ctx, const int *counts, PpSplitCost *out);
#define PP_SPLIT_SLACK 0.01  /* pp_split_search's choice: the shortest step within
                                this share above the least largest rank found */
typedef struct PpSplitSearch {
  PpSplitCost start, best;   /* the split given, and the one chosen */
  PpSplitCost least;         /* the split found needing least (best, but for the slack) */
  int evals;                 /* splits planned */
  int capped;                /* stopped at max_evals, not at a split no move improves */
} PpSplitSearch;
/* From counts (nchunks layer counts, chunk c on stage c % nstages), a local
 * search for the split whose stages' bytes, largest first, are least, then
 * whose step is shortest, moving one layer at a time and planning at most
 * max_evals splits; into counts and out the split of shortest step among
 * those planned within PP_SPLIT_SLACK of the least (its largest rank no
 * more than the start's; the same layers in all, each count at least 1).
 * With log, a line per split it moves to.  0, or -1 when eval failed or
 * memory ran out (counts unchanged). */
int pp_split_search(int nchunks, int nstages, int *counts, int max_evals, PpSplitEval eval,
                    void *ctx, PpSplitSearch *out, FILE *log);

/* passes/pp_split.c: the program each pipeline stage runs, from the
 * rank-local module of ONE microbatch (after autodiff and the optimizer;
 * without dp_grads: the trainer sums gradients over microbatches and
 * reduces them over dp and pp itself).  See pp_split.c's head comment. */
enum { PP_NODE_LEAF = -1, PP_NODE_OPT = -2, PP_NODE_SKIP = -3 };
typedef struct {
  int nstages, nchunks, microbatches, split_w;
  int slots;                 /* the most slots a stage has (stage_slots' largest) */
  int *stage_slots;          /* per stage: its arena's slots, one a microbatch it holds
                                at once */
  int *slot;                 /* [stage * microbatches + mb]: the slot microbatch mb uses
                                on that stage (from its first action there to its last) */
  int *chunk;                /* per node id: chunk that computes it, or PP_NODE_* */
  int *grad_param;           /* per node id: the PARAM whose gradient it is a term
                                of (added to the accumulator where it is computed),
                                else -1 */
  int *nact, **act;          /* per boundary c (chunk c -> c + 1): node ids sent forward */
  int *ngrad, **grad;        /* per boundary c: node ids sent back (chunk c + 1 -> c) */
  const PpSchedule *sched;   /* the plan's */
  /* Stage-local parameters (pp_split.c's head comment). */
  uint64_t *holders;         /* per node id: a PARAM's or STATE's stages, bit s for
                                stage s (at most 64 stages); 0 for other nodes */
  int64_t **stage_offset;    /* [stage][node id]: a held PARAM's / STATE's offset in
                                floats in that stage's buffer, else -1 */
  int64_t *stage_params_numel, *stage_state_numel; /* per stage */
  int64_t shared_numel_max;  /* the largest parameter held by several stages, 0: none */
  int *opt_owner;            /* per node id: an optimizer node's parameter (node id)
                                when it computes for that one alone, else -1 */
  unsigned char *opt_pub;    /* per node id: 1 for an owned optimizer node a shared one
                                reads (the sums of squares of the global norm), 2 for
                                an owned one those read; else 0 */
  /* ZeRO-1 (m->mesh_zero > 1; else NULL, 0): pp_zero_buckets */
  int **zero_bucket;         /* [stage][node id]: the PARAM's gradient's reduce-scatter
                                bucket on that stage (0, 1, ...), -1: none there */
  int *zero_nbuckets;        /* per stage: its buckets */
  int64_t zero_bucket_max;   /* the most floats of a bucket of several parameters (the
                                runtime's packing scratch), 0: none */
} PpProgram;

/* Reorders m's nodes (forward by chunk, then per chunk from the last: B, then
 * W; the optimizer last), assigns them to chunks and finds the boundaries.
 * Returns 0, or -1 with a one-line internal error in err (a value crossing
 * chunks against the pipeline's direction). */
int pass_pp_split(IrModule *m, const PpPlan *plan, PpProgram *out, char *err, size_t len);

/* Each stage's slot of each microbatch under schedule s into slot[st * M + mb]
 * (PpProgram.slot): a microbatch holds its slot on a stage from its first
 * action there to its last, and takes the lowest slot free at its first (by
 * the action list's order), so two microbatches share a slot only where
 * their actions do not interleave, and a stage has as many slots as the
 * most microbatches it holds at once: stage_slots[st] (NULL: not wanted).
 * Returns the slots of the stage needing most; -1 when out of memory. */
int pp_assign_slots(const PpSchedule *s, int *slot, int *stage_slots);

/* The stages whose arenas hold each node's bytes in a trainer of pp's stage
 * programs (bufplan's BufArenas): where[id] bit s for stage s, for the nodes
 * of its chunks, the values its chunks receive or send (act, grad), and the
 * values its nodes read; a parameter's holders for its gradient and the
 * optimizer nodes it owns; every stage for the other optimizer nodes, the
 * leaves and the skipped gradient sums, which unread[id] marks (never run:
 * their terms go to the accumulator where they are made).  m->nnodes
 * entries each. */
void pp_node_arenas(const IrModule *m, const PpProgram *pp, uint64_t *where,
                    unsigned char *unread);

/* passes/pp_zero.c: fills pp's zero_* (see PpProgram and pp_zero.c's head
 * comment) from m's ZeRO-1 degree and bucket bytes and pp's stage offsets;
 * pass_pp_split calls it last.  Allocates from m's arena. */
void pp_zero_buckets(IrModule *m, PpProgram *pp);

/* Per node id of m (the differentiated module, before or after its
 * optimizer): a PARAM's stages as pass_pp_split's holders will give them,
 * bit s for stage s; 0 for other nodes.  0, or -1 (out of memory, above 64
 * stages). */
int pp_param_stages(const IrModule *m, const PpStages *st, uint64_t *h);

/* passes/comm_cost.c: what one rank of pipeline stage `stage` communicates a
 * step in the trainer pass_pp_split's program describes (m: that program's
 * one-microbatch module): the collectives of the stage's chunks once per
 * microbatch, its optimizer's once, plus what rt_pipe_step adds around them
 * (runtime/rt_pipe.h): the accumulated gradients' all-reduces over dp (the
 * expert regions' over ep_dp) once, the stage boundaries' sends and receives
 * once per action of the schedule, the shared parameters' gradient exchange,
 * the loss's all-reduce and the optimizer's norm sums over pp once. */
void comm_analyze_pipe(const IrModule *m, const PpProgram *pp, const Layout *lay, int stage,
                       CommCost *out);

#endif
