"""The seeds' MLP trained per-step fault tolerant from Python: ctrun_worker.FaultTolerance and
StepSampler under ctrun --fault_tolerance=step, on CPU (Gloo). What the tests check it by:

- `--consumed_log PATH`: one line per replica and committed step, appended:
  "<replica> <epoch> <step> <unix ms> <pid> <sample> ..." (the quorum's samples of the step);
- on stdout, "[<replica> pid N] training ..." when a process starts and
  "[<replica> pid N] parameters digest X" at the end.

The last local rank of the first attempt kills itself (--kill_at_step) or hangs (--hang_at_step)
in the middle of that step, after its forward pass: before its backward pass, which starts the
step's collectives, so that its peers' collectives of that step fail for certain. With --checkpoint, quorum rank 0 saves the
model, the optimizer, the sampler and the step every --checkpoint_every committed steps, and a
job started again resumes from it (--max_steps ends a run early, at a checkpoint).

  ctrun --standalone --nproc_per_node=3 --fault_tolerance=step tests/python/ft_mlp.py
"""
import argparse
import hashlib
import os
import signal
import sys
import time

import torch
import torch.nn as nn

import ctrun_worker


def make_dataset(n):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 64, generator=g)
    teacher = torch.randn(64, 10, generator=g)
    return x, (x @ teacher).argmax(dim=1)


def digest(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=1536)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--consumed_log", default="")
    parser.add_argument("--step_sleep_ms", type=float, default=0,
                        help="a longer step, as a bigger model's")
    parser.add_argument("--kill_at_step", type=int, default=-1)
    parser.add_argument("--hang_at_step", type=int, default=-1)
    parser.add_argument("--collective_timeout", type=float, default=1.0)
    parser.add_argument("--heartbeat_timeout", type=float, default=0.5)
    parser.add_argument("--join_timeout", type=float, default=3.0)
    parser.add_argument("--quorum_timeout", type=float, default=30.0)
    parser.add_argument("--checkpoint", default="")
    parser.add_argument("--checkpoint_every", type=int, default=0)
    parser.add_argument("--max_steps", type=int, default=0)
    args = parser.parse_args()

    replica = os.environ["CTRUN_REPLICA_ID"]
    who = "[%s pid %d]" % (replica, os.getpid())
    faulty = (os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0" and
              int(os.environ["LOCAL_RANK"]) == int(os.environ["LOCAL_WORLD_SIZE"]) - 1)
    print("%s training %d epochs of %d samples" % (who, args.epochs, args.samples), flush=True)

    torch.manual_seed(int(os.environ["RANK"]))  # replicas start unequal: the first quorum heals
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    x, y = make_dataset(args.samples)
    sampler = ctrun_worker.StepSampler(args.samples, args.batch_size, seed=args.seed)
    resumed = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        sampler.load_state_dict(state["sampler"])
        resumed = state["step"]
        print("%s resumed from the checkpoint at step %d" % (who, resumed), flush=True)
    ft = ctrun_worker.FaultTolerance(
        model, optimizer, sampler, collective_timeout=args.collective_timeout,
        heartbeat_timeout=args.heartbeat_timeout, join_timeout=args.join_timeout,
        quorum_timeout=args.quorum_timeout, committed_step=resumed)
    log = open(args.consumed_log, "a") if args.consumed_log else None
    criterion = nn.CrossEntropyLoss()
    finished_by_others = False
    while not (args.max_steps and ft.committed_step >= args.max_steps):
        if sampler.epoch_done():
            if sampler.epoch + 1 >= args.epochs:
                break
            sampler.set_epoch(sampler.epoch + 1)
        step = ft.begin_step()
        if step.finished:
            print("%s the other replicas finished the training at step %d: nothing left to "
                  "train" % (who, step.step), flush=True)
            finished_by_others = True
            break
        mine = sampler.step(step.rank, step.size)
        quorum_samples = [i for r in range(step.size) for i in sampler.step(r, step.size)]
        epoch = sampler.epoch
        if args.step_sleep_ms:  # a longer step, as a bigger model's
            time.sleep(args.step_sleep_ms / 1000)
        if mine:
            loss = criterion(model(x[mine]), y[mine])
        if faulty and step.step == args.kill_at_step:
            os.kill(os.getpid(), signal.SIGKILL)
        if faulty and step.step == args.hang_at_step:
            time.sleep(3600)
        if mine:
            loss.backward()
        if ft.should_commit():
            optimizer.step()
            if log:
                log.write("%s %d %d %d %d %s\n" % (
                    replica, epoch, ft.committed_step, int(time.time() * 1000), os.getpid(),
                    " ".join(str(i) for i in quorum_samples)))
                log.flush()
            if (args.checkpoint and args.checkpoint_every and step.rank == 0 and
                    ft.committed_step % args.checkpoint_every == 0):
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "sampler": sampler.state_dict(), "step": ft.committed_step},
                           args.checkpoint + ".tmp")
                os.replace(args.checkpoint + ".tmp", args.checkpoint)
        optimizer.zero_grad()
    if not finished_by_others:
        ft.finish()
        print("%s parameters digest %s after %d steps (%s)" % (
            who, digest(model), ft.committed_step, ft.stats), flush=True)
        ctrun_worker.write_result(digest(model))  # --fault_report quotes it by rank


if __name__ == "__main__":
    sys.exit(main())
