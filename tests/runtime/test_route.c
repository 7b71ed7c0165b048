/* tests/runtime/test_route.c -- the routing, embedding and loss kernels against the
 * interpreter's ops of the same names.  Copies (topk, gather, onehot, dispatch,
 * embedding, combine_grad_y: one rounding at most) must match the reference
 * exactly; sums (scatter_add, combine, combine_grad_w, embedding_grad,
 * cross_entropy and its gradient) within relative L2 1e-5.  Shapes include
 * 1-sized dimensions, ties in topk, k = n, experts filled past capacity and
 * large logits; out-of-range indices fail like the reference, with the value,
 * position and range in the message; the same bits for 1, 2 and 3 pool threads.
 * cross_entropy_grad written over its logits (dlogits == logits, as the buffer
 * plan calls it: IR_F_INPLACE0) gives the out-of-place bits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt_pool.h"
#include "runtime/rt_route.h"
#include "tests/runtime/check.h"
#include "tests/runtime/ref_op.h"

#define TOL 1e-5

static TRng rng = {0x1234567ull};

static float *fnew(int64_t n, float scale) {
  float *x = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  trng_fill(&rng, x, n, scale);
  return x;
}

static int32_t *inew(int64_t n, int64_t limit) {
  int32_t *x = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
  for (int64_t e = 0; e < n; e++) x[e] = trng_int(&rng, limit);
  return x;
}

static void fail_case(int line, const char *what, const char *detail, double err) {
  char m[300];
  snprintf(m, sizeof m, "%s (%s): error %.3g", what, detail, err);
  check_report(__FILE__, line, m);
}

/* Evaluates the reference; reports and returns -1 if it fails. */
static int ref(IrOp op, const RefArg *args, int n, int64_t ia0, int64_t ia1, RefOut *out) {
  char why[256];
  if (ref_op(op, args, n, ia0, ia1, 0, 0, out, why, sizeof why) == 0) return 0;
  check_report(__FILE__, __LINE__, why);
  return -1;
}

#define EXPECT_EXACT(what, got, r, n, detail)                                      \
  do {                                                                            \
    if (!exact(got, (r).f, n)) fail_case(__LINE__, what, detail, rel_l2(got, (r).f, n)); \
  } while (0)
#define EXPECT_CLOSE(what, got, r, n, detail)                                      \
  do {                                                                            \
    double e_ = rel_l2(got, (r).f, n);                                            \
    if (!(e_ <= TOL)) fail_case(__LINE__, what, detail, e_);                      \
  } while (0)

/* ---- topk ------------------------------------------------------------------------ */

static void test_topk(void) {
  static const int64_t cases[][4] = {  /* lead0, lead1, n, k */
    {5, 1, 1, 1}, {7, 1, 4, 4}, {9, 1, 8, 2}, {3, 1, 33, 5}, {2, 3, 16, 16}, {40, 1, 64, 8},
  };
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
    for (int ties = 0; ties < 2; ties++) {
      int64_t rows = cases[c][0] * cases[c][1], n = cases[c][2], k = cases[c][3];
      float *x = fnew(rows * n, 1);
      if (ties)  /* few distinct values: many ties, lower index must come first */
        for (int64_t e = 0; e < rows * n; e++) x[e] = (float)trng_int(&rng, 3);
      int32_t *got = malloc(sizeof(int32_t) * (size_t)(rows * k));
      RefArg a = RF(x, cases[c][0], cases[c][1], n);
      RefOut r;
      if (ref(IR_OP_TOPK, &a, 1, k, 0, &r) == 0) {
        CHECK_OK(rt_topk(got, x, rows, n, k));
        if (memcmp(got, r.i, sizeof(int32_t) * (size_t)(rows * k))) {
          char d[80];
          snprintf(d, sizeof d, "rows %lld n %lld k %lld ties %d", (long long)rows,
                   (long long)n, (long long)k, ties);
          fail_case(__LINE__, "topk", d, 1);
        }
        ref_out_free(&r);
      }
      free(x), free(got);
    }
  float x[4] = {1, 2, 3, 4};
  int32_t o[4];
  CHECK_FAILS(rt_topk(o, x, 1, 4, 5), "topk: k = 5");
  CHECK_FAILS(rt_topk(o, x, 1, 0, 1), "topk: n must be >= 1, got 0");
}

/* ---- gather, scatter_add, onehot ------------------------------------------------ */

static void test_gather_scatter(void) {
  static const int64_t cases[][4] = {  /* lead0, lead1, n, k */
    {1, 1, 1, 1}, {4, 1, 5, 3}, {6, 1, 3, 7}, {2, 3, 4, 6}, {50, 1, 9, 2},
  };
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    int64_t l0 = cases[c][0], l1 = cases[c][1], rows = l0 * l1, n = cases[c][2], k = cases[c][3];
    char d[80];
    snprintf(d, sizeof d, "rows %lld n %lld k %lld", (long long)rows, (long long)n, (long long)k);
    float *x = fnew(rows * n, 1), *dy = fnew(rows * k, 1);
    int32_t *idx = inew(rows * k, n);
    float *g = malloc(sizeof(float) * (size_t)(rows * k));
    float *s = malloc(sizeof(float) * (size_t)(rows * n));
    RefArg ga[2] = {RF(x, l0, l1, n), RI(idx, l0, l1, k)};
    RefArg sa[2] = {RI(idx, l0, l1, k), RF(dy, l0, l1, k)};
    RefOut r;
    if (ref(IR_OP_GATHER, ga, 2, 0, 0, &r) == 0) {
      CHECK_OK(rt_gather(g, x, idx, rows, n, k));
      EXPECT_EXACT("gather", g, r, rows * k, d);
      ref_out_free(&r);
    }
    if (ref(IR_OP_SCATTER_ADD, sa, 2, n, 0, &r) == 0) {
      CHECK_OK(rt_scatter_add(s, idx, dy, rows, k, n));
      EXPECT_CLOSE("scatter_add", s, r, rows * n, d);
      ref_out_free(&r);
    }
    free(x), free(dy), free(idx), free(g), free(s);
  }
  float x[6] = {0}, o[6];
  int32_t bad[2] = {1, 3};
  CHECK_FAILS(rt_gather(o, x, bad, 1, 3, 2), "gather: index 3 at position 1 is outside [0, 3)");
  CHECK_FAILS(rt_scatter_add(o, bad, x, 2, 1, 2), "index 3 at position 1 is outside [0, 2)");
}

static void test_onehot(void) {
  static const int64_t cases[][3] = {{1, 1, 1}, {7, 1, 4}, {2, 5, 3}};
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    int64_t count = cases[c][0] * cases[c][1], n = cases[c][2];
    int32_t *idx = inew(count, n);
    float *o = malloc(sizeof(float) * (size_t)(count * n));
    RefArg a = RI(idx, cases[c][0], cases[c][1]);
    RefOut r;
    if (ref(IR_OP_ONEHOT, &a, 1, n, 0, &r) == 0) {
      CHECK_OK(rt_onehot(o, idx, count, n));
      EXPECT_EXACT("onehot", o, r, count * n, "");
      ref_out_free(&r);
    }
    free(idx), free(o);
  }
  int32_t neg = -1;
  float o[2];
  CHECK_FAILS(rt_onehot(o, &neg, 1, 2), "onehot: index -1 at position 0 is outside [0, 2)");
}

/* ---- dispatch, combine and their gradients -------------------------------------- */

static void test_routing(void) {
  static const int64_t cases[][5] = {  /* N, K, D, E, C */
    {1, 1, 1, 1, 1},    {13, 2, 5, 4, 3},  /* experts fill up: later choices dropped */
    {6, 1, 1, 1, 6},    {10, 4, 3, 4, 10}, /* k = E, nothing dropped */
    {9, 3, 17, 2, 1},   {40, 2, 33, 8, 9},
  };
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    int64_t N = cases[c][0], K = cases[c][1], D = cases[c][2], E = cases[c][3], C = cases[c][4];
    char d[80];
    snprintf(d, sizeof d, "N %lld K %lld D %lld E %lld C %lld", (long long)N, (long long)K,
             (long long)D, (long long)E, (long long)C);
    float *x = fnew(N * D, 1), *w = fnew(N * K, 1), *y = fnew(E * C * D, 1);
    float *dout = fnew(N * D, 1);
    int32_t *idx = inew(N * K, E);
    float *o_ecd = malloc(sizeof(float) * (size_t)(E * C * D));
    float *o_nd = malloc(sizeof(float) * (size_t)(N * D));
    float *o_nk = malloc(sizeof(float) * (size_t)(N * K));
    RefOut r;
    RefArg dis[2] = {RF(x, N, D), RI(idx, N, K)};
    if (ref(IR_OP_DISPATCH, dis, 2, E, C, &r) == 0) {
      memset(o_ecd, 0xff, sizeof(float) * (size_t)(E * C * D));  /* NaN: empty slots must be written */
      CHECK_OK(rt_dispatch(o_ecd, x, idx, N, K, D, E, C));
      EXPECT_EXACT("dispatch", o_ecd, r, E * C * D, d);
      ref_out_free(&r);
    }
    RefArg com[3] = {RF(y, E, C, D), RI(idx, N, K), RF(w, N, K)};
    if (ref(IR_OP_COMBINE, com, 3, 0, 0, &r) == 0) {
      CHECK_OK(rt_combine(o_nd, y, idx, w, N, K, D, E, C));
      EXPECT_CLOSE("combine", o_nd, r, N * D, d);
      ref_out_free(&r);
    }
    RefArg gy[3] = {RF(dout, N, D), RI(idx, N, K), RF(w, N, K)};
    if (ref(IR_OP_COMBINE_GRAD_Y, gy, 3, E, C, &r) == 0) {
      memset(o_ecd, 0xff, sizeof(float) * (size_t)(E * C * D));
      CHECK_OK(rt_combine_grad_y(o_ecd, dout, idx, w, N, K, D, E, C));
      EXPECT_EXACT("combine_grad_y", o_ecd, r, E * C * D, d);
      ref_out_free(&r);
    }
    RefArg gw[3] = {RF(dout, N, D), RF(y, E, C, D), RI(idx, N, K)};
    if (ref(IR_OP_COMBINE_GRAD_W, gw, 3, 0, 0, &r) == 0) {
      CHECK_OK(rt_combine_grad_w(o_nk, dout, y, idx, N, K, D, E, C));
      EXPECT_CLOSE("combine_grad_w", o_nk, r, N * K, d);
      ref_out_free(&r);
    }
    free(x), free(w), free(y), free(dout), free(idx), free(o_ecd), free(o_nd), free(o_nk);
  }
  float x[8] = {0}, o[64];
  int32_t idx[4] = {0, 1, 2, 4};
  CHECK_FAILS(rt_dispatch(o, x, idx, 2, 2, 2, 4, 2),
              "dispatch: expert 4 at position 3 (token 1, choice 1) is outside [0, 4)");
  CHECK_FAILS(rt_combine(o, x, idx, x, 2, 2, 1, 4, 0), "combine: C must be >= 1, got 0");
  CHECK_FAILS(rt_combine_grad_w(o, x, x, NULL, 2, 2, 1, 4, 1), "combine_grad_w: NULL idx");
}

/* ---- embedding ----------------------------------------------------------------- */

static void test_embedding(void) {
  static const int64_t cases[][4] = {  /* B, T, V, D */
    {1, 1, 1, 1}, {2, 3, 7, 5}, {3, 50, 3, 37}, {1, 300, 5, 100}, {4, 9, 1000, 16},
  };
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    int64_t B = cases[c][0], T = cases[c][1], V = cases[c][2], D = cases[c][3], P = B * T;
    char d[80];
    snprintf(d, sizeof d, "positions %lld V %lld D %lld", (long long)P, (long long)V,
             (long long)D);
    int32_t *ids = inew(P, V);
    float *table = fnew(V * D, 1), *dy = fnew(P * D, 1);
    float *out = malloc(sizeof(float) * (size_t)(P * D));
    float *dt = malloc(sizeof(float) * (size_t)(V * D));
    RefOut r;
    RefArg ea[2] = {RI(ids, B, T), RF(table, V, D)};
    if (ref(IR_OP_EMBEDDING, ea, 2, 0, 0, &r) == 0) {
      CHECK_OK(rt_embedding(out, ids, table, P, V, D));
      EXPECT_EXACT("embedding", out, r, P * D, d);
      ref_out_free(&r);
    }
    RefArg ga[2] = {RI(ids, B, T), RF(dy, B, T, D)};
    if (ref(IR_OP_EMBEDDING_GRAD, ga, 2, V, 0, &r) == 0) {
      memset(dt, 0xff, sizeof(float) * (size_t)(V * D));  /* must be zeroed by the kernel */
      CHECK_OK(rt_embedding_grad(dt, ids, dy, P, V, D));
      EXPECT_CLOSE("embedding_grad", dt, r, V * D, d);
      ref_out_free(&r);
      /* _acc: the same sums onto what the table held (a gradient accumulator) */
      float *acc = malloc(sizeof(float) * (size_t)(V * D));
      memcpy(acc, table, sizeof(float) * (size_t)(V * D));
      CHECK_OK(rt_embedding_grad_acc(acc, ids, dy, P, V, D));
      double worst = 0;
      for (int64_t i = 0; i < V * D; i++) {
        double want = (double)table[i] + dt[i];
        double err = fabs(acc[i] - want) / (1 + fabs(want));
        if (err > worst) worst = err;
      }
      CHECK(worst < 1e-5);
      free(acc);
    }
    free(ids), free(table), free(dy), free(out), free(dt);
  }
  /* Out-of-range ids: the reference fails too; the message names id, position, vocab. */
  int32_t ids[5] = {0, 6, 2, 9, 1};
  float table[7 * 2] = {0}, out[10];
  RefArg ea[2] = {RI(ids, 5), RF(table, 7, 2)};
  RefOut r;
  char why[256];
  CHECK(ref_op(IR_OP_EMBEDDING, ea, 2, 0, 0, 0, 0, &r, why, sizeof why) != 0);
  CHECK_FAILS(rt_embedding(out, ids, table, 5, 7, 2),
              "embedding: id 9 at position 3 is outside the vocabulary [0, 7)");
  ids[3] = -2;
  CHECK_FAILS(rt_embedding_grad(table, ids, out, 5, 7, 2),
              "embedding_grad: id -2 at position 3 is outside the vocabulary [0, 7)");
}

/* ---- cross-entropy -------------------------------------------------------------- */

static void test_cross_entropy(void) {
  static const int64_t cases[][3] = {{1, 1, 1}, {1, 5, 3}, {2, 7, 1000}, {3, 4, 50}};
  static const float scales[] = {1, 60};
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
    for (size_t s = 0; s < 2; s++) {
      int64_t B = cases[c][0], T = cases[c][1], V = cases[c][2], N = B * T;
      char d[80];
      snprintf(d, sizeof d, "N %lld V %lld logit scale %g", (long long)N, (long long)V,
               scales[s]);
      float *lg = fnew(N * V, scales[s]), dl = 0.75f + trng_normal(&rng), loss;
      int32_t *tg = inew(N, V);
      float *g = malloc(sizeof(float) * (size_t)(N * V));
      RefOut r;
      RefArg fa[3] = {RF(lg, B, T, V), RI(tg, B, T), ref_f32(&dl, 0, (const int64_t[]){1})};
      if (ref(IR_OP_CROSS_ENTROPY, fa, 2, 0, 0, &r) == 0) {
        CHECK_OK(rt_cross_entropy(&loss, lg, tg, N, V));
        EXPECT_CLOSE("cross_entropy", &loss, r, 1, d);
        ref_out_free(&r);
      }
      if (ref(IR_OP_CROSS_ENTROPY_GRAD, fa, 3, 0, 0, &r) == 0) {
        CHECK_OK(rt_cross_entropy_grad(g, lg, tg, &dl, N, V));
        EXPECT_CLOSE("cross_entropy_grad", g, r, N * V, d);
        ref_out_free(&r);
        /* in place (dlogits == logits, as the buffer plan calls it): the same bits */
        float *h = malloc(sizeof(float) * (size_t)(N * V));
        memcpy(h, lg, sizeof(float) * (size_t)(N * V));
        CHECK_OK(rt_cross_entropy_grad(h, h, tg, &dl, N, V));
        CHECK(memcmp(h, g, sizeof(float) * (size_t)(N * V)) == 0);
        free(h);
      }
      free(lg), free(tg), free(g);
    }
  float lg[6] = {0}, l;
  int32_t tg[2] = {0, 3};
  CHECK_FAILS(rt_cross_entropy(&l, lg, tg, 2, 3),
              "cross_entropy: target 3 at position 1 is outside [0, 3)");
  CHECK_FAILS(rt_cross_entropy_grad(lg, lg, tg, NULL, 2, 3), "cross_entropy_grad: NULL dloss");
}

/* ---- determinism ---------------------------------------------------------------- */

static void test_determinism(void) {
  enum { P = 600, V = 5, D = 100, N = 64, VC = 3000, NT = 200, E = 8, K = 2, C = 60 };
  int32_t *ids = inew(P, V), *tg = inew(N, VC), *idx = inew(NT * K, E);
  float *dy = fnew(P * D, 1), *lg = fnew(N * VC, 3), *y = fnew(E * C * D, 1);
  float *w = fnew(NT * K, 1), dl = 1.0f;
  float *dt[3], *g[3], *cb[3], loss[3];
  for (int t = 0; t < 3; t++) {
    CHECK_OK(rt_pool_init(t + 1));
    dt[t] = malloc(sizeof(float) * V * D);
    g[t] = malloc(sizeof(float) * (size_t)N * VC);
    cb[t] = malloc(sizeof(float) * NT * D);
    CHECK_OK(rt_embedding_grad(dt[t], ids, dy, P, V, D));
    CHECK_OK(rt_cross_entropy(&loss[t], lg, tg, N, VC));
    CHECK_OK(rt_cross_entropy_grad(g[t], lg, tg, &dl, N, VC));
    float *h = malloc(sizeof(float) * (size_t)N * VC); /* in place, rows over t + 1 threads */
    memcpy(h, lg, sizeof(float) * (size_t)N * VC);
    CHECK_OK(rt_cross_entropy_grad(h, h, tg, &dl, N, VC));
    CHECK(memcmp(h, g[t], sizeof(float) * (size_t)N * VC) == 0);
    free(h);
    CHECK_OK(rt_combine(cb[t], y, idx, w, NT, K, D, E, C));
  }
  for (int t = 1; t < 3; t++) {
    CHECK(memcmp(dt[0], dt[t], sizeof(float) * V * D) == 0);
    CHECK(memcmp(g[0], g[t], sizeof(float) * (size_t)N * VC) == 0);
    CHECK(memcmp(cb[0], cb[t], sizeof(float) * NT * D) == 0);
    CHECK(memcmp(&loss[0], &loss[t], sizeof(float)) == 0);
  }
  for (int t = 0; t < 3; t++) free(dt[t]), free(g[t]), free(cb[t]);
  free(ids), free(tg), free(idx), free(dy), free(lg), free(y), free(w);
}

int main(void) {
  CHECK_OK(rt_pool_init(2));
  test_topk();
  test_gather_scatter();
  test_onehot();
  test_routing();
  test_embedding();
  test_cross_entropy();
  test_determinism();
  rt_pool_shutdown();
  return check_result("test_route");
}
