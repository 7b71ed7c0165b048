/* runtime/rt_pipe.h -- one training step through a pipeline of stages, with
 * gradient accumulation over microbatches (passes/pp_split.c decides what
 * the tables below hold; a generated trainer's step calls rt_pipe_step).
 *
 * Each stage holds its own parameters and optimizer state (passes/pp_split.c):
 * io->params / io->state are the stage's buffers (RtModelDesc.pp_*).
 *
 * Stage s's arena (RtStepIO.arena; RtModelDesc.pp_arena_bytes[s]) is
 * rt_pipe_slots(p, s) arenas of slot_bytes[s], one per microbatch the stage
 * holds at once (microbatch mb uses slot slot[s * microbatches + mb] on
 * stage s, rt_pipe_slot), followed by
 * the gradient accumulator: grad_numel[s] floats laid out like stage s's
 * parameter buffer (room for the largest stage's, rounded to 64 bytes), then
 * two scratch vectors of shared_max floats (each rounded to 64 bytes).  Under
 * ZeRO-1 a bucket scratch of bucket_max floats (rounded to 64 bytes) lies at
 * the arena's start, over the slots, when the slots hold it (they are dead
 * once the action list has run), else after the two vectors.  Each chunk's
 * functions run on the arena of one slot (io->arena points at it while they
 * run; io->tokens / io->targets at the microbatch's rows) and add their
 * parameter-gradient terms into the accumulator (io->gacc).
 *
 * rt_pipe_step on the rank of pp coordinate s: zeroes the accumulator;
 * runs stage s's action list in order (F, B, W call the chunk's functions;
 * a schedule without W actions runs bwd then wgt as B; sends are buffered,
 * receives wait); sums the accumulator over dp, except the expert-parallel
 * parameters' parts (RtPipeDesc.expert), which it sums over the ep_dp group
 * instead (the dp ranks holding the same experts; passes/ep_grads.c); under
 * ZeRO-1 (zero > 1, with dp > 1) instead reduce-scatters the parameters'
 * regions over their group (RtPipeDesc.grads), one collective per bucket of
 * the stage (passes/pp_zero.c: a bucket of one parameter in place, one of
 * several packed rank by rank into the bucket scratch and the rank's pieces
 * copied back), so that only the rank's piece of each (rt_comm_flat_piece's
 * cut), the part its optimizer reads, holds the sum; sums each parameter
 * held by several stages between its holders, the rank's piece alone under
 * ZeRO-1 (every holder sends its part to the others, and adds all parts in
 * stage order: the same bits on each): the mean gradient, every term already
 * divided by microbatches * dp (the loss's gradient seed, driver/main.c);
 * stores it to io->grads when asked (the stage's layout; under ZeRO-1
 * all-gathered from the pieces first, in the same buckets); sets io->loss
 * (and ce_loss) to the mean of the microbatches' losses, which the last
 * chunk's forward reports, on every rank; then runs stage s's optimizer on
 * slot 0's arena, which reads the accumulator (and sums its part of the
 * global norm over pp itself, an expert-parallel parameter's first over ep).
 *
 * Tracing (io->trace, runtime/rt_trace.h): every action is one event (F, B,
 * W: compute; SEND/RECV: communication, a RECV's interval being the time
 * blocked plus the copy), then the dp (with ep_dp: one event; under ZeRO-1 the
 * reduce-scatters, one event) and pp
 * all-reduces of the accumulator, the loss's, and the optimizer.
 *
 * Messages: boundary c's values travel over the pp group, each in its own
 * send, tag (c * microbatches + mb) * 2 + (0 forward, 1 backward); shared
 * parameter j's gradient part, tag chunks * microbatches * 2 + j. */
#ifndef PARC_RT_PIPE_H
#define PARC_RT_PIPE_H

#include <stdint.h>

#include "runtime/rt_model.h"

/* PpKind's order (passes/passes.h) */
typedef enum {
  RT_PIPE_F, RT_PIPE_B, RT_PIPE_W, RT_PIPE_SEND_ACT, RT_PIPE_RECV_ACT, RT_PIPE_SEND_GRAD,
  RT_PIPE_RECV_GRAD
} RtPipeKind;

typedef struct {
  unsigned char kind, chunk; /* RtPipeKind; chunk < 256 */
  unsigned short mb;
} RtPipeAction;

typedef struct {
  int64_t offset;            /* bytes into a slot's arena */
  int64_t count;             /* 4-byte words: f32 or i32 elements, or (the GPU
                              * trainer's values stored as bf16) pairs of bf16 ones */
} RtPipeValue;

typedef int (*RtPipeFn)(RtStepIO *io);

typedef struct {
  const char *schedule;      /* "gpipe", "1f1b", ... (for --trace) */
  int stages, chunks, microbatches, slots; /* chunk c runs on stage c % stages */
  int split_w;               /* the schedule has W actions (else B runs bwd, then wgt) */
  const int64_t *slot_bytes; /* per stage: one slot's arena, a multiple of 64 (a stage's
                                values and kernel temporaries end there) */
  const int *slot;           /* [s * microbatches + mb]: microbatch mb's slot on stage s
                                (< slots; two microbatches share one only where their
                                actions on s do not interleave) */
  const int64_t *grad_numel; /* per stage: the accumulator, its parameter buffer's floats */
  int nshared;               /* parameters held by several stages */
  const int64_t *shared;     /* per such parameter: numel, then per stage its offset in
                                the stage's accumulator (-1: not held); stages + 1 each */
  int64_t shared_max;        /* the largest numel of those */
  int nexpert;               /* expert-parallel parameters (RtParamDesc.ep > 1) */
  const int64_t *expert;     /* per such parameter: numel, then per stage its offset in
                                the stage's accumulator (-1: not held); stages + 1 each */
  int zero;                  /* ZeRO-1 (RtModelDesc.zero): the dp degree; 0 or 1: none */
  int ngrads;                /* under zero: the parameters with a gradient */
  const int64_t *grads;      /* per such parameter: numel, its pieces' group (1: dp,
                                3: ep_dp, an expert-parallel one's), then per stage its
                                offset in the stage's accumulator (-1: not held), then
                                per stage its bucket there (0, 1, ...; -1: none);
                                2 stages + 2 each.  A bucket's rows share a group */
  int64_t bucket_max;        /* under zero: the most floats of a bucket of several rows */
  int64_t mb_tokens;         /* tokens of one microbatch on one rank: rows * seq */
  const int *nactions;       /* per stage */
  const RtPipeAction *const *actions; /* per stage */
  const int *nact;           /* per boundary c (chunk c -> c + 1): values sent forward */
  const RtPipeValue *const *act;
  const int *ngrad;          /* per boundary c: gradients sent back (c + 1 -> c) */
  const RtPipeValue *const *grad;
  const RtPipeFn *fwd, *bwd, *wgt; /* per chunk; fwd of the last sets io->loss, ce_loss */
  const RtPipeFn *optimizer; /* per stage: reads io->gacc; sets io->grad_norm, updates
                                the stage's buffers */
} RtPipeDesc;

/* Microbatch mb's slot on stage s. */
static inline int rt_pipe_slot(const RtPipeDesc *p, int s, int mb) {
  return p->slot[s * p->microbatches + mb];
}

/* Stage s's slots: one past the highest it uses. */
static inline int rt_pipe_slots(const RtPipeDesc *p, int s) {
  int n = 0;
  for (int mb = 0; mb < p->microbatches; mb++)
    if (rt_pipe_slot(p, s, mb) + 1 > n) n = rt_pipe_slot(p, s, mb) + 1;
  return n;
}

/* The step above.  0, or -1 with rt_fail() called. */
int rt_pipe_step(RtStepIO *io, const RtPipeDesc *p);

/* Stage s's slot table against its action list (rt_pipe_step checks it every
 * step, rt_cuda_pipe_step once per desc): every action's microbatch < M,
 * every slot in [0, slots), and two microbatches share a slot only where the
 * spans of their actions on s (first to last, sends and receives included)
 * do not overlap -- else one would overwrite the other's values.  0, or -1
 * with rt_fail() called naming the stage, slot and microbatches. */
int rt_pipe_check_slots(const RtPipeDesc *p, int s);

/* The end-of-step reduction's plan (rt_pipe_step here, rt_cuda_pipe_step on
 * the GPU): [*lo, *hi) is the next run of stage s's adjacent expert regions at
 * or past `at` in its accumulator of gn floats (lo = hi = gn when none is
 * left); [at, lo) is summed over dp, [lo, hi) over ep_dp, then at = hi.
 * 0, or -1 with rt_fail() called when a region lies past gn. */
int rt_pipe_expert_run(const RtPipeDesc *p, int s, int64_t at, int64_t gn, int64_t *lo,
                       int64_t *hi);

/* ---- ZeRO-1's buckets (rt_pipe_step here, rt_cuda_pipe_step on the GPU) ----
 * Stage s's gradient buckets (RtPipeDesc.grads, passes/pp_zero.c): a bucket
 * is the rows of one id on the stage, all of one group. */
typedef struct {
  int first, end, rows; /* `rows` rows of RtPipeDesc.grads in [first, end) */
  int64_t id, total;    /* its number on the stage; its floats */
  int group;            /* its rows' group: 1 dp, 3 ep_dp */
} RtPipeBucket;

/* The bucket after *b (id + 1; {.id = -1} before the first) into *b: 1, 0
 * when there is none, -1 with rt_fail() called when the table is not one of
 * passes/pp_zero.c's (a bucket's rows of two groups, or of a parameter the
 * stage does not hold, or several rows past bucket_max). */
int rt_pipe_bucket_next(const RtPipeDesc *p, int s, RtPipeBucket *b);

/* ZeRO-1's cut of n floats over z ranks: rank k's piece is counts[k] floats
 * from min(k c, n), c = ceil(n / z) (rt_comm_flat_piece's pieces less their
 * zero padding).  Returns rank me's offset. */
int64_t rt_pipe_zero_pieces(int64_t n, int z, int me, int64_t *counts);
/* The same cut for rank k alone: its offset, and *count floats. */
int64_t rt_pipe_zero_piece(int64_t n, int z, int k, int64_t *count);

/* Rank k's block of bucket b over z ranks: its piece of each of the bucket's
 * parameters, side by side in row order.  Calls fn(ctx, at, off, count) for
 * each non-empty piece (at: its place in the block; off: in the stage's
 * accumulator) unless fn is NULL.  Returns the block's floats. */
typedef void (*RtPipeBlockFn)(void *ctx, int64_t at, int64_t off, int64_t count);
int64_t rt_pipe_bucket_block(const RtPipeDesc *p, int s, const RtPipeBucket *b, int z, int k,
                             RtPipeBlockFn fn, void *ctx);

/* Bucket b's collective over z ranks: counts[k], rank k's floats, and rank
 * me's offset: a one-row bucket's are its parameter's pieces in place
 * (rt_pipe_zero_pieces, from rt_pipe_bucket_offset), a packed one's the
 * blocks side by side (rt_pipe_bucket_block). */
int64_t rt_pipe_bucket_counts(const RtPipeDesc *p, int s, const RtPipeBucket *b, int z, int me,
                              int64_t *counts);
/* where bucket b's first row starts in stage s's accumulator */
int64_t rt_pipe_bucket_offset(const RtPipeDesc *p, int s, const RtPipeBucket *b);

/* The bucket scratch's byte offset in stage s's arena: 0 when its slots
 * hold it, else `after` (where the two shared vectors end). */
int64_t rt_pipe_zero_scratch(const RtPipeDesc *p, int s, int64_t after);

/* ---- the harness's side of stage-local buffers (runtime/rt_train.c) ----
 * A pipelined model m (m->pp > 1, m->pp_param_offset set) describes the whole
 * (tp-local) model; stage s's rank trains with the stage's own description. */

typedef struct {
  RtModelDesc m;             /* stage s's: its parameters and state, its offsets */
  RtParamDesc *p;
  RtStateDesc *s;
  int *index;                /* per whole parameter: its index in m.params, or -1 */
} RtPipeStageDesc;

/* Fills d with stage s's description of m.  0, or -1 with rt_fail(). */
int rt_pipe_stage_desc(const RtModelDesc *m, int s, RtPipeStageDesc *d);
void rt_pipe_stage_desc_free(RtPipeStageDesc *d);

/* Gathers the whole (tp-local) buffers, laid out as in m, from every stage's
 * (a collective over pp, the stages of one tp and dp coordinate): params from
 * each stage's `params` (its parameter layout; the weights or the gradients),
 * state likewise when both state and whole_state are non-NULL.  A parameter
 * several stages hold is taken from the lowest.  Every stage receives it. */
int rt_pipe_gather(RtComm *pp, int s, const RtModelDesc *m, const float *params,
                   const float *state, float *whole_params, float *whole_state);

/* The reverse, locally: stage s's buffers from whole ones laid out as in m. */
void rt_pipe_extract(const RtModelDesc *m, int s, const float *whole_params,
                     const float *whole_state, float *params, float *state);

#endif
