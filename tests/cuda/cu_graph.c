/* tests/cuda/cu_graph.c -- PARC_CUDA_GRAPH's decisions without CUDA
 * (runtime/cuda/rt_cuda_graph_plan.c, rt_cuda_graph.h) and, given the
 * directories of generated trainers, the split of their step.
 *
 *   cu_graph                 the switch's values (an unknown one is refused with
 *                            a message naming the variable and the values
 *                            allowed), every blocker alone and their order, and
 *                            the per-step actions over runs of steps: warm-up
 *                            plain, capture once, replay after, --save-grads
 *                            steps plain without losing the graph
 *   cu_graph DIR [DIR...]    each DIR/train_cuda.c (parc --target all): step()
 *                            uploads, runs step_body through rt_cuda_graph_step,
 *                            then reads back, in that order; step_body reads no
 *                            io field but io->grads (SAVE_GRAD), so a replay
 *                            takes the step's inputs from device memory; the
 *                            host-staged op count passed equals the calls of
 *                            host-staged routines in step_body.  A directory
 *                            name ending in "+host" must count some. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda/rt_cuda_graph.h"
#include "runtime/rt_err.h"
#include "tests/cuda/cu_test.h"

static void switch_values(void) {
  static const char *const dflt[] = {NULL, "", "auto"};
  for (int i = 0; i < 3; i++) {
    int on = -1;
    CHECK(rt_cuda_graph_parse(dflt[i], &on) == RT_OK && on == RT_GRAPH_AUTO,
          "'%s' is auto (the default)", dflt[i] ? dflt[i] : "(unset)");
  }
  int on = -1;
  CHECK(rt_cuda_graph_parse("0", &on) == RT_OK && on == RT_GRAPH_OFF, "'0' is off");
  CHECK(rt_cuda_graph_parse("1", &on) == RT_OK && on == RT_GRAPH_ON, "'1' is on");
  /* auto and on both take steps into a graph (off: never) */
  CHECK(rt_cuda_graph_action(RT_GRAPH_AUTO, 1, 0, 0) == RT_GRAPH_CAPTURE &&
            rt_cuda_graph_action(RT_GRAPH_ON, 1, 0, 0) == RT_GRAPH_CAPTURE &&
            rt_cuda_graph_action(RT_GRAPH_OFF, 1, 0, 0) == RT_GRAPH_PLAIN,
        "auto and 1 capture the second step, 0 does not");
  static const char *const bad[] = {"2", "yes", "on", "1 ", "-1", "01", "Auto"};
  for (int i = 0; i < 7; i++) {
    rt_clear_error();
    on = -1;
    int rc = rt_cuda_graph_parse(bad[i], &on);
    const char *msg = rt_last_error();
    char want[64];
    snprintf(want, sizeof want, "PARC_CUDA_GRAPH='%s'", bad[i]);
    CHECK(rc == RT_ERR_SETUP && on == 0, "'%s' is refused as a setup error", bad[i]);
    CHECK(strstr(msg, want) && strstr(msg, "0") && strstr(msg, "1") && strstr(msg, "auto") &&
              !strchr(msg, '\n'),
          "one line naming the variable, '%s' and the values allowed: %s", bad[i], msg);
  }
}

static void blockers(void) {
  RtGraphCase none = {1, RT_GRAPH_COMM_NONE, 0, 0, 0};
  CHECK(rt_cuda_graph_blocker(&none) == NULL, "one rank, dense, no profile: captured");
  /* the comm backend of one rank is never looked at */
  RtGraphCase one = {1, RT_GRAPH_COMM_HOST, 0, 0, 0};
  CHECK(rt_cuda_graph_blocker(&one) == NULL, "one rank: no collectives");
  struct {
    RtGraphCase k;
    const char *word; /* in the notice */
  } alone[] = {
      {{1, RT_GRAPH_COMM_NONE, 0, 0, 1}, "PARC_CUDA_PROFILE"},
      {{1, RT_GRAPH_COMM_NONE, 1, 0, 0}, "pipelined"},
      {{2, RT_GRAPH_COMM_HOST, 0, 0, 0}, "PARC_CUDA_COMM=host"},
      {{4, RT_GRAPH_COMM_LOCAL, 0, 0, 0}, "device-local"},
      {{2, RT_GRAPH_COMM_NCCL, 0, 0, 0}, "NCCL"},
      {{1, RT_GRAPH_COMM_NONE, 0, 3, 0}, "routing"},
  };
  int n = (int)(sizeof alone / sizeof alone[0]);
  for (int i = 0; i < n; i++) {
    const char *why = rt_cuda_graph_blocker(&alone[i].k);
    CHECK(why && strstr(why, alone[i].word) && !strchr(why, '\n'), "case %d names %s: %s", i,
          alone[i].word, why ? why : "(nothing)");
    for (int j = 0; j < i; j++) /* each reason its own line */
      CHECK(!why || strcmp(why, rt_cuda_graph_blocker(&alone[j].k)), "cases %d and %d differ",
            i, j);
  }
  /* several at once: the first of the list above names the notice */
  RtGraphCase all = {2, RT_GRAPH_COMM_HOST, 1, 2, 1};
  const char *why = rt_cuda_graph_blocker(&all);
  CHECK(why && strstr(why, "PARC_CUDA_PROFILE"), "the profile first: %s", why ? why : "");
  RtGraphCase some = {2, RT_GRAPH_COMM_NCCL, 0, 2, 0};
  why = rt_cuda_graph_blocker(&some);
  CHECK(why && strstr(why, "NCCL"), "collectives before routing: %s", why ? why : "");
}

/* Runs `steps` steps as rt_cuda_graph_step does; save_grads[t] marks step t;
 * writes the actions and returns how many captures happened. */
static int run(int on, int steps, const int *save_grads, int *act) {
  int captured = 0, captures = 0;
  for (int t = 0; t < steps; t++) {
    act[t] = rt_cuda_graph_action(on, t, captured, save_grads ? save_grads[t] : 0);
    if (act[t] == RT_GRAPH_CAPTURE) captured = 1, captures++;
  }
  return captures;
}

static void actions(void) {
  enum { T = 8 };
  int act[T];
  CHECK(run(0, T, NULL, act) == 0, "off: no capture");
  for (int t = 0; t < T; t++) CHECK(act[t] == RT_GRAPH_PLAIN, "off: step %d plain", t);
  CHECK(run(1, T, NULL, act) == 1, "on: one capture");
  CHECK(act[0] == RT_GRAPH_PLAIN, "the warm-up step is plain");
  CHECK(act[1] == RT_GRAPH_CAPTURE, "the second step is captured");
  for (int t = 2; t < T; t++) CHECK(act[t] == RT_GRAPH_REPLAY, "step %d replays", t);
  /* --save-grads: the harness sets it on the run's first step; any step it
   * marks runs plain, and the capture moves to the next unmarked step */
  int sg[T] = {1, 1, 0, 0, 1, 0, 0, 0};
  CHECK(run(1, T, sg, act) == 1, "save-grads: still one capture");
  CHECK(act[0] == RT_GRAPH_PLAIN && act[1] == RT_GRAPH_PLAIN, "marked steps plain");
  CHECK(act[2] == RT_GRAPH_CAPTURE, "the capture after them");
  CHECK(act[3] == RT_GRAPH_REPLAY && act[4] == RT_GRAPH_PLAIN && act[5] == RT_GRAPH_REPLAY,
        "a marked step between replays is plain, the graph stays");
  CHECK(run(1, 1, NULL, act) == 0 && act[0] == RT_GRAPH_PLAIN, "a one-step run never captures");
}

/* ---- generated trainers ---- */

static const char *const host_routines[] = {
    "rt_cuda_topk(", "rt_cuda_gather(", "rt_cuda_scatter_add(", "rt_cuda_onehot(",
    "rt_cuda_dispatch(", "rt_cuda_capacity_drop(", "rt_cuda_expert_all_to_all(",
    "rt_cuda_combine(", "rt_cuda_combine_grad_y(", "rt_cuda_combine_grad_w(", NULL};

static int count(const char *a, const char *b, const char *what) {
  int n = 0;
  for (const char *p = strstr(a, what); p && p < b; p = strstr(p + 1, what)) n++;
  return n;
}

static void trainer(const char *dir) {
  char *src = cu_slurp_in(dir, "train_cuda.c");
  const char *body = strstr(src, "\nstatic int step_body(RtStepIO *io) {\n");
  const char *body_end = body ? strstr(body, "\n}\n") : NULL;
  const char *step = strstr(src, "\nstatic int step(RtStepIO *io) {\n");
  const char *step_end = step ? strstr(step, "\n}\n") : NULL;
  CHECK(body && body_end && step && step_end && body_end < step, "%s: step_body, then step",
        dir);
  if (!body_end || !step_end) {
    free(src);
    return;
  }
  /* the body: no io field but grads, no upload or read-back */
  int io = count(body, body_end, "io->"), grads = count(body, body_end, "io->grads");
  CHECK(io == grads, "%s: step_body reads %d io fields besides io->grads", dir, io - grads);
  CHECK(!count(body, body_end, "rt_cuda_step_"), "%s: no upload or read-back in step_body", dir);
  CHECK(count(body, body_end, "_launch(") > 0, "%s: the kernels are in step_body", dir);
  /* step: upload, graph step, read back */
  const char *up = strstr(step, "rt_cuda_step_begin(");
  const char *g = strstr(step, "CHECK(rt_cuda_graph_step(dev, step_body_, io, ");
  const char *down = strstr(step, "rt_cuda_step_end(");
  CHECK(up && g && down && up < g && g < down && down < step_end,
        "%s: step uploads, runs the body, reads back", dir);
  CHECK(!count(step, step_end, "_launch("), "%s: step launches no kernel itself", dir);
  int passed = -1, calls = 0;
  if (g) passed = atoi(g + strlen("CHECK(rt_cuda_graph_step(dev, step_body_, io, "));
  for (int i = 0; host_routines[i]; i++) calls += count(body, body_end, host_routines[i]);
  CHECK(g && strstr(g, "io->grads != NULL));"), "%s: --save-grads steps are marked", dir);
  CHECK(passed == calls, "%s: %d host-staged ops passed, %d called", dir, passed, calls);
  size_t n = strlen(dir);
  int want_host = n > 5 && !strcmp(dir + n - 5, "+host");
  CHECK(want_host == (calls > 0), "%s: %d host-staged calls", dir, calls);
  printf("cu_graph: %s: step_body with %d kernel launches, %d host-staged ops\n", dir,
         count(body, body_end, "_launch("), calls);
  free(src);
}

int main(int argc, char **argv) {
  if (argc == 1) {
    switch_values();
    blockers();
    actions();
  }
  for (int i = 1; i < argc; i++) trainer(argv[i]);
  if (failures) fprintf(stderr, "cu_graph: %d failures\n", failures);
  else printf("cu_graph: all checks passed\n");
  return failures != 0;
}
