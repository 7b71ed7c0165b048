/* tests/runtime/comm_xcheck.c -- one rank program, run unchanged on either backend:
 *
 *   comm_xcheck threads N OUTDIR   N ranks as threads of this process
 *   comm_xcheck mpi OUTDIR         under mpirun: one process per rank
 *                                  (both through rt_comm_run, which picks the backend)
 *   comm_xcheck mpi-timeout        under mpirun -np 3: rank 1 skips an all_reduce
 *                                  and waits in a barrier; every rank must fail
 *                                  after the 1 s timeout, each printing one line
 *   comm_xcheck mpi-async-timeout  the same with rt_comm_all_reduce_start: the
 *                                  waits of ranks 0 and 2 fail after the timeout
 *   comm_xcheck has-mpi            exit 0 if libparcrt has its MPI backend, else 77
 *
 * Every rank checks each result against serial references (comm_util.h) and
 * appends it to OUTDIR/rank<R>.bin; comm_mpi_check.py compares the files the two
 * backends wrote, byte for byte.  Exit status 0 on success; on failure the rank's
 * one-line error goes to stderr as "comm_xcheck: <message>" and the status is 1. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "runtime/rt_comm.h"
#include "runtime/rt_err.h"
#include "tests/runtime/comm_util.h"

#define MAXR 16
#define TRY(call)                         \
  do {                                    \
    if ((call) != RT_OK) return RT_ERR;   \
  } while (0)

typedef struct {
  FILE *out;
  float *x, *e;              /* BIG floats each */
} Ctx;

#define BIG 1000003

static int same(const Ctx *c, const float *got, const float *want, int64_t n, const char *what,
                int rank) {
  int64_t d = cu_first_diff(got, want, n);
  if (d >= 0)
    return rt_fail("rank %d: %s: element %lld of %lld is %a, want %a", rank, what,
                   (long long)d, (long long)n, (double)got[d], (double)want[d]);
  if (n > 0 && fwrite(got, sizeof *got, (size_t)n, c->out) != (size_t)n)
    return rt_fail("rank %d: cannot write the results", rank);
  return RT_OK;
}

/* Rank-ordered sum over the listed world ranks' values. */
static void sum_over(float *out, int64_t n, uint64_t seed, const int *ranks, int k) {
  for (int64_t i = 0; i < n; i++) {
    float s = cu_value(seed, ranks[0], i);
    for (int q = 1; q < k; q++) s += cu_value(seed, ranks[q], i);
    out[i] = s;
  }
}

static int run_checks(RtComm *w, Ctx *c) {
  int r = rt_comm_rank(w), n = rt_comm_size(w);
  float *x = c->x, *e = c->e;
  int all[MAXR];
  for (int q = 0; q < n; q++) all[q] = q;
  /* all_reduce, in place and not */
  static const int64_t sizes[] = {0, 1, 7, 17, 4099, 262147, BIG};
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
    int64_t k = sizes[s];
    uint64_t seed = 100 + s;
    cu_fill(x, k, seed, r, 0);
    if (s % 2) {
      TRY(rt_comm_all_reduce(w, x, x, k));
    } else {
      cu_fill(e, k, seed, r, 0);
      TRY(rt_comm_all_reduce(w, e, x, k));
    }
    sum_over(e, k, seed, all, n);
    TRY(same(c, x, e, k, "all_reduce", r));
  }
  /* all_gather and reduce_scatter with uneven blocks, one of them empty */
  int64_t counts[MAXR], offs[MAXR], total = 0;
  for (int q = 0; q < n; q++) {
    counts[q] = q == 1 ? 0 : 1000 + 37 * q;
    offs[q] = total;
    total += counts[q];
  }
  cu_fill(x, counts[r], 200, r, 0);
  TRY(rt_comm_all_gather(w, x, e, counts));
  for (int q = 0; q < n; q++) cu_fill(x + offs[q], counts[q], 200, q, 0);
  TRY(same(c, e, x, total, "all_gather", r));
  cu_fill(x, total, 201, r, 0);
  TRY(rt_comm_reduce_scatter(w, x, x + offs[r], counts));
  sum_over(e, total, 201, all, n);
  TRY(same(c, x + offs[r], e + offs[r], counts[r], "reduce_scatter", r));
  /* broadcast from the last rank */
  if (r == n - 1) cu_fill(x, 5000, 300, r, 0);
  TRY(rt_comm_broadcast(w, x, 5000, n - 1));
  cu_fill(e, 5000, 300, n - 1, 0);
  TRY(same(c, x, e, 5000, "broadcast", r));
  /* all_to_all with variable counts (some zero) */
  int64_t sc[MAXR], rc[MAXR], sd[MAXR], rd[MAXR], ns = 0, nr = 0;
  for (int j = 0; j < n; j++) {
    sc[j] = (r * 3 + j * 5) % 7 * 100;
    rc[j] = (j * 3 + r * 5) % 7 * 100;
    sd[j] = ns, rd[j] = nr;
    ns += sc[j], nr += rc[j];
  }
  for (int j = 0; j < n; j++) cu_fill(x + sd[j], sc[j], 400, r, (int64_t)j * 100000);
  float *recv = x + ns;
  TRY(rt_comm_all_to_all(w, x, sc, NULL, recv, rc, NULL));
  for (int j = 0; j < n; j++) cu_fill(e + rd[j], rc[j], 400, j, (int64_t)r * 100000);
  TRY(same(c, recv, e, nr, "all_to_all", r));
  /* a ring of sends (send first: buffered) */
  cu_fill(x, 3000, 500, r, 0);
  TRY(rt_comm_send(w, x, 3000, (r + 1) % n, 4));
  TRY(rt_comm_recv(w, x, 3000, (r + n - 1) % n, 4));
  cu_fill(e, 3000, 500, (r + n - 1) % n, 0);
  TRY(same(c, x, e, 3000, "ring", r));
  /* per-tag order: tags 0, 1, 0 sent; tag 1 received first */
  int to = (r + 1) % n, from = (r + n - 1) % n;
  for (int k = 0; k < 3; k++) {
    float v = (float)(r * 10 + k);
    TRY(rt_comm_send(w, &v, 1, to, k == 1));
  }
  float got[3];
  TRY(rt_comm_recv(w, &got[1], 1, from, 1));
  TRY(rt_comm_recv(w, &got[0], 1, from, 0));
  TRY(rt_comm_recv(w, &got[2], 1, from, 0));
  for (int k = 0; k < 3; k++) e[k] = (float)(from * 10 + k);
  TRY(same(c, got, e, 3, "tag order", r));
  /* a split: rank 0 joins none, the rest in reverse order */
  RtComm *g = NULL;
  TRY(rt_comm_split(w, r == 0 && n > 1 ? RT_COMM_NO_GROUP : 5, -r, "rest", &g));
  if (g) {
    int k = rt_comm_size(g);
    int64_t ones[MAXR];
    for (int q = 0; q < k; q++) ones[q] = 1, e[q] = (float)(n - 1 - q);
    float me = (float)r;
    int grc = k == (n > 1 ? n - 1 : 1) && !strcmp(rt_comm_name(g), "rest")
                  ? rt_comm_all_gather(g, &me, x, ones)
                  : rt_fail("rank %d: split gave %d ranks", r, k);
    rt_comm_free(g);
    TRY(grc);
    TRY(same(c, x, e, k, "split", r));
  } else if (r != 0 || n == 1) {
    return rt_fail("rank %d: split gave no group", r);
  }
  /* mesh groups */
  int tp = n % 2 == 0 ? 2 : 1, dp = n / tp;
  RtMesh m;
  TRY(rt_comm_mesh(w, tp, dp, 1, 1, &m));
  int tpm[MAXR], dpm[MAXR];
  for (int q = 0; q < tp; q++) tpm[q] = q + tp * m.dp_rank;
  for (int q = 0; q < dp; q++) dpm[q] = m.tp_rank + tp * q;
  int rc2 = RT_OK;
  for (int it = 0; it < 3 && rc2 == RT_OK; it++) {
    cu_fill(x, 10007, 600 + it, r, 0);
    rc2 = rt_comm_all_reduce(m.tp_comm, x, x, 10007);
    sum_over(e, 10007, 600 + it, tpm, tp);
    if (rc2 == RT_OK) rc2 = same(c, x, e, 10007, "tp all_reduce", r);
    cu_fill(x, 10007, 700 + it, r, 0);
    if (rc2 == RT_OK) rc2 = rt_comm_all_reduce(m.dp_comm, x, x, 10007);
    sum_over(e, 10007, 700 + it, dpm, dp);
    if (rc2 == RT_OK) rc2 = same(c, x, e, 10007, "dp all_reduce", r);
  }
  /* Non-blocking dp collectives (a trainer's gradient buckets): three in flight
   * while the tp group runs blocking all_reduces, waited for in reverse; the
   * reduce_scatter of ZeRO-1 and an all_gather; then the blocking twins on the
   * same inputs.  The bits must equal both the references and the other backend. */
  enum { NA = 3, LA = 20011 };
  float *y = rc2 == RT_OK ? malloc((size_t)NA * LA * sizeof *y) : NULL;
  if (rc2 == RT_OK && !y) rc2 = rt_fail("rank %d: out of memory", r);
  RtCommReq q[NA + 2] = {RT_COMM_REQ_NONE, RT_COMM_REQ_NONE, RT_COMM_REQ_NONE,
                         RT_COMM_REQ_NONE, RT_COMM_REQ_NONE};
  int64_t dcounts[MAXR], doffs[MAXR], dtotal = 0;
  for (int q2 = 0; q2 < dp; q2++) {
    dcounts[q2] = q2 == dp - 1 ? 0 : 3001 + 17 * q2;
    doffs[q2] = dtotal;
    dtotal += dcounts[q2];
  }
  for (int k = 0; k < NA && rc2 == RT_OK; k++) {
    cu_fill(y + (int64_t)k * LA, LA, 800 + k, r, 0);
    rc2 = rt_comm_all_reduce_start(m.dp_comm, y + (int64_t)k * LA, y + (int64_t)k * LA, LA, &q[k]);
    cu_fill(x, 5003, 900 + k, r, 0);
    if (rc2 == RT_OK) rc2 = rt_comm_all_reduce(m.tp_comm, x, x, 5003);
    sum_over(e, 5003, 900 + k, tpm, tp);
    if (rc2 == RT_OK) rc2 = same(c, x, e, 5003, "tp all_reduce beside dp requests", r);
  }
  float *rs_in = x, *rs_out = x + dtotal, *ag = x + dtotal + 4000;
  if (rc2 == RT_OK) {
    cu_fill(rs_in, dtotal, 1000, r, 0);
    rc2 = rt_comm_reduce_scatter_start(m.dp_comm, rs_in, rs_out, dcounts, &q[NA]);
  }
  if (rc2 == RT_OK) {
    cu_fill(ag + doffs[m.dp_rank], dcounts[m.dp_rank], 1001, r, 0);
    rc2 = rt_comm_all_gather_start(m.dp_comm, ag + doffs[m.dp_rank], ag, dcounts, &q[NA + 1]);
  }
  for (int k = NA + 1; k >= 0; k--)
    if (rt_comm_wait(&q[k]) && rc2 == RT_OK) rc2 = RT_ERR;
  for (int k = 0; k < NA && rc2 == RT_OK; k++) {
    sum_over(e, LA, 800 + k, dpm, dp);
    rc2 = same(c, y + (int64_t)k * LA, e, LA, "dp all_reduce_start", r);
  }
  if (rc2 == RT_OK) {
    sum_over(e, dtotal, 1000, dpm, dp);
    rc2 = same(c, rs_out, e + doffs[m.dp_rank], dcounts[m.dp_rank], "dp reduce_scatter_start", r);
  }
  for (int q2 = 0; q2 < dp; q2++) cu_fill(e + doffs[q2], dcounts[q2], 1001, dpm[q2], 0);
  if (rc2 == RT_OK) rc2 = same(c, ag, e, dtotal, "dp all_gather_start", r);
  if (rc2 == RT_OK) { /* the blocking twin: the same bits */
    cu_fill(y, LA, 800, r, 0);
    rc2 = rt_comm_all_reduce(m.dp_comm, y, y + LA, LA);
    sum_over(e, LA, 800, dpm, dp);
    if (rc2 == RT_OK) rc2 = same(c, y + LA, e, LA, "dp all_reduce", r);
  }
  free(y);
  rt_comm_mesh_free(&m);
  if (rc2) return rc2;
  return rt_comm_barrier(w);
}

typedef struct {
  const char *dir;
  const char *backend;       /* the one rt_comm_run must have chosen */
} Job;

static int xrank(RtComm *w, void *arg) {
  const Job *job = arg;
  const char *dir = job->dir;
  if (strcmp(rt_comm_backend(w), job->backend) != 0)
    return rt_fail("rank %d: rt_comm_run chose the %s backend, not %s", rt_comm_rank(w),
                   rt_comm_backend(w), job->backend);
  char path[4096];
  snprintf(path, sizeof path, "%s/rank%d.bin", dir, rt_comm_rank(w));
  Ctx c = {fopen(path, "wb"), malloc(2 * (size_t)BIG * sizeof(float)),
           malloc((size_t)BIG * sizeof(float))};
  int rc;
  if (!c.out) rc = rt_fail("cannot write %s", path);
  else if (!c.x || !c.e) rc = rt_fail("out of memory");
  else if (rt_comm_size(w) > MAXR) rc = rt_fail("at most %d ranks", MAXR);
  else rc = run_checks(w, &c);
  if (c.out && fclose(c.out) != 0 && rc == RT_OK) rc = rt_fail("cannot write %s", path);
  free(c.x);
  free(c.e);
  return rc;
}

/* mpi-stop: every rank meets the others, then returns RT_COMM_STOP_AGREED
 * (the ranks agreed to stop). */
static int stop_rank(RtComm *w, void *arg) {
  (void)arg;
  if (rt_comm_barrier(w)) return RT_ERR;
  rt_fail("rank %d: stopping with the others", rt_comm_rank(w));
  return RT_COMM_STOP_AGREED;
}

static int fail_exit(const char *what) {
  fprintf(stderr, "comm_xcheck: %s%s\n", what, rt_last_error());
  return 1;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  if (!strcmp(mode, "has-mpi")) return rt_comm_mpi_available() ? 0 : 77;
  /* Both backends through the same entry point, as a generated trainer does. */
  if (!strcmp(mode, "threads") && argc == 4) {
    Job job = {argv[3], "threads"};
    mkdir(job.dir, 0777);
    if (rt_comm_run(atoi(argv[2]), xrank, &job)) return fail_exit("");
    return 0;
  }
  if (!strcmp(mode, "mpi") && argc == 3) {
    Job job = {argv[2], "mpi"};
    if (!rt_comm_mpi_launched()) {
      fprintf(stderr, "comm_xcheck: not recognised as launched by mpirun\n");
      return 1;
    }
    mkdir(job.dir, 0777);
    if (rt_comm_run(0, xrank, &job)) return fail_exit("");
    return 0;
  }
  if (!strcmp(mode, "mpi-stop") && argc == 2) {
    /* rt_comm_run finalised MPI (a second init says so) and kept the rank's message */
    int rc = rt_comm_run(0, stop_rank, NULL);
    char msg[RT_ERR_MAX];
    snprintf(msg, sizeof msg, "%s", rt_last_error());
    RtComm *w = NULL;
    if (rc != RT_COMM_STOP_AGREED) return fail_exit("rt_comm_run did not return the stop: ");
    if (rt_comm_mpi_init(&w) == RT_OK || !strstr(rt_last_error(), "finalised already"))
      return fail_exit("MPI was not finalised: ");
    fprintf(stderr, "comm_xcheck: stopped, MPI finalised: %s\n", msg);
    return 1;
  }
  int async = !strcmp(mode, "mpi-async-timeout");
  if ((async || !strcmp(mode, "mpi-timeout")) && argc == 2) {
    RtComm *w;
    if (rt_comm_mpi_init(&w) || rt_comm_set_timeout(1)) return fail_exit("");
    static float x[1024];
    RtCommReq q = RT_COMM_REQ_NONE;
    int rc = rt_comm_rank(w) == 1 ? rt_comm_barrier(w)
             : async              ? rt_comm_all_reduce_start(w, x, x, 1024, &q)
                                  : rt_comm_all_reduce(w, x, x, 1024);
    if (rc == RT_OK && async && rt_comm_rank(w) != 1) rc = rt_comm_wait(&q);
    if (rc == RT_OK) {
      fprintf(stderr, "comm_xcheck: rank %d: the mismatched call succeeded\n", rt_comm_rank(w));
      return 1;
    }
    fprintf(stderr, "comm_xcheck: %s\n", rt_last_error());
    fflush(stderr);
    /* Give the other ranks time to report theirs before mpirun stops everyone. */
    struct timespec ts = {1, 500000000};
    nanosleep(&ts, NULL);
    if (rt_comm_mpi_finalize(w) == RT_OK) {
      fprintf(stderr, "comm_xcheck: finalize succeeded after a failure\n");
      return 1;
    }
    return 1;
  }
  fprintf(stderr, "usage: comm_xcheck threads N OUTDIR | mpi OUTDIR | mpi-timeout | "
                  "mpi-async-timeout | mpi-stop | has-mpi\n");
  return 2;
}
