/* tests/cuda/cu_local.c -- the device-local collectives' plan
 * (runtime/cuda/rt_cuda_local_plan.c) without CUDA: the steps
 * rt_cuda_local.cu enqueues, emulated on host memory, against the thread
 * communicator (rt_comm.h), bit for bit.
 *
 * For all_reduce, all_gather and reduce_scatter, groups of 1 to 19 members
 * (one reduction pass and several: RT_LOCAL_ADDS additions each), counts of
 * 1, 7 and 1000 floats, out of place and in place: every member's result of
 * the emulation equals the thread communicator's (memcmp), and no member's
 * send buffer changes before every member has read it (the emulation runs
 * the members' reads one after another, then checks every send buffer, then
 * the scratch copies).  Inputs span 2^-20 .. 2^20, so the sums' order shows:
 * the test checks that the reverse order gives other bits, and that the
 * emulation with the in-place scratch switched off is caught.
 *
 * Also the start-up memory check of ranks sharing a GPU
 * (runtime/cuda/rt_cuda_memcheck.c): the sum over the ranks on one host and
 * device, and the world gather of the ranks' records over thread meshes of up
 * to 12 ranks (every rank gets every record, in world rank order). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda/rt_cuda_local.h"
#include "runtime/cuda/rt_cuda_memcheck.h"
#include "runtime/rt_comm.h"
#include "runtime/rt_err.h"

static int failures;

#define CHECK(cond)                                                                         \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      fprintf(stderr, "cu_local: %s:%d: %s\n", __FILE__, __LINE__, #cond);                  \
      failures++;                                                                           \
    }                                                                                       \
  } while (0)

enum { MAXM = 19, MAXC = 1000 };
enum { OUT_OF_PLACE, IN_PLACE };

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* [-1, 1) times 2^(-20 .. 20) */
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  float x = (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
  int e = (int)(rng % 41) - 20;
  for (; e > 0; e--) x *= 2.0f;
  for (; e < 0; e++) x *= 0.5f;
  return x;
}

/* One member's memory: send and recv inside one allocation, as the mode says. */
typedef struct {
  float *base, *send, *recv, *scratch;
} Member;

static const char *const opname[] = {"all_reduce", "all_gather", "reduce_scatter"};

static int64_t in_of(int op, int m, int64_t n) { return op == RT_CUDA_OP_REDUCE_SCATTER ? n * m : n; }
static int64_t out_of(int op, int m, int64_t n) { return op == RT_CUDA_OP_ALL_GATHER ? n * m : n; }

/* Lays out member r's buffers: out of place, recv follows send; in place, the
 * rt_comm.h forms (all_reduce send == recv; all_gather send = block r of
 * recv; reduce_scatter recv = block r of send). */
static void layout(Member *mb, int op, int m, int r, int64_t n, int mode) {
  int64_t in = in_of(op, m, n), out = out_of(op, m, n);
  mb->base = calloc((size_t)(in + out), sizeof(float));
  mb->scratch = calloc((size_t)out, sizeof(float));
  mb->send = mb->base, mb->recv = mb->base + in;
  if (mode == IN_PLACE) {
    if (op == RT_CUDA_OP_ALL_REDUCE) mb->recv = mb->base;
    if (op == RT_CUDA_OP_ALL_GATHER) mb->recv = mb->base, mb->send = mb->base + r * n;
    if (op == RT_CUDA_OP_REDUCE_SCATTER) mb->recv = mb->base + r * n;
  }
}

/* ---- the reference: the thread communicator ---- */

typedef struct {
  int op, m, mode;
  int64_t n;
  float **input;     /* per member: its send values (in floats) */
  float **result;    /* per member: its recv values (out floats) */
} Ref;

static int ref_rank(RtComm *world, void *arg) {
  Ref *t = arg;
  int r = rt_comm_rank(world), m = t->m;
  Member mb;
  layout(&mb, t->op, m, r, t->n, t->mode);
  memcpy(mb.send, t->input[r], (size_t)in_of(t->op, m, t->n) * sizeof(float));
  int64_t counts[MAXM];
  for (int i = 0; i < m; i++) counts[i] = t->n;
  int rc = t->op == RT_CUDA_OP_ALL_REDUCE ? rt_comm_all_reduce(world, mb.send, mb.recv, t->n)
           : t->op == RT_CUDA_OP_ALL_GATHER ? rt_comm_all_gather(world, mb.send, mb.recv, counts)
                                            : rt_comm_reduce_scatter(world, mb.send, mb.recv, counts);
  memcpy(t->result[r], mb.recv, (size_t)out_of(t->op, m, t->n) * sizeof(float));
  free(mb.base);
  free(mb.scratch);
  return rc;
}

/* ---- the emulation of rt_cuda_local_collective ---- */

/* rt_cuda_local.cu's local_sum_kernel, element by element */
static void sum_pass(float *out, const float *start, const float *const *add, int nadd,
                     int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    float acc = start[i];
    for (int j = 0; j < nadd; j++) acc += add[j][i];
    out[i] = acc;
  }
}

/* Returns 0 when every member's result equals ref and no send buffer changed
 * before all reads were done; no_scratch switches the in-place scratch off. */
static int emulate(const Ref *t, int no_scratch) {
  int op = t->op, m = t->m, bad = 0;
  int64_t n = t->n, in = in_of(op, m, n), out = out_of(op, m, n);
  Member mb[MAXM];
  RtLocalPlan pl[MAXM];
  float *out_buf[MAXM];
  for (int r = 0; r < m; r++) {
    layout(&mb[r], op, m, r, n, t->mode);
    memcpy(mb[r].send, t->input[r], (size_t)in * sizeof(float));
    CHECK(rt_cuda_local_plan(op, m, r, n, mb[r].send, mb[r].recv, &pl[r]) == 0);
    CHECK(pl[r].in == in && pl[r].out == out && pl[r].n == n);
    if (no_scratch) pl[r].scratch = 0;
    out_buf[r] = pl[r].scratch ? mb[r].scratch : mb[r].recv;
  }
  /* 2. every member reads the peers' send buffers (all are "ready") */
  for (int r = 0; r < m; r++) {
    if (op == RT_CUDA_OP_ALL_GATHER) {
      for (int j = 0; j < m; j++)
        if (!(j == r && pl[r].skip_own))
          memcpy(out_buf[r] + j * n, mb[j].send, (size_t)n * sizeof(float));
      continue;
    }
    if (m == 1) { /* rt_cuda.h's collective() copies; not the plan's business */
      memcpy(out_buf[r], mb[0].send + pl[r].src_off, (size_t)n * sizeof(float));
      continue;
    }
    for (int k = 0; k < rt_cuda_local_passes(m); k++) {
      int lo, hi;
      rt_cuda_local_pass(m, k, &lo, &hi);
      const float *add[RT_LOCAL_ADDS];
      CHECK(hi - lo >= 1 && hi - lo <= RT_LOCAL_ADDS);
      for (int j = lo; j < hi; j++) add[j - lo] = mb[j].send + pl[r].src_off;
      sum_pass(out_buf[r], k == 0 ? mb[0].send + pl[r].src_off : out_buf[r], add, hi - lo, n);
    }
  }
  /* 3. all done reading: the send buffers are as they were published */
  for (int r = 0; r < m; r++)
    if (memcmp(mb[r].send, t->input[r], (size_t)in * sizeof(float))) bad = 1;
  for (int r = 0; r < m; r++) {
    if (pl[r].scratch) memcpy(mb[r].recv, mb[r].scratch, (size_t)out * sizeof(float));
    if (memcmp(mb[r].recv, t->result[r], (size_t)out * sizeof(float))) bad = 1;
    free(mb[r].base);
    free(mb[r].scratch);
  }
  return bad;
}

/* The reverse order of the sums differs from the communicator's somewhere
 * (so a test that passes has checked the order). */
static int order_shows(const Ref *t) {
  int64_t n = t->n;
  for (int64_t i = 0; i < n; i++) { /* member 0's result: element i of block 0 */
    float acc = t->input[t->m - 1][i];
    for (int j = t->m - 2; j >= 0; j--) acc += t->input[j][i];
    if (memcmp(&acc, &t->result[0][i], sizeof acc)) return 1;
  }
  return 0;
}

static void run_case(int op, int m, int64_t n, int mode) {
  Ref t = {op, m, mode, n, NULL, NULL};
  int64_t in = in_of(op, m, n), out = out_of(op, m, n);
  float *inputs[MAXM], *results[MAXM];
  for (int r = 0; r < m; r++) {
    inputs[r] = malloc((size_t)in * sizeof(float));
    results[r] = calloc((size_t)out, sizeof(float));
    for (int64_t i = 0; i < in; i++) inputs[r][i] = frand();
  }
  t.input = inputs, t.result = results;
  if (rt_comm_threads_run(m, ref_rank, &t)) {
    fprintf(stderr, "cu_local: reference %s m=%d: %s\n", opname[op], m, rt_last_error());
    failures++;
  } else {
    int bad = emulate(&t, 0);
    if (bad)
      fprintf(stderr, "cu_local: %s of %lld floats over %d members %s: the emulation differs "
              "from the thread communicator\n", opname[op], (long long)n, m,
              mode == IN_PLACE ? "in place" : "out of place");
    failures += bad;
    if (op != RT_CUDA_OP_ALL_GATHER && m >= 3 && n >= 7) CHECK(order_shows(&t));
    /* in place, the scratch is what keeps a member from overwriting what a
     * peer still reads: without it the emulation must notice */
    if (mode == IN_PLACE && m >= 2 && op == RT_CUDA_OP_ALL_REDUCE) CHECK(emulate(&t, 1) != 0);
  }
  for (int r = 0; r < m; r++) free(inputs[r]), free(results[r]);
}

static void check_plan_args(void) {
  RtLocalPlan p;
  static float buf[64]; /* addresses only */
  CHECK(rt_cuda_local_plan(3, 2, 0, 4, buf, buf + 8, &p) == -1);
  CHECK(rt_cuda_local_plan(RT_CUDA_OP_ALL_REDUCE, 0, 0, 4, buf, buf + 8, &p) == -1);
  CHECK(rt_cuda_local_plan(RT_CUDA_OP_ALL_REDUCE, 2, 2, 4, buf, buf + 8, &p) == -1);
  CHECK(rt_cuda_local_plan(RT_CUDA_OP_ALL_REDUCE, 2, 0, -1, buf, buf + 8, &p) == -1);
  /* adjacent ranges do not overlap; one shared float does */
  CHECK(rt_cuda_local_plan(RT_CUDA_OP_ALL_REDUCE, 2, 1, 8, buf, buf + 8, &p) == 0 && !p.scratch);
  CHECK(rt_cuda_local_plan(RT_CUDA_OP_ALL_REDUCE, 2, 1, 8, buf, buf + 7, &p) == 0 && p.scratch);
  CHECK(rt_cuda_local_plan(RT_CUDA_OP_ALL_REDUCE, 2, 1, 8, buf + 7, buf, &p) == 0 && p.scratch);
  /* all_gather: send as the own block of recv needs no scratch; elsewhere inside it does */
  CHECK(rt_cuda_local_plan(RT_CUDA_OP_ALL_GATHER, 4, 2, 4, buf + 8, buf, &p) == 0 &&
        p.skip_own && !p.scratch);
  CHECK(rt_cuda_local_plan(RT_CUDA_OP_ALL_GATHER, 4, 2, 4, buf + 4, buf, &p) == 0 &&
        !p.skip_own && p.scratch);
  /* reduce_scatter: member 3 of 4 sums block 3 of every send */
  CHECK(rt_cuda_local_plan(RT_CUDA_OP_REDUCE_SCATTER, 4, 3, 5, buf, buf + 40, &p) == 0 &&
        p.in == 20 && p.out == 5 && p.src_off == 15 && !p.scratch);
  /* passes: every source after the first added once, in order */
  for (int m = 2; m <= 40; m++) {
    int next = 1, passes = rt_cuda_local_passes(m);
    for (int k = 0; k < passes; k++) {
      int lo, hi;
      rt_cuda_local_pass(m, k, &lo, &hi);
      CHECK(lo == next && hi > lo && hi - lo <= RT_LOCAL_ADDS);
      next = hi;
    }
    CHECK(next == m);
  }
  CHECK(rt_cuda_local_passes(1) == 0 && rt_cuda_local_passes(RT_LOCAL_ADDS + 1) == 1 &&
        rt_cuda_local_passes(RT_LOCAL_ADDS + 2) == 2);
}

/* The start-up memory check: the sum over the ranks on one host and GPU. */
static void check_device_need(void) {
  const int64_t h0 = rt_cuda_host_hash("node0"), h1 = rt_cuda_host_hash("node1");
  CHECK(h0 != h1 && h0 >= 0 && h1 >= 0 && h0 == rt_cuda_host_hash("node0"));
  /* ranks 0-3 on node0: 0, 2 on GPU 0 and 1, 3 on GPU 1; ranks 4, 5 on node1 GPU 0 */
  RtDeviceNeed all[6] = {{100, 0, h0}, {200, 1, h0}, {300, 0, h0},
                         {400, 1, h0}, {500, 0, h1}, {600, 0, h1}};
  int k = 0;
  CHECK(rt_cuda_device_need(all, 6, 0, &k) == 400 && k == 2);
  CHECK(rt_cuda_device_need(all, 6, 3, &k) == 600 && k == 2);
  CHECK(rt_cuda_device_need(all, 6, 5, &k) == 1100 && k == 2);
  CHECK(rt_cuda_device_need(all, 1, 0, &k) == 100 && k == 1);
  CHECK(rt_cuda_device_need(all, 6, 6, &k) == -1 && rt_cuda_device_need(NULL, 6, 0, &k) == -1);
  RtDeviceNeed big[2] = {{INT64_MAX - 1, 0, h0}, {2, 0, h0}};
  CHECK(rt_cuda_device_need(big, 2, 1, &k) == -1);
}

/* rt_cuda_gather_world over a thread mesh: every rank gets every rank's
 * record in world order. */
typedef struct {
  int tp, dp, pp;
} GatherCase;

static int gather_rank(RtComm *world, void *arg) {
  const GatherCase *gc = arg;
  RtMesh mesh;
  if (rt_comm_mesh(world, gc->tp, gc->dp, gc->pp, 1, &mesh)) return 1;
  int w = rt_comm_world_rank(world), n = gc->tp * gc->dp * gc->pp, bad = 0;
  RtDeviceNeed mine = {((int64_t)w << 33) + 7 * w, w % 3, 1000 + w}, *all = calloc((size_t)n, sizeof *all);
  float rec[RT_DEVICE_NEED_FLOATS];
  memcpy(rec, &mine, sizeof mine);
  RtComm *g[3] = {mesh.tp_comm, mesh.dp_comm, mesh.pp_comm};
  if (!all || rt_cuda_gather_world(g, rec, RT_DEVICE_NEED_FLOATS, n, (float *)(void *)all)) bad = 1;
  for (int r = 0; r < n && !bad; r++)
    bad = all[r].need != ((int64_t)r << 33) + 7 * r || all[r].device != r % 3 ||
          all[r].host != 1000 + r;
  free(all);
  rt_comm_mesh_free(&mesh);
  return bad;
}

static void check_gather_world(void) {
  static const GatherCase cases[] = {{1, 1, 1}, {2, 1, 1}, {1, 2, 1}, {1, 1, 2},
                                     {2, 2, 1}, {2, 1, 2}, {1, 3, 2}, {2, 2, 2}, {3, 2, 2}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    GatherCase gc = cases[i];
    int ok = rt_comm_threads_run(gc.tp * gc.dp * gc.pp, gather_rank, &gc) == RT_OK;
    if (!ok) fprintf(stderr, "cu_local: gather_world tp %d dp %d pp %d: %s\n", gc.tp, gc.dp,
                     gc.pp, rt_last_error());
    CHECK(ok);
  }
}

/* rt_cuda_agree over a thread mesh: every rank gets the status and the
 * message of the lowest world rank that failed (RT_OK where none did). */
typedef struct {
  int tp, dp, pp;
  int status[8];     /* per world rank: RT_OK, RT_ERR_SETUP or RT_ERR */
  int want, from;    /* the agreed status and the world rank whose message wins */
} AgreeCase;

static int agree_rank(RtComm *world, void *arg) {
  const AgreeCase *ac = arg;
  RtMesh mesh;
  if (rt_comm_mesh(world, ac->tp, ac->dp, ac->pp, 1, &mesh)) return 1;
  int w = rt_comm_world_rank(world), n = ac->tp * ac->dp * ac->pp;
  rt_clear_error();
  if (ac->status[w] == RT_ERR_SETUP) rt_fail_setup("setup of rank %d refused", w);
  else if (ac->status[w] == RT_ERR) rt_fail("rank %d: internal", w);
  RtComm *g[3] = {mesh.tp_comm, mesh.dp_comm, mesh.pp_comm};
  int rc = rt_cuda_agree(g, n, ac->status[w]);
  char want[64] = "";
  if (ac->want == RT_ERR_SETUP) snprintf(want, sizeof want, "setup of rank %d refused", ac->from);
  else if (ac->want == RT_ERR) snprintf(want, sizeof want, "rank %d: internal", ac->from);
  int bad = rc != ac->want || strcmp(rt_last_error(), want);
  if (bad)
    fprintf(stderr, "cu_local: agree rank %d: got %d '%s', want %d '%s'\n", w, rc,
            rt_last_error(), ac->want, want);
  rt_comm_mesh_free(&mesh);
  return bad;
}

static void check_agree(void) {
  enum { OK = RT_OK, SET = RT_ERR_SETUP, ERR = RT_ERR };
  static const AgreeCase cases[] = {
      {1, 1, 1, {SET}, SET, 0},                            /* one rank: its own */
      {2, 2, 1, {OK, OK, OK, OK}, OK, 0},                  /* nobody failed */
      {2, 2, 1, {OK, SET, OK, SET}, SET, 1},               /* the lowest refused rank */
      {2, 1, 2, {OK, OK, ERR, SET}, ERR, 2},               /* an internal error first */
      {2, 1, 2, {SET, ERR, OK, OK}, SET, 0},               /* a refusal first */
      {2, 2, 2, {OK, OK, OK, OK, OK, OK, OK, SET}, SET, 7} /* the last rank alone */
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    AgreeCase ac = cases[i];
    int n = ac.tp * ac.dp * ac.pp;
    int ok = rt_comm_threads_run(n, agree_rank, &ac) == RT_OK;
    if (!ok) fprintf(stderr, "cu_local: agree case %zu failed\n", i);
    CHECK(ok);
  }
}

int main(void) {
  static const int members[] = {1, 2, 3, 4, 5, RT_LOCAL_ADDS + 1, RT_LOCAL_ADDS + 2, MAXM};
  static const int64_t counts[] = {1, 7, MAXC};
  int cases = 0;
  check_plan_args();
  check_device_need();
  check_gather_world();
  check_agree();
  for (int op = RT_CUDA_OP_ALL_REDUCE; op <= RT_CUDA_OP_REDUCE_SCATTER; op++)
    for (size_t mi = 0; mi < sizeof members / sizeof *members; mi++)
      for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++)
        for (int mode = OUT_OF_PLACE; mode <= IN_PLACE; mode++, cases++)
          run_case(op, members[mi], counts[ci], mode);
  printf("cu_local: %d cases, %s (%d failure%s)\n", cases, failures ? "FAIL" : "ok", failures,
         failures == 1 ? "" : "s");
  return failures ? 1 : 0;
}
