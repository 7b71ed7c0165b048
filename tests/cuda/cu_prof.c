/* tests/cuda/cu_prof.c -- the profile's host side (runtime/cuda/rt_cuda_prof.c)
 * on a fake event source: no CUDA, no GPU.  A fake clock stands for the
 * stream: the test moves it between an op's begin and end, record stores the
 * clock in the event, elapsed subtracts.
 *
 *   the switch (rt_prof_config), the warm-up (counts, records nothing, then
 *   makes every event the later steps need), nesting (only the outermost op
 *   records), aggregation per name, the table's numbers and order, the JSON
 *   lines (parsed back), the per-process file name, the report's rank order,
 *   many names (the hash table growing), and a failing event source (the
 *   profile stops, says so, and counts nothing of the failed step). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda/rt_cuda_prof.h"

static int failures;

#define CHECK(cond)                                                                         \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      fprintf(stderr, "cu_prof: %s:%d: %s\n", __FILE__, __LINE__, #cond);                   \
      failures++;                                                                           \
    }                                                                                       \
  } while (0)

typedef struct {
  double now;      /* ms */
  double t[8192];  /* each event's recorded time */
  int reserved, max_reserved, records, fail_elapsed;
} Fake;

static const char *f_reserve(void *ctx, int n) {
  Fake *f = ctx;
  if (n > 8192) return "fake: too many events";
  if (n > f->reserved) f->reserved = n;
  if (n > f->max_reserved) f->max_reserved = n;
  return NULL;
}

static const char *f_record(void *ctx, int ev) {
  Fake *f = ctx;
  if (ev < 0 || ev >= f->reserved) return "fake: event not reserved";
  f->t[ev] = f->now;
  f->records++;
  return NULL;
}

static const char *f_elapsed(void *ctx, int a, int b, double *ms) {
  Fake *f = ctx;
  if (f->fail_elapsed) return "fake: device lost";
  *ms = f->t[b] - f->t[a];
  return NULL;
}

static double f_wall(void *ctx) { return ((Fake *)ctx)->now * 1.1; }

static RtProf *make(Fake *f, int rank) {
  memset(f, 0, sizeof *f);
  RtProfEvents ev = {f, f_reserve, f_record, f_elapsed, f_wall};
  return rt_prof_new(&ev, rank, 2, "GPU 0 (Fake H200)", "tiny", "bf16");
}

/* One op of `ms` on the fake stream. */
static void op(RtProf *p, Fake *f, int kind, double ms, double bytes, double flops,
               const char *name) {
  rt_prof_begin(p);
  f->now += ms;
  rt_prof_end(p, kind, bytes, flops, name);
}

/* The step every test uses: 5 ms; k1 1 ms + 0.5 ms (1e6 bytes each), a GEMM
 * of 2 ms (2e9 FLOPs) with a nested copy inside it, 1.5 ms outside any op. */
static void step(RtProf *p, Fake *f) {
  rt_prof_step_begin(p);
  f->now += 0.5;
  op(p, f, RT_PROF_KERNEL, 1.0, 1e6, 0, "k1_add");
  rt_prof_begin(p); /* the GEMM, with a copy nested in it */
  f->now += 1.0;
  op(p, f, RT_PROF_OP, 0.5, 8e6, 0, "copy");
  f->now += 0.5;
  rt_prof_end(p, RT_PROF_GEMM, 3e6, 2e9, "matmul 64x64x64");
  f->now += 0.5;
  op(p, f, RT_PROF_KERNEL, 0.5, 1e6, 0, "k1_add");
  f->now += 0.5;
  rt_prof_step_end(p);
  rt_prof_step_done(p);
}

static char *read_all(FILE *f) {
  fflush(f);
  long n = ftell(f);
  rewind(f);
  char *s = calloc((size_t)n + 1, 1);
  if (s && fread(s, 1, (size_t)n, f) != (size_t)n) s[0] = 0;
  return s;
}

static const RtProfEntry *find(const RtProf *p, const char *name) {
  for (int i = 0; i < p->ne; i++)
    if (!strcmp(p->e[i].name, name)) return &p->e[i];
  return NULL;
}

static void test_config(void) {
  char path[64];
  CHECK(rt_prof_config(NULL, path, sizeof path) == 0 && !path[0]);
  CHECK(rt_prof_config("", path, sizeof path) == 0);
  CHECK(rt_prof_config("0", path, sizeof path) == 0);
  CHECK(rt_prof_config("1", path, sizeof path) == 1 && !path[0]);
  CHECK(rt_prof_config("yes", path, sizeof path) == 1 && !path[0]);
  CHECK(rt_prof_config("/tmp/p.jsonl", path, sizeof path) == 1 && !strcmp(path, "/tmp/p.jsonl"));
  CHECK(rt_prof_config("p.json", path, sizeof path) == 1 && !strcmp(path, "p.json"));
  CHECK(rt_prof_config("p.txt", path, sizeof path) == 1 && !path[0]);
  CHECK(rt_prof_config(".json", path, sizeof path) == 1 && !path[0]);
  char dst[128];
  rt_prof_json_path(dst, sizeof dst, "/a/b/prof.jsonl", 0);
  CHECK(!strcmp(dst, "/a/b/prof.jsonl"));
  rt_prof_json_path(dst, sizeof dst, "/a/b/prof.jsonl", 4);
  CHECK(!strcmp(dst, "/a/b/prof.rank4.jsonl"));
  rt_prof_json_path(dst, sizeof dst, "/a.b/prof", 2);
  CHECK(!strcmp(dst, "/a.b/prof.rank2"));
}

static void test_steps(void) {
  Fake f;
  RtProf *p = make(&f, 0);
  CHECK(p != NULL);
  if (!p) return;
  /* nothing happens outside a step */
  CHECK(rt_prof_begin(p) == 0);
  rt_prof_end(p, RT_PROF_OP, 1, 0, "x");
  CHECK(p->ne == 0 && f.records == 0);
  /* the warm-up: counted, not recorded, then the events made at once */
  step(p, &f);
  CHECK(p->steps == 0 && p->ne == 0 && f.records == 0);
  CHECK(p->warm_ops == 3);                 /* k1, the GEMM, k1: the copy nests */
  CHECK(f.max_reserved == 2 + 2 * 3);
  /* two recorded steps */
  step(p, &f);
  step(p, &f);
  CHECK(f.max_reserved == 8);              /* no event made after the warm-up */
  CHECK(p->steps == 2 && p->ne == 2);
  CHECK(fabs(p->step_ms - 10.0) < 1e-9);
  CHECK(fabs(p->wall_ms - 2 * 5.5) < 1e-9); /* begin at now - 0.5 ... done */
  const RtProfEntry *k1 = find(p, "k1_add"), *mm = find(p, "matmul 64x64x64");
  CHECK(k1 && k1->calls == 4 && fabs(k1->ms - 3.0) < 1e-9 && k1->bytes == 4e6 &&
        k1->kind == RT_PROF_KERNEL);
  CHECK(mm && mm->calls == 2 && fabs(mm->ms - 4.0) < 1e-9 && mm->flops == 4e9 &&
        mm->bytes == 6e6 && mm->kind == RT_PROF_GEMM);
  CHECK(!find(p, "copy"));                 /* nested: part of the GEMM */
  int order[2];
  rt_prof_sorted(p, order);
  CHECK(!strcmp(p->e[order[0]].name, "matmul 64x64x64") && !strcmp(p->e[order[1]].name, "k1_add"));

  /* the table */
  FILE *t = tmpfile();
  CHECK(t != NULL);
  if (!t) return;
  rt_prof_table(t, p);
  char *text = read_all(t);
  fclose(t);
  printf("%s", text);
  CHECK(strstr(text, "parc profile: rank 0 of 2, GPU 0 (Fake H200), model tiny, GEMM bf16\n"));
  CHECK(strstr(text, "  2 steps after the first: 5.000 ms per step on the device (5.500 ms on "
                     "the host), 70.0% of it in 2 ops (3 calls per step)\n"));
  /* GEMM: 2 ms a step, 40% of 5 ms, 1.5e9 bytes/s, 1 TFLOP/s */
  CHECK(strstr(text, "      2.0000  40.00          1       1.5      1.0  gemm      "
                     "matmul 64x64x64\n"));
  /* k1: 1.5 ms, 30%, two calls, 1.3 GB/s (4e6 bytes in 3 ms), no FLOPs */
  CHECK(strstr(text, "      1.5000  30.00          2       1.3        -  kernel    k1_add\n"));
  CHECK(strstr(text, "      1.5000  30.00                                -         (outside the ops"));
  CHECK(strstr(text, "matmul") < strstr(text, "k1_add"));
  free(text);

  /* the JSON lines, parsed back */
  FILE *j = tmpfile();
  CHECK(j != NULL);
  if (!j) return;
  rt_prof_jsonl(j, p);
  char *lines = read_all(j);
  fclose(j);
  int n = 0;
  for (char *s = strtok(lines, "\n"); s; s = strtok(NULL, "\n"), n++) {
    cJSON *o = cJSON_Parse(s);
    CHECK(o != NULL);
    if (!o) continue;
    const char *kind = cJSON_GetStringValue(cJSON_GetObjectItem(o, "profile"));
    double rank = cJSON_GetNumberValue(cJSON_GetObjectItem(o, "rank"));
    CHECK(rank == 0);
    if (n == 0) {
      CHECK(kind && !strcmp(kind, "step"));
      CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(o, "steps")) == 2);
      CHECK(fabs(cJSON_GetNumberValue(cJSON_GetObjectItem(o, "step_ms")) - 5.0) < 1e-9);
      CHECK(fabs(cJSON_GetNumberValue(cJSON_GetObjectItem(o, "ops_ms")) - 3.5) < 1e-9);
      CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(o, "gemm")), "bf16"));
    } else {
      CHECK(kind && !strcmp(kind, "op"));
      const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(o, "name"));
      const char *ceil = cJSON_GetStringValue(cJSON_GetObjectItem(o, "ceiling"));
      double tf = cJSON_GetNumberValue(cJSON_GetObjectItem(o, "tflop_s"));
      double gb = cJSON_GetNumberValue(cJSON_GetObjectItem(o, "gb_s"));
      double pct = cJSON_GetNumberValue(cJSON_GetObjectItem(o, "pct_step"));
      if (n == 1) {
        CHECK(name && !strcmp(name, "matmul 64x64x64") && ceil && !strcmp(ceil, "tensor"));
        CHECK(fabs(tf - 1.0) < 1e-6 && fabs(gb - 1.5) < 1e-6 && fabs(pct - 40) < 1e-6);
        CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(o, "flops")) == 4e9);
      } else {
        CHECK(name && !strcmp(name, "k1_add") && ceil && !strcmp(ceil, "hbm"));
        CHECK(tf == 0 && fabs(gb - 4e6 / 3e-3 / 1e9) < 1e-5);
        CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(o, "calls")) == 4);
      }
    }
    cJSON_Delete(o);
  }
  CHECK(n == 3);
  free(lines);

  /* a failing event source: the step is not counted, and the profile stops */
  f.fail_elapsed = 1;
  step(p, &f);
  CHECK(p->failed == 1 && p->steps == 2 && find(p, "k1_add")->calls == 4);
  f.fail_elapsed = 0;
  int before = f.records;
  step(p, &f);
  CHECK(p->steps == 2 && f.records == before); /* stopped for good */
  t = tmpfile();
  if (t) {
    rt_prof_table(t, p);
    text = read_all(t);
    fclose(t);
    CHECK(strstr(text, "(stopped early: reading the step's events: fake: device lost)"));
    free(text);
  }
  rt_prof_free(p);
}

static void test_report(void) {
  Fake f0, f1;
  RtProf *a = make(&f1, 1), *b = make(&f0, 0);
  if (!a || !b) {
    CHECK(0);
    return;
  }
  step(a, &f1); /* rank 1: only the warm-up */
  step(b, &f0);
  step(b, &f0);
  FILE *t = tmpfile(), *j = tmpfile();
  if (!t || !j) return;
  RtProf *ps[2] = {a, b};
  rt_prof_report(t, j, ps, 2);
  char *text = read_all(t), *lines = read_all(j);
  fclose(t);
  fclose(j);
  char *r0 = strstr(text, "rank 0 of 2"), *r1 = strstr(text, "rank 1 of 2");
  CHECK(r0 && r1 && r0 < r1);
  CHECK(strstr(text, "no step after the first (the warm-up) was recorded"));
  CHECK(strstr(lines, "\"rank\": 0") < strstr(lines, "\"rank\": 1"));
  free(text);
  free(lines);
  rt_prof_free(a);
  rt_prof_free(b);
}

static void test_names(void) {
  Fake f;
  RtProf *p = make(&f, 0);
  if (!p) return;
  step(p, &f);
  rt_prof_step_begin(p);
  char name[160];
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < 700; i++) {
      snprintf(name, sizeof name, "kernel_%d", i);
      op(p, &f, RT_PROF_KERNEL, 0.001 * (i + 1), 4, 0, name);
    }
  memset(name, 'x', sizeof name - 1); /* longer than RT_PROF_NAME: truncated, still one entry */
  name[sizeof name - 1] = 0;
  op(p, &f, RT_PROF_OP, 1, 0, 0, name);
  op(p, &f, RT_PROF_OP, 1, 0, 0, name);
  op(p, &f, 99, 1, 0, 0, NULL); /* no name, an unknown kind: "?", op */
  rt_prof_step_end(p);
  rt_prof_step_done(p);
  CHECK(p->ne == 702 && p->steps == 1);
  CHECK(f.max_reserved == 2 + 2 * 1403);
  int ok = 1;
  for (int i = 0; i < 700; i++) {
    snprintf(name, sizeof name, "kernel_%d", i);
    const RtProfEntry *e = find(p, name);
    ok &= e && e->calls == 2 && fabs(e->ms - 0.002 * (i + 1)) < 1e-9;
  }
  CHECK(ok);
  const RtProfEntry *q = find(p, "?");
  CHECK(q && q->kind == RT_PROF_OP && q->calls == 1);
  int longest = 0;
  for (int i = 0; i < p->ne; i++)
    if ((int)strlen(p->e[i].name) == RT_PROF_NAME - 1) {
      longest++;
      CHECK(p->e[i].calls == 2);
    }
  CHECK(longest == 1);
  rt_prof_free(p);
}

/* cu_prof --jsonl PATH: a fake two-rank profile's JSON lines (every kind),
 * for tests/gpu/compare.py profile (ctest cuda/prof_compare). */
static int write_jsonl(const char *path) {
  Fake f[2];
  RtProf *ps[2];
  for (int r = 0; r < 2; r++) {
    ps[r] = make(&f[r], 1 - r);
    if (!ps[r]) return 1;
    for (int s = 0; s < 3; s++) {
      rt_prof_step_begin(ps[r]);
      op(ps[r], &f[r], RT_PROF_GEMM, 2.0, 3e9, 1.5e12, "matmul 8192x768x3072");
      op(ps[r], &f[r], RT_PROF_GEMM_FP32, 1.0, 1e8, 3e10, "matmul_ta 768x8192x768");
      op(ps[r], &f[r], RT_PROF_ATTENTION, 1.0, 1e8, 2e10, "sdpa 8x12x12x1024x64 causal");
      op(ps[r], &f[r], RT_PROF_KERNEL, 0.5, 1.2e9, 0, "k12_add");
      op(ps[r], &f[r], RT_PROF_OP, 0.25, 4e8, 0, "cross_entropy");
      op(ps[r], &f[r], RT_PROF_COMM, 0.25, 1e8, 0, "all_reduce dp");
      op(ps[r], &f[r], RT_PROF_HOST, 0.25, 1e6, 0, "topk (host)");
      f[r].now += 0.75;
      rt_prof_step_end(ps[r]);
      rt_prof_step_done(ps[r]);
    }
  }
  FILE *out = fopen(path, "w");
  if (!out) return 1;
  rt_prof_report(NULL, out, ps, 2);
  int rc = fclose(out) != 0;
  rt_prof_free(ps[0]);
  rt_prof_free(ps[1]);
  return rc;
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "--jsonl")) return write_jsonl(argv[2]);
  test_config();
  test_steps();
  test_report();
  test_names();
  printf("cu_prof: %s\n", failures ? "FAIL" : "ok");
  return failures ? 1 : 0;
}
