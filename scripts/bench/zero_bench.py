#!/usr/bin/python3
"""Sharded data parallelism (issue 19): per-rank tensor memory and step time of each ZeRO stage
against DDP, gpt on CPU under ctrun, at world sizes 2, 3 and 4.

Each configuration runs zero_bench (scripts/bench/zero_bench/) under `ctrun --standalone`; its
ranks count their CPU tensor bytes through a counting allocator (measured, not computed). The
table gives, per parameter:
  state   bytes held right after backward: parameters + gradients + optimizer state (AdamW,
          fp32), the quantity the ZeRO formulas predict
  formula DDP 16, stage 1 8 + 8/N, stage 2 4 + 12/N, stage 3 16/N (fp32: 4 bytes of
          parameter, 4 of gradient, 8 of Adam's two moments); with --bf16 (2-byte parameters
          and gradients, fp32 master and moments) stage 1 4 + 12/N, stage 2 2 + 14/N, stage 3
          14/N (no bf16 copy of the shard is kept between gathers; the usual count is 16/N)
  peak    the most held at any moment of a step (adds activations and what is gathered)
and the median step time with its ratio to DDP's in the same world. Goal: state within 10 % of
the formula for stages 1-3. DDP's state is above 16: its gradient buckets are a second copy of
the gradients (as torch's DDP without gradient_as_bucket_view).

  /usr/bin/python3 scripts/bench/zero_bench.py [--quick] [--build build-bench]
      [--worlds 2,3,4] [--width 256] [--layers 8] [--bf16]
"""
import argparse
import json
import os
import sys

from bench_common import ensure_loopback_netns, run_bounded

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
RUN_TIMEOUT_S = 900


def formula(stage, world, bf16):
    if bf16 and stage > 0:  # bf16 parameters and gradients, fp32 master + Adam's moments
        # Stage 3 keeps no bf16 copy of its shard (it is made for the moment of each gather):
        # 14/N where FSDP and the ZeRO paper count 16/N.
        return {1: 4 + 12 / world, 2: 2 + 14 / world, 3: 14 / world}[stage]
    return {0: 16.0, 1: 8 + 8 / world, 2: 4 + 12 / world, 3: 16 / world}[stage]


def run_one(build, world, stage, args):
    cmd = [os.path.join(build, "launcher", "ctrun"), "--standalone",
           f"--nproc_per_node={world}", os.path.join(build, "scripts", "bench", "zero_bench"),
           "--zero", str(stage), "--width", str(args.width), "--layers", str(args.layers),
           "--steps", str(args.steps)] + (["--bf16"] if args.bf16 else [])
    env = dict(os.environ, OMP_NUM_THREADS="1")
    rc, out = run_bounded(cmd, RUN_TIMEOUT_S, env=env)
    for line in out.splitlines():
        marker = line.find("ZERO_BENCH ")
        if marker >= 0 and rc == 0:
            return json.loads(line[marker + len("ZERO_BENCH "):])
    sys.exit(f"zero_bench failed (world {world}, stage {stage}, rc {rc}):\n{out[-3000:]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps")
    parser.add_argument("--build", default=os.path.join(ROOT, "build-bench"))
    parser.add_argument("--worlds", default="2,3,4")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=0, help="steps per run (default 12, quick 5)")
    parser.add_argument("--bf16", action="store_true",
                        help="stages 1-3 with bf16 parameters and fp32 masters (DDP stays fp32)")
    parser.add_argument("--in-netns", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    ensure_loopback_netns(__file__, sys.argv[1:])
    if args.steps == 0:
        args.steps = 5 if args.quick else 12
    precision = "bf16 parameters, fp32 masters (DDP fp32)" if args.bf16 else "fp32"
    print(f"gpt width {args.width}, {args.layers} layers, AdamW, {precision}, CPU (gloo), "
          f"{args.steps} steps per run (the first 2 not measured), OMP_NUM_THREADS=1")
    print(f"{'world':>5} {'stage':>5} {'params':>10} {'state B/p':>9} {'formula':>7} "
          f"{'ratio':>6} {'peak B/p':>8} {'step ms':>8} {'vs DDP':>7}  goal")
    failed = False
    for world in [int(w) for w in args.worlds.split(",")]:
        ddp_ms = None
        for stage in (0, 1, 2, 3):
            row = run_one(args.build, world, stage, args)
            params = row["parameters"]
            state = row["state_bytes"] / params
            expected = formula(stage, world, args.bf16)
            ratio = state / expected
            if stage == 0:
                ddp_ms = row["step_ms"]
                goal = "(reference)"
            else:
                met = abs(ratio - 1) <= 0.10
                failed |= not met
                goal = "within 10 %: " + ("MET" if met else "MISSED")
            print(f"{world:>5} {stage:>5} {params:>10} {state:>9.2f} {expected:>7.2f} "
                  f"{ratio:>6.3f} {row['peak_bytes'] / params:>8.2f} {row['step_ms']:>8.1f} "
                  f"{row['step_ms'] / ddp_ms:>7.2f}  {goal}", flush=True)
    if failed:
        print("some stage's measured state is more than 10 % off its formula")


if __name__ == "__main__":
    main()
