/* runtime/rt_train.c -- rt_train_main: setup, the step loop, saving; see rt_train.h.
 *
 * Order of a run: check the model description; parse options; start the pool;
 * allocate params, state and the arena; open the data; weights from --resume,
 * --init or the seed; open the log; then for t = start .. steps-1: learning rate,
 * batch t, step, progress and log line, periodic checkpoint; finally the
 * weights file and the checkpoint. Options, files and output directories are all
 * checked before the first step, so a run does not die hours in on its own inputs
 * (except a token >= vocab in an llm.c file, which rt_data finds batch by batch).
 * A GPU trainer's device is made then too (RtModelDesc.start, after the weights
 * and the log, before the first step): a GPU too small for the plan or too few
 * GPUs for the mesh is a setup error (exit 1), reported before any step.
 *
 * Several ranks (tp * dp * pp > 1, rt_train.h): rt_train_main runs `run` once per rank
 * under rt_comm_run; a Run then carries the rank's mesh. With the thread backend a
 * failing rank records its message in the shared MeshCtx (the first failure wins)
 * and the main thread prints that one line; under MPI each failing process prints
 * its own, prefixed with its rank. */
#define _POSIX_C_SOURCE 200809L
#include "runtime/rt_train.h"

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/rt_comm.h"
#include "runtime/rt_data.h"
#include "runtime/rt_err.h"
#include "runtime/rt_fs.h"
#include "runtime/rt_log.h"
#include "runtime/rt_pipe.h"
#include "runtime/rt_pool.h"
#include "runtime/rt_rng.h"
#include "runtime/rt_sched.h"
#include "runtime/rt_trace.h"

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

/* The mesh fields: degrees, the batch split, shard descriptors and the states'
 * parameters. Only checked for several ranks: a one-rank trainer may leave them. */
static int check_mesh(const RtModelDesc *m) {
  int tp = m->tp ? m->tp : 1, dp = m->dp ? m->dp : 1, pp = m->pp ? m->pp : 1;
  if (tp < 1 || dp < 1 || pp < 1 || (int64_t)tp * dp * pp > RT_COMM_MAX_RANKS)
    return rt_fail("model description: mesh tp %d x dp %d x pp %d; each must be >= 1 (0 reads "
                   "as 1) and tp * dp * pp at most %d", m->tp, m->dp, m->pp, RT_COMM_MAX_RANKS);
  if (tp * dp == 1) return RT_OK;
  if (m->batch % dp)
    return rt_fail("model description: batch %lld is not divisible by dp %d; every "
                   "data-parallel rank takes batch / dp rows", (long long)m->batch, dp);
  if (m->microbatches > 1 && m->batch % ((int64_t)m->microbatches * dp))
    return rt_fail("model description: batch %lld does not split into %d microbatches of "
                   "dp %d shares", (long long)m->batch, m->microbatches, dp);
  int ep = m->ep ? m->ep : 1; /* expert parallelism: carved from dp */
  if (ep < 1 || dp % ep)
    return rt_fail("model description: ep %d does not divide dp %d", m->ep, dp);
  if (tp == 1 && ep == 1) return RT_OK;
  for (int i = 0; i < m->nparams; i++) {
    const RtParamDesc *p = &m->params[i];
    int64_t local[RT_MAX_RANK];
    if (p->ep > 1 && p->ep != ep)
      return rt_fail("model description: parameter '%s' is split over ep %d, the mesh's ep "
                     "is %d", p->name, p->ep, ep);
    if (p->shard_dim >= 0 && (tp > 1 || p->ep > 1)) {
      RtShard sh;
      if (p->shard_dim < p->rank) rt_train_param_shard(p, tp, 0, 0, &sh);
      if (p->shard_dim >= p->rank || p->shard_blocks < 1 ||
          rt_shard_local_shape(p->rank, p->global_shape, &sh, local)) {
        char why[RT_ERR_MAX];
        snprintf(why, sizeof why, "%s", rt_last_error());
        return rt_fail("model description: parameter '%s' has shard_dim %d, shard_blocks %d "
                       "for rank %d over tp %d: %s", p->name, p->shard_dim, p->shard_blocks,
                       p->rank, tp, why);
      }
    } else {
      memcpy(local, p->global_shape, sizeof local);
    }
    for (int d = 0; d < p->rank; d++)
      if (local[d] != p->shape[d])
        return rt_fail("model description: parameter '%s': local dimension %d is %lld but "
                       "its global shape and sharding give %lld", p->name, d,
                       (long long)p->shape[d], (long long)local[d]);
  }
  for (int i = 0; i < m->nstate; i++) {
    const RtStateDesc *st = &m->state[i];
    int64_t n = st->param < 0 || st->param >= m->nparams ? -1 : m->params[st->param].numel;
    if (n >= 0) { /* ZeRO-1: a piece (an expert-parallel one's over its ep_dp group) */
      int z = rt_zero_pieces(m, &m->params[st->param]);
      n = (n + z - 1) / z;
    }
    if (n < 0 || st->numel != n)
      return rt_fail("model description: state '%s' names parameter %d, which %s", st->name,
                     st->param, st->param < 0 || st->param >= m->nparams
                                     ? "does not exist"
                                     : "has another numel");
  }
  return RT_OK;
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
  if (m->nmoe < 0 || (m->nmoe && !m->moe))
    return rt_fail("model description: %d MoE layers but no table", m->nmoe);
  for (int i = 0; i < m->nmoe; i++)
    if (m->moe[i].experts < 1 || m->moe[i].offset < 0 ||
        m->moe[i].offset > m->moe_numel - m->moe[i].experts - 3)
      return rt_fail("model description: MoE layer %d: %d experts at %lld past the %lld "
                     "statistics floats", m->moe[i].layer, m->moe[i].experts,
                     (long long)m->moe[i].offset, (long long)m->moe_numel);
  int n = m->nparams > m->nstate ? m->nparams : m->nstate;
  const char **names = malloc((n > 0 ? (size_t)n : 1) * sizeof *names);
  if (!names) return rt_fail("model description: out of memory");
  int rc = check_params(m, names);
  if (rc == RT_OK) rc = check_state(m, names);
  free(names);
  if (rc == RT_OK) rc = check_mesh(m);
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

/* Random init from the seed: each tensor as a whole (global indices); with tp > 1
 * the shard of tp coordinate coord (an expert-parallel one's of ep coordinate
 * ep_coord), from the same global indices. */
static int init_params(const RtModelDesc *m, float *params, uint64_t seed, int tp, int coord,
                       int ep_coord) {
  for (int i = 0; i < m->nparams; i++) {
    const RtParamDesc *p = &m->params[i];
    float *dst = params + p->offset;
    RtShard sh;
    const int64_t *gshape = rt_train_param_shard(p, tp, coord, ep_coord, &sh);
    if (p->init == RT_INIT_NORMAL) {
      if (sh.dim >= 0 ? rt_shard_init_normal(dst, seed, rt_param_stream(p->name), p->std,
                                             p->rank, gshape, &sh)
                      : rt_init_normal_slice(dst, seed, rt_param_stream(p->name), p->std,
                                             p->rank, p->shape, -1, 0, 0))
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
                      double entropy, int tp, int dp, int pp) {
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
              {"beta2", m->beta2},             {"adam_eps", m->eps}, /* "eps": a norm's */
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
  if (rc == RT_OK && tp * dp > 1) rc = rt_log_config_num(log, "tp", tp);
  if (rc == RT_OK && tp * dp > 1) rc = rt_log_config_num(log, "dp", dp);
  if (rc == RT_OK && pp > 1) rc = rt_log_config_num(log, "pp", pp);
  if (rc == RT_OK && m->ep > 1) rc = rt_log_config_num(log, "ep", m->ep);
  if (rc == RT_OK) rc = rt_log_write_config(log);
  return rc;
}

/* ---- the run ---- */

/* Shared by the ranks of a thread-backend mesh: the first failure. */
typedef struct {
  pthread_mutex_t mu;
  int mpi;                   /* MPI backend: each process prints its own failure */
  int code;                  /* 0 until a rank fails */
  char msg[RT_ERR_MAX + 512];
} MeshFail;

/* The whole (unsharded) model that world rank 0 writes when tp > 1, ep > 1 or a
 * parameter is padded (Run.whole_out): a description with global shapes and packed
 * offsets, its buffers, and the gather scratch. */
typedef struct {
  RtModelDesc m;
  RtParamDesc *p;
  RtStateDesc *s;
  float *params, *state;     /* world rank 0 only */
  float *scratch;            /* max(tp, ep) * the largest local numel (the ranks
                                that gather: dp rank < ep) */
  int64_t *counts;
} Whole;

typedef struct {
  const RtModelDesc *m;
  RtTrainOpts o;
  const char *prog;
  float *params, *state;
  float *grads;              /* --save-grads: the first step's gradients */
  void *arena;
  int32_t *tokens, *targets;
  float *moe;                /* RtModelDesc.moe_numel > 0: the step's routing
                                statistics (RtStepIO.moe); else NULL */
  RtMoeLayerStats *moe_stats; /* nmoe: the logged ones, tokens in moe_tok */
  double *moe_tok;
  int32_t *mb_rows;          /* RtModelDesc.microbatches > 1 with dp > 1: scratch of
                                batch * seq ints for mb_major; else NULL */
  RtData *data;
  RtLog *log;
  int64_t start;             /* first step to run */
  RtSched sched;             /* the model's schedule, unless lr_const */
  int lr_const;              /* a constant lr (from --lr or the resumed checkpoint) */
  double lr;
  /* the mesh (tp = dp = pp = ep = 1, world NULL for one rank) */
  int tp, dp, pp, wrank;
  int ep;                    /* expert parallelism: ep consecutive dp ranks */
  int whole_out;             /* weights and checkpoints go through `whole`: tp > 1,
                                ep > 1 or a padded vocabulary (rt_model_padded) */
  RtComm *world;
  RtMesh mesh;
  MeshFail *shared;          /* thread backend: where failures go */
  Whole whole;
  RtZeroView zview;          /* ZeRO-1: the whole local state, for checkpoints */
  RtTrace *trace;            /* --trace: this rank's recorder, else NULL */
  /* a pipeline whose stages hold their own tensors (RtModelDesc.pp_param_offset):
   * m is this stage's description (stage.m), pp_whole the model's; ppw_* the whole
   * (tp-local) buffers, only while saving or resuming (else NULL) */
  RtPipeStageDesc stage;
  const RtModelDesc *pp_whole;
  float *ppw_params, *ppw_state;
  int stop_agreed;           /* MPI: the ranks agreed to stop (a refused setup, exit 1):
                                rank_main returns RT_COMM_STOP_AGREED, MPI is finalised */
} Run;

static void run_free(Run *r) {
  if (r->log && rt_log_close(r->log))
    fprintf(stderr, "%s: %s\n", r->prog, rt_last_error());
  rt_data_close(r->data);
  free(r->params);
  free(r->grads);
  free(r->state);
  free(r->arena);
  free(r->tokens);
  free(r->targets);
  free(r->mb_rows);
  free(r->moe);
  free(r->moe_stats);
  free(r->moe_tok);
  free(r->whole.p);
  free(r->whole.s);
  free(r->whole.params);
  free(r->whole.state);
  free(r->whole.scratch);
  free(r->whole.counts);
  rt_train_zero_free(&r->zview);
  rt_trace_free(r->trace);
  rt_pipe_stage_desc_free(&r->stage);
  free(r->ppw_params);
  free(r->ppw_state);
}

/* Prints the pending error as one line (thread-backend mesh: records it, and the
 * first recorded is printed once by rt_train_main); returns code. */
static int fail(const Run *r, int code, const char *what) {
  if (r->shared) {
    pthread_mutex_lock(&r->shared->mu);
    if (!r->shared->code) {
      r->shared->code = code;
      snprintf(r->shared->msg, sizeof r->shared->msg, "%s: %s%s", r->prog, what,
               rt_last_error());
    }
    pthread_mutex_unlock(&r->shared->mu);
    if (r->shared->mpi)
      fprintf(stderr, "%s: rank %d: %s%s\n", r->prog, r->wrank, what, rt_last_error());
  } else {
    fprintf(stderr, "%s: %s%s\n", r->prog, what, rt_last_error());
  }
  return code;
}

static int save_ckpt(Run *r, const RtModelDesc *m, const float *params, const float *state,
                     int64_t step) {
  RtTrainCkptInfo info;
  memset(&info, 0, sizeof info);
  info.step = step;
  info.steps = r->o.steps;
  info.seed = r->o.seed;
  info.lr_set = r->lr_const;
  info.lr = r->lr;
  info.data_tokens = rt_data_ntokens(r->data);
  snprintf(info.data_name, sizeof info.data_name, "%s", rt_data_name(r->data));
  return rt_train_save_ckpt(r->o.save, m, params, state, &info);
}

/* The whole-model description (global shapes, packed offsets) for r->whole_out. */
static int whole_init(Run *r) {
  const RtModelDesc *m = r->pp_whole ? r->pp_whole : r->m;
  Whole *w = &r->whole;
  w->p = calloc(m->nparams > 0 ? (size_t)m->nparams : 1, sizeof *w->p);
  w->s = calloc(m->nstate > 0 ? (size_t)m->nstate : 1, sizeof *w->s);
  int parts = r->tp > r->ep ? r->tp : r->ep; /* the largest gather group */
  w->counts = calloc((size_t)parts, sizeof *w->counts);
  /* experts split over tp and ep: the tp pieces (tp n), then the ep group's
   * ep-local tensors (ep tp n) */
  int64_t sparts = r->ep > 1 && r->tp > 1 ? (int64_t)r->tp * r->ep + r->tp : parts;
  if (!w->p || !w->s || !w->counts) return rt_fail("out of memory");
  int64_t off = 0, maxn = 0;
  for (int i = 0; i < m->nparams; i++) {
    RtParamDesc *p = &w->p[i];
    *p = m->params[i];
    RtShard sh;
    const int64_t *g = rt_train_param_shard(&m->params[i], r->tp, 0, 0, &sh);
    p->numel = 1;
    for (int d = 0; d < p->rank; d++) p->numel *= p->shape[d] = p->global_shape[d] = g[d];
    p->shard_dim = -1;
    p->shard_blocks = 1;
    p->ep = 0;
    p->offset = off;
    off += p->numel;
    if (m->params[i].numel > maxn) maxn = m->params[i].numel;
  }
  w->m = *m;
  w->m.tp = w->m.dp = w->m.ep = 1;
  w->m.params = w->p;
  w->m.params_numel = off;
  off = 0;
  for (int i = 0; i < m->nstate; i++) {
    w->s[i] = m->state[i];
    w->s[i].numel = w->p[m->state[i].param].numel;
    w->s[i].offset = off;
    off += w->s[i].numel;
  }
  w->m.state = w->s;
  w->m.state_numel = off;
  if (r->mesh.dp_rank < r->ep &&
      !(w->scratch = malloc((size_t)(maxn * sparts + 1) * sizeof(float))))
    return rt_fail("out of memory for the gather buffer (%lld floats)",
                   (long long)(maxn * sparts));
  if (r->wrank == 0 &&
      (!(w->params = malloc((size_t)(w->m.params_numel + 1) * sizeof(float))) ||
       !(w->state = malloc((size_t)(w->m.state_numel + 1) * sizeof(float)))))
    return rt_fail("out of memory for the whole model (%lld + %lld floats)",
                   (long long)w->m.params_numel, (long long)w->m.state_numel);
  return RT_OK;
}

/* Gathers one tensor (local numel n, sharded like p) into dst: over tp, on the dp
 * rank 0 ranks; an expert-parallel one over ep, on the dp ranks < ep (the ep group
 * of world rank 0's tp coordinate and the same for the others').  The caller is
 * every rank with dp rank < ep; those with dp rank > 0 skip all but the ep ones. */
static int gather_one(Run *r, const RtParamDesc *p, const float *local, int64_t n, float *dst) {
  RtShard sh;
  const int64_t *g = rt_train_param_shard(p, r->tp, 0, 0, &sh);
  Whole *w = &r->whole;
  int expert = p->ep > 1;
  if (!expert && r->mesh.dp_rank != 0) return RT_OK;
  if (sh.dim < 0) {
    if (dst) memcpy(dst, local, (size_t)n * sizeof *dst);
    return RT_OK;
  }
  if (sh.degree == 1) /* a padded tensor on one tp rank: its real rows */
    return dst ? rt_shard_insert(dst, local, p->rank, g, &sh) : RT_OK;
  if (sh.edegree > 1) { /* experts over ep, each over tp: tp first, then ep */
    int64_t es[RT_MAX_RANK], en = n * sh.degree;
    memcpy(es, g, sizeof es);
    es[0] /= sh.edegree;
    float *el = w->scratch + (size_t)en * (size_t)sh.edegree; /* the ep-local tensor */
    for (int c = 0; c < sh.degree; c++) w->counts[c] = n;
    if (rt_comm_all_gather(r->mesh.tp_comm, local, w->scratch, w->counts)) return RT_ERR;
    RtShard tsh = sh;
    tsh.edegree = 0;
    for (int c = 0; c < sh.degree; c++) {
      tsh.coord = c;
      if (rt_shard_insert(el, w->scratch + (size_t)c * (size_t)n, p->rank, es, &tsh))
        return RT_ERR;
    }
    for (int c = 0; c < sh.edegree; c++) w->counts[c] = en;
    if (rt_comm_all_gather(r->mesh.ep_comm, el, w->scratch, w->counts)) return RT_ERR;
    RtShard esh = {.dim = 0, .degree = sh.edegree, .blocks = 1}; /* dim 0 over ep */
    for (int c = 0; dst && c < sh.edegree; c++) {
      esh.coord = c;
      if (rt_shard_insert(dst, w->scratch + (size_t)c * (size_t)en, p->rank, g, &esh))
        return RT_ERR;
    }
    return RT_OK;
  }
  for (int c = 0; c < sh.degree; c++) w->counts[c] = n;
  if (rt_comm_all_gather(expert ? r->mesh.ep_comm : r->mesh.tp_comm, local, w->scratch,
                         w->counts))
    return RT_ERR;
  for (int c = 0; dst && c < sh.degree; c++) {
    sh.coord = c;
    if (rt_shard_insert(dst, w->scratch + (size_t)c * (size_t)n, p->rank, g, &sh)) return RT_ERR;
  }
  return RT_OK;
}

/* The whole (tp-local) buffers of a pipeline with stage-local tensors. */
static int ppw_alloc(Run *r) {
  if (r->ppw_params) return RT_OK;
  r->ppw_params = alloc64((size_t)r->pp_whole->params_numel * sizeof(float));
  r->ppw_state = alloc64((size_t)r->pp_whole->state_numel * sizeof(float));
  if (!r->ppw_params || !r->ppw_state)
    return rt_fail("out of memory for the whole model (%lld + %lld floats)",
                   (long long)r->pp_whole->params_numel, (long long)r->pp_whole->state_numel);
  return RT_OK;
}

/* Between saves a stage keeps only its own tensors. */
static void ppw_free(Run *r) {
  free(r->ppw_params);
  free(r->ppw_state);
  r->ppw_params = r->ppw_state = NULL;
}

/* Writes a checkpoint at `step` (ckpt == 1), or (ckpt == 0) the tensors `src`
 * (laid out like the parameters: the weights, or the gradients) as safetensors to
 * `path`: with several ranks the whole tensors are gathered to world rank 0, which
 * writes; every rank then learns the outcome. Returns an exit code or -1. */
static int save_out(Run *r, int ckpt, int64_t step, const float *src, const char *path) {
  const RtModelDesc *m = r->m;
  const char *what = ckpt ? "--save: " : path == r->o.save_grads ? "--save-grads: "
                                                                  : "--save-weights: ";
  const float *params = ckpt ? r->params : src, *state = r->state;
  int rc = RT_OK;
  if (m->to_host && m->to_host(r->params, r->state)) /* a GPU trainer: the device's copy */
    return fail(r, 3, "internal error: copying from the device: ");
  if (r->pp_whole) { /* every stage's own tensors into the whole (tp-local) layout */
    if (ppw_alloc(r) || rt_pipe_gather(r->mesh.pp_comm, r->mesh.pp_rank, r->pp_whole, params,
                                       ckpt ? state : NULL, r->ppw_params,
                                       ckpt ? r->ppw_state : NULL))
      return fail(r, 3, "internal error: gathering the pipeline stages' tensors: ");
    m = r->pp_whole;
    params = r->ppw_params;
    state = r->ppw_state;
  }
  if (ckpt && m->zero > 1) { /* ZeRO-1: every dp rank's pieces first (a pipeline's of
                                 every stage, gathered above) */
    if (rt_train_zero_gather(m, r->mesh.dp_comm, r->mesh.ep_dp_comm, state, &r->zview))
      return fail(r, 3, "internal error: gathering the optimizer state: ");
    m = &r->zview.m;
    state = r->zview.state;
  }
  if (r->whole_out) {
    if (r->mesh.dp_rank < r->ep) { /* gather_one: tp on dp rank 0, ep on dp ranks < ep */
      Whole *w = &r->whole;
      for (int i = 0; i < m->nparams && rc == RT_OK; i++)
        rc = gather_one(r, &m->params[i], params + m->params[i].offset, m->params[i].numel,
                        w->params ? w->params + w->p[i].offset : NULL);
      for (int i = 0; ckpt && i < m->nstate && rc == RT_OK; i++)
        rc = gather_one(r, &m->params[m->state[i].param], state + m->state[i].offset,
                        m->state[i].numel, w->state ? w->state + w->s[i].offset : NULL);
      if (rc) return fail(r, 3, "internal error: gathering the weights: ");
    }
    m = &r->whole.m;
    params = r->whole.params;
    state = r->whole.state;
  }
  if (r->wrank == 0) {
    rc = ckpt ? save_ckpt(r, m, params, state, step)
              : rt_train_save_weights(m, params, path);
    if (rc) fail(r, 1, what);
  }
  if (r->world) {
    float status = rc ? 1.0f : 0.0f;
    if (rt_comm_broadcast(r->world, &status, 1, 0)) return fail(r, 3, "internal error: ");
    if (status != 0.0f) {
      /* rank 0 has said why (and, with threads, recorded it first) */
      pthread_mutex_lock(&r->shared->mu);
      if (!r->shared->code) r->shared->code = 1;
      pthread_mutex_unlock(&r->shared->mu);
      return 1;
    }
  }
  ppw_free(r);
  return rc ? 1 : -1;
}

/* ZeRO-1: the step stored, at each parameter's offset of r->grads, the rank's piece
 * of that parameter's averaged gradient (rt_model.h); assembles the whole local
 * gradients there from every dp rank's pieces (a collective over dp; an
 * expert-parallel parameter's over its ep_dp group). */
static int zero_whole_grads(Run *r) {
  const RtModelDesc *m = r->m;
  RtStateDesc *s = calloc(m->nparams > 0 ? (size_t)m->nparams : 1, sizeof *s);
  if (!s) return rt_fail("out of memory");
  for (int i = 0; i < m->nparams; i++) /* the pieces, described as if they were state */
    s[i] = (RtStateDesc){m->params[i].name, m->params[i].offset,
                         (m->params[i].numel + rt_zero_pieces(m, &m->params[i]) - 1) /
                             rt_zero_pieces(m, &m->params[i]),
                         i};
  RtModelDesc g = *m;
  g.nstate = m->nparams;
  g.state = s;
  g.state_numel = m->params_numel;
  RtZeroView v;
  memset(&v, 0, sizeof v);
  int rc = rt_train_zero_gather(&g, r->mesh.dp_comm, r->mesh.ep_dp_comm, r->grads, &v);
  for (int i = 0; rc == RT_OK && i < m->nparams; i++)
    memcpy(r->grads + m->params[i].offset, v.state + v.s[i].offset,
           (size_t)m->params[i].numel * sizeof(float));
  rt_train_zero_free(&v);
  free(s);
  return rc;
}

/* Weights from --resume, --init or the seed; sets r->start. Returns an exit code or -1. */
static int load_start(Run *r) {
  const RtModelDesc *m = r->m;
  if (r->o.resume) {
    RtTrainCkptInfo info;
    if (r->pp_whole && ppw_alloc(r)) return fail(r, 3, "internal error: ");
    /* a pipeline stage loads the whole model, then keeps its own tensors */
    if (rt_train_load_ckpt_mesh(r->o.resume, r->pp_whole ? r->pp_whole : m,
                                r->pp_whole ? r->ppw_params : r->params,
                                r->pp_whole ? r->ppw_state : r->state, &info, r->tp,
                                r->mesh.tp_rank, r->mesh.dp_rank, r->mesh.ep_rank))
      return fail(r, 1, "--resume: ");
    if (r->pp_whole)
      rt_pipe_extract(r->pp_whole, r->mesh.pp_rank, r->ppw_params, r->ppw_state, r->params,
                      r->state);
    ppw_free(r);
    if (info.step > r->o.steps) {
      rt_fail("--resume %s: the checkpoint is at step %lld, beyond --steps %lld; give "
              "--steps %lld or more", r->o.resume, (long long)info.step,
              (long long)r->o.steps, (long long)info.step);
      return fail(r, 1, "");
    }
    if (r->o.seed_set && r->o.seed != info.seed && r->wrank == 0)
      fprintf(stderr, "%s: note: --seed %" PRIu64 " is not used: the weights come from the "
              "checkpoint (seed %" PRIu64 ")\n", r->prog, r->o.seed, info.seed);
    r->o.seed = info.seed;
    if (!r->o.lr_set && info.lr_set) {
      r->lr_const = 1;
      r->lr = info.lr;
    }
    /* (the saved name is cut to the buffer: compare that much) */
    if (r->wrank == 0 &&
        (info.data_tokens != rt_data_ntokens(r->data) ||
         strncmp(info.data_name, rt_data_name(r->data), sizeof info.data_name - 1)))
      fprintf(stderr, "%s: warning: the checkpoint was trained on %s (%lld tokens); this run "
              "continues on %s (%lld tokens)\n", r->prog, info.data_name,
              (long long)info.data_tokens, rt_data_name(r->data),
              (long long)rt_data_ntokens(r->data));
    r->start = info.step;
    return -1;
  }
  if (r->o.init) {
    if (rt_train_load_weights_tp(m, r->params, r->o.init, r->tp, r->mesh.tp_rank,
                                 r->mesh.ep_rank))
      return fail(r, 1, "--init: ");
    return -1;
  }
  if (init_params(m, r->params, r->o.seed, r->tp, r->mesh.tp_rank, r->mesh.ep_rank))
    return fail(r, 3, "internal error: init: ");
  return -1;
}

/* Orders the global batch (B rows of T) so that dp rank d's block of B/dp
 * rows holds, for each microbatch mb in turn, its share of the global rows
 * [mb B/M, (mb+1) B/M): global row mb B/M + d B/(M dp) + k goes to row
 * d B/dp + mb B/(M dp) + k (RtModelDesc.microbatches).  scratch: B*T ints. */
static void mb_major(int32_t *tokens, int32_t *targets, int32_t *scratch, int B, int T, int M,
                     int dp) {
  int share = B / (M * dp);
  for (int k2 = 0; k2 < 2; k2++) {
    int32_t *x = k2 ? targets : tokens;
    for (int d = 0; d < dp; d++)
      for (int mb = 0; mb < M; mb++)
        memcpy(scratch + ((size_t)d * (B / dp) + (size_t)mb * share) * T,
               x + ((size_t)mb * (B / M) + (size_t)d * share) * T,
               sizeof *x * (size_t)share * T);
    memcpy(x, scratch, sizeof *x * (size_t)B * T);
  }
}

/* The step's routing statistics (RtMoeDesc) made global and into
 * r->moe_stats: kept choices and routed ones summed over dp (every tp rank
 * holds the same) and pp (a layer's stage alone counts it), the aux sums
 * divided by dp * microbatches (each dp rank and microbatch adds the value
 * of its microbatch, the same on every dp rank). */
static int moe_stats(Run *r) {
  const RtModelDesc *m = r->m;
  int64_t n = m->moe_numel;
  if (r->dp > 1 && rt_comm_all_reduce(r->mesh.dp_comm, r->moe, r->moe, n)) return RT_ERR;
  if (r->pp > 1 && rt_comm_all_reduce(r->mesh.pp_comm, r->moe, r->moe, n)) return RT_ERR;
  double mbs = m->microbatches > 1 ? m->microbatches : 1;
  for (int i = 0; i < m->nmoe; i++) {
    const RtMoeDesc *d = &m->moe[i];
    const float *x = r->moe + d->offset;
    double kept = 0;
    for (int e = 0; e < d->experts; e++) kept += r->moe_tok[d->offset + e] = x[e];
    r->moe_stats[i] = (RtMoeLayerStats){d->layer, d->experts, r->moe_tok + d->offset,
                                        x[d->experts] - kept,
                                        x[d->experts + 1] / (r->dp * mbs),
                                        x[d->experts + 2] / (r->dp * mbs), d->z};
  }
  return RT_OK;
}

/* The step's buffers, groups and coordinates (what every step of the rank gets). */
static void step_io(const Run *r, RtStepIO *io) {
  const int B = (int)r->m->batch, T = (int)r->m->seq;
  memset(io, 0, sizeof *io);
  io->params = r->params;
  io->state = r->state;
  io->arena = r->arena;
  /* this rank's rows of the global batch */
  size_t rows = (size_t)r->mesh.dp_rank * (size_t)(B / r->dp) * (size_t)T;
  io->tokens = r->tokens + rows;
  io->targets = r->targets + rows;
  if (r->world) {
    io->tp_group = r->mesh.tp_comm;
    io->dp_group = r->mesh.dp_comm;
    io->pp_group = r->pp > 1 ? r->mesh.pp_comm : NULL;
    io->tp_rank = r->mesh.tp_rank;
    io->dp_rank = r->mesh.dp_rank;
    io->pp_rank = r->mesh.pp_rank;
    io->ep_group = r->ep > 1 ? r->mesh.ep_comm : NULL;
    io->ep_dp_group = r->ep > 1 ? r->mesh.ep_dp_comm : NULL;
    io->ep_rank = r->mesh.ep_rank;
  }
}

/* RtModelDesc.start (a GPU trainer's device), before the first step.  Its
 * outcome is the same on every rank with the same message (rt_model.h), so a
 * refused setup is reported once -- by world rank 0 under MPI, by the first
 * rank to record it with threads -- as a setup error: exit 1, no step run;
 * under MPI every rank then leaves MPI cleanly (Run.stop_agreed).
 * Returns an exit code or -1. */
static int start_device(Run *r) {
  RtStepIO io;
  step_io(r, &io);
  int rc = r->m->start(&io);
  if (rc == 0) return -1;
  if (rc != RT_ERR_SETUP) return fail(r, 3, "internal error: starting the device: ");
  if (!r->shared || !r->shared->mpi) return fail(r, 1, "");
  if (r->wrank == 0) fprintf(stderr, "%s: %s\n", r->prog, rt_last_error());
  pthread_mutex_lock(&r->shared->mu);
  if (!r->shared->code) r->shared->code = 1;
  pthread_mutex_unlock(&r->shared->mu);
  r->stop_agreed = 1;
  return 1;
}

static int train_loop(Run *r, double entropy) {
  const RtModelDesc *m = r->m;
  const int B = (int)m->batch, T = (int)m->seq;
  RtProgress prog;
  rt_progress_init(&prog, stdout, r->o.steps, -1);
  RtStepIO io;
  step_io(r, &io);
  const int show = !r->o.quiet && r->wrank == 0;
  double loss = NAN;
  for (int64_t t = r->start; t < r->o.steps; t++) {
    double t0 = now_ms();
    double lr = r->lr_const ? r->lr
                            : rt_lr_at(r->sched, m->lr, m->warmup, m->min_lr, r->o.steps, t);
    if (rt_data_batch(r->data, t, B, T, r->tokens, r->targets)) {
      rt_progress_done(&prog);
      return fail(r, 1, "--data: ");
    }
    if (m->microbatches > 1 && r->dp > 1)
      mb_major(r->tokens, r->targets, r->mb_rows, B, T, m->microbatches, r->dp);
    io.lr = (float)lr;
    io.step = (float)(t + 1);
    io.loss = io.ce_loss = io.grad_norm = NAN;
    io.grads = t == r->start ? r->grads : NULL;
    io.trace = r->trace;
    io.moe = r->moe;
    if (r->moe) memset(r->moe, 0, sizeof *r->moe * (size_t)m->moe_numel);
    int64_t traced = 0;
    double tt0 = 0;
    if (r->trace) {
      rt_trace_step(r->trace, t);
      traced = rt_trace_count(r->trace);
      tt0 = rt_trace_clock();
    }
    int failed = m->step(&io);
    /* a step that recorded nothing itself (no pipeline) is one compute event */
    if (r->trace && !failed && rt_trace_count(r->trace) == traced)
      rt_trace_add(r->trace, RT_TRACE_STEP, 0, 0, tt0, rt_trace_clock(), 0);
    if (failed) {
      rt_progress_done(&prog);
      if (!r->world) {
        fprintf(stderr, "%s: internal error: step %lld/%lld (log step %lld) failed: %s\n",
                r->prog, (long long)(t + 1), (long long)r->o.steps, (long long)t,
                rt_last_error());
        return 3;
      }
      char what[128];
      snprintf(what, sizeof what, "internal error: step %lld/%lld (log step %lld) failed: ",
               (long long)(t + 1), (long long)r->o.steps, (long long)t);
      return fail(r, 3, what);
    }
    if (r->dp > 1) {
      /* the log's loss: the mean over the data-parallel ranks */
      float both[2] = {io.loss, io.ce_loss};
      if (rt_comm_all_reduce(r->mesh.dp_comm, both, both, 2))
        return fail(r, 3, "internal error: averaging the loss: ");
      io.loss = both[0] / (float)r->dp;
      io.ce_loss = both[1] / (float)r->dp;
    }
    if (r->moe && moe_stats(r)) return fail(r, 3, "internal error: routing statistics: ");
    double ms = now_ms() - t0;
    loss = io.loss;
    if (io.grads) {
      /* (a pipelined step stores its whole accumulated gradients, rt_pipe.h) */
      int piped = (m->pp > 1) || m->microbatches > 1;
      if (m->zero > 1 && !piped && zero_whole_grads(r)) {
        rt_progress_done(&prog);
        return fail(r, 3, "internal error: --save-grads: gathering the gradient pieces: ");
      }
      int rc = save_out(r, 0, 0, r->grads, r->o.save_grads);
      if (rc >= 0) {
        rt_progress_done(&prog);
        return rc;
      }
    }
    RtStepStats s = {t, io.loss, lr, io.grad_norm, ms > 0 ? (double)B * T * 1e3 / ms : 0,
                     ms, -1};
    if (show) rt_progress_step(&prog, &s);
    /* the routing every tenth of the run (and on its first and last step) */
    int64_t every = r->o.steps >= 10 ? r->o.steps / 10 : 1;
    if (show && r->moe && (t == r->start || (t + 1) % every == 0 || t + 1 == r->o.steps)) {
      char line[1024];
      rt_progress_done(&prog);
      rt_moe_format(line, sizeof line, r->moe_stats, m->nmoe);
      printf("  %s\n", line);
    }
    if (r->log) {
      const char *key[1] = {"ce_loss"};
      double val[1] = {io.ce_loss};
      /* Bitwise: a NaN ce_loss beside a NaN loss is still logged. */
      int differs = memcmp(&io.ce_loss, &io.loss, sizeof io.loss) != 0;
      if (rt_log_step_moe(r->log, &s, key, val, differs, r->moe_stats,
                          r->moe ? m->nmoe : 0)) {
        rt_progress_done(&prog);
        return fail(r, 1, "--log: ");
      }
    }
    if (r->o.save && r->o.save_every && (t + 1) % r->o.save_every == 0 && t + 1 < r->o.steps) {
      int rc = save_out(r, 1, t + 1, NULL, NULL);
      if (rc >= 0) {
        rt_progress_done(&prog);
        return rc;
      }
    }
  }
  rt_progress_done(&prog);
  if (show && r->start < r->o.steps)
    printf("done: step %lld, loss %.4f (unigram entropy %.4f)\n", (long long)r->o.steps, loss,
           entropy);
  return -1;
}

static int run(Run *r) {
  const RtModelDesc *m = r->m;
  if (!r->world && rt_pool_init(r->o.threads))
    return fail(r, 3, "internal error: --threads: ");
  r->whole_out = r->tp > 1 || r->ep > 1 || rt_model_padded(r->pp_whole ? r->pp_whole : m, r->tp);
  if (r->whole_out && whole_init(r)) return fail(r, 3, "internal error: ");

  size_t ntok = (size_t)m->batch * (size_t)m->seq;
  r->params = alloc64((size_t)m->params_numel * sizeof(float));
  r->state = alloc64((size_t)m->state_numel * sizeof(float));
  r->arena = alloc64((size_t)m->arena_bytes);
  r->tokens = alloc64(ntok * sizeof(int32_t));
  r->targets = alloc64(ntok * sizeof(int32_t));
  if (r->o.save_grads) r->grads = alloc64((size_t)m->params_numel * sizeof(float));
  int reorder = m->microbatches > 1 && r->dp > 1;
  if (reorder) r->mb_rows = alloc64(ntok * sizeof(int32_t));
  int moe = m->nmoe > 0 && m->moe_numel > 0;
  if (moe) {
    r->moe = alloc64((size_t)m->moe_numel * sizeof(float));
    r->moe_stats = calloc((size_t)m->nmoe, sizeof *r->moe_stats);
    r->moe_tok = calloc((size_t)m->moe_numel, sizeof *r->moe_tok);
  }
  if (!r->params || !r->state || !r->arena || !r->tokens || !r->targets ||
      (r->o.save_grads && !r->grads) || (reorder && !r->mb_rows) ||
      (moe && (!r->moe || !r->moe_stats || !r->moe_tok))) {
    rt_fail("out of memory for %lld parameter, %lld state floats and an arena of %lld bytes",
            (long long)m->params_numel, (long long)m->state_numel, (long long)m->arena_bytes);
    return fail(r, 3, "internal error: ");
  }

  int rc = r->o.data ? rt_data_open(&r->data, r->o.data, (int)m->vocab, (int)m->seq)
                     : rt_data_builtin(&r->data, 0, (int)m->vocab, (int)m->seq);
  if (rc) return fail(r, 1, "--data: ");
  double entropy = rt_data_unigram_entropy(r->data);

  r->sched = (RtSched)rt_sched_parse(m->schedule);
  r->lr_const = r->o.lr_set;
  r->lr = r->o.lr_set ? r->o.lr : m->lr;
  if ((rc = load_start(r)) >= 0) return rc;

  if (r->wrank == 0 && r->o.save_weights && check_out_dir("save-weights", r->o.save_weights))
    return fail(r, 1, "");
  if (r->wrank == 0 && r->o.save_grads && check_out_dir("save-grads", r->o.save_grads))
    return fail(r, 1, "");
  if (r->wrank == 0 && r->o.trace && check_out_dir("trace", r->o.trace)) return fail(r, 1, "");
  if (r->wrank == 0 && r->o.save) {
    /* The checkpoint's parent is created now (as the first save would) and checked. */
    char parent[4096];
    if (rt_fs_dirname(r->o.save, parent, sizeof parent) || rt_fs_mkdirs(parent) ||
        check_out_dir("save", r->o.save))
      return fail(r, 1, "--save: ");
  }
  int64_t nparam = 0;
  const RtModelDesc *wm = r->pp_whole ? r->pp_whole : m; /* the whole model's count */
  for (int i = 0; i < wm->nparams; i++)
    nparam += r->whole_out ? r->whole.p[i].numel : wm->params[i].numel;
  /* A resumed run appends to its log: one file then tells the whole story. */
  if (r->wrank == 0 && r->o.log &&
      (rt_log_open(&r->log, r->o.log, r->o.resume != NULL) ||
       log_config(r->log, m, &r->o, r->lr, r->lr_const, nparam, r->start, r->data, entropy,
                  r->tp, r->dp, r->pp)))
    return fail(r, 1, "--log: ");
  /* every rank is set up (world rank 0 has checked the outputs) before the first step */
  if (r->world && rt_comm_barrier(r->world)) return fail(r, 3, "internal error: ");
  /* --trace: every rank's clock origin is the end of that barrier */
  if (r->o.trace && !(r->trace = rt_trace_open(r->wrank, r->mesh.tp_rank, r->mesh.dp_rank,
                                               r->pp > 1 ? r->mesh.pp_rank : 0)))
    return fail(r, 3, "internal error: ");
  /* the device (a GPU trainer): its start-up checks refuse a setup before any step */
  if (m->start && r->start < r->o.steps && (rc = start_device(r)) >= 0) return rc;

  if (!r->o.quiet && r->wrank == 0) {
    printf("%s: %lld parameters, arena %lld bytes | data %s: %lld tokens, unigram entropy "
           "%.4f nats | steps %lld..%lld, batch %lld x seq %lld, %d thread%s\n",
           m->name, (long long)nparam, (long long)m->arena_bytes, rt_data_name(r->data),
           (long long)rt_data_ntokens(r->data), entropy, (long long)r->start,
           (long long)r->o.steps, (long long)m->batch, (long long)m->seq, rt_pool_threads(),
           rt_pool_threads() == 1 ? "" : "s");
    if (r->world && r->pp > 1)
      printf("mesh: tp %d x dp %d x pp %d = %d ranks (%s)\n", r->tp, r->dp, r->pp,
             r->tp * r->dp * r->pp, rt_comm_backend(r->world));
    else if (r->world && r->ep > 1)
      printf("mesh: tp %d x dp %d (experts over ep %d) = %d ranks (%s)\n", r->tp, r->dp,
             r->ep, r->tp * r->dp, rt_comm_backend(r->world));
    else if (r->world)
      printf("mesh: tp %d x dp %d = %d ranks (%s)\n", r->tp, r->dp, r->tp * r->dp,
             rt_comm_backend(r->world));
    for (int s = 0; r->pp_whole && s < r->pp; s++)
      printf("%s%lld%s", s ? ", " : "stage parameter buffers (floats per rank): ",
             (long long)r->pp_whole->pp_params_numel[s], s + 1 < r->pp ? "" : "\n");
    if (r->o.resume)
      printf("resumed from %s at step %lld%s\n", r->o.resume, (long long)r->start,
             r->lr_const && !r->o.lr_set ? " with the constant --lr it was saved with" : "");
    fflush(stdout);
  }

  if ((rc = train_loop(r, entropy)) >= 0) return rc;
  if (r->trace) {
    if (rt_trace_write(r->trace, r->world, r->o.trace, r->tp, r->dp, r->pp))
      return fail(r, 1, "");
    if (!r->o.quiet && r->wrank == 0) printf("trace: %s\n", r->o.trace);
  }

  if (r->o.save_weights) {
    if ((rc = save_out(r, 0, 0, r->params, r->o.save_weights)) >= 0) return rc;
    if (!r->o.quiet && r->wrank == 0) printf("weights: %s\n", r->o.save_weights);
  }
  if (r->o.save) {
    if ((rc = save_out(r, 1, r->o.steps, NULL, NULL)) >= 0) return rc;
    if (!r->o.quiet && r->wrank == 0)
      printf("checkpoint: %s (step %lld)\n", r->o.save, (long long)r->o.steps);
  }
  return 0;
}

/* ---- several ranks ---- */

typedef struct {
  const RtModelDesc *m;
  const RtTrainOpts *o;
  const char *prog;
  MeshFail fail;
} MeshArg;

static int rank_main(RtComm *world, void *arg) {
  MeshArg *a = arg;
  const RtModelDesc *m = a->m;
  Run r;
  memset(&r, 0, sizeof r);
  r.m = m;
  r.o = *a->o;
  r.prog = a->prog;
  r.tp = m->tp ? m->tp : 1;
  r.dp = m->dp ? m->dp : 1;
  r.pp = m->pp ? m->pp : 1;
  r.ep = m->ep ? m->ep : 1;
  r.world = world;
  r.wrank = rt_comm_world_rank(world);
  r.shared = &a->fail;
  int rc;
  if (rt_comm_mesh(world, r.tp, r.dp, r.pp, r.ep, &r.mesh)) {
    rc = fail(&r, 3, "internal error: ");
  } else if (r.pp > 1 && m->pp_param_offset && rt_pipe_stage_desc(m, r.mesh.pp_rank, &r.stage)) {
    rc = fail(&r, 3, "internal error: ");
    rt_comm_mesh_free(&r.mesh);
  } else {
    if (r.stage.p) r.pp_whole = m, r.m = &r.stage.m; /* this stage's own tensors */
    rc = run(&r);
    if (rc < 0) rc = 0;
    if (rc == 0) fflush(stdout);
    rt_comm_mesh_free(&r.mesh);
  }
  /* every rank stops here alike (start_device): MPI is finalised, exit 1 */
  if (rc == 1 && r.stop_agreed) rc = RT_COMM_STOP_AGREED;
  run_free(&r);
  return rc;
}

/* Runs the tp * dp * pp ranks; returns the exit code. */
static int run_mesh(const RtModelDesc *m, const RtTrainOpts *o, const char *prog) {
  int tp = m->tp ? m->tp : 1, dp = m->dp ? m->dp : 1, ranks = tp * dp * (m->pp ? m->pp : 1);
  /* With ranks as threads the ranks are the parallelism: a one-thread pool (and
   * OpenBLAS) keeps them deterministic without oversubscribing; under MPI every
   * process gets its share of --threads. */
  int threads = rt_comm_mpi_launched() ? (o->threads / ranks > 1 ? o->threads / ranks : 1) : 1;
  if (rt_pool_init(threads)) {
    fprintf(stderr, "%s: internal error: --threads: %s\n", prog, rt_last_error());
    return 3;
  }
  MeshArg a;
  memset(&a, 0, sizeof a);
  a.m = m;
  a.o = o;
  a.prog = prog;
  pthread_mutex_init(&a.fail.mu, NULL);
  a.fail.mpi = rt_comm_mpi_launched();  /* rt_comm_run's own choice of backend */
  int rc = rt_comm_run(ranks, rank_main, &a);
  pthread_mutex_destroy(&a.fail.mu);
  if (rc == RT_OK) return 0;
  if (a.fail.code) {
    if (!a.fail.mpi) fprintf(stderr, "%s\n", a.fail.msg);  /* MPI: printed already */
    return a.fail.code;
  }
  fprintf(stderr, "%s: internal error: %s\n", prog, rt_last_error());
  return 3;
}

int rt_train_main(int argc, char **argv, const RtModelDesc *model) {
  Run r;
  memset(&r, 0, sizeof r);
  r.m = model;
  r.tp = r.dp = r.pp = r.ep = 1;
  r.prog = base_name(argc > 0 ? argv[0] : NULL);
  if (rt_train_check_model(model)) return fail(&r, 3, "internal error: ");
  int rc = rt_train_parse_opts(&r.o, argc, argv, model, stderr);
  if (rc >= 0) return rc;
  if ((model->tp ? model->tp : 1) * (model->dp ? model->dp : 1) * (model->pp ? model->pp : 1) > 1) {
    if (r.o.comm_timeout > 0 && rt_comm_set_timeout(r.o.comm_timeout))
      return fail(&r, 3, "internal error: --comm-timeout: ");
    rc = run_mesh(model, &r.o, r.prog);
    rt_pool_shutdown();
    fflush(stdout);
    return rc;
  }
  rc = run(&r);
  run_free(&r);
  rt_pool_shutdown();
  fflush(stdout);
  return rc < 0 ? 0 : rc;
}
