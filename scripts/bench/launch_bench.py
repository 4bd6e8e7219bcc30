#!/usr/bin/python3
"""Launcher benchmarks: ctrun against the reference torchrun (PyTorch 1.13), side by side.

  a) launch   `--standalone --nproc_per_node=4` of /bin/true: wall time of the whole agent
              process and its peak RSS.
  b) restart  4 workers on one node, `--max_restarts=5`: time from local rank 0's failing exit
              to the first instruction of its replacement (the C++ probe, launch_probe).
  c) node     two agents of a 1:2 job (c10d backend); the whole of one node (agent and workers)
     failure  is killed with SIGKILL; time until the survivor's worker starts again.
  d) first_collective  `--standalone --nproc_per_node=2` and `=4` of a Python worker
              (launch_bench/first_collective.py: import torch, init_process_group gloo env://,
              one all_reduce): time from the launch to the last rank's all_reduce done.

Run it with /usr/bin/python3 (it needs only the standard library; the node-failure workers
import torch). Unless it already runs in a network namespace with nothing but the loopback
interface, it re-runs itself in a new one (`unshare -n`; torchrun's TCPStore binds every
interface whatever address it is given). Every wait is bounded, and every process it starts is
stopped by PID.

  /usr/bin/python3 scripts/bench/launch_bench.py [--quick]
      [--only launch,restart,node,first_collective]
      [--ctrun build-bench/launcher/ctrun] [--ctrund build-bench/rendezvous/daemon/ctrund]
      [--probe build-bench/scripts/bench/launch_probe]
"""
import argparse
import datetime
import glob
import json
import os
import re
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from bench_common import ensure_loopback_netns

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
BUILD = os.path.join(ROOT, "build-bench")
PYTHON = "/usr/bin/python3"  # Debian's python3-torch 1.13: the reference
TORCHRUN = [PYTHON, os.path.join(ROOT, "tests", "python", "torchrun_ref.py")]
GLOO_WORKER = os.path.join(HERE, "launch_bench", "gloo_worker.py")
FIRST_COLLECTIVE = os.path.join(HERE, "launch_bench", "first_collective.py")

LAUNCH_TIMEOUT_S = 120
FIRST_COLLECTIVE_TIMEOUT_S = 120
RESTART_JOB_TIMEOUT_S = 240
NODE_STEADY_TIMEOUT_S = 180
NODE_RECOVERY_TIMEOUT_S = 90


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def now_ns():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


# ---- processes --------------------------------------------------------------------------------

def descendants(pid):
    """PIDs of every live descendant of pid (from /proc/<pid>/task/*/children)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        for children in glob.glob(f"/proc/{p}/task/*/children"):
            try:
                with open(children) as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            found.extend(kids)
            todo.extend(kids)
    return found


def kill_pids(pids, sig=signal.SIGKILL):
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


class Proc:
    """A child started with posix_spawn, watched through a pidfd (no polling, no SIGCHLD)."""

    def __init__(self, argv, log_path, env=None):
        self.argv = argv
        self.log_path = log_path
        with open(log_path, "ab") as out:
            self.t0 = time.monotonic()
            self.pid = os.posix_spawn(argv[0], argv, env if env is not None else os.environ,
                                      file_actions=[(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                                                    (os.POSIX_SPAWN_DUP2, out.fileno(), 1),
                                                    (os.POSIX_SPAWN_DUP2, out.fileno(), 2)])
        self.pidfd = os.pidfd_open(self.pid)
        self.status = None
        self.rusage = None
        self.t1 = None

    def wait(self, timeout):
        """Exit code, or None if still running after timeout seconds."""
        if self.status is None:
            ready, _, _ = select.select([self.pidfd], [], [], max(0.0, timeout))
            if not ready:
                return None
            self.t1 = time.monotonic()
            _, status, self.rusage = os.wait4(self.pid, 0)
            self.status = os.waitstatus_to_exitcode(status)
            os.close(self.pidfd)
        return self.status

    def running(self):
        return self.wait(0) is None

    def kill_tree(self, sig=signal.SIGKILL):
        if self.status is None:
            tree = [self.pid] + descendants(self.pid)
            kill_pids(tree, sig)
            return tree
        return []

    def stop(self, grace=10.0):
        """SIGTERM to the agent, SIGKILL to whatever of its tree is left after grace."""
        if self.status is not None:
            return self.status
        tree = [self.pid] + descendants(self.pid)
        kill_pids([self.pid], signal.SIGTERM)
        if self.wait(grace) is None:
            kill_pids([self.pid] + descendants(self.pid), signal.SIGKILL)
            self.wait(30)
        kill_pids([p for p in tree if os.path.exists(f"/proc/{p}")])  # orphans, if any
        return self.status


def run_to_end(argv, log_path, timeout, env=None):
    p = Proc(argv, log_path, env)
    try:
        if p.wait(timeout) is None:
            raise TimeoutError(f"{argv[0]} ran past {timeout} s; see {log_path}")
        return p
    finally:
        p.stop()


def tail(path, n=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- a) launch --------------------------------------------------------------------------------

LAUNCH_SIDES = ("ctrun", "torchrun", "torchrun_mi")  # torchrun_mi: with --monitor_interval=0.1


def launch_cmd(side, args):
    if side == "ctrun":
        return [args.ctrun, "--standalone", "--nproc_per_node=4", "/bin/true"]
    extra = ["--monitor_interval=0.1"] if side == "torchrun_mi" else []
    return TORCHRUN + ["--standalone", "--nproc_per_node=4"] + extra + ["--no_python", "/bin/true"]


def measured_launch(side, args, tmp, i):
    """(wall_s, maxrss_bytes) of one launch, through launch_measure (see measure.cc)."""
    logf = os.path.join(tmp, f"launch.{side}.{i}.log")
    result = os.path.join(tmp, f"launch.{side}.{i}.result")
    run_to_end([args.measure, result] + launch_cmd(side, args), logf, LAUNCH_TIMEOUT_S)
    with open(result) as f:
        wall_ns, maxrss_kib, code = (int(x) for x in f.read().split())
    if code != 0:
        raise RuntimeError(f"{side} launch exited {code}:\n{tail(logf)}")
    return wall_ns / 1e9, maxrss_kib * 1024


def bench_launch(args, tmp, runs):
    """{side: [(wall_s, maxrss_bytes)]}; one untimed warm-up each, then rotating order."""
    results = {side: [] for side in LAUNCH_SIDES}
    for i in range(runs + 1):
        k = i % len(LAUNCH_SIDES)
        for side in LAUNCH_SIDES[k:] + LAUNCH_SIDES[:k]:
            wall, rss = measured_launch(side, args, tmp, i)
            what = "warm-up" if i == 0 else f"run {i}"
            log(f"launch {what} {side:11}: {wall * 1e3:8.1f} ms, peak RSS {rss / 1e6:6.1f} MB")
            if i > 0:
                results[side].append((wall, rss))
    return results


# ---- b) restart -------------------------------------------------------------------------------

def read_ns(path):
    with open(path) as f:
        return int(f.read().strip())


def restart_cmd(side, args, out):
    probe = [args.probe, out, "--fail_restarts", str(args.restarts), "--fail_after_ms", "300"]
    common = ["--standalone", "--nproc_per_node=4", f"--max_restarts={args.restarts}",
              "--monitor_interval=0.1"]
    if side == "ctrun":
        return [args.ctrun] + common + probe
    return TORCHRUN + common + ["--no_python"] + probe


def bench_restart(args, tmp, jobs):
    """{side: [(first_ms, group_ms)]}: per restart, rank 0's replacement and all 4 started."""
    results = {"ctrun": [], "torchrun": []}
    for j in range(jobs):
        order = ("ctrun", "torchrun") if j % 2 == 0 else ("torchrun", "ctrun")
        for side in order:
            out = tempfile.mkdtemp(prefix=f"restart.{side}.{j}.", dir=tmp)
            logf = os.path.join(tmp, f"restart.{side}.{j}.log")
            p = run_to_end(restart_cmd(side, args, out), logf, RESTART_JOB_TIMEOUT_S)
            if p.status != 0:
                raise RuntimeError(f"{side} restart job exited {p.status}:\n{tail(logf)}")
            for k in range(args.restarts):
                fail = read_ns(os.path.join(out, f"fail.{k}"))
                starts = {}
                for path in glob.glob(os.path.join(out, f"start.{k + 1}.*")):
                    rank = int(os.path.basename(path).split(".")[2])
                    starts.setdefault(rank, []).append(read_ns(path))
                if sorted(starts) != [0, 1, 2, 3] or any(len(v) != 1 for v in starts.values()):
                    raise RuntimeError(f"{side}: attempt {k + 1} did not start 4 workers once "
                                       f"each: {starts}")
                first = (starts[0][0] - fail) / 1e6
                group = (max(v[0] for v in starts.values()) - fail) / 1e6
                results[side].append((first, group))
                log(f"restart job {j + 1} {side:8} #{k + 1}: rank 0 back after {first:8.1f} ms, "
                    f"all 4 after {group:8.1f} ms")
    return results


# ---- c) node failure --------------------------------------------------------------------------

def read_records(out, kind):
    records = []
    for path in glob.glob(os.path.join(out, f"{kind}.*")):
        with open(path) as f:
            records.append(json.load(f))
    return records


def wait_for(pred, timeout, what, procs=()):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        for p in procs:
            if not p.running():
                raise RuntimeError(f"{what}: agent {p.pid} exited {p.status}:\n{tail(p.log_path)}")
        time.sleep(0.02)
    raise TimeoutError(f"no {what} within {timeout} s")


def node_failure_once(side, args, tmp, rep):
    """Milliseconds from SIGKILL of node B to the start of the survivor's new worker."""
    out = tempfile.mkdtemp(prefix=f"node.{side}.{rep}.", dir=tmp)
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", PYTHON_EXEC=PYTHON)
    procs = []
    try:
        common = ["--nnodes=1:2", "--nproc_per_node=1", "--rdzv_backend=c10d",
                  f"--rdzv_id=node_failure_{rep}", "--max_restarts=3", "--monitor_interval=0.1"]
        worker = [GLOO_WORKER, out]
        if side == "ctrun":
            port_file = os.path.join(out, "ctrund.port")
            daemon = Proc([args.ctrund, "--host", "127.0.0.1", "--port", "0", "--port_file", port_file],
                          os.path.join(tmp, f"node.{side}.{rep}.ctrund.log"))
            procs.append(daemon)

            def port_written():
                try:
                    with open(port_file) as f:
                        return int(f.read().strip() or 0)
                except (OSError, ValueError):
                    return 0
            port = wait_for(port_written, 30, "ctrund port", [daemon])
            cmd = [args.ctrun] + common + [f"--rdzv_endpoint=127.0.0.1:{port}",
                                           "--rdzv_conf=last_call_timeout=1"] + worker
            cmd_a = cmd_b = cmd
        else:
            port = free_port()
            cmd = TORCHRUN + common + [f"--rdzv_endpoint=127.0.0.1:{port}"]
            cmd_a = cmd + ["--rdzv_conf=is_host=1,last_call_timeout=1"] + worker
            cmd_b = cmd + ["--rdzv_conf=is_host=0,last_call_timeout=1"] + worker
        a = Proc(cmd_a, os.path.join(tmp, f"node.{side}.{rep}.A.log"), env)
        procs.append(a)
        b = Proc(cmd_b, os.path.join(tmp, f"node.{side}.{rep}.B.log"), env)
        procs.append(b)

        def both_steady():
            steady = [r for r in read_records(out, "steady") if r["world_size"] == 2]
            return {a.pid, b.pid} <= {r["ppid"] for r in steady}
        wait_for(both_steady, NODE_STEADY_TIMEOUT_S, "world of 2 all-reducing", [a, b])
        time.sleep(1.0)
        node_b = [b.pid] + descendants(b.pid)
        t_kill = now_ns()
        kill_pids(node_b)  # the whole node at once: agent first, then its workers
        b.wait(10)

        def survivor_started():
            new = [r for r in read_records(out, "start") if r["ppid"] == a.pid and r["t_ns"] > t_kill]
            return min((r["t_ns"] for r in new), default=None)
        t_start = wait_for(survivor_started, NODE_RECOVERY_TIMEOUT_S, "restarted survivor", [a])
        # Check that the new group really forms, with one node.
        wait_for(lambda: any(r["ppid"] == a.pid and r["world_size"] == 1 and r["t_ns"] > t_kill
                             for r in read_records(out, "steady")),
                 NODE_RECOVERY_TIMEOUT_S, "survivor all-reducing alone", [a])
        ms = (t_start - t_kill) / 1e6
        log(f"node failure {rep + 1} {side:8}: survivor's worker started {ms:8.1f} ms after the "
            f"kill; survivor's agent saw: {detection(side, a.log_path)}")
        return ms
    finally:
        for p in reversed(procs):
            p.stop()


def detection(side, log_path):
    """How the surviving agent learnt of the loss, from the first telling line of its log."""
    with open(log_path, errors="replace") as f:
        text = f.read()
    if side == "ctrun":
        m = re.search(r"round \d+ opened \((.*)\): restarting workers", text)
        if m:
            return f"ctrund's push: {m.group(1)}"
        m = re.search(r"^.*(exit|fail|signal).*$", text, re.M | re.I)
        return m.group(0)[:120] if m else "?"
    m = re.search(r"failed \(exitcode: (-?\d+)\)", text)
    return f"its own worker failed (exit code {m.group(1)})" if m else "?"


def bench_node_failure(args, tmp, reps):
    results = {"ctrun": [], "torchrun": []}
    for rep in range(reps):
        order = ("ctrun", "torchrun") if rep % 2 == 0 else ("torchrun", "ctrun")
        for side in order:
            results[side].append(node_failure_once(side, args, tmp, rep))
    return results


# ---- d) launch to the first collective --------------------------------------------------------

FIRST_COLLECTIVE_RANKS = (2, 4)


def first_collective_once(side, nproc, args, tmp, i):
    """Milliseconds from the launch to the last rank's first all_reduce done."""
    out = tempfile.mkdtemp(prefix=f"first.{side}.{nproc}.{i}.", dir=tmp)
    logf = os.path.join(tmp, f"first.{side}.{nproc}.{i}.log")
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", PYTHON_EXEC=PYTHON)
    common = ["--standalone", f"--nproc_per_node={nproc}"]
    if side == "ctrun":
        cmd = [args.ctrun] + common + [FIRST_COLLECTIVE, out]
    else:
        cmd = TORCHRUN + common + [FIRST_COLLECTIVE, out]
    t0 = now_ns()
    p = run_to_end(cmd, logf, FIRST_COLLECTIVE_TIMEOUT_S, env)
    done = glob.glob(os.path.join(out, "done.*"))
    if p.status != 0 or len(done) != nproc:
        raise RuntimeError(f"{side} with {nproc} ranks exited {p.status}, {len(done)} ranks "
                           f"done:\n{tail(logf)}")
    return (max(read_ns(d) for d in done) - t0) / 1e6


def bench_first_collective(args, tmp, runs):
    """{(side, nproc): [ms]}; one untimed warm-up each, then alternating order."""
    results = {}
    for nproc in FIRST_COLLECTIVE_RANKS:
        for i in range(runs + 1):
            order = ("ctrun", "torchrun") if i % 2 == 0 else ("torchrun", "ctrun")
            for side in order:
                ms = first_collective_once(side, nproc, args, tmp, i)
                what = "warm-up" if i == 0 else f"run {i}"
                log(f"first collective {nproc} ranks {what} {side:8}: {ms:8.1f} ms")
                if i > 0:
                    results.setdefault((side, nproc), []).append(ms)
    return results


# ---- report -----------------------------------------------------------------------------------

def med(xs):
    return statistics.median(xs)


def report(launch, restart, node, args, first=None):
    print()
    print(f"launch_bench: ctrun ({args.ctrun}) vs torchrun 1.13 (tests/python/torchrun_ref.py), "
          f"loopback-only network namespace")
    if launch:
        n = len(launch["ctrun"])
        wall = {side: med([w for w, _ in launch[side]]) for side in LAUNCH_SIDES}
        rss = {side: med([r for _, r in launch[side]]) for side in LAUNCH_SIDES}
        c_rss_max = max(r for _, r in launch["ctrun"])
        print(f"\na) launch: --standalone --nproc_per_node=4 of /bin/true, median of {n} "
              f"(after one warm-up each)\n")
        print("| measure | torchrun | ctrun | torchrun / ctrun | target | met |")
        print("|---------|---------:|------:|-----------------:|--------|-----|")
        for side, label in (("torchrun", "wall time (ms), torchrun's defaults"),
                            ("torchrun_mi", "wall time (ms), torchrun --monitor_interval=0.1")):
            t, c = wall[side], wall["ctrun"]
            print(f"| {label} | {t * 1e3:.1f} | {c * 1e3:.1f} | {t / c:.1f}x "
                  f"| ctrun <= 1/20 of torchrun | {'MET' if c * 20 <= t else 'MISSED'} |")
        t, c = rss["torchrun"], rss["ctrun"]
        print(f"| agent peak RSS (MB) | {t / 1e6:.1f} | {c / 1e6:.1f} | {t / c:.1f}x "
              f"| ctrun < 20 MB | {'MET' if c_rss_max < 20e6 else 'MISSED'} "
              f"(max {c_rss_max / 1e6:.1f}) |")
        print()
        for side in LAUNCH_SIDES:
            walls = sorted(w * 1e3 for w, _ in launch[side])
            print(f"  {side} wall times (ms): " + ", ".join(f"{w:.1f}" for w in walls))
    if restart:
        n = len(restart["ctrun"])
        print(f"\nb) restart: 4 workers, local rank 0 exits 1 300 ms after its start; "
              f"median of {n} restarts\n")
        print("| time after the failing exit (ms) | torchrun | ctrun | torchrun / ctrun |")
        print("|----------------------------------|---------:|------:|-----------------:|")
        for idx, label in ((0, "rank 0's replacement starts"), (1, "all 4 replacements started")):
            t = med([r[idx] for r in restart["torchrun"]])
            c = med([r[idx] for r in restart["ctrun"]])
            print(f"| {label} | {t:.1f} | {c:.1f} | {t / c:.1f}x |")
        c = med([r[0] for r in restart["ctrun"]])
        print(f"\n  target ctrun < 50 ms: {'MET' if c < 50 else 'MISSED'} ({c:.1f} ms)")
        for side in ("torchrun", "ctrun"):
            print(f"  {side} rank 0 restarts (ms): "
                  + ", ".join(f"{r[0]:.1f}" for r in sorted(restart[side])))
    if node:
        n = len(node["ctrun"])
        t, c = med(node["torchrun"]), med(node["ctrun"])
        print(f"\nc) node failure: 1:2 job, 1 worker per node, last_call_timeout=1, node B killed "
              f"(SIGKILL); median of {n}\n")
        print("| time after the kill (ms) | torchrun | ctrun | torchrun / ctrun |")
        print("|--------------------------|---------:|------:|-----------------:|")
        print(f"| survivor's new worker starts | {t:.1f} | {c:.1f} | {t / c:.1f}x |")
        for side in ("torchrun", "ctrun"):
            print(f"  {side} (ms): " + ", ".join(f"{x:.1f}" for x in sorted(node[side])))
    if first:
        n = len(first[("ctrun", FIRST_COLLECTIVE_RANKS[0])])
        print(f"\nd) launch to the first collective: --standalone, Python workers "
              f"(import torch, init_process_group gloo env://, one all_reduce); ms from the "
              f"launch to the last rank's all_reduce done, median of {n} (after one warm-up)\n")
        print("| ranks | torchrun | ctrun | torchrun / ctrun |")
        print("|------:|---------:|------:|-----------------:|")
        for nproc in FIRST_COLLECTIVE_RANKS:
            t, c = med(first[("torchrun", nproc)]), med(first[("ctrun", nproc)])
            print(f"| {nproc} | {t:.1f} | {c:.1f} | {t / c:.2f}x |")
        for (side, nproc), xs in sorted(first.items()):
            print(f"  {side} {nproc} ranks (ms): " + ", ".join(f"{x:.1f}" for x in sorted(xs)))


def main():
    # `timeout` (run.sh) stops us with SIGTERM: unwind, so that every `finally` stops its agents.
    signal.signal(signal.SIGTERM, lambda signo, frame: sys.exit(128 + signo))
    argv = sys.argv[1:]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="5 launches, 1 restart job, 1 node failure per side")
    ap.add_argument("--only", default="launch,restart,node",
                    help="comma-separated subset of launch,restart,node,first_collective")
    ap.add_argument("--first_runs", type=int, default=5,
                    help="timed launches per side and rank count for first_collective")
    ap.add_argument("--launch_runs", type=int, default=9)
    ap.add_argument("--restart_jobs", type=int, default=2, help="each job gives --restarts restarts")
    ap.add_argument("--restarts", type=int, default=5)
    ap.add_argument("--node_reps", type=int, default=3)
    ap.add_argument("--ctrun", default=os.path.join(BUILD, "launcher", "ctrun"))
    ap.add_argument("--ctrund", default=os.path.join(BUILD, "rendezvous", "daemon", "ctrund"))
    ap.add_argument("--probe", default=os.path.join(BUILD, "scripts", "bench", "launch_probe"))
    ap.add_argument("--measure", default=os.path.join(BUILD, "scripts", "bench", "launch_measure"))
    ap.add_argument("--keep", action="store_true", help="keep the logs and time stamps")
    ap.add_argument("--in-netns", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    parts = set(args.only.split(","))
    if not parts <= {"launch", "restart", "node", "first_collective"}:
        ap.error("--only takes launch, restart, node, first_collective")
    needed = [args.ctrun] + ([args.measure] if "launch" in parts else []) + \
        ([args.probe] if "restart" in parts else []) + \
        ([args.ctrund] if "node" in parts else [])
    for path in needed:
        if not os.access(path, os.X_OK):
            sys.exit(f"launch_bench: {path} is missing; build it (cmake --build build-bench "
                     f"--target ctrun ctrund launch_probe launch_measure)")
    if args.quick:
        args.launch_runs, args.restart_jobs, args.node_reps, args.first_runs = 5, 1, 1, 2
    ensure_loopback_netns(__file__, [a for a in argv if a != "--in-netns"])

    log(f"== machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%M:%SZ}")
    tmp = tempfile.mkdtemp(prefix="launch_bench.")
    ok = False
    try:
        launch = bench_launch(args, tmp, args.launch_runs) if "launch" in parts else None
        restart = bench_restart(args, tmp, args.restart_jobs) if "restart" in parts else None
        node = bench_node_failure(args, tmp, args.node_reps) if "node" in parts else None
        first = bench_first_collective(args, tmp, args.first_runs) \
            if "first_collective" in parts else None
        report(launch, restart, node, args, first)
        log(f"== load at the end {os.getloadavg()[0]:.1f}")
        ok = True
    finally:
        if args.keep or not ok:
            log(f"launch_bench: logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
