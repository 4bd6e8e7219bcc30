# ctrun's sitecustomize for its Python workers (docs/faults.md, "Hang reports"). Python imports
# it at start because ctrun puts its helper directory first on the workers' PYTHONPATH.
#
# It registers faulthandler on the signal the agent names (CTRUN_STACKS_SIGNAL), writing every
# thread's stack to CTRUN_STACKS_FILE: the agent sends that signal to take a running worker's
# Python stacks for a hang report without stopping it. Where the worker has a heartbeat file it
# has ctrun_worker count the script's optimizer steps and time DDP's waits (no code change).
# Then it runs the sitecustomize that this one shadows (Debian's, a virtual environment's), if
# any.
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


class _CtrunAfterImport:
    """Steps without a code change (docs/env.md, "Steps"): once torch's autograd, optimizer and
    DistributedDataParallel modules have loaded, ctrun_worker counts the first optimizer's steps
    and times DDP's waits for the peers. A finder on sys.meta_path that finds nothing itself: it
    asks the others for these modules and runs ctrun_worker's patch after each has run."""

    NAMES = ("torch.autograd", "torch.optim.optimizer", "torch.nn.parallel.distributed")

    def find_spec(self, name, path=None, target=None):
        if name not in self.NAMES:
            return None
        for finder in _sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_then_patch(module):
            exec_module(module)
            try:
                import ctrun_worker

                ctrun_worker._steps.patch(name, module)
            except ImportError:
                pass

        loader.exec_module = exec_then_patch
        return spec


# Only where the agent reads the steps (it gave the worker a heartbeat file), and not when the
# user asks for none (CTRUN_AUTO_STEPS=0).
if _os.environ.get("CTRUN_HEARTBEAT_FILE") and _os.environ.get("CTRUN_AUTO_STEPS", "1") != "0":
    _sys.meta_path.insert(0, _CtrunAfterImport())


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
