/* codegen/machine_file.c -- --machine NAME|FILE (codegen/machine_file.h). */
#include "codegen/machine_file.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *slurp(const char *path, char *err, size_t len) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, len, "'%s' is neither a preset (h200, h100, a100) nor a readable file", path);
    return NULL;
  }
  char *buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n + 4096 + 1 > cap) {
      char *b = realloc(buf, cap = 2 * cap + 8192);
      if (!b) break;
      buf = b;
    }
    size_t r = fread(buf + n, 1, cap - n - 1, f);
    n += r;
    if (r == 0 || n > (1u << 20)) break;
  }
  fclose(f);
  if (!buf || n > (1u << 20)) {
    snprintf(err, len, "'%s': %s", path, buf ? "larger than 1 MiB" : "out of memory");
    free(buf);
    return NULL;
  }
  buf[n] = 0;
  return buf;
}

typedef struct {
  const char *key;
  double *v[2];   /* v[1] NULL: one number, no precisions */
  int integer;
} Field;

static int set_field(const Field *f, const cJSON *j, const char *path, char *err, size_t len) {
  if (cJSON_IsNumber(j)) {
    if (f->integer && j->valuedouble != (double)(int)j->valuedouble) {
      snprintf(err, len, "'%s': \"%s\" must be a whole number", path, f->key);
      return -1;
    }
    *f->v[0] = j->valuedouble;
    if (f->v[1]) *f->v[1] = j->valuedouble;
    return 0;
  }
  if (f->v[1] && cJSON_IsObject(j) && cJSON_GetArraySize(j) >= 1) {
    /* {"fp32": x, "bf16": y}, either alone keeping the other (the base's) */
    int ok = 1;
    for (const cJSON *e = j->child; e && ok; e = e->next) {
      int k = !strcmp(e->string, "fp32") ? 0 : !strcmp(e->string, "bf16") ? 1 : -1;
      if (k < 0 || !cJSON_IsNumber(e)) ok = 0;
      else *f->v[k] = e->valuedouble;
    }
    if (ok) return 0;
  }
  snprintf(err, len, "'%s': \"%s\" must be a number%s", path, f->key,
           f->v[1] ? " or {\"fp32\": number, \"bf16\": number} (either may be left out)" : "");
  return -1;
}

static int parse(const char *path, const char *text, Machine *out, char *err, size_t len) {
  cJSON *root = cJSON_Parse(text);
  if (!cJSON_IsObject(root)) {
    snprintf(err, len, "'%s' is not a JSON object (see parc --help, --machine)", path);
    cJSON_Delete(root);
    return -1;
  }
  int rc = -1, rpn = 0;
  double rpn_d = 0;
  const cJSON *base = cJSON_GetObjectItemCaseSensitive(root, "base");
  *out = (Machine){0};
  if (base) {
    const Machine *b = cJSON_IsString(base) ? machine_preset(base->valuestring) : NULL;
    if (!b) {
      snprintf(err, len, "'%s': \"base\" must name a preset: h200, h100 or a100", path);
      goto done;
    }
    *out = *b;
    rpn_d = b->ranks_per_node;
  }
  Field fields[] = {
      {"peak_flops", {&out->peak_flops[0], &out->peak_flops[1]}, 0},
      {"gemm_flops", {&out->gemm_flops[0], &out->gemm_flops[1]}, 0},
      {"attention_flops", {&out->attn_flops[0], &out->attn_flops[1]}, 0},
      {"memory_bytes_per_s", {&out->mem_bytes_per_s, NULL}, 0},
      {"kernel_s", {&out->kernel_s, NULL}, 0},
      {"parallel_call_s", {&out->parallel_call_s, NULL}, 0},
      {"parallel_min_elements", {&out->parallel_min_elements, NULL}, 0},
      {"intra_node_bytes_per_s", {&out->intra_bytes_per_s, NULL}, 0},
      {"inter_node_bytes_per_s", {&out->inter_bytes_per_s, NULL}, 0},
      {"latency_s", {&out->latency_s, NULL}, 0},
      {"ranks_per_node", {&rpn_d, NULL}, 1},
      {"device_bytes", {&out->device_bytes, NULL}, 0},
  };
  int nf = (int)(sizeof fields / sizeof fields[0]);
  for (const cJSON *j = root->child; j; j = j->next) {
    if (!strcmp(j->string, "base")) continue;
    if (!strcmp(j->string, "name")) {
      if (!cJSON_IsString(j) || !j->valuestring[0] || strlen(j->valuestring) >= sizeof out->name) {
        snprintf(err, len, "'%s': \"name\" must be a string of 1 to %zu characters", path,
                 sizeof out->name - 1);
        goto done;
      }
      continue;
    }
    int f = 0;
    while (f < nf && strcmp(fields[f].key, j->string)) f++;
    if (f == nf) {
      snprintf(err, len, "'%s': unknown field \"%s\"", path, j->string);
      goto done;
    }
    if (set_field(&fields[f], j, path, err, len)) goto done;
  }
  for (int f = 0; !base && f < nf; f++)
    if (!cJSON_GetObjectItemCaseSensitive(root, fields[f].key) &&
        strncmp(fields[f].key, "parallel_", 9) &&
        strcmp(fields[f].key, "device_bytes")) { /* (those three default to 0) */
      snprintf(err, len, "'%s': \"%s\" is missing (or give \"base\": a preset to start from)",
               path, fields[f].key);
      goto done;
    }
  rpn = rpn_d >= 1 && rpn_d <= 1 << 20 ? (int)rpn_d : 0;
  out->ranks_per_node = rpn;
  const cJSON *name = cJSON_GetObjectItemCaseSensitive(root, "name");
  snprintf(out->name, sizeof out->name, "%s", name ? name->valuestring : path);
  const char *bad;
  if (machine_check(out, &bad)) {
    snprintf(err, len, "'%s': \"%s\" must be %s", path, bad,
             !strcmp(bad, "ranks_per_node") ? "a whole number in [1, 1048576]"
             : !strcmp(bad, "kernel_s") || !strcmp(bad, "latency_s") ||
                     !strncmp(bad, "parallel_", 9) || !strcmp(bad, "device_bytes")
                 ? "finite and >= 0"
                                                                    : "finite and > 0");
    goto done;
  }
  rc = 0;
done:
  cJSON_Delete(root);
  return rc;
}

int machine_resolve(const char *arg, Machine *out, char *err, size_t len) {
  const Machine *p = machine_preset(arg);
  if (p) {
    *out = *p;
    return 0;
  }
  char *text = slurp(arg, err, len);
  if (!text) return -1;
  int rc = parse(arg, text, out, err, len);
  free(text);
  return rc;
}
