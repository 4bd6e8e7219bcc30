#!/usr/bin/env bash
# Builds ctrun against a CUDA LibTorch (the one inside a pip PyTorch) on a GPU machine that has
# no Debian packages and no internet, e.g. Ubuntu with CUDA and `pip install torch`.
#
#   scripts/gpu-build.sh fetch          on a Debian 12 machine with apt: downloads the .debs our
#                                       build needs that such a machine lacks into .gpu-deps/
#   scripts/gpu-build.sh build [DIR [TARGET...]]
#                                       on the GPU machine (after copying .gpu-deps/ there):
#                                       unpacks them into .gpu-deps/root and builds DIR
#                                       (default build-gpu) with NCCL and the CUDA LibTorch:
#                                       everything, or only the TARGETs named
#   scripts/gpu-build.sh test [DIR] [CTEST-ARG...]
#                                       runs the test suite of DIR (ctest), or the part that the
#                                       ctest arguments pick: test -R 'CUDA error'
#
# What travels: Boost 1.81 (Process v2 + filesystem, as on Debian 12; a system Boost of 1.81 or
# newer with its CMake package is taken instead, e.g. Ubuntu 24.04's 1.83), Catch2 2, CLI11, nlohmann
# json, Gloo's headers (a pip torch has Gloo inside but ships no gloo/ headers) and hwloc (for
# --numa-binding; its library needs only libudev1, which Ubuntu has). LibTorch,
# CUDA and NCCL come from the machine: torch.utils.cmake_prefix_path, /usr/local/cuda, and
# the nvidia-nccl wheel that pip torch depends on (else /usr/local/cuda). PYTHON picks the
# Python that holds torch (default python3); JOBS the build's parallelism (default nproc).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
deps="$here/.gpu-deps"
packages=(
  libboost1.81-dev libboost-filesystem1.81-dev libboost-filesystem1.81.0
  libboost-atomic1.81-dev libboost-atomic1.81.0 libboost-system1.81-dev
  catch2 libcli11-dev nlohmann-json3-dev libgloo-dev
  libhwloc-dev libhwloc15
)

# cmake and ctest: on PATH, else beside the Python that holds torch (pip's cmake).
tool() {
  if command -v "$1" >/dev/null; then
    command -v "$1"
  else
    echo "$(dirname "$(command -v "${PYTHON:-python3}")")/$1"
  fi
}

# The CMake package directory of a system Boost of 1.81 or newer that has Boost.Filesystem's
# too (Ubuntu 24.04's libboost1.83-dev: /usr/lib/x86_64-linux-gnu/cmake/Boost-1.83.0), the
# newest if several; nothing (status 1) without one. The build then takes it instead of the
# carried 1.81.
system_boost_dir() {
  local found="" cfg dir version
  for cfg in /usr/lib/*/cmake/Boost-*/BoostConfig.cmake /usr/lib/cmake/Boost-*/BoostConfig.cmake \
             /usr/local/lib/cmake/Boost-*/BoostConfig.cmake; do
    [ -f "$cfg" ] || continue
    dir=$(dirname "$cfg")
    version=${dir##*/Boost-}
    [ -d "$(dirname "$dir")/boost_filesystem-$version" ] || continue
    # At least 1.81.0, and newer than one found before.
    [ "$(printf '%s\n%s\n' 1.81.0 "$version" | sort -V | head -1)" = 1.81.0 ] || continue
    if [ -z "$found" ] || [ "$(printf '%s\n%s\n' "${found##*/Boost-}" "$version" | sort -V | tail -1)" = "$version" ]; then
      found=$dir
    fi
  done
  [ -n "$found" ] && echo "$found"
}

fetch() {
  mkdir -p "$deps/debs"
  (cd "$deps/debs" && apt-get download "${packages[@]}")
  echo "gpu-build: $(ls "$deps/debs" | wc -l) packages in $deps/debs ($(du -sh "$deps/debs" | cut -f1))"
}

# Unpacks the carried .debs into .gpu-deps/root; with "no-boost", all but Boost's: the root's
# include directory is on the compiler's path (Gloo's headers), and Boost 1.81's headers there
# would shadow the system Boost the build links against.
unpack() {
  local root="$deps/root" skip_boost=${1:-}
  [ -d "$deps/debs" ] || { echo "gpu-build: no $deps/debs (run 'scripts/gpu-build.sh fetch' on Debian)" >&2; exit 1; }
  local wanted=() f
  for f in "$deps"/debs/*.deb; do
    if [ "$skip_boost" = no-boost ] && [[ "$(basename "$f")" == libboost* ]]; then continue; fi
    wanted+=("$f")
  done
  # Unpacked again whenever the set of packages changed (a fetch that brought new ones).
  if [ ! -f "$root/.unpacked" ] || [ "$(cat "$root/.unpacked")" != "$(printf '%s\n' "${wanted[@]##*/}")" ]; then
    rm -rf "$root"
    mkdir -p "$root"
    for f in "${wanted[@]}"; do dpkg-deb -x "$f" "$root"; done
    printf '%s\n' "${wanted[@]##*/}" > "$root/.unpacked"
  fi
}

build() {
  local dir=${1:-$here/build-gpu}
  shift || true
  local targets=()
  for t in "$@"; do targets+=(--target "$t"); done
  local python=${PYTHON:-python3}
  local boost_args=() boost_dir skip_boost=""
  if boost_dir=$(system_boost_dir); then
    boost_args=(-DBoost_DIR="$boost_dir")
    skip_boost=no-boost
    echo "gpu-build: Boost ${boost_dir##*/Boost-} from the system ($boost_dir), not the carried 1.81"
  fi
  unpack "$skip_boost"
  local root="$deps/root"
  local torch_prefix nccl_home
  torch_prefix=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
  # pip torch's own NCCL (nvidia-nccl-cu*); its library has no unversioned .so link.
  nccl_home=$("$python" -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)
  local nccl_args=(-DCTRUN_NCCL=ON)
  if [ -n "$nccl_home" ] && [ -f "$nccl_home/include/nccl.h" ]; then
    nccl_args+=(-DCTRUN_NCCL_INCLUDE_DIR="$nccl_home/include"
                -DCTRUN_NCCL_LIBRARY="$(ls "$nccl_home"/lib/libnccl.so* | head -1)")
  fi
  local cmake
  cmake=$(tool cmake)
  # A precaution for CMake 4 (pip's cmake is 4.x): it refuses any config file that asks for
  # compatibility below 3.5, unless given this floor.
  CMAKE_POLICY_VERSION_MINIMUM=3.5 "$cmake" -S "$here" -B "$dir" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DCTRUN_BUILD_BENCH="${CTRUN_BUILD_BENCH:-OFF}" \
    -DCMAKE_PREFIX_PATH="$root/usr;$torch_prefix" \
    -DCTRUN_GLOO_INCLUDE_DIR="$root/usr/include" \
    -DCUDAToolkit_ROOT="${CUDA_HOME:-/usr/local/cuda}" \
    -DCMAKE_CUDA_COMPILER="${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" \
    "${nccl_args[@]}" "${boost_args[@]}"
  "$cmake" --build "$dir" -j "${JOBS:-$(nproc)}" "${targets[@]}"
}

run_tests() {
  local dir=$here/build-gpu
  if [ $# -gt 0 ] && [[ $1 != -* ]]; then  # a first word that is no ctest option is DIR
    dir=$1
    shift
  fi
  export CMAKE_POLICY_VERSION_MINIMUM=3.5  # the package test configures against torch again
  "$(tool ctest)" --test-dir "$dir" --output-on-failure -j "${JOBS:-$(nproc)}" --timeout 300 "$@"
}

case "${1:-}" in
  fetch) fetch ;;
  build) shift; build "$@" ;;
  test) shift; run_tests "$@" ;;
  *) echo "usage: scripts/gpu-build.sh fetch | build [DIR [TARGET...]] | test [DIR] [CTEST-ARG...]" >&2; exit 2 ;;
esac
