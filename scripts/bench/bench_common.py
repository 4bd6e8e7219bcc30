"""Helpers the Python benchmark drivers share (launch_bench.py, train_bench.py)."""
import os
import signal
import socket
import subprocess
import sys


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
