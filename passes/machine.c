/* passes/machine.c -- machine presets (passes/machine.h).
 *
 * h200: measured.  Sustained rates of parc's CUDA trainer on one H200 SXM
 * (bench/RESULTS.md, sixth GPU run, 2026-12-04: the GPT-2 small bf16
 * profile's own fit, which compare.py prints as a --machine line): GEMMs 673
 * TFLOP/s over all of them (670 taken), the mma.sync flash attention 92.0
 * TFLOP/s (forward 109.5, backward 86.5; 92 taken), the generated kernels
 * and memory-bound runtime ops 1.98 TB/s over all of them (1.98 taken),
 * 3.96 us the call of the fastest tenth of the kernels (4 taken).  The fifth
 * run's fit (670 / 90 / 1.75) predicted 24.98 ms against the sixth run's
 * measured 22.9 ms (the first run's rates, 400 / 40 / 3.0, gave 34.7 ms).  The
 * fp32 trainer's rates were not profiled: 75% of the FP32 peak (67 TFLOP/s)
 * for GEMMs, 15 TFLOP/s for attention (estimates).  Peaks: 989 TFLOP/s bf16
 * dense, 67 fp32.  Links: NVLink 4 at 450 GB/s a direction (NCCL reaches
 * ~80% of it: 360), 400 Gb/s InfiniBand a GPU between nodes (50 GB/s, 45
 * taken), 8 GPUs a node, 10 us a collective.  Memory (device_bytes): the
 * total nvidia-smi gives, 143771 MiB (H200 SXM, 141 GB), 81559 MiB (H100
 * SXM 80 GB), 81920 MiB (A100 SXM 80 GB).
 * h100: the H200's compute (same peaks), memory-bound kernels scaled by the
 * HBM bandwidth (3.35 against 4.8 TB/s).  a100: everything scaled from the
 * H200 by the A100 SXM's peaks (312 TFLOP/s bf16, 19.5 fp32, 2.0 TB/s,
 * NVLink 3 at 300 GB/s, 200 Gb/s InfiniBand).  h100 and a100 are scaled,
 * not measured: a JSON file with measured rates (--machine FILE) beats them. */
#include "passes/machine.h"

#include <math.h>
#include <string.h>

const Machine machine_presets[] = {
    {"h200", {67e12, 989e12}, {50e12, 670e12}, {15e12, 92e12}, 1.98e12, 4e-6, 0, 0, 360e9, 45e9,
     10e-6, 8, 143771.0 * (1 << 20)},
    {"h100", {67e12, 989e12}, {50e12, 670e12}, {15e12, 92e12}, 1.38e12, 4e-6, 0, 0, 360e9, 45e9,
     10e-6, 8, 81559.0 * (1 << 20)},
    {"a100", {19.5e12, 312e12}, {14.6e12, 211e12}, {4.4e12, 29.0e12}, 0.825e12, 4e-6, 0, 0, 240e9,
     22e9, 10e-6, 8, 81920.0 * (1 << 20)},
};
const int machine_npresets = (int)(sizeof machine_presets / sizeof machine_presets[0]);
const Machine *const machine_default = &machine_presets[0];

const Machine *machine_preset(const char *name) {
  for (int i = 0; i < machine_npresets; i++)
    if (!strcmp(machine_presets[i].name, name)) return &machine_presets[i];
  return NULL;
}

double machine_link_bytes_per_s(const Machine *mc, int span) {
  return span <= mc->ranks_per_node ? mc->intra_bytes_per_s : mc->inter_bytes_per_s;
}

int machine_bf16(const IrModule *m) {
  const IrSetting *s = ir_setting(m->train, m->ntrain, "precision");
  return s && s->sym && !strcmp(s->sym, "bf16");
}

static int bad(double v) { return !(v > 0) || !isfinite(v); }

int machine_check(const Machine *mc, const char **field) {
  static const char *const name[] = {"peak_flops.fp32", "peak_flops.bf16", "gemm_flops.fp32",
                                     "gemm_flops.bf16", "attention_flops.fp32",
                                     "attention_flops.bf16"};
  const double *rate[] = {&mc->peak_flops[0], &mc->peak_flops[1], &mc->gemm_flops[0],
                          &mc->gemm_flops[1], &mc->attn_flops[0], &mc->attn_flops[1]};
  for (int i = 0; i < 6; i++)
    if (bad(*rate[i])) return *field = name[i], -1;
  if (bad(mc->mem_bytes_per_s)) return *field = "memory_bytes_per_s", -1;
  if (!(mc->kernel_s >= 0) || !isfinite(mc->kernel_s)) return *field = "kernel_s", -1;
  if (!(mc->parallel_call_s >= 0) || !isfinite(mc->parallel_call_s))
    return *field = "parallel_call_s", -1;
  if (!(mc->parallel_min_elements >= 0) || !isfinite(mc->parallel_min_elements))
    return *field = "parallel_min_elements", -1;
  if (bad(mc->intra_bytes_per_s)) return *field = "intra_node_bytes_per_s", -1;
  if (bad(mc->inter_bytes_per_s)) return *field = "inter_node_bytes_per_s", -1;
  if (!(mc->latency_s >= 0) || !isfinite(mc->latency_s)) return *field = "latency_s", -1;
  if (mc->ranks_per_node < 1) return *field = "ranks_per_node", -1;
  if (!(mc->device_bytes >= 0) || !isfinite(mc->device_bytes)) return *field = "device_bytes", -1;
  return 0;
}
