/* runtime/rt_train.c -- rt_train_main: setup, the step loop, saving; see rt_train.h.
 *
 * Order of a run: check the model description; parse options; start the pool;
 * allocate params, state and the arena; open the data; weights from --resume,
 * --init or the seed; open the log; then for t = start .. steps-1: learning rate,
 * batch t, step, progress and log line, periodic checkpoint; finally the
 * weights file and the checkpoint. Options, files and output directories are all
 * checked before the first step, so a run does not die hours in on its own inputs
 * (except a token >= vocab in an llm.c file, which rt_data finds batch by batch). */
#define _POSIX_C_SOURCE 200809L
#include "runtime/rt_train.h"

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/rt_data.h"
#include "runtime/rt_err.h"
#include "runtime/rt_fs.h"
#include "runtime/rt_log.h"
#include "runtime/rt_pool.h"
#include "runtime/rt_rng.h"
#include "runtime/rt_sched.h"

/* ---- the model description's invariants ---- */

static int cmp_names(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Names must be unique (they key the weights files): sort a copy and compare neighbours. */
static int check_unique(const char *what, const char **names, int n) {
  qsort(names, (size_t)n, sizeof *names, cmp_names);
  for (int i = 1; i < n; i++)
    if (!strcmp(names[i - 1], names[i]))
      return rt_fail("model description: %s name '%s' appears twice", what, names[i]);
  return RT_OK;
}

/* Regions [offset, offset+numel) in declaration order, non-overlapping, inside total. */
static int check_region(const char *what, int i, const char *name, int64_t offset,
                        int64_t numel, int64_t *end, int64_t total) {
  if (offset < *end)
    return rt_fail("model description: %s %d '%s' starts at float %lld, before the end "
                   "(%lld) of the one declared before it", what, i, name, (long long)offset,
                   (long long)*end);
  if (numel < 0 || numel > total - offset)
    return rt_fail("model description: %s %d '%s' [%lld, %lld + %lld) exceeds its buffer of "
                   "%lld floats", what, i, name, (long long)offset, (long long)offset,
                   (long long)numel, (long long)total);
  *end = offset + numel;
  return RT_OK;
}

static int check_params(const RtModelDesc *m, const char **names) {
  int64_t end = 0;
  for (int i = 0; i < m->nparams; i++) {
    const RtParamDesc *p = &m->params[i];
    if (!p->name || !p->name[0])
      return rt_fail("model description: parameter %d has no name", i);
    if (p->rank < 0 || p->rank > RT_MAX_RANK)
      return rt_fail("model description: parameter '%s' has rank %d, outside 0..%d", p->name,
                     p->rank, RT_MAX_RANK);
    int64_t numel = 1;
    for (int d = 0; d < p->rank; d++) {
      if (p->shape[d] < 0 || (p->shape[d] > 0 && numel > INT64_MAX / p->shape[d]))
        return rt_fail("model description: parameter '%s' has a bad dimension %d (%lld)",
                       p->name, d, (long long)p->shape[d]);
      numel *= p->shape[d];
    }
    if (numel != p->numel)
      return rt_fail("model description: parameter '%s' has numel %lld but its shape holds "
                     "%lld", p->name, (long long)p->numel, (long long)numel);
    if (check_region("parameter", i, p->name, p->offset, p->numel, &end, m->params_numel))
      return RT_ERR;
    if (p->init != RT_INIT_NORMAL && p->init != RT_INIT_ZEROS && p->init != RT_INIT_ONES)
      return rt_fail("model description: parameter '%s' has unknown init %d", p->name,
                     (int)p->init);
    if (p->init == RT_INIT_NORMAL && !(p->std >= 0 && isfinite(p->std)))
      return rt_fail("model description: parameter '%s' has init std %g", p->name,
                     (double)p->std);
    names[i] = p->name;
  }
  return check_unique("parameter", names, m->nparams);
}

static int check_state(const RtModelDesc *m, const char **names) {
  int64_t end = 0;
  for (int i = 0; i < m->nstate; i++) {
    const RtStateDesc *s = &m->state[i];
    if (!s->name || !s->name[0]) return rt_fail("model description: state %d has no name", i);
    if (check_region("state", i, s->name, s->offset, s->numel, &end, m->state_numel))
      return RT_ERR;
    names[i] = s->name;
  }
  return check_unique("state", names, m->nstate);
}

int rt_train_check_model(const RtModelDesc *m) {
  if (!m) return rt_fail("model description: NULL");
  if (!m->name || !m->name[0] || !m->step || !m->optimizer || !m->schedule)
    return rt_fail("model description: name, optimizer, schedule and step are required");
  if (m->vocab < 1 || m->vocab > INT32_MAX || m->batch < 1 || m->seq < 1 ||
      m->batch > INT32_MAX / m->seq)
    return rt_fail("model description: vocab %lld, batch %lld, seq %lld: each must be "
                   "positive, vocab and batch*seq below 2^31", (long long)m->vocab,
                   (long long)m->batch, (long long)m->seq);
  if (m->nparams < 0 || m->nstate < 0 || m->params_numel < 0 || m->state_numel < 0 ||
      m->arena_bytes < 0 || (m->nparams && !m->params) || (m->nstate && !m->state) ||
      (size_t)m->params_numel > SIZE_MAX / sizeof(float) ||
      (size_t)m->state_numel > SIZE_MAX / sizeof(float))
    return rt_fail("model description: bad counts (nparams %d, nstate %d, params_numel %lld, "
                   "state_numel %lld, arena_bytes %lld)", m->nparams, m->nstate,
                   (long long)m->params_numel, (long long)m->state_numel,
                   (long long)m->arena_bytes);
  if (rt_sched_parse(m->schedule) < 0 || m->warmup < 0)
    return rt_fail("model description: schedule '%s' with warmup %lld; want constant, warmup "
                   "or cosine and warmup >= 0", m->schedule, (long long)m->warmup);
  if (m->steps < 0 || m->steps > RT_TRAIN_MAX_STEPS)
    return rt_fail("model description: steps %lld outside 0..%lld", (long long)m->steps,
                   (long long)RT_TRAIN_MAX_STEPS);
  if (m->nconfig < 0 || (m->nconfig && (!m->config_names || !m->config_values)))
    return rt_fail("model description: config has %d entries but no arrays", m->nconfig);
  for (int i = 0; i < m->nconfig; i++)
    if (!m->config_names[i]) return rt_fail("model description: config entry %d has no name", i);
  int n = m->nparams > m->nstate ? m->nparams : m->nstate;
  const char **names = malloc((n > 0 ? (size_t)n : 1) * sizeof *names);
  if (!names) return rt_fail("model description: out of memory");
  int rc = check_params(m, names);
  if (rc == RT_OK) rc = check_state(m, names);
  free(names);
  return rc;
}

/* ---- setup helpers ---- */

static const char *base_name(const char *path) {
  const char *slash = path ? strrchr(path, '/') : NULL;
  return slash ? slash + 1 : (path && path[0] ? path : "train");
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* bytes, 64-byte aligned, zeroed; NULL on failure. Exactly `bytes` are requested, so a
 * checked build catches a step that strays past its buffer. */
static void *alloc64(size_t bytes) {
  void *p = NULL;
  if (posix_memalign(&p, 64, bytes ? bytes : 1)) return NULL;
  memset(p, 0, bytes);
  return p;
}

/* Random init from the seed: each tensor as a whole (global indices). */
static int init_params(const RtModelDesc *m, float *params, uint64_t seed) {
  for (int i = 0; i < m->nparams; i++) {
    const RtParamDesc *p = &m->params[i];
    float *dst = params + p->offset;
    if (p->init == RT_INIT_NORMAL) {
      if (rt_init_normal_slice(dst, seed, rt_param_stream(p->name), p->std, p->rank, p->shape,
                               -1, 0, 0))
        return RT_ERR;
    } else if (p->init == RT_INIT_ONES) {
      rt_fill_ones(dst, p->numel);
    } else {
      rt_fill_zeros(dst, p->numel);
    }
  }
  return RT_OK;
}

/* An output file's directory must exist now, not after hours of training. */
static int check_out_dir(const char *opt, const char *path) {
  char dir[4096];
  if (rt_fs_dirname(path, dir, sizeof dir)) return RT_ERR;
  if (rt_fs_kind(dir) != 2 || access(dir, W_OK | X_OK) != 0)
    return rt_fail("--%s %s: directory %s does not exist or is not writable; create it or "
                   "choose another path", opt, path, dir);
  return RT_OK;
}

/* The config record: the model's dimensions, then every setting in force. */
static int log_config(RtLog *log, const RtModelDesc *m, const RtTrainOpts *o, double lr,
                      int lr_const, int64_t nparam, int64_t start, const RtData *data,
                      double entropy) {
  int rc = RT_OK;
  for (int i = 0; i < m->nconfig && rc == RT_OK; i++)
    rc = rt_log_config_num(log, m->config_names[i], m->config_values[i]);
  char seed[32];
  snprintf(seed, sizeof seed, "%" PRIu64, o->seed);
  struct {
    const char *key;
    double v;
  } nums[] = {{"batch", (double)m->batch},     {"seq", (double)m->seq},
              {"vocab", (double)m->vocab},     {"params", (double)nparam},
              {"arena_bytes", (double)m->arena_bytes},
              {"lr", lr},                      {"beta1", m->beta1},
              {"beta2", m->beta2},             {"eps", m->eps},
              {"weight_decay", m->weight_decay}, {"momentum", m->momentum},
              {"grad_clip", m->clip},          {"warmup", (double)m->warmup},
              {"min_lr", m->min_lr},           {"steps", (double)o->steps},
              {"start_step", (double)start},   {"threads", o->threads},
              {"data_tokens", (double)rt_data_ntokens(data)},
              {"unigram_entropy", entropy}};
  if (rc == RT_OK) rc = rt_log_config_str(log, "model", m->name);
  for (size_t i = 0; i < sizeof nums / sizeof nums[0] && rc == RT_OK; i++)
    rc = rt_log_config_num(log, nums[i].key, nums[i].v);
  if (rc == RT_OK) rc = rt_log_config_str(log, "optimizer", m->optimizer);
  if (rc == RT_OK) rc = rt_log_config_str(log, "schedule", lr_const ? "constant" : m->schedule);
  /* A seed beyond 2^53 would lose bits as a JSON number: written as a string then. */
  if (rc == RT_OK)
    rc = o->seed <= (UINT64_C(1) << 53) ? rt_log_config_num(log, "seed", (double)o->seed)
                                        : rt_log_config_str(log, "seed", seed);
  if (rc == RT_OK) rc = rt_log_config_str(log, "data", rt_data_name(data));
  if (rc == RT_OK) rc = rt_log_write_config(log);
  return rc;
}

/* ---- the run ---- */

typedef struct {
  const RtModelDesc *m;
  RtTrainOpts o;
  const char *prog;
  float *params, *state;
  void *arena;
  int32_t *tokens, *targets;
  RtData *data;
  RtLog *log;
  int64_t start;             /* first step to run */
  RtSched sched;             /* the model's schedule, unless lr_const */
  int lr_const;              /* a constant lr (from --lr or the resumed checkpoint) */
  double lr;
} Run;

static void run_free(Run *r) {
  if (r->log && rt_log_close(r->log))
    fprintf(stderr, "%s: %s\n", r->prog, rt_last_error());
  rt_data_close(r->data);
  free(r->params);
  free(r->state);
  free(r->arena);
  free(r->tokens);
  free(r->targets);
}

/* Prints the pending error as one line; returns code. */
static int fail(const Run *r, int code, const char *what) {
  fprintf(stderr, "%s: %s%s\n", r->prog, what, rt_last_error());
  return code;
}

static int save_ckpt(Run *r, int64_t step) {
  RtTrainCkptInfo info;
  memset(&info, 0, sizeof info);
  info.step = step;
  info.steps = r->o.steps;
  info.seed = r->o.seed;
  info.lr_set = r->lr_const;
  info.lr = r->lr;
  info.data_tokens = rt_data_ntokens(r->data);
  snprintf(info.data_name, sizeof info.data_name, "%s", rt_data_name(r->data));
  return rt_train_save_ckpt(r->o.save, r->m, r->params, r->state, &info);
}

/* Weights from --resume, --init or the seed; sets r->start. Returns an exit code or -1. */
static int load_start(Run *r) {
  const RtModelDesc *m = r->m;
  if (r->o.resume) {
    RtTrainCkptInfo info;
    if (rt_train_load_ckpt(r->o.resume, m, r->params, r->state, &info))
      return fail(r, 1, "--resume: ");
    if (info.step > r->o.steps) {
      fprintf(stderr, "%s: --resume %s: the checkpoint is at step %lld, beyond --steps %lld; "
              "give --steps %lld or more\n", r->prog, r->o.resume, (long long)info.step,
              (long long)r->o.steps, (long long)info.step);
      return 1;
    }
    if (r->o.seed_set && r->o.seed != info.seed)
      fprintf(stderr, "%s: note: --seed %" PRIu64 " is not used: the weights come from the "
              "checkpoint (seed %" PRIu64 ")\n", r->prog, r->o.seed, info.seed);
    r->o.seed = info.seed;
    if (!r->o.lr_set && info.lr_set) {
      r->lr_const = 1;
      r->lr = info.lr;
    }
    /* (the saved name is cut to the buffer: compare that much) */
    if (info.data_tokens != rt_data_ntokens(r->data) ||
        strncmp(info.data_name, rt_data_name(r->data), sizeof info.data_name - 1))
      fprintf(stderr, "%s: warning: the checkpoint was trained on %s (%lld tokens); this run "
              "continues on %s (%lld tokens)\n", r->prog, info.data_name,
              (long long)info.data_tokens, rt_data_name(r->data),
              (long long)rt_data_ntokens(r->data));
    r->start = info.step;
    return -1;
  }
  if (r->o.init) {
    if (rt_train_load_weights(m, r->params, r->o.init)) return fail(r, 1, "--init: ");
    return -1;
  }
  if (init_params(m, r->params, r->o.seed)) return fail(r, 3, "internal error: init: ");
  return -1;
}

static int train_loop(Run *r, double entropy) {
  const RtModelDesc *m = r->m;
  const int B = (int)m->batch, T = (int)m->seq;
  RtProgress prog;
  rt_progress_init(&prog, stdout, r->o.steps, -1);
  RtStepIO io;
  memset(&io, 0, sizeof io);
  io.params = r->params;
  io.state = r->state;
  io.arena = r->arena;
  io.tokens = r->tokens;
  io.targets = r->targets;
  double loss = NAN;
  for (int64_t t = r->start; t < r->o.steps; t++) {
    double t0 = now_ms();
    double lr = r->lr_const ? r->lr
                            : rt_lr_at(r->sched, m->lr, m->warmup, m->min_lr, r->o.steps, t);
    if (rt_data_batch(r->data, t, B, T, r->tokens, r->targets)) {
      rt_progress_done(&prog);
      return fail(r, 1, "--data: ");
    }
    io.lr = (float)lr;
    io.step = (float)(t + 1);
    io.loss = io.ce_loss = io.grad_norm = NAN;
    if (m->step(&io)) {
      rt_progress_done(&prog);
      fprintf(stderr, "%s: internal error: step %lld/%lld (log step %lld) failed: %s\n", r->prog,
              (long long)(t + 1), (long long)r->o.steps, (long long)t, rt_last_error());
      return 3;
    }
    double ms = now_ms() - t0;
    loss = io.loss;
    RtStepStats s = {t, io.loss, lr, io.grad_norm, ms > 0 ? (double)B * T * 1e3 / ms : 0,
                     ms, -1};
    if (!r->o.quiet) rt_progress_step(&prog, &s);
    if (r->log) {
      const char *key[1] = {"ce_loss"};
      double val[1] = {io.ce_loss};
      /* Bitwise: a NaN ce_loss beside a NaN loss is still logged. */
      int differs = memcmp(&io.ce_loss, &io.loss, sizeof io.loss) != 0;
      if (rt_log_step(r->log, &s, key, val, differs)) {
        rt_progress_done(&prog);
        return fail(r, 1, "--log: ");
      }
    }
    if (r->o.save && r->o.save_every && (t + 1) % r->o.save_every == 0 && t + 1 < r->o.steps) {
      if (save_ckpt(r, t + 1)) {
        rt_progress_done(&prog);
        return fail(r, 1, "--save: ");
      }
    }
  }
  rt_progress_done(&prog);
  if (!r->o.quiet && r->start < r->o.steps)
    printf("done: step %lld, loss %.4f (unigram entropy %.4f)\n", (long long)r->o.steps, loss,
           entropy);
  return -1;
}

static int run(Run *r) {
  const RtModelDesc *m = r->m;
  if (rt_pool_init(r->o.threads)) return fail(r, 3, "internal error: --threads: ");

  size_t ntok = (size_t)m->batch * (size_t)m->seq;
  r->params = alloc64((size_t)m->params_numel * sizeof(float));
  r->state = alloc64((size_t)m->state_numel * sizeof(float));
  r->arena = alloc64((size_t)m->arena_bytes);
  r->tokens = alloc64(ntok * sizeof(int32_t));
  r->targets = alloc64(ntok * sizeof(int32_t));
  if (!r->params || !r->state || !r->arena || !r->tokens || !r->targets) {
    fprintf(stderr, "%s: internal error: out of memory for %lld parameter, %lld state floats "
            "and an arena of %lld bytes\n", r->prog, (long long)m->params_numel,
            (long long)m->state_numel, (long long)m->arena_bytes);
    return 3;
  }

  int rc = r->o.data ? rt_data_open(&r->data, r->o.data, (int)m->vocab, (int)m->seq)
                     : rt_data_builtin(&r->data, 0, (int)m->vocab, (int)m->seq);
  if (rc) return fail(r, 1, "--data: ");
  double entropy = rt_data_unigram_entropy(r->data);

  r->sched = (RtSched)rt_sched_parse(m->schedule);
  r->lr_const = r->o.lr_set;
  r->lr = r->o.lr_set ? r->o.lr : m->lr;
  if ((rc = load_start(r)) >= 0) return rc;

  if (r->o.save_weights && check_out_dir("save-weights", r->o.save_weights))
    return fail(r, 1, "");
  if (r->o.save) {
    /* The checkpoint's parent is created now (as the first save would) and checked. */
    char parent[4096];
    if (rt_fs_dirname(r->o.save, parent, sizeof parent) || rt_fs_mkdirs(parent) ||
        check_out_dir("save", r->o.save))
      return fail(r, 1, "--save: ");
  }
  int64_t nparam = 0;
  for (int i = 0; i < m->nparams; i++) nparam += m->params[i].numel;
  /* A resumed run appends to its log: one file then tells the whole story. */
  if (r->o.log && (rt_log_open(&r->log, r->o.log, r->o.resume != NULL) ||
                   log_config(r->log, m, &r->o, r->lr, r->lr_const, nparam, r->start, r->data,
                              entropy)))
    return fail(r, 1, "--log: ");

  if (!r->o.quiet) {
    printf("%s: %lld parameters, arena %lld bytes | data %s: %lld tokens, unigram entropy "
           "%.4f nats | steps %lld..%lld, batch %lld x seq %lld, %d thread%s\n",
           m->name, (long long)nparam, (long long)m->arena_bytes, rt_data_name(r->data),
           (long long)rt_data_ntokens(r->data), entropy, (long long)r->start,
           (long long)r->o.steps, (long long)m->batch, (long long)m->seq, rt_pool_threads(),
           rt_pool_threads() == 1 ? "" : "s");
    if (r->o.resume)
      printf("resumed from %s at step %lld%s\n", r->o.resume, (long long)r->start,
             r->lr_const && !r->o.lr_set ? " with the constant --lr it was saved with" : "");
    fflush(stdout);
  }

  if ((rc = train_loop(r, entropy)) >= 0) return rc;

  if (r->o.save_weights) {
    if (rt_train_save_weights(m, r->params, r->o.save_weights)) return fail(r, 1, "--save-weights: ");
    if (!r->o.quiet) printf("weights: %s\n", r->o.save_weights);
  }
  if (r->o.save) {
    if (save_ckpt(r, r->o.steps)) return fail(r, 1, "--save: ");
    if (!r->o.quiet) printf("checkpoint: %s (step %lld)\n", r->o.save, (long long)r->o.steps);
  }
  return 0;
}

int rt_train_main(int argc, char **argv, const RtModelDesc *model) {
  Run r;
  memset(&r, 0, sizeof r);
  r.m = model;
  r.prog = base_name(argc > 0 ? argv[0] : NULL);
  if (rt_train_check_model(model)) return fail(&r, 3, "internal error: ");
  int rc = rt_train_parse_opts(&r.o, argc, argv, model, stderr);
  if (rc >= 0) return rc;
  rc = run(&r);
  run_free(&r);
  rt_pool_shutdown();
  fflush(stdout);
  return rc < 0 ? 0 : rc;
}
