#!/usr/bin/env bash
# Floods a real `deloco syncer` (configs/tiny.toml, CURVE on) and reports its resident memory (VmRSS, sampled every
# 50 ms) before and during each flood (issue 11). Goal: the peak within 100 MB of the baseline.
#   a  handshake  peers without a key declaring huge CURVE handshake frames and streaming them (item 1), and many
#                 peers each stalling a handshake frame just under the bound (what is left: connections × bound,
#                 for at most the 5 s handshake timeout)
#   b  multiframe an authenticated learner key sending multipart messages: 24 frames of 64 MiB (the issue's
#                 attack), 24 frames just under the bound, and one message of 2000 such frames (what is left:
#                 libzmq buffers a message whole before delivering it; frames × bound) (item 5)
#   c  hello      6000 hellos asking for the state from an authenticated key, nothing read back (item 4)
#   d  slowloris  slow clients on the metrics port while scrapes run: scrapes answered and their latency (item 10)
# Every flood gets a fresh syncer.
# The attacker is build/flood_attack (bench/flood_attack.cpp): cmake -DDELOCO_BUILD_BENCH=ON, then
#   cmake --build build --target deloco flood_attack
# Usage: bench/flood.sh [BUILD_DIR=build]     (from the repository root; needs jq and data/sotu)
set -euo pipefail
BUILD=${1:-build}
deloco=$BUILD/deloco
attack=$BUILD/flood_attack
for b in "$deloco" "$attack"; do [[ -x $b ]] || { echo "flood: no $b (see the top of this script)" >&2; exit 1; }; done
work=$(mktemp -d /tmp/deloco-flood.XXXXXX)
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

"$deloco" keygen --out "$work/keys/syncer" >/dev/null
mkdir -p "$work/keys/allow"
"$deloco" keygen --out "$work/keys/learner-0" >/dev/null
cp "$work/keys/learner-0.pub" "$work/keys/allow/"

# A fresh syncer for every flood, so that one flood's leftovers do not shift the next one's baseline.
pid=""
trap '[[ -n $pid ]] && kill $pid 2>/dev/null; wait 2>/dev/null || true' EXIT
start_syncer() {
  rm -rf "$work/run"
  "$deloco" syncer --config configs/tiny.toml --set sync.learners=2 --set sync.quorum=1 --set sync.fragments=2 \
    --set train.threads=1 --set syncer.eval_interval=0 --set syncer.metrics=127.0.0.1:0 \
    --set net.secret_key="$work/keys/syncer.key" --set net.allow="$work/keys/allow" \
    --bind tcp://127.0.0.1:0 --out "$work/run" >"$work/syncer.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do
    grep -q '"kind":"started"' "$work/run/syncer.jsonl" 2>/dev/null && break
    kill -0 $pid 2>/dev/null || { cat "$work/syncer.log" >&2; exit 1; }
    sleep 0.1
  done
  local started
  started=$(grep '"kind":"started"' "$work/run/syncer.jsonl" | head -1)
  endpoint=$(jq -r .endpoint <<<"$started")
  metrics=127.0.0.1:$(jq -r .metrics_port <<<"$started")
  fp=$(jq -r .fingerprint <<<"$started")
  max_frame=$(grep -o 'max frame [0-9]*' "$work/syncer.log" | grep -o '[0-9]*$' || true)
}
stop_syncer() {
  kill $pid 2>/dev/null || true
  wait $pid 2>/dev/null || true
  pid=""
}

rss() { awk '/^VmRSS/ { print int($2 / 1024) }' "/proc/$pid/status"; }
# Runs the attacker against a fresh syncer while sampling its RSS; prints "baseline peak after" in MB (after:
# 3 s after the attacker exited).
measure() {
  local base peak r f=$work/peak
  start_syncer
  sleep 2
  base=$(rss)
  echo "$base" >"$f"
  ( while kill -0 $pid 2>/dev/null; do r=$(rss); (( r > $(cat "$f") )) && echo "$r" >"$f"; sleep 0.05; done ) &
  local sampler=$! args=() x
  for x in "$@"; do  # @ENDPOINT, @METRICS, @FP: this syncer's
    x=${x//@ENDPOINT/$endpoint}; x=${x//@METRICS/$metrics}; x=${x//@FP/$fp}; args+=("$x")
  done
  "$attack" "${args[@]}" >"$work/attack.out" 2>&1 || true
  sleep 0.5
  kill $sampler; wait $sampler 2>/dev/null || true
  sleep 3
  local after
  after=$(rss)
  stop_syncer  # before answering: the caller starts the next syncer as soon as it has the answer
  echo "$base $(cat "$f") $after"
}

key=$work/keys/learner-0.key
pub=$work/keys/syncer.pub
start_syncer  # once, to learn the frame bound
stop_syncer
bound=$max_frame
under=$((bound - 8192))  # a frame just under the bound
echo "syncer frame bound (configs/tiny.toml, 2 fragments): $bound bytes; a frame just under it: $under bytes"
printf '%-62s %7s %7s %6s %8s  %s\n' flood "base_MB" "peak_MB" "+MB" "after_MB" "attacker"
row() {
  local name=$1 b p a; shift
  read -r b p a < <(measure "$@")
  printf '%-62s %7d %7d %6d %8d  %s\n' "$name" "$b" "$p" $((p - b)) "$a" "$(tail -1 "$work/attack.out")"
}

row "a. 3 keyless peers, 1 GiB handshake frames, streaming" handshake @ENDPOINT 3 $((1 << 30)) $((1 << 30)) 10
row "a. 50 keyless peers, 1 GiB handshake frames, streaming" handshake @ENDPOINT 50 $((1 << 30)) $((1 << 30)) 10
row "a. 1000 keyless peers stalling a frame just under the bound" handshake @ENDPOINT 1000 "$under" "$under" 10
row "b. 1 message of 24 frames x 64 MiB, authenticated" multiframe @ENDPOINT "$key" "$pub" 24 $((64 << 20)) 1 5
row "b. 200 messages of 24 frames just under the bound, auth." multiframe @ENDPOINT "$key" "$pub" 24 "$under" 200 10
row "b. 1 message of 2000 frames just under the bound, auth." multiframe @ENDPOINT "$key" "$pub" 2000 "$under" 1 10
row "c. 6000 hellos asking for the state, authenticated" hello @ENDPOINT "$key" "$pub" @FP 0 6000 10
row "d. 3 slowloris clients on /metrics, 20 scrapes over 10 s" slowloris @METRICS 3 10 20
row "d. 100 slowloris clients on /metrics, 20 scrapes over 10 s" slowloris @METRICS 100 10 20
echo "work folder $work"
