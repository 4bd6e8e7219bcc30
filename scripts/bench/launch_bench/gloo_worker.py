"""Worker of launch_bench.py's node-failure benchmark, run under ctrun and under torchrun alike.

    gloo_worker.py OUT_DIR

It records CLOCK_MONOTONIC before anything else (before `import torch`) in
OUT_DIR/start.<pid>, then joins a Gloo process group (env:// from the launcher's MASTER_ADDR,
MASTER_PORT, RANK, WORLD_SIZE) and all-reduces one number every 20 ms. After the first
all-reduce it writes OUT_DIR/steady.<pid>. Each file is one JSON object, written under a
temporary name and renamed. A failed collective (a peer that died) raises, and the worker
exits with 1, as a real training script would. Bounded: it stops by itself after 300 s.
"""
import time

T0_NS = time.clock_gettime_ns(time.CLOCK_MONOTONIC)

import datetime  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402


def stamp(name, **fields):
    out = sys.argv[1]
    record = dict(fields, pid=os.getpid(), ppid=os.getppid(),
                  restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "-1")),
                  world_size=int(os.environ.get("WORLD_SIZE", "-1")),
                  rank=int(os.environ.get("RANK", "-1")))
    tmp = os.path.join(out, f".{name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.rename(tmp, os.path.join(out, f"{name}.{os.getpid()}"))


stamp("start", t_ns=T0_NS)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
x = torch.ones(1)
deadline = time.monotonic() + 300
first = True
while time.monotonic() < deadline:
    dist.all_reduce(x)
    if first:
        stamp("steady", t_ns=time.clock_gettime_ns(time.CLOCK_MONOTONIC))
        first = False
    x.fill_(1)
    time.sleep(0.02)
