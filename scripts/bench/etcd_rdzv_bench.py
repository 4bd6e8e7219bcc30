#!/usr/bin/python3
"""Torch's own etcd-v2 rendezvous against ctrun's etcd backend (and ctrund), in one run.

torch side: N node processes, each with what `torchrun --rdzv_backend etcd-v2` builds: an
EtcdRendezvousBackend and EtcdStore (python-etcd, etcd's v2 API) behind a
DynamicRendezvousHandler, call next_rendezvous() with min = max = N against a fresh etcd
(--enable-v2). The time is from the first next_rendezvous() call to the last one returning.

ctrun side: backend_rdzv_bench (one process playing N agents through the agent's Backend, each
with its own connection, lease and watch) against a fresh etcd, and against a fresh ctrund, at
the same N, in the same loop.

Needs Debian's python3-torch (1.13) and python3-etcd (`apt-get install python3-etcd`): without
python-etcd, the torch column is skipped with a message. Run with /usr/bin/python3 inside a
loopback-only network namespace (run.sh does both).
"""
import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time

from bench_common import Etcd, first_json_row, time_torch_rendezvous

from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousTimeout,
)

try:  # python-etcd (python3-etcd): torch's etcd-v2 backend is built on it
    from torch.distributed.elastic.rendezvous.etcd_rendezvous_backend import create_backend
except ImportError:
    create_backend = None

HOST = "127.0.0.1"
JOIN_TIMEOUT_S = 240
START_TIMEOUT_S = 60


def run_torch(nodes, rep, tmp):
    """Wall time in seconds for one torch etcd-v2 rendezvous of `nodes` processes."""
    etcd = Etcd(tmp)
    try:
        run_id = f"etcd_bench_{nodes}_{rep}"

        def make_handler():  # in each node process
            params = RendezvousParameters(backend="etcd-v2", endpoint=f"{HOST}:{etcd.port}",
                                          run_id=run_id, min_nodes=nodes, max_nodes=nodes)
            backend, store = create_backend(params)
            return DynamicRendezvousHandler.from_backend(
                run_id, store, backend, nodes, nodes,
                timeout=RendezvousTimeout(join=datetime.timedelta(seconds=JOIN_TIMEOUT_S)))

        return time_torch_rendezvous(nodes, make_handler, "torch etcd-v2", START_TIMEOUT_S,
                                     JOIN_TIMEOUT_S)
    finally:
        etcd.stop()


def run_ctrun(bench, backend, nodes):
    """Wall time in seconds for one round of `nodes` agents on `backend` (backend_rdzv_bench)."""
    row = first_json_row([bench, "--backends", backend, "--nodes", str(nodes), "--reps", "1"],
                         JOIN_TIMEOUT_S + START_TIMEOUT_S + 60)
    return row["join_wall_s"]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default_bench = os.path.join(here, "..", "..", "build-bench", "scripts", "bench",
                                 "backend_rdzv_bench")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="16,64", help="node counts, comma-separated")
    ap.add_argument("--reps", type=int, default=3, help="repetitions (the median is reported)")
    ap.add_argument("--quick", action="store_true", help="one repetition")
    ap.add_argument("--backend_rdzv_bench", default=os.path.normpath(default_bench))
    args = ap.parse_args()
    reps = 1 if args.quick else args.reps
    counts = [int(n) for n in args.nodes.split(",")]
    sides = ["ctrun-etcd", "ctrund"]
    if create_backend is None:
        print("etcd_rdzv_bench: torch's etcd-v2 needs python-etcd (apt-get install python3-etcd): "
              "its column is skipped", file=sys.stderr)
    else:
        sides.insert(0, "torch-etcd-v2")

    times = {(side, n): [] for side in sides for n in counts}
    with tempfile.TemporaryDirectory(prefix="etcd_rdzv_bench.") as tmp:
        for rep in range(reps):
            for n in counts:
                # Rotate the order so drift on a shared machine hits every side alike.
                order = sides[rep % len(sides):] + sides[:rep % len(sides)]
                for side in order:
                    if side == "torch-etcd-v2":
                        t = run_torch(n, rep, tmp)
                    else:
                        backend = "etcd" if side == "ctrun-etcd" else "ctrund"
                        t = run_ctrun(args.backend_rdzv_bench, backend, n)
                    times[(side, n)].append(t)
                    print(f"rep {rep + 1} {side:13} {n:4} nodes: {t * 1e3:9.1f} ms",
                          file=sys.stderr)

    print(f"\netcd_rdzv_bench: one rendezvous round of N nodes (min = max = N) on a fresh etcd, "
          f"median of {reps}\n")
    med = {k: statistics.median(v) for k, v in times.items() if v}
    if "torch-etcd-v2" in sides:
        print("| nodes | torch etcd-v2 (ms) | ctrun etcd (ms) | ctrund (ms) | torch etcd-v2 / ctrun etcd |")
        print("|------:|-------------------:|----------------:|------------:|---------------------------:|")
        for n in counts:
            t, e, c = med[("torch-etcd-v2", n)], med[("ctrun-etcd", n)], med[("ctrund", n)]
            print(f"| {n:5} | {t * 1e3:18.1f} | {e * 1e3:15.1f} | {c * 1e3:11.1f} | {t / e:25.1f}x |")
    else:
        print("| nodes | ctrun etcd (ms) | ctrund (ms) |")
        print("|------:|----------------:|------------:|")
        for n in counts:
            print(f"| {n:5} | {med[('ctrun-etcd', n)] * 1e3:15.1f} | {med[('ctrund', n)] * 1e3:11.1f} |")


if __name__ == "__main__":
    main()
