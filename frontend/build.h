/* frontend/build.h -- constructors the grammar actions call, one per rule.
 * Keeps parser.y small: each action is one call here. */
#ifndef PARC_BUILD_H
#define PARC_BUILD_H

#include "frontend/ast.h"

Expr *build_int(Program *p, Loc loc, const char *text, int len);
Expr *build_float(Program *p, Loc loc, const char *text, int len);
Expr *build_name(Program *p, Loc loc, const char *name);
Expr *build_path(Program *p, Expr *path, Loc loc, const char *component);
Expr *build_binary(Program *p, Loc loc, int op, Expr *lhs, Expr *rhs);
Expr *build_neg(Program *p, Loc loc, Expr *e);
Expr *build_call(Program *p, Expr *callee, Arg *args, int nargs, const char *label);
Expr *build_error(Program *p, Loc loc);

/* Argument lists: a growable array with its count and capacity. */
typedef struct { Arg *items; int n, cap; } ArgList;
void build_arg(Program *p, ArgList *l, Loc loc, const char *name, Expr *value);

TypeExpr *build_type(Program *p, Loc loc, const char *dtype, Loc dtype_loc, Expr **dims,
                     int ndims);
typedef struct { Expr **items; int n, cap; } ExprList;
void build_expr_push(Program *p, ExprList *l, Expr *e);

Stmt *build_assign(Program *p, Loc loc, const char *name, Expr *value);
Stmt *build_input(Program *p, Loc loc, const char *name, TypeExpr *type);
Stmt *build_param(Program *p, Loc loc, const char *name, TypeExpr *type);
void build_param_init(Program *p, Stmt *s, Expr *init);
void build_param_shard(Program *p, Stmt *s, Expr *shard);
Stmt *build_expr_stmt(Program *p, Expr *call);
Stmt *build_repeat(Program *p, Loc loc, Expr *count, const char *label, StmtList body);
Stmt *build_if(Program *p, Loc loc, Expr *cond, StmtList body);
Stmt *build_return(Program *p, Loc loc, Expr *value);
Stmt *build_config(Program *p, Loc loc, EntryList entries);
void build_stmt_push(Program *p, StmtList *l, Stmt *s);
void build_entry(Program *p, EntryList *l, Loc loc, const char *name, Expr *value);

const char *build_label(Program *p, const char *prefix, const char *component);

Block *build_block_start(Program *p, Loc loc, const char *name);
void build_formal(Program *p, Block *b, Loc loc, const char *name, TypeExpr *type, Expr *def);
void build_block_finish(Program *p, Block *b, StmtList body);
void build_model(Program *p, Loc loc, const char *name, StmtList body);
void build_train(Program *p, Loc loc, EntryList entries);

/* Parses text (from src) into p; returns the number of syntax errors. */
int parse_source(Program *p, const Source *src);

#endif
