#!/usr/bin/python3
"""What counting a script's steps costs it: ctrun's optimizer step hook and DDP wait sampling
(ctrun_worker._Steps, installed by ctrun's sitecustomize.py in a worker with a heartbeat file)
against the same launch with them off (CTRUN_AUTO_STEPS=0), side by side in one run.

Both run under ctrun as a user gets it: `ctrun --standalone --nproc_per_node=2
--worker_timeout=60` (the heartbeat files that turn the hook on), an ordinary 2-rank DDP script
over Gloo (step_hook_bench/train.py) whose steps take STEP_MS of sleep plus a small model's
step. The two are run in turn, REPS times each, and the mean step time of each run is printed;
the ratio is hook / no hook, with the cost per step in microseconds.

Usage: /usr/bin/python3 scripts/bench/step_hook_bench.py [--quick] [--reps N]
Needs a built ctrun: build-bench/ (scripts/bench/run.sh builds it; CTRUN_BENCH_BUILD=DIR for
another).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("CTRUN_BENCH_BUILD", os.path.join(ROOT, "build-bench"))
CTRUN = os.path.join(BUILD, "launcher", "ctrun")
TRAIN = os.path.join(ROOT, "scripts", "bench", "step_hook_bench", "train.py")


def run_once(step_ms, steps, hook):
    env = dict(os.environ)
    env["CTRUN_AUTO_STEPS"] = "1" if hook else "0"
    out = subprocess.run(
        [CTRUN, "--standalone", "--nproc_per_node=2", "--worker_timeout=60", TRAIN,
         str(step_ms), str(steps), "20"],
        env=env, capture_output=True, text=True, timeout=600)
    found = re.search(r"step_ms ([0-9.]+)", out.stdout)
    if out.returncode != 0 or not found:
        sys.exit(f"step_hook_bench: the run failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
    return float(found.group(1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=0)
    args = parser.parse_args()
    if not os.path.exists(CTRUN):
        sys.exit(f"step_hook_bench: no ctrun at {CTRUN} (scripts/bench/run.sh builds it)")
    reps = args.reps or (3 if args.quick else 6)
    print(f"{'step':>8}  {'hook ms':>9}  {'no hook ms':>10}  {'ratio':>6}  {'cost us':>8}  runs")
    for step_ms, steps in ((10, 300), (100, 60)):
        with_hook, without = [], []
        for _ in range(reps):  # in turn, so that the machine's drift falls on both
            without.append(run_once(step_ms, steps, hook=False))
            with_hook.append(run_once(step_ms, steps, hook=True))
        a, b = statistics.median(with_hook), statistics.median(without)
        print(f"{step_ms:>6}ms  {a:>9.3f}  {b:>10.3f}  {a / b:>6.4f}  {(a - b) * 1000:>8.1f}  "
              f"{reps}x{steps} steps; hook {' '.join(f'{x:.3f}' for x in with_hook)}; "
              f"none {' '.join(f'{x:.3f}' for x in without)}", flush=True)


if __name__ == "__main__":
    main()
