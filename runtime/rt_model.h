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
 * Several ranks (tp * dp of them, tp fastest): every rank runs the same
 * step on its own buffers.  shape/offset/numel are the rank's LOCAL view;
 * a parameter with shard_dim >= 0 is cut from its global_shape along
 * shard_dim over the tp ranks in shard_blocks blocks (runtime/rt_shard.h:
 * degree = tp, coord = the tp coordinate); shard_dim = -1 means every rank
 * holds it whole.  Vocabulary padding: when shape[shard_dim] * tp exceeds
 * global_shape[shard_dim] (shard_blocks 1), the dimension is padded to
 * shape[shard_dim] * tp and the entries past the global size are padding:
 * zero, never in weight or checkpoint files (rt_param_padded).  Data-parallel ranks hold identical parameters and take
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
} RtParamDesc;

/* The padded size of p's split dimension over tp ranks (vocabulary padding:
 * shape[shard_dim] * tp), or 0 where p is whole or splits evenly. */
static inline int64_t rt_param_padded(const RtParamDesc *p, int tp) {
  if (tp <= 1 || p->shard_dim < 0 || p->shard_dim >= p->rank) return 0;
  int64_t n = p->shape[p->shard_dim] * tp;
  return n != p->global_shape[p->shard_dim] ? n : 0;
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
  int tp_rank, dp_rank;      /* this rank's coordinates */
  float lr;                  /* learning rate of this step, already scheduled */
  float step;                /* 1-based step count (for bias correction) */
  float *grads;              /* NULL, or params_numel floats: step stores every
                                parameter's gradient there (at the parameter's
                                offset, as the optimizer reads it: averaged
                                over dp, before clipping; under zero, the
                                rank's piece of it, laid out as a state piece) */
  /* results */
  float loss;                /* the objective on this rank's rows; the harness
                                averages it over dp for the log */
  float ce_loss;             /* cross-entropy alone (equals loss without aux terms) */
  float grad_norm;           /* global L2 norm of the gradients before clipping */
} RtStepIO;

typedef struct {
  const char *name;          /* model name */
  const char *source;        /* the DSL file it was compiled from */
  int64_t vocab, batch, seq; /* batch: the global batch */
  int tp, dp;                /* the mesh: tp * dp ranks (0 is read as 1) */
  int zero;                  /* ZeRO-1: the dp degree (> 1) the optimizer state
                                is sharded over; 0 or 1: whole on every dp rank.
                                Then state[i] is the rank's piece of the state of
                                params[state[i].param] (local numel n): of that
                                tensor flattened and zero-padded to zero * s
                                floats, s = ceil(n / zero), the floats
                                [d s, (d + 1) s) for dp coordinate d; numel = s */
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
} RtModelDesc;

/* The generated main calls this.  Returns the process exit code:
 * 0 success, 1 bad options or input files, 3 internal error. */
int rt_train_main(int argc, char **argv, const RtModelDesc *model);

#endif
