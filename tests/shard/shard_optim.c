/* tests/shard/shard_optim.c -- the optimizer step (passes/optimizer.c) on the
 * rank-local module, against the one-rank step, on the lockstep interpreter.
 *
 *   shard_optim [--sp] MODEL.dsl TP DP OPT CLIP [NAME=VALUE ...]
 *       OPT: adamw (beta1 0.9, beta2 0.95, eps 1e-8, wd 0.1) or sgd
 *       (momentum 0.9, wd 0.1); CLIP: on (a small max norm: the clipping
 *       coefficient must be < 1 at every step) or off (a large one: it must
 *       be exactly 1).  The model is compiled twice: whole (autodiff,
 *       pass_optimizer; one interpreter) and through pass_shard(TP, DP),
 *       autodiff, pass_dp_grads and pass_optimizer (TP x DP interpreters run
 *       by ir_interp_run_mesh).  Every rank gets its slices of the same
 *       global parameters and its rows of the same global batch.  Then
 *       NSTEPS optimizer steps, with a new lr each step and step = 1, 2, ...,
 *       the updates fed back on every interpreter (ir_interp_end_step).
 *       After each step: every rank's grad_norm equals the one-rank norm;
 *       every parameter and every optimizer state, re-assembled from the tp
 *       shards (the state's own shard fields), equals the one-rank value,
 *       within TOL relative to the tensor's largest value (parameter
 *       elements whose gradient is zero up to rounding: ZERO_TOL, below);
 *       and the copies that must agree (dp ranks; tp ranks of a replicated
 *       tensor) agree bit for bit.  Structure: one all_reduce (tp) in the
 *       optimizer when tp > 1, none on dp, no other extra node than the
 *       adds of the sharded sumsqs; grad_norm counts each replicated
 *       gradient once; sharded state carries its parameter's shard_degree,
 *       shard_blocks and global_shape; with tp = dp = 1 the IR text is the
 *       one-rank text but for the mesh line.
 *
 *   shard_optim [--zero] [--bucket BYTES] MODEL.dsl TP DP OPT CLIP ...
 *       --bucket: pass_dp_grads' bucket size (m->dp_bucket_bytes), so that
 *       small models get several buckets.  The dp reduction is checked to
 *       be bucketed: as many dp collectives in the backward pass as the
 *       buckets the rule gives (computed here from the gradients' positions
 *       before the pass), each right after its bucket's last gradient with
 *       only its flat buffer's nodes in between, its result first read after
 *       every other backward node (no pass after it: the loss's seed is
 *       1/DP, so the sum is the mean).  --zero (ZeRO-1, m->mesh_zero = DP): the
 *       buckets are reduce_scattered; the optimizer has one flat_shard per
 *       parameter, all_gathers on dp, one all_reduce on dp (the norm); every
 *       state is the rank's piece [ceil(n / DP)], flat_shards = DP; the
 *       pieces, re-assembled over dp (and tp), equal the one-rank state, and
 *       their padding stays exactly zero.
 *
 *   shard_optim --ep E [--zero] ... MODEL.dsl TP DP ...
 *       Expert parallelism over E of the DP ranks (m->mesh_ep; MoE models),
 *       the mesh run by ir_interp_run_mesh_ep.  Without --zero: each
 *       expert tensor's sumsq all-reduced over ep (axis 2) in the norm.
 *       With --zero: dense parameters as above; an expert tensor's gradient
 *       is reduce_scattered over its ep_dp group (axis 3, DP / E members)
 *       and its state is the rank's piece [ceil(n / (DP / E))] of its
 *       ep-local tensor, flat_shards = DP / E, at ep_dp coordinate d / E
 *       (with DP == E: whole, no piece), updated through a flat_shard on
 *       axis 3 and gathered back by all_gathers on axis 3; its sumsq adds
 *       into the one dp all_reduce of the norm (no ep or ep_dp all_reduce
 *       in the optimizer).  The state, re-assembled over ep_dp, then ep
 *       (and tp), equals the one-rank state. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../autodiff/ad_check.h"
#include "ir/interp.h"
#include "passes/passes.h"
#include "tests/shard/shard_util.h"
#include "tests/support/load.h"

#define TOL 1e-12
static int use_sp; /* --sp: sequence parallelism */
#define NSTEPS 3
/* A gradient element at most ZERO_GRAD times its tensor's largest is zero
 * up to rounding: both runs hold rounding noise there (~1e-17), which
 * AdamW's m / (sqrt(v) + eps) turns into steps of up to lr x noise / eps.
 * Such elements are checked to ZERO_TOL, the rest to TOL. */
#define ZERO_GRAD 1e-12
#define ZERO_TOL 1e-8




static int count_opt(const IrModule *m, IrOp op, int axis) {
  int k = 0;
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *n = m->nodes[i];
    k += n->phase == IR_PHASE_OPT && n->op == op && (axis < 0 || n->ia[0] == axis);
  }
  return k;
}

/* A setting list of at most 8 floats. */
static IrSetting *settings(IrModule *m, const char *const *names, const double *v, int n) {
  IrSetting *s = arena_alloc(&m->arena, 8 * sizeof *s);
  for (int i = 0; i < n; i++) s[i] = (IrSetting){.name = names[i], .is_float = 1, .f = v[i]};
  return s;
}

/* The test's optimizer and clip, whatever the model's train section says. */
static void configure(IrModule *m, int adamw, double clip) {
  m->optimizer = adamw ? "adamw" : "sgd";
  if (adamw) {
    m->optim = settings(m, (const char *[]){"beta1", "beta2", "eps", "wd"},
                        (double[]){0.9, 0.95, 1e-8, 0.1}, 4);
    m->noptim = 4;
  } else {
    m->optim = settings(m, (const char *[]){"momentum", "wd"}, (double[]){0.9, 0.1}, 2);
    m->noptim = 2;
  }
  IrSetting *t = arena_alloc(&m->arena, sizeof *t * (size_t)(m->ntrain + 1));
  int n = 0, found = 0;
  for (int i = 0; i < m->ntrain; i++) {
    t[n] = m->train[i];
    if (!strcmp(t[n].name, "clip")) t[n] = (IrSetting){.name = "clip", .is_float = 1, .f = clip},
                                    found = 1;
    n++;
  }
  if (!found) t[n++] = (IrSetting){.name = "clip", .is_float = 1, .f = clip};
  m->train = t;
  m->ntrain = n;
}

/* The module's IR text (ir_print), malloc'd. */
static char *ir_text(const IrModule *m) {
  FILE *f = tmpfile();
  if (!f) {
    printf("FAIL: tmpfile\n");
    exit(1);
  }
  ir_print(f, m);
  long len = ftell(f);
  char *text = calloc((size_t)len + 1, 1);
  rewind(f);
  if (!text || fread(text, 1, (size_t)len, f) != (size_t)len) {
    printf("FAIL: reading the IR text back\n");
    exit(1);
  }
  fclose(f);
  return text;
}

static const char *const state_keys[] = {"exp_avg", "exp_avg_sq", "momentum_buffer"};

/* The PARAM a STATE belongs to: its name less the last ".key". */
static const IrNode *param_of(IrModule *m, const IrNode *st) {
  const char *dot = strrchr(st->name, '.');
  char name[256];
  snprintf(name, sizeof name, "%.*s", dot ? (int)(dot - st->name) : 0, st->name);
  return shard_find_leaf(m, IR_OP_PARAM, name);
}

/* Global flat index of element e of leaf p on the rank at (tp c, dp d), or
 * -1: vocabulary padding, or (*pad set) ZeRO-1 padding.  A ZeRO-1 state
 * holds elements [k s, (k + 1) s) of its parameter's tp-local (an expert
 * tensor's: ep-local) tensor, flattened: k = d, or for an expert tensor its
 * ep_dp coordinate d / ep. */
static int64_t leaf_index(IrModule *m, const IrNode *p, int64_t e, int c, int d, int *pad) {
  *pad = 0;
  if (p->flat_shards <= 1) return shard_global_index(p, e, d, c);
  const IrNode *q = param_of(m, p);
  int expert = p->shard == IR_SHARD_EXPERT && p->ep_degree > 1;
  int64_t j = (int64_t)(expert ? d / shard_ep : d) * ir_numel(p) + e;
  if (!q || j >= ir_numel(q)) {
    *pad = 1;
    return -1;
  }
  return shard_global_index(q, j, d, c);
}

static int is_expert(const IrNode *p) {
  return p->shard == IR_SHARD_EXPERT && p->ep_degree > 1;
}

/* Compares leaf q of the reference (values R) with its rank-local
 * counterpart p on every rank; returns the max error relative to the
 * tensor's largest |value| and raises *spread by the largest difference
 * between copies that must be equal.  Elements flagged in zero (NULL: none)
 * are left out of the result: their error raises *zero_err instead. */
static double compare_leaf(IrModule *sh, const IrNode *q, const double *R, const IrNode *p,
                           IrInterp **rk, int tp, int dp, const unsigned char *zero,
                           double *zero_err, double *spread) {
  int64_t gn = ir_numel(q);
  double *asm_ = calloc((size_t)gn, sizeof *asm_);
  unsigned char *seen = calloc((size_t)gn, 1);
  for (int d = 0; d < dp; d++)
    for (int c = 0; c < tp; c++) {
      const double *L = rk[d * tp + c]->f[p->id];
      for (int64_t e = 0; e < ir_numel(p); e++) {
        int pad;
        int64_t gi = leaf_index(sh, p, e, c, d, &pad);
        if (gi < 0) { /* vocabulary or ZeRO-1 padding: must stay exactly 0 */
          *spread = fmax(*spread, fabs(L[e]));
          continue;
        }
        if (seen[gi]) *spread = fmax(*spread, fabs(asm_[gi] - L[e]));
        else asm_[gi] = L[e], seen[gi] = 1;
      }
    }
  double scale = 0, err = 0;
  int all = 1;
  for (int64_t e = 0; e < gn; e++) scale = fmax(scale, fabs(R[e]));
  for (int64_t e = 0; e < gn; e++) {
    double d = fabs(asm_[e] - R[e]) / fmax(scale, 1e-300);
    if (zero && zero[e]) *zero_err = fmax(*zero_err, d);
    else err = fmax(err, d);
    all &= seen[e];
  }
  free(asm_);
  free(seen);
  if (!all) {
    printf("FAIL: %s: the shards do not cover the tensor\n", q->name);
    shard_fails++;
  }
  return err;
}

/* What pass_dp_grads should make: buckets of the gradients in the order of
 * their positions (before the pass), each closed once it holds cap bytes,
 * a gradient of cap bytes or more in one alone;
 * returns their count, each bucket's last gradient in anchor[]. */
static int expect_buckets(IrModule *m, int dp, int zero, int64_t cap, IrNode **anchor) {
  int n = 0, nb = 0;
  IrNode **g = calloc((size_t)m->nnodes, sizeof *g);
  for (int i = 0; i < m->nnodes; i++) /* (expert-parallel ones: over ep_dp, no bucket) */
    if (m->nodes[i]->op == IR_OP_PARAM && m->nodes[i]->grad && !is_expert(m->nodes[i]))
      g[n++] = m->nodes[i];
  for (int i = 1; i < n; i++) /* insertion sort by gradient position */
    for (int j = i; j > 0 && g[j - 1]->grad->id > g[j]->grad->id; j--) {
      IrNode *t = g[j];
      g[j] = g[j - 1];
      g[j - 1] = t;
    }
  int64_t bytes = 0;
  for (int i = 0; i < n; i++) {
    int64_t k = ir_numel(g[i]), b = 4 * (zero ? (k + dp - 1) / dp * dp : k);
    if (b >= cap && bytes > 0) anchor[nb++] = g[i - 1]->grad, bytes = 0; /* alone */
    bytes += b;
    if (bytes >= cap || i == n - 1) anchor[nb++] = g[i]->grad, bytes = 0;
  }
  free(g);
  return nb;
}

/* The bucketed dp reduction's structure (see the header). */
static void check_buckets(IrModule *sh, int dp, int zero, int nb, IrNode **anchor) {
  IrOp kind = zero ? IR_OP_REDUCE_SCATTER : IR_OP_ALL_REDUCE;
  int ncoll = 0, other = 0, placed = 1, late = 1, last_bw = -1, stats = 0;
  /* the last backward node that is not part of a bucket's finish (views) */
  for (int i = 0; i < sh->nnodes; i++) {
    const IrNode *n = sh->nodes[i];
    if ((n->phase == IR_PHASE_B || n->phase == IR_PHASE_W) && n->op != IR_OP_SLICE &&
        n->op != IR_OP_RESHAPE)
      last_bw = i;
  }
  for (int i = 0; i < sh->nnodes; i++) {
    const IrNode *n = sh->nodes[i];
    int coll = n->op == IR_OP_ALL_REDUCE || n->op == IR_OP_REDUCE_SCATTER ||
               n->op == IR_OP_ALL_GATHER;
    if (n->phase == IR_PHASE_OPT || !coll || n->ia[0] != 1) continue;
    /* statistics of the global batch (MoE routing): forward all_reduces over
     * dp, and the adjoints of the differentiable ones in B */
    if (n->op == IR_OP_ALL_REDUCE && n->phase != IR_PHASE_W) {
      stats += n->phase == IR_PHASE_FWD ? 1 : -1;
      continue;
    }
    if (n->op != kind || ncoll >= nb) {
      other++;
      continue;
    }
    /* right after the anchor: only the bucket's flat-buffer nodes between */
    placed &= n->id > anchor[ncoll]->id;
    for (int k = anchor[ncoll]->id + 1; k < n->id; k++) {
      IrOp op = sh->nodes[k]->op;
      placed &= sh->nodes[k]->phase == IR_PHASE_W &&
                (op == IR_OP_RESHAPE || op == IR_OP_CONCAT || op == IR_OP_FILL);
    }
    for (int k = n->id + 1; k < sh->nnodes; k++)
      for (int j = 0; j < sh->nodes[k]->ninputs; j++)
        if (sh->nodes[k]->inputs[j] == n) late &= k > last_bw;
    ncoll++;
  }
  shard_expect(ncoll == nb && other == 0 && stats >= 0,
               zero ? "%s: one dp reduce_scatter per bucket, nothing else on dp (%g buckets)"
                    : "%s: one dp all_reduce per bucket, nothing else on dp (%g buckets)",
               "buckets", (double)nb);
  shard_expect(placed, "%s: each bucket's collective follows its last gradient, only its flat "
               "buffer in between (%g)", "issue", (double)ncoll);
  shard_expect(late, "%s: each collective's result is first read after the backward pass (%g)",
               "finish", (double)ncoll);
}

static int run_check(const char *path, int tp, int dp, int adamw, int clip_on, int zero,
                     int64_t bucket, const char *const *defs, int nd) {
  IrModule *ref = test_load(path, defs, nd), *sh = test_load(path, defs, nd);
  if (!ref || !sh) return 1;
  double clip = clip_on ? 0.05 : 1e6;
  configure(ref, adamw, clip);
  configure(sh, adamw, clip);
  char err[512];
  sh->mesh_ep = shard_ep;
  if (pass_shard(sh, tp, dp, use_sp, err, sizeof err)) {
    printf("FAIL: %s\n", err);
    return 1;
  }
  if (pass_autodiff(ref) || pass_optimizer(ref)) {
    printf("FAIL: the one-rank module does not compile\n");
    return 1;
  }
  if (pass_autodiff(sh)) {
    printf("FAIL: the rank-local module does not differentiate\n");
    return 1;
  }
  zero = zero && dp > 1; /* ZeRO-1 over one dp rank: no-op */
  sh->mesh_zero = zero ? dp : 0;
  sh->dp_bucket_bytes = bucket;
  IrNode **anchor = calloc((size_t)sh->nnodes, sizeof *anchor);
  int nb = dp > 1 ? expect_buckets(sh, dp, zero, bucket > 0 ? bucket : DP_BUCKET_BYTES_DEFAULT,
                                   anchor)
                  : 0;
  if (pass_dp_grads(sh, dp) || pass_optimizer(sh)) {
    printf("FAIL: the rank-local module does not compile\n");
    return 1;
  }
  must_verify(ref, "reference after pass_optimizer");
  must_verify(sh, "rank-local module after pass_optimizer");
  printf("     %s tp=%d dp=%d ep=%d %s clip %s%s, bucket %lld bytes\n", ref->name, tp, dp,
         shard_ep, adamw ? "adamw" : "sgd", clip_on ? "on" : "off", zero ? ", zero 1" : "",
         (long long)bucket);
  if (dp > 1) check_buckets(sh, dp, zero, nb, anchor);
  free(anchor);

  /* structure */
  int nsharded = 0, nparams = 0, state_ok = 1, nstate = 0, nexpert = 0;
  int ntx = 0; /* expert-parallel tensors whose experts are split over tp too */
  int ez = shard_ep > 1 ? dp / shard_ep : dp; /* an expert tensor's ZeRO-1 pieces */
  for (int i = 0; i < sh->nnodes; i++) {
    const IrNode *p = sh->nodes[i];
    if (p->op != IR_OP_PARAM || !p->grad) continue;
    nparams++;
    nexpert += is_expert(p);
    nsharded += p->shard_degree > 1 && !is_expert(p);
    ntx += p->shard_degree > 1 && is_expert(p);
    int z = is_expert(p) ? ez : dp; /* pieces under zero */
    for (int k = 0; k < 3; k++) {
      char name[256];
      snprintf(name, sizeof name, "%s.%s", p->name, state_keys[k]);
      const IrNode *s = shard_find_leaf(sh, IR_OP_STATE, name);
      if (!s) continue;
      nstate++;
      int64_t piece = (ir_numel(p) + z - 1) / z;
      state_ok &= (zero && z > 1 ? s->rank == 1 && s->shape[0] == piece && s->flat_shards == z
                                 : s->rank == p->rank && !memcmp(s->shape, p->shape, sizeof s->shape) &&
                              s->flat_shards <= 1) &&
                  s->shard == p->shard && s->shard_dim == p->shard_dim &&
                  s->ep_degree == p->ep_degree &&
                  (p->shard_degree > 1 || p->ep_degree > 1
                       ? s->shard_degree == p->shard_degree &&
                             s->shard_blocks == p->shard_blocks &&
                             !memcmp(s->global_shape, p->global_shape, sizeof s->global_shape)
                       : s->shard_degree <= 1);
    }
  }
  printf("     %d trained parameters, %d sharded over tp, %d over ep, %d state tensors\n",
         nparams, nsharded, nexpert, nstate);
  if (shard_ep > 1)
    shard_expect(nexpert > 0, "%s: the model has expert-parallel tensors (%g)", "ep",
                 (double)nexpert);
  shard_expect(state_ok && nstate == (adamw ? 2 : 1) * nparams,
         zero ? "%s: state is the rank's ZeRO-1 piece of its parameter, with its sharding (%g "
                "tensors)"
              : "%s: state has its parameter's local shape and sharding (%g tensors)", "state",
         (double)nstate);
  if (zero) {
    int ar_tp = count_opt(sh, IR_OP_ALL_REDUCE, 0), ar_dp = count_opt(sh, IR_OP_ALL_REDUCE, 1);
    int ag_dp = count_opt(sh, IR_OP_ALL_GATHER, 1), nflat = count_opt(sh, IR_OP_FLAT_SHARD, 1);
    int other = count_opt(sh, IR_OP_ALL_GATHER, 0) + count_opt(sh, IR_OP_REDUCE_SCATTER, -1) +
                count_opt(sh, IR_OP_GROUP_COPY, -1) + count_opt(sh, IR_OP_ALL_REDUCE, 2) +
                count_opt(sh, IR_OP_ALL_REDUCE, 3) + count_opt(sh, IR_OP_ALL_GATHER, 2);
    int ndense = nparams - nexpert, want_tp = tp > 1 && nsharded + ntx ? 1 : 0;
    shard_expect(ar_tp == want_tp && ar_dp == 1 && ag_dp >= 1 && ag_dp <= ndense &&
                     other == 0 && nflat == ndense,
                 "%s: the optimizer: %g tp all_reduce, one dp all_reduce (the norm), bucketed "
                 "dp all_gathers, a flat_shard per dense parameter", "zero", (double)want_tp);
    if (nexpert) {
      int ag_e = count_opt(sh, IR_OP_ALL_GATHER, 3), flat_e = count_opt(sh, IR_OP_FLAT_SHARD, 3);
      int rs_e = 0, ar_e = 0;
      for (int i = 0; i < sh->nnodes; i++) {
        const IrNode *n = sh->nodes[i];
        rs_e += n->op == IR_OP_REDUCE_SCATTER && n->phase == IR_PHASE_W && n->ia[0] == 3;
        ar_e += n->op == IR_OP_ALL_REDUCE && n->phase == IR_PHASE_W && n->ia[0] == 3;
      }
      shard_expect(ez > 1 ? rs_e == nexpert && ar_e == 0 && flat_e == nexpert && ag_e >= 1 &&
                                ag_e <= nexpert
                          : rs_e + ar_e + flat_e + ag_e == 0,
                   ez > 1 ? "%s: each expert gradient reduce_scattered over ep_dp, its piece "
                            "(of %g) updated through a flat_shard and gathered by bucketed "
                            "ep_dp all_gathers"
                          : "%s: experts whole on their rank (ep_dp of %g): no ep_dp "
                            "collective, no flat_shard",
                   "ep", (double)ez);
      printf("     experts: %d ep_dp reduce_scatter, %d flat_shard, %d ep_dp all_gather "
             "buckets\n", rs_e, flat_e, ag_e);
    }
    const IrNode *gn = sh->grad_norm;
    shard_expect(gn->ninputs == 1 && gn->inputs[0]->op == IR_OP_ALL_REDUCE &&
                     gn->inputs[0]->ia[0] == 1 && gn->inputs[0]->ia[1] == dp,
                 "%s: grad_norm reads one sum of squares, all-reduced over the %g dp ranks",
                 "norm", (double)dp);
    printf("     %d dp all_gather buckets in the optimizer\n", ag_dp);
  } else {
  int ar_tp = count_opt(sh, IR_OP_ALL_REDUCE, 0), ar_dp = count_opt(sh, IR_OP_ALL_REDUCE, 1);
  int ar_ep = count_opt(sh, IR_OP_ALL_REDUCE, 2);
  int other = count_opt(sh, IR_OP_ALL_GATHER, -1) + count_opt(sh, IR_OP_REDUCE_SCATTER, -1) +
              count_opt(sh, IR_OP_GROUP_COPY, -1) + count_opt(sh, IR_OP_ALL_REDUCE, 3);
  int want_tp = tp > 1 && nsharded + ntx ? 1 : 0;
  shard_expect(ar_tp == want_tp && ar_dp == 0 && ar_ep == nexpert && other == 0,
         "%s: the optimizer has %g all_reduce on tp, none on dp, one on ep per expert tensor, "
         "no other collective", "norm", (double)want_tp);
  int nopt_ref = 0, nopt_sh = 0;
  for (int i = 0; i < ref->nnodes; i++) nopt_ref += ref->nodes[i]->phase == IR_PHASE_OPT;
  for (int i = 0; i < sh->nnodes; i++) nopt_sh += sh->nodes[i]->phase == IR_PHASE_OPT;
  /* nsharded + ntx - 1 adds and the all_reduce (tp-split experts' ep-reduced
   * sumsqs join the tp sum); the experts' ep all_reduces */
  int extra = (want_tp ? nsharded + ntx : 0) + nexpert;
  int nadd = count_opt(sh, IR_OP_ADD, -1);
  shard_expect(nopt_sh == nopt_ref + extra && nadd == (want_tp ? nsharded + ntx - 1 : 0),
         "%s: the one-rank optimizer's nodes plus %g (the sharded sumsqs' adds, all_reduce)",
         "opt", (double)extra);
  int nrep = 0;
  const IrNode *gn = sh->grad_norm;
  for (int j = 0; j < gn->ninputs; j++) nrep += gn->inputs[j]->op == IR_OP_SUMSQ;
  const IrNode *g0 = gn->inputs[0];
  shard_expect(want_tp ? g0->op == IR_OP_ALL_REDUCE && g0->ia[0] == 0 && g0->ia[1] == tp &&
                       g0->phase == IR_PHASE_OPT && nrep == nparams - nsharded - nexpert &&
                       gn->ninputs == nrep + nexpert - ntx + 1
                 : nrep == nparams - nexpert && gn->ninputs == nparams,
         "%s: grad_norm reads each replicated gradient's sumsq once (%g), and the reduced "
         "sharded sum when tp > 1", "norm",
         (double)(nparams - (want_tp ? nsharded : 0)));
  }
  if (tp == 1 && dp == 1) { /* the rank-local module of a 1 x 1 mesh: one rank's IR */
    char *text[2];
    IrModule *mods[2] = {ref, sh};
    for (int j = 0; j < 2; j++) text[j] = ir_text(mods[j]);
    /* the same text but for the line naming the mesh */
    const char *mesh = "mesh tp = 1, dp = 1 (rank-local shapes)\n";
    char *at = strstr(text[1], mesh);
    if (at) memmove(at, at + strlen(mesh), strlen(at + strlen(mesh)) + 1);
    shard_expect(at && !strcmp(text[1], text[0]),
           "%s: tp = dp = 1 prints the one-rank IR, %g updates included", "ir",
           (double)ref->nupdates);
    free(text[0]);
    free(text[1]);
  }
  shard_expect(sh->nupdates == ref->nupdates, "%s: as many updates as one rank (%g)", "updates",
         (double)ref->nupdates);

  /* global values on the reference, every rank's slices */
  IrInterp *it = ir_interp_new(ref);
  int64_t vocab = 0;
  for (int i = 0; i < ref->nnodes; i++)
    if (ref->nodes[i]->op == IR_OP_EMBEDDING) vocab = ref->nodes[i]->inputs[1]->shape[0];
  IrNode *lr = shard_find_leaf(ref, IR_OP_INPUT, "lr");
  IrNode *step = shard_find_leaf(ref, IR_OP_INPUT, "step");
  shard_fill_reference(ref, it, vocab, (IrNode *[]){lr, step}, 2);
  int nr = tp * dp;
  IrInterp **rk = calloc((size_t)nr, sizeof *rk);
  IrNode *slr = shard_find_leaf(sh, IR_OP_INPUT, "lr");
  IrNode *sstep = shard_find_leaf(sh, IR_OP_INPUT, "step");
  if (shard_fill_ranks(ref, it, sh, rk, tp, dp, (IrNode *[]){slr, sstep}, 2)) return 1;
  IrNode *coef = NULL;
  for (int i = 0; i < ref->nnodes; i++)
    if (ref->nodes[i]->op == IR_OP_CLIP_COEF) coef = ref->nodes[i];
  if (!lr || !step || !slr || !sstep || !coef || !ref->grad_norm || !sh->grad_norm) {
    printf("FAIL: lr, step, clip_coef or grad_norm missing\n");
    return 1;
  }

  /* the steps */
  const double lrs[NSTEPS] = {1e-2, 7e-3, 4e-3};
  double norm_err = 0, norm_spread = 0, perr = 0, serr = 0, spread = 0;
  int clip_ok = 1, nstates = 0, ncompared = 0;
  unsigned char **zgrad = calloc((size_t)ref->nnodes, sizeof *zgrad);
  int64_t nzero = 0;
  double zerr = 0;
  char why[512];
  for (int t = 0; t < NSTEPS; t++) {
    it->f[lr->id][0] = lrs[t];
    it->f[step->id][0] = t + 1;
    for (int r = 0; r < nr; r++) {
      rk[r]->f[slr->id][0] = lrs[t];
      rk[r]->f[sstep->id][0] = t + 1;
    }
    if (ir_interp_run(it, 0, ref->nnodes, why, sizeof why)) {
      printf("FAIL: reference run: %s\n", why);
      return 1;
    }
    if (ir_interp_run_mesh_ep(rk, tp, dp, shard_ep, 0, sh->nnodes, why, sizeof why)) {
      printf("FAIL: mesh run: %s\n", why);
      return 1;
    }
    double nref = it->f[ref->grad_norm->id][0], c = it->f[coef->id][0];
    clip_ok &= clip_on ? c < 1 : c == 1;
    double e = 0;
    for (int r = 0; r < nr; r++) {
      double v = rk[r]->f[sh->grad_norm->id][0];
      e = fmax(e, fabs(v - nref) / fmax(fabs(nref), 1e-300));
      norm_spread = fmax(norm_spread, fabs(v - rk[0]->f[sh->grad_norm->id][0]));
    }
    norm_err = fmax(norm_err, e);
    printf("     step %d: lr %g, grad_norm %.15g (one rank), coef %.6g, rel err %.2e\n", t + 1,
           lrs[t], nref, c, e);
    ir_interp_end_step(it);
    for (int r = 0; r < nr; r++) ir_interp_end_step(rk[r]);

    /* elements whose one-rank gradient is zero up to rounding (GPT-2's key
     * bias: softmax ignores a shift shared by every key) */
    for (int k = 0; k < ref->nnodes; k++) {
      const IrNode *q = ref->nodes[k];
      if (q->op != IR_OP_PARAM || !q->grad) continue;
      const double *G = it->f[q->grad->id];
      double gmax = 0;
      for (int64_t j = 0; j < ir_numel(q); j++) gmax = fmax(gmax, fabs(G[j]));
      if (!zgrad[k]) zgrad[k] = calloc((size_t)ir_numel(q), 1);
      for (int64_t j = 0; j < ir_numel(q); j++)
        if (G[j] != 0 && fabs(G[j]) <= ZERO_GRAD * gmax && !zgrad[k][j]) zgrad[k][j] = 1, nzero++;
    }
    double pe = 0, se = 0;
    for (int k = 0; k < sh->nnodes; k++) {
      const IrNode *p = sh->nodes[k];
      if (p->op != IR_OP_PARAM && p->op != IR_OP_STATE) continue;
      const IrNode *q = shard_find_leaf(ref, p->op, p->name);
      if (!q) {
        printf("FAIL: %s has no one-rank counterpart\n", p->name);
        shard_fails++;
        continue;
      }
      if (p->shard_degree > 1 &&
          memcmp(p->global_shape, q->shape, sizeof(int64_t) * (size_t)q->rank)) {
        printf("FAIL: %s: global shape differs from the one-rank shape\n", p->name);
        shard_fails++;
        continue;
      }
      double r = compare_leaf(sh, q, it->f[q->id], p, rk, tp, dp,
                              p->op == IR_OP_PARAM ? zgrad[q->id] : NULL, &zerr, &spread);
      if (r > TOL) printf("     %s: rel err %.2e after step %d\n", p->name, r, t + 1);
      if (p->op == IR_OP_PARAM) pe = fmax(pe, r);
      else se = fmax(se, r), nstates += t == 0;
      ncompared += t == 0;
    }
    printf("     after step %d: parameters max rel err %.2e, state %.2e\n", t + 1, pe, se);
    perr = fmax(perr, pe);
    serr = fmax(serr, se);
  }
  shard_expect(clip_ok,
         clip_on ? "%s: the coefficient is below 1 at every step (max norm %g)"
                 : "%s: the coefficient is exactly 1 at every step (max norm %g)",
         "clip", clip);
  shard_expect(norm_err <= TOL && norm_spread == 0,
         "%s: every rank's grad_norm equals the one-rank norm (max rel %.2e)", "norm", norm_err);
  shard_expect(perr <= TOL, "%s: parameters after each step equal the one-rank ones (max rel %.2e)",
         "params", perr);
  shard_expect(serr <= TOL && nstates > 0,
         "%s: optimizer state after each step equals the one-rank state (max rel %.2e)", "state",
         serr);
  printf("     %lld parameter elements with a zero gradient (|g| <= %g max |g|), "
         "max rel err %.2e\n", (long long)nzero, ZERO_GRAD, zerr);
  shard_expect(zerr <= ZERO_TOL,
         "%s: parameters with a zero gradient: AdamW's rounding noise / eps only (max rel %.2e)",
         "zero", zerr);
  shard_expect(spread == 0, "%s: copies that must agree are bit-identical (max diff %.2e)", "replicas",
         spread);
  printf("     compared %d tensors (%d state) over %d steps\n", ncompared, nstates, NSTEPS);
  printf("RESULT %s tp=%d dp=%d ep=%d%s %s clip=%s norm %.2e params %.2e state %.2e "
         "zero-grad %.2e\n", ref->name, tp, dp, shard_ep, zero ? " zero" : "",
         adamw ? "adamw" : "sgd", clip_on ? "on" : "off", norm_err, perr, serr, zerr);
  for (int k = 0; k < ref->nnodes; k++) free(zgrad[k]);
  free(zgrad);
  for (int r = 0; r < nr; r++) ir_interp_free(rk[r]);
  free(rk);
  ir_interp_free(it);
  ir_module_free(ref);
  ir_module_free(sh);
  return shard_fails != 0;
}

int main(int argc, char **argv) {
  use_sp = shard_take_flag(&argc, argv, "--sp");
  int zero = shard_take_flag(&argc, argv, "--zero");
  for (int i = 1; i + 1 < argc; i++)
    if (!strcmp(argv[i], "--ep")) { /* --ep E: expert parallelism, E dividing DP */
      shard_ep = atoi(argv[i + 1]);
      memmove(argv + i, argv + i + 2, sizeof *argv * (size_t)(argc - i - 1));
      argc -= 2;
      break;
    }
  int64_t bucket = 0;
  if (argc > 2 && !strcmp(argv[1], "--bucket")) {
    bucket = atoll(argv[2]);
    memmove(argv + 1, argv + 3, sizeof *argv * (size_t)(argc - 2)); /* with the NULL */
    argc -= 2;
  }
  if (argc < 6 || (strcmp(argv[4], "adamw") && strcmp(argv[4], "sgd")) ||
      (strcmp(argv[5], "on") && strcmp(argv[5], "off"))) {
    fprintf(stderr, "usage: shard_optim MODEL.dsl TP DP adamw|sgd on|off [NAME=VALUE ...]\n");
    return 2;
  }
  return run_check(argv[1], atoi(argv[2]), atoi(argv[3]), !strcmp(argv[4], "adamw"),
                   !strcmp(argv[5], "on"), zero, bucket, (const char *const *)argv + 6,
                   argc - 6);
}
