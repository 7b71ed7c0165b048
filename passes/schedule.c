/* passes/schedule.c -- pipeline schedules as per-stage action lists.
 *
 * Each generator writes the order of a stage's compute actions (F, B, W);
 * with_comm() then puts a RECV right before every compute action that needs
 * data from another stage and a SEND right after every one that produces
 * data for another: RECV_ACT before F(mb, c > 0), SEND_ACT after F(mb, c <
 * last), RECV_GRAD before B(mb, c < last), SEND_GRAD after B(mb, c > 0).
 * Sends are asynchronous, so a stage only ever waits in a RECV; a schedule
 * is deadlock-free when its receive order never waits on a send that sits
 * behind a receive waiting on it (passes/schedule_check.c checks).
 *
 *   gpipe        all forwards, then all backwards, microbatches in order;
 *   1f1b         stage s: P - s - 1 warm-up forwards, then one forward and
 *                one backward in turn, then the remaining backwards
 *                (PipeDream-flush / Megatron);
 *   interleaved  Megatron's interleaved 1F1B: V chunks a stage, virtual
 *                microbatch k is microbatch (k / PV) P + k % P on the
 *                stage's chunk (k / P) % V (reversed for backward), with
 *                (P - s - 1) 2 + (V - 1) P warm-up forwards (all of them
 *                when M == P);
 *   zb           ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism"): B
 *                and W are separate actions; 1F1B's order, stage s
 *                deferring the W of its first s microbatches to the end. */
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

const char *const pp_schedule_name[PP_NSCHEDULES] = {"gpipe", "1f1b", "interleaved", "zb"};
const char *const pp_kind_name[PP_NKINDS] = {"F", "B", "W", "SEND_ACT", "RECV_ACT",
                                             "SEND_GRAD", "RECV_GRAD"};

const char *pp_action_str(const PpAction *a, char *buf, size_t len) {
  snprintf(buf, len, "%s(mb %d, chunk %d)",
           a->kind >= 0 && a->kind < PP_NKINDS ? pp_kind_name[a->kind] : "?", a->mb, a->chunk);
  return buf;
}

/* A growing action list. */
typedef struct {
  PpAction *a;
  int n, cap, oom;
} List;

static void push(List *l, PpKind k, int mb, int chunk) {
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 64;
    PpAction *a = realloc(l->a, sizeof *a * (size_t)cap);
    if (!a) {
      l->oom = 1;
      return;
    }
    l->a = a, l->cap = cap;
  }
  l->a[l->n++] = (PpAction){k, mb, chunk};
}

/* The compute order with its sends and receives (see the file comment). */
static void with_comm(const List *compute, int nchunks, List *out) {
  for (int i = 0; i < compute->n; i++) {
    PpAction a = compute->a[i];
    if (a.kind == PP_F && a.chunk > 0) push(out, PP_RECV_ACT, a.mb, a.chunk);
    if (a.kind == PP_B && a.chunk < nchunks - 1) push(out, PP_RECV_GRAD, a.mb, a.chunk);
    push(out, a.kind, a.mb, a.chunk);
    if (a.kind == PP_F && a.chunk < nchunks - 1) push(out, PP_SEND_ACT, a.mb, a.chunk);
    if (a.kind == PP_B && a.chunk > 0) push(out, PP_SEND_GRAD, a.mb, a.chunk);
  }
  out->oom |= compute->oom;
}

static void gpipe(List *l, int s, int M) {
  for (int mb = 0; mb < M; mb++) push(l, PP_F, mb, s);
  for (int mb = 0; mb < M; mb++) push(l, PP_B, mb, s);
}

static void one_f_one_b(List *l, int s, int P, int M) {
  int warm = P - s - 1 < M ? P - s - 1 : M;
  for (int mb = 0; mb < warm; mb++) push(l, PP_F, mb, s);
  for (int i = 0; i < M - warm; i++) {
    push(l, PP_F, warm + i, s);
    push(l, PP_B, i, s);
  }
  for (int mb = M - warm; mb < M; mb++) push(l, PP_B, mb, s);
}

/* Virtual microbatch k of stage s: microbatch and global chunk. */
static void virt(int k, int s, int P, int V, int backward, int *mb, int *chunk) {
  int local = (k % (P * V)) / P;
  if (backward) local = V - 1 - local;
  *mb = (k / (P * V)) * P + k % P;
  *chunk = local * P + s;
}

static void interleaved(List *l, int s, int P, int V, int M) {
  int total = M * V, mb, c;
  int warm = M == P ? total : (P - s - 1) * 2 + (V - 1) * P;
  if (warm > total) warm = total;
  for (int k = 0; k < warm; k++) {
    virt(k, s, P, V, 0, &mb, &c);
    push(l, PP_F, mb, c);
  }
  for (int k = 0; k < total - warm; k++) {
    virt(warm + k, s, P, V, 0, &mb, &c);
    push(l, PP_F, mb, c);
    virt(k, s, P, V, 1, &mb, &c);
    push(l, PP_B, mb, c);
  }
  for (int k = total - warm; k < total; k++) {
    virt(k, s, P, V, 1, &mb, &c);
    push(l, PP_B, mb, c);
  }
}

/* ZB-H1: 1F1B's order with W after its B, except that stage s defers the
 * W of its first s microbatches to the very end.  The input gradients then
 * run down the pipeline without waiting for weight gradients, and the
 * deferred W's fill the cool-down's idle time; stage s holds at most
 * (P - s) + s = P stashes, 1F1B's peak.  With equal F, B and W times the
 * bubble is (P - 1)(F + B - W) per stage, a third of 1F1B's. */
static void zb_h1(List *l, int s, int P, int M) {
  List order = {0};
  one_f_one_b(&order, s, P, M);
  int defer = s < M ? s : M;
  for (int i = 0; i < order.n; i++) {
    push(l, order.a[i].kind, order.a[i].mb, s);
    if (order.a[i].kind == PP_B && order.a[i].mb >= defer) push(l, PP_W, order.a[i].mb, s);
  }
  for (int mb = 0; mb < defer; mb++) push(l, PP_W, mb, s);
  l->oom |= order.oom;
  free(order.a);
}

void pp_schedule_free(PpSchedule *s) {
  for (int i = 0; s->actions && i < s->nstages; i++) free(s->actions[i]);
  free(s->actions);
  free(s->nactions);
  memset(s, 0, sizeof *s);
}

int pp_schedule_build(PpScheduleKind kind, int P, int V, int M, PpSchedule *out) {
  memset(out, 0, sizeof *out);
  if (P < 1 || M < 1 || V < 1 || (kind == PP_INTERLEAVED ? M % P != 0 : V != 1)) return -1;
  *out = (PpSchedule){kind, P, V, P * V, M, kind == PP_ZB_H1, NULL, NULL};
  out->nactions = calloc((size_t)P, sizeof *out->nactions);
  out->actions = calloc((size_t)P, sizeof *out->actions);
  List *compute = calloc((size_t)P, sizeof *compute);
  int bad = !out->nactions || !out->actions || !compute;
  for (int s = 0; !bad && s < P; s++) {
    if (kind == PP_GPIPE) gpipe(&compute[s], s, M);
    if (kind == PP_1F1B) one_f_one_b(&compute[s], s, P, M);
    if (kind == PP_INTERLEAVED) interleaved(&compute[s], s, P, V, M);
    if (kind == PP_ZB_H1) zb_h1(&compute[s], s, P, M);
    List full = {0};
    with_comm(&compute[s], P * V, &full);
    out->actions[s] = full.a;
    out->nactions[s] = full.n;
    bad = full.oom;
  }
  for (int s = 0; compute && s < P; s++) free(compute[s].a);
  free(compute);
  if (bad) pp_schedule_free(out);
  return bad ? -1 : 0;
}
