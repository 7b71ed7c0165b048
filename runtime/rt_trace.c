/* runtime/rt_trace.c -- the trainer's own trace; see rt_trace.h. */
#define _POSIX_C_SOURCE 200809L
#include "runtime/rt_trace.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/rt_comm.h"
#include "runtime/rt_err.h"
#include "runtime/rt_fs.h"

typedef struct {
  double start, end;         /* seconds since the rank's origin */
  int64_t step, count;
  int kind, chunk, mb;
} Event;

/* Numbers a rank sends to rank 0 before its events (EV_NUMS each). */
enum { HEAD_NUMS = 10, EV_NUMS = 7, TAG_HEAD = 7001, TAG_EVENTS = 7002 };

struct RtTrace {
  double origin;
  int64_t step;
  Event *ev;
  int64_t n, cap;
  int64_t own;               /* events not from rt_trace_comm (rt_trace_count) */
  int oom;                   /* an append failed: the recording is incomplete */
  int wrank, tp_rank, dp_rank, pp_rank;
  /* a pipelined trainer's schedule (stages 0: none described) */
  char schedule[32];
  int stages, chunks, microbatches, nactions;
};

double rt_trace_clock(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

RtTrace *rt_trace_open(int world_rank, int tp_rank, int dp_rank, int pp_rank) {
  RtTrace *t = calloc(1, sizeof *t);
  if (!t) {
    rt_fail("--trace: out of memory");
    return NULL;
  }
  t->wrank = world_rank, t->tp_rank = tp_rank, t->dp_rank = dp_rank, t->pp_rank = pp_rank;
  t->origin = rt_trace_clock();
  return t;
}

void rt_trace_free(RtTrace *t) {
  if (!t) return;
  free(t->ev);
  free(t);
}

void rt_trace_step(RtTrace *t, int64_t step) { t->step = step; }

int64_t rt_trace_count(const RtTrace *t) { return t->own; }

void rt_trace_pipe(RtTrace *t, const char *schedule, int stages, int chunks, int microbatches,
                   int nactions) {
  snprintf(t->schedule, sizeof t->schedule, "%s", schedule ? schedule : "?");
  t->stages = stages, t->chunks = chunks, t->microbatches = microbatches;
  t->nactions = nactions;
}

void rt_trace_add(RtTrace *t, RtTraceKind kind, int chunk, int mb, double start, double end,
                  int64_t count) {
  if (t->oom) return;
  if (t->n == t->cap) {
    int64_t cap = t->cap ? 2 * t->cap : 4096;
    Event *ev = realloc(t->ev, sizeof *ev * (size_t)cap);
    if (!ev) {
      t->oom = 1;
      return;
    }
    t->ev = ev, t->cap = cap;
  }
  t->ev[t->n++] = (Event){start - t->origin, end - t->origin, t->step, count, (int)kind, chunk,
                          mb};
  if (kind < RT_TRACE_ALL_REDUCE) t->own++;
}

/* A collective: group in chunk, how in mb. */
void rt_trace_comm(RtTrace *t, RtTraceKind kind, int group, int how, double start,
                   int64_t count) {
  rt_trace_add(t, kind, group, how, start, rt_trace_clock(), count);
}

/* ---- gathering: numbers as float pairs (hi, lo), exact to about 48 bits ---- */

static void put2(float *f, double x) {
  f[0] = (float)x;
  f[1] = (float)(x - (double)f[0]);
}

static double get2(const float *f) { return (double)f[0] + (double)f[1]; }

static void encode(const Event *e, float *f) {
  double v[EV_NUMS] = {e->start, e->end, (double)e->step, (double)e->count, e->kind, e->chunk,
                       e->mb};
  for (int k = 0; k < EV_NUMS; k++) put2(f + 2 * k, v[k]);
}

static void decode(const float *f, Event *e) {
  e->start = get2(f), e->end = get2(f + 2);
  e->step = (int64_t)get2(f + 4), e->count = (int64_t)get2(f + 6);
  e->kind = (int)get2(f + 8), e->chunk = (int)get2(f + 10), e->mb = (int)get2(f + 12);
}

/* One rank's events as rank 0 holds them. */
typedef struct {
  int wrank, tp_rank, dp_rank, pp_rank, nactions, oom;
  int64_t n;
  Event *ev;
} RankEvents;

/* ---- writing ---- */

static const char *const kind_name[RT_TRACE_NKINDS] = {
    "F", "B", "W", "SEND_ACT", "RECV_ACT", "SEND_GRAD", "RECV_GRAD",
    "all-reduce gradients (dp)", "reduce-scatter gradients (dp)", "shared gradients (pp)", "all-reduce loss (pp)",
    "optimizer", "step", "all_reduce", "all_gather", "reduce_scatter", "all_to_all"};

static const char *const group_name[RT_TRACE_NGROUPS] = {"tp", "dp", "ep", "ep_dp", "pp"};

static int is_collective(int kind) { return kind >= RT_TRACE_ALL_REDUCE && kind < RT_TRACE_NKINDS; }

static int is_comm(int kind) {
  return (kind >= RT_TRACE_SEND_ACT && kind <= RT_TRACE_RECV_GRAD) ||
         (kind >= RT_TRACE_REDUCE_DP && kind <= RT_TRACE_REDUCE_LOSS) || is_collective(kind);
}

static const char *group_of(const Event *e) {
  return e->chunk >= 0 && e->chunk < RT_TRACE_NGROUPS ? group_name[e->chunk] : "?";
}

static int by_start(const void *a, const void *b) {
  const Event *x = a, *y = b;
  return (x->start > y->start) - (x->start < y->start);
}

static void put_event(FILE *f, int pid, int tid, const char *name, const char *cat, double start,
                      double end, const Event *e) {
  fprintf(f, ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,"
             "\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"step\":%" PRId64, name, cat, pid, tid,
          start * 1e6, (end - start) * 1e6, e->step);
  if (e->kind <= RT_TRACE_RECV_GRAD) fprintf(f, ",\"mb\":%d,\"chunk\":%d", e->mb, e->chunk);
  if (is_collective(e->kind)) {
    fprintf(f, ",\"group\":\"%s\"", group_of(e));
    if (e->mb != RT_TRACE_BLOCKING)
      fprintf(f, ",\"async\":\"%s\"", e->mb == RT_TRACE_START ? "start" : "wait");
  }
  if (e->count || is_collective(e->kind)) fprintf(f, ",\"floats\":%" PRId64, e->count);
  fputs("}}", f);
}

/* Gaps shorter than this are the rank's own bookkeeping between two events,
 * not waiting: not drawn as idle. */
#define IDLE_MIN_S 1e-6

/* Idle of rank r: per step, the window [earliest start of the step on any
 * rank, its latest end] minus the union of r's events of that step.  ev of
 * every rank is sorted by start; lo/hi per step index (steps first..last). */
static void put_idle(FILE *f, const RankEvents *r, int64_t first, const double *lo,
                     const double *hi) {
  int64_t i = 0;
  while (i < r->n) {
    int64_t step = r->ev[i].step, k = step - first;
    double at = lo[k];
    for (; i < r->n && r->ev[i].step == step; i++) {
      const Event *e = &r->ev[i];
      if (e->start > at + IDLE_MIN_S) {
        Event idle = {at, e->start, step, 0, RT_TRACE_NKINDS, 0, 0};
        put_event(f, r->wrank, 2, "idle", "idle", at, e->start, &idle);
      }
      if (e->end > at) at = e->end;
    }
    if (hi[k] > at + IDLE_MIN_S) {
      Event idle = {at, hi[k], step, 0, RT_TRACE_NKINDS, 0, 0};
      put_event(f, r->wrank, 2, "idle", "idle", at, hi[k], &idle);
    }
  }
}

/* Inside each "step" event of rank r, its parts no collective of r covers:
 * "compute" events (tid 0).  ev sorted by start: a step's events are
 * contiguous, its collectives after its step event (the harness reads the
 * clock for the step first). */
static void put_compute(FILE *f, const RankEvents *r) {
  for (int64_t i = 0; i < r->n; i++) {
    const Event *s = &r->ev[i];
    if (s->kind != RT_TRACE_STEP) continue;
    double at = s->start;
    int any = 0;
    for (int64_t j = i + 1; j < r->n && r->ev[j].step == s->step; j++) {
      const Event *e = &r->ev[j];
      if (!is_collective(e->kind)) continue;
      any = 1;
      if (e->start > at + IDLE_MIN_S) {
        Event c = {at, e->start, s->step, 0, RT_TRACE_NKINDS, 0, 0};
        put_event(f, r->wrank, 0, "compute", "compute", at, e->start, &c);
      }
      if (e->end > at) at = e->end;
    }
    if (any && s->end > at + IDLE_MIN_S) {
      Event c = {at, s->end, s->step, 0, RT_TRACE_NKINDS, 0, 0};
      put_event(f, r->wrank, 0, "compute", "compute", at, s->end, &c);
    }
  }
}

/* The JSON of rt_trace.h into a malloc'd buffer; NULL when out of memory. */
static char *render(const RtTrace *t, RankEvents *ranks, int nranks, const char *backend,
                    int tp, int dp, int pp, size_t *len) {
  char *buf = NULL;
  FILE *f = open_memstream(&buf, len);
  if (!f) return NULL;
  int64_t first = INT64_MAX, last = INT64_MIN;
  for (int r = 0; r < nranks; r++) {
    qsort(ranks[r].ev, (size_t)ranks[r].n, sizeof *ranks[r].ev, by_start);
    /* a stable order of steps is needed below: events of one step are
     * contiguous once sorted by start, because a rank ends step t before it
     * starts step t + 1 */
    for (int64_t i = 0; i < ranks[r].n; i++) {
      if (ranks[r].ev[i].step < first) first = ranks[r].ev[i].step;
      if (ranks[r].ev[i].step > last) last = ranks[r].ev[i].step;
    }
  }
  int64_t nsteps = last >= first ? last - first + 1 : 0;
  double *lo = malloc(sizeof(double) * (size_t)(nsteps + 1));
  double *hi = malloc(sizeof(double) * (size_t)(nsteps + 1));
  if (!lo || !hi) {
    free(lo), free(hi);
    fclose(f);
    free(buf);
    return NULL;
  }
  for (int64_t k = 0; k < nsteps; k++) lo[k] = 1e300, hi[k] = -1e300;
  for (int r = 0; r < nranks; r++)
    for (int64_t i = 0; i < ranks[r].n; i++) {
      const Event *e = &ranks[r].ev[i];
      int64_t k = e->step - first;
      if (e->start < lo[k]) lo[k] = e->start;
      if (e->end > hi[k]) hi[k] = e->end;
    }
  fputs("{\"traceEvents\":[", f);
  static const char *const lane[3] = {"compute", "communication", "idle"};
  for (int r = 0; r < nranks; r++) {
    const RankEvents *x = &ranks[r];
    fprintf(f, "%s\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":"
               "{\"name\":\"rank %d: stage %d, tp %d, dp %d\"}}", r ? "," : "", x->wrank, x->wrank,
            x->pp_rank, x->tp_rank, x->dp_rank);
    fprintf(f, ",\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
               "\"args\":{\"sort_index\":%d}}", x->wrank, x->wrank);
    for (int l = 0; l < 3; l++)
      fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":"
                 "{\"name\":\"%s\"}}", x->wrank, l, lane[l]);
    for (int64_t i = 0; i < x->n; i++) {
      const Event *e = &x->ev[i];
      char name[80];
      const char *cat = kind_name[e->kind];
      if (e->kind <= RT_TRACE_RECV_GRAD)
        snprintf(name, sizeof name, "%s(mb %d, chunk %d)", kind_name[e->kind], e->mb, e->chunk);
      else if (is_collective(e->kind)) {
        snprintf(name, sizeof name, "%s %s%s", kind_name[e->kind], group_of(e),
                 e->mb == RT_TRACE_START ? " (start)" : e->mb == RT_TRACE_WAIT ? " (wait)" : "");
        if (e->mb == RT_TRACE_START) cat = "async_start";
      } else
        snprintf(name, sizeof name, "%s", kind_name[e->kind]);
      put_event(f, x->wrank, is_comm(e->kind), name, cat, e->start, e->end, e);
    }
    put_compute(f, x);
    put_idle(f, x, first, lo, hi);
  }
  fprintf(f, "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"source\":\"train --trace\","
             "\"backend\":\"%s\",\"ranks\":%d,\"tp\":%d,\"dp\":%d,\"pp\":%d", backend, nranks, tp,
          dp, pp);
  if (t->stages > 0) {
    fprintf(f, ",\"schedule\":\"%s\",\"stages\":%d,\"chunks\":%d,\"microbatches\":%d,"
               "\"nactions\":[", t->schedule, t->stages, t->chunks, t->microbatches);
    for (int r = 0; r < nranks; r++) fprintf(f, "%s%d", r ? "," : "", ranks[r].nactions);
    fputs("]", f);
  }
  fputs("}}\n", f);
  free(lo), free(hi);
  if (fclose(f)) {
    free(buf);
    return NULL;
  }
  return buf;
}

int rt_trace_write(RtTrace *t, RtComm *world, const char *path, int tp, int dp, int pp) {
  int nranks = world ? rt_comm_size(world) : 1, me = world ? rt_comm_rank(world) : 0;
  float head[2 * HEAD_NUMS];
  double h[HEAD_NUMS] = {t->wrank, t->tp_rank, t->dp_rank, t->pp_rank, t->nactions, t->oom,
                         (double)t->n, 0, 0, 0};
  for (int k = 0; k < HEAD_NUMS; k++) put2(head + 2 * k, h[k]);
  float *packed = NULL;
  if (me != 0) { /* to rank 0, which writes */
    packed = malloc(sizeof(float) * 2 * EV_NUMS * (size_t)(t->n + 1));
    if (!packed) return rt_fail("--trace: out of memory");
    for (int64_t i = 0; i < t->n; i++) encode(&t->ev[i], packed + 2 * EV_NUMS * i);
    int rc = rt_comm_send(world, head, 2 * HEAD_NUMS, 0, TAG_HEAD);
    if (!rc && t->n) rc = rt_comm_send(world, packed, 2 * EV_NUMS * t->n, 0, TAG_EVENTS);
    free(packed);
    float status = 0;
    if (!rc) rc = rt_comm_broadcast(world, &status, 1, 0);
    if (!rc && status != 0) rc = rt_fail("--trace %s: world rank 0 could not write it", path);
    return rc ? RT_ERR : RT_OK;
  }
  RankEvents *ranks = calloc((size_t)nranks, sizeof *ranks);
  int rc = ranks ? RT_OK : rt_fail("--trace: out of memory");
  for (int r = 0; r < nranks && rc == RT_OK; r++) {
    double v[HEAD_NUMS];
    if (r > 0 && rt_comm_recv(world, head, 2 * HEAD_NUMS, r, TAG_HEAD)) {
      rc = RT_ERR;
      break;
    }
    for (int k = 0; k < HEAD_NUMS; k++) v[k] = get2(head + 2 * k);
    RankEvents *x = &ranks[r];
    x->wrank = (int)v[0], x->tp_rank = (int)v[1], x->dp_rank = (int)v[2], x->pp_rank = (int)v[3];
    x->nactions = (int)v[4], x->oom = (int)v[5], x->n = (int64_t)v[6];
    x->ev = malloc(sizeof(Event) * (size_t)(x->n + 1));
    if (!x->ev) {
      rc = rt_fail("--trace: out of memory for %" PRId64 " events of rank %d", x->n, r);
      break;
    }
    if (r == 0) {
      memcpy(x->ev, t->ev, sizeof(Event) * (size_t)x->n);
      continue;
    }
    packed = malloc(sizeof(float) * 2 * EV_NUMS * (size_t)(x->n + 1));
    if (!packed) {
      rc = rt_fail("--trace: out of memory");
      break;
    }
    if (x->n && rt_comm_recv(world, packed, 2 * EV_NUMS * x->n, r, TAG_EVENTS)) rc = RT_ERR;
    for (int64_t i = 0; rc == RT_OK && i < x->n; i++) decode(packed + 2 * EV_NUMS * i, &x->ev[i]);
    free(packed);
  }
  int status = rc;
  for (int r = 0; r < nranks && status == RT_OK; r++)
    if (ranks[r].oom) status = rt_fail("--trace: rank %d ran out of memory recording", r);
  if (status == RT_OK) {
    size_t len = 0;
    char *text = render(t, ranks, nranks, world ? rt_comm_backend(world) : "none", tp, dp, pp,
                        &len);
    RtFsChunk c = {text, len};
    status = !text ? rt_fail("--trace: out of memory writing the trace")
             : rt_fs_write_atomic(path, &c, 1) ? RT_ERR
                                                : RT_OK;
    free(text);
  }
  for (int r = 0; ranks && r < nranks; r++) free(ranks[r].ev);
  free(ranks);
  if (rc != RT_OK) return RT_ERR; /* a failed receive: the ranks fail together (timeouts) */
  if (world) {
    float s = status == RT_OK ? 0.0f : 1.0f;
    if (rt_comm_broadcast(world, &s, 1, 0)) return RT_ERR;
  }
  return status;
}
