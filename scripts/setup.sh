#!/usr/bin/env bash
# Installs the Debian packages ctrun needs. Idempotent: a package already present is not
# touched, and apt is not consulted at all when nothing is missing.
#   scripts/setup.sh          what building ctrun and running the demo need
#   scripts/setup.sh --tests  that, and what only the test suite and benchmarks use (etcd, a
#                             private Slurm, Prometheus's promtool, lintian, ...)
# Never installs Boost 1.74 (libboost-all-dev / libboost-dev): it conflicts with 1.81.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libboost1.81-dev libboost-filesystem1.81-dev
  nlohmann-json3-dev libcli11-dev libssl-dev libhwloc-dev
  libtorch-dev libgloo-dev python3-torch
)
test_packages=(
  catch2 clang-format iproute2 procps elfutils help2man lintian
  etcd-server etcd-client slurmctld slurmd slurm-client munge prometheus
  openssh-server openssh-client pdsh
  chromium libpng-dev nftables curl python3-pytest python3-etcd
)
case "${1:-}" in
  "") ;;
  --tests) packages+=("${test_packages[@]}") ;;
  *)
    echo "scripts/setup.sh: unknown argument '$1' (expected nothing or --tests)" >&2
    exit 2
    ;;
esac

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
