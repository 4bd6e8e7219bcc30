# A Python worker that reports its steps through ctrun's helper, as docs/faults.md tells users
# to: STEPS steps of 50 ms, each reported and then written to FILE.<RANK>.<restart count>; at the
# end its result ("rank R") for --fault_report. No torch: it starts in milliseconds.
import os
import sys
import time

import ctrun_worker  # put on PYTHONPATH by ctrun (--faults, --worker_timeout)


def main():
    steps, prefix = int(sys.argv[1]), sys.argv[2]
    rank = os.environ["RANK"]
    path = f"{prefix}.{rank}.{os.environ['TORCHELASTIC_RESTART_COUNT']}"
    for step in range(1, steps + 1):
        time.sleep(0.05)
        ctrun_worker.report_step(step)
        with open(path, "w") as f:
            f.write(f"{step}\n")
    ctrun_worker.write_result(f"rank {rank}")


if __name__ == "__main__":
    main()
