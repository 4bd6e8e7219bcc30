"""The reference side of train_bench and gpu_bench: the trainers' models (trainers/mlp.cc,
trainers/gpt.cc, same layers, sizes, loss and optimizer) in PyTorch's own Python DDP, over gloo on
the CPU or nccl with --device cuda (cuda:LOCAL_RANK), run by torchrun.
It trains --max_steps optimizer steps and prints the same summary line as the C++ trainers:

  final loss <L> after <N> steps, samples/s <S>

where S is the global samples/s over the last 50 steps, each step timed from the start of its
forward pass to the end of optimizer.step(), as trainers/src/train_loop.cc times it.

  torchrun --nproc_per_node=2 ddp_ref.py mlp|gpt [--max_steps N] [--batch_size B]
      [--width W --layers L --heads H --context C] [--device cpu|cuda] [--bf16] [--no_ddp]
      [--no_foreach]
"""
import argparse
import collections
import contextlib
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class CausalSelfAttention(nn.Module):
    def __init__(self, width, heads, context):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.projection = nn.Linear(width, width)
        # A plain attribute, not a buffer: torch 1.13's DDP cannot broadcast bool buffers
        # ("Invalid scalar type"); libctrun_worker's DDP sends them as bytes.
        self.causal_mask = torch.ones(context, context, dtype=torch.bool).tril().logical_not()

    def forward(self, x):
        b, t, w = x.shape
        q, k, v = self.qkv(x).split(w, 2)
        q, k, v = (z.view(b, t, self.heads, w // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = q.matmul(k.transpose(-2, -1)) / math.sqrt(w // self.heads)
        scores = scores.masked_fill(self.causal_mask[:t, :t], float("-inf"))
        y = scores.softmax(-1).matmul(v).transpose(1, 2).contiguous().view(b, t, w)
        return self.projection(y)


class Block(nn.Module):
    def __init__(self, width, heads, context):
        super().__init__()
        self.attention_norm = nn.LayerNorm(width)
        self.attention = CausalSelfAttention(width, heads, context)
        self.mlp_norm = nn.LayerNorm(width)
        self.mlp_in = nn.Linear(width, 4 * width)
        self.mlp_out = nn.Linear(4 * width, width)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.mlp_out(F.gelu(self.mlp_in(self.mlp_norm(h))))


class Gpt(nn.Module):
    def __init__(self, width, layers, heads, context):
        super().__init__()
        self.token_embedding = nn.Embedding(256, width)
        self.position_embedding = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads, context) for _ in range(layers))
        self.final_norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 256)

    def forward(self, tokens):
        x = self.token_embedding(tokens) + self.position_embedding(
            torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.final_norm(x))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model", choices=["mlp", "gpt"])
    p.add_argument("--max_steps", type=int, default=60)
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast in the forward pass")
    p.add_argument("--no_ddp", action="store_true",
                   help="train the model alone, not wrapped in DDP (world size 1)")
    p.add_argument("--no_foreach", action="store_true",
                   help="the optimizer's per-parameter loop, as LibTorch's C++ optimizers run, "
                        "instead of torch's multi-tensor (foreach) kernels on CUDA")
    a = p.parse_args()

    if a.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    world = dist.get_world_size()
    torch.manual_seed(a.seed)
    foreach = False if a.no_foreach else None  # None: torch's default for the device
    # (a CPU-only torch refuses even a disabled CUDA autocast)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if a.bf16 else \
        contextlib.nullcontext
    g = torch.Generator().manual_seed(a.seed)
    if a.model == "mlp":
        model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
        inputs = torch.randn(10000, 784, generator=g)
        labels = inputs.matmul(torch.randn(784, 10, generator=g)).argmax(1)
        inputs, labels = inputs.to(device), labels.to(device)
        model.to(device)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=foreach)

        def loss_on(net, idx):
            return F.cross_entropy(net(inputs[idx]), labels[idx])
        n = inputs.shape[0]
    else:
        model = Gpt(a.width, a.layers, a.heads, a.context).to(device)
        for m in model.modules():
            if isinstance(m, CausalSelfAttention):
                m.causal_mask = m.causal_mask.to(device)
        windows = (1 << 20) // (a.context + 1)
        data = torch.randint(0, 256, (windows, a.context + 1), generator=g).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=foreach)

        def loss_on(net, idx):
            rows = data[idx]
            with autocast():
                logits = net(rows[:, :-1])
            return F.cross_entropy(logits.reshape(-1, 256).float(), rows[:, 1:].reshape(-1))
        n = data.shape[0]
    if a.no_ddp:
        assert dist.get_world_size() == 1, "--no_ddp trains one replica: world size 1"
        ddp = model
    else:
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    rank = dist.get_rank()
    order = torch.randperm(n, generator=g)[rank::world]
    times = collections.deque(maxlen=50)
    pos = 0
    for step in range(a.max_steps):
        started = time.perf_counter()
        idx = order[pos:pos + a.batch_size].to(device)
        pos = (pos + a.batch_size) % (len(order) - a.batch_size)
        loss = loss_on(ddp, idx)
        loss.item()
        ddp.zero_grad()  # as set_to_none=False; the C++ loop zeroes after the step instead
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - started)
    dist.barrier()
    if rank == 0:
        rate = a.batch_size * len(times) / sum(times) * world
        print(f"final loss {loss.item():.6f} after {a.max_steps} steps, samples/s {rate:.1f}",
              flush=True)
    # torch 1.13 can hang in process-group teardown (tests/python/ddp_mlp.py has the story).
    os._exit(0)


if __name__ == "__main__":
    main()
