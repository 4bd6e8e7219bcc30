"""Runs the reference /usr/bin/torchrun (PyTorch 1.13) under Python 3.11.

torch 1.13's Std.from_str("0") returns None on Python 3.11 (iterating an IntFlag no longer yields
its zero member; fixed in torch 2.0), which crashes torchrun with the default --redirects 0.
This wrapper patches Std.from_str to Std(int(v)) for plain numbers and runs torchrun unchanged.
"""
import runpy
import sys

from torch.distributed.elastic.multiprocessing import api

_original = api.Std.from_str


def _from_str(vm):
    if isinstance(vm, str) and vm.strip().isdigit():
        return api.Std(int(vm))
    return _original(vm)


api.Std.from_str = staticmethod(_from_str)
sys.argv = ["torchrun"] + sys.argv[1:]
runpy.run_path("/usr/bin/torchrun", run_name="__main__")
