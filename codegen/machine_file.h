/* codegen/machine_file.h -- --machine: a preset's name or a JSON file.
 *
 * The file is one object; every field is the same-named Machine rate
 * (passes/machine.h), a per-precision one either a number (both
 * precisions) or {"fp32": x, "bf16": y} (one of them alone changes that
 * precision only):
 *   {"name": "my-cluster", "base": "h100",
 *    "gemm_flops": {"fp32": 45e12, "bf16": 520e12}, "inter_node_bytes_per_s": 90e9}
 * "base" names a preset the file starts from (then any field may be left
 * out); without it every field is required: peak_flops, gemm_flops,
 * attention_flops, memory_bytes_per_s, kernel_s, intra_node_bytes_per_s,
 * inter_node_bytes_per_s, latency_s, ranks_per_node (parallel_call_s and
 * parallel_min_elements are optional, 0 when left out).  Unknown fields are
 * errors (a misspelt one would otherwise be silently ignored). */
#ifndef PARC_CG_MACHINE_FILE_H
#define PARC_CG_MACHINE_FILE_H

#include <stddef.h>

#include "passes/machine.h"

/* Fills *out from arg (a preset's name, else a JSON file's path).  0, or -1
 * with a one-line reason in err. */
int machine_resolve(const char *arg, Machine *out, char *err, size_t len);

#endif
