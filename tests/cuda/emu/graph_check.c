/* tests/cuda/emu/graph_check.c -- PARC_CUDA_GRAPH through libparcrt_cuda on
 * the emulated CUDA runtime (ctest cuda/graph_emu): rt_cuda_graph_step's
 * warm-up, capture and replays against the same steps run plainly, bit for bit.
 *
 * A step (body) on device state x [T, D]: y = x w, y += x w^T (cuBLASLt, the
 * second accumulating), causal attention with q = k = y and v = x
 * (rt_cuda_sdpa: dynamic shared memory, shuffles), the cross-entropy of the
 * output's rows (a block reduction, a mean), its gradient, the embedding
 * gradient of fixed ids (cub's sort, a memset), and x = the attention's
 * output: each step reads the last one's x, so a replay that ran stale work,
 * or none, shows.  Two contexts: one with PARC_CUDA_GRAPH=1 (step 1 plain, 2
 * captured and launched, 3.. replayed), one without; after every step x, the
 * loss and the embedding gradient must be the same bits in both, and the
 * graph context must have launched a graph for steps 2 on (the emulation's
 * count).  The same with PARC_CUDA_GRAPH unset (the default, auto) against
 * =0; and auto with host-staged ops in the step: no graph.  Then a body whose
 * work includes a synchronous copy (prohibited while capturing): the capture
 * fails, the step runs plainly (the same bits again) and later steps launch
 * no graph. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cu_test.h" /* failures, CHECK */
#include "emu_check.h"  /* emu_dev, emu_host */
#include "runtime/cuda/rt_cuda.h"
#include "runtime/rt_err.h"
#include "runtime/rt_gemm.h"
#include "runtime/rt_pool.h"

enum { T = 48, D = 32, V = 40, STEPS = 5 };

typedef struct {
  RtCuda *c;
  float *x, *w, *y, *o, *lse, *loss, *dlogits, *dloss, *dtable;
  int32_t *tgt, *ids;
  int sync_inside; /* the prohibited variant */
  float *host;     /* its synchronous copy's destination */
} Step;

static int body(void *arg) {
  Step *s = arg;
  RtCuda *c = s->c;
  if (rt_cuda_matmul(c, s->y, s->x, s->w, 1, T, D, D, 0) ||
      rt_cuda_matmul(c, s->y, s->x, s->w, 1, T, D, D, RT_MM_ACCUMULATE | RT_MM_TRANSPOSE_B) ||
      rt_cuda_sdpa(c, s->o, s->lse, s->y, s->y, s->x, 1, 1, 1, T, D, 0.125f, 1) ||
      rt_cuda_cross_entropy(c, s->loss, s->o, s->tgt, T, D) ||
      rt_cuda_cross_entropy_grad(c, s->dlogits, s->o, s->tgt, s->dloss, T, D) ||
      rt_cuda_embedding_grad(c, s->dtable, s->ids, s->dlogits, T, V, D))
    return RT_ERR;
  if (s->sync_inside && cudaMemcpy(s->host, s->loss, 4, cudaMemcpyDeviceToHost) != cudaSuccess)
    return rt_fail("graph_check: the synchronous copy failed");
  return rt_cuda_copy(c, s->x, s->o, T * D);
}

static float frand(uint64_t *r) {
  *r ^= *r << 13, *r ^= *r >> 7, *r ^= *r << 17;
  return (float)((*r >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* A context opened with PARC_CUDA_GRAPH=graph (NULL: unset). */
static int open_ctx(RtCuda **c, const char *graph) {
  if (graph) setenv("PARC_CUDA_GRAPH", graph, 1);
  else unsetenv("PARC_CUDA_GRAPH");
  RtCudaSetup su = {.params_numel = 1, .state_numel = 1, .arena_bytes = 64, .rows = 1, .seq = 1,
                    .tp = 1, .dp = 1, .gemm = RT_CUDA_GEMM_FP32, .model = "graph_check"};
  if (rt_cuda_open(c, &su, NULL, NULL)) {
    fprintf(stderr, "graph_check: %s\n", rt_last_error());
    return -1;
  }
  return 0;
}

static void init(Step *s, RtCuda *c, int sync_inside) {
  uint64_t r = 0x243f6a8885a308d3ull;
  float xh[T * D], wh[D * D], one = 1.0f;
  int32_t th[T], ih[T];
  for (int i = 0; i < T * D; i++) xh[i] = frand(&r);
  for (int i = 0; i < D * D; i++) wh[i] = frand(&r) * 0.2f;
  for (int i = 0; i < T; i++) th[i] = (int32_t)(i * 7 % D), ih[i] = (int32_t)(i * 5 % V);
  memset(s, 0, sizeof *s);
  s->c = c;
  s->x = emu_dev(xh, sizeof xh);
  s->w = emu_dev(wh, sizeof wh);
  s->y = emu_dev(NULL, sizeof xh);
  s->o = emu_dev(NULL, sizeof xh);
  s->lse = emu_dev(NULL, T * 4);
  s->loss = emu_dev(NULL, 4);
  s->dlogits = emu_dev(NULL, sizeof xh);
  s->dloss = emu_dev(&one, 4);
  s->dtable = emu_dev(NULL, V * D * 4);
  s->tgt = emu_dev(th, sizeof th);
  s->ids = emu_dev(ih, sizeof ih);
  s->sync_inside = sync_inside;
  s->host = malloc(4);
}

static void fini(Step *s) {
  void *p[] = {s->x, s->w, s->y, s->o, s->lse, s->loss, s->dlogits, s->dloss, s->dtable,
               s->tgt, s->ids};
  for (size_t i = 0; i < sizeof p / sizeof *p; i++) cudaFree(p[i]);
  free(s->host);
}

/* The state after a step, as host bytes: x, the loss, the embedding gradient. */
typedef struct {
  float x[T * D], loss, dtable[V * D];
} Snap;

static int snap(Step *s, Snap *out) {
  return rt_cuda_to_host(s->c, out->x, s->x, T * D) || rt_cuda_to_host(s->c, &out->loss, s->loss, 1) ||
         rt_cuda_to_host(s->c, out->dtable, s->dtable, V * D);
}

/* STEPS steps in a context of PARC_CUDA_GRAPH=graph and a plain one (=0),
 * compared after each; host_ops: the step's host-staged ops as the trainer
 * passes them; want_graphs: the graph launches expected of the first. */
static void run(const char *name, const char *graph, int host_ops, int sync_inside,
                long want_graphs) {
  RtCuda *cg = NULL, *cp = NULL;
  if (open_ctx(&cg, graph) || open_ctx(&cp, "0")) {
    failures++;
    rt_cuda_close(cg);
    rt_cuda_close(cp);
    return;
  }
  Step g, p;
  init(&g, cg, sync_inside);
  init(&p, cp, sync_inside);
  static Snap a, b;
  long before = kcu_emu_graph_launches();
  int same = 1;
  for (int step = 1; step <= STEPS; step++) {
    long l0 = kcu_emu_graph_launches();
    int rg = rt_cuda_graph_step(cg, body, &g, host_ops, 0);
    long l1 = kcu_emu_graph_launches();
    int rp = rt_cuda_graph_step(cp, body, &p, host_ops, 0);
    CHECK(rg == RT_OK && rp == RT_OK, "%s: step %d: %s", name, step, rt_last_error());
    CHECK(kcu_emu_graph_launches() == l1, "%s: the plain context launched a graph", name);
    if (snap(&g, &a) || snap(&p, &b)) {
      CHECK(0, "%s: step %d: read back: %s", name, step, rt_last_error());
      break;
    }
    int eq = !memcmp(&a, &b, sizeof a);
    CHECK(eq, "%s: step %d (%s): the graph context's state differs from the plain one's", name,
          step, l1 > l0 ? "graph" : "plain");
    CHECK(isfinite(a.loss) && a.loss > 0, "%s: step %d: loss %g", name, step, a.loss);
    same &= eq;
  }
  long got = kcu_emu_graph_launches() - before;
  CHECK(got == want_graphs, "%s: %ld graph launches, want %ld", name, got, want_graphs);
  printf("graph_check: %-40s %d steps, %ld graph launches, state %s\n", name, STEPS, got,
         same ? "bit for bit" : "DIFFERS");
  fini(&g);
  fini(&p);
  rt_cuda_close(cg);
  rt_cuda_close(cp);
}

int main(void) {
  rt_pool_init(2);
  run("captured and replayed", "1", 0, 0, STEPS - 1);
  run("by default (PARC_CUDA_GRAPH unset)", NULL, 0, 0, STEPS - 1);
  run("by default, host-staged ops in the step", NULL, 2, 0, 0);
  run("a synchronous copy in the step", "1", 0, 1, 0);
  printf("graph_check: %s (%d failure%s)\n", failures ? "FAIL" : "ok", failures,
         failures == 1 ? "" : "s");
  return failures ? 1 : 0;
}
