/* runtime/rt_comm_impl.h -- what the communicator front end (rt_comm.c) shares with
 * its backends (rt_comm_threads.c, rt_comm_mpi.c).  Not for generated code.
 *
 * The front end validates every call's arguments, fills an RtCommCall (with its
 * deadline) and passes it to the backend through RtCommOps.  Backends report
 * failures with rt_comm_fail, which writes the one-line message and tells the
 * backend (ops->failed) so that it can abort the world. */
#ifndef PARC_RT_COMM_IMPL_H
#define PARC_RT_COMM_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/rt_comm.h"
#include "runtime/rt_err.h"

/* grep RtCommKind if you change this enum: rt_comm_op_name lists the names. */
typedef enum {
  RT_COMM_ALL_REDUCE,
  RT_COMM_ALL_GATHER,
  RT_COMM_REDUCE_SCATTER,
  RT_COMM_BROADCAST,
  RT_COMM_ALL_TO_ALL,
  RT_COMM_BARRIER,
  RT_COMM_SPLIT,
  RT_COMM_SEND,
  RT_COMM_RECV,
  RT_COMM_NKINDS
} RtCommKind;

/* One validated call.  Which fields mean something depends on kind. */
typedef struct {
  RtCommKind kind;
  const float *send;         /* all_reduce, all_gather, reduce_scatter, all_to_all, send */
  float *recv;               /* all_reduce, all_gather, reduce_scatter, all_to_all, recv,
                                broadcast (its buffer) */
  int64_t count;             /* all_reduce, broadcast, send, recv: floats;
                                all_gather / reduce_scatter: the total;
                                all_to_all: floats this rank sends */
  int64_t count2;            /* all_to_all: floats this rank receives */
  const int64_t *counts;     /* all_gather, reduce_scatter: per rank */
  const int64_t *offsets;    /* all_gather, reduce_scatter: block starts (front end) */
  const int64_t *send_counts, *send_displs, *recv_counts, *recv_displs; /* all_to_all;
                                displacements filled in by the front end */
  int peer;                  /* broadcast: root; send / recv: peer (ranks of the group) */
  int tag;                   /* send / recv */
  int color, key;            /* split */
  const char *name;          /* split */
  RtComm **out;              /* split */
  double deadline;           /* rt_comm_now() seconds */
} RtCommCall;

typedef struct {
  const char *backend;
  int (*all_reduce)(RtComm *c, const RtCommCall *call);
  int (*all_gather)(RtComm *c, const RtCommCall *call);
  int (*reduce_scatter)(RtComm *c, const RtCommCall *call);
  int (*broadcast)(RtComm *c, const RtCommCall *call);
  int (*all_to_all)(RtComm *c, const RtCommCall *call);
  int (*barrier)(RtComm *c, const RtCommCall *call);
  int (*split)(RtComm *c, const RtCommCall *call);
  int (*send)(RtComm *c, const RtCommCall *call);
  int (*recv)(RtComm *c, const RtCommCall *call);
  /* Non-blocking collectives (rt_comm.h).  start queues p (all_reduce, all_gather
   * or reduce_scatter; p->call validated, deadline set) behind c's earlier requests
   * and returns at once; RT_ERR (message set) only when it could not queue it.
   * finish blocks until p is complete and sets p->rc and, on failure, p->err; it
   * is called once per request, from c's owner thread.  release frees p->bdata
   * (NULL: nothing to free); p itself is the front end's. */
  int (*start)(RtComm *c, RtCommPending *p);
  void (*finish)(RtComm *c, RtCommPending *p);
  void (*release)(RtComm *c, RtCommPending *p);
  void (*free)(RtComm *c);
  /* A call on c failed with `msg` (already in rt_last_error()). */
  void (*failed)(RtComm *c, const char *msg);
} RtCommOps;

/* A non-blocking collective from its start to its wait (rt_comm.h RtCommReq). */
struct RtCommPending {
  RtComm *c;
  RtCommCall call;           /* counts / offsets point into arrays[] */
  RtCommPending *next;       /* c's requests not yet waited for, in start order
                                (front end; owner thread only) */
  RtCommPending *qnext;      /* the backend's queue */
  int finished;              /* front end: ops->finish has returned */
  int rc;                    /* backend: RT_OK or RT_ERR once complete */
  char err[RT_ERR_MAX];      /* backend: the one-line message when rc != RT_OK */
  int bstate;                /* backend: progress (0 at start) */
  void *bdata;               /* backend: its state (ops->release frees it) */
  int64_t arrays[];          /* all_gather, reduce_scatter: counts then offsets */
};

/* The part of every handle the front end reads.  Backends embed it first. */
struct RtComm {
  const RtCommOps *ops;
  int rank, size;
  int *members;              /* world rank of each group rank (size entries) */
  char name[RT_COMM_NAME_MAX];
  int64_t *scratch;          /* 4 * size int64 for the front end's offsets */
  RtCommPending *pending;    /* requests started, not yet waited for (issue order) */
};

/* Completes (ops->finish) every request of c not yet complete, in start order;
 * their results stay for their waits.  Owner thread only. */
void rt_comm_complete(RtComm *c);

/* "all_reduce", ... */
const char *rt_comm_op_name(RtCommKind kind);

/* Monotonic clock in seconds. */
double rt_comm_now(void);

/* Writes "rank 3 (group dp, 2 ranks): all_reduce of 1024 floats <printf(fmt, ...)>"
 * (this rank, its group, the call) as the error, calls
 * c->ops->failed and returns RT_ERR. */
int rt_comm_fail(RtComm *c, const RtCommCall *call, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* out[i] = ((src[0][i] + src[1][i]) + ...) + src[n-1][i] for i < count, in float32.
 * out may be one of the src pointers (element i of every source is read before
 * out[i] is written); it must not partially overlap any. */
void rt_comm_reduce_ordered(float *out, const float *const *src, int n, int64_t count);

/* Fills c's common fields (members copied); RT_ERR on out of memory. */
int rt_comm_init_base(RtComm *c, const RtCommOps *ops, int rank, int size,
                      const int *members, const char *name);
/* Frees the common fields and discards c's requests never waited for (after
 * rt_comm_complete, or when the world is torn down). */
void rt_comm_free_base(RtComm *c);

/* Group ranks of a split: the ranks of c (size n) whose colors[r] == colors[me],
 * ordered by keys then rank, into order[]; returns how many, and this rank's
 * position in *pos. */
int rt_comm_split_order(int n, const int *colors, const int *keys, int me, int *order,
                        int *pos);

#endif
