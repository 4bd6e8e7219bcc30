# The step hook benchmark's worker (scripts/bench/step_hook_bench.py): an ordinary DDP script
# whose step is a fixed sleep (STEP_MS, a stand-in for the step's compute that adds no noise of
# its own) plus a small model's forward, backward and optimizer step. Prints the mean time of the
# timed steps on rank 0: "step_ms <mean>".
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main():
    step_ms, steps, warmup = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    dist.init_process_group("gloo")
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.randn(32, 64)
    began = None
    for step in range(warmup + steps):
        if step == warmup:
            dist.barrier()
            began = time.perf_counter()
        time.sleep(step_ms / 1000)
        model(batch).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    elapsed = time.perf_counter() - began
    if dist.get_rank() == 0:
        print(f"step_ms {elapsed / steps * 1000:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
