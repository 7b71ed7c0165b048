/* codegen/project.c -- plan the kernels and buffers, then write the files. */
#include "codegen/project.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/arena_plan.h"
#include "codegen/cg_kernels.h"
#include "codegen/cuda_arena.h"
#include "codegen/cuda_batch.h"
#include "codegen/cuda_store.h"
#include "codegen/host.h"
#include "codegen/host_cuda.h"
#include "codegen/kir_cuda.h"
#include "codegen/kir_llvm.h"
#include "codegen/report.h"
#include "codegen/step_model.h"
#include "passes/bufplan.h"
#include "passes/machine.h"

#ifndef PARC_SOURCE_DIR
#define PARC_SOURCE_DIR ""
#endif
#ifndef PARC_BINARY_DIR
#define PARC_BINARY_DIR ""
#endif
#ifndef PARC_SANITIZE_FLAGS
#define PARC_SANITIZE_FLAGS ""
#endif

static int failf(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int failf(char *err, size_t len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, len, fmt, ap);
  va_end(ap);
  return -1;
}

static FILE *create(const char *dir, const char *name, char *path, size_t plen, char *err,
                    size_t len) {
  snprintf(path, plen, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  if (!f) failf(err, len, "cannot write '%s': %s", path, strerror(errno));
  return f;
}

static int finish(FILE *f, const char *path, char *err, size_t len) {
  int bad = ferror(f);
  if (fclose(f) || bad) return failf(err, len, "cannot write '%s'", path);
  return 0;
}

static int target_cpu(const CgProject *p) { return !p->targets || (p->targets & CG_TARGET_CPU); }

/* The CUDA part of the generated CMakeLists.txt: off unless -DPARC_CUDA=ON,
 * so machines without CUDA are unaffected; nvcc warnings are errors and the
 * compile goes through nvcc_report.cmake, which keeps ptxas -v's report. */
static void cmake_cuda(FILE *f, const CgProject *p) {
  fprintf(f,
          "\n# ---- CUDA kernels: kernels.cu -> static library parc_kernels_cuda ----\n"
          "# -DPARC_CUDA=ON builds it with nvcc for PARC_CUDA_ARCHITECTURES, warnings as\n"
          "# errors; ptxas's registers/spills report goes to build/ptxas_report.txt.\n"
          "option(PARC_CUDA \"Build kernels.cu into parc_kernels_cuda\" %s)\n"
          "set(PARC_CUDA_ARCHITECTURES \"%s\" CACHE STRING \"GPU architectures for kernels.cu\")\n"
          "if(PARC_CUDA)\n"
          "  include(CheckLanguage)\n"
          "  check_language(CUDA)\n"
          "endif()\n"
          "if(PARC_CUDA AND CMAKE_CUDA_COMPILER)\n"
          "  set(CMAKE_CUDA_ARCHITECTURES \"${PARC_CUDA_ARCHITECTURES}\")\n"
          "  enable_language(CUDA)\n"
          "  find_package(CUDAToolkit REQUIRED)\n"
          "  add_library(parc_kernels_cuda STATIC kernels.cu)\n"
          "  set_target_properties(parc_kernels_cuda PROPERTIES CUDA_STANDARD 17\n"
          "    CUDA_STANDARD_REQUIRED ON CUDA_ARCHITECTURES \"${PARC_CUDA_ARCHITECTURES}\"\n"
          "    POSITION_INDEPENDENT_CODE ON\n"
          "    CUDA_COMPILER_LAUNCHER \"${CMAKE_COMMAND};-DREPORT=${CMAKE_BINARY_DIR}/ptxas_report.txt;"
          "-P;${CMAKE_CURRENT_SOURCE_DIR}/nvcc_report.cmake;--\")\n"
          "  target_compile_options(parc_kernels_cuda PRIVATE --Werror=all-warnings --ptxas-options=-v)\n"
          "  target_include_directories(parc_kernels_cuda PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})\n"
          "  target_link_libraries(parc_kernels_cuda PUBLIC CUDA::cudart)\n"
          "  # the GPU trainer (codegen/host_cuda.h), against parc's libparcrt_cuda\n"
          "  if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/train_cuda.c)\n"
          "    include(${PARC_BUILD_DIR}/runtime/cuda/parcrt_cuda.cmake OPTIONAL\n"
          "            RESULT_VARIABLE PARC_RT_CUDA_FOUND)\n"
          "    if(NOT PARC_RT_CUDA_FOUND OR NOT EXISTS \"${PARC_RT_CUDA_LIB}\")\n"
          "      message(FATAL_ERROR \"libparcrt_cuda is not built in ${PARC_BUILD_DIR}: build parc \"\n"
          "                          \"where the CUDA toolkit is found\")\n"
          "    endif()\n"
          "    add_executable(train_cuda train_cuda.c)\n"
          "    set_target_properties(train_cuda PROPERTIES C_STANDARD 11 C_STANDARD_REQUIRED ON\n"
          "                          RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})\n"
          "    target_include_directories(train_cuda PRIVATE ${CMAKE_CURRENT_SOURCE_DIR} ${PARC_SOURCE_DIR})\n"
          "    target_compile_options(train_cuda PRIVATE -Wall -Wextra $<$<BOOL:${TRAIN_WERROR}>:-Werror>)\n"
          "    target_link_libraries(train_cuda PRIVATE parc_kernels_cuda ${PARC_RT_CUDA_LIB} ${PARC_RT}\n"
          "                          CUDA::cublasLt CUDA::cudart ${PARC_RT_CUDA_NCCL} ${OPENBLAS_LIB}\n"
          "                          ${CJSON_LIB} Threads::Threads stdc++ m)\n"
          "    if(MPI_C_FOUND)\n"
          "      target_link_libraries(train_cuda PRIVATE MPI::MPI_C)\n"
          "    endif()\n"
          "%s"
          "  endif()\n"
          "elseif(PARC_CUDA)\n"
          "  message(WARNING \"PARC_CUDA is ON but no CUDA compiler was found: \"\n"
          "                  \"parc_kernels_cuda is not built\")\n"
          "endif()\n",
          target_cpu(p) ? "OFF" : "ON", p->cuda_arch ? p->cuda_arch : "80;90",
          PARC_SANITIZE_FLAGS[0] ? "    target_link_options(train_cuda PRIVATE "
                                   PARC_SANITIZE_FLAGS ")\n" : "");
}

/* The compiler launcher of kernels.cu: runs the command after "--" and
 * saves what it printed on stderr (ptxas -v) in REPORT. */
static int write_nvcc_report(const CgProject *p, char *err, size_t len) {
  char path[4096];
  FILE *f = create(p->dir, "nvcc_report.cmake", path, sizeof path, err, len);
  if (!f) return -1;
  fputs("# Generated by parc; do not edit.  cmake -DREPORT=FILE -P nvcc_report.cmake -- CMD...\n"
        "# runs CMD (the nvcc compile of kernels.cu) and saves its stderr, the ptxas -v\n"
        "# register/spill report, to FILE; fails, printing it, when CMD fails.\n"
        "set(cmd)\n"
        "set(seen 0)\n"
        "math(EXPR last \"${CMAKE_ARGC} - 1\")\n"
        "foreach(i RANGE ${last})\n"
        "  if(seen)\n"
        "    list(APPEND cmd \"${CMAKE_ARGV${i}}\")\n"
        "  elseif(\"${CMAKE_ARGV${i}}\" STREQUAL \"--\")\n"
        "    set(seen 1)\n"
        "  endif()\n"
        "endforeach()\n"
        "execute_process(COMMAND ${cmd} RESULT_VARIABLE rc ERROR_VARIABLE log)\n"
        "file(WRITE \"${REPORT}\" \"${log}\")\n"
        "if(NOT rc EQUAL 0)\n"
        "  message(FATAL_ERROR \"${log}\")\n"
        "endif()\n",
        f);
  return finish(f, path, err, len);
}

/* train_cuda.c (codegen/host_cuda.h) beside train.c.  A module the GPU
 * trainer cannot run yet (an op without a GPU routine) gets none, with a
 * note: the CPU trainer is still written. */
static int write_host_cuda(const CgProject *p, IrModule *m, const CgKernelPlan *kp,
                           const BufPlan *bp, const CgLeafPlan *lp, const CgHostInfo *info,
                           char *err, size_t len) {
  char path[4096], why[512];
  FILE *f = create(p->dir, "train_cuda.c", path, sizeof path, err, len);
  if (!f) return -1;
  if (cg_emit_host_cuda(f, m, kp, bp, lp, info, why, sizeof why)) {
    fclose(f);
    remove(path);
    fprintf(stderr, "parc: note: no GPU trainer (train_cuda): %s\n", why);
    return 0;
  }
  return finish(f, path, err, len);
}

/* CMake project that builds `train` from the generated sources. */
static int write_cmake(const CgProject *p, const IrModule *m, char *err, size_t len) {
  char path[4096];
  FILE *f = create(p->dir, "CMakeLists.txt", path, sizeof path, err, len);
  if (!f) return -1;
  if (!target_cpu(p)) {  /* --target cuda: the kernels library only */
    fprintf(f,
            "# Generated by parc %s for model %s; do not edit.\n"
            "#   cmake -S . -B build -DPARC_CUDA=ON && cmake --build build\n"
            "cmake_minimum_required(VERSION 3.20)\n"
            "project(parc_cuda_%s LANGUAGES C)\n",
            p->version, m->name, m->name);
    cmake_cuda(f, p);
    return finish(f, path, err, len);
  }
  fprintf(f,
          "# Generated by parc %s for model %s; do not edit.\n"
          "#   cmake -S . -B build && cmake --build build   ->   build/train --help\n"
          "cmake_minimum_required(VERSION 3.20)\n"
          "project(parc_train_%s C)\n\n"
          "set(PARC_SOURCE_DIR \"%s\" CACHE PATH \"parc's source tree (runtime headers)\")\n"
          "set(PARC_BUILD_DIR \"%s\" CACHE PATH \"parc's build tree (libparcrt)\")\n"
          "option(TRAIN_WERROR \"Treat warnings as errors\" OFF)\n\n"
          "find_library(PARC_RT parcrt PATHS ${PARC_BUILD_DIR}/runtime NO_DEFAULT_PATH)\n"
          "if(NOT PARC_RT)\n"
          "  message(FATAL_ERROR \"libparcrt not found in ${PARC_BUILD_DIR}/runtime: build parc \"\n"
          "                      \"first, or set -DPARC_BUILD_DIR=...\")\n"
          "endif()\n"
          "find_library(OPENBLAS_LIB openblas REQUIRED)\n"
          "find_library(CJSON_LIB cjson REQUIRED)\n"
          "find_package(Threads REQUIRED)\n\n"
          "add_executable(train train.c kernels_cpu.o)\n"
          "set_source_files_properties(kernels_cpu.o PROPERTIES EXTERNAL_OBJECT TRUE)\n"
          "set_target_properties(train PROPERTIES C_STANDARD 11 C_STANDARD_REQUIRED ON\n"
          "                      RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})\n"
          "if(NOT CMAKE_BUILD_TYPE)\n  set(CMAKE_BUILD_TYPE Release)\nendif()\n"
          "target_include_directories(train PRIVATE ${CMAKE_CURRENT_SOURCE_DIR} ${PARC_SOURCE_DIR})\n"
          "target_compile_options(train PRIVATE -Wall -Wextra $<$<BOOL:${TRAIN_WERROR}>:-Werror>)\n",
          p->version, m->name, m->name, PARC_SOURCE_DIR, PARC_BINARY_DIR);
  if (PARC_SANITIZE_FLAGS[0])
    fprintf(f, "# libparcrt was built with sanitizers: the trainer links their runtimes\n"
               "target_compile_options(train PRIVATE %s)\ntarget_link_options(train PRIVATE %s)\n",
            PARC_SANITIZE_FLAGS, PARC_SANITIZE_FLAGS);
  fprintf(f, "target_link_libraries(train PRIVATE ${PARC_RT} ${OPENBLAS_LIB} ${CJSON_LIB}\n"
             "                      Threads::Threads m)\n"
             "# libparcrt's communicators use MPI when parc was built with it\n"
             "find_package(MPI COMPONENTS C QUIET)\n"
             "if(MPI_C_FOUND)\n  target_link_libraries(train PRIVATE MPI::MPI_C)\nendif()\n");
  if (p->targets & CG_TARGET_CUDA) cmake_cuda(f, p);
  return finish(f, path, err, len);
}

static cJSON *shape_json(const IrNode *n) {
  cJSON *a = cJSON_CreateArray();
  for (int d = 0; d < n->rank; d++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)n->shape[d]));
  return a;
}

/* plan.json's "moe": per MoE layer, one rank's dispatch buffer against the
 * dropless worst case and its expert all-to-alls a step (codegen/report.h). */
static void moe_json(cJSON *root, const IrModule *m, const CgProject *p) {
  int M = p->pipe ? p->pipe->microbatches : 1, whole = !p->pipe;
  cJSON *a = cJSON_AddArrayToObject(root, "moe"); /* empty without MoE layers */
  int n = cg_moe_layers(m, p->layout, M, whole, NULL, 0);
  CgMoeLayer *v = n ? calloc((size_t)n, sizeof *v) : NULL;
  if (!v) return;
  cg_moe_layers(m, p->layout, M, whole, v, n);
  for (int i = 0; i < n; i++) {
    const CgMoeLayer *l = &v[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "layer", l->layer);
    cJSON_AddNumberToObject(o, "experts", (double)l->experts);
    cJSON_AddNumberToObject(o, "top_k", (double)l->top_k);
    cJSON_AddNumberToObject(o, "d_model", (double)l->d_model);
    cJSON_AddNumberToObject(o, "microbatches", l->microbatches);
    cJSON_AddNumberToObject(o, "batch_tokens", (double)l->batch_tokens);
    cJSON_AddNumberToObject(o, "tokens_per_rank", (double)l->tokens);
    cJSON_AddBoolToObject(o, "dropless", l->dropless);
    cJSON_AddNumberToObject(o, "capacity", (double)l->capacity);
    cJSON_AddNumberToObject(o, "capacity_per_rank", (double)l->rank_capacity);
    cJSON_AddNumberToObject(o, "dispatch_bytes_per_rank", l->dispatch_bytes);
    cJSON_AddNumberToObject(o, "dropless_bytes_per_rank", l->dropless_bytes);
    cJSON_AddNumberToObject(o, "ep", l->ep);
    cJSON_AddNumberToObject(o, "all_to_all_count", l->a2a_count);
    cJSON_AddNumberToObject(o, "all_to_all_payload_bytes", l->a2a_payload_bytes);
    cJSON_AddNumberToObject(o, "all_to_all_sent_bytes_per_rank", l->a2a_sent_bytes);
    cJSON_AddItemToArray(a, o);
  }
  free(v);
}

static const char *const comm_group[COMM_GROUPS] = {"tp", "dp", "ep", "ep_dp", "pp"};

/* The GPU trainer's collectives where they differ from "communication"'s
 * (passes.h CommGpu), an entry a group. */
static void gpu_comm_json(cJSON *arr, const CommGpu *d, int stage) {
  for (int g = 0; g < COMM_GROUPS; g++) {
    if (!d->sums[g] && !d->gathers[g] && !d->sends[g] && !d->fused[g]) continue;
    cJSON *o = cJSON_CreateObject();
    if (stage >= 0) cJSON_AddNumberToObject(o, "stage", stage);
    cJSON_AddStringToObject(o, "group", comm_group[g]);
    cJSON_AddNumberToObject(o, "all_reduces_stored_bf16", d->sums[g]);
    cJSON_AddNumberToObject(o, "all_gathers_bf16", d->gathers[g]);
    cJSON_AddNumberToObject(o, "sends_bf16", d->sends[g]);
    cJSON_AddNumberToObject(o, "loss_gathers_fused", d->fused[g]);
    cJSON_AddNumberToObject(o, "extra_collectives", d->sums[g] - d->fused[g]);
    cJSON_AddNumberToObject(o, "saved_bytes_per_rank", d->saved_bytes[g]);
    cJSON_AddItemToArray(arr, o);
  }
}

/* plan.json's "communication": one entry per group and kind one rank runs a
 * step (stage >= 0: a rank of that pipeline stage, with "stage"). */
static void comm_json(cJSON *comm, const CommCost *c, int stage) {
  static const char *const kind[COMM_KINDS] = {"all_reduce", "all_gather", "reduce_scatter",
                                               "send", "recv"};
  for (int g = 0; g < COMM_GROUPS; g++)
    for (int k = 0; k < COMM_KINDS; k++) {
      const CommEntry *e = &c->e[g][k];
      if (!e->count) continue;
      cJSON *o = cJSON_CreateObject();
      if (stage >= 0) cJSON_AddNumberToObject(o, "stage", stage);
      cJSON_AddStringToObject(o, "group", comm_group[g]);
      cJSON_AddNumberToObject(o, "ranks", c->group_size[g]);
      cJSON_AddStringToObject(o, "kind", kind[k]);
      cJSON_AddNumberToObject(o, "count", e->count);
      cJSON_AddNumberToObject(o, "payload_bytes", e->payload_bytes);
      cJSON_AddNumberToObject(o, "sent_bytes_per_rank", e->sent_bytes);
      cJSON_AddItemToArray(comm, o);
    }
  if (c->a2a_count) {
    /* expert parallelism: only filled slots travel, so the bytes are at most */
    cJSON *o = cJSON_CreateObject();
    if (stage >= 0) cJSON_AddNumberToObject(o, "stage", stage);
    cJSON_AddStringToObject(o, "group", "ep");
    cJSON_AddNumberToObject(o, "ranks", c->a2a_group);
    cJSON_AddStringToObject(o, "kind", "all_to_all");
    cJSON_AddNumberToObject(o, "count", c->a2a_count);
    cJSON_AddNumberToObject(o, "payload_bytes", c->a2a_payload_bytes);
    cJSON_AddNumberToObject(o, "sent_bytes_per_rank", c->a2a_sent_bytes);
    cJSON_AddBoolToObject(o, "upper_bound", 1);
    cJSON_AddItemToArray(comm, o);
  }
}

/* plan.json: what the compiler decided, for tools and for people. */
static int write_plan(const CgProject *p, const IrModule *m, int64_t apart_bytes,
                      const GpuBytes *gpu, const CgKernelPlan *kp, const int *canon,
                      const BufPlan *bp, const CgLeafPlan *lp, const CgCudaBatches *batches,
                      char *err, size_t len) {
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "parc", p->version);
  cJSON_AddStringToObject(root, "model", m->name);
  cJSON_AddStringToObject(root, "source", p->source);
  cJSON *lay = cJSON_AddObjectToObject(root, "layout");
  cJSON_AddNumberToObject(lay, "tp", p->layout->tp);
  cJSON_AddNumberToObject(lay, "pp", p->layout->pp);
  cJSON_AddNumberToObject(lay, "dp", p->layout->dp);
  cJSON_AddNumberToObject(lay, "ep", p->layout->ep);
  const PpPlan *pipe = p->cost->pipe;
  if (pipe) { /* --pp above 1: the layers of each chunk (chunk c on stage c % pp) */
    cJSON_AddStringToObject(lay, "schedule", pp_schedule_name[pipe->req.schedule]);
    cJSON_AddNumberToObject(lay, "microbatches", pipe->st.microbatches);
    cJSON *cl = cJSON_AddArrayToObject(lay, "chunk_layers");
    for (int c = 0; c < pipe->st.nchunks; c++)
      cJSON_AddItemToArray(cl, cJSON_CreateNumber(pipe->st.chunk_layers[c]));
    cJSON_AddStringToObject(lay, "chunk_layers_by", pipe->req.memory ? "memory"
                                                   : pipe->req.stage_layers ? "given"
                                                                            : "time");
  }
  cJSON *cost = cJSON_AddObjectToObject(root, "cost");
  cJSON_AddNumberToObject(cost, "parameters", (double)p->cost->params);
  if (p->cost->padding_params) { /* --pad-vocab and tp: the tables' rows, true and padded */
    cJSON_AddNumberToObject(cost, "vocab", (double)p->cost->vocab);
    cJSON_AddNumberToObject(cost, "padded_vocab", (double)p->cost->padded_vocab);
  }
  cJSON_AddNumberToObject(cost, "tokens_per_step", (double)p->cost->tokens);
  cJSON_AddNumberToObject(cost, "flops_per_step", 3 * p->cost->flops_fwd);
  cJSON_AddNumberToObject(cost, "params_numel", (double)lp->params_numel);
  cJSON_AddNumberToObject(cost, "state_numel", (double)lp->state_numel);
  /* what train.c allocates (ARENA_BYTES); a trainer of stage programs: its
   * stages' slots of one plan (arena_stage_slot_bytes, the largest
   * arena_slot_bytes; the live peak and apart figures follow) and the
   * gradient accumulators (cg_pipe_arena_bytes) */
  if (!p->pipe) cJSON_AddNumberToObject(cost, "arena_bytes", (double)cg_arena_bytes(kp, bp, NULL));
  if (p->pipe) {
    int64_t slot[PP_MAX_STAGES], most = 0;
    cg_pipe_slot_bytes(m, p->pipe, kp, bp, slot, NULL);
    cJSON_AddNumberToObject(cost, "arena_bytes", (double)cg_pipe_arena_bytes(p->pipe, slot, -1));
    cJSON_AddNumberToObject(cost, "arena_slots", p->pipe->slots); /* the most on a stage */
    cJSON *ss = cJSON_AddArrayToObject(cost, "arena_stage_slots");
    cJSON *sl = cJSON_AddArrayToObject(cost, "arena_stage_slot_bytes");
    cJSON *sb = cJSON_AddArrayToObject(cost, "arena_stage_bytes");
    for (int s = 0; s < p->pipe->nstages; s++) {
      cJSON_AddItemToArray(ss, cJSON_CreateNumber(p->pipe->stage_slots[s]));
      cJSON_AddItemToArray(sl, cJSON_CreateNumber((double)slot[s]));
      cJSON_AddItemToArray(sb, cJSON_CreateNumber((double)cg_pipe_arena_bytes(p->pipe, slot, s)));
      if (slot[s] > most) most = slot[s];
    }
    cJSON_AddNumberToObject(cost, "arena_slot_bytes", (double)most);
  }
  cJSON_AddNumberToObject(cost, "arena_live_peak_bytes", (double)bp->live_peak);
  /* the same plan with every buffer its own (passes/bufplan.h, In place) */
  cJSON_AddNumberToObject(cost, "arena_bytes_apart", (double)apart_bytes);
  /* the GPU trainer's arena, where it stores values as bf16 (codegen/cuda_arena.h),
   * and what it plans on the device (passes.h GpuBytes) */
  if (gpu->arena) cJSON_AddNumberToObject(cost, "gpu_arena_bytes", (double)gpu->arena);
  if (gpu->device) cJSON_AddNumberToObject(cost, "gpu_device_bytes", (double)gpu->device);
  if (gpu->nstages) { /* stage programs: a rank of each stage (gpu_device_bytes: the largest) */
    cJSON *st = cJSON_AddArrayToObject(cost, "gpu_device_bytes_per_stage");
    for (int s = 0; s < gpu->nstages; s++)
      cJSON_AddItemToArray(st, cJSON_CreateNumber((double)gpu->stage_device[s]));
  }
  /* updates their kernels store into the leaf (no buffer, no copy; cg_kernels.h)
   * and those copied into it at the end of the step */
  int inplace = 0;
  for (int i = 0; i < m->nupdates; i++)
    inplace += kp->inplace_of[m->updates[i].value->id] == m->updates[i].leaf->id;
  cJSON *upd = cJSON_AddObjectToObject(root, "updates");
  cJSON_AddNumberToObject(upd, "in_place", inplace);
  cJSON_AddNumberToObject(upd, "copied", m->nupdates - inplace);
  cJSON *comm = cJSON_AddArrayToObject(root, "communication");
  if (p->cost->has_comm && p->cost->stage_comm)
    for (int st = 0; st < p->cost->nstage_comm; st++)
      comm_json(comm, &p->cost->stage_comm[st], st);
  else if (p->cost->has_comm)
    comm_json(comm, &p->cost->comm, -1);
  /* where the GPU trainer's differ (bf16 sums: the report's "GPU trainer (bf16)" lines) */
  cJSON *gcomm = cJSON_AddArrayToObject(root, "gpu_communication");
  const PpPlan *pl = p->cost->pipe ? p->cost->pipe : p->cost->accum;
  if (pl && pl->kernel_timed)
    for (int st = 0; p->cost->has_comm && st < pl->st.nstages && st < PP_MAX_STAGES; st++)
      gpu_comm_json(gcomm, &pl->stage_comm[st], p->cost->stage_comm ? st : -1);
  else if (p->cost->has_comm && p->step_out && p->step_out->valid)
    gpu_comm_json(gcomm, &p->step_out->comm, -1);
  moe_json(root, m, p);
  if ((p->step_out && p->step_out->valid) || (p->cost->pipe && p->cost->pipe->kernel_timed) ||
      p->cost->accum) {
    Cost c = *p->cost; /* the report's predicted step time */
    if (p->step_out) c.step = *p->step_out;
    CgPredicted pr;
    cg_predict_step(p->layout, &c, &pr);
    cJSON *ps = cJSON_AddObjectToObject(root, "predicted_step");
    cJSON_AddStringToObject(ps, "machine", c.machine ? c.machine->name : machine_default->name);
    cJSON_AddStringToObject(ps, "precision", c.bf16 ? "bf16" : "fp32");
    cJSON_AddNumberToObject(ps, "seconds", pr.total_s);
    cJSON_AddNumberToObject(ps, "compute_s", pr.compute_s);
    if (c.pipe || c.accum) { /* the simulated schedule (or accumulation), then the optimizer */
      cJSON_AddNumberToObject(ps, "pipeline_s", pr.pipeline_s);
      cJSON_AddNumberToObject(ps, "optimizer_s", pr.opt_s);
    } else {
      cJSON_AddNumberToObject(ps, "gemm_s", c.step.gemm_s);
      cJSON_AddNumberToObject(ps, "attention_s", c.step.attn_s);
      cJSON_AddNumberToObject(ps, "memory_bound_s", c.step.mem_s);
      cJSON_AddNumberToObject(ps, "calls", c.step.calls);
    }
    cJSON_AddNumberToObject(ps, "communication_s", pr.comm_s);
    cJSON_AddNumberToObject(ps, "hidden_s", pr.hidden_s);
    cJSON_AddNumberToObject(ps, "mfu", pr.mfu);
  }
  /* dp bucket collectives started in the backward pass and waited for after it
   * (they overlap the rest of it); 0 with --no-overlap or without dp buckets */
  int *async = p->pipe ? NULL : cg_async_waits(m, kp), nasync = 0;
  for (int i = 0; async && i < m->nnodes; i++) nasync += async[i] >= 0;
  free(async);
  cJSON_AddNumberToObject(root, "dp_overlapped_collectives", nasync);
  cJSON *params = cJSON_AddArrayToObject(root, "params");
  cJSON *state = cJSON_AddArrayToObject(root, "state");
  cJSON *bufs = cJSON_AddArrayToObject(root, "buffers");
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *n = m->nodes[i];
    cJSON *o = cJSON_CreateObject();
    if (n->op == IR_OP_PARAM || n->op == IR_OP_STATE) {
      cJSON_AddStringToObject(o, "name", n->name);
      cJSON_AddItemToObject(o, "shape", shape_json(n));
      cJSON_AddNumberToObject(o, "offset", (double)lp->offset[i]);
      if (n->op == IR_OP_PARAM) {
        cJSON_AddStringToObject(o, "init", ir_init_name[n->init]);
        if (n->init == IR_INIT_NORMAL) cJSON_AddNumberToObject(o, "std", n->init_std);
        cJSON_AddStringToObject(o, "shard", ir_shard_name[n->shard]);
        if (n->shard_dim >= 0) cJSON_AddNumberToObject(o, "shard_dim", n->shard_dim);
        if (n->shard_degree > 1) cJSON_AddNumberToObject(o, "shard_degree", n->shard_degree);
        if (n->ep_degree > 1) cJSON_AddNumberToObject(o, "ep_degree", n->ep_degree);
        if (n->shard_degree > 1 || n->ep_degree > 1 || ir_param_padded(n)) { /* the file's (true) shape */
          cJSON *g = cJSON_CreateArray();
          for (int d = 0; d < n->rank; d++)
            cJSON_AddItemToArray(g, cJSON_CreateNumber((double)n->global_shape[d]));
          cJSON_AddItemToObject(o, "global_shape", g);
        }
      }
      cJSON_AddItemToArray(n->op == IR_OP_PARAM ? params : state, o);
    } else if (bp->offset[i] >= 0) {
      cJSON_AddNumberToObject(o, "node", i);
      cJSON_AddStringToObject(o, "op", ir_op_info[n->op].name);
      cJSON_AddStringToObject(o, "phase", ir_phase_name[n->phase]);
      cJSON_AddItemToObject(o, "shape", shape_json(n));
      cJSON_AddNumberToObject(o, "offset", (double)bp->offset[i]);
      cJSON_AddNumberToObject(o, "bytes", (double)bp->size[i]);
      cJSON_AddNumberToObject(o, "last_use", bp->last_use[i]);
      /* In place (passes/bufplan.h): written over that input's bytes */
      if (bp->alias[i] >= 0) cJSON_AddNumberToObject(o, "written_over", bp->alias[i]);
      cJSON_AddItemToArray(bufs, o);
    } else {
      cJSON_Delete(o);
    }
  }
  cJSON *ks = cJSON_AddArrayToObject(root, "kernels");
  for (int i = 0; i < kp->nkernels; i++) {
    const CgKernel *k = &kp->kernels[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", k->k->name);
    if (canon[i] != i) cJSON_AddStringToObject(o, "code", kp->kernels[canon[i]].k->name);
    cJSON_AddNumberToObject(o, "rows", (double)kir_kernel_rows(k->k));
    /* a reshape written over its input (passes/bufplan.h): no host runs it */
    if (cg_kernel_is_view(kp, bp, i)) cJSON_AddTrueToObject(o, "view");
    /* the GPU trainer's batched launches (codegen/cuda_batch.h): a batch's
     * size at its first member, the first member's index at the others */
    if (batches->count[i] > 1) cJSON_AddNumberToObject(o, "gpu_batch", batches->count[i]);
    if (batches->lead[i] >= 0 && batches->lead[i] != i)
      cJSON_AddNumberToObject(o, "gpu_batch_of", batches->lead[i]);
    /* a bias sum, bias add, GELU or GELU gradient the GPU trainer computes with
     * this GEMM node's call (cuda_batch.h), and which */
    if (batches->in_gemm[i] >= 0) {
      static const char *const epi[] = {"none", "bias_grad", "bias", "gelu", "gelu_grad"};
      cJSON_AddNumberToObject(o, "gpu_in_gemm", batches->in_gemm[i]);
      cJSON_AddStringToObject(o, "gpu_epilogue", epi[batches->epi[i]]);
    }
    cJSON *nodes = cJSON_AddArrayToObject(o, "nodes");
    for (int j = 0; j < k->nnodes; j++) cJSON_AddItemToArray(nodes, cJSON_CreateNumber(k->nodes[j]));
    cJSON_AddItemToArray(ks, o);
  }
  char *text = cJSON_Print(root);
  cJSON_Delete(root);
  if (!text) return failf(err, len, "out of memory writing plan.json");
  char path[4096];
  FILE *f = create(p->dir, "plan.json", path, sizeof path, err, len);
  if (f) fprintf(f, "%s\n", text);
  free(text);
  return f ? finish(f, path, err, len) : -1;
}

int cg_write_project(IrModule *m, const CgProject *p, int64_t *arena_bytes, char *err,
                     size_t len) {
  CgStepPlan sp;
  if (cg_plan_whole_step(m, p->fuse, p->pipe, machine_bf16(m), p->bf16_store, p->batch, &sp, err,
                         len))
    return -1;
  const CgKernelPlan *kp = &sp.kp;
  BufPlan apart; /* for plan.json: the arena were no buffer written over another */
  bufplan_build_apart(m, kp->materialize, cg_results(m), sp.pos, sp.held, &sp.bp.arenas,
                      &apart);
  *arena_bytes = cg_trainer_arena_bytes(m, p->pipe, kp, &sp.bp);
  char path[4096], ll[4096];
  int rc = -1;
  FILE *f = target_cpu(p) ? create(p->dir, "train.c", path, sizeof path, err, len) : NULL;
  if (target_cpu(p) && !f) goto out;
  KirModule code = *kp->km; /* a view: the distinct kernels only, not owned */
  code.kernels = arena_alloc(&m->arena, sizeof(KirKernel *) * (size_t)(kp->nkernels + 1));
  code.nkernels = 0;
  for (int i = 0; i < kp->nkernels; i++)
    if (sp.canon[i] == i) code.kernels[code.nkernels++] = kp->kernels[i].k;
  GpuBytes dev;
  cg_gpu_bytes(m, kp, &sp.gbp, &sp.lp, &sp.store, machine_bf16(m), p->pipe, &dev);
  if (p->gpu_out) *p->gpu_out = dev;
  CgHostInfo info = {p->source, p->version, 3 * p->cost->flops_fwd, sp.canon, p->pipe, NULL,
                     &sp.store, &sp.batches};
  if (p->targets & CG_TARGET_CUDA) {  /* path still names train.c (finish) */
    KirModule gpu = *kp->km;
    gpu.kernels = arena_alloc(&m->arena, sizeof(KirKernel *) * (size_t)(kp->nkernels + 1));
    gpu.nkernels = 0;
    unsigned char *multi = arena_alloc(&m->arena, (size_t)kp->nkernels + 1);
    for (int i = 0; i < kp->nkernels; i++)
      if (sp.store.canon[i] == i) {
        multi[gpu.nkernels] = sp.batches.multi[i];
        gpu.kernels[gpu.nkernels++] = sp.store.code[i];
      }
    char cu[4096], cuh[4096];
    snprintf(cu, sizeof cu, "%s/kernels.cu", p->dir);
    snprintf(cuh, sizeof cuh, "%s/kernels_cuda.h", p->dir);
    if (kir_cuda_write_multi(&gpu, multi, cu, cuh, err, len) || write_nvcc_report(p, err, len)) {
      if (f) fclose(f);
      goto out;
    }
  }
  if (!f) goto cuda_only;
  if (p->targets & CG_TARGET_CUDA && write_host_cuda(p, m, kp, &sp.gbp, &sp.lp, &info, err, len)) {
    fclose(f);
    goto out;
  }
  if (cg_emit_host(f, m, kp, &sp.bp, &sp.lp, &info, err, len)) {
    fclose(f);
    goto out;
  }
  if (finish(f, path, err, len)) goto out;
  snprintf(path, sizeof path, "%s/kernels.h", p->dir);
  if (kir_write_header(&code, path, err, len)) goto out;
  KirLlvmOptions opt;
  kir_llvm_defaults(&opt);
  if (p->generic_cpu) opt.cpu = KIR_CPU_GENERIC;
  snprintf(path, sizeof path, "%s/kernels_cpu.o", p->dir);
  snprintf(ll, sizeof ll, "%s/kernels_cpu.ll", p->dir);
  if (kir_llvm_emit(&code, &opt, path, ll, err, len)) goto out;
cuda_only:
  if (write_cmake(p, m, err, len)) goto out;
  if (p->step_out && !p->pipe) /* the report's predicted step time (pp = 1) */
    cg_step_model(m, kp, p->cost->machine ? p->cost->machine : machine_default, p->cost->bf16,
                  &sp.store, &sp.batches, p->step_out);
  if (write_plan(p, m, cg_arena_bytes(kp, &apart, NULL), &dev, kp, sp.canon, &sp.bp, &sp.lp,
                 &sp.batches, err, len))
    goto out;
  rc = 0;
out:
  cg_step_plan_free(&sp);
  return rc;
}
