/* tests/kir/check.c -- the compiled test kernels against plain C.
 *
 *   kir_check GROUP      GROUP: a kernel kind (gelu, softmax, ...), math, all
 *   kir_check bench      rough timings, not a test
 *   kir_check exhaustive exp, log, tanh on all 2^32 inputs (minutes)
 *
 * Links the object kir_gen wrote (host, generic x86-64 or libm variant) and
 * includes its header.  For every size of KT_SIZES each kernel runs
 *   1. on an empty row range, which must write nothing;
 *   2. on all rows in one call (outputs "a");
 *   3. on the rows split in two calls (outputs "b"), which must agree with
 *      "a" bit for bit: a row's result does not depend on the row range;
 * and every output buffer has guard zones either side that must survive.
 * The "a" outputs are then compared with a reference computed in double
 * (or, where the kernel has no transcendental or reduction, in float with
 * the same operation order, which must match bit for bit).  The tolerance
 * of each kernel is stated where it is checked: |got - ref| <= atol +
 * rtol |ref|. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"
#include "kernels_cpu.h"

#define N(a) (sizeof(a) / sizeof *(a))

/* ---- random inputs ---------------------------------------------------- */

static uint64_t rng = 0x9e3779b97f4a7c15u;

static uint64_t next64(void) {  /* splitmix64 */
  uint64_t z = (rng += 0x9e3779b97f4a7c15u);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
  return z ^ (z >> 31);
}

static float uniform(float lo, float hi) {
  return lo + (hi - lo) * (float)((double)(next64() >> 40) / (double)(1u << 24));
}

static uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* ---- guarded buffers -------------------------------------------------- */

#define GUARD 64                      /* floats each side */
#define SENTINEL 0x7fa5a5a5u          /* a NaN no kernel computes */

typedef struct {
  float *base;
  size_t n;
} Alloc;

static Alloc allocs[64];
static int nallocs;

static float *guarded(size_t n) {
  float *base = malloc((n + 2 * GUARD) * sizeof *base);
  if (!base || nallocs == N(allocs)) {
    fprintf(stderr, "out of memory\n");
    exit(3);
  }
  for (size_t i = 0; i < n + 2 * GUARD; i++) base[i] = from_bits(SENTINEL);
  allocs[nallocs++] = (Alloc){base, n};
  return base + GUARD;
}

/* Every guard zone intact; frees everything. */
static int release(const char *what) {
  int bad = 0;
  for (int a = 0; a < nallocs; a++) {
    const Alloc *p = &allocs[a];
    for (size_t i = 0; i < GUARD && !bad; i++)
      if (bits(p->base[i]) != SENTINEL || bits(p->base[GUARD + p->n + i]) != SENTINEL) {
        fprintf(stderr, "%s: a kernel wrote outside a buffer of %zu elements\n", what, p->n);
        bad = 1;
      }
    free(p->base);
  }
  nallocs = 0;
  return bad;
}

static float *rnd(size_t n, float lo, float hi) {
  float *p = guarded(n);
  for (size_t i = 0; i < n; i++) p[i] = uniform(lo, hi);
  return p;
}

/* An output: "a" for the one-call run, "b" for the split run, both
 * starting from init (random for inout buffers, else SENTINEL). */
typedef struct {
  float *a, *b, *init;
  size_t n;
} Out;

static Out outs[8];
static int nouts;

static Out *out_new(size_t n, int inout) {
  Out *o = &outs[nouts++];
  o->n = n;
  o->a = guarded(n);
  o->b = guarded(n);
  o->init = guarded(n);
  for (size_t i = 0; i < n; i++) {
    o->init[i] = inout ? uniform(-1, 1) : from_bits(SENTINEL);
    o->a[i] = o->b[i] = o->init[i];
  }
  return o;
}

static int outs_unchanged(const char *what) {
  for (int j = 0; j < nouts; j++)
    if (memcmp(outs[j].a, outs[j].init, outs[j].n * sizeof(float))) {
      fprintf(stderr, "%s: an empty row range wrote output %d\n", what, j);
      return 1;
    }
  return 0;
}

static int outs_agree(const char *what) {
  int bad = 0;
  for (int j = 0; j < nouts; j++)
    for (size_t i = 0; i < outs[j].n; i++)
      if (bits(outs[j].a[i]) != bits(outs[j].b[i])) {
        fprintf(stderr, "%s: output %d [%zu]: one call gave %.9g, split rows gave %.9g\n", what,
                j, i, (double)outs[j].a[i], (double)outs[j].b[i]);
        bad = 1;
        break;
      }
  nouts = 0;
  return bad;
}

/* Runs CALL (which passes O(out) for each output and lo, hi as the row
 * range) on an empty range, on all rows, and on the rows split in two. */
#define O(o) (side ? (o)->b : (o)->a)
#define RUN(what, rows, CALL)                     \
  do {                                            \
    int64_t h_ = (rows) / 2, lo = h_, hi = h_;    \
    int side = 0;                                 \
    CALL;                                         \
    bad |= outs_unchanged(what);                  \
    lo = 0, hi = (rows);                          \
    CALL;                                         \
    side = 1, lo = 0, hi = h_;                    \
    CALL;                                         \
    lo = h_, hi = (rows);                         \
    CALL;                                         \
    bad |= outs_agree(what);                      \
  } while (0)

/* ---- comparison ------------------------------------------------------- */

static double worst;  /* largest error / allowed error of the group */

static int close_to(const char *what, const float *got, const double *ref, size_t n,
                    double atol, double rtol) {
  for (size_t i = 0; i < n; i++) {
    double g = got[i], r = ref[i];
    int ok;
    double ratio = 0;
    if (isnan(r)) ok = isnan(g);
    else if (isinf(r)) ok = g == r;
    else {
      ratio = fabs(g - r) / (atol + rtol * fabs(r));
      ok = ratio <= 1;  /* false for NaN */
    }
    if (ratio > worst) worst = ratio;
    if (!ok) {
      fprintf(stderr, "%s [%zu]: got %.9g, want %.9g (atol %g, rtol %g)\n", what, i, g, r, atol,
              rtol);
      return 1;
    }
  }
  return 0;
}

static int exact(const char *what, const float *got, const float *ref, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (bits(got[i]) != bits(ref[i])) {
      fprintf(stderr, "%s [%zu]: got %.9g, want exactly %.9g\n", what, i, (double)got[i],
              (double)ref[i]);
      return 1;
    }
  return 0;
}

static double *dref(size_t n) {
  double *p = calloc(n ? n : 1, sizeof *p);
  if (!p) exit(3);
  return p;
}

static char name[96];
static const char *label(const char *kind, int64_t R, int64_t C) {
  snprintf(name, sizeof name, "%s_%lld_%lld", kind, (long long)R, (long long)C);
  return name;
}

/* ---- kernel tables ---------------------------------------------------- */

#define TABLE(kind, Fn)                                       \
  static const struct {                                       \
    int64_t R, C, rows;                                       \
    Fn *fn;                                                   \
  } kind##_k[] = {KT_SIZES(ENTRY_##kind)}
#define ENTRY(kind, R, C) {R, C, kind##_##R##_##C##_ROWS, kind##_##R##_##C},

typedef void Unary(const float *restrict, float *restrict, int64_t, int64_t);
typedef void Bias(const float *restrict, const float *restrict, const float *restrict,
                  float *restrict, int64_t, int64_t);
typedef void Norm(const float *restrict, const float *restrict, const float *restrict,
                  float *restrict, float *restrict, float *restrict, int64_t, int64_t);
typedef void Rms(const float *restrict, const float *restrict, float *restrict, int64_t, int64_t);
typedef void Ce(const float *restrict, const int32_t *restrict, float *restrict, int64_t, int64_t);
typedef void CeBwd(const float *restrict, const int32_t *restrict, const float *restrict,
                   float *restrict, int64_t, int64_t);
typedef void LnBwd(const float *restrict, const float *restrict, const float *restrict,
                   const float *restrict, const float *restrict, float *restrict, int64_t,
                   int64_t);
typedef void LnParams(const float *restrict, const float *restrict, const float *restrict,
                      const float *restrict, float *restrict, float *restrict, int64_t, int64_t);
typedef void Stats(const float *restrict, float *restrict, float *restrict, int64_t, int64_t);
typedef void Indexing(int32_t *restrict, float *restrict, int64_t, int64_t);

#define ENTRY_gelu(R, C) ENTRY(gelu, R, C)
#define ENTRY_bias_residual(R, C) ENTRY(bias_residual, R, C)
#define ENTRY_bcast(R, C) ENTRY(bcast, R, C)
#define ENTRY_softmax(R, C) ENTRY(softmax, R, C)
#define ENTRY_layernorm(R, C) ENTRY(layernorm, R, C)
#define ENTRY_rmsnorm(R, C) ENTRY(rmsnorm, R, C)
#define ENTRY_crossentropy(R, C) ENTRY(crossentropy, R, C)
#define ENTRY_ce_bwd(R, C) ENTRY(ce_bwd, R, C)
#define ENTRY_swiglu(R, C) ENTRY(swiglu, R, C)
#define ENTRY_colsum(R, C) ENTRY(colsum, R, C)
#define ENTRY_layernorm_bwd(R, C) ENTRY(layernorm_bwd, R, C)
#define ENTRY_ln_bwd_params(R, C) ENTRY(ln_bwd_params, R, C)
#define ENTRY_rowstats(R, C) ENTRY(rowstats, R, C)
#define ENTRY_indexing(R, C) ENTRY(indexing, R, C)

TABLE(gelu, Unary);
TABLE(bias_residual, Bias);
TABLE(bcast, Bias);
TABLE(softmax, Unary);
TABLE(layernorm, Norm);
TABLE(rmsnorm, Rms);
TABLE(crossentropy, Ce);
TABLE(ce_bwd, CeBwd);
TABLE(swiglu, Unary);
TABLE(colsum, Unary);
TABLE(layernorm_bwd, LnBwd);
TABLE(ln_bwd_params, LnParams);
TABLE(rowstats, Stats);
TABLE(indexing, Indexing);

#define ENTRY_causal(T) {T, causal_softmax_2_##T##_ROWS, causal_softmax_2_##T},
static const struct {
  int64_t T, rows;
  Unary *fn;
} causal_k[] = {KT_CAUSAL(ENTRY_causal)};

/* ---- the checks, one per kind ----------------------------------------- */

static int check_gelu(void) {
  int bad = 0;
  for (size_t s = 0; s < N(gelu_k); s++) {
    int64_t R = gelu_k[s].R, C = gelu_k[s].C, n = R * C;
    const char *what = label("gelu", R, C);
    float *x = rnd(n, -6, 6);
    Out *y = out_new(n, 0);
    RUN(what, gelu_k[s].rows, gelu_k[s].fn(x, O(y), lo, hi));
    double *ref = dref(n);
    for (int64_t i = 0; i < n; i++) {
      double v = x[i], u = (double)0.7978845608f * (v + (double)0.044715f * v * v * v);
      ref[i] = 0.5 * v * (1 + tanh(u));
    }
    /* tanh within a few ulp; 1 + tanh cancels for x << 0, hence atol. */
    bad |= close_to(what, y->a, ref, n, 1e-6, 1e-5);
    free(ref);
    bad |= release(what);
  }
  return bad;
}

static int check_bias_residual(void) {
  int bad = 0;
  for (size_t s = 0; s < N(bias_residual_k); s++) {
    int64_t R = bias_residual_k[s].R, C = bias_residual_k[s].C, n = R * C;
    const char *what = label("bias_residual", R, C);
    float *x = rnd(n, -1, 1), *b = rnd(C, -1, 1), *res = rnd(n, -1, 1), *ref = guarded(n);
    Out *y = out_new(n, 0);
    RUN(what, bias_residual_k[s].rows, bias_residual_k[s].fn(x, b, res, O(y), lo, hi));
    for (int64_t r = 0; r < R; r++)
      for (int64_t c = 0; c < C; c++) {
        float t = x[r * C + c] + b[c];
        ref[r * C + c] = t + res[r * C + c];
      }
    bad |= exact(what, y->a, ref, n);  /* no fast-math: same ops, same bits */
    bad |= release(what);
  }
  return bad;
}

static int check_bcast(void) {
  int bad = 0;
  for (size_t s = 0; s < N(bcast_k); s++) {
    int64_t R = bcast_k[s].R, C = bcast_k[s].C, n = R * C;
    const char *what = label("bcast", R, C);
    float *x = rnd(n, -1, 1), *scale = rnd(R, -2, 2), *b = rnd(C, -1, 1), *ref = guarded(n);
    Out *y = out_new(n, 0);
    RUN(what, bcast_k[s].rows, bcast_k[s].fn(x, scale, b, O(y), lo, hi));
    for (int64_t i = 0; i < n; i++) {
      float t = x[i] * scale[i / C];
      ref[i] = t + b[i % C];
    }
    bad |= exact(what, y->a, ref, n);
    bad |= release(what);
  }
  return bad;
}

static void softmax_ref(const float *x, double *y, int64_t n) {
  double mx = -INFINITY, sum = 0;
  for (int64_t c = 0; c < n; c++) mx = fmax(mx, x[c]);
  for (int64_t c = 0; c < n; c++) sum += y[c] = exp(x[c] - mx);
  for (int64_t c = 0; c < n; c++) y[c] /= sum;
}

static int check_softmax(void) {
  int bad = 0;
  for (size_t s = 0; s < N(softmax_k); s++) {
    int64_t R = softmax_k[s].R, C = softmax_k[s].C, n = R * C;
    const char *what = label("softmax", R, C);
    float *x = rnd(n, -10, 10);
    Out *y = out_new(n, 0);
    RUN(what, softmax_k[s].rows, softmax_k[s].fn(x, O(y), lo, hi));
    double *ref = dref(n);
    for (int64_t r = 0; r < R; r++) softmax_ref(x + r * C, ref + r * C, C);
    bad |= close_to(what, y->a, ref, n, 1e-9, 1e-5);
    free(ref);
    bad |= release(what);
  }
  return bad;
}

static int check_layernorm(void) {
  int bad = 0;
  for (size_t s = 0; s < N(layernorm_k); s++) {
    int64_t R = layernorm_k[s].R, C = layernorm_k[s].C, n = R * C;
    const char *what = label("layernorm", R, C);
    float *x = rnd(n, -2, 3), *w = rnd(C, 0.5f, 1.5f), *b = rnd(C, -1, 1);
    Out *y = out_new(n, 0), *mean = out_new(R, 0), *rstd = out_new(R, 0);
    RUN(what, layernorm_k[s].rows,
        layernorm_k[s].fn(x, w, b, O(y), O(mean), O(rstd), lo, hi));
    double *ry = dref(n), *rm = dref(R), *rr = dref(R);
    for (int64_t r = 0; r < R; r++) {
      const float *xr = x + r * C;
      double mu = 0, var = 0;
      for (int64_t c = 0; c < C; c++) mu += xr[c];
      mu /= C;
      for (int64_t c = 0; c < C; c++) var += (xr[c] - mu) * (xr[c] - mu);
      var /= C;  /* biased */
      rm[r] = mu;
      rr[r] = 1 / sqrt(var + (double)KT_EPS);
      for (int64_t c = 0; c < C; c++) ry[r * C + c] = (xr[c] - mu) * rr[r] * w[c] + b[c];
    }
    /* One-column rows have variance 0: rstd = 1/sqrt(eps) ~ 316 magnifies
     * the rounding of x - mean, which is exactly 0 here; no special case. */
    bad |= close_to(what, y->a, ry, n, 2e-5, 2e-5);
    bad |= close_to("layernorm mean", mean->a, rm, R, 1e-6, 1e-5);
    bad |= close_to("layernorm rstd", rstd->a, rr, R, 1e-6, 1e-5);
    free(ry), free(rm), free(rr);
    bad |= release(what);
  }
  return bad;
}

static int check_rmsnorm(void) {
  int bad = 0;
  for (size_t s = 0; s < N(rmsnorm_k); s++) {
    int64_t R = rmsnorm_k[s].R, C = rmsnorm_k[s].C, n = R * C;
    const char *what = label("rmsnorm", R, C);
    float *x = rnd(n, -2, 2), *w = rnd(C, 0.5f, 1.5f);
    Out *y = out_new(n, 0);
    RUN(what, rmsnorm_k[s].rows, rmsnorm_k[s].fn(x, w, O(y), lo, hi));
    double *ref = dref(n);
    for (int64_t r = 0; r < R; r++) {
      double ss = 0;
      for (int64_t c = 0; c < C; c++) ss += (double)x[r * C + c] * x[r * C + c];
      double rs = 1 / sqrt(ss / C + (double)KT_EPS);
      for (int64_t c = 0; c < C; c++) ref[r * C + c] = x[r * C + c] * rs * w[c];
    }
    bad |= close_to(what, y->a, ref, n, 1e-6, 1e-5);
    free(ref);
    bad |= release(what);
  }
  return bad;
}

/* Random targets in [0, C); the last row of a multi-row batch is ignored. */
static int32_t *targets(int64_t R, int64_t C) {
  int32_t *t = (int32_t *)guarded((size_t)R);
  for (int64_t r = 0; r < R; r++) t[r] = (int32_t)(next64() % (uint64_t)C);
  if (R > 1) t[R - 1] = -1;
  return t;
}

static double lse_ref(const float *x, int64_t C) {
  double mx = -INFINITY, sum = 0;
  for (int64_t c = 0; c < C; c++) mx = fmax(mx, x[c]);
  for (int64_t c = 0; c < C; c++) sum += exp(x[c] - mx);
  return mx + log(sum);
}

static int check_crossentropy(void) {
  int bad = 0;
  for (size_t s = 0; s < N(crossentropy_k); s++) {
    int64_t R = crossentropy_k[s].R, C = crossentropy_k[s].C;
    const char *what = label("crossentropy", R, C);
    float *x = rnd(R * C, -8, 8);
    int32_t *t = targets(R, C);
    Out *loss = out_new(R, 0);
    RUN(what, crossentropy_k[s].rows, crossentropy_k[s].fn(x, t, O(loss), lo, hi));
    double *ref = dref(R);
    for (int64_t r = 0; r < R; r++)
      ref[r] = t[r] < 0 ? 0 : lse_ref(x + r * C, C) - x[r * C + t[r]];
    bad |= close_to(what, loss->a, ref, R, 1e-5, 1e-5);
    free(ref);
    bad |= release(what);
  }
  return bad;
}

static int check_ce_bwd(void) {
  int bad = 0;
  for (size_t s = 0; s < N(ce_bwd_k); s++) {
    int64_t R = ce_bwd_k[s].R, C = ce_bwd_k[s].C, n = R * C;
    const char *what = label("ce_bwd", R, C);
    float *x = rnd(n, -8, 8), *dloss = rnd(R, 0.1f, 1);
    int32_t *t = targets(R, C);
    Out *dx = out_new(n, 0);
    RUN(what, ce_bwd_k[s].rows, ce_bwd_k[s].fn(x, t, dloss, O(dx), lo, hi));
    double *ref = dref(n);
    for (int64_t r = 0; r < R; r++) {
      double lse = lse_ref(x + r * C, C), g = t[r] < 0 ? 0 : dloss[r];
      for (int64_t c = 0; c < C; c++)
        ref[r * C + c] = (exp(x[r * C + c] - lse) - (c == t[r])) * g;
    }
    bad |= close_to(what, dx->a, ref, n, 1e-7, 1e-5);
    free(ref);
    bad |= release(what);
  }
  return bad;
}

static int check_swiglu(void) {
  int bad = 0;
  for (size_t s = 0; s < N(swiglu_k); s++) {
    int64_t R = swiglu_k[s].R, C = swiglu_k[s].C, n = R * C;
    const char *what = label("swiglu", R, C);
    float *h = rnd(2 * n, -8, 8);
    Out *y = out_new(n, 0);
    RUN(what, swiglu_k[s].rows, swiglu_k[s].fn(h, O(y), lo, hi));
    double *ref = dref(n);
    for (int64_t r = 0; r < R; r++)
      for (int64_t c = 0; c < C; c++) {
        double g = h[r * 2 * C + c], u = h[r * 2 * C + C + c];
        ref[r * C + c] = g / (1 + exp(-g)) * u;
      }
    bad |= close_to(what, y->a, ref, n, 1e-6, 1e-5);
    free(ref);
    bad |= release(what);
  }
  return bad;
}

static int check_colsum(void) {
  int bad = 0;
  for (size_t s = 0; s < N(colsum_k); s++) {
    int64_t R = colsum_k[s].R, C = colsum_k[s].C;
    const char *what = label("colsum", R, C);
    float *x = rnd(R * C, -1, 1);
    Out *out = out_new(C, 0);
    RUN(what, colsum_k[s].rows, colsum_k[s].fn(x, O(out), lo, hi));
    double *ref = dref(C);
    for (int64_t r = 0; r < R; r++)
      for (int64_t c = 0; c < C; c++) ref[c] += x[r * C + c];
    bad |= close_to(what, out->a, ref, C, 1e-6, 1e-6);
    free(ref);
    bad |= release(what);
  }
  return bad;
}

static int check_layernorm_bwd(void) {
  int bad = 0;
  for (size_t s = 0; s < N(layernorm_bwd_k); s++) {
    int64_t R = layernorm_bwd_k[s].R, C = layernorm_bwd_k[s].C, n = R * C;
    const char *what = label("layernorm_bwd", R, C);
    float *dy = rnd(n, -1, 1), *x = rnd(n, -2, 3), *w = rnd(C, 0.5f, 1.5f);
    float *mean = rnd(R, 0, 1), *rstd = rnd(R, 0.5f, 2);
    Out *dx = out_new(n, 0);
    RUN(what, layernorm_bwd_k[s].rows,
        layernorm_bwd_k[s].fn(dy, x, w, mean, rstd, O(dx), lo, hi));
    double *ref = dref(n);
    for (int64_t r = 0; r < R; r++) {
      double s1 = 0, s2 = 0, mu = mean[r], rs = rstd[r];
      for (int64_t c = 0; c < C; c++) {
        double xhat = (x[r * C + c] - mu) * rs, g = (double)dy[r * C + c] * w[c];
        s1 += g;
        s2 += g * xhat;
      }
      for (int64_t c = 0; c < C; c++) {
        double xhat = (x[r * C + c] - mu) * rs, g = (double)dy[r * C + c] * w[c];
        ref[r * C + c] = (g - s1 / C - xhat * (s2 / C)) * rs;
      }
    }
    bad |= close_to(what, dx->a, ref, n, 2e-5, 1e-5);
    free(ref);
    bad |= release(what);
  }
  return bad;
}

static int check_ln_bwd_params(void) {
  int bad = 0;
  for (size_t s = 0; s < N(ln_bwd_params_k); s++) {
    int64_t R = ln_bwd_params_k[s].R, C = ln_bwd_params_k[s].C, n = R * C;
    const char *what = label("ln_bwd_params", R, C);
    float *dy = rnd(n, -1, 1), *x = rnd(n, -2, 3), *mean = rnd(R, 0, 1), *rstd = rnd(R, 0.5f, 2);
    Out *dw = out_new(C, 1), *db = out_new(C, 1);  /* accumulated into */
    RUN(what, ln_bwd_params_k[s].rows,
        ln_bwd_params_k[s].fn(dy, x, mean, rstd, O(dw), O(db), lo, hi));
    double *rw = dref(C), *rb = dref(C);
    for (int64_t c = 0; c < C; c++) rw[c] = dw->init[c], rb[c] = db->init[c];
    for (int64_t r = 0; r < R; r++)
      for (int64_t c = 0; c < C; c++) {
        double xhat = (x[r * C + c] - (double)mean[r]) * rstd[r];
        rw[c] += dy[r * C + c] * xhat;
        rb[c] += dy[r * C + c];
      }
    bad |= close_to("ln_bwd_params dw", dw->a, rw, C, 2e-5, 1e-5);
    bad |= close_to("ln_bwd_params db", db->a, rb, C, 1e-5, 1e-5);
    free(rw), free(rb);
    bad |= release(what);
  }
  return bad;
}

/* Max and min are exact, so their references are computed in float and
 * must match bit for bit; NaN, -0 and infinities are planted in some rows. */
static int check_rowstats(void) {
  int bad = 0;
  for (size_t s = 0; s < N(rowstats_k); s++) {
    int64_t R = rowstats_k[s].R, C = rowstats_k[s].C, n = R * C;
    const char *what = label("rowstats", R, C);
    float *x = rnd(n, -4, 4), *rrelu = guarded(n), *rmax = guarded(R), *rmin = guarded(R);
    if (R > 1) {
      x[1 * C + C / 2] = NAN;                           /* row 1: NaN wins both */
      for (int64_t c = 0; c < C; c++) x[2 * C + c] = c % 2 ? 0.0f : -0.0f;  /* row 2 */
      for (int64_t c = 0; c < C; c++) x[3 * C + c] = -INFINITY;            /* row 3 */
      x[4 * C + C - 1] = INFINITY;                      /* row 4: at the tail */
      x[5 * C] = -NAN;                                  /* row 5: a negative NaN */
    }
    Out *relu = out_new(n, 0), *st = out_new(3 * R, 0);
    RUN(what, rowstats_k[s].rows, rowstats_k[s].fn(x, O(relu), O(st), lo, hi));
    double *rsum = dref(R), *rabs = dref(R);
    for (int64_t r = 0; r < R; r++) {
      float mx = -INFINITY, mn = INFINITY;
      for (int64_t c = 0; c < C; c++) {
        float v = x[r * C + c];
        rrelu[r * C + c] = isnan(v) ? v : v > 0 ? v : 0.0f;
        rsum[r] += v;
        rabs[r] += fabs(v);
        if (isnan(v) || isnan(mx)) mx = mn = NAN;
        else {
          if (v > mx || (v == 0 && mx == 0 && !signbit(v))) mx = v;
          if (v < mn || (v == 0 && mn == 0 && signbit(v))) mn = v;
        }
      }
      rmax[r] = mx, rmin[r] = mn;
    }
    for (int64_t i = 0; i < n; i++)  /* NaN payloads may differ */
      if (isnan(rrelu[i]) && isnan(relu->a[i])) relu->a[i] = rrelu[i];
    bad |= exact("rowstats relu", relu->a, rrelu, n);
    for (int64_t r = 0; r < R; r++) {
      const float *g = st->a + 3 * r;
      int ok = isnan(rmax[r]) ? isnan(g[0]) && isnan(g[1])
                              : bits(g[0]) == bits(rmax[r]) && bits(g[1]) == bits(rmin[r]);
      if (!ok) {
        fprintf(stderr, "%s row %lld: max %g min %g, want %g %g\n", what, (long long)r,
                (double)g[0], (double)g[1], (double)rmax[r], (double)rmin[r]);
        bad = 1;
      }
      /* A float sum of C terms in any order: error within C eps sum|x|;
       * random signs make it far smaller, and 1e-6 sum|x| holds. */
      float sum = g[2];
      int ok_sum = isnan(rsum[r]) || isinf(rsum[r]) ? (double)sum == rsum[r] || isnan(sum)
                                                    : fabs(sum - rsum[r]) <= 1e-6 * rabs[r];
      if (!ok_sum || isnan(rsum[r]) != isnan(sum)) {
        fprintf(stderr, "%s row %lld: sum %.9g, want %.9g\n", what, (long long)r, (double)sum,
                rsum[r]);
        bad = 1;
      }
    }
    free(rsum), free(rabs);
    bad |= release(what);
  }
  return bad;
}

static int check_indexing(void) {
  int bad = 0;
  for (size_t s = 0; s < N(indexing_k); s++) {
    int64_t R = indexing_k[s].R, C = indexing_k[s].C, n = R * C;
    const char *what = label("indexing", R, C);
    Out *ids = out_new(n, 0), *pos = out_new(n, 0);
    RUN(what, indexing_k[s].rows, indexing_k[s].fn((int32_t *)O(ids), O(pos), lo, hi));
    for (int64_t r = 0; r < R; r++)
      for (int64_t c = 0; c < C; c++) {
        int32_t want = (int32_t)((3 * c + r) % 7 - 2), got;
        memcpy(&got, &ids->a[r * C + c], sizeof got);
        float p = (float)((c < r ? c : r) - (c > 2 ? c : 2));
        if (got != want || bits(pos->a[r * C + c]) != bits(p)) {
          fprintf(stderr, "%s [%lld, %lld]: got %d %g, want %d %g\n", what, (long long)r,
                  (long long)c, got, (double)pos->a[r * C + c], want, (double)p);
          bad = 1;
        }
      }
    bad |= release(what);
  }
  return bad;
}

static int check_causal(void) {
  int bad = 0;
  for (size_t s = 0; s < N(causal_k); s++) {
    int64_t T = causal_k[s].T, n = 2 * T * T;
    const char *what = label("causal_softmax", 2, T);
    float *x = rnd(n, -10, 10);
    Out *y = out_new(n, 0);
    RUN(what, causal_k[s].rows, causal_k[s].fn(x, O(y), lo, hi));
    double *ref = dref(n);
    for (int64_t row = 0; row < 2 * T; row++)
      softmax_ref(x + row * T, ref + row * T, row % T + 1);  /* the rest stays 0 */
    bad |= close_to(what, y->a, ref, n, 1e-9, 1e-5);
    free(ref);
    bad |= release(what);
  }
  return bad;
}

static int check_axpy(void) {
  int bad = 0;
  int64_t cols[] = {0, 1, 37, 300};
  for (size_t s = 0; s < N(cols); s++) {
    int64_t C = cols[s], n = KT_AXPY_ROWS * C;
    const char *what = label("axpy", KT_AXPY_ROWS, C);
    float alpha = 0.37f, *x = rnd(n, -1, 1), *ref = guarded(n);
    Out *y = out_new(n, 1);
    RUN(what, axpy_ROWS, axpy(alpha, x, O(y), C, lo, hi));
    for (int64_t i = 0; i < n; i++) {
      float t = alpha * x[i];
      ref[i] = t + y->init[i];
    }
    bad |= exact(what, y->a, ref, n);
    bad |= release(what);
  }
  return bad;
}

/* ---- math: ulp error over wide input sets ----------------------------- */

/* Error of got in units in the last place of the float nearest to ref. */
static double ulps(float got, double ref) {
  if (isnan(ref)) return isnan(got) ? 0 : INFINITY;
  if (fabs(ref) >= 0x1.ffffffp127)  /* FLT_MAX + half an ulp: rounds to inf */
    ref = copysign(INFINITY, ref);
  if (isinf(ref) || isinf(got)) return (double)got == ref ? 0 : INFINITY;
  int e;
  frexp(ref, &e);  /* ref = m 2^e, 0.5 <= |m| < 1 */
  if (e < -125) e = -125;  /* denormal range: fixed spacing 2^-149 */
  return fabs(got - ref) / ldexp(1.0, e - 24);
}

typedef struct {
  const char *fn;
  double (*ref)(double);
  double bound;  /* ulp */
} MathFn;

static double rsqrt_ref(double x) { return 1 / sqrt(x); }

static int check_math(void) {
  enum { M = 1 << 20 };
  float *x = guarded(M), *y[5];
  for (int j = 0; j < 5; j++) y[j] = guarded(M);
  /* sqrt is correctly rounded; rsqrt = 1/sqrt rounds twice: < 1.5 ulp. */
  const MathFn fns[5] = {{"exp", exp, 2},
                         {"log", log, 2},
                         {"tanh", tanh, 3},
                         {"sqrt", sqrt, 0.5},
                         {"rsqrt", rsqrt_ref, 1.5}};
  double err[5] = {0};
  float at[5] = {0};
  int bad = 0;
  for (int set = 0; set < 4; set++) {
    for (int i = 0; i < M; i++) {
      switch (set) {
      case 0: x[i] = uniform(-110, 95); break;                    /* exp's whole range */
      case 1: x[i] = from_bits((uint32_t)next64() & 0x7fffffffu); break; /* every binade */
      case 2: x[i] = uniform(-12, 12); break;                     /* tanh's interesting part */
      default: x[i] = from_bits((uint32_t)next64()); break;         /* any bits */
      }
    }
    static const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1.0f, -1.0f,
                                    0x1p-149f, 0x1p-127f, 0x1.fffffep127f, 88.72283f,
                                    88.7228394f, -87.33654f, -103.972077f, -103.2789f,
                                    1e-30f, 9.0f, 10.0f, 0.5f * 0.6931472f, 1.4142135f};
    memcpy(x, special, sizeof special);
    mathfns(x, y[0], y[1], y[2], y[3], y[4], M, 0, 1);
    for (int j = 0; j < 5; j++)
      for (int i = 0; i < M; i++) {
        double e = ulps(y[j][i], fns[j].ref((double)x[i]));
        if (e > err[j]) err[j] = e, at[j] = x[i];
      }
  }
  for (int j = 0; j < 5; j++) {
    printf("%-5s max error %.3f ulp (at %.9g; bound %g)\n", fns[j].fn, err[j], (double)at[j],
           fns[j].bound);
    if (!(err[j] <= fns[j].bound)) bad = 1;
  }
  /* Special cases, bit for bit (ulps() does not see the sign of zero). */
  static const struct {
    int fn;
    float x, want;
  } sp[] = {{0, -INFINITY, 0.0f}, {0, INFINITY, INFINITY}, {0, -0.0f, 1.0f},
            {0, 100.0f, INFINITY},  {0, -200.0f, 0.0f},   {1, 0.0f, -INFINITY},
            {1, -0.0f, -INFINITY},  {1, INFINITY, INFINITY}, {1, 1.0f, 0.0f},
            {2, -0.0f, -0.0f},      {2, 0.0f, 0.0f},       {2, INFINITY, 1.0f},
            {2, -INFINITY, -1.0f},  {2, -30.0f, -1.0f},    {3, -0.0f, -0.0f},
            {4, 0.0f, INFINITY}};
  static const struct {
    int fn;
    float x;
  } nan_of[] = {{0, NAN}, {1, NAN}, {1, -1.0f}, {1, -INFINITY}, {1, -0x1p-149f}, {2, NAN},
                {3, -1.0f}, {4, -1.0f}};
  for (size_t i = 0; i < N(sp); i++) x[i] = sp[i].x;
  for (size_t i = 0; i < N(nan_of); i++) x[N(sp) + i] = nan_of[i].x;
  mathfns(x, y[0], y[1], y[2], y[3], y[4], (int64_t)(N(sp) + N(nan_of)), 0, 1);
  for (size_t i = 0; i < N(sp); i++)
    if (bits(y[sp[i].fn][i]) != bits(sp[i].want)) {
      fprintf(stderr, "%s(%g) = %g, want %g\n", fns[sp[i].fn].fn, (double)sp[i].x,
              (double)y[sp[i].fn][i], (double)sp[i].want);
      bad = 1;
    }
  for (size_t i = 0; i < N(nan_of); i++)
    if (!isnan(y[nan_of[i].fn][N(sp) + i])) {
      fprintf(stderr, "%s(%g) = %g, want NaN\n", fns[nan_of[i].fn].fn, (double)nan_of[i].x,
              (double)y[nan_of[i].fn][N(sp) + i]);
      bad = 1;
    }
  bad |= release("math");
  return bad;
}

/* Every one of the 2^32 inputs (minutes; run by hand after touching
 * codegen/kir_math.c, and update the bounds in kir_llvm.h). */
static int exhaustive(void) {
  enum { M = 1 << 20 };
  float *x = guarded(M), *y[5];
  for (int j = 0; j < 5; j++) y[j] = guarded(M);
  double (*ref[3])(double) = {exp, log, tanh};
  const char *fn[3] = {"exp", "log", "tanh"};
  double err[3] = {0};
  float at[3] = {0};
  for (uint64_t base = 0; base < (1ull << 32); base += M) {
    for (int i = 0; i < M; i++) x[i] = from_bits((uint32_t)(base + (uint64_t)i));
    mathfns(x, y[0], y[1], y[2], y[3], y[4], M, 0, 1);
    for (int j = 0; j < 3; j++)
      for (int i = 0; i < M; i++) {
        double e = ulps(y[j][i], ref[j]((double)x[i]));
        if (e > err[j]) err[j] = e, at[j] = x[i];
      }
  }
  for (int j = 0; j < 3; j++)
    printf("%-4s max error %.3f ulp over all inputs (at %a)\n", fn[j], err[j], (double)at[j]);
  return release("exhaustive");
}

/* ---- bench (not a test) ----------------------------------------------- */

static double now(void) {
  struct timespec t;
  timespec_get(&t, TIME_UTC);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void c_gelu(const float *x, float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    y[i] = 0.5f * x[i] * (1.0f + tanhf(0.7978845608f * (x[i] + 0.044715f * x[i] * x[i] * x[i])));
}

static void c_softmax(const float *x, float *y, int64_t R, int64_t C) {
  for (int64_t r = 0; r < R; r++) {
    float mx = -INFINITY, sum = 0;
    for (int64_t c = 0; c < C; c++) mx = fmaxf(mx, x[r * C + c]);
    for (int64_t c = 0; c < C; c++) sum += y[r * C + c] = expf(x[r * C + c] - mx);
    for (int64_t c = 0; c < C; c++) y[r * C + c] /= sum;
  }
}

static int bench(void) {
  int64_t n = 13 * 1000;
  float *x = rnd(n, -5, 5), *y = guarded(n);
  int reps = 2000;
  double t0 = now();
  for (int i = 0; i < reps; i++) gelu_13_1000(x, y, 0, 13);
  double t1 = now();
  for (int i = 0; i < reps; i++) c_gelu(x, y, n);
  double t2 = now();
  for (int i = 0; i < reps; i++) softmax_13_1000(x, y, 0, 13);
  double t3 = now();
  for (int i = 0; i < reps; i++) c_softmax(x, y, 13, 1000);
  double t4 = now();
  double e = 1e9 / ((double)reps * (double)n);
  printf("gelu 13x1000:    kir %.2f ns/elem, libm C %.2f ns/elem\n", (t1 - t0) * e, (t2 - t1) * e);
  printf("softmax 13x1000: kir %.2f ns/elem, libm C %.2f ns/elem\n", (t3 - t2) * e, (t4 - t3) * e);
  return release("bench");
}

/* ---- driver ----------------------------------------------------------- */

static const struct {
  const char *name;
  int (*check)(void);
} groups[] = {
    {"gelu", check_gelu},
    {"bias_residual", check_bias_residual},
    {"bcast", check_bcast},
    {"softmax", check_softmax},
    {"layernorm", check_layernorm},
    {"rmsnorm", check_rmsnorm},
    {"crossentropy", check_crossentropy},
    {"ce_bwd", check_ce_bwd},
    {"swiglu", check_swiglu},
    {"colsum", check_colsum},
    {"layernorm_bwd", check_layernorm_bwd},
    {"ln_bwd_params", check_ln_bwd_params},
    {"rowstats", check_rowstats},
    {"indexing", check_indexing},
    {"causal_softmax", check_causal},
    {"axpy", check_axpy},
    {"math", check_math},
};

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: kir_check GROUP|all|bench|exhaustive\n");
    return 2;
  }
  if (strcmp(argv[1], "bench") == 0) return bench();
  if (strcmp(argv[1], "exhaustive") == 0) return exhaustive();
  int found = 0, bad = 0;
  for (size_t g = 0; g < N(groups); g++) {
    if (strcmp(argv[1], "all") && strcmp(argv[1], groups[g].name)) continue;
    found = 1;
    worst = 0;
    int b = groups[g].check();
    if (strcmp(groups[g].name, "math"))
      printf("%-15s %s (worst error %.2f of tolerance)\n", groups[g].name, b ? "FAIL" : "ok",
             worst);
    bad |= b;
  }
  if (!found) {
    fprintf(stderr, "kir_check: no group '%s'\n", argv[1]);
    return 2;
  }
  return bad;
}
