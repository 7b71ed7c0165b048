/* tests/cuda/cu_profile.c -- the profile's records in a generated GPU
 * trainer (codegen/host_cuda.c, runtime/cuda/rt_cuda_prof.h), without a GPU:
 *
 *   - every fused kernel launch `NAME_launch(...);` has PROF_BEGIN(); on the
 *     line before and LAUNCHED("NAME", BYTES); on the line after, BYTES > 0;
 *   - every function that launches reads prof_ (rt_cuda_profiling) once;
 *   - runtime calls are not bracketed by the generated code (they time
 *     themselves);
 *   - a batched launch (codegen/cuda_batch.h) `NAME_multi_launch(&b_, N, ...)`
 *     likewise, inside its block, with LAUNCHED("NAME_multi", BYTES);
 *   - without a pipeline (plan.json's layout pp 1): the launches are
 *     plan.json's kernels in order, less those marked "view" (a reshape
 *     written over its input, which runs nowhere) and those marked
 *     "gpu_batch_of" (run by their batch's first member, "gpu_batch": N, whose
 *     launch is the batched one of N instances) and those marked "gpu_in_gemm"
 *     (a bias sum or bias add computed with that GEMM node's call: its launch, where the
 *     epilogue did not, is in the GEMM's `if (!summed_) { /+ %N ...` block,
 *     N its first node, 4 spaces in; each such kernel has one), and where every argument's buffer is
 *     known (plan.json's params, state, and the arena buffer at that offset
 *     that the kernel writes or that is live when it runs), BYTES is at least
 *     the kernel's outputs (written whole) and at most twice all its
 *     arguments (twice: a buffer read and written); with --partial, some
 *     kernel moves less than its arguments' total (one reading a slice of a
 *     wider buffer, e.g. split_heads of GPT-2's fused qkv, counts the slice).
 *
 *   cu_profile DIR [--partial]     (DIR holds train_cuda.c and plan.json) */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/cuda/cu_test.h"


static void fail(int line, const char *what, const char *text) {
  if (failures++ < 20) fprintf(stderr, "cu_profile: train_cuda.c:%d: %s: %s\n", line, what, text);
}


static cJSON *plan;
static int pipelined;

static double numel(const cJSON *shape) {
  double n = 1;
  const cJSON *d;
  cJSON_ArrayForEach(d, shape) n *= d->valuedouble;
  return n;
}

static double num(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItem(o, key);
  return v ? v->valuedouble : -1;
}

/* Bytes of the buffer an argument expression of kernel k (plan.json's) names;
 * -1 when unknown.  *out: 1 if the kernel writes it (one of its nodes). */
static double arg_bytes(const char *a, const cJSON *k, int *out) {
  long long off;
  *out = 0;
  if (!strcmp(a, "lr") || !strcmp(a, "t")) return 4;
  if (sscanf(a, "F(%lld)", &off) == 1 || sscanf(a, "I(%lld)", &off) == 1) {
    /* the arena reuses offsets: the buffer there that the kernel writes, or the
     * one live when it runs (made before its root, read at or after its first node) */
    const cJSON *nodes = cJSON_GetObjectItem(k, "nodes"), *v, *b;
    double lo = 1e18, root = -1, found = -1;
    int live = 0;
    cJSON_ArrayForEach(v, nodes) {
      lo = v->valuedouble < lo ? v->valuedouble : lo;
      root = v->valuedouble > root ? v->valuedouble : root;
    }
    if (root < 0) return -1; /* a statistics kernel: no nodes */
    cJSON_ArrayForEach(b, cJSON_GetObjectItem(plan, "buffers")) {
      if (num(b, "offset") != (double)off) continue;
      int mine = 0;
      cJSON_ArrayForEach(v, nodes) mine |= v->valuedouble == num(b, "node");
      double bytes = 4 * numel(cJSON_GetObjectItem(b, "shape")); /* "bytes" is rounded up */
      if (mine) {
        *out = 1;
        return bytes;
      }
      if (num(b, "node") < root && num(b, "last_use") >= lo) live++, found = bytes;
    }
    return live == 1 ? found : -1;
  }
  const char *list = !strncmp(a, "P + ", 4) ? "params" : !strncmp(a, "S + ", 4) ? "state" : NULL;
  if (list && sscanf(a + 4, "%lld", &off) == 1) {
    const cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(plan, list)) {
      if (cJSON_GetObjectItem(p, "offset")->valuedouble == (double)off)
        return 4 * numel(cJSON_GetObjectItem(p, "shape"));
    }
  }
  return -1;
}

/* 1 if plan.json's kernel k has a launch of its own (or leads a batch): not a
 * view, not a member of another's batch. */
static int runs(const cJSON *k) {
  return !cJSON_IsTrue(cJSON_GetObjectItem(k, "view")) && num(k, "gpu_batch_of") < 0 &&
         num(k, "gpu_in_gemm") < 0;
}

/* plan.json's kernel whose first node is `node` and that runs with a GEMM
 * (gpu_in_gemm: a bias sum, or a bias add), or NULL. */
static const cJSON *bias_kernel(const cJSON *kernels, long node) {
  const cJSON *k;
  cJSON_ArrayForEach(k, kernels) {
    const cJSON *nodes = cJSON_GetObjectItem(k, "nodes");
    if (num(k, "gpu_in_gemm") >= 0 && cJSON_GetArraySize(nodes) >= 1 &&
        cJSON_GetArrayItem(nodes, 0)->valuedouble == (double)node)
      return k;
  }
  return NULL;
}

/* The line after the one at s (NULL at the end). */
static char *next_line(char *s) {
  char *e = strchr(s, '\n');
  return e ? e + 1 : NULL;
}

int main(int argc, char **argv) {
  if (argc < 2 || argc > 3 || (argc == 3 && strcmp(argv[2], "--partial"))) {
    fprintf(stderr, "usage: cu_profile DIR [--partial]\n");
    return 2;
  }
  char *src = cu_slurp_in(argv[1], "train_cuda.c"), *json = cu_slurp_in(argv[1], "plan.json");
  plan = cJSON_Parse(json);
  if (!plan) {
    fprintf(stderr, "cu_profile: plan.json does not parse\n");
    return 1;
  }
  const cJSON *layout = cJSON_GetObjectItem(plan, "layout");
  const cJSON *pp = layout ? cJSON_GetObjectItem(layout, "pp") : NULL;
  pipelined = pp && pp->valuedouble > 1;
  if (!strstr(src, "#define LAUNCHED(kernel, bytes)") || !strstr(src, "#define PROF_BEGIN()"))
    fail(0, "missing macro", "LAUNCHED(kernel, bytes) or PROF_BEGIN()");

  const cJSON *kernels = cJSON_GetObjectItem(plan, "kernels");
  int launches = 0, checked = 0, partial = 0, funcs = 0, reads = 0, lineno = 0, batched = 0;
  int fn_launches = 0, fn_reads = 0, ki = 0, nk = cJSON_GetArraySize(kernels);
  long bias_node = -1; /* inside `if (!summed_) { /+ %N`: N */
  int bias_launches = 0;
  char prev[4096] = "", line[4096];
  for (char *s = src; s; s = next_line(s)) {
    lineno++;
    char *e = strchr(s, '\n');
    size_t n = e ? (size_t)(e - s) : strlen(s);
    if (n >= sizeof line) n = sizeof line - 1;
    memcpy(line, s, n);
    line[n] = 0;
    /* functions: "static int NAME(RtStepIO *io) {" ... "}" */
    if (!strncmp(line, "static int ", 11) && strstr(line, "(RtStepIO *io) {")) {
      funcs++;
      fn_launches = fn_reads = 0;
    }
    if (strstr(line, "const int prof_ = rt_cuda_profiling(dev);")) fn_reads++, reads++;
    if (!strcmp(line, "}") && fn_launches && fn_reads != 1)
      fail(lineno, "a function launching kernels reads prof_", fn_reads ? "twice" : "never");
    if (!strncmp(line, "  CHECK(rt_cuda_", 16) && !strcmp(prev, "  PROF_BEGIN();"))
      fail(lineno, "a runtime call bracketed by the generated code", line);
    if (sscanf(line, "  if (!summed_) { /* %%%ld", &bias_node) != 1 && !strcmp(line, "  }"))
      bias_node = -1;
    char *l = strstr(line, "_launch(");
    /* a batched launch, inside its block: 4 spaces in; or a bias sum's */
    int multi = !strncmp(line, "    ", 4) && line[4] != ' ' && l && l - line > 10 &&
                !strncmp(l - 6, "_multi", 6) && !strncmp(l, "_launch(&b_, ", 13);
    int bias = bias_node >= 0 && !multi;
    const char *in = multi || bias ? "    " : "  ";
    if ((!multi && strncmp(line, in, strlen(in))) || line[strlen(in)] == ' ' || !l ||
        !strstr(line, ", st);")) {
      snprintf(prev, sizeof prev, "%s", line);
      continue;
    }
    /* a launch */
    launches++;
    fn_launches++;
    char name[256], begin[32];
    snprintf(name, sizeof name, "%.*s", (int)(l - line - strlen(in)), line + strlen(in));
    snprintf(begin, sizeof begin, "%sPROF_BEGIN();", in);
    if (strcmp(prev, begin)) fail(lineno, "no PROF_BEGIN() before", line);
    char *after = next_line(s);
    char want[300], got[512];
    long long bytes = -1;
    snprintf(want, sizeof want, "%sLAUNCHED(\"%s\", ", in, name);
    snprintf(got, sizeof got, "%.*s", after ? (int)strcspn(after, "\n") : 0, after ? after : "");
    if (strncmp(got, want, strlen(want)) || sscanf(got + strlen(want), "%lld);", &bytes) != 1 ||
        bytes <= 0) {
      fail(lineno + 1, "expected LAUNCHED(\"NAME\", BYTES > 0) after the launch, got", got);
      snprintf(prev, sizeof prev, "%s", line);
      continue;
    }
    while (!bias && ki < nk && !runs(cJSON_GetArrayItem(kernels, ki)))
      ki++; /* a view runs nowhere, a batch member in its batch, a bias sum at its GEMM */
    const cJSON *k = pipelined ? NULL
                     : bias    ? bias_kernel(kernels, bias_node)
                               : cJSON_GetArrayItem(kernels, ki++);
    bias_launches += bias;
    if (!pipelined) {
      const cJSON *code = k ? cJSON_GetObjectItem(k, "code") : NULL;
      if (!code && k) code = cJSON_GetObjectItem(k, "name");
      char want_name[300];
      snprintf(want_name, sizeof want_name, "%s%s", cJSON_IsString(code) ? code->valuestring : "",
               multi ? "_multi" : "");
      int count = 0;
      if (multi) sscanf(l + 13, "%d", &count);
      if (!cJSON_IsString(code) || strcmp(want_name, name) ||
          (k && (multi ? num(k, "gpu_batch") != count : num(k, "gpu_batch") > 1))) {
        fail(lineno, "not plan.json's kernel (or batch) of that position", name);
        k = NULL;
      }
      batched += multi ? count : 0;
      if (multi) k = NULL; /* (its arguments are the struct's: not parsed) */
    }
    if (k) { /* the arguments: between "_launch(" and ", 0, ROWS, st);" */
      char args[4096];
      snprintf(args, sizeof args, "%s", l + 8);
      char *tail = strstr(args, ", st);");
      if (tail) *tail = 0;
      for (int drop = 0; drop < 2; drop++) { /* drop ROWS and the 0 before it */
        char *c = strrchr(args, ',');
        if (c) *c = 0;
      }
      double total = 0, outs = 0;
      int known = 1;
      for (char *a = strtok(args, ","); a; a = strtok(NULL, ",")) {
        while (isspace((unsigned char)*a)) a++;
        int out;
        double b = arg_bytes(a, k, &out);
        if (b < 0) known = 0;
        total += b;
        outs += out ? b : 0;
      }
      if (known) {
        checked++;
        if ((double)bytes > 2 * total || (double)bytes < outs) {
          char what[512];
          snprintf(what, sizeof what, "%s moves %lld bytes: outside [%.0f, %.0f], its outputs and "
                   "twice its arguments", name, bytes, outs, 2 * total);
          fail(lineno, "bytes", what);
        }
        if ((double)bytes < total) partial++;
      }
    }
    snprintf(prev, sizeof prev, "%s", line);
  }
  int launched = 0;
  for (const char *p = strstr(src, "\n  LAUNCHED(\""); p; p = strstr(p + 1, "\n  LAUNCHED(\""))
    launched++;
  for (const char *p = strstr(src, "\n    LAUNCHED(\""); p; p = strstr(p + 1, "\n    LAUNCHED(\""))
    launched++;
  if (launched != launches) {
    char what[128];
    snprintf(what, sizeof what, "%d LAUNCHED for %d launches", launched, launches);
    fail(0, "counts", what);
  }
  if (!launches) fail(0, "counts", "no kernel launch found");
  int run = 0, members = 0; /* plan.json's kernels less its views and batch members */
  int in_gemm = 0;           /* and its bias sums with GEMMs */
  for (int i = 0; i < nk; i++) {
    run += runs(cJSON_GetArrayItem(kernels, i));
    in_gemm += num(cJSON_GetArrayItem(kernels, i), "gpu_in_gemm") >= 0;
    members += num(cJSON_GetArrayItem(kernels, i), "gpu_batch") > 1 ||
               num(cJSON_GetArrayItem(kernels, i), "gpu_batch_of") >= 0;
  }
  if (!pipelined && batched != members) {
    char what[128];
    snprintf(what, sizeof what, "batched launches run %d instances, plan.json has %d", batched,
             members);
    fail(0, "counts", what);
  }
  if (!pipelined && (launches - bias_launches != run || bias_launches != in_gemm)) {
    char what[160];
    snprintf(what, sizeof what, "%d launches (%d of bias sums after their GEMMs), %d kernels in "
             "plan.json (less views; %d bias sums with GEMMs)", launches, bias_launches, run,
             in_gemm);
    fail(0, "counts", what);
  }
  if (!reads) fail(0, "prof_", "never read");
  if (!pipelined && !checked) fail(0, "bytes", "no launch had every argument's size known");
  if (argc == 3 && !pipelined && !partial)
    fail(0, "bytes", "no kernel moves less than its arguments (slices are not counted)");
  printf("cu_profile: %d launches in %d functions (%d instances in batches), %d with known "
         "argument sizes, %d moving less than their arguments%s: %s\n", launches, funcs, batched,
         checked, partial,
         pipelined ? " (pipelined: sizes not checked)" : "", failures ? "FAIL" : "ok");
  cJSON_Delete(plan);
  free(src);
  free(json);
  return failures ? 1 : 0;
}
