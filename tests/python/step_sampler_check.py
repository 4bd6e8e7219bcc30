"""Checks ctrun_worker.StepSampler on its own (run by python_fault_tolerance_test.cc): an epoch's
order is torch's DistributedSampler's; every sample of an epoch is trained exactly once with
quorums of 1 to 6 replicas and every fourth step lost; restore() takes a peer's place; bad
arguments are refused; FaultTolerance refuses a worker outside the mode and contradicting
timeouts, each in one line naming what is wrong. Prints "ok" at the end; an assertion names what failed."""
import os
import random
import sys

import torch
from torch.utils.data import DistributedSampler

import ctrun_worker


def main():
    n = 1000
    for epoch in (0, 3):
        s = ctrun_worker.StepSampler(n, 7, seed=11)
        s.set_epoch(epoch)
        torch_order = DistributedSampler(range(n), num_replicas=1, rank=0, seed=11)
        torch_order.set_epoch(epoch)
        got = [i for r in range(1) for i in s.step(r, 1)]
        assert got == list(torch_order)[:7], f"epoch {epoch}: {got} is not torch's order"
    assert ctrun_worker.StepSampler(5, 2, shuffle=False).step(0, 2) == [0, 2]

    rng = random.Random(5)
    s = ctrun_worker.StepSampler(n, 13, seed=2)
    for epoch in range(3):
        s.set_epoch(epoch)
        seen, steps = [], 0
        while not s.epoch_done():
            size = rng.randint(1, 6)
            shares = [s.step(r, size) for r in range(size)]
            steps += 1
            if steps % 4 == 0:
                continue  # lost: the next quorum trains the same place again
            for share in shares:
                seen += share
            s.commit(size)
        assert sorted(seen) == list(range(n)), f"epoch {epoch}: not each sample once"

    peer = ctrun_worker.StepSampler(n, 13, seed=2)
    peer.set_epoch(1)
    peer.commit(3)
    healed = ctrun_worker.StepSampler(n, 13, seed=2)
    healed.load_state_dict(peer.state_dict())
    assert healed.state_dict() == {"epoch": 1, "committed": 39}
    assert healed.step(1, 3) == peer.step(1, 3)

    for bad in (lambda: ctrun_worker.StepSampler(0, 1), lambda: ctrun_worker.StepSampler(5, 0),
                lambda: ctrun_worker.StepSampler(5, 1).step(2, 2),
                lambda: ctrun_worker.StepSampler(5, 1).step_size(0)):
        try:
            bad()
        except ValueError:
            continue
        raise AssertionError("bad arguments were not refused")
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    os.environ.pop("CTRUN_FAULT_TOLERANCE", None)
    try:
        ctrun_worker.FaultTolerance(model, optimizer)
        raise AssertionError("FaultTolerance ran outside --fault_tolerance=step")
    except RuntimeError as e:
        assert "--fault_tolerance=step" in str(e), str(e)
    os.environ.update(CTRUN_FAULT_TOLERANCE="step", CTRUN_WORKER_PROXY="/nonexistent")
    for kwargs, said in (({"collective_timeout": 60}, "the collective timeout (60s) must be "
                          "shorter than the join timeout (60s)"),
                         ({"heartbeat_timeout": 0}, "the heartbeat timeout must be positive"),
                         ({"backend": "mpi"}, "backend must be 'gloo' or 'nccl'")):
        try:
            ctrun_worker.FaultTolerance(model, optimizer, **kwargs)
            raise AssertionError(f"{kwargs} was not refused")
        except ValueError as e:
            assert said in str(e), str(e)
    print("ok")


if __name__ == "__main__":
    sys.exit(main())
