/* runtime/rt_err.c -- thread-local last-error buffer; see rt_err.h. */
#include "runtime/rt_err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char rt_errbuf[RT_ERR_MAX];

const char *rt_last_error(void) { return rt_errbuf; }

void rt_clear_error(void) { rt_errbuf[0] = '\0'; }

static void record(const char *fmt, va_list ap) __attribute__((format(printf, 1, 0)));
static void record(const char *fmt, va_list ap) {
  char tmp[RT_ERR_MAX];
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  if (n < 0) {
    snprintf(tmp, sizeof tmp, "runtime error (message could not be formatted)");
  } else if ((size_t)n >= sizeof tmp) {
    memcpy(tmp + sizeof tmp - 4, "...", 4);
  }
  /* One line: control characters (newlines from strerror or file names) become spaces. */
  for (char *p = tmp; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = ' ';
  memcpy(rt_errbuf, tmp, sizeof tmp);
}

int rt_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  record(fmt, ap);
  va_end(ap);
  return RT_ERR;
}

int rt_fail_setup(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  record(fmt, ap);
  va_end(ap);
  return RT_ERR_SETUP;
}
