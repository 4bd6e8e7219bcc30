# An ordinary synchronous DDP script, as users run them under torchrun: torch's
# DistributedDataParallel over Gloo, an optimizer step per batch, and nothing of ctrun's (no
# import, no report_step): ctrun counts its optimizer steps and times DDP's waits by itself.
# Some ranks can be made slow for a while, to test that the rank the others wait for is named:
#   ddp_sync_steps.py STEPS [--slow RANKS|node:N] [--kind data|compute] [--from S] [--to S]
#                     [--mark PATH] [--base_ms MS] [--work_ms MS]
# RANKS: a comma list of global ranks; node:N, every rank of group rank N. kind data: its batch
# function sleeps 0.2 s more (waiting for input); compute: 0.2 s more arithmetic. Slow in steps
# [FROM, TO); the first slow rank writes the time (epoch seconds) its slowdown began to PATH.
# Every rank's batch function sleeps BASE_MS (20) and its step computes WORK_MS of CPU time (0).
import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("steps", type=int)
    parser.add_argument("--slow", default="")
    parser.add_argument("--kind", default="data", choices=["data", "compute"])
    parser.add_argument("--from", dest="first", type=int, default=0)
    parser.add_argument("--to", dest="last", type=int, default=1 << 30)
    parser.add_argument("--mark", default="")
    parser.add_argument("--base_ms", type=float, default=20)  # every rank's batch function
    parser.add_argument("--work_ms", type=float, default=0)  # every rank's CPU time a step
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.slow.startswith("node:"):
        slow = int(os.environ["GROUP_RANK"]) == int(args.slow[5:])
    else:
        slow = str(rank) in args.slow.split(",")
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank)
    work = torch.randn(256, 256)

    def next_batch(step):
        time.sleep(args.base_ms / 1000)  # a data loader's share
        if slow and args.kind == "data" and args.first <= step < args.last:
            time.sleep(0.2)
        return torch.randn(64, 128, generator=generator)

    def compute(seconds):
        until = time.process_time() + seconds
        while time.process_time() < until:
            torch.mm(work, work)

    def extra_compute(step):
        compute(args.work_ms / 1000)
        if slow and args.kind == "compute" and args.first <= step < args.last:
            compute(0.2)

    for step in range(args.steps):
        if slow and step == args.first and args.mark:
            with open(f"{args.mark}.{rank}", "w") as f:
                f.write(f"{time.time():.3f}\n")
            os.replace(f"{args.mark}.{rank}", args.mark)
        batch = next_batch(step)
        extra_compute(step)
        loss = model(batch).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
