#!/usr/bin/python3
"""What counting a script's steps costs it: ctrun's optimizer step hook and DDP wait sampling
(ctrun_worker._Steps, installed by ctrun's sitecustomize.py in a worker with a heartbeat file)
against the same launch with them off (CTRUN_AUTO_STEPS=0), side by side in one run.

Both run under ctrun as a user gets it: `ctrun --standalone --nproc_per_node=2
--worker_timeout=60` (the heartbeat files that turn the hook on), an ordinary 2-rank DDP script
over Gloo (step_hook_bench/train.py) whose steps take STEP_MS of sleep plus a small model's
step. The two are run in turn, REPS times each, and the mean step time of each run is printed;
the ratio is hook / no hook (medians), with the cost per step in microseconds, and the ratio of
the fastest run of each (the least disturbed on a shared machine). Last, the hook's own time
per step measured alone in one process (below the launches' noise).

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


# The hook alone, in one process: ctrun_worker's step hook called as an optimizer step calls it,
# writing a heartbeat file in a temporary directory (ctrun's log root is one too).
HOOK_ALONE = r"""
import os, sys, tempfile, time
path = os.path.join(tempfile.mkdtemp(), "heartbeat")
open(path, "w").close()
os.environ["CTRUN_HEARTBEAT_FILE"] = path
import ctrun_worker
class Optimizer: pass
optimizer = Optimizer()
steps = ctrun_worker._steps
for _ in range(200): steps.stepped(optimizer)
began = time.perf_counter()
for _ in range(5000): steps.stepped(optimizer)
print(f"{(time.perf_counter() - began) / 5000 * 1e6:.2f}")
"""


def hook_alone_us():
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "launcher", "python"))
    out = subprocess.run(["/usr/bin/python3", "-c", HOOK_ALONE], env=env, capture_output=True,
                         text=True, timeout=120)
    if out.returncode != 0:
        sys.exit(f"step_hook_bench: the hook alone failed:\n{out.stderr[-2000:]}")
    return float(out.stdout.strip())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=0)
    args = parser.parse_args()
    if not os.path.exists(CTRUN):
        sys.exit(f"step_hook_bench: no ctrun at {CTRUN} (scripts/bench/run.sh builds it)")
    reps = args.reps or (3 if args.quick else 6)
    print(f"{'step':>8}  {'hook ms':>9}  {'no hook ms':>10}  {'ratio':>6}  {'cost us':>8}  "
          f"{'min ratio':>9}  runs")
    for step_ms, steps in ((10, 300), (100, 60)):
        with_hook, without = [], []
        for _ in range(reps):  # in turn, so that the machine's drift falls on both
            without.append(run_once(step_ms, steps, hook=False))
            with_hook.append(run_once(step_ms, steps, hook=True))
        a, b = statistics.median(with_hook), statistics.median(without)
        low = min(with_hook) / min(without)  # the least disturbed run of each
        print(f"{step_ms:>6}ms  {a:>9.3f}  {b:>10.3f}  {a / b:>6.4f}  {(a - b) * 1000:>8.1f}  "
              f"{low:>9.4f}  "
              f"{reps}x{steps} steps; hook {' '.join(f'{x:.3f}' for x in with_hook)}; "
              f"none {' '.join(f'{x:.3f}' for x in without)}", flush=True)
    alone = min(hook_alone_us() for _ in range(3))
    print(f"the hook alone (one process, 5000 calls, best of 3): {alone:.2f} us a step, "
          f"{alone / 100:.3f} % of a 10 ms step, {alone / 1000:.4f} % of a 100 ms step")


if __name__ == "__main__":
    main()
