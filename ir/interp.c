/* ir/interp.c -- the reference interpreter, one plain implementation per op
 * (ORDER-OPS).
 *
 * The comment above each op's function is its specification; the CPU and
 * CUDA kernels are tested against these functions.  Conventions used in
 * every comment:
 *   - tensors are row-major, last dimension fastest; "rows" of x are its
 *     numel(x) / D vectors along the last dimension D;
 *   - "broadcasting" is numpy's: shapes are right-aligned and a dimension of
 *     1 stretches to the other operand's;
 *   - an i32 index outside its range is an error, never clamped or wrapped.
 * Arithmetic is in double; there is no reordering for speed. */
#include "ir/interp.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- storage ---------------------------------------------------------------- */

static void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size);
  if (!p) {
    fprintf(stderr, "parc: out of memory (interpreter, %zu x %zu bytes)\n", n, size);
    exit(3);
  }
  return p;
}

IrInterp *ir_interp_new(const IrModule *m) {
  IrInterp *it = xcalloc(1, sizeof *it);
  it->m = m;
  it->nnodes = m->nnodes;
  it->f = xcalloc((size_t)m->nnodes, sizeof *it->f);
  it->i = xcalloc((size_t)m->nnodes, sizeof *it->i);
  for (int k = 0; k < m->nnodes; k++) {
    const IrNode *n = m->nodes[k];
    size_t numel = (size_t)ir_buf_numel(n); /* sdpa: lse after out */
    if (n->dtype == IR_I32) it->i[k] = xcalloc(numel, sizeof(int32_t));
    else it->f[k] = xcalloc(numel, sizeof(double));
  }
  return it;
}

void ir_interp_free(IrInterp *it) {
  if (!it) return;
  for (int k = 0; k < it->nnodes; k++) {
    free(it->f[k]);
    free(it->i[k]);
  }
  free(it->f);
  free(it->i);
  free(it);
}

/* ---- helpers ---------------------------------------------------------------- */

typedef struct {
  IrInterp *it;
  const IrNode *n;
  char *why;
  size_t len;
} Ctx;

static int fail(Ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int fail(Ctx *c, const char *fmt, ...) {
  size_t k = (size_t)snprintf(c->why, c->len, "node %%%d (%s): ", c->n->id,
                              ir_op_info[c->n->op].name);
  if (k < c->len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why + k, c->len - k, fmt, ap);
    va_end(ap);
  }
  return -1;
}

#define OUT(c) ((c)->it->f[(c)->n->id])
#define IN(c, k) ((c)->it->f[(c)->n->inputs[k]->id])
#define IDX(c, k) ((c)->it->i[(c)->n->inputs[k]->id])
#define ARG(c, k) ((c)->n->inputs[k])

static int64_t last_dim(const IrNode *x) { return x->rank ? x->shape[x->rank - 1] : 1; }

/* Flat index into x of the element that broadcasting x to out's shape puts
 * at flat index o of out (x's dimensions right-aligned with out's; x's
 * dimensions of size 1 repeat). */
static int64_t bcast_offset(const IrNode *x, const IrNode *out, int64_t o) {
  int64_t off = 0, stride = 1;
  for (int d = out->rank - 1, dx = x->rank - 1; d >= 0; d--, dx--) {
    int64_t i = o % out->shape[d];
    o /= out->shape[d];
    if (dx < 0) continue;
    if (x->shape[dx] != 1) off += i * stride;
    stride *= x->shape[dx];
  }
  return off;
}

/* Checks that every index in idx[0..count) lies in [0, limit). */
static int check_ids(Ctx *c, const int32_t *idx, int64_t count, int64_t limit, const char *what) {
  for (int64_t p = 0; p < count; p++)
    if (idx[p] < 0 || idx[p] >= limit)
      return fail(c, "%s %d at position %lld is outside [0, %lld)", what, idx[p], (long long)p,
                  (long long)limit);
  return 0;
}

/* ---- dense algebra ---------------------------------------------------------- */

/* matmul(a, b) [transpose_b] and matmul_ta(a, b) [transpose_b]:
 *   A = a[..., m, k] (matmul_ta: a[..., k, m] read transposed),
 *   B = b[..., k, n] (transpose_b: b[..., n, k] read transposed),
 *   out[..., i, j] = sum_p A[..., i, p] * B[..., p, j].
 * A rank-2 b is shared by every batch index of a (numpy broadcasting); a
 * batched b has a's rank and a's batch dimensions. */
static int eval_matmul(Ctx *c, int ta) {
  const IrNode *a = ARG(c, 0), *b = ARG(c, 1);
  int tb = c->n->ia[0] != 0;
  int64_t m = c->n->shape[c->n->rank - 2], n = c->n->shape[c->n->rank - 1];
  int64_t k = a->shape[a->rank - (ta ? 2 : 1)];
  int64_t batch = ir_numel(a) / (m * k);
  int b_batched = b->rank > 2;
  const double *A = IN(c, 0), *B = IN(c, 1);
  double *out = OUT(c);
  for (int64_t bi = 0; bi < batch; bi++) {
    const double *ab = A + bi * m * k, *bb = B + (b_batched ? bi * k * n : 0);
    double *ob = out + bi * m * n;
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        double s = 0;
        for (int64_t p = 0; p < k; p++) {
          double x = ta ? ab[p * m + i] : ab[i * k + p];
          double y = tb ? bb[j * k + p] : bb[p * n + j];
          s += x * y;
        }
        ob[i * n + j] = s;
      }
  }
  return 0;
}

/* ---- elementwise ------------------------------------------------------------ */

/* add, sub, mul, div: out = a OP b with broadcasting; division by zero
 * follows IEEE (inf, nan). */
static int eval_binary(Ctx *c) {
  const double *A = IN(c, 0), *B = IN(c, 1);
  double *out = OUT(c);
  for (int64_t o = 0; o < ir_numel(c->n); o++) {
    double x = A[bcast_offset(ARG(c, 0), c->n, o)], y = B[bcast_offset(ARG(c, 1), c->n, o)];
    switch (c->n->op) {
    case IR_OP_ADD: out[o] = x + y; break;
    case IR_OP_SUB: out[o] = x - y; break;
    case IR_OP_MUL: out[o] = x * y; break;
    default: out[o] = x / y; break;
    }
  }
  return 0;
}

#define INTERP_PI 3.14159265358979323846

static double gelu(double x) {
  const double k = sqrt(2.0 / INTERP_PI);
  return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
}

/* d gelu / dx for the tanh form above. */
static double gelu_deriv(double x) {
  const double k = sqrt(2.0 / INTERP_PI);
  double t = tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* scale: x * by.  gelu: the tanh approximation
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).  silu: x * sigmoid(x).
 * relu: max(x, 0).  exp: e^x.  log: the natural logarithm, as C's log (-inf
 * at 0, NaN below). */
static int eval_unary(Ctx *c) {
  const double *x = IN(c, 0);
  double *out = OUT(c);
  for (int64_t o = 0; o < ir_numel(c->n); o++) {
    switch (c->n->op) {
    case IR_OP_SCALE: out[o] = x[o] * c->n->fa; break;
    case IR_OP_GELU: out[o] = gelu(x[o]); break;
    case IR_OP_SILU: out[o] = x[o] * sigmoid(x[o]); break;
    case IR_OP_RELU: out[o] = x[o] > 0 ? x[o] : 0; break;
    case IR_OP_LOG: out[o] = log(x[o]); break;
    default: out[o] = exp(x[o]); break;
    }
  }
  return 0;
}

/* gelu_grad(x, dy) = dy * gelu'(x); silu_grad(x, dy) = dy * s (1 + x (1 - s))
 * with s = sigmoid(x); relu_grad(x, dy) = dy where x > 0, else 0. */
static int eval_act_grad(Ctx *c) {
  const double *x = IN(c, 0), *dy = IN(c, 1);
  double *out = OUT(c);
  for (int64_t o = 0; o < ir_numel(c->n); o++) {
    double d;
    if (c->n->op == IR_OP_GELU_GRAD) d = gelu_deriv(x[o]);
    else if (c->n->op == IR_OP_SILU_GRAD) d = sigmoid(x[o]) * (1 + x[o] * (1 - sigmoid(x[o])));
    else d = x[o] > 0 ? 1 : 0;
    out[o] = dy[o] * d;
  }
  return 0;
}

/* ---- normalisation ---------------------------------------------------------- */

/* Mean and 1/sqrt(var + eps) of one row: LayerNorm uses the biased variance
 * mean((x - mu)^2); RMSNorm uses mu = 0 and mean(x^2). */
static void row_stats(const double *x, int64_t d, int rms, double eps, double *mu, double *rstd) {
  double m = 0, v = 0;
  if (!rms) {
    for (int64_t j = 0; j < d; j++) m += x[j];
    m /= (double)d;
  }
  for (int64_t j = 0; j < d; j++) v += (x[j] - m) * (x[j] - m);
  *mu = m;
  *rstd = 1.0 / sqrt(v / (double)d + eps);
}

/* layer_norm(x, w, b): per row, (x - mean) / sqrt(var + eps) * w + b with the
 * biased variance.  rms_norm(x, w): per row, x / sqrt(mean(x^2) + eps) * w. */
static int eval_norm(Ctx *c) {
  int rms = c->n->op == IR_OP_RMSNORM;
  int64_t d = last_dim(c->n), rows = ir_numel(c->n) / d;
  const double *x = IN(c, 0), *w = IN(c, 1), *b = rms ? NULL : IN(c, 2);
  double *out = OUT(c);
  for (int64_t r = 0; r < rows; r++) {
    double mu, rstd;
    row_stats(x + r * d, d, rms, c->n->fa, &mu, &rstd);
    for (int64_t j = 0; j < d; j++)
      out[r * d + j] = (x[r * d + j] - mu) * rstd * w[j] + (b ? b[j] : 0);
  }
  return 0;
}

/* layer_norm_grad(x, w, dy) and rms_norm_grad(x, w, dy): the gradient with
 * respect to x of the norm above.  Per row, with xhat = (x - mu) * rstd
 * (rms: mu = 0) and g = dy * w:
 *   layer_norm: dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
 *   rms_norm:   dx = rstd * (g - xhat * mean(g * xhat)) */
static int eval_norm_grad(Ctx *c) {
  int rms = c->n->op == IR_OP_RMSNORM_GRAD;
  int64_t d = last_dim(c->n), rows = ir_numel(c->n) / d;
  const double *x = IN(c, 0), *w = IN(c, 1), *dy = IN(c, 2);
  double *out = OUT(c);
  for (int64_t r = 0; r < rows; r++) {
    const double *xr = x + r * d, *gr = dy + r * d;
    double mu, rstd, mg = 0, mgx = 0;
    row_stats(xr, d, rms, c->n->fa, &mu, &rstd);
    for (int64_t j = 0; j < d; j++) {
      mg += gr[j] * w[j];
      mgx += gr[j] * w[j] * (xr[j] - mu) * rstd;
    }
    mg /= (double)d;
    mgx /= (double)d;
    for (int64_t j = 0; j < d; j++) {
      double xhat = (xr[j] - mu) * rstd;
      out[r * d + j] = rstd * (gr[j] * w[j] - (rms ? 0 : mg) - xhat * mgx);
    }
  }
  return 0;
}

/* layer_norm_wgrad(x, dy) and rms_norm_wgrad(x, dy) -> [D]: the gradient
 * with respect to the gain, dw[j] = sum over rows of dy[r, j] * xhat[r, j]
 * (xhat as in the norm's gradient). */
static int eval_norm_wgrad(Ctx *c) {
  int rms = c->n->op == IR_OP_RMSNORM_WGRAD;
  const IrNode *xn = ARG(c, 0);
  int64_t d = last_dim(xn), rows = ir_numel(xn) / d;
  const double *x = IN(c, 0), *dy = IN(c, 1);
  double *out = OUT(c);
  memset(out, 0, sizeof(double) * (size_t)d);
  for (int64_t r = 0; r < rows; r++) {
    double mu, rstd;
    row_stats(x + r * d, d, rms, c->n->fa, &mu, &rstd);
    for (int64_t j = 0; j < d; j++) out[j] += dy[r * d + j] * (x[r * d + j] - mu) * rstd;
  }
  return 0;
}

/* softmax(x): per row, exp(x - max) / sum(exp(x - max)). */
static int eval_softmax(Ctx *c) {
  int64_t d = last_dim(c->n), rows = ir_numel(c->n) / d;
  const double *x = IN(c, 0);
  double *out = OUT(c);
  for (int64_t r = 0; r < rows; r++) {
    double mx = -INFINITY, s = 0;
    for (int64_t j = 0; j < d; j++) mx = fmax(mx, x[r * d + j]);
    for (int64_t j = 0; j < d; j++) s += out[r * d + j] = exp(x[r * d + j] - mx);
    for (int64_t j = 0; j < d; j++) out[r * d + j] /= s;
  }
  return 0;
}

/* softmax_grad(y, dy) with y = softmax(x): per row,
 * dx = y * (dy - sum(dy * y)). */
static int eval_softmax_grad(Ctx *c) {
  int64_t d = last_dim(c->n), rows = ir_numel(c->n) / d;
  const double *y = IN(c, 0), *dy = IN(c, 1);
  double *out = OUT(c);
  for (int64_t r = 0; r < rows; r++) {
    double s = 0;
    for (int64_t j = 0; j < d; j++) s += dy[r * d + j] * y[r * d + j];
    for (int64_t j = 0; j < d; j++) out[r * d + j] = y[r * d + j] * (dy[r * d + j] - s);
  }
  return 0;
}

/* ---- attention -------------------------------------------------------------- */

/* Offset of row t of channel ch (a head, or a dq|dk|dv channel) in batch b
 * of a tensor of C channels: head-major [B, C, T, hd], or with tokens
 * (IR_SDPA_*_TOKENS) token-major [B, T, C hd]. */
static int64_t attn_row(int tokens, int64_t b, int64_t ch, int64_t C, int64_t t, int64_t T,
                        int64_t hd) {
  return (tokens ? (b * T + t) * C + ch : (b * C + ch) * T + t) * hd;
}

/* Operand j (0 q, 1 k, 2 v) of sdpa / sdpa_grad n: the offset of row t of
 * its head h (a kv head for k, v) in batch b, and (attn_in_ld) the stride
 * between its rows: head-major [B, H or KV, T, hd], or the packed
 * [B, T, H + 2 KV, hd] of IR_SDPA_QKV_TOKENS (k's heads after q's, v's
 * after k's). */
static int64_t attn_in_row(const IrNode *n, int j, int64_t b, int64_t h, int64_t t) {
  const IrSdpaDims d = ir_sdpa_dims(n);
  if (n->ia[1] & IR_SDPA_QKV_TOKENS)
    return attn_row(1, b, (j ? d.H + (j - 1) * d.KV : 0) + h, d.H + 2 * d.KV, t, d.T, d.hd);
  return attn_row(0, b, h, j ? d.KV : d.H, t, d.T, d.hd);
}
static int64_t attn_in_ld(const IrNode *n) {
  const IrSdpaDims d = ir_sdpa_dims(n);
  return n->ia[1] & IR_SDPA_QKV_TOKENS ? (d.H + 2 * d.KV) * d.hd : d.hd;
}

/* The scores of query row t for (b, h) into s[0..T): s[u] = scale *
 * q[b,h,t,:] . k[b,h/(H/KV),u,:], u > t masked out (-inf) when causal. */
static void attn_scores(Ctx *c, int64_t b, int64_t h, int64_t t, double *s) {
  const IrSdpaDims d = ir_sdpa_dims(c->n);
  int64_t T = d.T, hd = d.hd, ld = attn_in_ld(c->n);
  const double *q = IN(c, 0) + attn_in_row(c->n, 0, b, h, t);
  const double *k = IN(c, 1) + attn_in_row(c->n, 1, b, h / (d.H / d.KV), 0);
  int64_t end = c->n->ia[0] ? t + 1 : T;
  for (int64_t u = 0; u < T; u++) {
    double dot = 0;
    for (int64_t i = 0; u < end && i < hd; i++) dot += q[i] * k[u * ld + i];
    s[u] = u < end ? dot * c->n->fa : -INFINITY;
  }
}

/* Attention probabilities of query row t for (batch b, head h) into p[0..T):
 * p = softmax(s) over the unmasked u of attn_scores, 0 at the masked ones.
 * Returns the row's lse, log sum_u exp(s[u]) over the unmasked u. */
static double attn_probs(Ctx *c, int64_t b, int64_t h, int64_t t, double *p) {
  int64_t T = ir_sdpa_dims(c->n).T, end = c->n->ia[0] ? t + 1 : T;
  double mx = -INFINITY, s = 0;
  attn_scores(c, b, h, t, p);
  for (int64_t u = 0; u < end; u++) mx = fmax(mx, p[u]);
  for (int64_t u = 0; u < end; u++) s += p[u] = exp(p[u] - mx);
  for (int64_t u = 0; u < end; u++) p[u] /= s;
  for (int64_t u = end; u < T; u++) p[u] = 0;
  return mx + log(s);
}

/* sdpa(q[B,H,T,hd], k[B,KV,T,hd], v[B,KV,T,hd]) causal scale:
 * out[b,h,t,:] = sum_u p[u] * v[b,h/(H/KV),u,:] with p from attn_probs
 * (grouped-query attention: query head h reads kv head h / (H/KV)); the
 * buffer's aux part (ir_aux_numel) holds lse[b,h,t] from attn_probs. */
static int eval_attention(Ctx *c) {
  const IrSdpaDims d = ir_sdpa_dims(c->n);
  int64_t B = d.B, H = d.H, KV = d.KV, T = d.T, hd = d.hd, ld = attn_in_ld(c->n);
  double *p = xcalloc((size_t)T, sizeof *p);
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t t = 0; t < T; t++) {
        OUT(c)[B * H * T * hd + (b * H + h) * T + t] = attn_probs(c, b, h, t, p);
        const double *v = IN(c, 2) + attn_in_row(c->n, 2, b, h / (H / KV), 0);
        double *o = OUT(c) + attn_row(c->n->ia[1] & IR_SDPA_OUT_TOKENS, b, h, H, t, T, hd);
        for (int64_t i = 0; i < hd; i++) {
          double s = 0;
          for (int64_t u = 0; u < T; u++) s += p[u] * v[u * ld + i];
          o[i] = s;
        }
      }
  free(p);
  return 0;
}

/* sdpa_lse(y) -> [B, H, T]: lse[b,h,t] of sdpa y (its buffer's aux part). */
static int eval_attention_lse(Ctx *c) {
  memcpy(OUT(c), IN(c, 0) + ir_numel(ARG(c, 0)), sizeof(double) * (size_t)ir_numel(c->n));
  return 0;
}

/* sdpa_delta(m[B, T, H*hd], dm[B, T, H*hd]) heads=H -> [B, H, T]:
 *   D[b,h,t] = sum_i m[b,t,h*hd + i] dm[b,t,h*hd + i], i ascending.
 * With m = merge_heads(out) and dm such that split_heads(dm) is sdpa's dy,
 * this is sdpa_grad's D = dy[b,h,t,:] . out[b,h,t,:], term for term. */
static int eval_attention_delta(Ctx *c) {
  int64_t B = c->n->shape[0], H = c->n->shape[1], T = c->n->shape[2];
  int64_t hd = ARG(c, 0)->shape[2] / H;
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t t = 0; t < T; t++) {
        const double *m = IN(c, 0) + ((b * T + t) * H + h) * hd;
        const double *dm = IN(c, 1) + ((b * T + t) * H + h) * hd;
        double s = 0;
        for (int64_t i = 0; i < hd; i++) s += m[i] * dm[i];
        OUT(c)[(b * H + h) * T + t] = s;
      }
  return 0;
}

/* sdpa_grad(q, k, v, dy, y) causal scale -> [B, H + 2 KV, T, hd]: the
 * gradients of sdpa packed along dimension 1: channels [0, H) hold dq,
 * [H, H + KV) dk, [H + KV, H + 2 KV) dv.  y = sdpa(q, k, v) gives out and lse
 * (its buffer's aux part): p[u] = exp(s[u] - lse[b,h,t]) is sdpa's p, and
 * D = dy[b,h,t,:] . out[b,h,t,:] equals sum_w p[w] dp[w].  The six-operand
 * form sdpa_grad(q, k, v, dy, lse, d) takes lse and D from lse[b,h,t] and
 * d[b,h,t] (sdpa_lse, sdpa_delta) instead of y.  Then
 *   dp[u] = dy[b,h,t,:] . v[b,g,u,:],  ds[u] = p[u] (dp[u] - D),
 *   dq[b,h,t,:]  = scale * sum_u ds[u] k[b,g,u,:],
 *   dk[b,g,u,:] += scale * ds[u] q[b,h,t,:],   dv[b,g,u,:] += p[u] dy[b,h,t,:]
 * summed over every query head h of group g = h / (H/KV) and every t.
 * Layout bits (ia[1], IR_SDPA_*): dy token-major [B, T, H hd], and the result
 * token-major [B, T, (H + 2 KV) hd]; sdpa's IR_SDPA_OUT_TOKENS writes out as
 * [B, T, H hd]; IR_SDPA_QKV_TOKENS reads q, k, v from one packed tensor
 * (attn_in_row).  The values and their order of summation do not change. */
static int eval_attention_grad(Ctx *c) {
  const IrSdpaDims sd = ir_sdpa_dims(c->n);
  int64_t B = sd.B, H = sd.H, KV = sd.KV, T = sd.T, hd = sd.hd, C = H + 2 * KV;
  int64_t ldi = attn_in_ld(c->n); /* q's, k's, v's row stride */
  int ot = (c->n->ia[1] & IR_SDPA_OUT_TOKENS) != 0, dyt = (c->n->ia[1] & IR_SDPA_DY_TOKENS) != 0;
  int64_t ld = ot ? C * hd : hd; /* the result's row stride */
  double *p = xcalloc((size_t)T, sizeof *p), *ds = xcalloc((size_t)T, sizeof *ds);
  double *out = OUT(c);
  memset(out, 0, sizeof(double) * (size_t)ir_numel(c->n));
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t t = 0; t < T; t++) {
        int64_t g = h / (H / KV);
        const double *q = IN(c, 0) + attn_in_row(c->n, 0, b, h, t);
        const double *k = IN(c, 1) + attn_in_row(c->n, 1, b, g, 0);
        const double *v = IN(c, 2) + attn_in_row(c->n, 2, b, g, 0);
        const double *dy = IN(c, 3) + attn_row(dyt, b, h, H, t, T, hd);
        double *dq = out + attn_row(ot, b, h, C, t, T, hd);
        double *dk = out + attn_row(ot, b, H + g, C, 0, T, hd);  /* row u: + u ld */
        double *dv = out + attn_row(ot, b, H + KV + g, C, 0, T, hd);
        double lse, sum = 0;
        if (c->n->ninputs == 6) {
          lse = IN(c, 4)[(b * H + h) * T + t];
          sum = IN(c, 5)[(b * H + h) * T + t];
        } else {
          const double *o = IN(c, 4) + ((b * H + h) * T + t) * hd;
          lse = IN(c, 4)[B * H * T * hd + (b * H + h) * T + t];
          for (int64_t i = 0; i < hd; i++) sum += dy[i] * o[i];
        }
        attn_scores(c, b, h, t, p);
        for (int64_t u = 0; u < T; u++) p[u] = exp(p[u] - lse); /* masked: exp(-inf) = 0 */
        for (int64_t u = 0; u < T; u++) {
          double dp = 0;
          for (int64_t i = 0; i < hd; i++) dp += dy[i] * v[u * ldi + i];
          ds[u] = dp;
        }
        for (int64_t u = 0; u < T; u++) {
          ds[u] = p[u] * (ds[u] - sum);
          for (int64_t i = 0; i < hd; i++) {
            dq[i] += c->n->fa * ds[u] * k[u * ldi + i];
            dk[u * ld + i] += c->n->fa * ds[u] * q[i];
            dv[u * ld + i] += p[u] * dy[i];
          }
        }
      }
  free(p);
  free(ds);
  return 0;
}

/* rope(x[B,H,T,hd]) theta, Hugging Face's rotate_half convention: for
 * position t (the index along dimension 2) and i in [0, hd/2), with
 * a = t * theta^(-2i/hd), x1 = x[..., i] and x2 = x[..., i + hd/2]:
 *   out[..., i] = x1 cos a - x2 sin a,  out[..., i + hd/2] = x2 cos a + x1 sin a.
 * rope_grad(dy) theta applies the transposed (inverse) rotation:
 *   dx1 = dy1 cos a + dy2 sin a,        dx2 = dy2 cos a - dy1 sin a. */
static int eval_rope(Ctx *c) {
  int64_t T = c->n->shape[2], hd = c->n->shape[3], half = hd / 2;
  int64_t rows = ir_numel(c->n) / hd;
  double sgn = c->n->op == IR_OP_ROPE_GRAD ? -1.0 : 1.0;
  const double *x = IN(c, 0);
  double *out = OUT(c);
  for (int64_t r = 0; r < rows; r++) {
    int64_t t = r % T;
    for (int64_t i = 0; i < half; i++) {
      double a = (double)t * pow(c->n->fa, -2.0 * (double)i / (double)hd);
      double x1 = x[r * hd + i], x2 = x[r * hd + i + half];
      out[r * hd + i] = x1 * cos(a) - sgn * x2 * sin(a);
      out[r * hd + i + half] = x2 * cos(a) + sgn * x1 * sin(a);
    }
  }
  return 0;
}

/* ---- embedding -------------------------------------------------------------- */

/* embedding(ids[...], table[V, D]) -> [..., D]: out[p, :] = table[ids[p], :]. */
static int eval_embedding(Ctx *c) {
  int64_t np = ir_numel(ARG(c, 0)), V = ARG(c, 1)->shape[0], D = ARG(c, 1)->shape[1];
  const int32_t *ids = IDX(c, 0);
  if (c->n->op == IR_OP_VOCAB_EMBEDDING) { /* rows [lo, lo + V) of a V x size table */
    int64_t lo = c->it->coord[c->n->ia[0]] * V;
    if (check_ids(c, ids, np, V * c->n->ia[1], "id")) return -1;
    for (int64_t p = 0; p < np; p++) {
      int64_t r = (int64_t)ids[p] - lo;
      if (r >= 0 && r < V)
        memcpy(OUT(c) + p * D, IN(c, 1) + r * D, sizeof(double) * (size_t)D);
      else memset(OUT(c) + p * D, 0, sizeof(double) * (size_t)D);
    }
    return 0;
  }
  if (check_ids(c, ids, np, V, "id")) return -1;
  for (int64_t p = 0; p < np; p++)
    memcpy(OUT(c) + p * D, IN(c, 1) + (int64_t)ids[p] * D, sizeof(double) * (size_t)D);
  return 0;
}

/* embedding_grad(ids[...], dy[..., D]) vocab -> [vocab, D]: a zeroed table
 * with every dy row added into the row its id names:
 * out[v, :] = sum over p with ids[p] == v of dy[p, :]. */
static int eval_embedding_grad(Ctx *c) {
  int64_t np = ir_numel(ARG(c, 0)), D = c->n->shape[1], V = c->n->shape[0], lo = 0, nv = V;
  const int32_t *ids = IDX(c, 0);
  if (c->n->op == IR_OP_VOCAB_EMBEDDING_GRAD) /* the rows [lo, lo + V) only */
    lo = c->it->coord[c->n->ia[1]] * V, nv = V * c->n->ia[2];
  if (check_ids(c, ids, np, nv, "id")) return -1;
  double *out = OUT(c);
  memset(out, 0, sizeof(double) * (size_t)ir_numel(c->n));
  for (int64_t p = 0; p < np; p++) {
    int64_t r = (int64_t)ids[p] - lo;
    if (r < 0 || r >= V) continue;
    for (int64_t j = 0; j < D; j++) out[r * D + j] += IN(c, 1)[p * D + j];
  }
  return 0;
}

/* ---- layout ----------------------------------------------------------------- */

/* reshape: the same elements in the same row-major order, new shape. */
static int eval_reshape(Ctx *c) {
  if (c->n->dtype == IR_I32)
    memcpy(c->it->i[c->n->id], IDX(c, 0), sizeof(int32_t) * (size_t)ir_numel(c->n));
  else memcpy(OUT(c), IN(c, 0), sizeof(double) * (size_t)ir_numel(c->n));
  return 0;
}

/* Copies element `from` of input 0 to element `to` of the result, either dtype. */
static void copy_elem(Ctx *c, int64_t to, int64_t from) {
  if (c->n->dtype == IR_I32) c->it->i[c->n->id][to] = IDX(c, 0)[from];
  else OUT(c)[to] = IN(c, 0)[from];
}

/* split_heads(x[B, T, H*hd]) heads=H -> [B, H, T, hd]:
 *   out[b, h, t, i] = x[b, t, h*hd + i].
 * merge_heads(x[B, H, T, hd]) -> [B, T, H*hd] is its inverse. */
static int eval_heads(Ctx *c) {
  int split = c->n->op == IR_OP_SPLIT_HEADS;
  const IrNode *h4 = split ? c->n : ARG(c, 0);  /* the [B, H, T, hd] side */
  int64_t B = h4->shape[0], H = h4->shape[1], T = h4->shape[2], hd = h4->shape[3];
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < hd; i++) {
          int64_t four = ((b * H + h) * T + t) * hd + i, three = (b * T + t) * H * hd + h * hd + i;
          if (split) copy_elem(c, four, three);
          else copy_elem(c, three, four);
        }
  return 0;
}

/* Splits flat index o of a tensor of shape s (rank r) into its indices. */
static void unflatten(int64_t o, int r, const int64_t *s, int64_t *idx) {
  for (int d = r - 1; d >= 0; d--) {
    idx[d] = o % s[d];
    o /= s[d];
  }
}

static int64_t flatten(int r, const int64_t *s, const int64_t *idx) {
  int64_t o = 0;
  for (int d = 0; d < r; d++) o = o * s[d] + idx[d];
  return o;
}

/* transpose(x) dim0 dim1: x with dimensions dim0 and dim1 swapped:
 * out[..., j (at dim0), ..., i (at dim1), ...] = x[..., i, ..., j, ...]. */
static int eval_transpose(Ctx *c) {
  int64_t idx[IR_MAX_RANK];
  const IrNode *x = ARG(c, 0);
  for (int64_t o = 0; o < ir_numel(c->n); o++) {
    unflatten(o, c->n->rank, c->n->shape, idx);
    int64_t t = idx[c->n->ia[0]];
    idx[c->n->ia[0]] = idx[c->n->ia[1]];
    idx[c->n->ia[1]] = t;
    copy_elem(c, o, flatten(x->rank, x->shape, idx));
  }
  return 0;
}

/* concat(x1, x2, ...) axis: the inputs one after another along axis; they
 * agree in every other dimension. */
static int eval_concat(Ctx *c) {
  int64_t idx[IR_MAX_RANK];
  int ax = (int)c->n->ia[0];
  for (int64_t o = 0; o < ir_numel(c->n); o++) {
    unflatten(o, c->n->rank, c->n->shape, idx);
    int k = 0;
    while (idx[ax] >= ARG(c, k)->shape[ax]) idx[ax] -= ARG(c, k++)->shape[ax];
    const IrNode *x = ARG(c, k);
    int64_t from = flatten(x->rank, x->shape, idx);
    if (c->n->dtype == IR_I32) c->it->i[c->n->id][o] = c->it->i[x->id][from];
    else OUT(c)[o] = c->it->f[x->id][from];
  }
  return 0;
}

/* slice(x) axis start len: indices [start, start + len) of x along axis. */
static int eval_slice(Ctx *c) {
  int64_t idx[IR_MAX_RANK];
  const IrNode *x = ARG(c, 0);
  for (int64_t o = 0; o < ir_numel(c->n); o++) {
    unflatten(o, c->n->rank, c->n->shape, idx);
    idx[c->n->ia[0]] += c->n->ia[1];
    copy_elem(c, o, flatten(x->rank, x->shape, idx));
  }
  return 0;
}

/* ---- reductions and broadcasting -------------------------------------------- */

/* sum(x) axis keepdim and mean(x) axis keepdim: x summed (averaged) over
 * axis; keepdim=1 keeps that dimension with size 1, else it is removed. */
static int eval_reduce(Ctx *c) {
  const IrNode *x = ARG(c, 0);
  int ax = (int)c->n->ia[0];
  int64_t inner = ir_dims_product(x, ax + 1, x->rank), n = x->shape[ax];
  int64_t outer = ir_numel(x) / (inner * n);
  for (int64_t a = 0; a < outer; a++)
    for (int64_t i = 0; i < inner; i++) {
      double s = 0;
      for (int64_t j = 0; j < n; j++) s += IN(c, 0)[(a * n + j) * inner + i];
      OUT(c)[a * inner + i] = c->n->op == IR_OP_MEAN ? s / (double)n : s;
    }
  return 0;
}

/* fill value: every element equals value (the shape is the node's own). */
static int eval_fill(Ctx *c) {
  for (int64_t o = 0; o < ir_numel(c->n); o++) OUT(c)[o] = c->n->fa;
  return 0;
}

/* broadcast(x): x broadcast to the node's shape.
 * sum_to(x): x summed down to the node's shape, the adjoint of broadcast:
 * out[q] = sum of x[o] over every o that broadcasting out to x's shape maps
 * to q. */
static int eval_broadcast(Ctx *c) {
  const IrNode *x = ARG(c, 0);
  double *out = OUT(c);
  if (c->n->op == IR_OP_BROADCAST) {
    for (int64_t o = 0; o < ir_numel(c->n); o++) out[o] = IN(c, 0)[bcast_offset(x, c->n, o)];
    return 0;
  }
  memset(out, 0, sizeof(double) * (size_t)ir_numel(c->n));
  for (int64_t o = 0; o < ir_numel(x); o++) out[bcast_offset(c->n, x, o)] += IN(c, 0)[o];
  return 0;
}

/* ---- loss ------------------------------------------------------------------- */

/* cross_entropy(logits[..., V], targets[...]) -> []: the mean over the N =
 * numel(targets) positions of logsumexp(logits[p, :]) - logits[p, targets[p]].
 * cross_entropy_grad(logits, targets, dl[]) -> [..., V]: its gradient times
 * dl, dlogits[p, v] = dl / N * (softmax(logits[p, :])[v] - (v == targets[p])). */
static int eval_cross_entropy(Ctx *c) {
  const IrNode *lg = ARG(c, 0);
  int64_t V = last_dim(lg), np = ir_numel(ARG(c, 1));
  const double *x = IN(c, 0);
  const int32_t *tg = IDX(c, 1);
  if (check_ids(c, tg, np, V, "target")) return -1;
  int grad = c->n->op == IR_OP_CROSS_ENTROPY_GRAD || c->n->op == IR_OP_VOCAB_CROSS_ENTROPY_GRAD;
  int64_t nv = V; /* columns [nv, V) are padding: masked, zero gradient */
  if (c->n->op == IR_OP_VOCAB_CROSS_ENTROPY || c->n->op == IR_OP_VOCAB_CROSS_ENTROPY_GRAD) {
    if (c->n->ia[1] != 1)
      return fail(c, "a group of %lld ranks: run the module with ir_interp_run_mesh",
                  (long long)c->n->ia[1]);
    nv = c->n->ia[2];
    if (check_ids(c, tg, np, nv, "target")) return -1;
  }
  double total = 0, scale = grad ? IN(c, 2)[0] / (double)np : 0;
  for (int64_t p = 0; p < np; p++) {
    const double *row = x + p * V;
    double mx = -INFINITY, s = 0;
    for (int64_t v = 0; v < nv; v++) mx = fmax(mx, row[v]);
    for (int64_t v = 0; v < nv; v++) s += exp(row[v] - mx);
    if (!grad) {
      total += mx + log(s) - row[tg[p]];
      continue;
    }
    for (int64_t v = 0; v < V; v++)
      OUT(c)[p * V + v] =
          v < nv ? scale * (exp(row[v] - mx) / s - (v == tg[p] ? 1.0 : 0.0)) : 0.0;
  }
  if (!grad) OUT(c)[0] = total / (double)np;
  return 0;
}

/* ---- routing ---------------------------------------------------------------- */

/* topk(x[..., n]) k -> i32[..., k]: per row, the indices of the k largest
 * values in descending value order; equal values are taken lower index
 * first. */
static int eval_topk(Ctx *c) {
  const IrNode *x = ARG(c, 0);
  int64_t n = last_dim(x), k = c->n->ia[0], rows = ir_numel(x) / n;
  unsigned char *taken = xcalloc((size_t)n, 1);
  for (int64_t r = 0; r < rows; r++) {
    const double *row = IN(c, 0) + r * n;
    memset(taken, 0, (size_t)n);
    for (int64_t j = 0; j < k; j++) {
      int64_t best = -1;
      for (int64_t i = 0; i < n; i++)
        if (!taken[i] && (best < 0 || row[i] > row[best])) best = i;
      taken[best] = 1;
      c->it->i[c->n->id][r * k + j] = (int32_t)best;
    }
  }
  free(taken);
  return 0;
}

/* gather(x[..., n], idx[..., k]) -> [..., k]: out[..., j] = x[..., idx[..., j]]
 * (along the last axis; the leading dimensions agree).
 * scatter_add(idx[..., k], dy[..., k]) n -> [..., n]: its adjoint, a zeroed
 * [..., n] with out[..., idx[..., j]] += dy[..., j]. */
static int eval_gather(Ctx *c) {
  int scatter = c->n->op == IR_OP_SCATTER_ADD;
  const IrNode *in = ARG(c, scatter ? 0 : 1);
  int64_t k = last_dim(in), rows = ir_numel(in) / k;
  int64_t n = scatter ? last_dim(c->n) : last_dim(ARG(c, 0));
  const int32_t *idx = IDX(c, scatter ? 0 : 1);
  if (check_ids(c, idx, rows * k, n, "index")) return -1;
  double *out = OUT(c);
  if (scatter) memset(out, 0, sizeof(double) * (size_t)ir_numel(c->n));
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < k; j++) {
      if (scatter) out[r * n + idx[r * k + j]] += IN(c, 1)[r * k + j];
      else out[r * k + j] = IN(c, 0)[r * n + idx[r * k + j]];
    }
  return 0;
}

/* onehot(idx[...]) n -> f32[..., n]: out[p, v] = 1 if idx[p] == v else 0. */
static int eval_onehot(Ctx *c) {
  int64_t np = ir_numel(ARG(c, 0)), n = c->n->ia[0];
  if (check_ids(c, IDX(c, 0), np, n, "index")) return -1;
  memset(OUT(c), 0, sizeof(double) * (size_t)ir_numel(c->n));
  for (int64_t p = 0; p < np; p++) OUT(c)[p * n + IDX(c, 0)[p]] = 1;
  return 0;
}

/* The slot assignment shared by dispatch, combine and their gradients:
 * choices (token n, choice j) in ascending order, n major, take the next
 * free slot of expert idx[n, j]; once an expert holds C tokens its later
 * choices are dropped.  slot[n*k + j] is the slot, or -1 when dropped. */
static int route(Ctx *c, const int32_t *idx, int64_t N, int64_t K, int64_t E, int64_t C,
                 int64_t *slot) {
  /* -1: a choice capacity_drop dropped (no slot); any other index must be an expert */
  for (int64_t p = 0; p < N * K; p++)
    if (idx[p] != -1 && check_ids(c, idx + p, 1, E, "expert")) return -1;
  int64_t *fill = xcalloc((size_t)E, sizeof *fill);
  for (int64_t p = 0; p < N * K; p++)
    slot[p] = idx[p] >= 0 && fill[idx[p]] < C ? fill[idx[p]]++ : -1;
  free(fill);
  return 0;
}

/* The routing operands and attributes of a routing node: idx [N, K] is
 * input `ix`; E and C come from the attributes (dispatch, combine_grad_y)
 * or from y [E, C, D], input `iy` (combine, combine_grad_w). */
static int64_t *routed(Ctx *c, int ix, int iy, int64_t *N, int64_t *K) {
  const IrNode *idx = ARG(c, ix);
  int64_t E = iy < 0 ? c->n->ia[0] : ARG(c, iy)->shape[0];
  int64_t C = iy < 0 ? c->n->ia[1] : ARG(c, iy)->shape[1];
  *N = idx->shape[0], *K = idx->shape[1];
  int64_t *slot = xcalloc((size_t)(*N * *K), sizeof *slot);
  if (route(c, IDX(c, ix), *N, *K, E, C, slot) == 0) return slot;
  free(slot);
  return NULL;
}

/* dispatch(x[N, D], idx[N, K]) experts=E capacity=C -> [E, C, D]: token n's
 * j-th choice puts x[n, :] into out[idx[n, j], slot(n, j), :] (see route);
 * empty slots are zero. */
static int eval_dispatch(Ctx *c) {
  int64_t N, K, D = ARG(c, 0)->shape[1], C = c->n->shape[1];
  int64_t *slot = routed(c, 1, -1, &N, &K);
  if (!slot) return -1;
  memset(OUT(c), 0, sizeof(double) * (size_t)ir_numel(c->n));
  for (int64_t p = 0; p < N * K; p++)
    if (slot[p] >= 0)
      memcpy(OUT(c) + ((int64_t)IDX(c, 1)[p] * C + slot[p]) * D, IN(c, 0) + (p / K) * D,
             sizeof(double) * (size_t)D);
  free(slot);
  return 0;
}

/* combine(y[E, C, D], idx[N, K], w[N, K]) -> [N, D]:
 * out[n, :] = sum over choices j not dropped of w[n, j] * y[idx[n, j], slot(n, j), :]
 * (slots recomputed exactly as dispatch assigns them, with E and C from y). */
static int eval_combine(Ctx *c) {
  int64_t N, K, C = ARG(c, 0)->shape[1], D = ARG(c, 0)->shape[2];
  int64_t *slot = routed(c, 1, 0, &N, &K);
  if (!slot) return -1;
  memset(OUT(c), 0, sizeof(double) * (size_t)ir_numel(c->n));
  for (int64_t p = 0; p < N * K; p++)
    if (slot[p] >= 0)
      for (int64_t d = 0; d < D; d++)
        OUT(c)[(p / K) * D + d] +=
            IN(c, 2)[p] * IN(c, 0)[((int64_t)IDX(c, 1)[p] * C + slot[p]) * D + d];
  free(slot);
  return 0;
}

/* combine_grad_y(dout[N, D], idx[N, K], w[N, K]) experts capacity -> [E, C, D]:
 * the gradient of combine with respect to y: the slot of choice (n, j)
 * holds w[n, j] * dout[n, :]; empty slots are zero. */
static int eval_combine_grad_y(Ctx *c) {
  int64_t N, K, C = c->n->shape[1], D = c->n->shape[2];
  int64_t *slot = routed(c, 1, -1, &N, &K);
  if (!slot) return -1;
  memset(OUT(c), 0, sizeof(double) * (size_t)ir_numel(c->n));
  for (int64_t p = 0; p < N * K; p++)
    if (slot[p] >= 0)
      for (int64_t d = 0; d < D; d++)
        OUT(c)[((int64_t)IDX(c, 1)[p] * C + slot[p]) * D + d] =
            IN(c, 2)[p] * IN(c, 0)[(p / K) * D + d];
  free(slot);
  return 0;
}

/* combine_grad_w(dout[N, D], y[E, C, D], idx[N, K]) -> [N, K]: the gradient
 * of combine with respect to w: dout[n, :] . y[idx[n, j], slot(n, j), :],
 * 0 for dropped choices. */
static int eval_combine_grad_w(Ctx *c) {
  int64_t N, K, C = ARG(c, 1)->shape[1], D = ARG(c, 1)->shape[2];
  int64_t *slot = routed(c, 2, 1, &N, &K);
  if (!slot) return -1;
  for (int64_t p = 0; p < N * K; p++) {
    double s = 0;
    for (int64_t d = 0; slot[p] >= 0 && d < D; d++)
      s += IN(c, 0)[(p / K) * D + d] * IN(c, 1)[((int64_t)IDX(c, 2)[p] * C + slot[p]) * D + d];
    OUT(c)[p] = s;
  }
  free(slot);
  return 0;
}

/* ---- optimizer --------------------------------------------------------------- */

/* PyTorch's torch.nn.utils.clip_grad_norm_ (norm_type 2) and
 * torch.optim.AdamW / torch.optim.SGD (dampening 0, no Nesterov), one op
 * per line of PyTorch's update, in PyTorch's order of operations.  Scalar
 * operands ([]) are read as s[0]; lr is the learning rate of this step
 * (already scheduled), step the 1-based step count; g the gradient, coef
 * the clipping coefficient, so g coef is the clipped gradient g'. */

/* sumsq(t) -> []: the sum over every element of t^2, in row-major order.
 * grad_norm(s1, ..., sn) -> []: sqrt(s1 + ... + sn), summed in operand
 * order: the global norm of every gradient viewed as one vector.  (PyTorch
 * takes the norm of the per-tensor norms: the same value up to rounding.) */
static int eval_norms(Ctx *c) {
  double s = 0;
  if (c->n->op == IR_OP_SUMSQ) {
    const double *x = IN(c, 0);
    for (int64_t o = 0; o < ir_numel(ARG(c, 0)); o++) s += x[o] * x[o];
    OUT(c)[0] = s;
    return 0;
  }
  for (int k = 0; k < c->n->ninputs; k++) s += IN(c, k)[0];
  OUT(c)[0] = sqrt(s);
  return 0;
}

/* clip_coef(norm) max_norm -> []: min(1, max_norm / (norm + 1e-6)); with
 * max_norm = 0 (clip = 0 in the train section) clipping is off: 1.
 * bias_correction(step) beta -> []: 1 - beta^step. */
static int eval_optim_scalar(Ctx *c) {
  double x = IN(c, 0)[0], fa = c->n->fa;
  if (c->n->op == IR_OP_BIAS_CORRECTION) {
    OUT(c)[0] = 1 - pow(fa, x);
    return 0;
  }
  double coef = fa / (x + 1e-6);
  OUT(c)[0] = fa == 0 || coef > 1 ? 1 : coef;
  return 0;
}

/* Pointwise updates, t the shape of operand 1:
 *   adam_moment(m, g, coef) beta square: m beta + (1 - beta) g' (square=0,
 *     the first moment) or m beta + (1 - beta) g' g' (square=1, the second),
 *     products left to right;
 *   weight_decay(p, lr) wd: p (1 - lr wd), the decoupled decay;
 *   adam_update(p, m, v, lr, bc1, bc2) eps: with step_size = lr / bc1 and
 *     denom = sqrt(v) / sqrt(bc2) + eps, p + ((-step_size) m) / denom
 *     (PyTorch's CPU addcdiv_: the product first, then the quotient);
 *   sgd_grad(g, coef, p) wd: g' + wd p (just g' when wd = 0);
 *   sgd_momentum(buf, d) momentum: momentum buf + d (buf starts at 0, which
 *     gives PyTorch's first-step buf = d);
 *   sgd_update(p, d, lr): p + (-lr) d. */
static int eval_optim_update(Ctx *c) {
  const IrNode *n = c->n;
  double *out = OUT(c), fa = n->fa;
  const double *a = IN(c, 0), *b = IN(c, 1);
  for (int64_t o = 0; o < ir_numel(n); o++) {
    switch (n->op) {
    case IR_OP_ADAM_MOMENT: {
      double g = b[o] * IN(c, 2)[0];
      out[o] = a[o] * fa + (n->ia[0] ? (1 - fa) * g * g : (1 - fa) * g);
      break;
    }
    case IR_OP_WEIGHT_DECAY: out[o] = a[o] * (1 - b[0] * fa); break;
    case IR_OP_ADAM_UPDATE: {
      double lr = IN(c, 3)[0], step_size = lr / IN(c, 4)[0], bc2_sqrt = sqrt(IN(c, 5)[0]);
      double denom = sqrt(IN(c, 2)[o]) / bc2_sqrt + fa;
      out[o] = a[o] + -step_size * b[o] / denom;
      break;
    }
    case IR_OP_SGD_GRAD: {
      double g = a[o] * b[0];
      out[o] = fa != 0 ? g + fa * IN(c, 2)[o] : g;
      break;
    }
    case IR_OP_SGD_MOMENTUM: out[o] = a[o] * fa + b[o]; break;
    default: out[o] = a[o] + -IN(c, 2)[0] * b[o]; break;
    }
  }
  return 0;
}

/* ---- collectives ------------------------------------------------------------ */

/* local_slice(x) axis size dim: the rank's piece, c-th of size along dim,
 * c its coordinate on the axis (set by ir_interp_run_mesh; 0 otherwise):
 * out[o, j, i] = x[o, c n + j, i] with n = out's dim. */
static int eval_local_slice(Ctx *c) {
  const IrNode *x = ARG(c, 0);
  int dim = (int)c->n->ia[2];
  int64_t inner = ir_dims_product(x, dim + 1, x->rank), outer = ir_dims_product(x, 0, dim);
  int64_t part = c->it->coord[c->n->ia[0]];
  if (part < 0 || part >= c->n->ia[1])
    return fail(c, "coordinate %lld outside a group of %lld", (long long)part,
                (long long)c->n->ia[1]);
  int64_t piece = c->n->shape[dim] * inner, full = x->shape[dim] * inner;
  for (int64_t o = 0; o < outer; o++)
    memcpy(OUT(c) + o * piece, IN(c, 0) + o * full + part * piece,
           sizeof(double) * (size_t)piece);
  return 0;
}

/* all_reduce, group_copy, all_gather, reduce_scatter (semantics in
 * ir/ops.def).  On one rank -- a group of size 1 -- each is the identity;
 * larger groups need every member's values: ir_interp_run_mesh. */
static int eval_collective_one(Ctx *c) {
  if (c->n->op == IR_OP_LOCAL_SLICE) return eval_local_slice(c);
  if (c->n->op != IR_OP_GROUP_COPY && c->n->ia[1] != 1)
    return fail(c, "a group of %lld ranks: run the module with ir_interp_run_mesh",
                (long long)c->n->ia[1]);
  memcpy(OUT(c), IN(c, 0), sizeof(double) * (size_t)ir_numel(c->n));
  return 0;
}

/* flat_shard: the member's piece of x flattened and zero-padded (ops.def);
 * its coordinate from ir_interp_run_mesh (0 on one rank, where size must
 * be 1). */
static int eval_flat_shard(Ctx *c) {
  int64_t n = ir_numel(c->n->inputs[0]), s = ir_numel(c->n);
  int64_t size = c->n->ia[1], me = c->it->coord[c->n->ia[0]];
  if (me >= size) return fail(c, "coordinate %lld outside a group of %lld", (long long)me,
                              (long long)size);
  for (int64_t e = 0; e < s; e++) OUT(c)[e] = me * s + e < n ? IN(c, 0)[me * s + e] : 0.0;
  return 0;
}

/* ---- expert routing across ranks (capacity_drop, expert_all_to_all) --------- */

/* cnt[e] += the choices of expert e in idx[0..nk) (dropped ones, -1, skipped). */
static void expert_counts(const int32_t *idx, int64_t nk, int64_t E, int64_t *cnt) {
  for (int64_t p = 0; p < nk; p++)
    if (idx[p] >= 0 && idx[p] < E) cnt[idx[p]]++;
}

/* capacity_drop on member `me` of a dp group whose members' interpreters are
 * mem[0..size): the earlier members' choices count first (ops.def). */
static int drop_member(IrInterp *const *mem, int size, int me, const IrNode *n, char *why,
                       size_t len) {
  const IrNode *x = n->inputs[0];
  int64_t nk = ir_numel(x), E = n->ia[0], C = n->ia[1];
  int64_t *fill = xcalloc((size_t)E, sizeof *fill);
  for (int k = 0; k < size; k++) {
    const int32_t *idx = mem[k]->i[x->id];
    for (int64_t p = 0; p < nk; p++)
      if (idx[p] < 0 || idx[p] >= E) {
        snprintf(why, len, "node %%%d (capacity_drop): expert %d at %lld outside [0, %lld)",
                 n->id, idx[p], (long long)p, (long long)E);
        free(fill);
        return -1;
      }
    if (k < me) expert_counts(idx, nk, E, fill);
  }
  const int32_t *idx = mem[me]->i[x->id];
  int32_t *out = mem[me]->i[n->id];
  for (int64_t p = 0; p < nk; p++) out[p] = fill[idx[p]]++ < C ? idx[p] : -1;
  free(fill);
  return 0;
}

/* expert_all_to_all on member `me` of an ep group mem[0..size) (ops.def). */
static void a2a_member(IrInterp *const *mem, int size, int me, const IrNode *n) {
  const IrNode *x = n->inputs[0], *ix = n->inputs[1];
  int back = n->ia[2] != 0;
  int64_t E = back ? n->shape[0] : x->shape[0], C = back ? n->shape[1] : x->shape[1];
  int64_t El = E / size, inner = ir_numel(x) / (x->shape[0] * x->shape[1]);
  int64_t nk = ir_numel(ix);
  int64_t *cnt = xcalloc((size_t)(size * E), sizeof *cnt); /* cnt[i E + e] */
  for (int i = 0; i < size; i++) expert_counts(mem[i]->i[ix->id], nk, E, cnt + i * E);
  double *out = mem[me]->f[n->id];
  memset(out, 0, sizeof(double) * (size_t)ir_numel(n));
  size_t row = sizeof(double) * (size_t)inner;
  if (!back) {
    for (int64_t l = 0; l < El; l++)
      for (int i = 0; i < size; i++) {
        int64_t e = me * El + l;
        for (int64_t c = 0; c < cnt[i * E + e] && c < C; c++)
          memcpy(out + (l * size * C + i * C + c) * inner,
                 mem[i]->f[x->id] + (e * C + c) * inner, row);
      }
  } else {
    for (int64_t e = 0; e < E; e++) {
      int o = (int)(e / El);
      int64_t l = e % El;
      for (int64_t c = 0; c < cnt[me * E + e] && c < C; c++)
        memcpy(out + (e * C + c) * inner, mem[o]->f[x->id] + (l * size * C + me * C + c) * inner,
               row);
    }
  }
  free(cnt);
}

/* On one rank (a group of size 1). */
static int eval_expert_route(Ctx *c) {
  int64_t size = c->n->op == IR_OP_CAPACITY_DROP ? c->n->ia[2] : c->n->ia[1];
  if (size != 1)
    return fail(c, "a group of %lld ranks: run the module with ir_interp_run_mesh",
                (long long)size);
  IrInterp *self = c->it;
  if (c->n->op == IR_OP_CAPACITY_DROP) return drop_member(&self, 1, 0, c->n, c->why, c->len);
  a2a_member(&self, 1, 0, c->n);
  return 0;
}

/* ---- driver ----------------------------------------------------------------- */

static int eval_node(Ctx *c) {
  switch (c->n->op) {
  case IR_OP_INPUT: case IR_OP_PARAM: case IR_OP_STATE: return 0;
  case IR_OP_MATMUL: return eval_matmul(c, 0);
  case IR_OP_ADD: case IR_OP_SUB: case IR_OP_MUL: case IR_OP_DIV: return eval_binary(c);
  case IR_OP_SCALE: case IR_OP_GELU: case IR_OP_SILU: case IR_OP_RELU: case IR_OP_EXP:
  case IR_OP_LOG:
    return eval_unary(c);
  case IR_OP_LAYERNORM: case IR_OP_RMSNORM: return eval_norm(c);
  case IR_OP_SOFTMAX: return eval_softmax(c);
  case IR_OP_ATTENTION: return eval_attention(c);
  case IR_OP_ROPE: return eval_rope(c);
  case IR_OP_EMBEDDING: case IR_OP_VOCAB_EMBEDDING: return eval_embedding(c);
  case IR_OP_RESHAPE: return eval_reshape(c);
  case IR_OP_SPLIT_HEADS: case IR_OP_MERGE_HEADS: return eval_heads(c);
  case IR_OP_TRANSPOSE: return eval_transpose(c);
  case IR_OP_CONCAT: return eval_concat(c);
  case IR_OP_SLICE: return eval_slice(c);
  case IR_OP_SUM: case IR_OP_MEAN: return eval_reduce(c);
  case IR_OP_CROSS_ENTROPY: case IR_OP_VOCAB_CROSS_ENTROPY: return eval_cross_entropy(c);
  case IR_OP_TOPK: return eval_topk(c);
  case IR_OP_GATHER: return eval_gather(c);
  case IR_OP_ONEHOT: return eval_onehot(c);
  case IR_OP_DISPATCH: return eval_dispatch(c);
  case IR_OP_COMBINE: return eval_combine(c);
  case IR_OP_CAPACITY_DROP: case IR_OP_EXPERT_ALL_TO_ALL: return eval_expert_route(c);
  case IR_OP_FILL: return eval_fill(c);
  case IR_OP_BROADCAST: case IR_OP_SUM_TO: return eval_broadcast(c);
  case IR_OP_ALL_REDUCE: case IR_OP_GROUP_COPY: case IR_OP_ALL_GATHER:
  case IR_OP_REDUCE_SCATTER: case IR_OP_LOCAL_SLICE: case IR_OP_REPLICATE:
    return eval_collective_one(c);
  case IR_OP_FLAT_SHARD: return eval_flat_shard(c);
  case IR_OP_MATMUL_TA: return eval_matmul(c, 1);
  case IR_OP_GELU_GRAD: case IR_OP_SILU_GRAD: case IR_OP_RELU_GRAD: return eval_act_grad(c);
  case IR_OP_LAYERNORM_GRAD: case IR_OP_RMSNORM_GRAD: return eval_norm_grad(c);
  case IR_OP_LAYERNORM_WGRAD: case IR_OP_RMSNORM_WGRAD: return eval_norm_wgrad(c);
  case IR_OP_SOFTMAX_GRAD: return eval_softmax_grad(c);
  case IR_OP_ATTENTION_GRAD: return eval_attention_grad(c);
  case IR_OP_ATTENTION_LSE: return eval_attention_lse(c);
  case IR_OP_ATTENTION_DELTA: return eval_attention_delta(c);
  case IR_OP_ROPE_GRAD: return eval_rope(c);
  case IR_OP_EMBEDDING_GRAD: case IR_OP_VOCAB_EMBEDDING_GRAD: return eval_embedding_grad(c);
  case IR_OP_CROSS_ENTROPY_GRAD: case IR_OP_VOCAB_CROSS_ENTROPY_GRAD:
    return eval_cross_entropy(c);
  case IR_OP_SCATTER_ADD: return eval_gather(c);
  case IR_OP_COMBINE_GRAD_Y: return eval_combine_grad_y(c);
  case IR_OP_COMBINE_GRAD_W: return eval_combine_grad_w(c);
  case IR_OP_SUMSQ: case IR_OP_GRAD_NORM: return eval_norms(c);
  case IR_OP_CLIP_COEF: case IR_OP_BIAS_CORRECTION: return eval_optim_scalar(c);
  case IR_OP_ADAM_MOMENT: case IR_OP_WEIGHT_DECAY: case IR_OP_ADAM_UPDATE:
  case IR_OP_SGD_GRAD: case IR_OP_SGD_MOMENTUM: case IR_OP_SGD_UPDATE:
    return eval_optim_update(c);
  case IR_OP_COUNT: break;
  }
  return fail(c, "no interpreter rule");
}

int ir_interp_run(IrInterp *it, int first, int end, char *why, size_t len) {
  if (first < 0) first = 0;
  if (end > it->nnodes) end = it->nnodes;
  for (int k = first; k < end; k++) {
    Ctx c = {it, it->m->nodes[k], why, len};
    if (eval_node(&c)) return -1;
  }
  return 0;
}

/* Every update reads the values of this step: copies first, then stores
 * (a value may itself be a leaf that another update replaces). */
void ir_interp_end_step(IrInterp *it) {
  const IrModule *m = it->m;
  void **tmp = xcalloc((size_t)m->nupdates, sizeof *tmp);
  for (int k = 0; k < m->nupdates; k++) {
    const IrNode *v = m->updates[k].value;
    size_t bytes = (size_t)ir_numel(v) * (v->dtype == IR_I32 ? sizeof(int32_t) : sizeof(double));
    tmp[k] = xcalloc(1, bytes);
    memcpy(tmp[k], v->dtype == IR_I32 ? (void *)it->i[v->id] : (void *)it->f[v->id], bytes);
  }
  for (int k = 0; k < m->nupdates; k++) {
    const IrNode *leaf = m->updates[k].leaf;
    size_t bytes =
        (size_t)ir_numel(leaf) * (leaf->dtype == IR_I32 ? sizeof(int32_t) : sizeof(double));
    memcpy(leaf->dtype == IR_I32 ? (void *)it->i[leaf->id] : (void *)it->f[leaf->id], tmp[k],
           bytes);
    free(tmp[k]);
  }
  free(tmp);
}

/* ---- lockstep mesh -------------------------------------------------------- */

/* Rank r of a tp x dp mesh has coordinates (r % tp, r / tp); expert
 * parallelism (ep dividing dp) groups ep consecutive dp coordinates (axis 2,
 * coordinate d % ep) and the dp coordinates of one ep coordinate (axis 3,
 * coordinate d / ep), as rt_comm_mesh does.  Members of rank r's group on
 * axis a, in coordinate order, into g; returns the count and r's own
 * coordinate in *me. */
static int mesh_ep = 1; /* the ep degree of the running ir_interp_run_mesh_ep */

static int axis_size(int axis, int tp, int dp) {
  return axis == 0 ? tp : axis == 1 ? dp : axis == 2 ? mesh_ep : dp / mesh_ep;
}

static int group_of(int r, int axis, int tp, int dp, int *g, int *me) {
  int t = r % tp, d = r / tp, ep = mesh_ep;
  if (axis == 0) {
    for (int k = 0; k < tp; k++) g[k] = d * tp + k;
    *me = t;
    return tp;
  }
  if (axis == 2) {
    for (int k = 0; k < ep; k++) g[k] = (d / ep * ep + k) * tp + t;
    *me = d % ep;
    return ep;
  }
  if (axis == 3) {
    for (int k = 0; k < dp / ep; k++) g[k] = (d % ep + k * ep) * tp + t;
    *me = d / ep;
    return dp / ep;
  }
  for (int k = 0; k < dp; k++) g[k] = k * tp + t;
  *me = d;
  return dp;
}

/* capacity_drop (dp group) or expert_all_to_all (its axis) on every rank. */
static int mesh_expert_route(IrInterp **ranks, int tp, int dp, const IrNode *n, char *why,
                             size_t len) {
  int drop = n->op == IR_OP_CAPACITY_DROP, axis = drop ? 1 : (int)n->ia[0];
  int64_t want = drop ? n->ia[2] : n->ia[1];
  int size = axis_size(axis, tp, dp);
  if (want != size) {
    snprintf(why, len, "node %%%d (%s): group size %lld, but the mesh axis %d has %d ranks",
             n->id, ir_op_info[n->op].name, (long long)want, axis, size);
    return -1;
  }
  int *g = xcalloc((size_t)size, sizeof *g);
  IrInterp **mem = xcalloc((size_t)size, sizeof *mem);
  int rc = 0;
  for (int r = 0; r < tp * dp && !rc; r++) {
    int me;
    group_of(r, axis, tp, dp, g, &me);
    for (int k = 0; k < size; k++) mem[k] = ranks[g[k]];
    if (drop) rc = drop_member(mem, size, me, n, why, len);
    else a2a_member(mem, size, me, n);
  }
  free(g);
  free(mem);
  return rc;
}

/* Runs one collective node on every rank: each rank's result is computed
 * from the members' inputs, summed in coordinate order (so every member
 * gets bit-identical sums). */
static int mesh_collective(IrInterp **ranks, int tp, int dp, const IrNode *n, char *why,
                           size_t len) {
  int nr = tp * dp, axis = (int)n->ia[0];
  int size = axis_size(axis, tp, dp);
  if (n->ia[1] != size) {
    snprintf(why, len, "node %%%d (%s): group size %lld, but the mesh axis %d has %d ranks",
             n->id, ir_op_info[n->op].name, (long long)n->ia[1], axis, size);
    return -1;
  }
  if (n->op == IR_OP_GROUP_COPY || size == 1) {
    for (int r = 0; r < nr; r++) {
      Ctx c = {ranks[r], n, why, len};
      if (eval_collective_one(&c)) return -1;
    }
    return 0;
  }
  const IrNode *x = n->inputs[0];
  int64_t nin = ir_numel(x);
  int *g = xcalloc((size_t)size, sizeof *g);
  for (int r = 0; r < nr; r++) {
    int me;
    group_of(r, axis, tp, dp, g, &me);
    double *out = ranks[r]->f[n->id];
    if (n->op == IR_OP_ALL_REDUCE) {
      for (int64_t e = 0; e < nin; e++) {
        double s = 0;
        for (int k = 0; k < size; k++) s += ranks[g[k]]->f[x->id][e];
        out[e] = s;
      }
      continue;
    }
    /* gather / scatter along dim: outer x [piece] x inner blocks */
    int dim = (int)n->ia[2];
    int64_t inner = ir_dims_product(x, dim + 1, x->rank), outer = ir_dims_product(x, 0, dim);
    if (n->op == IR_OP_ALL_GATHER || n->op == IR_OP_REPLICATE) {
      int64_t piece = x->shape[dim] * inner; /* one member's run per outer index */
      for (int64_t o = 0; o < outer; o++)
        for (int k = 0; k < size; k++)
          memcpy(out + (o * size + k) * piece, ranks[g[k]]->f[x->id] + o * piece,
                 sizeof(double) * (size_t)piece);
    } else {
      int64_t piece = n->shape[dim] * inner, full = x->shape[dim] * inner;
      for (int64_t o = 0; o < outer; o++)
        for (int64_t e = 0; e < piece; e++) {
          double s = 0;
          for (int k = 0; k < size; k++) s += ranks[g[k]]->f[x->id][o * full + me * piece + e];
          out[o * piece + e] = s;
        }
    }
  }
  free(g);
  return 0;
}

/* vocab_cross_entropy(_grad) on every rank: per position, the group's max,
 * sum of exp (in coordinate order) and the target logit from the member
 * that holds its column, as the runtime's all-reduces give them. */
static int mesh_vocab_ce(IrInterp **ranks, int tp, int dp, const IrNode *n, char *why,
                         size_t len) {
  int nr = tp * dp, axis = (int)n->ia[0], size = axis == 0 ? tp : dp;
  if (n->ia[1] != size) {
    snprintf(why, len, "node %%%d (%s): group size %lld, but the mesh axis %d has %d ranks",
             n->id, ir_op_info[n->op].name, (long long)n->ia[1], axis, size);
    return -1;
  }
  const IrNode *lg = n->inputs[0], *tgn = n->inputs[1];
  int64_t V = lg->shape[lg->rank - 1], np = ir_numel(tgn), nv = n->ia[2];
  int grad = n->op == IR_OP_VOCAB_CROSS_ENTROPY_GRAD;
  int *g = xcalloc((size_t)size, sizeof *g);
  for (int r = 0; r < nr; r++) {
    int me;
    group_of(r, axis, tp, dp, g, &me);
    const int32_t *tg = ranks[r]->i[tgn->id];
    double total = 0, scale = grad ? ranks[r]->f[n->inputs[2]->id][0] / (double)np : 0;
    for (int64_t p = 0; p < np; p++) {
      if (tg[p] < 0 || tg[p] >= nv) {
        snprintf(why, len, "node %%%d (%s): target %d out of range [0, %lld)", n->id,
                 ir_op_info[n->op].name, tg[p], (long long)nv);
        free(g);
        return -1;
      }
      /* member k's real columns: global k V + v < nv (the rest is padding) */
      double mx = -INFINITY, s = 0;
      for (int k = 0; k < size; k++) {
        const double *row = ranks[g[k]]->f[lg->id] + p * V;
        for (int64_t v = 0; v < V && k * V + v < nv; v++) mx = fmax(mx, row[v]);
      }
      for (int k = 0; k < size; k++) {
        const double *row = ranks[g[k]]->f[lg->id] + p * V;
        double sk = 0;
        for (int64_t v = 0; v < V && k * V + v < nv; v++) sk += exp(row[v] - mx);
        s += sk;
      }
      int owner = (int)(tg[p] / V);
      double t = ranks[g[owner]]->f[lg->id][p * V + tg[p] - owner * V];
      if (!grad) {
        total += mx + log(s) - t;
        continue;
      }
      const double *row = ranks[r]->f[lg->id] + p * V;
      for (int64_t v = 0; v < V; v++)
        ranks[r]->f[n->id][p * V + v] =
            me * V + v < nv ? scale * (exp(row[v] - mx) / s - (me * V + v == tg[p] ? 1.0 : 0.0))
                            : 0.0;
    }
    if (!grad) ranks[r]->f[n->id][0] = total / (double)np;
  }
  free(g);
  return 0;
}

int ir_interp_run_mesh(IrInterp **ranks, int tp, int dp, int first, int end, char *why,
                       size_t len) {
  return ir_interp_run_mesh_ep(ranks, tp, dp, 1, first, end, why, len);
}

int ir_interp_run_mesh_ep(IrInterp **ranks, int tp, int dp, int ep, int first, int end,
                          char *why, size_t len) {
  if (ep < 1 || dp % ep) {
    snprintf(why, len, "ep = %d does not divide dp = %d", ep, dp);
    return -1;
  }
  mesh_ep = ep;
  const IrModule *m = ranks[0]->m;
  if (first < 0) first = 0;
  if (end > ranks[0]->nnodes) end = ranks[0]->nnodes;
  for (int k = first; k < end; k++) {
    const IrNode *n = m->nodes[k];
    switch (n->op) {
    case IR_OP_ALL_REDUCE: case IR_OP_GROUP_COPY: case IR_OP_ALL_GATHER:
    case IR_OP_REDUCE_SCATTER: case IR_OP_REPLICATE:
      if (mesh_collective(ranks, tp, dp, n, why, len)) return -1;
      break;
    case IR_OP_VOCAB_CROSS_ENTROPY: case IR_OP_VOCAB_CROSS_ENTROPY_GRAD:
      if (mesh_vocab_ce(ranks, tp, dp, n, why, len)) return -1;
      break;
    case IR_OP_CAPACITY_DROP: case IR_OP_EXPERT_ALL_TO_ALL:
      if (mesh_expert_route(ranks, tp, dp, n, why, len)) return -1;
      break;
    default:
      for (int r = 0; r < tp * dp; r++) {
        ranks[r]->coord[0] = r % tp, ranks[r]->coord[1] = r / tp;
        ranks[r]->coord[2] = r / tp % ep, ranks[r]->coord[3] = r / tp / ep;
        if (ir_interp_run(ranks[r], k, k + 1, why, len)) return -1;
      }
    }
  }
  return 0;
}
