/* tests/runtime/rt_tool.c -- a command-line window on libparcrt for the python3
 * cross-checks (check_*.py). Each subcommand prints plain text or JSON on stdout;
 * on a runtime error it prints the runtime's one-line message on stderr and exits 1.
 *
 *   rt_tool normal SEED NAME N              stream of NAME, then N normals (hex bits)
 *   rt_tool batch FILE VOCAB B T STEP...    inputs/targets of each step
 *   rt_tool builtin NBYTES OUT              writes the built-in corpus to OUT
 *   rt_tool entropy FILE VOCAB              unigram entropy in nats
 *   rt_tool st-dump FILE                    tensors (value bits) and metadata as JSON
 *   rt_tool st-write FILE                   writes the fixed tensor set of check_safetensors.py
 *   rt_tool log-write FILE                  writes the fixed log of check_log.py */
#include <cjson/cJSON.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt_data.h"
#include "runtime/rt_err.h"
#include "runtime/rt_log.h"
#include "runtime/rt_rng.h"
#include "runtime/rt_safetensors.h"

static int fail(void) {
  fprintf(stderr, "%s\n", rt_last_error());
  return 1;
}

static uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static int cmd_normal(char **a) {
  uint64_t seed = strtoull(a[0], NULL, 10);
  uint64_t stream = rt_param_stream(a[1]);
  long n = strtol(a[2], NULL, 10);
  printf("%016llx\n", (unsigned long long)stream);
  for (long i = 0; i < n; i++) printf("%08x\n", bits(rt_rng_normal(seed, stream, (uint64_t)i)));
  return 0;
}

static int cmd_batch(int argc, char **a) {
  int vocab = atoi(a[1]), B = atoi(a[2]), T = atoi(a[3]);
  RtData *d;
  if (rt_data_open(&d, a[0], vocab, 0)) return fail();
  int32_t *in = malloc(sizeof(int32_t) * (size_t)B * (size_t)T);
  int32_t *tg = malloc(sizeof(int32_t) * (size_t)B * (size_t)T);
  int rc = 0;
  for (int k = 4; k < argc && rc == 0; k++) {
    long long step = strtoll(a[k], NULL, 10);
    if (rt_data_batch(d, step, B, T, in, tg)) {
      rc = fail();
      break;
    }
    printf("step %lld\n", step);
    for (int b = 0; b < B; b++) {
      for (int t = 0; t < T; t++) printf("%s%d", t ? " " : "", in[b * T + t]);
      printf("\n");
      for (int t = 0; t < T; t++) printf("%s%d", t ? " " : "", tg[b * T + t]);
      printf("\n");
    }
  }
  free(in);
  free(tg);
  rt_data_close(d);
  return rc;
}

static int cmd_builtin(char **a) {
  RtData *d;
  if (rt_data_builtin(&d, (size_t)strtoull(a[0], NULL, 10), 256, 0)) return fail();
  FILE *f = fopen(a[1], "wb");
  if (!f) return 1;
  for (int64_t i = 0; i < rt_data_ntokens(d); i++) fputc(rt_data_token(d, i), f);
  fclose(f);
  printf("%.12f\n", rt_data_unigram_entropy(d));
  rt_data_close(d);
  return 0;
}

static int cmd_entropy(char **a) {
  RtData *d;
  if (rt_data_open(&d, a[0], atoi(a[1]), 0)) return fail();
  printf("%.12f\n", rt_data_unigram_entropy(d));
  rt_data_close(d);
  return 0;
}

static int cmd_st_dump(char **a) {
  RtSt *st;
  if (rt_st_open(&st, a[0])) return fail();
  cJSON *root = cJSON_CreateObject();
  cJSON *ts = cJSON_AddArrayToObject(root, "tensors");
  for (int i = 0; i < rt_st_count(st); i++) {
    int64_t shape[RT_ST_MAXDIM];
    int rank = rt_st_shape(st, i, shape);
    int64_t n = rt_st_numel(st, i);
    float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (rt_st_read(st, rt_st_name(st, i), v, rank, shape)) return fail();
    cJSON *t = cJSON_CreateObject();
    cJSON_AddItemToArray(ts, t);
    cJSON_AddStringToObject(t, "name", rt_st_name(st, i));
    cJSON *sh = cJSON_AddArrayToObject(t, "shape");
    for (int d = 0; d < rank; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)shape[d]));
    cJSON *vals = cJSON_AddArrayToObject(t, "bits");
    for (int64_t k = 0; k < n; k++) cJSON_AddItemToArray(vals, cJSON_CreateNumber(bits(v[k])));
    free(v);
  }
  const char *keys[] = {"format", "parc", "note"};
  cJSON *meta = cJSON_AddObjectToObject(root, "metadata");
  for (int k = 0; k < 3; k++)
    if (rt_st_meta(st, keys[k])) cJSON_AddStringToObject(meta, keys[k], rt_st_meta(st, keys[k]));
  char *text = cJSON_PrintUnformatted(root);
  printf("%s\n", text);
  cJSON_free(text);
  cJSON_Delete(root);
  rt_st_close(st);
  return 0;
}

/* Value k of tensor t in the fixed set: exact in float32 and in python. */
static float fixed_value(int t, int64_t k) { return (float)((k * 7 + t * 13) % 101 - 50) / 8.0f; }

static int cmd_st_write(char **a) {
  static const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, FLT_MAX, -FLT_MIN,
                                  1e-45f /* smallest denormal */, 1.0f / 3.0f};
  RtStTensor t[5] = {
    {.name = "h.0.attn.c_attn.weight", .rank = 2, .shape = {6, 18}},
    {.name = "h.0.attn.c_attn.bias", .rank = 1, .shape = {18}},
    {.name = "special", .rank = 1, .shape = {9}, .data = special},
    {.name = "empty", .rank = 2, .shape = {3, 0}},
    {.name = "model.norm.weight.\"quoted\" name", .rank = 3, .shape = {2, 3, 4}},
  };
  float *buf[5] = {0};
  for (int i = 0; i < 5; i++) {
    if (t[i].data || i == 3) continue;
    int64_t n = 1;
    for (int d = 0; d < t[i].rank; d++) n *= t[i].shape[d];
    buf[i] = malloc(sizeof(float) * (size_t)n);
    for (int64_t k = 0; k < n; k++) buf[i][k] = fixed_value(i, k);
    t[i].data = buf[i];
  }
  RtStMeta meta[] = {{"format", "pt"}, {"parc", "test \xc3\xa9 unicode"}};
  int rc = rt_st_write(a[0], t, 5, meta, 2);
  for (int i = 0; i < 5; i++) free(buf[i]);
  return rc ? fail() : 0;
}

static int cmd_log_write(char **a) {
  RtLog *log;
  if (rt_log_open(&log, a[0], 0)) return fail();
  rt_log_config_num(log, "d", 768);
  rt_log_config_num(log, "lr", 6e-4);
  rt_log_config_str(log, "model", "gpt2");
  rt_log_config_num(log, "tp", 2);
  for (int s = 0; s < 5; s++) {
    RtStepStats st = {.step = s, .loss = 5.0 - 0.5 * s, .lr = 6e-4 * (s + 1) / 5,
                      .grad_norm = 1.0 / (s + 1), .tokens_per_s = 12345.5 + s,
                      .ms = 40.25 + s, .mfu = -1};
    if (s == 3) st.loss = NAN;
    if (s == 4) st.mfu = 0.375;
    const char *keys[] = {"ce_loss", "aux_loss"};
    double vals[] = {4.5 - 0.5 * s, 0.01 * s};
    if (rt_log_step(log, &st, keys, vals, s % 2 ? 2 : 0)) return fail();
  }
  return rt_log_close(log) ? fail() : 0;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: rt_tool COMMAND ARGS... (see the header of rt_tool.c)\n");
    return 2;
  }
  const char *c = argv[1];
  char **a = argv + 2;
  int n = argc - 2;
  if (!strcmp(c, "normal") && n == 3) return cmd_normal(a);
  if (!strcmp(c, "batch") && n >= 5) return cmd_batch(n, a);
  if (!strcmp(c, "builtin") && n == 2) return cmd_builtin(a);
  if (!strcmp(c, "entropy") && n == 2) return cmd_entropy(a);
  if (!strcmp(c, "st-dump") && n == 1) return cmd_st_dump(a);
  if (!strcmp(c, "st-write") && n == 1) return cmd_st_write(a);
  if (!strcmp(c, "log-write") && n == 1) return cmd_log_write(a);
  fprintf(stderr, "rt_tool: unknown command or wrong arguments: %s\n", c);
  return 2;
}
