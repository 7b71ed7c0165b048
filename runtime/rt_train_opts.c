/* runtime/rt_train_opts.c -- the trainer's command line; see rt_train.h.
 *
 * Every value is checked in full (no trailing characters, no overflow, inside its
 * range); a bad one is reported as one line naming the option, the value and the
 * allowed range. */
#define _POSIX_C_SOURCE 200809L
#include "runtime/rt_train.h"

#include "runtime/rt_comm.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum {
  OPT_STEPS = 1000, OPT_DATA, OPT_INIT, OPT_SAVE_WEIGHTS, OPT_LR, OPT_SEED, OPT_LOG,
  OPT_SAVE, OPT_SAVE_EVERY, OPT_RESUME, OPT_THREADS, OPT_QUIET, OPT_HELP, OPT_SAVE_GRADS,
  OPT_COMM_TIMEOUT, OPT_TRACE
};

static const struct option long_opts[] = {
    {"steps", required_argument, NULL, OPT_STEPS},
    {"data", required_argument, NULL, OPT_DATA},
    {"init", required_argument, NULL, OPT_INIT},
    {"save-weights", required_argument, NULL, OPT_SAVE_WEIGHTS},
    {"save-grads", required_argument, NULL, OPT_SAVE_GRADS},
    {"lr", required_argument, NULL, OPT_LR},
    {"seed", required_argument, NULL, OPT_SEED},
    {"log", required_argument, NULL, OPT_LOG},
    {"save", required_argument, NULL, OPT_SAVE},
    {"save-every", required_argument, NULL, OPT_SAVE_EVERY},
    {"resume", required_argument, NULL, OPT_RESUME},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"comm-timeout", required_argument, NULL, OPT_COMM_TIMEOUT},
    {"trace", required_argument, NULL, OPT_TRACE},
    {"quiet", no_argument, NULL, OPT_QUIET},
    {"help", no_argument, NULL, OPT_HELP},
    {NULL, 0, NULL, 0}};

static const char *base_name(const char *path) {
  const char *slash = path ? strrchr(path, '/') : NULL;
  return slash ? slash + 1 : (path && path[0] ? path : "train");
}

static int online_cpus(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  if (n < 1) return 1;
  return n > RT_TRAIN_MAX_THREADS ? RT_TRAIN_MAX_THREADS : (int)n;
}

/* Parses a whole decimal integer in [lo, hi]. */
static int parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
  if (!s[0]) return -1;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

static int parse_u64(const char *s, uint64_t *out) {
  if (!s[0] || s[0] == '-' || s[0] == '+' || s[0] == ' ') return -1;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end) return -1;
  *out = v;
  return 0;
}

static int parse_f64(const char *s, double lo, double hi, double *out) {
  if (!s[0]) return -1;
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || *end || !isfinite(v) || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

/* One line for the learning-rate schedule the model declares. */
static void describe_schedule(char *buf, size_t cap, const RtModelDesc *m) {
  const char *sched = m->schedule ? m->schedule : "constant";
  if (!strcmp(sched, "constant"))
    snprintf(buf, cap, "constant %g", m->lr);
  else
    snprintf(buf, cap, "%s: lr %g, warmup %lld, min_lr %g", sched, m->lr,
             (long long)m->warmup, m->min_lr);
}

void rt_train_usage(FILE *out, const char *prog, const RtModelDesc *m) {
  char sched[160];
  describe_schedule(sched, sizeof sched, m);
  int cpus = online_cpus();
  fprintf(out,
          "usage: %s [options]\n"
          "Trains model '%s'%s%s%s: batch %lld x seq %lld, vocab %lld, optimizer %s.\n"
          "  --steps N          total steps; a resumed run continues up to N (default %lld)\n"
          "  --data FILE        tokens: an llm.c .bin file or raw bytes (default: the built-in "
          "corpus)\n"
          "  --init W.safetensors\n"
          "                     start from these weights, by name and exact shape; names may "
          "carry a\n"
          "                     leading \"transformer.\" (default: random init from --seed)\n"
          "  --save-weights W.safetensors\n"
          "                     write the weights after the last step, atomically (default: "
          "none)\n"
          "  --lr X             constant learning rate instead of the schedule, 0..%g; a\n"
          "                     resumed run keeps the one it was saved with\n"
          "                     (default: the model's schedule, %s)\n"
          "  --seed S           init seed, 0..2^64-1 (default %llu)\n"
          "  --log FILE         JSON-lines log: a config record, then one record per step "
          "(default: none)\n"
          "  --save DIR         full training state at the end, atomically (default: none)\n"
          "  --save-every N     with --save: also after every N steps (default: only at the "
          "end)\n"
          "  --resume DIR       continue a --save checkpoint exactly (default: start at step "
          "0)\n"
          "  --threads N        worker threads, 1..%d (default %d: the online CPUs)\n"
          "  --comm-timeout S   several ranks: a collective or receive waiting longer than S\n"
          "                     seconds aborts every rank, naming rank, group, op and sizes\n"
          "                     (default %g, or PARC_COMM_TIMEOUT from the environment)\n"
          "  --trace FILE       what every rank did, with wall-clock times, as Chrome trace "
          "JSON\n"
          "                     (Perfetto): per rank compute (a pipeline's F, B, W per "
          "microbatch\n"
          "                     and chunk, the optimizer), sends, receives (time blocked),\n"
          "                     all-reduces and idle; merged over the ranks by world rank 0 "
          "at the\n"
          "                     end (default: none; without it nothing is timed)\n"
          "  --quiet            no start line, progress or summary; errors only\n"
          "  --help             this text\n"
          "Exit status: 0 done, 1 bad option value, input file or setup (a GPU trainer's\n"
          "device refused at start-up: too small, too few GPUs), 2 bad command line, 3 internal\n"
          "error.\n",
          base_name(prog), m->name ? m->name : "?", m->source ? " (from " : "",
          m->source ? m->source : "", m->source ? ")" : "", (long long)m->batch,
          (long long)m->seq, (long long)m->vocab, m->optimizer ? m->optimizer : "?",
          (long long)m->steps, RT_TRAIN_MAX_LR, sched, (unsigned long long)m->seed,
          RT_TRAIN_MAX_THREADS, cpus, rt_comm_timeout());
}

/* A malformed command line: the complaint, then the usage; exit 2. */
__attribute__((format(printf, 4, 5))) static int usage_error(FILE *err, const char *prog,
                                                             const RtModelDesc *m,
                                                             const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(err, "%s: ", base_name(prog));
  vfprintf(err, fmt, ap);
  fputc('\n', err);
  va_end(ap);
  rt_train_usage(err, prog, m);
  return 2;
}

static int bad_value(FILE *err, const char *prog, const char *opt, const char *val,
                     const char *range) {
  fprintf(err, "%s: --%s '%s': %s\n", base_name(prog), opt, val, range);
  return 1;
}

int rt_train_parse_opts(RtTrainOpts *o, int argc, char **argv, const RtModelDesc *m,
                        FILE *err) {
  const char *prog = argc > 0 ? argv[0] : "train";
  memset(o, 0, sizeof *o);
  o->steps = m->steps;
  o->seed = m->seed;
  o->threads = online_cpus();

  char range[160];
  /* getopt keeps its position in globals: start afresh on every call. */
#ifdef __GLIBC__
  optind = 0;
#else
  optind = 1;
#endif
  opterr = 0;
  int c, index;
  while ((c = getopt_long(argc, argv, ":", long_opts, &index)) != -1) {
    const char *v = optarg;
    const char *name = NULL;
    for (const struct option *lo = long_opts; lo->name; lo++)
      if (lo->val == c) name = lo->name;
    switch (c) {
    case OPT_STEPS:
      if (parse_i64(v, 0, RT_TRAIN_MAX_STEPS, &o->steps)) {
        snprintf(range, sizeof range, "want a whole number of steps in 0..%lld",
                 (long long)RT_TRAIN_MAX_STEPS);
        return bad_value(err, prog, name, v, range);
      }
      break;
    case OPT_SAVE_EVERY:
      if (parse_i64(v, 1, RT_TRAIN_MAX_STEPS, &o->save_every)) {
        snprintf(range, sizeof range, "want a whole number of steps in 1..%lld",
                 (long long)RT_TRAIN_MAX_STEPS);
        return bad_value(err, prog, name, v, range);
      }
      break;
    case OPT_THREADS: {
      int64_t t;
      if (parse_i64(v, 1, RT_TRAIN_MAX_THREADS, &t)) {
        snprintf(range, sizeof range, "want a whole number of threads in 1..%d",
                 RT_TRAIN_MAX_THREADS);
        return bad_value(err, prog, name, v, range);
      }
      o->threads = (int)t;
      break;
    }
    case OPT_TRACE:
      if (!v[0]) return bad_value(err, prog, name, v, "want a non-empty path");
      o->trace = v;
      break;
    case OPT_COMM_TIMEOUT:
      if (parse_f64(v, 0.0, RT_TRAIN_MAX_COMM_TIMEOUT, &o->comm_timeout) || !(o->comm_timeout > 0)) {
        snprintf(range, sizeof range, "want seconds in (0, %g]", RT_TRAIN_MAX_COMM_TIMEOUT);
        return bad_value(err, prog, name, v, range);
      }
      break;
    case OPT_LR:
      if (parse_f64(v, 0.0, RT_TRAIN_MAX_LR, &o->lr)) {
        snprintf(range, sizeof range, "want a finite learning rate in 0..%g",
                 RT_TRAIN_MAX_LR);
        return bad_value(err, prog, name, v, range);
      }
      o->lr_set = 1;
      break;
    case OPT_SEED:
      if (parse_u64(v, &o->seed))
        return bad_value(err, prog, name, v,
                         "want a whole number in 0..18446744073709551615");
      o->seed_set = 1;
      break;
    case OPT_DATA:
    case OPT_INIT:
    case OPT_SAVE_WEIGHTS:
    case OPT_SAVE_GRADS:
    case OPT_LOG:
    case OPT_SAVE:
    case OPT_RESUME:
      if (!v[0]) return bad_value(err, prog, name, v, "want a non-empty path");
      if (c == OPT_DATA) o->data = v;
      else if (c == OPT_INIT) o->init = v;
      else if (c == OPT_SAVE_WEIGHTS) o->save_weights = v;
      else if (c == OPT_SAVE_GRADS) o->save_grads = v;
      else if (c == OPT_LOG) o->log = v;
      else if (c == OPT_SAVE) o->save = v;
      else o->resume = v;
      break;
    case OPT_QUIET:
      o->quiet = 1;
      break;
    case OPT_HELP:
      rt_train_usage(stdout, prog, m);
      return 0;
    case ':':
      return usage_error(err, prog, m, "option '%s' needs a value", argv[optind - 1]);
    default: {
      char shortopt[3] = {'-', (char)optopt, 0};
      return usage_error(err, prog, m, "unknown or ambiguous option '%s'",
                         optopt ? shortopt : argv[optind - 1]);
    }
    }
  }
  if (optind < argc) return usage_error(err, prog, m, "unexpected argument '%s'", argv[optind]);

  if (o->init && o->resume) {
    fprintf(err, "%s: --init and --resume both set the weights; give one of them\n",
            base_name(prog));
    return 1;
  }
  if (o->save_every && !o->save) {
    fprintf(err, "%s: --save-every %lld needs --save DIR to write the checkpoints to\n",
            base_name(prog), (long long)o->save_every);
    return 1;
  }
  return -1;
}
