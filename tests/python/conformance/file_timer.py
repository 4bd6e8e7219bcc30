"""Conformance worker (torch): torch's file timer (torch.distributed.elastic.timer) under the
launcher, with TORCHELASTIC_ENABLE_FILE_TIMER=1.

Written for ctrun's conformance suite (tests/launcher/agent/conformance_test.cc). The first attempt
sets a timer of 1 s that it releases in time, then one of 1 s that it overruns by sleeping: the
launcher's file timer server must kill it (SIGKILL, the client's default). The next attempt
writes DIR/<RANK> with what it found: whether TORCHELASTIC_TIMER_FILE names a pipe, the pipe's
name without its random part, and the restart count. Every attempt appends a line to
DIR/attempts.<RANK>.
"""
import argparse
import os
import stat
import time

from torch.distributed.elastic import timer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--touch_file_dir", required=True)
    args = parser.parse_args()
    rank = os.environ["RANK"]
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    with open(os.path.join(args.touch_file_dir, "attempts." + rank), "a") as f:
        f.write(f"{attempt}\n")
    path = os.environ.get("TORCHELASTIC_TIMER_FILE", "")
    timer.configure(timer.FileTimerClient(path))
    with timer.expires(after=1, scope="in_time"):
        time.sleep(0.1)
    if attempt == 0:
        with timer.expires(after=1, scope="overrun"):
            time.sleep(60)  # the launcher's file timer server ends this
        return  # not reached when the server works: no file, and the row fails
    is_pipe = stat.S_ISFIFO(os.stat(path).st_mode)
    lines = [
        f"timer_file_is_pipe={is_pipe}",
        "timer_file_name=" + os.path.basename(path).rstrip("0123456789abcdef-"),
        f"TORCHELASTIC_RESTART_COUNT={attempt}",
    ]
    out = os.path.join(args.touch_file_dir, rank)
    with open(out + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.rename(out + ".tmp", out)


main()
