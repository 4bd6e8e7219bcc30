#!/usr/bin/env bash
# Runs the libFuzzer target for the frame decoder and request dispatcher for SECONDS seconds
# (default 60), with AddressSanitizer and UndefinedBehaviorSanitizer, starting from the seed
# corpus in tests/fuzz/corpus. New inputs that reach new code go to build-fuzz/corpus.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]]; then
  echo "scripts/fuzz.sh: SECONDS must be a whole number, got '$seconds'" >&2
  exit 2
fi

bash scripts/setup.sh --tests
if ! command -v clang++-14 >/dev/null || ! dpkg-query -W -f='${Status}' libclang-rt-14-dev 2>/dev/null | grep -q "install ok installed"; then
  sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends clang-14 libclang-rt-14-dev
fi

flags="-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer"
CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCTRUN_FUZZ=ON -DCTRUN_WITH_TORCH=OFF -DCTRUN_BUILD_TESTS=OFF -DCTRUN_BUILD_BENCH=OFF \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
cmake --build build-fuzz --target protocol_fuzzer -j "$(nproc)"

mkdir -p build-fuzz/corpus
build-fuzz/tests/fuzz/protocol_fuzzer -max_total_time="$seconds" -max_len=4096 -timeout=10 \
  -print_final_stats=1 build-fuzz/corpus tests/fuzz/corpus
