"""Conformance worker (no torch): writes DIR/<RANK> with what the launcher gave it.

Written for ctrun's conformance suite (tests/launcher/agent/conformance_test.cc), after the launch
scenarios of torch's launcher tests: each worker leaves one file named by its global rank, holding
KEY=VALUE lines (the launcher's variables it sees, its argv, its restart count), then succeeds, or
fails with --fail (always) or --fail_until N (while TORCHELASTIC_RESTART_COUNT < N). Every attempt
also appends a line to DIR/attempts.<RANK>.
"""
import argparse
import os
import sys

KEYS = [
    "LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE",
    "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "OMP_NUM_THREADS",
    "TEST_SENTINEL_PARENT", "PYTHONUNBUFFERED",
]
# Written as <unset> when absent: which torch's variables a worker got (each torch's own agent
# gives its own).
TORCH_KEYS = [
    "NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "TORCHELASTIC_SIGNALS_TO_HANDLE",
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--touch_file_dir", "--touch-file-dir", default=None)
    parser.add_argument("--fail", action="store_true")
    parser.add_argument("--fail_until", type=int, default=0)
    parser.add_argument("--local_rank", type=int, default=None)
    parser.add_argument("rest", nargs="*")
    args, _ = parser.parse_known_args()

    rank = os.environ["RANK"]
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if args.touch_file_dir:
        with open(os.path.join(args.touch_file_dir, "attempts." + rank), "a") as f:
            f.write(f"{attempt}\n")
    # What the launcher gave, and the console line the log checks look for.
    print(f"conformance worker rank {rank} attempt {attempt}", flush=True)
    print(f"conformance stderr rank {rank}", file=sys.stderr, flush=True)
    if args.fail or attempt < args.fail_until:
        raise RuntimeError(f"conformance worker rank {rank} fails (attempt {attempt})")
    lines = [f"{k}={os.environ[k]}" for k in KEYS if k in os.environ]
    lines += [f"{k}={os.environ.get(k, '<unset>')}" for k in TORCH_KEYS]
    lines.append("argv=" + " ".join(sys.argv[1:]))
    lines.append("main=" + __name__)
    if args.local_rank is not None:
        lines.append(f"arg_local_rank={args.local_rank}")
    path = os.path.join(args.touch_file_dir, rank)
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.rename(path + ".tmp", path)


# No sys.exit(): under --run_path torchrun 1.13 runs this file with runpy in a multiprocessing
# child, whose SystemExit (even 0) leaves the agent waiting for a return value that never comes.
if __name__ == "__main__":
    main()
