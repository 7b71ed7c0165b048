/* runtime/rt_route.c -- routing, embedding and loss kernels; see rt_route.h. */
#include "runtime/rt_route.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt_err.h"
#include "runtime/rt_pool.h"
#include "runtime/rt_vmath.h"

/* Elements of work a task should at least have before it is worth a thread. */
#define WORK_GRAIN 16384

/* Rows per task for rows of `len` elements. */
static int64_t row_grain(int64_t len) { return len >= WORK_GRAIN ? 1 : WORK_GRAIN / len; }

/* Each of the nd values, named in order by the space-separated `names`, is >= 1. */
static int positive(const char *op, const char *names, const int64_t *d, int nd) {
  for (int i = 0; i < nd; i++) {
    const char *name = names;
    for (int j = 0; j < i; j++) name = strchr(name, ' ') + 1;
    if (d[i] < 1)
      return rt_fail("%s: %.*s must be >= 1, got %lld", op, (int)strcspn(name, " "), name,
                     (long long)d[i]);
  }
  return RT_OK;
}
#define POSITIVE(op, names, ...)                                                           \
  positive(op, names, (const int64_t[]){__VA_ARGS__},                                       \
           (int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))

/* A tensor of a * b * c elements (all >= 1) can be addressed in bytes. */
static int fits(const char *op, int64_t a, int64_t b, int64_t c) {
  int64_t n;
  if (__builtin_mul_overflow(a, b, &n) || __builtin_mul_overflow(n, c, &n) ||
      n > INT64_MAX / 8)
    return rt_fail("%s: a tensor of %lld x %lld x %lld elements is too large", op,
                   (long long)a, (long long)b, (long long)c);
  return RT_OK;
}

/* Every idx[p], p < count, lies in [0, limit). */
static int ids_ok(const char *op, const char *what, const int32_t *idx, int64_t count,
                  int64_t limit, const char *range) {
  for (int64_t p = 0; p < count; p++)
    if (idx[p] < 0 || idx[p] >= limit)
      return rt_fail("%s: %s %d at position %lld is outside %s[0, %lld)", op, what, idx[p],
                     (long long)p, range, (long long)limit);
  return RT_OK;
}

static int null_arg(const char *op, const char *name) {
  return rt_fail("%s: NULL %s pointer", op, name);
}

/* ---- topk ---------------------------------------------------------------------- */

typedef struct {
  int32_t *out;
  const float *x;
  int64_t n, k;
  atomic_int oom;
} TopK;

static void topk_range(void *ctx, int64_t begin, int64_t end) {
  TopK *a = ctx;
  unsigned char *taken = malloc((size_t)a->n);
  if (!taken) {
    atomic_store(&a->oom, 1);
    return;
  }
  for (int64_t r = begin; r < end; r++) {
    const float *row = a->x + r * a->n;
    memset(taken, 0, (size_t)a->n);
    for (int64_t j = 0; j < a->k; j++) {
      int64_t best = -1;
      for (int64_t i = 0; i < a->n; i++)
        if (!taken[i] && (best < 0 || row[i] > row[best])) best = i;
      taken[best] = 1;
      a->out[r * a->k + j] = (int32_t)best;
    }
  }
  free(taken);
}

int rt_topk(int32_t *out, const float *x, int64_t rows, int64_t n, int64_t k) {
  if (!out || !x) return null_arg("topk", !out ? "output" : "x");
  if (POSITIVE("topk", "rows n k", rows, n, k) || fits("topk", rows, n, 1) ||
      fits("topk", rows, k, 1))
    return RT_ERR;
  if (k > n || n > INT32_MAX)
    return rt_fail("topk: k = %lld must be in [1, n = %lld] and n below 2^31", (long long)k,
                   (long long)n);
  TopK a = {out, x, n, k, 0};
  rt_parallel_for(rows, row_grain(n * k), topk_range, &a);
  if (atomic_load(&a.oom)) return rt_fail("topk: out of memory (%lld bytes)", (long long)n);
  return RT_OK;
}

/* ---- gather, scatter_add, onehot ------------------------------------------------ */

typedef struct {
  float *out;
  const float *x;
  const int32_t *idx;
  int64_t n, k;
} Gather;

static void gather_range(void *ctx, int64_t begin, int64_t end) {
  Gather *a = ctx;
  for (int64_t r = begin; r < end; r++)
    for (int64_t j = 0; j < a->k; j++) a->out[r * a->k + j] = a->x[r * a->n + a->idx[r * a->k + j]];
}

int rt_gather(float *out, const float *x, const int32_t *idx, int64_t rows, int64_t n,
              int64_t k) {
  if (!out || !x || !idx) return null_arg("gather", !out ? "output" : !x ? "x" : "idx");
  if (POSITIVE("gather", "rows n k", rows, n, k) || fits("gather", rows, n, 1) ||
      fits("gather", rows, k, 1) || ids_ok("gather", "index", idx, rows * k, n, ""))
    return RT_ERR;
  Gather a = {out, x, idx, n, k};
  rt_parallel_for(rows, row_grain(k), gather_range, &a);
  return RT_OK;
}

static void scatter_range(void *ctx, int64_t begin, int64_t end) {
  Gather *a = ctx;  /* out [rows, n], x = dy [rows, k] */
  for (int64_t r = begin; r < end; r++) {
    float *o = a->out + r * a->n;
    memset(o, 0, sizeof(float) * (size_t)a->n);
    for (int64_t j = 0; j < a->k; j++) o[a->idx[r * a->k + j]] += a->x[r * a->k + j];
  }
}

int rt_scatter_add(float *out, const int32_t *idx, const float *dy, int64_t rows, int64_t k,
                   int64_t n) {
  if (!out || !idx || !dy) return null_arg("scatter_add", !out ? "output" : !idx ? "idx" : "dy");
  if (POSITIVE("scatter_add", "rows k n", rows, k, n) || fits("scatter_add", rows, n, 1) ||
      fits("scatter_add", rows, k, 1) || ids_ok("scatter_add", "index", idx, rows * k, n, ""))
    return RT_ERR;
  Gather a = {out, dy, idx, n, k};
  rt_parallel_for(rows, row_grain(n + k), scatter_range, &a);
  return RT_OK;
}

static void onehot_range(void *ctx, int64_t begin, int64_t end) {
  Gather *a = ctx;
  for (int64_t p = begin; p < end; p++) {
    float *o = a->out + p * a->n;
    memset(o, 0, sizeof(float) * (size_t)a->n);
    o[a->idx[p]] = 1.0f;
  }
}

int rt_onehot(float *out, const int32_t *idx, int64_t count, int64_t n) {
  if (!out || !idx) return null_arg("onehot", !out ? "output" : "idx");
  if (POSITIVE("onehot", "count n", count, n) || fits("onehot", count, n, 1) ||
      ids_ok("onehot", "index", idx, count, n, ""))
    return RT_ERR;
  Gather a = {out, NULL, idx, n, 1};
  rt_parallel_for(count, row_grain(n), onehot_range, &a);
  return RT_OK;
}

/* ---- routing: dispatch, combine and their gradients ----------------------------- */

/* The slots of the N*K choices (see rt_route.h).  slot (may be NULL): slot[p] is
 * choice p's slot, or -1 when dropped.  src (may be NULL): src[e*C + c] is the choice
 * that fills slot c of expert e, or -1.  Checks idx first. */
static int route(const char *op, const int32_t *idx, int64_t N, int64_t K, int64_t E,
                 int64_t C, int64_t **slot, int64_t **src) {
  for (int64_t p = 0; p < N * K; p++)
    if (idx[p] != -1 && (idx[p] < 0 || idx[p] >= E)) /* -1: dropped by capacity_drop */
      return rt_fail("%s: expert %d at position %lld (token %lld, choice %lld) is outside "
                     "[0, %lld)", op, idx[p], (long long)p, (long long)(p / K),
                     (long long)(p % K), (long long)E);
  int64_t *fill = calloc((size_t)E, sizeof *fill);
  int64_t *s = slot ? malloc(sizeof *s * (size_t)(N * K)) : NULL;
  int64_t *f = src ? malloc(sizeof *f * (size_t)(E * C)) : NULL;
  if (!fill || (slot && !s) || (src && !f)) {
    free(fill), free(s), free(f);
    return rt_fail("%s: out of memory for the routing table (%lld choices, %lld slots)", op,
                   (long long)(N * K), (long long)(E * C));
  }
  for (int64_t q = 0; f && q < E * C; q++) f[q] = -1;
  for (int64_t p = 0; p < N * K; p++) {
    int64_t e = idx[p], c = e >= 0 && fill[e] < C ? fill[e]++ : -1;
    if (s) s[p] = c;
    if (f && c >= 0) f[e * C + c] = p;
  }
  free(fill);
  if (slot) *slot = s;
  if (src) *src = f;
  return RT_OK;
}

typedef struct {
  float *out;
  const float *x, *w;   /* x: the [N, D] operand (x or dout); w: weights or NULL */
  const float *y;       /* [E, C, D] operand of combine / combine_grad_w */
  const int32_t *idx;
  const int64_t *slot, *src;
  int64_t K, D, C;
} Route;

/* dispatch and combine_grad_y: one task per slot row (e, c) of out [E, C, D]. */
static void to_slots_range(void *ctx, int64_t begin, int64_t end) {
  Route *a = ctx;
  int64_t D = a->D;
  for (int64_t q = begin; q < end; q++) {
    float *o = a->out + q * D;
    int64_t p = a->src[q];
    if (p < 0) {
      memset(o, 0, sizeof(float) * (size_t)D);
      continue;
    }
    const float *xr = a->x + (p / a->K) * D;
    if (!a->w) {
      memcpy(o, xr, sizeof(float) * (size_t)D);
      continue;
    }
    float wp = a->w[p];
    for (int64_t d = 0; d < D; d++) o[d] = wp * xr[d];
  }
}

static int to_slots(const char *op, float *out, const float *x, const int32_t *idx,
                    const float *w, int64_t N, int64_t K, int64_t D, int64_t E, int64_t C) {
  if (POSITIVE(op, "N K D E C", N, K, D, E, C) || fits(op, N, K, 1) || fits(op, N, D, 1) ||
      fits(op, E, C, D))
    return RT_ERR;
  int64_t *src;
  if (route(op, idx, N, K, E, C, NULL, &src)) return RT_ERR;
  Route a = {.out = out, .x = x, .w = w, .idx = idx, .src = src, .K = K, .D = D, .C = C};
  rt_parallel_for(E * C, row_grain(D), to_slots_range, &a);
  free(src);
  return RT_OK;
}

int rt_dispatch(float *out, const float *x, const int32_t *idx, int64_t N, int64_t K,
                int64_t D, int64_t E, int64_t C) {
  if (!out || !x || !idx) return null_arg("dispatch", !out ? "output" : !x ? "x" : "idx");
  return to_slots("dispatch", out, x, idx, NULL, N, K, D, E, C);
}

int rt_route_stats(float *stats, const int32_t *idx, int64_t N, int64_t K, int64_t E,
                   int64_t C) {
  if (!stats || !idx) return null_arg("route_stats", !stats ? "stats" : "idx");
  if (POSITIVE("route_stats", "N K E C", N, K, E, C) || fits("route_stats", N, K, 1))
    return RT_ERR;
  int64_t *slot;
  if (route("route_stats", idx, N, K, E, C, &slot, NULL)) return RT_ERR;
  for (int64_t p = 0; p < N * K; p++) /* a kept choice has a slot of its expert */
    if (slot[p] >= 0) stats[idx[p]] += 1.0f;
  stats[E] += (float)(N * K);
  free(slot);
  return RT_OK;
}

int rt_combine_grad_y(float *dy, const float *dout, const int32_t *idx, const float *w,
                      int64_t N, int64_t K, int64_t D, int64_t E, int64_t C) {
  if (!dy || !dout || !idx || !w)
    return null_arg("combine_grad_y", !dy ? "output" : !dout ? "dout" : !idx ? "idx" : "w");
  return to_slots("combine_grad_y", dy, dout, idx, w, N, K, D, E, C);
}

/* combine: one task per token row of out [N, D]. */
static void combine_range(void *ctx, int64_t begin, int64_t end) {
  Route *a = ctx;
  int64_t D = a->D, K = a->K;
  for (int64_t n = begin; n < end; n++) {
    float *o = a->out + n * D;
    memset(o, 0, sizeof(float) * (size_t)D);
    for (int64_t p = n * K; p < (n + 1) * K; p++) {
      if (a->slot[p] < 0) continue;
      const float *yr = a->y + ((int64_t)a->idx[p] * a->C + a->slot[p]) * D;
      float wp = a->w[p];
      for (int64_t d = 0; d < D; d++) o[d] += wp * yr[d];
    }
  }
}

/* combine_grad_w: one task per choice p of dw [N, K]. */
static void combine_w_range(void *ctx, int64_t begin, int64_t end) {
  Route *a = ctx;
  int64_t D = a->D;
  for (int64_t p = begin; p < end; p++) {
    float s = 0;
    if (a->slot[p] >= 0) {
      const float *xr = a->x + (p / a->K) * D;
      const float *yr = a->y + ((int64_t)a->idx[p] * a->C + a->slot[p]) * D;
      for (int64_t d = 0; d < D; d++) s += xr[d] * yr[d];
    }
    a->out[p] = s;
  }
}

static int from_slots(const char *op, float *out, const float *x, const float *y,
                      const int32_t *idx, const float *w, int64_t N, int64_t K, int64_t D,
                      int64_t E, int64_t C) {
  if (POSITIVE(op, "N K D E C", N, K, D, E, C) || fits(op, N, K, 1) || fits(op, N, D, 1) ||
      fits(op, E, C, D))
    return RT_ERR;
  int64_t *slot;
  if (route(op, idx, N, K, E, C, &slot, NULL)) return RT_ERR;
  Route a = {.out = out, .x = x, .w = w, .y = y, .idx = idx, .slot = slot, .K = K, .D = D,
             .C = C};
  if (w) rt_parallel_for(N, row_grain(K * D), combine_range, &a);
  else rt_parallel_for(N * K, row_grain(D), combine_w_range, &a);
  free(slot);
  return RT_OK;
}

int rt_combine(float *out, const float *y, const int32_t *idx, const float *w, int64_t N,
               int64_t K, int64_t D, int64_t E, int64_t C) {
  if (!out || !y || !idx || !w)
    return null_arg("combine", !out ? "output" : !y ? "y" : !idx ? "idx" : "w");
  return from_slots("combine", out, NULL, y, idx, w, N, K, D, E, C);
}

int rt_combine_grad_w(float *dw, const float *dout, const float *y, const int32_t *idx,
                      int64_t N, int64_t K, int64_t D, int64_t E, int64_t C) {
  if (!dw || !dout || !y || !idx)
    return null_arg("combine_grad_w", !dw ? "output" : !dout ? "dout" : !y ? "y" : "idx");
  return from_slots("combine_grad_w", dw, dout, y, idx, NULL, N, K, D, E, C);
}

/* ---- embedding ------------------------------------------------------------------ */

typedef struct {
  float *out;
  const float *src;
  const int32_t *ids;
  int64_t count, V, D;
  int64_t lo; /* vocabulary parallelism: the table's rows are ids [lo, lo + V) */
} Embed;

static void embed_range(void *ctx, int64_t begin, int64_t end) {
  Embed *a = ctx;
  for (int64_t p = begin; p < end; p++) {
    int64_t r = (int64_t)a->ids[p] - a->lo;
    if (r >= 0 && r < a->V)
      memcpy(a->out + p * a->D, a->src + r * a->D, sizeof(float) * (size_t)a->D);
    else memset(a->out + p * a->D, 0, sizeof(float) * (size_t)a->D);
  }
}

int rt_embedding(float *out, const int32_t *ids, const float *table, int64_t count,
                 int64_t V, int64_t D) {
  if (!out || !ids || !table) return null_arg("embedding", !out ? "output" : !ids ? "ids" : "table");
  if (POSITIVE("embedding", "count V D", count, V, D) || fits("embedding", count, D, 1) ||
      fits("embedding", V, D, 1) || ids_ok("embedding", "id", ids, count, V, "the vocabulary "))
    return RT_ERR;
  Embed a = {out, table, ids, count, V, D, 0};
  rt_parallel_for(count, row_grain(D), embed_range, &a);
  return RT_OK;
}

/* Zeroes rows [begin, end) of dtable. */
static void zero_rows_range(void *ctx, int64_t begin, int64_t end) {
  Embed *a = ctx;
  memset(a->out + begin * a->D, 0, sizeof(float) * (size_t)((end - begin) * a->D));
}

/* One task per range of columns [begin, end) of dtable: adds the dy rows into them
 * in position order. */
static void embed_grad_range(void *ctx, int64_t begin, int64_t end) {
  Embed *a = ctx;
  int64_t D = a->D, w = end - begin;
  for (int64_t p = 0; p < a->count; p++) {
    int64_t r = (int64_t)a->ids[p] - a->lo;
    if (r < 0 || r >= a->V) continue;
    float *o = a->out + r * D + begin;
    const float *g = a->src + p * D + begin;
    for (int64_t j = 0; j < w; j++) o[j] += g[j];
  }
}

/* embedding_grad, onto what dtable holds where acc (rt_embedding_grad_acc) */
static int embedding_grad(const char *op, float *dtable, const int32_t *ids, const float *dy,
                          int64_t count, int64_t V, int64_t D, int acc) {
  if (!dtable || !ids || !dy) return null_arg(op, !dtable ? "output" : !ids ? "ids" : "dy");
  if (POSITIVE(op, "count V D", count, V, D) || fits(op, count, D, 1) || fits(op, V, D, 1) ||
      ids_ok(op, "id", ids, count, V, "the vocabulary "))
    return RT_ERR;
  Embed a = {dtable, dy, ids, count, V, D, 0};
  if (!acc) rt_parallel_for(V, row_grain(D), zero_rows_range, &a);
  /* 16 columns (one 64-byte line) at least per task, so tasks share no cache line
   * except at unaligned edges. */
  rt_parallel_for(D, 16, embed_grad_range, &a);
  return RT_OK;
}

int rt_embedding_grad(float *dtable, const int32_t *ids, const float *dy, int64_t count,
                      int64_t V, int64_t D) {
  return embedding_grad("embedding_grad", dtable, ids, dy, count, V, D, 0);
}

int rt_embedding_grad_acc(float *dtable, const int32_t *ids, const float *dy, int64_t count,
                          int64_t V, int64_t D) {
  return embedding_grad("embedding_grad_acc", dtable, ids, dy, count, V, D, 1);
}

/* ---- cross-entropy -------------------------------------------------------------- */

typedef struct {
  const float *logits;
  const int32_t *targets;
  int64_t V;
  double *loss;        /* forward: per-position loss */
  float *dlogits;      /* backward */
  float scale;         /* backward: dloss / N */
  atomic_int oom;
} Xent;

/* The largest of x[0..n), NaNs ignored (-inf if none), in 8 lanes so that it
 * vectorises; max is exact, so the lanes change nothing but the speed. */
static float row_max(const float *x, int64_t n) {
  float m[8];
  for (int l = 0; l < 8; l++) m[l] = -INFINITY;
  int64_t v = 0;
  for (; v + 8 <= n; v += 8)
    for (int l = 0; l < 8; l++) m[l] = x[v + l] > m[l] ? x[v + l] : m[l];
  for (; v < n; v++) m[0] = x[v] > m[0] ? x[v] : m[0];
  for (int l = 1; l < 8; l++) m[0] = m[l] > m[0] ? m[l] : m[0];
  return m[0];
}

/* The sum of e[0..n) in double: 8 lane sums (element v in lane v % 8 for the full
 * groups of 8, the tail in lane 0), then the lanes in order.  A fixed order:
 * the same bits every run. */
static double row_sum(const float *e, int64_t n) {
  double s[8] = {0};
  int64_t v = 0;
  for (; v + 8 <= n; v += 8)
    for (int l = 0; l < 8; l++) s[l] += (double)e[v + l];
  for (; v < n; v++) s[0] += (double)e[v];
  double t = 0;
  for (int l = 0; l < 8; l++) t += s[l];
  return t;
}

/* Per row: e = exp(x - max) (into the output row, or the task's scratch row for
 * the loss), its sum in double, then the loss or softmax - onehot.
 * In place (dlogits == logits, rt_route.h): row_max reads the row before any
 * write; the exp loop reads row[v] and then writes e[v], the same element,
 * and nothing reads the row after it (only e, which is the output); a row is
 * one task's, so rows on other threads are never touched. */
static void xent_range(void *ctx, int64_t begin, int64_t end) {
  Xent *a = ctx;
  int64_t V = a->V;
  float *tmp = NULL;
  if (a->loss && !(tmp = malloc(sizeof(float) * (size_t)V))) {
    atomic_store(&a->oom, 1);
    return;
  }
  for (int64_t p = begin; p < end; p++) {
    const float *row = a->logits + p * V;
    float *e = a->loss ? tmp : a->dlogits + p * V;
    float mx = row_max(row, V);
    for (int64_t v = 0; v < V; v++) e[v] = rt_exp_nonpos(row[v] - mx);
    double s = row_sum(e, V);
    if (a->loss) {
      a->loss[p] = (double)mx + log(s) - (double)row[a->targets[p]];
      continue;
    }
    float f = (float)(1.0 / s) * a->scale;
    for (int64_t v = 0; v < V; v++) e[v] *= f;
    e[a->targets[p]] -= a->scale;
  }
  free(tmp);
}

int rt_cross_entropy(float *loss, const float *logits, const int32_t *targets, int64_t N,
                     int64_t V) {
  if (!loss || !logits || !targets)
    return null_arg("cross_entropy", !loss ? "output" : !logits ? "logits" : "targets");
  if (POSITIVE("cross_entropy", "N V", N, V) || fits("cross_entropy", N, V, 1) ||
      ids_ok("cross_entropy", "target", targets, N, V, ""))
    return RT_ERR;
  double *per = malloc(sizeof(double) * (size_t)N);
  if (!per) return rt_fail("cross_entropy: out of memory for %lld losses", (long long)N);
  Xent a = {.logits = logits, .targets = targets, .V = V, .loss = per};
  rt_parallel_for(N, row_grain(V), xent_range, &a);
  if (atomic_load(&a.oom)) {
    free(per);
    return rt_fail("cross_entropy: out of memory for a row of %lld logits", (long long)V);
  }
  double total = 0;
  for (int64_t p = 0; p < N; p++) total += per[p];
  free(per);
  *loss = (float)(total / (double)N);
  return RT_OK;
}

int rt_cross_entropy_grad(float *dlogits, const float *logits, const int32_t *targets,
                          const float *dloss, int64_t N, int64_t V) {
  if (!dlogits || !logits || !targets || !dloss)
    return null_arg("cross_entropy_grad",
                    !dlogits ? "output" : !logits ? "logits" : !targets ? "targets" : "dloss");
  if (POSITIVE("cross_entropy_grad", "N V", N, V) || fits("cross_entropy_grad", N, V, 1) ||
      ids_ok("cross_entropy_grad", "target", targets, N, V, ""))
    return RT_ERR;
  Xent a = {.logits = logits, .targets = targets, .V = V, .dlogits = dlogits,
            .scale = (float)((double)*dloss / (double)N)};
  rt_parallel_for(N, row_grain(V), xent_range, &a);
  return RT_OK;
}

/* ---- vocabulary parallelism ---------------------------------------------------- */

int rt_vocab_embedding(float *out, const int32_t *ids, const float *table, int64_t count,
                       int64_t Vl, int64_t D, int part, int parts) {
  if (!out || !ids || !table)
    return null_arg("vocab_embedding", !out ? "output" : !ids ? "ids" : "table");
  if (POSITIVE("vocab_embedding", "count Vl D", count, Vl, D)) return RT_ERR;
  if (parts < 1 || part < 0 || part >= parts)
    return rt_fail("vocab_embedding: member %d of %d out of range", part, parts);
  if (fits("vocab_embedding", count, D, 1) || fits("vocab_embedding", Vl, D, parts) ||
      ids_ok("vocab_embedding", "id", ids, count, Vl * parts, "the vocabulary "))
    return RT_ERR;
  Embed a = {out, table, ids, count, Vl, D, (int64_t)part * Vl};
  rt_parallel_for(count, row_grain(D), embed_range, &a);
  return RT_OK;
}

/* vocab_embedding_grad, onto what dtable holds where acc */
static int vocab_embedding_grad(const char *op, float *dtable, const int32_t *ids,
                                const float *dy, int64_t count, int64_t Vl, int64_t D, int part,
                                int parts, int acc) {
  if (!dtable || !ids || !dy) return null_arg(op, !dtable ? "output" : !ids ? "ids" : "dy");
  if (POSITIVE(op, "count Vl D", count, Vl, D)) return RT_ERR;
  if (parts < 1 || part < 0 || part >= parts)
    return rt_fail("%s: member %d of %d out of range", op, part, parts);
  if (fits(op, count, D, 1) || fits(op, Vl, D, parts) ||
      ids_ok(op, "id", ids, count, Vl * parts, "the vocabulary "))
    return RT_ERR;
  Embed a = {dtable, dy, ids, count, Vl, D, (int64_t)part * Vl};
  if (!acc) rt_parallel_for(Vl, row_grain(D), zero_rows_range, &a);
  rt_parallel_for(D, 16, embed_grad_range, &a);
  return RT_OK;
}

int rt_vocab_embedding_grad(float *dtable, const int32_t *ids, const float *dy, int64_t count,
                            int64_t Vl, int64_t D, int part, int parts) {
  return vocab_embedding_grad("vocab_embedding_grad", dtable, ids, dy, count, Vl, D, part, parts,
                              0);
}

int rt_vocab_embedding_grad_acc(float *dtable, const int32_t *ids, const float *dy,
                                int64_t count, int64_t Vl, int64_t D, int part, int parts) {
  return vocab_embedding_grad("vocab_embedding_grad_acc", dtable, ids, dy, count, Vl, D, part,
                              parts, 1);
}

typedef struct {
  const float *logits;
  const int32_t *targets;
  int64_t Vl, lo;
  int64_t nv;        /* the member's real columns [0, nv): the rest is padding */
  const float *mx;   /* [N] the group's row maxima */
  float *send;       /* stats pass: [N, 3] sum of exp (hi, lo) and target logit */
  const double *s;   /* grad pass: [N] the group's sums of exp */
  float *dlogits;
  float scale;
} VXent;

static void vxent_stats_range(void *ctx, int64_t begin, int64_t end) {
  VXent *a = ctx;
  int64_t Vl = a->Vl, nv = a->nv;
  for (int64_t p = begin; p < end; p++) {
    const float *row = a->logits + p * Vl;
    float mx = a->mx[p];
    double s[8] = {0};
    int64_t v = 0;
    for (; v + 8 <= nv; v += 8)
      for (int l = 0; l < 8; l++) s[l] += (double)rt_exp_nonpos(row[v + l] - mx);
    for (; v < nv; v++) s[0] += (double)rt_exp_nonpos(row[v] - mx);
    double t = 0;
    for (int l = 0; l < 8; l++) t += s[l];
    float hi = (float)t;
    int64_t r = (int64_t)a->targets[p] - a->lo;
    a->send[3 * p] = hi;
    a->send[3 * p + 1] = (float)(t - (double)hi);
    a->send[3 * p + 2] = r >= 0 && r < Vl ? row[r] : 0.0f;
  }
}

/* In place (dlogits == logits, rt_route.h): vxent_stats has read every logit
 * it needs before this runs; here row[v] is read only to write e[v], the same
 * element, and the padding columns are written without being read. */
static void vxent_grad_range(void *ctx, int64_t begin, int64_t end) {
  VXent *a = ctx;
  int64_t Vl = a->Vl;
  for (int64_t p = begin; p < end; p++) {
    const float *row = a->logits + p * Vl;
    float *e = a->dlogits + p * Vl, mx = a->mx[p];
    float f = (float)(1.0 / a->s[p]) * a->scale;
    for (int64_t v = 0; v < a->nv; v++) e[v] = rt_exp_nonpos(row[v] - mx) * f;
    for (int64_t v = a->nv; v < Vl; v++) e[v] = 0.0f; /* padding: no gradient */
    int64_t r = (int64_t)a->targets[p] - a->lo;
    if (r >= 0 && r < Vl) e[r] -= a->scale;
  }
}

/* The member's real columns: those of global index below V. */
static int64_t real_columns(int64_t V, int64_t Vl, int part) {
  int64_t nv = V - (int64_t)part * Vl;
  return nv < 0 ? 0 : nv > Vl ? Vl : nv;
}

/* A vocab group g: NULL is the one-rank trainer's tp group, one member. */
static int vgroup_size(const RtComm *g) { return g ? rt_comm_size(g) : 1; }
static int vgroup_rank(const RtComm *g) { return g ? rt_comm_rank(g) : 0; }

/* A trainer's trace of the vocab group's collectives (rt_vocab_cross_entropy) */
typedef struct {
  RtTrace *t; /* NULL: none */
  int group;
} VTrace;

/* all_gather over g of n floats a member; a copy for the one-member NULL group
 * (not traced: no collective). */
static int vgather(RtComm *g, VTrace tr, const float *send, float *all, int64_t n,
                   int64_t *counts) {
  if (!g) {
    memcpy(all, send, sizeof(float) * (size_t)n);
    return RT_OK;
  }
  for (int k = 0; k < rt_comm_size(g); k++) counts[k] = n;
  double t0 = tr.t ? rt_trace_clock() : 0;
  int rc = rt_comm_all_gather(g, send, all, counts);
  if (rc == RT_OK && tr.t)
    rt_trace_comm(tr.t, RT_TRACE_ALL_GATHER, tr.group, RT_TRACE_BLOCKING, t0,
                  n * rt_comm_size(g));
  return rc;
}

/* The group's row maxima (mx [N]), sums of exp (s [N], double) and target
 * logits (t [N], double; NULL: not wanted), over the first V columns. */
static int vxent_stats(const char *op, RtComm *g, VTrace tr, const float *logits,
                       const int32_t *targets,
                       int64_t N, int64_t Vl, int64_t V, float *mx, double *s, double *t) {
  int parts = vgroup_size(g), part = vgroup_rank(g);
  if (fits(op, N, Vl, parts)) return RT_ERR;
  if (V < 1 || V > Vl * parts)
    return rt_fail("%s: vocabulary %lld outside [1, %lld], the group's columns", op,
                   (long long)V, (long long)(Vl * parts));
  if (ids_ok(op, "target", targets, N, V, "")) return RT_ERR;
  int64_t nv = real_columns(V, Vl, part);
  int64_t *counts = malloc(sizeof(int64_t) * (size_t)parts);
  float *all = malloc(sizeof(float) * (size_t)(3 * N * parts));
  float *send = malloc(sizeof(float) * (size_t)(3 * N));
  int rc = RT_OK;
  if (!counts || !all || !send) {
    rc = rt_fail("%s: out of memory for %lld rows of statistics", op, (long long)N);
    goto out;
  }
  for (int64_t p = 0; p < N; p++) send[p] = row_max(logits + p * Vl, nv);
  if (vgather(g, tr, send, all, N, counts)) {
    rc = RT_ERR;
    goto out;
  }
  for (int64_t p = 0; p < N; p++) {
    float m = all[p];
    for (int k = 1; k < parts; k++) m = all[k * N + p] > m ? all[k * N + p] : m;
    mx[p] = m;
  }
  VXent a = {.logits = logits, .targets = targets, .Vl = Vl, .lo = (int64_t)part * Vl,
             .nv = nv, .mx = mx, .send = send};
  rt_parallel_for(N, row_grain(Vl), vxent_stats_range, &a);
  if (vgather(g, tr, send, all, 3 * N, counts)) {
    rc = RT_ERR;
    goto out;
  }
  for (int64_t p = 0; p < N; p++) {
    double sum = 0, tl = 0;
    for (int k = 0; k < parts; k++) {
      const float *q = all + (int64_t)k * 3 * N + 3 * p;
      sum += (double)q[0] + (double)q[1];
      if (targets[p] / Vl == k) tl = (double)q[2];
    }
    s[p] = sum;
    if (t) t[p] = tl;
  }
out:
  free(counts);
  free(all);
  free(send);
  return rc;
}

int rt_vocab_cross_entropy(RtComm *g, RtTrace *trace, int trace_group, float *loss,
                           const float *logits, const int32_t *targets, int64_t N, int64_t Vl,
                           int64_t V) {
  if (!loss || !logits || !targets)
    return null_arg("vocab_cross_entropy", !loss ? "output" : !logits ? "logits" : "targets");
  if (POSITIVE("vocab_cross_entropy", "N Vl", N, Vl)) return RT_ERR;
  float *mx = malloc(sizeof(float) * (size_t)N);
  double *s = malloc(sizeof(double) * (size_t)N), *t = malloc(sizeof(double) * (size_t)N);
  int rc = !mx || !s || !t ? rt_fail("vocab_cross_entropy: out of memory for %lld rows",
                                     (long long)N)
                           : vxent_stats("vocab_cross_entropy", g, (VTrace){trace, trace_group},
                                         logits, targets, N, Vl, V, mx, s, t);
  if (rc == RT_OK) {
    double total = 0;
    for (int64_t p = 0; p < N; p++) total += (double)mx[p] + log(s[p]) - t[p];
    *loss = (float)(total / (double)N);
  }
  free(mx);
  free(s);
  free(t);
  return rc;
}

int rt_vocab_cross_entropy_grad(RtComm *g, RtTrace *trace, int trace_group, float *dlogits,
                                const float *logits, const int32_t *targets, const float *dloss,
                                int64_t N, int64_t Vl, int64_t V) {
  if (!dlogits || !logits || !targets || !dloss)
    return null_arg("vocab_cross_entropy_grad", !dlogits  ? "output"
                                                : !logits  ? "logits"
                                                : !targets ? "targets"
                                                           : "dloss");
  if (POSITIVE("vocab_cross_entropy_grad", "N Vl", N, Vl)) return RT_ERR;
  float *mx = malloc(sizeof(float) * (size_t)N);
  double *s = malloc(sizeof(double) * (size_t)N);
  int rc = !mx || !s ? rt_fail("vocab_cross_entropy_grad: out of memory for %lld rows",
                               (long long)N)
                     : vxent_stats("vocab_cross_entropy_grad", g, (VTrace){trace, trace_group},
                                   logits, targets, N, Vl, V, mx, s, NULL);
  if (rc == RT_OK) {
    VXent a = {.logits = logits, .targets = targets, .Vl = Vl,
               .lo = (int64_t)vgroup_rank(g) * Vl, .nv = real_columns(V, Vl, vgroup_rank(g)),
               .mx = mx, .s = s, .dlogits = dlogits,
               .scale = (float)((double)*dloss / (double)N)};
    rt_parallel_for(N, row_grain(Vl), vxent_grad_range, &a);
  }
  free(mx);
  free(s);
  return rc;
}

/* ---- sequence parallelism: collectives along one dimension ---------------- */

/* The pieces of [outer, n, inner] over g: piece floats per outer index (q) and
 * per member (outer q), checked. */
static int dim_pieces(const char *op, RtComm *g, int64_t outer, int64_t n, int64_t inner,
                      int64_t *q) {
  int parts = rt_comm_size(g);
  if (POSITIVE(op, "outer n inner", outer, n, inner) || fits(op, outer, n, inner)) return RT_ERR;
  if (n % parts)
    return rt_fail("%s: dimension %lld is not divisible by the group's %d members", op,
                   (long long)n, parts);
  *q = n / parts * inner;
  return RT_OK;
}

int rt_all_gather_dim(RtComm *g, const float *x, float *out, int64_t outer, int64_t n,
                      int64_t inner) {
  if (!g || !x || !out) return null_arg("all_gather_dim", !g ? "group" : !x ? "input" : "output");
  int64_t q;
  if (dim_pieces("all_gather_dim", g, outer, n, inner, &q)) return RT_ERR;
  int parts = rt_comm_size(g);
  int64_t *counts = malloc(sizeof(int64_t) * (size_t)parts);
  /* member-major: block k of tmp is member k's x, [outer, q] */
  float *tmp = outer > 1 ? malloc(sizeof(float) * (size_t)(outer * q * parts)) : out;
  int rc = RT_OK;
  if (!counts || !tmp) {
    rc = rt_fail("all_gather_dim: out of memory for %lld floats", (long long)(outer * q * parts));
    goto out;
  }
  for (int k = 0; k < parts; k++) counts[k] = outer * q;
  if ((rc = rt_comm_all_gather(g, x, tmp, counts)) != RT_OK || tmp == out) goto out;
  for (int64_t o = 0; o < outer; o++) /* to [outer, parts, q] */
    for (int k = 0; k < parts; k++)
      memcpy(out + (o * parts + k) * q, tmp + ((int64_t)k * outer + o) * q,
             sizeof(float) * (size_t)q);
out:
  free(counts);
  if (tmp != out) free(tmp);
  return rc;
}

int rt_reduce_scatter_dim(RtComm *g, const float *x, float *out, int64_t outer, int64_t n,
                          int64_t inner) {
  if (!g || !x || !out)
    return null_arg("reduce_scatter_dim", !g ? "group" : !x ? "input" : "output");
  int64_t q;
  if (dim_pieces("reduce_scatter_dim", g, outer, n, inner, &q)) return RT_ERR;
  int parts = rt_comm_size(g);
  int64_t *counts = malloc(sizeof(int64_t) * (size_t)parts);
  /* member-major: block k of tmp is x's piece for member k, [outer, q] */
  float *tmp = outer > 1 ? malloc(sizeof(float) * (size_t)(outer * q * parts)) : NULL;
  int rc = RT_OK;
  if (!counts || (outer > 1 && !tmp)) {
    rc = rt_fail("reduce_scatter_dim: out of memory for %lld floats",
                 (long long)(outer * q * parts));
    goto out;
  }
  for (int k = 0; k < parts; k++) counts[k] = outer * q;
  for (int64_t o = 0; tmp && o < outer; o++)
    for (int k = 0; k < parts; k++)
      memcpy(tmp + ((int64_t)k * outer + o) * q, x + (o * parts + k) * q,
             sizeof(float) * (size_t)q);
  rc = rt_comm_reduce_scatter(g, tmp ? tmp : x, out, counts);
out:
  free(counts);
  free(tmp);
  return rc;
}

int rt_local_slice(float *out, const float *x, int64_t outer, int64_t n, int64_t inner, int part,
                   int parts) {
  if (!out || !x) return null_arg("local_slice", !out ? "output" : "input");
  if (POSITIVE("local_slice", "outer n inner", outer, n, inner) ||
      fits("local_slice", outer, n, inner))
    return RT_ERR;
  if (parts < 1 || part < 0 || part >= parts || n % parts)
    return rt_fail("local_slice: member %d of %d, dimension %lld: out of range or not divisible",
                   part, parts, (long long)n);
  int64_t q = n / parts * inner;
  for (int64_t o = 0; o < outer; o++)
    memcpy(out + o * q, x + (o * parts + part) * q, sizeof(float) * (size_t)q);
  return RT_OK;
}

/* ---- capacity across data-parallel ranks ------------------------------------ */

int rt_capacity_drop(RtComm *g, int32_t *out, const int32_t *idx, int64_t N, int64_t K,
                     int64_t E, int64_t C) {
  if (!out || !idx) return null_arg("capacity_drop", !out ? "output" : "idx");
  if (POSITIVE("capacity_drop", "N K E C", N, K, E, C) || fits("capacity_drop", N, K, 1) ||
      ids_ok("capacity_drop", "expert", idx, N * K, E, ""))
    return RT_ERR;
  if (N * K > (1 << 24))
    return rt_fail("capacity_drop: %lld choices a rank: counts must stay exact in float",
                   (long long)(N * K));
  int parts = g ? rt_comm_size(g) : 1, me = g ? rt_comm_rank(g) : 0;
  float *cnt = calloc((size_t)E, sizeof *cnt), *all = malloc(sizeof *all * (size_t)(E * parts));
  int64_t *counts = malloc(sizeof *counts * (size_t)parts), *fill = calloc((size_t)E, sizeof *fill);
  int rc = RT_OK;
  if (!cnt || !all || !counts || !fill) {
    rc = rt_fail("capacity_drop: out of memory for %lld expert counts", (long long)(E * parts));
    goto out;
  }
  /* the members' per-expert counts (exact in float: below 2^24) */
  for (int64_t p = 0; p < N * K; p++) cnt[idx[p]] += 1.0f;
  for (int k = 0; k < parts; k++) counts[k] = E;
  if (g && parts > 1 && (rc = rt_comm_all_gather(g, cnt, all, counts)) != RT_OK) goto out;
  /* the earlier members' choices come first in global order */
  for (int k = 0; g && parts > 1 && k < me; k++)
    for (int64_t e = 0; e < E; e++) fill[e] += (int64_t)all[k * E + e];
  for (int64_t p = 0; p < N * K; p++) out[p] = fill[idx[p]]++ < C ? idx[p] : -1;
out:
  free(cnt), free(all), free(counts), free(fill);
  return rc;
}
