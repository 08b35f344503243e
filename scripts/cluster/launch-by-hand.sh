#!/usr/bin/env bash
# Starts a deloco cluster by hand on this machine, exactly as docs/cluster.md tells you to do on many machines:
# `deloco keygen` key pairs, one `deloco syncer` bound to a TCP port, M `deloco learner` processes dialling it
# (address and keys from the environment: DELOCO_SYNCER, DELOCO_SERVER_KEY, DELOCO_SECRET_KEY, DELOCO_LEARNER_ID),
# then waits for all of them. A learner that exits non-zero is started again (it rejoins by itself).
# Doubles as the test of those instructions: exits 0 only when the syncer and every learner exited 0.
#
# usage: scripts/cluster/launch-by-hand.sh [-c CONFIG] [-m LEARNERS] [-p PORT] [-o RUN_DIR] [-- EXTRA --set ARGS...]
#   -c  config file (default configs/demo.toml; chaos is switched off: it is `deloco run`'s business)
#   -m  number of learners M (default 2)
#   -p  TCP port of the syncer on 127.0.0.1 (default 5555)
#   -o  run folder (default runs/by-hand-<time>); keys go to RUN_DIR/keys, logs to RUN_DIR/logs
#   -b  the deloco binary (default ./build/deloco, or $DELOCO)
# Everything after `--` is passed to the syncer and every learner (e.g. -- --set train.steps=200).
set -euo pipefail

config=configs/demo.toml
learners=2
port=5555
run_dir=""
deloco=${DELOCO:-./build/deloco}
while getopts "c:m:p:o:b:h" opt; do
  case $opt in
    c) config=$OPTARG ;;
    m) learners=$OPTARG ;;
    p) port=$OPTARG ;;
    o) run_dir=$OPTARG ;;
    b) deloco=$OPTARG ;;
    h) sed -n '2,15p' "$0"; exit 0 ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[[ ${1:-} == "--" ]] && shift
extra=("$@")
[[ -x $deloco ]] || { echo "launch-by-hand: no deloco binary at $deloco (build it, or pass -b)" >&2; exit 1; }
[[ -f $config ]] || { echo "launch-by-hand: no config file $config" >&2; exit 1; }
run_dir=${run_dir:-runs/by-hand-$(date +%Y%m%d-%H%M%S)}
if [[ -e $run_dir/latest || -e $run_dir/syncer.jsonl ]]; then
  echo "launch-by-hand: $run_dir already holds a run; choose another with -o" >&2
  exit 1
fi
mkdir -p "$run_dir/logs"
keys=$run_dir/keys

# 1. Keys: one pair for the syncer, one per learner. The learners' public keys form the syncer's allow-list
#    (a folder of <name>.pub files; the name learner-N binds that key to learner id N).
"$deloco" keygen --out "$keys/syncer" >/dev/null
mkdir -p "$keys/allow"
for ((n = 0; n < learners; n++)); do
  "$deloco" keygen --out "$keys/learner-$n" >/dev/null
  cp "$keys/learner-$n.pub" "$keys/allow/"
done

common=(--config "$config" --set "sync.learners=$learners" --set chaos.enabled=false --out "$run_dir" "${extra[@]}")
# Ctrl-C or SIGTERM: every process of this script's group gets SIGTERM (deloco nodes stop cleanly), no restarts.
# shellcheck disable=SC2317  # invoked by the trap
stop_all() {
  trap '' INT TERM
  touch "$run_dir/.stopping"
  echo "launch-by-hand: stopping" >&2
  kill -TERM 0 2>/dev/null || true
  wait || true
  exit 130
}
trap stop_all INT TERM

# 2. The syncer: binds every interface on the port; its secret key and the allow-list from the environment.
DELOCO_SECRET_KEY=$keys/syncer.key DELOCO_ALLOW=$keys/allow \
  "$deloco" syncer "${common[@]}" --bind "tcp://*:$port" >"$run_dir/logs/syncer.log" 2>&1 &
syncer_pid=$!
echo "launch-by-hand: syncer (pid $syncer_pid) on tcp://127.0.0.1:$port, run folder $run_dir"

# 3. The learners: where the syncer is, its public key, their own key and id, all from the environment.
#    On another machine only DELOCO_SYNCER changes (tcp://<syncer host>:<port>).
learner() {
  local n=$1 tries=0
  until DELOCO_SYNCER=tcp://127.0.0.1:$port DELOCO_SERVER_KEY=$keys/syncer.pub \
        DELOCO_SECRET_KEY=$keys/learner-$n.key DELOCO_LEARNER_ID=$n \
        "$deloco" learner "${common[@]}" >>"$run_dir/logs/learner-$n.log" 2>&1; do
    [[ -e $run_dir/.stopping ]] && return 1
    tries=$((tries + 1))
    if ((tries >= 3)); then
      echo "launch-by-hand: learner $n failed $tries times; see $run_dir/logs/learner-$n.log" >&2
      return 1
    fi
    echo "launch-by-hand: learner $n exited non-zero; starting it again" >&2
    sleep 2
  done
}
learner_pids=()
for ((n = 0; n < learners; n++)); do
  learner "$n" &
  learner_pids+=("$!")
done
echo "launch-by-hand: $learners learners started; logs in $run_dir/logs"

# 4. Wait: every learner first, then the syncer (it exits once every learner has retired).
status=0
for ((n = 0; n < learners; n++)); do
  if ! wait "${learner_pids[$n]}"; then
    echo "launch-by-hand: learner $n failed" >&2
    status=1
  fi
done
if ((status != 0)); then
  kill -TERM "$syncer_pid" 2>/dev/null || true
fi
if ! wait "$syncer_pid"; then
  echo "launch-by-hand: the syncer failed; see $run_dir/logs/syncer.log" >&2
  status=1
fi
tail -n 1 "$run_dir/logs/syncer.log" >&2 || true
if ((status == 0)); then echo "launch-by-hand: done; records in $run_dir/syncer.jsonl and $run_dir/learner-*.jsonl"; fi
exit "$status"
