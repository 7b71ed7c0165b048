/* ir/shape.c -- shape and dtype inference, one case per op (ORDER-OPS).
 *
 * ir_infer is the single definition of every op's typing rule: the frontend
 * calls it when it builds a node and ir_verify calls it again to check that
 * no pass left a node with a stale shape. */
#include <stdarg.h>
#include <string.h>

#include "ir/ir.h"

static int fail(char *why, size_t len, const IrNode *n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(char *why, size_t len, const IrNode *n, const char *fmt, ...) {
  size_t k = (size_t)snprintf(why, len, "%s: ", ir_op_info[n->op].name);
  if (k >= len) return 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why + k, len - k, fmt, ap);
  va_end(ap);
  return 0;
}

static void set(IrNode *n, IrDType dt, int rank, const int64_t *shape) {
  n->dtype = dt;
  n->rank = rank;
  memmove(n->shape, shape, sizeof(int64_t) * (size_t)rank);
}

#define T(i, buf) ir_type_str(n->inputs[i], buf, sizeof buf)

/* Checks the dtype of input i. */
static int want(char *why, size_t len, IrNode *n, int i, IrDType dt) {
  if (n->inputs[i]->dtype == dt) return 1;
  char a[160];
  return fail(why, len, n, "operand %d must be %s, got %s", i + 1, ir_dtype_name[dt], T(i, a));
}

static int64_t last(const IrNode *x) { return x->shape[x->rank - 1]; }

static int broadcast(IrNode *n, char *why, size_t len) {
  const IrNode *a = n->inputs[0], *b = n->inputs[1];
  int r = a->rank > b->rank ? a->rank : b->rank;
  int64_t s[IR_MAX_RANK];
  for (int i = 0; i < r; i++) {
    int ia = a->rank - r + i, ib = b->rank - r + i;
    int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
    if (da != db && da != 1 && db != 1) {
      char x[160], y[160];
      return fail(why, len, n, "shapes do not broadcast: %s and %s (dimension %d: %lld vs %lld)",
                  T(0, x), T(1, y), i, (long long)da, (long long)db);
    }
    s[i] = da == 1 ? db : da;
  }
  set(n, IR_F32, r, s);
  return 1;
}

/* matmul and matmul_ta: a[..., m, k] (matmul_ta: a[..., k, m]) times
 * b[..., k, n] (transpose_b: b[..., n, k]); b is rank 2 or batched like a. */
static int infer_matmul(IrNode *n, int ta, char *why, size_t len) {
  const IrNode *a = n->inputs[0], *b = n->inputs[1];
  char x[160], y[160];
  if (a->rank < 2 || b->rank < 2)
    return fail(why, len, n, "operands need rank >= 2, got %s and %s", T(0, x), T(1, y));
  if (b->rank > 2 && b->rank != a->rank)
    return fail(why, len, n, "batched operand %s does not match %s", T(1, y), T(0, x));
  for (int i = 0; b->rank > 2 && i < b->rank - 2; i++)
    if (a->shape[i] != b->shape[i])
      return fail(why, len, n, "batch dimensions differ: %s and %s", T(0, x), T(1, y));
  int tb = n->ia[0] != 0;
  int64_t k = a->shape[a->rank - (ta ? 2 : 1)], m = a->shape[a->rank - (ta ? 1 : 2)];
  int64_t kb = b->shape[b->rank - (tb ? 1 : 2)], nn = b->shape[b->rank - (tb ? 2 : 1)];
  if (k != kb)
    return fail(why, len, n, "inner dimensions differ: %s%s @ %s%s (%lld vs %lld)", T(0, x),
                ta ? " (transposed)" : "", T(1, y), tb ? " (transposed)" : "", (long long)k,
                (long long)kb);
  int64_t s[IR_MAX_RANK];
  memcpy(s, a->shape, sizeof s);
  s[a->rank - 2] = m;
  s[a->rank - 1] = nn;
  set(n, IR_F32, a->rank, s);
  return 1;
}

/* The mesh axis and group size of the vocabulary-parallel ops, in ia[k] and
 * ia[k + 1]. */
static int group_ok(IrNode *n, int k, char *why, size_t len) {
  if (n->ia[k] < 0 || n->ia[k] > 1)
    return fail(why, len, n, "mesh axis %lld is not 0 (tp) or 1 (dp)", (long long)n->ia[k]);
  if (n->ia[k + 1] < 1 || n->ia[k + 1] > 65536)
    return fail(why, len, n, "group size %lld out of range", (long long)n->ia[k + 1]);
  return 1;
}

/* vocab_cross_entropy(_grad)'s true vocabulary (ia[2]) against the group's
 * columns: 1 <= vocab <= Vl * size (the rest are padding). */
static int vocab_ok(IrNode *n, const IrNode *logits, char *why, size_t len) {
  int64_t cols = logits->rank ? logits->shape[logits->rank - 1] * n->ia[1] : 0;
  if (n->ia[2] < 1 || n->ia[2] > cols)
    return fail(why, len, n, "vocab %lld outside [1, %lld], the group's columns",
                (long long)n->ia[2], (long long)cols);
  return 1;
}

static int axis_ok(IrNode *n, int64_t axis, int rank, char *why, size_t len) {
  if (axis >= 0 && axis < rank) return 1;
  return fail(why, len, n, "axis %lld out of range for rank %d", (long long)axis, rank);
}

/* The node's own shape (fill, broadcast, sum_to) must be a valid shape. */
static int own_shape_ok(IrNode *n, char *why, size_t len) {
  if (n->rank < 0 || n->rank > IR_MAX_RANK) return fail(why, len, n, "target rank out of range");
  int64_t k = 1;
  for (int i = 0; i < n->rank; i++) {
    if (n->shape[i] < 1 || n->shape[i] > IR_MAX_DIM || k > INT64_MAX / n->shape[i])
      return fail(why, len, n, "target dimension %d out of range", i);
    k *= n->shape[i];
  }
  return 1;
}

/* Whether shape (r, s) numpy-broadcasts to (rb, sb). */
static int broadcasts_to(int r, const int64_t *s, int rb, const int64_t *sb) {
  if (r > rb) return 0;
  for (int i = 0; i < r; i++) {
    int64_t d = s[i], db = sb[rb - r + i];
    if (d != db && d != 1) return 0;
  }
  return 1;
}

/* All inputs in [from, to) have the shape of input `ref`. */
static int same_as(IrNode *n, int ref, int from, int to, char *why, size_t len) {
  char x[160], y[160];
  for (int i = from; i < to; i++)
    if (!ir_same_shape(n->inputs[i], n->inputs[ref]))
      return fail(why, len, n, "operand %d %s must have the shape of operand %d %s", i + 1,
                  T(i, x), ref + 1, T(ref, y));
  return 1;
}

/* q[B,H,T,hd], k and v [B,KV,T,hd], H a multiple of KV; or, with
 * IR_SDPA_QKV_TOKENS, the packed [B, T, H + 2 KV, hd] as all three, KV in
 * ia[2] (ir.h). */
static int attention_operands(IrNode *n, char *why, size_t len) {
  IrNode *a = n->inputs[0], *b = n->inputs[1], *v = n->inputs[2];
  char x[160], y[160];
  for (int i = 0; i < n->ninputs; i++)
    if (!want(why, len, n, i, IR_F32)) return 0;
  if (n->ia[1] & IR_SDPA_QKV_TOKENS) {
    const int64_t kv = n->ia[2];
    if (a != b || a != v || a->rank != 4)
      return fail(why, len, n, "packed q|k|v must be one [batch, seq, heads, head_dim] operand "
                  "given three times, got %s and %s", T(0, x), T(1, y));
    if (kv < 1 || a->shape[2] - 2 * kv < 1 || (a->shape[2] - 2 * kv) % kv)
      return fail(why, len, n, "packed q|k|v %s: %lld kv heads leave no multiple of them as "
                  "query heads", T(0, x), (long long)kv);
    return 1;
  }
  if (n->ia[2])
    return fail(why, len, n, "kv heads %lld given without packed q|k|v", (long long)n->ia[2]);
  if (a->rank != 4 || b->rank != 4 || v->rank != 4)
    return fail(why, len, n, "q, k, v must be [batch, heads, seq, head_dim], got %s and %s",
                T(0, x), T(1, y));
  if (!ir_same_shape(b, v))
    return fail(why, len, n, "k and v differ: %s and %s", T(1, x), T(2, y));
  if (a->shape[0] != b->shape[0] || a->shape[2] != b->shape[2] || a->shape[3] != b->shape[3])
    return fail(why, len, n, "q %s and k %s differ in batch, seq or head_dim", T(0, x),
                T(1, y));
  if (a->shape[1] % b->shape[1])
    return fail(why, len, n, "query heads %lld are not a multiple of kv heads %lld",
                (long long)a->shape[1], (long long)b->shape[1]);
  return 1;
}

/* sdpa / sdpa_grad: layout bits (ia[1], IR_SDPA_*) within allowed. */
static int sdpa_layout_ok(IrNode *n, int64_t allowed, char *why, size_t len) {
  if (!(n->ia[1] & ~allowed)) return 1;
  return fail(why, len, n, "layout bits %lld not understood (allowed: %lld)", (long long)n->ia[1],
              (long long)allowed);
}

/* dispatch / combine_grad_y attributes: experts and capacity. */
static int experts_ok(IrNode *n, char *why, size_t len) {
  if (n->ia[0] >= 1 && n->ia[1] >= 1 && n->ia[0] <= IR_MAX_DIM && n->ia[1] <= IR_MAX_DIM)
    return 1;
  return fail(why, len, n, "experts (%lld) and capacity (%lld) must be positive",
              (long long)n->ia[0], (long long)n->ia[1]);
}

/* Optimizer operands, all f32, one letter per operand in kinds: 't' a
 * tensor with the shape of operand 1, 's' a scalar. */
static int optim_operands(IrNode *n, const char *kinds, char *why, size_t len) {
  char x[160], y[160];
  for (int i = 0; i < n->ninputs; i++) {
    if (!want(why, len, n, i, IR_F32)) return 0;
    if (kinds[i] == 's' && n->inputs[i]->rank != 0)
      return fail(why, len, n, "operand %d must be a scalar, got %s", i + 1, T(i, x));
    if (kinds[i] == 't' && !ir_same_shape(n->inputs[i], n->inputs[0]))
      return fail(why, len, n, "operand %d %s must have the shape of operand 1 %s", i + 1,
                  T(i, x), T(0, y));
  }
  return 1;
}

/* A hyper-parameter attribute in [lo, hi) (hi_open) or [lo, hi]. */
static int fattr_in(IrNode *n, double lo, double hi, int hi_open, char *why, size_t len) {
  double v = n->fa;
  if (v >= lo && (hi_open ? v < hi : v <= hi)) return 1;
  return fail(why, len, n, "%s = %g is outside [%g, %g%c", ir_op_info[n->op].fattr, v, lo, hi,
              hi_open ? ')' : ']');
}

int ir_infer(IrNode *n, char *why, size_t len) {
  const IrOpInfo *info = &ir_op_info[n->op];
  char x[160], y[160];
  if (info->arity >= 0 ? n->ninputs != info->arity : n->ninputs < 1)
    return fail(why, len, n, "takes %d operand(s), got %d", info->arity, n->ninputs);
  for (int i = 0; i < n->ninputs; i++)
    if (n->inputs[i]->dtype != IR_F32 && n->inputs[i]->dtype != IR_I32)
      return fail(why, len, n, "operand %d has no valid type", i + 1);
  IrNode *a = n->ninputs > 0 ? n->inputs[0] : NULL;
  IrNode *b = n->ninputs > 1 ? n->inputs[1] : NULL;
  int64_t s[IR_MAX_RANK];

  switch (n->op) {
  case IR_OP_INPUT:
  case IR_OP_PARAM:
  case IR_OP_STATE:
    return 1; /* leaf types are declared, not inferred */

  case IR_OP_MATMUL:
    if (!want(why, len, n, 0, IR_F32) || !want(why, len, n, 1, IR_F32)) return 0;
    return infer_matmul(n, 0, why, len);

  case IR_OP_ADD: case IR_OP_SUB: case IR_OP_MUL: case IR_OP_DIV:
    if (!want(why, len, n, 0, IR_F32) || !want(why, len, n, 1, IR_F32)) return 0;
    return broadcast(n, why, len);

  case IR_OP_SCALE: case IR_OP_GELU: case IR_OP_SILU: case IR_OP_RELU: case IR_OP_EXP:
  case IR_OP_LOG: case IR_OP_SOFTMAX:
    if (!want(why, len, n, 0, IR_F32)) return 0;
    if (n->op == IR_OP_SOFTMAX && a->rank < 1)
      return fail(why, len, n, "needs rank >= 1, got %s", T(0, x));
    set(n, IR_F32, a->rank, a->shape);
    return 1;

  case IR_OP_LAYERNORM: case IR_OP_RMSNORM:
    for (int i = 0; i < n->ninputs; i++)
      if (!want(why, len, n, i, IR_F32)) return 0;
    if (a->rank < 1) return fail(why, len, n, "needs rank >= 1, got %s", T(0, x));
    for (int i = 1; i < n->ninputs; i++)
      if (n->inputs[i]->rank != 1 || n->inputs[i]->shape[0] != last(a))
        return fail(why, len, n, "gain/bias %s does not match the last dimension of %s",
                    ir_type_str(n->inputs[i], y, sizeof y), T(0, x));
    set(n, IR_F32, a->rank, a->shape);
    return 1;

  case IR_OP_ATTENTION: {
    if (!sdpa_layout_ok(n, IR_SDPA_OUT_TOKENS | IR_SDPA_QKV_TOKENS, why, len) ||
        !attention_operands(n, why, len))
      return 0;
    const IrSdpaDims d = ir_sdpa_dims(n);
    if (n->ia[1] & IR_SDPA_OUT_TOKENS) { /* [B, T, H hd] */
      s[0] = d.B, s[1] = d.T, s[2] = d.H * d.hd;
      set(n, IR_F32, 3, s);
    } else {
      s[0] = d.B, s[1] = d.H, s[2] = d.T, s[3] = d.hd;
      set(n, IR_F32, 4, s);
    }
    return 1;
  }

  case IR_OP_ROPE:
  case IR_OP_ROPE_GRAD: /* the inverse rotation: same typing */
    if (!want(why, len, n, 0, IR_F32)) return 0;
    if (a->rank != 4 || a->shape[3] % 2)
      return fail(why, len, n, "needs [batch, heads, seq, head_dim] with even head_dim, got %s",
                  T(0, x));
    set(n, IR_F32, 4, a->shape);
    return 1;

  case IR_OP_EMBEDDING: case IR_OP_VOCAB_EMBEDDING:
    if (n->op == IR_OP_VOCAB_EMBEDDING && !group_ok(n, 0, why, len)) return 0;
    if (!want(why, len, n, 0, IR_I32) || !want(why, len, n, 1, IR_F32)) return 0;
    if (b->rank != 2) return fail(why, len, n, "table must be [vocab, dim], got %s", T(1, y));
    if (a->rank + 1 > IR_MAX_RANK) return fail(why, len, n, "result rank too large");
    memcpy(s, a->shape, sizeof s);
    s[a->rank] = b->shape[1];
    set(n, IR_F32, a->rank + 1, s);
    return 1;

  case IR_OP_RESHAPE: {
    /* the target shape is the node's own shape, set by the builder */
    int64_t k = 1;
    for (int i = 0; i < n->rank; i++) k *= n->shape[i];
    if (k != ir_numel(a))
      return fail(why, len, n, "%s has %lld elements, target has %lld", T(0, x),
                  (long long)ir_numel(a), (long long)k);
    n->dtype = a->dtype;
    return 1;
  }

  case IR_OP_SPLIT_HEADS:
    if (a->rank != 3) return fail(why, len, n, "needs [batch, seq, width], got %s", T(0, x));
    if (n->ia[0] < 1 || a->shape[2] % n->ia[0])
      return fail(why, len, n, "width %lld is not divisible by %lld heads",
                  (long long)a->shape[2], (long long)n->ia[0]);
    s[0] = a->shape[0], s[1] = n->ia[0], s[2] = a->shape[1], s[3] = a->shape[2] / n->ia[0];
    set(n, a->dtype, 4, s);
    return 1;

  case IR_OP_MERGE_HEADS:
    if (a->rank != 4)
      return fail(why, len, n, "needs [batch, heads, seq, head_dim], got %s", T(0, x));
    s[0] = a->shape[0], s[1] = a->shape[2], s[2] = a->shape[1] * a->shape[3];
    set(n, a->dtype, 3, s);
    return 1;

  case IR_OP_TRANSPOSE:
    if (!axis_ok(n, n->ia[0], a->rank, why, len) || !axis_ok(n, n->ia[1], a->rank, why, len))
      return 0;
    memcpy(s, a->shape, sizeof s);
    s[n->ia[0]] = a->shape[n->ia[1]];
    s[n->ia[1]] = a->shape[n->ia[0]];
    set(n, a->dtype, a->rank, s);
    return 1;

  case IR_OP_CONCAT: {
    if (!axis_ok(n, n->ia[0], a->rank, why, len)) return 0;
    memcpy(s, a->shape, sizeof s);
    for (int i = 1; i < n->ninputs; i++) {
      IrNode *c = n->inputs[i];
      int ok = c->rank == a->rank && c->dtype == a->dtype;
      for (int d = 0; ok && d < a->rank; d++)
        ok = d == n->ia[0] || c->shape[d] == a->shape[d];
      if (!ok) return fail(why, len, n, "%s does not fit %s", T(i, y), T(0, x));
      s[n->ia[0]] += c->shape[n->ia[0]];
      if (s[n->ia[0]] > IR_MAX_DIM) return fail(why, len, n, "result dimension too large");
    }
    set(n, a->dtype, a->rank, s);
    return 1;
  }

  case IR_OP_SLICE:
    if (!axis_ok(n, n->ia[0], a->rank, why, len)) return 0;
    if (n->ia[1] < 0 || n->ia[2] < 1 || n->ia[1] > a->shape[n->ia[0]] - n->ia[2])
      return fail(why, len, n, "[%lld, %lld) is outside dimension %lld of %s",
                  (long long)n->ia[1], (long long)(n->ia[1] + n->ia[2]), (long long)n->ia[0],
                  T(0, x));
    memcpy(s, a->shape, sizeof s);
    s[n->ia[0]] = n->ia[2];
    set(n, a->dtype, a->rank, s);
    return 1;

  case IR_OP_SUM: case IR_OP_MEAN: {
    if (!want(why, len, n, 0, IR_F32) || !axis_ok(n, n->ia[0], a->rank, why, len)) return 0;
    int r = 0;
    for (int i = 0; i < a->rank; i++) {
      if (i != n->ia[0]) s[r++] = a->shape[i];
      else if (n->ia[1]) s[r++] = 1;
    }
    set(n, IR_F32, r, s);
    return 1;
  }

  case IR_OP_CROSS_ENTROPY: case IR_OP_VOCAB_CROSS_ENTROPY:
    if (n->op == IR_OP_VOCAB_CROSS_ENTROPY &&
        (!group_ok(n, 0, why, len) || !vocab_ok(n, a, why, len)))
      return 0;
    if (!want(why, len, n, 0, IR_F32) || !want(why, len, n, 1, IR_I32)) return 0;
    if (a->rank != b->rank + 1 || a->rank < 2)
      return fail(why, len, n, "logits %s and targets %s: logits need one more dimension",
                  T(0, x), T(1, y));
    for (int i = 0; i < b->rank; i++)
      if (a->shape[i] != b->shape[i])
        return fail(why, len, n, "logits %s and targets %s differ in dimension %d", T(0, x),
                    T(1, y), i);
    set(n, IR_F32, 0, s);
    return 1;

  case IR_OP_TOPK:
    if (!want(why, len, n, 0, IR_F32)) return 0;
    if (a->rank < 1 || n->ia[0] < 1 || n->ia[0] > last(a))
      return fail(why, len, n, "k = %lld must be in [1, %lld] for %s", (long long)n->ia[0],
                  (long long)(a->rank ? last(a) : 0), T(0, x));
    memcpy(s, a->shape, sizeof s);
    s[a->rank - 1] = n->ia[0];
    set(n, IR_I32, a->rank, s);
    return 1;

  case IR_OP_GATHER:
    if (!want(why, len, n, 0, IR_F32) || !want(why, len, n, 1, IR_I32)) return 0;
    if (a->rank != b->rank || a->rank < 1)
      return fail(why, len, n, "%s and indices %s need the same rank", T(0, x), T(1, y));
    for (int i = 0; i < a->rank - 1; i++)
      if (a->shape[i] != b->shape[i])
        return fail(why, len, n, "%s and indices %s differ in dimension %d", T(0, x), T(1, y), i);
    set(n, IR_F32, b->rank, b->shape);
    return 1;

  case IR_OP_ONEHOT:
    if (!want(why, len, n, 0, IR_I32)) return 0;
    if (n->ia[0] < 1 || a->rank + 1 > IR_MAX_RANK)
      return fail(why, len, n, "bad class count %lld for %s", (long long)n->ia[0], T(0, x));
    memcpy(s, a->shape, sizeof s);
    s[a->rank] = n->ia[0];
    set(n, IR_F32, a->rank + 1, s);
    return 1;

  case IR_OP_DISPATCH:
    if (!want(why, len, n, 0, IR_F32) || !want(why, len, n, 1, IR_I32)) return 0;
    if (a->rank != 2 || b->rank != 2 || a->shape[0] != b->shape[0])
      return fail(why, len, n, "needs tokens [n, d] and choices [n, k], got %s and %s", T(0, x),
                  T(1, y));
    if (!experts_ok(n, why, len)) return 0;
    s[0] = n->ia[0], s[1] = n->ia[1], s[2] = a->shape[1];
    set(n, IR_F32, 3, s);
    return 1;

  case IR_OP_COMBINE: {
    IrNode *w = n->inputs[2];
    if (!want(why, len, n, 0, IR_F32) || !want(why, len, n, 1, IR_I32) ||
        !want(why, len, n, 2, IR_F32))
      return 0;
    if (a->rank != 3 || b->rank != 2 || !ir_same_shape(b, w))
      return fail(why, len, n, "needs experts [e, c, d], choices [n, k] and weights [n, k]");
    s[0] = b->shape[0], s[1] = a->shape[2];
    set(n, IR_F32, 2, s);
    return 1;
  }

  case IR_OP_CAPACITY_DROP:
    if (!want(why, len, n, 0, IR_I32)) return 0;
    if (a->rank != 2 || !experts_ok(n, why, len) || n->ia[2] < 1 || n->ia[2] > 65536)
      return fail(why, len, n, "needs choices [n, k], experts, capacity and a group size, got %s",
                  T(0, x));
    set(n, IR_I32, 2, a->shape);
    return 1;

  case IR_OP_EXPERT_ALL_TO_ALL: {
    /* (x [E, C, ...], idx [N, k]) -> [E / size, size C, ...]; back: the inverse */
    if (!want(why, len, n, 0, IR_F32) || !want(why, len, n, 1, IR_I32)) return 0;
    int64_t g = n->ia[1];
    if (a->rank < 2 || b->rank != 2 || n->ia[0] != 2 || g < 1 || g > 65536)
      return fail(why, len, n, "needs slots [e, c, ...], choices [n, k], axis 2 and a group "
                  "size, got %s and %s", T(0, x), T(1, y));
    memcpy(s, a->shape, sizeof s);
    if (!n->ia[2] && (a->shape[0] % g || a->shape[1] > IR_MAX_DIM / g))
      return fail(why, len, n, "%lld experts do not split over %lld ranks",
                  (long long)a->shape[0], (long long)g);
    if (n->ia[2] && (a->shape[1] % g || a->shape[0] > IR_MAX_DIM / g))
      return fail(why, len, n, "%lld slots do not split over %lld ranks", (long long)a->shape[1],
                  (long long)g);
    s[0] = n->ia[2] ? a->shape[0] * g : a->shape[0] / g;
    s[1] = n->ia[2] ? a->shape[1] / g : a->shape[1] * g;
    set(n, IR_F32, a->rank, s);
    return 1;
  }

  case IR_OP_FILL:
    if (!own_shape_ok(n, why, len)) return 0;
    n->dtype = IR_F32;
    return 1;

  case IR_OP_BROADCAST: case IR_OP_SUM_TO: {
    if (!want(why, len, n, 0, IR_F32) || !own_shape_ok(n, why, len)) return 0;
    int down = n->op == IR_OP_SUM_TO;
    int ok = down ? broadcasts_to(n->rank, n->shape, a->rank, a->shape)
                  : broadcasts_to(a->rank, a->shape, n->rank, n->shape);
    if (!ok) {
      IrNode t = *n;
      t.dtype = IR_F32;
      ir_type_str(&t, y, sizeof y);
      if (down) return fail(why, len, n, "target %s does not broadcast to %s", y, T(0, x));
      return fail(why, len, n, "%s does not broadcast to target %s", T(0, x), y);
    }
    n->dtype = IR_F32;
    return 1;
  }

  case IR_OP_ALL_REDUCE: case IR_OP_GROUP_COPY:
  case IR_OP_ALL_GATHER: case IR_OP_REDUCE_SCATTER:
  case IR_OP_LOCAL_SLICE: case IR_OP_REPLICATE: {
    int gather = n->op == IR_OP_ALL_GATHER || n->op == IR_OP_REPLICATE;
    int scatter = n->op == IR_OP_REDUCE_SCATTER || n->op == IR_OP_LOCAL_SLICE;
    if (!want(why, len, n, 0, IR_F32)) return 0;
    /* all_reduce also runs over ep (2) and ep_dp (3): expert gradients and norms;
     * all_gather and reduce_scatter over ep_dp: ZeRO-1 pieces of expert tensors */
    int64_t ax = n->ia[0];
    int ar = n->op == IR_OP_ALL_REDUCE, ep_dp = ar || n->op == IR_OP_ALL_GATHER ||
                                                 n->op == IR_OP_REDUCE_SCATTER;
    if (!(ax == 0 || ax == 1 || (ax == 2 && ar) || (ax == 3 && ep_dp)))
      return fail(why, len, n, "mesh axis %lld is not one it runs over (0 tp, 1 dp%s)",
                  (long long)ax, ar ? ", 2 ep, 3 ep_dp" : ep_dp ? ", 3 ep_dp" : "");
    if (n->ia[1] < 1 || n->ia[1] > 65536)
      return fail(why, len, n, "group size %lld out of range", (long long)n->ia[1]);
    memcpy(s, a->shape, sizeof s);
    if (gather || scatter) {
      if (!axis_ok(n, n->ia[2], a->rank, why, len)) return 0;
      int64_t d = a->shape[n->ia[2]];
      if (scatter && d % n->ia[1])
        return fail(why, len, n, "dimension %lld of %s is not divisible by %lld ranks",
                    (long long)n->ia[2], T(0, x), (long long)n->ia[1]);
      if (gather && d > IR_MAX_DIM / n->ia[1])
        return fail(why, len, n, "result dimension too large");
      s[n->ia[2]] = gather ? d * n->ia[1] : d / n->ia[1];
    }
    set(n, IR_F32, a->rank, s);
    return 1;
  }

  case IR_OP_FLAT_SHARD: { /* over dp (1), or ep_dp (3) for an expert tensor */
    if (!want(why, len, n, 0, IR_F32)) return 0;
    if (n->ia[0] < 0 || n->ia[0] > 3 || n->ia[0] == 2)
      return fail(why, len, n, "mesh axis %lld is not one it runs over (0 tp, 1 dp, 3 ep_dp)",
                  (long long)n->ia[0]);
    if (n->ia[1] < 1 || n->ia[1] > 65536)
      return fail(why, len, n, "group size %lld out of range", (long long)n->ia[1]);
    s[0] = (ir_numel(a) + n->ia[1] - 1) / n->ia[1];
    set(n, IR_F32, 1, s);
    return 1;
  }

  case IR_OP_MATMUL_TA:
    if (!want(why, len, n, 0, IR_F32) || !want(why, len, n, 1, IR_F32)) return 0;
    return infer_matmul(n, 1, why, len);

  case IR_OP_GELU_GRAD: case IR_OP_SILU_GRAD: case IR_OP_RELU_GRAD: case IR_OP_SOFTMAX_GRAD:
    if (!want(why, len, n, 0, IR_F32) || !want(why, len, n, 1, IR_F32) ||
        !same_as(n, 0, 1, 2, why, len))
      return 0;
    if (n->op == IR_OP_SOFTMAX_GRAD && a->rank < 1)
      return fail(why, len, n, "needs rank >= 1, got %s", T(0, x));
    set(n, IR_F32, a->rank, a->shape);
    return 1;

  case IR_OP_LAYERNORM_GRAD: case IR_OP_RMSNORM_GRAD:
  case IR_OP_LAYERNORM_WGRAD: case IR_OP_RMSNORM_WGRAD: {
    /* (x, w, dy) -> dx, or (x, dy) -> dw [D] */
    int wgrad = n->op == IR_OP_LAYERNORM_WGRAD || n->op == IR_OP_RMSNORM_WGRAD;
    for (int i = 0; i < n->ninputs; i++)
      if (!want(why, len, n, i, IR_F32)) return 0;
    if (a->rank < 1) return fail(why, len, n, "needs rank >= 1, got %s", T(0, x));
    if (!same_as(n, 0, n->ninputs - 1, n->ninputs, why, len)) return 0;
    if (!wgrad && (b->rank != 1 || b->shape[0] != last(a)))
      return fail(why, len, n, "gain %s does not match the last dimension of %s", T(1, y),
                  T(0, x));
    if (wgrad) set(n, IR_F32, 1, &a->shape[a->rank - 1]);
    else set(n, IR_F32, a->rank, a->shape);
    return 1;
  }

  case IR_OP_ATTENTION_GRAD:
    /* packed result: [B, H + 2 KV, T, hd] holds dq, dk, dv along dimension 1 */
    if (n->ninputs != 5 && n->ninputs != 6)
      return fail(why, len, n, "takes 5 operands (q, k, v, dy, y) or 6 (q, k, v, dy, lse, d), "
                  "got %d", n->ninputs);
    if (!sdpa_layout_ok(n, IR_SDPA_OUT_TOKENS | IR_SDPA_DY_TOKENS | IR_SDPA_QKV_TOKENS, why,
                        len) ||
        !attention_operands(n, why, len))
      return 0;
    const IrSdpaDims sd = ir_sdpa_dims(n);
    const int64_t bht[3] = {sd.B, sd.H, sd.T}; /* q's [B, H, T]: lse, d */
    IrNode *dy = n->inputs[3];
    if (n->ia[1] & IR_SDPA_DY_TOKENS) { /* dy [B, T, H hd] */
      if (dy->rank != 3 || dy->shape[0] != sd.B || dy->shape[1] != sd.T ||
          dy->shape[2] != sd.H * sd.hd)
        return fail(why, len, n, "token-major dy %s is not [batch, seq, heads * head_dim] of q %s",
                    T(3, y), T(0, x));
    } else if (dy->rank != 4 || memcmp(dy->shape, bht, sizeof bht) || dy->shape[3] != sd.hd) {
      return fail(why, len, n, "dy %s is not [batch, heads, seq, head_dim] of q %s", T(3, y),
                  T(0, x));
    }
    if (n->ninputs == 6) { /* the row statistics, lse and D, each [B, H, T] */
      for (int i = 4; i < 6; i++)
        if (n->inputs[i]->rank != 3 || memcmp(n->inputs[i]->shape, bht, sizeof bht))
          return fail(why, len, n, "%s %s is not [batch, heads, seq] of q %s",
                      i == 4 ? "lse" : "d", T(i, y), T(0, x));
    } else if (n->inputs[4]->op != IR_OP_ATTENTION || n->inputs[4]->inputs[0] != a ||
               n->inputs[4]->inputs[1] != b || n->inputs[4]->inputs[2] != n->inputs[2] ||
               n->inputs[4]->ia[0] != n->ia[0] || n->inputs[4]->fa != n->fa) {
      /* y is the very sdpa whose gradient this is: its buffer's lse (ir_aux_numel) and
       * out are the statistics the backward reuses */
      return fail(why, len, n, "the fifth operand must be the sdpa of q, k, v with the same "
                  "causal and scale");
    } else if (n->ia[1] || n->inputs[4]->ia[1]) {
      return fail(why, len, n, "the five-operand form reads the sdpa's out head-major: no "
                  "layout bits on either");
    }
    if (n->ia[1] & IR_SDPA_OUT_TOKENS) { /* [B, T, (H + 2 KV) hd] */
      s[0] = sd.B, s[1] = sd.T, s[2] = (sd.H + 2 * sd.KV) * sd.hd;
      set(n, IR_F32, 3, s);
      return 1;
    }
    s[0] = sd.B, s[1] = sd.H + 2 * sd.KV, s[2] = sd.T, s[3] = sd.hd;
    set(n, IR_F32, 4, s);
    return 1;

  case IR_OP_ATTENTION_LSE: /* sdpa's aux part, lse [B, H, T] */
    if (a->op != IR_OP_ATTENTION || a->inputs[0]->rank != 4)
      return fail(why, len, n, "needs an sdpa result, got %s %s", ir_op_info[a->op].name, T(0, x));
    const IrSdpaDims ad = ir_sdpa_dims(a);
    set(n, IR_F32, 3, (int64_t[]){ad.B, ad.H, ad.T}); /* q's [B, H, T], in any layout of a */
    return 1;

  case IR_OP_ATTENTION_DELTA: /* (m, dm) [B, T, H hd] -> [B, H, T] */
    if (!want(why, len, n, 0, IR_F32) || !want(why, len, n, 1, IR_F32) ||
        !same_as(n, 0, 1, 2, why, len))
      return 0;
    if (a->rank != 3) return fail(why, len, n, "needs [batch, seq, width], got %s", T(0, x));
    if (n->ia[0] < 1 || a->shape[2] % n->ia[0])
      return fail(why, len, n, "width %lld is not divisible by %lld heads",
                  (long long)a->shape[2], (long long)n->ia[0]);
    s[0] = a->shape[0], s[1] = n->ia[0], s[2] = a->shape[1];
    set(n, IR_F32, 3, s);
    return 1;

  case IR_OP_EMBEDDING_GRAD: case IR_OP_VOCAB_EMBEDDING_GRAD:
    if (n->op == IR_OP_VOCAB_EMBEDDING_GRAD && !group_ok(n, 1, why, len)) return 0;
    /* (ids [...], dy [..., D]) -> [vocab, D] */
    if (!want(why, len, n, 0, IR_I32) || !want(why, len, n, 1, IR_F32)) return 0;
    if (b->rank != a->rank + 1 || memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->rank))
      return fail(why, len, n, "ids %s and gradient %s do not match", T(0, x), T(1, y));
    if (n->ia[0] < 1 || n->ia[0] > IR_MAX_DIM)
      return fail(why, len, n, "vocab %lld must be positive", (long long)n->ia[0]);
    s[0] = n->ia[0], s[1] = last(b);
    set(n, IR_F32, 2, s);
    return 1;

  case IR_OP_CROSS_ENTROPY_GRAD: case IR_OP_VOCAB_CROSS_ENTROPY_GRAD: {
    if (n->op == IR_OP_VOCAB_CROSS_ENTROPY_GRAD &&
        (!group_ok(n, 0, why, len) || !vocab_ok(n, a, why, len)))
      return 0;
    /* (logits [..., V], targets [...], dloss []) -> dlogits */
    IrNode *c = n->inputs[2];
    if (!want(why, len, n, 0, IR_F32) || !want(why, len, n, 1, IR_I32) ||
        !want(why, len, n, 2, IR_F32))
      return 0;
    if (a->rank != b->rank + 1 || a->rank < 2 ||
        memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)b->rank) || c->rank != 0)
      return fail(why, len, n, "needs logits [..., V], targets [...] and a scalar, got %s, %s",
                  T(0, x), T(1, y));
    set(n, IR_F32, a->rank, a->shape);
    return 1;
  }

  case IR_OP_SCATTER_ADD:
    /* (idx [..., k], dy [..., k]) -> [..., n] */
    if (!want(why, len, n, 0, IR_I32) || !want(why, len, n, 1, IR_F32) ||
        !same_as(n, 0, 1, 2, why, len))
      return 0;
    if (a->rank < 1 || n->ia[0] < 1 || n->ia[0] > IR_MAX_DIM)
      return fail(why, len, n, "bad size n = %lld for %s", (long long)n->ia[0], T(0, x));
    memcpy(s, a->shape, sizeof s);
    s[a->rank - 1] = n->ia[0];
    set(n, IR_F32, a->rank, s);
    return 1;

  case IR_OP_COMBINE_GRAD_Y: {
    /* (dout [N, D], idx [N, k], w [N, k]) -> [experts, capacity, D] */
    IrNode *w = n->inputs[2];
    if (!want(why, len, n, 0, IR_F32) || !want(why, len, n, 1, IR_I32) ||
        !want(why, len, n, 2, IR_F32) || !experts_ok(n, why, len))
      return 0;
    if (a->rank != 2 || b->rank != 2 || !ir_same_shape(b, w) || a->shape[0] != b->shape[0])
      return fail(why, len, n, "needs gradient [n, d], choices [n, k] and weights [n, k]");
    s[0] = n->ia[0], s[1] = n->ia[1], s[2] = a->shape[1];
    set(n, IR_F32, 3, s);
    return 1;
  }

  case IR_OP_COMBINE_GRAD_W: {
    /* (dout [N, D], y [E, C, D], idx [N, k]) -> [N, k] */
    IrNode *idx = n->inputs[2];
    if (!want(why, len, n, 0, IR_F32) || !want(why, len, n, 1, IR_F32) ||
        !want(why, len, n, 2, IR_I32))
      return 0;
    if (a->rank != 2 || b->rank != 3 || idx->rank != 2 || a->shape[0] != idx->shape[0] ||
        a->shape[1] != b->shape[2])
      return fail(why, len, n, "needs gradient [n, d], experts [e, c, d] and choices [n, k]");
    set(n, IR_F32, 2, idx->shape);
    return 1;
  }

  case IR_OP_SUMSQ:
    if (!want(why, len, n, 0, IR_F32)) return 0;
    set(n, IR_F32, 0, s);
    return 1;

  case IR_OP_GRAD_NORM:
    for (int i = 0; i < n->ninputs; i++)
      if (!want(why, len, n, i, IR_F32)) return 0;
    for (int i = 0; i < n->ninputs; i++)
      if (n->inputs[i]->rank != 0)
        return fail(why, len, n, "operand %d must be a scalar, got %s", i + 1, T(i, x));
    set(n, IR_F32, 0, s);
    return 1;

  case IR_OP_CLIP_COEF: case IR_OP_BIAS_CORRECTION:
    if (!optim_operands(n, "s", why, len)) return 0;
    if (n->op == IR_OP_CLIP_COEF ? !fattr_in(n, 0, 1e30, 0, why, len)
                                 : !fattr_in(n, 0, 1, 1, why, len))
      return 0;
    set(n, IR_F32, 0, s);
    return 1;

  case IR_OP_ADAM_MOMENT:
    if (!optim_operands(n, "tts", why, len) || !fattr_in(n, 0, 1, 1, why, len)) return 0;
    if (n->ia[0] != 0 && n->ia[0] != 1)
      return fail(why, len, n, "square must be 0 or 1, got %lld", (long long)n->ia[0]);
    set(n, IR_F32, a->rank, a->shape);
    return 1;

  case IR_OP_WEIGHT_DECAY: case IR_OP_ADAM_UPDATE: case IR_OP_SGD_GRAD:
  case IR_OP_SGD_MOMENTUM: case IR_OP_SGD_UPDATE: {
    const char *kinds = n->op == IR_OP_WEIGHT_DECAY   ? "ts"
                        : n->op == IR_OP_ADAM_UPDATE  ? "tttsss"
                        : n->op == IR_OP_SGD_GRAD     ? "tst"
                        : n->op == IR_OP_SGD_MOMENTUM ? "tt"
                                                      : "tts";
    if (!optim_operands(n, kinds, why, len)) return 0;
    if (n->op != IR_OP_SGD_UPDATE && !fattr_in(n, 0, 1e30, 0, why, len)) return 0;
    set(n, IR_F32, a->rank, a->shape);
    return 1;
  }

  case IR_OP_COUNT:
    break;
  }
  return fail(why, len, n, "unknown op");
}
