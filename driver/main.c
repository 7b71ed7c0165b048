/* driver/main.c -- the parc command: parse, lower, run the passes, check
 * the layout, report.
 *
 * Exit codes: 0 success, 1 bad model or options, 2 usage, 3 internal error. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#ifndef PATH_MAX
#define PATH_MAX 4096
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "codegen/arena_plan.h"
#include "codegen/cuda_store.h"
#include "codegen/explain.h"
#include "codegen/machine_file.h"
#include "codegen/project.h"
#include "codegen/report.h"
#include "codegen/step_model.h"
#include "codegen/timeline.h"
#include "frontend/build.h"
#include "frontend/lower.h"
#include "passes/passes.h"

#ifndef PARC_VERSION
#define PARC_VERSION "0.1.0"
#endif

enum { EXIT_BAD = 1, EXIT_USAGE = 2, EXIT_INTERNAL = 3 };

extern const char parc_prelude[];
extern const unsigned long parc_prelude_len;

static void usage(FILE *out) {
  fprintf(out,
          "usage: parc MODEL.dsl [options]\n"
          "\n"
          "Compiles a transformer model written in parc's DSL for the given parallel layout\n"
          "and reports its parameters, FLOPs and per-rank memory.\n"
          "\n"
          "options:\n"
          "  -o, --output DIR       write the trainer project into DIR (created if missing):\n"
          "                         train.c, kernels_cpu.o/.ll, CMakeLists.txt, plan.json,\n"
          "                         report.txt, model.ir; then: cmake -S DIR -B DIR/build &&\n"
          "                         cmake --build DIR/build && DIR/build/train --help\n"
          "                         (--tp/--dp/--pp: a trainer of tp*dp*pp ranks, threads or\n"
          "                         mpirun; --ep: experts over ep of the dp ranks)\n"
          "      --no-fuse          one kernel per operation (for checking fusion)\n"
          "      --cpu host|generic kernels for this machine's CPU (default) or any x86-64\n"
          "      --target cpu|cuda|all  what -o generates: cpu: the CPU trainer (train.c,\n"
          "                         kernels_cpu.o); cuda: the kernels as CUDA C (kernels.cu,\n"
          "                         kernels_cuda.h); all: both, and the GPU trainer\n"
          "                         train_cuda.c.  Default: all when nvcc is found ($CUDACXX,\n"
          "                         PATH, /usr/local/cuda/bin), else cpu.  The generated\n"
          "                         CMakeLists builds kernels.cu and build/train_cuda only\n"
          "                         with -DPARC_CUDA=ON\n"
          "      --cuda-arch LIST   GPU architectures for kernels.cu, e.g. 80,90 (default 80;90)\n"
          "      --emit ir|dot      print the IR as text or as a Graphviz graph to stdout\n"
          "      --emit timeline|trace  with --pp above 1: print the simulated pipeline\n"
          "                         schedule to stdout as an SVG picture (a row per stage,\n"
          "                         F/B/W boxes per microbatch) or as Chrome trace JSON\n"
          "                         (open in Perfetto or chrome://tracing)\n"
          "      --explain WHAT     after the report, trace a rank's plan back to the model's\n"
          "                         lines: memory (what is live at the activation arena's\n"
          "                         peak, CPU and GPU trainers), step (where the predicted\n"
          "                         compute time goes) or all; pipelines: each stage's\n"
          "                         slot of the arena and own values, each stage's calls\n"
          "      --explain-rows N   rows of each --explain table, the largest groups (default\n"
          "                         15; all: every group); the rest are summed on one line\n"
          "  -D NAME=VALUE          override a config or train value (-D layers=2 -D batch=4)\n"
          "      --tp N             tensor-parallel degree (default 1)\n"
          "      --pp N             pipeline-parallel degree (default 1)\n"
          "      --schedule S       pipeline schedule: gpipe, 1f1b (default), interleaved\n"
          "                         (1F1B over virtual stages) or zb (ZB-H1, zero bubble)\n"
          "      --microbatches M   microbatches a step through the pipeline (default: the\n"
          "                         train section's microbatches if above 1, else --pp);\n"
          "                         must divide the batch per dp rank.  A model with expert\n"
          "                         routing (MoE) routes each microbatch on its own, so for\n"
          "                         it M is part of the model: the train section's value by\n"
          "                         default on every layout, and honoured with --pp 1 too\n"
          "                         (gradient accumulation over the microbatches)\n"
          "      --virtual-stages V chunks of layers per stage, interleaved only (default 2)\n"
          "      --stage-layers L   layers per stage (per chunk with interleaved), e.g.\n"
          "                         3,5,4; time (the default): balanced by the cost\n"
          "                         model's FLOPs; memory: the split whose largest rank\n"
          "                         needs least device memory (a search from time's,\n"
          "                         each split planned as the trainer; of the splits\n"
          "                         within 1%% of the least, the shortest predicted step)\n"
          "      --dp N             data-parallel degree (default 1)\n"
          "      --sp               sequence parallelism over the tp group (the sequence\n"
          "                         must divide by tp; no effect with --tp 1)\n"
          "      --ep N             expert-parallel degree, carved from dp (default 1)\n"
          "      --pad-vocab N      pad the vocabulary to the smallest multiple of N * tp rows\n"
          "                         (each tp rank's rows a multiple of N, for aligned GEMMs;\n"
          "                         the padding rows are zero, masked in the loss and never\n"
          "                         in weight files), at every tp, 1 included; 1: only what\n"
          "                         tp needs.  Default: the train section's pad_vocab, else\n"
          "                         64 (dropped, as the report says, for a model that reads\n"
          "                         the vocabulary dimension whole, e.g. a z-loss over the\n"
          "                         logits); N in [1, 4096]\n"
          "      --zero 0|1         ZeRO stage: 1 shards the optimizer state over the dp ranks\n"
          "                         (reduce-scatter gradients, update the rank's piece,\n"
          "                         all-gather parameters; with --pp, each stage its own\n"
          "                         after the microbatches); a no-op with dp 1 (default 0)\n"
          "      --bucket-mb X      MiB of gradient per bucket of the dp reduction, each\n"
          "                         bucket one collective issued as soon as it is complete in\n"
          "                         the backward pass; under --zero 1 also the buckets of the\n"
          "                         parameters' all-gathers and, with --pp, of the gradients'\n"
          "                         reduce-scatters after the microbatches (default 25)\n"
          "      --no-overlap       run the dp buckets' collectives as blocking calls\n"
          "                         (default: each is started when its bucket is complete\n"
          "                         and waited for after the backward pass, so it overlaps\n"
          "                         the rest of the backward pass)\n"
          "      --machine M        predict the step time for M: a preset (h200, the default,\n"
          "                         h100, a100) or a JSON file of sustained rates, e.g.\n"
          "                         {\"base\": \"h100\", \"inter_node_bytes_per_s\": 90e9}\n"
          "                         (fields: peak_flops, gemm_flops, attention_flops (a number\n"
          "                         or {\"fp32\": x, \"bf16\": y}), memory_bytes_per_s, kernel_s,\n"
          "                         parallel_call_s, parallel_min_elements (optional),\n"
          "                         intra_node_bytes_per_s, inter_node_bytes_per_s, latency_s,\n"
          "                         ranks_per_node; all of them without \"base\"; and\n"
          "                         device_bytes, a GPU's memory, optional: the report\n"
          "                         says whether a rank's plan fits it);\n"
          "                         bench/predict_cpu.py measures this machine's CPU\n"
          "      --keep-attn-out    attention's backward reads its forward output (no\n"
          "                         attn_delta: the output stays alive until the backward;\n"
          "                         for comparing plans)\n"
          "      --recompute WHAT   norms: the backward recomputes each layer's norm output\n"
          "                         (layer_norm, rms_norm) from its input, which it keeps\n"
          "                         anyway, instead of keeping the output from the forward\n"
          "                         (a [tokens, d] value a norm and layer less at the\n"
          "                         arena's peak for one more memory-bound kernel each,\n"
          "                         with --sp one more all-gather of it too; the\n"
          "                         recomputation stores the forward's bits); pointwise:\n"
          "                         likewise each layer's pointwise values the backward\n"
          "                         reads (gelu(h), silu(g) * u) from values it keeps anyway;\n"
          "                         all: both; a list (norms,pointwise); layers: the\n"
          "                         backward runs each layer's forward again (GEMMs,\n"
          "                         attention and collectives too, about a third more\n"
          "                         compute) and keeps only the layers' inputs; none\n"
          "                         (default)\n"
          "      --head-major-attn  attention keeps its head-major operands and results,\n"
          "                         with split_heads / merge_heads copies around it (no\n"
          "                         attn_layout pass; the same bits, for comparing)\n"
          "      --bf16-store MODE  what the bf16 GPU trainer does with its activations:\n"
          "                         on (default) stores them as bf16, halving their memory\n"
          "                         traffic and their room in the GPU trainer's arena (the\n"
          "                         report's \"GPU trainer\" lines); off keeps every value\n"
          "                         in fp32 (for comparing);\n"
          "                         round keeps fp32 buffers holding the bf16-rounded values\n"
          "                         (on's reference: the same roundings, made in fp32)\n"
          "      --no-bf16-store    the same as --bf16-store off\n"
          "      --no-batch         the GPU trainer launches every kernel on its own (default:\n"
          "                         independent launches of one kernel's code between two\n"
          "                         runtime ops run as one batched launch; pipelined\n"
          "                         trainers: the optimizer's; for comparing)\n"
          "      --dump-after PASS  print the IR after PASS (lower");
  for (int i = 0; pass_name(i); i++) fprintf(out, ", %s", pass_name(i));
  fprintf(out,
          ")\n"
          "      --no-verify        skip the IR verifier between passes\n"
          "      --time             print how long each phase took to stderr\n"
          "  -h, --help             show this help\n"
          "      --version          show the version\n"
          "\n"
          "exit codes: 0 success, 1 bad model or options, 2 usage, 3 internal error\n");
}

static int parse_degree(const char *flag, const char *s, int *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (!*s || *end || errno || v < 1 || v > LAYOUT_MAX_DEGREE) {
    fprintf(stderr, "parc: error: %s '%s': must be an integer in [1, %d]\n", flag, s,
            LAYOUT_MAX_DEGREE);
    return 0;
  }
  *out = (int)v;
  return 1;
}

static int parse_schedule(const char *s, PpRequest *req) {
  for (int k = 0; k < PP_NSCHEDULES; k++)
    if (!strcmp(s, pp_schedule_name[k])) {
      req->schedule = (PpScheduleKind)k;
      req->schedule_given = 1;
      return 1;
    }
  fprintf(stderr, "parc: error: --schedule '%s': expected gpipe, 1f1b, interleaved or zb\n", s);
  return 0;
}

/* --recompute norms,pointwise | all | layers | none (the last given wins).
 * 1, or 0 after printing the error. */
static int parse_recompute(const char *arg, int *norms_out, int *pointwise_out,
                           int *layers_out) {
  int norms = 0, pointwise = 0, layers = 0;
  const char *s = arg;
  for (;;) {
    size_t n = strcspn(s, ",");
    if (n == 5 && !strncmp(s, "norms", n)) norms = 1;
    else if (n == 9 && !strncmp(s, "pointwise", n)) pointwise = 1;
    else if (n == 3 && !strncmp(s, "all", n)) norms = pointwise = 1;
    else if (n == 6 && !strncmp(s, "layers", n) && strchr(arg, ',')) {
      fprintf(stderr, "parc: error: --recompute '%s': layers stands alone (it recomputes each "
              "layer's whole forward, norms and pointwise values included)\n", arg);
      return 0;
    } else if (n == 6 && !strncmp(s, "layers", n)) layers = 1;
    else if (!(n == 4 && !strncmp(s, "none", n) && !strchr(arg, ','))) {
      fprintf(stderr, "parc: error: --recompute '%s': expected norms, pointwise, a list of "
              "those (norms,pointwise), all, layers or none\n", arg);
      return 0;
    }
    if (!s[n]) break;
    s += n + 1;
  }
  *norms_out = norms;
  *pointwise_out = pointwise;
  *layers_out = layers;
  return 1;
}

/* --stage-layers 3,5,4: a malloc'd list (freed at exit), each at least 1;
 * time: none (balanced by FLOPs); memory: none until the search (choose_split). */
static int parse_stage_layers(const char *s, PpRequest *req) {
  if (!strcmp(s, "time") || !strcmp(s, "memory")) {
    free((void *)req->stage_layers);
    req->stage_layers = NULL;
    req->nstage_layers = 0;
    req->memory = !strcmp(s, "memory");
    return 1;
  }
  int n = 1;
  for (const char *p = s; *p; p++) n += *p == ',';
  int *v = n <= LAYOUT_MAX_DEGREE ? calloc((size_t)n, sizeof *v) : NULL;
  const char *p = s;
  for (int i = 0; v && i < n; i++) {
    char *end;
    errno = 0;
    long x = strtol(p, &end, 10);
    if (end == p || (*end && *end != ',') || errno || x < 1 || x > LAYOUT_MAX_DEGREE) {
      free(v);
      v = NULL;
      break;
    }
    v[i] = (int)x;
    p = *end ? end + 1 : end;
  }
  if (!v) {
    fprintf(stderr, "parc: error: --stage-layers '%s': expected layer counts like 3,5,4, each "
            "at least 1, or time, or memory\n", s);
    return 0;
  }
  req->memory = 0;
  free((void *)req->stage_layers);
  req->stage_layers = v;
  req->nstage_layers = n;
  return 1;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int make_dir(const char *dir) {
  char path[PATH_MAX];
  if (strlen(dir) >= sizeof path) return -1;
  strcpy(path, dir);
  for (char *p = path + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(path, 0777) && errno != EEXIST) return -1;
    *p = '/';
  }
  if (mkdir(path, 0777) && errno != EEXIST) return -1;
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode) ? 0 : -1;
}

static FILE *open_out(const char *dir, const char *name) {
  char path[PATH_MAX];
  if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path) return NULL;
  FILE *f = fopen(path, "w");
  if (!f) fprintf(stderr, "parc: error: cannot write '%s': %s\n", path, strerror(errno));
  return f;
}

typedef struct {
  const char *model, *outdir, *emit, *dump_after;
  Layout lay;
  Override *ov;
  int nov;
  int targets;               /* CG_TARGET_* bits; 0 until chosen (see default_targets) */
  const char *cuda_arch;     /* CMake CUDA_ARCHITECTURES list, ';'-separated */
  int verify, timing, no_fuse, generic_cpu, sp;
  int64_t bucket_bytes;      /* --bucket-mb in bytes; 0: the default */
  int no_overlap;            /* --no-overlap: blocking dp bucket collectives */
  int keep_attn_out;         /* --keep-attn-out: no attn_delta pass */
  int head_major_attn;       /* --head-major-attn: no attn_layout pass */
  int recompute_norms;       /* --recompute norms: the remat_norm pass */
  int recompute_pointwise;   /* --recompute pointwise: the remat_act pass */
  int recompute_layers;      /* --recompute layers: the remat_layer pass */
  int bf16_store;            /* --bf16-store: a CgStoreMode (codegen/cuda_store.h) */
  int no_batch;              /* --no-batch: the GPU trainer launches every kernel alone */
  unsigned explain;          /* --explain: CG_EXPLAIN_* bits (codegen/explain.h); 0: none */
  int explain_rows;          /* --explain-rows: groups a table prints (0: all); -1: not given
                                (CG_EXPLAIN_ROWS) */
  int pad_vocab;             /* --pad-vocab; 0: not given (the train section's, else 64) */
  int pads;                  /* the layout pads the vocabulary (set after the cost):
                                pass_shard runs even for one rank */
  PpRequest pipe;            /* --schedule, --microbatches, --virtual-stages, --stage-layers */
  PpSplitSearch split;       /* --stage-layers memory: the search's outcome (pipe.search) */
  int *time_layers;          /* then: the split balanced by FLOPs it started from */
  Machine machine;           /* --machine (passes/machine.h); the default preset if not given */
  CgSourceText srcs[2];      /* the prelude's and the model's text, for --explain */
} Options;

/* 1 if an nvcc is found: $CUDACXX (as CMake takes it), PATH, /usr/local/cuda. */
static int have_nvcc(void) {
  const char *cx = getenv("CUDACXX");
  if (cx && *cx) return access(cx, X_OK) == 0;
  const char *path = getenv("PATH");
  char buf[PATH_MAX];
  while (path && *path) {
    size_t n = strcspn(path, ":");
    if (n > 0 && n + 6 < sizeof buf) {
      snprintf(buf, sizeof buf, "%.*s/nvcc", (int)n, path);
      if (access(buf, X_OK) == 0) return 1;
    }
    path += n + (path[n] == ':');
  }
  return access("/usr/local/cuda/bin/nvcc", X_OK) == 0;
}

/* --cuda-arch: entries like 80, 90a, 90-real, or native / all / all-major,
 * separated by ',' or ';'; returned ';'-separated (a CMake list), or NULL
 * after an error message. */
static const char *cuda_arch_list(const char *s) {
  static char out[256];
  size_t n = strlen(s);
  int ok = n > 0 && n < sizeof out;
  for (size_t i = 0; ok && i <= n;) {
    size_t t = strcspn(s + i, ",;");
    const char *e = s + i;
    size_t d = 0;
    while (d < t && e[d] >= '0' && e[d] <= '9') d++;
    int word = (t == 6 && !strncmp(e, "native", 6)) || (t == 3 && !strncmp(e, "all", 3)) ||
               (t == 9 && !strncmp(e, "all-major", 9));
    const char *rest = e + d;
    size_t r = t - d;
    if (r && rest[0] >= 'a' && rest[0] <= 'z') rest++, r--;  /* 90a */
    int num = d >= 2 && (r == 0 || (r == 5 && !strncmp(rest, "-real", 5)) ||
                         (r == 8 && !strncmp(rest, "-virtual", 8)));
    ok = word || num;
    i += t + 1;
  }
  if (!ok) {
    fprintf(stderr, "parc: error: --cuda-arch '%s': expected a list like 80,90 (or native)\n", s);
    return NULL;
  }
  for (size_t i = 0; i <= n; i++) out[i] = s[i] == ',' ? ';' : s[i];
  return out;
}

static int parse_args(int argc, char **argv, Options *o) {
  enum { O_EMIT = 256, O_TP, O_PP, O_DP, O_EP, O_DUMP, O_NOVERIFY, O_TIME, O_VERSION, O_NOFUSE,
         O_CPU, O_SP, O_ZERO, O_BUCKET, O_NO_OVERLAP, O_PAD_VOCAB, O_KEEP_ATTN_OUT, O_HEAD_MAJOR_ATTN,
         O_NO_BF16_STORE, O_BF16_STORE, O_NO_BATCH, O_EXPLAIN, O_EXPLAIN_ROWS, O_RECOMPUTE };
  static const struct option longs[] = {
      {"output", required_argument, 0, 'o'},  {"emit", required_argument, 0, O_EMIT},
      {"tp", required_argument, 0, O_TP},     {"pp", required_argument, 0, O_PP},
      {"dp", required_argument, 0, O_DP},     {"ep", required_argument, 0, O_EP},
      {"dump-after", required_argument, 0, O_DUMP},
      {"no-verify", no_argument, 0, O_NOVERIFY}, {"time", no_argument, 0, O_TIME},
      {"help", no_argument, 0, 'h'},          {"version", no_argument, 0, O_VERSION},
      {"no-fuse", no_argument, 0, O_NOFUSE},  {"cpu", required_argument, 0, O_CPU},
      {"sp", no_argument, 0, O_SP},
      {"zero", required_argument, 0, O_ZERO}, {"bucket-mb", required_argument, 0, O_BUCKET},
      {"no-overlap", no_argument, 0, O_NO_OVERLAP},
      {"keep-attn-out", no_argument, 0, O_KEEP_ATTN_OUT},
      {"head-major-attn", no_argument, 0, O_HEAD_MAJOR_ATTN},
      {"no-bf16-store", no_argument, 0, O_NO_BF16_STORE},
      {"bf16-store", required_argument, 0, O_BF16_STORE},
      {"no-batch", no_argument, 0, O_NO_BATCH},
      {"explain", required_argument, 0, O_EXPLAIN},
      {"explain-rows", required_argument, 0, O_EXPLAIN_ROWS},
      {"recompute", required_argument, 0, O_RECOMPUTE},
      {"pad-vocab", required_argument, 0, O_PAD_VOCAB},
      {"target", required_argument, 0, 512}, {"cuda-arch", required_argument, 0, 513},
      {"machine", required_argument, 0, 514},
      {"schedule", required_argument, 0, 600}, {"microbatches", required_argument, 0, 601},
      {"virtual-stages", required_argument, 0, 602}, {"stage-layers", required_argument, 0, 603},
      {0, 0, 0, 0}};
  o->lay = (Layout){1, 1, 1, 1, 0};
  o->verify = 1;
  o->explain_rows = -1;
  o->machine = *machine_default;
  o->ov = calloc((size_t)argc + 1, sizeof *o->ov);
  if (!o->ov) return EXIT_INTERNAL;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":o:D:h", longs, NULL)) != -1) {
    switch (c) {
    case 'o': o->outdir = optarg; break;
    case O_EMIT:
      if (strcmp(optarg, "ir") && strcmp(optarg, "dot") && strcmp(optarg, "timeline") &&
          strcmp(optarg, "trace")) {
        fprintf(stderr, "parc: error: --emit '%s': expected ir, dot, timeline or trace\n", optarg);
        return EXIT_BAD;
      }
      o->emit = optarg;
      break;
    case O_RECOMPUTE:
      if (!parse_recompute(optarg, &o->recompute_norms, &o->recompute_pointwise,
                           &o->recompute_layers)) return EXIT_BAD;
      break;
    case O_EXPLAIN: /* (given twice: both) */
      if (!strcmp(optarg, "memory")) o->explain |= CG_EXPLAIN_MEMORY;
      else if (!strcmp(optarg, "step")) o->explain |= CG_EXPLAIN_STEP;
      else if (!strcmp(optarg, "all")) o->explain |= CG_EXPLAIN_MEMORY | CG_EXPLAIN_STEP;
      else {
        fprintf(stderr, "parc: error: --explain '%s': expected memory, step or all\n", optarg);
        return EXIT_BAD;
      }
      break;
    case O_EXPLAIN_ROWS: {
      char *end = NULL;
      long v = strtol(optarg, &end, 10);
      if (!strcmp(optarg, "all")) {
        o->explain_rows = 0;
      } else if (!*optarg || *end || v < 1 || v > 100000) {
        fprintf(stderr, "parc: error: --explain-rows '%s': expected a number of rows from 1 to "
                        "100000, or all\n", optarg);
        return EXIT_BAD;
      } else {
        o->explain_rows = (int)v;
      }
      break;
    }
    case 'D': {
      char *eq = strchr(optarg, '=');
      if (!eq || eq == optarg) {
        fprintf(stderr, "parc: error: -D '%s': expected NAME=VALUE\n", optarg);
        return EXIT_BAD;
      }
      *eq = 0;
      o->ov[o->nov++] = (Override){optarg, eq + 1};
      break;
    }
    case O_TP: if (!parse_degree("--tp", optarg, &o->lay.tp)) return EXIT_BAD; break;
    case O_PP: if (!parse_degree("--pp", optarg, &o->lay.pp)) return EXIT_BAD; break;
    case O_DP: if (!parse_degree("--dp", optarg, &o->lay.dp)) return EXIT_BAD; break;
    case O_EP: if (!parse_degree("--ep", optarg, &o->lay.ep)) return EXIT_BAD; break;
    case O_ZERO:
      if (strcmp(optarg, "0") && strcmp(optarg, "1")) {
        fprintf(stderr, "parc: error: --zero '%s': must be 0 or 1\n", optarg);
        return EXIT_BAD;
      }
      o->lay.zero = optarg[0] - '0';
      break;
    case O_NO_OVERLAP: o->no_overlap = 1; break;
    case 514: {
      char why[512];
      if (machine_resolve(optarg, &o->machine, why, sizeof why)) {
        fprintf(stderr, "parc: error: --machine %s\n", why);
        return EXIT_BAD;
      }
      break;
    }
    case O_KEEP_ATTN_OUT: o->keep_attn_out = 1; break;
    case O_HEAD_MAJOR_ATTN: o->head_major_attn = 1; break;
    case O_NO_BF16_STORE: o->bf16_store = CG_STORE_OFF; break;
    case O_NO_BATCH: o->no_batch = 1; break;
    case O_BF16_STORE: {
      static const char *const modes[] = {"on", "off", "round"}; /* CgStoreMode's order */
      int k = 0;
      while (k < 3 && strcmp(optarg, modes[k])) k++;
      if (k == 3) {
        fprintf(stderr, "parc: error: --bf16-store '%s': must be on, off or round\n", optarg);
        return EXIT_BAD;
      }
      o->bf16_store = k;
      break;
    }
    case O_PAD_VOCAB: {
      char *end;
      errno = 0;
      long v = strtol(optarg, &end, 10);
      if (!*optarg || *end || errno || v < 1 || v > IR_PAD_VOCAB_MAX) {
        fprintf(stderr, "parc: error: --pad-vocab '%s': must be an integer in [1, %d]\n", optarg,
                IR_PAD_VOCAB_MAX);
        return EXIT_BAD;
      }
      o->pad_vocab = (int)v;
      break;
    }
    case O_BUCKET: {
      char *end;
      errno = 0;
      double mb = strtod(optarg, &end);
      if (!*optarg || *end || errno || !(mb > 0 && mb <= 1048576)) {
        fprintf(stderr, "parc: error: --bucket-mb '%s': must be a number in (0, 1048576]\n",
                optarg);
        return EXIT_BAD;
      }
      o->bucket_bytes = (int64_t)(mb * 1048576.0);
      if (o->bucket_bytes < 4) o->bucket_bytes = 4;
      break;
    }
    case O_DUMP: {
      int ok = !strcmp(optarg, "lower");
      for (int i = 0; pass_name(i); i++) ok |= !strcmp(optarg, pass_name(i));
      if (!ok) {
        fprintf(stderr, "parc: error: --dump-after '%s': no such pass (see --help)\n", optarg);
        return EXIT_BAD;
      }
      o->dump_after = optarg;
      break;
    }
    case O_NOVERIFY: o->verify = 0; break;
    case O_NOFUSE: o->no_fuse = 1; break;
    case O_SP: o->sp = 1; break;
    case O_CPU:
      if (strcmp(optarg, "host") && strcmp(optarg, "generic")) {
        fprintf(stderr, "parc: error: --cpu '%s': expected host or generic\n", optarg);
        return EXIT_BAD;
      }
      o->generic_cpu = !strcmp(optarg, "generic");
      break;
    case O_TIME: o->timing = 1; break;
    case 512: /* --target */
      if (!strcmp(optarg, "cpu")) o->targets = CG_TARGET_CPU;
      else if (!strcmp(optarg, "cuda")) o->targets = CG_TARGET_CUDA;
      else if (!strcmp(optarg, "all")) o->targets = CG_TARGET_CPU | CG_TARGET_CUDA;
      else {
        fprintf(stderr, "parc: error: --target '%s': expected cpu, cuda or all\n", optarg);
        return EXIT_BAD;
      }
      break;
    case 513: /* --cuda-arch */
      if (!(o->cuda_arch = cuda_arch_list(optarg))) return EXIT_BAD;
      break;
    case 600: /* --schedule */
      if (!parse_schedule(optarg, &o->pipe)) return EXIT_BAD;
      break;
    case 601: /* --microbatches */
      if (!parse_degree("--microbatches", optarg, &o->pipe.microbatches)) return EXIT_BAD;
      break;
    case 602: /* --virtual-stages */
      if (!parse_degree("--virtual-stages", optarg, &o->pipe.virtual_stages)) return EXIT_BAD;
      break;
    case 603: /* --stage-layers */
      if (!parse_stage_layers(optarg, &o->pipe)) return EXIT_BAD;
      break;
    case 'h': usage(stdout); exit(0);
    case O_VERSION: printf("parc %s\n", PARC_VERSION); exit(0);
    case ':':
      fprintf(stderr, "parc: option '%s' needs a value\n", argv[optind - 1]);
      fprintf(stderr, "usage: parc MODEL.dsl [options]; see parc --help\n");
      return EXIT_USAGE;
    default:
      fprintf(stderr, "parc: unknown option '%s'\n", argv[optind - 1]);
      fprintf(stderr, "usage: parc MODEL.dsl [options]; see parc --help\n");
      return EXIT_USAGE;
    }
  }
  if (optind != argc - 1) {
    fprintf(stderr, optind >= argc ? "parc: no model file given\n"
                                   : "parc: one model file at a time, got several\n");
    fprintf(stderr, "usage: parc MODEL.dsl [options]; see parc --help\n");
    return EXIT_USAGE;
  }
  o->model = argv[optind];
  int64_t ranks = (int64_t)o->lay.tp * o->lay.pp * o->lay.dp;
  if (ranks > LAYOUT_MAX_RANKS) {
    fprintf(stderr, "parc: error: --tp %d --pp %d --dp %d make %lld ranks; at most %d\n",
            o->lay.tp, o->lay.pp, o->lay.dp, (long long)ranks, LAYOUT_MAX_RANKS);
    return EXIT_BAD;
  }
  if (o->explain_rows >= 0 && !o->explain) {
    fprintf(stderr, "parc: error: --explain-rows without --explain: it sets the rows of "
                    "--explain's tables (add --explain memory, step or all)\n");
    return EXIT_BAD;
  }
  if (o->explain && (o->emit || o->dump_after)) {
    fprintf(stderr, "parc: error: --explain with %s: both print to stdout; ask for one at a "
                    "time\n", o->emit ? "--emit" : "--dump-after");
    return EXIT_BAD;
  }
  if (o->lay.zero && o->lay.dp == 1)
    fprintf(stderr, "parc: warning: --zero 1 at --dp 1 shards nothing: ZeRO-1 splits the "
                    "optimizer state over the data-parallel ranks (add --dp N)\n");
  return 0;
}

/* The pipeline's chunks timed by the kernels the trainer runs (tm, the
 * microbatch module, and its stage programs) on --machine, simulated again
 * (codegen/step_model.h); the plan's FLOP-rate timing is replaced.  0, or -1
 * after an internal error message. */
static int pipe_retime(const Options *o, const IrModule *m, IrModule *tm, const PpProgram *pp,
                       PpPlan *plan) {
  char why[512];
  if (cg_pipe_step_model(tm, pp, !o->no_fuse, &o->machine, machine_bf16(m), o->bf16_store,
                         !o->no_batch, plan, why, sizeof why)) {
    fprintf(stderr, "parc: internal error: timing the pipeline: %s\n", why);
    return -1;
  }
  return 0;
}

/* The machine the report predicts the step time on, into a fresh cost. */
static void predict_on(Cost *cost, const Options *o, const IrModule *m) {
  cost->machine = &o->machine;
  cost->bf16 = machine_bf16(m);
  cost->overlap_dp = !o->no_overlap;
  cost->sp = o->sp;
}

/* --explain of m, the module a rank runs (every pass done; pp: its stage
 * programs, pipe_module's, or NULL at pp 1), into out.  0, or -1 after an
 * internal error message. */
static int explain(const Options *o, IrModule *m, const PpProgram *pp, const Cost *cost,
                   FILE *out) {
  char why[512];
  if (!cg_explain(out, m, pp, o->explain, !o->no_fuse, cost->machine, cost->bf16, o->bf16_store,
                  !o->no_batch, o->srcs, 2, o->explain_rows < 0 ? CG_EXPLAIN_ROWS : o->explain_rows,
                  why, sizeof why))
    return 0;
  fprintf(stderr, "parc: internal error: --explain: %s\n", why);
  return -1;
}

/* The per-rank plan for a report without -o (pp = ep = 1): the rank-local
 * module's activation arena and, with several ranks, its communication, into
 * cost; with xout, that module's --explain into it.  The module m has been
 * through every pass unsharded; a sharded copy is lowered afresh.  Returns
 * 0, or -1 with the reason in why (the report then says what it could not
 * plan; the compile itself is fine). */
static int plan_ranks(Program *prog, const Options *o, IrModule *m, Cost *cost, FILE *xout,
                      char *why, size_t len) {
  if (o->lay.tp * o->lay.dp == 1 && !o->pads) {
    if (cg_plan_arena(m, !o->no_fuse, NULL, &cost->arena_bytes, cost->machine, cost->bf16,
                      &cost->step, o->bf16_store, !o->no_batch, &cost->gpu, why, len))
      return -1;
    return xout && explain(o, m, NULL, cost, xout) ? -1 : 0;
  }
  IrModule *r = lower_program(prog, o->ov, o->nov);
  if (!r) {
    snprintf(why, len, "internal error: the model did not lower a second time");
    return -1;
  }
  r->pad_vocab = m->pad_vocab;
  PassOptions popt = {.verify = o->verify, .stop_after = "dce", .zero = o->lay.zero,
                      .bucket_bytes = o->bucket_bytes, .no_overlap = o->no_overlap,
                      .keep_attn_out = o->keep_attn_out,
                      .head_major_attn = o->head_major_attn,
                      .recompute_norms = o->recompute_norms,
                      .recompute_pointwise = o->recompute_pointwise,
                      .recompute_layers = o->recompute_layers};
  int rc = pass_run_all(r, &popt) ? -1 : 0;
  if (rc) snprintf(why, len, "internal error: passes");
  r->mesh_ep = o->lay.ep; /* experts split over ep of the dp ranks */
  if (!rc && pass_shard(r, o->lay.tp, o->lay.dp, o->sp, why, len)) rc = -1;
  popt.stop_after = NULL;
  popt.start_after = "dce";
  if (!rc && pass_run_all(r, &popt)) {
    snprintf(why, len, "internal error: passes after sharding");
    rc = -1;
  }
  /* (a routed model's microbatches: pipe_comm's; one rank padding its
   * vocabulary has no collectives) */
  if (!rc && !cost->has_comm && o->lay.tp * o->lay.dp > 1) {
    comm_analyze(r, &cost->comm);
    cost->has_comm = 1;
  }
  if (!rc)
    rc = cg_plan_arena(r, !o->no_fuse, NULL, &cost->arena_bytes, cost->machine, cost->bf16,
                       &cost->step, o->bf16_store, !o->no_batch, &cost->gpu, why, len);
  if (!rc && xout && explain(o, r, NULL, cost, xout)) rc = -1;
  ir_module_free(r);
  return rc;
}

/* The module a pipelined trainer runs (passes/pp_split.c): the model lowered
 * again for one microbatch (batch / M sequences; batch / (dp M) a rank),
 * sharded for tp x dp (the experts over ep of the dp ranks), differentiated,
 * with its optimizer but without dp_grads (the trainer sums the gradients
 * over microbatches and reduces them over dp, the experts' over ep_dp, and
 * pp once per step), split into the plan's chunks.  NULL with the reason in
 * why. */
static IrModule *pipe_module(Program *prog, const Options *o, const IrModule *m,
                             const PpPlan *plan, PpProgram *pp, char *why, size_t len) {
  const IrSetting *b = ir_setting(m->train, m->ntrain, "batch");
  int M = plan->st.microbatches;
  if (!b || b->is_float || b->i % M) {
    snprintf(why, len, "the train section's batch does not divide into %d microbatches", M);
    return NULL;
  }
  char value[32];
  snprintf(value, sizeof value, "%lld", (long long)(b->i / M));
  Override *ov = calloc((size_t)o->nov + 1, sizeof *ov);
  if (!ov) {
    snprintf(why, len, "out of memory");
    return NULL;
  }
  memcpy(ov, o->ov, sizeof *ov * (size_t)o->nov);
  ov[o->nov] = (Override){"batch", value}; /* the last override of a name wins */
  IrModule *r = lower_program(prog, ov, o->nov + 1);
  free(ov);
  if (!r) {
    snprintf(why, len, "internal error: the model did not lower for one microbatch");
    return NULL;
  }
  PassOptions popt = {.verify = o->verify, .stop_after = "dce",
                      .keep_attn_out = o->keep_attn_out,
                      .head_major_attn = o->head_major_attn,
                      .recompute_norms = o->recompute_norms,
                      .recompute_pointwise = o->recompute_pointwise,
                      .recompute_layers = o->recompute_layers};
  int rc = pass_run_all(r, &popt) ? -1 : 0;
  r->mesh_ep = o->lay.ep; /* experts split over ep of the dp ranks */
  r->pad_vocab = m->pad_vocab;
  if (!rc && (o->lay.tp * o->lay.dp > 1 || o->pads) &&
      pass_shard(r, o->lay.tp, o->lay.dp, o->sp, why, len))
    rc = -1;
  /* autodiff to remat (as the unpipelined module: attn_delta, gelu_epilogue,
   * remat, and the --recompute passes); then, past dp_grads, the optimizer */
  popt.start_after = "dce";
  popt.stop_after = "remat";
  if (!rc && pass_run_all(r, &popt)) rc = -1;
  /* ZeRO-1: the optimizer takes the rank's piece of each accumulated gradient
   * and gathers each stage's parameters apart (passes/optimizer.c) */
  r->grads_whole = 1;
  r->mesh_zero = o->lay.zero >= 1 && o->lay.dp > 1 ? o->lay.dp : 0;
  r->dp_bucket_bytes = o->bucket_bytes;
  uint64_t *stages = r->mesh_zero ? arena_alloc(&r->arena, sizeof *stages * (size_t)(r->nnodes + 1))
                                  : NULL;
  if (!rc && stages && pp_param_stages(r, &plan->st, stages)) {
    snprintf(why, len, "internal error: the pipeline's parameter stages");
    rc = -1;
  }
  r->opt_stages = stages;
  popt.start_after = "dp_grads";
  popt.stop_after = NULL;
  if (!rc && pass_run_all(r, &popt)) rc = -1;
  r->opt_stages = NULL; /* (its ids are the optimizer's input's) */
  /* the loss's seed 1 / (M dp): every term the trainer sums into the
   * accumulator comes out divided, so the sums over the microbatches and dp are
   * the mean gradient, no pass after them (runtime/rt_pipe.h) */
  if (!rc && r->seed)
    r->seed->fa = 1.0 / ((double)plan->st.microbatches * (o->lay.dp > 1 ? o->lay.dp : 1));
  if (!rc && pass_pp_split(r, plan, pp, why, len)) rc = -1;
  char vwhy[384];
  if (!rc && ir_verify(r, vwhy, sizeof vwhy)) {
    snprintf(why, len, "internal error: IR invalid after the pipeline split: %.380s", vwhy);
    rc = -1;
  }
  if (rc && !why[0]) snprintf(why, len, "internal error: passes for the pipeline trainer");
  if (rc) {
    ir_module_free(r);
    return NULL;
  }
  return r;
}

/* 1 if m (past dce) pads a vocabulary table at this layout only because of
 * m->pad_vocab (tp alone would not) and the partitioner refuses that
 * padding: the model slices, reduces or gathers the padded dimension (a
 * z-loss over the logits, say).  Then why gets the partitioner's message.  A second lowering of the
 * model is sharded to find out, only when something would be padded; any
 * other failure is left to the compile itself to report. */
static int padding_refused(Program *prog, const Options *o, const IrModule *m, char *why,
                           size_t len) {
  int pads = 0, needs = 0; /* padded at m->pad_vocab; padded even at 1 (tp's) */
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *p = m->nodes[i];
    if (p->op != IR_OP_PARAM || p->shard != IR_SHARD_VOCAB || p->rank < 1) continue;
    pads |= ir_padded_vocab(p->shape[0], o->lay.tp, m->pad_vocab) != p->shape[0];
    needs |= ir_padded_vocab(p->shape[0], o->lay.tp, 1) != p->shape[0];
  }
  if (!pads || needs) return 0; /* nothing to drop, or dropping it would not help */
  IrModule *r = lower_program(prog, o->ov, o->nov);
  if (!r) return 0;
  r->pad_vocab = m->pad_vocab;
  r->mesh_ep = o->lay.ep;
  PassOptions popt = {.stop_after = "dce"};
  int refused = !pass_run_all(r, &popt) && pass_shard(r, o->lay.tp, o->lay.dp, o->sp, why, len) &&
                r->pad_refused;
  ir_module_free(r);
  char *hint = refused ? strstr(why, PASS_SHARD_PAD_HINT) : NULL;
  if (hint) *hint = 0; /* the report says what happened instead */
  return refused;
}

/* The communication of a pipelined trainer's ranks (tm and pp from
 * pipe_module) into cost: per stage, in m's arena; cost->comm is stage 0's. */
static void pipe_comm(const Options *o, IrModule *m, const IrModule *tm, const PpProgram *pp,
                      Cost *cost) {
  if (o->lay.tp * o->lay.pp * o->lay.dp < 2) return;
  int P = pp->nstages;
  CommCost *sc = arena_alloc(&m->arena, sizeof *sc * (size_t)P);
  for (int s = 0; s < P; s++) comm_analyze_pipe(tm, pp, &o->lay, s, &sc[s]);
  cost->comm = sc[0];
  cost->has_comm = 1;
  cost->stage_comm = P > 1 ? sc : NULL;
  cost->nstage_comm = P > 1 ? P : 0;
}

/* One split of --stage-layers memory's search, planned as the trainer
 * would be: the pipeline plan, its microbatch module and stage programs,
 * their kernels' timing and the GPU trainer's bytes per stage. */
typedef struct {
  Program *prog;
  const Options *o;
  IrModule *m;
  int nchunks;
  int bad_input;             /* a split failed for the model's sake, not parc's */
} SplitTry;

static int split_eval(void *ctx, const int *counts, PpSplitCost *out) {
  SplitTry *x = ctx;
  const Options *o = x->o;
  PpRequest req = o->pipe;
  req.stage_layers = counts, req.nstage_layers = x->nchunks, req.memory = 0;
  PpPlan plan = {0};
  PpProgram pp = {0};
  GpuBytes gpu = {0};
  int64_t arena = 0;
  char why[512] = "";
  IrModule *r = NULL;
  int rc = pp_plan(x->m, &o->lay, &req, &plan, why, sizeof why);
  if (!rc && !(r = pipe_module(x->prog, o, x->m, &plan, &pp, why, sizeof why))) rc = -1;
  if (!rc && pipe_retime(o, x->m, r, &pp, &plan)) rc = -1; /* (its own message) */
  if (!rc && cg_plan_arena(r, !o->no_fuse, &pp, &arena, &o->machine, machine_bf16(r), NULL,
                           o->bf16_store, !o->no_batch, &gpu, why, sizeof why))
    rc = -1;
  if (!rc && gpu.nstages != o->lay.pp) {
    snprintf(why, sizeof why, "internal error: %d stages planned for --pp %d", gpu.nstages,
             o->lay.pp);
    rc = -1;
  }
  if (!rc) {
    /* the step as the report predicts it: the pipeline, the optimizer, the
     * busiest stage's collectives (the arrays land in m's arena) */
    Cost cost;
    cost_analyze_split(x->m, &o->lay, plan.st.chunk_layers, plan.st.nchunks, &cost);
    predict_on(&cost, o, x->m);
    cost.pipe = &plan;
    cost.microbatches = plan.st.microbatches;
    pipe_comm(o, x->m, r, &pp, &cost);
    CgPredicted pr;
    cg_predict_step(&o->lay, &cost, &pr);
    memset(out, 0, sizeof *out);
    for (int s = 0; s < gpu.nstages && s < PP_MAX_STAGES; s++)
      out->stage_bytes[s] = gpu.stage_device[s];
    out->step_s = pr.total_s;
  } else if (why[0]) {
    x->bad_input = !strstr(why, "internal error");
    fprintf(stderr, "parc: error: --stage-layers memory: planning the split ");
    for (int c = 0; c < x->nchunks; c++) fprintf(stderr, "%s%d", c ? "," : "", counts[c]);
    fprintf(stderr, ": %s\n", why);
  }
  ir_module_free(r);
  pp_plan_free(&plan);
  return rc;
}

/* --stage-layers memory (m differentiated, o->pipe checked): the split
 * pp_split_search finds from the one balanced by FLOPs (passes/stages.c)
 * becomes o->pipe.stage_layers, the search's outcome o->split.  Progress on
 * stderr, a line a split it moves to.  0, or after an error message
 * EXIT_BAD (the model cannot be planned so) or EXIT_INTERNAL. */
#define SPLIT_MAX_EVALS 200
static int choose_split(Program *prog, Options *o, IrModule *m) {
  PpRequest req = o->pipe;
  req.memory = 0;
  PpPlan start = {0};
  char why[512];
  if (pp_plan(m, &o->lay, &req, &start, why, sizeof why)) {
    fprintf(stderr, "parc: internal error: %s\n", why);
    return EXIT_INTERNAL;
  }
  int n = start.st.nchunks;
  int *counts = malloc(sizeof(int) * (size_t)n);
  o->time_layers = malloc(sizeof(int) * (size_t)n);
  if (!counts || !o->time_layers) {
    pp_plan_free(&start);
    free(counts);
    fprintf(stderr, "parc: error: out of memory\n");
    return EXIT_INTERNAL;
  }
  memcpy(counts, start.st.chunk_layers, sizeof(int) * (size_t)n);
  memcpy(o->time_layers, counts, sizeof(int) * (size_t)n);
  pp_plan_free(&start);
  SplitTry x = {prog, o, m, n, 0};
  if (pp_split_search(n, o->lay.pp, counts, SPLIT_MAX_EVALS, split_eval, &x, &o->split, stderr)) {
    free(counts);
    return x.bad_input ? EXIT_BAD : EXIT_INTERNAL;
  }
  o->pipe.stage_layers = counts;
  o->pipe.nstage_layers = n;
  o->pipe.time_layers = o->time_layers;
  o->pipe.search = &o->split;
  return 0;
}

int main(int argc, char **argv) {
  Options o = {0};
  FILE *xout = NULL; /* --explain without -o: printed after the report */
  char *xtext = NULL;
  size_t xlen = 0;
  IrModule *tm = NULL; /* a pipelined trainer's module (pipe_module) */
  PpProgram stage_prog = {0};
  PpPlan pipe = {0}; /* --pp above 1: stages, schedule, simulated timeline */
  int rc = parse_args(argc, argv, &o);
  if (rc) {
    free(o.ov);
    return rc;
  }
  double t0 = now();
  Source prelude = {"prelude.dsl", parc_prelude, parc_prelude_len}, user;
  if (!source_load(&user, o.model)) {
    free(o.ov);
    return EXIT_BAD;
  }
  Arena parse_arena = {0};
  Diag diag;
  diag_init(&diag, stderr);
  Program prog = {.arena = &parse_arena, .diag = &diag, .main_src = &user};
  o.srcs[0] = (CgSourceText){prelude.path, prelude.text, prelude.len};
  o.srcs[1] = (CgSourceText){user.path, user.text, user.len};
  parse_source(&prog, &prelude);
  if (prog.nmodels) {
    fprintf(stderr, "parc: internal error: the prelude defines a model\n");
    return EXIT_INTERNAL;
  }
  parse_source(&prog, &user);
  double t1 = now();
  IrModule *m = diag.errors ? NULL : lower_program(&prog, o.ov, o.nov);
  double t2 = now();
  rc = 0;
  if (!m) {
    diag_finish(&diag);
    rc = EXIT_BAD;
    goto done;
  }
  /* the vocabulary padding: --pad-vocab, else the train section's, else 64 */
  const IrSetting *pv = ir_setting(m->train, m->ntrain, "pad_vocab");
  m->pad_vocab = o.pad_vocab ? o.pad_vocab : pv && !pv->is_float && !pv->sym ? (int)pv->i : 64;
  /* The forward module first: the layout is checked and costed on it. */
  PassOptions popt = {.verify = o.verify, .dump_after = o.dump_after, .dump = stdout,
                      .stop_after = "dce", .zero = o.lay.zero, .bucket_bytes = o.bucket_bytes,
                      .no_overlap = o.no_overlap, .keep_attn_out = o.keep_attn_out,
                      .head_major_attn = o.head_major_attn,
                      .recompute_norms = o.recompute_norms,
                      .recompute_pointwise = o.recompute_pointwise,
                      .recompute_layers = o.recompute_layers};
  if (pass_run_all(m, &popt)) {
    rc = EXIT_INTERNAL;
    goto done;
  }
  if (layout_check(m, &o.lay, stderr)) {
    rc = EXIT_BAD;
    goto done;
  }
  /* a padding nobody asked for that the model cannot take: dropped, said
   * (after the layout check: the probe shards the model at this layout) */
  char dropped[512] = "";
  if (!o.pad_vocab && !pv && padding_refused(&prog, &o, m, dropped, sizeof dropped)) {
    m->pad_vocab = 1;
    m->pad_dropped = arena_strdup(&m->arena, dropped);
  }
  o.pipe.emit = o.emit;
  o.pipe.machine = &o.machine;
  if (pp_request_check(m, &o.lay, &o.pipe, stderr)) {
    rc = EXIT_BAD;
    goto done;
  }
  Cost cost;
  cost_analyze(m, &o.lay, &cost);
  predict_on(&cost, &o, m);
  /* the microbatches a step routes, as pp_request_check settled them (a routed
   * model's at pp 1 too, --microbatches included); 0 for a dense model at pp 1 */
  cost.microbatches = o.pipe.microbatches;
  FILE *rep = o.emit || o.dump_after ? stderr : stdout;
  int ranks = o.lay.tp * o.lay.pp * o.lay.dp;
  o.pads = cost.padding_params > 0;
  if (o.outdir && (ranks > 1 || o.pads) && o.lay.pp == 1) { /* pipelines: refused after their
                                                               plan */
    /* a trainer for several ranks (or a padded vocabulary) runs the rank-local module */
    char why[512] = "";
    m->mesh_ep = o.lay.ep; /* experts split over ep of the dp ranks (ep divides dp) */
    if (pass_shard(m, o.lay.tp, o.lay.dp, o.sp, why, sizeof why) && !why[0])
      snprintf(why, sizeof why, "the partitioner failed");
    if (why[0]) {
      cg_report(rep, m, &o.lay, &cost);
      fprintf(stderr, "parc: error: %s\n", why);
      rc = EXIT_BAD;
      goto done;
    }
  }
  popt.stop_after = NULL;
  popt.start_after = "dce";
  if (pass_run_all(m, &popt)) {
    rc = EXIT_INTERNAL;
    goto done;
  }
  if (m->mesh_tp * m->mesh_dp > 1) {
    comm_analyze(m, &cost.comm);
    cost.has_comm = 1;
  }
  /* A routed model (pp_split_matters) with M > 1 microbatches trains as a
   * one-stage pipeline at pp 1: the same microbatches as on every layout. */
  int routed_mb = o.lay.pp == 1 && o.pipe.microbatches > 1;
  int pipe1 = routed_mb && o.outdir;
  /* --explain without -o: the report's per-rank module (plan_ranks, or the
   * pipeline's module below), printed after the report; with -o, the trainer's */
  xout = o.explain && !o.outdir ? open_memstream(&xtext, &xlen) : NULL;
  if (o.lay.pp > 1 && o.pipe.memory && (rc = choose_split(&prog, &o, m))) goto done;
  if (o.lay.pp > 1 || routed_mb) { /* (without -o too: the report's communication) */
    /* the pipeline plan on the differentiated module; the report's stages follow it */
    char why[512];
    if (pp_plan(m, &o.lay, &o.pipe, &pipe, why, sizeof why)) {
      fprintf(stderr, "parc: internal error: %s\n", why);
      rc = EXIT_INTERNAL;
      goto done;
    }
    if (o.lay.pp > 1) {
      cost_analyze_split(m, &o.lay, pipe.st.chunk_layers, pipe.st.nchunks, &cost);
      predict_on(&cost, &o, m); /* (cost_analyze_split starts afresh) */
      cost.pipe = &pipe;
      cost.microbatches = pipe.st.microbatches;
    }
  }
  double t3 = now();
  if (o.emit && !strcmp(o.emit, "ir")) ir_print(stdout, m);
  if (o.emit && !strcmp(o.emit, "dot")) ir_print_dot(stdout, m);
  if (o.outdir && (o.lay.pp > 1 || pipe1)) {
    char why[512] = "";
    if (!(tm = pipe_module(&prog, &o, m, &pipe, &stage_prog, why, sizeof why)) && !why[0])
      snprintf(why, sizeof why, "internal error: the pipelined trainer");
    if (why[0]) {
      cg_report(rep, m, &o.lay, &cost);
      fprintf(stderr, "parc: error: %s\n", why);
      rc = strstr(why, "internal error") ? EXIT_INTERNAL : EXIT_BAD;
      goto done;
    }
    /* what the trainer's ranks communicate: its microbatch module's collectives
     * M times, the step's once (the whole-batch module counted above is not run) */
    pipe_comm(&o, m, tm, &stage_prog, &cost);
    if (pipe_retime(&o, m, tm, &stage_prog, &pipe)) {
      rc = EXIT_INTERNAL;
      goto done;
    }
  } else if (!o.outdir && (o.lay.pp > 1 || routed_mb)) {
    /* the report alone: the same trainer's communication and timing, its module then
     * freed */
    char why[512] = "";
    PpProgram pp = {0};
    IrModule *r = pipe_module(&prog, &o, m, &pipe, &pp, why, sizeof why);
    if (r) pipe_comm(&o, m, r, &pp, &cost);
    int bad = r && pipe_retime(&o, m, r, &pp, &pipe);
    /* each stage's arena and device bytes, as -o would allocate them */
    if (r && !bad && !o.emit && !o.dump_after &&
        cg_plan_arena(r, !o.no_fuse, &pp, &cost.arena_bytes, cost.machine, machine_bf16(r),
                      NULL, o.bf16_store, !o.no_batch, &cost.gpu, why, sizeof why)) {
      fprintf(stderr, "parc: internal error: %s\n", why);
      bad = 1;
    }
    if (r && !bad && xout && explain(&o, r, &pp, &cost, xout)) bad = 1;
    ir_module_free(r);
    if (bad) {
      rc = EXIT_INTERNAL;
      goto done;
    }
  }
  /* a routed model's microbatches at pp 1: the step is their accumulation */
  if (routed_mb && pipe.kernel_timed) cost.accum = &pipe;
  /* (after the pipeline's chunks were timed by their kernels) */
  if (o.emit && !strcmp(o.emit, "timeline")) cg_timeline_svg(stdout, m->name, &pipe);
  if (o.emit && !strcmp(o.emit, "trace")) cg_timeline_trace(stdout, m->name, &pipe);
  if (o.outdir) {
    if (make_dir(o.outdir)) {
      fprintf(stderr, "parc: error: cannot create directory '%s': %s\n", o.outdir,
              strerror(errno));
      rc = EXIT_BAD;
      goto done;
    }
    int targets = o.targets ? o.targets
                            : have_nvcc() ? CG_TARGET_CPU | CG_TARGET_CUDA : CG_TARGET_CPU;
    CgProject proj = {o.outdir, o.model, PARC_VERSION, !o.no_fuse, o.generic_cpu, &cost, &o.lay,
                      targets, o.cuda_arch, tm ? &stage_prog : NULL, &cost.step,
                      &cost.gpu, o.bf16_store, !o.no_batch};
    char why[512];
    if (cg_write_project(tm ? tm : m, &proj, &cost.arena_bytes, why, sizeof why)) {
      fprintf(stderr, "parc: error: %s\n", why);
      rc = EXIT_INTERNAL;
      goto done;
    }
  }
  char unplanned[512] = "";
  double t4 = now();
  /* (a routed model's microbatches: their accumulating trainer's arena is the
   * pipelined one, planned only with -o, as at pp > 1) */
  if (!o.outdir && !o.emit && !o.dump_after && o.lay.pp == 1 && !routed_mb &&
      plan_ranks(&prog, &o, m, &cost, xout, unplanned, sizeof unplanned) && !unplanned[0])
    snprintf(unplanned, sizeof unplanned, "unknown reason");
  if (xout && fclose(xout)) {
    free(xtext);
    xtext = NULL;
  }
  xout = NULL;
  double t5 = now();
  cg_report(rep, m, &o.lay, &cost);
  if (unplanned[0])
    fprintf(rep, "per-rank activation arena and communication: not planned (%s)\n", unplanned);
  if (o.explain && !o.outdir) {
    if (xtext && !unplanned[0]) {
      fprintf(rep, "\n%s", xtext);
    } else {
      fprintf(stderr, "parc: error: --explain: the per-rank plan was not made (%s)\n",
              unplanned[0] ? unplanned : "out of memory");
      rc = EXIT_INTERNAL;
    }
  }
  if (o.explain && o.outdir) {
    fputc('\n', rep);
    if (explain(&o, tm ? tm : m, tm ? &stage_prog : NULL, &cost, rep))
      rc = EXIT_INTERNAL;
  }
  if (o.outdir) {
    FILE *f = open_out(o.outdir, "report.txt");
    if (f) {
      cg_report(f, m, &o.lay, &cost);
      if (fclose(f)) rc = EXIT_BAD;
    }
    FILE *g = open_out(o.outdir, "model.ir");
    if (g) {
      ir_print(g, tm ? tm : m); /* what train.c runs */
      if (fclose(g)) rc = EXIT_BAD;
    }
    if (!f || !g) rc = EXIT_BAD;
    if (!rc && !o.emit && !o.dump_after)
      printf("wrote %s: build with cmake -S %s -B %s/build && cmake --build %s/build\n",
             o.outdir, o.outdir, o.outdir, o.outdir);
  }
  if (o.timing)
    fprintf(stderr, "time: parse %.2f ms, lower %.2f ms, passes %.2f ms, total %.2f ms "
            "(of it: report's per-rank plan %.2f ms, pipeline module and -o project %.2f ms)\n",
            (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3, (now() - t0) * 1e3,
            (t5 - t4) * 1e3, (t4 - t3) * 1e3);
done:
  if (xout) fclose(xout);
  free(xtext);
  ir_module_free(tm);
  pp_plan_free(&pipe);
  free((void *)o.pipe.stage_layers);
  free(o.time_layers);
  ir_module_free(m);
  arena_free(&parse_arena);
  source_free(&user);
  free(o.ov);
  return rc;
}
