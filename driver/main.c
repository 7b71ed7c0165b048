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

#include "codegen/project.h"
#include "codegen/report.h"
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
          "                         (--tp/--dp: a trainer of tp*dp ranks, threads or mpirun;\n"
          "                         --pp/--ep above 1 are not generated yet)\n"
          "      --no-fuse          one kernel per operation (for checking fusion)\n"
          "      --cpu host|generic kernels for this machine's CPU (default) or any x86-64\n"
          "      --emit ir|dot      print the IR as text or as a Graphviz graph to stdout\n"
          "  -D NAME=VALUE          override a config or train value (-D layers=2 -D batch=4)\n"
          "      --tp N             tensor-parallel degree (default 1)\n"
          "      --pp N             pipeline-parallel degree (default 1)\n"
          "      --dp N             data-parallel degree (default 1)\n"
          "      --ep N             expert-parallel degree, carved from dp (default 1)\n"
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
  int verify, timing, no_fuse, generic_cpu;
} Options;

static int parse_args(int argc, char **argv, Options *o) {
  enum { O_EMIT = 256, O_TP, O_PP, O_DP, O_EP, O_DUMP, O_NOVERIFY, O_TIME, O_VERSION, O_NOFUSE,
         O_CPU };
  static const struct option longs[] = {
      {"output", required_argument, 0, 'o'},  {"emit", required_argument, 0, O_EMIT},
      {"tp", required_argument, 0, O_TP},     {"pp", required_argument, 0, O_PP},
      {"dp", required_argument, 0, O_DP},     {"ep", required_argument, 0, O_EP},
      {"dump-after", required_argument, 0, O_DUMP},
      {"no-verify", no_argument, 0, O_NOVERIFY}, {"time", no_argument, 0, O_TIME},
      {"help", no_argument, 0, 'h'},          {"version", no_argument, 0, O_VERSION},
      {"no-fuse", no_argument, 0, O_NOFUSE},  {"cpu", required_argument, 0, O_CPU},
      {0, 0, 0, 0}};
  o->lay = (Layout){1, 1, 1, 1};
  o->verify = 1;
  o->ov = calloc((size_t)argc + 1, sizeof *o->ov);
  if (!o->ov) return EXIT_INTERNAL;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":o:D:h", longs, NULL)) != -1) {
    switch (c) {
    case 'o': o->outdir = optarg; break;
    case O_EMIT:
      if (strcmp(optarg, "ir") && strcmp(optarg, "dot")) {
        fprintf(stderr, "parc: error: --emit '%s': expected ir or dot\n", optarg);
        return EXIT_BAD;
      }
      o->emit = optarg;
      break;
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
    case O_CPU:
      if (strcmp(optarg, "host") && strcmp(optarg, "generic")) {
        fprintf(stderr, "parc: error: --cpu '%s': expected host or generic\n", optarg);
        return EXIT_BAD;
      }
      o->generic_cpu = !strcmp(optarg, "generic");
      break;
    case O_TIME: o->timing = 1; break;
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
  return 0;
}

int main(int argc, char **argv) {
  Options o = {0};
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
  /* The forward module first: the layout is checked and costed on it. */
  PassOptions popt = {.verify = o.verify, .dump_after = o.dump_after, .dump = stdout,
                      .stop_after = "dce"};
  if (pass_run_all(m, &popt)) {
    rc = EXIT_INTERNAL;
    goto done;
  }
  if (layout_check(m, &o.lay, stderr)) {
    rc = EXIT_BAD;
    goto done;
  }
  Cost cost;
  cost_analyze(m, &o.lay, &cost);
  FILE *rep = o.emit || o.dump_after ? stderr : stdout;
  int ranks = o.lay.tp * o.lay.pp * o.lay.dp;
  if (o.outdir && ranks > 1) {
    /* a trainer for several ranks runs the rank-local module */
    char why[512] = "";
    if (o.lay.pp > 1 || o.lay.ep > 1)
      snprintf(why, sizeof why, "-o with --pp or --ep above 1: code generation for pipeline "
               "and expert parallelism is not implemented yet; the report above is exact");
    else if (pass_shard(m, o.lay.tp, o.lay.dp, why, sizeof why) && !why[0])
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
  double t3 = now();
  if (o.emit && !strcmp(o.emit, "ir")) ir_print(stdout, m);
  if (o.emit && !strcmp(o.emit, "dot")) ir_print_dot(stdout, m);
  if (o.outdir) {
    if (make_dir(o.outdir)) {
      fprintf(stderr, "parc: error: cannot create directory '%s': %s\n", o.outdir,
              strerror(errno));
      rc = EXIT_BAD;
      goto done;
    }
    CgProject proj = {o.outdir, o.model, PARC_VERSION, !o.no_fuse, o.generic_cpu, &cost, &o.lay};
    char why[512];
    if (cg_write_project(m, &proj, &cost.arena_bytes, why, sizeof why)) {
      fprintf(stderr, "parc: error: %s\n", why);
      rc = EXIT_INTERNAL;
      goto done;
    }
  }
  cg_report(rep, m, &o.lay, &cost);
  if (o.outdir) {
    FILE *f = open_out(o.outdir, "report.txt");
    if (f) {
      cg_report(f, m, &o.lay, &cost);
      if (fclose(f)) rc = EXIT_BAD;
    }
    FILE *g = open_out(o.outdir, "model.ir");
    if (g) {
      ir_print(g, m);
      if (fclose(g)) rc = EXIT_BAD;
    }
    if (!f || !g) rc = EXIT_BAD;
    if (!rc && !o.emit && !o.dump_after)
      printf("wrote %s: build with cmake -S %s -B %s/build && cmake --build %s/build\n",
             o.outdir, o.outdir, o.outdir, o.outdir);
  }
  if (o.timing)
    fprintf(stderr, "time: parse %.2f ms, lower %.2f ms, passes %.2f ms, total %.2f ms\n",
            (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3, (now() - t0) * 1e3);
done:
  ir_module_free(m);
  arena_free(&parse_arena);
  source_free(&user);
  free(o.ov);
  return rc;
}
