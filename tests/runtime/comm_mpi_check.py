#!/usr/bin/env python3
"""tests/runtime/comm_mpi_check.py -- the communicator's MPI backend, through mpirun.

    comm_mpi_check.py npN COMM_XCHECK WORKDIR      N in 2, 3, 4
    comm_mpi_check.py timeout COMM_XCHECK WORKDIR
    comm_mpi_check.py async_timeout COMM_XCHECK WORKDIR
    comm_mpi_check.py stop COMM_XCHECK WORKDIR

npN runs comm_xcheck's rank program twice on the same inputs, as N MPI processes
and as N threads; each run checks its own results against serial references, and
the files of results the two runs wrote must be identical byte for byte (the
backends sum in the same order).  timeout runs 3 processes where rank 1 skips an
all_reduce: every rank must fail after the 1 s timeout with its one-line message;
async_timeout the same with rt_comm_all_reduce_start (the failure comes from the
wait).  stop runs 3 processes whose rank_main all return RT_COMM_STOP_AGREED
(the ranks agreed to stop, as on a refused GPU setup): rt_comm_run must finalise
MPI on every rank and keep each rank's message, each process exiting 1 (mpirun
told not to abort the others when the first exits, so that each prints its
line), in well under the communication timeout.

Exit 77 (skipped) when mpirun is missing or libparcrt was built without MPI.
"""
import os
import shutil
import subprocess
import sys
import time

SKIP = 77


def mpi_env():
    env = dict(os.environ)
    env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
    env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    # Under AddressSanitizer: Open MPI's own allocations outlive MPI_Finalize.
    asan = env.get("ASAN_OPTIONS", "")
    env["ASAN_OPTIONS"] = (asan + ":" if asan else "") + "detect_leaks=0"
    return env


def run(cmd, env, timeout):
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=timeout, text=True, errors="replace")
    return p, time.monotonic() - t0


def fail(msg, p=None):
    print("FAIL: " + msg)
    if p is not None:
        print("--- stdout\n" + p.stdout + "--- stderr\n" + p.stderr)
    return 1


def check_np(n, exe, workdir, mpirun, env):
    base = os.path.join(workdir, "comm_xcheck_np%d" % n)
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    mpi_dir, thr_dir = os.path.join(base, "mpi"), os.path.join(base, "threads")
    p, secs = run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(n), exe, "mpi",
                   mpi_dir], env, 120)
    if p.returncode != 0:
        return fail("mpirun -np %d comm_xcheck mpi exited %d" % (n, p.returncode), p)
    print("mpi, %d ranks: %.2f s" % (n, secs))
    p, secs = run([exe, "threads", str(n), thr_dir], dict(os.environ), 120)
    if p.returncode != 0:
        return fail("comm_xcheck threads %d exited %d" % (n, p.returncode), p)
    print("threads, %d ranks: %.2f s" % (n, secs))
    for r in range(n):
        with open(os.path.join(mpi_dir, "rank%d.bin" % r), "rb") as f:
            a = f.read()
        with open(os.path.join(thr_dir, "rank%d.bin" % r), "rb") as f:
            b = f.read()
        if not a or len(a) != len(b):
            return fail("rank %d: %d bytes from mpi, %d from threads" % (r, len(a), len(b)))
        if a != b:
            i = next(i for i in range(len(a)) if a[i] != b[i])
            return fail("rank %d: mpi and threads results differ at byte %d" % (r, i))
        print("rank %d: %d bytes identical" % (r, len(a)))
    return 0


def check_timeout(exe, mpirun, env, mode="mpi-timeout"):
    p, secs = run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "3", exe,
                   mode], env, 60)
    if p.returncode == 0:
        return fail("mpirun succeeded although rank 1 skipped a collective", p)
    want = [
        "comm_xcheck: rank 0 (group world, 3 ranks): all_reduce of 1024 floats timed out "
        "after 1 s waiting for rank 1",
        "comm_xcheck: rank 2 (group world, 3 ranks): all_reduce of 1024 floats timed out "
        "after 1 s waiting for rank 1",
        "comm_xcheck: rank 1 (group world, 3 ranks): barrier timed out after 1 s waiting "
        "for the other ranks",
    ]
    lines = p.stderr.splitlines()
    for w in want:
        if w not in lines:
            return fail("missing line: " + w, p)
    if secs > 20:
        return fail("the failing run took %.1f s" % secs, p)
    print("every rank failed as expected in %.2f s" % secs)
    return 0


def check_stop(exe, mpirun, env):
    # each process prints after MPI_Finalize; mpirun must not kill the others
    # when the first exits 1 (its default), or a line may be missing
    p, secs = run([mpirun, "--allow-run-as-root", "--oversubscribe", "--quiet",
                   "--mca", "orte_abort_on_non_zero_status", "0", "-np", "3", exe, "mpi-stop"],
                  env, 60)
    # (so Open MPI's mpirun exits 0 although each process exits 1: the line
    # each prints says it returns 1)
    if p.returncode not in (0, 1):
        return fail("mpirun exited %d, expected 0 or 1" % p.returncode, p)
    lines = p.stderr.splitlines()
    for r in range(3):
        w = "comm_xcheck: stopped, MPI finalised: rank %d: stopping with the others" % r
        if w not in lines:
            return fail("missing line: " + w, p)
    if len(lines) != 3:
        return fail("%d lines on stderr, expected the 3 ranks' alone" % len(lines), p)
    if secs > 20:
        return fail("the stop took %.1f s" % secs, p)
    print("every rank stopped and finalised MPI in %.2f s" % secs)
    return 0


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    case, exe, workdir = sys.argv[1:]
    mpirun = shutil.which("mpirun")
    if not mpirun:
        print("SKIP: mpirun not found (apt-get install openmpi-bin)")
        return SKIP
    if subprocess.run([exe, "has-mpi"]).returncode != 0:
        print("SKIP: libparcrt was built without MPI")
        return SKIP
    env = mpi_env()
    if case.startswith("np"):
        return check_np(int(case[2:]), exe, workdir, mpirun, env)
    if case == "timeout":
        return check_timeout(exe, mpirun, env)
    if case == "stop":
        return check_stop(exe, mpirun, env)
    if case == "async_timeout":
        return check_timeout(exe, mpirun, env, "mpi-async-timeout")
    print("unknown case " + case)
    return 2


if __name__ == "__main__":
    sys.exit(main())
