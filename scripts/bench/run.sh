#!/usr/bin/env bash
# Runs every benchmark of issues 2, 3, 4, 7, 16, 18, 19, 26, 23, 41 and 45 and prints their tables with ratios:
#   store_bench       ctrund vs PyTorch's TCPStore: set+get throughput (1/4/16 client processes), latency
#   bootstrap_bench   process-group bootstrap store traffic of 1024..65536 ranks, from one address
#                     and from 256: the agent's worker store (its defaults, a round of N ranks) vs
#                     PyTorch's TCPStore server; and a job restarted 1,000 times on one store
#   rdzv_bench        ctrund as packaged (--state_dir, --token_file) forming a round of 16..8192
#                     nodes: formation time, daemon peak memory
#   c10d_rdzv_bench   torch's c10d dynamic rendezvous vs ctrund at 16 and 64 nodes
#   backend_rdzv_bench  one round of 16..1024 agents through the agent's Backend: etcd vs ctrund, and
#                     each over mutual TLS vs plain (ctrund to 1024 nodes, etcd to 256)
#   etcd_rdzv_bench   torch's etcd-v2 rendezvous vs ctrun's etcd backend (and ctrund), 16 and 64
#   launch_bench      the ctrun launcher vs torchrun: launch time and memory, worker restart,
#                     node failure
#   train_bench       the C++ trainers vs Python DDP under torchrun: samples/s, overlap,
#                     all-reduce bus bandwidth
#   ft_bench          a worker SIGKILLed: --fault_tolerance=step vs ctrun's restart vs torchrun
#                     (fault to next committed step, steps lost); the quorum's steady cost
#   py_ft_bench       the same for Python scripts (ctrun_worker.FaultTolerance): a worker SIGKILLed,
#                     vs ctrun's restart and torchrun with a plain DDP script; the cost per step vs DDP
#   zero_bench        ZeRO stages 1-3 vs DDP: measured per-rank tensor memory against the
#                     formulas, step time (gpt on CPU at 2, 3 and 4 ranks)
#   hostfile_bench    ctrun --hosts over ssh (cold, warm) vs pdsh and sequential ssh, 2/4/8 hosts
#   fault_bench       recovery from each kind of injected fault (ctrun --faults): restart mode vs
#                     --fault_tolerance=step, from the fault reports
#   step_hook_bench   what ctrun's count of a script's optimizer steps (and DDP wait sampling)
#                     costs a step of 10 ms and 100 ms, against the same launch without it
#   lost_node_bench   a lost machine (a host's link cut, its processes alive) in a 2:3 job on
#                     network-namespace hosts: cut to the survivors' next step, ctrun vs torchrun
#                     with defaults, ctrun tuned, and a no-fault check of the tuning under load
# Usage: scripts/bench/run.sh [--quick]
# Builds build-bench/ first if needed (one job at a time: the machine is shared; BENCH_JOBS=N
# to change). Everything runs inside a loopback-only network namespace, because TCPStore binds
# every interface whatever address it is given.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build="$root/build-bench"
bench="$build/scripts/bench"
quick=()
for arg in "$@"; do
  case "$arg" in
    --quick) quick=(--quick) ;;
    --in-netns) ;;
    *) echo "usage: $0 [--quick]" >&2; exit 2 ;;
  esac
done

if [[ " $* " != *" --in-netns "* ]]; then
  if [ ! -f "$build/build.ninja" ]; then
    cmake -S "$root" -B "$build" -G Ninja -DCTRUN_BUILD_TESTS=OFF -DCTRUN_BUILD_BENCH=ON \
      -DCTRUN_WITH_TORCH=ON -DCMAKE_BUILD_TYPE=Release
  fi
  nice -n 19 ninja -C "$build" -j "${BENCH_JOBS:-1}" ctrund rdzv_bench backend_rdzv_bench store_bench \
    bootstrap_bench ctrun launch_probe launch_measure mlp gpt allreduce_bench zero_bench
  # Re-run this script in a fresh network namespace with only the loopback interface.
  unshare_flags=(-n)
  [ "$(id -u)" -eq 0 ] || unshare_flags=(-r -n)
  exec unshare "${unshare_flags[@]}" "$0" "${quick[@]}" --in-netns
fi

ip link set lo up
echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'),"\
     "$(free -g | awk '/Mem:/ {print $2}') GiB, kernel $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ), ${quick[*]:-full run}"

status=0
run() {  # every benchmark is bounded: none may hang the run
  local limit=$1; shift
  echo
  echo "== $*"
  if ! timeout --kill-after=10 "$limit" "$@"; then
    echo "!! failed or timed out: $*" >&2
    status=1
  fi
}

run 1200 "$bench/store_bench" "${quick[@]}"
run 900 "$bench/bootstrap_bench" "${quick[@]}"
run 600 "$bench/bootstrap_bench" --restarts 1000
run 900 /usr/bin/python3 "$root/scripts/bench/pyclient_bench.py" --ctrun "$build/launcher/ctrun" "${quick[@]}"
run 900 "$bench/rdzv_bench" "${quick[@]}"
run 900 /usr/bin/python3 "$root/scripts/bench/c10d_rdzv_bench.py" --rdzv_bench "$bench/rdzv_bench" "${quick[@]}"
run 900 "$bench/backend_rdzv_bench" "${quick[@]}"
run 1200 /usr/bin/python3 "$root/scripts/bench/etcd_rdzv_bench.py" \
  --backend_rdzv_bench "$bench/backend_rdzv_bench" "${quick[@]}"
run 900 /usr/bin/python3 "$root/scripts/bench/launch_bench.py" "${quick[@]}"
run 3600 /usr/bin/python3 "$root/scripts/bench/train_bench.py" "${quick[@]}"
run 1800 /usr/bin/python3 "$root/scripts/bench/ft_bench.py" "${quick[@]}"
run 1200 /usr/bin/python3 "$root/scripts/bench/py_ft_bench.py" "${quick[@]}"
run 1800 /usr/bin/python3 "$root/scripts/bench/zero_bench.py" "${quick[@]}"
run 900 /usr/bin/python3 "$root/scripts/bench/hostfile_bench.py" --ctrun "$build/launcher/ctrun" --ctrund "$build/rendezvous/daemon/ctrund" "${quick[@]}"
run 1800 /usr/bin/python3 "$root/scripts/bench/fault_bench.py" "${quick[@]}"
run 900 /usr/bin/python3 "$root/scripts/bench/step_hook_bench.py" "${quick[@]}"
run 2400 /usr/bin/python3 "$root/scripts/bench/lost_node_bench.py" --ctrun "$build/launcher/ctrun" --ctrund "$build/rendezvous/daemon/ctrund" "${quick[@]}"
exit $status
