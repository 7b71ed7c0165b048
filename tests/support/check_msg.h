/* tests/support/check_msg.h -- a CHECK with a printf-style message, for the
 * compiler-side unit tests: a failure prints "FAIL file:line: message" and
 * the test goes on; `checks` counts the checks made, `failures` those that
 * failed (main prints both and returns failures != 0). */
#ifndef PARC_TESTS_SUPPORT_CHECK_MSG_H
#define PARC_TESTS_SUPPORT_CHECK_MSG_H

#include <stdio.h>

static int failures, checks;

#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    checks++;                                                                                      \
    if (!(cond)) {                                                                                 \
      failures++;                                                                                  \
      printf("FAIL %s:%d: ", __FILE__, __LINE__);                                                  \
      printf(__VA_ARGS__);                                                                         \
      printf("\n");                                                                                \
    }                                                                                              \
  } while (0)

#endif
