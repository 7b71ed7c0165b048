/* frontend/diag.h -- diagnostics in one format:
 *
 *   file:line:col: error: message
 *     source line
 *           ^
 *
 * Every AST node keeps a Loc, so any later error can point at source. */
#ifndef PARC_DIAG_H
#define PARC_DIAG_H

#include <stddef.h>
#include <stdio.h>

typedef struct {
  const char *path;      /* as given by the user, or "<prelude>" */
  const char *text;      /* whole file, may contain NUL bytes */
  size_t len;
} Source;

typedef struct {
  const Source *src;     /* NULL: no location (command line) */
  int line, col;         /* 1-based; col counts bytes */
  int off, len;          /* byte range of the token in src->text */
} Loc;

typedef struct {
  FILE *out;
  int errors;
  int max_errors;        /* stop reporting (and tell the user) past this */
  int suppressed;
} Diag;

#define DIAG_MAX_ERRORS 20

void diag_init(Diag *d, FILE *out);
void diag_error(Diag *d, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void diag_note(Diag *d, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Prints "N errors generated." style summary, if any were suppressed. */
void diag_finish(Diag *d);

/* Copies s into buf, escaping unprintable bytes and cutting it at about
 * len-8 bytes with "..." so that a megabyte identifier stays one short line. */
const char *diag_quote(char *buf, size_t len, const char *s, size_t n);

/* Reads a whole file; on failure prints a one-line message and returns 0. */
int source_load(Source *s, const char *path);
void source_free(Source *s);

#endif
