"""Worker of launch_bench.py's launch-to-first-collective benchmark, run under ctrun and under
torchrun alike.

    first_collective.py OUT_DIR

Joins a Gloo process group (env:// from the launcher's environment; under an agent store, as
both launchers give it, through the agent's store), all-reduces one number once, checks the
sum, and writes CLOCK_MONOTONIC (ns) at that moment to OUT_DIR/done.<rank>.
"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
x = torch.ones(1)
dist.all_reduce(x)
t_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
world = dist.get_world_size()
if int(x.item()) != world:
    sys.exit(f"all_reduce gave {x.item()}, expected {world}")
rank = dist.get_rank()
tmp = os.path.join(sys.argv[1], f".done.{rank}.tmp")
with open(tmp, "w") as f:
    f.write(str(t_ns))
os.rename(tmp, os.path.join(sys.argv[1], f"done.{rank}"))
dist.destroy_process_group()
