# A one-GPU NCCL job for the Flight Recorder's check on a GPU machine (scripts/gpu-proof.sh):
# STEPS all_reduces, each step reported through ctrun's helper, then it stops in a function of
# its own (a hang the agent's hang report can see). Needs torch 2.x with CUDA.
import sys
import time

import torch
import torch.distributed as dist

import ctrun_worker


def slow_data():
    while True:
        time.sleep(1)


def main():
    steps = int(sys.argv[1])
    dist.init_process_group("nccl")
    torch.cuda.set_device(0)
    t = torch.ones(1024, device="cuda")
    for step in range(1, steps + 1):
        dist.all_reduce(t)
        torch.cuda.synchronize()
        ctrun_worker.report_step(step)
    slow_data()


if __name__ == "__main__":
    main()
