#!/usr/bin/env bash
# The slow tier: the tests labelled `slow` (ctest -L slow), left out of CI (.ci/run) for their minutes: the chaos soak
# of standby pairs (bench/chaos_soak.sh --pairs), the testbed's runs and network faults (partitions, a flapping
# link, a slow link; root for network namespaces, skipped otherwise), the installed package's consumer, the Slurm job
# and the end-to-end storms (DELOCO_SLOW_INTEGRATION in CMakeLists.txt). Run it before resolving reliability or
# real-link work, on the build that scripts/setup.sh made (build/). Prints each test's time and the total.
# Usage: scripts/test-slow.sh [ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x build/deloco ]; then
  echo "test-slow: build/deloco is missing: run scripts/setup.sh first" >&2
  exit 2
fi
if [ "$(id -u)" != 0 ]; then
  echo "test-slow: not root: the testbed tests will be skipped (they need network namespaces)" >&2
fi
start=$(date +%s)
# One at a time: the testbed tests share one route (RESOURCE_LOCK) and the soak wants both cores.
status=0
ctest --test-dir build -L slow --output-on-failure -j1 "$@" || status=$?
echo "test-slow: $(( $(date +%s) - start )) s in all, exit $status"
exit $status
