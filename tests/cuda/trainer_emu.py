#!/usr/bin/env python3
"""tests/cuda/trainer_emu.py -- a generated GPU trainer (train_cuda) run on the
CPU through the CUDA emulation (tests/cuda/emu), against the CPU trainer.

  trainer_emu.py --name NAME --model MODEL [--parc-args ARGS] [--checks LIST]
                 --parc PARC --root SRC --emu-lib LIB --link LIBS --cc CC --cxx CXX
                 --work DIR [--steps N]

parc writes examples/MODEL.dsl with --target all and ARGS (a layout) into
DIR/NAME; the project's own CMakeLists builds the CPU trainer `train`;
kernels.cu, rewritten for g++ by emu_rewrite.py, and train_cuda.c are built and
linked against LIB (libparcrt_cuda_emu: runtime/cuda on the emulation) and
LIBS (libparcrt and what it needs) into `train_cuda_emu`.  No nvcc, no GPU.

Checks (comma-separated; each one prints a line, any failure exits 1):
  cpu     train and train_cuda_emu (fp32 GEMMs, the ranks of a layout as threads
          sharing the one emulated GPU, host-staged collectives) from the same
          seed: losses within 1e-4 relative at every step, and at one rank the
          step-1 gradients per tensor within 1e-4 relative L2 (compare.py, as
          tests/gpu/check.sh does on a real GPU);
  graph   PARC_CUDA_GRAPH=1 (step 2 captured into a graph, later steps
          replayed) against =0: losses bit for bit, the notice about the
          fallback printed exactly --graph-notices times (default 0), and
          steps - 1 graph launches (0 after a notice) by the emulation's count
          (KCU_EMU_STATS);
  device  PARC_CUDA_LOCAL=device (device copies and reduction kernels instead
          of host staging) against the host-staged run: losses bit for bit;
  launch  the start-up checks and launchers: on an emulated GPU of 16 MiB
          (KCU_EMU_MEM_MIB) train_cuda refuses to start with the planned and
          free bytes (several ranks sharing a GPU of just over one rank's need:
          the shared message; a rank's planned bytes those of parc's report,
          "GPU trainer: ... of device memory a rank", a stage's line for stage
          programs) as a setup error: exit 1,
          the message once and
          nothing else, no "internal error", no step in its log; likewise a
          cudaMalloc failing after the memory check (KCU_EMU_MALLOC_FAIL=3:
          memory taken meanwhile), its line naming the allocation, the bytes
          asked and free; with several ranks likewise PARC_CUDA_COMM=nccl (the
          emulated build has no NCCL) and, where mpirun exists, mpirun --quiet
          -np RANKS with a 16 MiB GPU per process (and with only ranks 1.. too
          small, or out of memory after the check: every rank stops, rank 1's
          message), every process finalising MPI (Open MPI: its btl verbose
          lines), likewise a bad PARC_CUDA_PIPE_STREAM; and mpirun -np RANKS (a
          process per rank, each its own
          emulated GPU, host-staged collectives over MPI) gives the threads'
          losses bit for bit;
  bf16    PARC_CUDA_GEMM=bf16 (GEMM operands rounded to bf16, attention on the
          tensor-core kernels, rt_cuda_attn_mma.cu) against train: losses
          within 2e-4 relative, and at one rank the step-1 gradients within
          3e-2 relative L2 (gpt2_tiny: 2.7e-5 and 6.0e-3; with the forward's
          causal mask one key too wide, 1.2e-3 and 0.31).
  store   the trainer generated with -D precision=bf16, whose kernels and
          GEMMs store activations as bf16 (codegen/cuda_store.h: GEMMs read
          them without copies, kernels widen them as they load them): losses
          and step-1
          gradients bit for bit those of the --bf16-store round trainer (f32
          buffers, the same values rounded as they are stored: the same
          roundings, made elsewhere), and within the bf16 check's bounds of
          train (gpt2_tiny: 3.1e-5 and 6.2e-3); with the device check and
          several ranks, its PARC_CUDA_LOCAL=device run gives the host-staged
          run's losses bit for bit (the all-reduces it stores as bf16,
          rt_cuda_all_reduce_bf16, on both backends); it has such values
          (RT_CUDA_MM_*_BF16 in train_cuda.c, kernels taking a bf16 input,
          kcu_round_bf16 in the round trainer), and the weights' bf16 copy
          the GEMMs read is either stored by the optimizer's kernels beside
          each update (PB arguments; codegen/cuda_store.h mirror_all: the
          round trainer's GEMMs convert the f32 params at every call, so a
          stale or misplaced copy changes the losses from step 2 on) or
          made by a call each step, never both; its GELUs in GEMM epilogues
          (one rt_cuda_matmul_gelu / _dgelu call for each kernel plan.json
          marks so; GPT-2's trainers have some, pipelined ones in their
          stage programs too): where it has any, its run with the emulated heuristic
          refusing every epilogue (the kernels after the GEMMs) gives the
          losses of its run with all of them turned off (PARC_CUDA_GELU,
          _BGRAD, _BIAS=0) bit for bit, within 1e-3 of the epilogues'
          (gpt2_tiny: 4.6e-5); PARC_CUDA_GEMM=fp32 is
          refused as a setup error (exit 1, no step); on a GPU too small it
          refuses to start with parc's reported bytes (its own arena, with
          the bf16 values at 2 bytes: codegen/cuda_arena.h).
  bgrad   the bias gradients, which the plain run computes in their weight
          gradients' GEMMs (train_cuda.c: one rt_cuda_matmul_ta_bgrad per
          plan.json gpu_in_gemm kernel; the emulated cuBLASLt's BGRADA
          epilogue; in a pipelined trainer's stage programs, GEMMs adding into
          the accumulator, the sums through rt_cuda_bgrad_ws's scratch into
          it), against the kernels launched
          after those GEMMs instead: a cuBLASLt without the epilogue
          (KCU_EMU_LT_NO_BGRAD=1) and PARC_CUDA_BGRAD=0 give each other's
          losses and step-1 gradients bit for bit (the same kernels), those
          within the cpu check's bounds of train, with steps x the fused
          kernels more launches than the plain run (x the microbatches in a
          pipelined trainer; KCU_EMU_STATS);
  tune    PARC_CUDA_GEMM_TUNE=FILE with three emulated cuBLASLt algorithms
          (KCU_EMU_LT_ALGOS=3; the heuristic's first sleeping, KCU_EMU_LT_SLOW=0;
          the others summing in chunks: other bits), as a CUDA graph
          (PARC_CUDA_GRAPH=1): the run that times every plan and writes FILE
          (its closing line counts them, one FILE line each) within the cpu
          check's bounds of train, and a second run reading FILE (timing
          none) gives its losses bit for bit;
  batch   the trainer generated with --no-batch (every kernel launched on its
          own) against the default one, which batches independent launches of
          one kernel's code (codegen/cuda_batch.h; it has some, NAME_multi_launch;
          a pipelined trainer: its optimizer's, each on the one stage holding
          the parameter): losses and step-1 gradients bit for bit, and by the
          emulation's count (KCU_EMU_STATS) the unbatched run makes exactly
          steps x the absorbed launches (plan.json's gpu_batch_of) more launches;
  layout  the trainer generated with --head-major-attn (split_heads and
          merge_heads copies around attention) against the default one, whose
          attention reads and writes token-major tensors (passes/attn_layout.c;
          it has some, RT_CUDA_ATTN_*_TOKENS in train_cuda.c): losses and step-1
          gradients bit for bit, and fewer kernel launches by the emulation's
          count;
  recompute  with store: the bf16 trainer generated with --recompute norms
          (passes/remat_norm.c: the backward recomputes the layers' norm outputs,
          stored as bf16 as the kept ones were) against the store check's:
          losses within 1e-4 and step-1 gradients within 2e-2 relative (its
          forward norms take no fused prologue: other sum orders), with a
          smaller GPU arena (plan.json gpu_arena_bytes);
  pointwise  with store: likewise with --recompute pointwise (passes/remat_act.c:
          gelu(h), silu(g) * u computed again in the backward, stored as bf16 as
          the kept ones were): losses within 1e-4 and step-1 gradients within
          2e-2 relative (the plans' buffers differ, and with them what is
          stored as bf16), with a smaller GPU arena;
  layers  with store: likewise with --recompute layers (passes/remat_layer.c:
          each layer's forward run again before its backward): losses within
          1e-4 and step-1 gradients within 2e-2 relative (as recompute: the
          forward norms take no fused prologue), with a smaller GPU arena;
  grads   with cpu and bf16: the step-1 gradients compared at several ranks too
          (layouts whose --save-grads file is the whole model, e.g. ZeRO-1's
          pieces gathered from the dp ranks).

What this proves and what it cannot: the generated kernels, the launchers and
libparcrt_cuda compute what the CPU trainer computes, and graph capture
replays the same work; the emulation runs each stream's work at enqueue, one
operation at a time, so a missing stream or event wait (a race) is invisible.
"""
import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# bf16 against the CPU's f32, losses and step-1 gradients: the bf16 check (GEMM
# operands rounded; gpt2_tiny: 2.0e-5 and 6.0e-3) and the store check
# (activations too; 3.1e-5 and 6.2e-3)
BF16_LOSS_TOL, BF16_GRAD_TOL = 2e-4, 3e-2
# ... but not moe_tiny's: its expert weights see a few tokens each, and which
# experts a token takes moves with the rounding.  The bf16 GEMMs alone put layer
# 2's w3 gradient 3.9e-2 off; with the activations (GEMM results included) every
# gradient of layer 0's MoE block moves 6-11% at once (gate 0.106, w1-w3
# 0.062-0.069), the others as before: a token's top-2 choice flipping there
BF16_GRAD_TOL_OF = {"moe_tiny": 0.15}
# --recompute norms against the kept norms, both bf16: the forward's norms take
# no fused prologue there (their sums in another order, an f32 ulp now and then,
# which a bf16 rounding can turn into a bf16 ulp; gpt2_tiny: losses 7.7e-6,
# step-1 gradients 5.6e-3); --recompute layers likewise
RECOMPUTE_LOSS_TOL, RECOMPUTE_GRAD_TOL = 1e-4, 2e-2
# --recompute pointwise against the kept values, both bf16: each copy computes
# the forward's formula from the same operands (GPT-2's h = a + b, under gelu's
# copy and gelu's gradient, inside each kernel: passes/remat.c), but the plans'
# buffers differ and with them what is stored as bf16: gpt2_tiny's fp32 plan
# with the logits' gradient written over the logits fragments more than the
# plan apart, which it then is, so its GPU trainer keeps the logits f32 where
# the plan without the copies stores them and their gradient bf16 in place:
# losses 1.7e-5, step-1 gradients 3.8e-3; llama_tiny tp 2 pp 2 bit for bit;
# the CPU trainers agree bit for bit
POINTWISE_LOSS_TOL, POINTWISE_GRAD_TOL = 1e-4, 2e-2


def run(cmd, log, env=None, timeout=900):
    """Runs cmd with its output into log; returns whether it exited 0."""
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            f.write("\ntrainer_emu: timed out after %d s\n" % timeout)
            rc = 124
    if rc != 0:
        sys.stdout.write("command failed (%d): %s\n" % (rc, " ".join(map(shlex.quote, cmd))))
        with open(log) as f:
            sys.stdout.write("".join(f.readlines()[-40:]))
    return rc == 0


def build(a, proj, extra=(), cpu=True):
    """parc (ARGS and extra), the CPU trainer (where cpu), and train_cuda_emu;
    False (reported) on failure."""
    parc_cmd = [a.parc, os.path.join(a.root, "examples", a.model + ".dsl"), "--target", "all",
                "-o", proj] + shlex.split(a.parc_args) + list(extra)
    if not run(parc_cmd, proj + ".parc.log"):
        return False
    os.makedirs(proj + "/build", exist_ok=True)
    if cpu and not (
            run(["cmake", "-S", proj, "-B", proj + "/build", "-DCMAKE_BUILD_TYPE=Release"],
                proj + ".cmake.log") and
            run(["cmake", "--build", proj + "/build", "--target", "train"], proj + ".build.log")):
        return False
    emu_inc = ["-I" + os.path.join(HERE, "emu"), "-I" + HERE, "-I" + proj, "-I" + a.root]
    kcpp = proj + "/kernels_emu.cpp"
    if not run([sys.executable, os.path.join(HERE, "emu_rewrite.py"), proj + "/kernels.cu", kcpp],
               proj + ".rewrite.log"):
        return False
    objs = [proj + "/kernels_emu.o", proj + "/train_cuda_emu.o"]
    return (run([a.cxx, "-std=c++17", "-O2", "-ffp-contract=off", "-w"] + emu_inc +
                ["-c", kcpp, "-o", objs[0]], proj + ".kernels.log") and
            run([a.cc, "-std=c11", "-O1", "-ffp-contract=off"] + emu_inc +
                ["-c", proj + "/train_cuda.c", "-o", objs[1]], proj + ".host.log") and
            run([a.cxx] + objs + [a.emu_lib] + shlex.split(a.link) +
                ["-o", proj + "/build/train_cuda_emu"], proj + ".link.log"))


def compare(a, kind, ref, got, tol, what):
    """compare.py KIND REF GOT TOL; prints its RESULT line under what."""
    r = subprocess.run([sys.executable, os.path.join(a.root, "tests", "gpu", "compare.py"), kind,
                        ref, got, str(tol)], capture_output=True, text=True)
    last = (r.stdout.strip().splitlines() or ["(no output) " + r.stderr.strip()])[-1]
    print("%-34s %s" % (what, last))
    if r.returncode != 0:
        sys.stdout.write(r.stdout + r.stderr)
    return r.returncode == 0


def refused(cmd, env, tag, want, check=None):
    """Runs cmd (train_cuda_emu with --log TAG.jsonl added), which must refuse the
    setup at start-up: exit 1, want printed once and nothing else (mpirun runs
    --quiet: without it Open MPI adds its notice about a nonzero exit status,
    finalised or not), no "internal error" and no step wrapper, and the log has
    its config record but no step record (no step ran).  check(line), if given,
    returns the problems of the refusal's line (a list)."""
    log, jl = tag + ".log", tag + ".jsonl"
    if os.path.exists(jl):
        os.remove(jl)
    at = cmd.index(":") if ":" in cmd else len(cmd)  # mpirun's first context: world rank 0
    # Open MPI: its btl framework's verbose lines show which processes finalised MPI
    # ("close: component self closed" is printed by MPI_Finalize)
    ranks = mpi_ranks(cmd) if "mpirun" in os.path.basename(cmd[0]) and open_mpi(cmd[0]) else 0
    verbose = ["--mca", "btl_base_verbose", "10"] if ranks else []
    with open(log, "w") as f:
        rc = subprocess.run(cmd[:1] + verbose + cmd[1:at] + ["--log", jl] + cmd[at:], stdout=f,
                            stderr=subprocess.STDOUT, env=env, timeout=300).returncode
    text = open(log).read()
    fin = len(set(re.findall(r"^\[([^\]]+)\] mca: base: close: component self closed$", text,
                             re.M)))
    # (those lines, and the btl's others, start with Open MPI's "[host:pid] ")
    text = "".join(x for x in text.splitlines(True) if not re.match(r"\[[^\]\s]+:\d+\] ", x))
    recs = [json.loads(line) for line in open(jl)] if os.path.exists(jl) else []
    bad = [w for w in ("internal error", "failed: ") if w in text]
    lines = [x for x in text.splitlines() if x.strip()]
    problems = (["exit %d, expected 1" % rc] if rc != 1 else []) + \
        (["%r printed %d times, expected once" % (want, text.count(want))]
         if text.count(want) != 1 else []) + \
        (["%d lines of output, expected the refusal's alone" % len(lines)]
         if len(lines) != 1 else []) + \
        (check(lines[0]) if check and len(lines) == 1 and want in lines[0] else []) + \
        (["%d of the %d processes finalised MPI" % (fin, ranks)] if fin != ranks else []) + \
        ["%r printed" % w for w in bad] + \
        (["the log has no config record"] if not recs or "config" not in recs[0] else []) + \
        (["%d step records in the log" % sum("step" in r for r in recs)]
         if any("step" in r for r in recs) else [])
    if problems:
        print("a setup refusal: %s; output:\n%s" % ("; ".join(problems), text[-2000:]))
        return False
    line = [x for x in text.splitlines() if want in x][0]
    print("%-34s refused: %s" % ("mpirun" if "mpirun" in cmd[0] else os.path.basename(cmd[0]),
                                  line[:160]))
    return True


def open_mpi(mpirun):
    """Whether mpirun is Open MPI's."""
    r = subprocess.run([mpirun, "--version"], capture_output=True, text=True)
    return "Open MPI" in r.stdout + r.stderr


def mpi_ranks(cmd):
    """The processes an mpirun command line starts (the sum of its -np)."""
    return sum(int(cmd[i + 1]) for i, x in enumerate(cmd) if x == "-np")


def oom_line(line):
    """The problems of a start-up out-of-memory refusal's line (refused's check):
    it names the allocation, the bytes asked and free and the check's figures,
    which must be those of a check that passed, and says what to do."""
    m = re.search(r"out of GPU memory at start-up: cudaMalloc\(\w[^)]*\) of (\d+) bytes "
                  r"failed with (\d+) bytes free of (\d+) \(the start-up check saw (\d+) free "
                  r"for this rank's plan of (\d+) bytes\)", line)
    if not m:
        return ["the line does not give the allocation, its bytes and the bytes free"]
    asked, free, total, seen, plan = map(int, m.groups())
    problems = []
    if not 0 < asked <= plan:
        problems.append("%d bytes asked, not within the plan's %d" % (asked, plan))
    if not plan <= seen <= total or free > total:
        problems.append("planned %d, free %d then and %d now of %d: not a check that passed"
                        % (plan, seen, free, total))
    if "free the GPU" not in line:
        problems.append("the line does not say what to do")
    return problems


def small_gpu(one_rank):
    """An emulated GPU too small for the trainer (KCU_EMU_MEM_MIB) and the words of
    its refusal: one rank alone does not fit; several share one GPU that one
    rank's plan fits (its GEMM workspace alone is 32 MiB)."""
    return ("16", "the plan does not fit: planned") if one_rank else \
        ("48", "ranks sharing this GPU do not fit")


def planned_as_reported(proj, line):
    """The refusal's planned bytes (this rank's) against parc's report of the same
    project ("GPU trainer: ... (N bytes) of device memory a rank"; trainers of
    stage programs: a line a stage, "stage S: ... (N bytes)", the refusing
    world rank's stage S = rank / (tp dp)): the problems."""
    with open(proj + "/report.txt") as f:
        text = f.read()
    rep = re.search(r"^GPU trainer: .*?\((\d+) bytes\) of device memory a rank", text, re.M)
    got = re.search(r"this rank (\d+)", line) or re.search(r"planned (\d+) bytes", line)
    if re.search(r"^GPU trainer: device memory a rank of each stage", text, re.M):
        lay = re.search(r"^layout: tp (\d+), pp \d+, dp (\d+)", text, re.M)
        who = re.search(r"\brank (\d+) on ", line)
        stage = int(who.group(1)) // (int(lay.group(1)) * int(lay.group(2))) \
            if lay and who else -1
        rep = re.search(r"^    stage %d: .*?\((\d+) bytes\)" % stage, text, re.M)
    if not rep or not got:
        return ["no planned bytes in the report or the refusal: %r" % line]
    planned = int(got.group(1))
    return [] if planned == int(rep.group(1)) else \
        ["planned %d bytes at start-up, %s in parc's report" % (planned, rep.group(1))]


def launch(a, proj, emu, env, steps, one_rank):
    """The launch check (module doc); proj.emu.jsonl is the plain run (ranks as threads)."""
    mib, want = small_gpu(one_rank)
    if not refused([emu] + steps, dict(env, KCU_EMU_MEM_MIB=mib), proj + ".small_gpu", want,
                   lambda line: planned_as_reported(proj, line)):
        return False
    # memory taken after the agreed check (the emulation fails the 3rd cudaMalloc, the
    # first rank's arena or another rank's buffer): the user's environment, agreed
    # over the ranks (one rank alone fails here with threads), exit 1, no step
    if not refused([emu] + steps, dict(env, KCU_EMU_MALLOC_FAIL="3"), proj + ".oom",
                   "out of GPU memory at start-up: cudaMalloc(" +
                   ("arena)" if one_rank else ""), oom_line):
        return False
    # another refusal of the setup: NCCL asked of a build without it (the emulation's)
    if not one_rank and not refused([emu] + steps, dict(env, PARC_CUDA_COMM="nccl",
                                                        PARC_CUDA_LOCAL=""),
                                    proj + ".nccl_setting", "built without NCCL"):
        return False
    # a bad PARC_CUDA_PIPE_STREAM (NCCL's pipeline transfers on their own stream or not)
    if not one_rank and not refused([emu] + steps, dict(env, PARC_CUDA_PIPE_STREAM="2"),
                                    proj + ".pipe_stream", "PARC_CUDA_PIPE_STREAM='2': expected 1"):
        return False
    mpirun = shutil.which("mpirun")
    if one_rank or not mpirun:
        return True
    ranks, f = 1, shlex.split(a.parc_args)
    for flag in ("--tp", "--pp", "--dp"):
        if flag in f:
            ranks *= int(f[f.index(flag) + 1])
    e = dict(env, KCU_EMU_GPUS=str(ranks))
    opts = [mpirun, "--allow-run-as-root", "--oversubscribe", "--quiet"]
    for var in ("KCU_EMU_GPUS", "PARC_CUDA_COMM", "PARC_CUDA_GEMM", "PARC_CUDA_LOCAL",
                "PARC_CUDA_GRAPH"):
        opts += ["-x", var]
    mpi = opts + ["-np", str(ranks), emu] + steps
    # a process per GPU, each too small: every rank refuses, the message once
    if not refused(opts + ["-x", "KCU_EMU_MEM_MIB=16", "-np", str(ranks), emu] + steps, e,
                   proj + ".mpi_small_gpu", "the plan does not fit: planned"):
        return False
    # only ranks 1.. too small: rank 0 would fit, yet every rank stops at start-up
    # with rank 1's message (the ranks agree), none waiting for a peer
    mpmd = opts + ["-np", "1", emu] + steps + \
        [":", "-np", str(ranks - 1), "-x", "KCU_EMU_MEM_MIB=16", emu] + steps
    if not refused(mpmd, e, proj + ".mpi_small_gpu1", "rank 1 on GPU 1 (Emulated"):
        return False
    # a pipeline: only its last stage's ranks too small, the first of them refusing
    # with that stage's planned bytes (each stage plans its own parameters and GEMMs)
    pp = int(f[f.index("--pp") + 1]) if "--pp" in f else 1
    first = ranks - ranks // pp
    last = opts + ["-np", str(first), emu] + steps + \
        [":", "-np", str(ranks - first), "-x", "KCU_EMU_MEM_MIB=16", emu] + steps
    if pp > 1 and not refused(last, e, proj + ".mpi_small_gpu_last",
                              "rank %d on GPU %d (Emulated" % (first, first),
                              lambda line: planned_as_reported(proj, line)):
        return False
    # ranks 1.. out of memory after the agreed check: every rank stops, rank 1's message
    oom = opts + ["-np", "1", emu] + steps + \
        [":", "-np", str(ranks - 1), "-x", "KCU_EMU_MALLOC_FAIL=3", emu] + steps
    if not refused(oom, e, proj + ".mpi_oom", "out of GPU memory at start-up: cudaMalloc(arena) "
                   "of ", lambda line: oom_line(line) + ([] if "rank 1 on GPU 1 (" in line
                                                          else ["not rank 1's message"])):
        return False
    ok = run(mpi + ["--log", proj + ".mpi.jsonl"], proj + ".mpi.log", env=e)
    return ok and compare(a, "losses", proj + ".emu.jsonl", proj + ".mpi.jsonl", 0,
                          a.name + " mpirun = threads bits")  # the plain run: threads


def gelu_kernels(a, proj, sp, env, steps, src):
    """The bf16 trainer's GELUs in GEMM epilogues (codegen/cuda_batch.h): one
    rt_cuda_matmul_gelu or _dgelu call for each plan.json kernel marked so;
    where there are any, the trainer whose epilogues the emulated heuristic
    refuses (KCU_EMU_LT_NO_BGRAD: every kernel after its GEMM) equals the one
    with every epilogue turned off, bit for bit, and within bf16 rounding of
    the epilogues' run (other roundings of h and dg)."""
    with open(sp + "/plan.json") as f:
        planned = sum(k.get("gpu_epilogue") in ("gelu", "gelu_grad")
                      for k in json.load(f)["kernels"])
    calls = src.count("CHECK(rt_cuda_matmul_gelu(") + src.count("CHECK(rt_cuda_matmul_dgelu(")
    if not planned and a.model.startswith("gpt2"):  # GPT-2's MLP: GELU(h + b) after its GEMM
        print("%s: no GELU or GELU gradient in a GEMM epilogue planned (stage programs "
              "included)" % a.name)
        return False
    if calls != planned:
        print("%s: %d GELUs and gradients in GEMM epilogues in plan.json, %d "
              "rt_cuda_matmul_gelu and _dgelu calls" % (a.name, planned, calls))
        return False
    if not planned:
        return True
    off = {"PARC_CUDA_GELU": "0", "PARC_CUDA_BGRAD": "0", "PARC_CUDA_BIAS": "0"}
    runs = {}
    for tag, extra in (("gelu_refused", {"KCU_EMU_LT_NO_BGRAD": "1"}), ("gelu_off", off)):
        runs[tag] = proj + "." + tag + ".jsonl"
        if not run([sp + "/build/train_cuda_emu"] + steps + ["--log", runs[tag]],
                   proj + "." + tag + ".log", env=dict(env, PARC_CUDA_GEMM="bf16", **extra)):
            return False
    return compare(a, "losses", runs["gelu_off"], runs["gelu_refused"], 0,
                   "%s GELU kernels: refused = off bits (%d calls)" % (a.name, calls)) and \
        compare(a, "losses", proj + ".store.jsonl", runs["gelu_off"], 1e-3,
                a.name + " GELU kernels ~ epilogues")


def store(a, proj, env, steps, grads, against_cpu, one_rank, device):
    """The store check (the head comment): proj_bf16 against proj_bf16r, and
    against the CPU's f32; with device (several ranks), the bf16 trainer's
    device-local run against its host-staged one; and the bf16 trainer's
    planned device bytes (its own arena, codegen/cuda_arena.h, and GEMM
    workspaces) as parc reported them."""
    sp, rp = proj + "_bf16", proj + "_bf16r"
    if not (build(a, sp, ["-D", "precision=bf16"], cpu=False) and
            build(a, rp, ["-D", "precision=bf16", "--bf16-store", "round"], cpu=False)):
        return False
    with open(sp + "/train_cuda.c") as f:  # GEMM operands and results stored as bf16
        n = sum(f.read().count(flag) for flag in ("RT_CUDA_MM_A_BF16 |", "RT_CUDA_MM_B_BF16 |",
                                                   "RT_CUDA_MM_C_BF16 |"))
    with open(sp + "/train_cuda.c") as f:  # all-reduces whose sums it stores as bf16,
        src = f.read()  # and collectives moving bf16 values (group_copy, all-gathers)
        ar, pairs = src.count("rt_cuda_all_reduce_bf16("), src.count("/* bf16: 2 elements a float */")
        # the weights' bf16 copy: kept by the optimizer's kernels (their PB
        # arguments, codegen/cuda_store.h mirror_all) or made again by the step
        mirrors = src.count("(uint16_t *)PB(")
        per_step = src.count("CHECK(rt_cuda_params_to_bf16(dev));")
    with open(sp + "/kernels.cu") as f:  # kernels reading a bf16 value (declarations once)
        k = sum("const __nv_bfloat16 *" in line for line in f if line.startswith("__global__"))
    with open(rp + "/kernels.cu") as f:
        r = f.read().count("kcu_round_bf16(")
    if n == 0 or k == 0 or r == 0:
        print("%s: -D precision=bf16 stores %d GEMM operands or results and %d kernel inputs "
              "as bf16, the round trainer %d values" % (a.name, n, k, r))
        return False
    if (mirrors > 0) == (per_step > 0):
        print("%s: the weights' bf16 copy is stored by %d optimizer kernels and made by %d "
              "calls a step: one of the two, not both" % (a.name, mirrors, per_step))
        return False
    runs = {}
    for tag, p in (("store", sp), ("round", rp)):
        runs[tag] = (proj + "." + tag + ".jsonl", grads(tag))
        if not run([p + "/build/train_cuda_emu"] + steps + ["--log", runs[tag][0]] + runs[tag][1],
                   proj + "." + tag + ".log", env=dict(env, PARC_CUDA_GEMM="bf16")):
            return False
    ok = compare(a, "losses", runs["round"][0], runs["store"][0], 0,
                 "%s bf16 stores = round bits (%d GEMM operands and results, %d kernels, "
                 "%d all-reduces, %d copies and gathers, weights' copy %s)"
                 % (a.name, n, k, ar, pairs, "stored by %d optimizer launches" % mirrors
                    if mirrors else "made each step"))
    if ok and device:  # rt_cuda_all_reduce_bf16 on the device-local collectives too
        dev = proj + ".store_dev.jsonl"
        ok = run([sp + "/build/train_cuda_emu"] + steps + ["--log", dev],
                 proj + ".store_dev.log",
                 env=dict(env, PARC_CUDA_GEMM="bf16", PARC_CUDA_LOCAL="device")) and \
            compare(a, "losses", runs["store"][0], dev, 0,
                    "%s bf16 stores, device = host bits (%d all-reduces, %d copies and "
                    "gathers)" % (a.name, ar, pairs))
    if ok and runs["store"][1]:
        ok = compare(a, "grads", runs["round"][1][1], runs["store"][1][1], 0,
                     a.name + " bf16 stores, gradients")
    ok = ok and gelu_kernels(a, proj, sp, env, steps, src)
    ok = ok and against_cpu("store", BF16_LOSS_TOL, BF16_GRAD_TOL_OF.get(a.name, BF16_GRAD_TOL),
                            "bf16 activations vs CPU",
                            "bf16 activations, gradients")
    mib, want = small_gpu(one_rank)
    return ok and refused([sp + "/build/train_cuda_emu"] + steps, dict(env, PARC_CUDA_GEMM="fp32"),
                          sp + ".fp32", "this trainer's GEMMs read or write bf16 values") and \
        refused([sp + "/build/train_cuda_emu"] + steps,
                dict(env, PARC_CUDA_GEMM="bf16", KCU_EMU_MEM_MIB=mib),
                sp + ".small_gpu", want, lambda line: planned_as_reported(sp, line))


def recompute(a, proj, env, steps, grads, what="norms"):
    """The recompute check (the head comment), or the pointwise or layers one
    (what "pointwise", "layers"): proj_bf16rec (proj_bf16pw, proj_bf16layers)
    against the store check's proj_bf16 run."""
    tag = {"norms": "recompute"}.get(what, what)
    sp, cp = proj + "_bf16", proj + {"norms": "_bf16rec", "pointwise": "_bf16pw"}.get(
        what, "_bf16" + what)
    if not build(a, cp, ["-D", "precision=bf16", "--recompute", what], cpu=False):
        return False
    arena = []
    for p in (sp, cp):
        with open(p + "/plan.json") as f:
            arena.append(json.load(f)["cost"]["gpu_arena_bytes"])
    with open(cp + "/report.txt") as f:
        m = re.search(r"recomputed in the backward \(--recompute %s\): (\d+) " % what, f.read())
    if not m or not arena[1] < arena[0]:
        print("%s: --recompute %s: %s recomputed, GPU arena %d bytes, %d without" %
              (a.name, what, m.group(1) if m else "none", arena[1], arena[0]))
        return False
    log = proj + "." + tag + ".jsonl"
    if not run([cp + "/build/train_cuda_emu"] + steps + ["--log", log] + grads(tag),
               proj + "." + tag + ".log", env=dict(env, PARC_CUDA_GEMM="bf16")):
        return False
    loss_tol, grad_tol = (RECOMPUTE_LOSS_TOL, RECOMPUTE_GRAD_TOL) if what != "pointwise" else \
        (POINTWISE_LOSS_TOL, POINTWISE_GRAD_TOL)
    ok = compare(a, "losses", proj + ".store.jsonl", log, loss_tol,
                 "%s bf16 --recompute %s vs kept (%s values; GPU arena %d -> %d)" %
                 (a.name, what, m.group(1), arena[0], arena[1]))
    if ok and grads(tag):
        ok = compare(a, "grads", grads("store")[1], grads(tag)[1], grad_tol,
                     "%s bf16 --recompute %s, gradients" % (a.name, what))
    return ok


def same_bits(a, proj, vp, tag, what, env, steps, grads, stats):
    """Runs vp's trainer (proj generated with other parc flags) as run TAG:
    its losses and step-1 gradients bit for bit proj's plain run's (WHAT
    names them).  Returns the kernel launches of (plain, TAG) by the
    emulation's count, or None (reported)."""
    log = proj + "." + tag + ".jsonl"
    if not run([vp + "/build/train_cuda_emu"] + steps + ["--log", log] + grads(tag),
               proj + "." + tag + ".log", env=dict(env, KCU_EMU_STATS=stats(tag))):
        return None
    ok = compare(a, "losses", log, proj + ".emu.jsonl", 0, a.name + " " + what)
    if ok and grads(tag):
        ok = compare(a, "grads", grads(tag)[1], grads("emu")[1], 0, a.name + " " + tag +
                     ", gradients")
    if not ok:
        return None
    counts = []
    for t in ("emu", tag):
        with open(stats(t)) as f:
            counts.append(json.load(f)["kernel_launches"])
    return counts


def batch(a, proj, env, steps, grads, stats):
    """The batch check (the head comment): proj_nobatch against proj."""
    np_ = proj + "_nobatch"
    if not build(a, np_, ["--no-batch"], cpu=False):
        return False
    with open(proj + "/plan.json") as f:
        absorbed = sum("gpu_batch_of" in k for k in json.load(f)["kernels"])
    with open(proj + "/train_cuda.c") as f:
        multi = f.read().count("_multi_launch(")
    with open(np_ + "/train_cuda.c") as f:
        multi_off = f.read().count("_multi_launch(")
    if absorbed == 0 or multi == 0 or multi_off != 0:
        print("%s: %d launches absorbed by %d batched launches; --no-batch has %d" %
              (a.name, absorbed, multi, multi_off))
        return False
    counts = same_bits(a, proj, np_, "nobatch", "batched = unbatched bits (%d launches "
                       "absorbed)" % absorbed, env, steps, grads, stats)
    if counts is None:
        return False
    want = absorbed * int(steps[1])
    if counts[1] - counts[0] != want:
        print("%s: %d kernel launches batched, %d unbatched: %d fewer, expected %d "
              "(%d absorbed a step)" % (a.name, counts[0], counts[1], counts[1] - counts[0],
                                        want, absorbed))
        return False
    print("%-34s %d kernel launches, %d unbatched" % (a.name + " launches", counts[0], counts[1]))
    return True


def layout(a, proj, env, steps, grads, stats):
    """The layout check (the head comment): proj_headmajor against proj."""
    hp = proj + "_headmajor"
    if not build(a, hp, ["--head-major-attn"], cpu=False):
        return False
    flags = []
    for p in (proj, hp):
        with open(p + "/train_cuda.c") as f:
            flags.append(f.read().count("_TOKENS"))
    if flags[0] == 0 or flags[1] != 0:
        print("%s: %d token-major attention flags in train_cuda.c, %d with --head-major-attn" %
              (a.name, flags[0], flags[1]))
        return False
    counts = same_bits(a, proj, hp, "headmajor", "token-major = head-major attention bits "
                       "(%d flags)" % flags[0], env, steps, grads, stats)
    if counts is None:
        return False
    if not counts[0] < counts[1]:
        print("%s: %d kernel launches token-major, %d head-major: not fewer" %
              (a.name, counts[0], counts[1]))
        return False
    print("%-34s %d kernel launches, %d head-major" % (a.name + " launches", counts[0],
                                                      counts[1]))
    return True


def tune(a, proj, gpu, log_of, jsonl, against_cpu):
    """The tune check (the module's docstring)."""
    path = proj + ".tune.txt"
    if os.path.exists(path):
        os.remove(path)
    env = {"KCU_EMU_LT_ALGOS": "3", "KCU_EMU_LT_SLOW": "0", "PARC_CUDA_GEMM_TUNE": path,
           "PARC_CUDA_GRAPH": "1"}
    if not gpu("tune", env, save_grads=True) or not gpu("tune2", env):
        return False
    lines = []
    if os.path.exists(path):
        with open(path) as f:
            lines = [ln for ln in f if ln.strip() and not ln.startswith("#")]
    m1 = re.search(r"GEMM tuning: 0 plans as \S+ names, (\d+) timed", log_of("tune"))
    m2 = re.search(r"GEMM tuning: (\d+) plans? as \S+ names, 0 timed", log_of("tune2"))
    if not m1 or not m2 or int(m1.group(1)) != len(lines) or int(m2.group(1)) != len(lines) \
            or not lines:
        print("%s: tuning: %d lines in %s; the runs' closing lines: %s, %s (see %s.tune.log)" %
              (a.name, len(lines), path, m1 and m1.group(0), m2 and m2.group(0), proj))
        return False
    ok = against_cpu("tune", 1e-4, 1e-4, "tuned GEMMs vs CPU", "tuned GEMMs, step-1 gradients")
    ok = ok and compare(a, "losses", jsonl("tune"), jsonl("tune2"), 0,
                        a.name + " tuned = read from the file, bits")
    if ok:
        print("%-34s %d GEMM plans timed, then read" % (a.name + " tune", len(lines)))
    return ok


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--name", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--parc-args", default="")
    p.add_argument("--checks", default="cpu")
    p.add_argument("--graph-notices", type=int, default=0)
    p.add_argument("--steps", type=int, default=4)
    for req in ("parc", "root", "emu-lib", "link", "cc", "cxx", "work"):
        p.add_argument("--" + req, required=True)
    a = p.parse_args()
    checks = a.checks.split(",")
    known = ("cpu", "graph", "device", "bf16", "store", "launch", "grads", "batch", "layout",
             "recompute", "pointwise", "layers", "bgrad", "tune")
    bad = [c for c in checks if c not in known]
    if bad:
        p.error("unknown check %s (%s)" % (bad[0], ", ".join(known)))
    os.makedirs(a.work, exist_ok=True)
    proj = os.path.join(a.work, a.name)
    if not build(a, proj):
        return 1
    steps = ["--steps", str(a.steps), "--quiet"]
    one_rank = not any(f in a.parc_args for f in ("--tp", "--pp", "--dp", "--ep"))
    env = dict(os.environ, PARC_CUDA_COMM="host", PARC_CUDA_LOCAL="host", PARC_CUDA_GEMM="fp32",
               PARC_CUDA_GRAPH="0")
    emu = proj + "/build/train_cuda_emu"

    def jsonl(tag):
        return proj + "." + tag + ".jsonl"

    def stats(tag):
        return proj + "." + tag + ".stats.json"

    cmp_grads = one_rank or "grads" in checks

    def grads(tag):  # the step-1 gradients, compared at one rank (or with the grads check)
        return ["--save-grads", proj + "." + tag + "_grads.safetensors"] if cmp_grads else []

    def gpu(tag, extra_env, save_grads=False):  # (--save-grads keeps its step plain)
        e = dict(env, KCU_EMU_STATS=stats(tag), **extra_env)
        return run([emu] + steps + ["--log", jsonl(tag)] + (grads(tag) if save_grads else []),
                   proj + "." + tag + ".log", env=e)

    def log_of(tag):
        with open(proj + "." + tag + ".log") as f:
            return f.read()

    def against_cpu(tag, loss_tol, grad_tol, what, grad_what):
        ok = compare(a, "losses", jsonl("cpu"), jsonl(tag), loss_tol, a.name + " " + what)
        if ok and cmp_grads:
            ok = compare(a, "grads", grads("cpu")[1], grads(tag)[1], grad_tol,
                         a.name + " " + grad_what)
        return ok

    def same_bits(tag, what):  # against the plain run
        return compare(a, "losses", jsonl("emu"), jsonl(tag), 0, a.name + " " + what)

    # the plain run (fp32, host-staged, no graph): the reference of every check
    ok = gpu("emu", {}, save_grads=True)
    if ok and ("cpu" in checks or "bf16" in checks or "store" in checks):
        ok = run([proj + "/build/train"] + steps + ["--log", jsonl("cpu")] + grads("cpu"),
                 proj + ".cpu.log")
    if ok and "cpu" in checks:
        ok = against_cpu("emu", 1e-4, 1e-4, "losses vs CPU", "step-1 gradients")
    if ok and "bf16" in checks:
        ok = gpu("bf16", {"PARC_CUDA_GEMM": "bf16"}, save_grads=True) and \
            against_cpu("bf16", BF16_LOSS_TOL, BF16_GRAD_TOL_OF.get(a.name, BF16_GRAD_TOL),
                        "bf16 GEMMs vs CPU",
                        "bf16 gradients")
    if ok and "store" in checks:
        ok = store(a, proj, env, steps, grads, against_cpu, one_rank,
                   "device" in checks and not one_rank)
    if ok and "recompute" in checks and "store" in checks:
        ok = recompute(a, proj, env, steps, grads)
    if ok and "pointwise" in checks and "store" in checks:
        ok = recompute(a, proj, env, steps, grads, "pointwise")
    if ok and "layers" in checks and "store" in checks:
        ok = recompute(a, proj, env, steps, grads, "layers")
    if ok and "bgrad" in checks and "cpu" in checks:
        with open(proj + "/plan.json") as f:
            plan = json.load(f)
            fused = sum("gpu_in_gemm" in k for k in plan["kernels"])
            # a pipelined trainer's stage programs run once a microbatch
            runs = a.steps * plan["layout"].get("microbatches", 1)
        with open(proj + "/train_cuda.c") as f:
            src = f.read()
            calls = src.count("rt_cuda_matmul_ta_bgrad(") + src.count("rt_cuda_matmul_bias(")
        if fused == 0 or calls != fused:
            print("%s: %d bias sums and adds with their GEMMs in plan.json, %d "
                  "rt_cuda_matmul_ta_bgrad and _bias calls" % (a.name, fused, calls))
            ok = False
        # no algorithm with either epilogue (the emulated heuristic), and both turned off
        off = {"PARC_CUDA_BGRAD": "0", "PARC_CUDA_BIAS": "0"}
        ok = ok and gpu("nobgrad", {"KCU_EMU_LT_NO_BGRAD": "1"}, save_grads=True) and \
            gpu("bgrad0", off, save_grads=True)
        ok = ok and compare(a, "losses", jsonl("nobgrad"), jsonl("bgrad0"), 0,
                            a.name + " no epilogue = PARC_CUDA_BGRAD=0 BIAS=0 bits")
        if ok and cmp_grads:
            ok = compare(a, "grads", grads("nobgrad")[1], grads("bgrad0")[1], 0,
                         a.name + " no epilogue = PARC_CUDA_BGRAD=0 BIAS=0, gradients")
        ok = ok and against_cpu("nobgrad", 1e-4, 1e-4, "bias kernels vs CPU",
                                "bias kernels, step-1 gradients")
        if ok:
            n = []
            for tag in ("emu", "nobgrad"):
                with open(stats(tag)) as f:
                    n.append(json.load(f)["kernel_launches"])
            if n[1] - n[0] != fused * runs:
                print("%s: %d kernel launches with the epilogue, %d without: expected %d more" %
                      (a.name, n[0], n[1], fused * runs))
                ok = False
            else:
                print("%-34s %d bias sums and adds in GEMMs, %d kernel launches (%d without)" %
                      (a.name + " bgrad", fused, n[0], n[1]))
    if ok and "tune" in checks and "cpu" in checks:
        ok = tune(a, proj, gpu, log_of, jsonl, against_cpu)
    if ok and "batch" in checks:
        ok = batch(a, proj, env, steps, grads, stats)
    if ok and "layout" in checks:
        ok = layout(a, proj, env, steps, grads, stats)
    if ok and "graph" in checks:
        ok = gpu("graph", {"PARC_CUDA_GRAPH": "1"})
        n = log_of("graph").count("PARC_CUDA_GRAPH=1: ") if ok else 0
        if ok and n != a.graph_notices:
            print("%s: %d graph fallback notices, expected %d (see %s.graph.log)" %
                  (a.name, n, a.graph_notices, proj))
            ok = False
        # step 1 plain, step 2 captured then launched, the others replayed: steps - 1
        # graph launches (none after a fallback notice, none at PARC_CUDA_GRAPH=0)
        for tag, want in (("emu", 0), ("graph", 0 if a.graph_notices else a.steps - 1)):
            if not ok:
                break
            with open(stats(tag)) as f:
                got = json.load(f)["graph_launches"]
            if got != want:
                print("%s: the %s run launched %d graphs, expected %d" % (a.name, tag, got, want))
                ok = False
        ok = ok and same_bits("graph", "graph = plain bits")
    if ok and "device" in checks:
        ok = gpu("dev", {"PARC_CUDA_LOCAL": "device"})
        if ok and "collectives device-local (device copies" not in log_of("dev"):
            print("%s: the start-up line does not name the device-local collectives" % a.name)
            ok = False
        ok = ok and same_bits("dev", "device = host bits")
    if ok and "launch" in checks:
        ok = launch(a, proj, emu, env, steps, one_rank)
    print("trainer_emu %s: %s" % (a.name, "ok" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
