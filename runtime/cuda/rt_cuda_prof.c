/* runtime/cuda/rt_cuda_prof.c -- the per-kernel profile's host side: records,
 * entries, the table, the JSON lines and the exit report.  No CUDA here (see
 * rt_cuda_prof.h); the events come through RtProfEvents. */
#include "runtime/cuda/rt_cuda_prof.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

const char *const rt_prof_kind_name[RT_PROF_NKINDS] = {
    "kernel", "gemm", "gemm_fp32", "attention", "op", "comm", "host", "attention_tc"};
const char *const rt_prof_ceiling_name[RT_PROF_NKINDS] = {"hbm",  "tensor", "fp32", "fp32",
                                                          "hbm",  "none",   "none", "tensor"};

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n > k && !strcmp(s + n - k, suffix);
}

int rt_prof_config(const char *value, char *path, size_t len) {
  if (len) path[0] = 0;
  if (!value || !value[0] || !strcmp(value, "0")) return 0;
  if ((ends_with(value, ".json") || ends_with(value, ".jsonl")) && strlen(value) < len)
    memcpy(path, value, strlen(value) + 1);
  return 1;
}

RtProf *rt_prof_new(const RtProfEvents *ev, int rank, int ranks, const char *device,
                    const char *model, const char *gemm) {
  RtProf *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->ev = *ev;
  p->open_ev = -1;
  p->rank = rank;
  p->ranks = ranks;
  snprintf(p->device, sizeof p->device, "%s", device ? device : "?");
  snprintf(p->model, sizeof p->model, "%s", model ? model : "?");
  snprintf(p->gemm, sizeof p->gemm, "%s", gemm ? gemm : "?");
  return p;
}

void rt_prof_free(RtProf *p) {
  if (!p) return;
  free(p->e);
  free(p->hash);
  free(p->rec);
  free(p);
}

/* Stops recording for good, saying why (once). */
static void stop(RtProf *p, const char *what, const char *why) {
  if (!p->failed) {
    snprintf(p->why, sizeof p->why, "%s: %s", what, why ? why : "failed");
    fprintf(stderr, "train_cuda: rank %d: the profile stops: %s\n", p->rank, p->why);
  }
  p->failed = 1;
  p->on = 0;
  p->warm = 0;
  p->open_ev = -1;
}

static int reserve(RtProf *p, int n) {
  const char *why = p->ev.reserve ? p->ev.reserve(p->ev.ctx, n) : "no events";
  if (why) stop(p, "making events", why);
  return why ? -1 : 0;
}

static int record(RtProf *p, int ev) {
  const char *why = p->ev.record ? p->ev.record(p->ev.ctx, ev) : "no events";
  if (why) stop(p, "recording an event", why);
  return why ? -1 : 0;
}

void rt_prof_step_begin(RtProf *p) {
  if (p->failed) return;
  p->begun++;
  p->depth = 0;
  p->open_ev = -1;
  p->nrec = 0;
  p->on = 1;
  p->warm = p->begun == 1;
  if (p->warm) {
    p->warm_ops = 0;
    return;
  }
  p->nev = 2;
  p->ended = 0;
  p->wall0 = p->ev.wall_ms ? p->ev.wall_ms(p->ev.ctx) : 0;
  if (reserve(p, 2 + 2 * p->warm_ops)) return; /* made once, after the warm-up */
  record(p, 0);
}

int rt_prof_begin(RtProf *p) {
  if (!p->on || p->depth++ > 0) return 0;
  if (p->warm) {
    p->warm_ops++;
    return 0;
  }
  int ev = p->nev;
  if (reserve(p, ev + 2) || record(p, ev)) return 0;
  p->nev = ev + 2;
  p->open_ev = ev;
  return 1;
}

static uint32_t hash_name(const char *s) {
  uint32_t h = 2166136261u;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
  return h;
}

/* The entry of `name` (made on first use); -1 when out of memory. */
static int entry(RtProf *p, const char *name, int kind) {
  char key[RT_PROF_NAME];
  snprintf(key, sizeof key, "%s", name && name[0] ? name : "?");
  if (2 * (p->ne + 1) > p->cap_hash) { /* grow: rehash */
    int cap = p->cap_hash ? 2 * p->cap_hash : 256;
    int *h = calloc((size_t)cap, sizeof *h);
    if (!h) return -1;
    for (int i = 0; i < p->ne; i++) {
      uint32_t s = hash_name(p->e[i].name) & (uint32_t)(cap - 1);
      while (h[s]) s = (s + 1) & (uint32_t)(cap - 1);
      h[s] = i + 1;
    }
    free(p->hash);
    p->hash = h;
    p->cap_hash = cap;
  }
  uint32_t s = hash_name(key) & (uint32_t)(p->cap_hash - 1);
  for (; p->hash[s]; s = (s + 1) & (uint32_t)(p->cap_hash - 1))
    if (!strcmp(p->e[p->hash[s] - 1].name, key)) return p->hash[s] - 1;
  if (p->ne == p->cap_e) {
    int cap = p->cap_e ? 2 * p->cap_e : 64;
    RtProfEntry *e = realloc(p->e, (size_t)cap * sizeof *e);
    if (!e) return -1;
    p->e = e;
    p->cap_e = cap;
  }
  RtProfEntry *e = &p->e[p->ne];
  memset(e, 0, sizeof *e);
  memcpy(e->name, key, sizeof key);
  e->kind = kind >= 0 && kind < RT_PROF_NKINDS ? kind : RT_PROF_OP;
  p->hash[s] = ++p->ne;
  return p->ne - 1;
}

void rt_prof_end(RtProf *p, int kind, double bytes, double flops, const char *name) {
  if (!p->on || p->depth <= 0) return;
  if (--p->depth > 0 || p->open_ev < 0) return;
  int ev = p->open_ev;
  p->open_ev = -1;
  if (record(p, ev + 1)) return;
  int i = entry(p, name, kind);
  if (i < 0) {
    stop(p, "the profile's tables", "out of memory");
    return;
  }
  if (p->nrec == p->cap_rec) {
    int cap = p->cap_rec ? 2 * p->cap_rec : 256;
    RtProfRec *r = realloc(p->rec, (size_t)cap * sizeof *r);
    if (!r) {
      stop(p, "the profile's records", "out of memory");
      return;
    }
    p->rec = r;
    p->cap_rec = cap;
  }
  p->rec[p->nrec++] = (RtProfRec){i, ev, bytes, flops, 0};
}

void rt_prof_step_end(RtProf *p) {
  if (!p->on || p->warm) return;
  if (!record(p, 1)) p->ended = 1;
}

void rt_prof_step_done(RtProf *p) {
  if (!p->on) return;
  p->on = 0;
  if (p->warm) {
    p->warm = 0;
    reserve(p, 2 + 2 * p->warm_ops);
    return;
  }
  if (p->depth) { /* an op left open: the step failed half-way; not counted */
    p->depth = 0;
    return;
  }
  if (!p->ended) {
    stop(p, "the step", "ended without rt_prof_step_end (an internal error)");
    return;
  }
  double step = 0;
  const char *why = p->ev.elapsed(p->ev.ctx, 0, 1, &step);
  if (why) {
    stop(p, "reading the step's events", why);
    return;
  }
  for (int k = 0; k < p->nrec; k++) /* every read first: a failure counts nothing */
    if ((why = p->ev.elapsed(p->ev.ctx, p->rec[k].ev, p->rec[k].ev + 1, &p->rec[k].ms))) {
      stop(p, "reading an op's events", why);
      return;
    }
  for (int k = 0; k < p->nrec; k++) {
    RtProfEntry *e = &p->e[p->rec[k].entry];
    e->ms += p->rec[k].ms;
    e->calls++;
    e->bytes += p->rec[k].bytes;
    e->flops += p->rec[k].flops;
  }
  p->nrec = 0;
  p->steps++;
  p->step_ms += step;
  if (p->ev.wall_ms) p->wall_ms += p->ev.wall_ms(p->ev.ctx) - p->wall0;
}

void rt_prof_detach(RtProf *p) {
  p->on = 0;
  p->warm = 0;
  p->open_ev = -1;
  p->nrec = 0;
  memset(&p->ev, 0, sizeof p->ev);
  p->failed = p->failed ? p->failed : 2; /* 2: closed, not an error */
  if (!p->why[0]) snprintf(p->why, sizeof p->why, "the device context closed");
}

/* ---- reports ---- */

static const RtProfEntry *sort_base;

static int by_time(const void *a, const void *b) {
  const RtProfEntry *x = &sort_base[*(const int *)a], *y = &sort_base[*(const int *)b];
  if (x->ms != y->ms) return x->ms > y->ms ? -1 : 1;
  return strcmp(x->name, y->name);
}

static pthread_mutex_t sort_mu = PTHREAD_MUTEX_INITIALIZER;

void rt_prof_sorted(const RtProf *p, int *order) {
  for (int i = 0; i < p->ne; i++) order[i] = i;
  pthread_mutex_lock(&sort_mu);
  sort_base = p->e;
  qsort(order, (size_t)p->ne, sizeof *order, by_time);
  pthread_mutex_unlock(&sort_mu);
}

static double ops_ms(const RtProf *p) {
  double s = 0;
  for (int i = 0; i < p->ne; i++) s += p->e[i].ms;
  return s;
}

static int64_t ops_calls(const RtProf *p) {
  int64_t s = 0;
  for (int i = 0; i < p->ne; i++) s += p->e[i].calls;
  return s;
}

/* A rate as text ("-" when the op has none). */
static const char *rate(char *buf, size_t len, double amount, double ms, double unit) {
  if (amount <= 0 || ms <= 0) snprintf(buf, len, "-");
  else snprintf(buf, len, "%.1f", amount / (ms * 1e-3) / unit);
  return buf;
}

static const char *per_step(char *buf, size_t len, int64_t calls, int64_t steps) {
  if (calls % steps == 0) snprintf(buf, len, "%lld", (long long)(calls / steps));
  else snprintf(buf, len, "%.2f", (double)calls / (double)steps);
  return buf;
}

void rt_prof_table(FILE *out, const RtProf *p) {
  fprintf(out, "parc profile: rank %d of %d, %s, model %s, GEMM %s\n", p->rank, p->ranks,
          p->device, p->model, p->gemm);
  if (p->failed == 1) fprintf(out, "  (stopped early: %s)\n", p->why);
  if (!p->steps) {
    fprintf(out, "  no step after the first (the warm-up) was recorded: run 2 steps or more\n");
    return;
  }
  double n = (double)p->steps, step = p->step_ms / n, ops = ops_ms(p) / n;
  char a[32], b[32], c[32];
  fprintf(out, "  %lld steps after the first: %.3f ms per step on the device (%.3f ms on the "
          "host), %.1f%% of it in %d ops (%s calls per step)\n", (long long)p->steps, step,
          p->wall_ms / n, step > 0 ? 100 * ops / step : 0.0, p->ne,
          per_step(a, sizeof a, ops_calls(p), p->steps));
  fprintf(out, "  %10s %6s %10s %9s %8s  %-9s %s\n", "ms/step", "%step", "calls/step", "GB/s",
          "TFLOP/s", "kind", "name");
  int *order = malloc(sizeof(int) * (size_t)(p->ne + 1));
  if (!order) return;
  rt_prof_sorted(p, order);
  for (int k = 0; k < p->ne; k++) {
    const RtProfEntry *e = &p->e[order[k]];
    fprintf(out, "  %10.4f %6.2f %10s %9s %8s  %-9s %s\n", e->ms / n,
            step > 0 ? 100 * e->ms / n / step : 0.0, per_step(a, sizeof a, e->calls, p->steps),
            rate(b, sizeof b, e->bytes, e->ms, 1e9), rate(c, sizeof c, e->flops, e->ms, 1e12),
            rt_prof_kind_name[e->kind], e->name);
  }
  free(order);
  double gap = step - ops > 0 ? step - ops : 0;
  fprintf(out, "  %10.4f %6.2f %10s %9s %8s  %-9s %s\n", gap, step > 0 ? 100 * gap / step : 0.0,
          "", "", "", "-", "(outside the ops: uploads, host waits, launch gaps)");
}

/* s as a JSON string. */
static void json_str(FILE *out, const char *s) {
  fputc('"', out);
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') fprintf(out, "\\%c", ch);
    else if (ch < 0x20) fprintf(out, "\\u%04x", ch);
    else fputc(ch, out);
  }
  fputc('"', out);
}

/* A finite double for JSON (NaN and infinities are not JSON numbers). */
static double fin(double x) { return isfinite(x) ? x : 0; }

void rt_prof_jsonl(FILE *out, const RtProf *p) {
  double n = p->steps ? (double)p->steps : 1, step = p->step_ms / n;
  fprintf(out, "{\"profile\": \"step\", \"rank\": %d, \"ranks\": %d, \"device\": ", p->rank,
          p->ranks);
  json_str(out, p->device);
  fprintf(out, ", \"model\": ");
  json_str(out, p->model);
  fprintf(out, ", \"gemm\": ");
  json_str(out, p->gemm);
  fprintf(out, ", \"steps\": %lld, \"step_ms\": %.6g, \"wall_ms\": %.6g, \"ops_ms\": %.6g, "
          "\"ops\": %d, \"calls_per_step\": %.6g", (long long)p->steps, fin(step),
          fin(p->wall_ms / n), fin(ops_ms(p) / n), p->ne, (double)ops_calls(p) / n);
  if (p->failed == 1) {
    fprintf(out, ", \"stopped\": ");
    json_str(out, p->why);
  }
  fprintf(out, "}\n");
  int *order = malloc(sizeof(int) * (size_t)(p->ne + 1));
  if (!order) return;
  rt_prof_sorted(p, order);
  for (int k = 0; k < p->ne; k++) {
    const RtProfEntry *e = &p->e[order[k]];
    double sec = e->ms * 1e-3;
    fprintf(out, "{\"profile\": \"op\", \"rank\": %d, \"name\": ", p->rank);
    json_str(out, e->name);
    fprintf(out, ", \"kind\": \"%s\", \"ceiling\": \"%s\", \"calls\": %lld, \"steps\": %lld, "
            "\"ms\": %.6g, \"ms_per_step\": %.6g, \"pct_step\": %.4g, \"bytes\": %.17g, "
            "\"flops\": %.17g, \"gb_s\": %.6g, \"tflop_s\": %.6g}\n",
            rt_prof_kind_name[e->kind], rt_prof_ceiling_name[e->kind], (long long)e->calls,
            (long long)p->steps, fin(e->ms), fin(e->ms / n),
            fin(step > 0 ? 100 * e->ms / n / step : 0), e->bytes, e->flops,
            fin(sec > 0 ? e->bytes / sec / 1e9 : 0), fin(sec > 0 ? e->flops / sec / 1e12 : 0));
  }
  free(order);
}

static int by_rank(const void *a, const void *b) {
  const RtProf *x = *(RtProf *const *)a, *y = *(RtProf *const *)b;
  return (x->rank > y->rank) - (x->rank < y->rank);
}

void rt_prof_report(FILE *out, FILE *json, RtProf *const *ps, int n) {
  RtProf **s = malloc(sizeof *s * (size_t)(n + 1));
  if (!s) return;
  memcpy(s, ps, sizeof *s * (size_t)n);
  qsort(s, (size_t)n, sizeof *s, by_rank);
  for (int i = 0; i < n; i++) {
    if (out) {
      if (i) fputc('\n', out);
      rt_prof_table(out, s[i]);
    }
    if (json) rt_prof_jsonl(json, s[i]);
  }
  free(s);
}

void rt_prof_json_path(char *dst, size_t len, const char *path, int lowest) {
  if (lowest <= 0) {
    snprintf(dst, len, "%s", path);
    return;
  }
  const char *dot = strrchr(path, '.'), *slash = strrchr(path, '/');
  if (!dot || (slash && dot < slash)) dot = path + strlen(path);
  snprintf(dst, len, "%.*s.rank%d%s", (int)(dot - path), path, lowest, dot);
}

/* ---- the process's registry and its exit handler ---- */

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static RtProf **reg;
static int nreg, cap_reg, reg_hooked;
static char reg_path[4096];

static void report_at_exit(void) {
  pthread_mutex_lock(&reg_mu);
  if (nreg) {
    int lowest = reg[0]->rank;
    for (int i = 1; i < nreg; i++) lowest = reg[i]->rank < lowest ? reg[i]->rank : lowest;
    FILE *json = NULL;
    char path[4200];
    if (reg_path[0]) {
      rt_prof_json_path(path, sizeof path, reg_path, lowest);
      if (!(json = fopen(path, "w")))
        fprintf(stderr, "train_cuda: cannot write the profile to %s\n", path);
    }
    fflush(stdout);
    rt_prof_report(stdout, json, reg, nreg);
    fflush(stdout);
    if (json) {
      if (fclose(json)) fprintf(stderr, "train_cuda: error writing the profile to %s\n", path);
      else fprintf(stderr, "train_cuda: profile written to %s\n", path);
    }
    for (int i = 0; i < nreg; i++) rt_prof_free(reg[i]);
    free(reg);
    reg = NULL;
    nreg = cap_reg = 0;
  }
  pthread_mutex_unlock(&reg_mu);
}

void rt_prof_register(RtProf *p, const char *path) {
  pthread_mutex_lock(&reg_mu);
  if (nreg == cap_reg) {
    int cap = cap_reg ? 2 * cap_reg : 8;
    RtProf **r = realloc(reg, sizeof *r * (size_t)cap);
    if (!r) {
      pthread_mutex_unlock(&reg_mu);
      fprintf(stderr, "train_cuda: rank %d: out of memory registering the profile\n", p->rank);
      return;
    }
    reg = r;
    cap_reg = cap;
  }
  reg[nreg++] = p;
  if (!reg_path[0] && path && path[0]) snprintf(reg_path, sizeof reg_path, "%s", path);
  if (!reg_hooked) {
    reg_hooked = 1;
    atexit(report_at_exit);
  }
  pthread_mutex_unlock(&reg_mu);
}
