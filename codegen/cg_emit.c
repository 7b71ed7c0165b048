/* codegen/cg_emit.c -- one group of IR nodes to one KIR kernel.
 *
 * A group's kernel is one of four loop structures (CgTmpl).  Inside it,
 * value() produces the f32 (or, for i32 views, index) value of any member
 * at given coordinates: members are computed from their operands, other
 * nodes are loaded from their buffers.  Coordinates carry the range of
 * values they take (Ix), which lets views avoid div/mod when an index stays
 * in one block and lets rope pick its half statically.
 *
 * Groups made only of broadcasting arithmetic ("pure") flatten adjacent
 * dimensions that every node reads alike (coalesce): a bias add over
 * [B, T, D] runs as B*T rows of D, an update of a [V, D] parameter as one
 * flat loop cut into rows of at most ELEM_MAX_COLS.
 *
 * Each op's arithmetic follows ir/interp.c operation by operation, in f32;
 * see cg_kernels.h for the two places where the formula differs (rope's
 * angle and sin/cos, bias_correction's expm1). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cg_internal.h"

#define CG_PI 3.14159265358979323846
#define ELEM_MAX_COLS 4096  /* longest flattened column loop before it is cut into rows */

typedef struct {
  KirVal v;
  int64_t lo, hi;  /* inclusive range of v; coordinates are never negative */
} Ix;

typedef struct {
  int node, rank;
  KirVal c[IR_MAX_RANK];
  KirVal v;
} Memo;

typedef struct {
  CgKernelPlan *p;
  const CgView *view;
  const IrModule *m;
  int gi;                           /* the group being built */
  KirKernel *k;
  CgKernel *ck;                     /* its plan entry */
  int *buf_of;                      /* per node: buffer param of this kernel, or -1 */
  int cap_args;
  int coalesced, crank;             /* value() sees coalesced shapes (see coalesce) */
  int64_t (*cshape)[IR_MAX_RANK];   /* per node, when coalesced */
  Memo *memo;                       /* values built in the open loop */
  int nmemo, cap_memo;
  int fixed_node;                   /* CG_ROW final loop: the row op's value is fixed_val */
  KirVal fixed_val;
  char *err;
  size_t errlen;
  int failed;
} Em;

static void *xrealloc(void *p, size_t n) {
  p = realloc(p, n ? n : 1);
  if (!p) {
    fprintf(stderr, "parc: out of memory (kernel generation, %zu bytes)\n", n);
    exit(3);
  }
  return p;
}

__attribute__((format(printf, 2, 3))) static KirVal fail(Em *E, const char *fmt, ...) {
  if (!E->failed) {
    const IrNode *r = E->m->nodes[E->ck->root];
    int n = snprintf(E->err, E->errlen, "kernel for %%%d (%s): ", r->id, ir_op_info[r->op].name);
    if (n >= 0 && (size_t)n < E->errlen) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(E->err + n, E->errlen - (size_t)n, fmt, ap);
      va_end(ap);
    }
  }
  E->failed = 1;
  return KIR_NONE;
}

static const IrNode *node(const Em *E, int id) { return E->m->nodes[id]; }
static int member(const Em *E, const IrNode *n) { return E->view->group_of[n->id] == E->gi; }
/* Whether the kernel stores member n: into its own buffer, or its leaf's. */
static int stored(const Em *E, const IrNode *n) {
  return E->view->materialize[n->id] != 0 || E->view->inplace_of[n->id] >= 0;
}
static int inplace(const Em *E, const IrNode *n) {
  return member(E, n) && E->view->inplace_of[n->id] >= 0;
}

/* ---- shapes, buffers, coordinates ------------------------------------------- */

static int rank_of(const Em *E, const IrNode *n) { return E->coalesced ? E->crank : n->rank; }
static int64_t dim_of(const Em *E, const IrNode *n, int d) {
  return E->coalesced ? E->cshape[n->id][d] : n->shape[d];
}

static void push_arg(Em *E, int a) {
  CgKernel *ck = E->ck;
  if (ck->nargs == E->cap_args) {
    E->cap_args = E->cap_args ? 2 * E->cap_args : 8;
    ck->arg_node = xrealloc(ck->arg_node, sizeof(int) * (size_t)E->cap_args);
  }
  ck->arg_node[ck->nargs++] = a;
}

/* The buffer param of node n, declared on first use: out<id> when the
 * kernel stores it, in<id> when it reads it; a member written in place is
 * stored through its leaf's param, inout<leaf> (declared before any load). */
static int buffer(Em *E, const IrNode *n, KirAccess acc) {
  if (E->buf_of[n->id] >= 0) return E->buf_of[n->id];
  if (inplace(E, n)) {
    const IrNode *leaf = node(E, E->view->inplace_of[n->id]);
    int b = buffer(E, leaf, KIR_INOUT);
    if (E->k->params[b].access != KIR_INOUT)
      return fail(E, "%s is read before its in-place update %%%d is declared", leaf->name, n->id);
    return E->buf_of[n->id] = b;
  }
  char name[32];
  snprintf(name, sizeof name, "%s%d", acc == KIR_IN ? "in" : acc == KIR_OUT ? "out" : "inout",
           n->id);
  int b = kir_buf(E->k, name, n->dtype == IR_I32 ? KIR_I32 : KIR_F32, acc);
  push_arg(E, n->id);
  E->buf_of[n->id] = b;
  return b;
}

static int temp_buffer(Em *E, int t, KirAccess acc) {
  char name[32];
  snprintf(name, sizeof name, "tmp%d", t);
  int b = kir_buf(E->k, name, KIR_F32, acc);
  push_arg(E, CG_TEMP_ARG(t));
  return b;
}

static KirVal F(Em *E, double v) { return kir_fconst(E->k, (float)v); }
static KirVal I(Em *E, int64_t v) { return kir_iconst(E->k, v); }
static Ix ix_const(Em *E, int64_t v) { return (Ix){I(E, v), v, v}; }
static Ix ix_row(Em *E, int dim, int64_t ext) { return (Ix){kir_row(E->k, dim), 0, ext - 1}; }
/* a + d, folding into a's own constant term (x + c1) + d = x + (c1 + d), so
 * that equal indices reached two ways are one KIR value. */
static Ix ix_add(Em *E, Ix a, int64_t d) {
  KirVal base = a.v;
  int64_t total = d;
  if (a.v >= 0 && a.v < E->k->nnodes) {
    const KirNode *n = &E->k->nodes[a.v];
    if (n->op == KIR_OP_IADD && E->k->nodes[n->arg[1]].op == KIR_OP_ICONST) {
      base = n->arg[0];
      total += E->k->nodes[n->arg[1]].imm;
    }
  }
  return (Ix){kir_add(E->k, base, I(E, total)), a.lo + d, a.hi + d};
}
static Ix ix_div(Em *E, Ix a, int64_t d) {
  if (a.lo / d == a.hi / d) return ix_const(E, a.lo / d);
  return (Ix){kir_idiv(E->k, a.v, d), a.lo / d, a.hi / d};
}
/* a % d; a subtraction when a stays in one block of d. */
static Ix ix_mod(Em *E, Ix a, int64_t d) {
  int64_t q = a.lo / d;
  if (q == a.hi / d) return (Ix){kir_sub(E->k, a.v, I(E, q * d)), a.lo - q * d, a.hi - q * d};
  return (Ix){kir_imod(E->k, a.v, d), 0, d - 1};
}

/* Row-major flat index of coordinates c into n's (possibly coalesced) shape,
 * with its range. */
static Ix flat_ix(Em *E, const IrNode *n, const Ix *c) {
  Ix f = ix_const(E, 0);
  for (int d = 0; d < rank_of(E, n); d++) {
    int64_t ext = dim_of(E, n, d);
    if (ext == 1) continue;  /* its coordinate is 0 */
    f.v = kir_add(E->k, kir_mul(E->k, f.v, I(E, ext)), c[d].v);
    f.lo = f.lo * ext + c[d].lo;
    f.hi = f.hi * ext + c[d].hi;
  }
  return f;
}

/* Coordinates of flat index f in shape (rank, shape). */
static void unflatten(Em *E, Ix f, int rank, const int64_t *shape, Ix *c) {
  int64_t stride = 1;
  for (int d = rank - 1; d >= 0; d--) {
    c[d] = shape[d] == 1 ? ix_const(E, 0) : ix_mod(E, ix_div(E, f, stride), shape[d]);
    stride *= shape[d];
  }
}

/* Coordinates in x of the element that broadcasting x to n's shape puts at
 * n's coordinates c (right-aligned; x's 1-sized dims read index 0). */
static void bcast(Em *E, const IrNode *n, const Ix *c, const IrNode *x, Ix *xc) {
  int rn = rank_of(E, n), rx = rank_of(E, x);
  for (int d = 0; d < rx; d++)
    xc[d] = dim_of(E, x, d) == 1 || d + rn - rx < 0 ? ix_const(E, 0) : c[d + rn - rx];
}

/* ---- values ------------------------------------------------------------------ */

static KirVal value(Em *E, const IrNode *n, const Ix *c);

/* Operand i of n at n's coordinates c, broadcast. */
static KirVal operand(Em *E, const IrNode *n, int i, const Ix *c) {
  Ix xc[IR_MAX_RANK];
  bcast(E, n, c, n->inputs[i], xc);
  return value(E, n->inputs[i], xc);
}

/* An f32[] operand (optimizer scalars). */
static KirVal scalar(Em *E, const IrNode *n, int i) {
  const IrNode *x = n->inputs[i];
  Ix zero[IR_MAX_RANK];
  for (int d = 0; d < rank_of(E, x); d++) zero[d] = ix_const(E, 0);
  return value(E, x, zero);
}

static KirVal sigmoid(Em *E, KirVal x) {
  KirKernel *k = E->k;
  return kir_div(k, F(E, 1), kir_add(k, F(E, 1), kir_exp(k, kir_neg(k, x))));
}

/* tanh(sqrt(2/pi) (x + 0.044715 x^3)), as the interpreter orders it. */
static KirVal gelu_tanh(Em *E, KirVal x) {
  KirKernel *k = E->k;
  KirVal cube = kir_mul(k, kir_mul(k, kir_mul(k, F(E, 0.044715), x), x), x);
  return kir_tanh(k, kir_mul(k, F(E, sqrt(2.0 / CG_PI)), kir_add(k, x, cube)));
}

/* Horner: c[0] + x (c[1] + x (c[2] + ...)), n coefficients. */
static KirVal horner(Em *E, KirVal x, const double *c, int n) {
  KirVal acc = F(E, c[n - 1]);
  for (int i = n - 2; i >= 0; i--) acc = kir_add(E->k, F(E, c[i]), kir_mul(E->k, x, acc));
  return acc;
}

/* e^y - 1 without cancellation: Taylor series to y^9 for |y| < 1/2
 * (truncation < 3e-10 relative), exp(y) - 1 beyond (no cancellation). */
static KirVal expm1f_kir(Em *E, KirVal y) {
  static const double c[9] = {1.0,         1.0 / 2,      1.0 / 6,       1.0 / 24,     1.0 / 120,
                              1.0 / 720,   1.0 / 5040,   1.0 / 40320,   1.0 / 362880};
  KirKernel *k = E->k;
  KirVal series = kir_mul(k, y, horner(E, y, c, 9));
  KirVal big = kir_sub(k, kir_exp(k, y), F(E, 1));
  return kir_select(k, kir_cmp(k, KIR_LT, kir_abs(k, y), F(E, 0.5)), series, big);
}

/* x rounded to the nearest integer (ties to even), |x| < 2^22. */
static KirVal rint_small(Em *E, KirVal x) {
  const double magic = 12582912.0; /* 1.5 * 2^23: x + magic has unit ulp */
  return kir_sub(E->k, kir_add(E->k, x, F(E, magic)), F(E, magic));
}

/* cos(a) and sin(a) in f32.  q = nearest integer to a / (pi/2); s = a - q pi/2
 * with pi/2 split in three parts (P1 * q exact, P2 * q exact for q < 2^13),
 * so |s| <= pi/4 + tiny; Taylor polynomials of sin to s^9 and cos to s^10
 * (truncation < 2e-9); then the quadrant q mod 4 swaps and negates. */
static void sincos_kir(Em *E, KirVal a, KirVal *cs, KirVal *sn) {
  KirKernel *k = E->k;
  const double half_pi = CG_PI / 2, p1 = 1.5703125; /* 8 significant bits */
  int e;
  double m = frexp(half_pi - p1, &e);
  double p2 = ldexp(floor(ldexp(m, 11)), e - 11);  /* next 11 bits */
  double p3 = half_pi - p1 - p2;
  KirVal q = rint_small(E, kir_mul(k, a, F(E, 2.0 / CG_PI)));
  KirVal s = kir_sub(k, a, kir_mul(k, q, F(E, p1)));
  s = kir_sub(k, s, kir_mul(k, q, F(E, p2)));
  s = kir_sub(k, s, kir_mul(k, q, F(E, p3)));
  KirVal q4 = kir_sub(k, q, kir_mul(k, F(E, 4), rint_small(E, kir_mul(k, q, F(E, 0.25)))));
  static const double sc[5] = {1.0, -1.0 / 6, 1.0 / 120, -1.0 / 5040, 1.0 / 362880};
  static const double cc[6] = {1.0, -1.0 / 2, 1.0 / 24, -1.0 / 720, 1.0 / 40320, -1.0 / 3628800};
  KirVal s2 = kir_mul(k, s, s);
  KirVal sin_s = kir_mul(k, s, horner(E, s2, sc, 5));
  KirVal cos_s = horner(E, s2, cc, 6);
  /* q4 in {-2, ..., 2}: 1 -> (sin, cos) = (cos_s, -sin_s); -1 -> (-cos_s, sin_s);
   * +-2 -> (-sin_s, -cos_s); 0 -> (sin_s, cos_s) */
  KirVal odd = kir_cmp(k, KIR_EQ, kir_abs(k, q4), F(E, 1));
  KirVal bs = kir_select(k, odd, cos_s, sin_s), bc = kir_select(k, odd, sin_s, cos_s);
  KirVal neg = F(E, -1), pos = F(E, 1);
  KirVal sign_s = kir_select(k, kir_cmp(k, KIR_LT, q4, F(E, 0)), neg,
                             kir_select(k, kir_cmp(k, KIR_GT, q4, F(E, 1.5)), neg, pos));
  KirVal sign_c = kir_select(k, kir_cmp(k, KIR_GT, q4, F(E, 0.5)), neg,
                             kir_select(k, kir_cmp(k, KIR_LT, q4, F(E, -1.5)), neg, pos));
  *sn = kir_mul(k, bs, sign_s);
  *cs = kir_mul(k, bc, sign_c);
}

/* rope / rope_grad at c = (b, h, t, i) (see ir/interp.c): with j = i mod hd/2
 * and a = t * theta^(-2j/hd), out = x[i] cos a - sgn x[i + hd/2] sin a in the
 * first half, x[i] cos a + sgn x[i - hd/2] sin a in the second. */
static KirVal rope(Em *E, const IrNode *n, const Ix *c) {
  KirKernel *k = E->k;
  const IrNode *x = n->inputs[0];
  int64_t hd = n->shape[3], half = hd / 2;
  double sgn = n->op == IR_OP_ROPE ? 1.0 : -1.0;
  Ix i = c[3], j, partner;
  KirVal s;             /* the coefficient of x[partner] sin a: -sgn or +sgn */
  int fixed = 0;        /* s known statically: +1 add, -1 sub */
  if (i.hi < half) {
    j = i, partner = ix_add(E, i, half), fixed = sgn > 0 ? -1 : 1;
    s = KIR_NONE;
  } else if (i.lo >= half) {
    j = ix_add(E, i, -half), partner = j, fixed = sgn > 0 ? 1 : -1;
    s = KIR_NONE;
  } else {
    j = ix_mod(E, i, half);
    partner = ix_mod(E, ix_add(E, i, half), hd);
    s = kir_select(k, kir_cmp(k, KIR_LT, i.v, I(E, half)), F(E, -sgn), F(E, sgn));
  }
  double lg = -2.0 * log(n->fa) / (double)hd;
  KirVal inv_freq = kir_exp(k, kir_mul(k, kir_itof(k, j.v), F(E, lg)));
  KirVal cs, sn;
  sincos_kir(E, kir_mul(k, kir_itof(k, c[2].v), inv_freq), &cs, &sn);
  Ix pc[4] = {c[0], c[1], c[2], partner};
  KirVal t1 = kir_mul(k, value(E, x, c), cs);
  KirVal t2 = kir_mul(k, value(E, x, pc), sn);
  if (fixed) return fixed > 0 ? kir_add(k, t1, t2) : kir_sub(k, t1, t2);
  return kir_add(k, t1, kir_mul(k, s, t2));
}

/* The value of member n at its coordinates c (not memoized). */
static KirVal compute(Em *E, const IrNode *n, const Ix *c) {
  KirKernel *k = E->k;
  Ix xc[IR_MAX_RANK];
  const IrNode *x = n->ninputs ? n->inputs[0] : NULL;
  double fa = n->fa;
#define OP(i) operand(E, n, (i), c)
  switch (n->op) {
  case IR_OP_ADD: return kir_add(k, OP(0), OP(1));
  case IR_OP_SUB: return kir_sub(k, OP(0), OP(1));
  case IR_OP_MUL: return kir_mul(k, OP(0), OP(1));
  case IR_OP_DIV: return kir_div(k, OP(0), OP(1));
  case IR_OP_SCALE: return kir_mul(k, OP(0), F(E, fa));
  case IR_OP_GELU: {
    KirVal v = OP(0);
    return kir_mul(k, kir_mul(k, F(E, 0.5), v), kir_add(k, F(E, 1), gelu_tanh(E, v)));
  }
  case IR_OP_SILU: {
    KirVal v = OP(0);
    return kir_mul(k, v, sigmoid(E, v));
  }
  case IR_OP_RELU: {
    KirVal v = OP(0);
    return kir_select(k, kir_cmp(k, KIR_GT, v, F(E, 0)), v, F(E, 0));
  }
  case IR_OP_EXP: return kir_exp(k, OP(0));
  case IR_OP_LOG: return kir_log(k, OP(0));
  case IR_OP_GELU_GRAD: {
    /* 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2) */
    KirVal v = OP(0), dy = OP(1), t = gelu_tanh(E, v);
    KirVal a = kir_mul(k, F(E, 0.5), kir_add(k, F(E, 1), t));
    KirVal b = kir_mul(k, kir_mul(k, F(E, 0.5), v), kir_sub(k, F(E, 1), kir_mul(k, t, t)));
    b = kir_mul(k, b, F(E, sqrt(2.0 / CG_PI)));
    b = kir_mul(k, b, kir_add(k, F(E, 1), kir_mul(k, kir_mul(k, F(E, 3.0 * 0.044715), v), v)));
    return kir_mul(k, dy, kir_add(k, a, b));
  }
  case IR_OP_SILU_GRAD: {
    KirVal v = OP(0), dy = OP(1), s = sigmoid(E, v);
    KirVal d = kir_mul(k, s, kir_add(k, F(E, 1), kir_mul(k, v, kir_sub(k, F(E, 1), s))));
    return kir_mul(k, dy, d);
  }
  case IR_OP_RELU_GRAD: {
    KirVal v = OP(0), dy = OP(1);
    return kir_mul(k, dy, kir_select(k, kir_cmp(k, KIR_GT, v, F(E, 0)), F(E, 1), F(E, 0)));
  }
  case IR_OP_FILL: return F(E, fa);
  case IR_OP_BROADCAST: return OP(0);
  case IR_OP_RESHAPE: {
    Ix f = flat_ix(E, n, c);
    if (!member(E, x)) return kir_load(k, buffer(E, x, KIR_IN), f.v);
    unflatten(E, f, x->rank, x->shape, xc);
    return value(E, x, xc);
  }
  case IR_OP_SPLIT_HEADS: { /* out[b, h, t, i] = x[b, t, h*hd + i] */
    int64_t hd = n->shape[3];
    xc[0] = c[0], xc[1] = c[2];
    xc[2] = (Ix){kir_add(k, kir_mul(k, c[1].v, I(E, hd)), c[3].v), c[1].lo * hd + c[3].lo,
                 c[1].hi * hd + c[3].hi};
    return value(E, x, xc);
  }
  case IR_OP_MERGE_HEADS: { /* out[b, t, j] = x[b, j / hd, t, j % hd] */
    int64_t hd = x->shape[3];
    xc[0] = c[0], xc[1] = ix_div(E, c[2], hd), xc[2] = c[1], xc[3] = ix_mod(E, c[2], hd);
    return value(E, x, xc);
  }
  case IR_OP_TRANSPOSE:
    memcpy(xc, c, sizeof(Ix) * (size_t)n->rank);
    xc[n->ia[0]] = c[n->ia[1]], xc[n->ia[1]] = c[n->ia[0]];
    return value(E, x, xc);
  case IR_OP_SLICE:
    memcpy(xc, c, sizeof(Ix) * (size_t)n->rank);
    xc[n->ia[0]] = ix_add(E, c[n->ia[0]], n->ia[1]);
    return value(E, x, xc);
  case IR_OP_ROPE: case IR_OP_ROPE_GRAD: return rope(E, n, c);
  case IR_OP_GRAD_NORM: {
    KirVal s = scalar(E, n, 0);
    for (int i = 1; i < n->ninputs; i++) s = kir_add(k, s, scalar(E, n, i));
    return kir_sqrt(k, s);
  }
  case IR_OP_CLIP_COEF: {
    if (fa == 0) return F(E, 1);
    KirVal coef = kir_div(k, F(E, fa), kir_add(k, scalar(E, n, 0), F(E, 1e-6)));
    return kir_select(k, kir_cmp(k, KIR_GT, coef, F(E, 1)), F(E, 1), coef);
  }
  case IR_OP_BIAS_CORRECTION: { /* 1 - beta^step */
    KirVal step = scalar(E, n, 0);
    if (fa == 0) return kir_select(k, kir_cmp(k, KIR_EQ, step, F(E, 0)), F(E, 0), F(E, 1));
    return kir_neg(k, expm1f_kir(E, kir_mul(k, step, F(E, log(fa)))));
  }
  case IR_OP_ADAM_MOMENT: { /* m beta + (1 - beta) g' [g'], g' = g coef */
    KirVal g = kir_mul(k, OP(1), scalar(E, n, 2));
    KirVal t = kir_mul(k, F(E, 1 - fa), g);
    if (n->ia[0]) t = kir_mul(k, t, g);
    return kir_add(k, kir_mul(k, OP(0), F(E, fa)), t);
  }
  case IR_OP_WEIGHT_DECAY:
    return kir_mul(k, OP(0), kir_sub(k, F(E, 1), kir_mul(k, scalar(E, n, 1), F(E, fa))));
  case IR_OP_ADAM_UPDATE: { /* p + (-(lr / bc1) m) / (sqrt(v) / sqrt(bc2) + eps) */
    KirVal step_size = kir_div(k, scalar(E, n, 3), scalar(E, n, 4));
    KirVal denom = kir_add(k, kir_div(k, kir_sqrt(k, OP(2)), kir_sqrt(k, scalar(E, n, 5))),
                           F(E, fa));
    return kir_add(k, OP(0), kir_div(k, kir_mul(k, kir_neg(k, step_size), OP(1)), denom));
  }
  case IR_OP_SGD_GRAD: {
    KirVal g = kir_mul(k, OP(0), scalar(E, n, 1));
    return fa != 0 ? kir_add(k, g, kir_mul(k, F(E, fa), OP(2))) : g;
  }
  case IR_OP_SGD_MOMENTUM: return kir_add(k, kir_mul(k, OP(0), F(E, fa)), OP(1));
  case IR_OP_SGD_UPDATE: return kir_add(k, OP(0), kir_mul(k, kir_neg(k, scalar(E, n, 2)), OP(1)));
  default: break;
  }
#undef OP
  return fail(E, "%%%d (%s) cannot be computed inline", n->id, ir_op_info[n->op].name);
}

static KirVal value(Em *E, const IrNode *n, const Ix *c) {
  if (E->failed) return KIR_NONE;
  if (!member(E, n)) return kir_load(E->k, buffer(E, n, KIR_IN), flat_ix(E, n, c).v);
  if (n->id == E->fixed_node) return E->fixed_val;
  int r = rank_of(E, n);
  for (int i = 0; i < E->nmemo; i++) {
    Memo *mo = &E->memo[i];
    int same = mo->node == n->id && mo->rank == r;
    for (int d = 0; same && d < r; d++) same = mo->c[d] == c[d].v;
    if (same) return mo->v;
  }
  KirVal v = compute(E, n, c);
  if (E->nmemo == E->cap_memo) {
    E->cap_memo = E->cap_memo ? 2 * E->cap_memo : 32;
    E->memo = xrealloc(E->memo, sizeof(Memo) * (size_t)E->cap_memo);
  }
  Memo *mo = &E->memo[E->nmemo++];
  mo->node = n->id, mo->rank = r, mo->v = v;
  for (int d = 0; d < r; d++) mo->c[d] = c[d].v;
  return v;
}

static void open_loop(Em *E, int64_t extent) {
  kir_loop(E->k, I(E, extent));
  E->nmemo = 0;  /* values of the previous loop are not usable here */
}

static void end_loop(Em *E) {
  kir_end(E->k);
  E->nmemo = 0;
}

/* ---- coalescing -------------------------------------------------------------- */

/* A member whose own reading of its input is the kernel's loop structure
 * (CG_REDUCE's reductions): not part of what coalescing looks at. */
static int structural(const IrNode *n) { return cg_template_of(n->op) == CG_REDUCE; }

/* Whether every member (but the reductions of a CG_REDUCE kernel, whose
 * reading is described by the dim classes) is broadcasting arithmetic. */
static int group_pure(const Em *E) {
  for (int i = 0; i < E->ck->nnodes; i++) {
    const IrNode *n = node(E, E->ck->nodes[i]);
    if (!structural(n) && !cg_pure_op(n->op)) return 0;
  }
  return 1;
}

/* Flattens the iteration shape S (rank r; cls[d] 0 kept, 1 reduced) for a
 * pure group: drops 1-sized dims and merges adjacent dims of one class that
 * every touched node (members but reductions, and all operands) reads
 * alike: all of each or none (broadcast).  Fills E->cshape for the touched
 * nodes, E->crank, and the merged dims' extents and classes. */
static void coalesce(Em *E, int r, const int64_t *S, const int *cls, int64_t *cS, int *ccls) {
  const IrModule *m = E->m;
  int *touched = xrealloc(NULL, sizeof(int) * (size_t)m->nnodes);
  unsigned char *seen = xrealloc(NULL, (size_t)m->nnodes);
  memset(seen, 0, (size_t)m->nnodes);
  int nt = 0;
  for (int i = 0; i < E->ck->nnodes; i++) {
    const IrNode *n = node(E, E->ck->nodes[i]);
    if (!structural(n) && !seen[n->id]) seen[n->id] = 1, touched[nt++] = n->id;
    for (int j = 0; j < n->ninputs; j++)
      if (!seen[n->inputs[j]->id]) seen[n->inputs[j]->id] = 1, touched[nt++] = n->inputs[j]->id;
  }
  /* pattern of touched node t on dim d of S: 1 full, 0 broadcast */
#define FULL(t, d)                                                                     \
  ((d) - (r - node(E, t)->rank) >= 0 && node(E, t)->shape[(d) - (r - node(E, t)->rank)] == S[d])
  int group_of_dim[IR_MAX_RANK], ng = 0, prev = -1;
  for (int d = 0; d < r; d++) {
    group_of_dim[d] = -1;
    if (S[d] == 1) continue;
    int merge = prev >= 0 && cls[prev] == cls[d];
    for (int i = 0; merge && i < nt; i++) merge = FULL(touched[i], prev) == FULL(touched[i], d);
    if (merge) {
      cS[ng - 1] *= S[d];
    } else {
      cS[ng] = S[d];
      ccls[ng] = cls[d];
      ng++;
    }
    group_of_dim[d] = ng - 1;
    prev = d;
  }
  if (!E->cshape) E->cshape = xrealloc(NULL, sizeof *E->cshape * (size_t)m->nnodes);
  for (int i = 0; i < nt; i++) {
    int t = touched[i];
    for (int g = 0; g < ng; g++) E->cshape[t][g] = 1;
    for (int d = 0; d < r; d++)
      if (group_of_dim[d] >= 0 && FULL(t, d)) E->cshape[t][group_of_dim[d]] = cS[group_of_dim[d]];
  }
#undef FULL
  E->coalesced = 1;
  E->crank = ng;
  free(touched);
  free(seen);
}

/* ---- templates --------------------------------------------------------------- */

/* Declares out buffers for the stored members, the root's first. */
static void declare_outputs(Em *E) {
  const IrNode *root = node(E, E->ck->root);
  if (member(E, root) && stored(E, root)) buffer(E, root, KIR_OUT);
  for (int i = 0; i < E->ck->nnodes; i++) {
    const IrNode *n = node(E, E->ck->nodes[i]);
    if (n != root && stored(E, n)) buffer(E, n, KIR_OUT);
  }
}

/* Stores every stored member at coordinates c of the iteration shape, whose
 * node is `shape_of` (all stored members have its shape).  With a member
 * written in place, every value is built before the first store, so each
 * load of a leaf precedes the store into it (KIR: a load observes the stores
 * built before it). */
static void store_members(Em *E, const IrNode *shape_of, const Ix *c) {
  int any_inplace = 0;
  for (int i = 0; i < E->ck->nnodes; i++) any_inplace |= inplace(E, node(E, E->ck->nodes[i]));
  KirVal *vals = any_inplace ? xrealloc(NULL, sizeof(KirVal) * (size_t)E->ck->nnodes) : NULL;
  for (int pass = any_inplace ? 0 : 1; pass < 2; pass++)
    for (int i = 0; i < E->ck->nnodes; i++) {
      const IrNode *n = node(E, E->ck->nodes[i]);
      if (!stored(E, n)) continue;
      int same = n->rank == shape_of->rank;
      for (int d = 0; same && d < n->rank; d++) same = n->shape[d] == shape_of->shape[d];
      if (!same) {
        fail(E, "stored member %%%d does not have the kernel's shape", n->id);
        free(vals);
        return;
      }
      if (pass == 0) {
        vals[i] = value(E, n, c);
        continue;
      }
      KirVal v = vals ? vals[i] : value(E, n, c);
      kir_store(E->k, buffer(E, n, KIR_OUT), flat_ix(E, shape_of, c).v, v);
    }
  free(vals);
}

/* The in-place invariant (cg_kernels.h, (a)) on the built kernel: each leaf
 * param a member is written through is stored once, and loaded only at that
 * store's index and before it, so iteration i reads element i of the leaf's
 * old value and nothing else. */
static void check_inplace(Em *E) {
  const KirKernel *k = E->k;
  for (int i = 0; i < E->ck->nnodes && !E->failed; i++) {
    const IrNode *n = node(E, E->ck->nodes[i]);
    if (!inplace(E, n)) continue;
    int b = E->buf_of[n->id], stores = 0;
    KirVal idx = KIR_NONE;
    for (KirVal x = 0; x < k->nnodes; x++) {
      const KirNode *d = &k->nodes[x];
      if ((d->op != KIR_OP_LOAD && d->op != KIR_OP_STORE) || d->imm != b) continue;
      if (idx == KIR_NONE) idx = d->arg[0];
      if (d->arg[0] != idx || (d->op == KIR_OP_LOAD && stores) ||
          (d->op == KIR_OP_STORE && stores++)) {
        fail(E, "in-place update %%%d: its leaf %s is not read and written element by element",
             n->id, node(E, E->view->inplace_of[n->id])->name);
        return;
      }
    }
    if (b < 0 || !stores) fail(E, "in-place update %%%d is never stored", n->id);
  }
}

/* Largest divisor of n in [lo, hi], or 0. */
static int64_t divisor_in(int64_t n, int64_t lo, int64_t hi) {
  for (int64_t d = hi; d >= lo; d--)
    if (n % d == 0) return d;
  return 0;
}

/* CG_ELEM: one iteration per element of the root's shape S.  Rows are S's
 * leading dims, the column its last (coalesced in pure groups; a long
 * column is cut into rows).  A rope root iterates over half the last dim
 * and handles i and i + hd/2 together (their sin and cos are shared). */
static void emit_elem(Em *E) {
  KirKernel *k = E->k;
  const IrNode *root = node(E, E->ck->root);
  int64_t cS[IR_MAX_RANK];
  int cls[IR_MAX_RANK] = {0}, ccls[IR_MAX_RANK];
  if (group_pure(E)) coalesce(E, root->rank, root->shape, cls, cS, ccls);
  int r = rank_of(E, root);
  int rope_root = !E->coalesced && (root->op == IR_OP_ROPE || root->op == IR_OP_ROPE_GRAD);
  int64_t last = r ? dim_of(E, root, r - 1) : 1, cols = rope_root ? last / 2 : last, split = 0;
  if (E->coalesced && r && last > ELEM_MAX_COLS) {
    split = divisor_in(last, 256, ELEM_MAX_COLS);
    if (split) cols = split;
  }
  for (int d = 0; d + 1 < r; d++) kir_row_dim(k, dim_of(E, root, d));
  if (split) kir_row_dim(k, last / split);
  declare_outputs(E);
  Ix c[IR_MAX_RANK];
  for (int d = 0; d + 1 < r; d++) c[d] = ix_row(E, d, dim_of(E, root, d));
  open_loop(E, cols);
  Ix col = {kir_col(k), 0, cols - 1};
  if (r == 0) {
    store_members(E, root, c);
  } else if (split) {
    Ix hi = ix_row(E, r - 1, last / split);
    c[r - 1] = (Ix){kir_add(k, kir_mul(k, hi.v, I(E, split)), col.v), 0, last - 1};
    store_members(E, root, c);
  } else {
    c[r - 1] = col;
    store_members(E, root, c);
    if (rope_root) {
      c[r - 1] = ix_add(E, col, cols);
      store_members(E, root, c);
    }
  }
  end_loop(E);
}

/* CG_ROW: the row op R over the last dim D of its shape S; one row per
 * vector, loops for the statistics, then a final loop where R's value is
 * known and every stored member (prologue at S, R, epilogue) is stored. */
static void emit_row(Em *E, const CgGroup *g, int stats) {
  KirKernel *k = E->k;
  const IrNode *R = node(E, g->rowop);
  int r = R->rank;
  int64_t D = R->shape[r - 1];
  double eps = R->fa;
  for (int d = 0; d + 1 < r; d++) kir_row_dim(k, R->shape[d]);
  declare_outputs(E);
  Ix c[IR_MAX_RANK];
  for (int d = 0; d + 1 < r; d++) c[d] = ix_row(E, d, R->shape[d]);
#define LOOP() (open_loop(E, D), c[r - 1] = (Ix){kir_col(k), 0, D - 1})
#define IN(i) operand(E, R, (i), c)
  KirVal Df = F(E, (double)D), y = KIR_NONE;
  switch (R->op) {
  case IR_OP_LAYERNORM: case IR_OP_RMSNORM: {
    int rms = R->op == IR_OP_RMSNORM;
    KirVal mu = F(E, 0);
    if (!rms) {
      LOOP();
      KirVal s = kir_reduce(k, KIR_SUM, IN(0));
      end_loop(E);
      mu = kir_div(k, s, Df);
    }
    LOOP();
    KirVal dx = rms ? IN(0) : kir_sub(k, IN(0), mu);
    KirVal v = kir_reduce(k, KIR_SUM, kir_mul(k, dx, dx));
    end_loop(E);
    KirVal rstd = kir_rsqrt(k, kir_add(k, kir_div(k, v, Df), F(E, eps)));
    LOOP();
    dx = rms ? IN(0) : kir_sub(k, IN(0), mu);
    y = kir_mul(k, kir_mul(k, dx, rstd), IN(1));
    if (!rms) y = kir_add(k, y, IN(2));
    break;
  }
  case IR_OP_SOFTMAX: {
    LOOP();
    KirVal mx = kir_reduce(k, KIR_MAX, IN(0));
    end_loop(E);
    LOOP();
    KirVal s = kir_reduce(k, KIR_SUM, kir_exp(k, kir_sub(k, IN(0), mx)));
    end_loop(E);
    LOOP();
    y = kir_div(k, kir_exp(k, kir_sub(k, IN(0), mx)), s);
    break;
  }
  case IR_OP_SOFTMAX_GRAD: { /* y (dy - sum(dy y)) */
    LOOP();
    KirVal s = kir_reduce(k, KIR_SUM, kir_mul(k, IN(1), IN(0)));
    end_loop(E);
    LOOP();
    y = kir_mul(k, IN(0), kir_sub(k, IN(1), s));
    break;
  }
  case IR_OP_LAYERNORM_GRAD: case IR_OP_RMSNORM_GRAD: {
    /* g = dy w; dx = rstd (g - mean(g) - xhat mean(g xhat)) (rms: no mean(g)) */
    int rms = R->op == IR_OP_RMSNORM_GRAD;
    KirVal mu = F(E, 0), mg = F(E, 0);
    if (!rms) {
      LOOP();
      KirVal s = kir_reduce(k, KIR_SUM, IN(0));
      mg = kir_reduce(k, KIR_SUM, kir_mul(k, IN(2), IN(1)));
      end_loop(E);
      mu = kir_div(k, s, Df);
      mg = kir_div(k, mg, Df);
    }
    LOOP();
    KirVal dx = rms ? IN(0) : kir_sub(k, IN(0), mu);
    KirVal v = kir_reduce(k, KIR_SUM, kir_mul(k, dx, dx));
    end_loop(E);
    KirVal rstd = kir_rsqrt(k, kir_add(k, kir_div(k, v, Df), F(E, eps)));
    if (stats >= 0) { /* for the wgrad: as emit_stats lays them out */
      int tb = temp_buffer(E, stats, KIR_OUT);
      int64_t rows = ir_numel(R) / D;
      KirVal row = I(E, 0);
      for (int d = 0; d + 1 < r; d++) row = kir_add(k, kir_mul(k, row, I(E, R->shape[d])), c[d].v);
      if (!rms) kir_store(k, tb, row, mu);
      kir_store(k, tb, rms ? row : kir_add(k, row, I(E, rows)), rstd);
    }
    LOOP();
    dx = rms ? IN(0) : kir_sub(k, IN(0), mu);
    KirVal gw = kir_mul(k, IN(2), IN(1));
    KirVal mgx = kir_reduce(k, KIR_SUM, kir_mul(k, kir_mul(k, gw, dx), rstd));
    end_loop(E);
    mgx = kir_div(k, mgx, Df);
    LOOP();
    dx = rms ? IN(0) : kir_sub(k, IN(0), mu);
    gw = kir_mul(k, IN(2), IN(1));
    KirVal xhat = kir_mul(k, dx, rstd);
    KirVal t = rms ? gw : kir_sub(k, gw, mg);
    y = kir_mul(k, rstd, kir_sub(k, t, kir_mul(k, xhat, mgx)));
    break;
  }
  default:
    fail(E, "%%%d (%s) is not a row op", R->id, ir_op_info[R->op].name);
    return;
  }
#undef LOOP
#undef IN
  E->fixed_node = R->id;
  E->fixed_val = y;
  store_members(E, R, c);
  E->fixed_node = -1;
  end_loop(E);
}

/* The layer_norm / rms_norm statistics of every row of x into temporary t:
 * layer_norm mean at [r], 1/std at [rows + r]; rms_norm 1/std at [r]. */
static void emit_stats(Em *E, const IrNode *w, int t) {
  KirKernel *k = E->k;
  const IrNode *x = w->inputs[0];
  int rms = w->op == IR_OP_RMSNORM_WGRAD;
  int64_t D = x->shape[x->rank - 1], rows = ir_numel(x) / D;
  kir_row_dim(k, rows);
  int out = temp_buffer(E, t, KIR_OUT);
  int in = buffer(E, x, KIR_IN);
  KirVal row = kir_row(k, 0), base = kir_mul(k, row, I(E, D)), Df = F(E, (double)D);
  KirVal mu = F(E, 0);
  if (!rms) {
    open_loop(E, D);
    KirVal s = kir_reduce(k, KIR_SUM, kir_load(k, in, kir_add(k, base, kir_col(k))));
    end_loop(E);
    mu = kir_div(k, s, Df);
  }
  open_loop(E, D);
  KirVal xv = kir_load(k, in, kir_add(k, base, kir_col(k)));
  KirVal dx = rms ? xv : kir_sub(k, xv, mu);
  KirVal v = kir_reduce(k, KIR_SUM, kir_mul(k, dx, dx));
  end_loop(E);
  KirVal rstd = kir_rsqrt(k, kir_add(k, kir_div(k, v, Df), F(E, w->fa)));
  if (!rms) kir_store(k, out, row, mu);
  kir_store(k, out, rms ? row : kir_add(k, row, I(E, rows)), rstd);
}

/* Classes of X's dims for reduction n of X: 1 where n sums over the dim. */
static void reduce_classes(const IrNode *n, const IrNode *X, int *cls) {
  int r = X->rank;
  for (int d = 0; d < r; d++) {
    switch (n->op) {
    case IR_OP_SUM: case IR_OP_MEAN: cls[d] = d == n->ia[0]; break;
    case IR_OP_SUMSQ: cls[d] = 1; break;
    case IR_OP_SUM_TO: {
      int dq = d - (r - n->rank);
      cls[d] = dq < 0 || (n->shape[dq] == 1 && X->shape[d] != 1);
      break;
    }
    default: cls[d] = d < r - 1; break; /* the wgrads: every row of x */
    }
  }
}

/* CG_REDUCE: sum, mean, sum_to, sumsq and the wgrads' column sums; several
 * when they reduce tensors of one shape over the same dims (a wgrad and its
 * bias's sum_to).  X is the tensor reduced over; rows are its kept elements
 * (the results'), the one column loop runs over its reduced elements,
 * decomposed into their coordinates (one reduced run needs no division),
 * summing in a fixed order; each result is stored once per row.  t: the
 * temporary holding a wgrad's row statistics. */
static void emit_reduce(Em *E, int t) {
  KirKernel *k = E->k;
  const IrNode *red[4];
  int nred = 0;
  for (int i = 0; i < E->ck->nnodes; i++) {
    const IrNode *n = node(E, E->ck->nodes[i]);
    if (!structural(n)) continue;
    if (nred == 4) {
      fail(E, "too many reductions in one kernel");
      return;
    }
    red[nred++] = n;
  }
  if (nred == 0) {
    fail(E, "no reduction");
    return;
  }
  const IrNode *X = red[0]->inputs[0];
  int r = X->rank, cls[IR_MAX_RANK], cls2[IR_MAX_RANK];
  reduce_classes(red[0], X, cls);
  for (int i = 1; i < nred; i++) {
    const IrNode *Xi = red[i]->inputs[0];
    reduce_classes(red[i], Xi, cls2);
    int same = Xi->rank == r && !memcmp(cls, cls2, sizeof(int) * (size_t)r);
    for (int d = 0; same && d < r; d++) same = Xi->shape[d] == X->shape[d];
    if (!same) {
      fail(E, "reductions %%%d and %%%d do not share their loop", red[0]->id, red[i]->id);
      return;
    }
  }
  int64_t S[IR_MAX_RANK], cS[IR_MAX_RANK];
  int ccls[IR_MAX_RANK];
  memcpy(S, X->shape, sizeof S);
  if (group_pure(E)) {
    coalesce(E, r, S, cls, cS, ccls);
  } else {
    memcpy(cS, S, sizeof cS);
    memcpy(ccls, cls, sizeof ccls);
  }
  int cr = E->coalesced ? E->crank : r;
  int64_t n = 1;
  for (int d = 0; d < cr; d++) {
    if (ccls[d]) n *= cS[d];
    else if (cS[d] > 1) kir_row_dim(k, cS[d]);
  }
  declare_outputs(E);
  Ix c[IR_MAX_RANK];
  int rd = 0;
  for (int d = 0; d < cr; d++)
    if (!ccls[d]) c[d] = cS[d] > 1 ? ix_row(E, rd++, cS[d]) : ix_const(E, 0);
  int tmp = t >= 0 ? temp_buffer(E, t, KIR_IN) : -1;
  open_loop(E, n);
  Ix col = {kir_col(k), 0, n - 1};
  int64_t stride = 1;
  for (int d = cr - 1; d >= 0; d--) {
    if (!ccls[d]) continue;
    c[d] = cS[d] == 1 ? ix_const(E, 0) : ix_mod(E, ix_div(E, col, stride), cS[d]);
    stride *= cS[d];
  }
  KirVal sums[4];
  for (int i = 0; i < nred; i++) {
    const IrNode *R = red[i];
    KirVal v;
    if (R->op == IR_OP_LAYERNORM_WGRAD || R->op == IR_OP_RMSNORM_WGRAD) {
      /* dw[j] = sum over rows of dy (x - mu) rstd; the row's index in x is
       * the flat index of its reduced (leading) coordinates */
      if (tmp < 0) {
        fail(E, "wgrad %%%d has no statistics", R->id);
        return;
      }
      KirVal row = I(E, 0);
      for (int d = 0; d < cr; d++)
        if (ccls[d]) row = kir_add(k, kir_mul(k, row, I(E, cS[d])), c[d].v);
      KirVal x = value(E, R->inputs[0], c), dy = value(E, R->inputs[1], c);
      if (R->op == IR_OP_LAYERNORM_WGRAD) {
        int64_t rows = ir_numel(X) / X->shape[r - 1];
        KirVal mu = kir_load(k, tmp, row), rstd = kir_load(k, tmp, kir_add(k, row, I(E, rows)));
        v = kir_mul(k, kir_mul(k, dy, kir_sub(k, x, mu)), rstd);
      } else {
        v = kir_mul(k, kir_mul(k, dy, x), kir_load(k, tmp, row));
      }
    } else {
      v = value(E, R->inputs[0], c);
      if (R->op == IR_OP_SUMSQ) v = kir_mul(k, v, v);
    }
    sums[i] = kir_reduce(k, KIR_SUM, v);
  }
  end_loop(E);
  /* the results' flat index: their kept coordinates, row-major */
  KirVal idx = I(E, 0);
  for (int d = 0; d < cr; d++)
    if (!ccls[d] && cS[d] > 1) idx = kir_add(k, kir_mul(k, idx, I(E, cS[d])), c[d].v);
  for (int i = 0; i < nred; i++) {
    KirVal s = sums[i];
    if (red[i]->op == IR_OP_MEAN) s = kir_div(k, s, F(E, (double)n));
    kir_store(k, buffer(E, red[i], KIR_OUT), idx, s);
  }
}

/* CG_CONCAT: rows are the dims before the axis; part p is one loop over its
 * contiguous block of len_p * inner elements, stored at its offset. */
static void emit_concat(Em *E) {
  KirKernel *k = E->k;
  const IrNode *root = node(E, E->ck->root);
  int ax = (int)root->ia[0], r = root->rank;
  int64_t inner = ir_dims_product(root, ax + 1, r), L = root->shape[ax];
  for (int d = 0; d < ax; d++) kir_row_dim(k, root->shape[d]);
  declare_outputs(E);
  Ix c[IR_MAX_RANK];
  KirVal rowflat = I(E, 0);
  for (int d = 0; d < ax; d++) {
    c[d] = ix_row(E, d, root->shape[d]);
    rowflat = kir_add(k, kir_mul(k, rowflat, I(E, root->shape[d])), c[d].v);
  }
  int64_t off = 0;
  for (int p = 0; p < root->ninputs; p++) {
    const IrNode *x = root->inputs[p];
    int64_t len = x->shape[ax];
    open_loop(E, len * inner);
    Ix col = {kir_col(k), 0, len * inner - 1};
    KirVal v;
    if (!member(E, x)) {
      v = kir_load(k, buffer(E, x, KIR_IN),
                   kir_add(k, kir_mul(k, rowflat, I(E, len * inner)), col.v));
    } else {
      c[ax] = ix_div(E, col, inner);
      int64_t stride = 1;
      for (int d = r - 1; d > ax; d--) {
        c[d] = ix_mod(E, ix_div(E, col, stride), root->shape[d]);
        stride *= root->shape[d];
      }
      v = value(E, x, c);
    }
    KirVal at = kir_add(k, kir_mul(k, rowflat, I(E, L * inner)), kir_add(k, I(E, off * inner), col.v));
    kir_store(k, buffer(E, root, KIR_OUT), at, v);
    end_loop(E);
    off += len;
  }
}

/* ---- driver ------------------------------------------------------------------ */

/* k<root>_<op>[_fused][suffix]: op is the row op of a row kernel, the wgrad
 * of a reduction kernel that has one, else the root's. */
static void begin_kernel(Em *E, CgKernelPlan *p, const CgGroup *g, const IrNode *named,
                         int *members, int nmembers, const char *suffix) {
  char name[96];
  snprintf(name, sizeof name, "k%d_%s%s%s", g->root, ir_op_info[named->op].name,
           nmembers > 1 ? "_fused" : "", suffix);
  CgKernel *ck = &p->kernels[p->nkernels++];
  memset(ck, 0, sizeof *ck);
  ck->k = kir_kernel_new(p->km, name);
  ck->root = g->root;
  ck->nodes = members;
  ck->nnodes = members ? nmembers : 0;
  E->k = ck->k;
  E->ck = ck;
  E->cap_args = 0;
  E->coalesced = 0;
  E->nmemo = 0;
  E->fixed_node = -1;
  for (int i = 0; i < E->m->nnodes; i++) E->buf_of[i] = -1;
}

/* A new temporary of numel f32, its writer and reader to be filled in. */
static int new_temp(CgKernelPlan *p, int64_t numel) {
  p->temps = xrealloc(p->temps, sizeof(CgTemp) * (size_t)(p->ntemps + 1));
  p->temps[p->ntemps] = (CgTemp){numel, -1, -1};
  return p->ntemps++;
}

/* Elements of the statistics of x's rows: layer_norm mean and 1/std, rms 1/std. */
static int64_t stats_numel(const IrNode *x, int rms) {
  return (rms ? 1 : 2) * (ir_numel(x) / x->shape[x->rank - 1]);
}

int cg_emit_group(CgKernelPlan *p, const CgView *v, const CgGroup *g, int gi, char *err,
                  size_t errlen) {
  const IrModule *m = v->m;
  Em E;
  memset(&E, 0, sizeof E);
  E.p = p, E.view = v, E.m = m, E.gi = gi, E.err = err, E.errlen = errlen;
  E.buf_of = xrealloc(NULL, sizeof(int) * (size_t)m->nnodes);
  int nmembers = 0;
  for (int i = 0; i <= g->root; i++) nmembers += v->group_of[i] == gi;
  int *members = xrealloc(NULL, sizeof(int) * (size_t)nmembers);
  nmembers = 0;
  const IrNode *wgrad = NULL;
  for (int i = 0; i <= g->root; i++)
    if (v->group_of[i] == gi) {
      members[nmembers++] = i;
      if (m->nodes[i]->op == IR_OP_LAYERNORM_WGRAD || m->nodes[i]->op == IR_OP_RMSNORM_WGRAD)
        wgrad = m->nodes[i];
    }
  int temp = -1;
  if (wgrad && g->stats >= 0) {
    temp = v->stats_temp[g->stats];
    if (temp < 0) {
      snprintf(err, errlen, "internal: statistics of %%%d are not written before %%%d", g->stats,
               wgrad->id);
      free(E.buf_of);
      free(members);
      return -1;
    }
  } else if (wgrad) {
    int rms = wgrad->op == IR_OP_RMSNORM_WGRAD;
    temp = new_temp(p, stats_numel(wgrad->inputs[0], rms));
    p->temps[temp].writer = p->nkernels;
    begin_kernel(&E, p, g, wgrad, NULL, 0, "_stats");
    emit_stats(&E, wgrad, temp);
  }
  const IrNode *named = g->tmpl == CG_ROW ? m->nodes[g->rowop] : wgrad ? wgrad : m->nodes[g->root];
  begin_kernel(&E, p, g, named, members, nmembers, "");
  if (temp >= 0) p->temps[temp].reader = p->nkernels - 1;
  int stats = -1;
  if (g->tmpl == CG_ROW && v->writes_stats[g->rowop]) {
    const IrNode *R = m->nodes[g->rowop];
    stats = new_temp(p, stats_numel(R, R->op == IR_OP_RMSNORM_GRAD));
    p->temps[stats].writer = p->nkernels - 1;
    v->stats_temp[g->rowop] = stats;
  }
  switch (g->tmpl) {
  case CG_ELEM: emit_elem(&E); check_inplace(&E); break;
  case CG_ROW: emit_row(&E, g, stats); break;
  case CG_REDUCE: emit_reduce(&E, temp); break;
  case CG_CONCAT: emit_concat(&E); break;
  }
  free(E.buf_of);
  free(E.cshape);
  free(E.memo);
  if (!E.failed && kir_error(p->km)) {
    snprintf(err, errlen, "%s", kir_error(p->km));
    E.failed = 1;
  }
  return E.failed ? -1 : 0;
}
