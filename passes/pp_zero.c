/* passes/pp_zero.c -- the buckets in which a pipelined ZeRO-1 trainer
 * reduce-scatters its accumulated gradients (runtime/rt_pipe.c).
 *
 * After the microbatches, stage s's rank holds each of its parameters'
 * gradients whole in its accumulator; under ZeRO-1 (m->mesh_zero > 1) it
 * reduce-scatters them over their group so that it keeps the sum of its piece
 * (z = ir_zero_pieces pieces of ceil(numel / z) floats; dp, or an
 * expert-parallel parameter's ep_dp group).  Rather than one collective per
 * parameter, the parameters go in buckets, each one collective:
 *
 *   walk     the PARAMs with a gradient in node order (the order of the
 *            trainer's pp_grads table), those stage s holds whose group has
 *            more than one rank (z > 1) and that have elements;
 *   bucket   one open bucket per group (dp, ep_dp: buckets never mix groups,
 *            as the optimizer's gather buckets), taking that group's
 *            parameters in walk order while it holds at most cap bytes of
 *            pieces (4 z ceil(numel / z) each, padding counted, as
 *            passes/dp_grads.c and the gather buckets count them), cap =
 *            m->dp_bucket_bytes (--bucket-mb; 0: DP_BUCKET_BYTES_DEFAULT):
 *            a parameter that would take it past cap closes it and opens the
 *            next, so a parameter of cap bytes or more is alone (reduced in
 *            place, no copy) and a bucket of several never exceeds cap;
 *   numbers  0, 1, ... per stage in the order the buckets open
 *            (zero_bucket[s][id]); a bucket's rows are in walk order, maybe
 *            with the other group's between them.
 *
 * Each parameter keeps its place and its piece layout in the accumulator,
 * which the optimizer (flat_shard of p->grad, passes/optimizer.c) and the
 * checkpoints read: the runtime packs a bucket of several parameters rank by
 * rank into a scratch of zero_bucket_max floats, reduce-scatters that, and
 * copies the rank's pieces back.  Sums are elementwise in rank order, so the
 * pieces hold the same bits whatever the buckets. */
#include "passes/passes.h"

void pp_zero_buckets(IrModule *m, PpProgram *pp) {
  int P = pp->nstages, N = m->nnodes;
  pp->zero_bucket = NULL;
  pp->zero_nbuckets = NULL;
  pp->zero_bucket_max = 0;
  if (m->mesh_zero <= 1) return;
  int64_t cap = m->dp_bucket_bytes > 0 ? m->dp_bucket_bytes : DP_BUCKET_BYTES_DEFAULT;
  pp->zero_bucket = arena_alloc(&m->arena, sizeof(int *) * (size_t)P);
  pp->zero_nbuckets = arena_alloc(&m->arena, sizeof(int) * (size_t)P);
  for (int s = 0; s < P; s++) {
    int *b = pp->zero_bucket[s] = arena_alloc(&m->arena, sizeof(int) * ((size_t)N + 1));
    int nb = 0, open[2] = {-1, -1}, members[2] = {0, 0}; /* per group: dp, ep_dp */
    int64_t bytes[2] = {0, 0}, floats[2] = {0, 0};
    for (int i = 0; i <= N; i++) {
      const IrNode *p = i < N ? m->nodes[i] : NULL;
      int z = p ? ir_zero_pieces(m, p) : 0, g = p && ep_sharded(p);
      if (p) b[i] = -1;
      if (p && (p->op != IR_OP_PARAM || !p->grad || pp->stage_offset[s][i] < 0 || z <= 1 ||
                ir_numel(p) <= 0))
        continue;
      int64_t need = p ? 4 * ir_zero_piece_numel(m, p) * z : 0;
      for (int k = 0; k < 2; k++) { /* close: at the end, or g's when p would overfill it */
        if (p && (k != g || open[k] < 0 || bytes[k] + need <= cap)) continue;
        if (members[k] > 1 && floats[k] > pp->zero_bucket_max) pp->zero_bucket_max = floats[k];
        open[k] = -1, members[k] = 0, bytes[k] = floats[k] = 0;
      }
      if (!p) break;
      if (open[g] < 0) open[g] = nb++;
      b[i] = open[g];
      members[g]++, bytes[g] += need, floats[g] += ir_numel(p);
    }
    pp->zero_nbuckets[s] = nb;
  }
}
