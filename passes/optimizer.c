/* passes/optimizer.c -- the optimizer step as IR, appended after autodiff.
 *
 * For every parameter p with a gradient g (p->grad; parameters without one
 * get no update and no state) it appends, tagged IR_PHASE_OPT:
 *
 *   lr, step      scalar INPUTs the host fills every step: the learning
 *                 rate already scheduled (runtime/rt_sched.h) and the
 *                 1-based step count (f32, exact to 2^24);
 *   global norm   s_p = sumsq(g) per parameter, norm = grad_norm(s_1, ...)
 *                 (m->grad_norm: the norm before clipping, for the log),
 *                 coef = clip_coef(norm) max_norm=clip: PyTorch's
 *                 clip_grad_norm_ (clip = 0: no clipping, coef = 1);
 *   AdamW         state p.exp_avg and p.exp_avg_sq;
 *                 bc1, bc2 = bias_correction(step) beta=beta1, beta2 (shared);
 *                 m' = adam_moment(m, g, coef), v' = adam_moment(v, g, coef);
 *                 p1 = weight_decay(p, lr) wd (rank >= 2 only; else p1 = p);
 *                 p' = adam_update(p1, m', v', lr, bc1, bc2) eps;
 *   SGD           d = sgd_grad(g, coef, p) wd (rank >= 2 only, else wd = 0);
 *                 momentum > 0: state p.momentum_buffer,
 *                 buf' = sgd_momentum(buf, d), d = buf';
 *                 p' = sgd_update(p, d, lr);
 *
 * and records the updates (p.exp_avg <- m', ..., p <- p') on the module.
 * State names are PyTorch's state keys after the parameter's name, so a
 * checkpoint reads like optimizer.state_dict().
 *
 * Weight decay: AdamW's is PyTorch's decoupled decay; SGD's is PyTorch's
 * coupled decay (added to the gradient, so momentum carries it).  Both
 * apply to tensors of rank >= 2 only (matrices, embeddings, experts) and
 * never to biases, gains and other 1-d tensors: the GPT-2/nanoGPT policy,
 * the same for both optimizers so that switching optimizer does not change
 * which tensors decay.  (torch.optim applies a group's weight_decay to every
 * tensor in it: a PyTorch run matches with two parameter groups.)
 *
 * Per-parameter nodes take the parameter's layer and source location, so a
 * pipeline stage updates the parameters it holds; the shared scalars take
 * the loss's location and no layer.
 *
 * The rank-local module (pass_shard, then autodiff and pass_dp_grads).
 * Parameters with shard_degree > 1 hold a tp slice, the others are whole
 * and, like their gradients, identical on every tp rank; pass_dp_grads has
 * already averaged every gradient over dp, so gradients are identical on
 * the dp ranks too.  The update is elementwise, so each rank updates its
 * slice with the one-rank formulas; only the global norm needs the group:
 *
 *   s_sh   = s_a + s_b + ...   the sumsq of every sharded gradient, added
 *                              locally (in parameter order),
 *   s_all  = all_reduce(s_sh) axis=0 size=tp   ONE collective per step,
 *   norm   = grad_norm(s_all, s_r1, s_r2, ...) with the replicated
 *                              gradients' sumsq counted once, not reduced;
 *
 * no dp reduction (the gradients are already the dp mean).  Every rank gets
 * the same norm and coefficient (the all_reduce sums in one order).  A
 * module with no sharded parameter (one rank, or tp = 1) gets exactly the
 * nodes above, no collective.  State copies its parameter's sharding
 * (shard, shard_dim, and after pass_shard shard_degree, shard_blocks,
 * ep_degree and global_shape): local shape, so a runtime can save and load it unsharded
 * as it does the parameter.  Which tensors decay is decided by rank, which
 * sharding does not change (a slice has its tensor's rank).
 *
 * ZeRO-1 (m->mesh_zero == dp > 1; pass_dp_grads has left in p->grad the
 * rank's piece g of the flattened mean gradient, s = ceil(numel / dp)
 * elements, zero-padded).  The state is sharded the same way (STATE of
 * shape [s], flat_shards = dp: dp times less state per rank), and the rank
 * updates only its piece of each parameter:
 *
 *   x      = flat_shard(p) axis=1 size=dp     the rank's piece of p, [s]
 *   x'     = the update above on (x, g, state pieces): elementwise, so the
 *            pieces together are the one-rank update; decay still by p's
 *            rank; the padding stays zero (zero g, state and x);
 *   p'     = the pieces of a bucket of parameters (about dp_bucket_bytes,
 *            in parameter order) gathered with ONE all_gather axis=1 over
 *            [1, S] -> [dp, S], then per parameter its column block, read
 *            row by row without the padding (slice, reshape); each bucket's
 *            all_gather issued right after its last update.
 *   norm   the sumsq of every piece (padding adds 0) is one partial sum:
 *            u = all_reduce_tp(sharded sum) + the replicated ones (equal
 *            on the tp ranks of a dp coordinate), norm = grad_norm(
 *            all_reduce(u) axis=1 size=dp): every gradient element counted
 *            once, every rank the same bits.
 *
 * ZeRO-1 with expert parallelism: an expert-parallel parameter (ep_sharded,
 * its experts / ep experts on the rank) is cut over its ep_dp group instead,
 * z = dp / ep pieces (ir_zero_pieces; pass_ep_grads left the rank's piece
 * of its gradient): x = flat_shard(p) axis=3 size=z, state pieces with
 * flat_shards = z, and the updated pieces gathered in buckets of their own
 * with all_gather axis=3 size=z.  With ep == dp (z = 1) the rank's experts
 * are updated whole, as without ZeRO.  Their sumsq is one more term of u
 * (whole over tp, like a replicated one): the dp ranks hold every (ep,
 * ep_dp) coordinate pair once, so the all_reduce over dp counts every
 * expert element once, with no ep or ep_dp collective of its own.
 *
 * ZeRO-1 in a pipelined trainer (m->grads_whole: no pass_dp_grads; the
 * trainer accumulates p->grad whole over the microbatches and sums it over
 * dp, or ep_dp, itself, runtime/rt_pipe.h): the rank's piece of the mean
 * gradient is g = flat_shard(p->grad) over the same group as x, taken twice
 * (one copy for the norm's sumsq, one for the update: passes/pp_split.c runs
 * the norm's per-parameter values on a parameter's lowest holder alone, the
 * update on every holder).  There the sumsq of every parameter precedes the
 * partial sums that add them (one sum over pp for all of them, pp_split.c's
 * shared scalar adds).  The gather buckets never mix parameters of
 * different pipeline stage sets (m->opt_stages), so each stage gathers its
 * own parameters, over its own dp group. */
#include <stdarg.h>
#include <string.h>

#include "ir/strmap.h"
#include "passes/passes.h"

typedef struct {
  IrModule *m;
  const IrNode *at;   /* the parameter being updated, or NULL: layer and loc */
  int failed;
} Opt;

static int err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int err(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "parc: error: optimizer: ");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return -1;
}

static IrNode *place(Opt *o, IrNode *n) {
  n->phase = IR_PHASE_OPT;
  n->layer = o->at ? o->at->layer : -1;
  n->loc = o->at ? o->at->loc : o->m->loss ? o->m->loss->loc : (IrLoc){0};
  return n;
}

/* An op on inputs in[0..nin) with integer attributes ia0, ia1 and float
 * attribute fa, its type inferred (NULL after an internal error). */
static IrNode *op_ia3(Opt *o, IrOp code, IrNode **in, int nin, int64_t ia0, int64_t ia1,
                      int64_t ia2, double fa) {
  IrNode p = {.op = code, .inputs = in, .ninputs = nin, .ia = {ia0, ia1, ia2}, .fa = fa};
  char why[512];
  if (o->failed) return NULL;
  if (!ir_infer(&p, why, sizeof why)) {
    fprintf(stderr, "parc: internal error: optimizer: %s\n", why);
    o->failed = 1;
    return NULL;
  }
  return place(o, ir_add_like(o->m, &p));
}

static IrNode *op_ia(Opt *o, IrOp code, IrNode **in, int nin, int64_t ia0, int64_t ia1,
                     double fa) {
  return op_ia3(o, code, in, nin, ia0, ia1, 0, fa);
}

static IrNode *op(Opt *o, IrOp code, IrNode **in, int nin, int64_t ia0, double fa) {
  return op_ia(o, code, in, nin, ia0, 0, fa);
}

static IrNode *op1(Opt *o, IrOp code, IrNode *a, int64_t ia0, double fa) {
  return op(o, code, (IrNode *[]){a}, 1, ia0, fa);
}

static IrNode *op2(Opt *o, IrOp code, IrNode *a, IrNode *b, double fa) {
  return op(o, code, (IrNode *[]){a, b}, 2, 0, fa);
}

static IrNode *op3(Opt *o, IrOp code, IrNode *a, IrNode *b, IrNode *c, int64_t ia0, double fa) {
  return op(o, code, (IrNode *[]){a, b, c}, 3, ia0, fa);
}

/* A scalar f32 INPUT the host fills each step. */
static IrNode *scalar_input(Opt *o, const char *name) {
  IrNode *n = place(o, ir_add(o->m, IR_OP_INPUT, NULL, 0));
  n->dtype = IR_F32;
  n->name = name;
  return n;
}

/* Zero-initialised optimizer state of parameter p, named p.<key>; under
 * ZeRO-1 the rank's piece of it, shaped like p's gradient piece. */
static IrNode *state(Opt *o, IrNode *p, const char *key) {
  IrNode *n = place(o, ir_add(o->m, IR_OP_STATE, NULL, 0));
  n->dtype = IR_F32;
  n->rank = p->rank;
  memcpy(n->shape, p->shape, sizeof n->shape);
  int z = ir_zero_pieces(o->m, p);
  if (z > 1) {
    n->rank = 1;
    n->shape[0] = ir_zero_piece_numel(o->m, p); /* the gradient's piece */
    n->flat_shards = z;
  }
  n->name = arena_printf(&o->m->arena, "%s.%s", p->name, key);
  n->init = IR_INIT_ZEROS;
  n->shard = p->shard;
  n->shard_dim = p->shard_dim;
  n->ep_degree = p->ep_degree;
  if (p->shard_degree > 1 || p->ep_degree > 1) {
    n->shard_degree = p->shard_degree;
    n->shard_blocks = p->shard_blocks;
    memcpy(n->global_shape, p->global_shape, sizeof n->global_shape);
  }
  return n;
}

static void update(Opt *o, IrNode *leaf, IrNode *value) {
  if (value) ir_add_update(o->m, leaf, value);
}

static IrNode *reshape(Opt *o, IrNode *x, int rank, const int64_t *shape) {
  if (!x || (x->rank == rank && !memcmp(x->shape, shape, sizeof(int64_t) * (size_t)rank)))
    return x;
  IrNode p = {.op = IR_OP_RESHAPE, .inputs = &x, .ninputs = 1, .rank = rank};
  memcpy(p.shape, shape, sizeof(int64_t) * (size_t)rank);
  char why[512];
  if (!ir_infer(&p, why, sizeof why)) {
    fprintf(stderr, "parc: internal error: optimizer: %s\n", why);
    o->failed = 1;
    return NULL;
  }
  return place(o, ir_add_like(o->m, &p));
}

static IrNode *slice(Opt *o, IrNode *x, int axis, int64_t start, int64_t len) {
  if (!x || (start == 0 && len == x->shape[axis])) return x;
  return op_ia3(o, IR_OP_SLICE, (IrNode *[]){x}, 1, axis, start, len, 0);
}

/* ZeRO-1: the updated pieces gathered back into whole parameters, in
 * buckets of about cap bytes (like the gradients'), each bucket's
 * all_gather issued as soon as its last piece is updated: over dp (axis 1)
 * for dense parameters, over ep_dp (axis 3) for expert-parallel ones. */
typedef struct {
  IrModule *m;
  int axis, dp;       /* the group: mesh axis and members */
  int64_t cap, bytes;
  IrNode **ps;        /* the bucket: parameter, new piece, ... */
  int n;
  uint64_t stages;    /* a pipeline's: the bucket's parameters' stages */
} Gather;

/* One all_gather over the bucket's pieces laid side by side, [1, S] ->
 * [dp, S]: column block i of row r is rank r's piece of parameter i, so
 * parameter i is its block read row by row, less the padding. */
static void gather_flush(Opt *o, Gather *g) {
  if (!g->n || o->failed) return;
  IrNode **rows = arena_alloc(&g->m->arena, sizeof(IrNode *) * (size_t)g->n);
  for (int i = 0; i < g->n; i++) {
    o->at = g->ps[2 * i];
    rows[i] = reshape(o, g->ps[2 * i + 1], 2, (int64_t[]){1, ir_numel(g->ps[2 * i + 1])});
  }
  IrNode *flat = g->n == 1 ? rows[0] : op_ia(o, IR_OP_CONCAT, rows, g->n, 1, 0, 0);
  IrNode *all = op_ia(o, IR_OP_ALL_GATHER, (IrNode *[]){flat}, 1, g->axis, g->dp, 0);
  int64_t off = 0;
  for (int i = 0; i < g->n && !o->failed; i++) {
    IrNode *p = g->ps[2 * i];
    int64_t s = ir_numel(g->ps[2 * i + 1]), n = ir_numel(p), ds = s * g->dp;
    o->at = p;
    IrNode *v = reshape(o, slice(o, all, 1, off, s), 1, &ds);
    update(o, p, reshape(o, slice(o, v, 0, 0, n), p->rank, p->shape));
    off += s;
  }
  g->n = 0;
  g->bytes = 0;
}

static void gather_add(Opt *o, Gather *g, IrNode *p, IrNode *piece) {
  if (!piece) return;
  uint64_t st = g->m->opt_stages ? g->m->opt_stages[p->id] : 0;
  if (g->n && st != g->stages) gather_flush(o, g); /* never across pipeline stages */
  g->stages = st;
  g->ps[2 * g->n] = p;
  g->ps[2 * g->n + 1] = piece;
  g->n++;
  g->bytes += 4 * ir_numel(piece) * g->dp;
  if (g->bytes >= g->cap) gather_flush(o, g);
}

/* What the update reads of p's gradient: p->grad, or in a pipelined
 * trainer under ZeRO-1 (m->grads_whole) the rank's piece of it, a new node
 * on each call (head comment). */
static IrNode *piece_of_grad(Opt *o, IrNode *p) {
  int z = ir_zero_pieces(o->m, p);
  if (!o->m->grads_whole || z <= 1) return p->grad;
  return op_ia(o, IR_OP_FLAT_SHARD, (IrNode *[]){p->grad}, 1, ep_sharded(p) ? 3 : 1, z, 0);
}

/* The hyper-parameters, read and checked once. */
typedef struct {
  int adamw;
  double clip, beta1, beta2, eps, wd, momentum;
} Hyper;

static int setting(const IrSetting *s, int n, const char *where, const char *name, double lo,
                   double hi, int hi_open, double *out) {
  const IrSetting *v = ir_setting(s, n, name);
  if (!v || v->sym) return err("the %s setting '%s' is missing", where, name);
  double d = v->is_float ? v->f : (double)v->i;
  if (!(d >= lo && (hi_open ? d < hi : d <= hi)))
    return err("%s = %g must be in [%g, %g%c", name, d, lo, hi, hi_open ? ')' : ']');
  *out = d;
  return 0;
}

static int read_hyper(const IrModule *m, Hyper *h) {
  if (!m->optimizer) return err("the module has no optimizer settings");
  h->adamw = !strcmp(m->optimizer, "adamw");
  if (!h->adamw && strcmp(m->optimizer, "sgd")) return err("unknown optimizer '%s'", m->optimizer);
  if (setting(m->train, m->ntrain, "train", "clip", 0, 1e30, 0, &h->clip)) return -1;
  const IrSetting *s = m->optim;
  int n = m->noptim;
  if (h->adamw)
    return setting(s, n, "adamw", "beta1", 0, 1, 1, &h->beta1) ||
                   setting(s, n, "adamw", "beta2", 0, 1, 1, &h->beta2) ||
                   setting(s, n, "adamw", "eps", 0, 1e30, 0, &h->eps) ||
                   setting(s, n, "adamw", "wd", 0, 1e30, 0, &h->wd)
               ? -1
               : 0;
  return setting(s, n, "sgd", "momentum", 0, 1e30, 0, &h->momentum) ||
                 setting(s, n, "sgd", "wd", 0, 1e30, 0, &h->wd)
             ? -1
             : 0;
}

/* Names the pass will add must be new. */
static int check_names(const IrModule *m, const Hyper *h) {
  Arena scratch = {0};
  StrMap names = {0};
  int rc = 0;
  for (int i = 0; i < m->nnodes; i++)
    if (m->nodes[i]->name) strmap_put(&scratch, &names, m->nodes[i]->name, m->nodes[i]);
  const char *fixed[] = {"lr", "step"};
  for (int k = 0; k < 2 && !rc; k++)
    if (strmap_get(&names, fixed[k]))
      rc = err("the model already has a value named '%s', which the optimizer's input needs",
               fixed[k]);
  const char *keys[2] = {h->adamw ? "exp_avg" : h->momentum != 0 ? "momentum_buffer" : NULL,
                         h->adamw ? "exp_avg_sq" : NULL};
  for (int i = 0; i < m->nnodes && !rc; i++) {
    const IrNode *p = m->nodes[i];
    for (int k = 0; k < 2 && p->grad && keys[k] && !rc; k++) {
      const char *name = arena_printf(&scratch, "%s.%s", p->name, keys[k]);
      if (strmap_get(&names, name))
        rc = err("the state '%s' would take the name of a model value", name);
    }
  }
  arena_free(&scratch);
  return rc;
}

int pass_optimizer(IrModule *m) {
  for (int i = 0; i < m->nnodes; i++)
    if (m->nodes[i]->phase == IR_PHASE_OPT) {
      fprintf(stderr, "parc: internal error: optimizer: the module already has its optimizer\n");
      return -1;
    }
  if (m->nupdates || m->grad_norm) {
    fprintf(stderr, "parc: internal error: optimizer: the module already has updates\n");
    return -1;
  }
  Hyper h = {0};
  if (read_hyper(m, &h) || check_names(m, &h)) return -1;
  int nfwd = m->nnodes, nparams = 0;
  for (int i = 0; i < nfwd; i++) nparams += m->nodes[i]->grad != NULL;
  if (!nparams) return 0; /* nothing to train */

  int nsharded = 0;
  for (int i = 0; i < nfwd; i++) {
    const IrNode *p = m->nodes[i];
    if (!p->grad || p->shard_degree <= 1) continue;
    if (p->op != IR_OP_PARAM || p->shard_degree != m->mesh_tp) {
      fprintf(stderr, "parc: internal error: optimizer: %s is split over %d ranks, but the "
                      "module's tp group has %d\n", p->name, p->shard_degree, m->mesh_tp);
      return -1;
    }
    nsharded++;
  }

  int zero = m->mesh_zero > 1, dp = m->mesh_zero;
  if (zero && m->mesh_dp != dp) {
    fprintf(stderr, "parc: internal error: optimizer: ZeRO-1 over %d ranks, but the module's "
                    "dp group has %d\n", dp, m->mesh_dp);
    return -1;
  }
  for (int i = 0; zero && i < nfwd; i++) {
    const IrNode *p = m->nodes[i];
    if (p->grad && ep_sharded(p) && (dp % p->ep_degree || m->mesh_ep != p->ep_degree)) {
      fprintf(stderr, "parc: internal error: optimizer: %s is split over ep = %d, which does "
                      "not divide the ZeRO-1 dp group of %d (mesh ep %d)\n", p->name,
              p->ep_degree, dp, m->mesh_ep);
      return -1;
    }
  }
  Opt o = {.m = m};
  IrNode *lr = scalar_input(&o, "lr"), *step = scalar_input(&o, "step");
  IrNode **sq = arena_alloc(&m->arena, sizeof(IrNode *) * (size_t)nparams);
  IrNode *sharded = NULL; /* the local sum of the sharded gradients' sumsq */
  IrNode **ssq = arena_alloc(&m->arena, sizeof(IrNode *) * (size_t)nparams);
  int nss = 0; /* a pipeline's sharded sumsq, added after the loop */
  int k = nsharded ? 1 : 0; /* sq[0]: their all_reduce, filled below */
  for (int i = 0; i < nfwd; i++) {
    IrNode *p = m->nodes[i];
    if (!p->grad) continue;
    o.at = p;
    IrNode *s = op1(&o, IR_OP_SUMSQ, piece_of_grad(&o, p), 0, 0);
    if (ep_sharded(p) && !zero) { /* the rank's experts: summed over the ep group (axis 2) */
      o.at = NULL;
      s = op_ia(&o, IR_OP_ALL_REDUCE, (IrNode *[]){s}, 1, 2, p->ep_degree, 0);
      if (p->shard_degree <= 1) { /* whole over tp */
        sq[k++] = s;
        continue;
      }
    }
    if (p->shard_degree <= 1) { /* (ZeRO-1 experts whole over tp: a piece over dp) */
      sq[k++] = s;
      continue;
    }
    if (m->grads_whole) { /* added below, after every sumsq (passes/pp_split.c) */
      ssq[nss++] = s;
      continue;
    }
    o.at = NULL;
    sharded = sharded ? op2(&o, IR_OP_ADD, sharded, s, 0) : s;
  }
  o.at = NULL;
  for (int j = 0; j < nss; j++) sharded = sharded ? op2(&o, IR_OP_ADD, sharded, ssq[j], 0) : ssq[j];
  if (nsharded) {
    /* axis 0 (tp), the whole group */
    sq[0] = op_ia(&o, IR_OP_ALL_REDUCE, (IrNode *[]){sharded}, 1, 0, m->mesh_tp, 0);
  }
  if (zero) {
    /* every rank holds a piece of every gradient: its local sum, the same on
     * the tp ranks of a dp coordinate, is added over dp (axis 1) */
    IrNode *local = sq[0];
    for (int j = 1; j < k; j++) local = op2(&o, IR_OP_ADD, local, sq[j], 0);
    sq[0] = op_ia(&o, IR_OP_ALL_REDUCE, (IrNode *[]){local}, 1, 1, dp, 0);
    k = 1;
  }
  IrNode *norm = m->grad_norm = op(&o, IR_OP_GRAD_NORM, sq, k, 0, 0);
  IrNode *coef = op1(&o, IR_OP_CLIP_COEF, norm, 0, h.clip);
  IrNode *bc1 = h.adamw ? op1(&o, IR_OP_BIAS_CORRECTION, step, 0, h.beta1) : NULL;
  IrNode *bc2 = h.adamw ? op1(&o, IR_OP_BIAS_CORRECTION, step, 0, h.beta2) : NULL;

  int64_t cap = m->dp_bucket_bytes > 0 ? m->dp_bucket_bytes : DP_BUCKET_BYTES_DEFAULT;
  Gather ag = {.m = m, .axis = 1, .dp = dp, .cap = cap};             /* dense: over dp */
  Gather eg = {.m = m, .axis = 3, .dp = m->mesh_ep > 1 ? dp / m->mesh_ep : 1, .cap = cap};
  if (zero) {
    ag.ps = arena_alloc(&m->arena, sizeof(IrNode *) * 2 * (size_t)nparams);
    eg.ps = arena_alloc(&m->arena, sizeof(IrNode *) * 2 * (size_t)nparams);
  }
  for (int i = 0; i < nfwd && !o.failed; i++) {
    IrNode *p = m->nodes[i], *g = p->grad;
    if (!g) continue;
    o.at = p;
    g = piece_of_grad(&o, p);
    double wd = p->rank >= 2 ? h.wd : 0;
    /* under ZeRO-1 the rank updates its piece of p, shaped like g: of z pieces
     * over dp, or over ep_dp for an expert-parallel p (z = 1: whole) */
    int z = ir_zero_pieces(m, p), axis = ep_sharded(p) ? 3 : 1;
    IrNode *x = z > 1 ? op_ia(&o, IR_OP_FLAT_SHARD, (IrNode *[]){p}, 1, axis, z, 0) : p, *x1;
    if (h.adamw) {
      IrNode *ms = state(&o, p, "exp_avg"), *vs = state(&o, p, "exp_avg_sq");
      IrNode *m1 = op3(&o, IR_OP_ADAM_MOMENT, ms, g, coef, 0, h.beta1);
      IrNode *v1 = op3(&o, IR_OP_ADAM_MOMENT, vs, g, coef, 1, h.beta2);
      IrNode *p1 = wd != 0 ? op2(&o, IR_OP_WEIGHT_DECAY, x, lr, wd) : x;
      x1 = op(&o, IR_OP_ADAM_UPDATE, (IrNode *[]){p1, m1, v1, lr, bc1, bc2}, 6, 0, h.eps);
      update(&o, ms, m1);
      update(&o, vs, v1);
    } else {
      IrNode *d = op3(&o, IR_OP_SGD_GRAD, g, coef, x, 0, wd);
      if (h.momentum != 0) {
        IrNode *buf = state(&o, p, "momentum_buffer");
        d = op2(&o, IR_OP_SGD_MOMENTUM, buf, d, h.momentum);
        update(&o, buf, d);
      }
      x1 = op3(&o, IR_OP_SGD_UPDATE, x, d, lr, 0, 0);
    }
    if (z <= 1) update(&o, p, x1);
    else gather_add(&o, axis == 3 ? &eg : &ag, p, x1);
  }
  if (zero) {
    gather_flush(&o, &ag);
    gather_flush(&o, &eg);
  }
  return o.failed ? -1 : 0;
}
