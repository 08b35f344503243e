#!/usr/bin/env bash
# Byte-level against SentencePiece BPE at equal wall time: configs/small.toml and configs/small-bpe.toml (the same
# GPT, the same validation documents) trained side by side, one per core (1 thread each), evaluated every
# EVAL steps; prints bits per byte of both at the same elapsed times.
#   bench/tokens_vs_bytes.sh [STEPS=1500] [EVAL=100] [OUT=/tmp/deloco-tokens-vs-bytes]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-1500}; every=${2:-100}; out=${3:-/tmp/deloco-tokens-vs-bytes}
[ -f data/sotu-bpe/tokens.json ] || build/deloco tokenize --input data/sotu --vocab 4096 --out data/sotu-bpe >/dev/null
rm -rf "$out" && mkdir -p "$out"
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
common=(--set train.steps="$steps" --set train.eval_every="$every" --set train.threads=1 --set train.checkpoint_every=0)
taskset -c 0 build/deloco train --config configs/small.toml "${common[@]}" --set train.out_dir="$out/bytes" >"$out/bytes.log" 2>&1 &
a=$!
taskset -c 1 build/deloco train --config configs/small-bpe.toml "${common[@]}" --set train.out_dir="$out/bpe" >"$out/bpe.log" 2>&1 &
b=$!
wait $a; wait $b
/usr/bin/python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
def evals(name):
    return [r for r in map(json.loads, open(f"{out}/{name}/metrics.jsonl")) if r.get("kind") == "eval"]
def at(ev, t):  # the last evaluation at or before t seconds
    best = None
    for r in ev:
        if r["elapsed_s"] <= t + 1e-9: best = r
    return best
by, bp = evals("bytes"), evals("bpe")
print("| minutes | byte-level: step, bits/byte | BPE 4096: step, bits/byte |")
print("|---|---|---|")
for r in by:
    q = at(bp, r["elapsed_s"])
    if q is None: continue
    print(f"| {r['elapsed_s']/60:.1f} | {r['step']}, {r['val_bpb']:.3f} | {q['step']}, {q['val_bpb']:.3f} |")
print(f"end: bytes {by[-1]['step']} steps in {by[-1]['elapsed_s']/60:.1f} min -> {by[-1]['val_bpb']:.3f}; "
      f"BPE {bp[-1]['step']} steps in {bp[-1]['elapsed_s']/60:.1f} min -> {bp[-1]['val_bpb']:.3f}")
PY
