/* tests/pipeline/schedule_test.c -- every schedule passes the checker, its
 * simulated bubble matches the analytic one under uniform durations, its
 * microbatches' slots are the fewest that keep them apart, and the checker
 * refuses broken schedules, naming the stage and action. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"
#include "runtime/rt_err.h"
#include "runtime/rt_pipe.h"
#include "tests/support/check_msg.h"


/* Uniform timing: a stage's F, B, W of one microbatch take f, b, w split
 * over its V chunks; transfers take send. */
static PpTiming *uniform(int nchunks, int V, double f, double b, double w, double send) {
  PpTiming *t = calloc((size_t)nchunks, sizeof *t);
  for (int c = 0; c < nchunks; c++) t[c] = (PpTiming){f / V, b / V, w / V, send, 100, 0};
  return t;
}

/* Simulates; returns the bubble or -1 (and reports) when refused. */
static double bubble_of(PpScheduleKind k, int P, int V, int M, double f, double b, double w,
                        PpSim *keep) {
  PpSchedule s;
  if (pp_schedule_build(k, P, V, M, &s)) {
    CHECK(0, "%s P=%d V=%d M=%d: build failed", pp_schedule_name[k], P, V, M);
    return -1;
  }
  PpTiming *t = uniform(P * V, V, f, b, w, 0);
  PpSim sim;
  char err[512];
  double r = -1;
  if (pp_simulate(&s, t, 0, &sim, err, sizeof err)) {
    CHECK(0, "%s P=%d V=%d M=%d refused: %s", pp_schedule_name[k], P, V, M, err);
  } else {
    r = sim.bubble;
    int n = 0;
    for (int st = 0; st < P; st++) n += s.nactions[st];
    CHECK(sim.nevents == n, "%s: %d events for %d actions", pp_schedule_name[k], sim.nevents, n);
    if (keep) *keep = sim;
    else pp_sim_free(&sim);
  }
  free(t);
  pp_schedule_free(&s);
  return r;
}

static void test_all_schedules(void) {
  static const int Ps[] = {2, 4}, Ms[] = {4, 8, 16};
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 3; j++) {
      int P = Ps[i], M = Ms[j];
      double want = (double)(P - 1) / M;
      /* F : B : W = 1 : 1 : 1, and a B twice the F with no W split */
      double g = bubble_of(PP_GPIPE, P, 1, M, 1, 1, 1, NULL);
      double o = bubble_of(PP_1F1B, P, 1, M, 1, 1, 1, NULL);
      double g2 = bubble_of(PP_GPIPE, P, 1, M, 1, 2, 0, NULL);
      double o2 = bubble_of(PP_1F1B, P, 1, M, 1, 2, 0, NULL);
      double v = bubble_of(PP_INTERLEAVED, P, 2, M, 1, 1, 1, NULL);
      double z = bubble_of(PP_ZB_H1, P, 1, M, 1, 1, 1, NULL);
      CHECK(fabs(g - want) < 1e-12 && fabs(g2 - want) < 1e-12, "gpipe P=%d M=%d: %g, want %g",
            P, M, g, want);
      CHECK(fabs(o - want) < 1e-12 && fabs(o2 - want) < 1e-12, "1f1b P=%d M=%d: %g, want %g",
            P, M, o, want);
      CHECK(fabs(v - want / 2) < 1e-12, "interleaved P=%d V=2 M=%d: %g, want %g", P, M, v,
            want / 2);
      CHECK(z >= 0 && z < o, "zb P=%d M=%d: %g, not below 1f1b's %g", P, M, z, o);
      CHECK(fabs(z - want / 3) < 1e-12, "zb P=%d M=%d: %g, want a third of 1f1b's: %g", P, M, z,
            want / 3);
      printf("P=%d M=%2d  gpipe %.4f  1f1b %.4f  interleaved(V=2) %.4f  zb %.4f  (analytic "
             "%.4f, /V %.4f)\n", P, M, g, o, v, z, want, want / 2);
    }
  /* interleaved with more chunks, and GPipe with fewer microbatches than stages */
  CHECK(fabs(bubble_of(PP_INTERLEAVED, 4, 3, 8, 1, 2, 0, NULL) - 3.0 / 24) < 1e-12,
        "interleaved V=3");
  CHECK(fabs(bubble_of(PP_GPIPE, 4, 1, 2, 1, 2, 0, NULL) - 3.0 / 2) < 1e-12, "gpipe M < P");
}

/* Memory: 1F1B keeps at most P - s microbatches on stage s, GPipe all M. */
static void test_inflight(void) {
  PpSim sim;
  if (bubble_of(PP_1F1B, 4, 1, 8, 1, 2, 0, &sim) >= 0) {
    for (int s = 0; s < 4; s++)
      CHECK(sim.peak_inflight[s] == 4 - s, "1f1b stage %d: %d in flight", s, sim.peak_inflight[s]);
    CHECK(sim.peak_stash_bytes[0] == 400, "1f1b stage 0 stash %lld",
          (long long)sim.peak_stash_bytes[0]);
    pp_sim_free(&sim);
  }
  if (bubble_of(PP_GPIPE, 4, 1, 8, 1, 2, 0, &sim) >= 0) {
    CHECK(sim.peak_inflight[3] == 8, "gpipe: %d in flight", sim.peak_inflight[3]);
    pp_sim_free(&sim);
  }
  if (bubble_of(PP_ZB_H1, 4, 1, 8, 1, 1, 1, &sim) >= 0) {
    for (int s = 0; s < 4; s++)
      CHECK(sim.peak_inflight[s] <= 4, "zb stage %d: %d in flight", s, sim.peak_inflight[s]);
    pp_sim_free(&sim);
  }
}

/* Feeds a schedule edited by fn to the checker; the error must contain want. */
static void expect_refused(const char *what, void (*fn)(PpSchedule *), const char *want) {
  PpSchedule s;
  if (pp_schedule_build(PP_1F1B, 2, 1, 4, &s)) {
    CHECK(0, "%s: build", what);
    return;
  }
  fn(&s);
  PpTiming *t = uniform(2, 1, 1, 2, 0, 0.5);
  PpSim sim;
  char err[512] = "";
  int rc = pp_simulate(&s, t, 0, &sim, err, sizeof err);
  CHECK(rc == -1 && strstr(err, want), "%s: got rc %d '%s', want '%s'", what, rc, err, want);
  if (!rc) pp_sim_free(&sim);
  printf("refused %-22s %s\n", what, err);
  free(t);
  pp_schedule_free(&s);
}

static int find(const PpSchedule *s, int st, PpKind k, int mb) {
  for (int i = 0; i < s->nactions[st]; i++)
    if (s->actions[st][i].kind == k && s->actions[st][i].mb == mb) return i;
  return -1;
}

static void drop(PpSchedule *s, int st, int i) {
  memmove(&s->actions[st][i], &s->actions[st][i + 1],
          sizeof(PpAction) * (size_t)(s->nactions[st] - i - 1));
  s->nactions[st]--;
}

/* stage 1 loses its RECV_ACT of microbatch 2: F runs without its input */
static void missing_recv(PpSchedule *s) { drop(s, 1, find(s, 1, PP_RECV_ACT, 2)); }
/* stage 1 loses RECV_ACT and F of microbatch 3: stage 0's send is never received */
static void unreceived_send(PpSchedule *s) {
  drop(s, 1, find(s, 1, PP_RECV_ACT, 3));
  drop(s, 1, find(s, 1, PP_F, 3));
  drop(s, 1, find(s, 1, PP_B, 3));
  drop(s, 1, find(s, 1, PP_SEND_GRAD, 3));
  drop(s, 0, find(s, 0, PP_RECV_GRAD, 3));
  drop(s, 0, find(s, 0, PP_B, 3));
}
/* stage 0 loses the SEND_ACT of microbatch 1: stage 1 waits forever */
static void missing_send(PpSchedule *s) { drop(s, 0, find(s, 0, PP_SEND_ACT, 1)); }
/* stage 0 waits for microbatch 0's gradient before sending its forward:
 * stage 1 waits for that forward: a cycle */
static void deadlock(PpSchedule *s) {
  int i = find(s, 0, PP_SEND_ACT, 0), j = find(s, 0, PP_RECV_GRAD, 0);
  PpAction a = s->actions[0][i];
  memmove(&s->actions[0][i], &s->actions[0][i + 1], sizeof(PpAction) * (size_t)(j - i));
  s->actions[0][j] = a;
}
/* stage 1 runs B before F of microbatch 0 */
static void backward_first(PpSchedule *s) {
  int i = find(s, 1, PP_F, 0), j = find(s, 1, PP_B, 0);
  PpAction a = s->actions[1][i];
  s->actions[1][i] = s->actions[1][j];
  s->actions[1][j] = a;
}
/* stage 0 runs F(0) twice */
static void twice(PpSchedule *s) { s->actions[0][find(s, 0, PP_F, 1)].mb = 0; }
/* a chunk placed on the wrong stage */
static void wrong_stage(PpSchedule *s) { s->actions[0][0].chunk = 1; }

static void test_broken(void) {
  expect_refused("missing recv", missing_recv, "stage 1, action");
  expect_refused("missing recv", missing_recv, "F(mb 2, chunk 1): runs before its RECV_ACT");
  expect_refused("unreceived send", unreceived_send,
                 "stage 0, action 11 SEND_ACT(mb 3, chunk 0): never received");
  expect_refused("missing send", missing_send, "RECV_ACT(mb 1, chunk 1): no stage sends it");
  expect_refused("deadlock order", deadlock,
                 "stage 0, action 3 RECV_GRAD(mb 0, chunk 0): deadlock: waits for stage 1's");
  expect_refused("B before F", backward_first, "stage 1, action 1 B(mb 0, chunk 1): runs before F");
  expect_refused("F twice", twice, "F(mb 0, chunk 0): runs twice");
  expect_refused("wrong stage", wrong_stage, "stage 0, action 0 F(mb 0, chunk 1): the chunk belongs");
  /* the stash limit */
  PpSchedule s;
  pp_schedule_build(PP_GPIPE, 2, 1, 4, &s);
  PpTiming *t = uniform(2, 1, 1, 2, 0, 0);
  PpSim sim;
  char err[512] = "";
  int rc = pp_simulate(&s, t, 300, &sim, err, sizeof err);
  CHECK(rc == -1 && strstr(err, "F(mb 3, chunk 0): stashed activations exceed the limit"),
        "stash limit: '%s'", err);
  free(t);
  pp_schedule_free(&s);
}

/* The runtime's check of a slot table (rt_pipe_check_slots, a second
 * implementation of test_slots' spans test) takes pp_assign_slots' table, and
 * refuses a slot out of range and two held microbatches put in one slot. */
static void check_runtime_slots(const PpSchedule *s, int *slot, int slots) {
  int P = s->nstages, M = s->microbatches;
  RtPipeAction *acts[16];
  const RtPipeAction *cacts[16];
  if (P > 16) return;
  for (int st = 0; st < P; st++) {
    acts[st] = malloc(sizeof(RtPipeAction) * (size_t)(s->nactions[st] ? s->nactions[st] : 1));
    for (int a = 0; a < s->nactions[st]; a++)
      acts[st][a] = (RtPipeAction){(unsigned char)s->actions[st][a].kind,
                                   (unsigned char)s->actions[st][a].chunk,
                                   (unsigned short)s->actions[st][a].mb};
    cacts[st] = acts[st];
  }
  RtPipeDesc d = {.stages = P, .chunks = s->nchunks, .microbatches = M, .slots = slots,
                  .slot = slot, .nactions = s->nactions, .actions = cacts};
  const char *name = pp_schedule_name[s->kind];
  for (int st = 0; st < P; st++) {
    rt_clear_error();
    CHECK(rt_pipe_check_slots(&d, st) == 0, "%s P=%d M=%d stage %d: runtime refuses: %s", name,
          P, M, st, rt_last_error());
    /* microbatch 1 moved into microbatch 0's slot, where the stage holds
     * both at once (0's last action after 1's first) */
    int keep = slot[st * M + 1], last0 = -1, first1 = -1;
    for (int a = 0; a < s->nactions[st]; a++) {
      if (s->actions[st][a].mb == 0) last0 = a;
      if (s->actions[st][a].mb == 1 && first1 < 0) first1 = a;
    }
    if (last0 > first1) {
      slot[st * M + 1] = slot[st * M];
      rt_clear_error();
      CHECK(rt_pipe_check_slots(&d, st) != 0 &&
                strstr(rt_last_error(), "holds microbatches 0 and 1"),
            "%s P=%d M=%d stage %d: shared slot: \"%s\"", name, P, M, st, rt_last_error());
    }
    slot[st * M + 1] = slots;
    rt_clear_error();
    CHECK(rt_pipe_check_slots(&d, st) != 0 && strstr(rt_last_error(), "microbatch 1 in slot"),
          "%s P=%d M=%d stage %d: slot out of range: \"%s\"", name, P, M, st, rt_last_error());
    slot[st * M + 1] = keep;
  }
  for (int st = 0; st < P; st++) free(acts[st]);
}

/* pp_assign_slots on every schedule: a slot per microbatch on each stage,
 * two microbatches in one slot only where their action spans on the stage
 * are apart, and as many slots as the most spans one action index lies in
 * (counted plainly): no fewer could do.  1F1B's stage s holds P - s; ZB-H1,
 * whose late W actions made mb % slots take every microbatch, holds P. */
static void test_slots(void) {
  static const int Ps[] = {2, 4}, Ms[] = {4, 8, 16};
  for (int k = 0; k < PP_NSCHEDULES; k++)
    for (int i = 0; i < 2; i++)
      for (int j = 0; j < 3; j++) {
        int P = Ps[i], M = Ms[j], V = k == PP_INTERLEAVED ? 2 : 1, most = 0;
        PpSchedule s;
        if (pp_schedule_build((PpScheduleKind)k, P, V, M, &s)) {
          CHECK(0, "%s P=%d M=%d: build failed", pp_schedule_name[k], P, M);
          continue;
        }
        int *slot = malloc(sizeof(int) * (size_t)(P * M));
        int *first = malloc(sizeof(int) * (size_t)M), *last = malloc(sizeof(int) * (size_t)M);
        int *stage_slots = malloc(sizeof(int) * (size_t)P);
        int slots = pp_assign_slots(&s, slot, stage_slots);
        for (int st = 0; st < P; st++) {
          for (int mb = 0; mb < M; mb++) first[mb] = last[mb] = -1;
          for (int a = 0; a < s.nactions[st]; a++) {
            int mb = s.actions[st][a].mb;
            if (first[mb] < 0) first[mb] = a;
            last[mb] = a;
          }
          int held = 0, used = 0;
          for (int a = 0; a < s.nactions[st]; a++) {
            int n = 0;
            for (int mb = 0; mb < M; mb++) n += first[mb] <= a && a <= last[mb];
            if (n > held) held = n;
          }
          for (int x = 0; x < M; x++) {
            int sx = slot[st * M + x];
            CHECK(sx >= 0 && sx < slots, "%s P=%d M=%d stage %d: mb %d in slot %d of %d",
                  pp_schedule_name[k], P, M, st, x, sx, slots);
            if (sx + 1 > used) used = sx + 1;
            for (int y = x + 1; y < M; y++)
              CHECK(sx != slot[st * M + y] || last[x] < first[y] || last[y] < first[x],
                    "%s P=%d M=%d stage %d: mbs %d and %d share slot %d while both held",
                    pp_schedule_name[k], P, M, st, x, y, sx);
          }
          CHECK(used == held && stage_slots[st] == held,
                "%s P=%d M=%d stage %d: %d slots used, %d said, for %d held at once",
                pp_schedule_name[k], P, M, st, used, stage_slots[st], held);
          if (k == PP_1F1B)
            CHECK(used == P - st, "1f1b P=%d M=%d stage %d: %d slots", P, M, st, used);
          if (held > most) most = held;
        }
        CHECK(slots == most, "%s P=%d M=%d: %d slots, %d held at most", pp_schedule_name[k], P,
              M, slots, most);
        check_runtime_slots(&s, slot, slots);
        if (k == PP_ZB_H1) CHECK(slots == P, "zb P=%d M=%d: %d slots", P, M, slots);
        free(slot), free(stage_slots), free(first), free(last);
        pp_schedule_free(&s);
      }
}

int main(void) {
  test_all_schedules();
  test_slots();
  test_inflight();
  test_broken();
  printf("%d checks, %d failures\n", checks, failures);
  return failures != 0;
}
