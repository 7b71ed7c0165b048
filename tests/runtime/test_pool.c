/* tests/runtime/test_pool.c -- rt_pool: every index covered exactly once, chunk
 * bounds a function of (n, grain) only, workers really run concurrently, nested and
 * concurrent callers neither deadlock nor lose work, idle workers burn no CPU,
 * resizing and bad arguments. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/rt_pool.h"
#include "tests/runtime/check.h"

typedef struct {
  atomic_int *hits;          /* per index */
  int64_t (*chunks)[2];      /* (begin, end) of each call */
  atomic_int nchunks;
} Cover;

static void cover_fn(void *ctx, int64_t b, int64_t e) {
  Cover *c = ctx;
  int k = atomic_fetch_add(&c->nchunks, 1);
  if (k < RT_POOL_MAX_CHUNKS + 1) c->chunks[k][0] = b, c->chunks[k][1] = e;
  for (int64_t i = b; i < e; i++) atomic_fetch_add(&c->hits[i], 1);
}

static int by_begin(const void *x, const void *y) {
  const int64_t *a = x, *b = y;
  return (a[0] > b[0]) - (a[0] < b[0]);
}

/* Runs one loop and checks coverage and the chunk bounds; returns failures. */
static int check_cover(int64_t n, int64_t grain) {
  Cover c;
  c.hits = calloc((size_t)(n > 0 ? n : 1), sizeof *c.hits);
  c.chunks = calloc(RT_POOL_MAX_CHUNKS + 1, sizeof *c.chunks);
  atomic_init(&c.nchunks, 0);
  rt_parallel_for(n, grain, cover_fn, &c);
  int bad = 0;
  for (int64_t i = 0; i < n; i++) bad += atomic_load(&c.hits[i]) != 1;
  int64_t want = rt_parallel_chunks(n, grain), got = atomic_load(&c.nchunks);
  bad += got != want;
  bad += n > 0 && (want < 1 || want > RT_POOL_MAX_CHUNKS);
  if (got == want) {
    qsort(c.chunks, (size_t)got, sizeof *c.chunks, by_begin);
    int64_t g = grain < 1 ? 1 : grain, minlen = n < g ? n : g;
    for (int64_t j = 0; j < got; j++) {
      int64_t b, e;
      rt_parallel_chunk(n, want, j, &b, &e);
      bad += c.chunks[j][0] != b || c.chunks[j][1] != e || e - b < minlen;
    }
  }
  free(c.hits);
  free(c.chunks);
  return bad;
}

static void test_coverage(void) {
  static const int threads[] = {1, 2, 3, 4, 7};
  static const int64_t ns[] = {0, -3, 1, 2, 3, 5, 16, 17, 100, 255, 256, 257, 1000, 4097, 100003};
  static const int64_t grains[] = {-1, 0, 1, 2, 3, 7, 64, 1000, 1 << 20};
  for (size_t t = 0; t < sizeof threads / sizeof *threads; t++) {
    CHECK_OK(rt_pool_init(threads[t]));
    CHECK(rt_pool_threads() == threads[t]);
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
      for (size_t g = 0; g < sizeof grains / sizeof *grains; g++) {
        int bad = check_cover(ns[a], grains[g]);
        if (bad) {
          char m[160];
          snprintf(m, sizeof m, "coverage: threads %d n %lld grain %lld: %d bad", threads[t],
                   (long long)ns[a], (long long)grains[g], bad);
          check_report(__FILE__, __LINE__, m);
        }
      }
  }
  /* Bounds do not depend on the pool: the chunk formula has no thread count. */
  CHECK(rt_parallel_chunks(1000, 1) == RT_POOL_MAX_CHUNKS);
  CHECK(rt_parallel_chunks(1000, 300) == 3);
  CHECK(rt_parallel_chunks(5, 3) == 1);
  CHECK(rt_parallel_chunks(0, 3) == 0);
  int64_t b, e;
  rt_parallel_chunk(10, 3, 0, &b, &e);
  CHECK(b == 0 && e == 4);
  rt_parallel_chunk(10, 3, 2, &b, &e);
  CHECK(b == 7 && e == 10);
}

/* Two chunks that can only both finish if they run at the same time: each waits
 * (up to 5 s) until the other has started. */
typedef struct {
  atomic_int started;
  atomic_int timed_out;
} Meet;

static double now_s(clockid_t clk) {
  struct timespec ts;
  clock_gettime(clk, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void meet_fn(void *ctx, int64_t b, int64_t e) {
  Meet *m = ctx;
  atomic_fetch_add(&m->started, 1);
  double t0 = now_s(CLOCK_MONOTONIC);
  while (atomic_load(&m->started) < 2) {
    if (now_s(CLOCK_MONOTONIC) - t0 > 5) {
      atomic_store(&m->timed_out, 1);
      return;
    }
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
}

static void test_concurrency(void) {
  CHECK_OK(rt_pool_init(2));
  Meet m;
  atomic_init(&m.started, 0);
  atomic_init(&m.timed_out, 0);
  rt_parallel_for(2, 1, meet_fn, &m);
  CHECK(!atomic_load(&m.timed_out));
}

/* A chunk that runs another loop inside itself. */
static void nested_fn(void *ctx, int64_t b, int64_t e) {
  atomic_int *bad = ctx;
  for (int64_t i = b; i < e; i++)
    if (check_cover(37 + i, 2)) atomic_fetch_add(bad, 1);
}

static void test_nested(void) {
  CHECK_OK(rt_pool_init(3));
  atomic_int bad;
  atomic_init(&bad, 0);
  rt_parallel_for(12, 1, nested_fn, &bad);
  CHECK(atomic_load(&bad) == 0);
}

/* Application threads (ranks as threads) calling loops at the same time. */
static void *caller(void *arg) {
  atomic_int *bad = arg;
  for (int r = 0; r < 200; r++)
    if (check_cover(50 + r, 1 + r % 5)) atomic_fetch_add(bad, 1);
  return NULL;
}

static void test_concurrent_callers(void) {
  CHECK_OK(rt_pool_init(3));
  atomic_int bad;
  atomic_init(&bad, 0);
  pthread_t t[3];
  for (int i = 0; i < 3; i++) CHECK(pthread_create(&t[i], NULL, caller, &bad) == 0);
  for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
  CHECK(atomic_load(&bad) == 0);
}

/* Idle workers sleep: the process uses (almost) no CPU while nothing runs.
 * The pool has no spin phase (workers block on a condition variable at once),
 * so any window would do; the test takes the least CPU over three windows so
 * that one burst from elsewhere in the process (the sanitizers' bookkeeping
 * after the callers above exit, a late page fault) cannot fail it, while a
 * worker that spins uses a large part of a core in every window. */
static void spin_fn(void *ctx, int64_t b, int64_t e) {
  volatile double *x = ctx;
  for (int64_t i = b; i < e; i++) x[i] = (double)i * 0.5;
}

static void test_idle(void) {
  CHECK_OK(rt_pool_init(3));
  double x[64];
  rt_parallel_for(64, 1, spin_fn, x);
  double least = 1e9;
  for (int w = 0; w < 3; w++) {
    double c0 = now_s(CLOCK_PROCESS_CPUTIME_ID);
    struct timespec ts = {0, 250000000};
    nanosleep(&ts, NULL);
    double used = now_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
    if (used < least) least = used;
  }
  if (least > 0.04) {
    char m[120];
    snprintf(m, sizeof m, "idle pool used at least %.3f s of CPU in each 0.25 s window",
             least);
    check_report(__FILE__, __LINE__, m);
  }
}

static void test_lifecycle(void) {
  CHECK_FAILS(rt_pool_init(-1), "use 1..");
  CHECK_FAILS(rt_pool_init(RT_POOL_MAX_THREADS + 1), "threads requested");
  CHECK_OK(rt_pool_init(0));
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  CHECK(rt_pool_threads() == (cpus > RT_POOL_MAX_THREADS ? RT_POOL_MAX_THREADS : cpus));
  CHECK_OK(rt_pool_init(2));
  CHECK_OK(rt_pool_init(2));
  CHECK(rt_pool_threads() == 2);
  rt_pool_shutdown();
  rt_pool_shutdown();
  CHECK(rt_pool_threads() == 1);
  CHECK(check_cover(1000, 1) == 0);  /* no pool: serial, same chunks */
}

int main(void) {
  test_lifecycle();
  test_coverage();
  test_concurrency();
  test_nested();
  test_concurrent_callers();
  test_idle();
  rt_pool_shutdown();
  return check_result("test_pool");
}
