#!/usr/bin/env bash
# Runs one libFuzzer target for SECONDS: scripts/fuzz.sh TARGET SECONDS [libFuzzer flags...]
#   TARGET: fuzz_wire (wire decoder + payload codecs), fuzz_codecs (float codecs both ways), fuzz_topk (the sparse top-k codec both ways), fuzz_config (TOML
#           loader and overrides), fuzz_safetensors (safetensors header), fuzz_manifest (checkpoint manifest),
#           fuzz_report (run records, as `deloco report` and the live dashboard read them).
# Builds build-san/ (clang, ASan + UBSan, see scripts/sanitize.sh) when needed. The working corpus is
# build-san/corpus/TARGET, seeded from the committed fuzz/corpus/TARGET; crashes are written to
# build-san/crashes/TARGET/ and fail the script. Ends with the execution count and the coverage reached.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then sed -n 2,8p "$0" >&2; exit 2; fi
target=$1 seconds=$2
shift 2
if [ ! -f fuzz/$target.cpp ]; then echo "fuzz: no target '$target' (fuzz/$target.cpp)" >&2; exit 2; fi
if [ ! -f build-san/build.ninja ]; then
  cmake -S . -B build-san -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_C_COMPILER=clang -DDELOCO_WITH_TORCH=OFF -DDELOCO_SANITIZE=ON -DDELOCO_FUZZ=ON >/dev/null
fi
cmake --build build-san --target "$target" >/dev/null
mkdir -p "build-san/corpus/$target" "build-san/crashes/$target"
log=$(mktemp)
set +e
"build-san/fuzz/$target" -max_total_time="$seconds" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
  -artifact_prefix="build-san/crashes/$target/" "$@" "build-san/corpus/$target" "fuzz/corpus/$target" 2>&1 | tee "$log" |
  grep -E "^#[0-9]+\s+(INITED|DONE)|ERROR|SUMMARY|property violated|terminate|what\(\)"
rc=${PIPESTATUS[0]}
set -e
execs=$(grep -oP 'stat::number_of_executed_units: \K[0-9]+' "$log" || echo 0)
cov=$(grep -oP '#[0-9]+\s+DONE\s+cov: \K[0-9]+' "$log" | tail -1 || true)
ft=$(grep -oP '#[0-9]+\s+DONE\s+cov: [0-9]+ ft: \K[0-9]+' "$log" | tail -1 || true)
rm -f "$log"
echo "fuzz: $target: ${execs} executions in ${seconds} s, coverage ${cov:-?} edges (${ft:-?} features), exit $rc"
exit "$rc"
