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

__all__ = ["InjectedFault", "report_step", "write_result"]


class InjectedFault(RuntimeError):
    """Raised by report_step() where a ctrun --faults plan injects an exception."""


def report_step(step):
    """The worker finished training step `step` (its own count, from 1; a resumed run goes on
    from its checkpoint's step). Raises InjectedFault when the plan says so, before the step
    is reported: the step that raised is not counted as done."""
    fault_file = os.environ.get("CTRUN_FAULT_FILE")
    if fault_file and os.path.exists(fault_file):
        with open(fault_file) as f:
            message = f.read().strip()
        raise InjectedFault(message or "ctrun: injected exception")
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
