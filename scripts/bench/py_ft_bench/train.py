"""py_ft_bench's worker: an MLP on CPU (Gloo), trained two ways on the same samples.

  --mode ddp  torchrun's usual script: init_process_group, DistributedDataParallel, a
              DistributedSampler's order, rank 0 checkpoints every --checkpoint_every steps and
              a restarted job resumes from the last one
  --mode ft   ctrun_worker.FaultTolerance and StepSampler (ctrun --fault_tolerance=step)

Both append to --consumed_log "<who> <epoch> <step> <unix ms> <pid>" per committed step (ddp:
rank 0; ft: every replica) and, where the last rank of the first attempt kills itself before
step --kill_at, "<who> fault <unix ms> <pid> <steps committed>" first; and print
"step_ms <ms>" every --log_every steps (rank 0): the median step time of the window.
"""
import argparse
import os
import signal
import statistics
import sys
import time

import torch
import torch.nn as nn


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("ddp", "ft"), required=True)
    p.add_argument("--samples", type=int, default=9600)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--kill_at", type=int, default=0)
    p.add_argument("--checkpoint", default="")
    p.add_argument("--checkpoint_every", type=int, default=10)
    p.add_argument("--consumed_log", default="")
    p.add_argument("--log_every", type=int, default=0)
    return p.parse_args()


def model_of(args):
    layers, width = [], 64
    for _ in range(args.layers):
        layers += [nn.Linear(width, args.width), nn.ReLU()]
        width = args.width
    return nn.Sequential(*layers, nn.Linear(width, 10))


def data(n):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 64, generator=g)
    return x, (x @ torch.randn(64, 10, generator=g)).argmax(dim=1)


class Log:
    def __init__(self, path, who):
        self.f = open(path, "a") if path else None
        self.who = who

    def line(self, text):
        if self.f:
            self.f.write(f"{self.who} {text}\n")
            self.f.flush()


def faulty(args, step):
    return (args.kill_at > 0 and step == args.kill_at and
            os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0" and
            int(os.environ["LOCAL_RANK"]) == int(os.environ["LOCAL_WORLD_SIZE"]) - 1)


def die(log, done):
    log.line(f"fault {int(time.time() * 1000)} {os.getpid()} {done}")
    os.kill(os.getpid(), signal.SIGKILL)


def report(times, step, args, rank):
    if args.log_every and rank == 0 and step % args.log_every == 0 and times:
        print(f"step {step} step_ms {statistics.median(times) * 1e3:.2f}", flush=True)
        times.clear()


def train_ddp(args):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DistributedSampler

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(model_of(args))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = data(args.samples)
    order = list(DistributedSampler(range(args.samples), world, rank, seed=3))
    steps = len(order) // args.batch_size
    start = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    log = Log(args.consumed_log, f"rank{rank}")
    criterion, times = nn.CrossEntropyLoss(), []
    for step in range(start, steps):
        if faulty(args, step + 1):
            die(log, step)
        began = time.monotonic()
        mine = order[step * args.batch_size:(step + 1) * args.batch_size]
        criterion(model(x[mine]), y[mine]).backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.monotonic() - began)
        if rank == 0:
            log.line(f"0 {step + 1} {int(time.time() * 1000)} {os.getpid()}")
            if args.checkpoint and (step + 1) % args.checkpoint_every == 0:
                torch.save({"model": model.module.state_dict(),
                            "optimizer": optimizer.state_dict(), "step": step + 1},
                           args.checkpoint + ".tmp")
                os.replace(args.checkpoint + ".tmp", args.checkpoint)
        report(times, step + 1, args, rank)
    dist.destroy_process_group()


def train_ft(args):
    import ctrun_worker

    torch.manual_seed(0)
    model = model_of(args)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = data(args.samples)
    sampler = ctrun_worker.StepSampler(args.samples, args.batch_size, seed=3)
    ft = ctrun_worker.FaultTolerance(model, optimizer, sampler, collective_timeout=2,
                                     heartbeat_timeout=1, join_timeout=4, quorum_timeout=60)
    log = Log(args.consumed_log, os.environ["CTRUN_REPLICA_ID"])
    criterion, times = nn.CrossEntropyLoss(), []
    while not sampler.epoch_done():
        if faulty(args, ft.committed_step + 1):
            die(log, ft.committed_step)
        began = time.monotonic()
        step = ft.begin_step()
        if step.finished:
            return
        mine = sampler.step(step.rank, step.size)
        if mine:
            criterion(model(x[mine]), y[mine]).backward()
        if ft.should_commit():
            optimizer.step()
            log.line(f"0 {ft.committed_step} {int(time.time() * 1000)} {os.getpid()}")
            times.append(time.monotonic() - began)
            report(times, ft.committed_step, args, step.rank)
        optimizer.zero_grad()
    ft.finish()


def main():
    args = parse()
    (train_ft if args.mode == "ft" else train_ddp)(args)


if __name__ == "__main__":
    sys.exit(main())
