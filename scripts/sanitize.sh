#!/usr/bin/env bash
# Builds the torch-free half of deloco (deloco_base: config, wire codec, transports, goodput, files) with clang,
# AddressSanitizer and UndefinedBehaviorSanitizer, plus the libFuzzer targets of fuzz/, into build-san/, and runs
# its tests there: every deloco_base test, then each fuzz target for FUZZ_SECONDS (default 10; scripts/fuzz.sh runs
# one longer) over its seed corpus.
# Any sanitizer report fails the test that triggered it. Installs clang and its runtimes when missing (Debian 12).
# Usage: scripts/sanitize.sh [ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
if [ "${DELOCO_SKIP_APT:-0}" != 1 ]; then
  missing=()
  for p in clang libclang-rt-dev; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "sanitize: installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

cmake -S . -B build-san -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_C_COMPILER=clang -DDELOCO_WITH_TORCH=OFF -DDELOCO_SANITIZE=ON -DDELOCO_FUZZ=ON \
  -DDELOCO_FUZZ_TEST_SECONDS="${FUZZ_SECONDS:-10}" >/dev/null
cmake --build build-san -j "${JOBS:-$(nproc)}"
# detect_leaks: ZeroMQ's context teardown in tests is fine; real leaks in our code are what we want to see.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
# Leaks allocated inside libzmq (a frame in libzmq.so) are not reported (scripts/lsan.supp says which was seen);
# memory deloco allocates itself and leaks still fails the test.
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$PWD/scripts/lsan.supp:print_suppressions=0}"
ctest --test-dir build-san --output-on-failure -j "${JOBS:-$(nproc)}" "$@"
