"""A pytest test that a training job survives injected faults (docs/faults.md, "In CI").

ctrun runs the job twice, once clean and once under a seeded fault plan, and the faulted run
must succeed, end with the clean run's results (what each rank passed to
ctrun_worker.write_result) and be running again within a bound after every fault. Copy it
next to your tests and set what differs through the environment:

    CTRUN=ctrun TRAIN_SCRIPT=train.py python3 -m pytest test_faults.py

    CTRUN           the ctrun to run (default: ctrun on PATH)
    TRAIN_SCRIPT    the training script; it is given --checkpoint PATH, a file of its own per
                    run, from which it resumes after a restart
    SCRIPT_ARGS     more arguments for the script (split on spaces)
    NPROC           workers (default 2)
    FAULT_PLAN      the --faults value (default: five kills, SIGTERMs, exceptions and hangs
                    at steps 5 to 100 of ranks 0 and 1, drawn from seed 5)
    MAX_RESTARTS    the faulted run's restart budget (default 10)
    RECOVERY_MS     the most a fault may keep the workers from running (default 10000)

A failure found with a seed replays exactly with the same FAULT_PLAN.
"""
import json
import os
import shlex
import subprocess

CTRUN = os.environ.get("CTRUN", "ctrun")
TRAIN_SCRIPT = os.environ.get("TRAIN_SCRIPT", "train.py")
SCRIPT_ARGS = shlex.split(os.environ.get("SCRIPT_ARGS", ""))
NPROC = os.environ.get("NPROC", "2")
FAULT_PLAN = os.environ.get(
    "FAULT_PLAN",
    "random:seed=5,count=5,kinds=kill+term+exception+hang,ranks=0-1,steps=5-100,duration=1")
MAX_RESTARTS = os.environ.get("MAX_RESTARTS", "10")
RECOVERY_MS = int(os.environ.get("RECOVERY_MS", "10000"))


def run_job(tmp_path, name, *ctrun_flags):
    """The job under ctrun as `name`; its fault report (ctrun --fault_report) as a dict."""
    report = tmp_path / f"{name}.json"
    command = [CTRUN, "--standalone", f"--nproc_per_node={NPROC}", f"--fault_report={report}",
               *ctrun_flags, TRAIN_SCRIPT, "--checkpoint", str(tmp_path / f"{name}.pt"),
               *SCRIPT_ARGS]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{name} run failed ({done.returncode}):\n{done.stderr[-4000:]}"
    return json.loads(report.read_text())


def test_job_survives_faults(tmp_path):
    clean = run_job(tmp_path, "clean")
    assert clean["results"], "the script wrote no result (ctrun_worker.write_result)"

    faulted = run_job(tmp_path, "faulted", f"--max_restarts={MAX_RESTARTS}",
                      f"--faults={FAULT_PLAN}")
    assert faulted["outcome"] == "succeeded"
    assert faulted["faults"], "no fault fired: is the plan's window inside the job?"
    assert faulted["results"] == clean["results"]  # the same result on every rank
    for fault in faulted["faults"]:
        assert fault.get("running_again_ms", 0) <= RECOVERY_MS, fault
