#!/usr/bin/env bash
# The checks of this round that need a GPU machine with torch 2.x (a lent machine: see README
# "GPU machines"), in one bounded run that writes each phase's result to $OUT (default
# ./gpu-proof-out) as it goes:
#   build       scripts/gpu-build.sh build (everything)
#   bootstrap   bootstrap_bench: ctrun's worker store against torch 2.x's libuv TCPStore server
#   pyclient    pyclient_bench.py: torch's Python TCPStore client through ctrun and torchrun
#   flight      a one-GPU NCCL job with --flight_recorder stops in its own function;
#               `ctrun status --dump` reads every rank's stacks and the Flight Recorder's dump
#   gpu_memory  a worker holding GPU memory fails; the restart waits for NVML to release it
#               (and --health_check runs nvidia-smi before each join)
#   tests       the GPU tests (scripts/gpu-build.sh test -R ...)
# DEADLINE_S bounds the whole run (default 560); each phase gets at most its own limit. PHASES
# (default all: "build bootstrap pyclient flight gpu_memory tests") picks some.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
out=${OUT:-$here/gpu-proof-out}
mkdir -p "$out"
start=$(date +%s)
deadline=$((start + ${DEADLINE_S:-560}))
build=build-gpu
phases=" ${PHASES:-build bootstrap pyclient flight gpu_memory tests} "
export out build

left() { echo $((deadline - $(date +%s))); }
# phase NAME LIMIT COMMAND...: runs it bounded by min(LIMIT, time left), output to $out/NAME.log.
phase() {
  local name=$1 limit=$2
  shift 2
  [[ $phases == *" $name "* ]] || return 0
  local t
  t=$(left)
  [ "$t" -lt "$limit" ] && limit=$t
  if [ "$limit" -le 5 ]; then
    echo "$name: not run (no time left)" | tee -a "$out/summary.txt"
    return 1
  fi
  local t0=$(date +%s)
  timeout --kill-after=5 "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name: rc $rc in $(($(date +%s) - t0)) s (limit $limit)" | tee -a "$out/summary.txt"
  return $rc
}

{
  date -u
  nvidia-smi -L
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())'
  echo "nproc $(nproc); ulimit -n $(ulimit -n) (hard $(ulimit -Hn)); uid $(id -u)"
  git log --oneline -1 2>/dev/null || true
} >"$out/env.txt" 2>&1

export CTRUN_BUILD_BENCH=ON
# BUILD_TARGETS: only these (default: everything).
# shellcheck disable=SC2086
phase build 300 scripts/gpu-build.sh build "$build" ${BUILD_TARGETS:-} || { tail -40 "$out/build.log"; exit 1; }

phase bootstrap 120 "$build/scripts/bench/bootstrap_bench" --ranks 4096,16384 --sources 1 \
  --reps 3 --backends tcpstore,ctrun_v2 --timeout_s 40

phase pyclient 110 python3 scripts/bench/pyclient_bench.py --no_netns --ranks 1024,4096 --reps 1 \
  --timeout_s 40 --ctrun "$build/launcher/ctrun" --python python3 \
  --torchrun "python3 -m torch.distributed.run"

flight() {
  local port=29611 dir=$out/flight
  mkdir -p "$dir"
  PYTHON_EXEC=python3 "$build/launcher/ctrun" --nnodes=1 --nproc_per_node=1 --rdzv_backend=c10d \
    --rdzv_endpoint=127.0.0.1:$port --rdzv_id=fr --flight_recorder --worker_timeout=600 \
    --health_check "nvidia-smi -L" --log_dir "$dir/logs" \
    tests/python/nccl_steps_then_hang.py 20 >"$dir/agent.log" 2>&1 &
  local agent=$!
  local i
  for i in $(seq 1 120); do
    grep -qE '^20( |$)' "$dir"/logs/*/attempt_0/0/heartbeat 2>/dev/null && break
    sleep 0.5
  done
  sleep 1
  "$build/launcher/ctrun" status --rdzv_endpoint=127.0.0.1:$port --rdzv_id=fr --dump \
    --dump_timeout 20 >"$dir/dump.txt" 2>&1
  "$build/launcher/ctrun" status --rdzv_endpoint=127.0.0.1:$port --rdzv_id=fr --dump --json \
    --dump_timeout 20 >"$dir/dump.json" 2>&1
  local rc=$?
  kill -TERM $agent
  wait $agent
  ls -la "$dir"/logs/*/attempt_0/0/ >"$dir/files.txt" 2>&1
  cat "$dir/dump.txt"
  return $rc
}
export -f flight
phase flight 70 bash -c flight

gpu_memory() {
  PYTHON_EXEC=python3 "$build/launcher/ctrun" --standalone --nproc_per_node=1 --max_restarts=1 \
    --health_check "nvidia-smi -L" tests/python/gpu_memory_then_fail.py 8
}
export -f gpu_memory
phase gpu_memory 60 bash -c gpu_memory

phase tests 200 scripts/gpu-build.sh test "$build" -R 'nccl|CUDA error|cuda'
[ -f "$out/tests.log" ] && tail -5 "$out/tests.log" >>"$out/summary.txt"
echo "total $(($(date +%s) - start)) s" >>"$out/summary.txt"
cat "$out/summary.txt"
