/* frontend/build.c -- AST construction for the grammar actions. */
#include "frontend/build.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static Expr *new_expr(Program *p, ExprKind kind, Loc loc) {
  Expr *e = arena_alloc(p->arena, sizeof *e);
  e->kind = kind;
  e->loc = loc;
  e->depth = 1;
  return e;
}

Expr *build_error(Program *p, Loc loc) { return new_expr(p, E_ERROR, loc); }

/* Bounds expression depth: a deeper expression becomes an error node, so
 * later recursive walks are bounded by AST_MAX_DEPTH frames. */
static Expr *bounded(Program *p, Expr *e) {
  if (e->depth <= AST_MAX_DEPTH) return e;
  if (e->depth == AST_MAX_DEPTH + 1)
    diag_error(p->diag, e->loc, "expression nested too deeply (more than %d levels)",
               AST_MAX_DEPTH);
  Expr *err = build_error(p, e->loc);
  err->depth = AST_MAX_DEPTH + 2;  /* reported once; enclosing nodes stay errors silently */
  return err;
}

static int max_depth(const Expr *a, const Expr *b) {
  int da = a ? a->depth : 0, db = b ? b->depth : 0;
  return da > db ? da : db;
}

Expr *build_int(Program *p, Loc loc, const char *text, int len) {
  Expr *e = new_expr(p, E_INT, loc);
  char buf[32];
  if (len >= (int)sizeof buf) {
    diag_error(p->diag, loc, "integer literal too large (at most %lld)", (long long)INT64_MAX);
    e->kind = E_ERROR;
    return e;
  }
  memcpy(buf, text, (size_t)len);
  buf[len] = 0;
  errno = 0;
  e->ival = strtoll(buf, NULL, 10);
  if (errno == ERANGE) {
    diag_error(p->diag, loc, "integer literal too large (at most %lld)", (long long)INT64_MAX);
    e->kind = E_ERROR;
  }
  return e;
}

Expr *build_float(Program *p, Loc loc, const char *text, int len) {
  Expr *e = new_expr(p, E_FLOAT, loc);
  char *s = arena_strndup(p->arena, text, (size_t)len);
  errno = 0;
  e->fval = strtod(s, NULL);
  if (errno == ERANGE && (e->fval > 1 || e->fval < -1)) {
    diag_error(p->diag, loc, "number '%s' is out of range", s);
    e->kind = E_ERROR;
  }
  return e;
}

Expr *build_name(Program *p, Loc loc, const char *name) {
  Expr *e = new_expr(p, E_NAME, loc);
  e->name = name;
  return e;
}

Expr *build_path(Program *p, Expr *path, Loc loc, const char *component) {
  path->loc.len = loc.off + loc.len - path->loc.off;
  path->name = arena_printf(p->arena, "%s.%s", path->name, component);
  return path;
}

Expr *build_binary(Program *p, Loc loc, int op, Expr *lhs, Expr *rhs) {
  Expr *e = new_expr(p, E_BINARY, loc);
  e->op = op;
  e->lhs = lhs;
  e->rhs = rhs;
  e->depth = 1 + max_depth(lhs, rhs);
  return bounded(p, e);
}

Expr *build_neg(Program *p, Loc loc, Expr *x) {
  Expr *e = new_expr(p, E_NEG, loc);
  e->lhs = x;
  e->depth = 1 + x->depth;
  return bounded(p, e);
}

Expr *build_call(Program *p, Expr *callee, Arg *args, int nargs, const char *label) {
  Expr *e = new_expr(p, E_CALL, callee->loc);
  e->name = callee->name;
  e->args = args;
  e->nargs = nargs;
  e->label = label;
  int d = 0;
  for (int i = 0; i < nargs; i++)
    if (args[i].value->depth > d) d = args[i].value->depth;
  e->depth = 1 + d;
  return bounded(p, e);
}

void build_arg(Program *p, ArgList *l, Loc loc, const char *name, Expr *value) {
  arena_grow(p->arena, (void **)&l->items, &l->cap, l->n + 1, sizeof(Arg));
  l->items[l->n++] = (Arg){name, value, loc};
}

void build_expr_push(Program *p, ExprList *l, Expr *e) {
  arena_grow(p->arena, (void **)&l->items, &l->cap, l->n + 1, sizeof(Expr *));
  l->items[l->n++] = e;
}

TypeExpr *build_type(Program *p, Loc loc, const char *dtype, Loc dtype_loc, Expr **dims,
                     int ndims) {
  TypeExpr *t = arena_alloc(p->arena, sizeof *t);
  t->loc = loc;
  t->dtype = dtype;
  t->dtype_loc = dtype_loc;
  t->dims = dims;
  t->ndims = ndims;
  if (dtype && strcmp(dtype, "f32") != 0 && strcmp(dtype, "i32") != 0) {
    diag_error(p->diag, dtype_loc, "unknown element type '%s' (expected f32 or i32)", dtype);
    t->dtype = NULL;
  }
  return t;
}

static Stmt *new_stmt(Program *p, StmtKind kind, Loc loc) {
  Stmt *s = arena_alloc(p->arena, sizeof *s);
  s->kind = kind;
  s->loc = loc;
  return s;
}

Stmt *build_assign(Program *p, Loc loc, const char *name, Expr *value) {
  Stmt *s = new_stmt(p, S_ASSIGN, loc);
  s->name = name;
  s->value = value;
  return s;
}

Stmt *build_input(Program *p, Loc loc, const char *name, TypeExpr *type) {
  Stmt *s = new_stmt(p, S_INPUT, loc);
  s->name = name;
  s->type = type;
  return s;
}

Stmt *build_param(Program *p, Loc loc, const char *name, TypeExpr *type) {
  Stmt *s = new_stmt(p, S_PARAM, loc);
  s->name = name;
  s->type = type;
  return s;
}

void build_param_init(Program *p, Stmt *s, Expr *init) {
  if (s->init) diag_error(p->diag, init->loc, "parameter '%s' has two init clauses", s->name);
  s->init = init;
}

void build_param_shard(Program *p, Stmt *s, Expr *shard) {
  if (s->shard) diag_error(p->diag, shard->loc, "parameter '%s' has two shard clauses", s->name);
  s->shard = shard;
}

Stmt *build_expr_stmt(Program *p, Expr *call) {
  Stmt *s = new_stmt(p, S_EXPR, call->loc);
  s->value = call;
  return s;
}

Stmt *build_repeat(Program *p, Loc loc, Expr *count, const char *label, StmtList body) {
  Stmt *s = new_stmt(p, S_REPEAT, loc);
  s->value = count;
  s->label = label;
  s->body = body;
  return s;
}

Stmt *build_if(Program *p, Loc loc, Expr *cond, StmtList body) {
  Stmt *s = new_stmt(p, S_IF, loc);
  s->value = cond;
  s->body = body;
  return s;
}

Stmt *build_return(Program *p, Loc loc, Expr *value) {
  Stmt *s = new_stmt(p, S_RETURN, loc);
  s->value = value;
  return s;
}

Stmt *build_config(Program *p, Loc loc, EntryList entries) {
  Stmt *s = new_stmt(p, S_CONFIG, loc);
  s->entries = entries;
  return s;
}

void build_stmt_push(Program *p, StmtList *l, Stmt *s) {
  if (!s) return;
  arena_grow(p->arena, (void **)&l->items, &l->cap, l->n + 1, sizeof(Stmt *));
  l->items[l->n++] = s;
}

void build_entry(Program *p, EntryList *l, Loc loc, const char *name, Expr *value) {
  for (int i = 0; i < l->n; i++)
    if (strcmp(l->items[i].name, name) == 0) {
      diag_error(p->diag, loc, "'%s' is set twice", name);
      diag_note(p->diag, l->items[i].loc, "first set here");
      return;
    }
  arena_grow(p->arena, (void **)&l->items, &l->cap, l->n + 1, sizeof(Entry));
  l->items[l->n++] = (Entry){name, value, loc};
}

const char *build_label(Program *p, const char *prefix, const char *component) {
  if (!prefix) return component;
  return arena_printf(p->arena, "%s.%s", prefix, component);
}

Block *build_block_start(Program *p, Loc loc, const char *name) {
  Block *b = arena_alloc(p->arena, sizeof *b);
  b->name = name;
  b->loc = loc;
  return b;
}

void build_formal(Program *p, Block *b, Loc loc, const char *name, TypeExpr *type, Expr *def) {
  for (int i = 0; i < b->nformals; i++)
    if (strcmp(b->formals[i].name, name) == 0) {
      diag_error(p->diag, loc, "block '%s' has two arguments named '%s'", b->name, name);
      return;
    }
  arena_grow(p->arena, (void **)&b->formals, &b->capformals, b->nformals + 1, sizeof(Formal));
  b->formals[b->nformals++] = (Formal){name, type, def, loc};
}

void build_block_finish(Program *p, Block *b, StmtList body) {
  b->body = body;
  arena_grow(p->arena, (void **)&p->blocks, &p->capblocks, p->nblocks + 1, sizeof(Block *));
  p->blocks[p->nblocks++] = b;
}

void build_model(Program *p, Loc loc, const char *name, StmtList body) {
  Model *m = arena_alloc(p->arena, sizeof *m);
  m->name = name;
  m->loc = loc;
  m->body = body;
  arena_grow(p->arena, (void **)&p->models, &p->capmodels, p->nmodels + 1, sizeof(Model *));
  p->models[p->nmodels++] = m;
}

void build_train(Program *p, Loc loc, EntryList entries) {
  if (p->ntrain_sections++) {
    diag_error(p->diag, loc, "a second train section");
    diag_note(p->diag, p->train_loc, "the first one is here");
    return;
  }
  p->train = entries;
  p->train_loc = loc;
}
