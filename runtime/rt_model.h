/* runtime/rt_model.h -- the contract between a generated trainer and the
 * runtime's training harness (rt_train_main).
 *
 * The generated host C describes its model with one RtModelDesc (the
 * parameters, optimizer state, inputs, buffer plan and settings the compiler
 * decided) and provides `step`, which runs one training step: forward,
 * backward, gradient clipping and the optimizer update, in place on the
 * parameter and state buffers.  Everything else (options, data, init,
 * weights in and out, checkpoints, logging, progress) is the harness's.
 *
 * Invariants:
 *   - params[i] occupies [offset, offset + numel) of the one parameter
 *     buffer, in declaration order, without overlap; likewise state[i] in
 *     the state buffer (optimizer moments, zero at the start of training);
 *   - step reads and writes only params, state, arena (exactly arena_bytes,
 *     64-byte aligned), tokens/targets ([batch, seq] int32) and the scalar
 *     fields of RtStepIO;
 *   - step is deterministic: the same inputs give the same bits.
 *
 * Several ranks (tp * dp * pp of them, tp fastest, pp slowest): every rank runs the same
 * step on its own buffers.  shape/offset/numel are the rank's LOCAL view;
 * a parameter with shard_dim >= 0 is cut from its global_shape along
 * shard_dim over the tp ranks (an expert-parallel one, RtParamDesc.ep > 1,
 * over the ep group instead) in shard_blocks blocks (runtime/rt_shard.h:
 * degree = tp, coord = the tp coordinate); shard_dim = -1 means every rank
 * holds it whole.  Vocabulary padding: when shape[shard_dim] * tp exceeds
 * global_shape[shard_dim] (shard_blocks 1), the dimension is padded to
 * shape[shard_dim] * tp and the entries past the global size are padding:
 * zero, never in weight or checkpoint files (rt_param_padded).  This holds
 * at tp 1 too (parc --pad-vocab): a one-rank parameter with shard_dim >= 0
 * and a smaller global size is a padded whole tensor.  Data-parallel ranks hold identical parameters and take
 * rows [d * batch / dp, (d + 1) * batch / dp) of each global batch.  A
 * one-rank model sets tp = dp = 1 (0 is read as 1) and shard_dim = -1. */
#ifndef PARC_RT_MODEL_H
#define PARC_RT_MODEL_H

#include <stdint.h>

#define RT_MAX_RANK 8

typedef enum { RT_INIT_NORMAL, RT_INIT_ZEROS, RT_INIT_ONES } RtInit;

typedef struct {
  const char *name;          /* Hugging Face style dotted name */
  int rank;
  int64_t shape[RT_MAX_RANK]; /* this rank's shape */
  int64_t offset, numel;     /* in floats, within the parameter buffer */
  RtInit init;
  float std;                 /* RT_INIT_NORMAL */
  int64_t global_shape[RT_MAX_RANK]; /* the whole tensor (== shape if unsharded) */
  int shard_dim;             /* -1: whole on every rank; else split over tp */
  int shard_blocks;          /* >= 1: blocks of the split dim (GPT-2's qkv: 3) */
  int ep;                    /* > 1: an expert-parallel parameter: its experts
                                (dimension 0) are split over the ep group (degree
                                ep == RtModelDesc.ep, coord the ep rank, no
                                padding); shard_dim 0: each expert whole over tp;
                                shard_dim >= 1: each expert's shard_dim split over
                                tp as well (rt_shard.h's edegree).  0 or 1:
                                shard_dim is over tp */
} RtParamDesc;

/* The padded size of p's split dimension over tp ranks (vocabulary padding:
 * shape[shard_dim] * tp, at tp 1 too), or 0 where p is whole or splits evenly
 * (a one-rank description that leaves global_shape 0 is whole). */
static inline int64_t rt_param_padded(const RtParamDesc *p, int tp) {
  if (p->shard_dim < 0 || p->shard_dim >= p->rank || p->ep > 1) return 0;
  int64_t n = p->shape[p->shard_dim] * (tp > 1 ? tp : 1), g = p->global_shape[p->shard_dim];
  if (tp <= 1 && (g < 1 || g >= n)) return 0;
  return n != g ? n : 0;
}

typedef struct {
  const char *name;          /* e.g. "h.0.ln_1.weight.exp_avg" */
  int64_t offset, numel;     /* in floats, within the state buffer */
  int param;                 /* index in params[] of its parameter: same shape
                                and sharding */
} RtStateDesc;

typedef struct RtComm RtComm;

/* What one call of step reads and writes besides the buffers. */
typedef struct {
  float *params;             /* params_numel floats */
  float *state;              /* state_numel floats */
  void *arena;               /* arena_bytes bytes */
  const int32_t *tokens;     /* [batch / dp, seq]: this rank's rows */
  const int32_t *targets;    /* [batch / dp, seq] */
  RtComm *tp_group;          /* the ranks sharing this dp coordinate (NULL: one rank) */
  RtComm *dp_group;          /* the ranks sharing this tp coordinate (NULL: one rank) */
  RtComm *pp_group;          /* the ranks sharing tp and dp coordinates: the stages
                                (NULL: one stage) */
  int tp_rank, dp_rank, pp_rank; /* this rank's coordinates */
  RtComm *ep_group;          /* expert parallelism (RtModelDesc.ep > 1): the ep
                                consecutive dp ranks of this one's block, same tp
                                coordinate (rt_comm_mesh's "ep"); else NULL */
  RtComm *ep_dp_group;       /* the dp ranks holding the same experts (same ep
                                rank, "ep_dp"); NULL without ep */
  int ep_rank;               /* dp_rank % ep: which experts this rank holds */
  float lr;                  /* learning rate of this step, already scheduled */
  float step;                /* 1-based step count (for bias correction) */
  float *gacc;               /* pipelined trainers (runtime/rt_pipe.h): the gradient
                                accumulator, params_numel floats; else NULL */
  float *grads;              /* NULL, or params_numel floats: step stores every
                                parameter's gradient there (at the parameter's
                                offset, as the optimizer reads it: averaged
                                over dp, before clipping; under zero, the
                                rank's piece of it, laid out as a state piece,
                                but a pipelined step's (pp > 1 or microbatches
                                > 1), which is whole: its accumulator's) */
  /* results */
  float loss;                /* the objective on this rank's rows; the harness
                                averages it over dp for the log */
  float ce_loss;             /* cross-entropy alone (equals loss without aux terms) */
  float grad_norm;           /* global L2 norm of the gradients before clipping */
  float *moe;                /* NULL, or RtModelDesc.moe_numel floats the step adds
                                its routing statistics to (RtMoeDesc; the harness
                                zeroes them before the step) */
  struct RtTrace *trace;     /* NULL, or `train --trace`: this rank's recorder
                                (runtime/rt_trace.h); a pipelined step records its
                                actions there, the harness a whole step otherwise */
} RtStepIO;

/* One MoE layer's routing statistics in RtStepIO.moe, at offset: experts
 * floats, the choices each expert kept (its filled slots); then the choices
 * routed (tokens * top_k); then the layer's load-balancing loss term and its
 * router z-loss term (0 without one) as added to the objective (coefficient
 * applied), once per microbatch: experts + 3 floats.
 * Rank-local: the harness sums them over dp and pp, divides the aux sum by
 * dp * microbatches, and logs dropped = routed - sum of kept. */
typedef struct {
  int layer;                 /* the repeat's layer index */
  int experts;
  int64_t offset;            /* floats into RtStepIO.moe */
  int z;                     /* 1: the layer has a router z-loss term */
} RtMoeDesc;

typedef struct {
  const char *name;          /* model name */
  const char *source;        /* the DSL file it was compiled from */
  int64_t vocab, batch, seq; /* batch: the global batch */
  int tp, dp;                /* the mesh: tp * dp * pp ranks (0 is read as 1) */
  int pp;                    /* pipeline stages (0 is read as 1); with pp > 1 the
                                fields here describe the whole (tp-local) model and
                                each stage holds only its own parameters and state
                                (pp_* below) */
  const int64_t *pp_param_offset; /* pp > 1: [s * nparams + i] params[i]'s offset in
                                stage s's parameter buffer, -1 where s does not hold
                                it (a tensor held by several stages is identical on
                                each); NULL: every stage holds everything */
  const int64_t *pp_params_numel; /* pp > 1: per stage, its parameter buffer's floats */
  const int64_t *pp_state_offset; /* [s * nstate + i], likewise for state[i] (held
                                where its parameter is) */
  const int64_t *pp_state_numel;
  const int64_t *pp_arena_bytes; /* pp > 1: per stage, its arena's bytes (arena_bytes: the
                                largest; a stage holds its own slots, rt_pipe.h); NULL:
                                arena_bytes on every stage */
  int nmoe;                  /* MoE layers with routing statistics (0: none) */
  const RtMoeDesc *moe;
  int64_t moe_numel;         /* floats of RtStepIO.moe */
  int microbatches;          /* 0 or 1: one step sees the rank's rows at once; M > 1:
                                the step splits the global batch into M microbatches
                                (rt_pipe.h), microbatch mb being the global rows
                                [mb B/M, (mb+1) B/M) on every layout: a dp rank's
                                rows are its share of each microbatch in turn (the
                                harness orders the batch so), which keeps a routed
                                model's per-microbatch statistics layout-free */
  int ep;                    /* expert parallelism (0 is read as 1): ep divides dp;
                                the parameters with ep > 1 (RtParamDesc) are split
                                over the ep group (rank order: rt_comm_mesh) */
  int zero;                  /* ZeRO-1: the dp degree (> 1) the optimizer state
                                is sharded over; 0 or 1: whole on every dp rank.
                                Then state[i] is the rank's piece of the state of
                                params[state[i].param] (local numel n): of that
                                tensor flattened and zero-padded to zero * s
                                floats, s = ceil(n / zero), the floats
                                [d s, (d + 1) s) for dp coordinate d; numel = s.
                                An expert-parallel parameter's state (ep > 1) is
                                cut over its ep_dp group instead: zero / ep pieces,
                                coordinate d / ep (zero == ep: whole on the rank) */
  int nparams;
  const RtParamDesc *params;
  int64_t params_numel;
  int nstate;
  const RtStateDesc *state;
  int64_t state_numel;
  int64_t arena_bytes;       /* the planned peak: the arena is exactly this */
  double flops_per_step;     /* forward + backward, from the compiler's count */

  /* train settings from the DSL (the harness's options may override some) */
  int64_t steps;
  double lr, clip;
  const char *optimizer;     /* "adamw" or "sgd" */
  double beta1, beta2, eps, weight_decay, momentum;
  const char *schedule;      /* "constant", "warmup" or "cosine" */
  int64_t warmup;
  double min_lr;
  uint64_t seed;

  /* model dimensions for the log's config record, as name/value pairs */
  int nconfig;
  const char *const *config_names;
  const double *config_values;

  /* runs one step; returns 0, or -1 with rt_fail() called */
  int (*step)(RtStepIO *io);

  /* NULL, or (a GPU trainer, train_cuda) copies this rank's current parameters
   * and optimizer state from the device into the host buffers params / state
   * (the ones RtStepIO gives step); the harness calls it, on every rank, before
   * it reads them (weights out, checkpoints); a no-op before the device is made.
   * Such a trainer uploads the host buffers in start (below), so whatever the
   * harness initialised or loaded before it is what trains.  0, or -1 with
   * rt_fail() called. */
  int (*to_host)(float *params, float *state);

  /* NULL, or (a GPU trainer, train_cuda) makes this rank's device context: the
   * harness calls it once on every rank, after the weights are initialised or
   * loaded into io->params / io->state and before the first step (only when a
   * step will run), with io as that step gets it (buffers, groups, coordinates;
   * no batch yet).  Collective over the mesh, and it agrees: returns 0 on every
   * rank, or on every rank RT_ERR_SETUP (rt_err.h: the user's setup cannot run
   * the plan, e.g. a GPU too small or too few GPUs; the harness prints the
   * message alone and exits 1 before any step) or another negative status (an
   * internal error, exit 3), with the same rt_fail() message on every rank. */
  int (*start)(RtStepIO *io);
} RtModelDesc;

/* 1 if some parameter of m is padded over tp ranks (rt_param_padded): its
 * files hold fewer rows than the ranks do, so weights and checkpoints go
 * through the whole model, at tp 1 too. */
static inline int rt_model_padded(const RtModelDesc *m, int tp) {
  for (int i = 0; i < m->nparams; i++)
    if (rt_param_padded(&m->params[i], tp)) return 1;
  return 0;
}

/* The generated main calls this.  Returns the process exit code:
 * 0 success, 1 bad options or input files or a setup the device refuses
 * (RtModelDesc.start), 3 internal error. */
int rt_train_main(int argc, char **argv, const RtModelDesc *model);

#endif
