/* codegen/kir.c -- the kernel IR builder: nodes, scopes, type checks.
 *
 * Every public builder enforces the invariants listed in kir.h at the call
 * that would break them, records the first violation in the module and
 * returns KIR_NONE.  Index arithmetic on constants is folded (x+0, x*1,
 * const op const) and equal nodes are shared (value numbering), so
 * generated kernels stay small. */
#include "codegen/kir.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

const char *const kir_op_name[KIR_OP_COUNT] = {
#define X(e, text, n) text,
    KIR_OPS(X)
#undef X
};

const int kir_op_nargs[KIR_OP_COUNT] = {
#define X(e, text, n) n,
    KIR_OPS(X)
#undef X
};

/* ORDER KirCmp */
const char *const kir_cmp_name[] = {"lt", "le", "gt", "ge", "eq", "ne"};
/* ORDER KirRed */
const char *const kir_red_name[] = {"sum", "max", "min"};

static const char *const type_name[] = {"void", "index", "f32", "pred"};

static void *xrealloc(void *p, size_t size) {
  p = realloc(p, size ? size : 1);
  if (!p) {
    fprintf(stderr, "parc: out of memory (asked for %zu bytes)\n", size);
    exit(3);
  }
  return p;
}

/* Grows *arr (of *cap elements of size elem) to hold at least need. */
static void grow(void **arr, int *cap, int need, size_t elem) {
  if (need <= *cap) return;
  int n = *cap ? *cap : 8;
  while (n < need) n *= 2;
  *arr = xrealloc(*arr, (size_t)n * elem);
  *cap = n;
}

static char *xstrdup(const char *s) {
  size_t n = strlen(s) + 1;
  return memcpy(xrealloc(NULL, n), s, n);
}

/* Records the first error of the module; later ones are consequences. */
__attribute__((format(printf, 2, 3))) static void fail(KirKernel *k, const char *fmt, ...) {
  KirModule *m = k->mod;
  if (m->error[0]) return;
  int n = snprintf(m->error, sizeof m->error, "kernel '%s': ", k->name);
  if (n < 0 || (size_t)n >= sizeof m->error) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m->error + n, sizeof m->error - (size_t)n, fmt, ap);
  va_end(ap);
}

KirModule *kir_module_new(void) {
  KirModule *m = xrealloc(NULL, sizeof *m);
  memset(m, 0, sizeof *m);
  return m;
}

void kir_module_free(KirModule *m) {
  if (!m) return;
  for (int i = 0; i < m->nkernels; i++) {
    KirKernel *k = m->kernels[i];
    for (int p = 0; p < k->nparams; p++) free(k->params[p].name);
    free(k->params);
    free(k->rows);
    free(k->nodes);
    free(k->loops);
    free(k->cse);
    free(k->name);
    free(k);
  }
  free(m->kernels);
  free(m->names);
  free(m);
}

const char *kir_error(const KirModule *m) { return m->error[0] ? m->error : NULL; }

static int is_ident(const char *s) {
  if (!s || !(isalpha((unsigned char)*s) || *s == '_')) return 0;
  for (; *s; s++)
    if (!(isalnum((unsigned char)*s) || *s == '_')) return 0;
  return 1;
}

static uint64_t name_hash(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  while (*s) h = (h ^ (unsigned char)*s++) * 1099511628211ull;
  return h;
}

/* Adds kernel index i to the name set; 1 if a kernel of that name was there. */
static int name_seen(KirModule *m, int i) {
  if (2 * (m->nkernels + 1) > m->cap_names) { /* rehash at double the size */
    int cap = m->cap_names ? 2 * m->cap_names : 64;
    int *t = xrealloc(NULL, sizeof(int) * (size_t)cap);
    for (int j = 0; j < cap; j++) t[j] = -1;
    for (int j = 0; j < m->cap_names; j++) {
      int k = m->names[j];
      if (k < 0) continue;
      size_t h = (size_t)(name_hash(m->kernels[k]->name) & (uint64_t)(cap - 1));
      while (t[h] >= 0) h = (h + 1) & (size_t)(cap - 1);
      t[h] = k;
    }
    free(m->names);
    m->names = t, m->cap_names = cap;
  }
  const char *name = m->kernels[i]->name;
  size_t h = (size_t)(name_hash(name) & (uint64_t)(m->cap_names - 1));
  for (; m->names[h] >= 0; h = (h + 1) & (size_t)(m->cap_names - 1))
    if (strcmp(m->kernels[m->names[h]]->name, name) == 0) return 1;
  m->names[h] = i;
  return 0;
}

KirKernel *kir_kernel_new(KirModule *m, const char *name) {
  KirKernel *k = xrealloc(NULL, sizeof *k);
  memset(k, 0, sizeof *k);
  k->mod = m;
  k->name = xstrdup(name ? name : "");
  k->open = -1;
  grow((void **)&m->kernels, &m->cap_kernels, m->nkernels + 1, sizeof *m->kernels);
  m->kernels[m->nkernels++] = k;
  if (!is_ident(k->name)) fail(k, "kernel name is not a C identifier");
  if (name_seen(m, m->nkernels - 1)) fail(k, "kernel name used twice");
  return k;
}

int kir_row_dim(KirKernel *k, int64_t extent) {
  if (k->nnodes > 0 || k->nloops > 0) {
    fail(k, "row dims must be declared before any value");
    return -1;
  }
  if (extent < 1) {
    fail(k, "row dim extent %lld is not positive", (long long)extent);
    return -1;
  }
  if (kir_kernel_rows(k) > INT64_MAX / extent) {
    fail(k, "row count overflows int64");
    return -1;
  }
  grow((void **)&k->rows, &k->cap_rows, k->nrows + 1, sizeof *k->rows);
  k->rows[k->nrows] = extent;
  return k->nrows++;
}

int64_t kir_kernel_rows(const KirKernel *k) {
  int64_t n = 1;
  for (int i = 0; i < k->nrows; i++) n *= k->rows[i];
  return n;
}

static int add_param(KirKernel *k, const char *name, KirParamKind kind) {
  if (!is_ident(name)) {
    fail(k, "param name '%s' is not a C identifier", name ? name : "");
    return -1;
  }
  if (strcmp(name, "row_begin") == 0 || strcmp(name, "row_end") == 0) {
    fail(k, "param name '%s' is reserved", name);
    return -1;
  }
  for (int i = 0; i < k->nparams; i++)
    if (strcmp(k->params[i].name, name) == 0) {
      fail(k, "param name '%s' used twice", name);
      return -1;
    }
  grow((void **)&k->params, &k->cap_params, k->nparams + 1, sizeof *k->params);
  KirParam *p = &k->params[k->nparams];
  memset(p, 0, sizeof *p);
  p->name = xstrdup(name);
  p->kind = kind;
  return k->nparams++;
}

int kir_buf(KirKernel *k, const char *name, KirElem elem, KirAccess access) {
  if (elem != KIR_F32 && elem != KIR_I32) {
    fail(k, "buffer '%s': bad element type", name ? name : "");
    return -1;
  }
  if (access != KIR_IN && access != KIR_OUT && access != KIR_INOUT) {
    fail(k, "buffer '%s': bad access", name ? name : "");
    return -1;
  }
  int p = add_param(k, name, KIR_PARAM_BUF);
  if (p >= 0) {
    k->params[p].elem = elem;
    k->params[p].access = access;
  }
  return p;
}

int kir_scalar(KirKernel *k, const char *name, KirType type) {
  if (type != KIR_TY_INDEX && type != KIR_TY_F32) {
    fail(k, "scalar '%s' must be index or f32", name ? name : "");
    return -1;
  }
  return add_param(k, name, type == KIR_TY_INDEX ? KIR_PARAM_I64 : KIR_PARAM_F32);
}

/* Loops finished at the current position (see "Scope" in kir.h). */
static int position(const KirKernel *k) { return k->open >= 0 ? k->open : k->nloops; }

/* Checks that node v may be used here by `what`; 0 if so. */
static int usable(KirKernel *k, KirVal v, const char *what) {
  if (v == KIR_NONE) return -1;  /* an earlier error */
  if (v < 0 || v >= k->nnodes) {
    fail(k, "%s: %%%d is not a value of this kernel", what, v);
    return -1;
  }
  const KirNode *n = &k->nodes[v];
  if (n->type == KIR_TY_VOID) {
    fail(k, "%s: %%%d is a store, not a value", what, v);
    return -1;
  }
  if (n->loop >= 0 && n->loop != k->open) {
    if (k->open >= 0)
      fail(k, "%s: %%%d varies in loop %d but is used in loop %d", what, v, n->loop, k->open);
    else
      fail(k, "%s: %%%d varies in loop %d but is used outside it", what, v, n->loop);
    return -1;
  }
  if (n->loop < 0 && n->avail > position(k)) {
    fail(k, "%s: %%%d needs loop %d's reduction, which has not finished here", what, v,
         n->avail - 1);
    return -1;
  }
  return 0;
}

static int want(KirKernel *k, KirVal v, KirType t, const char *what) {
  if (k->nodes[v].type == t) return 0;
  fail(k, "%s: %%%d is %s, expected %s", what, v, type_name[k->nodes[v].type], type_name[t]);
  return -1;
}

/* Hash of what makes two nodes the same value. */
static uint32_t node_hash(const KirNode *n) {
  uint64_t h = 1469598103934665603u;
  uint32_t fb;
  memcpy(&fb, &n->fimm, sizeof fb);
  uint64_t parts[7] = {(uint64_t)n->op, (uint64_t)n->type, (uint64_t)(uint32_t)n->arg[0],
                       (uint64_t)(uint32_t)n->arg[1], (uint64_t)(uint32_t)n->arg[2],
                       (uint64_t)n->imm, fb};
  for (int i = 0; i < 7; i++) h = (h ^ parts[i]) * 1099511628211u;
  return (uint32_t)(h ^ (h >> 32));
}

static int same_node(const KirNode *a, const KirNode *b) {
  return a->op == b->op && a->type == b->type && a->arg[0] == b->arg[0] &&
         a->arg[1] == b->arg[1] && a->arg[2] == b->arg[2] && a->imm == b->imm &&
         memcmp(&a->fimm, &b->fimm, sizeof a->fimm) == 0;
}

/* Value numbering: may node n share an existing equal node?  Statements
 * and COL are never shared; a load only while nothing has stored to its
 * buffer (an equal load after a store may read a different value).  An
 * equal node has the same operands, so the same scope: usable here. */
static int shareable(const KirKernel *k, const KirNode *n) {
  if (n->op == KIR_OP_STORE || n->op == KIR_OP_REDUCE || n->op == KIR_OP_COL) return 0;
  return n->op != KIR_OP_LOAD || k->params[n->imm].nstores == 0;
}

/* Slot of k->cse where n is or would go; cap_cse is a power of two. */
static int cse_slot(const KirKernel *k, const KirNode *n) {
  uint32_t mask = (uint32_t)k->cap_cse - 1, i = node_hash(n) & mask;
  while (k->cse[i] != KIR_NONE && !same_node(&k->nodes[k->cse[i]], n)) i = (i + 1) & mask;
  return (int)i;
}

static void cse_insert(KirKernel *k, KirVal v) {
  if (2 * (k->ncse + 1) > k->cap_cse) {  /* keep the load under 1/2 */
    int cap = k->cap_cse ? 2 * k->cap_cse : 64;
    free(k->cse);
    k->cse = xrealloc(NULL, (size_t)cap * sizeof *k->cse);
    for (int i = 0; i < cap; i++) k->cse[i] = KIR_NONE;
    k->cap_cse = cap;
    k->ncse = 0;
    for (KirVal u = 0; u < k->nnodes; u++)
      if (u != v && shareable(k, &k->nodes[u]) && k->cse[cse_slot(k, &k->nodes[u])] == KIR_NONE) {
        k->cse[cse_slot(k, &k->nodes[u])] = u;
        k->ncse++;
      }
  }
  int s = cse_slot(k, &k->nodes[v]);
  if (k->cse[s] == KIR_NONE) {
    k->cse[s] = v;
    k->ncse++;
  }
}

/* Appends a node whose operands were checked, deriving its scope, or
 * returns the existing equal node. */
static KirVal node(KirKernel *k, KirOp op, KirType type, KirVal a, KirVal b, KirVal c,
                   int64_t imm, float fimm) {
  KirNode t;
  memset(&t, 0, sizeof t);
  t.op = op;
  t.type = type;
  t.arg[0] = a;
  t.arg[1] = b;
  t.arg[2] = c;
  t.imm = imm;
  t.fimm = fimm;
  int share = shareable(k, &t);
  if (share && k->cap_cse) {
    KirVal old = k->cse[cse_slot(k, &t)];
    if (old != KIR_NONE) return old;
  }
  t.scope = k->open;
  t.loop = -1;
  for (int i = 0; i < 3; i++) {
    if (t.arg[i] == KIR_NONE) continue;
    const KirNode *o = &k->nodes[t.arg[i]];
    if (o->loop >= 0) t.loop = o->loop;
    if (o->avail > t.avail) t.avail = o->avail;
  }
  if (t.loop >= 0) t.avail = 0;
  grow((void **)&k->nodes, &k->cap_nodes, k->nnodes + 1, sizeof *k->nodes);
  k->nodes[k->nnodes] = t;
  KirVal v = k->nnodes++;
  if (share) cse_insert(k, v);
  return v;
}

static int is_iconst(const KirKernel *k, KirVal v, int64_t c) {
  return k->nodes[v].op == KIR_OP_ICONST && k->nodes[v].imm == c;
}

KirVal kir_col(KirKernel *k) {
  if (k->open < 0) {
    fail(k, "col: no loop is open");
    return KIR_NONE;
  }
  KirLoop *l = &k->loops[k->open];
  if (l->col == KIR_NONE) {
    l->col = node(k, KIR_OP_COL, KIR_TY_INDEX, KIR_NONE, KIR_NONE, KIR_NONE, 0, 0);
    k->nodes[l->col].loop = k->open;
  }
  return l->col;
}

KirVal kir_row(KirKernel *k, int dim) {
  if (dim < 0 || dim >= k->nrows) {
    fail(k, "row: dim %d out of range (%d row dims)", dim, k->nrows);
    return KIR_NONE;
  }
  return node(k, KIR_OP_ROW, KIR_TY_INDEX, KIR_NONE, KIR_NONE, KIR_NONE, dim, 0);
}

KirVal kir_iconst(KirKernel *k, int64_t c) {
  return node(k, KIR_OP_ICONST, KIR_TY_INDEX, KIR_NONE, KIR_NONE, KIR_NONE, c, 0);
}

KirVal kir_fconst(KirKernel *k, float c) {
  return node(k, KIR_OP_FCONST, KIR_TY_F32, KIR_NONE, KIR_NONE, KIR_NONE, 0, c);
}

KirVal kir_param(KirKernel *k, int p) {
  if (p < 0 || p >= k->nparams || k->params[p].kind == KIR_PARAM_BUF) {
    fail(k, "param: %d is not a scalar param", p);
    return KIR_NONE;
  }
  KirType t = k->params[p].kind == KIR_PARAM_I64 ? KIR_TY_INDEX : KIR_TY_F32;
  return node(k, KIR_OP_PARAM, t, KIR_NONE, KIR_NONE, KIR_NONE, p, 0);
}

/* Binary op on index or f32 operands of one type. */
static KirVal binary(KirKernel *k, const char *what, KirOp iop, KirOp fop, KirVal a, KirVal b) {
  if (usable(k, a, what) || usable(k, b, what)) return KIR_NONE;
  KirType t = k->nodes[a].type;
  if (t != k->nodes[b].type || (t != KIR_TY_INDEX && t != KIR_TY_F32) ||
      (t == KIR_TY_INDEX && iop == KIR_OP_COUNT) || (t == KIR_TY_F32 && fop == KIR_OP_COUNT)) {
    fail(k, "%s: operands are %s and %s", what, type_name[t], type_name[k->nodes[b].type]);
    return KIR_NONE;
  }
  if (t == KIR_TY_INDEX) {
    const KirNode *na = &k->nodes[a], *nb = &k->nodes[b];
    if (na->op == KIR_OP_ICONST && nb->op == KIR_OP_ICONST) {
      int64_t x = na->imm, y = nb->imm, r;
      int ovf = 0;
      switch (iop) {
      case KIR_OP_IADD: ovf = __builtin_add_overflow(x, y, &r); break;
      case KIR_OP_ISUB: ovf = __builtin_sub_overflow(x, y, &r); break;
      case KIR_OP_IMUL: ovf = __builtin_mul_overflow(x, y, &r); break;
      case KIR_OP_IMIN: r = x < y ? x : y; break;
      default: r = x > y ? x : y; break;
      }
      if (ovf) {
        fail(k, "%s: constant index arithmetic overflows int64", what);
        return KIR_NONE;
      }
      return kir_iconst(k, r);
    }
    if ((iop == KIR_OP_IADD && is_iconst(k, b, 0)) || (iop == KIR_OP_ISUB && is_iconst(k, b, 0)) ||
        (iop == KIR_OP_IMUL && is_iconst(k, b, 1)))
      return a;
    if ((iop == KIR_OP_IADD && is_iconst(k, a, 0)) || (iop == KIR_OP_IMUL && is_iconst(k, a, 1)))
      return b;
  }
  return node(k, t == KIR_TY_INDEX ? iop : fop, t, a, b, KIR_NONE, 0, 0);
}

KirVal kir_add(KirKernel *k, KirVal a, KirVal b) {
  return binary(k, "add", KIR_OP_IADD, KIR_OP_FADD, a, b);
}
KirVal kir_sub(KirKernel *k, KirVal a, KirVal b) {
  return binary(k, "sub", KIR_OP_ISUB, KIR_OP_FSUB, a, b);
}
KirVal kir_mul(KirKernel *k, KirVal a, KirVal b) {
  return binary(k, "mul", KIR_OP_IMUL, KIR_OP_FMUL, a, b);
}
KirVal kir_div(KirKernel *k, KirVal a, KirVal b) {
  return binary(k, "div", KIR_OP_COUNT, KIR_OP_FDIV, a, b);
}
KirVal kir_max(KirKernel *k, KirVal a, KirVal b) {
  return binary(k, "max", KIR_OP_IMAX, KIR_OP_FMAX, a, b);
}
KirVal kir_min(KirKernel *k, KirVal a, KirVal b) {
  return binary(k, "min", KIR_OP_IMIN, KIR_OP_FMIN, a, b);
}

KirVal kir_neg(KirKernel *k, KirVal a) {
  if (usable(k, a, "neg")) return KIR_NONE;
  if (k->nodes[a].type == KIR_TY_INDEX) return kir_sub(k, kir_iconst(k, 0), a);
  if (want(k, a, KIR_TY_F32, "neg")) return KIR_NONE;
  return node(k, KIR_OP_FNEG, KIR_TY_F32, a, KIR_NONE, KIR_NONE, 0, 0);
}

static KirVal idivmod(KirKernel *k, const char *what, KirOp op, KirVal a, int64_t d) {
  if (usable(k, a, what) || want(k, a, KIR_TY_INDEX, what)) return KIR_NONE;
  if (d <= 0) {
    fail(k, "%s: divisor %lld is not positive", what, (long long)d);
    return KIR_NONE;
  }
  if (k->nodes[a].op == KIR_OP_ICONST) {
    int64_t x = k->nodes[a].imm;
    return kir_iconst(k, op == KIR_OP_IDIV ? x / d : x % d);
  }
  if (d == 1) return op == KIR_OP_IDIV ? a : kir_iconst(k, 0);
  return node(k, op, KIR_TY_INDEX, a, KIR_NONE, KIR_NONE, d, 0);
}

KirVal kir_idiv(KirKernel *k, KirVal a, int64_t d) { return idivmod(k, "idiv", KIR_OP_IDIV, a, d); }
KirVal kir_imod(KirKernel *k, KirVal a, int64_t d) { return idivmod(k, "imod", KIR_OP_IMOD, a, d); }

KirVal kir_affine(KirKernel *k, KirVal a, int64_t stride, int64_t offset) {
  return kir_add(k, kir_mul(k, a, kir_iconst(k, stride)), kir_iconst(k, offset));
}

static KirVal funary(KirKernel *k, const char *what, KirOp op, KirVal a) {
  if (usable(k, a, what) || want(k, a, KIR_TY_F32, what)) return KIR_NONE;
  return node(k, op, KIR_TY_F32, a, KIR_NONE, KIR_NONE, 0, 0);
}

KirVal kir_abs(KirKernel *k, KirVal a) { return funary(k, "abs", KIR_OP_FABS, a); }
KirVal kir_exp(KirKernel *k, KirVal a) { return funary(k, "exp", KIR_OP_EXP, a); }
KirVal kir_log(KirKernel *k, KirVal a) { return funary(k, "log", KIR_OP_LOG, a); }
KirVal kir_tanh(KirKernel *k, KirVal a) { return funary(k, "tanh", KIR_OP_TANH, a); }
KirVal kir_sqrt(KirKernel *k, KirVal a) { return funary(k, "sqrt", KIR_OP_SQRT, a); }
KirVal kir_rsqrt(KirKernel *k, KirVal a) { return funary(k, "rsqrt", KIR_OP_RSQRT, a); }

KirVal kir_itof(KirKernel *k, KirVal a) {
  if (usable(k, a, "itof") || want(k, a, KIR_TY_INDEX, "itof")) return KIR_NONE;
  return node(k, KIR_OP_ITOF, KIR_TY_F32, a, KIR_NONE, KIR_NONE, 0, 0);
}

KirVal kir_cmp(KirKernel *k, KirCmp c, KirVal a, KirVal b) {
  if (usable(k, a, "cmp") || usable(k, b, "cmp")) return KIR_NONE;
  KirType t = k->nodes[a].type;
  if ((unsigned)c > KIR_NE) {
    fail(k, "cmp: bad predicate %d", (int)c);
    return KIR_NONE;
  }
  if (t != k->nodes[b].type || (t != KIR_TY_INDEX && t != KIR_TY_F32)) {
    fail(k, "cmp: operands are %s and %s", type_name[t], type_name[k->nodes[b].type]);
    return KIR_NONE;
  }
  return node(k, KIR_OP_CMP, KIR_TY_PRED, a, b, KIR_NONE, c, 0);
}

KirVal kir_select(KirKernel *k, KirVal p, KirVal a, KirVal b) {
  if (usable(k, p, "select") || usable(k, a, "select") || usable(k, b, "select")) return KIR_NONE;
  if (want(k, p, KIR_TY_PRED, "select")) return KIR_NONE;
  KirType t = k->nodes[a].type;
  if (t != k->nodes[b].type || t == KIR_TY_PRED) {
    fail(k, "select: arms are %s and %s", type_name[t], type_name[k->nodes[b].type]);
    return KIR_NONE;
  }
  return node(k, KIR_OP_SELECT, t, p, a, b, 0, 0);
}

static int buffer(KirKernel *k, int buf, const char *what) {
  if (buf < 0 || buf >= k->nparams || k->params[buf].kind != KIR_PARAM_BUF) {
    fail(k, "%s: %d is not a buffer param", what, buf);
    return -1;
  }
  return 0;
}

KirVal kir_load(KirKernel *k, int buf, KirVal index) {
  if (buffer(k, buf, "load") || usable(k, index, "load") || want(k, index, KIR_TY_INDEX, "load"))
    return KIR_NONE;
  KirType t = k->params[buf].elem == KIR_F32 ? KIR_TY_F32 : KIR_TY_INDEX;
  KirVal v = node(k, KIR_OP_LOAD, t, index, KIR_NONE, KIR_NONE, buf, 0);
  k->params[buf].nloads++;
  return v;
}

void kir_store(KirKernel *k, int buf, KirVal index, KirVal value) {
  if (buffer(k, buf, "store") || usable(k, index, "store") || usable(k, value, "store") ||
      want(k, index, KIR_TY_INDEX, "store"))
    return;
  KirParam *p = &k->params[buf];
  if (p->access == KIR_IN) {
    fail(k, "store: buffer '%s' is declared in (read-only)", p->name);
    return;
  }
  if (want(k, value, p->elem == KIR_F32 ? KIR_TY_F32 : KIR_TY_INDEX, "store")) return;
  KirVal v = node(k, KIR_OP_STORE, KIR_TY_VOID, index, value, KIR_NONE, buf, 0);
  k->nodes[v].loop = k->open;  /* runs once per iteration of its loop */
  k->nodes[v].avail = 0;
  p->nstores++;
}

KirVal kir_reduce(KirKernel *k, KirRed op, KirVal value) {
  if (k->open < 0) {
    fail(k, "reduce: no loop is open");
    return KIR_NONE;
  }
  if ((unsigned)op > KIR_MIN) {
    fail(k, "reduce: bad reduction %d", (int)op);
    return KIR_NONE;
  }
  if (usable(k, value, "reduce") || want(k, value, KIR_TY_F32, "reduce")) return KIR_NONE;
  KirVal v = node(k, KIR_OP_REDUCE, KIR_TY_F32, value, KIR_NONE, KIR_NONE, op, 0);
  k->nodes[v].loop = -1;          /* one value per row ... */
  k->nodes[v].avail = k->open + 1; /* ... once its loop is done */
  return v;
}

void kir_loop(KirKernel *k, KirVal extent) {
  if (k->open >= 0) {
    fail(k, "loop: loop %d is still open (loops do not nest)", k->open);
    return;
  }
  if (usable(k, extent, "loop extent") || want(k, extent, KIR_TY_INDEX, "loop extent")) return;
  grow((void **)&k->loops, &k->cap_loops, k->nloops + 1, sizeof *k->loops);
  KirLoop *l = &k->loops[k->nloops];
  l->extent = extent;
  l->col = KIR_NONE;
  l->first = l->end = k->nnodes;
  k->open = k->nloops++;
}

void kir_end(KirKernel *k) {
  if (k->open < 0) {
    fail(k, "end: no loop is open");
    return;
  }
  k->loops[k->open].end = k->nnodes;
  k->open = -1;
}

void kir_fill_live(const KirKernel *k, unsigned char *live) {
  memset(live, 0, (size_t)k->nnodes);
  for (int l = 0; l < k->nloops; l++) live[k->loops[l].extent] = 1;
  for (KirVal v = k->nnodes - 1; v >= 0; v--) {
    const KirNode *n = &k->nodes[v];
    if (n->op == KIR_OP_STORE || n->op == KIR_OP_REDUCE) live[v] = 1;
    if (!live[v]) continue;
    for (int i = 0; i < kir_op_nargs[n->op]; i++) live[n->arg[i]] = 1;
  }
}

int kir_verify(const KirModule *m, char *err, size_t errlen) {
  const char *e = kir_error(m);
  char buf[sizeof m->error];
  if (!e && m->nkernels == 0) e = "module has no kernels";
  for (int i = 0; !e && i < m->nkernels; i++) {
    const KirKernel *k = m->kernels[i];
    if (k->open >= 0) {
      snprintf(buf, sizeof buf, "kernel '%s': loop %d is never ended", k->name, k->open);
      e = buf;
    }
  }
  if (!e) return 0;
  snprintf(err, errlen, "%s", e);
  return -1;
}
