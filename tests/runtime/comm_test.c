/* tests/runtime/comm_test.c -- the communicator (rt_comm.h) on its thread backend.
 *
 *   comm_test collectives   every collective, 1/2/3/4/8 ranks, sizes 0 .. 1e6 (uneven
 *                           splits, zero blocks, in place), bit-equal to serial references
 *   comm_test all_to_all    variable counts (zeros, gaps, reversed displacements)
 *   comm_test mesh          tp x dp x pp (x ep) groups: coordinates, membership and
 *                           order, concurrent collectives on every axis; color/key splits
 *   comm_test p2p           ping-pong, pipeline ring, per-tag order, send-first pairs,
 *                           self-sends, a receive posted before its send
 *   comm_test timeout       a late rank, an exited rank, mismatched calls, a failing
 *                           rank, a sub-group, a receive: every rank fails, promptly,
 *                           with the expected one-line message; nothing hangs
 *   comm_test determinism   the same all_reduce five times: identical bits
 *   comm_test errors        argument checks
 *   comm_test async         non-blocking starts and waits: several requests in flight
 *                           waited out of order, bit-equal to the blocking calls and to
 *                           serial references; progress while the rank computes; a
 *                           blocking call behind requests; dp requests beside tp
 *                           blocking calls; timeouts, mismatches and a rank leaving
 *                           with requests in flight fail (or finish) at the wait
 * Inputs and references come from comm_util.h.  A rank that sees a wrong result
 * returns rt_fail(...), which rt_comm_threads_run hands back. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/rt_comm.h"
#include "tests/runtime/check.h"
#include "tests/runtime/comm_util.h"

#define ENSURE(cond, ...)                   \
  do {                                      \
    if (!(cond)) return rt_fail(__VA_ARGS__); \
  } while (0)
#define TRY(call)                         \
  do {                                    \
    if ((call) != RT_OK) return RT_ERR;   \
  } while (0)

static const int NRANKS[] = {1, 2, 3, 4, 8};
#define NN ((int)(sizeof NRANKS / sizeof *NRANKS))
#define MAXR 8

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

static void poison(float *x, int64_t n) {
  uint32_t nan = 0x7fc0deadu;
  for (int64_t i = 0; i < n; i++) memcpy(&x[i], &nan, sizeof nan);
}

static int same_bits(const float *got, const float *want, int64_t n, const char *what,
                     int rank) {
  int64_t d = cu_first_diff(got, want, n);
  if (d >= 0)
    return rt_fail("rank %d: %s: element %lld of %lld is %a, want %a", rank, what,
                   (long long)d, (long long)n, (double)got[d], (double)want[d]);
  return RT_OK;
}

static float *falloc(int64_t n) { return malloc((size_t)(n > 0 ? n : 1) * sizeof(float)); }

/* ---- collectives ---- */

typedef struct {
  int n;
  uint64_t seed;
  int64_t count;               /* all_reduce, broadcast */
  const float *sum;            /* ordered sum, count floats */
  int64_t counts[MAXR], offsets[MAXR], total;   /* all_gather, reduce_scatter blocks */
  const float *gathered;       /* total floats */
  const float *rs_sum;         /* total floats */
} Coll;

static int coll_rank_body(RtComm *w, const Coll *t, float *a, float *b, float *e) {
  int r = rt_comm_rank(w);
  int64_t count = t->count, total = t->total, mine = t->counts[r], off = t->offsets[r];
  ENSURE(rt_comm_size(w) == t->n && rt_comm_world_rank(w) == r, "rank %d: bad world", r);
  /* all_reduce, out of place: the input stays as it was. */
  cu_fill(a, count, t->seed, r, 0);
  poison(b, count);
  TRY(rt_comm_all_reduce(w, count ? a : NULL, count ? b : NULL, count));
  TRY(same_bits(b, t->sum, count, "all_reduce", r));
  cu_fill(e, count, t->seed, r, 0);
  TRY(same_bits(a, e, count, "all_reduce input", r));
  /* in place */
  TRY(rt_comm_all_reduce(w, a, a, count));
  TRY(same_bits(a, t->sum, count, "all_reduce in place", r));
  /* all_gather */
  cu_fill(a, mine, t->seed + 1, r, 0);
  poison(b, total);
  TRY(rt_comm_all_gather(w, a, b, t->counts));
  TRY(same_bits(b, t->gathered, total, "all_gather", r));
  poison(b, total);
  cu_fill(b + off, mine, t->seed + 1, r, 0);
  TRY(rt_comm_all_gather(w, b + off, b, t->counts));
  TRY(same_bits(b, t->gathered, total, "all_gather in place", r));
  /* reduce_scatter */
  cu_fill(a, total, t->seed + 2, r, 0);
  poison(b, mine);
  TRY(rt_comm_reduce_scatter(w, a, b, t->counts));
  TRY(same_bits(b, t->rs_sum + off, mine, "reduce_scatter", r));
  TRY(rt_comm_reduce_scatter(w, a, a + off, t->counts));
  TRY(same_bits(a + off, t->rs_sum + off, mine, "reduce_scatter in place", r));
  /* broadcast from every root */
  for (int root = 0; root < t->n; root++) {
    if (r == root) cu_fill(a, count, t->seed + 3, root, 0);
    else poison(a, count);
    TRY(rt_comm_broadcast(w, a, count, root));
    cu_fill(e, count, t->seed + 3, root, 0);
    TRY(same_bits(a, e, count, "broadcast", r));
  }
  return rt_comm_barrier(w);
}

static int coll_rank(RtComm *w, void *arg) {
  const Coll *t = arg;
  int64_t big = t->count > t->total ? t->count : t->total;
  float *a = falloc(big), *b = falloc(big), *e = falloc(big);
  int rc = a && b && e ? coll_rank_body(w, t, a, b, e) : rt_fail("out of memory");
  free(a);
  free(b);
  free(e);
  return rc;
}

static void test_collectives(void) {
  uint64_t rng = 1;
  for (int k = 0; k < NN; k++) {
    int n = NRANKS[k];
    const int64_t sizes[] = {0, 1, n + 1, 1001 + 2 * n, 4099, 1000003};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
      Coll t = {.n = n, .seed = cu_next(&rng), .count = sizes[s]};
      /* Blocks: the standard split, or random with zeros. */
      if (s % 2 == 0) {
        rt_comm_block_counts(sizes[s], n, 1, t.counts);
      } else {
        for (int r = 0; r < n; r++)
          t.counts[r] = (r == 1 || (int64_t)(cu_next(&rng) % 4) == 0)
                            ? 0 : (int64_t)(cu_next(&rng) % (uint64_t)(sizes[s] / n + 2));
      }
      for (int r = 0; r < n; r++) t.offsets[r] = t.total, t.total += t.counts[r];
      float *sum = falloc(t.count), *gathered = falloc(t.total), *rs = falloc(t.total);
      cu_ordered_sum(sum, t.count, t.seed, n, 0);
      for (int r = 0; r < n; r++) cu_fill(gathered + t.offsets[r], t.counts[r], t.seed + 1, r, 0);
      cu_ordered_sum(rs, t.total, t.seed + 2, n, 0);
      t.sum = sum, t.gathered = gathered, t.rs_sum = rs;
      int rc = rt_comm_threads_run(n, coll_rank, &t);
      if (rc) {
        char m[1200];
        snprintf(m, sizeof m, "collectives, %d ranks, count %lld, total %lld: %s", n,
                 (long long)t.count, (long long)t.total, rt_last_error());
        check_report(__FILE__, __LINE__, m);
      }
      free(sum);
      free(gathered);
      free(rs);
    }
  }
}

/* ---- all_to_all ---- */

typedef struct {
  int n;
  uint64_t seed;
  int64_t cnt[MAXR][MAXR];     /* cnt[i][j]: floats i sends to j */
  int gaps;                    /* displacements reversed with gaps between blocks */
} A2A;

#define A2A_GAP 3
#define A2A_STRIDE 1000000     /* value index of block (i -> j): j * stride + k */

/* Displacements of a rank's blocks (send: its row; recv: its column). */
static int64_t a2a_displs(const A2A *t, const int64_t *counts, int64_t *displs) {
  int64_t at = 0;
  for (int q = 0; q < t->n; q++) {
    int j = t->gaps ? t->n - 1 - q : q;
    displs[j] = at;
    at += counts[j] + (t->gaps ? A2A_GAP : 0);
  }
  return at;
}

static int a2a_body(RtComm *w, const A2A *t, float *send, float *recv, float *e, int64_t ns,
                    int64_t nr, const int64_t *sc, const int64_t *sd, const int64_t *rc,
                    const int64_t *rd) {
  int i = rt_comm_rank(w);
  poison(send, ns);
  poison(recv, nr);
  for (int j = 0; j < t->n; j++)
    cu_fill(send + sd[j], sc[j], t->seed, i, (int64_t)j * A2A_STRIDE);
  TRY(rt_comm_all_to_all(w, send, sc, t->gaps ? sd : NULL, recv, rc, t->gaps ? rd : NULL));
  poison(e, nr);
  for (int j = 0; j < t->n; j++)
    cu_fill(e + rd[j], rc[j], t->seed, j, (int64_t)i * A2A_STRIDE);
  return same_bits(recv, e, nr, t->gaps ? "all_to_all (gaps)" : "all_to_all", i);
}

static int a2a_rank(RtComm *w, void *arg) {
  const A2A *t = arg;
  int i = rt_comm_rank(w);
  int64_t sc[MAXR], sd[MAXR], rc[MAXR], rd[MAXR];
  for (int j = 0; j < t->n; j++) sc[j] = t->cnt[i][j], rc[j] = t->cnt[j][i];
  int64_t ns = a2a_displs(t, sc, sd), nr = a2a_displs(t, rc, rd);
  float *send = falloc(ns), *recv = falloc(nr), *e = falloc(nr);
  int r = send && recv && e ? a2a_body(w, t, send, recv, e, ns, nr, sc, sd, rc, rd)
                            : rt_fail("out of memory");
  free(send);
  free(recv);
  free(e);
  return r;
}

static void test_all_to_all(void) {
  uint64_t rng = 7;
  for (int k = 0; k < NN; k++)
    for (int v = 0; v < 6; v++) {
      A2A t = {.n = NRANKS[k], .seed = cu_next(&rng), .gaps = v % 2};
      for (int i = 0; i < t.n; i++)
        for (int j = 0; j < t.n; j++) {
          uint64_t x = cu_next(&rng);
          t.cnt[i][j] = v == 0 ? 0                                   /* all empty */
                        : x % 5 == 0 ? 0
                        : v == 5 && x % 7 == 1 ? (int64_t)(50000 + x % 1000)  /* large */
                        : (int64_t)(x % 40);
        }
      if (rt_comm_threads_run(t.n, a2a_rank, &t)) {
        char m[1200];
        snprintf(m, sizeof m, "all_to_all, %d ranks, variant %d: %s", t.n, v, rt_last_error());
        check_report(__FILE__, __LINE__, m);
      }
    }
}

/* ---- mesh and splits ---- */

typedef struct {
  int tp, dp, pp, ep;
} MeshCase;

/* The members of this rank's group of a mesh axis, in group order, by the formula of
 * rt_comm.h. */
static int mesh_members(const MeshCase *m, int r, const char *axis, int *out) {
  int t = r % m->tp, d = r / m->tp % m->dp, p = r / (m->tp * m->dp), k = 0;
#define RANK_OF(tt, dd, pp_) ((tt) + m->tp * ((dd) + m->dp * (pp_)))
  if (!strcmp(axis, "tp"))
    for (int x = 0; x < m->tp; x++) out[k++] = RANK_OF(x, d, p);
  if (!strcmp(axis, "dp"))
    for (int x = 0; x < m->dp; x++) out[k++] = RANK_OF(t, x, p);
  if (!strcmp(axis, "pp"))
    for (int x = 0; x < m->pp; x++) out[k++] = RANK_OF(t, d, x);
  if (!strcmp(axis, "ep"))
    for (int x = 0; x < m->ep; x++) out[k++] = RANK_OF(t, d / m->ep * m->ep + x, p);
  if (!strcmp(axis, "ep_dp"))
    for (int x = 0; x < m->dp / m->ep; x++) out[k++] = RANK_OF(t, x * m->ep + d % m->ep, p);
#undef RANK_OF
  return k;
}

/* The group's members (gathered world ranks) and a concurrent all_reduce and
 * reduce_scatter against references over the expected members. */
static int check_group(RtComm *g, const MeshCase *m, int wr, const char *axis, uint64_t seed) {
  int want[MAXR], n = mesh_members(m, wr, axis, want);
  ENSURE(g && !strcmp(rt_comm_name(g), axis) && rt_comm_size(g) == n &&
             rt_comm_world_rank(g) == wr,
         "rank %d: group %s: size %d, want %d", wr, axis, rt_comm_size(g), n);
  ENSURE(want[rt_comm_rank(g)] == wr, "rank %d: wrong position in %s", wr, axis);
  float me = (float)wr, got[MAXR];
  int64_t ones[MAXR];
  for (int i = 0; i < n; i++) ones[i] = 1;
  TRY(rt_comm_all_gather(g, &me, got, ones));
  for (int i = 0; i < n; i++)
    ENSURE(got[i] == (float)want[i], "rank %d: %s member %d is %g, want %d", wr, axis, i,
           (double)got[i], want[i]);
  enum { CNT = 2053 };
  float x[CNT], ref[CNT];
  cu_fill(x, CNT, seed, wr, 0);
  for (int i = 0; i < CNT; i++) {
    float s = cu_value(seed, want[0], i);
    for (int q = 1; q < n; q++) s += cu_value(seed, want[q], i);
    ref[i] = s;
  }
  TRY(rt_comm_all_reduce(g, x, x, CNT));
  TRY(same_bits(x, ref, CNT, axis, wr));
  int64_t counts[MAXR], offs[MAXR], at = 0;
  rt_comm_block_counts(CNT, n, 1, counts);
  for (int i = 0; i < n; i++) offs[i] = at, at += counts[i];
  cu_fill(x, CNT, seed, wr, 0);
  int gr = rt_comm_rank(g);
  TRY(rt_comm_reduce_scatter(g, x, x + offs[gr], counts));
  return same_bits(x + offs[gr], ref + offs[gr], counts[gr], axis, wr);
}

static int mesh_rank(RtComm *w, void *arg) {
  const MeshCase *m = arg;
  int r = rt_comm_rank(w);
  RtMesh mesh;
  TRY(rt_comm_mesh(w, m->tp, m->dp, m->pp, m->ep, &mesh));
  int rc = RT_OK;
  if (mesh.tp_rank != r % m->tp || mesh.dp_rank != r / m->tp % m->dp ||
      mesh.pp_rank != r / (m->tp * m->dp) || mesh.ep_rank != mesh.dp_rank % m->ep)
    rc = rt_fail("rank %d: coordinates %d %d %d %d", r, mesh.tp_rank, mesh.dp_rank,
                 mesh.pp_rank, mesh.ep_rank);
  /* Every axis, several rounds: groups of one axis run at the same time. */
  for (int it = 0; it < 4 && rc == RT_OK; it++) {
    uint64_t s = 1000 + (uint64_t)it * 10;
    rc = check_group(mesh.tp_comm, m, r, "tp", s);
    if (rc == RT_OK) rc = check_group(mesh.dp_comm, m, r, "dp", s + 1);
    if (rc == RT_OK) rc = check_group(mesh.pp_comm, m, r, "pp", s + 2);
    if (rc == RT_OK) rc = check_group(mesh.ep_comm, m, r, "ep", s + 3);
    if (rc == RT_OK) rc = check_group(mesh.ep_dp_comm, m, r, "ep_dp", s + 4);
  }
  rt_comm_mesh_free(&mesh);
  if (rc) return rc;
  /* color / key: thirds by r % 3, reversed by key; the last rank joins none. */
  int n = rt_comm_size(w);
  int color = r == n - 1 && n > 1 ? RT_COMM_NO_GROUP : r % 3;
  RtComm *g = NULL;
  TRY(rt_comm_split(w, color, -r, "thirds", &g));
  if (color == RT_COMM_NO_GROUP) {
    ENSURE(g == NULL, "rank %d: RT_COMM_NO_GROUP gave a group", r);
  } else {
    int want[MAXR], k = 0;
    for (int q = n - 1; q >= 0; q--)
      if (q % 3 == color && !(q == n - 1 && n > 1)) want[k++] = q;
    float me = (float)r, got[MAXR];
    int64_t ones[MAXR];
    for (int i = 0; i < k; i++) ones[i] = 1;
    ENSURE(g && rt_comm_size(g) == k && !strcmp(rt_comm_name(g), "thirds"),
           "rank %d: split size %d, want %d", r, g ? rt_comm_size(g) : -1, k);
    rc = rt_comm_all_gather(g, &me, got, ones);
    for (int i = 0; i < k && rc == RT_OK; i++)
      if (got[i] != (float)want[i]) rc = rt_fail("rank %d: split member %d is %g", r, i,
                                                  (double)got[i]);
  }
  rt_comm_free(g);
  if (rc) return rc;
  return rt_comm_barrier(w);
}

static void test_mesh(void) {
  static const MeshCase cases[] = {{1, 1, 1, 1}, {2, 2, 2, 1}, {2, 2, 2, 2}, {1, 4, 2, 2},
                                   {2, 1, 4, 1}, {8, 1, 1, 1}, {1, 8, 1, 4}, {1, 3, 1, 3},
                                   {3, 1, 1, 1}, {2, 2, 1, 2}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const MeshCase *m = &cases[i];
    if (rt_comm_threads_run(m->tp * m->dp * m->pp, mesh_rank, (void *)m)) {
      char msg[1200];
      snprintf(msg, sizeof msg, "mesh tp %d dp %d pp %d ep %d: %s", m->tp, m->dp, m->pp, m->ep,
               rt_last_error());
      check_report(__FILE__, __LINE__, msg);
    }
  }
}

/* ---- point to point ---- */

static int pingpong_rank(RtComm *w, void *arg) {
  int r = rt_comm_rank(w);
  static const int64_t sizes[] = {0, 1, 17, 1000, 100000};
  float *x = falloc(100000), *e = falloc(100000);
  int rc = x && e ? RT_OK : rt_fail("out of memory");
  for (int round = 0; round < 100 && rc == RT_OK; round++) {
    int64_t n = sizes[round % 5];
    if (r == 0) {
      cu_fill(x, n, 5, round, 0);
      rc = rt_comm_send(w, x, n, 1, round % 3);
      if (rc == RT_OK) rc = rt_comm_recv(w, x, n, 1, 100);
      cu_fill(e, n, 5, round, 0);
      for (int64_t i = 0; i < n; i++) e[i] = e[i] * 2.0f;
      if (rc == RT_OK) rc = same_bits(x, e, n, "ping-pong", r);
    } else {
      rc = rt_comm_recv(w, x, n, 0, round % 3);
      for (int64_t i = 0; rc == RT_OK && i < n; i++) x[i] = x[i] * 2.0f;
      if (rc == RT_OK) rc = rt_comm_send(w, x, n, 0, 100);
    }
  }
  free(x);
  free(e);
  return rc;
}

/* A pipeline: rank 0 feeds microbatches, stage r adds r + 1, the last returns to 0. */
static int ring_rank(RtComm *w, void *arg) {
  int r = rt_comm_rank(w), n = rt_comm_size(w);
  enum { MB = 8, LEN = 3001 };
  float *x = falloc(LEN), *e = falloc(LEN);
  int rc = x && e ? RT_OK : rt_fail("out of memory");
  if (r == 0) {
    for (int mb = 0; mb < MB && rc == RT_OK; mb++) {
      cu_fill(x, LEN, 9, mb, 0);
      for (int64_t i = 0; i < LEN; i++) x[i] += 1.0f;
      rc = rt_comm_send(w, x, LEN, 1 % n, mb);
    }
    for (int mb = 0; mb < MB && rc == RT_OK; mb++) {
      rc = rt_comm_recv(w, x, LEN, n - 1, mb);
      cu_fill(e, LEN, 9, mb, 0);
      for (int64_t i = 0; i < LEN; i++)
        for (int s = 0; s < n; s++) e[i] += (float)(s + 1);
      if (rc == RT_OK) rc = same_bits(x, e, LEN, "pipeline ring", r);
    }
  } else {
    for (int mb = 0; mb < MB && rc == RT_OK; mb++) {
      rc = rt_comm_recv(w, x, LEN, r - 1, mb);
      for (int64_t i = 0; i < LEN; i++) x[i] += (float)(r + 1);
      if (rc == RT_OK) rc = rt_comm_send(w, x, LEN, (r + 1) % n, mb);
    }
  }
  free(x);
  free(e);
  return rc;
}

/* Interleaved tags, received tag by tag; both ranks send before receiving (needs
 * buffered sends); a self-send; a receive posted before its send. */
static int tags_rank(RtComm *w, void *arg) {
  int r = rt_comm_rank(w), peer = 1 - r;
  enum { K = 6, BIG = 300000 };
  float v, *big = falloc(BIG), *e = falloc(BIG);
  int rc = big && e ? RT_OK : rt_fail("out of memory");
  if (r == 0) {
    for (int k = 0; k < K && rc == RT_OK; k++)
      for (int tag = 0; tag < 3 && rc == RT_OK; tag++) {
        v = (float)(tag * 100 + k);
        rc = rt_comm_send(w, &v, 1, 1, tag);
      }
  } else {
    for (int tag = 2; tag >= 0 && rc == RT_OK; tag--)
      for (int k = 0; k < K && rc == RT_OK; k++) {
        rc = rt_comm_recv(w, &v, 1, 0, tag);
        if (rc == RT_OK && v != (float)(tag * 100 + k))
          rc = rt_fail("rank 1: tag %d message %d is %g", tag, k, (double)v);
      }
  }
  if (rc == RT_OK) {         /* send-first exchange of large messages */
    cu_fill(big, BIG, 11, r, 0);
    rc = rt_comm_send(w, big, BIG, peer, 7);
    if (rc == RT_OK) rc = rt_comm_recv(w, big, BIG, peer, 7);
    cu_fill(e, BIG, 11, peer, 0);
    if (rc == RT_OK) rc = same_bits(big, e, BIG, "exchange", r);
  }
  if (rc == RT_OK) {         /* self */
    v = 42.0f + (float)r;
    float u = 0;
    rc = rt_comm_send(w, &v, 1, r, 3);
    if (rc == RT_OK) rc = rt_comm_recv(w, &u, 1, r, 3);
    if (rc == RT_OK && u != v) rc = rt_fail("rank %d: self-send gave %g", r, (double)u);
  }
  if (rc == RT_OK) {         /* rank 1 waits in recv before rank 0 sends */
    if (r == 0) {
      sleep_s(0.05);
      cu_fill(big, BIG, 12, 0, 0);
      rc = rt_comm_send(w, big, BIG, 1, 8);
    } else {
      rc = rt_comm_recv(w, big, BIG, 0, 8);
      cu_fill(e, BIG, 12, 0, 0);
      if (rc == RT_OK) rc = same_bits(big, e, BIG, "posted receive", r);
    }
  }
  free(big);
  free(e);
  return rc;
}

static void test_p2p(void) {
  CHECK_OK(rt_comm_threads_run(2, pingpong_rank, NULL));
  for (int k = 0; k < NN; k++) CHECK_OK(rt_comm_threads_run(NRANKS[k], ring_rank, NULL));
  CHECK_OK(rt_comm_threads_run(2, tags_rank, NULL));
}

/* ---- failures and timeouts ---- */

typedef struct {
  int n;
  int scenario;
  char msg[MAXR][RT_ERR_MAX];  /* each rank's error ("" if it succeeded) */
  double secs[MAXR];           /* how long its failing call took */
  int rc[MAXR];
} Fail;

enum { LATE, EXITS, MISMATCH, FAILS, SUBGROUP, RECV, COUNTS, A2A_COUNTS, P2P_SIZE };

static int fail_body(RtComm *w, Fail *f, int r) {
  float x[1024] = {0};
  switch (f->scenario) {
  case LATE:                 /* rank 1 arrives 2.5 s late */
    if (r == 1) sleep_s(2.5);
    return rt_comm_all_reduce(w, x, x, 1024);
  case EXITS:                /* rank 1 leaves without calling */
    if (r == 1) return RT_OK;
    return rt_comm_all_reduce(w, x, x, 1024);
  case MISMATCH:             /* rank 1 calls a barrier instead */
    if (r == 1) return rt_comm_barrier(w);
    return rt_comm_all_reduce(w, x, x, 1024);
  case FAILS:                /* rank 2 fails on its own */
    if (r == 2) return rt_fail("boom");
    return rt_comm_all_reduce(w, x, x, 1024);
  case SUBGROUP: {           /* 2 x 2 mesh: rank 3 is late in its dp group {1, 3}; */
    RtMesh m;                /* the other dp group {0, 2} finishes */
    if (rt_comm_mesh(w, 2, 2, 1, 1, &m)) return RT_ERR;
    if (r == 3) sleep_s(2.5);
    int rc = rt_comm_all_reduce(m.dp_comm, x, x, 1024);
    rt_comm_mesh_free(&m);
    return rc;
  }
  case RECV:                 /* rank 1 never sends */
    if (r == 1) {
      sleep_s(2);
      return RT_OK;
    }
    return rt_comm_recv(w, x, 4, 1, 5);
  case COUNTS: {             /* rank 1 disagrees on all_gather counts (same total) */
    int64_t counts[3] = {3, r == 1 ? 4 : 3, r == 1 ? 0 : 1};
    return rt_comm_all_gather(w, x, x + 512, counts);
  }
  case A2A_COUNTS: {         /* rank 0 sends 3 to rank 1, which expects 2 */
    int64_t sc[2], rc[2];
    for (int j = 0; j < 2; j++) {
      sc[j] = (j == r ? 1 : 2) + (r == 0 && j == 1);
      rc[j] = j == r ? 1 : 2;
    }
    return rt_comm_all_to_all(w, x, sc, NULL, x + 512, rc, NULL);
  }
  case P2P_SIZE:             /* rank 0 sends 3 floats, rank 1 expects 4 */
    if (r == 0) return rt_comm_send(w, x, 3, 1, 0);
    return rt_comm_recv(w, x, 4, 0, 0);
  }
  return RT_OK;
}

static int fail_rank(RtComm *w, void *arg) {
  Fail *f = arg;
  int r = rt_comm_rank(w);
  double t0 = now_s();
  int rc = fail_body(w, f, r);
  f->secs[r] = now_s() - t0;
  f->rc[r] = rc;
  snprintf(f->msg[r], sizeof f->msg[r], "%s", rc ? rt_last_error() : "");
  return rc;
}

/* Runs a scenario; checks the run failed with `first` in its message. */
static void run_fail(Fail *f, int n, int scenario, const char *first) {
  memset(f, 0, sizeof *f);
  f->n = n;
  f->scenario = scenario;
  double t0 = now_s();
  CHECK_FAILS(rt_comm_threads_run(n, fail_rank, f), first);
  if (now_s() - t0 > 5) check_report(__FILE__, __LINE__, "a failure scenario took > 5 s");
}

/* Rank r's message contains `needle` and the call took at most `secs`. */
static void expect_rank(const Fail *f, int r, const char *needle, double secs, int line) {
  char m[RT_ERR_MAX + 200];
  if (!f->rc[r] || !strstr(f->msg[r], needle) || strchr(f->msg[r], '\n')) {
    snprintf(m, sizeof m, "scenario %d rank %d: rc %d, message \"%s\", wanted \"%s\"",
             f->scenario, r, f->rc[r], f->msg[r], needle);
    check_report(__FILE__, line, m);
  }
  if (f->secs[r] > secs) {
    snprintf(m, sizeof m, "scenario %d rank %d: failed after %.2f s, wanted <= %.2f s",
             f->scenario, r, f->secs[r], secs);
    check_report(__FILE__, line, m);
  }
}

static void test_timeout(void) {
  CHECK_OK(rt_comm_set_timeout(1));
  static Fail f;
  const char *late = "all_reduce of 1024 floats timed out after 1 s waiting for rank 1";
  run_fail(&f, 4, LATE, late);
  double longest = 0;
  for (int r = 0; r < 4; r++)
    if (r != 1) {
      expect_rank(&f, r, late, 2.0, __LINE__);
      char head[80];
      snprintf(head, sizeof head, "rank %d (group world, 4 ranks): all_reduce of 1024 floats ", r);
      CHECK(strncmp(f.msg[r], head, strlen(head)) == 0);
      if (f.secs[r] > longest) longest = f.secs[r];
    }
  CHECK(longest >= 0.9);     /* the first to fail waited for the whole timeout */
  expect_rank(&f, 1, "rank 1 (group world, 4 ranks): all_reduce of 1024 floats was not "
              "started because of an earlier failure: rank ", 3.0, __LINE__);

  const char *gone = "failed: rank 1 returned from its rank_main without calling it";
  run_fail(&f, 4, EXITS, gone);
  for (int r = 0; r < 4; r++)
    if (r != 1) expect_rank(&f, r, gone, 0.5, __LINE__);
  CHECK(f.rc[1] == 0);

  run_fail(&f, 3, MISMATCH, "does not match");
  expect_rank(&f, 0, "rank 0 (group world, 3 ranks): all_reduce of 1024 floats does not match "
              "rank 1, which called barrier", 0.5, __LINE__);
  expect_rank(&f, 1, "rank 1 (group world, 3 ranks): barrier does not match rank 0, which "
              "called all_reduce of 1024 floats", 0.5, __LINE__);
  expect_rank(&f, 2, "does not match", 0.5, __LINE__);

  run_fail(&f, 4, FAILS, "rank 2: boom");
  for (int r = 0; r < 4; r++)
    if (r != 2) expect_rank(&f, r, "earlier failure: rank 2: boom", 0.5, __LINE__);

  run_fail(&f, 4, SUBGROUP, "timed out");
  expect_rank(&f, 1, "rank 1 (group dp, 2 ranks): all_reduce of 1024 floats timed out after "
              "1 s waiting for rank 3", 2.0, __LINE__);
  CHECK(strcmp(f.msg[1], "rank 1 (group dp, 2 ranks): all_reduce of 1024 floats timed out "
               "after 1 s waiting for rank 3") == 0);
  CHECK(f.rc[0] == 0 && f.rc[2] == 0);
  expect_rank(&f, 3, "rank 3 (group dp, 2 ranks): all_reduce of 1024 floats was not started",
              3.0, __LINE__);

  run_fail(&f, 2, RECV, "timed out");
  CHECK(strcmp(f.msg[0], "rank 0 (group world, 2 ranks): recv of 4 floats from rank 1 (tag 5) "
               "timed out after 1 s") == 0);
  CHECK(f.secs[0] < 2.0);

  run_fail(&f, 3, COUNTS, "disagrees");
  for (int r = 0; r < 3; r++) expect_rank(&f, r, "on counts[1]", 0.5, __LINE__);

  run_fail(&f, 2, A2A_COUNTS, "rank 0 sends 3 floats to rank 1, which expects 2");
  for (int r = 0; r < 2; r++)
    expect_rank(&f, r, "rank 0 sends 3 floats to rank 1, which expects 2", 0.5, __LINE__);

  run_fail(&f, 2, P2P_SIZE, "the message has 3 floats");
  expect_rank(&f, 1, "rank 1 (group world, 2 ranks): recv of 4 floats from rank 0 (tag 0) "
              "failed: the message has 3 floats", 0.5, __LINE__);
  CHECK_OK(rt_comm_set_timeout(RT_COMM_DEFAULT_TIMEOUT_S));
}

/* ---- determinism ---- */

typedef struct {
  int64_t count;
  float *out;                  /* rank 0's result */
  int run;
} Det;

static int det_rank(RtComm *w, void *arg) {
  Det *d = arg;
  int r = rt_comm_rank(w);
  float *x = falloc(d->count);
  if (!x) return rt_fail("out of memory");
  cu_fill(x, d->count, 77, r, 0);
  /* Different arrival orders on every run. */
  sleep_s(0.001 * (double)((d->run * 3 + r * 5) % 7));
  int rc = rt_comm_all_reduce(w, x, x, d->count);
  if (rc == RT_OK && r == 0) memcpy(d->out, x, (size_t)d->count * sizeof *x);
  free(x);
  return rc;
}

static void test_determinism(void) {
  const int64_t count = 100003;
  float *ref = falloc(count), *rev = falloc(count), *out = falloc(count);
  for (int n = 4; n <= 8; n += 4) {
    cu_ordered_sum(ref, count, 77, n, 0);
    /* The data is sensitive to order: adding the ranks backwards changes many sums. */
    int64_t differ = 0;
    for (int64_t i = 0; i < count; i++) {
      float s = cu_value(77, n - 1, i);
      for (int r = n - 2; r >= 0; r--) s += cu_value(77, r, i);
      rev[i] = s;
      differ += memcmp(&rev[i], &ref[i], sizeof(float)) != 0;
    }
    CHECK(differ > count / 100);
    for (int run = 0; run < 5; run++) {
      Det d = {.count = count, .out = out, .run = run};
      poison(out, count);
      CHECK_OK(rt_comm_threads_run(n, det_rank, &d));
      if (cu_first_diff(out, ref, count) >= 0) {
        char m[120];
        snprintf(m, sizeof m, "determinism: %d ranks, run %d differs from the ordered sum", n,
                 run);
        check_report(__FILE__, __LINE__, m);
      }
    }
  }
  free(ref);
  free(rev);
  free(out);
}

/* ---- argument checks ---- */

typedef struct {
  int which;
  char msg[RT_ERR_MAX];
  char later[RT_ERR_MAX];
} Arg;

static int arg_rank(RtComm *w, void *arg) {
  Arg *a = arg;
  float x[8] = {0};
  int64_t counts[1] = {-2};
  int64_t four[1] = {4};
  RtMesh mesh;
  int rc = RT_OK;
  switch (a->which) {
  case 0: rc = rt_comm_all_reduce(w, x, x, -1); break;
  case 1: rc = rt_comm_all_reduce(w, x, x + 1, 4); break;
  case 2: rc = rt_comm_broadcast(w, x, 4, 5); break;
  case 3: rc = rt_comm_send(w, x, 1, 0, -1); break;
  case 4: rc = rt_comm_recv(w, x, 1, 3, 0); break;
  case 5: rc = rt_comm_all_gather(w, x, x, NULL); break;
  case 6: rc = rt_comm_reduce_scatter(w, x, x, counts); break;
  case 7: rc = rt_comm_all_gather(w, x + 1, x, four); break;
  case 8: rc = rt_comm_mesh(w, 2, 1, 1, 1, &mesh); break;
  case 9: rc = rt_comm_split(w, -5, 0, "x", NULL); break;
  case 10: rc = rt_comm_all_reduce(w, NULL, x, 3); break;
  }
  snprintf(a->msg, sizeof a->msg, "%s", rc ? rt_last_error() : "(succeeded)");
  /* The world is aborted now: later calls fail at once. */
  if (rt_comm_barrier(w) == RT_OK) snprintf(a->later, sizeof a->later, "(barrier succeeded)");
  else snprintf(a->later, sizeof a->later, "%s", rt_last_error());
  return rc;
}

static void test_errors(void) {
  CHECK_FAILS(rt_comm_threads_run(0, arg_rank, NULL), "0 ranks requested");
  CHECK_FAILS(rt_comm_threads_run(RT_COMM_MAX_RANKS + 1, arg_rank, NULL), "ranks requested");
  CHECK_FAILS(rt_comm_threads_run(2, NULL, NULL), "NULL rank_main");
  CHECK_FAILS(rt_comm_set_timeout(0), "is not a timeout");
  CHECK_FAILS(rt_comm_set_timeout(-3), "is not a timeout");
  CHECK_FAILS(rt_comm_set_timeout(NAN), "is not a timeout");
  CHECK_OK(rt_comm_set_timeout(2.5));
  CHECK(rt_comm_timeout() == 2.5);
  CHECK_OK(rt_comm_set_timeout(RT_COMM_DEFAULT_TIMEOUT_S));
  CHECK_FAILS(rt_comm_all_reduce(NULL, NULL, NULL, 0), "NULL communicator");
  rt_comm_free(NULL);
  int64_t c[3];
  rt_comm_block_counts(10, 3, 2, c);
  CHECK(c[0] == 8 && c[1] == 6 && c[2] == 6);
  rt_comm_block_counts(2, 3, 1, c);
  CHECK(c[0] == 1 && c[1] == 1 && c[2] == 0);
  static const char *const want[] = {
      "rank 0 (group world, 1 rank): all_reduce of -1 floats failed: the count is negative",
      "send and receive buffers overlap without being equal",
      "root 5 is not a rank of the group (0..0)",
      "send of 1 floats to rank 0 (tag -1) failed: tags are >= 0",
      "peer 3 is not a rank of the group (0..0)",
      "all_gather of 0 floats (0 from rank 0) failed: counts is NULL",
      "failed: counts[0] = -2 is not a count",
      "overlaps the receive buffer without being this rank's block",
      "mesh tp 2 x dp 1 x pp 1 (ep 1) does not fit 1 ranks",
      "split failed: the group pointer is NULL",
      "all_reduce of 3 floats failed: the send buffer is NULL",
  };
  for (int i = 0; i < (int)(sizeof want / sizeof *want); i++) {
    static Arg a;
    memset(&a, 0, sizeof a);
    a.which = i;
    CHECK_FAILS(rt_comm_threads_run(1, arg_rank, &a), want[i]);
    if (!strstr(a.msg, want[i])) {
      char m[RT_ERR_MAX + 200];
      snprintf(m, sizeof m, "argument case %d: \"%s\", wanted \"%s\"", i, a.msg, want[i]);
      check_report(__FILE__, __LINE__, m);
    }
    CHECK(strstr(a.later, "barrier was not started because of an earlier failure") != NULL);
  }
  RtComm *w = NULL;
  if (!rt_comm_mpi_available()) {
    CHECK_FAILS(rt_comm_mpi_init(&w), "built without MPI; install libopenmpi-dev");
    CHECK(w == NULL);
  }
}

/* ---- non-blocking collectives ---- */

typedef struct {
  int n;
  int64_t count;               /* all_reduce */
  int64_t counts[MAXR], offsets[MAXR], total;   /* reduce_scatter, all_gather blocks */
} Async;

/* A rank's computation while requests are in flight: touches only its own x. */
static float busy(float *x, int64_t n, int reps) {
  float s = 0;
  for (int r = 0; r < reps; r++)
    for (int64_t i = 0; i < n; i++) {
      x[i] = x[i] * 0.999f + 0.5f;
      s += x[i];
    }
  return s;
}

static int async_body(RtComm *w, const Async *t, float **b) {
  int r = rt_comm_rank(w), n = t->n;
  int64_t count = t->count, total = t->total, mine = t->counts[r], off = t->offsets[r];
  /* b[0]: all_reduce input, b[1] its output, b[2] in place, b[3] reduce_scatter input,
   * b[4] its output, b[5] all_gather output, b[6] blocking results, b[7] reference,
   * b[8] computation. */
  RtCommReq q[5] = {RT_COMM_REQ_NONE, RT_COMM_REQ_NONE, RT_COMM_REQ_NONE, RT_COMM_REQ_NONE,
                    RT_COMM_REQ_NONE};
  cu_fill(b[0], count, 11, r, 0);
  poison(b[1], count);
  cu_fill(b[2], count, 12, r, 0);
  cu_fill(b[3], total, 13, r, 0);
  poison(b[4], mine);
  poison(b[5], total);
  float *gsend = b[5] + off;   /* all_gather in place: this rank's block of the output */
  cu_fill(gsend, mine, 14, r, 0);
  int64_t counts[MAXR];        /* the request keeps its own copy: this one changes */
  memcpy(counts, t->counts, sizeof counts);
  TRY(rt_comm_all_reduce_start(w, b[0], b[1], count, &q[0]));
  TRY(rt_comm_all_reduce_start(w, b[2], b[2], count, &q[1]));
  TRY(rt_comm_reduce_scatter_start(w, b[3], b[4], counts, &q[2]));
  memset(counts, 0, sizeof counts);
  TRY(rt_comm_all_gather_start(w, gsend, b[5], t->counts, &q[3]));
  cu_fill(b[8], 4096, 15, r, 0);
  volatile float sink = busy(b[8], 4096, 50);
  (void)sink;
  /* Waited out of order; q[4] was never started: a no-op. */
  TRY(rt_comm_wait(&q[2]));
  TRY(rt_comm_wait(&q[4]));
  TRY(rt_comm_wait(&q[0]));
  TRY(rt_comm_wait(&q[3]));
  TRY(rt_comm_wait(&q[1]));
  ENSURE(!q[0].p && !q[1].p && !q[2].p && !q[3].p, "rank %d: a waited request is not cleared", r);
  TRY(rt_comm_wait(&q[0]));    /* twice: no request any more */
  /* The references, then the blocking calls on the same inputs: same bits. */
  cu_ordered_sum(b[7], count, 11, n, 0);
  TRY(same_bits(b[1], b[7], count, "all_reduce_start", r));
  cu_fill(b[6], count, 11, r, 0);
  TRY(same_bits(b[0], b[6], count, "all_reduce_start input", r));
  TRY(rt_comm_all_reduce(w, b[0], b[6], count));
  TRY(same_bits(b[1], b[6], count, "all_reduce_start vs blocking", r));
  cu_ordered_sum(b[7], count, 12, n, 0);
  TRY(same_bits(b[2], b[7], count, "all_reduce_start in place", r));
  cu_ordered_sum(b[7], total, 13, n, 0);
  TRY(same_bits(b[4], b[7] + off, mine, "reduce_scatter_start", r));
  TRY(rt_comm_reduce_scatter(w, b[3], b[6], t->counts));
  TRY(same_bits(b[4], b[6], mine, "reduce_scatter_start vs blocking", r));
  for (int j = 0; j < n; j++) cu_fill(b[7] + t->offsets[j], t->counts[j], 14, j, 0);
  TRY(same_bits(b[5], b[7], total, "all_gather_start in place", r));
  /* A blocking collective behind requests in flight completes them first. */
  cu_fill(b[2], count, 16, r, 0);
  TRY(rt_comm_all_reduce_start(w, b[2], b[2], count, &q[0]));
  cu_fill(b[0], count, 17, r, 0);
  TRY(rt_comm_all_reduce(w, b[0], b[1], count));
  TRY(rt_comm_wait(&q[0]));
  cu_ordered_sum(b[7], count, 16, n, 0);
  TRY(same_bits(b[2], b[7], count, "all_reduce_start before a blocking call", r));
  cu_ordered_sum(b[7], count, 17, n, 0);
  TRY(same_bits(b[1], b[7], count, "blocking all_reduce behind a request", r));
  return rt_comm_barrier(w);
}

static int async_rank(RtComm *w, void *arg) {
  const Async *t = arg;
  int64_t big = t->count > t->total ? t->count : t->total;
  if (big < 4096) big = 4096;
  float *b[9];
  int ok = 1;
  for (int i = 0; i < 9; i++) ok &= (b[i] = falloc(big)) != NULL;
  int rc = ok ? async_body(w, t, b) : rt_fail("out of memory");
  for (int i = 0; i < 9; i++) free(b[i]);
  return rc;
}

/* Mesh tp 2 x dp 2: dp requests in flight while the tp groups run blocking
 * all_reduces, as a trainer's backward does. */
static int async_mesh_rank(RtComm *w, void *arg) {
  (void)arg;
  RtMesh m;
  TRY(rt_comm_mesh(w, 2, 2, 1, 1, &m));
  int wr = rt_comm_world_rank(w), tpm[2], dpm[2];
  for (int q = 0; q < 2; q++) tpm[q] = q + 2 * m.dp_rank, dpm[q] = m.tp_rank + 2 * q;
  enum { K = 3, N = 30011 };
  float *d = falloc(K * N), *x = falloc(N), *e = falloc(N);
  int rc = d && x && e ? RT_OK : rt_fail("out of memory");
  RtCommReq q[K] = {RT_COMM_REQ_NONE, RT_COMM_REQ_NONE, RT_COMM_REQ_NONE};
  for (int k = 0; k < K && rc == RT_OK; k++) {
    cu_fill(d + k * N, N, 40 + k, wr, 0);
    rc = rt_comm_all_reduce_start(m.dp_comm, d + k * N, d + k * N, N, &q[k]);
    cu_fill(x, N, 50 + k, wr, 0);
    if (rc == RT_OK) rc = rt_comm_all_reduce(m.tp_comm, x, x, N);
    for (int64_t i = 0; i < N && rc == RT_OK; i++) {
      float s = cu_value(50 + k, tpm[0], i) + cu_value(50 + k, tpm[1], i);
      if (memcmp(&s, &x[i], sizeof s)) rc = rt_fail("rank %d: tp all_reduce %d differs", wr, k);
    }
  }
  for (int k = K - 1; k >= 0; k--)
    if (rt_comm_wait(&q[k]) && rc == RT_OK) rc = RT_ERR;
  for (int k = 0; k < K && rc == RT_OK; k++) {
    for (int64_t i = 0; i < N; i++)
      e[i] = cu_value(40 + k, dpm[0], i) + cu_value(40 + k, dpm[1], i);
    rc = same_bits(d + k * N, e, N, "dp all_reduce_start beside tp", wr);
  }
  free(d);
  free(x);
  free(e);
  rt_comm_mesh_free(&m);
  return rc;
}

/* Progress: rank 0 starts at once, rank 1 after 0.3 s: rank 0's start returns
 * at once.  Then both start and sleep 0.3 s (their computation): the progress
 * threads finish the collective meanwhile, so the waits return at once. */
typedef struct {
  double start_s, wait_s, late_wait_s;
} Timing;

static int async_progress_rank(RtComm *w, void *arg) {
  Timing *tm = arg;
  int r = rt_comm_rank(w);
  enum { N = 1 << 20 };
  float *x = falloc(N), *e = falloc(N);
  if (!x || !e) return rt_fail("out of memory");
  RtCommReq q = RT_COMM_REQ_NONE;
  cu_fill(x, N, 60, r, 0);
  if (r == 1) sleep_s(0.3);
  double t0 = now_s();
  int rc = rt_comm_all_reduce_start(w, x, x, N, &q);
  double t1 = now_s();
  if (rc == RT_OK) rc = rt_comm_wait(&q);
  double t2 = now_s();
  if (r == 0) tm->start_s = t1 - t0, tm->late_wait_s = t2 - t1;
  cu_ordered_sum(e, N, 60, 2, 0);
  if (rc == RT_OK) rc = same_bits(x, e, N, "late all_reduce_start", r);
  cu_fill(x, N, 61, r, 0);
  if (rc == RT_OK) rc = rt_comm_all_reduce_start(w, x, x, N, &q);
  sleep_s(0.3);
  t0 = now_s();
  if (rc == RT_OK) rc = rt_comm_wait(&q);
  if (r == 0) tm->wait_s = now_s() - t0;
  cu_ordered_sum(e, N, 61, 2, 0);
  if (rc == RT_OK) rc = same_bits(x, e, N, "overlapped all_reduce_start", r);
  free(x);
  free(e);
  return rc;
}

enum { A_LATE, A_MISMATCH, A_LEAVES, A_ARGS };

typedef struct {
  int scenario;
  int rc[MAXR], start_rc[MAXR];
  double start_s[MAXR], wait_s[MAXR];
  char msg[MAXR][RT_ERR_MAX];
} AFail;

static int async_fail_rank(RtComm *w, void *arg) {
  AFail *f = arg;
  int r = rt_comm_rank(w);
  float x[2048] = {0};
  int64_t counts[2] = {512, 512};
  RtCommReq q = RT_COMM_REQ_NONE;
  double t0 = now_s();
  int rc = RT_OK;
  switch (f->scenario) {
  case A_LATE:               /* rank 1 never starts it (leaves after the timeout) */
    if (r == 1) {
      sleep_s(2.5);
      return RT_OK;
    }
    rc = rt_comm_all_reduce_start(w, x, x, 1024, &q);
    break;
  case A_MISMATCH:           /* rank 1 starts a reduce_scatter instead */
    rc = r == 1 ? rt_comm_reduce_scatter_start(w, x, x + 1024, counts, &q)
                : rt_comm_all_reduce_start(w, x, x, 1024, &q);
    break;
  case A_LEAVES: {           /* both start two and return without waiting (the
                                buffers must outlive the requests: not on the stack) */
    static float left[2][2048];
    float *y = left[r];
    rc = rt_comm_all_reduce_start(w, y, y, 1024, &q);
    if (rc == RT_OK) rc = rt_comm_all_gather_start(w, y + 1024 + 512 * r, y + 1024, counts, &q);
    f->start_rc[r] = rc;
    return rc;
  }
  case A_ARGS:               /* a bad start fails at once, with the blocking message */
    rc = rt_comm_all_reduce_start(w, x, x + 1, 4, &q);
    f->start_rc[r] = rc;
    snprintf(f->msg[r], sizeof f->msg[r], "%s", rc ? rt_last_error() : "");
    f->rc[r] = q.p != NULL;  /* no request made */
    return rc;
  }
  f->start_rc[r] = rc;
  f->start_s[r] = now_s() - t0;
  t0 = now_s();
  if (rc == RT_OK) rc = rt_comm_wait(&q);
  f->wait_s[r] = now_s() - t0;
  f->rc[r] = rc;
  snprintf(f->msg[r], sizeof f->msg[r], "%s", rc ? rt_last_error() : "");
  return rc;
}

static void test_async(void) {
  uint64_t rng = 5;
  for (int k = 0; k < NN; k++) {
    int n = NRANKS[k];
    const int64_t sizes[] = {0, 1, 1000, 1000003};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
      Async t = {.n = n, .count = sizes[s]};
      for (int r = 0; r < n; r++)
        t.counts[r] = r == 1 ? 0 : (int64_t)(cu_next(&rng) % (uint64_t)(sizes[s] / n + 2));
      for (int r = 0; r < n; r++) t.offsets[r] = t.total, t.total += t.counts[r];
      if (rt_comm_threads_run(n, async_rank, &t)) {
        char m[1200];
        snprintf(m, sizeof m, "async, %d ranks, count %lld: %s", n, (long long)t.count,
                 rt_last_error());
        check_report(__FILE__, __LINE__, m);
      }
    }
  }
  CHECK_OK(rt_comm_threads_run(4, async_mesh_rank, NULL));

  Timing tm = {0};
  CHECK_OK(rt_comm_threads_run(2, async_progress_rank, &tm));
  CHECK(tm.start_s < 0.05);      /* returned without waiting for rank 1 ... */
  CHECK(tm.late_wait_s > 0.2);   /* ... whose part the wait then waited for */
  if (tm.wait_s > 0.05) {        /* done during the 0.3 s of "computation" */
    char m[120];
    snprintf(m, sizeof m, "async progress: the wait after 0.3 s took %.3f s", tm.wait_s);
    check_report(__FILE__, __LINE__, m);
  }

  CHECK_OK(rt_comm_set_timeout(1));
  static AFail f;
  memset(&f, 0, sizeof f);
  f.scenario = A_LATE;
  CHECK_FAILS(rt_comm_threads_run(2, async_fail_rank, &f), "timed out");
  CHECK(f.start_rc[0] == RT_OK && f.start_s[0] < 0.1);
  CHECK(strcmp(f.msg[0], "rank 0 (group world, 2 ranks): all_reduce of 1024 floats timed out "
               "after 1 s waiting for rank 1") == 0);
  CHECK(f.wait_s[0] > 0.8 && f.wait_s[0] < 2.0);

  memset(&f, 0, sizeof f);
  f.scenario = A_MISMATCH;
  CHECK_FAILS(rt_comm_threads_run(2, async_fail_rank, &f), "does not match");
  CHECK(f.start_rc[0] == RT_OK && f.start_rc[1] == RT_OK);
  CHECK(strstr(f.msg[0], "rank 0 (group world, 2 ranks): all_reduce of 1024 floats does not "
               "match rank 1, which called reduce_scatter") != NULL);
  CHECK(strstr(f.msg[1], "reduce_scatter of 1024 floats (512 to rank 1) does not match rank 0")
        != NULL);
  CHECK(f.wait_s[0] < 0.5 && f.wait_s[1] < 0.5);

  memset(&f, 0, sizeof f);
  f.scenario = A_LEAVES;
  CHECK_OK(rt_comm_threads_run(2, async_fail_rank, &f));
  CHECK(f.start_rc[0] == RT_OK && f.start_rc[1] == RT_OK);

  memset(&f, 0, sizeof f);
  f.scenario = A_ARGS;
  CHECK_FAILS(rt_comm_threads_run(1, async_fail_rank, &f), "overlap without being equal");
  CHECK(f.start_rc[0] == RT_ERR && f.rc[0] == 0);
  CHECK(strstr(f.msg[0], "rank 0 (group world, 1 rank): all_reduce of 4 floats failed: send "
               "and receive buffers overlap without being equal") != NULL);
  CHECK_FAILS(rt_comm_all_reduce_start(NULL, NULL, NULL, 0, NULL), "NULL communicator");
  CHECK_OK(rt_comm_wait(NULL));
  CHECK_OK(rt_comm_set_timeout(RT_COMM_DEFAULT_TIMEOUT_S));
}

int main(int argc, char **argv) {
  const char *which = argc > 1 ? argv[1] : "";
  if (!strcmp(which, "collectives")) test_collectives();
  else if (!strcmp(which, "all_to_all")) test_all_to_all();
  else if (!strcmp(which, "mesh")) test_mesh();
  else if (!strcmp(which, "p2p")) test_p2p();
  else if (!strcmp(which, "timeout")) test_timeout();
  else if (!strcmp(which, "determinism")) test_determinism();
  else if (!strcmp(which, "errors")) test_errors();
  else if (!strcmp(which, "async")) test_async();
  else {
    fprintf(stderr, "usage: comm_test collectives|all_to_all|mesh|p2p|timeout|determinism|"
                    "errors|async\n");
    return 2;
  }
  return check_result("comm_test");
}
