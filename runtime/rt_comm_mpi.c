/* runtime/rt_comm_mpi.c -- the MPI backend: one process per rank.  See rt_comm.h.
 *
 * Built with MPI (PARC_HAVE_MPI) when CMake finds it; otherwise rt_comm_mpi_init
 * fails with a message saying what to install.
 *
 * Every handle owns two duplicates of its MPI communicator: `coll` carries the
 * collectives' own traffic, `p2p` the user's send / recv, so user tags never meet
 * internal messages.  Nothing blocks inside MPI: every operation is non-blocking
 * (MPI_Isend / MPI_Irecv / MPI_Improbe / MPI_I<collective>) and polled with
 * MPI_Test until the call's deadline.  (rt_comm_split's MPI_Comm_split runs only
 * after a polled all-gather has shown every rank present.)
 *
 * Determinism: sums never go through MPI's reductions (MPI_Allreduce may add in
 * any order, and the order may change with sizes or the algorithm chosen).
 *   reduce_scatter: every rank sends block j of its input straight to rank j
 *     (n - 1 messages out, n - 1 in; each rank sends and receives (n-1)/n of the
 *     data, as in a ring), then adds the n blocks with rt_comm_reduce_ordered, the
 *     thread backend's code, in rank order.
 *   all_reduce: that reduce_scatter over the standard blocks of the buffer, then
 *     MPI_Iallgatherv in place (a copy, so exact).
 * Both backends therefore give the same bits for the same inputs.
 * Counts per message and displacements must fit in an int (2^31 - 1 floats).
 *
 * Non-blocking collectives run the same steps as a state machine per request
 * (MReq), advanced by progress() at every start and wait on the handle:
 *   M_P2P        the reduce_scatter messages in flight (posted at the start);
 *                once all arrived, the rank-ordered sum, as above;
 *   M_NEED_COLL  all_reduce after its sum, all_gather from the start: the
 *                MPI_Iallgatherv is not posted yet;
 *   M_COLL       posted; M_DONE once it completed.
 * MPI requires every rank to post its collectives on `coll` in the same order:
 * a request posts its MPI_Iallgatherv only once every earlier request of the
 * handle that has one posted it (they were started in the same order
 * everywhere).  The point-to-point messages of several requests match in start
 * order too (MPI keeps the order of messages between two ranks with one tag).
 * The front end runs no blocking collective while requests are in flight. */
#define _POSIX_C_SOURCE 200809L
#include "runtime/rt_comm.h"

#include <stdlib.h>

#include "runtime/rt_err.h"

int rt_comm_mpi_launched(void) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                                     "MPI_LOCALNRANKS"};
  for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v) return 1;
  }
  return 0;
}

#ifndef PARC_HAVE_MPI

#define NO_MPI "this libparcrt was built without MPI; install libopenmpi-dev (apt-get install " \
               "libopenmpi-dev openmpi-bin) and rebuild parc"

int rt_comm_mpi_available(void) { return 0; }

int rt_comm_mpi_init(RtComm **world) {
  if (world) *world = NULL;
  return rt_fail("rt_comm_mpi_init: %s", NO_MPI);
}

int rt_comm_mpi_finalize(RtComm *world) {
  (void)world;
  return rt_fail("rt_comm_mpi_finalize: %s", NO_MPI);
}

#else

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "runtime/rt_comm_impl.h"
#include "runtime/rt_pool.h"

#define TAG_RS 1             /* reduce_scatter blocks on `coll` */
#define BUSY_POLLS 2000      /* MPI_Test polls before sleeping between polls */

typedef struct MPending {    /* a buffered send in flight */
  struct MPending *next;
  MPI_Request req;
  float data[];
} MPending;

typedef struct {
  int alive;                 /* a world handle exists */
  int initialised_here;      /* rt_comm_mpi_init called MPI_Init_thread */
  int failed;
  char first_err[RT_ERR_MAX];
  int tag_ub;
} MWorld;

static MWorld mworld;        /* MPI: one world per process */

typedef struct {
  RtComm base;               /* first */
  MPI_Comm coll, p2p;
  int is_world;
  float *scratch;
  int64_t scratch_cap;
  MPI_Request *reqs;         /* 2 * size */
  int *req_peer;             /* 2 * size */
  int *ints;                 /* 4 * size */
  int64_t *blk;              /* 3 * size */
  const float **srcs;        /* size */
  MPending *pending;
  RtCommPending *qhead, *qtail; /* non-blocking requests not complete, start order */
} MComm;

enum { M_P2P, M_NEED_COLL, M_COLL, M_DONE };

typedef struct {             /* a non-blocking request's MPI state (RtCommPending.bdata) */
  int nreq;
  MPI_Request *reqs;         /* nreq point-to-point requests (M_P2P) */
  int *peers;                /* the group rank each waits on */
  MPI_Request coll;          /* M_COLL */
  float *tmp;                /* the other ranks' blocks, (n - 1) * counts[me] floats */
  int64_t *counts, *offsets; /* all_reduce: the standard blocks of the buffer */
  int *ic, *io;              /* MPI_Iallgatherv's counts and displacements */
  float dummy;               /* a valid address for empty buffers */
} MReq;

static const RtCommOps mpi_ops;

static void mpi_failed(RtComm *c, const char *msg) {
  (void)c;
  if (!mworld.failed) snprintf(mworld.first_err, sizeof mworld.first_err, "%s", msg);
  mworld.failed = 1;
}

static int mpi_fail(MComm *m, const RtCommCall *call, const char *what, int rc) {
  char s[MPI_MAX_ERROR_STRING + 1];
  int len = 0;
  if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) len = 0;
  s[len] = '\0';
  return rt_comm_fail(&m->base, call, "failed: %s: %s", what, len ? s : "MPI error");
}

#define MPI_TRY(m, call, what, expr)                  \
  do {                                                \
    int rc_ = (expr);                                 \
    if (rc_ != MPI_SUCCESS) return mpi_fail(m, call, what, rc_); \
  } while (0)

static void nap(long ns) {
  struct timespec ts = {0, ns};
  nanosleep(&ts, NULL);
}

static int entry(MComm *m, const RtCommCall *call) {
  if (mworld.failed)
    return rt_comm_fail(&m->base, call, "was not started because of an earlier failure: %s",
                        mworld.first_err);
  return RT_OK;
}

static int fits_int(MComm *m, const RtCommCall *call, int64_t v, const char *what) {
  if (v > INT_MAX)
    return rt_comm_fail(&m->base, call, "failed: %s of %lld floats is more than the MPI "
                        "backend's limit of %d", what, (long long)v, INT_MAX);
  return RT_OK;
}

/* Frees the buffers of finished sends. */
static int progress_sends(MComm *m, const RtCommCall *call) {
  for (MPending **p = &m->pending; *p;) {
    int done = 0;
    MPI_TRY(m, call, "MPI_Test of an earlier send", MPI_Test(&(*p)->req, &done, MPI_STATUS_IGNORE));
    if (done) {
      MPending *f = *p;
      *p = f->next;
      free(f);
    } else {
      p = &(*p)->next;
    }
  }
  return RT_OK;
}

/* Polls reqs[0..n) until all complete or the deadline passes.  peers[i] is the
 * group rank request i waits on, or -1 for a collective request. */
static int wait_all(MComm *m, const RtCommCall *call, int n, MPI_Request *reqs, const int *peers) {
  for (long polls = 0;; polls++) {
    int open = -1;
    for (int i = 0; i < n; i++) {
      if (reqs[i] == MPI_REQUEST_NULL) continue;
      int done = 0;
      MPI_TRY(m, call, "MPI_Test", MPI_Test(&reqs[i], &done, MPI_STATUS_IGNORE));
      if (!done && open < 0) open = i;
    }
    if (open < 0) return RT_OK;
    if (rt_comm_now() > call->deadline) {
      int p = peers ? peers[open] : -1;
      if (p >= 0)
        return rt_comm_fail(&m->base, call, "timed out after %g s waiting for rank %d",
                            rt_comm_timeout(), m->base.members[p]);
      return rt_comm_fail(&m->base, call, "timed out after %g s waiting for the other ranks",
                          rt_comm_timeout());
    }
    if (polls > BUSY_POLLS) nap(20000);
  }
}

static int wait_one(MComm *m, const RtCommCall *call, MPI_Request *req) {
  return wait_all(m, call, 1, req, NULL);
}

static float *scratch(MComm *m, int64_t floats) {
  if (floats <= m->scratch_cap) return m->scratch;
  float *p = realloc(m->scratch, (size_t)floats * sizeof *p);
  if (!p) return NULL;
  m->scratch = p;
  m->scratch_cap = floats;
  return p;
}

/* ---- handles ---- */

static MComm *mcomm_new(MPI_Comm coll, MPI_Comm p2p, int rank, int size, const int *members,
                        const char *name) {
  MComm *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  m->coll = coll;
  m->p2p = p2p;
  m->reqs = malloc((size_t)size * 2 * sizeof *m->reqs);
  m->req_peer = malloc((size_t)size * 2 * sizeof *m->req_peer);
  m->ints = malloc((size_t)size * 4 * sizeof *m->ints);
  m->blk = malloc((size_t)size * 3 * sizeof *m->blk);
  m->srcs = malloc((size_t)size * sizeof *m->srcs);
  if (!m->reqs || !m->req_peer || !m->ints || !m->blk || !m->srcs ||
      rt_comm_init_base(&m->base, &mpi_ops, rank, size, members, name)) {
    free(m->reqs);
    free(m->req_peer);
    free(m->ints);
    free(m->blk);
    free(m->srcs);
    free(m);
    return NULL;
  }
  return m;
}

/* Frees m; after a failure only memory MPI cannot still write to. */
static int mcomm_destroy(MComm *m, const RtCommCall *call) {
  int rc = RT_OK;
  if (!mworld.failed) {
    /* Sends still in flight must finish before their buffers go. */
    MPending *p = m->pending;
    while (p && rc == RT_OK) {
      rc = wait_one(m, call, &p->req);
      if (rc == RT_OK) {
        MPending *f = p;
        p = p->next;
        m->pending = p;
        free(f);
      }
    }
  }
  if (mworld.failed || rc != RT_OK) return RT_ERR;  /* leaks what MPI may touch */
  MPI_Comm_free(&m->coll);
  MPI_Comm_free(&m->p2p);
  rt_comm_free_base(&m->base);
  free(m->scratch);
  free(m->reqs);
  free(m->req_peer);
  free(m->ints);
  free(m->blk);
  free(m->srcs);
  free(m);
  return RT_OK;
}

static void m_free(RtComm *c) {
  MComm *m = (MComm *)c;
  if (m->is_world) return;
  RtCommCall call = {.kind = RT_COMM_BARRIER, .deadline = rt_comm_now() + rt_comm_timeout()};
  mcomm_destroy(m, &call);
}

int rt_comm_mpi_available(void) { return 1; }

int rt_comm_mpi_init(RtComm **world) {
  if (!world) return rt_fail("rt_comm_mpi_init: NULL world pointer");
  *world = NULL;
  if (mworld.alive)
    return rt_fail("rt_comm_mpi_init: the MPI world is initialised already; call "
                   "rt_comm_mpi_finalize first");
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (finalized) return rt_fail("rt_comm_mpi_init: MPI was finalised already in this process");
  int initialised_here = 0;
  if (!inited) {
    int provided = 0;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
      return rt_fail("rt_comm_mpi_init: MPI_Init_thread failed");
    initialised_here = 1;
  }
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm coll, p2p;
  if (MPI_Comm_dup(MPI_COMM_WORLD, &coll) != MPI_SUCCESS ||
      MPI_Comm_dup(MPI_COMM_WORLD, &p2p) != MPI_SUCCESS)
    return rt_fail("rt_comm_mpi_init: MPI_Comm_dup failed");
  MPI_Comm_set_errhandler(coll, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(p2p, MPI_ERRORS_RETURN);
  int *members = malloc((size_t)size * sizeof *members);
  MComm *m = NULL;
  if (members) {
    for (int r = 0; r < size; r++) members[r] = r;
    m = mcomm_new(coll, p2p, rank, size, members, "world");
  }
  free(members);
  if (!m) return rt_fail("rt_comm_mpi_init: out of memory for %d ranks", size);
  m->is_world = 1;
  void *ub = NULL;
  int flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
  memset(&mworld, 0, sizeof mworld);
  mworld.tag_ub = flag && ub ? *(int *)ub : 32767;
  mworld.alive = 1;
  mworld.initialised_here = initialised_here;
  *world = &m->base;
  return RT_OK;
}

int rt_comm_mpi_finalize(RtComm *world) {
  if (!world || world->ops != &mpi_ops || !((MComm *)world)->is_world)
    return rt_fail("rt_comm_mpi_finalize: not the MPI world communicator");
  rt_comm_complete(world);   /* requests never waited for */
  if (mworld.failed)
    return rt_fail("rt_comm_mpi_finalize: not finalising MPI after a failed call (%s); exit "
                   "with a nonzero status and mpirun stops every rank", mworld.first_err);
  RtCommCall call = {.kind = RT_COMM_BARRIER, .deadline = rt_comm_now() + rt_comm_timeout()};
  MComm *m = (MComm *)world;
  if (mcomm_destroy(m, &call)) return RT_ERR;
  mworld.alive = 0;
  if (mworld.initialised_here && MPI_Finalize() != MPI_SUCCESS)
    return rt_fail("rt_comm_mpi_finalize: MPI_Finalize failed");
  return RT_OK;
}

/* ---- collectives ---- */

/* Rank-ordered sum, over every rank's send, of this rank's block (counts[me]
 * floats at offsets[me]) into out: blocks go straight to their owner. */
static int reduce_blocks(MComm *m, const RtCommCall *call, const float *send, float *out,
                         const int64_t *counts, const int64_t *offsets) {
  int n = m->base.size, me = m->base.rank;
  int64_t k = counts[me];
  for (int j = 0; j < n; j++)
    if (fits_int(m, call, counts[j], "a block")) return RT_ERR;
  float *tmp = scratch(m, (int64_t)(n - 1) * k);
  if (!tmp && (n - 1) * k > 0)
    return rt_comm_fail(&m->base, call, "failed: out of memory for %lld floats of scratch",
                        (long long)((n - 1) * k));
  int nreq = 0;
  for (int j = 0; j < n; j++) {
    if (j == me || k == 0) continue;
    float *slot = tmp + (int64_t)(j < me ? j : j - 1) * k;
    m->req_peer[nreq] = j;
    MPI_TRY(m, call, "MPI_Irecv", MPI_Irecv(slot, (int)k, MPI_FLOAT, j, TAG_RS, m->coll,
                                              &m->reqs[nreq++]));
  }
  for (int j = 0; j < n; j++) {
    if (j == me || counts[j] == 0) continue;
    m->req_peer[nreq] = j;
    MPI_TRY(m, call, "MPI_Isend", MPI_Isend(send + offsets[j], (int)counts[j], MPI_FLOAT, j,
                                              TAG_RS, m->coll, &m->reqs[nreq++]));
  }
  if (wait_all(m, call, nreq, m->reqs, m->req_peer)) return RT_ERR;
  if (k > 0) {
    for (int j = 0; j < n; j++)
      m->srcs[j] = j == me ? send + offsets[me] : tmp + (int64_t)(j < me ? j : j - 1) * k;
    rt_comm_reduce_ordered(out, m->srcs, n, k);
  }
  return RT_OK;
}

/* counts / offsets (int64) to MPI's ints. */
static int to_ints(MComm *m, const RtCommCall *call, const int64_t *counts,
                   const int64_t *offsets, int *ic, int *io) {
  for (int j = 0; j < m->base.size; j++) {
    if (fits_int(m, call, counts[j], "a block") ||
        fits_int(m, call, offsets[j], "a displacement"))
      return RT_ERR;
    ic[j] = (int)counts[j];
    io[j] = (int)offsets[j];
  }
  return RT_OK;
}

static int m_all_reduce(RtComm *c, const RtCommCall *call) {
  MComm *m = (MComm *)c;
  if (entry(m, call) || progress_sends(m, call)) return RT_ERR;
  int n = c->size, me = c->rank;
  int64_t *counts = m->blk, *offsets = m->blk + n;
  for (int j = 0; j < n; j++) {
    int64_t b, e;
    rt_parallel_chunk(call->count, n, j, &b, &e);
    counts[j] = e - b;
    offsets[j] = b;
  }
  float dummy = 0;
  float *recv = call->count > 0 ? call->recv : &dummy;
  if (reduce_blocks(m, call, call->send, recv + offsets[me], counts, offsets)) return RT_ERR;
  if (n == 1) return RT_OK;
  int *ic = m->ints, *io = m->ints + n;
  if (to_ints(m, call, counts, offsets, ic, io)) return RT_ERR;
  MPI_Request req;
  MPI_TRY(m, call, "MPI_Iallgatherv", MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv,
                                                       ic, io, MPI_FLOAT, m->coll, &req));
  return wait_one(m, call, &req);
}

static int m_reduce_scatter(RtComm *c, const RtCommCall *call) {
  MComm *m = (MComm *)c;
  if (entry(m, call) || progress_sends(m, call)) return RT_ERR;
  return reduce_blocks(m, call, call->send, call->recv, call->counts, call->offsets);
}

static int m_all_gather(RtComm *c, const RtCommCall *call) {
  MComm *m = (MComm *)c;
  if (entry(m, call) || progress_sends(m, call)) return RT_ERR;
  int n = c->size, me = c->rank;
  int *ic = m->ints, *io = m->ints + n;
  if (to_ints(m, call, call->counts, call->offsets, ic, io)) return RT_ERR;
  if (fits_int(m, call, call->count, "the gathered buffer")) return RT_ERR;
  float dummy = 0;
  float *recv = call->count > 0 ? call->recv : &dummy;
  int64_t mine = call->counts[me];
  const void *send = mine > 0 && call->send == recv + call->offsets[me] ? MPI_IN_PLACE
                     : mine > 0                                       ? (const void *)call->send
                                                                      : (const void *)&dummy;
  MPI_Request req;
  MPI_TRY(m, call, "MPI_Iallgatherv", MPI_Iallgatherv(send, (int)mine, MPI_FLOAT, recv, ic, io,
                                                       MPI_FLOAT, m->coll, &req));
  return wait_one(m, call, &req);
}

static int m_broadcast(RtComm *c, const RtCommCall *call) {
  MComm *m = (MComm *)c;
  if (entry(m, call) || progress_sends(m, call)) return RT_ERR;
  if (fits_int(m, call, call->count, "a broadcast")) return RT_ERR;
  float dummy = 0;
  MPI_Request req;
  MPI_TRY(m, call, "MPI_Ibcast", MPI_Ibcast(call->count > 0 ? call->recv : &dummy,
                                             (int)call->count, MPI_FLOAT, call->peer, m->coll,
                                             &req));
  return wait_one(m, call, &req);
}

static int m_all_to_all(RtComm *c, const RtCommCall *call) {
  MComm *m = (MComm *)c;
  if (entry(m, call) || progress_sends(m, call)) return RT_ERR;
  int n = c->size;
  /* What each peer will send here, checked against what this rank expects. */
  int64_t *incoming = m->blk;
  MPI_Request req;
  MPI_TRY(m, call, "MPI_Ialltoall", MPI_Ialltoall(call->send_counts, 1, MPI_INT64_T, incoming, 1,
                                                   MPI_INT64_T, m->coll, &req));
  if (wait_one(m, call, &req)) return RT_ERR;
  for (int j = 0; j < n; j++)
    if (incoming[j] != call->recv_counts[j])
      return rt_comm_fail(c, call, "failed: rank %d sends %lld floats to rank %d, which expects "
                          "%lld", c->members[j], (long long)incoming[j],
                          c->members[c->rank], (long long)call->recv_counts[j]);
  int *sc = m->ints, *sd = m->ints + n, *rc = m->ints + 2 * n, *rd = m->ints + 3 * n;
  if (to_ints(m, call, call->send_counts, call->send_displs, sc, sd) ||
      to_ints(m, call, call->recv_counts, call->recv_displs, rc, rd))
    return RT_ERR;
  float dummy[2] = {0, 0};
  MPI_TRY(m, call, "MPI_Ialltoallv",
          MPI_Ialltoallv(call->count > 0 ? call->send : dummy, sc, sd, MPI_FLOAT,
                         call->count2 > 0 ? call->recv : dummy + 1, rc, rd, MPI_FLOAT, m->coll,
                         &req));
  return wait_one(m, call, &req);
}

static int m_barrier(RtComm *c, const RtCommCall *call) {
  MComm *m = (MComm *)c;
  if (entry(m, call) || progress_sends(m, call)) return RT_ERR;
  MPI_Request req;
  MPI_TRY(m, call, "MPI_Ibarrier", MPI_Ibarrier(m->coll, &req));
  return wait_one(m, call, &req);
}

static int m_split(RtComm *c, const RtCommCall *call) {
  MComm *m = (MComm *)c;
  if (entry(m, call) || progress_sends(m, call)) return RT_ERR;
  int n = c->size, me = c->rank;
  int *all = malloc((size_t)n * 6 * sizeof *all);
  if (!all) return rt_comm_fail(c, call, "failed: out of memory");
  int *colors = all + 3 * n, *keys = all + 4 * n, *order = all + 5 * n;
  int mine[3] = {call->color, call->key, c->members[me]};
  MPI_Request req;
  int rc = MPI_Iallgather(mine, 3, MPI_INT, all, 3, MPI_INT, m->coll, &req);
  if (rc != MPI_SUCCESS) {
    free(all);
    return mpi_fail(m, call, "MPI_Iallgather", rc);
  }
  if (wait_one(m, call, &req)) {
    free(all);
    return RT_ERR;
  }
  for (int j = 0; j < n; j++) colors[j] = all[3 * j], keys[j] = all[3 * j + 1];
  int pos = 0, size = 0;
  if (call->color >= 0) size = rt_comm_split_order(n, colors, keys, me, order, &pos);
  for (int i = 0; i < size; i++) order[i] = all[3 * order[i] + 2];  /* world ranks */
  /* Everyone is here (the all-gather completed), so these cannot hang. */
  int color = call->color >= 0 ? call->color : MPI_UNDEFINED;
  MPI_Comm coll = MPI_COMM_NULL, p2p = MPI_COMM_NULL;
  rc = MPI_Comm_split(m->coll, color, call->key, &coll);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_split(m->p2p, color, call->key, &p2p);
  if (rc != MPI_SUCCESS) {
    free(all);
    return mpi_fail(m, call, "MPI_Comm_split", rc);
  }
  if (call->color < 0) {
    free(all);
    return RT_OK;
  }
  int mpi_rank = -1;
  MPI_Comm_rank(coll, &mpi_rank);
  MComm *g = size > 0 && mpi_rank == pos ? mcomm_new(coll, p2p, pos, size, order, call->name)
                                         : NULL;
  free(all);
  if (!g) {
    MPI_Comm_free(&coll);
    MPI_Comm_free(&p2p);
    return rt_comm_fail(c, call, mpi_rank != pos ? "failed: MPI ordered the group differently"
                                                 : "failed: out of memory for the new group");
  }
  *call->out = &g->base;
  return RT_OK;
}

/* ---- point to point ---- */

/* What send and recv check first: the call, the sends still in flight, a count
 * MPI can take and a tag below MPI's limit. */
static int p2p_entry(MComm *m, const RtCommCall *call) {
  if (entry(m, call) || progress_sends(m, call)) return RT_ERR;
  if (fits_int(m, call, call->count, "a message")) return RT_ERR;
  if (call->tag > mworld.tag_ub)
    return rt_comm_fail(&m->base, call, "failed: tag %d is above MPI's limit %d", call->tag,
                        mworld.tag_ub);
  return RT_OK;
}

static int m_send(RtComm *c, const RtCommCall *call) {
  MComm *m = (MComm *)c;
  if (p2p_entry(m, call)) return RT_ERR;
  size_t bytes = (size_t)call->count * sizeof(float);
  MPending *p = malloc(sizeof *p + bytes);
  if (!p) return rt_comm_fail(c, call, "failed: out of memory buffering the message");
  if (bytes) memcpy(p->data, call->send, bytes);
  int rc = MPI_Isend(p->data, (int)call->count, MPI_FLOAT, call->peer, call->tag, m->p2p,
                     &p->req);
  if (rc != MPI_SUCCESS) {
    free(p);
    return mpi_fail(m, call, "MPI_Isend", rc);
  }
  p->next = m->pending;
  m->pending = p;
  return RT_OK;
}

static int m_recv(RtComm *c, const RtCommCall *call) {
  MComm *m = (MComm *)c;
  if (p2p_entry(m, call)) return RT_ERR;
  MPI_Message msg;
  MPI_Status st;
  for (long polls = 0;; polls++) {
    int found = 0;
    MPI_TRY(m, call, "MPI_Improbe", MPI_Improbe(call->peer, call->tag, m->p2p, &found, &msg, &st));
    if (found) break;
    if (progress_sends(m, call)) return RT_ERR;
    if (rt_comm_now() > call->deadline)
      return rt_comm_fail(c, call, "timed out after %g s", rt_comm_timeout());
    if (polls > BUSY_POLLS) nap(20000);
  }
  int got = 0;
  MPI_TRY(m, call, "MPI_Get_count", MPI_Get_count(&st, MPI_FLOAT, &got));
  if (got != call->count)
    return rt_comm_fail(c, call, "failed: the message has %d floats", got);
  float dummy = 0;
  MPI_TRY(m, call, "MPI_Mrecv", MPI_Mrecv(call->count > 0 ? call->recv : &dummy, got, MPI_FLOAT,
                                           &msg, MPI_STATUS_IGNORE));
  return RT_OK;
}

/* ---- non-blocking collectives ---- */

static void mreq_free(MReq *q) {
  if (!q) return;
  free(q->reqs);
  free(q->peers);
  free(q->tmp);
  free(q->counts);
  free(q->ic);
  free(q);
}

/* Completes p with the current error (rt_comm_fail wrote it). */
static void m_req_failed(RtCommPending *p) {
  p->rc = RT_ERR;
  snprintf(p->err, sizeof p->err, "%s", rt_last_error());
  p->bstate = M_DONE;
}

/* Posts this rank's reduce_scatter messages of p's blocks (counts / offsets). */
static int post_blocks(MComm *m, RtCommPending *p, MReq *q, const int64_t *counts,
                       const int64_t *offsets) {
  const RtCommCall *call = &p->call;
  int n = m->base.size, me = m->base.rank;
  int64_t k = counts[me];
  for (int j = 0; j < n; j++)
    if (fits_int(m, call, counts[j], "a block")) return RT_ERR;
  if ((n - 1) * k > 0 && !(q->tmp = malloc((size_t)((n - 1) * k) * sizeof(float))))
    return rt_comm_fail(&m->base, call, "failed: out of memory for %lld floats of scratch",
                        (long long)((n - 1) * k));
  for (int j = 0; j < n; j++) {
    if (j == me || k == 0) continue;
    q->peers[q->nreq] = j;
    MPI_TRY(m, call, "MPI_Irecv", MPI_Irecv(q->tmp + (int64_t)(j < me ? j : j - 1) * k, (int)k,
                                              MPI_FLOAT, j, TAG_RS, m->coll, &q->reqs[q->nreq++]));
  }
  for (int j = 0; j < n; j++) {
    if (j == me || counts[j] == 0) continue;
    q->peers[q->nreq] = j;
    MPI_TRY(m, call, "MPI_Isend", MPI_Isend(call->send + offsets[j], (int)counts[j], MPI_FLOAT,
                                              j, TAG_RS, m->coll, &q->reqs[q->nreq++]));
  }
  return RT_OK;
}

static void progress(MComm *m);

static int m_start(RtComm *c, RtCommPending *p) {
  MComm *m = (MComm *)c;
  const RtCommCall *call = &p->call;
  if (entry(m, call) || progress_sends(m, call)) return RT_ERR;
  int n = c->size;
  MReq *q = calloc(1, sizeof *q);
  if (q) p->bdata = q;       /* release frees it, whatever happens next */
  if (!q || !(q->reqs = malloc((size_t)n * 2 * sizeof *q->reqs)) ||
      !(q->peers = malloc((size_t)n * 2 * sizeof *q->peers)) ||
      !(q->counts = malloc((size_t)n * 2 * sizeof *q->counts)) ||
      !(q->ic = malloc((size_t)n * 2 * sizeof *q->ic)))
    return rt_comm_fail(c, call, "failed: out of memory for the request");
  q->offsets = q->counts + n;
  q->coll = MPI_REQUEST_NULL;
  p->bstate = M_NEED_COLL;
  if (call->kind == RT_COMM_ALL_REDUCE) {
    for (int j = 0; j < n; j++) {
      int64_t b, e;
      rt_parallel_chunk(call->count, n, j, &b, &e);
      q->counts[j] = e - b;
      q->offsets[j] = b;
    }
    if (to_ints(m, call, q->counts, q->offsets, q->ic, q->ic + n) ||
        post_blocks(m, p, q, q->counts, q->offsets))
      return RT_ERR;
    p->bstate = M_P2P;
  } else if (call->kind == RT_COMM_REDUCE_SCATTER) {
    if (post_blocks(m, p, q, call->counts, call->offsets)) return RT_ERR;
    p->bstate = M_P2P;
  } else if (call->kind == RT_COMM_ALL_GATHER) {
    if (to_ints(m, call, call->counts, call->offsets, q->ic, q->ic + n) ||
        fits_int(m, call, call->count, "the gathered buffer"))
      return RT_ERR;
  } else {
    return rt_comm_fail(c, call, "failed: no non-blocking form");
  }
  p->qnext = NULL;
  if (m->qtail) m->qtail->qnext = p;
  else m->qhead = p;
  m->qtail = p;
  progress(m);               /* the earlier requests move on too */
  return RT_OK;
}

/* Posts p's MPI_Iallgatherv (its turn has come). */
static int post_coll(MComm *m, RtCommPending *p, MReq *q) {
  const RtCommCall *call = &p->call;
  int n = m->base.size, me = m->base.rank;
  if (call->kind == RT_COMM_ALL_REDUCE) {
    float *recv = call->count > 0 ? call->recv : &q->dummy;
    MPI_TRY(m, call, "MPI_Iallgatherv", MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL,
                                                         recv, q->ic, q->ic + n, MPI_FLOAT,
                                                         m->coll, &q->coll));
    return RT_OK;
  }
  float *recv = call->count > 0 ? call->recv : &q->dummy;
  int64_t mine = call->counts[me];
  const void *send = mine > 0 && call->send == recv + call->offsets[me] ? MPI_IN_PLACE
                     : mine > 0                                       ? (const void *)call->send
                                                                      : (const void *)&q->dummy;
  MPI_TRY(m, call, "MPI_Iallgatherv", MPI_Iallgatherv(send, (int)mine, MPI_FLOAT, recv, q->ic,
                                                       q->ic + n, MPI_FLOAT, m->coll, &q->coll));
  return RT_OK;
}

/* Advances p as far as it goes without waiting; coll_turn: every earlier request
 * has posted its collective (or has none).  RT_ERR after completing p with a
 * failure. */
static int advance(MComm *m, RtCommPending *p, int coll_turn) {
  MReq *q = p->bdata;
  const RtCommCall *call = &p->call;
  int n = m->base.size, me = m->base.rank;
  if (p->bstate == M_P2P) {
    int done = 1;            /* one by one: finished ones become MPI_REQUEST_NULL, so
                                that a timeout names a rank still missing */
    for (int i = 0; i < q->nreq; i++) {
      if (q->reqs[i] == MPI_REQUEST_NULL) continue;
      int ok = 0, rc = MPI_Test(&q->reqs[i], &ok, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        mpi_fail(m, call, "MPI_Test", rc);
        m_req_failed(p);
        return RT_ERR;
      }
      done &= ok;
    }
    if (!done) return RT_OK;
    /* Every block arrived: the rank-ordered sum, as reduce_blocks adds it. */
    int all = call->kind == RT_COMM_ALL_REDUCE;
    const int64_t *counts = all ? q->counts : call->counts;
    const int64_t *offsets = all ? q->offsets : call->offsets;
    int64_t k = counts[me];
    if (k > 0) {
      float *out = all ? call->recv + offsets[me] : call->recv;
      for (int j = 0; j < n; j++)
        m->srcs[j] = j == me ? call->send + offsets[me] : q->tmp + (int64_t)(j < me ? j : j - 1) * k;
      rt_comm_reduce_ordered(out, m->srcs, n, k);
    }
    p->bstate = all && n > 1 ? M_NEED_COLL : M_DONE;
  }
  if (p->bstate == M_NEED_COLL && coll_turn) {
    if (post_coll(m, p, q)) {
      m_req_failed(p);
      return RT_ERR;
    }
    p->bstate = M_COLL;
  }
  if (p->bstate == M_COLL) {
    int done = 0;
    int rc = MPI_Test(&q->coll, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      mpi_fail(m, call, "MPI_Test", rc);
      m_req_failed(p);
      return RT_ERR;
    }
    if (done) p->bstate = M_DONE;
  }
  return RT_OK;
}

/* Advances every request of m in start order; complete ones leave the queue
 * (p->rc set).  After a failure of the world the rest fail at once. */
static void progress(MComm *m) {
  int coll_turn = 1;
  for (RtCommPending **pp = &m->qhead; *pp;) {
    RtCommPending *p = *pp;
    if (p->bstate != M_DONE) {
      if (mworld.failed) {
        rt_comm_fail(&m->base, &p->call, "was abandoned because of an earlier failure: %s",
                     mworld.first_err);
        m_req_failed(p);
      } else {
        advance(m, p, coll_turn);
      }
    }
    if (p->bstate == M_DONE) {
      *pp = p->qnext;        /* p->rc is RT_OK unless m_req_failed set it */
      p->qnext = NULL;
      continue;
    }
    if (p->bstate == M_P2P ? p->call.kind == RT_COMM_ALL_REDUCE : p->bstate == M_NEED_COLL)
      coll_turn = 0;         /* it will post a collective later: the rest wait for it */
    pp = &p->qnext;
  }
  m->qtail = NULL;
  for (RtCommPending *p = m->qhead; p; p = p->qnext) m->qtail = p;
}

static int m_in_queue(const MComm *m, const RtCommPending *p) {
  for (const RtCommPending *x = m->qhead; x; x = x->qnext)
    if (x == p) return 1;
  return 0;
}

static void m_finish(RtComm *c, RtCommPending *p) {
  MComm *m = (MComm *)c;
  for (long polls = 0;; polls++) {
    progress(m);
    if (!m_in_queue(m, p)) return;
    if (rt_comm_now() > p->call.deadline) {
      MReq *q = p->bdata;
      int open = -1;
      for (int i = 0; p->bstate == M_P2P && i < q->nreq && open < 0; i++)
        if (q->reqs[i] != MPI_REQUEST_NULL) open = q->peers[i];
      if (open >= 0)
        rt_comm_fail(c, &p->call, "timed out after %g s waiting for rank %d", rt_comm_timeout(),
                     c->members[open]);
      else
        rt_comm_fail(c, &p->call, "timed out after %g s waiting for the other ranks",
                     rt_comm_timeout());
      m_req_failed(p);
      progress(m);           /* fails the rest and takes p out of the queue */
      return;
    }
    if (polls > BUSY_POLLS) nap(20000);
  }
}

/* A request's buffers go only when MPI can no longer write to them. */
static void m_release(RtComm *c, RtCommPending *p) {
  (void)c;
  if (p->rc == RT_OK && p->bstate == M_DONE) mreq_free(p->bdata);
  p->bdata = NULL;
}

static const RtCommOps mpi_ops = {
    .backend = "mpi",
    .all_reduce = m_all_reduce,
    .all_gather = m_all_gather,
    .reduce_scatter = m_reduce_scatter,
    .broadcast = m_broadcast,
    .all_to_all = m_all_to_all,
    .barrier = m_barrier,
    .split = m_split,
    .send = m_send,
    .recv = m_recv,
    .start = m_start,
    .finish = m_finish,
    .release = m_release,
    .free = m_free,
    .failed = mpi_failed,
};

#endif
