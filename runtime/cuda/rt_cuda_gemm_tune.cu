/* runtime/cuda/rt_cuda_gemm_tune.cu -- PARC_CUDA_GEMM_TUNE: each GEMM plan
 * runs the fastest of cuBLASLt's heuristic candidates, timed on this GPU,
 * instead of the heuristic's first choice.
 *
 *   unset, "" or 0   off: the heuristic's first choice (the default)
 *   1                time the candidates at each plan's first call; nothing kept
 *   FILE             the same, and the choices are kept in FILE: a plan FILE
 *                    names is not timed again (lines of this GPU's name and
 *                    cuBLASLt's version), a plan it lacks is timed and its
 *                    line appended at once
 *
 * The end of a step that planned GEMMs prints one line (world rank 0): how
 * many plans FILE named, how many were timed, how many of those run faster
 * than the first choice and by how much.
 *
 * Why a file: candidates differ in their order of summation, so a run that
 * times picks by this run's timings, and two such runs may differ in the last
 * bits; runs that read one FILE run the same algorithms, the same bits (and
 * so does the run that wrote it, from its first call on).
 *
 * Timing (rt_cuda_tune_time, from rt_cuda_gemm.cu's gemm() at a plan's first
 * call outside a graph capture): each candidate runs once, then RUNS more
 * times between two events, with this call's operands; where the call adds
 * into its result (beta 1) the candidates write a scratch of the result's
 * size, reading the result as C, so the call's own run adds once; else they
 * write the result, which the call's own run then writes again (and the
 * epilogues' outputs, the bias gradient and the GELU's aux matrix, likewise).
 * A candidate replaces the first choice only where it is faster by more than
 * MARGIN (timing noise must not flip near-equal choices).  The host waits for
 * the compute stream there, mid-step: tensor- and data-parallel ranks run the
 * same program, so they wait at the same points, after the same collectives;
 * a pipelined or expert-parallel trainer's ranks do not (a stage could wait
 * for a transfer its peer enqueues only after its own wait), so those do not
 * time: they run what FILE names and the first choice elsewhere.
 *
 * FILE's lines (# comments): the GPU's name (spaces as _), cuBLASLt's version,
 * the plan's key (rt_cuda_gemm.cu's cache key: batch m k n flags ta mode
 * bf16ops ld[3] al[3] want_epi al_bias al_aux), ':', the algorithm (cuBLASLt's
 * 8 opaque words, which it documents as storable for the same version), ':',
 * the chosen and the first choice's microseconds a run.  A line that does not
 * read so is reported once and ignored. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/cuda/rt_cuda_impl.h"

#define TUNE_KEY 17     /* the fields of a plan's key */
#define TUNE_RUNS 3     /* timed runs a candidate, after one untimed */
#define TUNE_MARGIN 0.02 /* a candidate must be this much faster than the first choice */

typedef struct {
  int64_t key[TUNE_KEY];
  cublasLtMatmulAlgo_t algo;
  double best_us, first_us;
} TuneEntry;

struct RtGemmTune {
  char path[1024]; /* "" : nothing kept */
  char dev[128];   /* the GPU's name, spaces as '_' */
  unsigned long long ver; /* cuBLASLt's */
  int may_time;    /* not pipelined */
  TuneEntry *e;
  int n, cap;
  int read, timed, faster; /* plans run from FILE, timed, timed and faster than the first */
  int reported;    /* read + timed when the last summary line was printed */
  int werr;        /* FILE could not be written (said once) */
  double gain_lo, gain_hi; /* the faster ones' gains (fraction of the first's time) */
};

static void key_of(const GemmPlan *p, int64_t k[TUNE_KEY]) {
  const int64_t v[TUNE_KEY] = {p->batch, p->m, p->k, p->n, p->flags, p->ta, p->mode,
                               p->bf16ops, p->ld[0], p->ld[1], p->ld[2], p->al[0], p->al[1],
                               p->al[2], p->want_epi, p->al_bias, p->al_aux};
  memcpy(k, v, sizeof v);
}

static int add_entry(RtGemmTune *t, const int64_t key[TUNE_KEY], const cublasLtMatmulAlgo_t *a,
                     double best, double first) {
  if (t->n == t->cap) {
    int cap = t->cap ? 2 * t->cap : 32;
    TuneEntry *e = (TuneEntry *)realloc(t->e, (size_t)cap * sizeof *e);
    if (!e) return RT_ERR;
    t->e = e, t->cap = cap;
  }
  TuneEntry *e = &t->e[t->n++];
  memcpy(e->key, key, sizeof e->key);
  e->algo = *a;
  e->best_us = best, e->first_us = first;
  return RT_OK;
}

/* One line of FILE into t if it is this GPU's and this cuBLASLt's: 1 read,
 * 0 another GPU's or version's (or a comment), -1 not a tuning line. */
static int parse_line(RtGemmTune *t, char *line) {
  char *s = line;
  while (*s == ' ' || *s == '\t') s++;
  if (!*s || *s == '\n' || *s == '#') return 0;
  char dev[128];
  int used = 0;
  unsigned long long ver;
  if (sscanf(s, "%127s %llu%n", dev, &ver, &used) != 2) return -1;
  s += used;
  int64_t key[TUNE_KEY];
  for (int i = 0; i < TUNE_KEY; i++) {
    char *end;
    errno = 0;
    key[i] = strtoll(s, &end, 10);
    if (end == s || errno) return -1;
    s = end;
  }
  cublasLtMatmulAlgo_t a;
  memset(&a, 0, sizeof a);
  unsigned long long w[8];
  double best, first;
  if (sscanf(s, " : %llx %llx %llx %llx %llx %llx %llx %llx : %lf %lf%n", &w[0], &w[1], &w[2],
             &w[3], &w[4], &w[5], &w[6], &w[7], &best, &first, &used) != 10)
    return -1;
  for (s += used; *s == ' ' || *s == '\t' || *s == '\n' || *s == '\r'; s++) {
  }
  if (*s) return -1;
  static_assert(sizeof a.data == sizeof w, "cuBLASLt's algorithm is 8 64-bit words");
  for (int i = 0; i < 8; i++) a.data[i] = (uint64_t)w[i];
  if (strcmp(dev, t->dev) || ver != t->ver) return 0;
  return add_entry(t, key, &a, best, first) == RT_OK ? 1 : -1;
}

static void read_file(RtGemmTune *t, int report) {
  FILE *f = fopen(t->path, "r");
  if (!f) return; /* not yet written: every plan is timed */
  char line[1024];
  int ln = 0, bad = 0;
  while (fgets(line, sizeof line, f)) {
    ln++;
    if (parse_line(t, line) < 0 && !bad++ && report)
      fprintf(stderr, "parcrt_cuda: %s:%d: not a GEMM tuning line (ignored; delete the file "
              "to tune again)\n", t->path, ln);
  }
  fclose(f);
}

/* Entry e appended to FILE, with the header first where FILE is empty (one
 * write a line, O_APPEND: ranks writing together do not interleave their
 * lines); RT_OK, or RT_ERR with errno. */
static int append_entry(const RtGemmTune *t, const TuneEntry *e) {
  int fd = open(t->path, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return RT_ERR;
  int rc = RT_OK;
  char line[640];
  if (lseek(fd, 0, SEEK_END) == 0) {
    int len = snprintf(line, sizeof line,
                       "# parc GEMM tuning (PARC_CUDA_GEMM_TUNE, runtime/cuda/rt_cuda_gemm_tune.cu): "
                       "gpu cublasLt-version batch m k n flags ta mode bf16ops ld[3] al[3] "
                       "epilogue al_bias al_aux : algorithm : us-chosen us-first-choice\n");
    if (write(fd, line, (size_t)len) != len) rc = RT_ERR;
  }
  int len = snprintf(line, sizeof line, "%s %llu", t->dev, t->ver);
  for (int j = 0; j < TUNE_KEY; j++)
    len += snprintf(line + len, sizeof line - (size_t)len, " %lld", (long long)e->key[j]);
  len += snprintf(line + len, sizeof line - (size_t)len, " :");
  for (int j = 0; j < 8; j++)
    len += snprintf(line + len, sizeof line - (size_t)len, " %016llx",
                    (unsigned long long)e->algo.data[j]);
  len += snprintf(line + len, sizeof line - (size_t)len, " : %.1f %.1f\n", e->best_us,
                  isfinite(e->first_us) ? e->first_us : -1.0);
  if (rc == RT_OK && write(fd, line, (size_t)len) != len) rc = RT_ERR;
  const int saved = errno;
  if (close(fd) && rc == RT_OK) return RT_ERR;
  errno = saved;
  return rc;
}

int rt_cuda_tune_open(RtCuda *c) {
  const char *v = getenv("PARC_CUDA_GEMM_TUNE");
  if (!v || !*v || !strcmp(v, "0")) return RT_OK;
  if (strlen(v) >= sizeof(((RtGemmTune *)0)->path))
    return rt_fail_setup("PARC_CUDA_GEMM_TUNE: a path of %zu characters; at most %zu",
                         strlen(v), sizeof(((RtGemmTune *)0)->path) - 1);
  RtGemmTune *t = (RtGemmTune *)calloc(1, sizeof *t);
  if (!t) return rt_fail("out of memory for the GEMM tuning table");
  c->tune = t;
  if (strcmp(v, "1")) snprintf(t->path, sizeof t->path, "%s", v);
  cudaDeviceProp prop;
  CU_CHECK(c, cudaGetDeviceProperties(&prop, c->device), "cudaGetDeviceProperties");
  snprintf(t->dev, sizeof t->dev, "%.100s", prop.name);
  for (char *s = t->dev; *s; s++)
    if (*s == ' ' || *s == '\t') *s = '_';
  if (!t->dev[0]) snprintf(t->dev, sizeof t->dev, "GPU");
  t->ver = (unsigned long long)cublasLtGetVersion();
  t->may_time = c->gsize[RT_CUDA_PP] <= 1 && c->gsize[RT_CUDA_EP] <= 1;
  if (!t->may_time && c->wrank == 0)
    fprintf(stderr, "parcrt_cuda: PARC_CUDA_GEMM_TUNE: a pipelined or expert-parallel trainer "
            "times no GEMMs (its ranks run different programs that wait for each other "
            "mid-step); it runs what %s names and cuBLASLt's first choice elsewhere\n",
            t->path[0] ? t->path : "a tuning file");
  if (t->path[0]) read_file(t, c->wrank == 0);
  return RT_OK;
}

void rt_cuda_tune_plan(RtCuda *c, GemmPlan *p, const cublasLtMatmulHeuristicResult_t *res,
                       int found) {
  RtGemmTune *t = c->tune;
  cublasLtMatmulAlgo_t cand[RT_CUDA_TUNE_ALGOS];
  int n = 0;
  for (int i = 0; i < found && n < RT_CUDA_TUNE_ALGOS; i++)
    if (res[i].state == CUBLAS_STATUS_SUCCESS) cand[n++] = res[i].algo;
  if (!t || n < 2) return;
  int64_t key[TUNE_KEY];
  key_of(p, key);
  for (int i = 0; i < t->n; i++) /* the file's first line of this key that is a candidate */
    if (!memcmp(t->e[i].key, key, sizeof key))
      for (int j = 0; j < n; j++)
        if (!memcmp(&cand[j], &t->e[i].algo, sizeof cand[j])) {
          p->algo = cand[j];
          t->read++;
          return;
        }
  if (!t->may_time) return;
  p->cand = (cublasLtMatmulAlgo_t *)malloc((size_t)n * sizeof *p->cand);
  if (!p->cand) return; /* untimed: the first choice */
  memcpy(p->cand, cand, (size_t)n * sizeof *cand);
  p->tune = n;
}

/* cuBLASLt's D of plan p: the result's bytes (its layout lc, type by flags) */
static size_t result_bytes(const GemmPlan *p) {
  size_t el = (p->flags & RT_CUDA_MM_C_BF16) ? 2 : 4;
  return el * (size_t)((p->batch - 1) * p->m * p->n + p->m * p->ld[2]);
}

int rt_cuda_tune_time(RtCuda *c, GemmPlan *p, const void *A, const void *B, const void *C,
                      float beta) {
  RtGemmTune *t = c->tune;
  const int n = p->tune;
  cublasLtMatmulAlgo_t *cand = p->cand;
  p->tune = 0, p->cand = NULL;
  void *D = (void *)C, *scratch = NULL;
  if (beta != 0.0f) { /* the candidates must not add into the result */
    if (cudaMalloc(&scratch, result_bytes(p)) != cudaSuccess) {
      (void)cudaGetLastError(); /* no room to time: the first choice */
      free(cand);
      return RT_OK;
    }
    D = scratch;
  }
  cudaEvent_t ev[2] = {NULL, NULL};
  const float alpha = 1.0f;
  auto run = [&](const cublasLtMatmulAlgo_t *algo) {
    return cublasLtMatmul(c->lt, p->op, &alpha, A, p->la, B, p->lb, &beta, C, p->lc, D, p->lc,
                          algo, c->lt_ws, RT_CUDA_GEMM_WORKSPACE, c->compute);
  };
  double us[RT_CUDA_TUNE_ALGOS];
  int rc = RT_OK;
  if (cudaEventCreate(&ev[0]) != cudaSuccess || cudaEventCreate(&ev[1]) != cudaSuccess)
    rc = rt_cuda_fail_at(c, __FILE__, __LINE__, "cudaEventCreate", "the GEMM tuning's events");
  for (int i = 0; rc == RT_OK && i < n; i++) {
    us[i] = INFINITY;
    cublasStatus_t st = run(&cand[i]); /* untimed: its first run may load its kernel */
    cudaError_t ce = cudaSuccess;
    if (st == CUBLAS_STATUS_SUCCESS) ce = cudaEventRecord(ev[0], c->compute);
    for (int r = 0; r < TUNE_RUNS && st == CUBLAS_STATUS_SUCCESS && ce == cudaSuccess; r++)
      st = run(&cand[i]);
    if (st != CUBLAS_STATUS_SUCCESS) { /* a candidate that does not run is not chosen */
      (void)cudaGetLastError();
      continue;
    }
    float ms = 0.0f;
    if (ce == cudaSuccess) ce = cudaEventRecord(ev[1], c->compute);
    if (ce == cudaSuccess) ce = cudaEventSynchronize(ev[1]);
    if (ce == cudaSuccess) ce = cudaEventElapsedTime(&ms, ev[0], ev[1]);
    if (ce != cudaSuccess)
      rc = rt_cuda_fail_at(c, __FILE__, __LINE__, "GEMM tuning", cudaGetErrorString(ce));
    else us[i] = 1e3 * ms / TUNE_RUNS;
  }
  for (int i = 0; i < 2; i++)
    if (ev[i]) cudaEventDestroy(ev[i]);
  cudaFree(scratch); /* (NULL: nothing; else it waits for the candidates' runs) */
  if (rc == RT_OK) {
    int best = 0; /* the fastest of those faster than the first choice by the margin */
    for (int i = 1; i < n; i++)
      if (us[i] < us[0] * (1.0 - TUNE_MARGIN) && us[i] < us[best]) best = i;
    if (isfinite(us[best])) {
      p->algo = cand[best];
      int64_t key[TUNE_KEY];
      key_of(p, key);
      if (add_entry(t, key, &cand[best], us[best], us[0]) != RT_OK)
        rc = rt_fail("out of memory for the GEMM tuning table");
      else if (t->path[0] && append_entry(t, &t->e[t->n - 1]) != RT_OK && !t->werr++)
        fprintf(stderr, "parcrt_cuda: GEMM tuning: cannot write %s: %s (this run's choices are "
                "not kept; check PARC_CUDA_GEMM_TUNE)\n", t->path, strerror(errno));
      t->timed++;
      if (best) {
        const double g = isfinite(us[0]) ? 1.0 - us[best] / us[0] : 0.0;
        t->gain_lo = t->faster ? fmin(t->gain_lo, g) : g;
        t->gain_hi = t->faster ? fmax(t->gain_hi, g) : g;
        t->faster++;
      }
    }
  }
  free(cand);
  return rc;
}

void rt_cuda_tune_step_end(RtCuda *c) {
  RtGemmTune *t = c->tune;
  if (!t || t->timed + t->read == t->reported) return;
  t->reported = t->timed + t->read;
  if (c->wrank) return;
  char line[1400];
  int len = t->path[0] ? snprintf(line, sizeof line, "%d plan%s as %s names, %d timed", t->read,
                                  t->read == 1 ? "" : "s", t->path, t->timed)
                       : snprintf(line, sizeof line, "%d plan%s timed", t->timed,
                                  t->timed == 1 ? "" : "s");
  const int lo = (int)lround(100 * t->gain_lo), hi = (int)lround(100 * t->gain_hi);
  if (t->timed)
    len += snprintf(line + len, sizeof line - (size_t)len,
                    ", %d of them faster than cuBLASLt's first choice", t->faster);
  if (t->faster && lo == hi) snprintf(line + len, sizeof line - (size_t)len, " (by %d%%)", lo);
  else if (t->faster) snprintf(line + len, sizeof line - (size_t)len, " (by %d-%d%%)", lo, hi);
  fprintf(stderr, "parcrt_cuda: GEMM tuning: %s\n", line);
}

void rt_cuda_tune_close(RtCuda *c) {
  RtGemmTune *t = c->tune;
  if (!t) return;
  free(t->e);
  free(t);
  c->tune = NULL;
}
