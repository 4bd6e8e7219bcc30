#!/usr/bin/python3
"""Multi-host launch over ssh: `ctrun --hosts` against pdsh and a sequential ssh loop.

The time from the command to every worker running, on N = 2, 4 and 8 hosts (one worker each).
The hosts are network namespaces made by scripts/netns-cluster.sh: node0 is the login machine
that every launch runs in, node1..nodeN are the hosts, each with a private sshd (its own host
key, the bench's client key, root login). The filesystem is shared, so every host runs the same
ctrun. Four ways to start the same job, side by side in one run:

  ctrun cold   `ctrun --hosts H1:1,...,HN:1 --ssh "ssh -F /dev/null -i KEY ..."` in a fresh
               TMPDIR: no shared ssh connection exists yet (ctrun hosts the rendezvous itself,
               an embedded ctrund, and starts one agent per host over ssh, all at once)
  ctrun warm   the same launch again in the same TMPDIR right after the cold one was stopped:
               ssh's connection sharing (ControlMaster=auto, ControlPersist=60) reuses the
               masters the cold launch left
  pdsh         Debian's pdsh (`pdsh -R ssh -w H1,...,HN`, the ssh options in
               PDSH_SSH_ARGS_APPEND) starting the same agents (`ctrun --nnodes=N
               --nproc_per_node=1 --rdzv_backend=c10d --rdzv_endpoint=198.18.0.10:PORT
               --rdzv_id=ID --rdzv_conf=is_host=false`) against a ctrund the bench starts in
               node0 before the clock starts
  seq ssh      a shell loop in node0: `ssh -f ... HOST 'agent command'` one host after
               another (each `ssh -f` returns once its connection is authenticated, and the
               loop waits for that before the next host), same agents, same kind of ctrund

The worker of every variant is `/bin/sh -c 'date +%s%N > DIR/started.$RANK; exec sleep 60'`.
A launch's time runs from time.time_ns() taken just before the command is started to the
latest of the N time stamps (both CLOCK_REALTIME, the namespaces share the clock). Then the job
is stopped: ctrun gets SIGTERM and is waited for (the bench also counts what it left on the
hosts, which should be nothing), and for pdsh and the ssh loop every process in the namespaces
but the sshd listeners is killed by PID (`ip netns pids`). Nothing is left between launches.
Each repetition runs the variants in a rotating order (ctrun warm always right after ctrun
cold); the table gives medians, after one untimed warm-up round at the smallest N.

Needs root, /usr/sbin/sshd, /usr/bin/ssh and /usr/bin/pdsh; without them it prints
"hostfile_bench: skipped: <why>" and exits 0. It needs only Python's standard library and
works in any network namespace (run.sh's loopback-only one included): the cluster's namespaces
are new ones. Every wait is bounded; the namespaces and every process are removed at the end.

  /usr/bin/python3 scripts/bench/hostfile_bench.py [--quick] [--hosts 2,4,8] [--reps 3]
      [--ctrun build-bench/launcher/ctrun] [--ctrund build-bench/rendezvous/daemon/ctrund]
      [--keep]
"""
import argparse
import datetime
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

from bench_common import Skip, live, log, netns_pids, tail

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
BUILD = os.path.join(ROOT, "build-bench")
NETNS_CLUSTER = os.path.join(ROOT, "scripts", "netns-cluster.sh")
SSHD, SSH, PDSH = "/usr/sbin/sshd", "/usr/bin/ssh", "/usr/bin/pdsh"

WORKER_SLEEP_S = 60       # the workers outlive any launch's measurement
START_TIMEOUT_S = 120     # command to every worker running
STOP_TIMEOUT_S = 40       # ctrun's SIGTERM to its exit (its own grace is shutdown_timeout + 15)
SETUP_TIMEOUT_S = 60
LOGIN = 0                 # node0: the login machine; nodes 1..N are the hosts

VARIANTS = ("ctrun_cold", "ctrun_warm", "pdsh", "seq_ssh")
UNITS = (("ctrun_cold", "ctrun_warm"), ("pdsh",), ("seq_ssh",))  # the order rotates by unit


def med(xs):
    return statistics.median(xs)


def wait_proc(p, timeout):
    """p's exit code, or None if it still runs after timeout seconds."""
    try:
        return p.wait(timeout=max(0.0, timeout))
    except subprocess.TimeoutExpired:
        return None


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


# ---- the cluster ------------------------------------------------------------------------------

class Cluster:
    """node0 (login) and `hosts` host namespaces, each host with a private sshd."""

    def __init__(self, hosts, tmp):
        self.hosts = hosts
        self.nodes = hosts + 1
        self.prefix = f"hb{os.getpid() % 1000000}"
        self.tmp = tmp
        self.dir = os.path.join(tmp, "ssh")
        os.makedirs(self.dir)
        self.key = os.path.join(self.dir, "client")
        self.sshd = {}       # node -> Popen of its listener
        self.made = False

    def ns(self, i):
        return f"{self.prefix}-node{i}"

    @staticmethod
    def addr(i):
        return f"198.18.0.{10 + i}"

    def on(self, i, argv):
        return ["ip", "netns", "exec", self.ns(i)] + argv

    def up(self):
        done = subprocess.run(["bash", NETNS_CLUSTER, "up", str(self.nodes), "--prefix", self.prefix],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=SETUP_TIMEOUT_S)
        self.made = True
        if done.returncode != 0:
            raise Skip(f"cannot make the network namespaces (scripts/netns-cluster.sh: "
                       f"{done.stdout.strip()[-300:]})")
        # sshd's privilege separation directory; left in place like the tests do (it is shared
        # by every namespace, and a test beside us may use it).
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        self._keygen(self.key)
        shutil.copy(self.key + ".pub", os.path.join(self.dir, "authorized_keys"))
        logs = {}
        for i in range(1, self.nodes):
            hostkey = os.path.join(self.dir, f"host{i}")
            self._keygen(hostkey)
            conf = os.path.join(self.dir, f"sshd{i}.conf")
            with open(conf, "w") as f:
                f.write(f"ListenAddress {self.addr(i)}:22\n"
                        f"HostKey {hostkey}\n"
                        f"AuthorizedKeysFile {os.path.join(self.dir, 'authorized_keys')}\n"
                        "PermitRootLogin yes\nPubkeyAuthentication yes\n"
                        "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                        "UsePAM no\nStrictModes no\nPidFile none\nMaxStartups 200\n")
            logs[i] = os.path.join(self.dir, f"sshd{i}.log")
            with open(logs[i], "wb") as out:
                self.sshd[i] = subprocess.Popen(self.on(i, [SSHD, "-D", "-e", "-f", conf]),
                                                stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        deadline = time.monotonic() + SETUP_TIMEOUT_S
        for i, path in logs.items():
            while "Server listening" not in tail(path):
                if self.sshd[i].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"sshd in {self.ns(i)} did not start:\n{tail(path)}")
                time.sleep(0.02)

    def _keygen(self, path):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", path],
                       check=True, stdout=subprocess.DEVNULL, timeout=SETUP_TIMEOUT_S)

    def ssh_opts(self):
        """The options every variant's ssh gets (ctrun adds its own -T, BatchMode, timeouts and
        connection sharing after these)."""
        return ["-F", "/dev/null", "-i", self.key, "-o", "StrictHostKeyChecking=no",
                "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"]

    def pids(self, i):
        return netns_pids(self.ns(i))

    def strays(self, nodes, spare=lambda pid: False):
        """{pid: comm} of the live processes in `nodes`, but the sshd listeners and `spare`."""
        listeners = {p.pid for p in self.sshd.values()}
        found = {}
        for i in nodes:
            for pid in self.pids(i):
                if pid not in listeners and not spare(pid) and live(pid):
                    found[pid] = comm(pid)
        return found

    def clean(self, nodes=None, spare=lambda pid: False):
        """SIGKILL by PID to every process in `nodes` (default all) but the sshd listeners and
        `spare`, until none is left; returns what was killed as {pid: comm}."""
        nodes = range(self.nodes) if nodes is None else nodes
        killed = {}
        deadline = time.monotonic() + 30
        while True:
            found = self.strays(nodes, spare)
            if not found:
                return killed
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes left in the namespaces after 30 s: {found}")
            killed.update(found)
            for pid in found:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)

    def down(self):
        if not self.made:
            return
        try:
            for i in range(self.nodes):
                for pid in self.pids(i):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            for p in self.sshd.values():
                wait_proc(p, 10)
        finally:
            subprocess.run(["bash", NETNS_CLUSTER, "down", "--prefix", self.prefix],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=SETUP_TIMEOUT_S)


# ---- one launch -------------------------------------------------------------------------------

def worker_argv(out):
    return ["--no_python", "/bin/sh", "-c",
            f"date +%s%N > {out}/started.$RANK; exec sleep {WORKER_SLEEP_S}"]


def wait_started(out, n, t0_ns, procs, logf):
    """ns from t0_ns to the last of the n workers' time stamps. `procs`: (Popen, must_run)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    stamps = {}
    while True:
        for r in range(n):
            if r not in stamps:
                try:
                    with open(os.path.join(out, f"started.{r}")) as f:
                        stamps[r] = int(f.read().strip())
                except (FileNotFoundError, ValueError):
                    pass  # not there yet, or being written
        if len(stamps) == n:
            extra = sorted(set(os.listdir(out)) - {f"started.{r}" for r in range(n)})
            if extra:
                raise RuntimeError(f"unexpected files {extra} in {out}")
            return max(stamps.values()) - t0_ns
        for p, must_run in procs:
            code = p.poll()
            if code is not None and (must_run or code != 0):
                raise RuntimeError(f"{p.args[4]} exited {code} with {len(stamps)} of {n} "
                                   f"workers started:\n{tail(logf)}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(stamps)} of {n} workers started after "
                               f"{START_TIMEOUT_S} s:\n{tail(logf)}")
        time.sleep(0.005)


class Bench:
    def __init__(self, args, cluster, tmp):
        self.args = args
        self.c = cluster
        self.tmp = tmp
        self.seq = 0
        self.stop_ms = []        # ctrun: SIGTERM to the launcher's exit
        self.left_by_ctrun = []  # processes found on the hosts after ctrun's exit

    def _out(self, variant, n):
        self.seq += 1
        out = os.path.join(self.tmp, f"{self.seq:03d}.{variant}.{n}")
        os.makedirs(out)
        return out, out + ".log"

    def hosts(self, n):
        return [self.c.addr(i) for i in range(1, n + 1)]

    def agent_command(self, n, port, out):
        argv = [self.args.ctrun, f"--nnodes={n}", "--nproc_per_node=1", "--rdzv_backend=c10d",
                f"--rdzv_endpoint={self.c.addr(LOGIN)}:{port}",
                f"--rdzv_id=hb-{uuid.uuid4().hex[:8]}", "--rdzv_conf=is_host=false"] \
            + worker_argv(out)
        return f"cd {shlex.quote(out)} && exec " + " ".join(shlex.quote(a) for a in argv)

    # ctrun --hosts, cold and warm
    def ctrun_pair(self, n):
        ssh_dir = tempfile.mkdtemp(prefix="t", dir=self.tmp)  # TMPDIR: ssh's shared connections
        try:
            cold = self._ctrun(n, ssh_dir, "ctrun_cold")
            # Whatever ctrun left on the hosts goes (none, normally), but node0's ssh masters
            # and their sessions on the hosts (sshd) stay for the warm launch.
            self.c.clean(range(1, n + 1), spare=lambda pid: comm(pid) == "sshd")
            warm = self._ctrun(n, ssh_dir, "ctrun_warm")
            return {"ctrun_cold": cold, "ctrun_warm": warm}
        finally:
            self.c.clean()

    def _ctrun(self, n, ssh_dir, variant):
        out, logf = self._out(variant, n)
        argv = self.c.on(LOGIN, [self.args.ctrun, "--hosts", ",".join(f"{h}:1" for h in self.hosts(n)),
                                 "--ssh", " ".join(["ssh"] + self.c.ssh_opts())] + worker_argv(out))
        env = dict(os.environ, TMPDIR=ssh_dir)
        with open(logf, "wb") as lf:
            t0 = time.time_ns()
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=lf, stderr=lf, env=env,
                                 cwd=out)
        try:
            ns = wait_started(out, n, t0, [(p, True)], logf)
            t = time.monotonic()
            p.send_signal(signal.SIGTERM)
            code = wait_proc(p, STOP_TIMEOUT_S)
            if code is None:
                raise RuntimeError(f"ctrun did not exit {STOP_TIMEOUT_S} s after SIGTERM:\n"
                                   f"{tail(logf)}")
            self.stop_ms.append((time.monotonic() - t) * 1e3)
            left = self.c.strays(range(1, n + 1), spare=lambda pid: comm(pid) == "sshd")
            self.left_by_ctrun.append(len(left))
            if left:
                log(f"  !! ctrun left {left} on the hosts after its exit")
            return ns / 1e6
        finally:
            if p.poll() is None:
                p.kill()
                wait_proc(p, 10)

    def _ctrund(self, out):
        port_file = out + ".port"
        with open(out + ".ctrund.log", "wb") as lf:
            p = subprocess.Popen(self.c.on(LOGIN, [self.args.ctrund, "--host", self.c.addr(LOGIN),
                                                    "--port", "0", "--port_file", port_file]),
                                 stdin=subprocess.DEVNULL, stdout=lf, stderr=lf)
        deadline = time.monotonic() + SETUP_TIMEOUT_S
        while True:
            try:
                with open(port_file) as f:
                    return p, int(f.read().strip())
            except (FileNotFoundError, ValueError):
                pass
            if p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ctrund did not start:\n{tail(out + '.ctrund.log')}")
            time.sleep(0.01)

    def _by_hand(self, n, variant, make_argv, env=None):
        """pdsh or the ssh loop: a ctrund first (not timed), then the command."""
        out, logf = self._out(variant, n)
        procs = []
        try:
            daemon, port = self._ctrund(out)
            procs.append(daemon)
            argv, must_run = make_argv(self.agent_command(n, port, out))
            with open(logf, "wb") as lf:
                t0 = time.time_ns()
                p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=lf, stderr=lf,
                                     env=env, cwd=out)
            procs.append(p)
            return wait_started(out, n, t0, [(daemon, True), (p, must_run)], logf) / 1e6
        finally:
            self.c.clean()
            for p in procs:
                if p.poll() is None:
                    p.kill()
                wait_proc(p, 10)

    def pdsh(self, n):
        env = dict(os.environ, PDSH_SSH_ARGS_APPEND=" ".join(
            self.c.ssh_opts() + ["-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]))
        return {"pdsh": self._by_hand(
            n, "pdsh", lambda cmd: (self.c.on(LOGIN, [PDSH, "-R", "ssh", "-w", ",".join(self.hosts(n)),
                                                      cmd]), True), env)}

    def seq_ssh(self, n):
        opts = " ".join(shlex.quote(o) for o in
                        self.c.ssh_opts() + ["-o", "BatchMode=yes", "-o", "ConnectTimeout=10"])

        def argv(cmd):
            loop = "".join(f"{SSH} -f {opts} {h} {shlex.quote(cmd)} || exit $?\n"
                           for h in self.hosts(n))
            return self.c.on(LOGIN, ["/bin/sh", "-c", loop]), False

        return {"seq_ssh": self._by_hand(n, "seq_ssh", argv)}

    def unit(self, names, n):
        if names[0] == "ctrun_cold":
            return self.ctrun_pair(n)
        return self.pdsh(n) if names[0] == "pdsh" else self.seq_ssh(n)


# ---- main -------------------------------------------------------------------------------------

def report(results, bench, args, counts, load0):
    reps = len(results[(VARIANTS[0], counts[0])])
    print()
    print(f"hostfile_bench: ms from the command to the last of N workers running (one per host), "
          f"median of {reps}; hosts are network namespaces with a private sshd each, all on this "
          f"machine's {os.cpu_count()} cores")
    print(f"ctrun: {args.ctrun}; ctrund (pdsh, seq ssh): {args.ctrund}")
    print()
    print("| hosts | ctrun cold (ms) | ctrun warm (ms) | pdsh (ms) | sequential ssh (ms) "
          "| pdsh / ctrun cold | seq / ctrun cold |")
    print("|------:|----------------:|----------------:|----------:|--------------------:"
          "|------------------:|-----------------:|")
    for n in counts:
        m = {v: med(results[(v, n)]) for v in VARIANTS}
        print(f"| {n} | {m['ctrun_cold']:.1f} | {m['ctrun_warm']:.1f} | {m['pdsh']:.1f} "
              f"| {m['seq_ssh']:.1f} | {m['pdsh'] / m['ctrun_cold']:.2f}x "
              f"| {m['seq_ssh'] / m['ctrun_cold']:.2f}x |")
    print()
    for n in counts:
        print(f"  {n} hosts, runs (ms): " + "; ".join(
            f"{v} " + ", ".join(f"{x:.1f}" for x in sorted(results[(v, n)])) for v in VARIANTS))
    s = sorted(bench.stop_ms)
    print(f"  ctrun SIGTERM to its exit (ms): median {med(s):.1f}, max {s[-1]:.1f}; processes "
          f"left on the hosts after its exit (besides sshd): {sum(bench.left_by_ctrun)}")
    print(f"  load average {load0:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")


def main():
    # `timeout` (run.sh) stops us with SIGTERM: unwind, so that `finally` removes everything.
    signal.signal(signal.SIGTERM, lambda signo, frame: sys.exit(128 + signo))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 and 4 hosts, 2 repetitions")
    ap.add_argument("--hosts", default=None, help="host counts, comma-separated (default 2,4,8)")
    ap.add_argument("--reps", type=int, default=None, help="repetitions (default 3, quick 2)")
    ap.add_argument("--ctrun", default=os.path.join(BUILD, "launcher", "ctrun"))
    ap.add_argument("--ctrund", default=os.path.join(BUILD, "rendezvous", "daemon", "ctrund"))
    ap.add_argument("--keep", action="store_true", help="keep the logs and time stamps")
    args = ap.parse_args()
    counts = [int(x) for x in (args.hosts or ("2,4" if args.quick else "2,4,8")).split(",")]
    reps = args.reps or (2 if args.quick else 3)
    if min(counts) < 1 or max(counts) > 100 or reps < 1:
        ap.error("--hosts: 1..100 each; --reps >= 1")

    load0 = os.getloadavg()[0]
    print(f"== machine: {os.cpu_count()} cores, load {load0:.2f}; "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%M:%SZ}, "
          f"{'quick' if args.quick else 'full'} run: hosts {counts}, {reps} reps", flush=True)
    why = None
    if os.geteuid() != 0:
        why = "needs root (network namespaces, sshd)"
    else:
        for path, what in ((SSHD, "openssh-server"), (SSH, "openssh-client"), (PDSH, "pdsh")):
            if not os.access(path, os.X_OK):
                why = f"needs {path} ({what})"
                break
        if why is None and shutil.which("ip") is None:
            why = "needs ip (iproute2)"
        if why is None and shutil.which("ssh-keygen") is None:
            why = "needs ssh-keygen"
    if why is None:
        v = subprocess.run([PDSH, "-V"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=30).stdout
        if "ssh" not in v.split("rcmd modules:")[-1].splitlines()[0]:
            why = "pdsh has no ssh rcmd module"
    if why:
        print(f"hostfile_bench: skipped: {why}")
        return
    for path in (args.ctrun, args.ctrund):
        if not os.access(path, os.X_OK):
            sys.exit(f"hostfile_bench: {path} is missing; build it (cmake --build build-bench "
                     f"--target ctrun ctrund)")
    args.ctrun, args.ctrund = os.path.abspath(args.ctrun), os.path.abspath(args.ctrund)

    tmp = tempfile.mkdtemp(prefix="hfb.")  # short: ssh's control sockets live under it
    cluster = Cluster(max(counts), tmp)
    ok = False
    try:
        try:
            cluster.up()
        except Skip as e:
            print(f"hostfile_bench: skipped: {e}")
            ok = True
            return
        bench = Bench(args, cluster, tmp)
        # Warm-up (not counted): every variant once at the smallest N.
        for names in UNITS:
            got = bench.unit(names, counts[0])
            log("warm-up " + ", ".join(f"{k} {v:.1f} ms" for k, v in got.items()))
        bench.stop_ms.clear()
        bench.left_by_ctrun.clear()
        results = {(v, n): [] for v in VARIANTS for n in counts}
        for rep in range(reps):
            for j, n in enumerate(counts):
                k = (rep + j) % len(UNITS)
                for names in UNITS[k:] + UNITS[:k]:
                    got = bench.unit(names, n)
                    for v, ms in got.items():
                        results[(v, n)].append(ms)
                    log(f"rep {rep + 1} {n} hosts: " +
                        ", ".join(f"{v} {ms:8.1f} ms" for v, ms in got.items()))
        report(results, bench, args, counts, load0)
        ok = True
    finally:
        cluster.down()
        if args.keep or not ok:
            log(f"hostfile_bench: logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
