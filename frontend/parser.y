/* frontend/parser.y -- grammar of the parc DSL.
 * Each action is one call into frontend/build.c. */
%define api.pure full
%define api.prefix {dsl_}
%define api.location.type {Loc}
%define parse.error custom
%define parse.lac full
%locations
%expect 0
%param {void *scanner}
%parse-param {LexState *lex}

%code requires {
#include "frontend/lex.h"
typedef struct { const char *text; int len; } TokText;
}

%code provides {
int dsl_lex(DSL_STYPE *lval, Loc *lloc, void *scanner);
}

%code {
#include <stdio.h>
#include <string.h>
#define YYMAXDEPTH 2000
#define YYLLOC_DEFAULT(Cur, Rhs, N)                                   \
  do {                                                                \
    if (N) { (Cur) = YYRHSLOC(Rhs, 1);                                \
             (Cur).len = YYRHSLOC(Rhs, N).off + YYRHSLOC(Rhs, N).len - (Cur).off; } \
    else { (Cur) = YYRHSLOC(Rhs, 0); (Cur).off += (Cur).len; (Cur).len = 0; } \
  } while (0)
static void dsl_error(Loc *loc, void *scanner, LexState *lex, const char *msg);
#define P (lex->prog)
}

%union {
  const char *str;
  TokText tok;
  Expr *expr;
  Stmt *stmt;
  StmtList stmts;
  EntryList entries;
  ArgList args;
  ExprList exprs;
  TypeExpr *type;
  Block *block;
}

%token MODEL "'model'" CONFIG "'config'" INPUT "'input'" PARAM "'param'"
%token BLOCK "'block'" REPEAT "'repeat'" RETURN "'return'" TRAIN "'train'"
%token INIT "'init'" SHARD "'shard'" AS "'as'" IF "'if'"
%token NL "end of line"
%token <str> IDENT "name"
%token <tok> INT "integer" FLOAT "number"
%token INT_ERROR "malformed number"

%type <str> word label
%type <expr> expr primary path call count
%type <stmt> stmt param_decl
%type <stmts> body
%type <entries> entries
%type <args> args args_opt
%type <exprs> dims dims_opt
%type <type> type
%type <block> block_head formals

%left '+' '-'
%left '*' '/' '%'
%precedence UMINUS

%%

/* file: { model | block | train | separator } */
file
  : %empty
  | file model
  | file block
  | file train
  | file sep
  | file error sep                          { yyerrok; }
  | file error '}'                          { yyerrok; }
  ;

sep : NL | ';' ;

/* model: 'model' NAME '{' body '}' */
model
  : MODEL IDENT '{' body '}'                { build_model(P, @2, $2, $4); }
  ;

/* train: 'train' '{' entries '}' */
train
  : TRAIN '{' entries '}'                   { build_train(P, @1, $3); }
  ;

/* block: 'block' NAME '(' [formal {',' formal}] ')' '{' body '}' */
block
  : block_head ')' '{' body '}'             { build_block_finish(P, $1, $4); }
  | formals ')' '{' body '}'                { build_block_finish(P, $1, $4); }
  ;

block_head
  : BLOCK IDENT '('                         { $$ = build_block_start(P, @2, $2); }
  ;

/* formal: NAME [':' type] ['=' expr] */
formals
  : block_head IDENT                        { $$ = $1; build_formal(P, $1, @2, $2, NULL, NULL); }
  | block_head IDENT ':' type               { $$ = $1; build_formal(P, $1, @2, $2, $4, NULL); }
  | block_head IDENT '=' expr               { $$ = $1; build_formal(P, $1, @2, $2, NULL, $4); }
  | formals ',' IDENT                       { $$ = $1; build_formal(P, $1, @3, $3, NULL, NULL); }
  | formals ',' IDENT ':' type              { $$ = $1; build_formal(P, $1, @3, $3, $5, NULL); }
  | formals ',' IDENT '=' expr              { $$ = $1; build_formal(P, $1, @3, $3, NULL, $5); }
  ;

body
  : %empty                                  { $$ = (StmtList){0}; }
  | body stmt                               { $$ = $1; build_stmt_push(P, &$$, $2); }
  | body sep                                { $$ = $1; }
  | body error sep                          { $$ = $1; yyerrok; }
  ;

/* stmt: NAME '=' expr | 'input' NAME ':' type | param | 'repeat' count ['as' label] '{' body '}'
 *     | 'if' expr '{' body '}' | 'return' expr | 'config' '{' entries '}' | call */
stmt
  : IDENT '=' expr                          { $$ = build_assign(P, @1, $1, $3); }
  | INPUT IDENT ':' type                    { $$ = build_input(P, @2, $2, $4); }
  | param_decl                              { $$ = $1; }
  | REPEAT count '{' body '}'               { $$ = build_repeat(P, @1, $2, NULL, $4); }
  | REPEAT count AS label '{' body '}'      { $$ = build_repeat(P, @1, $2, $4, $6); }
  | IF expr '{' body '}'                    { $$ = build_if(P, @1, $2, $4); }
  | RETURN expr                             { $$ = build_return(P, @1, $2); }
  | CONFIG '{' entries '}'                  { $$ = build_config(P, @1, $3); }
  | call                                    { $$ = build_expr_stmt(P, $1); }
  ;

/* count: INT | path | '(' expr ')' -- no call, so 'as' after it is the repeat's */
count
  : INT                                     { $$ = build_int(P, @1, $1.text, $1.len); }
  | path                                    { $$ = $1; }
  | '(' expr ')'                            { $$ = $2; }
  ;

/* param: 'param' word ':' type {'init' primary | 'shard' primary} */
param_decl
  : PARAM word ':' type                     { $$ = build_param(P, @2, $2, $4); }
  | param_decl INIT primary                 { $$ = $1; build_param_init(P, $1, $3); }
  | param_decl SHARD primary                { $$ = $1; build_param_shard(P, $1, $3); }
  ;

/* entries: { NAME '=' expr | separator } */
entries
  : %empty                                  { $$ = (EntryList){0}; }
  | entries IDENT '=' expr                  { $$ = $1; build_entry(P, &$$, @2, $2, $4); }
  | entries sep                             { $$ = $1; }
  | entries error sep                       { $$ = $1; yyerrok; }
  ;

/* type: [NAME] '[' [expr {',' expr}] ']' */
type
  : '[' dims_opt ']'                        { $$ = build_type(P, @1, NULL, @1, $2.items, $2.n); }
  | IDENT '[' dims_opt ']'                  { $$ = build_type(P, @1, $1, @1, $3.items, $3.n); }
  ;

dims_opt
  : %empty                                  { $$ = (ExprList){0}; }
  | dims                                    { $$ = $1; }
  ;

dims
  : expr                                    { $$ = (ExprList){0}; build_expr_push(P, &$$, $1); }
  | dims ',' expr                           { $$ = $1; build_expr_push(P, &$$, $3); }
  ;

expr
  : expr '+' expr                           { $$ = build_binary(P, @2, '+', $1, $3); }
  | expr '-' expr                           { $$ = build_binary(P, @2, '-', $1, $3); }
  | expr '*' expr                           { $$ = build_binary(P, @2, '*', $1, $3); }
  | expr '/' expr                           { $$ = build_binary(P, @2, '/', $1, $3); }
  | expr '%' expr                           { $$ = build_binary(P, @2, '%', $1, $3); }
  | '-' expr %prec UMINUS                   { $$ = build_neg(P, @1, $2); }
  | primary                                 { $$ = $1; }
  ;

primary
  : INT                                     { $$ = build_int(P, @1, $1.text, $1.len); }
  | FLOAT                                   { $$ = build_float(P, @1, $1.text, $1.len); }
  | INT_ERROR                               { $$ = build_error(P, @1); }
  | path                                    { $$ = $1; }
  | call                                    { $$ = $1; }
  | '(' expr ')'                            { $$ = $2; }
  ;

/* path: NAME {'.' word} */
path
  : IDENT                                   { $$ = build_name(P, @1, $1); }
  | path '.' word                           { $$ = build_path(P, $1, @3, $3); }
  ;

/* call: path '(' [arg {',' arg}] ')' ['as' label] ; arg: [NAME '='] expr */
call
  : path '(' args_opt ')'                   { $$ = build_call(P, $1, $3.items, $3.n, NULL); }
  | path '(' args_opt ')' AS label          { $$ = build_call(P, $1, $3.items, $3.n, $6); }
  ;

args_opt
  : %empty                                  { $$ = (ArgList){0}; }
  | args                                    { $$ = $1; }
  ;

args
  : expr                                    { $$ = (ArgList){0}; build_arg(P, &$$, @1, NULL, $1); }
  | IDENT '=' expr                          { $$ = (ArgList){0}; build_arg(P, &$$, @1, $1, $3); }
  | args ',' expr                           { $$ = $1; build_arg(P, &$$, @3, NULL, $3); }
  | args ',' IDENT '=' expr                 { $$ = $1; build_arg(P, &$$, @3, $3, $5); }
  ;

/* label: word {'.' word} -- keywords allowed, for names like model.layers */
label
  : word                                    { $$ = $1; }
  | label '.' word                          { $$ = build_label(P, $1, $3); }
  ;

word
  : IDENT     { $$ = $1; }
  | MODEL     { $$ = "model"; }   | CONFIG { $$ = "config"; } | INPUT { $$ = "input"; }
  | PARAM     { $$ = "param"; }   | BLOCK  { $$ = "block"; }  | REPEAT { $$ = "repeat"; }
  | RETURN    { $$ = "return"; }  | TRAIN  { $$ = "train"; }  | INIT { $$ = "init"; }
  | SHARD     { $$ = "shard"; }   | IF { $$ = "if"; }
  ;

%%

/* "expected X or Y, saw 'text'" with the offending token's own text. */
static int yyreport_syntax_error(const yypcontext_t *ctx, void *scanner, LexState *lex) {
  (void)scanner;
  enum { MAXEXP = 6 };
  /* Recovery resumes at the next statement end: forget open brackets, so
   * that newlines end statements again. */
  lex->depth = 0;
  if (yypcontext_location(ctx)->line == lex->bad_line) {
    lex->prog->diag->errors++; /* the lexer already explained this line */
    return 0;
  }
  yysymbol_kind_t expected[MAXEXP];
  int n = yypcontext_expected_tokens(ctx, expected, MAXEXP), kept = 0;
  for (int i = 0; i < n; i++) /* a malformed number is never what anyone means */
    if (expected[i] != YYSYMBOL_INT_ERROR) expected[kept++] = expected[i];
  n = kept;
  yysymbol_kind_t tok = yypcontext_token(ctx);
  const Loc *loc = yypcontext_location(ctx);
  char msg[512], saw[96];
  size_t k = 0;
  if (n > 0) {
    k += (size_t)snprintf(msg, sizeof msg, "expected ");
    for (int i = 0; i < n && k < sizeof msg; i++)
      k += (size_t)snprintf(msg + k, sizeof msg - k, "%s%s", i == 0 ? "" : i == n - 1 ? " or " : ", ",
                            yysymbol_name(expected[i]));
    if (k < sizeof msg) k += (size_t)snprintf(msg + k, sizeof msg - k, ", ");
  }
  if (tok == YYSYMBOL_YYEOF) snprintf(saw, sizeof saw, "end of file");
  else if (tok == YYSYMBOL_NL) snprintf(saw, sizeof saw, "end of line");
  else {
    char q[64];
    snprintf(saw, sizeof saw, "'%s'",
             diag_quote(q, sizeof q, lex->src->text + loc->off, (size_t)loc->len));
  }
  if (k < sizeof msg) snprintf(msg + k, sizeof msg - k, "%s%s", k ? "saw " : "unexpected ", saw);
  if (n == 0 && k == 0) snprintf(msg, sizeof msg, "unexpected %s", saw);
  diag_error(lex->prog->diag, *loc, "%s", msg);
  return 0;
}

static void dsl_error(Loc *loc, void *scanner, LexState *lex, const char *msg) {
  (void)scanner;
  if (strstr(msg, "exhausted"))
    diag_error(lex->prog->diag, *loc, "nesting too deep: the parser gave up here");
  else
    diag_error(lex->prog->diag, *loc, "%s", msg);
}
