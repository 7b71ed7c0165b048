/* tests/runtime/check.h -- minimal assertions for the runtime tests.
 * CHECK records a failure with file:line and goes on; a test's main returns
 * check_result(), nonzero if anything failed. Output stays short: one line per
 * failure, at most CHECK_MAX_REPORTS of them. */
#ifndef PARC_TESTS_RUNTIME_CHECK_H
#define PARC_TESTS_RUNTIME_CHECK_H

#include <stdio.h>
#include <string.h>

#include "runtime/rt_err.h"

#define CHECK_MAX_REPORTS 20

static int check_failures;

static inline void check_report(const char *file, int line, const char *what) {
  if (++check_failures <= CHECK_MAX_REPORTS)
    fprintf(stderr, "%s:%d: FAILED: %s\n", file, line, what);
}

#define CHECK(cond)                                            \
  do {                                                         \
    if (!(cond)) check_report(__FILE__, __LINE__, #cond);      \
  } while (0)

/* An rt_ call that must succeed; prints the runtime's message if not. */
#define CHECK_OK(call)                                                          \
  do {                                                                          \
    if ((call) != 0) {                                                          \
      char m_[1200];                                                            \
      snprintf(m_, sizeof m_, "%s -> %s", #call, rt_last_error());              \
      check_report(__FILE__, __LINE__, m_);                                     \
    }                                                                           \
  } while (0)

/* An rt_ call that must fail with a one-line message containing `needle`. */
#define CHECK_FAILS(call, needle)                                                 \
  do {                                                                            \
    rt_clear_error();                                                             \
    int rc_ = (call);                                                             \
    const char *e_ = rt_last_error();                                             \
    if (rc_ == 0 || !strstr(e_, (needle)) || strchr(e_, '\n')) {                  \
      char m_[1400];                                                              \
      snprintf(m_, sizeof m_, "%s: rc %d, message \"%s\", wanted \"%s\"", #call,   \
               rc_, e_, (needle));                                                \
      check_report(__FILE__, __LINE__, m_);                                       \
    }                                                                             \
  } while (0)

static inline int check_result(const char *name) {
  if (check_failures) fprintf(stderr, "%s: %d check(s) failed\n", name, check_failures);
  return check_failures != 0;
}

#endif
