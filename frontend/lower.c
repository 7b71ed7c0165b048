/* frontend/lower.c -- evaluate the parsed model into IR.
 *
 * Values are numbers, symbols (bare names such as `gelu` or `column`) and
 * tensors (IR nodes).  Blocks are instantiated at each call; errors inside
 * a block name the call chain that led there.  An erroneous expression
 * yields V_ERR, which later uses pass on silently, so one mistake gives one
 * message. */
#include "frontend/lower.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ir/strmap.h"

#define MAX_CALL_DEPTH 64
#define MAX_REPEAT     100000
#define MAX_NODES      (1 << 20)

typedef enum { V_NONE, V_INT, V_FLOAT, V_TENSOR, V_SYM, V_ERR } VKind;

typedef struct {
  VKind k;
  int64_t i;
  double f;
  IrNode *t;
  const char *s;
  Loc loc;
} Value;

typedef struct Var {
  const char *name;
  Value v;
  struct Var *next;
} Var;

/* A block's frame sees its own variables, then the globals (config and
 * train values); never its caller's variables. */
typedef struct Frame {
  Var *vars;
  struct Frame *up;
} Frame;

typedef enum { IN_MODEL, IN_REPEAT, IN_BLOCK } Where;

typedef struct {
  Block *block;
  Loc loc;
} Call;

typedef struct {
  Program *prog;
  Diag *diag;
  IrModule *m;
  Arena *a;                 /* parse arena: frames and scratch */
  Frame globals;
  const char *prefix;       /* dotted scope of parameters being made */
  int layer;
  Call calls[MAX_CALL_DEPTH];
  int ncalls;
  StrMap scopes;            /* scope paths already used */
  StrMap params;            /* full name -> IrNode* */
  StrMap failed;            /* parameters whose declaration was reported */
  StrMap inputs;
  IrNode **aux;             /* auxiliary loss terms, already scaled */
  int naux, capaux;
  int nrepeats;
  int too_big;              /* node limit reported */
  const char *last_path;    /* cached arena copy of a source path */
  const char *last_path_copy;
  Value ret;
  int returned;
} Lower;

static const Value verr = {.k = V_ERR};

/* ---- diagnostics ---------------------------------------------------------- */

static void err(Lower *L, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void err(Lower *L, Loc loc, const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  diag_error(L->diag, loc, "%s", buf);
  for (int i = L->ncalls - 1, shown = 0; i >= 0 && shown < 4; i--, shown++)
    diag_note(L->diag, L->calls[i].loc, "in block '%s' called here", L->calls[i].block->name);
}

static const char *q(char *buf, size_t len, const char *s) {
  return diag_quote(buf, len, s, strlen(s));
}

static const char *kind_name(VKind k) {
  switch (k) {
  case V_INT: return "an integer";
  case V_FLOAT: return "a number";
  case V_TENSOR: return "a tensor";
  case V_SYM: return "a name";
  case V_NONE: return "nothing";
  default: return "an error";
  }
}

/* Edit distance, for "did you mean" hints; names longer than 63 are skipped. */
static int edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 63 || lb > 63) return 99;
  int row[64];
  for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
  for (size_t i = 1; i <= la; i++) {
    int prev = row[0];
    row[0] = (int)i;
    for (size_t j = 1; j <= lb; j++) {
      int cur = row[j];
      int sub = prev + (a[i - 1] != b[j - 1]);
      int del = row[j] + 1, ins = row[j - 1] + 1;
      row[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
      prev = cur;
    }
  }
  return row[lb];
}

typedef struct {
  const char *name;
  int dist;
} Hint;

static void hint_try(Hint *h, const char *want, const char *cand) {
  int d = edit_distance(want, cand);
  int limit = strlen(want) <= 3 ? 1 : 2;
  if (d <= limit && d < h->dist) {
    h->dist = d;
    h->name = cand;
  }
}

/* ---- values and frames ---------------------------------------------------- */

static Value vint(int64_t i, Loc loc) { return (Value){.k = V_INT, .i = i, .loc = loc}; }
static Value vfloat(double f, Loc loc) { return (Value){.k = V_FLOAT, .f = f, .loc = loc}; }
static Value vsym(const char *s, Loc loc) { return (Value){.k = V_SYM, .s = s, .loc = loc}; }
static Value vtensor(IrNode *t, Loc loc) { return (Value){.k = V_TENSOR, .t = t, .loc = loc}; }

static Var *lookup(Frame *f, const char *name) {
  for (; f; f = f->up)
    for (Var *v = f->vars; v; v = v->next)
      if (strcmp(v->name, name) == 0) return v;
  return NULL;
}

static void bind(Lower *L, Frame *f, const char *name, Value v) {
  for (Var *x = f->vars; x; x = x->next)
    if (strcmp(x->name, name) == 0) {
      x->v = v;
      return;
    }
  Var *x = arena_alloc(L->a, sizeof *x);
  x->name = name;
  x->v = v;
  x->next = f->vars;
  f->vars = x;
}

static double num(Value v) { return v.k == V_INT ? (double)v.i : v.f; }
static int is_num(Value v) { return v.k == V_INT || v.k == V_FLOAT; }

/* Reports a value that cannot be used where a `want` is needed. */
static void bad_value(Lower *L, Value v, const char *want) {
  char b[96];
  if (v.k == V_ERR) return;
  if (v.k == V_NONE) err(L, v.loc, "'%s' returns no value", v.s ? v.s : "?");
  else if (v.k == V_SYM) err(L, v.loc, "unknown name '%s'", q(b, sizeof b, v.s));
  else err(L, v.loc, "expected %s, got %s", want, kind_name(v.k));
}

/* ---- IR construction ------------------------------------------------------ */

static IrLoc irloc(Lower *L, Loc loc) {
  if (!loc.src) return (IrLoc){0};
  if (loc.src->path != L->last_path) {
    L->last_path = loc.src->path;
    L->last_path_copy = arena_strdup(&L->m->arena, loc.src->path);
  }
  return (IrLoc){L->last_path_copy, loc.line, loc.col};
}

static int shape_fits(const IrNode *n) {
  int64_t k = 1;
  for (int i = 0; i < n->rank; i++) {
    if (n->shape[i] < 1 || n->shape[i] > IR_MAX_DIM) return 0;
    if (k > INT64_MAX / n->shape[i]) return 0;
    k *= n->shape[i];
  }
  return 1;
}

static int room(Lower *L, Loc loc) {
  if (L->m->nnodes < MAX_NODES) return 1;
  if (!L->too_big) err(L, loc, "model too large: more than %d IR nodes", MAX_NODES);
  L->too_big = 1;
  return 0;
}

/* Type-checks `proto` (op, inputs, attributes, and for reshape its shape)
 * and appends it to the module. */
static Value emit(Lower *L, Loc loc, IrNode *proto) {
  char why[640];
  if (!ir_infer(proto, why, sizeof why)) {
    err(L, loc, "%s", why);
    return verr;
  }
  if (!shape_fits(proto)) {
    char ty[160];
    err(L, loc, "%s: result %s is too large", ir_op_info[proto->op].name,
        ir_type_str(proto, ty, sizeof ty));
    return verr;
  }
  if (!room(L, loc)) return verr;
  IrNode *n = ir_add_like(L->m, proto);
  n->layer = L->layer;
  n->loc = irloc(L, loc);
  return vtensor(n, loc);
}

static Value op1(Lower *L, Loc loc, IrOp op, IrNode *a, double fa) {
  IrNode p = {.op = op, .inputs = &a, .ninputs = 1, .fa = fa};
  return emit(L, loc, &p);
}

static Value op2(Lower *L, Loc loc, IrOp op, IrNode *a, IrNode *b) {
  IrNode *in[2] = {a, b};
  IrNode p = {.op = op, .inputs = in, .ninputs = 2};
  return emit(L, loc, &p);
}

/* ---- arithmetic ----------------------------------------------------------- */

static Value arith_int(Lower *L, Loc loc, int op, int64_t a, int64_t b) {
  int64_t r = 0;
  int ovf = 0;
  switch (op) {
  case '+': ovf = __builtin_add_overflow(a, b, &r); break;
  case '-': ovf = __builtin_sub_overflow(a, b, &r); break;
  case '*': ovf = __builtin_mul_overflow(a, b, &r); break;
  case '/':
  case '%':
    if (b == 0) {
      err(L, loc, "division by zero");
      return verr;
    }
    if (a == INT64_MIN && b == -1) {
      if (op == '%') return vint(0, loc);
      ovf = 1;
      break;
    }
    if (op == '%') return vint(a % b, loc);
    if (a % b == 0) return vint(a / b, loc);
    return vfloat((double)a / (double)b, loc);
  }
  if (ovf) {
    err(L, loc, "integer overflow in %lld %c %lld", (long long)a, op, (long long)b);
    return verr;
  }
  return vint(r, loc);
}

static Value arith(Lower *L, Loc loc, int op, Value a, Value b) {
  if (a.k == V_ERR || b.k == V_ERR) return verr;
  if (a.k == V_INT && b.k == V_INT) return arith_int(L, loc, op, a.i, b.i);
  if (is_num(a) && is_num(b)) {
    double x = num(a), y = num(b), r = 0;
    switch (op) {
    case '+': r = x + y; break;
    case '-': r = x - y; break;
    case '*': r = x * y; break;
    case '/':
      if (y == 0) {
        err(L, loc, "division by zero");
        return verr;
      }
      r = x / y;
      break;
    default:
      err(L, loc, "'%%' needs integers, got %s and %s", kind_name(a.k), kind_name(b.k));
      return verr;
    }
    if (!isfinite(r)) {
      err(L, loc, "number out of range in '%c'", op);
      return verr;
    }
    return vfloat(r, loc);
  }
  if (a.k == V_TENSOR && b.k == V_TENSOR) {
    static const IrOp ops[] = {['+'] = IR_OP_ADD, ['-'] = IR_OP_SUB, ['*'] = IR_OP_MUL,
                               ['/'] = IR_OP_DIV};
    if (op == '%') {
      err(L, loc, "'%%' is not defined on tensors");
      return verr;
    }
    return op2(L, loc, ops[op], a.t, b.t);
  }
  if ((a.k == V_TENSOR && is_num(b) && (op == '*' || op == '/')) ||
      (is_num(a) && b.k == V_TENSOR && op == '*')) {
    Value t = a.k == V_TENSOR ? a : b, s = a.k == V_TENSOR ? b : a;
    double by = num(s);
    if (op == '/') {
      if (by == 0) {
        err(L, loc, "division by zero");
        return verr;
      }
      by = 1.0 / by;
    }
    return op1(L, loc, IR_OP_SCALE, t.t, by);
  }
  if (a.k == V_TENSOR || b.k == V_TENSOR) {
    Value o = a.k == V_TENSOR ? b : a;
    if (o.k == V_TENSOR || is_num(o)) {
      err(L, loc, "'%c' between a tensor and a number: only tensor * number and tensor / number "
          "are defined", op);
      return verr;
    }
    bad_value(L, o, "a tensor or a number");
    return verr;
  }
  bad_value(L, is_num(a) ? b : a, "a number or a tensor");
  return verr;
}

/* ---- expressions ---------------------------------------------------------- */

static Value eval(Lower *L, Frame *f, Expr *e);
static Value call(Lower *L, Frame *f, Expr *e);

static const char *join(Lower *L, const char *prefix, const char *name) {
  if (!prefix || !*prefix) return name;
  return arena_printf(L->a, "%s.%s", prefix, name);
}

static Value eval_name(Lower *L, Frame *f, Expr *e) {
  Var *v = lookup(f, e->name);
  if (v) {
    Value r = v->v;
    r.loc = e->loc;
    return r;
  }
  if (strchr(e->name, '.')) {
    IrNode *p = strmap_get(&L->params, join(L, L->prefix, e->name));
    if (!p) p = strmap_get(&L->params, e->name);
    if (p) return vtensor(p, e->loc);
    if (strmap_get(&L->failed, join(L, L->prefix, e->name)) || strmap_get(&L->failed, e->name))
      return verr;
    char b[96];
    err(L, e->loc, "no parameter named '%s' has been defined", q(b, sizeof b, e->name));
    return verr;
  }
  return vsym(e->name, e->loc);
}

static Value eval(Lower *L, Frame *f, Expr *e) {
  switch (e->kind) {
  case E_INT: return vint(e->ival, e->loc);
  case E_FLOAT: return vfloat(e->fval, e->loc);
  case E_NAME: return eval_name(L, f, e);
  case E_BINARY: {
    Value a = eval(L, f, e->lhs);
    Value b = eval(L, f, e->rhs);
    return arith(L, e->loc, e->op, a, b);
  }
  case E_NEG: {
    Value a = eval(L, f, e->lhs);
    if (a.k == V_INT) return arith_int(L, e->loc, '-', 0, a.i);
    if (a.k == V_FLOAT) return vfloat(-a.f, e->loc);
    if (a.k == V_TENSOR) return op1(L, e->loc, IR_OP_SCALE, a.t, -1.0);
    bad_value(L, a, "a number or a tensor");
    return verr;
  }
  case E_CALL: return call(L, f, e);
  case E_ERROR: return verr;
  }
  return verr;
}

/* Integer from a value, with a range; reports and returns 0 on failure. */
static int want_int(Lower *L, Value v, const char *what, int64_t lo, int64_t hi, int64_t *out) {
  if (v.k == V_ERR) return 0;
  if (v.k != V_INT) {
    if (v.k == V_SYM) bad_value(L, v, "an integer");
    else if (v.k == V_FLOAT) err(L, v.loc, "%s must be an integer, got %.9g", what, v.f);
    else err(L, v.loc, "%s must be an integer, got %s", what, kind_name(v.k));
    return 0;
  }
  if (v.i < lo || v.i > hi) {
    err(L, v.loc, "%s must be in [%lld, %lld], got %lld", what, (long long)lo, (long long)hi,
        (long long)v.i);
    return 0;
  }
  *out = v.i;
  return 1;
}

static int want_num(Lower *L, Value v, const char *what, double *out) {
  if (v.k == V_ERR) return 0;
  if (!is_num(v)) {
    if (v.k == V_SYM) bad_value(L, v, "a number");
    else err(L, v.loc, "%s must be a number, got %s", what, kind_name(v.k));
    return 0;
  }
  *out = num(v);
  return 1;
}

static int want_tensor(Lower *L, Value v) {
  if (v.k == V_TENSOR) return 1;
  bad_value(L, v, "a tensor");
  return 0;
}

/* ---- calls ---------------------------------------------------------------- */

typedef struct {
  int n;
  Value *v;
  const char **name;   /* NULL for positional */
  Loc *loc;
  int *used;
} Args;

static Args eval_args(Lower *L, Frame *f, Expr *e) {
  Args a = {.n = e->nargs};
  a.v = arena_alloc(L->a, sizeof(Value) * (size_t)(e->nargs + 1));
  a.name = arena_alloc(L->a, sizeof(char *) * (size_t)(e->nargs + 1));
  a.loc = arena_alloc(L->a, sizeof(Loc) * (size_t)(e->nargs + 1));
  a.used = arena_alloc(L->a, sizeof(int) * (size_t)(e->nargs + 1));
  for (int i = 0; i < e->nargs; i++) {
    a.v[i] = eval(L, f, e->args[i].value);
    a.name[i] = e->args[i].name;
    a.loc[i] = e->args[i].loc;
  }
  return a;
}

static Block *find_block(Lower *L, const char *name) {
  /* later definitions win: the user's blocks shadow the prelude's */
  for (int i = L->prog->nblocks - 1; i >= 0; i--)
    if (strcmp(L->prog->blocks[i]->name, name) == 0) return L->prog->blocks[i];
  return NULL;
}

/* Whether op is a DSL primitive: graph values and what passes make are not. */
static int dsl_primitive(int op) {
  return !(ir_op_info[op].flags & (IR_F_LEAF | IR_F_BACKWARD | IR_F_INTERNAL));
}

static int find_op(const char *name) {
  for (int op = 0; op < IR_OP_COUNT; op++)
    if (dsl_primitive(op) && strcmp(ir_op_info[op].name, name) == 0) return op;
  return -1;
}

/* Builtins that are not IR ops. */
static const char *const extra_builtins[] = {"dim", "sqrt", "add_loss", NULL};

static int is_builtin(const char *name) {
  if (find_op(name) >= 0) return 1;
  for (int i = 0; extra_builtins[i]; i++)
    if (strcmp(extra_builtins[i], name) == 0) return 1;
  return 0;
}

static const char *scope_for(Lower *L, const char *label, const char *block) {
  if (label) {
    const char *full = join(L, L->prefix, label);
    strmap_put(L->a, &L->scopes, full, (void *)full);
    return full;
  }
  const char *full = join(L, L->prefix, block);
  for (int k = 1; strmap_get(&L->scopes, full); k++)
    full = join(L, L->prefix, arena_printf(L->a, "%s_%d", block, k));
  strmap_put(L->a, &L->scopes, full, (void *)full);
  return full;
}

static void exec(Lower *L, Frame *f, StmtList *body, Where where);

/* Binds a tensor argument against its formal's shape pattern: a bare name
 * not yet bound in the block binds to the dimension, anything else must
 * evaluate to it. */
static int match_pattern(Lower *L, Frame *fr, Block *b, Formal *fm, Value v) {
  TypeExpr *t = fm->type;
  char ty[160];
  if (v.k == V_ERR) return 0;
  if (v.k != V_TENSOR) {
    err(L, v.loc, "argument '%s' of block '%s' must be a tensor, got %s", fm->name, b->name,
        kind_name(v.k));
    return 0;
  }
  if (v.t->rank != t->ndims ||
      (t->dtype && strcmp(t->dtype, ir_dtype_name[v.t->dtype]) != 0)) {
    err(L, v.loc, "argument '%s' of block '%s' must have %d dimension(s)%s%s, got %s", fm->name,
        b->name, t->ndims, t->dtype ? " of " : "", t->dtype ? t->dtype : "",
        ir_type_str(v.t, ty, sizeof ty));
    return 0;
  }
  for (int i = 0; i < t->ndims; i++) {
    Expr *d = t->dims[i];
    if (d->kind == E_NAME && !strchr(d->name, '.')) {
      Var *x = NULL;
      for (Var *y = fr->vars; y; y = y->next)
        if (strcmp(y->name, d->name) == 0) x = y;
      if (!x) {
        bind(L, fr, d->name, vint(v.t->shape[i], d->loc));
        continue;
      }
    }
    Value want = eval(L, fr, d);
    int64_t n;
    if (!want_int(L, want, "a dimension", 1, IR_MAX_DIM, &n)) return 0;
    if (n != v.t->shape[i]) {
      err(L, v.loc, "argument '%s' of block '%s': dimension %d must be %lld, got %s", fm->name,
          b->name, i, (long long)n, ir_type_str(v.t, ty, sizeof ty));
      return 0;
    }
  }
  return 1;
}

static Value call_block(Lower *L, Block *b, Expr *e, Args *a) {
  for (int i = 0; i < L->ncalls; i++)
    if (L->calls[i].block == b) {
      err(L, e->loc, "block '%s' calls itself; recursion is not allowed", b->name);
      return verr;
    }
  if (L->ncalls >= MAX_CALL_DEPTH) {
    err(L, e->loc, "blocks nested more than %d deep", MAX_CALL_DEPTH);
    return verr;
  }
  Frame fr = {.up = &L->globals};
  Value *bound = arena_alloc(L->a, sizeof(Value) * (size_t)(b->nformals + 1));
  int *given = arena_alloc(L->a, sizeof(int) * (size_t)(b->nformals + 1));
  int ok = 1, npos = 0;
  for (int i = 0; i < a->n; i++) {
    int k = -1;
    if (!a->name[i]) {
      k = npos++;
      if (k >= b->nformals) {
        err(L, a->loc[i], "block '%s' takes %d argument(s), got more", b->name, b->nformals);
        diag_note(L->diag, b->loc, "'%s' is defined here", b->name);
        return verr;
      }
    } else {
      for (int j = 0; j < b->nformals; j++)
        if (strcmp(b->formals[j].name, a->name[i]) == 0) k = j;
      if (k < 0) {
        Hint h = {NULL, 99};
        for (int j = 0; j < b->nformals; j++) hint_try(&h, a->name[i], b->formals[j].name);
        char nb[96];
        err(L, a->loc[i], "block '%s' has no argument named '%s'%s%s%s", b->name,
            q(nb, sizeof nb, a->name[i]), h.name ? "; did you mean '" : "",
            h.name ? h.name : "", h.name ? "'?" : "");
        ok = 0;
        continue;
      }
    }
    if (given[k]) {
      err(L, a->loc[i], "argument '%s' of block '%s' is given twice", b->formals[k].name,
          b->name);
      ok = 0;
      continue;
    }
    given[k] = 1;
    bound[k] = a->v[i];
  }
  if (!ok) return verr;

  L->calls[L->ncalls++] = (Call){b, e->loc};
  for (int j = 0; j < b->nformals && ok; j++) {
    Formal *fm = &b->formals[j];
    Value v;
    if (given[j]) v = bound[j];
    else if (fm->def) v = eval(L, &fr, fm->def);
    else {
      L->ncalls--;
      err(L, e->loc, "missing argument '%s' of block '%s'", fm->name, b->name);
      diag_note(L->diag, fm->loc, "'%s' is declared here", fm->name);
      L->ncalls++;
      ok = 0;
      break;
    }
    if (v.k == V_ERR) ok = 0;
    if (ok && fm->type) ok = match_pattern(L, &fr, b, fm, v);
    bind(L, &fr, fm->name, v);
  }
  Value result = verr;
  if (ok) {
    const char *saved = L->prefix;
    L->prefix = scope_for(L, e->label, b->name);
    L->returned = 0;
    L->ret = (Value){.k = V_NONE, .loc = e->loc, .s = b->name};
    exec(L, &fr, &b->body, IN_BLOCK);
    result = L->ret;
    result.loc = e->loc;
    L->returned = 0;
    L->prefix = saved;
  }
  L->ncalls--;
  return result;
}

/* Default for an op attribute the call did not give, or 0 if required. */
static int attr_default(IrNode *p, const char *name, double *out) {
  if (!strcmp(name, "transpose_b") || !strcmp(name, "causal") || !strcmp(name, "keepdim")) {
    *out = 0;
    return 1;
  }
  if (!strcmp(name, "eps")) {
    *out = 1e-5;
    return 1;
  }
  if (!strcmp(name, "theta")) {
    *out = 10000.0;
    return 1;
  }
  if (!strcmp(name, "scale") && p->ninputs == 3 && p->inputs[0]->rank == 4) {
    *out = 1.0 / sqrt((double)p->inputs[0]->shape[3]);
    return 1;
  }
  return 0;
}

static int is_axis_attr(const char *name) {
  return !strcmp(name, "axis") || !strcmp(name, "dim0") || !strcmp(name, "dim1");
}

/* reshape(x, d0, d1, ...), with at most one -1 inferred. */
static Value call_reshape(Lower *L, Expr *e, Args *a) {
  if (a->n < 2 || a->n - 1 > IR_MAX_RANK) {
    err(L, e->loc, "reshape takes a tensor and 1 to %d dimensions", IR_MAX_RANK);
    return verr;
  }
  if (!want_tensor(L, a->v[0])) return verr;
  IrNode *x = a->v[0].t;
  IrNode p = {.op = IR_OP_RESHAPE, .inputs = &x, .ninputs = 1, .rank = a->n - 1};
  int infer = -1;
  int64_t known = 1;
  for (int i = 1; i < a->n; i++) {
    int64_t d;
    if (a->name[i]) {
      err(L, a->loc[i], "reshape takes no named arguments");
      return verr;
    }
    if (a->v[i].k == V_INT && a->v[i].i == -1 && infer < 0) {
      infer = i - 1;
      continue;
    }
    if (!want_int(L, a->v[i], "a dimension", 1, IR_MAX_DIM, &d)) return verr;
    p.shape[i - 1] = d;
    if (known > INT64_MAX / d) {
      err(L, a->loc[i], "reshape: target shape too large");
      return verr;
    }
    known *= d;
  }
  if (infer >= 0) {
    if (ir_numel(x) % known) {
      err(L, e->loc, "reshape: %lld elements do not divide into %lld", (long long)ir_numel(x),
          (long long)known);
      return verr;
    }
    p.shape[infer] = ir_numel(x) / known;
  }
  return emit(L, e->loc, &p);
}

/* dispatch(x, idx, experts = E, capacity_factor = c): c = 0 is dropless. */
static int dispatch_capacity(Lower *L, Expr *e, IrNode *p, Args *a) {
  double cf = 0;
  for (int i = 0; i < a->n; i++)
    if (a->name[i] && !strcmp(a->name[i], "capacity_factor")) {
      a->used[i] = 1;
      if (!want_num(L, a->v[i], "capacity_factor", &cf)) return 0;
      if (cf < 0 || cf > 1e6) {
        err(L, a->loc[i], "capacity_factor must be in [0, 1e6], got %g", cf);
        return 0;
      }
    }
  if (p->ia[1]) return 1; /* explicit capacity */
  int64_t n = p->inputs[0]->shape[0], k = p->inputs[1]->shape[1], ex = p->ia[0];
  if (ex < 1) {
    err(L, e->loc, "dispatch: experts must be given and positive");
    return 0;
  }
  int64_t cap = n;
  if (cf > 0) {
    double c = ceil(cf * (double)n * (double)k / (double)ex);
    cap = c < (double)n ? (int64_t)c : n;
    if (cap < 1) cap = 1;
  }
  p->ia[1] = cap;
  return 1;
}

static Value call_op(Lower *L, Expr *e, IrOp op, Args *a) {
  const IrOpInfo *info = &ir_op_info[op];
  if (op == IR_OP_RESHAPE) return call_reshape(L, e, a);
  IrNode p = {.op = op};
  IrNode **in = arena_alloc(L->a, sizeof(IrNode *) * (size_t)(a->n + 1));
  int npos = 0;
  while (npos < a->n && !a->name[npos] && (info->arity < 0 || npos < info->arity)) {
    if (info->arity < 0 && a->v[npos].k != V_TENSOR) break;
    if (!want_tensor(L, a->v[npos])) return verr;
    in[npos] = a->v[npos].t;
    a->used[npos] = 1;
    npos++;
  }
  int want_in = info->arity < 0 ? 1 : info->arity;
  if (npos < want_in) {
    err(L, e->loc, "%s takes %d tensor operand(s), got %d", info->name, want_in, npos);
    return verr;
  }
  p.inputs = in;
  p.ninputs = npos;
  /* attributes: positional in declaration order, or by name */
  const char *slots[4] = {info->iattr[0], info->iattr[1], info->iattr[2], info->fattr};
  int have[4] = {0};
  int next = 0;
  for (int i = npos; i < a->n; i++) {
    int s = -1;
    if (!a->name[i]) {
      while (next < 4 && !slots[next]) next++;
      if (next >= 4) {
        err(L, a->loc[i], "%s takes no more arguments", info->name);
        return verr;
      }
      s = next++;
    } else {
      for (int j = 0; j < 4; j++)
        if (slots[j] && !strcmp(slots[j], a->name[i])) s = j;
      if (s < 0) {
        if (op == IR_OP_DISPATCH && !strcmp(a->name[i], "capacity_factor")) continue;
        char nb[96];
        err(L, a->loc[i], "%s has no argument named '%s'", info->name,
            q(nb, sizeof nb, a->name[i]));
        return verr;
      }
    }
    if (have[s]) {
      err(L, a->loc[i], "argument '%s' of %s is given twice", slots[s], info->name);
      return verr;
    }
    have[s] = 1;
    a->used[i] = 1;
    if (s == 3) {
      if (!want_num(L, a->v[i], slots[s], &p.fa)) return verr;
      continue;
    }
    int64_t v;
    if (!want_int(L, a->v[i], slots[s], -IR_MAX_DIM, IR_MAX_DIM, &v)) return verr;
    if (is_axis_attr(slots[s]) && v < 0) v += in[0]->rank;
    p.ia[s] = v;
  }
  for (int s = 0; s < 4; s++) {
    if (!slots[s] || have[s]) continue;
    double d;
    if (!attr_default(&p, slots[s], &d)) {
      if (op == IR_OP_DISPATCH && s == 1) continue; /* from capacity_factor */
      err(L, e->loc, "%s needs argument '%s'", info->name, slots[s]);
      return verr;
    }
    if (s == 3) p.fa = d;
    else p.ia[s] = (int64_t)d;
  }
  if (op == IR_OP_DISPATCH && !dispatch_capacity(L, e, &p, a)) return verr;
  return emit(L, e->loc, &p);
}

static Value call_extra(Lower *L, Expr *e, const char *name, Args *a) {
  for (int i = 0; i < a->n; i++)
    if (a->name[i]) {
      err(L, a->loc[i], "%s takes no named arguments", name);
      return verr;
    }
  if (!strcmp(name, "dim")) {
    int64_t i;
    if (a->n != 2) {
      err(L, e->loc, "dim takes a tensor and an axis");
      return verr;
    }
    if (!want_tensor(L, a->v[0])) return verr;
    int r = a->v[0].t->rank;
    if (!want_int(L, a->v[1], "axis", -r, r - 1, &i)) return verr;
    return vint(a->v[0].t->shape[i < 0 ? i + r : i], e->loc);
  }
  if (!strcmp(name, "sqrt")) {
    double x;
    if (a->n != 1) {
      err(L, e->loc, "sqrt takes one number");
      return verr;
    }
    if (!want_num(L, a->v[0], "the argument of sqrt", &x)) return verr;
    if (x < 0) {
      err(L, e->loc, "sqrt of a negative number");
      return verr;
    }
    return vfloat(sqrt(x), e->loc);
  }
  /* add_loss(term, coefficient): adds coefficient * term to the objective */
  double c;
  if (a->n != 2) {
    err(L, e->loc, "add_loss takes a scalar tensor and a coefficient");
    return verr;
  }
  if (!want_tensor(L, a->v[0]) || !want_num(L, a->v[1], "the coefficient", &c)) return verr;
  if (a->v[0].t->rank != 0) {
    char ty[160];
    err(L, e->loc, "add_loss needs a scalar, got %s", ir_type_str(a->v[0].t, ty, sizeof ty));
    return verr;
  }
  if (c == 0) return (Value){.k = V_NONE, .loc = e->loc, .s = "add_loss"};
  Value t = c == 1 ? a->v[0] : op1(L, e->loc, IR_OP_SCALE, a->v[0].t, c);
  if (t.k != V_TENSOR) return verr;
  arena_grow(L->a, (void **)&L->aux, &L->capaux, L->naux + 1, sizeof(IrNode *));
  L->aux[L->naux++] = t.t;
  return (Value){.k = V_NONE, .loc = e->loc, .s = "add_loss"};
}

static void unknown_callee(Lower *L, Frame *f, Expr *e) {
  Hint h = {NULL, 99};
  for (int i = 0; i < L->prog->nblocks; i++) hint_try(&h, e->name, L->prog->blocks[i]->name);
  for (int op = 0; op < IR_OP_COUNT; op++)
    if (dsl_primitive(op)) hint_try(&h, e->name, ir_op_info[op].name);
  for (int i = 0; extra_builtins[i]; i++) hint_try(&h, e->name, extra_builtins[i]);
  (void)f;
  char b[96];
  if (h.name)
    err(L, e->loc, "unknown block or primitive '%s'; did you mean '%s'?",
        q(b, sizeof b, e->name), h.name);
  else
    err(L, e->loc, "unknown block or primitive '%s'", q(b, sizeof b, e->name));
}

static Value call(Lower *L, Frame *f, Expr *e) {
  const char *name = e->name;
  Var *v = lookup(f, name);
  if (v) {
    if (v->v.k == V_ERR) return verr;
    if (v->v.k != V_SYM) {
      err(L, e->loc, "'%s' is %s, not a block or primitive", name, kind_name(v->v.k));
      return verr;
    }
    name = v->v.s;
  }
  Block *b = find_block(L, name);
  if (!b && !is_builtin(name)) {
    Expr tmp = *e;
    tmp.name = name;
    unknown_callee(L, f, &tmp);
    return verr;
  }
  Args a = eval_args(L, f, e);
  for (int i = 0; i < a.n; i++)
    if (a.v[i].k == V_ERR) return verr;
  if (b) return call_block(L, b, e, &a);
  if (e->label) {
    err(L, e->loc, "'as %s' names the parameters of a block; '%s' is a primitive", e->label, name);
    return verr;
  }
  int op = find_op(name);
  if (op >= 0) return call_op(L, e, (IrOp)op, &a);
  return call_extra(L, e, name, &a);
}

/* ---- statements ----------------------------------------------------------- */

static int eval_dims(Lower *L, Frame *f, TypeExpr *t, const char *what, int64_t *shape) {
  if (t->ndims > IR_MAX_RANK) {
    err(L, t->loc, "%s has %d dimensions; at most %d are supported", what, t->ndims, IR_MAX_RANK);
    return 0;
  }
  int ok = 1;
  int64_t numel = 1;
  for (int i = 0; i < t->ndims; i++) {
    Value v = eval(L, f, t->dims[i]);
    if (v.k == V_ERR) {
      ok = 0;
      continue;
    }
    if (v.k != V_INT || v.i < 1 || v.i > IR_MAX_DIM) {
      if (v.k == V_SYM) bad_value(L, v, "a dimension");
      else if (v.k == V_INT)
        err(L, v.loc, "dimension %d of %s must be in [1, %lld], got %lld", i, what,
            (long long)IR_MAX_DIM, (long long)v.i);
      else if (v.k == V_FLOAT)
        err(L, v.loc, "dimension %d of %s must be an integer, got %.9g", i, what, v.f);
      else err(L, v.loc, "dimension %d of %s must be an integer, got %s", i, what, kind_name(v.k));
      ok = 0;
      continue;
    }
    shape[i] = v.i;
    if (numel > INT64_MAX / v.i) {
      err(L, t->loc, "%s has too many elements", what);
      ok = 0;
      numel = 1;
    } else {
      numel *= v.i;
    }
  }
  return ok;
}

static int parse_init(Lower *L, Frame *f, Expr *e, IrNode *n) {
  n->init = IR_INIT_NORMAL;
  n->init_std = 0.02;
  if (!e) return 1;
  const char *name = e->kind == E_NAME || e->kind == E_CALL ? e->name : NULL;
  if (name && e->kind == E_NAME && (!strcmp(name, "zeros") || !strcmp(name, "ones"))) {
    n->init = !strcmp(name, "zeros") ? IR_INIT_ZEROS : IR_INIT_ONES;
    return 1;
  }
  if (name && !strcmp(name, "normal")) {
    if (e->kind == E_NAME) return 1;
    if (e->nargs != 1) {
      err(L, e->loc, "normal takes one argument, the standard deviation");
      return 0;
    }
    double sd;
    if (!want_num(L, eval(L, f, e->args[0].value), "the standard deviation", &sd)) return 0;
    if (!(sd >= 0) || sd > 1e6) {
      err(L, e->args[0].loc, "standard deviation must be in [0, 1e6], got %g", sd);
      return 0;
    }
    n->init_std = sd;
    return 1;
  }
  err(L, e->loc, "unknown init; expected zeros, ones or normal(std)");
  return 0;
}

static int parse_shard(Lower *L, Frame *f, Expr *e, IrNode *n) {
  n->shard = IR_SHARD_REPLICATED;
  n->shard_dim = -1;
  if (!e) return 1;
  const char *name = NULL;
  int reserved = 0;
  for (int k = 0; e->kind == E_NAME && k < IR_SHARD_COUNT; k++)
    reserved |= !strcmp(e->name, ir_shard_name[k]);
  if (reserved) {
    name = e->name;
  } else if (e->kind == E_NAME) {
    Value v = eval(L, f, e);
    if (v.k == V_ERR) return 0;
    if (v.k != V_SYM) {
      err(L, e->loc, "shard intent must be a name, got %s", kind_name(v.k));
      return 0;
    }
    name = v.s;
  } else if (e->kind == E_CALL) {
    name = e->name;
    int64_t d;
    if (e->nargs != 1) {
      err(L, e->loc, "%s(dim) takes one argument", name);
      return 0;
    }
    if (!want_int(L, eval(L, f, e->args[0].value), "the sharded dimension", 0, n->rank - 1, &d))
      return 0;
    n->shard_dim = (int)d;
  }
  for (int k = 0; name && k < IR_SHARD_COUNT; k++)
    if (!strcmp(name, ir_shard_name[k])) {
      n->shard = (IrShard)k;
      if (k == IR_SHARD_REPLICATED) n->shard_dim = -1;
      else if (k == IR_SHARD_VOCAB) n->shard_dim = 0;
      /* experts (dimension 0) over ep; expert(d): dimension d of each expert
       * over tp as well (shard_dim); plain expert: whole over tp */
      else if (k == IR_SHARD_EXPERT && e->kind != E_CALL) n->shard_dim = -1;
      else if (k == IR_SHARD_EXPERT && n->shard_dim == 0) {
        err(L, e->args[0].loc, "expert(0): dimension 0 holds the experts; expert(d) names the "
                               "dimension of each expert split over tp, 1 to %d", n->rank - 1);
        return 0;
      }
      return 1;
    }
  char b[96];
  err(L, e->loc, "unknown shard intent '%s'; expected replicated, column, row, vocab or expert",
      name ? q(b, sizeof b, name) : "?");
  return 0;
}

/* Names the optimizer pass gives its own graph values (passes/optimizer.c):
 * the trainer's scalar inputs, and the state suffixes of parameters. */
static const char *const reserved_inputs[] = {"lr", "step", NULL};
static const char *const reserved_suffixes[] = {".exp_avg", ".exp_avg_sq", ".momentum_buffer",
                                                NULL};

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcmp(s + n - k, suffix);
}

static void exec_param(Lower *L, Frame *f, Stmt *s) {
  IrNode p = {.op = IR_OP_PARAM, .dtype = IR_F32, .rank = s->type->ndims};
  const char *full = join(L, L->prefix, s->name);
  char what[160], b[96];
  snprintf(what, sizeof what, "parameter '%s'", q(b, sizeof b, full));
  if (s->type->dtype && strcmp(s->type->dtype, "f32") != 0) {
    err(L, s->type->dtype_loc, "parameters are f32; '%s' is declared %s", full, s->type->dtype);
    bind(L, f, s->name, verr);
    return;
  }
  int ok = eval_dims(L, f, s->type, what, p.shape);
  ok = ok && parse_init(L, f, s->init, &p);
  ok = ok && parse_shard(L, f, s->shard, &p);
  for (int i = 0; ok && reserved_suffixes[i]; i++)
    if (ends_with(full, reserved_suffixes[i])) {
      err(L, s->loc, "parameter '%s': names ending in '%s' are reserved for optimizer state",
          q(b, sizeof b, full), reserved_suffixes[i]);
      ok = 0;
    }
  IrNode *old = strmap_get(&L->params, full);
  if (ok && old) {
    err(L, s->loc, "parameter '%s' is defined twice", q(b, sizeof b, full));
    diag_note(L->diag, (Loc){0}, "first defined at %s:%d:%d; label one of the calls with 'as NAME'",
              old->loc.file ? old->loc.file : "?", old->loc.line, old->loc.col);
    ok = 0;
  }
  if (!ok || !room(L, s->loc)) {
    strmap_put(L->a, &L->failed, full, (void *)full);
    bind(L, f, s->name, verr);
    return;
  }
  IrNode *n = ir_add(L->m, IR_OP_PARAM, NULL, 0);
  n->dtype = IR_F32;
  n->rank = p.rank;
  memcpy(n->shape, p.shape, sizeof n->shape);
  n->name = arena_strdup(&L->m->arena, full);
  n->init = p.init;
  n->init_std = p.init_std;
  n->shard = p.shard;
  n->shard_dim = p.shard_dim;
  n->layer = L->layer;
  n->loc = irloc(L, s->loc);
  strmap_put(L->a, &L->params, full, n);
  bind(L, f, s->name, vtensor(n, s->loc));
}

static void exec_input(Lower *L, Frame *f, Stmt *s) {
  for (int i = 0; reserved_inputs[i]; i++)
    if (!strcmp(s->name, reserved_inputs[i])) {
      err(L, s->loc, "input name '%s' is reserved for the trainer's %s", s->name,
          i == 0 ? "learning rate" : "step count");
      bind(L, f, s->name, verr);
      return;
    }
  IrNode p = {.op = IR_OP_INPUT, .rank = s->type->ndims};
  p.dtype = s->type->dtype && !strcmp(s->type->dtype, "i32") ? IR_I32 : IR_F32;
  char what[160], b[96];
  snprintf(what, sizeof what, "input '%s'", q(b, sizeof b, s->name));
  if (!eval_dims(L, f, s->type, what, p.shape)) {
    bind(L, f, s->name, verr);
    return;
  }
  if (strmap_get(&L->inputs, s->name)) {
    err(L, s->loc, "input '%s' is declared twice", s->name);
    return;
  }
  if (!room(L, s->loc)) return;
  IrNode *n = ir_add(L->m, IR_OP_INPUT, NULL, 0);
  n->dtype = p.dtype;
  n->rank = p.rank;
  memcpy(n->shape, p.shape, sizeof n->shape);
  n->name = arena_strdup(&L->m->arena, s->name);
  n->loc = irloc(L, s->loc);
  strmap_put(L->a, &L->inputs, s->name, n);
  bind(L, f, s->name, vtensor(n, s->loc));
}

static void exec_repeat(Lower *L, Frame *f, Stmt *s) {
  if (L->nrepeats++) {
    err(L, s->loc, "a model has one repeat: its iterations are the layers that pipeline "
        "stages split");
    return;
  }
  int64_t n;
  if (!want_int(L, eval(L, f, s->value), "the repeat count", 1, MAX_REPEAT, &n)) return;
  const char *label = s->label;
  if (!label) label = s->value->kind == E_NAME ? s->value->name : "layers";
  L->m->nlayers = (int)n;
  for (int64_t i = 0; i < n && !L->too_big; i++) {
    L->prefix = arena_printf(L->a, "%s.%lld", label, (long long)i);
    L->layer = (int)i;
    exec(L, f, &s->body, IN_REPEAT);
    if (L->diag->errors > L->diag->max_errors) break;
  }
  L->prefix = "";
  L->layer = -1;
}

/* Whether s may not stand where it is.  check_structure reports these once;
 * exec skips them. */
static int misplaced(const Stmt *s, Where where) {
  switch (s->kind) {
  case S_INPUT: case S_REPEAT: case S_CONFIG: return where != IN_MODEL;
  case S_RETURN: return where != IN_BLOCK;
  default: return 0;
  }
}

static void check_structure(Lower *L, StmtList *body, Where where) {
  static const char *const place[] = {"the model's top level", "repeat", "a block"};
  for (int i = 0; i < body->n; i++) {
    Stmt *s = body->items[i];
    if (misplaced(s, where)) {
      if (s->kind == S_INPUT)
        err(L, s->loc, "inputs are declared at the top level of the model, not in %s",
            place[where]);
      else if (s->kind == S_REPEAT)
        err(L, s->loc, "repeat is allowed only at the top level of a model, not in %s",
            place[where]);
      else if (s->kind == S_CONFIG)
        err(L, s->loc, "config belongs at the top level of the model, not in %s", place[where]);
      else
        err(L, s->loc, "return is allowed only in a block");
    }
    if (s->kind == S_REPEAT) check_structure(L, &s->body, IN_REPEAT);
    if (s->kind == S_IF) check_structure(L, &s->body, where);
  }
}

/* if COND { body }: COND is a number known when the model is built; the body
 * runs (in the enclosing scope: its assignments stay) when it is not 0, and
 * is never evaluated otherwise, so an option switched off builds nothing. */
static void exec_if(Lower *L, Frame *f, Stmt *s, Where where) {
  Value c = eval(L, f, s->value);
  if (c.k == V_ERR) return;
  if (!is_num(c)) {
    if (c.k == V_SYM) bad_value(L, c, "a number");
    else err(L, c.loc, "the condition of 'if' must be a number known when the model is built, "
             "got %s", kind_name(c.k));
    return;
  }
  if (num(c) != 0) exec(L, f, &s->body, where);
}

static void exec(Lower *L, Frame *f, StmtList *body, Where where) {
  for (int i = 0; i < body->n && !L->returned; i++) {
    Stmt *s = body->items[i];
    if (misplaced(s, where)) {
      if (s->name) bind(L, f, s->name, verr);
      continue;
    }
    switch (s->kind) {
    case S_ASSIGN:
      bind(L, f, s->name, eval(L, f, s->value));
      break;
    case S_EXPR: {
      Value v = eval(L, f, s->value);
      (void)v;
      break;
    }
    case S_PARAM:
      exec_param(L, f, s);
      break;
    case S_INPUT:
      exec_input(L, f, s);
      break;
    case S_REPEAT:
      exec_repeat(L, f, s);
      break;
    case S_IF:
      exec_if(L, f, s, where);
      break;
    case S_RETURN:
      L->ret = eval(L, f, s->value);
      L->returned = 1;
      break;
    case S_CONFIG:
      break; /* evaluated before the body */
    }
  }
}

/* ---- settings: config, train, -D ------------------------------------------ */

static const char *const train_keys[] = {"batch", "microbatches", "steps", "lr", "optimizer",
                                         "schedule", "clip", "precision", "seed", "pad_vocab",
                                         NULL};

static int parse_override(const char *s, Value *v) {
  char *end;
  if (!*s) return 0;
  errno = 0;
  long long i = strtoll(s, &end, 10);
  if (!*end && errno == 0) {
    *v = vint(i, (Loc){0});
    return 1;
  }
  errno = 0;
  double d = strtod(s, &end);
  if (!*end && errno == 0 && isfinite(d)) {
    *v = vfloat(d, (Loc){0});
    return 1;
  }
  if (!(s[0] == '_' || ((s[0] | 32) >= 'a' && (s[0] | 32) <= 'z'))) return 0;
  for (const char *p = s; *p; p++)
    if (!(*p == '_' || (*p >= '0' && *p <= '9') || ((*p | 32) >= 'a' && (*p | 32) <= 'z')))
      return 0;
  *v = vsym(s, (Loc){0});
  return 1;
}

/* The last -D of that name wins, as with a compiler's -D; all are used. */
static const Override *find_override(const Override *ov, int nov, const char *name, int *used) {
  const Override *found = NULL;
  for (int i = 0; i < nov; i++)
    if (!strcmp(ov[i].name, name)) {
      used[i] = 1;
      found = &ov[i];
    }
  return found;
}

static int setting_from(Lower *L, const char *name, Value v, IrSetting *out) {
  memset(out, 0, sizeof *out);
  out->name = arena_strdup(&L->m->arena, name);
  if (v.k == V_INT) out->i = v.i, out->f = (double)v.i;
  else if (v.k == V_FLOAT) out->is_float = 1, out->f = v.f;
  else if (v.k == V_SYM) out->sym = arena_strdup(&L->m->arena, v.s);
  else {
    bad_value(L, v, "a number or a name");
    return 0;
  }
  return 1;
}

static void add_setting(Lower *L, IrSetting **arr, int *n, int *cap, IrSetting s) {
  arena_grow(&L->m->arena, (void **)arr, cap, *n + 1, sizeof(IrSetting));
  (*arr)[(*n)++] = s;
}

/* Evaluates `value` (or its -D override) and binds it as a global. */
static Value eval_setting(Lower *L, const char *name, Expr *value, const Override *ov,
                          int nov, int *used) {
  const Override *o = find_override(ov, nov, name, used);
  if (!o) return eval(L, &L->globals, value);
  Value v;
  if (!parse_override(o->value, &v)) {
    diag_error(L->diag, (Loc){0}, "-D %s=%s: '%s' is not a number or a name", o->name, o->value,
               o->value);
    return verr;
  }
  return v;
}

/* optimizer = adamw(beta1 = 0.9, ...) and schedule = cosine(...): a named
 * choice with numeric named arguments, each with a default. */
typedef struct {
  const char *choice;
  const char *const *args;
  const double *defaults;
} Choice;

static const char *const adamw_args[] = {"beta1", "beta2", "eps", "wd", NULL};
static const double adamw_def[] = {0.9, 0.95, 1e-8, 0.0};
static const char *const sgd_args[] = {"momentum", "wd", NULL};
static const double sgd_def[] = {0.0, 0.0};
static const char *const const_args[] = {NULL};
static const double const_def[] = {0};
static const char *const warmup_args[] = {"warmup", NULL};
static const double warmup_def[] = {0};
static const char *const cosine_args[] = {"warmup", "min_lr", NULL};
static const double cosine_def[] = {0, 0.0};

static const Choice optimizers[] = {{"adamw", adamw_args, adamw_def},
                                    {"sgd", sgd_args, sgd_def}, {NULL, NULL, NULL}};
static const Choice schedules[] = {{"constant", const_args, const_def},
                                   {"warmup", warmup_args, warmup_def},
                                   {"cosine", cosine_args, cosine_def},
                                   {NULL, NULL, NULL}};

static void eval_choice(Lower *L, Expr *e, Value v, const Choice *table, const char *what,
                        const char **choice, IrSetting **out, int *nout) {
  const char *name = e && e->kind == E_CALL ? e->name : v.k == V_SYM ? v.s : NULL;
  const Choice *c = NULL;
  for (int i = 0; name && table[i].choice; i++)
    if (!strcmp(table[i].choice, name)) c = &table[i];
  if (!c) {
    char list[256] = "", b[96];
    for (int i = 0; table[i].choice; i++)
      snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
               table[i].choice);
    if (v.k != V_ERR)
      err(L, e ? e->loc : v.loc, "unknown %s '%s'; expected one of %s", what,
          name ? q(b, sizeof b, name) : kind_name(v.k), list);
    return;
  }
  *choice = c->choice;
  int cap = 0, n = 0;
  for (int k = 0; c->args[k]; k++) {
    double d = c->defaults[k];
    for (int i = 0; e && e->kind == E_CALL && i < e->nargs; i++)
      if (e->args[i].name && !strcmp(e->args[i].name, c->args[k])) {
        Value a = eval(L, &L->globals, e->args[i].value);
        if (!want_num(L, a, c->args[k], &d)) d = c->defaults[k];
        else if (!(d >= 0)) {
          err(L, e->args[i].loc, "%s must not be negative", c->args[k]);
          d = c->defaults[k];
        } else if (!strncmp(c->args[k], "beta", 4) && !(d < 1)) {
          /* Adam's moment decay: 1 would never forget (and divide by 0 in the bias correction) */
          err(L, e->args[i].loc, "%s must be in [0, 1), got %g", c->args[k], d);
          d = c->defaults[k];
        }
      }
    IrSetting s = {.name = c->args[k], .is_float = 1, .f = d};
    if (!strcmp(c->args[k], "warmup")) s.is_float = 0, s.i = (int64_t)d;
    add_setting(L, out, &n, &cap, s);
  }
  for (int i = 0; e && e->kind == E_CALL && i < e->nargs; i++) {
    int known = 0;
    for (int k = 0; c->args[k]; k++) known |= e->args[i].name && !strcmp(e->args[i].name, c->args[k]);
    if (!known) {
      char list[256] = "";
      for (int k = 0; c->args[k]; k++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", k ? ", " : "", c->args[k]);
      err(L, e->args[i].loc, "%s %s takes named arguments %s", what, c->choice,
          *list ? list : "(none)");
    }
  }
  *nout = n;
}

static void check_train_value(Lower *L, const char *key, Value v) {
  int64_t i;
  double d;
  if (!strcmp(key, "batch") || !strcmp(key, "microbatches"))
    want_int(L, v, key, 1, 1 << 30, &i);
  else if (!strcmp(key, "pad_vocab"))
    want_int(L, v, key, 1, IR_PAD_VOCAB_MAX, &i);
  else if (!strcmp(key, "steps"))
    want_int(L, v, key, 0, INT64_C(1) << 40, &i);
  else if (!strcmp(key, "seed"))
    want_int(L, v, key, 0, INT64_MAX, &i);
  else if (!strcmp(key, "lr") || !strcmp(key, "clip")) {
    if (want_num(L, v, key, &d) && !(d >= 0 && d <= 1e6))
      err(L, v.loc, "%s must be in [0, 1e6], got %g", key, d);
  } else if (!strcmp(key, "precision")) {
    if (v.k != V_SYM || (strcmp(v.s, "fp32") && strcmp(v.s, "bf16")))
      err(L, v.loc, "precision must be fp32 or bf16");
  }
}

static void eval_train(Lower *L, const Override *ov, int nov, int *used) {
  IrModule *m = L->m;
  int cap = 0;
  EntryList *tr = &L->prog->train;
  for (int i = 0; i < tr->n; i++) {
    int known = 0;
    for (int k = 0; train_keys[k]; k++) known |= !strcmp(train_keys[k], tr->items[i].name);
    if (!known) {
      Hint h = {NULL, 99};
      for (int k = 0; train_keys[k]; k++) hint_try(&h, tr->items[i].name, train_keys[k]);
      char b[96];
      err(L, tr->items[i].loc, "unknown train setting '%s'%s%s%s",
          q(b, sizeof b, tr->items[i].name), h.name ? "; did you mean '" : "",
          h.name ? h.name : "", h.name ? "'?" : "");
    }
  }
  /* optional: a setting only where given (the driver has its default) */
  static const struct {
    const char *key;
    double def;
    int is_float;
    const char *sym;
    int optional;
  } plain[] = {{"batch", 8, 0, NULL, 0},   {"microbatches", 1, 0, NULL, 0},
               {"steps", 100, 0, NULL, 0}, {"lr", 3e-4, 1, NULL, 0},
               {"clip", 1.0, 1, NULL, 0},  {"precision", 0, 0, "fp32", 0},
               {"seed", 1337, 0, NULL, 0}, {"pad_vocab", 64, 0, NULL, 1}};
  for (size_t k = 0; k < sizeof plain / sizeof plain[0]; k++) {
    Expr *e = NULL;
    for (int i = 0; i < tr->n; i++)
      if (!strcmp(tr->items[i].name, plain[k].key)) e = tr->items[i].value;
    if (plain[k].optional && !e && !find_override(ov, nov, plain[k].key, used)) continue;
    Value v = plain[k].sym ? vsym(plain[k].sym, L->prog->train_loc)
              : plain[k].is_float ? vfloat(plain[k].def, L->prog->train_loc)
                                  : vint((int64_t)plain[k].def, L->prog->train_loc);
    if (e || find_override(ov, nov, plain[k].key, used))
      v = eval_setting(L, plain[k].key, e, ov, nov, used);
    check_train_value(L, plain[k].key, v);
    IrSetting s;
    if (v.k == V_ERR || !setting_from(L, plain[k].key, v, &s)) continue;
    add_setting(L, &m->train, &m->ntrain, &cap, s);
    bind(L, &L->globals, plain[k].key, v);
  }
  for (int which = 0; which < 2; which++) {
    const char *key = which ? "schedule" : "optimizer";
    Expr *e = NULL;
    for (int i = 0; i < tr->n; i++)
      if (!strcmp(tr->items[i].name, key)) e = tr->items[i].value;
    Value v = vsym(which ? "constant" : "adamw", L->prog->train_loc);
    const Override *o = find_override(ov, nov, key, used);
    if (o) {
      e = NULL;
      if (!parse_override(o->value, &v) || v.k != V_SYM) v = vsym(o->value, (Loc){0});
    } else if (e && e->kind != E_CALL) {
      v = eval(L, &L->globals, e);
      e = NULL;
    }
    if (which)
      eval_choice(L, e, v, schedules, "schedule", &m->schedule, &m->sched, &m->nsched);
    else
      eval_choice(L, e, v, optimizers, "optimizer", &m->optimizer, &m->optim, &m->noptim);
  }
}

static void eval_config(Lower *L, Model *md, const Override *ov, int nov, int *used) {
  int cap = 0;
  Stmt *cfg = NULL;
  for (int i = 0; i < md->body.n; i++) {
    Stmt *s = md->body.items[i];
    if (s->kind != S_CONFIG) continue;
    if (cfg) {
      err(L, s->loc, "a second config section");
      diag_note(L->diag, cfg->loc, "the first one is here");
      continue;
    }
    cfg = s;
  }
  if (!cfg) return;
  for (int i = 0; i < cfg->entries.n; i++) {
    Entry *en = &cfg->entries.items[i];
    for (int k = 0; train_keys[k]; k++)
      if (!strcmp(train_keys[k], en->name))
        err(L, en->loc, "'%s' is a train setting; set it in the train section", en->name);
    Value v = eval_setting(L, en->name, en->value, ov, nov, used);
    IrSetting s;
    if (v.k == V_ERR || !setting_from(L, en->name, v, &s)) {
      bind(L, &L->globals, en->name, verr);
      continue;
    }
    add_setting(L, &L->m->config, &L->m->nconfig, &cap, s);
    bind(L, &L->globals, en->name, v);
  }
}

/* ---- entry ---------------------------------------------------------------- */

static void check_blocks(Lower *L) {
  Program *p = L->prog;
  for (int i = 0; i < p->nblocks; i++) {
    Block *b = p->blocks[i];
    if (is_builtin(b->name)) err(L, b->loc, "block '%s' has the name of a primitive", b->name);
    for (int j = 0; j < i; j++) {
      Block *c = p->blocks[j];
      if (strcmp(c->name, b->name) || c->loc.src != b->loc.src) continue;
      err(L, b->loc, "block '%s' is defined twice", b->name);
      diag_note(L->diag, c->loc, "first defined here");
    }
  }
}

IrModule *lower_program(Program *prog, const Override *ov, int nov) {
  Diag *d = prog->diag;
  Loc file_loc = {prog->main_src, 1, 1, 0, 0};
  if (prog->nmodels != 1) {
    if (prog->nmodels == 0)
      diag_error(d, file_loc, "no model in this file; expected 'model NAME { ... }'");
    else
      diag_error(d, prog->models[1]->loc, "a second model; a file holds one model");
    return NULL;
  }
  Model *md = prog->models[0];
  Lower L = {.prog = prog, .diag = d, .a = prog->arena, .prefix = "", .layer = -1};
  L.m = ir_module_new(md->name);
  int *used = arena_alloc(L.a, sizeof(int) * (size_t)(nov + 1));
  check_blocks(&L);
  for (int i = 0; i < prog->nblocks; i++) check_structure(&L, &prog->blocks[i]->body, IN_BLOCK);
  check_structure(&L, &md->body, IN_MODEL);
  eval_config(&L, md, ov, nov, used);
  eval_train(&L, ov, nov, used);
  for (int i = 0; i < nov; i++) {
    if (used[i]) continue;
    char list[512] = "";
    for (int k = 0; k < L.m->nconfig; k++)
      snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", k ? ", " : "",
               L.m->config[k].name);
    for (int k = 0; train_keys[k]; k++)
      snprintf(list + strlen(list), sizeof list - strlen(list), ", %s", train_keys[k]);
    diag_error(d, (Loc){0}, "-D %s: the model has no config or train value of that name (it has: %s)",
               ov[i].name, list);
  }
  Frame model = {.up = &L.globals};
  if (!d->errors) exec(&L, &model, &md->body, IN_MODEL);
  if (!d->errors) {
    Var *loss = lookup(&model, "loss");
    if (!loss || loss->v.k != V_TENSOR || loss->v.t->rank != 0) {
      char ty[160];
      if (!loss) diag_error(d, md->loc, "model '%s' defines no 'loss'", md->name);
      else if (loss->v.k == V_TENSOR)
        diag_error(d, loss->v.loc, "'loss' must be a scalar, got %s",
                   ir_type_str(loss->v.t, ty, sizeof ty));
      else if (loss->v.k != V_ERR)
        diag_error(d, loss->v.loc, "'loss' must be a scalar tensor, got %s",
                   kind_name(loss->v.k));
    } else {
      IrNode *obj = loss->v.t;
      L.m->ce_loss = obj;
      for (int i = 0; i < L.naux; i++) {
        Value s = op2(&L, loss->v.loc, IR_OP_ADD, obj, L.aux[i]);
        if (s.k == V_TENSOR) obj = s.t;
      }
      L.m->loss = obj;
    }
  }
  if (d->errors) {
    ir_module_free(L.m);
    return NULL;
  }
  return L.m;
}
