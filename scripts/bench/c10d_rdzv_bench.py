#!/usr/bin/python3
"""Torch's own c10d dynamic rendezvous against ctrund, at the same node counts, in one run.

c10d side: N node processes, each with a TCPStore client and a DynamicRendezvousHandler over
C10dRendezvousBackend (what `torchrun --rdzv_backend c10d` uses), call next_rendezvous() with
min = max = N. The TCPStore server runs in its own process, as ctrund does. The time is from
the first next_rendezvous() call to the last one returning (store connections are made before).

ctrun side: rdzv_bench (the C++ load generator against a fresh ctrund) at the same N.

Run with /usr/bin/python3 (Debian's python3-torch 1.13) inside a loopback-only network
namespace: TCPStore binds every interface whatever address it is given.
"""
import argparse
import datetime
import multiprocessing as mp
import os
import statistics
import sys
import time

from bench_common import first_json_row, recv_within, time_torch_rendezvous

# Imported once here so forked node processes start at once (a fresh `import torch` takes
# about a second of CPU per process). Importing starts no threads, so forking is safe.
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousTimeout,
)

HOST = "127.0.0.1"
STORE_TIMEOUT = datetime.timedelta(seconds=60)
JOIN_TIMEOUT_S = 120
START_TIMEOUT_S = 60


def server_main(conn):
    store = TCPStore(HOST, 0, None, True, timeout=STORE_TIMEOUT, wait_for_workers=False)
    conn.send(store.port)
    conn.poll(JOIN_TIMEOUT_S + START_TIMEOUT_S + 60)  # until told to stop (or the parent is gone)


def run_c10d(nodes, rep):
    """Wall time in seconds for one c10d rendezvous of `nodes` processes."""
    ctx = mp.get_context("fork")
    server_conn, child = ctx.Pipe()
    server = ctx.Process(target=server_main, args=(child,), daemon=True)
    server.start()
    try:
        port = recv_within(server_conn, time.monotonic() + START_TIMEOUT_S, "TCPStore port")
        run_id = f"c10d_bench_{nodes}_{rep}"

        def make_handler():  # in each node process
            store = TCPStore(HOST, port, None, False, timeout=STORE_TIMEOUT,
                             wait_for_workers=False)
            backend = C10dRendezvousBackend(store, run_id)
            return DynamicRendezvousHandler.from_backend(
                run_id, store, backend, nodes, nodes,
                timeout=RendezvousTimeout(join=datetime.timedelta(seconds=JOIN_TIMEOUT_S)))

        return time_torch_rendezvous(nodes, make_handler, "c10d", START_TIMEOUT_S, JOIN_TIMEOUT_S)
    finally:
        try:
            server_conn.send("exit")
        except (OSError, ValueError):
            pass
        server.join(timeout=5)
        if server.is_alive():
            server.kill()
            server.join(timeout=5)


def run_ctrun(rdzv_bench, nodes):
    """Wall time in seconds for one ctrund rendezvous of `nodes` nodes (rdzv_bench)."""
    row = first_json_row([rdzv_bench, "--nodes", str(nodes), "--reps", "1"],
                         JOIN_TIMEOUT_S + START_TIMEOUT_S + 60)
    return row["join_wall_s"]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default_bench = os.path.join(here, "..", "..", "build-bench", "scripts", "bench", "rdzv_bench")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="16,64", help="node counts, comma-separated")
    ap.add_argument("--reps", type=int, default=3, help="repetitions (the median is reported)")
    ap.add_argument("--quick", action="store_true", help="one repetition")
    ap.add_argument("--rdzv_bench", default=os.path.normpath(default_bench))
    args = ap.parse_args()
    reps = 1 if args.quick else args.reps
    counts = [int(n) for n in args.nodes.split(",")]

    times = {(side, n): [] for side in ("c10d", "ctrun") for n in counts}
    for rep in range(reps):
        for n in counts:
            # Alternate the order so drift on a shared machine hits both sides alike.
            order = ("c10d", "ctrun") if rep % 2 == 0 else ("ctrun", "c10d")
            for side in order:
                t = run_c10d(n, rep) if side == "c10d" else run_ctrun(args.rdzv_bench, n)
                times[(side, n)].append(t)
                print(f"rep {rep + 1} {side:5} {n:3} nodes: {t * 1e3:8.1f} ms", file=sys.stderr)

    print(f"\nc10d_rdzv_bench: one rendezvous round of N nodes (min = max = N), "
          f"median of {reps}\n")
    print("| nodes | torch c10d (ms) | ctrund (ms) | speedup c10d/ctrun |")
    print("|------:|----------------:|------------:|-------------------:|")
    for n in counts:
        theirs = statistics.median(times[("c10d", n)])
        ours = statistics.median(times[("ctrun", n)])
        print(f"| {n:5} | {theirs * 1e3:15.1f} | {ours * 1e3:11.1f} | {theirs / ours:17.1f}x |")


if __name__ == "__main__":
    main()
