#!/usr/bin/python3
"""Per-step fault tolerance against restarting: one fault schedule, three ways, side by side.

  ft        ctrun --fault_tolerance=step, mlp --fault_tolerant (survivors go on; the killed
            worker is replaced and heals from a peer)
  restart   ctrun (torchrun's model): every worker restarts and resumes from the checkpoint
  torchrun  the reference torchrun 1.13 (tests/python/torchrun_ref.py) with the same mlp binary
            (--no_python), resuming from the checkpoint

The schedule: 3 workers train mlp on CPU (one epoch); on the first attempt the last rank
SIGKILLs itself before step --kill_at; the restart modes checkpoint every --checkpoint_every
steps. Every commit and the fault are timestamped in the trainer's --consumed_log, so all three
are measured the same way:
  fault -> next commit   ms from the fault to the first step committed after it
  steps lost             committed steps done again (the fault's step - the step resumed from)
  total                  the run's wall time, and its excess over the same mode without a fault

Then the quorum's steady-state cost: mlp and gpt, no fault, ctrun plain DDP vs
--fault_tolerant (the quorum on the agent's ctrund), and vs --fault_tolerant on etcd (the
replicas' own quorum on etcd keys; where /usr/bin/etcd is installed), step times side by side.

Usage: /usr/bin/python3 scripts/bench/ft_bench.py [--quick] [--reps N] [--part faults|steady]
Needs build-bench/ (scripts/bench/run.sh builds it; CTRUN_BENCH_BUILD=DIR for another). Runs in a loopback-only network namespace.
"""
import argparse
import os
import re
import statistics
import sys
import tempfile
import time

from bench_common import Etcd, ensure_loopback_netns, run_bounded

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
BUILD = os.environ.get("CTRUN_BENCH_BUILD", os.path.join(ROOT, "build-bench"))
TORCHRUN = ["/usr/bin/python3", os.path.join(ROOT, "tests", "python", "torchrun_ref.py")]
JOB_TIMEOUT_S = 300
FT_TIMEOUTS = ["--ft_collective_timeout_ms", "2000", "--ft_heartbeat_timeout_ms", "1000",
               "--ft_join_timeout_ms", "4000", "--ft_quorum_timeout_ms", "60000"]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def read_consumed(path):
    """(the fault as (unix ms, steps committed) or None, [(unix ms, step, pid)] of every commit
    by any worker), from the trainer's --consumed_log (trainers/src/consumed_log.h)."""
    fault, commits = None, []
    with open(path) as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 5 and fields[1] == "fault":
                fault = (int(fields[2]), int(fields[4]))
            elif len(fields) >= 5:
                commits.append((int(fields[3]), int(fields[2]), int(fields[4])))
    return fault, sorted(commits)


def command(mode, args, tmp, consumed, fault):
    mlp = [os.path.join(BUILD, "trainers", "mlp"), "--epochs", "1", "--samples",
           str(args.samples), "--batch_size", "32", "--seed", "3", "--consumed_log", consumed]
    if fault:
        mlp += ["--inject_kill_at_step", str(args.kill_at)]
    launcher = ["--standalone", "--nproc_per_node=3", "--max_restarts=1", "--monitor_interval=0.1"]
    if mode == "ft":
        return ([os.path.join(BUILD, "launcher", "ctrun"), "--fault_tolerance=step"] + launcher
                + mlp + ["--fault_tolerant"] + FT_TIMEOUTS)
    checkpoints = ["--checkpoint_dir", tempfile.mkdtemp(prefix="ckpt.", dir=tmp),
                   "--checkpoint_every", str(args.checkpoint_every)]
    if mode == "restart":
        return [os.path.join(BUILD, "launcher", "ctrun")] + launcher + mlp + checkpoints
    return TORCHRUN + launcher + ["--no_python"] + mlp + checkpoints


def one_run(mode, args, tmp, rep, fault):
    consumed = os.path.join(tmp, f"{mode}.{rep}.{int(fault)}.consumed")
    start = time.monotonic()
    code, out = run_bounded(command(mode, args, tmp, consumed, fault), JOB_TIMEOUT_S)
    wall = time.monotonic() - start
    if code != 0:
        raise RuntimeError(f"{mode} run exited {code}:\n{out[-3000:]}")
    return fault_row(mode, consumed, wall, fault)


def fault_row(mode, consumed, wall, fault):
    """A run's row from its consumed log: total_s, and with a fault to_commit_ms and
    steps_lost (py_ft_bench.py measures its Python runs with this too)."""
    seen, commits = read_consumed(consumed)
    row = {"total_s": wall}
    if fault:
        if seen is None:
            raise RuntimeError(f"{mode}: no fault in the consumed log")
        fault_ms, done = seen
        # The next committed step: one past the `done` steps, or any step of a process started
        # after the fault (a restart redoing steps since its checkpoint). A survivor's line for
        # step `done` written just after the fault is the commit before it, not the next one.
        old = {pid for t, step, pid in commits if t <= fault_ms}
        after = [(t, step) for t, step, pid in commits
                 if t > fault_ms and (step > done or pid not in old)]
        row["to_commit_ms"] = after[0][0] - fault_ms
        row["steps_lost"] = done - (after[0][1] - 1)
    return row


def median(rows, key):
    return statistics.median(r[key] for r in rows)


def bench_faults(args, tmp):
    modes = ("ft", "restart", "torchrun")
    rows = {m: [] for m in modes}
    clean = {m: [] for m in modes}
    for rep in range(args.reps):
        order = modes[rep % 3:] + modes[:rep % 3]
        for mode in order:
            for fault in (True, False):
                r = one_run(mode, args, tmp, rep, fault)
                (rows if fault else clean)[mode].append(r)
                log(f"rep {rep} {mode:8} {'fault' if fault else 'clean'}: " +
                    ", ".join(f"{k} {v:.1f}" for k, v in r.items()))
    print(f"\n### One of 3 workers SIGKILLed after step {args.kill_at} (mlp, {args.samples} samples, "
          f"batch 32 per worker, checkpoint every {args.checkpoint_every} in the restart modes), "
          f"median of {args.reps}\n")
    print_fault_table(rows)
    t, r, f = (median(rows[m], "total_s") - median(clean[m], "total_s")
               for m in ("torchrun", "restart", "ft"))
    print(f"| the fault's cost: total - the same run without it (s) | {t:.2f} | {r:.2f} | {f:.2f} "
          f"| | |")
    f_ms = median(rows["ft"], "to_commit_ms")
    print(f"\nGoal: fault -> next committed step under 300 ms with 0 steps lost: "
          f"{'MET' if f_ms < 300 and median(rows['ft'], 'steps_lost') == 0 else 'MISSED'} "
          f"({f_ms:.0f} ms)")


def print_fault_table(rows):
    """The three modes' medians side by side, with the ratios to ft (py_ft_bench.py too)."""
    print("| measure | torchrun | ctrun restart | ctrun --fault_tolerance=step | torchrun / ft "
          "| restart / ft |")
    print("|---|---|---|---|---|---|")
    for key, label in (("to_commit_ms", "fault -> next committed step (ms)"),
                       ("steps_lost", "committed steps done again")):
        t, r, f = (median(rows[m], key) for m in ("torchrun", "restart", "ft"))
        ratio = (lambda a: f"{a / f:.1f}x" if f > 0 else "-")
        print(f"| {label} | {t:.0f} | {r:.0f} | {f:.0f} | {ratio(t)} | {ratio(r)} |")
    t, r, f = (median(rows[m], "total_s") for m in ("torchrun", "restart", "ft"))
    print(f"| total wall time (s) | {t:.2f} | {r:.2f} | {f:.2f} | {t / f:.2f}x | {r / f:.2f}x |")


STEP_MS = re.compile(r"step_ms ([0-9.]+)")


def steady_cost(args, tmp):
    """ctrun plain DDP vs --fault_tolerant, no fault: median step time from the trainers'
    --log_every lines (the FT loop logs on quorum rank 0, the plain one on rank 0), the first
    window left out: it holds the start (the first quorum, communicator and heal in FT mode,
    the allocator's warm-up in both), not the steady state."""
    trainers = {
        "mlp": [os.path.join(BUILD, "trainers", "mlp"), "--epochs", "1", "--samples",
                str(args.steady_samples), "--batch_size", "64", "--log_every", "10"],
        "gpt": [os.path.join(BUILD, "trainers", "gpt"), "--max_steps", str(args.gpt_steps),
                "--width", "128", "--layers", "2", "--heads", "4", "--context", "64",
                "--batch_size", "8", "--log_every", "5"],
    }
    modes = ["plain", "ft"] + (["ft_etcd"] if os.path.exists("/usr/bin/etcd") else [])
    print(f"\n### The quorum's cost in steady state: 3 workers, no fault, median step time over "
          f"{args.reps} run(s) of each\n")
    if "ft_etcd" not in modes:
        print("(/usr/bin/etcd is not installed: the etcd column is left out)\n")
    print("| trainer | ctrun DDP step (ms) | --fault_tolerant step (ms) | cost |" +
          (" on etcd (ms) | cost on etcd |" if "ft_etcd" in modes else ""))
    print("|---|---|---|---|" + ("---|---|" if "ft_etcd" in modes else ""))
    ctrun = os.path.join(BUILD, "launcher", "ctrun")
    for name, argv in trainers.items():
        times = {m: [] for m in modes}
        for rep in range(args.reps):
            for mode in modes[rep % len(modes):] + modes[:rep % len(modes)]:
                etcd = Etcd(tmp) if mode == "ft_etcd" else None
                try:
                    if etcd:
                        launcher = [ctrun, "--nnodes=1", "--rdzv_backend=etcd",
                                    f"--rdzv_endpoint=127.0.0.1:{etcd.port}", "--rdzv_id=bench"]
                    else:
                        launcher = [ctrun, "--standalone"]
                    launcher.append("--nproc_per_node=3")
                    extra = []
                    if mode != "plain":
                        launcher.append("--fault_tolerance=step")
                        extra = ["--fault_tolerant"] + FT_TIMEOUTS
                    code, out = run_bounded(launcher + argv + extra, JOB_TIMEOUT_S)
                finally:
                    if etcd:
                        etcd.stop()
                if code != 0:
                    raise RuntimeError(f"{name} {mode} exited {code}:\n{out[-3000:]}")
                steps = [float(x) for x in STEP_MS.findall(out)][1:]
                if not steps:
                    raise RuntimeError(f"{name} {mode}: no step_ms lines:\n{out[-2000:]}")
                times[mode].append(statistics.median(steps))
                log(f"steady {name} rep {rep} {mode}: {times[mode][-1]:.2f} ms/step")
        p, f = statistics.median(times["plain"]), statistics.median(times["ft"])
        row = f"| {name} | {p:.2f} | {f:.2f} | {100 * (f - p) / p:+.1f} % |"
        if "ft_etcd" in modes:
            e = statistics.median(times["ft_etcd"])
            row += f" {e:.2f} | {100 * (e - p) / p:+.1f} % |"
        print(row)


def main():
    ensure_loopback_netns(__file__, sys.argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--samples", type=int, default=None)
    parser.add_argument("--kill_at", type=int, default=None)
    parser.add_argument("--steady_samples", type=int, default=None,
                        help="mlp's samples in the steady-state part (100 or 250 steps)")
    parser.add_argument("--checkpoint_every", type=int, default=10)
    parser.add_argument("--gpt_steps", type=int, default=None)
    parser.add_argument("--part", choices=("faults", "steady"), default=None,
                        help="run one part only (default: both)")
    parser.add_argument("--in-netns", action="store_true")
    args = parser.parse_args()
    args.reps = args.reps or (1 if args.quick else 3)
    args.samples = args.samples or (3072 if args.quick else 9600)
    args.kill_at = args.kill_at or (15 if args.quick else 45)
    args.gpt_steps = args.gpt_steps or (20 if args.quick else 60)
    args.steady_samples = args.steady_samples or (19200 if args.quick else 48000)
    print(f"ft_bench: {os.uname().nodename}, {os.cpu_count()} cores, "
          f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}")
    with tempfile.TemporaryDirectory(prefix="ft_bench.") as tmp:
        if args.part in (None, "faults"):
            bench_faults(args, tmp)
        if args.part in (None, "steady"):
            steady_cost(args, tmp)


if __name__ == "__main__":
    main()
