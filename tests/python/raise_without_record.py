# A worker that fails the way most scripts do: an exception, and no torch @record, so no error
# file. ctrun's root-cause report must show the exception from the worker's stderr anyway.
import os
import sys


def load_batch(step):
    raise ValueError(f"bad batch at step {step} on rank {os.environ.get('RANK')}")


def main():
    print("starting", flush=True)
    print("a warning on stderr", file=sys.stderr, flush=True)
    load_batch(7)


if __name__ == "__main__":
    main()
