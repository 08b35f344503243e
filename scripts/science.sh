#!/usr/bin/env bash
# The science suite (issue 14): every experiment of docs/science.md in the deterministic simulator, with seeds,
# tuning on a dev split and 95% intervals. Needs the built deloco and /usr/bin/python3 (matplotlib for the plots:
# scripts/setup.sh installs python3-matplotlib).
#   scripts/science.sh --quick     # the reduced suite (tiny model), about 400 runs, 15-20 min on 2 cores
#   scripts/science.sh --smoke     # the quick scale, one seed, each method at its preset (no tuning runs): 75 runs, about 3 min
#                                  # on 2 cores: every experiment end to end; CI runs it
#   scripts/science.sh             # the full suite into runs/science and docs/science.md (hours; resumable)
# Other options pass through to scripts/science.py (--out DIR, --jobs N, --only e1,e5, --report-only, --doc FILE).
set -euo pipefail
cd "$(dirname "$0")/.."
exec /usr/bin/python3 scripts/science.py "$@"
