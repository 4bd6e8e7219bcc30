# A gloo job in which one rank stops in a function of its own while the others wait for it in
# all_reduce (the hang reports' test): every rank reports each step through ctrun's helper;
# rank HANG_RANK (argv[1]) calls slow_data() before its all_reduce of step HANG_STEP (argv[2])
# and never returns from it.
import sys
import time

import torch
import torch.distributed as dist

import ctrun_worker  # put on PYTHONPATH by ctrun (--worker_timeout)


def slow_data():
    while True:
        time.sleep(1)


def main():
    hang_rank, hang_step = int(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(4)
    for step in range(1, 10000):
        if rank == hang_rank and step == hang_step:
            slow_data()
        dist.all_reduce(t)
        ctrun_worker.report_step(step)
        time.sleep(0.05)


if __name__ == "__main__":
    main()
