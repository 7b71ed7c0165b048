/* tests/support/load.c -- see load.h. */
#include "tests/support/load.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/build.h"
#include "passes/passes.h"

extern const char parc_prelude[];
extern const unsigned long parc_prelude_len;

IrModule *test_load(const char *path, const char *const *defines, int n) {
  Source prelude = {"prelude.dsl", parc_prelude, parc_prelude_len}, user;
  if (!source_load(&user, path)) return NULL;
  Arena arena = {0};
  Diag diag;
  diag_init(&diag, stderr);
  Program prog = {.arena = &arena, .diag = &diag, .main_src = &user};
  Override *ov = arena_alloc(&arena, sizeof(Override) * (size_t)(n + 1));
  for (int i = 0; i < n; i++) {
    char *d = arena_strdup(&arena, defines[i]);
    char *eq = strchr(d, '=');
    if (!eq) return NULL;
    *eq = 0;
    ov[i] = (Override){d, eq + 1};
  }
  parse_source(&prog, &prelude);
  parse_source(&prog, &user);
  IrModule *m = diag.errors ? NULL : lower_program(&prog, ov, n);
  PassOptions opt = {.verify = 1, .dump = stderr, .stop_after = "dce"}; /* the forward module */
  if (m && pass_run_all(m, &opt)) {
    ir_module_free(m);
    m = NULL;
  }
  arena_free(&arena);
  source_free(&user);
  return m;
}

IrModule *test_load_step(const char *path, const char *const *defines, int n) {
  IrModule *m = test_load(path, defines, n);
  char err[512];
  if (!m || pass_autodiff(m) || pass_optimizer(m) || ir_verify(m, err, sizeof err)) {
    printf("FAIL: %s does not compile\n", path);
    if (m) ir_module_free(m);
    return NULL;
  }
  return m;
}

IrModule *test_load_full(const char *path, const char *const *defines, int n) {
  IrModule *m = test_load(path, defines, n);
  PassOptions opt = {.verify = 1, .dump = stderr, .start_after = "dce"};
  char err[512];
  if (!m || pass_run_all(m, &opt) || ir_verify(m, err, sizeof err)) {
    printf("FAIL: %s does not compile\n", path);
    if (m) ir_module_free(m);
    return NULL;
  }
  return m;
}
