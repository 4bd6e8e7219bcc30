"""Conformance worker (imports torch): joins a gloo process group with the given init_method
(env:// or tcp://HOST:PORT), checks the world size with one all_reduce, and writes DIR/<rank>
with what it found. For the init_method scenarios of torch's launcher tests."""
import argparse
import os

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--init_method", "--init-method", required=True)
parser.add_argument("--out_dir", required=True)
args = parser.parse_args()

dist.init_process_group(
    backend="gloo",
    init_method=args.init_method,
    world_size=int(os.environ["WORLD_SIZE"]),
    rank=int(os.environ["RANK"]),
)
rank = dist.get_rank()
world_size = dist.get_world_size()
ones = torch.zeros(world_size, dtype=torch.int64)
ones[rank] = 1
dist.all_reduce(ones)
summed = int(ones.sum().item())
dist.barrier()
dist.destroy_process_group()
with open(os.path.join(args.out_dir, str(rank)), "w") as f:
    f.write(f"world_size={world_size}\nall_reduce_sum={summed}\n")
