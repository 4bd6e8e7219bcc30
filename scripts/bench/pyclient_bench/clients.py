"""The worker of pyclient_bench.py: N ranks of a process group's bootstrap, each a real
torch.distributed.TCPStore client (torch's own Python client, as a user's workers have it), all
against the store of the launcher that started this one worker (MASTER_ADDR:MASTER_PORT: the
agent's store under ctrun and torch 2.x's torchrun, where TORCHELASTIC_USE_AGENT_STORE=True; under
torch 1.13's torchrun this worker hosts it, as rank 0's init_process_group would).

The ranks run as threads of --procs forked processes (TCPStore releases the GIL in its calls).
Each rank connects, then rank 0 sets a 128-byte id that every other rank waits for and reads,
then the store barrier of init_process_group: add 1, the last sets a key, all wait for it. The
time is from the start signal to the last rank through the barrier. Writes one JSON line to
--json_out.
"""
import argparse
import datetime
import json
import multiprocessing as mp
import os
import threading
import time

import torch.distributed as dist

ID_KEY = "bench/default_pg/0"
BARRIER_KEY = "bench/store_based_barrier_key:1"
LAST_KEY = BARRIER_KEY + ":last_worker"
UNIQUE_ID = bytes(range(128))


def one_rank(rank, ranks, addr, port, timeout, start, out):
    try:
        start.wait()
        store = dist.TCPStore(addr, port, is_master=False, timeout=timeout,
                              wait_for_workers=False)
        if rank == 0:
            store.set(ID_KEY, UNIQUE_ID)
        else:
            store.wait([ID_KEY])
            if store.get(ID_KEY) != UNIQUE_ID:
                raise RuntimeError("the unique id read back differs")
        if store.add(BARRIER_KEY, 1) == ranks:
            store.set(LAST_KEY, b"1")
        store.wait([LAST_KEY])
        out.append((time.time(), None))
    except Exception as e:  # noqa: BLE001 - a rank's failure is a result
        out.append((time.time(), f"rank {rank}: {type(e).__name__}: {e}"))


def one_process(first, count, ranks, addr, port, timeout_s, start, ready, results):
    timeout = datetime.timedelta(seconds=timeout_s)
    out = []
    threads = [threading.Thread(target=one_rank,
                                args=(first + i, ranks, addr, port, timeout, start, out))
               for i in range(count)]
    for t in threads:
        t.start()
    with ready.get_lock():
        ready.value += 1
    for t in threads:
        t.join()
    results.put(out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, required=True)
    p.add_argument("--procs", type=int, default=2 * (os.cpu_count() or 1))
    p.add_argument("--timeout_s", type=float, default=120)
    p.add_argument("--json_out", required=True)
    a = p.parse_args()
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    ctx = mp.get_context("fork")
    start, ready, results = ctx.Event(), ctx.Value("i", 0), ctx.Queue()
    per = -(-a.ranks // a.procs)
    procs = []
    for first in range(0, a.ranks, per):
        count = min(per, a.ranks - first)
        procs.append(ctx.Process(target=one_process, args=(
            first, count, a.ranks, addr, port, a.timeout_s, start, ready, results)))
    for proc in procs:
        proc.start()
    deadline = time.time() + a.timeout_s
    while ready.value < len(procs):  # every process's threads waiting on the start signal
        if time.time() > deadline:
            raise SystemExit("clients.py: the client processes did not start in time")
        time.sleep(0.01)
    server = None
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":  # rank 0 hosts it (torch 1.x)
        server = dist.TCPStore(addr, port, is_master=True, wait_for_workers=False,
                               timeout=datetime.timedelta(seconds=a.timeout_s))
    t0 = time.time()
    start.set()
    ends, errors = [], []
    for _ in procs:
        for end, error in results.get(timeout=a.timeout_s + 30):
            ends.append(end)
            if error:
                errors.append(error)
    for proc in procs:
        proc.join(30)
    del server
    row = {"ranks": a.ranks, "ok": not errors and len(ends) == a.ranks,
           "wall_s": max(ends) - t0 if ends else None, "errors": len(errors),
           "first_error": errors[0] if errors else None}
    with open(a.json_out, "w") as f:
        f.write(json.dumps(row) + "\n")
    return 0 if row["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
