# ctrun's sitecustomize for its Python workers (docs/faults.md, "Hang reports"). Python imports
# it at start because ctrun puts its helper directory first on the workers' PYTHONPATH.
#
# It registers faulthandler on the signal the agent names (CTRUN_STACKS_SIGNAL), writing every
# thread's stack to CTRUN_STACKS_FILE: the agent sends that signal to take a running worker's
# Python stacks for a hang report without stopping it. Then it runs the sitecustomize that this
# one shadows (Debian's, a virtual environment's), if any.
import os as _os
import sys as _sys


def _ctrun_register_stacks():
    signal_number = _os.environ.get("CTRUN_STACKS_SIGNAL", "")
    path = _os.environ.get("CTRUN_STACKS_FILE", "")
    if not signal_number.isdigit() or not path:
        return None
    try:
        import faulthandler

        # Kept open for the process's life: faulthandler writes to its descriptor from the
        # signal handler.
        out = open(path, "a")
        faulthandler.register(int(signal_number), file=out, all_threads=True, chain=False)
        return out
    except (OSError, ValueError, RuntimeError):
        return None  # no stacks on request; the worker runs as without ctrun


_ctrun_stacks_file = _ctrun_register_stacks()


def _ctrun_run_shadowed():
    here = _os.path.dirname(_os.path.abspath(__file__))
    for entry in _sys.path:
        directory = _os.path.abspath(entry or ".")
        if directory == here:
            continue
        candidate = _os.path.join(directory, "sitecustomize.py")
        if _os.path.isfile(candidate):
            with open(candidate) as f:
                code = compile(f.read(), candidate, "exec")
            exec(code, {"__name__": "sitecustomize", "__file__": candidate})
            return


_ctrun_run_shadowed()
