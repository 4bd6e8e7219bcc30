# A script that knows nothing of ctrun: it steps torch optimizers, and ctrun's sitecustomize
# counts the first optimizer's steps as the worker's (docs/env.md, "Steps without a code change").
#   optimizer_steps.py check            run directly with ctrun's helper directory on PYTHONPATH
#                                       and CTRUN_HEARTBEAT_FILE set: checks what the file says
#                                       after each kind of step, exits 1 on the first mismatch
#   optimizer_steps.py train N [HANG]   N steps of 50 ms (a second optimizer and gradient
#                                       accumulation of 2 micro-steps included); with HANG, hangs
#                                       for good after step HANG
import os
import sys
import time

import torch


def heartbeat_step():
    with open(os.environ["CTRUN_HEARTBEAT_FILE"]) as f:
        return int(f.read().split()[0])


def expect(what, want):
    got = heartbeat_step()
    if got != want:
        print(f"optimizer_steps: {what}: the heartbeat file says step {got}, expected {want}",
              file=sys.stderr)
        sys.exit(1)


def check():
    model = torch.nn.Linear(4, 1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    adam = torch.optim.Adam(model.parameters(), lr=0.1)  # a second optimizer: not counted

    def backward():
        model(torch.randn(8, 4)).pow(2).mean().backward()

    for step in range(1, 4):
        backward()
        sgd.step()
        adam.step()
        sgd.zero_grad()
        expect(f"after SGD's step {step} and Adam's", step)
    # Gradient accumulation: two backward passes, one optimizer step.
    backward()
    backward()
    sgd.step()
    expect("after one step of two accumulated micro-batches", 4)

    # A subclass whose step calls its base's is one step.
    class Clipped(torch.optim.SGD):
        def step(self, closure=None):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            return super().step(closure)

    import ctrun_worker

    # The script's own count wins from its first report_step on.
    ctrun_worker.report_step(100)
    expect("after report_step(100)", 100)
    sgd.step()
    expect("after a step once the script reports its own", 100)
    del sgd, adam
    clipped = Clipped(model.parameters(), lr=0.1)
    ctrun_worker._steps.explicit = False  # as in a new process: the hook counts again
    clipped.step()
    expect("after the first step of a new optimizer (the first one gone)", 5)
    clipped.step()
    expect("after a subclass's step that calls its base's", 6)


def train(steps, hang):
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, steps + 1):
        for _ in range(2):
            model(torch.randn(8, 16)).pow(2).mean().backward()
        time.sleep(0.05)
        optimizer.step()
        optimizer.zero_grad()
        if step == hang:
            while True:
                time.sleep(1)
    print(f"trained {steps} steps", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "check":
        check()
    else:
        train(int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 0)
