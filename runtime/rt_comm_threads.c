/* runtime/rt_comm_threads.c -- the thread backend: every rank a thread of this
 * process, collectives through shared memory.  See rt_comm.h.
 *
 * A group (TGroup) is shared by its members; each member holds its own handle
 * (THandle) into the group's handle array.  A collective is:
 *   1. entry: the member publishes its arguments in its slot (TSlot) and enters
 *      the entry barrier.  This barrier is the only one that can fail (world
 *      aborted, deadline, a member returned from rank_main); a member that fails
 *      there withdraws its arrival, so the barrier completes for all members or
 *      for none: once it completes, every member is committed to the whole call.
 *   2. every member checks every slot: same op and sizes (and, for all_gather /
 *      reduce_scatter / all_to_all, agreeing counts).  All members see the same
 *      slots, so all reach the same verdict.
 *   3. the data phase: each member reads the others' published buffers and writes
 *      only its own, separated by "sync" barriers that ignore aborts (between them
 *      there is only copying, which cannot block), so no member leaves while
 *      another still reads its buffers.
 * Slots are double-buffered by call parity: a member can rewrite slot parity p
 * only two calls later, after every member has left this call's reads behind.
 *
 * Traffic per rank, for count floats and n ranks (block = count / n), and barriers:
 *   all_reduce      reads (2n - 1) / n count, writes count: reduce its block from
 *                   the n inputs into its own output, sync, copy the other n - 1
 *                   finished blocks from their owners' outputs, sync (3 barriers).
 *                   Up to 1024 floats: reduce everything into a private buffer,
 *                   sync, write it (reads n count; 2 barriers).
 *   reduce_scatter  reads n block, writes block (2 barriers)
 *   all_gather      reads and writes the other ranks' blocks (2 barriers)
 *   broadcast       reads and writes count, not on the root (2 barriers)
 *   all_to_all      reads and writes what this rank receives (2 barriers)
 *   barrier, split  1 and 2 barriers
 * Every byte moves once, by the rank that needs it; no staging copies.  Sums run
 * through rt_comm_reduce_ordered (rank order), like the MPI backend.
 * Point to point: a send finding its receive posted copies straight into it;
 * otherwise it copies into a queued message that the receive copies out.
 *
 * Non-blocking collectives: each handle that starts one gets a progress thread
 * (THandle.worker) that runs the handle's requests one at a time, in start order,
 * through the same t_* functions a blocking call runs, so the sums and every
 * message are the blocking call's.  The front end never runs a blocking
 * collective of the handle while its queue is non-empty (it completes the
 * requests first), so the handle's call state (calls, phase, srcs) has one user
 * at a time.  A rank's thread, once its rank_main returned, waits until its
 * progress threads have nothing left before it counts as exited: until then its
 * requests still take part in their collectives. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/rt_comm.h"
#include "runtime/rt_comm_impl.h"
#include "runtime/rt_err.h"
#include "runtime/rt_pool.h"

/* A barrier polls for up to SPIN_US before sleeping on its condition variable, when
 * the world has no more ranks than CPUs, yielding the CPU every 64 polls: on a busy
 * machine the rank it waits for may need this core. */
#define SPIN_US 50
#define SMALL_ALL_REDUCE 1024 /* floats: one-pass all_reduce up to this count */

typedef struct TWorld TWorld;
typedef struct TGroup TGroup;

typedef struct {             /* a member's published call */
  RtCommKind kind;
  int64_t count;             /* as RtCommCall.count */
  int root;
  const float *send;
  float *recv;
  const int64_t *counts, *offsets;
  const int64_t *send_counts, *send_displs, *recv_counts, *recv_displs;
  int color, key;
  const char *name;
  TGroup *made;              /* split: the group this member created (leader) */
} TSlot;

typedef struct TMsg {        /* a buffered point-to-point message */
  struct TMsg *next;
  int src, tag;
  int64_t count;
  float data[];
} TMsg;

typedef struct {             /* a member's incoming point-to-point traffic */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  TMsg *head, *tail;         /* buffered messages in arrival order */
  int posted, src, tag;      /* the receive its owner is blocked in */
  int64_t want;
  float *buf;
  int done;                  /* a sender filled it ... */
  int64_t got;               /* ... with this many floats (0 copied when != want) */
} TMailbox;

typedef struct {
  RtComm base;               /* first: RtComm * <-> THandle * */
  TGroup *g;
  int is_world;
  uint64_t calls;            /* collectives entered: the slot parity */
  uint64_t phase;            /* barriers entered */
  const float **srcs;        /* size entries */
  /* non-blocking collectives (owner thread: worker_on, qready; the rest under qmu) */
  int worker_on;             /* the progress thread runs */
  int qready;                /* qmu and qcv initialised */
  int stop;                  /* the progress thread ends once the queue is empty */
  pthread_t worker;
  pthread_mutex_t qmu;
  pthread_cond_t qcv;        /* a request queued or completed, or stop set */
  RtCommPending *qhead, *qtail; /* queued requests; the head is running */
} THandle;

struct TGroup {
  TWorld *w;
  int size;
  TGroup *next;              /* the world's registry (under w->mu) */
  int refs;                  /* handles not freed (under w->mu) */
  int spin;
  int sync_ready;            /* mu and cv initialised */
  int boxes_ready;           /* mailboxes initialised */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int arrived_count;         /* at the barrier in progress */
  _Atomic uint64_t gen;      /* barriers completed */
  uint64_t *arrived;         /* per member: the last barrier it entered */
  TSlot *slots[2];           /* by call parity, size each */
  TMailbox *box;             /* per member */
  THandle *handles;          /* per member */
};

struct TWorld {
  int n;
  int spin;
  pthread_mutex_t mu;        /* the registry and the first failure */
  TGroup *groups;
  _Atomic int aborted;
  char first_err[RT_ERR_MAX];
  _Atomic int *exited;       /* per world rank: returned from rank_main */
};

static const RtCommOps thread_ops;

/* ---- clocks and waits ---- */

static void deadline_ts(double deadline, struct timespec *ts) {
  double s = deadline < 0 ? 0 : deadline;
  ts->tv_sec = (time_t)s;
  ts->tv_nsec = (long)((s - (double)ts->tv_sec) * 1e9);
  if (ts->tv_nsec >= 1000000000L) ts->tv_sec++, ts->tv_nsec -= 1000000000L;
  if (ts->tv_nsec < 0) ts->tv_nsec = 0;
}

static int cond_init_monotonic(pthread_cond_t *cv) {
  pthread_condattr_t a;
  if (pthread_condattr_init(&a)) return -1;
  int rc = pthread_condattr_setclock(&a, CLOCK_MONOTONIC) || pthread_cond_init(cv, &a);
  pthread_condattr_destroy(&a);
  return rc ? -1 : 0;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  atomic_signal_fence(memory_order_seq_cst);
#endif
}

/* ---- the world: failures and wake-ups ---- */

/* Wakes every waiter of every group (after an abort or a rank's exit). */
static void wake_all_locked(TWorld *w) {
  for (TGroup *g = w->groups; g; g = g->next) {
    pthread_mutex_lock(&g->mu);
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    for (int i = 0; i < g->size; i++) {
      pthread_mutex_lock(&g->box[i].mu);
      pthread_cond_broadcast(&g->box[i].cv);
      pthread_mutex_unlock(&g->box[i].mu);
    }
  }
}

/* Records msg as the world's failure if it is the first, and aborts the world. */
static void world_fail(TWorld *w, const char *msg) {
  pthread_mutex_lock(&w->mu);
  if (!w->first_err[0]) snprintf(w->first_err, sizeof w->first_err, "%s", msg);
  atomic_store(&w->aborted, 1);
  wake_all_locked(w);
  pthread_mutex_unlock(&w->mu);
}

static void world_first_error(TWorld *w, char *buf, size_t n) {
  pthread_mutex_lock(&w->mu);
  snprintf(buf, n, "%s", w->first_err[0] ? w->first_err : "(no message)");
  pthread_mutex_unlock(&w->mu);
}

static int fail_aborted(THandle *h, const RtCommCall *call, const char *when) {
  char first[RT_ERR_MAX];
  world_first_error(h->g->w, first, sizeof first);
  return rt_comm_fail(&h->base, call, "%s because of an earlier failure: %s", when, first);
}

static void thread_failed(RtComm *c, const char *msg) { world_fail(((THandle *)c)->g->w, msg); }

/* ---- groups ---- */

/* Ends h's progress thread (its queue must be empty, or about to be). */
static void stop_worker(THandle *h) {
  if (!h->worker_on) return;
  pthread_mutex_lock(&h->qmu);
  h->stop = 1;
  pthread_cond_broadcast(&h->qcv);
  pthread_mutex_unlock(&h->qmu);
  pthread_join(h->worker, NULL);
  h->worker_on = 0;
  h->stop = 0;
}

static void group_destroy(TGroup *g) {
  if (!g) return;
  for (int i = 0; g->handles && i < g->size; i++) {
    THandle *h = &g->handles[i];
    stop_worker(h);
    if (h->qready) {
      pthread_mutex_destroy(&h->qmu);
      pthread_cond_destroy(&h->qcv);
      h->qready = 0;
    }
    rt_comm_free_base(&g->handles[i].base);
    free(g->handles[i].srcs);
  }
  for (int i = 0; i < g->boxes_ready; i++) {
    for (TMsg *m = g->box[i].head, *next; m; m = next) {
      next = m->next;
      free(m);
    }
    pthread_mutex_destroy(&g->box[i].mu);
    pthread_cond_destroy(&g->box[i].cv);
  }
  if (g->sync_ready) {
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
  }
  free(g->handles);
  free(g->box);
  free(g->arrived);
  free(g->slots[0]);
  free(g->slots[1]);
  free(g);
}

/* A group of `size` members (world ranks members[]), registered in w; NULL when
 * out of memory. */
static TGroup *group_new(TWorld *w, int size, const int *members, const char *name,
                         int is_world) {
  TGroup *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->w = w;
  g->size = size;
  g->spin = w->spin;
  atomic_init(&g->gen, 0);
  g->arrived = calloc((size_t)size, sizeof *g->arrived);
  g->slots[0] = calloc((size_t)size, sizeof(TSlot));
  g->slots[1] = calloc((size_t)size, sizeof(TSlot));
  g->box = calloc((size_t)size, sizeof *g->box);
  g->handles = calloc((size_t)size, sizeof *g->handles);
  int ok = g->arrived && g->slots[0] && g->slots[1] && g->box && g->handles;
  if (ok && pthread_mutex_init(&g->mu, NULL) == 0) {
    if (cond_init_monotonic(&g->cv) == 0) g->sync_ready = 1;
    else pthread_mutex_destroy(&g->mu);
  }
  ok = ok && g->sync_ready;
  for (; ok && g->boxes_ready < size; g->boxes_ready++) {
    TMailbox *b = &g->box[g->boxes_ready];
    if (pthread_mutex_init(&b->mu, NULL)) {
      ok = 0;
    } else if (cond_init_monotonic(&b->cv)) {
      pthread_mutex_destroy(&b->mu);
      ok = 0;
    }
    if (!ok) break;
  }
  for (int i = 0; ok && i < size; i++) {
    THandle *h = &g->handles[i];
    h->g = g;
    h->is_world = is_world;
    h->srcs = malloc((size_t)size * sizeof *h->srcs);
    if (!h->srcs || rt_comm_init_base(&h->base, &thread_ops, i, size, members, name)) ok = 0;
  }
  if (!ok) {
    group_destroy(g);
    return NULL;
  }
  g->refs = size;
  pthread_mutex_lock(&w->mu);
  g->next = w->groups;
  w->groups = g;
  pthread_mutex_unlock(&w->mu);
  return g;
}

/* ---- barriers ---- */

/* First member that has not entered barrier `phase` (under g->mu), or -1. */
static int first_missing(TGroup *g, uint64_t phase) {
  for (int j = 0; j < g->size; j++)
    if (g->arrived[j] < phase) return j;
  return -1;
}

/* Arrives at the next barrier; 1 if this arrival completed it. */
static int arrive(THandle *h, uint64_t *phase) {
  TGroup *g = h->g;
  *phase = ++h->phase;
  pthread_mutex_lock(&g->mu);
  g->arrived[h->base.rank] = *phase;
  if (++g->arrived_count == g->size) {
    g->arrived_count = 0;
    atomic_store_explicit(&g->gen, *phase, memory_order_release);
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    return 1;
  }
  pthread_mutex_unlock(&g->mu);
  return 0;
}

static int spin_until(TGroup *g, uint64_t phase, int abortable) {
  if (!g->spin) return 0;
  double end = 0;
  for (unsigned i = 1;; i++) {
    if (atomic_load_explicit(&g->gen, memory_order_acquire) >= phase) return 1;
    if (abortable && atomic_load_explicit(&g->w->aborted, memory_order_relaxed)) return 0;
    if (i % 64 == 0) {
      double t = rt_comm_now();
      if (end == 0) end = t + SPIN_US * 1e-6;
      else if (t > end) return 0;
      sched_yield();
    }
    cpu_relax();
  }
}

/* The entry barrier: fails (and withdraws this member's arrival) when the world is
 * aborted, the deadline passes or a member it waits for has left rank_main. */
static int barrier_entry(THandle *h, const RtCommCall *call) {
  TGroup *g = h->g;
  TWorld *w = g->w;
  uint64_t phase;
  if (arrive(h, &phase) || spin_until(g, phase, 1)) return RT_OK;
  enum { DONE, ABORTED, EXITED, TIMEOUT } why = DONE;
  int missing = -1;
  struct timespec ts;
  deadline_ts(call->deadline, &ts);
  int timed_out = 0;
  pthread_mutex_lock(&g->mu);
  while (atomic_load_explicit(&g->gen, memory_order_relaxed) < phase) {
    if (atomic_load(&w->aborted)) {
      why = ABORTED;
    } else {
      for (int j = 0; j < g->size && why == DONE; j++)
        if (g->arrived[j] < phase && atomic_load(&w->exited[h->base.members[j]]))
          why = EXITED, missing = j;
    }
    if (why == DONE && timed_out) why = TIMEOUT, missing = first_missing(g, phase);
    if (why != DONE) break;
    timed_out = pthread_cond_timedwait(&g->cv, &g->mu, &ts) == ETIMEDOUT;
  }
  /* Withdraw: the barrier cannot complete without us now.  arrived[] keeps our
   * phase, so that the others' messages name the members that never came. */
  if (why != DONE) g->arrived_count--;
  pthread_mutex_unlock(&g->mu);
  const int *mem = h->base.members;
  switch (why) {
  case DONE:
    return RT_OK;
  case ABORTED:
    return fail_aborted(h, call, "was abandoned");
  case EXITED:
    return rt_comm_fail(&h->base, call, "failed: rank %d returned from its rank_main without "
                        "calling it", mem[missing]);
  case TIMEOUT:
    if (missing < 0)         /* every member came, but one has withdrawn since */
      return rt_comm_fail(&h->base, call, "timed out after %g s", rt_comm_timeout());
    return rt_comm_fail(&h->base, call, "timed out after %g s waiting for rank %d",
                        rt_comm_timeout(), mem[missing]);
  }
  return RT_ERR;
}

/* A barrier inside a call whose entry barrier completed: every member is bound to
 * reach it (only copying lies in between), so aborts are ignored; a member must not
 * leave while others may still read its buffers. */
static int barrier_sync(THandle *h, const RtCommCall *call) {
  TGroup *g = h->g;
  uint64_t phase;
  if (arrive(h, &phase) || spin_until(g, phase, 0)) return RT_OK;
  pthread_mutex_lock(&g->mu);
  while (atomic_load_explicit(&g->gen, memory_order_relaxed) < phase)
    pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
  (void)call;
  return RT_OK;
}

/* ---- entry: publish, barrier, check agreement ---- */

static void describe_slot(const TSlot *s, char *buf, size_t n) {
  switch (s->kind) {
  case RT_COMM_ALL_REDUCE:
  case RT_COMM_ALL_GATHER:
  case RT_COMM_REDUCE_SCATTER:
    snprintf(buf, n, "%s of %lld floats", rt_comm_op_name(s->kind), (long long)s->count);
    break;
  case RT_COMM_BROADCAST:
    snprintf(buf, n, "%s of %lld floats from group rank %d", rt_comm_op_name(s->kind),
             (long long)s->count, s->root);
    break;
  default:
    snprintf(buf, n, "%s", rt_comm_op_name(s->kind));
  }
}

/* Publishes the call, passes the entry barrier and checks that every member called
 * the same thing.  On RT_OK *slots is this call's slot array. */
static int enter(THandle *h, const RtCommCall *call, TSlot **slots_out) {
  TGroup *g = h->g;
  int me = h->base.rank, n = g->size;
  if (atomic_load(&g->w->aborted)) return fail_aborted(h, call, "was not started");
  TSlot *slots = g->slots[h->calls++ & 1];
  TSlot *s = &slots[me];
  *s = (TSlot){.kind = call->kind, .count = call->count, .root = call->peer,
               .send = call->send, .recv = call->recv, .counts = call->counts,
               .offsets = call->offsets, .send_counts = call->send_counts,
               .send_displs = call->send_displs, .recv_counts = call->recv_counts,
               .recv_displs = call->recv_displs, .color = call->color, .key = call->key,
               .name = call->name};
  if (barrier_entry(h, call)) return RT_ERR;
  *slots_out = slots;
  /* 1. Scalars (every member's slot is stable until its call after next). */
  for (int j = 0; j < n; j++) {
    const TSlot *o = &slots[j];
    int same = o->kind == s->kind;
    if (same && s->kind != RT_COMM_ALL_TO_ALL && s->kind != RT_COMM_SPLIT &&
        s->kind != RT_COMM_BARRIER)
      same = o->count == s->count && (s->kind != RT_COMM_BROADCAST || o->root == s->root);
    if (!same) {
      char other[160];
      describe_slot(o, other, sizeof other);
      return rt_comm_fail(&h->base, call, "does not match rank %d, which called %s",
                          h->base.members[j], other);
    }
  }
  /* 2. Arrays: every member is in this same call, which it leaves only after a
   *    sync barrier, so its arrays stay valid while we read them. */
  char why[200] = "";
  if (s->kind == RT_COMM_ALL_GATHER || s->kind == RT_COMM_REDUCE_SCATTER) {
    for (int j = 0; j < n && !why[0]; j++)
      for (int r = 0; r < n; r++)
        if (slots[j].counts[r] != s->counts[r]) {
          snprintf(why, sizeof why, "disagrees with rank %d on counts[%d]: %lld here, %lld there",
                   h->base.members[j], r, (long long)s->counts[r], (long long)slots[j].counts[r]);
          break;
        }
  } else if (s->kind == RT_COMM_ALL_TO_ALL) {
    for (int i = 0; i < n && !why[0]; i++)
      for (int j = 0; j < n; j++)
        if (slots[j].send_counts[i] != slots[i].recv_counts[j]) {
          snprintf(why, sizeof why, "failed: rank %d sends %lld floats to rank %d, which "
                   "expects %lld", h->base.members[j], (long long)slots[j].send_counts[i],
                   h->base.members[i], (long long)slots[i].recv_counts[j]);
          break;
        }
  }
  if (why[0]) {
    barrier_sync(h, call);
    return rt_comm_fail(&h->base, call, "%s", why);
  }
  return RT_OK;
}

/* ---- collectives ---- */

static int world_aborted_check(THandle *h, const RtCommCall *call) {
  if (atomic_load(&h->g->w->aborted)) return fail_aborted(h, call, "was not started");
  return RT_OK;
}

static int t_all_reduce(RtComm *c, const RtCommCall *call) {
  THandle *h = (THandle *)c;
  int n = c->size, me = c->rank;
  int64_t count = call->count;
  if (n == 1) {
    if (world_aborted_check(h, call)) return RT_ERR;
    if (count > 0 && call->recv != call->send)
      memcpy(call->recv, call->send, (size_t)count * sizeof(float));
    return RT_OK;
  }
  TSlot *slots;
  if (enter(h, call, &slots)) return RT_ERR;
  if (count <= SMALL_ALL_REDUCE) {
    /* Everyone reduces everything into a private buffer, then writes it. */
    float acc[SMALL_ALL_REDUCE];
    for (int j = 0; j < n; j++) h->srcs[j] = slots[j].send;
    if (count > 0) rt_comm_reduce_ordered(acc, h->srcs, n, count);
    barrier_sync(h, call);
    if (count > 0) memcpy(call->recv, acc, (size_t)count * sizeof(float));
    return RT_OK;
  }
  /* Reduce-scatter into our own output block, then gather the finished blocks. */
  int64_t b, e;
  rt_parallel_chunk(count, n, me, &b, &e);
  for (int j = 0; j < n; j++) h->srcs[j] = slots[j].send + b;
  if (e > b) rt_comm_reduce_ordered(call->recv + b, h->srcs, n, e - b);
  barrier_sync(h, call);
  for (int j = 0; j < n; j++) {
    if (j == me) continue;
    rt_parallel_chunk(count, n, j, &b, &e);
    if (e > b) memcpy(call->recv + b, slots[j].recv + b, (size_t)(e - b) * sizeof(float));
  }
  return barrier_sync(h, call);
}

static int t_all_gather(RtComm *c, const RtCommCall *call) {
  THandle *h = (THandle *)c;
  int n = c->size, me = c->rank;
  TSlot *slots;
  if (enter(h, call, &slots)) return RT_ERR;
  for (int j = 0; j < n; j++) {
    int64_t k = call->counts[j];
    float *dst = k > 0 ? call->recv + call->offsets[j] : NULL;
    if (k > 0 && (j != me || dst != slots[j].send))
      memcpy(dst, slots[j].send, (size_t)k * sizeof(float));
  }
  return barrier_sync(h, call);
}

static int t_reduce_scatter(RtComm *c, const RtCommCall *call) {
  THandle *h = (THandle *)c;
  int n = c->size, me = c->rank;
  TSlot *slots;
  if (enter(h, call, &slots)) return RT_ERR;
  int64_t k = call->counts[me];
  if (k > 0) {
    for (int j = 0; j < n; j++) h->srcs[j] = slots[j].send + call->offsets[me];
    rt_comm_reduce_ordered(call->recv, h->srcs, n, k);
  }
  return barrier_sync(h, call);
}

static int t_broadcast(RtComm *c, const RtCommCall *call) {
  THandle *h = (THandle *)c;
  TSlot *slots;
  if (enter(h, call, &slots)) return RT_ERR;
  if (c->rank != call->peer && call->count > 0)
    memcpy(call->recv, slots[call->peer].recv, (size_t)call->count * sizeof(float));
  return barrier_sync(h, call);
}

static int t_all_to_all(RtComm *c, const RtCommCall *call) {
  THandle *h = (THandle *)c;
  int n = c->size, me = c->rank;
  TSlot *slots;
  if (enter(h, call, &slots)) return RT_ERR;
  for (int j = 0; j < n; j++) {
    int64_t k = call->recv_counts[j];
    if (k > 0)
      memcpy(call->recv + call->recv_displs[j], slots[j].send + slots[j].send_displs[me],
             (size_t)k * sizeof(float));
  }
  return barrier_sync(h, call);
}

static int t_barrier(RtComm *c, const RtCommCall *call) {
  TSlot *slots;
  return enter((THandle *)c, call, &slots);
}

static int t_split(RtComm *c, const RtCommCall *call) {
  THandle *h = (THandle *)c;
  int n = c->size, me = c->rank;
  TSlot *slots;
  if (enter(h, call, &slots)) return RT_ERR;
  int color = call->color;
  int *colors = malloc((size_t)n * 4 * sizeof *colors);
  int pos = 0, m = 0;
  if (colors) {
    int *keys = colors + n, *order = colors + 2 * n, *members = colors + 3 * n;
    for (int j = 0; j < n; j++) colors[j] = slots[j].color, keys[j] = slots[j].key;
    if (color >= 0) m = rt_comm_split_order(n, colors, keys, me, order, &pos);
    /* The first member in order creates the group. */
    if (m > 0 && pos == 0) {
      for (int i = 0; i < m; i++) members[i] = c->members[order[i]];
      slots[me].made = group_new(h->g->w, m, members, call->name, 0);
    }
    barrier_sync(h, call);
    if (m > 0) {
      TGroup *ng = slots[order[0]].made;
      if (ng) *call->out = &ng->handles[pos].base;
    }
  } else {
    barrier_sync(h, call);   /* in step with the others */
  }
  free(colors);
  if (color >= 0 && !*call->out)
    return rt_comm_fail(c, call, "failed: out of memory for the new group");
  return RT_OK;
}

static void t_free(RtComm *c) {
  THandle *h = (THandle *)c;
  if (h->is_world) return;
  stop_worker(h);            /* the front end completed its requests */
  TGroup *g = h->g;
  TWorld *w = g->w;
  pthread_mutex_lock(&w->mu);
  int last = --g->refs == 0;
  if (last)
    for (TGroup **p = &w->groups; *p; p = &(*p)->next)
      if (*p == g) {
        *p = g->next;
        break;
      }
  pthread_mutex_unlock(&w->mu);
  if (last) group_destroy(g);
}

/* ---- point to point ---- */

static int t_send(RtComm *c, const RtCommCall *call) {
  THandle *h = (THandle *)c;
  if (world_aborted_check(h, call)) return RT_ERR;
  TMailbox *b = &h->g->box[call->peer];
  int me = c->rank;
  size_t bytes = (size_t)call->count * sizeof(float);
  pthread_mutex_lock(&b->mu);
  if (b->posted && !b->done && b->src == me && b->tag == call->tag) {
    /* The receiver waits for exactly this (and found no earlier one queued). */
    if (call->count == b->want && bytes) memcpy(b->buf, call->send, bytes);
    b->got = call->count;
    b->done = 1;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    return RT_OK;
  }
  pthread_mutex_unlock(&b->mu);
  TMsg *m = malloc(sizeof *m + bytes);
  if (!m) return rt_comm_fail(c, call, "failed: out of memory buffering the message");
  m->next = NULL;
  m->src = me;
  m->tag = call->tag;
  m->count = call->count;
  if (bytes) memcpy(m->data, call->send, bytes);
  pthread_mutex_lock(&b->mu);
  if (b->posted && !b->done && b->src == me && b->tag == call->tag) {
    /* Posted while we copied: hand the copy over directly. */
    if (call->count == b->want && bytes) memcpy(b->buf, m->data, bytes);
    b->got = call->count;
    b->done = 1;
    free(m);
  } else {
    if (b->tail) b->tail->next = m;
    else b->head = m;
    b->tail = m;
  }
  pthread_cond_broadcast(&b->cv);
  pthread_mutex_unlock(&b->mu);
  return RT_OK;
}

static int t_recv(RtComm *c, const RtCommCall *call) {
  THandle *h = (THandle *)c;
  if (world_aborted_check(h, call)) return RT_ERR;
  TWorld *w = h->g->w;
  TMailbox *b = &h->g->box[c->rank];
  int peer = call->peer, tag = call->tag;
  size_t bytes = (size_t)call->count * sizeof(float);
  pthread_mutex_lock(&b->mu);
  TMsg **pp = &b->head, *prev = NULL;
  for (; *pp; prev = *pp, pp = &(*pp)->next)
    if ((*pp)->src == peer && (*pp)->tag == tag) break;
  if (*pp) {
    TMsg *m = *pp;
    *pp = m->next;
    if (b->tail == m) b->tail = prev;
    pthread_mutex_unlock(&b->mu);
    int64_t got = m->count;
    if (got == call->count && bytes) memcpy(call->recv, m->data, bytes);
    free(m);
    if (got != call->count)
      return rt_comm_fail(c, call, "failed: the message has %lld floats", (long long)got);
    return RT_OK;
  }
  b->posted = 1, b->src = peer, b->tag = tag, b->want = call->count, b->buf = call->recv;
  b->done = 0, b->got = 0;
  enum { DONE, ABORTED, EXITED, TIMEOUT } why = DONE;
  struct timespec ts;
  deadline_ts(call->deadline, &ts);
  int peer_world = c->members[peer];
  int timed_out = 0;
  while (!b->done) {
    if (atomic_load(&w->aborted)) why = ABORTED;
    else if (atomic_load(&w->exited[peer_world])) why = EXITED;
    else if (timed_out) why = TIMEOUT;
    if (why != DONE) break;
    timed_out = pthread_cond_timedwait(&b->cv, &b->mu, &ts) == ETIMEDOUT;
  }
  int64_t got = b->got;
  b->posted = 0;             /* no sender touches buf from here on */
  b->buf = NULL;
  pthread_mutex_unlock(&b->mu);
  switch (why) {
  case DONE:
    if (got != call->count)
      return rt_comm_fail(c, call, "failed: the message has %lld floats", (long long)got);
    return RT_OK;
  case ABORTED:
    return fail_aborted(h, call, "was abandoned");
  case EXITED:
    return rt_comm_fail(c, call, "failed: rank %d returned from its rank_main without "
                        "sending it", peer_world);
  case TIMEOUT:
    return rt_comm_fail(c, call, "timed out after %g s", rt_comm_timeout());
  }
  return RT_ERR;
}

/* ---- non-blocking collectives ---- */

static int run_call(RtComm *c, const RtCommCall *call) {
  switch (call->kind) {
  case RT_COMM_ALL_REDUCE: return t_all_reduce(c, call);
  case RT_COMM_ALL_GATHER: return t_all_gather(c, call);
  case RT_COMM_REDUCE_SCATTER: return t_reduce_scatter(c, call);
  default: return rt_comm_fail(c, call, "failed: no non-blocking form");
  }
}

/* The progress thread: runs the queue's head, marks it complete, and so on, in
 * start order; ends when stopped with an empty queue. */
static void *progress_main(void *arg) {
  THandle *h = arg;
  pthread_mutex_lock(&h->qmu);
  for (;;) {
    while (!h->qhead && !h->stop) pthread_cond_wait(&h->qcv, &h->qmu);
    RtCommPending *p = h->qhead;
    if (!p) break;
    pthread_mutex_unlock(&h->qmu);
    rt_clear_error();
    int rc = run_call(&h->base, &p->call);
    pthread_mutex_lock(&h->qmu);
    p->rc = rc;
    if (rc != RT_OK) snprintf(p->err, sizeof p->err, "%s", rt_last_error());
    p->bstate = 1;           /* complete: finish may return */
    h->qhead = p->qnext;
    if (!h->qhead) h->qtail = NULL;
    pthread_cond_broadcast(&h->qcv);
  }
  pthread_mutex_unlock(&h->qmu);
  return NULL;
}

static int t_start(RtComm *c, RtCommPending *p) {
  THandle *h = (THandle *)c;
  if (world_aborted_check(h, &p->call)) return RT_ERR;
  if (!h->qready) {
    if (pthread_mutex_init(&h->qmu, NULL))
      return rt_comm_fail(c, &p->call, "failed: cannot make the request queue's mutex");
    if (pthread_cond_init(&h->qcv, NULL)) {
      pthread_mutex_destroy(&h->qmu);
      return rt_comm_fail(c, &p->call, "failed: cannot make the request queue's condition");
    }
    h->qready = 1;
  }
  if (!h->worker_on) {
    int e = pthread_create(&h->worker, NULL, progress_main, h);
    if (e)
      return rt_comm_fail(c, &p->call, "failed: cannot start the progress thread: %s",
                          strerror(e));
    h->worker_on = 1;
  }
  p->bstate = 0;
  p->qnext = NULL;
  pthread_mutex_lock(&h->qmu);
  if (h->qtail) h->qtail->qnext = p;
  else h->qhead = p;
  h->qtail = p;
  pthread_cond_broadcast(&h->qcv);
  pthread_mutex_unlock(&h->qmu);
  return RT_OK;
}

/* Returns once the progress thread completed p (it always does: a request waits
 * at most until its deadline at entry, and past entry only copies). */
static void t_finish(RtComm *c, RtCommPending *p) {
  THandle *h = (THandle *)c;
  pthread_mutex_lock(&h->qmu);
  while (p->bstate == 0) pthread_cond_wait(&h->qcv, &h->qmu);
  pthread_mutex_unlock(&h->qmu);
}

/* After rank_main of world rank `rank` returned: waits until the progress threads
 * of its handles have run every request it started. */
static void drain_rank(TWorld *w, int rank) {
  for (;;) {
    THandle *busy = NULL;
    pthread_mutex_lock(&w->mu);
    for (TGroup *g = w->groups; g && !busy; g = g->next)
      for (int i = 0; i < g->size && !busy; i++) {
        THandle *h = &g->handles[i];
        if (h->base.members[i] != rank || !h->worker_on) continue;
        pthread_mutex_lock(&h->qmu);
        if (h->qhead) busy = h;
        pthread_mutex_unlock(&h->qmu);
      }
    pthread_mutex_unlock(&w->mu);
    if (!busy) return;
    /* Our handle holds a reference: its group outlives this wait. */
    pthread_mutex_lock(&busy->qmu);
    while (busy->qhead) pthread_cond_wait(&busy->qcv, &busy->qmu);
    pthread_mutex_unlock(&busy->qmu);
  }
}

static const RtCommOps thread_ops = {
    .backend = "threads",
    .all_reduce = t_all_reduce,
    .all_gather = t_all_gather,
    .reduce_scatter = t_reduce_scatter,
    .broadcast = t_broadcast,
    .all_to_all = t_all_to_all,
    .barrier = t_barrier,
    .split = t_split,
    .send = t_send,
    .recv = t_recv,
    .start = t_start,
    .finish = t_finish,
    .release = NULL,
    .free = t_free,
    .failed = thread_failed,
};

/* ---- launching ---- */

typedef struct {
  TWorld *w;
  int rank;
  int (*fn)(RtComm *, void *);
  void *arg;
  THandle *h;
} TRank;

static void *rank_thread(void *p) {
  TRank *t = p;
  TWorld *w = t->w;
  rt_clear_error();
  int rc = t->fn(&t->h->base, t->arg);
  if (rc != 0) {
    const char *e = rt_last_error();
    char msg[RT_ERR_MAX];
    if (!e[0]) snprintf(msg, sizeof msg, "rank %d: rank_main returned %d", t->rank, rc);
    else if (strncmp(e, "rank ", 5) == 0) snprintf(msg, sizeof msg, "%s", e);
    else snprintf(msg, sizeof msg, "rank %d: %s", t->rank, e);
    world_fail(w, msg);
  }
  drain_rank(w, t->rank);
  pthread_mutex_lock(&w->mu);
  atomic_store(&w->exited[t->rank], 1);
  wake_all_locked(w);
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

int rt_comm_threads_run(int nranks, int (*rank_main)(RtComm *world, void *arg), void *arg) {
  if (nranks < 1 || nranks > RT_COMM_MAX_RANKS)
    return rt_fail("rt_comm_threads_run: %d ranks requested; use 1..%d", nranks,
                   RT_COMM_MAX_RANKS);
  if (!rank_main) return rt_fail("rt_comm_threads_run: NULL rank_main");
  TWorld *w = calloc(1, sizeof *w);
  int *members = malloc((size_t)nranks * sizeof *members);
  TRank *ranks = calloc((size_t)nranks, sizeof *ranks);
  pthread_t *tids = calloc((size_t)nranks, sizeof *tids);
  int ok = w && members && ranks && tids;
  if (ok) {
    w->n = nranks;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    w->spin = cpus > 0 && nranks <= cpus;
    w->exited = calloc((size_t)nranks, sizeof *w->exited);
    ok = w->exited && pthread_mutex_init(&w->mu, NULL) == 0;
  }
  TGroup *g = NULL;
  if (ok) {
    for (int r = 0; r < nranks; r++) members[r] = r, atomic_init(&w->exited[r], 0);
    atomic_init(&w->aborted, 0);
    g = group_new(w, nranks, members, "world", 1);
    ok = g != NULL;
  }
  if (!ok) {
    if (w && w->exited) pthread_mutex_destroy(&w->mu);
    if (w) free(w->exited);
    free(w);
    free(members);
    free(ranks);
    free(tids);
    return rt_fail("rt_comm_threads_run: out of memory for %d ranks", nranks);
  }
  int started = 0;
  for (; started < nranks; started++) {
    TRank *t = &ranks[started];
    *t = (TRank){.w = w, .rank = started, .fn = rank_main, .arg = arg,
                 .h = &g->handles[started]};
    int e = pthread_create(&tids[started], NULL, rank_thread, t);
    if (e) {
      char msg[200];
      snprintf(msg, sizeof msg, "rt_comm_threads_run: could not start the thread of rank %d "
               "of %d: %s", started, nranks, strerror(e));
      world_fail(w, msg);
      break;
    }
  }
  for (int r = 0; r < started; r++) pthread_join(tids[r], NULL);
  int rc = RT_OK;
  if (w->first_err[0]) rc = rt_fail("%s", w->first_err);
  while (w->groups) {
    TGroup *next = w->groups->next;
    group_destroy(w->groups);
    w->groups = next;
  }
  pthread_mutex_destroy(&w->mu);
  free(w->exited);
  free(w);
  free(members);
  free(ranks);
  free(tids);
  return rc;
}
