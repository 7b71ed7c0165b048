/* frontend/ast.h -- the syntax tree the parser builds (through build.c).
 *
 * Every node carries the Loc of the token it came from.  All nodes live in
 * the parse arena.  Expressions carry their nesting depth, bounded by
 * AST_MAX_DEPTH, so that no later recursive walk can exhaust the stack. */
#ifndef PARC_AST_H
#define PARC_AST_H

#include <stdint.h>

#include "frontend/diag.h"
#include "ir/arena.h"

#define AST_MAX_DEPTH 256

typedef enum { E_INT, E_FLOAT, E_NAME, E_BINARY, E_NEG, E_CALL, E_ERROR } ExprKind;

typedef struct Expr Expr;
typedef struct Arg {
  const char *name;      /* named argument, or NULL for positional */
  Expr *value;
  Loc loc;
} Arg;

struct Expr {
  ExprKind kind;
  Loc loc;
  int depth;
  int64_t ival;          /* E_INT */
  double fval;           /* E_FLOAT */
  const char *name;      /* E_NAME: a dotted path; E_CALL: callee path */
  int op;                /* E_BINARY: '+', '-', '*', '/', '%' */
  Expr *lhs, *rhs;       /* E_BINARY; E_NEG uses lhs */
  Arg *args;             /* E_CALL */
  int nargs;
  const char *label;     /* E_CALL with "as label": scope for its parameters */
};

typedef struct {
  const char *dtype;     /* "f32", "i32" or NULL when omitted */
  Loc dtype_loc;
  Expr **dims;
  int ndims;
  Loc loc;
} TypeExpr;

typedef enum { S_ASSIGN, S_INPUT, S_PARAM, S_REPEAT, S_IF, S_RETURN, S_CONFIG, S_EXPR } StmtKind;

typedef struct Stmt Stmt;
typedef struct { Stmt **items; int n, cap; } StmtList;

typedef struct {
  const char *name;
  Expr *value;
  Loc loc;
} Entry;
typedef struct { Entry *items; int n, cap; } EntryList;

struct Stmt {
  StmtKind kind;
  Loc loc;
  const char *name;      /* S_ASSIGN, S_INPUT, S_PARAM target */
  Expr *value;           /* S_ASSIGN, S_RETURN, S_EXPR; S_REPEAT: count; S_IF: condition */
  TypeExpr *type;        /* S_INPUT, S_PARAM */
  Expr *init;            /* S_PARAM: init expression or NULL */
  Expr *shard;           /* S_PARAM: shard intent or NULL */
  const char *label;     /* S_REPEAT: scope prefix or NULL */
  StmtList body;         /* S_REPEAT, S_IF */
  EntryList entries;     /* S_CONFIG */
};

typedef struct {
  const char *name;
  TypeExpr *type;        /* shape pattern, or NULL */
  Expr *def;             /* default value, or NULL */
  Loc loc;
} Formal;

typedef struct {
  const char *name;
  Loc loc;
  Formal *formals;
  int nformals, capformals;
  StmtList body;
} Block;

typedef struct {
  const char *name;
  Loc loc;
  StmtList body;
} Model;

/* Everything parsed from one or more files (the prelude, then the user's). */
typedef struct {
  Arena *arena;
  Diag *diag;
  const Source *main_src;   /* the user's file, for errors about it as a whole */
  Model **models;  int nmodels, capmodels;
  Block **blocks;  int nblocks, capblocks;
  EntryList train; int ntrain_sections;
  Loc train_loc;
} Program;

#endif
