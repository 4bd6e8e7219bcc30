#!/usr/bin/python3
"""A lost machine: one node of an elastic job vanishes from the network, nothing is closed.

Issue 41, section 3. launch_bench.py's node failure kills processes, so the rendezvous sees a
connection close at once; a dead machine or a cut link closes nothing, and the survivors learn of
it only from missed keep-alives or a collective that never returns. Here the link of one host is
cut while its processes stay alive, and the benchmark measures the time from the cut to the
survivors' first training step in a world without that host.

Hosts: network namespaces from scripts/netns-cluster.sh (`up 4 --prefix lnb`: lnb-node0..3),
each in a UTS namespace of its own with its namespace's name as host name, and an
/etc/netns/lnb-nodeI/hosts (which `ip netns exec` mounts over /etc/hosts) that maps every host
name to its address, as a cluster's DNS would. The job: 3 nodes x 1 worker, `--nnodes=2:3
--nproc_per_node=1 --max_restarts=3`, agents on lnb-node1..3, the worker
lost_node_bench/train.py (a tiny MLP in Gloo DDP, ~50 ms steps, a line per step per node,
resumes from a checkpoint every 10 steps), started the same way under both launchers.

  ctrun     ctrund in lnb-node0 as the packaged unit runs it (`--host 0.0.0.0 --port 29400
            --token_file F --state_dir D`), agents `ctrun --rdzv_backend=ctrund
            --rdzv_endpoint=lnb-node0:29400 --rdzv_conf=token_file=F[,SETTING] ...`
  torchrun  tests/python/torchrun_ref.py (/usr/bin/torchrun 1.13 with its Python 3.11 crash
            patched), `--rdzv_backend=c10d --rdzv_endpoint=lnb-node1:29400`: node1 hosts the
            c10d store (torch finds that itself: the endpoint is its host name)

The fault, once all 3 ranks train: in lnb-node3, nftables drops every packet in and out of eth0
(`--cut link` instead sets eth0 down). Node 3's agent and worker stay alive. Time runs from the
cut to the first step line of node 1 or 2 written after it with world size 2, bounded by
`--bound` (then "> bound (not recovered)").

Settings: ctrun and torchrun with their defaults (keep-alives 5 s x 3; the worker's process group
with torch's default timeout, 30 min), then `ctrun tuned` (`--tuned`, default
keep_alive_interval=1,keep_alive_max_attempt=2) and, in a full run, `torchrun tuned`
(`--rdzv_conf=last_call_timeout=1 --monitor_interval=0.5`, and the worker's process-group
timeout 5 s: torchrun's agents do not watch each other, so only a failing collective wakes
them; torch 1.13 ignores keep-alive keys in --rdzv_conf, its handler fixes 5 s x 3).
Then the load check: ctrun tuned for `--load_s` seconds with no fault, every step CPU-bound
(no sleep, hidden 4096, batch 1024) and a busy loop on each host; a false alarm is any new round,
restart, or step in a world other than 3.

Needs root, ip, nft and unshare; without them it prints "lost_node_bench: SKIPPED: <why>" and
exits 0. Works in any network namespace (run.sh's loopback-only one included). Every wait is
bounded; every process is killed by PID (`ip netns pids`) and the namespaces removed at the end.

  /usr/bin/python3 scripts/bench/lost_node_bench.py [--quick] [--reps 3] [--bound 180]
      [--tuned keep_alive_interval=1,keep_alive_max_attempt=2] [--load_s 180]
      [--only ctrun,ctrun_tuned,torchrun,torchrun_tuned,load] [--cut nft|link]
      [--ctrun build-bench/launcher/ctrun] [--ctrund build-bench/rendezvous/daemon/ctrund]
      [--keep]
"""
import argparse
import datetime
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

from bench_common import Skip, live, log, netns_pids, tail

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
BUILD = os.path.join(ROOT, "build-bench")
NETNS_CLUSTER = os.path.join(ROOT, "scripts", "netns-cluster.sh")
PYTHON = "/usr/bin/python3"  # Debian's python3-torch 1.13
TORCHRUN = [PYTHON, os.path.join(ROOT, "tests", "python", "torchrun_ref.py")]
WORKER = os.path.join(HERE, "lost_node_bench", "train.py")

PREFIX = "lnb"
NODES = 4          # node0: ctrund (ctrun runs) or idle (torchrun runs); nodes 1..3: agents
LOST = 3           # the node whose link is cut (never the host of a store)
SURVIVORS = (1, 2)
STEADY_TIMEOUT_S = 180
STEADY_STEPS = 20  # every node has logged this many steps in a world of 3 before the cut
SETUP_TIMEOUT_S = 60
PORT = 29400

SETTINGS = ("ctrun", "torchrun", "ctrun_tuned", "torchrun_tuned")


class Cluster:
    def __init__(self):
        self.made = False
        self.etc_made = False
        self.addrs = {}

    @staticmethod
    def ns(i):
        return f"{PREFIX}-node{i}"

    def up(self):
        """(Re)makes the namespaces: every run starts on fresh hosts, with no rule left."""
        self.made = True
        done = subprocess.run(["bash", NETNS_CLUSTER, "up", str(NODES), "--prefix", PREFIX],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=SETUP_TIMEOUT_S)
        if done.returncode != 0:
            raise Skip(f"cannot make the network namespaces (scripts/netns-cluster.sh: "
                       f"{done.stdout.strip()[-300:]})")
        for i in range(NODES):
            self.addrs[i] = subprocess.run(["bash", NETNS_CLUSTER, "addr", str(i)],
                                           stdout=subprocess.PIPE, text=True, check=True,
                                           timeout=30).stdout.strip()
        if not os.path.isdir("/etc/netns"):
            os.makedirs("/etc/netns")
            self.etc_made = True
        hosts = "127.0.0.1 localhost\n" + "".join(
            f"{self.addrs[i]} {self.ns(i)}\n" for i in range(NODES))
        for i in range(NODES):
            os.makedirs(f"/etc/netns/{self.ns(i)}", exist_ok=True)
            with open(f"/etc/netns/{self.ns(i)}/hosts", "w") as f:
                f.write(hosts)

    def on(self, i, argv):
        """argv in node i: its network namespace, and a UTS namespace with its host name."""
        return ["ip", "netns", "exec", self.ns(i), "unshare", "--uts", "/bin/sh", "-c",
                'hostname "$0" && exec "$@"', self.ns(i)] + argv

    def cut(self, i, how):
        if how == "nft":
            rules = ("add table inet lnb_cut; "
                     "add chain inet lnb_cut in { type filter hook input priority -200 ; }; "
                     "add chain inet lnb_cut out { type filter hook output priority -200 ; }; "
                     'add rule inet lnb_cut in iifname "eth0" drop; '
                     'add rule inet lnb_cut out oifname "eth0" drop')
            argv = ["ip", "netns", "exec", self.ns(i), "nft", rules]
        else:
            argv = ["ip", "-n", self.ns(i), "link", "set", "eth0", "down"]
        subprocess.run(argv, check=True, timeout=30, stdout=subprocess.DEVNULL)
        return time.time()

    def pids(self, i):
        return netns_pids(self.ns(i))

    def clean(self):
        """SIGKILL by PID to every process in the namespaces until none is left."""
        deadline = time.monotonic() + 30
        while True:
            found = [p for i in range(NODES) for p in self.pids(i) if live(p)]
            if not found:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes left in the namespaces after 30 s: {found}")
            for pid in found:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)

    def down(self):
        try:
            if self.made:
                try:
                    self.clean()
                finally:
                    subprocess.run(["bash", NETNS_CLUSTER, "down", "--prefix", PREFIX],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   timeout=SETUP_TIMEOUT_S)
        finally:
            for i in range(NODES):
                shutil.rmtree(f"/etc/netns/{self.ns(i)}", ignore_errors=True)
            if self.etc_made:
                try:
                    os.rmdir("/etc/netns")
                except OSError:
                    pass


def read_steps(out, node):
    """[(time, step, restart, world)] of node's step lines."""
    rows = []
    try:
        with open(os.path.join(out, f"node{node}.log")) as f:
            for line in f:
                p = line.split()
                if len(p) == 6:
                    try:
                        rows.append((float(p[0]), int(p[1]), int(p[2]), int(p[3])))
                    except ValueError:
                        pass
    except FileNotFoundError:
        pass
    return rows


def read_events(out, node):
    """[(time, kind, restart, world)] of node's launch, pg and error lines."""
    rows = []
    try:
        with open(os.path.join(out, f"node{node}.log")) as f:
            for line in f:
                p = line.split()
                if len(p) == 6 and p[1] in ("launch", "pg", "error"):
                    rows.append((float(p[0]), p[1], int(p[2]), int(p[3])))
    except (FileNotFoundError, ValueError):
        pass
    return rows


def stamp_s(line):
    """The time the bench read an agent's log line ("1795822234.975 ..."), or None."""
    try:
        return float(line.split(" ", 1)[0])
    except ValueError:
        return None


class Bench:
    def __init__(self, args, cluster, tmp):
        self.args = args
        self.c = cluster
        self.tmp = tmp
        self.seq = 0
        self.token = os.path.join(tmp, "token")
        with open(self.token, "w") as f:
            f.write(uuid.uuid4().hex + "\n")
        os.chmod(self.token, 0o640)

    def _start(self, node, argv, logf, env):
        """argv in `node`; its output goes to logf, each line behind the time it was read."""
        p = subprocess.Popen(self.c.on(node, argv), stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)

        def pump():
            with open(logf, "ab", buffering=0) as lf:
                for line in p.stdout:
                    lf.write(b"%.3f " % time.time() + line)
        threading.Thread(target=pump, daemon=True).start()
        return p

    def start_job(self, setting, out, worker_env):
        """Starts the rendezvous (ctrun: ctrund) and the 3 agents; returns the Popens."""
        procs = []
        env = dict(os.environ, LNB_OUT=out, **worker_env)
        job = f"lnb-{uuid.uuid4().hex[:8]}"
        tuned = setting.endswith("_tuned")
        if setting.startswith("ctrun"):
            port_file = os.path.join(out, "ctrund.port")
            procs.append(self._start(0, [self.args.ctrund, "--host", "0.0.0.0", "--port",
                                         str(PORT), "--token_file", self.token, "--state_dir",
                                         os.path.join(out, "ctrund-state"), "--port_file",
                                         port_file], os.path.join(out, "ctrund.log"), env))
            deadline = time.monotonic() + SETUP_TIMEOUT_S
            while not os.path.exists(port_file):
                if procs[0].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("ctrund did not start:\n"
                                       + tail(os.path.join(out, "ctrund.log")))
                time.sleep(0.02)
            conf = f"token_file={self.token}" + (f",{self.args.tuned}" if tuned else "")
            argv = [self.args.ctrun, "--rdzv_backend=ctrund",
                    f"--rdzv_endpoint={self.c.ns(0)}:{PORT}", f"--rdzv_id={job}",
                    "--nnodes=2:3", "--nproc_per_node=1", "--max_restarts=3",
                    f"--rdzv_conf={conf}", WORKER]
            # python3 on this machine's PATH has no torch: ctrun starts the worker with
            # PYTHON_EXEC, as launch_bench.py does (torchrun uses its own interpreter).
            env["PYTHON_EXEC"] = PYTHON
        else:
            extra = []
            # Torch's elastic logs at INFO (LOGLEVEL: logging only), to see where the time goes.
            env["LOGLEVEL"] = "INFO"
            if tuned:
                # torch 1.13 takes no keep-alive keys from --rdzv_conf (DynamicRendezvousHandler.
                # from_backend fixes 5 s x 3), so what can be tuned is the last call, the
                # monitor interval and the worker's process-group timeout.
                extra = ["--monitor_interval=0.5", "--rdzv_conf=last_call_timeout=1"]
            argv = TORCHRUN + ["--rdzv_backend=c10d", f"--rdzv_endpoint={self.c.ns(1)}:{PORT}",
                               f"--rdzv_id={job}", "--nnodes=2:3", "--nproc_per_node=1",
                               "--max_restarts=3"] + extra + [WORKER]
        for i in (1, 2, 3):
            procs.append(self._start(i, argv, os.path.join(out, f"agent{i}.log"),
                                     dict(env, LNB_NODE=str(i))))
        return procs

    def wait_steady(self, out, procs):
        deadline = time.monotonic() + STEADY_TIMEOUT_S
        while True:
            rows = {i: [r for r in read_steps(out, i) if r[3] == 3] for i in (1, 2, 3)}
            if all(len(r) >= STEADY_STEPS for r in rows.values()):
                return
            for p in procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{' '.join(p.args[10:])} exited {p.returncode} before "
                                       f"the job trained:\n" + self.logs(out))
            if time.monotonic() > deadline:
                raise TimeoutError(f"the job did not train on 3 nodes within "
                                   f"{STEADY_TIMEOUT_S} s:\n" + self.logs(out))
            time.sleep(0.1)

    @staticmethod
    def logs(out):
        return "".join(f"--- {name}\n{tail(os.path.join(out, name), 15)}"
                       for name in sorted(os.listdir(out)) if name.endswith(".log"))

    def _out(self, name):
        self.seq += 1
        out = os.path.join(self.tmp, f"{self.seq:03d}.{name}")
        os.makedirs(out)
        return out

    def _stop(self, procs):
        self.c.clean()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()

    def lost_node(self, setting, bound_s):
        """One run: seconds from the cut to the survivors' first step in a world of 2 (None if
        not within bound_s), and details."""
        self.c.up()
        out = self._out(setting)
        worker_env = {"LNB_STEP_S": "0.05"}
        if setting == "torchrun_tuned":
            worker_env["LNB_PG_TIMEOUT"] = "5"
        procs = []
        try:
            procs = self.start_job(setting, out, worker_env)
            self.wait_steady(out, procs)
            time.sleep(1.0)
            t_cut = self.c.cut(LOST, self.args.cut)
            last_before = max(r[1] for i in (1, 2, 3) for r in read_steps(out, i) if r[0] <= t_cut)
            deadline = time.monotonic() + bound_s
            first = None
            while first is None and time.monotonic() < deadline:
                after = [(r, i) for i in SURVIVORS for r in read_steps(out, i)
                         if r[0] > t_cut and r[3] == 2]
                if after:
                    first = min(after)
                else:
                    time.sleep(0.05)
            d = {"dir": out, "last_before": last_before}
            if first is not None:
                (t, step, restart, world), node = first
                d.update(resumed_step=step, restart=restart, steps_lost=last_before - (step - 1))
            # The survivors' workers: a collective that failed, the new worker's interpreter, its
            # process group up (seconds after the cut).
            for kind, key in (("error", "worker_error"), ("launch", "new_worker"),
                              ("pg", "new_pg")):
                ts = [e[0] - t_cut for i in SURVIVORS for e in read_events(out, i)
                      if e[1] == kind and e[0] > t_cut]
                if ts:
                    d[key] = min(ts)
            if first is None:
                # Still at their last step before the cut, with their workers alive?
                d["survivors_last_step_after_cut"] = max(
                    [r[0] - t_cut for i in SURVIVORS for r in read_steps(out, i)] or [float("nan")])
            # ctrun: when a survivor's agent learned that node 3 was gone ("round N opened").
            for i in SURVIVORS:
                for line in tail(os.path.join(out, f"agent{i}.log"), 400).splitlines():
                    if " opened (" in line and stamp_s(line) and stamp_s(line) > t_cut:
                        d.setdefault("detected", stamp_s(line) - t_cut)
                        d.setdefault("reason", line.split(" opened (", 1)[1].rsplit(")", 1)[0])
            # Node 3 must still be alive: a lost machine, not killed processes.
            d["lost_alive"] = procs[-1].poll() is None
            return (None if first is None else first[0][0] - t_cut), d
        finally:
            self._stop(procs)

    def load_check(self, setting, duration_s):
        """ctrun tuned, no fault, CPU-bound steps and a busy loop on every host: any new round,
        restart or step in another world is a false alarm."""
        self.c.up()
        out = self._out(f"load.{setting}")
        procs = []
        try:
            procs = self.start_job(setting, out, {"LNB_STEP_S": "0", "LNB_HIDDEN": "4096",
                                                  "LNB_BATCH": "1024"})
            self.wait_steady(out, procs)
            for i in range(NODES):
                procs.append(self._start(i, ["/bin/sh", "-c", "while :; do :; done"],
                                         os.path.join(out, f"busy{i}.log"), dict(os.environ)))
            t0 = time.time()
            start_steps = {i: len(read_steps(out, i)) for i in (1, 2, 3)}
            loads = []
            end = time.monotonic() + duration_s
            while time.monotonic() < end:
                time.sleep(1.0)
                loads.append(os.getloadavg()[0])
            t1 = time.time()
            rows = {i: read_steps(out, i) for i in (1, 2, 3)}
            alarms = []
            for i, rs in rows.items():
                bad = [r for r in rs if r[3] != 3 or r[2] != 0]
                if bad:
                    alarms.append(f"node {i}: {len(bad)} steps in world {bad[0][3]}, restart "
                                  f"{bad[0][2]}")
            for i in (1, 2, 3):
                for line in tail(os.path.join(out, f"agent{i}.log"), 400).splitlines():
                    if " opened (" in line or "restarting" in line or "lost" in line:
                        alarms.append(f"agent {i}: {line.strip()}")
            for line in tail(os.path.join(out, "ctrund.log"), 400).splitlines():
                if "keep-alive" in line or "reopened" in line or " left" in line:
                    alarms.append(f"ctrund: {line.strip()}")
            in_window = {i: [r for r in rows[i] if t0 <= r[0] <= t1] for i in rows}
            gaps = [b[0] - a[0] for i in rows for a, b in zip(in_window[i], in_window[i][1:])]
            for i in rows:
                if len(rows[i]) <= start_steps[i]:
                    alarms.append(f"node {i}: no step during the check")
            return {"dir": out, "seconds": t1 - t0, "alarms": alarms,
                    "steps_per_s": min(len(v) for v in in_window.values()) / (t1 - t0),
                    "max_gap": max(gaps) if gaps else float("nan"),
                    "load": (min(loads), max(loads)) if loads else (0, 0)}
        finally:
            self._stop(procs)


def fmt(x, bound):
    return f"> {bound:.0f} (not recovered)" if x is None else f"{x:.1f}"


def main():
    signal.signal(signal.SIGTERM, lambda signo, frame: sys.exit(128 + signo))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="1 repetition of ctrun, ctrun tuned and torchrun (bounded at 60 s), "
                         "a 45 s load check")
    ap.add_argument("--reps", type=int, default=None, help="repetitions (default 3, quick 1)")
    ap.add_argument("--bound", type=float, default=180.0,
                    help="seconds a run may take to recover (quick: torchrun 60)")
    ap.add_argument("--tuned", default="keep_alive_interval=1,keep_alive_max_attempt=2",
                    help="ctrun tuned's --rdzv_conf keys")
    ap.add_argument("--load_s", type=float, default=None, help="load check (default 180, quick 45)")
    ap.add_argument("--only", default=None, help="comma-separated: " + ",".join(SETTINGS) + ",load")
    ap.add_argument("--cut", choices=("nft", "link"), default="nft")
    ap.add_argument("--ctrun", default=os.path.join(BUILD, "launcher", "ctrun"))
    ap.add_argument("--ctrund", default=os.path.join(BUILD, "rendezvous", "daemon", "ctrund"))
    ap.add_argument("--keep", action="store_true", help="keep the logs")
    args = ap.parse_args()
    reps = args.reps or (1 if args.quick else 3)
    load_s = args.load_s if args.load_s is not None else (45 if args.quick else 180)
    if args.only:
        wanted = args.only.split(",")
    else:
        wanted = ["ctrun", "ctrun_tuned", "torchrun"] + ([] if args.quick else ["torchrun_tuned"])
        wanted.append("load")
    unknown = set(wanted) - set(SETTINGS) - {"load"}
    if unknown or reps < 1:
        ap.error(f"--only: unknown {sorted(unknown)}; --reps >= 1")
    settings = [s for s in SETTINGS if s in wanted]

    load0 = os.getloadavg()[0]
    print(f"== machine: {os.cpu_count()} cores, load {load0:.2f}; "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%M:%SZ}, "
          f"{'quick' if args.quick else 'full'} run: {reps} reps, cut by {args.cut}", flush=True)
    why = None
    if os.geteuid() != 0:
        why = "needs root (network namespaces, nftables)"
    else:
        for tool in ("ip", "unshare", "hostname") + (("nft",) if args.cut == "nft" else ()):
            if shutil.which(tool) is None:
                why = f"needs {tool}"
                break
    if why is None and subprocess.run([PYTHON, "-c", "import torch"], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, timeout=120).returncode != 0:
        why = f"{PYTHON} has no torch"
    if why:
        print(f"lost_node_bench: SKIPPED: {why}")
        return
    for path in (args.ctrun, args.ctrund):
        if not os.access(path, os.X_OK):
            sys.exit(f"lost_node_bench: {path} is missing; build it (cmake --build build-bench "
                     f"--target ctrun ctrund)")
    args.ctrun, args.ctrund = os.path.abspath(args.ctrun), os.path.abspath(args.ctrund)

    tmp = tempfile.mkdtemp(prefix="lnb.")
    cluster = Cluster()
    ok = False
    try:
        bench = Bench(args, cluster, tmp)
        results = {s: [] for s in settings}
        details = {s: [] for s in settings}
        try:
            for rep in range(reps):
                k = rep % len(settings)
                for s in settings[k:] + settings[:k]:
                    bound = 60.0 if (args.quick and s.startswith("torchrun")) else args.bound
                    secs, d = bench.lost_node(s, bound)
                    results[s].append(secs)
                    details[s].append(d)
                    log(f"rep {rep + 1} {s}: {fmt(secs, bound)} s; " +
                        ", ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                                  for k, v in d.items() if k != "dir"))
            load = bench.load_check("ctrun_tuned", load_s) if "load" in wanted else None
        except Skip as e:
            print(f"lost_node_bench: SKIPPED: {e}")
            ok = True
            return

        print()
        print(f"lost_node_bench: seconds from cutting node 3's link ({args.cut}; its processes "
              f"stay alive) to the first step of a survivor in a world of 2; 3 nodes x 1 worker, "
              f"--nnodes=2:3; network-namespace hosts on this machine's {os.cpu_count()} cores")
        print(f"ctrun: {args.ctrun}; ctrund: {args.ctrund}; torchrun 1.13 (tests/python/"
              f"torchrun_ref.py); ctrun tuned: --rdzv_conf {args.tuned}")
        print()
        print("| launcher | setting | cut -> survivors training (s), each run | median | "
              "torchrun / ctrun |")
        print("|---|---|---|---:|---:|")

        def median(s):
            xs = results[s]
            if any(x is None for x in xs):
                return None
            return statistics.median(xs)

        bounds = {s: (60.0 if (args.quick and s.startswith("torchrun")) else args.bound)
                  for s in settings}
        labels = {
            "ctrun": ("ctrun", "defaults (keep-alive 5 s x 3)"),
            "torchrun": ("torchrun", "defaults (keep-alive 5 s x 3, process-group timeout 30 min)"),
            "ctrun_tuned": ("ctrun", f"--rdzv_conf {args.tuned}"),
            "torchrun_tuned": ("torchrun", "--rdzv_conf last_call_timeout=1 --monitor_interval=0.5, "
                               "process-group timeout 5 s (keep-alives fixed at 5 s x 3)"),
        }
        for s in settings:
            m = median(s)
            ratio = ""
            peer = {"torchrun": "ctrun", "torchrun_tuned": "ctrun_tuned"}.get(s)
            if peer in results and median(peer):
                if m is None:
                    ratio = f"> {bounds[s] / median(peer):.1f}x"
                else:
                    ratio = f"{m / median(peer):.1f}x"
            print(f"| {labels[s][0]} | {labels[s][1]} | "
                  f"{', '.join(fmt(x, bounds[s]) for x in results[s])} | "
                  f"{fmt(m, bounds[s]) if m is not None else '> ' + str(int(bounds[s]))} | {ratio} |")
        print()
        for s in settings:
            for j, d in enumerate(details[s]):
                print(f"  {s} run {j + 1}: " + ", ".join(
                    f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in d.items() if k != "dir"))
        if load is not None:
            print()
            print(f"  load check, ctrun tuned ({args.tuned}), no fault, {load['seconds']:.0f} s: "
                  f"CPU-bound steps (hidden 4096, batch 1024, no sleep) and a busy loop on each of "
                  f"the 4 hosts; load average {load['load'][0]:.1f}-{load['load'][1]:.1f}; "
                  f"{load['steps_per_s']:.1f} steps/s, longest step {load['max_gap']:.2f} s; "
                  f"false alarms: {len(load['alarms']) or 'none'}")
            for a in load["alarms"][:20]:
                print(f"    {a}")
        print(f"  load average {load0:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
        ok = True
    finally:
        cluster.down()
        if args.keep or not ok:
            log(f"lost_node_bench: logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
