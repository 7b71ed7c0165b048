/* tests/cuda/cu_structure.c -- a generated project's CUDA source against its
 * plan: kernels.cu has exactly one __global__ per distinct kernel of
 * plan.json (the kernels without a "code" field), each with one launcher
 * NAME_launch declared in kernels_cuda.h; a launcher launches its own kernel
 * with the block size of its __launch_bounds__ (both instantiations when the
 * kernel is a template on VEC); every kernel carries its kernel IR comment.
 * A kernel whose code a batch runs (plan.json's "gpu_batch": the code's
 * kernel, by "code" or its own name) has the batched form too: one more
 * __global__ NAME_multi and NAME_multi_launch, declared with NAME_multi_t in
 * kernels_cuda.h (codegen/cuda_batch.h); no other kernel has one.
 *
 *   cu_structure DIR       (DIR holds plan.json, kernels.cu, kernels_cuda.h) */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/cuda/cu_test.h"


static void fail(const char *name, const char *what) {
  fprintf(stderr, "cu_structure: %s: %s\n", name, what);
  failures++;
}


static int count(const char *s, const char *what) {
  int n = 0;
  for (const char *p = strstr(s, what); p; p = strstr(p + 1, what)) n++;
  return n;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: cu_structure DIR\n");
    return 2;
  }
  char *plan = cu_slurp_in(argv[1], "plan.json"), *cu = cu_slurp_in(argv[1], "kernels.cu");
  char *hdr = cu_slurp_in(argv[1], "kernels_cuda.h");
  cJSON *root = cJSON_Parse(plan);
  cJSON *ks = root ? cJSON_GetObjectItem(root, "kernels") : NULL;
  if (!cJSON_IsArray(ks)) {
    fprintf(stderr, "cu_structure: plan.json has no kernels array\n");
    return 1;
  }
  int distinct = 0, total = 0;
  cJSON *k;
  cJSON_ArrayForEach(k, ks) {
    total++;
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(k, "name"));
    cJSON *code = cJSON_GetObjectItem(k, "code");
    char want[512];
    if (!name) {
      fail("?", "a kernel without a name");
      continue;
    }
    if (code) {  /* shares the code of an earlier kernel: no CUDA kernel of its own */
      snprintf(want, sizeof want, ") %s(", name);
      if (strstr(cu, want)) fail(name, "a deduplicated kernel has its own __global__");
      const char *canon = cJSON_GetStringValue(code);
      snprintf(want, sizeof want, "void %s_launch(", canon ? canon : "?");
      if (!canon || count(hdr, want) != 1) fail(name, "the kernel it shares code with has no launcher");
      continue;
    }
    distinct++;
    snprintf(want, sizeof want, ") %s(", name);
    if (count(cu, want) != 1) fail(name, "not exactly one __global__ definition");
    const char *def = strstr(cu, want);
    snprintf(want, sizeof want, "/* ---- %s: rows [", name);
    const char *head = strstr(cu, want);
    if (!head) fail(name, "no comment");
    else if (!strstr(head, " *   kernel ") || strstr(head, " *   kernel ") > def)
      fail(name, "the comment lacks the kernel IR");
    /* the __launch_bounds__ of the definition, the block of the launches */
    int bounds = 0;
    if (def) {
      const char *lb = def;
      while (lb > cu && strncmp(lb, "__launch_bounds__(", 18)) lb--;
      bounds = atoi(lb + 18);
    }
    snprintf(want, sizeof want, "extern \"C\" void %s_launch(", name);
    if (count(cu, want) != 1) fail(name, "not exactly one launcher");
    const char *launch = strstr(cu, want);
    snprintf(want, sizeof want, "void %s_launch(", name);
    if (count(hdr, want) != 1) fail(name, "not declared in kernels_cuda.h");
    if (launch) {
      const char *end = strstr(launch, "\n}\n");
      char call[512];
      int vec = 0, plain = 0;
      snprintf(call, sizeof call, "%s<true><<<grid_, %d, 0, stream>>>(", name, bounds);
      const char *c = strstr(launch, call);
      vec = c && c < end;
      snprintf(call, sizeof call, "%s<false><<<grid_, %d, 0, stream>>>(", name, bounds);
      c = strstr(launch, call);
      vec += c && c < end;
      snprintf(call, sizeof call, "%s<<<grid_, %d, 0, stream>>>(", name, bounds);
      c = strstr(launch, call);
      plain = c && c < end;
      if (!(bounds > 0 && (vec == 2) != (plain == 1)))
        fail(name, "the launcher does not launch its kernel with the __launch_bounds__ block");
    }
  }
  /* the batched forms: exactly the codes some batch runs */
  int multis = 0;
  cJSON_ArrayForEach(k, ks) {
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(k, "name"));
    const char *code = cJSON_GetStringValue(cJSON_GetObjectItem(k, "code"));
    if (!name || code) continue; /* (a code's batches are counted at its own kernel) */
    int batched = 0;
    cJSON *j;
    cJSON_ArrayForEach(j, ks) {
      const char *jc = cJSON_GetStringValue(cJSON_GetObjectItem(j, "code"));
      if (cJSON_GetObjectItem(j, "gpu_batch") &&
          !strcmp(jc ? jc : cJSON_GetStringValue(cJSON_GetObjectItem(j, "name")), name))
        batched = 1;
    }
    char want[512], decl[512];
    snprintf(want, sizeof want, ") %s_multi(const %s_multi_t a_, ", name, name);
    snprintf(decl, sizeof decl, "} %s_multi_t;\nvoid %s_multi_launch(const %s_multi_t *a, int count",
             name, name, name);
    int has = count(cu, want);
    multis += has;
    if (has != batched || count(hdr, decl) != batched)
      fail(name, batched ? "a batch runs its code but it has no batched form (or several)"
                         : "a batched form no batch runs");
  }
  int globals = count(cu, "\n__global__ void __launch_bounds__(");
  int templates = count(cu, "\ntemplate <bool VEC>\n__global__");
  if (globals != distinct + multis) { /* templates included: their __global__ follows the template line */
    char msg[128];
    snprintf(msg, sizeof msg, "%d __global__ functions for %d distinct kernels and %d batched forms",
             globals, distinct, multis);
    fail("kernels.cu", msg);
  }
  cJSON_Delete(root);
  free(plan);
  free(cu);
  free(hdr);
  if (!failures)
    printf("cu_structure: %d kernels, %d distinct, %d batched forms, %d __global__ (%d templates "
           "on VEC): ok\n", total, distinct, multis, globals, templates);
  return failures ? 1 : 0;
}
