/* passes/schedule_check.c -- the schedule checker: simulates every stage's
 * action list and refuses a schedule that could not run.
 *
 * Model: each stage runs its list in order on one clock.  F, B and W take
 * their chunk's duration (a B of a schedule without W actions takes b + w);
 * a SEND takes no stage time and its data arrives `send` seconds later (the
 * link is never the bottleneck: transfers do not queue); a RECV waits until
 * its data has arrived.  Stages are advanced in turn as far as they can;
 * because a stage's times depend only on its own list and on send times,
 * the timeline does not depend on that order.
 *
 * Checked, each failure naming the stage, the action's index and the
 * action: indices in range and the chunk on this stage; an action's
 * dependences ran earlier on the stage (F after its RECV_ACT, B after F and
 * its RECV_GRAD, W after B, a SEND after what it sends); nothing runs twice;
 * every RECV has a SEND somewhere and no two stages wait on each other
 * (deadlock); every SEND is received; every microbatch runs F, B (and W)
 * on every chunk; stashed bytes within the limit.  Stash: a chunk's
 * stash_bytes are held from F(mb) until B(mb) (W(mb) when W is split). */
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

/* State of one (microbatch, chunk). */
typedef struct {
  unsigned char f, b, w, act_in, grad_in; /* ran / received on its stage */
  double act_at, grad_at;                 /* arrival of its input / output gradient; < 0 unsent */
  int act_from, grad_from;                /* index of that SEND in the sender's list */
} Cell;

typedef struct {
  const PpSchedule *s;
  const PpTiming *t;
  Cell *cell;
  char *err;
  size_t len;
} Sim;

static int fail(Sim *z, int stage, int i, const char *why) {
  char a[80];
  pp_action_str(&z->s->actions[stage][i], a, sizeof a);
  snprintf(z->err, z->len, "schedule %s: stage %d, action %d %s: %s", pp_schedule_name[z->s->kind],
           stage, i, a, why);
  return -1;
}

/* Static checks of one action. */
static int well_formed(Sim *z, int st, int i) {
  const PpSchedule *s = z->s;
  const PpAction *a = &s->actions[st][i];
  int last = s->nchunks - 1;
  if (a->kind < 0 || a->kind >= PP_NKINDS) return fail(z, st, i, "unknown action kind");
  if (a->mb < 0 || a->mb >= s->microbatches) return fail(z, st, i, "microbatch out of range");
  if (a->chunk < 0 || a->chunk > last) return fail(z, st, i, "chunk out of range");
  if (a->chunk % s->nstages != st) return fail(z, st, i, "the chunk belongs to another stage");
  if (a->kind == PP_W && !s->split_w) return fail(z, st, i, "W in a schedule whose B includes W");
  if ((a->kind == PP_SEND_ACT || a->kind == PP_RECV_GRAD) && a->chunk == last)
    return fail(z, st, i, "the last chunk has no next chunk");
  if ((a->kind == PP_RECV_ACT || a->kind == PP_SEND_GRAD) && a->chunk == 0)
    return fail(z, st, i, "the first chunk has no previous chunk");
  return 0;
}

/* Where a blocked RECV's SEND is, or -1 (stage in *who). */
static int find_send(const PpSchedule *s, const PpAction *recv, int *who) {
  PpKind want = recv->kind == PP_RECV_ACT ? PP_SEND_ACT : PP_SEND_GRAD;
  int chunk = recv->chunk + (recv->kind == PP_RECV_ACT ? -1 : 1);
  *who = chunk % s->nstages;
  for (int i = 0; i < s->nactions[*who]; i++) {
    const PpAction *a = &s->actions[*who][i];
    if (a->kind == want && a->mb == recv->mb && a->chunk == chunk) return i;
  }
  return -1;
}

/* Runs actions[st][*at] and on while they can; returns -1 on a violation. */
static int advance(Sim *z, int st, int *at, double *clock, PpSim *out, int64_t *held, int *inflight,
                   int64_t limit) {
  const PpSchedule *s = z->s;
  while (*at < s->nactions[st]) {
    int i = *at;
    const PpAction *a = &s->actions[st][i];
    const PpTiming *t = &z->t[a->chunk];
    Cell *c = &z->cell[a->mb * s->nchunks + a->chunk];
    double start = *clock, end = start;
    switch (a->kind) {
    case PP_RECV_ACT:
      if (c->act_at < 0) return 0; /* waits */
      if (c->act_in) return fail(z, st, i, "received twice");
      c->act_in = 1;
      if (c->act_at > end) end = c->act_at;
      break;
    case PP_RECV_GRAD:
      if (c->grad_at < 0) return 0;
      if (c->grad_in) return fail(z, st, i, "received twice");
      c->grad_in = 1;
      if (c->grad_at > end) end = c->grad_at;
      break;
    case PP_F:
      if (c->f) return fail(z, st, i, "runs twice");
      if (a->chunk > 0 && !c->act_in) return fail(z, st, i, "runs before its RECV_ACT");
      c->f = 1;
      end += t->f;
      held[st] += t->stash_bytes;
      inflight[st]++;
      if (held[st] > out->peak_stash_bytes[st]) out->peak_stash_bytes[st] = held[st];
      if (inflight[st] > out->peak_inflight[st]) out->peak_inflight[st] = inflight[st];
      if (limit > 0 && held[st] > limit) return fail(z, st, i, "stashed activations exceed the limit");
      break;
    case PP_B:
      if (c->b) return fail(z, st, i, "runs twice");
      if (!c->f) return fail(z, st, i, "runs before F of the microbatch on this chunk");
      if (a->chunk < s->nchunks - 1 && !c->grad_in) return fail(z, st, i, "runs before its RECV_GRAD");
      c->b = 1;
      end += s->split_w ? t->b : t->b + t->w;
      if (!s->split_w) held[st] -= t->stash_bytes, inflight[st]--;
      break;
    case PP_W:
      if (c->w) return fail(z, st, i, "runs twice");
      if (!c->b) return fail(z, st, i, "runs before B of the microbatch on this chunk");
      c->w = 1;
      end += t->w;
      held[st] -= t->stash_bytes, inflight[st]--;
      break;
    case PP_SEND_ACT: {
      if (!c->f) return fail(z, st, i, "sends before F of the microbatch on this chunk");
      Cell *to = c + 1;
      if (to->act_at >= 0) return fail(z, st, i, "sent twice");
      to->act_at = start + t->send;
      to->act_from = i;
      break;
    }
    case PP_SEND_GRAD: {
      if (!c->b) return fail(z, st, i, "sends before B of the microbatch on this chunk");
      Cell *to = c - 1;
      if (to->grad_at >= 0) return fail(z, st, i, "sent twice");
      to->grad_at = start + z->t[a->chunk - 1].send;
      to->grad_from = i;
      break;
    }
    default: return fail(z, st, i, "unknown action kind");
    }
    if (a->kind == PP_F || a->kind == PP_B || a->kind == PP_W) out->busy[st] += end - start;
    out->events[out->nevents++] = (PpEvent){st, i, start, end};
    if (end > out->makespan) out->makespan = end;
    *clock = end;
    (*at)++;
  }
  return 0;
}

void pp_sim_free(PpSim *sim) {
  free(sim->events);
  free(sim->busy);
  free(sim->peak_inflight);
  free(sim->peak_stash_bytes);
  memset(sim, 0, sizeof *sim);
}

static int check(Sim *z, PpSim *out, int64_t limit) {
  const PpSchedule *s = z->s;
  int P = s->nstages, total = 0;
  for (int st = 0; st < P; st++) {
    total += s->nactions[st];
    for (int i = 0; i < s->nactions[st]; i++)
      if (well_formed(z, st, i)) return -1;
  }
  int ncell = s->microbatches * s->nchunks;
  z->cell = calloc((size_t)ncell, sizeof *z->cell);
  int *at = calloc((size_t)P, sizeof *at), *inflight = calloc((size_t)P, sizeof *inflight);
  double *clock = calloc((size_t)P, sizeof *clock);
  int64_t *held = calloc((size_t)P, sizeof *held);
  out->events = calloc((size_t)total + 1, sizeof *out->events);
  out->busy = calloc((size_t)P, sizeof *out->busy);
  out->peak_inflight = calloc((size_t)P, sizeof *out->peak_inflight);
  out->peak_stash_bytes = calloc((size_t)P, sizeof *out->peak_stash_bytes);
  int rc = 0;
  if (!z->cell || !at || !inflight || !clock || !held || !out->events || !out->busy ||
      !out->peak_inflight || !out->peak_stash_bytes) {
    snprintf(z->err, z->len, "schedule check: out of memory");
    rc = -1;
  }
  for (int k = 0; !rc && k < ncell; k++) z->cell[k].act_at = z->cell[k].grad_at = -1;
  /* every pass either runs an action or, when none can run, ends */
  for (int moved = 1; !rc && moved;) {
    moved = 0;
    for (int st = 0; !rc && st < P; st++) {
      int before = at[st];
      rc = advance(z, st, &at[st], &clock[st], out, held, inflight, limit);
      moved |= at[st] != before;
    }
  }
  /* stages left are blocked in a RECV: a missing SEND is the cause if there
   * is one, else some stages wait on each other (the lowest is named) */
  for (int pass = 0; pass < 2 && !rc; pass++)
    for (int st = 0; !rc && st < P; st++) {
      if (at[st] == s->nactions[st]) continue;
      int who, j = find_send(s, &s->actions[st][at[st]], &who);
      char why[256], w[80];
      if (j < 0) {
        snprintf(why, sizeof why, "no stage sends it (stage %d has no matching %s)", who,
                 s->actions[st][at[st]].kind == PP_RECV_ACT ? "SEND_ACT" : "SEND_GRAD");
        rc = fail(z, st, at[st], why);
      } else if (pass == 1) {
        int k = at[who] < s->nactions[who] ? at[who] : 0;
        snprintf(why, sizeof why, "deadlock: waits for stage %d's action %d, which never runs "
                 "because stage %d waits at its action %d %s", who, j, who, k,
                 pp_action_str(&s->actions[who][k], w, sizeof w));
        rc = fail(z, st, at[st], why);
      }
    }
  /* every send received, every microbatch through every chunk */
  for (int k = 0; !rc && k < ncell; k++) {
    const Cell *c = &z->cell[k];
    int ch = k % s->nchunks;
    if (c->act_at >= 0 && !c->act_in)
      rc = fail(z, (ch - 1) % P, c->act_from, "never received (no matching RECV_ACT)");
    else if (c->grad_at >= 0 && !c->grad_in)
      rc = fail(z, (ch + 1) % P, c->grad_from, "never received (no matching RECV_GRAD)");
  }
  for (int k = 0; !rc && k < ncell; k++) {
    const Cell *c = &z->cell[k];
    int mb = k / s->nchunks, ch = k % s->nchunks;
    if (!c->f || !c->b || (s->split_w && !c->w)) {
      snprintf(z->err, z->len, "schedule %s: stage %d never runs %s(mb %d, chunk %d)",
               pp_schedule_name[s->kind], ch % P, !c->f ? "F" : !c->b ? "B" : "W", mb, ch);
      rc = -1;
    }
  }
  if (!rc) {
    double idle = 0, busy = 0;
    for (int st = 0; st < P; st++) idle += out->makespan - out->busy[st], busy += out->busy[st];
    out->bubble = busy > 0 ? idle / busy : 0;
  }
  free(z->cell), free(at), free(inflight), free(clock), free(held);
  return rc;
}

int pp_simulate(const PpSchedule *s, const PpTiming *timing, int64_t stash_limit, PpSim *out,
                char *err, size_t len) {
  memset(out, 0, sizeof *out);
  Sim z = {s, timing, NULL, err, len};
  int rc = check(&z, out, stash_limit);
  if (rc) pp_sim_free(out);
  return rc;
}
