/* frontend/lex.h -- state shared by the flex scanner and the bison parser. */
#ifndef PARC_LEX_H
#define PARC_LEX_H

#include "frontend/ast.h"
#include "frontend/build.h"

typedef struct {
  Program *prog;
  const Source *src;
  int line, col, off;     /* position of the next byte */
  int depth;              /* open '(' and '[': newlines inside are spaces */
  int last;               /* kind of the last token returned */
  int bad_line;           /* line of the last lexical error: parse errors there are its echo */
} LexState;

/* Updates the location for the token text just matched. */
void lex_advance(LexState *s, Loc *loc, const char *text, int len);
/* Whether a newline here ends a statement. */
int lex_newline(LexState *s);
int lex_token(LexState *s, int tok);
const char *lex_text(LexState *s, const char *text, int len);
void lex_bad_char(LexState *s, const Loc *loc, const char *text, int len);
void lex_bad_number(LexState *s, const Loc *loc, const char *text, int len);

#endif
