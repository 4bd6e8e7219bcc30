#!/usr/bin/env bash
# The demo: ctrun launches a real PyTorch DDP training (the seeds' MLP, gloo on CPU, 2 workers)
# with an embedded rendezvous (--standalone), injects a worker failure in the second epoch,
# and resumes the job from its checkpoint, exactly as a torchrun user would run it. Then the
# same model as a C++ trainer on libctrun_worker (DDP over Gloo), one worker SIGKILLed mid-epoch
# and the job resumed from its last checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
# Only what the demo runs (no tests, no benchmarks), in a build of its own without debug
# information: on 2 cores 5 minutes instead of 6.5, and 1.1 GB of disk instead of 2.4 (README).
# scripts/test.sh builds in build/, with debug information.
demo_build=build-demo
cmake -S . -B "$demo_build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCTRUN_BUILD_TESTS=OFF \
  -DCTRUN_BUILD_BENCH=OFF > /dev/null
cmake --build "$demo_build" -j "$(nproc)" --target ctrun ctrund mlp

work=$(mktemp -d /tmp/ctrun_demo_XXXXXX)
trap 'rm -rf "$work"' EXIT

echo
echo "== ctrun --standalone --nproc_per_node=2 --max_restarts=1 tests/python/ddp_mlp.py"
echo "   (rank 1 fails once in epoch 1; the job restarts and resumes from the checkpoint)"
echo
PYTHON_EXEC=/usr/bin/python3 "$demo_build"/launcher/ctrun --standalone --nproc_per_node=2 --max_restarts=1 \
  --log_dir "$work/logs" \
  tests/python/ddp_mlp.py --epochs 4 --fail_at_epoch 1 --checkpoint "$work/checkpoint.pt"
echo
echo "== per-rank logs were written under --log_dir:"
find "$work/logs" -name '*.log' | sort | sed "s|$work/||"

echo
echo "== ctrun --standalone --nproc_per_node=2 --max_restarts=1 $demo_build/trainers/mlp"
echo "   (C++ DDP on libctrun_worker; rank 1 SIGKILLs itself before step 100, the job restarts"
echo "   and resumes from the checkpoint of step 80)"
echo
"$demo_build"/launcher/ctrun --standalone --nproc_per_node=2 --max_restarts=1 \
  "$demo_build"/trainers/mlp --epochs 3 --checkpoint_dir "$work/mlp_checkpoints" --checkpoint_every 40 \
  --inject_kill_at_step 100
