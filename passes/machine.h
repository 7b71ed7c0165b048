/* passes/machine.h -- the machine a step time is predicted for.
 *
 * A machine is a set of sustained rates one rank achieves, not peaks: the
 * rate parc's own kernels reach on it.  The report (codegen/report.c) and
 * the pipeline simulation (passes/pp_plan.c) predict with them; --machine
 * picks a preset by name or reads a JSON file (codegen/machine_file.c).
 *
 * Index [0] of the per-precision rates is the fp32 trainer, [1] bf16 mixed
 * precision (the train section's precision = bf16): a CPU machine gives both
 * the same rate.  Ranks are numbered tp fastest, then dp, then pp
 * (runtime/rt_comm.h), and fill nodes of ranks_per_node consecutive ranks:
 * a group whose members all lie in one node uses the intra-node link. */
#ifndef PARC_PASSES_MACHINE_H
#define PARC_PASSES_MACHINE_H

#include "ir/ir.h"

typedef struct Machine {
  char name[64];
  double peak_flops[2];      /* dense matmul peak, for the MFU the report states */
  double gemm_flops[2];      /* sustained by GEMMs (matmul, matmul_ta) */
  double attn_flops[2];      /* sustained by the fused attention (sdpa, sdpa_grad) */
  double mem_bytes_per_s;    /* sustained by memory-bound kernels */
  double kernel_s;           /* fixed cost of every kernel or runtime call */
  double parallel_call_s;    /* more for a generated kernel that splits over threads
                                (a CPU pool waking its workers; 0 on a GPU) ... */
  double parallel_min_elements; /* ... when its result has at least this many
                                elements (codegen/host.c grain: 2 tasks of 16K) */
  double intra_bytes_per_s;  /* what one rank sends a second over a ring, within a node */
  double inter_bytes_per_s;  /* the same between nodes */
  double latency_s;          /* fixed cost of every collective or transfer */
  int ranks_per_node;
  double device_bytes;       /* one GPU's memory, as cudaMemGetInfo's total gives it (the
                                report compares a rank's planned bytes with it); 0: unknown
                                (a CPU) */
} Machine;

/* The presets, by name; machine_default is the one without --machine. */
extern const Machine machine_presets[];
extern const int machine_npresets;
extern const Machine *const machine_default;

/* The preset called name, or NULL. */
const Machine *machine_preset(const char *name);

/* The bandwidth a ring over a group of ranks spanning `span` consecutive
 * world ranks runs at (span <= ranks_per_node: within one node). */
double machine_link_bytes_per_s(const Machine *mc, int span);

/* The index of m's precision in the per-precision rates: 1 when its train
 * section says precision = bf16, else 0. */
int machine_bf16(const IrModule *m);

/* 0 if every rate is positive and finite, ranks_per_node >= 1 and
 * device_bytes finite and >= 0, else -1 with the offending field's name in
 * *field. */
int machine_check(const Machine *mc, const char **field);

#endif
