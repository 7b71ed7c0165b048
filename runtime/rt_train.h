/* runtime/rt_train.h -- the training harness behind rt_train_main (rt_model.h).
 *
 * A generated trainer includes only rt_model.h; this header is shared by the
 * harness's own files: rt_train.c (setup and the step loop), rt_train_opts.c
 * (command line) and rt_train_state.c (weights in and out, checkpoints).
 *
 * Exit codes of rt_train_main: 0 success; 1 a bad option value, a conflict
 * between options, an input or output file that cannot be used, or a setup the
 * device refuses at start-up (RtModelDesc.start: a GPU too small, too few GPUs;
 * each one line on stderr, before any step); 2 a malformed command line (unknown option, missing
 * argument, stray argument: the line, then the usage); 3 an internal error
 * (an inconsistent RtModelDesc, a failing step, out of memory).
 *
 * Invariants:
 *  - Everything a step sees is a pure function of (model, seed or --init
 *    weights, data, steps, lr override, step index): no clock, thread count
 *    or output option changes a bit of the parameters or of the losses.
 *  - A checkpoint holds the state after `step` completed steps; training from
 *    it runs exactly the steps t = step.. that the uninterrupted run would
 *    have run, with the same inputs, so the result is bit-identical.
 *
 * Checkpoint directory (written with rt_ckpt, hence atomically):
 *   model.safetensors      every parameter by name, with its shape
 *   optimizer.safetensors  every state tensor by name, shape [numel]
 *   trainer.json           {"format": "parc-train-state", "version": 1,
 *                           "step": completed steps, "next_sequence": step*batch
 *                           (the data position), "seed": "decimal",
 *                           "lr_override": number or null, "steps": the run's total,
 *                           "data": {"name", "tokens"},
 *                           "model": {"name", "vocab", "batch", "seq", "optimizer",
 *                                     "nparams", "params_numel", "nstate",
 *                                     "state_numel"}}
 * A resume refuses a checkpoint whose "model" object (name, vocab, batch, seq,
 * optimizer, nparams, nstate) or tensor names and shapes differ from the running
 * model's. params_numel / state_numel are informational (the parameter and state
 * buffers at tp = 1; with tp > 1 the sums of the global numels).
 *
 * Several ranks (RtModelDesc tp * dp > 1): rt_train_main runs the ranks with
 * rt_comm_run (threads, or MPI processes under mpirun). Every rank sets up its own
 * buffers (local numels), initialises its shards from the global RNG indices (so
 * every layout starts from the one-rank model), takes rows [d*B/dp, (d+1)*B/dp) of
 * the global batch; the logged loss is the mean over dp. Weights files and
 * checkpoints hold whole tensors (gathered over tp, and the expert-parallel ones
 * over ep, to world rank 0, which writes them), so they are layout-free: the mesh
 * is not recorded and a resume may use any (tp, dp, ep). Threads: with ranks as threads the process-wide pool is 1 thread
 * (each rank computes on its own thread, OpenBLAS single-threaded: deterministic
 * and no oversubscription); under MPI each process's pool gets
 * max(1, --threads / ranks). Only world rank 0 prints and writes the log.
 *
 * Pipelines (RtModelDesc pp > 1): tp * dp * pp ranks (rt_comm_mesh's order); with
 * RtModelDesc.pp_param_offset each stage's rank trains with its stage's own
 * description (rt_pipe_stage_desc: its parameters and state, its offsets) and
 * allocates, initialises (by name and global indices) and updates only those.
 * Weights, gradients and checkpoints stay whole: saving first gathers the
 * stages' tensors over pp into the whole (tp- and ep-local) layout
 * (rt_pipe_gather; a tensor several stages hold, identical on each, from the
 * lowest), then goes on as for pp = 1 (over tp and ep; world rank 0 writes);
 * --resume loads the whole model and keeps the stage's part (rt_pipe_extract),
 * so a checkpoint resumes under any (tp, pp, dp, ep). The step's loss and gradient norm are the whole model's on every
 * stage. --trace: rt_trace.h. */
#ifndef PARC_RT_TRAIN_H
#define PARC_RT_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "runtime/rt_model.h"
#include "runtime/rt_pool.h"
#include "runtime/rt_shard.h"

#define RT_TRAIN_MAX_STEPS INT64_C(1000000000000)  /* --steps, --save-every */
#define RT_TRAIN_MAX_THREADS RT_POOL_MAX_THREADS
#define RT_TRAIN_MAX_LR 1000.0
#define RT_TRAIN_MAX_COMM_TIMEOUT 1e6  /* seconds, as rt_comm_set_timeout allows */

#define RT_TRAIN_STATE_FORMAT "parc-train-state"
#define RT_TRAIN_STATE_VERSION 1

/* The command line, after parsing. Paths are argv strings (not owned). */
typedef struct {
  int64_t steps;
  const char *data;          /* NULL: the built-in corpus */
  const char *init;          /* --init weights */
  const char *save_weights;
  const char *save_grads;    /* the first step's gradients */
  const char *log;
  const char *save;          /* checkpoint directory */
  const char *resume;
  int64_t save_every;        /* 0: only at the end */
  double lr;                 /* when lr_set */
  int lr_set;
  uint64_t seed;
  int seed_set;
  int threads;
  int quiet;
  double comm_timeout;       /* seconds; 0: the communicator's default */
  const char *trace;         /* --trace: Chrome trace JSON of what the ranks did */
} RtTrainOpts;

/* Parses argv into o (defaults from the model). Returns -1 to go on training, or the
 * exit code to return now: 0 after --help, 1 for a bad value (one line on err),
 * 2 for a malformed command line (one line, then the usage, on err). */
int rt_train_parse_opts(RtTrainOpts *o, int argc, char **argv, const RtModelDesc *m,
                        FILE *err);
/* The --help text: every option with its default from the model. */
void rt_train_usage(FILE *out, const char *prog, const RtModelDesc *m);

/* Checks the model description's own invariants (rt_model.h); RT_ERR names the
 * first broken one. */
int rt_train_check_model(const RtModelDesc *m);

/* Loads every parameter from a safetensors file by name, exact shape; a name may
 * carry a leading "transformer." in the file; other tensors in the file are ignored. */
int rt_train_load_weights(const RtModelDesc *m, float *params, const char *path);
/* The same for tp coordinate `coord` of a tp-way mesh (and ep coordinate ep_coord
 * for the expert-parallel parameters, RtParamDesc.ep > 1): each parameter's shard is
 * read from the whole tensor in the file (its global shape checked); tp = 1 without
 * expert-parallel parameters is the above. */
int rt_train_load_weights_tp(const RtModelDesc *m, float *params, const char *path, int tp,
                             int coord, int ep_coord);
/* Parameter p's shard descriptor and its global shape: an expert-parallel parameter
 * (p->ep > 1) on coordinate ep_coord of its ep group (dim 0, degree p->ep; with
 * shard_dim >= 1 and tp > 1 each expert split over tp as well: dim shard_dim, degree
 * tp, coordinate coord, edegree p->ep, ecoord ep_coord); any other on coordinate coord of tp (dim -1 when tp == 1 or shard_dim < 0, and
 * then p->shape when tp == 1), except that a padded parameter (rt_param_padded) at
 * tp 1 is degree 1 with its padding, and its global shape the true one. */
const int64_t *rt_train_param_shard(const RtParamDesc *p, int tp, int coord, int ep_coord,
                                    RtShard *sh);
/* Writes every parameter, by name and shape, to path atomically. */
int rt_train_save_weights(const RtModelDesc *m, const float *params, const char *path);

/* What trainer.json holds besides the model's identity. */
typedef struct {
  int64_t step;              /* completed steps */
  int64_t steps;             /* the total of the run that saved */
  uint64_t seed;
  int lr_set;                /* the run trained with a constant --lr */
  double lr;
  int64_t data_tokens;       /* the data it trained on: token count and name */
  char data_name[256];       /* (cut to fit) */
} RtTrainCkptInfo;

/* ZeRO-1 (m->zero > 1): the pieces parameter p's state (and gradient) is cut in:
 * m->zero, the dp ranks, for a dense p; for an expert-parallel one (p->ep > 1) the
 * ranks holding the same experts, its ep_dp group of m->zero / ep (coordinate
 * dp_rank / ep; 1 when ep == dp: the rank's experts' state is whole); 1 without
 * ZeRO. */
static inline int rt_zero_pieces(const RtModelDesc *m, const RtParamDesc *p) {
  if (m->zero <= 1) return 1;
  return p->ep > 1 ? m->zero / p->ep : m->zero;
}

/* ZeRO-1 (m->zero > 1): the rank-local model with its optimizer state whole on the
 * rank (each state tensor its parameter's local numel, packed in order), made by
 * rt_train_zero_gather from the dp ranks' pieces (an expert-parallel parameter's
 * state from its ep_dp group's); checkpoints are written from it. */
typedef struct {
  RtModelDesc m;             /* m with state[i].numel = its parameter's local numel */
  RtStateDesc *s;
  float *state;              /* m.state_numel floats */
  float *scratch;            /* dp * the largest piece */
} RtZeroView;
/* Collective over the dp group `dp` (every dp rank calls it) and, with expert
 * parallelism, the ep_dp group `ep_dp` (NULL without): fills v (allocated on the
 * first call, reused after) with the whole local state of m assembled from every
 * rank's pieces `state` (rt_zero_pieces of them per tensor).  RT_ERR on out of
 * memory or a failed all_gather. */
int rt_train_zero_gather(const RtModelDesc *m, RtComm *dp, RtComm *ep_dp, const float *state,
                         RtZeroView *v);
void rt_train_zero_free(RtZeroView *v);

/* Writes the full training state to checkpoint directory dir atomically. */
int rt_train_save_ckpt(const char *dir, const RtModelDesc *m, const float *params,
                       const float *state, const RtTrainCkptInfo *info);
/* Reads a checkpoint written by rt_train_save_ckpt for the same model into params,
 * state and info; a different model is refused naming what differs. */
int rt_train_load_ckpt(const char *dir, const RtModelDesc *m, float *params, float *state,
                       RtTrainCkptInfo *info);
/* The same for tp coordinate `coord`: each rank reads its shards of the parameters and
 * of their optimizer state (state i shares the sharding of params[state[i].param]);
 * a model without expert-parallel parameters (else ep coordinate 0's). */
int rt_train_load_ckpt_tp(const char *dir, const RtModelDesc *m, float *params, float *state,
                          RtTrainCkptInfo *info, int tp, int coord);
/* The same on a tp x dp mesh: with m->zero > 1 each rank keeps only the pieces of
 * dp coordinate dp_coord of its state (rt_model.h; an expert-parallel parameter's:
 * ep_dp coordinate dp_coord / ep of rt_zero_pieces); expert-parallel parameters and
 * their state are read as ep coordinate ep_coord's shards; otherwise as above. */
int rt_train_load_ckpt_mesh(const char *dir, const RtModelDesc *m, float *params, float *state,
                            RtTrainCkptInfo *info, int tp, int tp_coord, int dp_coord,
                            int ep_coord);

#endif
