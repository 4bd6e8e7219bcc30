"""ctrun's helper for Python workers: report training steps and results to the agent.

ctrun puts this module first on the workers' PYTHONPATH when it gives them heartbeat files
(with --worker_timeout, --faults or --fault_report), so a script imports it without installing
anything:

    import ctrun_worker
    for step in range(start, steps):
        train_one_step()
        ctrun_worker.report_step(step + 1)   # a beat, the step for plans "at_step", and the
                                             # point where a planned exception is raised
    ctrun_worker.write_result(digest)        # --fault_report quotes it by rank

Without ctrun (or without those options) every function does nothing, so a script that imports
it runs unchanged elsewhere: guard the import with try/except ImportError if it must also run
where ctrun is absent.
"""
import os
import sys

__all__ = ["InjectedFault", "report_step", "write_result"]


class InjectedFault(RuntimeError):
    """Raised by report_step() where a ctrun --faults plan injects an exception."""


def _make_cuda_error(message):
    """A CUDA error, as a GPU fault gives one: a kernel that indexes out of bounds on this
    worker's current device (a device-side assert). The context stays broken: every later CUDA
    call in the process fails too, NCCL's included. Raises what torch raises for it."""
    try:
        import torch
    except ImportError:
        raise InjectedFault(message + ": no CUDA device in this worker (torch is not "
                            "installed); raised as an exception instead") from None
    if not torch.cuda.is_available():
        raise InjectedFault(message + ": no CUDA device in this worker "
                            "(torch.cuda.is_available() is False); raised as an exception instead")
    device = torch.cuda.current_device()
    print(f"{message}: launching a kernel that fails on cuda:{device} "
          "(an index out of bounds: a device-side assert)", file=sys.stderr, flush=True)
    values = torch.zeros(1, device=device)
    values[torch.ones(1, dtype=torch.long, device=device)]
    torch.cuda.synchronize(device)
    raise InjectedFault(f"{message}: the failing kernel did not fail on cuda:{device}")


def report_step(step):
    """The worker finished training step `step` (its own count, from 1; a resumed run goes on
    from its checkpoint's step). Where the plan says so, raises InjectedFault, or makes a CUDA
    error (kind cuda_error: torch raises it), before the step is reported: the step that
    raised is not counted as done."""
    fault_file = os.environ.get("CTRUN_FAULT_FILE")
    if fault_file and os.path.exists(fault_file):
        # The agent's file: the kind on the first line, the message on the second.
        with open(fault_file) as f:
            text = f.read().strip()
        kind, _, message = text.partition("\n")
        if kind not in ("exception", "cuda_error"):
            kind, message = "exception", text  # a message alone (agents before cuda_error)
        message = message.strip() or "ctrun: injected " + kind
        if kind == "cuda_error":
            _make_cuda_error(message)
        raise InjectedFault(message)
    path = os.environ.get("CTRUN_HEARTBEAT_FILE")
    if path:
        try:
            # The agent created the file: open without creating, so that a beat after the
            # agent removed its directory does not make one.
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
        except OSError:
            return
        try:
            os.write(fd, f"{int(step)}\n".encode())
        finally:
            os.close(fd)


def write_result(text):
    """What identifies this worker's result (a digest of its parameters, a metric): with
    --fault_report the agent lists it by rank, so a CI job compares a faulted run with a clean
    one. One line; written once, at the end."""
    path = os.environ.get("CTRUN_RESULT_FILE")
    if path:
        with open(path, "w") as f:
            f.write(str(text).splitlines()[0] if str(text) else "")
            f.write("\n")


def _flight_record_summary(path, rank):
    """The last collective of each process group in an NCCL Flight Recorder dump (torch 2.x
    writes it as a pickle of plain dicts and lists), as the agent's hang report reads it."""
    import json
    import pickle

    with open(path, "rb") as f:
        dump = pickle.load(f)
    last = {}
    for entry in dump.get("entries", []):
        if entry.get("is_p2p"):
            continue
        group = entry.get("process_group") or (entry.get("pg_id"),)
        name = str(group[0] if isinstance(group, (tuple, list)) else group)
        seq = int(entry.get("collective_seq_id") or 0)
        if name not in last or seq >= last[name]["seq"]:
            last[name] = {"group": name, "seq": seq, "op": str(entry.get("profiling_name", "")),
                          "state": str(entry.get("state", ""))}
    print(json.dumps({"rank": rank, "last": sorted(last.values(), key=lambda l: l["group"])}))


if __name__ == "__main__":
    # `python3 ctrun_worker.py fr_summary DUMP RANK`: the agent's reader of Flight Recorder dumps.
    if len(sys.argv) == 4 and sys.argv[1] == "fr_summary":
        _flight_record_summary(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit("usage: ctrun_worker.py fr_summary DUMP RANK")
