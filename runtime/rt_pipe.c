/* runtime/rt_pipe.c -- rt_pipe_step: a stage's action list, gradient
 * accumulation and its reduction; see rt_pipe.h. */
#include "runtime/rt_pipe.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/rt_comm.h"
#include "runtime/rt_err.h"
#include "runtime/rt_trace.h"

/* Sends (send != 0) or receives every value of one boundary's list. */
static int transfer(RtStepIO *io, char *slot, const RtPipeValue *v, int n, int send, int peer,
                    int tag) {
  for (int i = 0; i < n; i++) {
    float *x = (float *)(void *)(slot + v[i].offset);
    if (send ? rt_comm_send(io->pp_group, x, v[i].count, peer, tag)
             : rt_comm_recv(io->pp_group, x, v[i].count, peer, tag))
      return RT_ERR;
  }
  return RT_OK;
}

/* One action of the list. */
static int act(RtStepIO *io, const RtPipeDesc *p, const RtPipeAction *a, char *base,
               const int32_t *tokens, const int32_t *targets, double *loss, double *ce) {
  int c = a->chunk, mb = a->mb, P = p->stages, M = p->microbatches;
  char *slot = base + (int64_t)rt_pipe_slot(p, c % P, mb) * p->slot_bytes[c % P];
  switch ((RtPipeKind)a->kind) {
  case RT_PIPE_F:
  case RT_PIPE_B:
  case RT_PIPE_W: {
    io->arena = slot;
    io->tokens = tokens + (int64_t)mb * p->mb_tokens;
    io->targets = targets + (int64_t)mb * p->mb_tokens;
    int rc = a->kind == RT_PIPE_F   ? p->fwd[c](io)
             : a->kind == RT_PIPE_W ? p->wgt[c](io)
                                    : p->bwd[c](io);
    /* a schedule without W actions runs the weight gradients with B */
    if (!rc && a->kind == RT_PIPE_B && !p->split_w) rc = p->wgt[c](io);
    if (rc) return RT_ERR;
    if (a->kind == RT_PIPE_F && c == p->chunks - 1) *loss += io->loss, *ce += io->ce_loss;
    return RT_OK;
  }
  case RT_PIPE_SEND_ACT:
    return transfer(io, slot, p->act[c], p->nact[c], 1, (c + 1) % P, (c * M + mb) * 2);
  case RT_PIPE_RECV_ACT:
    return transfer(io, slot, p->act[c - 1], p->nact[c - 1], 0, (c - 1) % P,
                    ((c - 1) * M + mb) * 2);
  case RT_PIPE_SEND_GRAD:
    return transfer(io, slot, p->grad[c - 1], p->ngrad[c - 1], 1, (c - 1) % P,
                    ((c - 1) * M + mb) * 2 + 1);
  case RT_PIPE_RECV_GRAD:
    return transfer(io, slot, p->grad[c], p->ngrad[c], 0, (c + 1) % P, (c * M + mb) * 2 + 1);
  }
  return rt_fail("pipeline: unknown action kind %d", a->kind);
}

/* One action, recorded in io->trace when there is one: the interval it took
 * (a RECV's is the time blocked waiting plus the copy) and the floats a
 * transfer moved. */
static int traced_act(RtStepIO *io, const RtPipeDesc *p, const RtPipeAction *a, char *base,
                      const int32_t *tokens, const int32_t *targets, double *loss, double *ce) {
  if (!io->trace) return act(io, p, a, base, tokens, targets, loss, ce);
  double t0 = rt_trace_clock();
  int rc = act(io, p, a, base, tokens, targets, loss, ce);
  double t1 = rt_trace_clock();
  int64_t count = 0;
  int c = a->chunk;
  if (a->kind == RT_PIPE_SEND_ACT || a->kind == RT_PIPE_RECV_ACT ||
      a->kind == RT_PIPE_SEND_GRAD || a->kind == RT_PIPE_RECV_GRAD) {
    int b = a->kind == RT_PIPE_SEND_ACT || a->kind == RT_PIPE_RECV_GRAD ? c : c - 1;
    const RtPipeValue *v = a->kind <= RT_PIPE_RECV_ACT ? p->act[b] : p->grad[b];
    int n = a->kind <= RT_PIPE_RECV_ACT ? p->nact[b] : p->ngrad[b];
    for (int i = 0; i < n; i++) count += v[i].count;
  }
  rt_trace_add(io->trace, (RtTraceKind)a->kind, c, a->mb, t0, t1, count);
  return rc;
}

/* A collective of the step, recorded as kind. */
static int reduce(RtStepIO *io, RtComm *g, float *x, int64_t n, RtTraceKind kind) {
  double t0 = io->trace ? rt_trace_clock() : 0;
  int rc = rt_comm_all_reduce(g, x, x, n);
  if (io->trace) rt_trace_add(io->trace, kind, 0, 0, t0, rt_trace_clock(), n);
  return rc;
}

/* The accumulator's sum over dp (one event in the trace): one all-reduce of
 * all of it, or, with expert-parallel parameters on stage s, each part
 * between their regions over dp and each run of adjacent regions over ep_dp
 * (nothing over an ep_dp group of one rank). */
int rt_pipe_expert_run(const RtPipeDesc *p, int s, int64_t at, int64_t gn, int64_t *lo,
                       int64_t *hi) {
  *lo = *hi = gn; /* the next expert region at or past `at`, and those right after */
  for (int j = 0; j < p->nexpert; j++) {
    const int64_t *e = p->expert + (int64_t)j * (p->stages + 1), off = e[1 + s];
    if (off >= at && off < *lo && e[0] > 0) *lo = off, *hi = off + e[0];
  }
  for (int j = 0; j < p->nexpert && *lo < gn; j++) {
    const int64_t *e = p->expert + (int64_t)j * (p->stages + 1);
    if (e[1 + s] == *hi && e[0] > 0) *hi += e[0], j = -1; /* (again from the first) */
  }
  if (*hi > gn) return rt_fail("pipeline: an expert parameter past the accumulator");
  return RT_OK;
}

static int reduce_grads(RtStepIO *io, const RtPipeDesc *p, int s, float *g, int64_t gn, int dp) {
  int ep_dp = io->ep_dp_group ? rt_comm_size(io->ep_dp_group) : 1;
  double t0 = io->trace ? rt_trace_clock() : 0;
  int64_t at = 0, moved = 0; /* g[0, at) is done */
  while (at < gn) {
    int64_t lo, hi;
    if (rt_pipe_expert_run(p, s, at, gn, &lo, &hi)) return RT_ERR;
    if (lo > at && dp > 1) {
      if (rt_comm_all_reduce(io->dp_group, g + at, g + at, lo - at)) return RT_ERR;
      moved += lo - at;
    }
    if (hi > lo && ep_dp > 1) {
      if (rt_comm_all_reduce(io->ep_dp_group, g + lo, g + lo, hi - lo)) return RT_ERR;
      moved += hi - lo;
    }
    at = hi;
  }
  if (io->trace) rt_trace_add(io->trace, RT_TRACE_REDUCE_DP, 0, 0, t0, rt_trace_clock(), moved);
  return RT_OK;
}

int64_t rt_pipe_zero_piece(int64_t n, int z, int k, int64_t *count) {
  int64_t s = (n + z - 1) / z, lo = (int64_t)k * s < n ? (int64_t)k * s : n;
  *count = n - lo < s ? n - lo : s;
  return lo;
}

int64_t rt_pipe_zero_pieces(int64_t n, int z, int me, int64_t *counts) {
  int64_t mine = 0;
  for (int k = 0; k < z; k++) {
    int64_t lo = rt_pipe_zero_piece(n, z, k, &counts[k]);
    if (k == me) mine = lo;
  }
  return mine;
}

static const int64_t *zero_row(const RtPipeDesc *p, int j) {
  return p->grads + (int64_t)j * (2 * p->stages + 2);
}

int rt_pipe_bucket_next(const RtPipeDesc *p, int s, RtPipeBucket *b) {
  int P = p->stages;
  *b = (RtPipeBucket){.first = -1, .id = b->id + 1};
  const int64_t *e = NULL;
  for (int j = 0; j < p->ngrads; j++) {
    const int64_t *r = zero_row(p, j);
    if (r[2 + P + s] != b->id) continue;
    if (!e) e = r, b->first = j;
    if (r[1] != e[1] || r[2 + s] < 0 || r[0] < 0)
      return rt_fail("pipeline: ZeRO-1 bucket %lld holds a row of another group or one the "
                     "stage does not hold", (long long)b->id);
    b->rows++;
    b->total += r[0];
    b->end = j + 1;
  }
  if (!e) return 0;
  b->group = (int)e[1];
  if (b->rows > 1 && b->total > p->bucket_max)
    return rt_fail("pipeline: ZeRO-1 bucket %lld of %lld floats, past the scratch of %lld",
                   (long long)b->id, (long long)b->total, (long long)p->bucket_max);
  return 1;
}

int64_t rt_pipe_bucket_block(const RtPipeDesc *p, int s, const RtPipeBucket *b, int z, int k,
                             RtPipeBlockFn fn, void *ctx) {
  int64_t at = 0;
  for (int j = b->first; j < b->end; j++) {
    const int64_t *r = zero_row(p, j);
    if (r[2 + p->stages + s] != b->id) continue;
    int64_t count, lo = rt_pipe_zero_piece(r[0], z, k, &count);
    if (fn && count) fn(ctx, at, r[2 + s] + lo, count);
    at += count;
  }
  return at;
}

int64_t rt_pipe_bucket_counts(const RtPipeDesc *p, int s, const RtPipeBucket *b, int z, int me,
                              int64_t *counts) {
  if (b->rows == 1) return rt_pipe_zero_pieces(zero_row(p, b->first)[0], z, me, counts);
  int64_t mine = 0, at = 0;
  for (int k = 0; k < z; k++) {
    counts[k] = rt_pipe_bucket_block(p, s, b, z, k, NULL, NULL);
    if (k == me) mine = at;
    at += counts[k];
  }
  return mine;
}

int64_t rt_pipe_bucket_offset(const RtPipeDesc *p, int s, const RtPipeBucket *b) {
  return zero_row(p, b->first)[2 + s];
}

/* A bucket of stage s on this rank: the bucket, its group's communicator
 * and size.  1, 0 when there is none left, -1 with rt_fail() called. */
typedef struct {
  RtPipeBucket b;
  RtComm *c;
  int z;
} ZeroBucket;

static int zero_next(RtStepIO *io, const RtPipeDesc *p, int s, ZeroBucket *zb) {
  int more = rt_pipe_bucket_next(p, s, &zb->b);
  if (more <= 0) return more;
  zb->c = zb->b.group == 3 ? io->ep_dp_group : io->dp_group;
  zb->z = zb->c ? rt_comm_size(zb->c) : 1;
  if (zb->z > RT_COMM_MAX_RANKS) return rt_fail("pipeline: a ZeRO-1 group of %d ranks", zb->z);
  return 1;
}

/* Copies between a bucket block x and the accumulator g (rt_pipe_bucket_block's
 * callback): into x (dir 1) or out of it (dir -1). */
typedef struct {
  float *g, *x;
  int dir;
} BlockCopy;
static void block_copy(void *ctx, int64_t at, int64_t off, int64_t count) {
  BlockCopy *c = ctx;
  if (c->dir > 0) memcpy(c->x + at, c->g + off, (size_t)count * sizeof *c->x);
  else memcpy(c->g + off, c->x + at, (size_t)count * sizeof *c->x);
}
static void zero_block(const RtPipeDesc *p, int s, const ZeroBucket *zb, int k, float *g,
                       float *x, int dir) {
  BlockCopy c = {g, x, dir};
  rt_pipe_bucket_block(p, s, &zb->b, zb->z, k, block_copy, &c);
}

int64_t rt_pipe_zero_scratch(const RtPipeDesc *p, int s, int64_t after) {
  int64_t bytes = (p->bucket_max * 4 + 63) / 64 * 64;
  return bytes <= (int64_t)rt_pipe_slots(p, s) * p->slot_bytes[s] ? 0 : after;
}

/* ZeRO-1: stage s's gradients reduce-scattered over their groups, one
 * collective per bucket, so that the rank's piece of each (rt_pipe_zero_pieces)
 * holds the sum (one event in the trace, the regions' floats).  A bucket
 * of one row goes in place; one of several is packed rank by rank into
 * the scratch x (block k: every row's piece k), reduce-scattered there
 * (the rank's block in place) and its pieces copied back. */
static int scatter_grads(RtStepIO *io, const RtPipeDesc *p, int s, float *g, float *x) {
  int64_t counts[RT_COMM_MAX_RANKS], moved = 0;
  double t0 = io->trace ? rt_trace_clock() : 0;
  ZeroBucket b = {.b = {.id = -1}};
  for (int more; (more = zero_next(io, p, s, &b)) != 0;) {
    if (more < 0) return RT_ERR;
    if (b.z <= 1) continue;
    int me = rt_comm_rank(b.c);
    int64_t mine = rt_pipe_bucket_counts(p, s, &b.b, b.z, me, counts);
    if (b.b.rows == 1) {
      float *at = g + rt_pipe_bucket_offset(p, s, &b.b);
      if (rt_comm_reduce_scatter(b.c, at, at + mine, counts)) return RT_ERR;
    } else {
      int64_t at = 0;
      for (int k = 0; k < b.z; at += counts[k++]) zero_block(p, s, &b, k, g, x + at, 1);
      if (rt_comm_reduce_scatter(b.c, x, x + mine, counts)) return RT_ERR;
      zero_block(p, s, &b, me, g, x + mine, -1);
    }
    moved += b.b.total;
  }
  if (io->trace) rt_trace_add(io->trace, RT_TRACE_SCATTER_DP, 0, 0, t0, rt_trace_clock(), moved);
  return RT_OK;
}

/* ZeRO-1, --save-grads: the whole gradients into io->grads from every rank's
 * pieces (the accumulator holds only the rank's pieces summed), in the same
 * buckets: a bucket of several rows gathers the blocks zero_block lays out
 * into the scratch x, then copies every rank's pieces out. */
static int gather_grads(RtStepIO *io, const RtPipeDesc *p, int s, float *g, int64_t gn,
                        float *x) {
  int64_t counts[RT_COMM_MAX_RANKS];
  memcpy(io->grads, g, (size_t)gn * sizeof *g);
  ZeroBucket b = {.b = {.id = -1}};
  for (int more; (more = zero_next(io, p, s, &b)) != 0;) {
    if (more < 0) return RT_ERR;
    if (b.z <= 1) continue;
    int me = rt_comm_rank(b.c);
    int64_t mine = rt_pipe_bucket_counts(p, s, &b.b, b.z, me, counts);
    if (b.b.rows == 1) {
      int64_t off = rt_pipe_bucket_offset(p, s, &b.b);
      if (rt_comm_all_gather(b.c, g + off + mine, io->grads + off, counts)) return RT_ERR;
      continue;
    }
    zero_block(p, s, &b, me, g, x + mine, 1);
    if (rt_comm_all_gather(b.c, x + mine, x, counts)) return RT_ERR;
    int64_t at = 0;
    for (int k = 0; k < b.z; at += counts[k++]) zero_block(p, s, &b, k, io->grads, x + at, -1);
  }
  return RT_OK;
}

int rt_pipe_check_slots(const RtPipeDesc *p, int s) {
  int M = p->microbatches, n = p->nactions[s];
  const RtPipeAction *a = p->actions[s];
  for (int mb = 0; mb < M; mb++)
    if (rt_pipe_slot(p, s, mb) < 0 || rt_pipe_slot(p, s, mb) >= p->slots)
      return rt_fail("pipeline: stage %d puts microbatch %d in slot %d of %d", s, mb,
                     rt_pipe_slot(p, s, mb), p->slots);
  int *last = malloc(sizeof *last * (size_t)(M > 0 ? M : 1));
  int *owner = malloc(sizeof *owner * (size_t)(p->slots > 0 ? p->slots : 1));
  if (!last || !owner) {
    free(last), free(owner);
    return rt_fail("out of memory checking stage %d's %d slots", s, p->slots);
  }
  for (int mb = 0; mb < M; mb++) last[mb] = -1;
  for (int k = 0; k < p->slots; k++) owner[k] = -1;
  int rc = RT_OK;
  for (int i = 0; i < n && rc == RT_OK; i++) {
    if (a[i].mb >= M)
      rc = rt_fail("pipeline: stage %d's action %d is of microbatch %d of %d", s, i, a[i].mb, M);
    else
      last[a[i].mb] = i;
  }
  /* owner[k]: the microbatch whose span holds slot k at action i, or -1 */
  for (int i = 0; i < n && rc == RT_OK; i++) {
    int mb = a[i].mb, k = rt_pipe_slot(p, s, mb);
    if (owner[k] >= 0 && owner[k] != mb)
      rc = rt_fail("pipeline: stage %d's slot %d holds microbatches %d and %d at once (action "
                   "%d); the slot table does not fit the schedule",
                   s, k, owner[k], mb, i);
    owner[k] = i == last[mb] ? -1 : mb;
  }
  free(last), free(owner);
  return rc;
}

int rt_pipe_step(RtStepIO *io, const RtPipeDesc *p) {
  char *base = io->arena;
  const int32_t *tokens = io->tokens, *targets = io->targets;
  int s = io->pp_group ? io->pp_rank : 0;
  if (s < 0 || s >= p->stages) return rt_fail("pipeline: pp coordinate %d of %d stages", s, p->stages);
  if (rt_pipe_check_slots(p, s)) return RT_ERR;
  if (io->trace)
    rt_trace_pipe(io->trace, p->schedule, p->stages, p->chunks, p->microbatches, p->nactions[s]);
  int64_t gmax = 0, gn = p->grad_numel[s];
  for (int k = 0; k < p->stages; k++)
    if (p->grad_numel[k] > gmax) gmax = p->grad_numel[k];
  float *g = (float *)(void *)(base + (int64_t)rt_pipe_slots(p, s) * p->slot_bytes[s]);
  float *sum = g + (gmax * 4 + 63) / 64 * 16, *part = sum + (p->shared_max * 4 + 63) / 64 * 16;
  memset(g, 0, (size_t)gn * sizeof *g);
  io->gacc = g;
  double loss = 0, ce = 0;
  int rc = RT_OK;
  for (int i = 0; i < p->nactions[s] && rc == RT_OK; i++)
    rc = traced_act(io, p, &p->actions[s][i], base, tokens, targets, &loss, &ce);
  io->arena = base;
  io->tokens = tokens;
  io->targets = targets;
  if (rc) return RT_ERR;
  int dp = io->dp_group ? rt_comm_size(io->dp_group) : 1, zero = p->zero > 1 && dp > 1;
  float *after = part + (p->shared_max * 4 + 63) / 64 * 16;
  float *scratch = zero ? (float *)(void *)(base + rt_pipe_zero_scratch(p, s, (char *)after - base))
                        : NULL;
  if (zero ? scatter_grads(io, p, s, g, scratch) : dp > 1 && reduce_grads(io, p, s, g, gn, dp))
    return RT_ERR;
  double t0 = io->trace ? rt_trace_clock() : 0;
  int64_t moved = 0;
  for (int j = 0; j < p->nshared; j++) {
    const int64_t *sh = p->shared + (int64_t)j * (p->stages + 1), *off = sh + 1;
    int64_t n = sh[0], at = 0; /* under ZeRO-1 the rank's piece alone: [at, at + n) */
    int tag = p->chunks * p->microbatches * 2 + j, first = 1;
    if (off[s] < 0) continue;
    if (zero) at = rt_pipe_zero_piece(sh[0], dp, rt_comm_rank(io->dp_group), &n);
    for (int k = 0; k < p->stages; k++) /* buffered: never waits */
      if (k != s && off[k] >= 0 && rt_comm_send(io->pp_group, g + off[s] + at, n, k, tag))
        return RT_ERR;
    for (int k = 0; k < p->stages; k++) { /* sum = the parts in stage order */
      if (off[k] < 0) continue;
      const float *x = g + off[s] + at;
      if (k != s) {
        if (rt_comm_recv(io->pp_group, part, n, k, tag)) return RT_ERR;
        x = part;
        moved += n;
      }
      if (first) {
        memcpy(sum, x, (size_t)n * sizeof *sum);
        first = 0;
      } else {
        for (int64_t i = 0; i < n; i++) sum[i] += x[i];
      }
    }
    memcpy(g + off[s] + at, sum, (size_t)n * sizeof *g);
  }
  if (io->trace && p->nshared)
    rt_trace_add(io->trace, RT_TRACE_REDUCE_PP, 0, 0, t0, rt_trace_clock(), moved);
  if (io->grads && zero && gather_grads(io, p, s, g, gn, scratch)) return RT_ERR;
  if (io->grads && !zero) memcpy(io->grads, g, (size_t)gn * sizeof *g);
  /* the loss: the last stage's mean over microbatches, on every stage */
  float both[2] = {0, 0};
  if (s == (p->chunks - 1) % p->stages)
    both[0] = (float)(loss / p->microbatches), both[1] = (float)(ce / p->microbatches);
  if (p->stages > 1 && reduce(io, io->pp_group, both, 2, RT_TRACE_REDUCE_LOSS)) return RT_ERR;
  t0 = io->trace ? rt_trace_clock() : 0;
  rc = p->optimizer[s](io);
  if (io->trace) rt_trace_add(io->trace, RT_TRACE_OPTIMIZER, 0, 0, t0, rt_trace_clock(), 0);
  io->loss = both[0];
  io->ce_loss = both[1];
  return rc ? RT_ERR : RT_OK;
}

/* ---- stage-local buffers for the harness ---- */

int rt_pipe_stage_desc(const RtModelDesc *m, int s, RtPipeStageDesc *d) {
  memset(d, 0, sizeof *d);
  d->p = calloc((size_t)m->nparams + 1, sizeof *d->p);
  d->s = calloc((size_t)m->nstate + 1, sizeof *d->s);
  d->index = calloc((size_t)m->nparams + 1, sizeof *d->index);
  if (!d->p || !d->s || !d->index) {
    rt_pipe_stage_desc_free(d);
    return rt_fail("out of memory for stage %d's description", s);
  }
  int np = 0, ns = 0;
  for (int i = 0; i < m->nparams; i++) {
    int64_t off = m->pp_param_offset[(int64_t)s * m->nparams + i];
    d->index[i] = off >= 0 ? np : -1;
    if (off < 0) continue;
    if (off > m->pp_params_numel[s] - m->params[i].numel) {
      rt_pipe_stage_desc_free(d);
      return rt_fail("model description: parameter '%s' at %lld on stage %d exceeds its "
                     "buffer of %lld floats", m->params[i].name, (long long)off, s,
                     (long long)m->pp_params_numel[s]);
    }
    d->p[np] = m->params[i];
    d->p[np++].offset = off;
  }
  for (int i = 0; i < m->nstate; i++) {
    int64_t off = m->pp_state_offset[(int64_t)s * m->nstate + i];
    int param = m->state[i].param;
    if (off < 0) continue;
    if (param < 0 || param >= m->nparams || d->index[param] < 0 ||
        off > m->pp_state_numel[s] - m->state[i].numel) {
      rt_pipe_stage_desc_free(d);
      return rt_fail("model description: stage %d holds state '%s' without its parameter "
                     "or past its buffer", s, m->state[i].name);
    }
    d->s[ns] = m->state[i];
    d->s[ns].offset = off;
    d->s[ns++].param = d->index[param];
  }
  d->m = *m;
  d->m.nparams = np, d->m.params = d->p, d->m.params_numel = m->pp_params_numel[s];
  d->m.nstate = ns, d->m.state = d->s, d->m.state_numel = m->pp_state_numel[s];
  if (m->pp_arena_bytes) d->m.arena_bytes = m->pp_arena_bytes[s];
  return RT_OK;
}

void rt_pipe_stage_desc_free(RtPipeStageDesc *d) {
  free(d->p);
  free(d->s);
  free(d->index);
  memset(d, 0, sizeof *d);
}

/* The lowest stage holding parameter i, which contributes it to a gather. */
static int owner(const RtModelDesc *m, int i) {
  for (int s = 0; s < m->pp; s++)
    if (m->pp_param_offset[(int64_t)s * m->nparams + i] >= 0) return s;
  return -1;
}

/* Stage s's contribution (params owned, then state of those, in order) packed
 * into out, or its length when out is NULL. */
static int64_t pack(const RtModelDesc *m, int s, const float *params, const float *state,
                    float *out) {
  int64_t n = 0;
  for (int i = 0; i < m->nparams; i++) {
    if (owner(m, i) != s) continue;
    if (out)
      memcpy(out + n, params + m->pp_param_offset[(int64_t)s * m->nparams + i],
             (size_t)m->params[i].numel * sizeof *out);
    n += m->params[i].numel;
  }
  for (int i = 0; state && i < m->nstate; i++) {
    if (owner(m, m->state[i].param) != s) continue;
    if (out)
      memcpy(out + n, state + m->pp_state_offset[(int64_t)s * m->nstate + i],
             (size_t)m->state[i].numel * sizeof *out);
    n += m->state[i].numel;
  }
  return n;
}

int rt_pipe_gather(RtComm *pp, int s, const RtModelDesc *m, const float *params,
                   const float *state, float *whole_params, float *whole_state) {
  int P = m->pp, with_state = state && whole_state;
  int64_t *counts = calloc((size_t)P, sizeof *counts), total = 0;
  if (!counts) return rt_fail("out of memory");
  for (int k = 0; k < P; k++) total += counts[k] = pack(m, k, params, with_state ? state : NULL,
                                                        NULL);
  float *mine = malloc(sizeof(float) * (size_t)(counts[s] + 1));
  float *all = malloc(sizeof(float) * (size_t)(total + 1));
  int rc = mine && all ? RT_OK : rt_fail("out of memory gathering %lld floats over pp",
                                          (long long)total);
  if (rc == RT_OK) {
    pack(m, s, params, with_state ? state : NULL, mine);
    rc = rt_comm_all_gather(pp, mine, all, counts);
  }
  for (int64_t k = 0, at = 0; rc == RT_OK && k < P; k++) { /* unpack stage k's part */
    for (int i = 0; i < m->nparams; i++) {
      if (owner(m, i) != k) continue;
      memcpy(whole_params + m->params[i].offset, all + at,
             (size_t)m->params[i].numel * sizeof(float));
      at += m->params[i].numel;
    }
    for (int i = 0; with_state && i < m->nstate; i++) {
      if (owner(m, m->state[i].param) != k) continue;
      memcpy(whole_state + m->state[i].offset, all + at,
             (size_t)m->state[i].numel * sizeof(float));
      at += m->state[i].numel;
    }
  }
  free(counts), free(mine), free(all);
  return rc;
}

void rt_pipe_extract(const RtModelDesc *m, int s, const float *whole_params,
                     const float *whole_state, float *params, float *state) {
  for (int i = 0; i < m->nparams; i++) {
    int64_t off = m->pp_param_offset[(int64_t)s * m->nparams + i];
    if (off >= 0)
      memcpy(params + off, whole_params + m->params[i].offset,
             (size_t)m->params[i].numel * sizeof(float));
  }
  for (int i = 0; whole_state && i < m->nstate; i++) {
    int64_t off = m->pp_state_offset[(int64_t)s * m->nstate + i];
    if (off >= 0)
      memcpy(state + off, whole_state + m->state[i].offset,
             (size_t)m->state[i].numel * sizeof(float));
  }
}
