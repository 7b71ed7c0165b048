/* tests/autodiff/ad_interp.c -- the interpreter against plain C written
 * here, independently of ir/interp.c, and against values worked out by
 * hand, so that the finite-difference tests do not only prove the
 * interpreter consistent with itself.  Also checks that out-of-range
 * indices are errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ad_check.h"

static int fails;

static void report(const char *what, double err, double tol) {
  int ok = err <= tol;
  printf("%s %-48s max error %.3g\n", ok ? "ok  " : "FAIL", what, err);
  fails += !ok;
}

static double max_diff(const double *a, const double *b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(a[i] - b[i]));
  return m;
}

/* Fills the leaves, runs the module, returns the interpreter. */
static IrInterp *run(Build *b) {
  IrInterp *it = ir_interp_new(b->m);
  fill_leaves(b, it);
  char why[512];
  if (ir_interp_run(it, 0, b->m->nnodes, why, sizeof why)) {
    printf("FAIL interpreter: %s\n", why);
    exit(1);
  }
  return it;
}

#define F(it, n) ((it)->f[(n)->id])
#define I(it, n) ((it)->i[(n)->id])

static void matmul_broadcast(void) {
  Build b;
  build_init(&b, "matmul", 11);
  IrNode *x = t_param(&b, LEAF_NORMAL, 1, 0, S(2, 3, 4));
  IrNode *w = t_param(&b, LEAF_NORMAL, 1, 0, S(5, 4));
  IrNode *y = t_op2(&b, IR_OP_MATMUL, x, w, 1, 0);
  IrInterp *it = run(&b);
  double ref[2 * 3 * 5];
  for (int bt = 0; bt < 6; bt++)
    for (int n = 0; n < 5; n++) {
      double s = 0;
      for (int k = 0; k < 4; k++) s += F(it, x)[bt * 4 + k] * F(it, w)[n * 4 + k];
      ref[bt * 5 + n] = s;
    }
  report("matmul [2,3,4] @ [5,4]^T", max_diff(F(it, y), ref, 30), 1e-12);
  ir_interp_free(it);
  ir_module_free(b.m);
}

static void norms_and_gelu(void) {
  Build b;
  build_init(&b, "norms", 12);
  IrNode *x = t_param(&b, LEAF_NORMAL, 2, 0.5, S(3, 6));
  IrNode *w = t_param(&b, LEAF_NORMAL, 1, 1, S(6)), *bias = t_param(&b, LEAF_NORMAL, 1, 0, S(6));
  IrNode *in[3] = {x, w, bias};
  IrNode *ln = t_op(&b, IR_OP_LAYERNORM, in, 3, 0, 0, 0, 1e-5);
  IrNode *rms = t_op2(&b, IR_OP_RMSNORM, x, w, 0, 1e-6);
  IrNode *ge = t_op1(&b, IR_OP_GELU, x, 0, 0, 0, 0);
  IrNode *si = t_op1(&b, IR_OP_SILU, x, 0, 0, 0, 0);
  IrInterp *it = run(&b);
  double rl[18], rr[18], rg[18], rs[18];
  for (int r = 0; r < 3; r++) {
    const double *v = F(it, x) + r * 6;
    double mu = 0, var = 0, ms = 0;
    for (int j = 0; j < 6; j++) mu += v[j] / 6, ms += v[j] * v[j] / 6;
    for (int j = 0; j < 6; j++) var += (v[j] - mu) * (v[j] - mu) / 6;
    for (int j = 0; j < 6; j++) {
      rl[r * 6 + j] = (v[j] - mu) / sqrt(var + 1e-5) * F(it, w)[j] + F(it, bias)[j];
      rr[r * 6 + j] = v[j] / sqrt(ms + 1e-6) * F(it, w)[j];
      double u = v[j];
      rg[r * 6 + j] = 0.5 * u * (1 + tanh(0.7978845608028654 * (u + 0.044715 * u * u * u)));
      rs[r * 6 + j] = u / (1 + exp(-u));
    }
  }
  report("layer_norm (biased variance, eps inside)", max_diff(F(it, ln), rl, 18), 1e-12);
  report("rms_norm", max_diff(F(it, rms), rr, 18), 1e-12);
  report("gelu (tanh form)", max_diff(F(it, ge), rg, 18), 1e-12);
  report("silu", max_diff(F(it, si), rs, 18), 1e-12);
  ir_interp_free(it);
  ir_module_free(b.m);
}

static void softmax_and_loss(void) {
  Build b;
  build_init(&b, "softmax", 13);
  IrNode *x = t_param(&b, LEAF_FIXED, 0, 0, S(2, 3));
  IrNode *t = t_fixed_ids(&b, S(2));
  IrNode *sm = t_op1(&b, IR_OP_SOFTMAX, x, 0, 0, 0, 0);
  IrNode *ce = t_op2(&b, IR_OP_CROSS_ENTROPY, x, t, 0, 0);
  IrInterp *it = ir_interp_new(b.m);
  const double v[6] = {0, log(2.0), log(3.0), 1000, 1000, 1000};
  memcpy(F(it, x), v, sizeof v);
  I(it, t)[0] = 2, I(it, t)[1] = 0;
  char why[256];
  if (ir_interp_run(it, 0, b.m->nnodes, why, sizeof why)) printf("FAIL %s\n", why), exit(1);
  const double want[6] = {1 / 6.0, 2 / 6.0, 3 / 6.0, 1 / 3.0, 1 / 3.0, 1 / 3.0};
  report("softmax [0, ln 2, ln 3] and large equal logits", max_diff(F(it, sm), want, 6), 1e-15);
  double ref = (-log(0.5) + -log(1 / 3.0)) / 2;
  report("cross_entropy = mean -log p[target]", fabs(F(it, ce)[0] - ref), 1e-12);
  ir_interp_free(it);
  ir_module_free(b.m);
}

/* log against C's, and the prelude's logsumexp (z_j - log softmax(z)_j at
 * j = argmax, as IR ops) against the two-pass max-shifted formula: equal
 * logits, a huge row (exp overflows even a double), a spread row, random. */
static void log_and_logsumexp(void) {
  Build b;
  build_init(&b, "log", 19);
  IrNode *x = t_param(&b, LEAF_UNIFORM, 1e-3, 50, S(4, 5));
  IrNode *lx = t_op1(&b, IR_OP_LOG, x, 0, 0, 0, 0);
  IrNode *z = t_param(&b, LEAF_FIXED, 0, 0, S(4, 3));
  IrNode *p = t_op1(&b, IR_OP_SOFTMAX, z, 0, 0, 0, 0);
  IrNode *j = t_op1(&b, IR_OP_TOPK, p, 1, 0, 0, 0);
  IrNode *lse = t_op2(&b, IR_OP_SUB, t_op2(&b, IR_OP_GATHER, z, j, 0, 0),
                      t_op1(&b, IR_OP_LOG, t_op2(&b, IR_OP_GATHER, p, j, 0, 0), 0, 0, 0, 0), 0, 0);
  IrInterp *it = ir_interp_new(b.m);
  fill_leaves(&b, it);
  const double zv[12] = {1000, 1000, 1000, 800, 799, -5, 0, -30, -60, 0.3, -1.2, 2.5};
  memcpy(F(it, z), zv, sizeof zv);
  F(it, x)[0] = 1, F(it, x)[1] = exp(1.0), F(it, x)[2] = 0;
  char why[256];
  if (ir_interp_run(it, 0, b.m->nnodes, why, sizeof why)) printf("FAIL %s\n", why), exit(1);
  double err = 0;
  for (int i = 3; i < 20; i++) err = fmax(err, fabs(F(it, lx)[i] - log(F(it, x)[i])));
  int ok = F(it, lx)[0] == 0 && F(it, lx)[1] == 1 && isinf(F(it, lx)[2]) && F(it, lx)[2] < 0;
  printf("%s log(1) = 0, log(e) = 1, log(0) = -inf\n", ok ? "ok  " : "FAIL");
  fails += !ok;
  report("log against C's log", err, 0);
  double want[4];
  for (int r = 0; r < 4; r++) {
    const double *v = zv + 3 * r;
    double m = fmax(v[0], fmax(v[1], v[2])), s = 0;
    for (int k = 0; k < 3; k++) s += exp(v[k] - m);
    want[r] = m + log(s);
  }
  report("logsumexp: equal, huge, spread and random rows", max_diff(F(it, lse), want, 4),
         1e-12);
  ir_interp_free(it);
  ir_module_free(b.m);
}

/* Attention written the textbook way: scores with -inf above the diagonal,
 * exp without the max shift, explicit GQA head mapping. */
static void attention_gqa(void) {
  enum { B = 2, H = 4, KV = 2, T = 5, D = 3 };
  Build b;
  build_init(&b, "sdpa", 14);
  IrNode *in[3];
  in[0] = t_param(&b, LEAF_NORMAL, 1, 0, S(B, H, T, D));
  in[1] = t_param(&b, LEAF_NORMAL, 1, 0, S(B, KV, T, D));
  in[2] = t_param(&b, LEAF_NORMAL, 1, 0, S(B, KV, T, D));
  IrNode *causal = t_op(&b, IR_OP_ATTENTION, in, 3, 1, 0, 0, 0.6);
  IrNode *full = t_op(&b, IR_OP_ATTENTION, in, 3, 0, 0, 0, 0.6);
  IrInterp *it = run(&b);
  const double *q = F(it, in[0]), *k = F(it, in[1]), *v = F(it, in[2]);
  for (int c = 0; c < 2; c++) {
    double ref[B * H * T * D];
    for (int bi = 0; bi < B; bi++)
      for (int h = 0; h < H; h++)
        for (int t = 0; t < T; t++) {
          int g = h / (H / KV);
          double e[T], z = 0;
          for (int u = 0; u < T; u++) {
            double s = 0;
            for (int i = 0; i < D; i++)
              s += q[((bi * H + h) * T + t) * D + i] * k[((bi * KV + g) * T + u) * D + i];
            s = (c == 0 && u > t) ? -INFINITY : 0.6 * s;
            z += e[u] = exp(s);
          }
          for (int i = 0; i < D; i++) {
            double o = 0;
            for (int u = 0; u < T; u++) o += e[u] / z * v[((bi * KV + g) * T + u) * D + i];
            ref[((bi * H + h) * T + t) * D + i] = o;
          }
        }
    report(c == 0 ? "sdpa GQA causal" : "sdpa GQA non-causal",
           max_diff(F(it, c == 0 ? causal : full), ref, B * H * T * D), 1e-12);
  }
  ir_interp_free(it);
  ir_module_free(b.m);
}

/* sdpa_lse and sdpa_delta against plain C: lse = log sum_u exp(scaled score)
 * over the visible keys (no max shift; small scores), D = dy . out with dy
 * split out of the merged dm by hand; and sdpa_grad from them equals
 * sdpa_grad from sdpa's out and lse exactly (the same sums in the same
 * order). */
static void attention_stats(void) {
  enum { B = 2, H = 4, KV = 2, T = 5, D = 3 };
  Build b;
  build_init(&b, "sdpa_stats", 16);
  IrNode *in[3];
  in[0] = t_param(&b, LEAF_NORMAL, 1, 0, S(B, H, T, D));
  in[1] = t_param(&b, LEAF_NORMAL, 1, 0, S(B, KV, T, D));
  in[2] = t_param(&b, LEAF_NORMAL, 1, 0, S(B, KV, T, D));
  IrNode *y = t_op(&b, IR_OP_ATTENTION, in, 3, 1, 0, 0, 0.6);
  IrNode *m = t_op1(&b, IR_OP_MERGE_HEADS, y, 0, 0, 0, 0);
  IrNode *dm = t_param(&b, LEAF_NORMAL, 1, 0, S(B, T, H * D));
  IrNode *dy = t_op1(&b, IR_OP_SPLIT_HEADS, dm, H, 0, 0, 0);
  IrNode *lse = t_op1(&b, IR_OP_ATTENTION_LSE, y, 0, 0, 0, 0);
  IrNode *d = t_op2(&b, IR_OP_ATTENTION_DELTA, m, dm, H, 0);
  IrNode *g5 = t_op(&b, IR_OP_ATTENTION_GRAD, (IrNode *[]){in[0], in[1], in[2], dy, y}, 5, 1, 0,
                    0, 0.6);
  IrNode *g6 = t_op(&b, IR_OP_ATTENTION_GRAD, (IrNode *[]){in[0], in[1], in[2], dy, lse, d}, 6,
                    1, 0, 0, 0.6);
  IrInterp *it = run(&b);
  const double *q = F(it, in[0]), *k = F(it, in[1]), *o = F(it, y), *dmv = F(it, dm);
  double rl[B * H * T], rd[B * H * T];
  for (int bi = 0; bi < B; bi++)
    for (int h = 0; h < H; h++)
      for (int t = 0; t < T; t++) {
        int g = h / (H / KV), r = (bi * H + h) * T + t;
        double z = 0, dot = 0;
        for (int u = 0; u <= t; u++) {
          double s = 0;
          for (int i = 0; i < D; i++) s += q[r * D + i] * k[((bi * KV + g) * T + u) * D + i];
          z += exp(0.6 * s);
        }
        for (int i = 0; i < D; i++) dot += o[r * D + i] * dmv[(bi * T + t) * H * D + h * D + i];
        rl[r] = log(z), rd[r] = dot;
      }
  report("sdpa_lse against plain C", max_diff(F(it, lse), rl, B * H * T), 1e-12);
  report("sdpa_delta against plain C", max_diff(F(it, d), rd, B * H * T), 1e-12);
  report("sdpa_grad from lse and D equals from out", max_diff(F(it, g6), F(it, g5),
                                                              ir_numel(g5)), 0);
  ir_interp_free(it);
  ir_module_free(b.m);
}

/* Hugging Face: cos/sin = cat(freqs, freqs), x * cos + rotate_half(x) * sin
 * with rotate_half(x) = cat(-x2, x1). */
static void rope_hf(void) {
  enum { T = 4, HD = 6 };
  Build b;
  build_init(&b, "rope", 15);
  IrNode *x = t_param(&b, LEAF_NORMAL, 1, 0, S(1, 2, T, HD));
  IrNode *y = t_op1(&b, IR_OP_ROPE, x, 0, 0, 0, 10000.0);
  IrInterp *it = run(&b);
  double ref[2 * T * HD];
  for (int h = 0; h < 2; h++)
    for (int t = 0; t < T; t++) {
      const double *r = F(it, x) + (h * T + t) * HD;
      for (int j = 0; j < HD; j++) {
        double inv = 1.0 / pow(10000.0, (double)(2 * (j % (HD / 2))) / HD);
        double rot = j < HD / 2 ? -r[j + HD / 2] : r[j - HD / 2];
        ref[(h * T + t) * HD + j] = r[j] * cos(t * inv) + rot * sin(t * inv);
      }
    }
  report("rope, rotate_half convention", max_diff(F(it, y), ref, 2 * T * HD), 1e-12);
  ir_interp_free(it);
  ir_module_free(b.m);
}

static void layout_and_reduce(void) {
  Build b;
  build_init(&b, "layout", 16);
  IrNode *x = t_param(&b, LEAF_NORMAL, 1, 0, S(2, 3, 4)); /* [B=2, T=3, H*hd = 2*2] */
  IrNode *sh = t_op1(&b, IR_OP_SPLIT_HEADS, x, 2, 0, 0, 0);
  IrNode *tr = t_op1(&b, IR_OP_TRANSPOSE, x, 0, 2, 0, 0);
  IrNode *sk = t_op1(&b, IR_OP_SUM, x, 1, 1, 0, 0);
  IrNode *mn = t_op1(&b, IR_OP_MEAN, x, 2, 0, 0, 0);
  IrInterp *it = run(&b);
  double rs[24], rt[24], rk[8], rm[6];
  const double *v = F(it, x);
  for (int bb = 0; bb < 2; bb++)
    for (int t = 0; t < 3; t++)
      for (int c = 0; c < 4; c++) {
        double e = v[(bb * 3 + t) * 4 + c];
        rs[((bb * 2 + c / 2) * 3 + t) * 2 + c % 2] = e;
        rt[(c * 3 + t) * 2 + bb] = e;
      }
  for (int bb = 0; bb < 2; bb++)
    for (int c = 0; c < 4; c++)
      rk[bb * 4 + c] = v[bb * 12 + c] + v[bb * 12 + 4 + c] + v[bb * 12 + 8 + c];
  for (int r = 0; r < 6; r++) rm[r] = (v[r * 4] + v[r * 4 + 1] + v[r * 4 + 2] + v[r * 4 + 3]) / 4;
  report("split_heads [B,T,H*hd] -> [B,H,T,hd]", max_diff(F(it, sh), rs, 24), 0);
  report("transpose dims 0 and 2", max_diff(F(it, tr), rt, 24), 0);
  report("sum axis 1 keepdim", max_diff(F(it, sk), rk, 8), 1e-15);
  report("mean axis 2", max_diff(F(it, mn), rm, 6), 1e-15);
  ir_interp_free(it);
  ir_module_free(b.m);
}

/* topk ties and the MoE routing with a full expert, worked out by hand. */
static void routing(void) {
  Build b;
  build_init(&b, "routing", 17);
  IrNode *s = t_param(&b, LEAF_FIXED, 0, 0, S(1, 4));
  IrNode *top = t_op1(&b, IR_OP_TOPK, s, 3, 0, 0, 0);
  IrNode *x = t_param(&b, LEAF_FIXED, 0, 0, S(3, 2));
  IrNode *idx = t_fixed_ids(&b, S(3, 2));
  IrNode *w = t_param(&b, LEAF_FIXED, 0, 0, S(3, 2));
  IrNode *din[2] = {x, idx};
  IrNode *d = t_op(&b, IR_OP_DISPATCH, din, 2, 2, 2, 0, 0); /* experts 2, capacity 2 */
  IrNode *cin[3] = {d, idx, w};
  IrNode *c = t_op(&b, IR_OP_COMBINE, cin, 3, 0, 0, 0, 0);
  IrNode *g = t_op2(&b, IR_OP_GATHER, w, idx, 0, 0);
  IrNode *oh = t_op1(&b, IR_OP_ONEHOT, idx, 2, 0, 0, 0);
  IrInterp *it = ir_interp_new(b.m);
  const double sv[4] = {1, 3, 3, 2}, xv[6] = {1, 2, 3, 4, 5, 6}, wv[6] = {0.5, 0.25, 2, 4, 8, 16};
  const int32_t iv[6] = {0, 1, 0, 1, 0, 0}; /* token 2's choices find expert 0 full */
  memcpy(F(it, s), sv, sizeof sv);
  memcpy(F(it, x), xv, sizeof xv);
  memcpy(F(it, w), wv, sizeof wv);
  memcpy(I(it, idx), iv, sizeof iv);
  char why[256];
  if (ir_interp_run(it, 0, b.m->nnodes, why, sizeof why)) printf("FAIL %s\n", why), exit(1);
  const int32_t want_top[3] = {1, 2, 3};
  int ok = !memcmp(I(it, top), want_top, sizeof want_top);
  printf("%s topk of [1, 3, 3, 2], k 3 = [1, 2, 3] (ties: lower index first)\n",
         ok ? "ok  " : "FAIL");
  fails += !ok;
  /* expert 0: slot 0 token 0, slot 1 token 1; expert 1 the same; token 2 dropped */
  const double want_d[8] = {1, 2, 3, 4, 1, 2, 3, 4};
  report("dispatch with a full expert", max_diff(F(it, d), want_d, 8), 0);
  const double want_c[6] = {0.5 * 1 + 0.25 * 1, 0.5 * 2 + 0.25 * 2, 2 * 3 + 4 * 3,
                            2 * 4 + 4 * 4, 0, 0};
  report("combine: dropped choices add nothing", max_diff(F(it, c), want_c, 6), 0);
  const double want_g[6] = {0.5, 0.25, 2, 4, 8, 8};
  report("gather along the last axis", max_diff(F(it, g), want_g, 6), 0);
  const double want_oh[12] = {1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 1, 0};
  report("onehot", max_diff(F(it, oh), want_oh, 12), 0);
  ir_interp_free(it);
  ir_module_free(b.m);
}

/* An id outside the table is an error naming the node, not a clamp. */
static void bad_ids(void) {
  Build b;
  build_init(&b, "ids", 18);
  IrNode *ids = t_fixed_ids(&b, S(3));
  IrNode *table = t_param(&b, LEAF_NORMAL, 1, 0, S(4, 2));
  t_op2(&b, IR_OP_EMBEDDING, ids, table, 0, 0);
  IrInterp *it = ir_interp_new(b.m);
  fill_leaves(&b, it);
  I(it, ids)[0] = 1, I(it, ids)[1] = 4, I(it, ids)[2] = 0;
  char why[256] = "";
  int rc = ir_interp_run(it, 0, b.m->nnodes, why, sizeof why);
  int ok = rc == -1 && strstr(why, "id 4 at position 1 is outside [0, 4)");
  printf("%s embedding id out of range is an error (%s)\n", ok ? "ok  " : "FAIL", why);
  fails += !ok;
  ir_interp_free(it);
  ir_module_free(b.m);
}

int main(void) {
  matmul_broadcast();
  norms_and_gelu();
  softmax_and_loss();
  log_and_logsumexp();
  attention_gqa();
  attention_stats();
  rope_hf();
  layout_and_reduce();
  routing();
  bad_ids();
  return fails != 0;
}
