"""The seeds' MLP trained with DistributedDataParallel on CPU (gloo), launched by torchrun or ctrun.

Unmodified torchrun workflow: init_process_group("gloo", init_method="env://"), a
DistributedSampler with set_epoch, rank-0 logging and rank-0 checkpoints (resumed after a
restart), linear LR scaling with warmup, and @record so a failure lands in the error file.
The data is synthetic but learnable: labels come from a fixed random "teacher" layer.

  ctrun --standalone --nproc_per_node=2 tests/python/ddp_mlp.py --epochs 3
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_dataset(n: int) -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 784, generator=g)
    teacher = torch.randn(784, 10, generator=g)
    y = (x @ teacher).argmax(dim=1)
    return TensorDataset(x, y)


@record
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--checkpoint", default="")
    parser.add_argument("--fail_at_epoch", type=int, default=-1,
                        help="raise in rank 1 at this epoch on the first attempt (restart tests)")
    args = parser.parse_args()

    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == int(os.environ["WORLD_SIZE"]) and rank == int(os.environ["RANK"])
    torch.manual_seed(0)  # same initial weights everywhere; DDP broadcasts rank 0's anyway

    model = DDP(nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10)))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr * world)  # linear scaling
    criterion = nn.CrossEntropyLoss()
    dataset = make_dataset(args.samples)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    warmup_steps = len(loader)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup_steps))

    start_epoch = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint, map_location="cpu")
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        start_epoch = state["epoch"] + 1
        if rank == 0:
            print(f"resumed from epoch {state['epoch']}", flush=True)

    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    for epoch in range(start_epoch, args.epochs):
        if epoch == args.fail_at_epoch and restart == 0 and rank == 1:
            raise RuntimeError(f"injected failure at epoch {epoch}")
        sampler.set_epoch(epoch)
        model.train()
        total, batches, started = 0.0, 0, time.time()
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            scheduler.step()
            total += loss.item()
            batches += 1
        mean = torch.tensor([total / batches])
        dist.all_reduce(mean)
        mean /= world
        if rank == 0:
            print(f"epoch {epoch}: loss={mean.item():.4f} world={world} "
                  f"time={time.time() - started:.2f}s", flush=True)
            if args.checkpoint:
                tmp = args.checkpoint + ".tmp"
                torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                            "scheduler": scheduler.state_dict(), "epoch": epoch}, tmp)
                os.replace(tmp, args.checkpoint)
        dist.barrier()

    # Every rank holds the same parameters: compare a checksum across ranks.
    checksum = torch.tensor([sum(p.detach().double().sum().item() for p in model.parameters())])
    gathered = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(gathered, checksum.double())
    assert all(torch.equal(gathered[0], g) for g in gathered), "parameters diverged across ranks"
    if rank == 0:
        print(f"done: {args.epochs} epochs, world size {world}, parameters identical", flush=True)
    # torch 1.13 can deadlock in its own teardown (destroy_process_group or interpreter exit:
    # the main thread joins while rank 0's TCPStore threads poll), under torchrun as under
    # ctrun. Once every rank is past this barrier nothing needs the group any more, so leave
    # without the teardown.
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
