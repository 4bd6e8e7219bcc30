#!/usr/bin/python3
"""torch's own Python TCPStore client, N ranks from one address, through the job's store as a
launcher with its defaults provides it: ctrun against torchrun, side by side.

A job of one worker (`--standalone --nproc_per_node=1`) whose worker
(pyclient_bench/clients.py) plays N ranks of a process group's bootstrap as real
`torch.distributed.TCPStore` clients against MASTER_ADDR:MASTER_PORT: the agent's store under ctrun
and under torch 2.x's torchrun (TORCHELASTIC_USE_AGENT_STORE=True); under torch 1.13's torchrun
the worker hosts a TCPStore server there itself, as rank 0's init_process_group would: connect, a 128-byte id set by rank 0 and read by all, the store barrier. Both
launchers run as a user gets them: nothing raised, the shell's open-file limit as it is (printed).
The time is the worker's, from its start signal to the last rank through the barrier; a launcher
whose store refuses or drops ranks FAILS that case (its first error is printed).

  /usr/bin/python3 scripts/bench/pyclient_bench.py [--ranks 1024,4096] [--reps 3] [--quick]
      [--no_netns]
      [--ctrun build/launcher/ctrun] [--python /usr/bin/python3]
      [--torchrun "python3 -m torch.distributed.run"]

Here the reference is /usr/bin/torchrun (PyTorch 1.13, through tests/python/torchrun_ref.py); on
a GPU machine with torch 2.x pass --python python3 --torchrun "python3 -m torch.distributed.run"
(torch 2.4+'s agent store is its libuv server). It re-runs itself in a loopback-only network
namespace unless it already is in one.
"""
import argparse
import json
import os
import resource
import shlex
import statistics
import sys
import tempfile

from bench_common import ensure_loopback_netns, run_bounded

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
CLIENTS = os.path.join(HERE, "pyclient_bench", "clients.py")


def run_case(launcher, ranks, a, tmp):
    out = os.path.join(tmp, f"{launcher}-{ranks}.json")
    if os.path.exists(out):
        os.remove(out)
    head = [a.ctrun] if launcher == "ctrun" else shlex.split(a.torchrun)
    cmd = head + ["--standalone", "--nproc_per_node=1", CLIENTS, "--ranks", str(ranks),
                  "--timeout_s", str(a.timeout_s), "--json_out", out]
    env = dict(os.environ, PYTHON_EXEC=a.python)
    code, text = run_bounded(cmd, a.timeout_s + 60, env=env)
    row = None
    if os.path.exists(out):
        with open(out) as f:
            row = json.loads(f.readline())
    if code != 0 or not row or not row["ok"]:
        why = (row or {}).get("first_error") or (
            "timed out" if code is None else f"exit {code}: " + text.strip()[-300:])
        errors = (row or {}).get("errors", 0)
        return None, f"{errors} ranks failed; {why}" if errors else why
    return row["wall_s"], None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", default=None, help="rank counts (default 1024,4096; --quick: 1024)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="one repetition of 1024 ranks")
    p.add_argument("--ctrun", default=os.path.join(ROOT, "build", "launcher", "ctrun"))
    p.add_argument("--python", default="/usr/bin/python3")
    p.add_argument("--torchrun",
                   default=f"/usr/bin/python3 {os.path.join(ROOT, 'tests/python/torchrun_ref.py')}")
    p.add_argument("--timeout_s", type=int, default=120)
    p.add_argument("--no_netns", action="store_true",
                   help="run on this machine's loopback as it is (where unshare is refused)")
    p.add_argument("--in-netns", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if not a.no_netns:
        ensure_loopback_netns(__file__, sys.argv[1:])
    reps = 1 if a.quick else a.reps
    ranks = [int(n) for n in (a.ranks or ("1024" if a.quick else "1024,4096")).split(",")]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    print(f"pyclient_bench: open-file limit {soft} (hard {hard}), as the launchers get it; "
          f"{reps} repetition(s); torchrun: {a.torchrun}", file=sys.stderr, flush=True)
    results = {}  # (launcher, ranks) -> list of seconds, or an error
    with tempfile.TemporaryDirectory(prefix="pyclient_bench.") as tmp:
        for rep in range(reps):
            for n in ranks:
                order = ["ctrun", "torchrun"] if (rep + n) % 2 == 0 else ["torchrun", "ctrun"]
                for launcher in order:
                    cell = results.setdefault((launcher, n), [])
                    if isinstance(cell, str):
                        continue  # failed once: reported, not retried
                    wall, error = run_case(launcher, n, a, tmp)
                    print(f"rep {rep + 1} {launcher:8s} {n:5d} ranks: "
                          + (f"{wall * 1e3:.1f} ms" if error is None else f"FAILED: {error}"),
                          file=sys.stderr, flush=True)
                    results[(launcher, n)] = error if error else cell + [wall]

    def text(cell):
        return "FAILED" if isinstance(cell, str) else f"{statistics.median(cell) * 1e3:.1f}"

    print("\n| ranks | under torchrun (ms) | under ctrun (ms) | ratio |")
    print("|------:|---:|---:|---:|")
    ours_failed = False
    for n in ranks:
        t, c = results[("torchrun", n)], results[("ctrun", n)]
        ours_failed |= isinstance(c, str)
        ratio = ("-" if isinstance(t, str) or isinstance(c, str)
                 else f"{statistics.median(t) / statistics.median(c):.2f}x")
        print(f"| {n:5d} | {text(t)} | {text(c)} | {ratio} |")
    for (launcher, n), cell in sorted(results.items()):
        if isinstance(cell, str):
            print(f"- {launcher}, {n} ranks: {cell}")
    return 1 if ours_failed else 0


if __name__ == "__main__":
    sys.exit(main())
