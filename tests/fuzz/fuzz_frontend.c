/* tests/fuzz/fuzz_frontend.c -- libFuzzer target over the whole frontend:
 * parse (with the prelude), lower, run the passes, check a layout, cost it.
 * Any crash, leak, hang or sanitizer report is a bug. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/build.h"
#include "frontend/lower.h"
#include "passes/passes.h"

extern const char parc_prelude[];
extern const unsigned long parc_prelude_len;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static FILE *sink;
  if (!sink) sink = fopen("/dev/null", "w");
  char *text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = 0;
  Source prelude = {"prelude.dsl", parc_prelude, parc_prelude_len};
  Source user = {"fuzz.dsl", text, size};
  Arena arena = {0};
  Diag diag;
  diag_init(&diag, sink);
  Program prog = {.arena = &arena, .diag = &diag, .main_src = &user};
  parse_source(&prog, &prelude);
  parse_source(&prog, &user);
  Override ov[] = {{"layers", "2"}};
  IrModule *m = diag.errors ? NULL : lower_program(&prog, ov, size % 2);
  if (m) {
    PassOptions opt = {.verify = 1, .dump = sink};
    if (pass_run_all(m, &opt)) abort(); /* the verifier rejected a pass's output */
    Layout lay = {1 + (int)(size % 4), 1 + (int)(size % 3), 2, 1 + (int)(size % 2), 0};
    layout_check(m, &lay, sink);
    Cost cost;
    cost_analyze(m, &lay, &cost);
    ir_module_free(m);
  }
  arena_free(&arena);
  free(text);
  return 0;
}
