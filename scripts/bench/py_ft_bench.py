#!/usr/bin/python3
"""Per-step fault tolerance for Python scripts against restarting: one fault schedule, three
ways, side by side, then the steady cost per step.

  ft        ctrun --fault_tolerance=step, the script on ctrun_worker.FaultTolerance (survivors
            go on; the killed worker is replaced and heals from a peer)
  restart   ctrun (torchrun's model): the same MLP as a plain DDP script; every worker restarts
            and resumes from rank 0's checkpoint
  torchrun  the reference torchrun 1.13 (tests/python/torchrun_ref.py), the same DDP script

The schedule: 3 workers (py_ft_bench/train.py, torch on CPU, Gloo) train one epoch; on the first
attempt the last rank SIGKILLs itself before step --kill_at; the restart modes checkpoint every
--checkpoint_every steps. Every commit and the fault are timestamped in the consumed log:
  fault -> next commit   ms from the fault to the first step committed after it
  steps lost             committed steps done again

Then the steady cost: the same MLP widened so that a step takes about 100 ms or more, no fault,
plain DDP under ctrun against FaultTolerance under ctrun --fault_tolerance=step: median step
times side by side.

Usage: /usr/bin/python3 scripts/bench/py_ft_bench.py [--quick] [--reps N] [--part faults|steady]
Needs a built ctrun: build-bench/ (scripts/bench/run.sh builds it; CTRUN_BENCH_BUILD=DIR for
another). Runs in a loopback-only network namespace.
"""
import argparse
import os
import re
import statistics
import sys
import tempfile
import time

from bench_common import ensure_loopback_netns, run_bounded
from ft_bench import fault_row, median, print_fault_table

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
BUILD = os.environ.get("CTRUN_BENCH_BUILD", os.path.join(ROOT, "build-bench"))
TORCHRUN = ["/usr/bin/python3", os.path.join(ROOT, "tests", "python", "torchrun_ref.py")]
TRAIN = os.path.join(HERE, "py_ft_bench", "train.py")
JOB_TIMEOUT_S = 300


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def ctrun():
    return os.path.join(BUILD, "launcher", "ctrun")


def command(mode, args, tmp, consumed, fault):
    script = [TRAIN, "--samples", str(args.samples), "--consumed_log", consumed]
    if fault:
        script += ["--kill_at", str(args.kill_at)]
    launcher = ["--standalone", "--nproc_per_node=3", "--max_restarts=1", "--monitor_interval=0.1"]
    if mode == "ft":
        return [ctrun(), "--fault_tolerance=step"] + launcher + script + ["--mode", "ft"]
    script += ["--mode", "ddp", "--checkpoint", os.path.join(tmp, f"ckpt.{time.monotonic_ns()}"),
               "--checkpoint_every", str(args.checkpoint_every)]
    return ([ctrun()] if mode == "restart" else TORCHRUN) + launcher + script


def one_run(mode, args, tmp, rep, fault):
    consumed = os.path.join(tmp, f"{mode}.{rep}.{int(fault)}.consumed")
    env = dict(os.environ, PYTHON_EXEC="/usr/bin/python3")
    start = time.monotonic()
    code, out = run_bounded(command(mode, args, tmp, consumed, fault), JOB_TIMEOUT_S, env=env)
    wall = time.monotonic() - start
    if code != 0:
        raise RuntimeError(f"{mode} run exited {code}:\n{out[-3000:]}")
    return fault_row(mode, consumed, wall, fault)


def bench_faults(args, tmp):
    modes = ("ft", "restart", "torchrun")
    rows = {m: [] for m in modes}
    for rep in range(args.reps):
        for mode in modes[rep % 3:] + modes[:rep % 3]:
            r = one_run(mode, args, tmp, rep, True)
            rows[mode].append(r)
            log(f"rep {rep} {mode:8}: " + ", ".join(f"{k} {v:.1f}" for k, v in r.items()))
    print(f"\n### Python: one of 3 workers SIGKILLed before step {args.kill_at} (MLP, "
          f"{args.samples} samples, batch 32 per worker, checkpoint every "
          f"{args.checkpoint_every} in the restart modes), median of {args.reps}\n")
    print_fault_table(rows)
    f_ms = median(rows["ft"], "to_commit_ms")
    met = f_ms < 500 and median(rows["ft"], "steps_lost") == 0
    print(f"\nGoal: fault -> next committed step under 500 ms with 0 steps lost: "
          f"{'MET' if met else 'MISSED'} ({f_ms:.0f} ms)")


STEP_MS = re.compile(r"step_ms ([0-9.]+)")


def steady_cost(args, tmp):
    script = [TRAIN, "--samples", str(args.steady_samples), "--width", str(args.width),
              "--layers", "3", "--batch_size", "64", "--log_every", "5"]
    times = {"ddp": [], "ft": []}
    env = dict(os.environ, PYTHON_EXEC="/usr/bin/python3")
    for rep in range(args.reps):
        for mode in (("ddp", "ft") if rep % 2 == 0 else ("ft", "ddp")):
            launcher = [ctrun(), "--standalone", "--nproc_per_node=3"]
            if mode == "ft":
                launcher.append("--fault_tolerance=step")
            code, out = run_bounded(launcher + script + ["--mode", mode], JOB_TIMEOUT_S, env=env)
            if code != 0:
                raise RuntimeError(f"steady {mode} exited {code}:\n{out[-3000:]}")
            steps = [float(x) for x in STEP_MS.findall(out)][1:]  # the first window: the start
            if not steps:
                raise RuntimeError(f"steady {mode}: no step_ms lines:\n{out[-2000:]}")
            times[mode].append(statistics.median(steps))
            log(f"steady rep {rep} {mode}: {times[mode][-1]:.2f} ms/step")
    p, f = statistics.median(times["ddp"]), statistics.median(times["ft"])
    cost = 100 * (f - p) / p
    print(f"\n### Python: the steady cost per step, 3 workers, no fault (MLP 3 x {args.width}, "
          f"batch 64 per worker), median over {args.reps} run(s) of each\n")
    print("| DDP under ctrun (ms/step) | FaultTolerance under --fault_tolerance=step (ms/step) "
          "| cost |")
    print("|---|---|---|")
    print(f"| {p:.2f} | {f:.2f} | {cost:+.1f} % |")
    print(f"\nGoal: under 3 % for steps of 100 ms or more: "
          f"{'MET' if cost < 3 and p >= 100 else 'MISSED'} ({cost:+.1f} % at {p:.0f} ms)")


def main():
    ensure_loopback_netns(__file__, sys.argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--samples", type=int, default=None)
    parser.add_argument("--kill_at", type=int, default=None)
    parser.add_argument("--checkpoint_every", type=int, default=10)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--steady_samples", type=int, default=None)
    parser.add_argument("--part", choices=("faults", "steady"), default=None)
    parser.add_argument("--in-netns", action="store_true")
    args = parser.parse_args()
    args.reps = args.reps or (1 if args.quick else 3)
    args.samples = args.samples or (3072 if args.quick else 9600)
    args.kill_at = args.kill_at or (15 if args.quick else 45)
    args.steady_samples = args.steady_samples or (5760 if args.quick else 11520)
    if not os.path.exists(ctrun()):
        sys.exit(f"py_ft_bench: no {ctrun()}: build it (scripts/bench/run.sh) or set "
                 "CTRUN_BENCH_BUILD")
    print(f"py_ft_bench: {os.uname().nodename}, {os.cpu_count()} cores, "
          f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}")
    with tempfile.TemporaryDirectory(prefix="py_ft_bench.") as tmp:
        if args.part in (None, "faults"):
            bench_faults(args, tmp)
        if args.part in (None, "steady"):
            steady_cost(args, tmp)


if __name__ == "__main__":
    main()
