#!/usr/bin/python3
"""Recovery from each kind of injected fault: ctrun's restart mode and per-step fault tolerance
side by side, measured from ctrun's own fault reports (ctrun --faults --fault_report).

  restart   ctrun --max_restarts: every worker restarts and resumes from the checkpoint (mlp,
            --checkpoint_every steps): torchrun's model
  ft        ctrun --fault_tolerance=step with mlp --fault_tolerant: the survivors go on, a
            worker that ended is replaced alone and heals from a peer

Each job: 3 workers train mlp on CPU for one epoch; one fault hits the last rank at step
--at_step (kill, term, segv, exception, a 1 s hang, a 2 s straggler at 25 %, its node cut off
from the rendezvous for 1 s), or the rendezvous is killed and restarted 1 s later at --after
seconds. From the report
(the agent's clock): the worker's exit seen, workers running again, the job past the step it
was at (any worker reporting a step beyond the furthest one reported when the fault fired: the
survivors under --fault_tolerance=step, the restarted workers once they caught up otherwise),
the target's own first step after the fault and the steps it did again; and the job's wall
time against a clean run of the same mode in the same repetition. Repetitions interleave every
kind and mode.

Usage: /usr/bin/python3 scripts/bench/fault_bench.py [--quick] [--reps N]
Needs build-bench/ (scripts/bench/run.sh builds it; CTRUN_BENCH_BUILD=DIR for another). Runs in
a loopback-only network namespace.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from bench_common import ensure_loopback_netns, run_bounded

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
BUILD = os.environ.get("CTRUN_BENCH_BUILD", os.path.join(ROOT, "build-bench"))
JOB_TIMEOUT_S = 300
FT_TIMEOUTS = ["--ft_collective_timeout_ms", "2000", "--ft_heartbeat_timeout_ms", "1000",
               "--ft_join_timeout_ms", "4000", "--ft_quorum_timeout_ms", "60000"]
KINDS = {
    "kill": "kill",
    "term": "term",
    "segv": "segv",
    "exception": "exception",
    "hang 1 s": "hang:duration=1",
    "straggler 2 s at 25 %": "straggler:duration=2,speed=0.25",
    "cut off 1 s": "cut_off:duration=1",
    "rendezvous restart 1 s": "rendezvous_restart:duration=1",
}
# The rendezvous' own faults take a time, not a rank and a step: about when rank 2 reaches
# --at_step in a clean run.
TIMED = {"rendezvous_restart"}
QUICK_KINDS = ["kill", "exception", "hang 1 s"]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def fault_spec(kind, rank, step, after):
    """The inline plan of one fault of `kind` on `rank` at `step` (or at `after` seconds)."""
    name, _, fields = KINDS[kind].partition(":")
    spec = f"{name}:after={after}" if name in TIMED else f"{name}:rank={rank},at_step={step}"
    return spec + ("," + fields if fields else "")


def command(mode, args, tmp, fault, report):
    ctrun = [os.path.join(BUILD, "launcher", "ctrun"), "--standalone", "--nproc_per_node=3",
             "--max_restarts=3", "--fault_report", report]
    if fault:
        ctrun += ["--faults", fault]
    mlp = [os.path.join(BUILD, "trainers", "mlp"), "--epochs", "1", "--samples",
           str(args.samples), "--batch_size", "32", "--seed", "7"]
    if mode == "ft":
        return ctrun + ["--fault_tolerance=step"] + mlp + ["--fault_tolerant"] + FT_TIMEOUTS
    return ctrun + mlp + ["--checkpoint_dir", os.path.join(tmp, "ckpt"),
                          "--checkpoint_every", str(args.checkpoint_every)]


def one_run(mode, kind, args, rep):
    """The fault report's figures for one job (kind None: a clean run), and its wall time."""
    with tempfile.TemporaryDirectory(prefix="fault_bench.") as tmp:
        report = os.path.join(tmp, "report.json")
        fault = fault_spec(kind, 2, args.at_step, args.after) if kind else None
        start = time.monotonic()
        rc, out = run_bounded(command(mode, args, tmp, fault, report), JOB_TIMEOUT_S)
        wall = time.monotonic() - start
        if rc != 0:
            raise RuntimeError(f"{mode} {kind or 'clean'} rep {rep}: exit {rc}\n{out[-3000:]}")
        with open(report) as f:
            data = json.load(f)
    row = {"total": wall, "restarts": data["restarts"]}
    if kind:
        faults = data["faults"]
        if len(faults) != 1:
            raise RuntimeError(f"{mode} {kind}: {len(faults)} faults in the report\n{out[-3000:]}")
        f = faults[0]
        for key in ("worker_exit_ms", "running_again_ms", "progress_ms", "first_step_ms",
                    "steps_redone"):
            if key in f:
                row[key] = f[key]
    log(f"  rep {rep} {mode:7s} {kind or 'clean':24s} {wall:6.2f} s "
        f"{json.dumps({k: v for k, v in row.items() if k != 'total'})}")
    return row


def median(rows, key):
    values = [r[key] for r in rows if key in r]
    return statistics.median(values) if values else None


def cell(value, digits=0):
    if value is None:
        return "-"
    return f"{value:.{digits}f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="one repetition of kill, exception and hang only")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--samples", type=int, default=9600, help="one epoch: 100 steps")
    parser.add_argument("--at_step", type=int, default=46)
    parser.add_argument("--checkpoint_every", type=int, default=10)
    parser.add_argument("--after", type=float, default=3.0,
                        help="seconds into the job for the rendezvous' own faults")
    parser.add_argument("--kinds", default="",
                        help="comma-separated kinds to run (default: all; see KINDS)")
    parser.add_argument("--in-netns", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    ensure_loopback_netns(__file__, sys.argv[1:])
    kinds = QUICK_KINDS if args.quick else list(KINDS)
    if args.kinds:
        kinds = [k.strip() for k in args.kinds.split(",")]
        unknown = [k for k in kinds if k not in KINDS]
        if unknown:
            parser.error(f"--kinds: unknown {unknown}; known: {list(KINDS)}")
    reps = 1 if args.quick else args.reps

    results = {}  # (mode, kind or None) -> rows
    for rep in range(reps):
        for mode in ("restart", "ft"):
            results.setdefault((mode, None), []).append(one_run(mode, None, args, rep))
        for kind in kinds:
            for mode in ("restart", "ft"):
                results.setdefault((mode, kind), []).append(one_run(mode, kind, args, rep))

    print(f"3 workers of mlp, one epoch of {args.samples} samples (100 steps of 32 per worker), "
          f"one fault on rank 2 at step {args.at_step}; restart mode checkpoints every "
          f"{args.checkpoint_every} steps; medians of {reps} repetition(s), times in ms from the "
          "fault (the agent's clock)")
    print()
    print("| kind | mode | exit seen | running again | job past its step | target's next step | "
          "steps redone | restarts | cost (s) | job on: restart/ft | cost: restart/ft |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for kind in kinds:
        costs, progress = {}, {}
        for mode in ("restart", "ft"):
            rows = results[(mode, kind)]
            clean = median(results[(mode, None)], "total")
            costs[mode] = median(rows, "total") - clean
            progress[mode] = median(rows, "progress_ms")
        for mode in ("restart", "ft"):
            rows = results[(mode, kind)]
            ratio_progress = ratio_cost = ""
            if mode == "ft":
                if progress["restart"] and progress["ft"]:
                    ratio_progress = f"{progress['restart'] / progress['ft']:.1f}x"
                if costs["ft"] > 0.05:
                    ratio_cost = f"{costs['restart'] / costs['ft']:.1f}x"
            print(f"| {kind} | {mode} | {cell(median(rows, 'worker_exit_ms'))} | "
                  f"{cell(median(rows, 'running_again_ms'))} | {cell(progress[mode])} | "
                  f"{cell(median(rows, 'first_step_ms'))} | "
                  f"{cell(median(rows, 'steps_redone'))} | {cell(median(rows, 'restarts'))} | "
                  f"{costs[mode]:.2f} | {ratio_progress} | {ratio_cost} |")
    print()
    for mode in ("restart", "ft"):
        print(f"clean run, {mode}: {median(results[(mode, None)], 'total'):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
