/* tests/runtime/test_log.c -- the progress line (exact text, terminal redraw) and
 * the JSON-lines logger's error paths; check_log.py parses the log itself. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt_log.h"
#include "tests/runtime/check.h"

static void test_hms(void) {
  char b[32];
  rt_format_hms(b, sizeof b, 0);
  CHECK(!strcmp(b, "0:00:00"));
  rt_format_hms(b, sizeof b, 754000);
  CHECK(!strcmp(b, "0:12:34"));
  rt_format_hms(b, sizeof b, 3600e3 * 27 + 61e3);
  CHECK(!strcmp(b, "27:01:01"));
  rt_format_hms(b, sizeof b, -1);
  CHECK(!strcmp(b, "-:--:--"));
  rt_format_hms(b, sizeof b, NAN);
  CHECK(!strcmp(b, "-:--:--"));
}

static void test_format(void) {
  char b[256];
  RtStepStats s = {.step = 11, .loss = 3.21344, .lr = 6e-4, .grad_norm = 1.2344,
                   .tokens_per_s = 12345, .ms = 45.62, .mfu = -1};
  rt_progress_format(b, sizeof b, &s, 1000, 754000, 0);
  CHECK(!strcmp(b, "step   12/1000 | loss 3.2134 | lr 6.00e-04 | norm 1.234 | 12.3k tok/s | "
                   "45.6 ms | eta 0:12:34"));
  s.mfu = 0.4567;
  s.tokens_per_s = 2.5e6;
  s.loss = NAN;
  rt_progress_format(b, sizeof b, &s, 1000, -1, 10);
  CHECK(!strcmp(b, "[..........]   1% step   12/1000 | loss nan | lr 6.00e-04 | norm 1.234 | "
                   "2.50M tok/s | 45.6 ms | mfu 45.7% | eta -:--:--"));
  s.step = 999;
  s.tokens_per_s = 950;
  s.mfu = -1;
  s.loss = 1;
  rt_progress_format(b, sizeof b, &s, 1000, 0, 4);
  CHECK(!strncmp(b, "[####] 100% step 1000/1000 | loss 1.0000", 40));
  CHECK(strstr(b, "| 950 tok/s |") != NULL);
  /* Cut to the buffer, returning the full length as snprintf does. */
  int n = rt_progress_format(b, 16, &s, 1000, 0, 0);
  CHECK(n > 16 && strlen(b) == 15);
}

static char *slurp(FILE *f, size_t *len) {
  fflush(f);
  long n = ftell(f);
  rewind(f);
  char *buf = calloc(1, (size_t)n + 1);
  *len = fread(buf, 1, (size_t)n, f);
  return buf;
}

static void test_progress_output(void) {
  RtStepStats s = {.lr = 1e-3, .grad_norm = 1, .tokens_per_s = 1000, .ms = 100, .mfu = -1};
  /* Terminal: one line redrawn with '\r', ended by '\n' at the last step. */
  FILE *f = tmpfile();
  RtProgress p;
  rt_progress_init(&p, f, 3, 1);
  for (int i = 0; i < 3; i++) {
    s.step = i;
    s.loss = 5 - i;
    s.ms = i == 0 ? 1000 : 100;   /* warm-up step does not skew the ETA */
    rt_progress_step(&p, &s);
  }
  size_t len;
  char *out = slurp(f, &len);
  int cr = 0, nl = 0;
  for (size_t i = 0; i < len; i++) cr += out[i] == '\r', nl += out[i] == '\n';
  CHECK(cr == 3 && nl == 1 && out[len - 1] == '\n');
  CHECK(strstr(out, "[####################] 100% step 3/3") != NULL);
  CHECK(strstr(out, "step 2/3 | loss 4.0000") && strstr(out, "eta 0:00:00"));
  CHECK(strstr(out, "step 1/3 | loss 5.0000 | lr 1.00e-03 | norm 1.000 | 1000 tok/s | "
                    "1000.0 ms | eta 0:00:02"));
  free(out);
  fclose(f);
  /* Not a terminal: plain lines, no control characters; the ETA uses the second
   * step's time, not the warm-up's. */
  f = tmpfile();
  rt_progress_init(&p, f, 10, 0);
  for (int i = 0; i < 3; i++) {
    s.step = i;
    s.loss = 5 - i;
    s.ms = i == 0 ? 5000 : 100;
    rt_progress_step(&p, &s);
  }
  rt_progress_done(&p);   /* nothing to end */
  out = slurp(f, &len);
  nl = 0;
  int ctl = 0;
  for (size_t i = 0; i < len; i++) nl += out[i] == '\n', ctl += out[i] == '\r' || out[i] == 27;
  CHECK(nl == 3 && ctl == 0);
  CHECK(strstr(out, "step  1/10 | loss 5.0000 | lr 1.00e-03 | norm 1.000 | 1000 tok/s | "
                    "5000.0 ms | eta 0:00:45\n"));
  CHECK(strstr(out, "step  2/10 | loss 4.0000 | lr 1.00e-03 | norm 1.000 | 1000 tok/s | "
                    "100.0 ms | eta 0:00:01\n"));
  free(out);
  fclose(f);
}

static void test_log_errors(void) {
  RtLog *log;
  CHECK_FAILS(rt_log_open(&log, "rt_log_no_such_dir/train.jsonl", 0),
              "log rt_log_no_such_dir/train.jsonl: cannot open for writing");
  CHECK_OK(rt_log_open(&log, "rt_log_err.jsonl", 0));
  if (!log) return;
  CHECK_OK(rt_log_config_num(log, "a", 1));
  CHECK_OK(rt_log_config_num(log, "a", 2));   /* replaced, not repeated */
  RtStepStats s = {.step = 0, .loss = 1, .mfu = -1};
  const char *keys[] = {"loss"};
  const double vals[] = {2};
  CHECK_FAILS(rt_log_step(log, &s, keys, vals, 1), "extra field 'loss'");
  CHECK_OK(rt_log_step(log, &s, NULL, NULL, 0));
  CHECK_FAILS(rt_log_config_num(log, "b", 1), "config key 'b' added after the config record");
  CHECK_OK(rt_log_close(log));
  FILE *f = fopen("rt_log_err.jsonl", "rb");
  char line[512] = "";
  CHECK(f && fgets(line, sizeof line, f));
  CHECK(!strcmp(line, "{\"config\":{\"a\":2}}\n"));
  if (f) fclose(f);
}

/* The MoE routing text (exact) and record: cut text still reports its length. */
static void test_moe(void) {
  const double t0[] = {30, 34, 32, 32}, t1[] = {31, 33, 20, 32};
  RtMoeLayerStats l[2] = {{0, 4, t0, 0, 0.0201, 0, 0}, {1, 4, t1, 12, 0.02, 0.004, 1}};
  char b[256];
  int n = rt_moe_format(b, sizeof b, l, 2);
  const char *want = "moe L0 tok 30/34/32/32 drop 0 aux 0.0201 | L1 tok 31/33/20/32 drop 12 aux 0.02 "
                     "z 0.004";
  CHECK(!strcmp(b, want) && n == (int)strlen(want));
  CHECK(rt_moe_format(b, 10, l, 2) == n && strlen(b) == 9 && !strncmp(b, want, 9));
  RtLog *log;
  CHECK_OK(rt_log_open(&log, "rt_log_moe.jsonl", 0));
  if (!log) return;
  RtStepStats s = {.step = 3, .loss = 1, .mfu = -1};
  CHECK_OK(rt_log_step_moe(log, &s, NULL, NULL, 0, l, 2));
  CHECK_OK(rt_log_close(log));
  FILE *f = fopen("rt_log_moe.jsonl", "rb");
  char line[1024] = "";
  CHECK(f && fgets(line, sizeof line, f) && fgets(line, sizeof line, f));
  CHECK(strstr(line, "\"moe\":[{\"layer\":0,\"tokens\":[30,34,32,32],\"dropped\":0,"
                     "\"aux\":0.0201},{\"layer\":1,") != NULL);
  CHECK(strstr(line, "\"aux\":0.02,\"z\":0.004}]") != NULL); /* z: layer 1 only */
  if (f) fclose(f);
}

int main(void) {
  test_moe();
  test_hms();
  test_format();
  test_progress_output();
  test_log_errors();
  return check_result("test_log");
}
