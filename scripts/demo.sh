#!/usr/bin/env bash
# The demo: ctrun launches a real PyTorch DDP training (the seeds' MLP, gloo on CPU, 2 workers)
# with an embedded rendezvous (--standalone), injects a worker failure in the second epoch,
# and resumes the job from its checkpoint, exactly as a torchrun user would run it.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
cmake -S . -B build -G Ninja > /dev/null
cmake --build build -j "$(nproc)" --target ctrun ctrund

work=$(mktemp -d /tmp/ctrun_demo_XXXXXX)
trap 'rm -rf "$work"' EXIT

echo
echo "== ctrun --standalone --nproc_per_node=2 --max_restarts=1 tests/python/ddp_mlp.py"
echo "   (rank 1 fails once in epoch 1; the job restarts and resumes from the checkpoint)"
echo
PYTHON_EXEC=/usr/bin/python3 build/launcher/ctrun --standalone --nproc_per_node=2 --max_restarts=1 \
  --log_dir "$work/logs" \
  tests/python/ddp_mlp.py --epochs 4 --fail_at_epoch 1 --checkpoint "$work/checkpoint.pt"
echo
echo "== per-rank logs were written under --log_dir:"
find "$work/logs" -name '*.log' | sort | sed "s|$work/||"
