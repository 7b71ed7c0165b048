/* tests/runtime/test_attention.c -- rt_sdpa and rt_sdpa_grad against the
 * interpreter's sdpa and sdpa_grad (relative L2 <= 1e-5 per output, and per dq /
 * dk / dv part of the packed gradient): GQA ratios 1, 2 and 4, causal and not,
 * T = 1, below, at, just above and well above RT_SDPA_BLOCK, head_dim 1 up to 32,
 * scores large enough to overflow exp without the max shift (held to 1e-4: a score
 * of size S carries S * 2^-24 of float rounding into exp, so the relative error of
 * p, and of the gradient, grows with S; at |S| ~ 200 it is ~1e-5); the lse output
 * against logsumexp in double; the backward from the forward's out and lse (the
 * trainers' old call) gives the same bits as the one that recomputes them, and
 * the one from lse and D (rt_sdpa_grad_stats, D by rt_sdpa_delta from the merged
 * out and dy, held to 1e-5 of a double dot product) the same bits again, and
 * again token-major (rt_sdpa_layout's out, rt_sdpa_grad_stats_layout's dy and
 * packed gradient: the head-major results merged, bit for bit); the same bits
 * for 1, 2 and 3 pool threads; argument errors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt_attention.h"
#include "runtime/rt_pool.h"
#include "tests/runtime/check.h"
#include "tests/runtime/ref_op.h"

#define TOL 1e-5

typedef struct {
  int64_t B, H, KV, T, hd;
  float qscale;  /* q's standard deviation: large values test the max shift */
  double tol;    /* 0: TOL */
} Case;

static void report_err(const char *what, const Case *c, int causal, double err) {
  if (err <= (c->tol > 0 ? c->tol : TOL)) return;
  char m[200];
  snprintf(m, sizeof m, "%s B %lld H %lld KV %lld T %lld hd %lld causal %d: rel L2 %.3g", what,
           (long long)c->B, (long long)c->H, (long long)c->KV, (long long)c->T,
           (long long)c->hd, causal, err);
  check_report(__FILE__, __LINE__, m);
}

/* logsumexp over the visible keys of every query row, in double. */
static double lse_err(const float *lse, const float *q, const float *k, const Case *c,
                      float scale, int causal) {
  int64_t T = c->T, hd = c->hd, rep = c->H / c->KV;
  double num = 0, den = 0;
  for (int64_t b = 0; b < c->B; b++)
    for (int64_t h = 0; h < c->H; h++)
      for (int64_t t = 0; t < T; t++) {
        const float *qr = q + ((b * c->H + h) * T + t) * hd;
        const float *kh = k + (b * c->KV + h / rep) * T * hd;
        int64_t end = causal ? t + 1 : T;
        double mx = -INFINITY, s = 0, *sc = malloc(sizeof(double) * (size_t)end);
        for (int64_t u = 0; u < end; u++) {
          double d = 0;
          for (int64_t i = 0; i < hd; i++) d += (double)qr[i] * kh[u * hd + i];
          sc[u] = d * scale;
          mx = fmax(mx, sc[u]);
        }
        for (int64_t u = 0; u < end; u++) s += exp(sc[u] - mx);
        double want = mx + log(s), got = lse[(b * c->H + h) * T + t];
        num += (got - want) * (got - want);
        den += want * want;
        free(sc);
      }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* dst[b, t, c hd + i] = src[b, c, t, i] over C channels (merge_heads) */
static void merge_rows(float *dst, const float *src, int64_t B, int64_t C, int64_t T, int64_t hd) {
  for (int64_t b = 0; b < B; b++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t t = 0; t < T; t++)
        memcpy(dst + ((b * T + t) * C + c) * hd, src + ((b * C + c) * T + t) * hd,
               sizeof(float) * (size_t)hd);
}

static void run_case(TRng *rng, const Case *c, int causal) {
  int64_t B = c->B, H = c->H, KV = c->KV, T = c->T, hd = c->hd;
  int64_t nq = B * H * T * hd, nk = B * KV * T * hd, ng = B * (H + 2 * KV) * T * hd;
  float scale = (float)(1.0 / sqrt((double)hd));
  float *q = malloc(sizeof(float) * (size_t)nq), *dy = malloc(sizeof(float) * (size_t)nq);
  float *k = malloc(sizeof(float) * (size_t)nk), *v = malloc(sizeof(float) * (size_t)nk);
  float *out = malloc(sizeof(float) * (size_t)nq), *g = malloc(sizeof(float) * (size_t)ng);
  float *lse = malloc(sizeof(float) * (size_t)(B * H * T));
  trng_fill(rng, q, nq, c->qscale);
  trng_fill(rng, k, nk, 1);
  trng_fill(rng, v, nk, 1);
  trng_fill(rng, dy, nq, 1);

  RefArg args[4] = {RF(q, B, H, T, hd), RF(k, B, KV, T, hd), RF(v, B, KV, T, hd),
                    RF(dy, B, H, T, hd)};
  RefOut fwd, bwd;
  char why[256];
  if (ref_op(IR_OP_ATTENTION, args, 3, causal, 0, 0, scale, &fwd, why, sizeof why) ||
      ref_op(IR_OP_ATTENTION_GRAD, args, 4, causal, 0, 0, scale, &bwd, why, sizeof why)) {
    check_report(__FILE__, __LINE__, why);
    return;
  }
  CHECK_OK(rt_sdpa(out, lse, q, k, v, B, H, KV, T, hd, scale, causal));
  report_err("sdpa", c, causal, rel_l2(out, fwd.f, nq));
  report_err("sdpa lse", c, causal, lse_err(lse, q, k, c, scale, causal));

  CHECK_OK(rt_sdpa_grad(g, q, k, v, dy, out, lse, B, H, KV, T, hd, scale, causal));
  report_err("sdpa_grad", c, causal, rel_l2(g, bwd.f, ng));
  float *g2 = malloc(sizeof(float) * (size_t)ng);
  CHECK_OK(rt_sdpa_grad(g2, q, k, v, dy, NULL, NULL, B, H, KV, T, hd, scale, causal));
  CHECK(memcmp(g, g2, sizeof(float) * (size_t)ng) == 0); /* kept == recomputed statistics */
  /* D from the merged out and dy ([B, T, H hd], as merge_heads lays them out):
   * against a double dot product, and sdpa_grad from lse and D bit for bit the
   * one from out and lse */
  float *mo = malloc(sizeof(float) * (size_t)nq), *mdy = malloc(sizeof(float) * (size_t)nq);
  float *d = malloc(sizeof(float) * (size_t)(B * H * T));
  double *dref = malloc(sizeof(double) * (size_t)(B * H * T));
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t t = 0; t < T; t++) {
        int64_t r = (b * H + h) * T + t;
        dref[r] = 0;
        for (int64_t i = 0; i < hd; i++) {
          int64_t four = r * hd + i, three = ((b * T + t) * H + h) * hd + i;
          mo[three] = out[four], mdy[three] = dy[four];
          dref[r] += (double)out[four] * dy[four];
        }
      }
  CHECK_OK(rt_sdpa_delta(d, mo, mdy, B, H, T, hd));
  report_err("sdpa_delta", c, causal, rel_l2(d, dref, B * H * T));
  CHECK_OK(rt_sdpa_grad_stats(g2, q, k, v, dy, lse, d, B, H, KV, T, hd, scale, causal));
  CHECK(memcmp(g, g2, sizeof(float) * (size_t)ng) == 0); /* lse and D == out and lse */
  /* token-major (RT_SDPA_*): out as merge_heads lays it out, the packed
   * gradient [B, T, (H + 2 KV) hd], dy read from mdy: the same bits, moved */
  float *ot = malloc(sizeof(float) * (size_t)nq), *lt = malloc(sizeof(float) * (size_t)(B * H * T));
  float *gt = malloc(sizeof(float) * (size_t)ng), *mg = malloc(sizeof(float) * (size_t)ng);
  CHECK_OK(rt_sdpa_layout(ot, lt, q, k, v, B, H, KV, T, hd, scale, causal, RT_SDPA_OUT_TOKENS));
  CHECK(memcmp(ot, mo, sizeof(float) * (size_t)nq) == 0);
  CHECK(memcmp(lt, lse, sizeof(float) * (size_t)(B * H * T)) == 0);
  merge_rows(mg, g, B, H + 2 * KV, T, hd);
  static const unsigned lay[3] = {RT_SDPA_OUT_TOKENS | RT_SDPA_DY_TOKENS, RT_SDPA_DY_TOKENS,
                                  RT_SDPA_OUT_TOKENS};
  for (int i = 0; i < 3; i++) {
    memset(gt, 0xff, sizeof(float) * (size_t)ng); /* NaNs wherever nothing is written */
    CHECK_OK(rt_sdpa_grad_stats_layout(gt, q, k, v, lay[i] & RT_SDPA_DY_TOKENS ? mdy : dy, lse, d,
                                       B, H, KV, T, hd, scale, causal, lay[i]));
    CHECK(memcmp(gt, lay[i] & RT_SDPA_OUT_TOKENS ? mg : g, sizeof(float) * (size_t)ng) == 0);
  }
  /* packed q|k|v (RT_SDPA_QKV_TOKENS): q, k, v read from one [B, T, H + 2 KV,
   * hd] tensor, as the q|k|v projection writes them (dqkv's token-major
   * layout): the same bits, in every layout of the rest */
  float *hm = malloc(sizeof(float) * (size_t)ng), *pk = malloc(sizeof(float) * (size_t)ng);
  for (int64_t b = 0; b < B; b++) {
    float *dst = hm + b * (H + 2 * KV) * T * hd;
    memcpy(dst, q + b * H * T * hd, sizeof(float) * (size_t)(H * T * hd));
    memcpy(dst + H * T * hd, k + b * KV * T * hd, sizeof(float) * (size_t)(KV * T * hd));
    memcpy(dst + (H + KV) * T * hd, v + b * KV * T * hd, sizeof(float) * (size_t)(KV * T * hd));
  }
  merge_rows(pk, hm, B, H + 2 * KV, T, hd);
  for (int tok = 0; tok < 2; tok++) {
    memset(ot, 0xff, sizeof(float) * (size_t)nq);
    CHECK_OK(rt_sdpa_layout(ot, lt, pk, pk, pk, B, H, KV, T, hd, scale, causal,
                            RT_SDPA_QKV_TOKENS | (tok ? RT_SDPA_OUT_TOKENS : 0u)));
    CHECK(memcmp(ot, tok ? mo : out, sizeof(float) * (size_t)nq) == 0);
    CHECK(memcmp(lt, lse, sizeof(float) * (size_t)(B * H * T)) == 0);
  }
  for (int i = 0; i < 3; i++) {
    memset(gt, 0xff, sizeof(float) * (size_t)ng);
    CHECK_OK(rt_sdpa_grad_stats_layout(gt, pk, pk, pk, lay[i] & RT_SDPA_DY_TOKENS ? mdy : dy, lse,
                                       d, B, H, KV, T, hd, scale, causal,
                                       lay[i] | RT_SDPA_QKV_TOKENS));
    CHECK(memcmp(gt, lay[i] & RT_SDPA_OUT_TOKENS ? mg : g, sizeof(float) * (size_t)ng) == 0);
  }
  free(hm), free(pk);
  free(ot), free(lt), free(gt), free(mg);
  free(mo), free(mdy), free(d), free(dref);
  free(g2);
  /* Each part on its own (dk and dv are smaller than dq when H > KV). */
  static const char *part[3] = {"sdpa_grad dq", "sdpa_grad dk", "sdpa_grad dv"};
  int64_t lo[3] = {0, H, H + KV}, hi[3] = {H, H + KV, H + 2 * KV}, C = H + 2 * KV;
  for (int p = 0; p < 3; p++) {
    double num = 0, den = 0;
    for (int64_t b = 0; b < B; b++)
      for (int64_t e = lo[p] * T * hd; e < hi[p] * T * hd; e++) {
        int64_t o = b * C * T * hd + e;
        num += ((double)g[o] - bwd.f[o]) * ((double)g[o] - bwd.f[o]);
        den += bwd.f[o] * bwd.f[o];
      }
    report_err(part[p], c, causal, den > 0 ? sqrt(num / den) : sqrt(num));
  }
  ref_out_free(&fwd);
  ref_out_free(&bwd);
  free(q), free(k), free(v), free(dy), free(out), free(g), free(lse);
}

static void test_against_reference(void) {
  static const Case cases[] = {
    /* B, H, KV, T, hd, q std, tolerance */
    {1, 1, 1, 1, 1, 1, 0},   {2, 2, 2, 5, 3, 1, 0},    {1, 2, 1, 63, 4, 1, 0},
    {1, 4, 2, 64, 8, 1, 0},  {2, 4, 1, 67, 5, 1, 0},   {1, 2, 2, 130, 16, 1, 0},
    {1, 1, 1, 9, 32, 8, 0},  {3, 4, 4, 2, 7, 1, 0},    {1, 8, 2, 33, 2, 60, 1e-4},
  };
  TRng rng = {7};
  CHECK_OK(rt_pool_init(2));
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    for (int causal = 0; causal < 2; causal++) run_case(&rng, &cases[i], causal);
}

/* Identical bits for 1, 2 and 3 threads, forward and backward, GQA 2, causal. */
static void test_determinism(void) {
  enum { B = 2, H = 4, KV = 2, T = 150, HD = 16 };
  int64_t nq = B * H * T * HD, nk = B * KV * T * HD, ng = B * (H + 2 * KV) * T * HD;
  TRng rng = {99};
  float *q = malloc(sizeof(float) * (size_t)nq), *dy = malloc(sizeof(float) * (size_t)nq);
  float *k = malloc(sizeof(float) * (size_t)nk), *v = malloc(sizeof(float) * (size_t)nk);
  trng_fill(&rng, q, nq, 1);
  trng_fill(&rng, k, nk, 1);
  trng_fill(&rng, v, nk, 1);
  trng_fill(&rng, dy, nq, 1);
  float *out[3], *g[3];
  for (int t = 0; t < 3; t++) {
    CHECK_OK(rt_pool_init(t + 1));
    out[t] = malloc(sizeof(float) * (size_t)nq);
    g[t] = malloc(sizeof(float) * (size_t)ng);
    float *lse = malloc(sizeof(float) * (size_t)(B * H * T));
    CHECK_OK(rt_sdpa(out[t], lse, q, k, v, B, H, KV, T, HD, 0.25f, 1));
    CHECK_OK(rt_sdpa_grad(g[t], q, k, v, dy, out[t], lse, B, H, KV, T, HD, 0.25f, 1));
    free(lse);
  }
  for (int t = 1; t < 3; t++) {
    CHECK(memcmp(out[0], out[t], sizeof(float) * (size_t)nq) == 0);
    CHECK(memcmp(g[0], g[t], sizeof(float) * (size_t)ng) == 0);
  }
  for (int t = 0; t < 3; t++) free(out[t]), free(g[t]);
  free(q), free(k), free(v), free(dy);
}

static void test_errors(void) {
  float x[64] = {0};
  CHECK_FAILS(rt_sdpa(x, NULL, x, x, x, 1, 3, 2, 2, 2, 1, 0), "3 query heads are not a multiple");
  CHECK_FAILS(rt_sdpa(NULL, NULL, x, x, x, 1, 1, 1, 2, 2, 1, 0), "sdpa: NULL output");
  CHECK_FAILS(rt_sdpa_grad(x, x, x, x, NULL, NULL, NULL, 1, 1, 1, 2, 2, 1, 0),
              "sdpa_grad: NULL dy");
  CHECK_FAILS(rt_sdpa_grad(x, x, x, x, x, NULL, NULL, 1, 1, 1, 0, 2, 1, 0), "T 0");
  CHECK_FAILS(rt_sdpa_grad_stats(x, x, x, x, x, x, NULL, 1, 1, 1, 2, 2, 1, 0), "NULL d");
  CHECK_FAILS(rt_sdpa_delta(x, NULL, x, 1, 1, 2, 2), "NULL m");
  CHECK_FAILS(rt_sdpa_layout(x, NULL, x, x, x, 1, 1, 1, 2, 2, 1, 0, RT_SDPA_DY_TOKENS),
              "layout bits 0x2 not understood");
  CHECK_FAILS(rt_sdpa_grad_stats_layout(x, x, x, x, x, x, x, 1, 1, 1, 2, 2, 1, 0, 8),
              "layout bits 0x8 not understood");
  CHECK_FAILS(rt_sdpa_delta(x, x, x, 1, 0, 2, 2), "H 0");
  CHECK_FAILS(rt_sdpa_grad(x, x, x, x, x, x, NULL, 1, 1, 1, 2, 2, 1, 0),
              "forward's lse is NULL but not its out");
  CHECK_FAILS(rt_sdpa(x, NULL, x, x, x, (int64_t)1 << 40, 1, 1, (int64_t)1 << 40, 2, 1, 0),
              "too large");
}

int main(void) {
  test_against_reference();
  test_determinism();
  test_errors();
  rt_pool_shutdown();
  return check_result("test_attention");
}
