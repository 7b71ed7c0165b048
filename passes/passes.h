/* passes/passes.h -- the compiler's passes, each one file with one entry
 * point, run in order from the table in passes/pipeline.c.  Passes never
 * include a backend header. */
#ifndef PARC_PASSES_H
#define PARC_PASSES_H

#include <stdint.h>
#include <stdio.h>

#include "ir/ir.h"

/* The device mesh the user asked for.  Rank order: tp fastest, then dp
 * (ep carved from it), then pp. */
typedef struct {
  int tp, pp, dp, ep;
} Layout;

#define LAYOUT_MAX_DEGREE 65536
#define LAYOUT_MAX_RANKS  (1 << 20)

/* Options the pass pipeline reads. */
typedef struct {
  int verify;             /* run ir_verify after every pass */
  const char *dump_after; /* print the IR after the pass of this name */
  FILE *dump;             /* where --dump-after writes */
  const char *stop_after; /* NULL: every pass; else stop after this one */
  const char *start_after; /* NULL: from the first pass; else after this one */
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

/* passes/shard.c: tensor (Megatron column/row) and data parallelism.
 * Rewrites the forward module (after intent and dce, before autodiff) into
 * the rank-local module every rank of a tp x dp mesh runs: local shapes,
 * sharded PARAMs recording shard_degree, shard_blocks and global_shape,
 * INPUTs with batch / dp rows, all_reduce (Megatron's g) and group_copy
 * (Megatron's f) on the tp axis where layouts meet.  Not in the default
 * pass list.  Returns 0, or -1 with a one-line reason in err for what it
 * cannot shard yet (the module must then be freed, not used). */
int pass_shard(IrModule *m, int tp, int dp, char *err, size_t len);

/* passes/dp_grads.c: after pass_autodiff on a module pass_shard made with
 * dp > 1, before the optimizer: every parameter gradient becomes the mean
 * over the dp ranks, all_reduce(dp) then scale 1/dp (phase W).  No-op when
 * dp == 1.  Returns 0, or -1 after printing an internal error. */
int pass_dp_grads(IrModule *m, int dp);

/* passes/layout.c: checks the degrees against the model; prints one line
 * per problem to err and returns how many there were. */
int layout_check(const IrModule *m, const Layout *lay, FILE *err);

/* passes/cost.c: what a layout costs, per rank and stage. */
typedef struct {
  int first_layer, nlayers;  /* layers held, [first, first + n) */
  int64_t params;            /* parameters one rank of this stage holds */
} StageCost;

/* passes/comm_cost.c: collectives per step of a rank-local module, by
 * group (0 tp, 1 dp) and kind. */
typedef enum { COMM_ALL_REDUCE, COMM_ALL_GATHER, COMM_REDUCE_SCATTER, COMM_KINDS } CommKind;
typedef struct {
  int count;
  double payload_bytes;      /* the tensors the group combines */
  double sent_bytes;         /* what one rank sends, ring schedules */
} CommEntry;
typedef struct {
  CommEntry e[2][COMM_KINDS];
  int group_size[2];         /* 0 where the group does not communicate */
} CommCost;

void comm_analyze(const IrModule *m, CommCost *out);

typedef struct {
  int64_t params;            /* the model as written */
  int nparam_tensors;
  int64_t vocab, padded_vocab, padding_params;
  double flops_fwd;          /* one forward pass over the whole batch */
  double flops_attn_fwd;     /* of which the attention score/value products */
  int64_t tokens;            /* tokens in one batch */
  int nstages;
  StageCost *stages;         /* nstages entries, in the module's arena */
  int64_t arena_bytes;       /* the trainer's planned activation arena; 0 until
                                code generation has planned it */
  int has_comm;              /* comm holds the rank-local module's collectives */
  CommCost comm;
} Cost;

int cost_analyze(IrModule *m, const Layout *lay, Cost *out);

#endif
