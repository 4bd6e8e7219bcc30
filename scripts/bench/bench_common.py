"""Helpers the Python benchmark drivers share (launch_bench.py, train_bench.py, gpu_bench.py,
c10d_rdzv_bench.py, etcd_rdzv_bench.py, ft_bench.py, and the network-namespace clusters of
hostfile_bench.py and lost_node_bench.py)."""
import json
import multiprocessing as mp
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time


class Skip(Exception):
    """What a benchmark cannot run here (no root, no sshd): said, and the run goes on."""


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def tail(path, n=30):
    """The last n lines of a file ("" when it cannot be read)."""
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def live(pid):
    """True while pid exists and is not a zombie (PID 1 here reaps orphans slowly)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def netns_pids(ns):
    """The pids of the processes in network namespace ns (`ip netns pids`)."""
    done = subprocess.run(["ip", "netns", "pids", ns], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True, timeout=30)
    return [int(p) for p in done.stdout.split()]


def ensure_loopback_netns(script, argv):
    """Re-executes `script` in a new network namespace unless it already runs in one with only
    `lo` (torchrun's TCPStore binds every interface whatever address it is given)."""
    names = [name for _, name in socket.if_nameindex()]
    if names == ["lo"]:
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True, timeout=30)
        return
    if "--in-netns" in argv:
        sys.exit(f"{os.path.basename(script)}: still see interfaces {names} after unshare -n")
    flags = ["-n"] if os.geteuid() == 0 else ["-r", "-n"]
    os.execvp("unshare", ["unshare"] + flags + [sys.executable, os.path.abspath(script)]
              + argv + ["--in-netns"])


def run_bounded(cmd, timeout_s, env=None):
    """Runs cmd in its own session; on timeout kills the whole session by its process group.
    Returns (exit code or None on timeout, combined output)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                         start_new_session=True, text=True)
    try:
        out, _ = p.communicate(timeout=timeout_s)
        return p.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        return None, out


def first_json_row(cmd, timeout_s):
    """Runs one of our C++ benchmarks (`cmd`, without --json_out) and returns the first row it
    writes with --json_out, as a dict; RuntimeError with its stderr when it fails."""
    with tempfile.TemporaryDirectory(prefix="bench_rows.") as tmp:
        out = os.path.join(tmp, "rows.json")
        done = subprocess.run(cmd + ["--json_out", out], timeout=timeout_s,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{os.path.basename(cmd[0])} failed ({done.returncode}): "
                               f"{done.stderr.strip()}")
        with open(out) as f:
            return json.loads(f.readline())


def final_samples_per_s(out):
    """samples/s from the summary line both the C++ trainers and train_bench/ddp_ref.py print:
    `final loss <L> after <N> steps, samples/s <S>` (the last one in `out`)."""
    m = re.findall(r"final loss \S+ after \d+ steps, samples/s ([0-9.]+)", out)
    if not m:
        raise RuntimeError("no 'final loss ... samples/s' line in:\n" + out[-2000:])
    return float(m[-1])


def recv_within(conn, deadline, what):
    """The next message on `conn`, or TimeoutError naming `what` at the monotonic `deadline`."""
    if not conn.poll(max(0.0, deadline - time.monotonic())):
        raise TimeoutError(f"no {what} in time")
    return conn.recv()


def _rendezvous_node(make_handler, conn, start_timeout_s, join_timeout_s):
    handler = make_handler()
    conn.send("ready")
    if not conn.poll(start_timeout_s + 30):
        os._exit(1)
    conn.recv()  # go
    t0 = time.monotonic()
    _, rank, world_size = handler.next_rendezvous()
    t1 = time.monotonic()
    conn.send((t0, t1, rank, world_size))
    # Stay until told: a node that vanished early would look like a failure to the others.
    conn.poll(join_timeout_s + 30)
    os._exit(0)


def time_torch_rendezvous(nodes, make_handler, name, start_timeout_s, join_timeout_s):
    """Wall time in seconds for one round of torch's rendezvous among `nodes` forked processes.

    Each process builds its handler with `make_handler()` (called in the child; the parent has
    imported torch already, so forks start at once), reports ready, and on a shared go calls
    next_rendezvous(). The time runs from the first call to the last return. The ranks must be
    0..N-1 with world size N. Every process is stopped before this returns."""
    ctx = mp.get_context("fork")
    procs, conns = [], []
    try:
        for _ in range(nodes):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_rendezvous_node,
                            args=(make_handler, child, start_timeout_s, join_timeout_s),
                            daemon=True)
            p.start()
            procs.append(p)
            conns.append(parent)
        deadline = time.monotonic() + start_timeout_s
        for c in conns:
            if recv_within(c, deadline, "node ready") != "ready":
                raise RuntimeError("node did not get ready")
        for c in conns:
            c.send("go")
        deadline = time.monotonic() + join_timeout_s + 30
        results = [recv_within(c, deadline, "rendezvous result") for c in conns]
        ranks = sorted(r[2] for r in results)
        if ranks != list(range(nodes)) or any(r[3] != nodes for r in results):
            raise RuntimeError(f"bad ranks from {name}: {ranks[:10]}...")
        return max(r[1] for r in results) - min(r[0] for r in results)
    finally:
        for c in conns:
            try:
                c.send("exit")
            except (OSError, ValueError):
                pass
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)


def free_port(host="127.0.0.1"):
    """A TCP port on `host` that was free a moment ago."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Etcd:
    """A fresh one-member etcd with the v2 API on, data in `tmp`; stopped by PID."""

    def __init__(self, tmp, host="127.0.0.1", start_timeout_s=60):
        self.host = host
        self.port, peer = free_port(host), free_port(host)
        client_url, peer_url = f"http://{host}:{self.port}", f"http://{host}:{peer}"
        self.data = tempfile.mkdtemp(prefix="etcd.", dir=tmp)
        self.log = open(os.path.join(self.data, "etcd.log"), "w")
        self.proc = subprocess.Popen(
            ["/usr/bin/etcd", "--name=bench", f"--data-dir={self.data}/data", "--enable-v2",
             f"--listen-client-urls={client_url}", f"--advertise-client-urls={client_url}",
             f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
             f"--initial-cluster=bench={peer_url}", "--logger=zap", "--log-level=error"],
            stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                socket.create_connection((host, self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError("etcd did not start")
                time.sleep(0.05)

    def stop(self):
        self.proc.kill()
        self.proc.wait(timeout=10)
        self.log.close()
        shutil.rmtree(self.data, ignore_errors=True)
