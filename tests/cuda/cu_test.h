/* tests/cuda/cu_test.h -- what the generated-CUDA text tests share: a failure
 * counter with CHECK, reading a generated file, and cutting one kernel's
 * section out of kernels.cu.  Header-only; each test is one translation unit.
 * C or C++ (the emulation's checks, tests/cuda/emu, are C++). */
#ifndef PARC_TESTS_CU_TEST_H
#define PARC_TESTS_CU_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

/* CHECK(cond, fmt, ...): count and report a failed condition, go on. */
#define CHECK(c, ...)                                              \
  do {                                                             \
    if (!(c)) {                                                    \
      fprintf(stderr, "%s:%d: FAIL %s: ", __FILE__, __LINE__, #c); \
      fprintf(stderr, __VA_ARGS__);                                \
      fputc('\n', stderr);                                         \
      failures++;                                                  \
    }                                                              \
  } while (0)

/* The whole file at path, NUL-terminated (malloc'd), or NULL if unreadable. */
static inline char *cu_slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = n >= 0 ? (char *)malloc((size_t)n + 1) : NULL;
  if (s && fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
  if (s) s[n] = 0;
  fclose(f);
  return s;
}

/* dir/file as cu_slurp reads it; exits 1 with a message when it cannot. */
static inline char *cu_slurp_in(const char *dir, const char *file) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  char *s = cu_slurp(path);
  if (!s) {
    fprintf(stderr, "cannot read %s\n", path);
    exit(1);
  }
  return s;
}

/* The text of kernel `name` in kernels.cu: its comment, kernel and launcher
 * (malloc'd; empty when there is no such kernel). */
static inline char *cu_section(const char *cu, const char *name) {
  char head[256];
  snprintf(head, sizeof head, "/* ---- %s: ", name);
  const char *a = strstr(cu, head);
  if (!a) return (char *)calloc(1, 1);
  const char *b = strstr(a + 1, "/* ---- ");
  size_t n = b ? (size_t)(b - a) : strlen(a);
  char *s = (char *)malloc(n + 1);
  memcpy(s, a, n);
  s[n] = 0;
  return s;
}

#endif
