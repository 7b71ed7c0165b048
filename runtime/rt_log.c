/* runtime/rt_log.c -- progress line and JSON-lines training log; see rt_log.h. */
#define _POSIX_C_SOURCE 200809L
#include "runtime/rt_log.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/rt_err.h"

/* ---- progress line ---- */

void rt_format_hms(char *buf, size_t cap, double ms) {
  if (!(ms >= 0) || !isfinite(ms) || ms > 3.6e6 * 1e6) {
    snprintf(buf, cap, "-:--:--");
    return;
  }
  long long s = (long long)(ms / 1000.0 + 0.5);
  snprintf(buf, cap, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
}

/* 950 -> "950", 12345 -> "12.3k", 1234567 -> "1.23M". */
static void human(char *buf, size_t cap, double v) {
  if (!isfinite(v)) snprintf(buf, cap, "-");
  else if (v >= 1e9) snprintf(buf, cap, "%.2fG", v / 1e9);
  else if (v >= 1e6) snprintf(buf, cap, "%.2fM", v / 1e6);
  else if (v >= 1e4) snprintf(buf, cap, "%.1fk", v / 1e3);
  else snprintf(buf, cap, "%.0f", v);
}

static int digits(int64_t v) {
  int d = 1;
  while (v >= 10) v /= 10, d++;
  return d;
}

int rt_progress_format(char *buf, size_t cap, const RtStepStats *s, int64_t total_steps,
                       double eta_ms, int bar_width) {
  char bar[128] = "", tok[32], eta[32], mfu[32] = "";
  if (bar_width > 0 && total_steps > 0) {
    if (bar_width > 100) bar_width = 100;
    double frac = (double)(s->step + 1) / (double)total_steps;
    if (frac > 1) frac = 1;
    if (frac < 0) frac = 0;
    int fill = (int)(frac * bar_width + 0.5);
    int k = 0;
    bar[k++] = '[';
    for (int i = 0; i < bar_width; i++) bar[k++] = i < fill ? '#' : '.';
    snprintf(bar + k, sizeof bar - (size_t)k, "] %3d%% ", (int)(frac * 100));
  }
  human(tok, sizeof tok, s->tokens_per_s);
  rt_format_hms(eta, sizeof eta, eta_ms);
  if (s->mfu >= 0) snprintf(mfu, sizeof mfu, " | mfu %.1f%%", 100 * s->mfu);
  int w = digits(total_steps > 0 ? total_steps : 1);
  return snprintf(buf, cap,
                  "%sstep %*lld/%lld | loss %.4f | lr %.2e | norm %.3f | %s tok/s | %.1f ms%s"
                  " | eta %s",
                  bar, w, (long long)(s->step + 1), (long long)total_steps, s->loss, s->lr,
                  s->grad_norm, tok, s->ms, mfu, eta);
}

void rt_progress_init(RtProgress *p, FILE *out, int64_t total_steps, int tty) {
  memset(p, 0, sizeof *p);
  p->out = out;
  p->total_steps = total_steps;
  p->tty = tty >= 0 ? tty : isatty(fileno(out));
}

void rt_progress_step(RtProgress *p, const RtStepStats *s) {
  /* The first step carries warm-up time: the second replaces it, then a moving average. */
  if (p->calls < 2 || !(p->avg_ms > 0)) p->avg_ms = s->ms;
  else p->avg_ms = 0.9 * p->avg_ms + 0.1 * s->ms;
  p->calls++;
  int64_t left = p->total_steps - s->step - 1;
  double eta = left >= 0 ? (double)left * p->avg_ms : -1;
  char line[512];
  rt_progress_format(line, sizeof line, s, p->total_steps, eta, p->tty ? 20 : 0);
  if (p->tty) {
    /* "\033[K" clears what a longer previous line left on the right. */
    fprintf(p->out, "\r%s\033[K", line);
    p->open_line = 1;
    if (left <= 0) rt_progress_done(p);
  } else {
    fprintf(p->out, "%s\n", line);
  }
  fflush(p->out);
}

void rt_progress_done(RtProgress *p) {
  if (p->open_line) {
    fputc('\n', p->out);
    fflush(p->out);
    p->open_line = 0;
  }
}

/* ---- JSON-lines log ---- */

struct RtLog {
  FILE *f;
  char *path;
  cJSON *config;            /* pending config pairs; NULL once written */
};

int rt_log_open(RtLog **out, const char *path, int append) {
  *out = NULL;
  RtLog *log = calloc(1, sizeof *log);
  size_t n = strlen(path) + 1;
  if (!log || !(log->path = malloc(n)) || !(log->config = cJSON_CreateObject())) {
    if (log) free(log->path);
    free(log);
    return rt_fail("log %s: out of memory", path);
  }
  memcpy(log->path, path, n);
  log->f = fopen(path, append ? "a" : "w");
  if (!log->f) {
    rt_fail("log %s: cannot open for writing (%s); check the path given with --log", path,
            strerror(errno));
    cJSON_Delete(log->config);
    free(log->path);
    free(log);
    return RT_ERR;
  }
  *out = log;
  return RT_OK;
}

static int config_put(RtLog *log, const char *key, cJSON *item) {
  if (!item) return rt_fail("log %s: out of memory", log->path);
  if (!log->config) {
    cJSON_Delete(item);
    return rt_fail("log %s: config key '%s' added after the config record was written; add "
                   "all config pairs before the first step", log->path, key);
  }
  if (cJSON_GetObjectItemCaseSensitive(log->config, key))
    cJSON_ReplaceItemInObjectCaseSensitive(log->config, key, item);
  else
    cJSON_AddItemToObject(log->config, key, item);
  return RT_OK;
}

int rt_log_config_num(RtLog *log, const char *key, double value) {
  return config_put(log, key, cJSON_CreateNumber(value));
}

int rt_log_config_str(RtLog *log, const char *key, const char *value) {
  return config_put(log, key, cJSON_CreateString(value));
}

/* Writes obj as one line and flushes; deletes obj. */
static int write_line(RtLog *log, cJSON *obj) {
  char *text = obj ? cJSON_PrintUnformatted(obj) : NULL;
  cJSON_Delete(obj);
  if (!text) return rt_fail("log %s: out of memory formatting a record", log->path);
  int bad = fputs(text, log->f) < 0 || fputc('\n', log->f) == EOF || fflush(log->f) != 0;
  cJSON_free(text);
  if (bad)
    return rt_fail("log %s: write failed (%s); check free disk space", log->path,
                   strerror(errno));
  return RT_OK;
}

int rt_log_write_config(RtLog *log) {
  if (!log->config) return RT_OK;
  cJSON *rec = cJSON_CreateObject();
  if (!rec) return rt_fail("log %s: out of memory", log->path);
  cJSON_AddItemToObject(rec, "config", log->config);
  log->config = NULL;
  return write_line(log, rec);
}

int rt_log_step(RtLog *log, const RtStepStats *s, const char *const *extra_keys,
                const double *extra_vals, int n_extra) {
  return rt_log_step_moe(log, s, extra_keys, extra_vals, n_extra, NULL, 0);
}

/* The "moe" array of a step record; NULL when out of memory. */
static cJSON *moe_json(const RtMoeLayerStats *moe, int nmoe) {
  cJSON *arr = cJSON_CreateArray();
  for (int i = 0; arr && i < nmoe; i++) {
    cJSON *o = cJSON_CreateObject();
    if (!o || !cJSON_AddItemToArray(arr, o)) { /* arr owns o from here */
      cJSON_Delete(o);
      break;
    }
    cJSON *tok = cJSON_CreateDoubleArray(moe[i].tokens, moe[i].experts);
    if (!cJSON_AddNumberToObject(o, "layer", moe[i].layer) || !tok ||
        !cJSON_AddItemToObject(o, "tokens", tok)) {
      cJSON_Delete(tok);
      break;
    }
    if (!cJSON_AddNumberToObject(o, "dropped", moe[i].dropped) ||
        !cJSON_AddNumberToObject(o, "aux", moe[i].aux) ||
        (moe[i].has_z && !cJSON_AddNumberToObject(o, "z", moe[i].z)))
      break;
    if (i == nmoe - 1) return arr;
  }
  cJSON_Delete(arr);
  return NULL;
}

/* snprintf at *n of buf (cap bytes), advancing *n by what it wanted to write. */
static void append(char *buf, size_t cap, size_t *n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  /* past the end: only the length (the text stays cut, terminated at cap - 1) */
  int k = *n < cap ? vsnprintf(buf + *n, cap - *n, fmt, ap) : vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (k > 0) *n += (size_t)k;
}

int rt_moe_format(char *buf, size_t cap, const RtMoeLayerStats *moe, int nmoe) {
  size_t n = 0;
  if (cap) buf[0] = 0;
  for (int i = 0; i < nmoe; i++) {
    append(buf, cap, &n, "%sL%d tok", i ? " | " : "moe ", moe[i].layer);
    for (int e = 0; e < moe[i].experts; e++)
      append(buf, cap, &n, "%c%.0f", e ? '/' : ' ', moe[i].tokens[e]);
    append(buf, cap, &n, " drop %.0f aux %.4g", moe[i].dropped, moe[i].aux);
    if (moe[i].has_z) append(buf, cap, &n, " z %.4g", moe[i].z);
  }
  return (int)n;
}

int rt_log_step_moe(RtLog *log, const RtStepStats *s, const char *const *extra_keys,
                    const double *extra_vals, int n_extra, const RtMoeLayerStats *moe,
                    int nmoe) {
  if (rt_log_write_config(log)) return RT_ERR;
  cJSON *rec = cJSON_CreateObject();
  int ok = rec && cJSON_AddNumberToObject(rec, "step", (double)s->step) &&
           cJSON_AddNumberToObject(rec, "loss", s->loss) &&
           cJSON_AddNumberToObject(rec, "lr", s->lr) &&
           cJSON_AddNumberToObject(rec, "grad_norm", s->grad_norm) &&
           cJSON_AddNumberToObject(rec, "tokens_per_s", s->tokens_per_s) &&
           cJSON_AddNumberToObject(rec, "ms", s->ms) &&
           (s->mfu < 0 || cJSON_AddNumberToObject(rec, "mfu", s->mfu));
  for (int i = 0; ok && i < n_extra; i++) {
    if (!extra_keys[i] || cJSON_GetObjectItemCaseSensitive(rec, extra_keys[i])) {
      cJSON_Delete(rec);
      return rt_fail("log %s: extra field '%s' is missing a name or repeats a field of the "
                     "record; give it a distinct name", log->path,
                     extra_keys[i] ? extra_keys[i] : "(null)");
    }
    ok = cJSON_AddNumberToObject(rec, extra_keys[i], extra_vals[i]) != NULL;
  }
  if (ok && nmoe > 0) {
    cJSON *arr = moe_json(moe, nmoe);
    ok = arr && cJSON_AddItemToObject(rec, "moe", arr);
    if (arr && !ok) cJSON_Delete(arr);
  }
  if (!ok) {
    cJSON_Delete(rec);
    return rt_fail("log %s: out of memory", log->path);
  }
  return write_line(log, rec);
}

int rt_log_close(RtLog *log) {
  if (!log) return RT_OK;
  int rc = rt_log_write_config(log);
  if (fclose(log->f) != 0 && rc == RT_OK)
    rc = rt_fail("log %s: close failed (%s)", log->path, strerror(errno));
  cJSON_Delete(log->config);
  free(log->path);
  free(log);
  return rc;
}
