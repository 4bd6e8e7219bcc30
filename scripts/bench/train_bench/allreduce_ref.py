"""The reference side of allreduce_bench (train_bench/allreduce.cc): torch.distributed.all_reduce
over gloo, the same sizes and iteration counts, the same output lines:
  allreduce <bytes> <iterations> <microseconds per call> <busbw GB/s>
Run by torchrun."""
import os
import time

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    n = dist.get_world_size()
    size = 1024
    while size <= 64 << 20:
        iterations = min(max((256 << 20) // size, 5), 500)
        tensor = torch.ones(size // 4, dtype=torch.float32)
        for _ in range(3):
            dist.all_reduce(tensor)
        dist.barrier()
        started = time.perf_counter()
        for _ in range(iterations):
            dist.all_reduce(tensor)
        per_call = (time.perf_counter() - started) / iterations
        busbw = size / per_call * 2 * (n - 1) / n / 1e9
        if dist.get_rank() == 0:
            print(f"allreduce {size} {iterations} {per_call * 1e6:.1f} {busbw:.4f}", flush=True)
        size *= 4
    dist.barrier()
    os._exit(0)  # torch 1.13's teardown can hang (tests/python/ddp_mlp.py)


if __name__ == "__main__":
    main()
