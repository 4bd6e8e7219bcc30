#!/usr/bin/env python3
"""GPU benchmarks (issues 4 and 6), for a machine with an NVIDIA GPU and a CUDA PyTorch, after
scripts/gpu-build.sh. One rank on cuda:0, in one run, alternating the sides:

  overhead   trainers/{mlp,gpt} with libctrun_worker's DDP (NCCL, world size 1) against the same
             trainer with --no_ddp (the model alone): the cost of the wrapper (goal: under 5 %);
             torch's own DDP against its model alone, for comparison
  vs torch   the same trainers against the same models in PyTorch's Python DDP (nccl) under that
             machine's torchrun (train_bench/ddp_ref.py): samples/s and the ratio; once with
             torch's default optimizer (multi-tensor "foreach" kernels on CUDA) and once with the
             per-parameter loop that LibTorch's C++ optimizers have

Every configuration runs --reps times and the median is reported; each run prints samples/s over
its last 50 steps (step = forward pass to the end of optimizer.step()).

  python3 scripts/bench/gpu_bench.py [--build build-gpu] [--reps 3] [--quick]
"""
import argparse
import os
import statistics
import sys

from bench_common import final_samples_per_s, run_bounded

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
DDP_REF = os.path.join(HERE, "train_bench", "ddp_ref.py")
RUN_TIMEOUT_S = 300

# (name, trainer, model flags shared by both sides, batch per rank, steps, bf16)
GPT_LARGE = ["--width", "768", "--layers", "12", "--heads", "12", "--context", "256"]
CONFIGS = [
    ("mlp", "mlp", [], 64, 400, False),
    ("gpt (width 256, 4 blocks, context 64)", "gpt", [], 16, 200, False),
    ("gpt-large (width 768, 12 blocks, context 256)", "gpt", GPT_LARGE, 16, 80, False),
    ("gpt-large --bf16", "gpt", GPT_LARGE, 16, 80, True),
]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def samples_per_s(cmd):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    rc, out = run_bounded(cmd, RUN_TIMEOUT_S, env)
    if rc != 0:
        tail = "\n".join(out.splitlines()[-15:])
        raise RuntimeError(f"{' '.join(cmd)} -> {rc}\n{tail}")
    return final_samples_per_s(out)


def commands(build, trainer, model, batch, steps, bf16):
    ctrun = [os.path.join(build, "launcher", "ctrun"), "--standalone", "--nproc_per_node=1"]
    ours = [os.path.join(build, "trainers", trainer), "--device", "cuda", "--epochs", "100",
            "--max_steps", str(steps), "--batch_size", str(batch)] + model
    ref = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
           DDP_REF, trainer, "--device", "cuda", "--max_steps", str(steps),
           "--batch_size", str(batch)] + model
    if bf16:
        ours.append("--bf16")
        ref.append("--bf16")
    return [("ctrun + libctrun_worker DDP", ctrun + ours),
            ("ctrun, --no_ddp (the model alone)", ctrun + ours + ["--no_ddp"]),
            ("torchrun + Python DDP (nccl)", ref),
            ("torchrun, Python without DDP", ref + ["--no_ddp"]),
            ("torchrun + Python DDP, per-parameter optimizer", ref + ["--no_foreach"])]


def main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build-gpu"))
    p.add_argument("--reps", type=int)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--configs", help="comma-separated indexes into CONFIGS (default: all)")
    a = p.parse_args(argv)
    reps = a.reps or (1 if a.quick else 3)
    chosen = [CONFIGS[int(i)] for i in a.configs.split(",")] if a.configs else CONFIGS
    for name, trainer, model, batch, steps, bf16 in chosen:
        if a.quick:
            steps = max(60, steps // 2)
        sides = commands(a.build, trainer, model, batch, steps, bf16)
        rates = {side: [] for side, _ in sides}
        for rep in range(reps):
            for side, cmd in (sides if rep % 2 == 0 else sides[::-1]):
                rates[side].append(samples_per_s(cmd))
                log(f"  {name} | {side}: {rates[side][-1]:.1f} samples/s")
        medians = [statistics.median(rates[side]) for side, _ in sides]
        ours, alone = medians[0], medians[1]
        print(f"\n## {name}: 1 rank on cuda:0, batch {batch}, {steps} steps (median of {reps})\n")
        print("| | samples/s | ms/step | libctrun_worker DDP over this |")
        print("|---|---:|---:|---:|")
        for i, ((side, _), rate) in enumerate(zip(sides, medians)):
            ratio = "" if i == 0 else f"{ours / rate:.3f}x"
            print(f"| {side} | {rate:.1f} | {batch / rate * 1e3:.2f} | {ratio} |")
        torch_ddp, torch_alone = medians[2], medians[3]
        print(f"\nDDP overhead at world size 1 (step time): libctrun_worker "
              f"{(alone / ours - 1) * 100:+.1f} %, torch {(torch_alone / torch_ddp - 1) * 100:+.1f} %; "
              "runs: " + "; ".join(f"{side}: " + ", ".join(f"{x:.1f}" for x in rates[side])
                                   for side, _ in sides), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
