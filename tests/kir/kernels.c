/* tests/kir/kernels.c -- test kernels, written the way the fusion pass
 * builds them: one builder call per operation.  The plain C references are
 * in check.c. */
#include "kernels.h"

#include <stdio.h>

#define F(v) kir_fconst(k, (float)(v))
#define I(v) kir_iconst(k, (int64_t)(v))

static KirKernel *begin(KirModule *m, const char *kind, int64_t R, int64_t C) {
  char name[64];
  snprintf(name, sizeof name, "%s_%lld_%lld", kind, (long long)R, (long long)C);
  return kir_kernel_new(m, name);
}

/* Element (row, col) of a row-major [*, C] buffer, for the row loop. */
static KirVal at(KirKernel *k, int64_t C, KirVal col) {
  return kir_add(k, kir_mul(k, kir_row(k, 0), I(C)), col);
}

/* y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
static void gelu(KirModule *m, int64_t R, int64_t C) {
  KirKernel *k = begin(m, "gelu", R, C);
  kir_row_dim(k, R);
  int x = kir_buf(k, "x", KIR_F32, KIR_IN), y = kir_buf(k, "y", KIR_F32, KIR_OUT);
  kir_loop(k, I(C));
  KirVal i = at(k, C, kir_col(k));
  KirVal v = kir_load(k, x, i);
  KirVal cube = kir_mul(k, kir_mul(k, v, v), v);
  KirVal u = kir_mul(k, F(0.7978845608f), kir_add(k, v, kir_mul(k, F(0.044715f), cube)));
  kir_store(k, y, i, kir_mul(k, kir_mul(k, F(0.5f), v), kir_add(k, F(1.0f), kir_tanh(k, u))));
  kir_end(k);
}

/* y[r, c] = x[r, c] + bias[c] + res[r, c] */
static void bias_residual(KirModule *m, int64_t R, int64_t C) {
  KirKernel *k = begin(m, "bias_residual", R, C);
  kir_row_dim(k, R);
  int x = kir_buf(k, "x", KIR_F32, KIR_IN), bias = kir_buf(k, "bias", KIR_F32, KIR_IN);
  int res = kir_buf(k, "res", KIR_F32, KIR_IN), y = kir_buf(k, "y", KIR_F32, KIR_OUT);
  kir_loop(k, I(C));
  KirVal c = kir_col(k), i = at(k, C, c);
  KirVal s = kir_add(k, kir_add(k, kir_load(k, x, i), kir_load(k, bias, c)), kir_load(k, res, i));
  kir_store(k, y, i, s);
  kir_end(k);
}

/* One flat loop over R*C: y[i] = x[i] * scale[i / C] + bias[i % C]. */
static void bcast(KirModule *m, int64_t R, int64_t C) {
  KirKernel *k = begin(m, "bcast", R, C);
  int x = kir_buf(k, "x", KIR_F32, KIR_IN), scale = kir_buf(k, "scale", KIR_F32, KIR_IN);
  int bias = kir_buf(k, "bias", KIR_F32, KIR_IN), y = kir_buf(k, "y", KIR_F32, KIR_OUT);
  kir_loop(k, I(R * C));
  KirVal i = kir_col(k);
  KirVal v = kir_mul(k, kir_load(k, x, i), kir_load(k, scale, kir_idiv(k, i, C)));
  kir_store(k, y, i, kir_add(k, v, kir_load(k, bias, kir_imod(k, i, C))));
  kir_end(k);
}

/* y = exp(x - max) / sum, over each row. */
static void softmax(KirModule *m, int64_t R, int64_t C) {
  KirKernel *k = begin(m, "softmax", R, C);
  kir_row_dim(k, R);
  int x = kir_buf(k, "x", KIR_F32, KIR_IN), y = kir_buf(k, "y", KIR_F32, KIR_OUT);
  kir_loop(k, I(C));
  KirVal mx = kir_reduce(k, KIR_MAX, kir_load(k, x, at(k, C, kir_col(k))));
  kir_end(k);
  kir_loop(k, I(C));
  KirVal i = at(k, C, kir_col(k));
  KirVal e = kir_exp(k, kir_sub(k, kir_load(k, x, i), mx));
  kir_store(k, y, i, e);
  KirVal sum = kir_reduce(k, KIR_SUM, e);
  kir_end(k);
  KirVal inv = kir_div(k, F(1), sum);
  kir_loop(k, I(C));
  i = at(k, C, kir_col(k));
  kir_store(k, y, i, kir_mul(k, kir_load(k, y, i), inv));
  kir_end(k);
}

/* y = (x - mean) * rstd * w + b; saves mean and rstd for the backward. */
static void layernorm(KirModule *m, int64_t R, int64_t C) {
  KirKernel *k = begin(m, "layernorm", R, C);
  kir_row_dim(k, R);
  int x = kir_buf(k, "x", KIR_F32, KIR_IN), w = kir_buf(k, "w", KIR_F32, KIR_IN);
  int b = kir_buf(k, "b", KIR_F32, KIR_IN), y = kir_buf(k, "y", KIR_F32, KIR_OUT);
  int mean = kir_buf(k, "mean", KIR_F32, KIR_OUT), rstd = kir_buf(k, "rstd", KIR_F32, KIR_OUT);
  kir_loop(k, I(C));
  KirVal sum = kir_reduce(k, KIR_SUM, kir_load(k, x, at(k, C, kir_col(k))));
  kir_end(k);
  KirVal mu = kir_div(k, sum, F(C));
  kir_loop(k, I(C));
  KirVal d = kir_sub(k, kir_load(k, x, at(k, C, kir_col(k))), mu);
  KirVal ss = kir_reduce(k, KIR_SUM, kir_mul(k, d, d));
  kir_end(k);
  KirVal rs = kir_rsqrt(k, kir_add(k, kir_div(k, ss, F(C)), F(KT_EPS)));
  kir_store(k, mean, kir_row(k, 0), mu);
  kir_store(k, rstd, kir_row(k, 0), rs);
  kir_loop(k, I(C));
  KirVal c = kir_col(k), i = at(k, C, c);
  KirVal xhat = kir_mul(k, kir_sub(k, kir_load(k, x, i), mu), rs);
  kir_store(k, y, i, kir_add(k, kir_mul(k, xhat, kir_load(k, w, c)), kir_load(k, b, c)));
  kir_end(k);
}

/* y = x * rsqrt(mean(x^2) + eps) * w */
static void rmsnorm(KirModule *m, int64_t R, int64_t C) {
  KirKernel *k = begin(m, "rmsnorm", R, C);
  kir_row_dim(k, R);
  int x = kir_buf(k, "x", KIR_F32, KIR_IN), w = kir_buf(k, "w", KIR_F32, KIR_IN);
  int y = kir_buf(k, "y", KIR_F32, KIR_OUT);
  kir_loop(k, I(C));
  KirVal v = kir_load(k, x, at(k, C, kir_col(k)));
  KirVal ss = kir_reduce(k, KIR_SUM, kir_mul(k, v, v));
  kir_end(k);
  KirVal rs = kir_rsqrt(k, kir_add(k, kir_div(k, ss, F(C)), F(KT_EPS)));
  kir_loop(k, I(C));
  KirVal c = kir_col(k), i = at(k, C, c);
  kir_store(k, y, i, kir_mul(k, kir_mul(k, kir_load(k, x, i), rs), kir_load(k, w, c)));
  kir_end(k);
}

/* Row max and log-sum-exp of the logits: the shared start of both
 * cross-entropy kernels.  Returns lse; *mx gets the max. */
static KirVal logsumexp(KirKernel *k, int x, int64_t C, KirVal *mx) {
  kir_loop(k, I(C));
  *mx = kir_reduce(k, KIR_MAX, kir_load(k, x, at(k, C, kir_col(k))));
  kir_end(k);
  kir_loop(k, I(C));
  KirVal e = kir_exp(k, kir_sub(k, kir_load(k, x, at(k, C, kir_col(k))), *mx));
  KirVal sum = kir_reduce(k, KIR_SUM, e);
  kir_end(k);
  return kir_add(k, *mx, kir_log(k, sum));
}

/* loss[r] = logsumexp(x[r]) - x[r, t[r]]; 0 where t[r] < 0 (ignored). */
static void crossentropy(KirModule *m, int64_t R, int64_t C) {
  KirKernel *k = begin(m, "crossentropy", R, C);
  kir_row_dim(k, R);
  int x = kir_buf(k, "logits", KIR_F32, KIR_IN), t = kir_buf(k, "targets", KIR_I32, KIR_IN);
  int loss = kir_buf(k, "loss", KIR_F32, KIR_OUT);
  KirVal mx, lse = logsumexp(k, x, C, &mx);
  KirVal r = kir_row(k, 0), tgt = kir_load(k, t, r);
  KirVal xt = kir_load(k, x, at(k, C, kir_max(k, tgt, I(0))));
  KirVal valid = kir_cmp(k, KIR_GE, tgt, I(0));
  kir_store(k, loss, r, kir_select(k, valid, kir_sub(k, lse, xt), F(0)));
}

/* dlogits = (softmax(x) - onehot(t)) * dloss[r]; 0 where t[r] < 0. */
static void ce_bwd(KirModule *m, int64_t R, int64_t C) {
  KirKernel *k = begin(m, "ce_bwd", R, C);
  kir_row_dim(k, R);
  int x = kir_buf(k, "logits", KIR_F32, KIR_IN), t = kir_buf(k, "targets", KIR_I32, KIR_IN);
  int dloss = kir_buf(k, "dloss", KIR_F32, KIR_IN), dx = kir_buf(k, "dlogits", KIR_F32, KIR_OUT);
  KirVal mx, lse = logsumexp(k, x, C, &mx);
  KirVal tgt = kir_load(k, t, kir_row(k, 0));
  KirVal g = kir_select(k, kir_cmp(k, KIR_GE, tgt, I(0)), kir_load(k, dloss, kir_row(k, 0)), F(0));
  kir_loop(k, I(C));
  KirVal c = kir_col(k), i = at(k, C, c);
  KirVal p = kir_exp(k, kir_sub(k, kir_load(k, x, i), lse));
  KirVal hot = kir_select(k, kir_cmp(k, KIR_EQ, c, tgt), F(1), F(0));
  kir_store(k, dx, i, kir_mul(k, kir_sub(k, p, hot), g));
  kir_end(k);
}

/* h is [R, 2C] (gate | up); y[r, c] = silu(gate) * up. */
static void swiglu(KirModule *m, int64_t R, int64_t C) {
  KirKernel *k = begin(m, "swiglu", R, C);
  kir_row_dim(k, R);
  int h = kir_buf(k, "h", KIR_F32, KIR_IN), y = kir_buf(k, "y", KIR_F32, KIR_OUT);
  kir_loop(k, I(C));
  KirVal c = kir_col(k);
  KirVal gi = kir_add(k, kir_mul(k, kir_row(k, 0), I(2 * C)), c);
  KirVal g = kir_load(k, h, gi), u = kir_load(k, h, kir_add(k, gi, I(C)));
  KirVal silu = kir_div(k, g, kir_add(k, F(1), kir_exp(k, kir_neg(k, g))));
  kir_store(k, y, at(k, C, c), kir_mul(k, silu, u));
  kir_end(k);
}

/* out[c] = sum over r of x[r, c]: the kept axis (columns of x) is the row
 * space, the reduced axis (rows of x) the column loop. */
static void colsum(KirModule *m, int64_t R, int64_t C) {
  KirKernel *k = begin(m, "colsum", R, C);
  kir_row_dim(k, C);
  int x = kir_buf(k, "x", KIR_F32, KIR_IN), out = kir_buf(k, "out", KIR_F32, KIR_OUT);
  kir_loop(k, I(R));
  KirVal i = kir_add(k, kir_mul(k, kir_col(k), I(C)), kir_row(k, 0));
  KirVal s = kir_reduce(k, KIR_SUM, kir_load(k, x, i));
  kir_end(k);
  kir_store(k, out, kir_row(k, 0), s);
}

/* dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)),
 * dxhat = dy * w, xhat = (x - mean) * rstd. */
static void layernorm_bwd(KirModule *m, int64_t R, int64_t C) {
  KirKernel *k = begin(m, "layernorm_bwd", R, C);
  kir_row_dim(k, R);
  int dy = kir_buf(k, "dy", KIR_F32, KIR_IN), x = kir_buf(k, "x", KIR_F32, KIR_IN);
  int w = kir_buf(k, "w", KIR_F32, KIR_IN), mean = kir_buf(k, "mean", KIR_F32, KIR_IN);
  int rstd = kir_buf(k, "rstd", KIR_F32, KIR_IN), dx = kir_buf(k, "dx", KIR_F32, KIR_OUT);
  KirVal mu = kir_load(k, mean, kir_row(k, 0)), rs = kir_load(k, rstd, kir_row(k, 0));
  KirVal s1 = KIR_NONE, s2 = KIR_NONE;
  for (int pass = 0; pass < 2; pass++) {
    kir_loop(k, I(C));
    KirVal c = kir_col(k), i = at(k, C, c);
    KirVal xhat = kir_mul(k, kir_sub(k, kir_load(k, x, i), mu), rs);
    KirVal dxhat = kir_mul(k, kir_load(k, dy, i), kir_load(k, w, c));
    if (pass == 0) {
      s1 = kir_reduce(k, KIR_SUM, dxhat);  /* two reductions, one loop */
      s2 = kir_reduce(k, KIR_SUM, kir_mul(k, dxhat, xhat));
    } else {
      KirVal a = kir_div(k, s1, F(C)), b = kir_div(k, s2, F(C));
      KirVal d = kir_sub(k, kir_sub(k, dxhat, a), kir_mul(k, xhat, b));
      kir_store(k, dx, i, kir_mul(k, d, rs));
    }
    kir_end(k);
  }
}

/* dw[c] += sum_r dy * xhat, db[c] += sum_r dy: rows are columns of x. */
static void ln_bwd_params(KirModule *m, int64_t R, int64_t C) {
  KirKernel *k = begin(m, "ln_bwd_params", R, C);
  kir_row_dim(k, C);
  int dy = kir_buf(k, "dy", KIR_F32, KIR_IN), x = kir_buf(k, "x", KIR_F32, KIR_IN);
  int mean = kir_buf(k, "mean", KIR_F32, KIR_IN), rstd = kir_buf(k, "rstd", KIR_F32, KIR_IN);
  int dw = kir_buf(k, "dw", KIR_F32, KIR_INOUT), db = kir_buf(k, "db", KIR_F32, KIR_INOUT);
  KirVal c = kir_row(k, 0);
  kir_loop(k, I(R));
  KirVal r = kir_col(k), i = kir_add(k, kir_mul(k, r, I(C)), c);
  KirVal xhat = kir_mul(k, kir_sub(k, kir_load(k, x, i), kir_load(k, mean, r)),
                        kir_load(k, rstd, r));
  KirVal g = kir_load(k, dy, i);
  KirVal sw = kir_reduce(k, KIR_SUM, kir_mul(k, g, xhat));
  KirVal sb = kir_reduce(k, KIR_SUM, g);
  kir_end(k);
  kir_store(k, dw, c, kir_add(k, kir_load(k, dw, c), sw));
  kir_store(k, db, c, kir_add(k, kir_load(k, db, c), sb));
}

/* relu stored while max, min and sum reduce in the same loop. */
static void rowstats(KirModule *m, int64_t R, int64_t C) {
  KirKernel *k = begin(m, "rowstats", R, C);
  kir_row_dim(k, R);
  int x = kir_buf(k, "x", KIR_F32, KIR_IN), relu = kir_buf(k, "relu", KIR_F32, KIR_OUT);
  int st = kir_buf(k, "stats", KIR_F32, KIR_OUT);
  kir_loop(k, I(C));
  KirVal i = at(k, C, kir_col(k)), v = kir_load(k, x, i);
  kir_store(k, relu, i, kir_max(k, v, F(0)));
  KirVal mx = kir_reduce(k, KIR_MAX, v), mn = kir_reduce(k, KIR_MIN, v);
  KirVal s = kir_reduce(k, KIR_SUM, v);
  kir_end(k);
  KirVal base = kir_mul(k, kir_row(k, 0), I(3));
  kir_store(k, st, base, mx);
  kir_store(k, st, kir_add(k, base, I(1)), mn);
  kir_store(k, st, kir_add(k, base, I(2)), s);
}

/* Index values both ways: ids[r, c] = (3c + r) % 7 - 2 (an i32 store of
 * possibly negative values), pos[r, c] = float(min(c, r) - max(c, 2)). */
static void indexing(KirModule *m, int64_t R, int64_t C) {
  KirKernel *k = begin(m, "indexing", R, C);
  kir_row_dim(k, R);
  int ids = kir_buf(k, "ids", KIR_I32, KIR_OUT), pos = kir_buf(k, "pos", KIR_F32, KIR_OUT);
  kir_loop(k, I(C));
  KirVal c = kir_col(k), r = kir_row(k, 0), i = at(k, C, c);
  kir_store(k, ids, i, kir_sub(k, kir_imod(k, kir_add(k, kir_mul(k, c, I(3)), r), 7), I(2)));
  kir_store(k, pos, i, kir_itof(k, kir_sub(k, kir_min(k, c, r), kir_max(k, c, I(2)))));
  kir_end(k);
}

/* Causal softmax over attention scores [2, T, T]: rows (b, t) see columns
 * 0..t; the rest of the row is zeroed.  Row-dependent extents, two row dims. */
static void causal_softmax(KirModule *m, int64_t T) {
  KirKernel *k = begin(m, "causal_softmax", 2, T);
  kir_row_dim(k, 2);
  kir_row_dim(k, T);
  int x = kir_buf(k, "x", KIR_F32, KIR_IN), y = kir_buf(k, "y", KIR_F32, KIR_OUT);
  KirVal t = kir_row(k, 1);
  KirVal base = kir_mul(k, kir_add(k, kir_mul(k, kir_row(k, 0), I(T)), t), I(T));
  KirVal n = kir_add(k, t, I(1));
  kir_loop(k, n);
  KirVal mx = kir_reduce(k, KIR_MAX, kir_load(k, x, kir_add(k, base, kir_col(k))));
  kir_end(k);
  kir_loop(k, n);
  KirVal i = kir_add(k, base, kir_col(k));
  KirVal e = kir_exp(k, kir_sub(k, kir_load(k, x, i), mx));
  kir_store(k, y, i, e);
  KirVal sum = kir_reduce(k, KIR_SUM, e);
  kir_end(k);
  KirVal inv = kir_div(k, F(1), sum);
  kir_loop(k, n);
  i = kir_add(k, base, kir_col(k));
  kir_store(k, y, i, kir_mul(k, kir_load(k, y, i), inv));
  kir_end(k);
  kir_loop(k, kir_sub(k, I(T), n));  /* zero extent on the last row */
  kir_store(k, y, kir_add(k, kir_add(k, base, n), kir_col(k)), F(0));
  kir_end(k);
}

/* exp, log, tanh, sqrt, rsqrt of n values (n a runtime scalar). */
static void mathfns(KirModule *m) {
  KirKernel *k = kir_kernel_new(m, "mathfns");
  int x = kir_buf(k, "x", KIR_F32, KIR_IN);
  static const char *const out[5] = {"y_exp", "y_log", "y_tanh", "y_sqrt", "y_rsqrt"};
  int y[5];
  for (int j = 0; j < 5; j++) y[j] = kir_buf(k, out[j], KIR_F32, KIR_OUT);
  int n = kir_scalar(k, "n", KIR_TY_INDEX);
  kir_loop(k, kir_param(k, n));
  KirVal c = kir_col(k), v = kir_load(k, x, c);
  KirVal f[5] = {kir_exp(k, v), kir_log(k, v), kir_tanh(k, v), kir_sqrt(k, v), kir_rsqrt(k, v)};
  for (int j = 0; j < 5; j++) kir_store(k, y[j], c, f[j]);
  kir_end(k);
}

/* y[r, c] = alpha * x[r, c] + y[r, c], n columns: both scalar kinds. */
static void axpy(KirModule *m) {
  KirKernel *k = kir_kernel_new(m, "axpy");
  kir_row_dim(k, KT_AXPY_ROWS);
  int alpha = kir_scalar(k, "alpha", KIR_TY_F32);
  int x = kir_buf(k, "x", KIR_F32, KIR_IN), y = kir_buf(k, "y", KIR_F32, KIR_INOUT);
  int n = kir_scalar(k, "n", KIR_TY_INDEX);
  KirVal N = kir_param(k, n);
  kir_loop(k, N);
  KirVal i = kir_add(k, kir_mul(k, kir_row(k, 0), N), kir_col(k));
  KirVal v = kir_add(k, kir_mul(k, kir_param(k, alpha), kir_load(k, x, i)), kir_load(k, y, i));
  kir_store(k, y, i, v);
  kir_end(k);
}

typedef void Build(KirModule *m, int64_t R, int64_t C);
static Build *const kinds[] = {gelu,   bias_residual, bcast,         softmax,       layernorm,
                               rmsnorm, crossentropy, ce_bwd,        swiglu,        colsum,
                               layernorm_bwd, ln_bwd_params, rowstats, indexing};

void kt_build(KirModule *m, int all) {
  for (size_t j = 0; j < sizeof kinds / sizeof *kinds; j++) {
#define X(R, C) \
  if (all || (R == 13 && C == 7)) kinds[j](m, R, C);
    KT_SIZES(X)
#undef X
  }
#define X(T) \
  if (all || T == 7) causal_softmax(m, T);
  KT_CAUSAL(X)
#undef X
  mathfns(m);
  axpy(m);
}
