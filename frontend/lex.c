/* frontend/lex.c -- scanner helpers and the entry point that runs the parser. */
#include "frontend/lex.h"

#include <string.h>

#include "parser.h"
#define YYSTYPE DSL_STYPE
#define YYLTYPE Loc
#include "lexer.h"

void lex_advance(LexState *s, Loc *loc, const char *text, int len) {
  loc->src = s->src;
  loc->line = s->line;
  loc->col = s->col;
  loc->off = s->off;
  loc->len = len;
  for (int i = 0; i < len; i++) {
    if (text[i] == '\n') {
      s->line++;
      s->col = 1;
    } else {
      s->col++;
    }
  }
  s->off += len;
}

int lex_newline(LexState *s) {
  if (s->depth > 0) return 0;
  switch (s->last) {
  case IDENT: case INT: case FLOAT: case INT_ERROR: case ')': case ']': case '}':
    return 1;
  default:
    return 0;
  }
}

int lex_token(LexState *s, int tok) {
  s->last = tok;
  return tok;
}

const char *lex_text(LexState *s, const char *text, int len) {
  return arena_strndup(s->prog->arena, text, (size_t)len);
}

void lex_bad_char(LexState *s, const Loc *loc, const char *text, int len) {
  char q[64];
  s->bad_line = loc->line;
  unsigned char c = (unsigned char)text[0];
  if (c >= 0x80)
    diag_error(s->prog->diag, *loc, "non-ASCII bytes '%s' outside a comment",
               diag_quote(q, sizeof q, text, (size_t)len));
  else
    diag_error(s->prog->diag, *loc, "unexpected character '%s'",
               diag_quote(q, sizeof q, text, (size_t)len));
}

void lex_bad_number(LexState *s, const Loc *loc, const char *text, int len) {
  char q[64];
  s->bad_line = loc->line;
  diag_error(s->prog->diag, *loc, "malformed number '%s'", diag_quote(q, sizeof q, text, (size_t)len));
}

int parse_source(Program *p, const Source *src) {
  LexState st = {.prog = p, .src = src, .line = 1, .col = 1};
  yyscan_t scanner;
  if (dsl_lex_init_extra(&st, &scanner)) return 1;
  if (src->len > (size_t)1 << 30) {
    diag_error(p->diag, (Loc){0}, "'%s' is larger than 1 GiB", src->path);
    dsl_lex_destroy(scanner);
    return 1;
  }
  YY_BUFFER_STATE buf = dsl__scan_bytes(src->text, (int)src->len, scanner);
  int before = p->diag->errors;
  int rc = dsl_parse(scanner, &st);
  dsl__delete_buffer(buf, scanner);
  dsl_lex_destroy(scanner);
  return rc || p->diag->errors > before;
}
