#!/usr/bin/env bash
# GPU check (issue 12): builds deloco against a CUDA libtorch and runs a short `deloco train` and `deloco run` on the
# GPU in bf16. Run it on a machine with an NVIDIA GPU, after scripts/setup.sh has fetched the corpus.
#
#   scripts/gpu-check.sh                   # finds a CUDA libtorch: $CMAKE_PREFIX_PATH, else the pip torch of python3
#   CMAKE_PREFIX_PATH=/opt/libtorch scripts/gpu-check.sh
#
# Exit status 0 when both runs finish on the GPU with a finite validation loss; 2 when no GPU or no CUDA libtorch
# is found (nothing was checked); 1 on a failure. Output goes to build-cuda/gpu-check/.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU visible (nvidia-smi -L failed); nothing checked" >&2
  exit 2
fi
prefix="${CMAKE_PREFIX_PATH:-}"
if [ -z "$prefix" ]; then
  for py in python3 /usr/bin/python3; do
    if p=$("$py" -c 'import torch, sys; sys.exit(0 if torch.version.cuda else 1); ' 2>/dev/null && \
           "$py" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null); then prefix="$p"; break; fi
  done
fi
if [ -z "$prefix" ]; then
  echo "gpu-check: no CUDA libtorch found; set CMAKE_PREFIX_PATH to one (e.g. an unpacked libtorch-cxx11-abi zip)" >&2
  exit 2
fi
echo "gpu-check: libtorch from $prefix"
nvidia-smi -L

cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
  -DDELOCO_BUILD_TESTS=OFF -DDELOCO_BUILD_BENCH=OFF >/dev/null
cmake --build build-cuda -j "${JOBS:-$(nproc)}" --target deloco
out=build-cuda/gpu-check
rm -rf "$out" && mkdir -p "$out"

common=(--config configs/small.toml --set train.device=cuda --set train.precision=bf16 --set train.eval_tokens=16384)
echo "gpu-check: deloco train (200 steps, bf16, cuda)"
build-cuda/deloco train "${common[@]}" --set train.steps=200 --set train.eval_every=100 \
  --set train.out_dir="$out/train" --summary "$out/train.json" 2>&1 | tail -3
echo "gpu-check: deloco run (2 learners, 200 steps each, bf16, cuda)"
build-cuda/deloco run --config configs/demo.toml --set train.device=cuda --set train.precision=bf16 \
  --set sync.learners=2 --set train.steps=200 --set chaos.enabled=false --set syncer.out_dir="$out/run" \
  --summary "$out/run.json" 2>&1 | tail -3

ok=1
for s in "$out/train.json" "$out/run.json"; do
  loss=$(jq -r '.final_val_loss' "$s" 2>/dev/null || echo null)
  echo "gpu-check: $(basename "$s" .json): final_val_loss $loss"
  case "$loss" in null|nan|NaN|inf|-inf|"") ok=0 ;; esac
done
[ "$ok" = 1 ] && echo "gpu-check: passed" || { echo "gpu-check: FAILED" >&2; exit 1; }
