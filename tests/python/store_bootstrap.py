"""Bootstraps a gloo process group the way scripts do under torchrun, and uses its store.

    store_bootstrap.py INIT_METHOD OUT_DIR

INIT_METHOD is env:// or tcp://HOST:PORT (the launcher's --master_addr/--master_port, as a
script that takes them from its own command line would). Every rank checks an all-reduce and a
key that rank 0 puts in the process group's store, then writes OUT_DIR/rank<R> with what it saw.
"""
import os
import sys

import torch
import torch.distributed as dist


def main():
    init_method, out_dir = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    expected = world_size * (world_size + 1) / 2
    if total.item() != expected:
        raise SystemExit(f"all_reduce gave {total.item()}, expected {expected}")

    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        store.set("greeting", "from rank 0")
    if store.get("greeting") != b"from rank 0":
        raise SystemExit("the store did not carry rank 0's key")
    dist.barrier()
    with open(os.path.join(out_dir, f"rank{rank}"), "w") as f:
        f.write(f"world_size={world_size}\n")
        f.write(f"agent_store={os.environ.get('TORCHELASTIC_USE_AGENT_STORE')}\n")
        f.write(f"master={os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
