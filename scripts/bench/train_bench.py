#!/usr/bin/python3
"""Worker-runtime benchmarks (issue 4): the C++ trainers on libctrun_worker under ctrun against
the same models in PyTorch's Python DDP (gloo, CPU) under the reference torchrun, side by side.

  allreduce  bus bandwidth (nccl-tests: bytes/time * 2(n-1)/n) of 1 KB..64 MB float32 all-reduces
             on 2 ranks: our process group (train_bench/allreduce.cc) vs torch.distributed
             (train_bench/allreduce_ref.py)
  mlp        samples/s, 2 ranks, batch 64 per rank: trainers/mlp vs ddp_ref.py mlp (also with
             the glibc malloc settings libctrun_worker's trainers apply, given by environment)
  gpt        samples/s, 2 ranks, batch 8 per rank, the bench-sized model: trainers/gpt vs
             ddp_ref.py gpt
  overlap    trainers/gpt step time on 2 ranks over 1 rank (no communication), with bucketed
             overlap, with --no_overlap (one all-reduce after backward), and with small buckets

OMP_NUM_THREADS=1 everywhere; every configuration runs `--reps` times, ctrun and the reference
alternating, and the median is reported. Runs in a loopback-only network namespace.

  /usr/bin/python3 scripts/bench/train_bench.py [--quick] [--reps N]
      [--only allreduce,mlp,gpt,overlap] [--build build-bench]
"""
import argparse
import os
import re
import statistics
import sys

from bench_common import ensure_loopback_netns, final_samples_per_s, run_bounded

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
PYTHON = "/usr/bin/python3"
TORCHRUN = [PYTHON, os.path.join(ROOT, "tests", "python", "torchrun_ref.py")]
DDP_REF = os.path.join(HERE, "train_bench", "ddp_ref.py")
ALLREDUCE_REF = os.path.join(HERE, "train_bench", "allreduce_ref.py")
RUN_TIMEOUT_S = 600

# The gpt benchmark's model: small enough for 2 shared cores, the same on both sides.
GPT_MODEL = ["--width", "128", "--layers", "4", "--heads", "4", "--context", "64"]
GPT_BATCH = 8


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# What libctrun_worker's tune_malloc_for_training() sets, given to the reference through glibc's
# variables for a second, like-for-like row.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}


def environment(extra=None):
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra or {})
    return env


def launch(kind, nproc, program):
    if kind == "ctrun":
        return [BUILD_CTRUN, "--standalone", f"--nproc_per_node={nproc}"] + program
    return TORCHRUN + ["--standalone", f"--nproc_per_node={nproc}"] + program


def run(cmd, extra_env=None):
    rc, out = run_bounded(cmd, RUN_TIMEOUT_S, environment(extra_env))
    if rc != 0:
        tail = "\n".join(out.splitlines()[-15:])
        raise RuntimeError(f"{' '.join(cmd)} -> {rc}\n{tail}")
    return out


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def bench_allreduce(reps):
    ours, ref = {}, {}
    for _ in range(reps):
        for kind, table, program in (("ctrun", ours, [ALLREDUCE_BENCH]),
                                     ("torchrun", ref, [ALLREDUCE_REF])):
            out = run(launch(kind, 2, program))
            for size, _, _, busbw in re.findall(r"allreduce (\d+) (\d+) ([0-9.]+) ([0-9.]+)", out):
                table.setdefault(int(size), []).append(float(busbw))
    print("\n## all-reduce bus bandwidth, 2 ranks, gloo on loopback (GB/s, median of "
          f"{reps})\n")
    print("| bytes | libctrun_worker | torch.distributed | ratio |")
    print("|---:|---:|---:|---:|")
    for size in sorted(ours):
        a, b = median(ours[size]), median(ref.get(size, []))
        print(f"| {size} | {a:.3f} | {b:.3f} | {a / b:.2f}x |")


def bench_trainer(name, reps, steps):
    if name == "mlp":
        ours_program = [MLP, "--epochs", "100", "--max_steps", str(steps)]
        ref_program = [DDP_REF, "mlp", "--max_steps", str(steps)]
        batch = 64
    else:
        ours_program = [GPT, "--epochs", "1", "--max_steps", str(steps),
                        "--batch_size", str(GPT_BATCH)] + GPT_MODEL
        ref_program = [DDP_REF, "gpt", "--max_steps", str(steps),
                       "--batch_size", str(GPT_BATCH)] + GPT_MODEL
        batch = GPT_BATCH
    ours, ref, ref_tuned = [], [], []
    for rep in range(reps):
        order = [("ctrun", ours, ours_program, None), ("torchrun", ref, ref_program, None),
                 ("torchrun+malloc", ref_tuned, ref_program, MALLOC_ENV)]
        if rep % 2:
            order.reverse()
        for kind, results, program, extra_env in order:
            launcher = "ctrun" if kind == "ctrun" else "torchrun"
            results.append(final_samples_per_s(run(launch(launcher, 2, program), extra_env)))
            log(f"  {name} {kind}: {results[-1]:.1f} samples/s")
    a, b, c = median(ours), median(ref), median(ref_tuned)
    print(f"\n## {name}: 2 ranks, batch {batch} per rank, {steps} steps, samples/s over the last "
          f"50 (median of {reps})\n")
    print("| | samples/s | ctrun over this |")
    print("|---|---:|---:|")
    print(f"| ctrun + libctrun_worker (C++) | {a:.1f} | |")
    print(f"| torchrun + Python DDP | {b:.1f} | {a / b:.2f}x |")
    print(f"| torchrun + Python DDP, with the same malloc settings | {c:.1f} | {a / c:.2f}x |")
    print(f"\nruns: ctrun {', '.join(f'{x:.1f}' for x in ours)}; "
          f"torchrun {', '.join(f'{x:.1f}' for x in ref)}; "
          f"torchrun+malloc {', '.join(f'{x:.1f}' for x in ref_tuned)}")


def bench_overlap(reps, steps):
    base = [GPT, "--epochs", "1", "--max_steps", str(steps), "--batch_size", str(GPT_BATCH)]
    base += GPT_MODEL
    configs = [("1 rank (no communication)", 1, []),
               ("2 ranks, bucketed overlap (1 MB, then 25 MB)", 2, []),
               ("2 ranks, bucketed overlap, 0.25 MB buckets", 2,
                ["--first_bucket_mb", "0.25", "--bucket_mb", "0.25"]),
               ("2 ranks, --no_overlap (one all-reduce after backward)", 2, ["--no_overlap"])]
    step_ms = {name: [] for name, _, _ in configs}
    for rep in range(reps):
        for name, nproc, extra in (configs if rep % 2 == 0 else configs[::-1]):
            rate = final_samples_per_s(run(launch("ctrun", nproc, base + extra)))
            step_ms[name].append(GPT_BATCH * nproc / rate * 1e3)
            log(f"  overlap {name}: {step_ms[name][-1]:.1f} ms/step")
    one = median(step_ms[configs[0][0]])
    print(f"\n## gpt overlap: step time, batch {GPT_BATCH} per rank (median of {reps})\n")
    print("| configuration | ms/step | over 1 rank |")
    print("|---|---:|---:|")
    for name, _, _ in configs:
        t = median(step_ms[name])
        print(f"| {name} | {t:.1f} | {t / one:.2f}x |")


def main(argv):
    global BUILD_CTRUN, MLP, GPT, ALLREDUCE_BENCH
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--reps", type=int)
    p.add_argument("--only", default="allreduce,mlp,gpt,overlap")
    p.add_argument("--build", default=os.path.join(ROOT, "build-bench"))
    p.add_argument("--in-netns", action="store_true")
    a = p.parse_args(argv)
    ensure_loopback_netns(__file__, [x for x in argv if x != "--in-netns"])
    BUILD_CTRUN = os.path.join(a.build, "launcher", "ctrun")
    MLP = os.path.join(a.build, "trainers", "mlp")
    GPT = os.path.join(a.build, "trainers", "gpt")
    ALLREDUCE_BENCH = os.path.join(a.build, "scripts", "bench", "allreduce_bench")
    reps = a.reps or (1 if a.quick else 3)
    only = a.only.split(",")
    if "allreduce" in only:
        bench_allreduce(reps)
    if "mlp" in only:
        bench_trainer("mlp", reps, 100 if a.quick else 200)
    if "gpt" in only:
        bench_trainer("gpt", reps, 55 if a.quick else 70)
    if "overlap" in only:
        bench_overlap(reps, 55 if a.quick else 70)


if __name__ == "__main__":
    main(sys.argv[1:])
