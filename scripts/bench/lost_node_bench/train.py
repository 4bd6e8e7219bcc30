"""lost_node_bench.py's worker: a small DDP job of our own, run unchanged under ctrun and torchrun.

It trains a two-layer MLP on random data over Gloo (env:// from the launcher's MASTER_ADDR,
MASTER_PORT, RANK, WORLD_SIZE) and, after every step, appends one line to
$LNB_OUT/node$LNB_NODE.log:

    TIME STEP RESTART WORLD RANK PID

TIME is time.time() (the namespaces share the clock), RESTART the launcher's
TORCHELASTIC_RESTART_COUNT, WORLD the process group's size. Three more kinds of line have a word
for STEP: `launch` (TIME: the interpreter's first statement, before `import torch`; written
with `pg` once the process group is up), `pg` and `error` (TIME: when a step raised, e.g. a
collective's timeout; the exception is raised again). Rank 0 saves the model and the step
every 10 steps ($LNB_OUT/ckpt.pt, written under a temporary name and renamed); every rank
resumes from it.

Settings, from the environment (the benchmark sets them the same for both launchers):
  LNB_STEP_S      pad each step to this many seconds with a sleep (0.05; 0: no padding)
  LNB_HIDDEN      hidden width (64), LNB_BATCH batch size per rank (32)
  LNB_PG_TIMEOUT  init_process_group's timeout in seconds; unset: torch's default (30 min)
  LNB_MAX_S       stop (exit 0) after this many seconds (600): every run is bounded
"""
import os
import time

LAUNCHED = time.time()

import datetime  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

out = os.environ["LNB_OUT"]
node = os.environ["LNB_NODE"]
step_s = float(os.environ.get("LNB_STEP_S", "0.05"))
hidden = int(os.environ.get("LNB_HIDDEN", "64"))
batch = int(os.environ.get("LNB_BATCH", "32"))
pg_timeout = os.environ.get("LNB_PG_TIMEOUT")
max_s = float(os.environ.get("LNB_MAX_S", "600"))
restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")

torch.set_num_threads(1)
kwargs = {"timeout": datetime.timedelta(seconds=float(pg_timeout))} if pg_timeout else {}
dist.init_process_group("gloo", **kwargs)
rank, world = dist.get_rank(), dist.get_world_size()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, hidden), nn.ReLU(), nn.Linear(hidden, 1))
ckpt = os.path.join(out, "ckpt.pt")
step = 0
if os.path.exists(ckpt):
    state = torch.load(ckpt)
    model.load_state_dict(state["model"])
    step = state["step"]
ddp = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
log = open(os.path.join(out, f"node{node}.log"), "a", buffering=1)
log.write(f"{LAUNCHED:.3f} launch {restart} {world} {rank} {os.getpid()}\n")
log.write(f"{time.time():.3f} pg {restart} {world} {rank} {os.getpid()}\n")

torch.manual_seed(1000 + rank)
end = time.monotonic() + max_s
while time.monotonic() < end:
    t0 = time.monotonic()
    try:
        x = torch.randn(batch, 32)
        loss = nn.functional.mse_loss(ddp(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
    except Exception:
        log.write(f"{time.time():.3f} error {restart} {world} {rank} {os.getpid()}\n")
        raise
    step += 1
    log.write(f"{time.time():.3f} {step} {restart} {world} {rank} {os.getpid()}\n")
    if rank == 0 and step % 10 == 0:
        tmp = f"{ckpt}.{os.getpid()}.tmp"
        torch.save({"model": model.state_dict(), "step": step}, tmp)
        os.rename(tmp, ckpt)
    time.sleep(max(0.0, step_s - (time.monotonic() - t0)))
dist.destroy_process_group()
