"""A Python data-parallel job over gloo written to survive restarts bit for bit, as a user's job under
`ctrun --faults` would be: every input is a function of the step, rank 0 checkpoints model,
optimizer and step every few steps (atomically), a restarted job resumes from the checkpoint,
and each step is reported through ctrun's helper, so that faults planned at a step land there
(and a planned exception is raised there). At the end every rank writes the digest of its
parameters as its result, so a faulted run is compared with a clean one.

  ctrun --standalone --nproc_per_node=3 --max_restarts=6 --faults=random:... \\
      --fault_report=report.json tests/python/fault_train.py --checkpoint ckpt.pt

With --device cuda each rank trains on cuda:LOCAL_RANK over NCCL, deterministically (a planned
cuda_error then breaks the worker's CUDA context at a step).
"""
import argparse
import hashlib
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn

import ctrun_worker  # on PYTHONPATH under ctrun --faults / --worker_timeout


def batch(step: int, rank: int, size: int):
    """Step `step`'s inputs on `rank`: the same in every attempt."""
    g = torch.Generator().manual_seed(1_000_003 * step + rank)
    x = torch.randn(size, 32, generator=g)
    y = (x[:, :8].sum(dim=1) > 0).long()
    return x, y


def digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def average_gradients(model: nn.Module) -> None:
    """Data parallel by hand: one all-reduce of every gradient as one flat buffer. Not DDP:
    DDP rebuilds its buckets after the first step of each process, so with three or more ranks a
    resumed job would sum gradients in another order than an uninterrupted one (gloo's ring
    splits the buffer by offset) and differ in the last bits; one fixed buffer keeps the order."""
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--checkpoint_every", type=int, default=5)
    parser.add_argument("--step_seconds", type=float, default=0.03,
                        help="sleep per step: room for faults to land at a step")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: each rank on cuda:LOCAL_RANK, over NCCL")
    args = parser.parse_args()

    device = torch.device("cpu")
    if args.device == "cuda":
        # Bit-identical runs on a GPU: cuBLAS's fixed workspace and deterministic kernels.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", init_method="env://")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    criterion = nn.CrossEntropyLoss()

    step = 0
    if os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
        if rank == 0:
            print(f"resumed from step {step}", flush=True)

    while step < args.steps:
        x, y = (t.to(device) for t in batch(step, rank, args.batch_size))
        optimizer.zero_grad()
        criterion(model(x), y).backward()
        average_gradients(model)
        optimizer.step()
        step += 1
        if rank == 0 and step % args.checkpoint_every == 0:
            tmp = args.checkpoint + ".tmp"
            torch.save({"model": model.state_dict(),
                        "optimizer": optimizer.state_dict(), "step": step}, tmp)
            os.replace(tmp, args.checkpoint)
        time.sleep(args.step_seconds)
        ctrun_worker.report_step(step)

    result = digest(model)
    ctrun_worker.write_result(result)
    print(f"rank {rank}: digest {result}", flush=True)
    # torch 1.13 can deadlock in its own teardown (see ddp_mlp.py): once every rank is past
    # this barrier nothing needs the group any more.
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    try:
        main()
    except Exception:
        # A failed worker ends here, as uncaught, but without torch's teardown: after a CUDA
        # error its NCCL group's destructor may wait on communicators the context cannot end.
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
