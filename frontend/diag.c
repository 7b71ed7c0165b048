/* frontend/diag.c -- error and note printing with the source line and a caret. */
#include "frontend/diag.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define LINE_WINDOW 100  /* bytes of a long source line shown around the caret */

void diag_init(Diag *d, FILE *out) {
  memset(d, 0, sizeof *d);
  d->out = out;
  d->max_errors = DIAG_MAX_ERRORS;
}

const char *diag_quote(char *buf, size_t len, const char *s, size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n && k + 8 < len; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c >= 32 && c < 127) buf[k++] = (char)c;
    else k += (size_t)snprintf(buf + k, len - k, "\\x%02x", c);
    if (k + 8 >= len && i + 1 < n) {
      memcpy(buf + k, "...", 3);
      k += 3;
      break;
    }
  }
  buf[k] = 0;
  return buf;
}

/* Prints the line that holds loc, then a caret under loc's column.  Long
 * lines are shown as a window around the column; unprintable bytes as '?'. */
static void show_line(FILE *out, Loc loc) {
  const Source *s = loc.src;
  if (!s || loc.line < 1 || loc.off < 0 || (size_t)loc.off > s->len) return;
  size_t start = (size_t)loc.off, end = (size_t)loc.off;
  while (start > 0 && s->text[start - 1] != '\n') start--;
  while (end < s->len && s->text[end] != '\n') end++;
  size_t caret = (size_t)loc.off;
  size_t from = start, to = end;
  if (caret - from > LINE_WINDOW / 2) from = caret - LINE_WINDOW / 2;
  if (to - from > LINE_WINDOW) to = from + LINE_WINDOW;
  fputs("  ", out);
  if (from > start) fputs("...", out);
  for (size_t i = from; i < to; i++) {
    unsigned char c = (unsigned char)s->text[i];
    fputc(c == '\t' || (c >= 32 && c < 127) ? c : '?', out);
  }
  if (to < end) fputs("...", out);
  fputs("\n  ", out);
  if (from > start) fputs("   ", out);
  for (size_t i = from; i < caret; i++) fputc(s->text[i] == '\t' ? '\t' : ' ', out);
  fputc('^', out);
  for (int i = 1; i < loc.len && i < 40 && caret + (size_t)i < to; i++) fputc('~', out);
  fputc('\n', out);
}

static void emit(Diag *d, Loc loc, const char *kind, const char *fmt, va_list ap) {
  if (loc.src) fprintf(d->out, "%s:%d:%d: %s: ", loc.src->path, loc.line, loc.col, kind);
  else fprintf(d->out, "parc: %s: ", kind);
  vfprintf(d->out, fmt, ap);
  fputc('\n', d->out);
  show_line(d->out, loc);
}

void diag_error(Diag *d, Loc loc, const char *fmt, ...) {
  d->errors++;
  if (d->errors > d->max_errors) {
    d->suppressed++;
    return;
  }
  va_list ap;
  va_start(ap, fmt);
  emit(d, loc, "error", fmt, ap);
  va_end(ap);
}

void diag_note(Diag *d, Loc loc, const char *fmt, ...) {
  if (d->errors > d->max_errors) return;
  va_list ap;
  va_start(ap, fmt);
  emit(d, loc, "note", fmt, ap);
  va_end(ap);
}

void diag_finish(Diag *d) {
  if (d->suppressed)
    fprintf(d->out, "parc: %d more error(s) not shown (%d in all)\n", d->suppressed, d->errors);
}

int source_load(Source *s, const char *path) {
  memset(s, 0, sizeof *s);
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "parc: error: cannot open '%s': %s\n", path, strerror(errno));
    return 0;
  }
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  for (;;) {
    if (!buf) break;
    if (n == cap) {
      if (cap > ((size_t)1 << 31)) {
        fprintf(stderr, "parc: error: '%s' is larger than 2 GiB\n", path);
        free(buf);
        fclose(f);
        return 0;
      }
      char *nb = realloc(buf, cap * 2);
      if (!nb) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = nb;
      cap *= 2;
    }
    size_t k = fread(buf + n, 1, cap - n, f);
    n += k;
    if (k == 0) break;
  }
  int err = ferror(f) ? errno : 0;
  fclose(f);
  if (!buf || err) {
    fprintf(stderr, "parc: error: cannot read '%s': %s\n", path, buf ? strerror(err) : "out of memory");
    free(buf);
    return 0;
  }
  s->path = path;
  s->text = buf;
  s->len = n;
  return 1;
}

void source_free(Source *s) {
  free((char *)s->text);
  s->text = NULL;
}
