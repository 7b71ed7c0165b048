/* runtime/rt_pool.c -- persistent pthread pool; see rt_pool.h.
 *
 * One loop at a time owns the pool: its caller holds `submit` (taken with
 * trylock, so a second caller, or a nested call from inside a chunk, runs its
 * chunks inline instead of waiting).  The owner publishes a Job, bumps the
 * generation and wakes the workers; everyone takes chunks from the job's atomic
 * counter until none are left; the owner waits until every worker has left the
 * job (busy == 0) before the Job, which lives on its stack, goes away. */
#define _POSIX_C_SOURCE 200809L
#include "runtime/rt_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/rt_err.h"

typedef struct {
  RtRangeFn fn;
  void *ctx;
  int64_t n, nchunks;
  atomic_llong next;       /* next chunk to take */
} Job;

static struct {
  pthread_mutex_t submit;  /* held by the caller that owns the pool for a loop */
  pthread_mutex_t mu;      /* guards everything below */
  pthread_cond_t wake;     /* workers wait here for a new generation or stop */
  pthread_cond_t done;     /* the owner waits here for busy == 0 */
  pthread_t *tid;
  int nworkers;
  unsigned long gen;       /* bumped once per published job; 0 at start */
  int busy;                /* workers not yet finished with the current job */
  int stop;
  Job *job;
} P = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
       PTHREAD_COND_INITIALIZER, NULL, 0, 0, 0, 0, NULL};

static atomic_int pool_threads = 1;

int64_t rt_parallel_chunks(int64_t n, int64_t grain) {
  if (n <= 0) return 0;
  if (grain < 1) grain = 1;
  int64_t c = n / grain;
  return c < 1 ? 1 : c > RT_POOL_MAX_CHUNKS ? RT_POOL_MAX_CHUNKS : c;
}

void rt_parallel_chunk(int64_t n, int64_t nchunks, int64_t j, int64_t *begin, int64_t *end) {
  int64_t q = n / nchunks, r = n % nchunks;
  *begin = j * q + (j < r ? j : r);
  *end = *begin + q + (j < r);
}

static void run_chunks(Job *j) {
  for (;;) {
    int64_t c = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
    if (c >= j->nchunks) return;
    int64_t b, e;
    rt_parallel_chunk(j->n, j->nchunks, c, &b, &e);
    j->fn(j->ctx, b, e);
  }
}

static void *worker(void *arg) {
  (void)arg;
  unsigned long seen = 0;  /* the generation at creation: workers start before any job */
  pthread_mutex_lock(&P.mu);
  for (;;) {
    while (!P.stop && P.gen == seen) pthread_cond_wait(&P.wake, &P.mu);
    if (P.stop) break;
    seen = P.gen;
    Job *j = P.job;
    pthread_mutex_unlock(&P.mu);
    run_chunks(j);
    pthread_mutex_lock(&P.mu);
    if (--P.busy == 0) pthread_cond_signal(&P.done);
  }
  pthread_mutex_unlock(&P.mu);
  return NULL;
}

/* Stops and joins the workers; the caller holds `submit`. */
static void stop_workers(void) {
  pthread_mutex_lock(&P.mu);
  P.stop = 1;
  pthread_cond_broadcast(&P.wake);
  pthread_mutex_unlock(&P.mu);
  for (int i = 0; i < P.nworkers; i++) pthread_join(P.tid[i], NULL);
  free(P.tid);
  P.tid = NULL;
  P.nworkers = 0;
  P.stop = 0;
  P.gen = 0;
  P.job = NULL;
  atomic_store(&pool_threads, 1);
}

int rt_pool_init(int threads) {
  if (threads == 0) {
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    threads = c < 1 ? 1 : c > RT_POOL_MAX_THREADS ? RT_POOL_MAX_THREADS : (int)c;
  }
  if (threads < 1 || threads > RT_POOL_MAX_THREADS)
    return rt_fail("rt_pool_init: %d threads requested; use 1..%d, or 0 for one per CPU",
                   threads, RT_POOL_MAX_THREADS);
  pthread_mutex_lock(&P.submit);
  if (P.nworkers == threads - 1) {
    pthread_mutex_unlock(&P.submit);
    return RT_OK;
  }
  stop_workers();
  int rc = RT_OK;
  if (threads > 1) {
    P.tid = calloc((size_t)(threads - 1), sizeof *P.tid);
    if (!P.tid) {
      rc = rt_fail("rt_pool_init: out of memory for %d threads", threads);
    } else {
      for (int i = 0; i < threads - 1; i++) {
        int e = pthread_create(&P.tid[i], NULL, worker, NULL);
        if (e) {
          rc = rt_fail("rt_pool_init: could not start worker %d of %d: %s", i + 1,
                       threads - 1, strerror(e));
          break;
        }
        P.nworkers++;
      }
      if (rc != RT_OK) stop_workers();
      else atomic_store(&pool_threads, threads);
    }
  }
  pthread_mutex_unlock(&P.submit);
  return rc;
}

void rt_pool_shutdown(void) {
  pthread_mutex_lock(&P.submit);
  stop_workers();
  pthread_mutex_unlock(&P.submit);
}

int rt_pool_threads(void) { return atomic_load(&pool_threads); }

void rt_parallel_for(int64_t n, int64_t grain, RtRangeFn fn, void *ctx) {
  int64_t nchunks = rt_parallel_chunks(n, grain);
  if (nchunks == 0) return;
  Job j = {fn, ctx, n, nchunks, 0};
  /* Serial: one chunk, no workers, or the pool is busy (nested or concurrent). */
  if (nchunks == 1 || atomic_load(&pool_threads) == 1 || pthread_mutex_trylock(&P.submit)) {
    run_chunks(&j);
    return;
  }
  if (P.nworkers == 0) {  /* shut down between the check and the lock */
    pthread_mutex_unlock(&P.submit);
    run_chunks(&j);
    return;
  }
  pthread_mutex_lock(&P.mu);
  P.job = &j;
  P.busy = P.nworkers;
  P.gen++;
  pthread_cond_broadcast(&P.wake);
  pthread_mutex_unlock(&P.mu);
  run_chunks(&j);
  pthread_mutex_lock(&P.mu);
  while (P.busy) pthread_cond_wait(&P.done, &P.mu);
  P.job = NULL;
  pthread_mutex_unlock(&P.mu);
  pthread_mutex_unlock(&P.submit);
}
