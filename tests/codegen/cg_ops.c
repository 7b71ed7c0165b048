/* tests/codegen/cg_ops.c -- every op that lowers to KIR, and the fusion
 * patterns, against the double-precision interpreter.
 *
 * Each case builds a tiny module (shapes drawn from a seeded RNG, with
 * broadcasting and 1-sized dims), plans it with fuse = 0 and fuse = 1,
 * compiles each plan through LLVM, runs the kernels (rows in several ranges)
 * and compares every materialised node with ir_interp at the case's
 * relative-L2 tolerance; fused and unfused results must agree with each
 * other too.  Pattern cases also state how many kernels fusion must leave,
 * and cases with updates how many the plans write in place (cg_kernels.h)
 * and how many copies train.c's step then ends with.
 *
 *   cg_ops CASE        run one case
 *   cg_ops             run them all
 *   cg_ops --list      print the case names (tests/codegen/CMakeLists.txt)
 *   cg_ops --coverage  fail unless every op that lowers to KIR has a case
 *
 * Tolerances.  1e-5 relative L2 unless stated: f32 rounding of each op is
 * ~6e-8 relative, a few ops in a row and the ~1e-7 error of exp/tanh/log
 * stay well below it.  Looser, with the reason beside the case:
 * cancellation-prone gradients (3e-5), rope (its f32 angle is off by
 * ~1e-7 * t: 2e-5 to position 64, 5e-5 to 4096). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg_harness.h"
#include "codegen/host.h"

/* ---- building modules ---------------------------------------------------------- */

typedef enum { V_NORMAL, V_UNIFORM, V_AWAY, V_IDS, V_CONST } ValKind;

typedef struct {
  int id;
  ValKind kind;
  double a, b;
} Spec;

typedef struct {
  IrModule *m;
  CgRng rng;
  Spec spec[128];
  int nspec;
} B;

#define S(...) ((const int64_t[]){__VA_ARGS__, -1})
#define SCALAR ((const int64_t[]){-1})

static int64_t dim(B *b, int64_t lo, int64_t hi) { return lo + cg_randint(&b->rng, hi - lo + 1); }

static void set_shape(IrNode *n, const int64_t *shape) {
  n->rank = 0;
  for (int d = 0; shape[d] >= 0; d++) n->shape[n->rank++] = shape[d];
}

/* A leaf: op PARAM, INPUT or STATE; values drawn by kind (a, b as ValKind). */
static IrNode *leaf(B *b, IrOp op, ValKind kind, double a, double c, const int64_t *shape) {
  IrNode *n = ir_add(b->m, op, NULL, 0);
  char name[32];
  snprintf(name, sizeof name, "v%d", n->id);
  n->name = arena_strdup(&b->m->arena, name);
  n->dtype = kind == V_IDS ? IR_I32 : IR_F32;
  n->shard_dim = -1;
  set_shape(n, shape);
  b->spec[b->nspec++] = (Spec){n->id, kind, a, c};
  return n;
}

static IrNode *in(B *b, ValKind kind, double a, double c, const int64_t *shape) {
  return leaf(b, IR_OP_INPUT, kind, a, c, shape);
}
static IrNode *normal(B *b, const int64_t *shape) { return in(b, V_NORMAL, 1, 0, shape); }

static IrNode *add_checked(B *b, IrNode *p) {
  char why[512];
  if (!ir_infer(p, why, sizeof why)) {
    fprintf(stderr, "test module does not type-check: %s\n", why);
    exit(2);
  }
  return ir_add_like(b->m, p);
}

static IrNode *opn(B *b, IrOp op, IrNode **x, int nx, int64_t i0, int64_t i1, int64_t i2,
                   double fa) {
  IrNode p = {.op = op, .inputs = x, .ninputs = nx, .ia = {i0, i1, i2}, .fa = fa};
  return add_checked(b, &p);
}
static IrNode *op1(B *b, IrOp op, IrNode *x, int64_t i0, int64_t i1, int64_t i2, double fa) {
  return opn(b, op, &x, 1, i0, i1, i2, fa);
}
static IrNode *op2(B *b, IrOp op, IrNode *x, IrNode *y, int64_t i0, double fa) {
  IrNode *v[2] = {x, y};
  return opn(b, op, v, 2, i0, 0, 0, fa);
}
static IrNode *op3(B *b, IrOp op, IrNode *x, IrNode *y, IrNode *z, int64_t i0, double fa) {
  IrNode *v[3] = {x, y, z};
  return opn(b, op, v, 3, i0, 0, 0, fa);
}
/* Ops whose result shape is the node's own (reshape, fill, broadcast, sum_to). */
static IrNode *shaped(B *b, IrOp op, IrNode *x, const int64_t *shape, double fa) {
  IrNode p = {.op = op, .inputs = &x, .ninputs = x ? 1 : 0, .fa = fa};
  set_shape(&p, shape);
  return add_checked(b, &p);
}

/* ---- cases: elementwise --------------------------------------------------------- */

static void c_add_bcast(B *b) {
  int64_t A = dim(b, 1, 3), Bd = dim(b, 2, 4), C = dim(b, 2, 7);
  op2(b, IR_OP_ADD, normal(b, S(A, Bd, C)), normal(b, S(Bd, 1)), 0, 0);
}
static void c_add_both_bcast(B *b) { op2(b, IR_OP_ADD, normal(b, S(1, 4)), normal(b, S(3, 1)), 0, 0); }
static void c_add_ones(B *b) {
  int64_t Bd = dim(b, 2, 5), C = dim(b, 1, 6);
  op2(b, IR_OP_ADD, normal(b, S(1, Bd, 1, C)), normal(b, S(C)), 0, 0);
}
static void c_add_scalar(B *b) { op2(b, IR_OP_ADD, normal(b, SCALAR), normal(b, SCALAR), 0, 0); }
static void c_sub_bcast(B *b) {
  int64_t Bd = dim(b, 2, 4), C = dim(b, 2, 4);
  op2(b, IR_OP_SUB, normal(b, S(Bd, 1)), normal(b, S(2, Bd, C)), 0, 0);
}
static void c_mul_bcast(B *b) {
  int64_t C = dim(b, 2, 9);
  op2(b, IR_OP_MUL, normal(b, S(2, 3, C)), normal(b, S(C)), 0, 0);
}
static void c_mul_self(B *b) {
  IrNode *x = normal(b, S(3, 4));
  op2(b, IR_OP_MUL, x, x, 0, 0);
}
static void c_div_bcast(B *b) {
  op2(b, IR_OP_DIV, normal(b, S(2, 3, 4)), in(b, V_AWAY, 0.5, 2, S(3, 1)), 0, 0);
}
static void unary(B *b, IrOp op, ValKind kind, double a, double c) {
  op1(b, op, in(b, kind, a, c, S(2, dim(b, 1, 4), dim(b, 3, 40))), 0, 0, 0, -0.37);
}
static void c_scale(B *b) { unary(b, IR_OP_SCALE, V_NORMAL, 1, 0); }
static void c_gelu(B *b) { unary(b, IR_OP_GELU, V_NORMAL, 2, 0); }
static void c_silu(B *b) { unary(b, IR_OP_SILU, V_NORMAL, 3, 0); }
static void c_relu(B *b) { unary(b, IR_OP_RELU, V_AWAY, 0.01, 2); }
static void c_exp(B *b) { unary(b, IR_OP_EXP, V_NORMAL, 2, 0); }
static void c_log(B *b) { unary(b, IR_OP_LOG, V_UNIFORM, 1e-3, 50); }
static void act_grad(B *b, IrOp op, ValKind kind, double a, double c) {
  int64_t sh[] = {dim(b, 1, 3), dim(b, 2, 33), -1};
  op2(b, op, in(b, kind, a, c, sh), normal(b, sh), 0, 0);
}
static void c_gelu_grad(B *b) { act_grad(b, IR_OP_GELU_GRAD, V_NORMAL, 2, 0); }
static void c_silu_grad(B *b) { act_grad(b, IR_OP_SILU_GRAD, V_NORMAL, 3, 0); }
static void c_relu_grad(B *b) { act_grad(b, IR_OP_RELU_GRAD, V_AWAY, 0.01, 2); }

/* ---- cases: normalisation --------------------------------------------------------- */

static void norm(B *b, IrOp op, const int64_t *sh, int64_t D) {
  IrNode *x = in(b, V_NORMAL, 2, 0.5, sh), *w = in(b, V_NORMAL, 0.5, 1, S(D));
  if (op == IR_OP_LAYERNORM) op3(b, op, x, w, normal(b, S(D)), 0, 1e-5);
  else op2(b, op, x, w, 0, 1e-5);
}
static void c_layer_norm(B *b) {
  int64_t D = dim(b, 2, 40);
  norm(b, IR_OP_LAYERNORM, S(dim(b, 1, 3), dim(b, 1, 4), D), D);
}
static void c_layer_norm_1d(B *b) { norm(b, IR_OP_LAYERNORM, S(7), 7); }
static void c_rms_norm(B *b) {
  int64_t D = dim(b, 2, 40);
  norm(b, IR_OP_RMSNORM, S(dim(b, 1, 5), D), D);
}
static void c_softmax(B *b) {
  op1(b, IR_OP_SOFTMAX, in(b, V_NORMAL, 3, 0, S(dim(b, 1, 3), 1, dim(b, 1, 20))), 0, 0, 0, 0);
}
static void c_softmax_wide(B *b) { op1(b, IR_OP_SOFTMAX, in(b, V_NORMAL, 4, 0, S(2, 300)), 0, 0, 0, 0); }
static void norm_grad(B *b, IrOp op) {
  int64_t D = dim(b, 2, 40), sh[] = {dim(b, 1, 3), dim(b, 1, 5), D, -1};
  IrNode *x = in(b, V_NORMAL, 2, 0.5, sh), *w = in(b, V_NORMAL, 0.5, 1, S(D));
  op3(b, op, x, w, normal(b, sh), 0, 1e-5);
}
static void norm_wgrad(B *b, IrOp op) {
  int64_t D = dim(b, 1, 40), sh[] = {dim(b, 1, 3), dim(b, 1, 5), D, -1};
  op2(b, op, in(b, V_NORMAL, 2, 0.5, sh), normal(b, sh), 0, 1e-5);
}
static void c_layer_norm_grad(B *b) { norm_grad(b, IR_OP_LAYERNORM_GRAD); }
static void c_rms_norm_grad(B *b) { norm_grad(b, IR_OP_RMSNORM_GRAD); }
static void c_layer_norm_wgrad(B *b) { norm_wgrad(b, IR_OP_LAYERNORM_WGRAD); }
static void c_rms_norm_wgrad(B *b) { norm_wgrad(b, IR_OP_RMSNORM_WGRAD); }
static void c_softmax_grad(B *b) {
  int64_t sh[] = {dim(b, 1, 4), dim(b, 1, 20), -1};
  IrNode *y = op1(b, IR_OP_SOFTMAX, in(b, V_NORMAL, 2, 0, sh), 0, 0, 0, 0);
  op2(b, IR_OP_SOFTMAX_GRAD, y, normal(b, sh), 0, 0);
}

/* ---- cases: rope -------------------------------------------------------------------- */

static void rope(B *b, IrOp op, double theta, int64_t T) {
  int64_t hd = 2 * dim(b, 1, 8);
  op1(b, op, normal(b, S(dim(b, 1, 2), dim(b, 1, 3), T, hd)), 0, 0, 0, theta);
}
static void c_rope(B *b) { rope(b, IR_OP_ROPE, 10000, dim(b, 1, 64)); }
static void c_rope_llama3(B *b) { rope(b, IR_OP_ROPE, 500000, 64); }
static void c_rope_long(B *b) { op1(b, IR_OP_ROPE, normal(b, S(1, 1, 4096, 64)), 0, 0, 0, 10000); }
static void c_rope_grad(B *b) { rope(b, IR_OP_ROPE_GRAD, 10000, dim(b, 1, 64)); }

/* ---- cases: layout -------------------------------------------------------------------- */

static void c_reshape(B *b) { shaped(b, IR_OP_RESHAPE, normal(b, S(2, 3, 4)), S(6, 4), 0); }
static void c_reshape_i32(B *b) {
  shaped(b, IR_OP_RESHAPE, in(b, V_IDS, 50, 0, S(3, 5)), S(15), 0);
}
static void c_split_heads(B *b) {
  int64_t H = dim(b, 1, 3), hd = dim(b, 1, 5);
  op1(b, IR_OP_SPLIT_HEADS, normal(b, S(2, dim(b, 1, 4), H * hd)), H, 0, 0, 0);
}
static void c_merge_heads(B *b) {
  op1(b, IR_OP_MERGE_HEADS, normal(b, S(2, dim(b, 1, 3), dim(b, 1, 4), dim(b, 1, 5))), 0, 0, 0, 0);
}
static void c_transpose(B *b) {
  int d0 = (int)dim(b, 0, 3), d1 = (int)dim(b, 0, 3);
  op1(b, IR_OP_TRANSPOSE, normal(b, S(2, 3, dim(b, 1, 4), 5)), d0, d1, 0, 0);
}
static void c_slice_i32(B *b) { op1(b, IR_OP_SLICE, in(b, V_IDS, 9, 0, S(3, 4)), 1, 1, 2, 0); }
static void c_transpose_i32(B *b) {
  op1(b, IR_OP_TRANSPOSE, in(b, V_IDS, 9, 0, S(3, 4)), 0, 1, 0, 0);
}
static void concat(B *b, int axis, int nparts, int ids) {
  int64_t sh[] = {2, dim(b, 1, 3), dim(b, 1, 4), -1};
  IrNode *parts[4];
  for (int p = 0; p < nparts; p++) {
    sh[axis] = dim(b, 1, 4);
    parts[p] = ids ? in(b, V_IDS, 100, 0, sh) : normal(b, sh);
  }
  opn(b, IR_OP_CONCAT, parts, nparts, axis, 0, 0, 0);
}
static void c_concat_first(B *b) { concat(b, 0, 2, 0); }
static void c_concat_mid(B *b) { concat(b, 1, 3, 0); }
static void c_concat_last(B *b) { concat(b, 2, 3, 0); }
static void c_concat_i32(B *b) { concat(b, 1, 2, 1); }
static void slice(B *b, int axis) {
  int64_t sh[] = {dim(b, 1, 3), dim(b, 2, 5), dim(b, 2, 6), -1};
  int64_t len = dim(b, 1, sh[axis]), start = dim(b, 0, sh[axis] - len);
  op1(b, IR_OP_SLICE, normal(b, sh), axis, start, len, 0);
}
static void c_slice_first(B *b) { slice(b, 0); }
static void c_slice_mid(B *b) { slice(b, 1); }
static void c_slice_last(B *b) { slice(b, 2); }
static void c_broadcast(B *b) {
  int64_t Bd = dim(b, 2, 4);
  shaped(b, IR_OP_BROADCAST, normal(b, S(Bd, 1)), S(dim(b, 1, 3), Bd, dim(b, 2, 5)), 0);
}
static void c_broadcast_scalar(B *b) { shaped(b, IR_OP_BROADCAST, normal(b, SCALAR), S(3, 4), 0); }
static void c_fill(B *b) {
  shaped(b, IR_OP_FILL, NULL, S(dim(b, 1, 4), 3), 0.25);
  shaped(b, IR_OP_FILL, NULL, SCALAR, -2);
}

/* ---- cases: reductions ------------------------------------------------------------------- */

static void c_sum_to(B *b) {
  int64_t A = dim(b, 1, 3), Bd = dim(b, 2, 4), C = dim(b, 2, 6);
  IrNode *x = normal(b, S(A, Bd, C));
  shaped(b, IR_OP_SUM_TO, x, S(Bd, 1), 0);
  shaped(b, IR_OP_SUM_TO, x, S(C), 0);
  shaped(b, IR_OP_SUM_TO, x, S(1, 1, C), 0);
  shaped(b, IR_OP_SUM_TO, x, S(A, Bd, C), 0);
  shaped(b, IR_OP_SUM_TO, x, SCALAR, 0);
}
static void reduce(B *b, IrOp op) {
  IrNode *x = normal(b, S(dim(b, 1, 3), dim(b, 1, 4), dim(b, 2, 30)));
  for (int axis = 0; axis < 3; axis++)
    for (int keep = 0; keep < 2; keep++) op1(b, op, x, axis, keep, 0, 0);
}
static void c_sum(B *b) { reduce(b, IR_OP_SUM); }
static void c_mean(B *b) { reduce(b, IR_OP_MEAN); }

/* ---- cases: the optimizer ------------------------------------------------------------------ */

static void c_sumsq(B *b) {
  op1(b, IR_OP_SUMSQ, normal(b, S(dim(b, 1, 5), dim(b, 1, 50))), 0, 0, 0, 0);
}
static void c_grad_norm(B *b) {
  IrNode *s[3];
  for (int i = 0; i < 3; i++) s[i] = in(b, V_UNIFORM, 0, 4, SCALAR);
  opn(b, IR_OP_GRAD_NORM, s, 3, 0, 0, 0, 0);
}
static void c_clip_coef(B *b) {
  op1(b, IR_OP_CLIP_COEF, in(b, V_CONST, 0.25, 0, SCALAR), 0, 0, 0, 1.0);
  op1(b, IR_OP_CLIP_COEF, in(b, V_CONST, 3.7, 0, SCALAR), 0, 0, 0, 1.0);
  op1(b, IR_OP_CLIP_COEF, in(b, V_CONST, 3.7, 0, SCALAR), 0, 0, 0, 0.0);
}
static void c_bias_correction(B *b) {
  const double steps[] = {1, 2, 7, 1000, 100000};
  for (int i = 0; i < 5; i++) {
    IrNode *s = in(b, V_CONST, steps[i], 0, SCALAR);
    op1(b, IR_OP_BIAS_CORRECTION, s, 0, 0, 0, 0.9);
    op1(b, IR_OP_BIAS_CORRECTION, s, 0, 0, 0, 0.999);
    op1(b, IR_OP_BIAS_CORRECTION, s, 0, 0, 0, 0.0);
  }
}
static IrNode *state(B *b, ValKind kind, double a, double c, const int64_t *sh) {
  return leaf(b, IR_OP_STATE, kind, a, c, sh);
}
static void c_adam_moment(B *b) {
  int64_t sh[] = {dim(b, 1, 4), dim(b, 1, 20), -1};
  IrNode *g = normal(b, sh), *coef = in(b, V_UNIFORM, 0.3, 1, SCALAR);
  op3(b, IR_OP_ADAM_MOMENT, state(b, V_NORMAL, 0.1, 0, sh), g, coef, 0, 0.9);
  op3(b, IR_OP_ADAM_MOMENT, state(b, V_UNIFORM, 0, 0.1, sh), g, coef, 1, 0.95);
}
static void c_weight_decay(B *b) {
  op2(b, IR_OP_WEIGHT_DECAY, normal(b, S(3, dim(b, 1, 9))), in(b, V_CONST, 1e-2, 0, SCALAR), 0,
      0.1);
}
static void c_adam_update(B *b) {
  int64_t sh[] = {dim(b, 1, 4), dim(b, 1, 20), -1};
  IrNode *v[6] = {normal(b, sh), in(b, V_NORMAL, 0.01, 0, sh), in(b, V_UNIFORM, 0, 1e-3, sh),
                  in(b, V_CONST, 1e-3, 0, SCALAR), in(b, V_CONST, 0.271, 0, SCALAR),
                  in(b, V_CONST, 0.0297, 0, SCALAR)};
  opn(b, IR_OP_ADAM_UPDATE, v, 6, 0, 0, 0, 1e-8);
}
static void c_sgd(B *b) {
  int64_t sh[] = {dim(b, 1, 4), dim(b, 1, 20), -1};
  IrNode *g = normal(b, sh), *p = normal(b, sh), *coef = in(b, V_UNIFORM, 0.3, 1, SCALAR);
  IrNode *d0 = op3(b, IR_OP_SGD_GRAD, g, coef, p, 0, 0.0);
  IrNode *d1 = op3(b, IR_OP_SGD_GRAD, g, coef, p, 0, 0.01);
  IrNode *m = op2(b, IR_OP_SGD_MOMENTUM, state(b, V_NORMAL, 0.1, 0, sh), d1, 0, 0.9);
  op3(b, IR_OP_SGD_UPDATE, p, m, in(b, V_CONST, 0.05, 0, SCALAR), 0, 0);
  op3(b, IR_OP_SGD_UPDATE, p, d0, in(b, V_CONST, 0.05, 0, SCALAR), 0, 0);
}

/* ---- cases: fusion patterns ------------------------------------------------------------------- */

static void c_p_bias_gelu(B *b) {
  int64_t F = dim(b, 8, 40);
  IrNode *h = op2(b, IR_OP_ADD, normal(b, S(2, 5, F)), normal(b, S(F)), 0, 0);
  op1(b, IR_OP_GELU, h, 0, 0, 0, 0);
}
/* bias add + residual add + layer_norm, the residual stream also read by a
 * later op: one row kernel stores the stream and the norm */
static void c_p_residual_ln(B *b) {
  int64_t D = dim(b, 4, 40), sh[] = {2, dim(b, 1, 6), D, -1};
  IrNode *y = op2(b, IR_OP_ADD, normal(b, sh), normal(b, S(D)), 0, 0);
  IrNode *h = op2(b, IR_OP_ADD, normal(b, sh), y, 0, 0);
  IrNode *w = in(b, V_NORMAL, 0.5, 1, S(D));
  op3(b, IR_OP_LAYERNORM, h, w, normal(b, S(D)), 0, 1e-5);
  op1(b, IR_OP_SCALE, h, 0, 0, 0, 0.5);
}
static void c_p_swiglu(B *b) {
  int64_t sh[] = {2, dim(b, 1, 6), dim(b, 8, 40), -1};
  op2(b, IR_OP_MUL, op1(b, IR_OP_SILU, in(b, V_NORMAL, 3, 0, sh), 0, 0, 0, 0), normal(b, sh), 0, 0);
}
static void c_p_softmax_prologue(B *b) {
  int64_t T = dim(b, 2, 20);
  IrNode *s = op1(b, IR_OP_SCALE, in(b, V_NORMAL, 3, 0, S(2, 3, T, T)), 0, 0, 0, 0.25);
  op1(b, IR_OP_SOFTMAX, op2(b, IR_OP_ADD, s, normal(b, S(T, T)), 0, 0), 0, 0, 0, 0);
}
static void c_p_softmax_epilogue(B *b) {
  int64_t sh[] = {3, dim(b, 2, 20), -1};
  IrNode *y = op1(b, IR_OP_SOFTMAX, in(b, V_NORMAL, 3, 0, sh), 0, 0, 0, 0);
  op2(b, IR_OP_MUL, y, normal(b, sh), 0, 0);
}
static void c_p_ln_grad_epilogue(B *b) {
  int64_t D = dim(b, 2, 40), sh[] = {2, dim(b, 1, 5), D, -1};
  IrNode *g = op3(b, IR_OP_LAYERNORM_GRAD, in(b, V_NORMAL, 2, 0.5, sh),
                  in(b, V_NORMAL, 0.5, 1, S(D)), normal(b, sh), 0, 1e-5);
  op2(b, IR_OP_ADD, normal(b, sh), g, 0, 0);
}
/* the LayerNorm backward of one layer: dx (B), dw and db (W) */
static void c_p_ln_backward(B *b) {
  int64_t D = dim(b, 2, 40), sh[] = {2, dim(b, 1, 5), D, -1};
  IrNode *x = in(b, V_NORMAL, 2, 0.5, sh), *dy = normal(b, sh);
  op3(b, IR_OP_LAYERNORM_GRAD, x, in(b, V_NORMAL, 0.5, 1, S(D)), dy, 0, 1e-5);
  op2(b, IR_OP_LAYERNORM_WGRAD, x, dy, 0, 1e-5);
  shaped(b, IR_OP_SUM_TO, dy, S(D), 0);
}
/* clip + AdamW for one parameter, as pass_optimizer writes it */
static void c_p_adamw(B *b) {
  int64_t sh[] = {dim(b, 2, 8), dim(b, 2, 30), -1};
  IrNode *p = leaf(b, IR_OP_PARAM, V_NORMAL, 1, 0, sh), *g = normal(b, sh);
  IrNode *g2 = normal(b, S(5)), *lr = in(b, V_CONST, 1e-3, 0, SCALAR);
  IrNode *step = in(b, V_CONST, 3, 0, SCALAR);
  IrNode *m = state(b, V_NORMAL, 0.1, 0, sh), *v = state(b, V_UNIFORM, 0, 1e-2, sh);
  IrNode *s[2] = {op1(b, IR_OP_SUMSQ, g, 0, 0, 0, 0), op1(b, IR_OP_SUMSQ, g2, 0, 0, 0, 0)};
  IrNode *norm = opn(b, IR_OP_GRAD_NORM, s, 2, 0, 0, 0, 0);
  IrNode *coef = op1(b, IR_OP_CLIP_COEF, norm, 0, 0, 0, 1.0);
  IrNode *bc1 = op1(b, IR_OP_BIAS_CORRECTION, step, 0, 0, 0, 0.9);
  IrNode *bc2 = op1(b, IR_OP_BIAS_CORRECTION, step, 0, 0, 0, 0.95);
  IrNode *m1 = op3(b, IR_OP_ADAM_MOMENT, m, g, coef, 0, 0.9);
  IrNode *v1 = op3(b, IR_OP_ADAM_MOMENT, v, g, coef, 1, 0.95);
  IrNode *p1 = op2(b, IR_OP_WEIGHT_DECAY, p, lr, 0, 0.1);
  IrNode *u[6] = {p1, m1, v1, lr, bc1, bc2};
  IrNode *p2 = opn(b, IR_OP_ADAM_UPDATE, u, 6, 0, 0, 0, 1e-8);
  ir_add_update(b->m, m, m1);
  ir_add_update(b->m, v, v1);
  ir_add_update(b->m, p, p2);
  b->m->grad_norm = norm;
}
/* In-place updates (cg_kernels.h).  A kernel that reads its leaf across
 * elements (here a transpose fused into the update) keeps a buffer and the
 * copy; unfused, the transpose is its own earlier kernel and the add may
 * overwrite p. */
static void c_p_inplace_transpose(B *b) {
  int64_t n = dim(b, 3, 9);
  IrNode *p = leaf(b, IR_OP_PARAM, V_NORMAL, 1, 0, S(n, n));
  ir_add_update(b->m, p, op2(b, IR_OP_ADD, p, op1(b, IR_OP_TRANSPOSE, p, 0, 1, 0, 0), 0, 0));
}
/* a reader of p after p's update kernel: p's old value must survive, so p's
 * update is copied (s's, written by that reader's kernel, is in place) */
static void c_p_inplace_late_reader(B *b) {
  int64_t sh[] = {dim(b, 2, 5), dim(b, 2, 30), -1};
  IrNode *p = leaf(b, IR_OP_PARAM, V_NORMAL, 1, 0, sh), *s = state(b, V_NORMAL, 1, 0, sh);
  s->name = arena_printf(&b->m->arena, "%s.exp_avg", p->name); /* p's state (host.c) */
  ir_add_update(b->m, p, op1(b, IR_OP_SCALE, p, 0, 0, 0, 0.5));
  ir_add_update(b->m, s, op2(b, IR_OP_ADD, s, op1(b, IR_OP_EXP, p, 0, 0, 0, 0), 0, 0));
}
/* the update value read by a later kernel (unfused: from the leaf's buffer) */
static void c_p_inplace_value_reader(B *b) {
  int64_t sh[] = {dim(b, 2, 5), dim(b, 2, 30), -1};
  IrNode *p = leaf(b, IR_OP_PARAM, V_NORMAL, 1, 0, sh), *g = normal(b, sh);
  IrNode *v = op2(b, IR_OP_SUB, p, g, 0, 0);
  ir_add_update(b->m, p, v);
  op1(b, IR_OP_EXP, v, 0, 0, 0, 0);
}
/* an update computed by a reduction: not elementwise, copied */
static void c_p_inplace_reduce(B *b) {
  int64_t D = dim(b, 2, 12);
  IrNode *p = leaf(b, IR_OP_PARAM, V_NORMAL, 1, 0, S(D));
  IrNode *x = op2(b, IR_OP_ADD, normal(b, S(3, D)), p, 0, 0);
  ir_add_update(b->m, p, shaped(b, IR_OP_SUM_TO, x, S(D), 0));
}
/* dq | dk | dv of sdpa_grad back to [B, T, 3 W]: slices, merge_heads, concat */
static void c_p_concat_views(B *b) {
  int64_t H = dim(b, 1, 3), T = dim(b, 1, 6), hd = dim(b, 1, 5);
  IrNode *g = normal(b, S(2, 3 * H, T, hd)), *parts[3];
  for (int i = 0; i < 3; i++)
    parts[i] = op1(b, IR_OP_MERGE_HEADS, op1(b, IR_OP_SLICE, g, 1, i * H, H, 0), 0, 0, 0, 0);
  opn(b, IR_OP_CONCAT, parts, 3, 2, 0, 0, 0);
}
/* q = rope(split_heads(slice(qkv))) */
static void c_p_rope_views(B *b) {
  int64_t H = dim(b, 1, 3), hd = 2 * dim(b, 1, 4), W = H * hd;
  IrNode *qkv = normal(b, S(2, dim(b, 2, 16), 3 * W));
  IrNode *q = op1(b, IR_OP_SPLIT_HEADS, op1(b, IR_OP_SLICE, qkv, 2, W, W, 0), H, 0, 0, 0);
  op1(b, IR_OP_ROPE, q, 0, 0, 0, 10000);
}
/* merge_heads(rope_grad(slice(g))): rope's halves are not static here */
static void c_p_rope_grad_merge(B *b) {
  int64_t H = dim(b, 1, 3), hd = 2 * dim(b, 1, 4);
  IrNode *g = normal(b, S(2, 2 * H, dim(b, 1, 16), hd));
  IrNode *r = op1(b, IR_OP_ROPE_GRAD, op1(b, IR_OP_SLICE, g, 1, H, H, 0), 0, 0, 0, 10000);
  op1(b, IR_OP_MERGE_HEADS, r, 0, 0, 0, 0);
}
static void c_p_sum_to_prologue(B *b) {
  int64_t sh[] = {dim(b, 1, 3), dim(b, 2, 5), dim(b, 2, 9), -1};
  IrNode *a = op2(b, IR_OP_MUL, normal(b, sh), normal(b, sh), 0, 0);
  shaped(b, IR_OP_SUM_TO, a, S(sh[2]), 0);
}
static void c_p_reduce_views(B *b) {
  IrNode *t = op1(b, IR_OP_TRANSPOSE, normal(b, S(3, dim(b, 1, 4), 5)), 0, 2, 0, 0);
  op1(b, IR_OP_SUM, op1(b, IR_OP_EXP, t, 0, 0, 0, 0), 1, 0, 0, 0);
}
static void c_p_reshape_root(B *b) {
  IrNode *g = op1(b, IR_OP_GELU, normal(b, S(2, 3, dim(b, 2, 9))), 0, 0, 0, 0);
  shaped(b, IR_OP_RESHAPE, g, S(6, g->shape[2]), 0);
}
static void c_p_transpose_chain(B *b) {
  IrNode *t = op1(b, IR_OP_TRANSPOSE, op1(b, IR_OP_EXP, normal(b, S(3, 4, 5)), 0, 0, 0, 0), 1, 2, 0, 0);
  op2(b, IR_OP_ADD, t, normal(b, S(5, 4)), 0, 0);
}
/* one value read twice in the kernel is computed once; fanout to two kernels */
static void c_p_fanout(B *b) {
  IrNode *e = op1(b, IR_OP_EXP, normal(b, S(4, 6)), 0, 0, 0, 0);
  op2(b, IR_OP_MUL, e, op1(b, IR_OP_SCALE, e, 0, 0, 0, 3), 0, 0);
}
/* the residual is read by a runtime op before and after its consumer kernel */
static void c_p_runtime_reader(B *b) {
  int64_t sh[] = {2, 3, 8, -1};
  IrNode *h = op2(b, IR_OP_ADD, normal(b, sh), normal(b, S(8)), 0, 0);
  op1(b, IR_OP_GELU, h, 0, 0, 0, 0);
  op2(b, IR_OP_MATMUL, h, normal(b, S(8, 4)), 0, 0);
  IrNode *h2 = op2(b, IR_OP_ADD, normal(b, sh), normal(b, S(8)), 0, 0);
  op2(b, IR_OP_MATMUL, h2, normal(b, S(8, 4)), 0, 0);
  op1(b, IR_OP_GELU, h2, 0, 0, 0, 0);
}
/* MoE renormalisation: w / sum(w, last, keepdim) */
static void c_p_renormalise(B *b) {
  IrNode *w = in(b, V_UNIFORM, 0.1, 1, S(dim(b, 2, 9), 2));
  op2(b, IR_OP_DIV, w, op1(b, IR_OP_SUM, w, 1, 1, 0, 0), 0, 0);
}
/* the prelude's logsumexp tail, z_j - log(p_j), and its square: one kernel */
static void c_p_log_sub(B *b) {
  int64_t n = dim(b, 2, 40);
  IrNode *lp = op1(b, IR_OP_LOG, in(b, V_UNIFORM, 0.2, 1, S(n, 1)), 0, 0, 0, 0);
  IrNode *l = op2(b, IR_OP_SUB, normal(b, S(n, 1)), lp, 0, 0);
  op2(b, IR_OP_MUL, l, l, 0, 0);
}
static void c_p_long_column(B *b) {
  op1(b, IR_OP_GELU, op2(b, IR_OP_ADD, normal(b, S(4, 3000)), normal(b, S(4, 3000)), 0, 0), 0, 0,
      0, 0);
  op1(b, IR_OP_EXP, normal(b, S(1, 4099)), 0, 0, 0, 0);
  op2(b, IR_OP_ADD, normal(b, S(3, 5000)), normal(b, S(5000)), 0, 0);
}
/* a reduction over two separated dims of a view: column index decomposed */
static void c_p_sum_to_views(B *b) {
  IrNode *t = op1(b, IR_OP_TRANSPOSE, normal(b, S(3, dim(b, 2, 4), 5)), 0, 2, 0, 0);
  shaped(b, IR_OP_SUM_TO, op1(b, IR_OP_SCALE, t, 0, 0, 0, 2), S(t->shape[1], 1), 0);
}
/* a row op whose input is a view */
static void c_p_row_views(B *b) {
  IrNode *x = op1(b, IR_OP_MERGE_HEADS, normal(b, S(2, 3, dim(b, 1, 5), 4)), 0, 0, 0, 0);
  IrNode *w = in(b, V_NORMAL, 0.5, 1, S(12));
  op3(b, IR_OP_LAYERNORM, x, w, normal(b, S(12)), 0, 1e-5);
  op1(b, IR_OP_SOFTMAX, op1(b, IR_OP_TRANSPOSE, normal(b, S(3, 7)), 0, 1, 0, 0), 0, 0, 0, 0);
}

/* ---- the case table ------------------------------------------------------------------------------ */

typedef struct {
  const char *name;
  void (*fn)(B *);
  double tol;
  int fused_kernels;  /* kernels left by fusion; -1: not checked */
} Case;

static const Case cases[] = {
    {"add_bcast", c_add_bcast, 1e-6, -1},
    {"add_both_bcast", c_add_both_bcast, 1e-6, -1},
    {"add_ones", c_add_ones, 1e-6, -1},
    {"add_scalar", c_add_scalar, 1e-6, -1},
    {"sub_bcast", c_sub_bcast, 1e-6, -1},
    {"mul_bcast", c_mul_bcast, 1e-6, -1},
    {"mul_self", c_mul_self, 1e-6, -1},
    {"div_bcast", c_div_bcast, 1e-6, -1},
    {"scale", c_scale, 1e-6, -1},
    {"gelu", c_gelu, 1e-5, -1},
    {"silu", c_silu, 1e-5, -1},
    {"relu", c_relu, 1e-6, -1},
    {"exp", c_exp, 1e-5, -1},
    {"log", c_log, 1e-6, -1},
    {"gelu_grad", c_gelu_grad, 1e-5, -1},
    {"silu_grad", c_silu_grad, 1e-5, -1},
    {"relu_grad", c_relu_grad, 1e-6, -1},
    {"layer_norm", c_layer_norm, 1e-5, -1},
    {"layer_norm_1d", c_layer_norm_1d, 1e-5, -1},
    {"rms_norm", c_rms_norm, 1e-5, -1},
    {"softmax", c_softmax, 1e-5, -1},
    {"softmax_wide", c_softmax_wide, 1e-5, -1},
    /* dx subtracts two means from g: cancellation */
    {"layer_norm_grad", c_layer_norm_grad, 3e-5, -1},
    {"rms_norm_grad", c_rms_norm_grad, 3e-5, -1},
    {"layer_norm_wgrad", c_layer_norm_wgrad, 1e-5, -1},
    {"rms_norm_wgrad", c_rms_norm_wgrad, 1e-5, -1},
    {"softmax_grad", c_softmax_grad, 3e-5, 2},
    /* angle error ~1e-7 * t for t < 64 */
    {"rope", c_rope, 2e-5, -1},
    {"rope_llama3", c_rope_llama3, 2e-5, -1},
    {"rope_grad", c_rope_grad, 2e-5, -1},
    /* positions to 4096: 1.9e-5 measured; f32 angles as Hugging Face computes
     * them (t * inv_freq in f32, exact sin/cos) give 1.4e-5 */
    {"rope_long", c_rope_long, 5e-5, -1},
    {"reshape", c_reshape, 0, -1},
    {"reshape_i32", c_reshape_i32, 0, -1},
    {"split_heads", c_split_heads, 0, -1},
    {"merge_heads", c_merge_heads, 0, -1},
    {"transpose", c_transpose, 0, -1},
    {"transpose_i32", c_transpose_i32, 0, -1},
    {"concat_first", c_concat_first, 0, -1},
    {"concat_mid", c_concat_mid, 0, -1},
    {"concat_last", c_concat_last, 0, -1},
    {"concat_i32", c_concat_i32, 0, -1},
    {"slice_first", c_slice_first, 0, -1},
    {"slice_mid", c_slice_mid, 0, -1},
    {"slice_last", c_slice_last, 0, -1},
    {"slice_i32", c_slice_i32, 0, -1},
    {"broadcast", c_broadcast, 0, -1},
    {"broadcast_scalar", c_broadcast_scalar, 0, -1},
    {"fill", c_fill, 0, -1},
    {"sum_to", c_sum_to, 1e-6, -1},
    {"sum", c_sum, 1e-6, -1},
    {"mean", c_mean, 1e-6, -1},
    {"sumsq", c_sumsq, 1e-6, -1},
    {"grad_norm", c_grad_norm, 1e-6, -1},
    {"clip_coef", c_clip_coef, 1e-6, -1},
    {"bias_correction", c_bias_correction, 1e-6, -1},
    {"adam_moment", c_adam_moment, 1e-6, -1},
    {"weight_decay", c_weight_decay, 1e-6, -1},
    {"adam_update", c_adam_update, 1e-6, -1},
    {"sgd", c_sgd, 1e-6, -1},
    {"p_bias_gelu", c_p_bias_gelu, 1e-5, 1},
    {"p_residual_ln", c_p_residual_ln, 1e-5, 2},
    {"p_swiglu", c_p_swiglu, 1e-5, 1},
    {"p_softmax_prologue", c_p_softmax_prologue, 1e-5, 1},
    {"p_softmax_epilogue", c_p_softmax_epilogue, 1e-5, 1},
    {"p_ln_grad_epilogue", c_p_ln_grad_epilogue, 3e-5, 1},
    {"p_ln_backward", c_p_ln_backward, 3e-5, 2},
    {"p_adamw", c_p_adamw, 1e-5, 4},
    {"p_inplace_transpose", c_p_inplace_transpose, 1e-6, 1},
    {"p_inplace_late_reader", c_p_inplace_late_reader, 1e-6, 2},
    {"p_inplace_value_reader", c_p_inplace_value_reader, 1e-6, 1},
    {"p_inplace_reduce", c_p_inplace_reduce, 1e-6, 1},
    {"p_concat_views", c_p_concat_views, 0, 1},
    {"p_rope_views", c_p_rope_views, 2e-5, 1},
    {"p_rope_grad_merge", c_p_rope_grad_merge, 2e-5, 1},
    {"p_sum_to_prologue", c_p_sum_to_prologue, 1e-6, 1},
    {"p_reduce_views", c_p_reduce_views, 1e-5, 1},
    {"p_reshape_root", c_p_reshape_root, 1e-5, 1},
    {"p_transpose_chain", c_p_transpose_chain, 1e-5, 1},
    {"p_fanout", c_p_fanout, 1e-5, 1},
    {"p_runtime_reader", c_p_runtime_reader, 1e-5, 3},
    {"p_renormalise", c_p_renormalise, 1e-6, 2},
    {"p_log_sub", c_p_log_sub, 1e-6, 1},
    {"p_long_column", c_p_long_column, 1e-5, 3},
    {"p_sum_to_views", c_p_sum_to_views, 1e-6, 1},
    {"p_row_views", c_p_row_views, 1e-5, 2},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

/* Updates the plans write in place (cg_kernels.h), unfused and fused (0 for
 * every case not listed), and the copies train.c then ends its step with
 * (-1: not checked; the host reads only PARAM and STATE leaves here). */
static const struct {
  const char *name;
  int inplace[2], copies[2];
} inplace_counts[] = {
    {"p_adamw", {3, 3}, {-1, -1}},
    {"p_inplace_transpose", {1, 0}, {0, 1}},
    {"p_inplace_late_reader", {1, 1}, {1, 1}}, /* s's update; p's is copied */
    {"p_inplace_value_reader", {1, 1}, {-1, -1}},
    {"p_inplace_reduce", {0, 0}, {-1, -1}},
};

/* The update copies at the end of train.c's step (codegen/host.c) for plan
 * kp: statements memcpy(P + ..) or memcpy(S + ..); -1 if the host C cannot
 * be written. */
static int host_copies(IrModule *m, const CgKernelPlan *kp) {
  int *pos = arena_alloc(&m->arena, sizeof(int) * (size_t)(m->nnodes + 1));
  for (int i = 0; i < m->nnodes; i++)
    pos[i] = kp->kernel_of[i] >= 0 ? kp->kernels[kp->kernel_of[i]].root : i;
  BufPlan bp;
  bufplan_build(m, kp->materialize, cg_results(m), pos, &bp);
  CgLeafPlan lp;
  cg_plan_leaves(m, &lp);
  CgHostInfo info = {"case.dsl", "test", 0, NULL, NULL, NULL, NULL, NULL};
  FILE *f = tmpfile();
  char err[512], line[1024];
  if (!f) return -1;
  int n = -1;
  if (cg_emit_host(f, m, kp, &bp, &lp, &info, err, sizeof err) == 0) {
    n = 0;
    rewind(f);
    while (fgets(line, sizeof line, f))
      n += !strncmp(line, "  memcpy(P + ", 13) || !strncmp(line, "  memcpy(S + ", 13);
  } else {
    printf("     host: %s\n", err);
  }
  fclose(f);
  return n;
}

/* ---- running ------------------------------------------------------------------------------------- */

static void build(const Case *c, B *b, uint64_t seed) {
  memset(b, 0, sizeof *b);
  b->m = ir_module_new(c->name);
  b->rng.s = seed;
  c->fn(b);
}

static void fill_leaves(B *b, IrInterp *it) {
  for (int s = 0; s < b->nspec; s++) {
    const Spec *sp = &b->spec[s];
    const IrNode *n = b->m->nodes[sp->id];
    for (int64_t e = 0; e < ir_numel(n); e++) {
      double v = 0;
      switch (sp->kind) {
      case V_NORMAL: v = sp->a * cg_normal(&b->rng) + sp->b; break;
      case V_UNIFORM: v = cg_uniform(&b->rng, sp->a, sp->b); break;
      case V_AWAY:
        v = cg_uniform(&b->rng, sp->a, sp->b) * (cg_randint(&b->rng, 2) ? 1 : -1);
        break;
      case V_IDS: it->i[sp->id][e] = (int32_t)cg_randint(&b->rng, (int64_t)sp->a); continue;
      case V_CONST: v = sp->a; break;
      }
      it->f[sp->id][e] = (double)(float)v;  /* both sides see the same f32 inputs */
    }
  }
}

static int run_case(const Case *c, int verbose) {
  B b;
  build(c, &b, 0x9e3779b97f4a7c15ull ^ (uint64_t)(c - cases + 1) * 0x100000001b3ull);
  IrModule *m = b.m;
  IrInterp *ref = ir_interp_new(m);
  fill_leaves(&b, ref);
  char err[512];
  int fails = 0;
  if (ir_interp_run(ref, 0, m->nnodes, err, sizeof err)) {
    printf("FAIL %s: interpreter: %s\n", c->name, err);
    return 1;
  }
  CgKernelPlan plan[2];
  CgBufs bufs[2];
  memset(bufs, 0, sizeof bufs);
  double worst[2] = {0, 0};
  for (int fuse = 0; fuse < 2; fuse++) {
    CgLib lib;
    if (cg_plan_kernels(m, fuse, NULL, &plan[fuse], err, sizeof err) ||
        cg_lib_open(&lib, plan[fuse].km, err, sizeof err) ||
        cg_execute(m, &plan[fuse], &lib, ref, &bufs[fuse], err, sizeof err)) {
      printf("FAIL %s (fuse=%d): %s\n", c->name, fuse, err);
      if (verbose && plan[fuse].km) kir_print(stdout, plan[fuse].km);
      return 1;
    }
    if (verbose) kir_print(stdout, plan[fuse].km);
    cg_lib_close(&lib);
    for (int i = 0; i < m->nnodes; i++) {
      const IrNode *n = m->nodes[i];
      if ((!plan[fuse].materialize[i] && plan[fuse].inplace_of[i] < 0) ||
          plan[fuse].kernel_of[i] < 0)
        continue;
      double e;
      if (n->dtype == IR_I32) {
        e = 0;
        for (int64_t j = 0; j < ir_numel(n); j++) e += bufs[fuse].i[i][j] != ref->i[i][j];
      } else {
        e = cg_rel_l2(bufs[fuse].f[i], ref->f[i], ir_numel(n));
      }
      if (e > worst[fuse] || e != e) worst[fuse] = e;
      if (!(e <= c->tol)) {
        printf("FAIL %s (fuse=%d): %%%d (%s) rel L2 %.3g > %.3g\n", c->name, fuse, i,
               ir_op_info[n->op].name, e, c->tol);
        fails++;
      }
    }
  }
  /* fused and unfused agree wherever both materialise a value */
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *n = m->nodes[i];
    if (!bufs[0].f[i] || !bufs[1].f[i] || plan[0].kernel_of[i] < 0) continue;
    double e = cg_rel_l2_ff(bufs[1].f[i], bufs[0].f[i], ir_numel(n));
    if (!(e <= 2 * c->tol + 1e-6)) {
      printf("FAIL %s: fused and unfused differ at %%%d (%s): %.3g\n", c->name, i,
             ir_op_info[n->op].name, e);
      fails++;
    }
  }
  for (int f = 0; f < 2; f++) {
    int inplace = 0, want = 0, copies = -1;
    for (int i = 0; i < m->nnodes; i++) inplace += plan[f].inplace_of[i] >= 0;
    for (size_t k = 0; k < sizeof inplace_counts / sizeof inplace_counts[0]; k++)
      if (!strcmp(inplace_counts[k].name, c->name))
        want = inplace_counts[k].inplace[f], copies = inplace_counts[k].copies[f];
    if (inplace != want) {
      printf("FAIL %s (fuse=%d): %d updates written in place, expected %d\n", c->name, f,
             inplace, want);
      fails++;
    }
    int got = copies >= 0 ? host_copies(m, &plan[f]) : -1;
    if (got != copies) {
      printf("FAIL %s (fuse=%d): train.c copies %d updates, expected %d\n", c->name, f, got,
             copies);
      fails++;
    }
  }
  if (c->fused_kernels >= 0 && plan[1].nkernels != c->fused_kernels) {
    printf("FAIL %s: fusion left %d kernels, expected %d\n", c->name, plan[1].nkernels,
           c->fused_kernels);
    fails++;
  }
  printf("%s %s: %d kernels unfused, %d fused; max rel L2 %.2e / %.2e (tol %.0e)\n",
         fails ? "FAIL" : "ok  ", c->name, plan[0].nkernels, plan[1].nkernels, worst[0], worst[1],
         c->tol);
  for (int f = 0; f < 2; f++) {
    cg_bufs_free(&bufs[f]);
    cg_plan_free(&plan[f]);
  }
  ir_interp_free(ref);
  ir_module_free(m);
  return fails != 0;
}

/* Every op that lowers to KIR appears in some case's module. */
static int coverage(void) {
  int seen[IR_OP_COUNT] = {0}, missing = 0;
  for (int c = 0; c < NCASES; c++) {
    B b;
    build(&cases[c], &b, 1);
    for (int i = 0; i < b.m->nnodes; i++) seen[b.m->nodes[i]->op] = 1;
    ir_module_free(b.m);
  }
  for (int op = 0; op < IR_OP_COUNT; op++)
    if (cg_kernel_op((IrOp)op) && !seen[op]) {
      printf("FAIL: no codegen case for op %s\n", ir_op_info[op].name);
      missing++;
    }
  int nk = 0;
  for (int op = 0; op < IR_OP_COUNT; op++) nk += cg_kernel_op((IrOp)op);
  printf("%s: %d of %d ops lower to KIR, %d without a case\n", missing ? "FAIL" : "ok  ", nk,
         IR_OP_COUNT, missing);
  return missing != 0;
}

int main(int argc, char **argv) {
  int verbose = argc > 2 && !strcmp(argv[2], "-v");
  if (argc > 1 && !strcmp(argv[1], "--list")) {
    for (int c = 0; c < NCASES; c++) printf("%s\n", cases[c].name);
    return 0;
  }
  if (argc > 1 && !strcmp(argv[1], "--coverage")) return coverage();
  int fails = 0, ran = 0;
  for (int c = 0; c < NCASES; c++) {
    if (argc > 1 && strcmp(argv[1], cases[c].name)) continue;
    fails += run_case(&cases[c], verbose);
    ran++;
  }
  if (!ran) {
    fprintf(stderr, "cg_ops: no case '%s' (--list)\n", argv[1]);
    return 2;
  }
  return fails != 0;
}
