#!/usr/bin/env bash
# Chaos soak: a `deloco run` attacked from outside, then checked for what must never happen.
#
#   bench/chaos_soak.sh [--kills N] [--interval S] [--stops N] [--out DIR] [--binary PATH] [--pairs]
#                       [-- --set key=value ...]
#
# --pairs: the cluster of issue 34 instead — configs/tiny.toml, 2 learners of 2 ranks each (learner groups), a syncer
# of 2 shards, each a standby pair (syncer.standby); the victims are every process: learners, their other ranks,
# both shards' leaders and standbys. The learners serve the state they hold (net.serve=auto, 16 KB chunks), so a
# restarted learner fetches its download from the other learner and the syncer (each at most 8 Mbit/s, so both
# serve), every chunk checked against the syncer's hash (rejoin from peers). A syncer of a shard is killed at most once per 15 s (its pair must have
# followed again: a double failure of a pair is not promised). The checks then include the pair invariants (every
# fragment's merges in sequence over every term, no version applied twice by a learner, no replica mismatch, every
# push merged exactly once or not merged for a reason its learner recorded, no honest donor's chunk failing its hash,
# every shard's newest checkpoint loads and holds every merge).
#
# Starts `deloco run` (configs/demo.toml, its own chaos off, two learners) and, from outside it, SIGKILLs a random
# process of the cluster (the syncer included: at least every third victim is the syncer) about every S seconds
# (default 10, jittered ±50%) until N kills (default 50) were done, and SIGSTOPs a random process for 1-6 s
# (then SIGCONT) about every second interval (default N/2 stops). `deloco run` restarts what was killed (the syncer
# with --resume). Kills are spaced so that no process is killed more than 4 times in 120 s or twice in 15 s: the
# crash-loop policy of `deloco run` (3 exits in 10 s, or 5 in 120 s) would otherwise end the run on purpose.
# Then it lets the run finish and checks the invariants
# (bench/chaos_soak_check.py):
#   1. the run finishes (exit 0, every learner done);
#   2. no merge a learner has seen is missing after a syncer's resume: the versions a resumed syncer starts from
#      are ≥ every version any learner applied before the kill, and no learner ever reports the syncer behind;
#   3. the merge count and the checkpointed model never go back (checkpoint records, `latest`, restored counts);
#   4. no temporary files are left in the run folder, and the newest checkpoint loads and evaluates (`deloco eval`);
#   5. validation loss still falls (the last evaluation of the global model is below the first).
# Prints a summary line per invariant and exits non-zero when any fails. Takes about N × S seconds plus the tail of
# the run (≈ 9–12 min with the defaults on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."

kills=50 interval=10 stops="" out="" bin=build/deloco pairs=0
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --kills) kills=$2; shift 2 ;;
    --interval) interval=$2; shift 2 ;;
    --stops) stops=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --binary) bin=$2; shift 2 ;;
    --pairs) pairs=1; shift ;;
    --) shift; extra=("$@"); break ;;
    *) sed -n 2,20p "$0" >&2; exit 2 ;;
  esac
done
stops=${stops:-$((kills / 2))}
out=${out:-runs/soak-$(date +%Y%m%d-%H%M%S)}
[ -x "$bin" ] || { echo "soak: no deloco binary at $bin (build first: scripts/setup.sh)" >&2; exit 2; }

# Long enough to outlast the attack: the kills take at least max(interval, 10 s) each (the spacing rule above
# allows about one per 10 s with three processes), each stop about 6 s more; ~0.2 s per inner step on 2 cores,
# and restarts cost progress.
steps=$(awk -v k="$kills" -v s="$interval" -v n="$stops" \
  'BEGIN { g = s > 10 ? s : 10; printf "%d", (k * g * 1.1 + n * 6 + 60) / 0.2 + 300 }')
export OMP_WAIT_POLICY=PASSIVE
config=configs/demo.toml full=3
if [ "$pairs" = 1 ]; then
  # The tiny model steps ~10x faster than the demo's; the learners are slowed to keep the run as long as the attack.
  config=configs/tiny.toml full=8
  extra=(--set syncer.shards=2 --set syncer.standby=true --set learner.ranks=2 --set sync.fragments=4
         --set sync.sync_every=20 --set sync.wait_for_answer=false --set sync.quorum=1 --set learner.slowdown=4
         --set train.eval_tokens=4096 --set net.serve=auto --set net.chunk_bytes=16384 --set net.serve_rate=8 "${extra[@]}")
  steps=$((steps * 4))
fi
"$bin" run --config "$config" --set syncer.out_dir="$out" --set chaos.enabled=false --set sync.learners=2 \
  --set train.steps="$steps" --set syncer.eval_interval=15 "${extra[@]}" >"$out.console.log" 2>&1 &
run_pid=$!
# However this script ends (a failed check, ctest's timeout, ^C), the run ends too: a stopped process is continued
# first, so it can hear its run's stop.
cleanup() {
  kill -0 "$run_pid" 2>/dev/null || return 0
  for p in $(pgrep -P "$run_pid" 2>/dev/null); do kill -CONT "$p" 2>/dev/null || true; done
  kill -INT "$run_pid" 2>/dev/null || true
  for _ in $(seq 20); do kill -0 "$run_pid" 2>/dev/null || return 0; sleep 0.5; done
  pkill -KILL -P "$run_pid" 2>/dev/null || true
  kill -KILL "$run_pid" 2>/dev/null || true
}
trap cleanup EXIT
echo "soak: deloco run pid $run_pid, folder $out, $kills kills every ~${interval}s, $stops stops, $steps steps per learner"

# The cluster's processes: children of the run, named by their role (syncer, or learner --id N).
victims() { # prints "pid name" lines
  for p in $(pgrep -P "$run_pid" 2>/dev/null); do
    local cmd
    cmd=$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null) || continue
    case "$cmd" in
      *" syncer "*)
        local shard slot=""
        shard=$(sed -n 's/.*--shard \([0-9]*\).*/\1/p' <<<"$cmd")
        case "$cmd" in *" --standby"*) slot="-standby" ;; esac
        echo "$p syncer${shard:+-s$shard}$slot" ;;
      *" learner "*)
        local rank
        rank=$(sed -n 's/.*--rank \([0-9]*\).*/\1/p' <<<"$cmd")
        [ "${rank:-0}" = 0 ] && rank="" || rank=".rank-$rank"
        echo "$p learner-$(sed -n 's/.*--id \([0-9]*\).*/\1/p' <<<"$cmd")$rank" ;;
    esac
  done
}

declare -A history  # name -> space-separated kill times (a learner's ranks count as the learner: its group restarts whole)
can_kill() { # name now: at most 4 kills of one process within 120 s, and 2 within 15 s
  local n=0 recent=0 t
  for t in ${history[${1%%.rank-*}]:-}; do
    if awk -v a="$t" -v b="$2" 'BEGIN { exit !(b - a < 120) }'; then n=$((n + 1)); fi
    if awk -v a="$t" -v b="$2" 'BEGIN { exit !(b - a < 15) }'; then recent=$((recent + 1)); fi
  done
  [ "$n" -lt 4 ] && [ "$recent" -lt 2 ] || return 1
  # A standby pair: one syncer of a shard per 15 s, so the killed one has come back and followed again.
  if [ "$pairs" = 1 ] && [[ "$1" == syncer* ]]; then
    local shard=${1#syncer-s}; shard=${shard%%-*}
    for t in ${shard_kills[$shard]:-}; do
      if awk -v a="$t" -v b="$2" 'BEGIN { exit !(b - a < 15) }'; then return 1; fi
    done
  fi
  return 0
}
declare -A shard_kills

log="$out.soak.log"
: >"$log"
done_kills=0 done_stops=0 syncer_kills=0 start=$(date +%s.%N)
sleep 20  # let the cluster start and merge a little first
while [ "$done_kills" -lt "$kills" ] && kill -0 "$run_pid" 2>/dev/null; do
  now=$(awk -v s="$start" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }')
  mapfile -t procs < <(victims)
  if [ "${#procs[@]}" -lt "$full" ]; then sleep 0.5; continue; fi  # someone is restarting: wait for the full cluster
  # Every third kill goes to the syncer; otherwise a random member.
  if [ $((done_kills % 3)) -eq 0 ]; then pick=$(printf '%s\n' "${procs[@]}" | grep ' syncer' | shuf -n 1)
  else pick=${procs[$((RANDOM % ${#procs[@]}))]}; fi
  [ -n "$pick" ] || { sleep 0.5; continue; }
  pid=${pick%% *} name=${pick#* }
  if ! can_kill "$name" "$now"; then sleep 1; continue; fi
  kill -KILL "$pid" 2>/dev/null && {
    done_kills=$((done_kills + 1)); history[${name%%.rank-*}]="${history[${name%%.rank-*}]:-} $now"
    if [[ "$name" == syncer* ]]; then
      syncer_kills=$((syncer_kills + 1))
      sh=${name#syncer-s}; sh=${sh%%-*}; [ "$sh" = syncer ] && sh=0
      shard_kills[$sh]="${shard_kills[$sh]:-} $now"
    fi
    echo "$now SIGKILL $name $pid" >>"$log"
  }
  # Sometimes a stop as well, of another process, for 1-6 s.
  if [ "$done_stops" -lt "$stops" ] && [ $((RANDOM % 2)) -eq 0 ]; then
    sleep 2
    mapfile -t procs < <(victims)
    if [ "${#procs[@]}" -gt 0 ]; then
      pick=${procs[$((RANDOM % ${#procs[@]}))]}; spid=${pick%% *}
      d=$((1 + RANDOM % 6))
      if kill -STOP "$spid" 2>/dev/null; then
        echo "$now SIGSTOP ${pick#* } $spid ${d}s" >>"$log"; done_stops=$((done_stops + 1))
        sleep "$d"; kill -CONT "$spid" 2>/dev/null || true
      fi
    fi
  fi
  # Jittered gap: interval × [0.5, 1.5).
  sleep "$(awk -v s="$interval" -v r="$RANDOM" 'BEGIN { printf "%.2f", s * (0.5 + r / 32768) }')"
done
echo "soak: $done_kills kills ($syncer_kills of the syncer), $done_stops stops; waiting for the run to finish"
set +e
wait "$run_pid"
rc=$?
set -e
check_args=()
[ "$pairs" = 1 ] && check_args=(--pairs)
set +e
/usr/bin/python3 bench/chaos_soak_check.py "$out" --exit-code "$rc" --kills "$done_kills" --syncer-kills "$syncer_kills" \
  --stops "$done_stops" --binary "$bin" "${check_args[@]}"
check=$?
set -e
# A run that finished before the attack was done is not the soak that was asked for.
if [ "$done_kills" -lt "$kills" ]; then
  echo "FAIL  the attack was done: $done_kills of $kills kills before the run ended"
  exit 1
fi
exit "$check"
