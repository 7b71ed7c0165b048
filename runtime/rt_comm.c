/* runtime/rt_comm.c -- the communicator front end: argument checks, deadlines,
 * messages, the rank-ordered reduction every backend uses, splits and the mesh.
 * See rt_comm.h; backends are rt_comm_threads.c and rt_comm_mpi.c. */
#define _POSIX_C_SOURCE 200809L
#include "runtime/rt_comm.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/rt_comm_impl.h"
#include "runtime/rt_err.h"
#include "runtime/rt_pool.h"

/* ---- timeouts ---- */

static _Atomic int64_t comm_timeout_us;   /* 0 until first read */
static pthread_once_t comm_timeout_once = PTHREAD_ONCE_INIT;

static void timeout_from_env(void) {
  int64_t us = (int64_t)(RT_COMM_DEFAULT_TIMEOUT_S * 1e6);
  const char *e = getenv("PARC_COMM_TIMEOUT");
  if (e && *e) {
    char *end;
    errno = 0;
    double s = strtod(e, &end);
    if (errno == 0 && *end == '\0' && s > 0 && s <= 1e6) us = (int64_t)(s * 1e6);
  }
  int64_t zero = 0;
  atomic_compare_exchange_strong(&comm_timeout_us, &zero, us);
}

int rt_comm_set_timeout(double seconds) {
  if (!(seconds > 0 && seconds <= 1e6))
    return rt_fail("rt_comm_set_timeout: %g s is not a timeout; use 0 < seconds <= 1e6",
                   seconds);
  pthread_once(&comm_timeout_once, timeout_from_env);
  int64_t us = (int64_t)(seconds * 1e6);
  atomic_store(&comm_timeout_us, us > 0 ? us : 1);
  return RT_OK;
}

double rt_comm_timeout(void) {
  pthread_once(&comm_timeout_once, timeout_from_env);
  return (double)atomic_load(&comm_timeout_us) * 1e-6;
}

double rt_comm_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- messages ---- */

static const char *const op_names[RT_COMM_NKINDS] = {  /* ORDER RtCommKind */
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all",
    "barrier",    "split",      "send",           "recv"};

const char *rt_comm_op_name(RtCommKind kind) {
  return kind >= 0 && kind < RT_COMM_NKINDS ? op_names[kind] : "unknown op";
}

static int world_of(const RtComm *c, int r) {
  return r >= 0 && r < c->size ? c->members[r] : r;
}

/* "all_reduce of 1024 floats" */
static void describe_op(const RtComm *c, const RtCommCall *call, char *buf, size_t n) {
  const char *op = op_names[call->kind];
  long long k = (long long)call->count;
  switch (call->kind) {
  case RT_COMM_ALL_REDUCE:
    snprintf(buf, n, "%s of %lld floats", op, k);
    break;
  case RT_COMM_ALL_GATHER:
  case RT_COMM_REDUCE_SCATTER:
    snprintf(buf, n, "%s of %lld floats (%lld %s rank %d)", op, k,
             (long long)call->counts[c->rank],
             call->kind == RT_COMM_ALL_GATHER ? "from" : "to", world_of(c, c->rank));
    break;
  case RT_COMM_BROADCAST:
    snprintf(buf, n, "%s of %lld floats from rank %d", op, k, world_of(c, call->peer));
    break;
  case RT_COMM_ALL_TO_ALL:
    snprintf(buf, n, "%s sending %lld and receiving %lld floats", op, k,
             (long long)call->count2);
    break;
  case RT_COMM_SEND:
    snprintf(buf, n, "%s of %lld floats to rank %d (tag %d)", op, k, world_of(c, call->peer),
             call->tag);
    break;
  case RT_COMM_RECV:
    snprintf(buf, n, "%s of %lld floats from rank %d (tag %d)", op, k,
             world_of(c, call->peer), call->tag);
    break;
  default:
    snprintf(buf, n, "%s", op);
  }
}

/* "rank 3 (group dp, 2 ranks): all_reduce of 1024 floats" */
static void describe(const RtComm *c, const RtCommCall *call, char *buf, size_t n) {
  char op[256];
  describe_op(c, call, op, sizeof op);
  snprintf(buf, n, "rank %d (group %s, %d rank%s): %s", c->members[c->rank], c->name,
           c->size, c->size == 1 ? "" : "s", op);
}

int rt_comm_fail(RtComm *c, const RtCommCall *call, const char *fmt, ...) {
  char head[400], tail[RT_ERR_MAX];
  describe(c, call, head, sizeof head);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tail, sizeof tail, fmt, ap);
  va_end(ap);
  rt_fail("%s %s", head, tail);
  if (c->ops->failed) c->ops->failed(c, rt_last_error());
  return RT_ERR;
}

/* ---- the reduction every backend uses ---- */

#define TILE 1024   /* floats summed per pass: the accumulator stays in L1 */

void rt_comm_reduce_ordered(float *out, const float *const *src, int n, int64_t count) {
  float acc[TILE];
  int64_t t = 0;
  /* Full tiles: constant trip counts, so the loops vectorise at -O2. */
  for (; t + TILE <= count; t += TILE) {
    const float *s0 = src[0] + t;
    for (int i = 0; i < TILE; i++) acc[i] = s0[i];
    for (int j = 1; j < n; j++) {
      const float *s = src[j] + t;
      for (int i = 0; i < TILE; i++) acc[i] += s[i];
    }
    memcpy(out + t, acc, sizeof acc);
  }
  int64_t m = count - t;
  if (m > 0) {
    for (int64_t i = 0; i < m; i++) acc[i] = src[0][t + i];
    for (int j = 1; j < n; j++)
      for (int64_t i = 0; i < m; i++) acc[i] += src[j][t + i];
    memcpy(out + t, acc, (size_t)m * sizeof *acc);
  }
}

/* ---- common handle fields ---- */

int rt_comm_init_base(RtComm *c, const RtCommOps *ops, int rank, int size,
                      const int *members, const char *name) {
  c->ops = ops;
  c->pending = NULL;
  c->rank = rank;
  c->size = size;
  snprintf(c->name, sizeof c->name, "%s", name && *name ? name : "unnamed");
  c->members = malloc((size_t)size * sizeof *c->members);
  c->scratch = malloc((size_t)size * 4 * sizeof *c->scratch);
  if (!c->members || !c->scratch) {
    free(c->members);
    free(c->scratch);
    c->members = NULL;
    c->scratch = NULL;
    return rt_fail("communicator %s: out of memory for %d ranks", c->name, size);
  }
  memcpy(c->members, members, (size_t)size * sizeof *members);
  return RT_OK;
}

/* Drops c's requests never waited for; they are complete (or the world is being
 * torn down with nothing left running). */
static void discard_pending(RtComm *c) {
  while (c->pending) {
    RtCommPending *p = c->pending;
    c->pending = p->next;
    if (c->ops->release) c->ops->release(c, p);
    free(p);
  }
}

void rt_comm_free_base(RtComm *c) {
  discard_pending(c);
  free(c->members);
  free(c->scratch);
  c->members = NULL;
  c->scratch = NULL;
}

typedef struct {
  int key, rank;
} KeyRank;

static int by_key_rank(const void *a, const void *b) {
  const KeyRank *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return (x->rank > y->rank) - (x->rank < y->rank);
}

int rt_comm_split_order(int n, const int *colors, const int *keys, int me, int *order,
                        int *pos) {
  KeyRank *kr = malloc((size_t)n * sizeof *kr);
  int m = 0;
  if (!kr) return -1;
  for (int r = 0; r < n; r++)
    if (colors[r] == colors[me]) kr[m].key = keys[r], kr[m].rank = r, m++;
  qsort(kr, (size_t)m, sizeof *kr, by_key_rank);
  for (int i = 0; i < m; i++) {
    order[i] = kr[i].rank;
    if (kr[i].rank == me) *pos = i;
  }
  free(kr);
  return m;
}

/* ---- argument checks ---- */

int rt_comm_rank(const RtComm *c) { return c ? c->rank : -1; }
int rt_comm_size(const RtComm *c) { return c ? c->size : 0; }
int rt_comm_world_rank(const RtComm *c) { return c ? c->members[c->rank] : -1; }
const char *rt_comm_name(const RtComm *c) { return c ? c->name : "(null)"; }
const char *rt_comm_backend(const RtComm *c) { return c ? c->ops->backend : "(null)"; }

/* A float range [p, p + n) as addresses. */
static int overlap(const void *a, int64_t na, const void *b, int64_t nb) {
  if (na <= 0 || nb <= 0) return 0;
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return x < y + (uintptr_t)nb * sizeof(float) && y < x + (uintptr_t)na * sizeof(float);
}

/* p == base + off (an in-place block), without forming NULL + off. */
static int is_block(const float *p, const float *base, int64_t off) {
  return p && base && (uintptr_t)p == (uintptr_t)base + (uintptr_t)off * sizeof(float);
}

/* Largest count accepted: the byte size of any buffer fits in int64. */
#define MAX_FLOATS (INT64_MAX / 16)

void rt_comm_complete(RtComm *c) {
  for (RtCommPending *p = c->pending; p; p = p->next)
    if (!p->finished) {
      c->ops->finish(c, p);
      p->finished = 1;
    }
}

/* Every call begins here.  A collective first completes the requests in flight on
 * c, so that the backend never runs two of c's collectives at once and every
 * member meets them in the same order. */
static int start(RtComm *c, RtCommCall *call, const char *fn) {
  if (!c) return rt_fail("%s: NULL communicator", fn);
  if (c->pending && call->kind != RT_COMM_SEND && call->kind != RT_COMM_RECV)
    rt_comm_complete(c);
  call->deadline = rt_comm_now() + rt_comm_timeout();
  return RT_OK;
}

static int bad(RtComm *c, const RtCommCall *call, const char *fmt, const char *detail) {
  return rt_comm_fail(c, call, fmt, detail);
}

/* Checks a per-rank counts array and fills offsets; sets call->count to the total. */
static int check_counts(RtComm *c, RtCommCall *call, const int64_t *counts, int64_t *offsets,
                        const char *what) {
  if (!counts) {
    call->counts = c->scratch;      /* zeros, so that the message can be built */
    memset(c->scratch, 0, (size_t)c->size * sizeof *c->scratch);
    return bad(c, call, "failed: %s is NULL", what);
  }
  int64_t total = 0;
  for (int r = 0; r < c->size; r++) {
    if (counts[r] < 0 || counts[r] > MAX_FLOATS - total) {
      call->counts = counts;
      call->count = total;
      return rt_comm_fail(c, call, "failed: %s[%d] = %lld is not a count", what, r,
                          (long long)counts[r]);
    }
    offsets[r] = total;
    total += counts[r];
  }
  call->counts = counts;
  call->offsets = offsets;
  call->count = total;
  return RT_OK;
}

/* The checks of all_reduce, all_gather and reduce_scatter, shared by the blocking
 * calls and their starts. */
static int check_all_reduce(RtComm *c, RtCommCall *call) {
  const float *send = call->send, *recv = call->recv;
  int64_t count = call->count;
  if (count < 0 || count > MAX_FLOATS)
    return rt_comm_fail(c, call, "failed: the count is negative or too large");
  if (count > 0 && (!send || !recv))
    return bad(c, call, "failed: the %s buffer is NULL", !send ? "send" : "receive");
  if (send != recv && overlap(send, count, recv, count))
    return bad(c, call, "failed: %s", "send and receive buffers overlap without being equal");
  return RT_OK;
}

static int check_all_gather(RtComm *c, RtCommCall *call, const int64_t *counts) {
  if (check_counts(c, call, counts, c->scratch, "counts")) return RT_ERR;
  const float *send = call->send, *recv = call->recv;
  int64_t mine = counts[c->rank];
  if ((mine > 0 && !send) || (call->count > 0 && !recv))
    return bad(c, call, "failed: the %s buffer is NULL", mine > 0 && !send ? "send" : "receive");
  if (!is_block(send, recv, call->offsets[c->rank]) && overlap(send, mine, recv, call->count))
    return bad(c, call, "failed: %s",
               "the send buffer overlaps the receive buffer without being this rank's block");
  return RT_OK;
}

static int check_reduce_scatter(RtComm *c, RtCommCall *call, const int64_t *counts) {
  if (check_counts(c, call, counts, c->scratch, "counts")) return RT_ERR;
  const float *send = call->send, *recv = call->recv;
  int64_t mine = counts[c->rank];
  if ((call->count > 0 && !send) || (mine > 0 && !recv))
    return bad(c, call, "failed: the %s buffer is NULL",
               call->count > 0 && !send ? "send" : "receive");
  if (!is_block(recv, send, call->offsets[c->rank]) && overlap(send, call->count, recv, mine))
    return bad(c, call, "failed: %s",
               "the receive buffer overlaps the send buffer without being this rank's block");
  return RT_OK;
}

int rt_comm_all_reduce(RtComm *c, const float *send, float *recv, int64_t count) {
  RtCommCall call = {.kind = RT_COMM_ALL_REDUCE, .send = send, .recv = recv, .count = count};
  if (start(c, &call, "rt_comm_all_reduce") || check_all_reduce(c, &call)) return RT_ERR;
  return c->ops->all_reduce(c, &call);
}

int rt_comm_all_gather(RtComm *c, const float *send, float *recv, const int64_t *counts) {
  RtCommCall call = {.kind = RT_COMM_ALL_GATHER, .send = send, .recv = recv};
  if (start(c, &call, "rt_comm_all_gather") || check_all_gather(c, &call, counts)) return RT_ERR;
  return c->ops->all_gather(c, &call);
}

int rt_comm_reduce_scatter(RtComm *c, const float *send, float *recv, const int64_t *counts) {
  RtCommCall call = {.kind = RT_COMM_REDUCE_SCATTER, .send = send, .recv = recv};
  if (start(c, &call, "rt_comm_reduce_scatter") || check_reduce_scatter(c, &call, counts))
    return RT_ERR;
  return c->ops->reduce_scatter(c, &call);
}

/* ---- non-blocking collectives ---- */

/* Queues the validated call as a request of c.  The request owns copies of the
 * counts and offsets (the caller's arrays, and c->scratch, may change before the
 * backend reads them). */
static int post(RtComm *c, const RtCommCall *call, RtCommReq *req) {
  int arrays = call->kind == RT_COMM_ALL_GATHER || call->kind == RT_COMM_REDUCE_SCATTER;
  size_t n = arrays ? 2 * (size_t)c->size : 0;
  RtCommPending *p = calloc(1, sizeof *p + n * sizeof(int64_t));
  if (!p) return rt_comm_fail(c, call, "failed: out of memory for the request");
  p->c = c;
  p->call = *call;
  if (arrays) {
    memcpy(p->arrays, call->counts, (size_t)c->size * sizeof(int64_t));
    memcpy(p->arrays + c->size, call->offsets, (size_t)c->size * sizeof(int64_t));
    p->call.counts = p->arrays;
    p->call.offsets = p->arrays + c->size;
  }
  if (c->ops->start(c, p)) {
    if (c->ops->release) c->ops->release(c, p);
    free(p);
    return RT_ERR;
  }
  RtCommPending **tail = &c->pending;
  while (*tail) tail = &(*tail)->next;
  *tail = p;
  req->p = p;
  return RT_OK;
}

static int check_req(RtComm *c, RtCommReq *req, const char *fn) {
  if (!c) return rt_fail("%s: NULL communicator", fn);
  if (!req) return rt_fail("%s: NULL request", fn);
  req->p = NULL;
  return RT_OK;
}

/* The deadline of a start, like a blocking call's (without completing c's
 * requests: this one joins them). */
static void start_async(RtCommCall *call) {
  call->deadline = rt_comm_now() + rt_comm_timeout();
}

int rt_comm_all_reduce_start(RtComm *c, const float *send, float *recv, int64_t count,
                             RtCommReq *req) {
  RtCommCall call = {.kind = RT_COMM_ALL_REDUCE, .send = send, .recv = recv, .count = count};
  if (check_req(c, req, "rt_comm_all_reduce_start")) return RT_ERR;
  start_async(&call);
  if (check_all_reduce(c, &call)) return RT_ERR;
  return post(c, &call, req);
}

int rt_comm_all_gather_start(RtComm *c, const float *send, float *recv, const int64_t *counts,
                             RtCommReq *req) {
  RtCommCall call = {.kind = RT_COMM_ALL_GATHER, .send = send, .recv = recv};
  if (check_req(c, req, "rt_comm_all_gather_start")) return RT_ERR;
  start_async(&call);
  if (check_all_gather(c, &call, counts)) return RT_ERR;
  return post(c, &call, req);
}

int rt_comm_reduce_scatter_start(RtComm *c, const float *send, float *recv,
                                 const int64_t *counts, RtCommReq *req) {
  RtCommCall call = {.kind = RT_COMM_REDUCE_SCATTER, .send = send, .recv = recv};
  if (check_req(c, req, "rt_comm_reduce_scatter_start")) return RT_ERR;
  start_async(&call);
  if (check_reduce_scatter(c, &call, counts)) return RT_ERR;
  return post(c, &call, req);
}

int rt_comm_wait(RtCommReq *req) {
  if (!req || !req->p) return RT_OK;
  RtCommPending *p = req->p;
  RtComm *c = p->c;
  req->p = NULL;
  if (!p->finished) {
    c->ops->finish(c, p);
    p->finished = 1;
  }
  for (RtCommPending **q = &c->pending; *q; q = &(*q)->next)
    if (*q == p) {
      *q = p->next;
      break;
    }
  int rc = p->rc;
  if (rc != RT_OK) rt_fail("%s", p->err[0] ? p->err : "a request failed (no message)");
  if (c->ops->release) c->ops->release(c, p);
  free(p);
  return rc;
}

int rt_comm_broadcast(RtComm *c, float *buf, int64_t count, int root) {
  RtCommCall call = {.kind = RT_COMM_BROADCAST, .recv = buf, .count = count, .peer = root};
  if (start(c, &call, "rt_comm_broadcast")) return RT_ERR;
  if (root < 0 || root >= c->size)
    return rt_comm_fail(c, &call, "failed: root %d is not a rank of the group (0..%d)", root,
                        c->size - 1);
  if (count < 0 || count > MAX_FLOATS)
    return rt_comm_fail(c, &call, "failed: the count is negative or too large");
  if (count > 0 && !buf) return bad(c, &call, "failed: the %s is NULL", "buffer");
  return c->ops->broadcast(c, &call);
}

int rt_comm_all_to_all(RtComm *c, const float *send, const int64_t *send_counts,
                       const int64_t *send_displs, float *recv, const int64_t *recv_counts,
                       const int64_t *recv_displs) {
  RtCommCall call = {.kind = RT_COMM_ALL_TO_ALL, .send = send, .recv = recv};
  if (start(c, &call, "rt_comm_all_to_all")) return RT_ERR;
  int n = c->size;
  int64_t *sd = c->scratch + 2 * n, *rd = c->scratch + 3 * n;
  if (!send_counts || !recv_counts)
    return bad(c, &call, "failed: %s is NULL", !send_counts ? "send_counts" : "recv_counts");
  int64_t stot = 0, rtot = 0, send_end = 0, recv_end = 0;
  for (int j = 0; j < n; j++) {
    int64_t s = send_counts[j], r = recv_counts[j];
    int64_t so = send_displs ? send_displs[j] : stot, ro = recv_displs ? recv_displs[j] : rtot;
    if (s < 0 || r < 0 || s > MAX_FLOATS - stot || r > MAX_FLOATS - rtot || so < 0 ||
        ro < 0 || so > MAX_FLOATS - s || ro > MAX_FLOATS - r)
      return rt_comm_fail(c, &call,
                          "failed: peer %d: send %lld at %lld, receive %lld at %lld is not "
                          "a valid block",
                          j, (long long)s, (long long)so, (long long)r, (long long)ro);
    sd[j] = so;
    rd[j] = ro;
    stot += s;
    rtot += r;
    if (s > 0 && so + s > send_end) send_end = so + s;
    if (r > 0 && ro + r > recv_end) recv_end = ro + r;
  }
  call.count = stot;
  call.count2 = rtot;
  call.send_counts = send_counts;
  call.recv_counts = recv_counts;
  call.send_displs = sd;
  call.recv_displs = rd;
  if ((stot > 0 && !send) || (rtot > 0 && !recv))
    return bad(c, &call, "failed: the %s buffer is NULL", stot > 0 && !send ? "send" : "receive");
  if (overlap(send, send_end, recv, recv_end))
    return bad(c, &call, "failed: %s", "send and receive buffers overlap");
  return c->ops->all_to_all(c, &call);
}

int rt_comm_barrier(RtComm *c) {
  RtCommCall call = {.kind = RT_COMM_BARRIER};
  if (start(c, &call, "rt_comm_barrier")) return RT_ERR;
  return c->ops->barrier(c, &call);
}

int rt_comm_split(RtComm *c, int color, int key, const char *name, RtComm **group) {
  RtCommCall call = {.kind = RT_COMM_SPLIT, .color = color, .key = key, .name = name,
                     .out = group};
  if (start(c, &call, "rt_comm_split")) return RT_ERR;
  if (!group) return bad(c, &call, "failed: %s is NULL", "the group pointer");
  *group = NULL;
  if (color < 0 && color != RT_COMM_NO_GROUP)
    return rt_comm_fail(c, &call, "failed: color %d is negative (RT_COMM_NO_GROUP is %d)",
                        color, RT_COMM_NO_GROUP);
  return c->ops->split(c, &call);
}

void rt_comm_free(RtComm *c) {
  if (!c) return;
  rt_comm_complete(c);       /* nothing of c may run after it is gone */
  discard_pending(c);
  c->ops->free(c);
}

static int check_p2p(RtComm *c, RtCommCall *call, const void *buf) {
  if (call->peer < 0 || call->peer >= c->size)
    return rt_comm_fail(c, call, "failed: peer %d is not a rank of the group (0..%d)",
                        call->peer, c->size - 1);
  if (call->tag < 0) return rt_comm_fail(c, call, "failed: tags are >= 0");
  if (call->count < 0 || call->count > MAX_FLOATS)
    return rt_comm_fail(c, call, "failed: the count is negative or too large");
  if (call->count > 0 && !buf) return bad(c, call, "failed: the %s is NULL", "buffer");
  return RT_OK;
}

int rt_comm_send(RtComm *c, const float *buf, int64_t count, int peer, int tag) {
  RtCommCall call = {.kind = RT_COMM_SEND, .send = buf, .count = count, .peer = peer, .tag = tag};
  if (start(c, &call, "rt_comm_send") || check_p2p(c, &call, buf)) return RT_ERR;
  return c->ops->send(c, &call);
}

int rt_comm_recv(RtComm *c, float *buf, int64_t count, int peer, int tag) {
  RtCommCall call = {.kind = RT_COMM_RECV, .recv = buf, .count = count, .peer = peer, .tag = tag};
  if (start(c, &call, "rt_comm_recv") || check_p2p(c, &call, buf)) return RT_ERR;
  return c->ops->recv(c, &call);
}

int rt_comm_flat_piece(const RtComm *c, const float *x, int64_t n, float *out, int64_t s) {
  int64_t r = c ? c->rank : 0;
  if (n < 0 || s < 0 || (s > 0 && r > INT64_MAX / 16 / s) || (n > 0 && !x) || (s > 0 && !out))
    return rt_fail("rt_comm_flat_piece: piece %lld of %lld floats of a %lld-float tensor",
                   (long long)r, (long long)s, (long long)n);
  int64_t b = r * s, k = n - b < s ? (n - b > 0 ? n - b : 0) : s;
  if (k > 0) memcpy(out, x + b, (size_t)k * sizeof(float));
  if (s > k) memset(out + k, 0, (size_t)(s - k) * sizeof(float));
  return RT_OK;
}

/* ---- launching ---- */

int rt_comm_run(int nranks, int (*rank_main)(RtComm *world, void *arg), void *arg) {
  if (!rt_comm_mpi_launched()) return rt_comm_threads_run(nranks, rank_main, arg);
  if (!rank_main) return rt_fail("rt_comm_run: NULL rank_main");
  RtComm *w;
  if (rt_comm_mpi_init(&w)) return RT_ERR;
  if (nranks != 0 && nranks != w->size)
    return rt_fail("rt_comm_run: %d ranks requested, but mpirun started %d; pass 0 (or "
                   "the same number) under mpirun", nranks, w->size);
  rt_clear_error();
  int rc = rank_main(w, arg);
  if (rc == RT_COMM_STOP_AGREED) /* every rank is here: leave MPI cleanly */
    return rt_comm_mpi_finalize(w) ? RT_ERR : RT_COMM_STOP_AGREED;
  if (rc != 0) {
    const char *e = rt_last_error();
    if (!e[0]) return rt_fail("rank %d: rank_main returned %d", w->rank, rc);
    if (strncmp(e, "rank ", 5) != 0) return rt_fail("rank %d: %s", w->rank, e);
    return RT_ERR;
  }
  return rt_comm_mpi_finalize(w);
}

/* ---- helpers ---- */

void rt_comm_block_counts(int64_t total, int parts, int64_t unit, int64_t *counts) {
  for (int r = 0; r < parts; r++) {
    int64_t b, e;
    rt_parallel_chunk(total, parts, r, &b, &e);
    counts[r] = (e - b) * unit;
  }
}

int rt_comm_mesh(RtComm *world, int tp, int dp, int pp, int ep, RtMesh *mesh) {
  if (!world || !mesh) return rt_fail("rt_comm_mesh: NULL %s", world ? "mesh" : "world");
  memset(mesh, 0, sizeof *mesh);
  int n = world->size, r = world->rank;
  if (tp < 1 || dp < 1 || pp < 1 || ep < 1 || (long long)tp * dp * pp != n || dp % ep != 0) {
    RtCommCall call = {.kind = RT_COMM_SPLIT};
    return rt_comm_fail(world, &call,
                        "failed: mesh tp %d x dp %d x pp %d (ep %d) does not fit %d ranks: "
                        "tp * dp * pp must equal the world size and ep divide dp",
                        tp, dp, pp, ep, n);
  }
  mesh->tp = tp, mesh->dp = dp, mesh->pp = pp, mesh->ep = ep;
  mesh->tp_rank = r % tp;
  mesh->dp_rank = r / tp % dp;
  mesh->pp_rank = r / (tp * dp);
  mesh->ep_rank = mesh->dp_rank % ep;
  int t = mesh->tp_rank, d = mesh->dp_rank, p = mesh->pp_rank;
  /* Colors index the other coordinates; keys order each group by its own axis. */
  if (rt_comm_split(world, d + dp * p, t, "tp", &mesh->tp_comm) ||
      rt_comm_split(world, t + tp * p, d, "dp", &mesh->dp_comm) ||
      rt_comm_split(world, t + tp * d, p, "pp", &mesh->pp_comm) ||
      rt_comm_split(world, t + tp * (d / ep + dp / ep * p), d % ep, "ep", &mesh->ep_comm) ||
      rt_comm_split(world, t + tp * (d % ep + ep * p), d / ep, "ep_dp", &mesh->ep_dp_comm)) {
    rt_comm_mesh_free(mesh);
    return RT_ERR;
  }
  return RT_OK;
}

void rt_comm_mesh_free(RtMesh *mesh) {
  if (!mesh) return;
  rt_comm_free(mesh->tp_comm);
  rt_comm_free(mesh->dp_comm);
  rt_comm_free(mesh->pp_comm);
  rt_comm_free(mesh->ep_comm);
  rt_comm_free(mesh->ep_dp_comm);
  mesh->tp_comm = mesh->dp_comm = mesh->pp_comm = mesh->ep_comm = mesh->ep_dp_comm = NULL;
}
