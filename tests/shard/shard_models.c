/* tests/shard/shard_models.c -- the partitioner (passes/shard.c) against the
 * one-rank interpreter, on a lockstep multi-rank interpreter.
 *
 *   shard_models [--sp] MODEL.dsl TP DP AR [NAME=VALUE ...]
 *       The model is compiled twice to its forward module: once whole
 *       (autodiff, one interpreter) and once through pass_shard(TP, DP, SP),
 *       autodiff, pass_attn_delta (the sharded module's sdpa_grads read
 *       lse and D, as the trainers' do; the whole one's read sdpa's out)
 *       and pass_dp_grads, run by ir_interp_run_mesh on TP x DP
 *       rank interpreters.  Every rank gets its slices of the same global
 *       parameter values (shard_dim, shard_blocks) and its rows of the same
 *       global batch.  Checks: the sharded forward has exactly AR
 *       all_reduce nodes besides the vocab-parallel embedding's (with
 *       --sp and TP > 1: no all_reduce, and AR reduce_scatters and AR
 *       all_gathers besides the embedding's and the head's, every norm on
 *       seq / TP positions, and the backward has the adjoint collectives);
 *       the vocabulary is always vocab-parallel under TP > 1, padded when
 *       TP does not divide it; the loss (mean over dp ranks, equal on the
 *       tp ranks) equals the one-rank loss; every parameter's gradient,
 *       re-assembled from the tp shards, is equal on every dp rank and
 *       equals the one-rank gradient, both within 1e-10 relative, and is
 *       exactly 0 on vocabulary padding.
 *       --pad N: the vocabulary padding quantum (m->pad_vocab, parc's
 *       --pad-vocab): tables of ir_padded_vocab(V, TP, N) rows, padded at
 *       TP 1 too (a plain embedding, vocab_cross_entropy, no collective).
 *       --ep E: expert parallelism over E of the DP ranks (m->mesh_ep):
 *       the expert weights' slices by ep coordinate, the mesh run with
 *       ir_interp_run_mesh_ep; MoE models: the routing statistics are
 *       all-reduced over dp, and the slots travel by expert_all_to_all.
 *   shard_models [--sp] --error MODEL.dsl TP DP TEXT [NAME=VALUE ...]
 *       pass_shard must fail with a message containing TEXT.
 *   shard_models --ir MODEL.dsl TP DP [NAME=VALUE ...]
 *       Prints the rank-local forward module pass_shard makes.
 *   shard_models --twice MODEL.dsl [NAME=VALUE ...]
 *       pass_shard refuses a module it already sharded. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../autodiff/ad_check.h"
#include "ir/interp.h"
#include "passes/passes.h"
#include "tests/shard/shard_util.h"
#include "tests/support/load.h"

#define TOL 1e-10
static int use_sp; /* --sp: sequence parallelism */
static int use_pad; /* --pad N: m->pad_vocab */
static int use_merged; /* --merged N: tp regions whose all_reduce another's serves */




static int count_op(const IrModule *m, IrOp op, IrPhase ph) {
  int k = 0;
  for (int i = 0; i < m->nnodes; i++)
    k += m->nodes[i]->op == op && m->nodes[i]->phase == ph &&
         (op != IR_OP_ALL_REDUCE || m->nodes[i]->ia[0] == 0); /* all_reduce: over tp */
  return k;
}

/* Mixture of experts (rule_dispatch): per MoE layer under dp > 1, the two
 * routing statistics all-reduced over dp (three with a router z-loss, its
 * mean over the tokens: one log node a layer, the prelude's logsumexp), a
 * capacity_drop iff the capacity drops tokens, and under ep > 1 one
 * expert_all_to_all each way with the expert weights holding experts / ep
 * experts. */
static int moe_checks(const IrModule *sh, int tp, int dp) {
  int ndisp = 0, ndp = 0, ndrop = 0, na2a = 0, nexp = 0, expok = 1, nz = 0, ncw = 0;
  for (int i = 0; i < sh->nnodes; i++) {
    const IrNode *n = sh->nodes[i];
    ndisp += n->op == IR_OP_DISPATCH;
    ndp += n->op == IR_OP_ALL_REDUCE && n->ia[0] == 1;
    ndrop += n->op == IR_OP_CAPACITY_DROP;
    nz += n->op == IR_OP_LOG && n->phase == IR_PHASE_FWD;
    na2a += n->op == IR_OP_EXPERT_ALL_TO_ALL;
    if (n->op == IR_OP_PARAM && n->shard == IR_SHARD_EXPERT) {
      nexp++;
      expok &= shard_ep > 1 ? n->ep_degree == shard_ep &&
                                  n->shape[0] * shard_ep == n->global_shape[0]
                            : n->ep_degree <= 1;
      /* each expert split over tp (expert(d)): the rank holds 1 / (ep tp) of it */
      int64_t whole = 1;
      for (int d = 0; d < n->rank; d++)
        whole *= n->shard_degree > 1 || n->ep_degree > 1 ? n->global_shape[d] : n->shape[d];
      int sd = n->shard_dim;
      expok &= tp > 1 ? n->shard_degree == tp && sd >= 1 && n->shape[sd] * tp == n->global_shape[sd]
                      : n->shard_degree <= 1;
      expok &= ir_numel(n) * tp * shard_ep == whole;
    }
    /* the routing weights enter combine through group_copy when the experts'
     * outputs are partial sums over tp */
    if (n->op == IR_OP_COMBINE && n->phase == IR_PHASE_FWD)
      ncw += n->inputs[2]->op == IR_OP_GROUP_COPY;
  }
  if (!ndisp) return 0;
  printf("     moe: %d dispatch, %d dp all_reduce, %d capacity_drop, %d expert_all_to_all\n",
         ndisp, ndp, ndrop, na2a);
  shard_expect(ndp == (dp > 1 ? 2 * ndisp + nz : 0),
               "%s: routing statistics all-reduced over dp, two per MoE layer, one more per "
               "z-loss (%g)", "moe", (double)ndp);
  shard_expect(na2a == (shard_ep > 1 ? 2 * ndisp : 0),
               "%s: one expert_all_to_all each way per MoE layer (%g)", "ep", (double)na2a);
  shard_expect(nexp > 0 && expok, "%s: expert weights hold experts / ep experts, each split "
               "over tp: 1 / (ep tp) of the tensor on a rank (%g tensors)", "ep", (double)nexp);
  shard_expect(ncw == (tp > 1 ? ndisp : 0), "%s: combine's weights enter through group_copy "
               "(%g)", "tp", (double)ncw);
  if (dp > 1) printf("     capacity_drop: %d (tp %d)\n", ndrop, tp);
  return ncw;
}

static int run_check(const char *path, int tp, int dp, int ar, const char *const *defs, int nd) {
  IrModule *ref = test_load(path, defs, nd), *sh = test_load(path, defs, nd);
  if (!ref || !sh) return 1;
  char err[512];
  sh->mesh_ep = shard_ep;
  sh->pad_vocab = use_pad;
  if (pass_shard(sh, tp, dp, use_sp, err, sizeof err)) {
    printf("FAIL: %s\n", err);
    return 1;
  }
  must_verify(sh, "after pass_shard");
  int ncw = moe_checks(sh, tp, dp);
  int sp = use_sp && tp > 1;
  /* GPT-2's fused q|k|v: sharded blockwise, 3 blocks, HF's global [d, 3d] */
  int nqkv = 0, qkv_ok = 1;
  for (int i = 0; i < sh->nnodes; i++) {
    const IrNode *p = sh->nodes[i];
    if (p->op != IR_OP_PARAM || !strstr(p->name, "c_attn.")) continue;
    nqkv++;
    qkv_ok &= tp == 1 ? p->shard_degree <= 1
                      : p->shard_degree == tp && p->shard_blocks == 3 &&
                            p->global_shape[p->rank - 1] == p->shape[p->rank - 1] * tp &&
                            p->shard_dim == p->rank - 1;
  }
  if (nqkv) shard_expect(qkv_ok, "%s: c_attn weight and bias sharded in 3 blocks (%g tensors)", "qkv",
                   (double)nqkv);
  int nar = count_op(sh, IR_OP_ALL_REDUCE, IR_PHASE_FWD);
  int ncp = count_op(sh, IR_OP_GROUP_COPY, IR_PHASE_FWD);
  printf("     %s tp=%d dp=%d: forward all_reduce %d, group_copy %d\n", ref->name, tp, dp, nar,
         ncp);
  /* vocabulary parallelism: one vocab_embedding (its all_reduce) and one
   * vocab_cross_entropy (the head's group_copy) on top of the layers' */
  int nve = count_op(sh, IR_OP_VOCAB_EMBEDDING, IR_PHASE_FWD);
  int nvce = count_op(sh, IR_OP_VOCAB_CROSS_ENTROPY, IR_PHASE_FWD);
  int64_t vocab = 0;
  for (int i = 0; i < ref->nnodes; i++)
    if (ref->nodes[i]->op == IR_OP_EMBEDDING) vocab = ref->nodes[i]->inputs[1]->shape[0];
  printf("     vocab %lld: vocab_embedding %d, vocab_cross_entropy %d\n", (long long)vocab, nve,
         nvce);
  /* vocab-parallel whenever tp > 1: padded to a multiple of pad * tp; at tp 1
   * padded (a plain lookup, the padded loss) only where pad does not divide V */
  int vp = tp > 1;
  int64_t Vp = ir_padded_vocab(vocab, tp, use_pad);
  int vce = vp || Vp != vocab;
  shard_expect(nve == vp && nvce == vce && count_op(sh, IR_OP_EMBEDDING, IR_PHASE_FWD) == !vp,
         "%s: embedding vocab-parallel iff tp > 1, cross-entropy iff tp > 1 or padded (%g)",
         "vocab", (double)tp);
  int padded = 0;
  for (int i = 0; i < sh->nnodes; i++) {
    const IrNode *n = sh->nodes[i];
    if (n->op == IR_OP_PARAM && n->shard == IR_SHARD_VOCAB && vce) {
      int64_t rows = Vp / tp;
      padded += rows * tp != vocab;
      shard_expect(n->shape[0] == rows && n->global_shape[0] == vocab &&
                       n->shape[0] % (use_pad > 1 ? use_pad : 1) == 0,
                   "%s: vocabulary table holds Vp / tp rows per rank (a multiple of --pad), "
                   "global V (%g)", n->name, (double)rows);
    }
    if (n->op == IR_OP_VOCAB_CROSS_ENTROPY)
      shard_expect(n->ia[2] == vocab, "%s: vocab_cross_entropy masks past the true vocabulary %g",
                   "vocab", (double)vocab);
  }
  if (padded) printf("     vocabulary %lld padded to %lld\n", (long long)vocab, (long long)Vp);
  int nrs = count_op(sh, IR_OP_REDUCE_SCATTER, IR_PHASE_FWD);
  int nag = count_op(sh, IR_OP_ALL_GATHER, IR_PHASE_FWD);
  int nls = count_op(sh, IR_OP_LOCAL_SLICE, IR_PHASE_FWD);
  int nrep = count_op(sh, IR_OP_REPLICATE, IR_PHASE_FWD); /* each ends a region */
  if (!sp) {
    shard_expect(nar == ar + nve, "%s: forward all_reduce count as expected (%g)", "tp",
           (double)(ar + nve));
    /* a region whose partial sum joins another's before it is reduced (a
     * shared expert's with the routed experts') has no all_reduce of its own */
    int ecp = tp > 1 ? ar + nvce + nrep + ncw + use_merged : 0;
    shard_expect(ncp == ecp, "%s: one group_copy per region (%g)", "tp", (double)ecp);
    shard_expect(nrs + nag + nls == 0, "%s: no sequence collectives without --sp (%g)", "tp",
                 (double)(nrs + nag + nls));
  } else {
    printf("     sp: forward reduce_scatter %d, all_gather %d, local_slice %d\n", nrs, nag, nls);
    shard_expect(nar == 0, "%s: no forward all_reduce under --sp (%g)", "sp", (double)nar);
    shard_expect(nrs == ar + nve, "%s: a reduce_scatter where all_reduce was (%g)", "sp",
                 (double)(ar + nve));
    /* (the MoE block's tokens are gathered whole by a replicate: routing needs
     * every token; they then enter the experts' region through group_copy) */
    shard_expect(nag + nrep == ar + nvce, "%s: an all_gather (a replicate for the MoE "
                 "tokens) before each column region (%g)", "sp", (double)(ar + nvce));
    int64_t T = 0;
    for (int i = 0; i < sh->nnodes; i++)
      if (sh->nodes[i]->op == IR_OP_INPUT && sh->nodes[i]->rank == 2) T = sh->nodes[i]->shape[1];
    int nnorm = 0, onshards = 0;
    for (int i = 0; i < sh->nnodes; i++) {
      const IrNode *n = sh->nodes[i];
      if (n->op != IR_OP_LAYERNORM && n->op != IR_OP_RMSNORM) continue;
      nnorm++;
      onshards += n->rank == 3 && n->shape[1] * tp == T;
    }
    shard_expect(nnorm > 0 && onshards == nnorm,
                 "%s: every norm runs on seq / tp positions (%g norms)", "sp", (double)nnorm);
  }
  if (pass_autodiff(ref) || pass_autodiff(sh) || pass_attn_delta(sh)) {
    printf("FAIL: autodiff\n");
    return 1;
  }
  int nmodel = sh->nnodes; /* the model's nodes, before the dp reduction's */
  if (pass_dp_grads(sh, dp)) {
    printf("FAIL: pass_dp_grads\n");
    return 1;
  }
  must_verify(ref, "reference after autodiff");
  must_verify(sh, "after autodiff and pass_dp_grads");
  int btp = 0, bdp = 0;
  for (int i = 0; i < sh->nnodes; i++) {
    const IrNode *n = sh->nodes[i];
    if (n->op != IR_OP_ALL_REDUCE || n->phase == IR_PHASE_FWD) continue;
    btp += n->ia[0] == 0, bdp += n->ia[0] == 1;
  }
  printf("     backward all_reduce: tp %d, dp %d\n", btp, bdp);
  shard_expect(btp == ncp, "%s: backward all_reduce count, one per group_copy (%g)", "tp",
         (double)ncp);
  if (sp) {
    int brs = 0, bag = 0; /* on tp */
    for (int i = 0; i < sh->nnodes; i++) {
      const IrNode *n = sh->nodes[i];
      if (n->phase == IR_PHASE_FWD || n->ia[0] != 0) continue;
      brs += n->op == IR_OP_REDUCE_SCATTER, bag += n->op == IR_OP_ALL_GATHER;
    }
    printf("     sp backward: reduce_scatter %d, all_gather %d\n", brs, bag);
    shard_expect(brs == nag && bag == nrs + nls,
                 "%s: backward reduce_scatter per all_gather and all_gather per reduce_scatter "
                 "and local_slice (%g)", "sp", (double)(brs + bag));
  }
  /* no rank materialises anything with the whole vocabulary (logits,
   * their gradient, the table or its gradient), padded at tp 1 too */
  if (vce) {
    int whole = 0;
    for (int i = 0; i < nmodel; i++) {
      const IrNode *n = sh->nodes[i];
      for (int d = 0; d < n->rank; d++)
        if (n->shape[d] == vocab) {
          if (!whole) printf("     %%%d %s has the whole vocabulary %lld on dimension %d\n",
                             n->id, ir_op_info[n->op].name, (long long)vocab, d);
          whole++;
        }
    }
    shard_expect(!whole, "%s: no node has a dimension of the whole vocabulary (%g found)", "vocab",
           (double)whole);
  }

  /* global values on the reference */
  IrInterp *it = ir_interp_new(ref);
  shard_fill_reference(ref, it, vocab, NULL, 0);
  char why[512];
  if (ir_interp_run(it, 0, ref->nnodes, why, sizeof why)) {
    printf("FAIL: reference run: %s\n", why);
    return 1;
  }

  /* every rank's slices */
  int nr = tp * dp;
  IrInterp **rk = calloc((size_t)nr, sizeof *rk);
  if (shard_fill_ranks(ref, it, sh, rk, tp, dp, NULL, 0)) return 1;
  if (ir_interp_run_mesh_ep(rk, tp, dp, shard_ep, 0, sh->nnodes, why, sizeof why)) {
    printf("FAIL: mesh run: %s\n", why);
    return 1;
  }

  /* loss: mean over dp, the same on every tp rank */
  double loss_ref = it->f[ref->loss->id][0], loss = 0, tp_spread = 0;
  for (int r = 0; r < nr; r++) {
    double l = rk[r]->f[sh->loss->id][0];
    if (r % tp == 0) loss += l / dp;
    tp_spread = fmax(tp_spread, fabs(l - rk[r - r % tp]->f[sh->loss->id][0]));
  }
  double lerr = fabs(loss - loss_ref) / fmax(fabs(loss_ref), 1e-300);
  printf("     loss %.12f (one rank %.12f), rel err %.2e, tp spread %.2e\n", loss, loss_ref, lerr,
         tp_spread);
  shard_expect(lerr <= TOL && tp_spread == 0, "%s: loss equals the one-rank loss (rel %.2e)", "loss",
         lerr);

  /* gradients */
  double gmax = 0, dspread = 0, padmax = 0;
  int ngrads = 0, missing = 0;
  for (int k = 0; k < sh->nnodes; k++) {
    const IrNode *p = sh->nodes[k];
    if (p->op != IR_OP_PARAM) continue;
    const IrNode *q = shard_find_leaf(ref, IR_OP_PARAM, p->name);
    if (!!p->grad != !!q->grad) {
      printf("FAIL: %s: gradient present on one side only\n", p->name);
      missing++;
      continue;
    }
    if (!p->grad) continue;
    ngrads++;
    const double *G = it->f[q->grad->id];
    int64_t gn = ir_numel(q);
    double scale = 0;
    for (int64_t e = 0; e < gn; e++) scale = fmax(scale, fabs(G[e]));
    double *asm_ = calloc((size_t)gn, sizeof *asm_);
    int *by = calloc((size_t)gn, sizeof *by); /* 1 + the dp coordinate that filled it */
    double perr = 0;
    for (int d = 0; d < dp; d++) {
      for (int c = 0; c < tp; c++) {
        const double *L = rk[d * tp + c]->f[p->grad->id];
        for (int64_t e = 0; e < ir_numel(p); e++) {
          int64_t gi = shard_global_index(p, e, d, c);
          if (gi < 0) { /* vocabulary padding: no gradient */
            padmax = fmax(padmax, fabs(L[e]));
            continue;
          }
          if (!by[gi]) asm_[gi] = L[e], by[gi] = 1 + d;
          else if (by[gi] != 1 + d) dspread = fmax(dspread, fabs(asm_[gi] - L[e]));
        }
      }
    }
    for (int64_t e = 0; e < gn; e++) perr = fmax(perr, fabs(asm_[e] - G[e]));
    free(by);
    perr /= fmax(scale, 1e-300);
    if (perr > TOL) printf("     %s: rel err %.2e\n", p->name, perr);
    gmax = fmax(gmax, perr);
    free(asm_);
  }
  printf("     %d gradients, max rel err %.2e, dp spread %.2e\n", ngrads, gmax, dspread);
  shard_expect(padmax == 0, "%s: gradients of vocabulary padding are exactly 0 (max %g)",
               "padding", padmax);
  shard_expect(!missing && ngrads > 0 && gmax <= TOL && dspread == 0,
         "%s: gathered gradients equal the one-rank gradients (max rel %.2e)", "grads", gmax);
  for (int r = 0; r < nr; r++) ir_interp_free(rk[r]);
  free(rk);
  ir_interp_free(it);
  ir_module_free(ref);
  ir_module_free(sh);
  return shard_fails != 0;
}

int main(int argc, char **argv) {
  use_sp = shard_take_flag(&argc, argv, "--sp");
  for (int i = 1; i + 1 < argc; i++)
    if (!strcmp(argv[i], "--pad")) { /* --pad N: m->pad_vocab */
      use_pad = atoi(argv[i + 1]);
      memmove(argv + i, argv + i + 2, sizeof *argv * (size_t)(argc - i - 1));
      argc -= 2;
      break;
    }
  for (int i = 1; i + 1 < argc; i++)
    if (!strcmp(argv[i], "--merged")) { /* --merged N: regions sharing an all_reduce */
      use_merged = atoi(argv[i + 1]);
      memmove(argv + i, argv + i + 2, sizeof *argv * (size_t)(argc - i - 1));
      argc -= 2;
      break;
    }
  for (int i = 1; i + 1 < argc; i++)
    if (!strcmp(argv[i], "--ep")) { /* --ep E: expert parallelism, E dividing DP */
      shard_ep = atoi(argv[i + 1]);
      memmove(argv + i, argv + i + 2, sizeof *argv * (size_t)(argc - i - 1));
      argc -= 2;
      break;
    }
  if (argc >= 6 && !strcmp(argv[1], "--error")) {
    IrModule *m = test_load(argv[2], (const char *const *)argv + 6, argc - 6);
    if (!m) return 1;
    char err[512] = "";
    m->mesh_ep = shard_ep;
    int rc = pass_shard(m, atoi(argv[3]), atoi(argv[4]), use_sp, err, sizeof err);
    printf("%s\n", err);
    int ok = rc != 0 && strstr(err, argv[5]) && !strchr(err, '\n');
    printf("%s pass_shard rejects it with '%s'\n", ok ? "ok  " : "FAIL", argv[5]);
    ir_module_free(m);
    return !ok;
  }
  if (argc >= 5 && !strcmp(argv[1], "--ir")) {
    IrModule *m = test_load(argv[2], (const char *const *)argv + 5, argc - 5);
    char err[512] = "";
    if (!m || pass_shard(m, atoi(argv[3]), atoi(argv[4]), use_sp, err, sizeof err)) {
      printf("FAIL: %s\n", err);
      return 1;
    }
    ir_print(stdout, m);
    ir_module_free(m);
    return 0;
  }
  if (argc >= 3 && !strcmp(argv[1], "--twice")) {
    IrModule *m = test_load(argv[2], (const char *const *)argv + 3, argc - 3);
    if (!m) return 1;
    char err[512] = "";
    int ok = pass_shard(m, 1, 2, 0, err, sizeof err) == 0 && pass_shard(m, 1, 2, 0, err, sizeof err);
    printf("%s\n%s a second pass_shard is refused\n", err, ok ? "ok  " : "FAIL");
    ir_module_free(m);
    return !ok;
  }
  if (argc < 5) {
    fprintf(stderr, "usage: shard_models MODEL.dsl TP DP AR [NAME=VALUE ...]\n");
    return 2;
  }
  return run_check(argv[1], atoi(argv[2]), atoi(argv[3]), atoi(argv[4]),
                   (const char *const *)argv + 5, argc - 5);
}
