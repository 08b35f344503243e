#!/usr/bin/env bash
# bench/wan.sh — data parallel across a WAN (issue 31, item 4): every method on a testbed of network-namespace hosts
# (scripts/testbed.sh) at each link rate, one JSON line per (model, method, rate) into the results file, then
# docs/wan.md and its plots (bench/wan_report.py). One command:
#
#   bench/wan.sh                                   # the whole matrix (resumable: rows already present are skipped)
#   bench/wan.sh --models demo --rates "none 10mbit" --steps 400 --max-seconds 90 --out /tmp/quick.jsonl  # quick
#
# A row is skipped when the results hold it at the same scale (steps, bound, learners); a row at another scale is
# measured again and replaces it.
#
# Options (defaults in brackets):
#   --rates "R ..."      link rate of every host, tc syntax or none (unshaped) [none 1000mbit 100mbit 10mbit 1mbit];
#                        R@50ms adds a 50 ms round trip between any two hosts (scripts/testbed.sh up --delay 12.5:
#                        the testbed's delay line, since netem is absent here)
#   --methods "M ..."    ddp | dp | sync | streaming | decoupled                 [ddp dp sync streaming decoupled]
#   --models "M ..."     demo (configs/demo.toml, 0.64M parameters) | large (configs/wan-large.toml, 1.84M)
#                        | any configs/wan-*.toml as wan-NAME                                       [demo large]
#   --steps N            inner steps per learner (rank)               [demo 1000; others their config's: large 500]
#   --max-seconds S      the wall-time bound of one run's training: DDP stops after S s of training, deloco run
#                        is interrupted (SIGINT) S + 15 s after its start                                   [180]
#   --repeats N          measure each row N times (repeat 0 .. N-1; docs/wan.md's *Repeats* section)    [1]
#   --learners M         learners (deloco) = ranks (DDP); the testbed has M + 1 hosts, host 0 the syncer's     [2]
#   --eval-seconds S     seconds between evaluations of the global model (syncer.eval_interval; DDP rank 0)   [10]
#   --ddp-timeout S      DDP's Gloo timeout (a collective or the rendezvous taking longer breaks the run)    [60]
#   --set KEY=VALUE      an extra deloco --set for every deloco method (repeatable)
#   --tcp CC             the hosts' TCP congestion control (scripts/testbed.sh up --tcp: bbr, cubic, ...)  [kernel's]
#   --out FILE           results                                                    [docs/wan/results.jsonl]
#   --runs DIR           run folders (records, logs)                                          [/tmp/deloco-wan]
#   --redo               run rows that are already in the results file again (the new line replaces the old)
#   --no-build           use build/deloco as it is (default: build it first, under /tmp/deloco-build.lock)
#   --recollect          run nothing: rebuild the rows of every run folder under --runs from its records
#   --no-report          do not regenerate docs/wan.md at the end
#   --list               print the rows that would run, run nothing
#
# Methods (all deloco ones: M learners, H = 40, chaos off, CURVE over TCP; the syncer on host 0, learner n on host
# n + 1 — dp: rank r on host r + 1 — by `deloco run --set testbed.name=...`):
#   ddp        PyTorch DDP over Gloo (bench/ddp_peer.py), one rank per learner host (hosts 1..M; host 0 idle)
#   sync       synchronous DiLoCo: K = M, P = 1, tau = 0, learners wait for the answer, mean merge, Nesterov, fp32
#   streaming  Streaming DiLoCo: K = M, P = 4, tau = 5, learners wait for each answer tau steps later, fp32
#   decoupled  Decoupled DiLoCo: K = 1 with the adaptive grace window, P = 4, tau = 5, learners never wait, token
#              weights, the decoupled merge preset, codecs fitted to each link (net.encoding = auto,
#              net.broadcast_encoding = auto: docs/runtime.md; rows before 82716e2 had int4 pushes, bf16 broadcasts),
#              learners that rebase on late answers with the outer momentum at 0.6 (sync.apply = rebase,
#              docs/apply-rule.md; rows before issue 56's apply rule overwrote, with momentum 0.9)
#   dp         deloco's own data-parallel group spanning hosts: ONE learner of M ranks (learner.ranks = M,
#              learner.group_timeout = --ddp-timeout), rank r on host r + 1 (deloco run's placement, docs/testbed.md:
#              per-step gradient all-reduce over Gloo across the links, the group's store at host 1), its syncer on
#              host 0, the Decoupled settings; the same run folder layout as the other deloco methods.
#
# Needs root (namespaces), build/deloco (scripts/setup.sh) and Debian's /usr/bin/python3 with python3-torch and
# matplotlib. Holds /tmp/deloco-testbed.lock from each testbed's up to its down (one testbed per machine: every
# testbed joins the machine's namespace at 198.18.255.254), and removes the testbed on every exit.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
TB=scripts/testbed.sh
export TESTBED_NAME=${TESTBED_NAME:-wanb}

rates="none 1000mbit 100mbit 10mbit 1mbit"
methods="ddp dp sync streaming decoupled"
tcp_cc=""
models="demo large"
steps=""
max_s=180
M=2
repeats=1
eval_s=10
ddp_timeout=60
out=docs/wan/results.jsonl
runs=/tmp/deloco-wan
redo=0
build=1
recollect=0
report=1
list=0
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rates) rates=$2; shift 2 ;;
    --methods) methods=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --max-seconds) max_s=$2; shift 2 ;;
    --learners) M=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --eval-seconds) eval_s=$2; shift 2 ;;
    --ddp-timeout) ddp_timeout=$2; shift 2 ;;
    --set) extra+=(--set "$2"); shift 2 ;;
    --tcp) tcp_cc=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --redo) redo=1; shift ;;
    --no-build) build=0; shift ;;
    --recollect) recollect=1; shift ;;
    --no-report) report=0; shift ;;
    --list) list=1; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
    *) echo "wan.sh: unknown option '$1' (--help)" >&2; exit 2 ;;
  esac
done
[[ "$M" =~ ^[1-9][0-9]*$ ]] || { echo "wan.sh: --learners must be a positive integer" >&2; exit 2; }
[[ "$repeats" =~ ^[1-9][0-9]*$ ]] || { echo "wan.sh: --repeats must be a positive integer" >&2; exit 2; }

config_of() {  # model name -> config file
  case "$1" in
    demo) echo configs/demo.toml ;;
    large) echo configs/wan-large.toml ;;
    wan-*) echo "configs/$1.toml" ;;
    *) echo "wan.sh: unknown model '$1' (demo, large, or wan-NAME for configs/wan-NAME.toml)" >&2; return 1 ;;
  esac
}
steps_of() {  # model -> inner steps ("" : the config's train.steps)
  if [ -n "$steps" ]; then echo "$steps"; elif [ "$1" = demo ]; then echo 1000; else echo ""; fi
}
for m in $models; do [ -f "$(config_of "$m")" ] || { echo "wan.sh: no config for model '$m'" >&2; exit 2; }; done
for me in $methods; do
  case "$me" in ddp|sync|streaming|decoupled|dp) ;; *) echo "wan.sh: unknown method '$me'" >&2; exit 2 ;; esac
done

has_row() {  # model method rate config steps repeat: the row is in the results, at this scale (steps, bound, learners)
  $PY bench/wan_report.py has --results "$out" --model "$1" --method "$2" --rate "$3" --config "$4" \
    --steps "${5:-0}" --max-seconds "$max_s" --learners "$M" --repeat "${6:-0}"
}

if [ "$list" = 1 ]; then
  for model in $models; do for method in $methods; do for rate in $rates; do for ((rep = 0; rep < repeats; rep++)); do
    if [ "$redo" = 0 ] && has_row "$model" "$method" "$rate" "$(config_of "$model")" "$(steps_of "$model")" $rep; then
      echo "skip $model $method $rate repeat $rep (in $out)"
    else
      echo "run  $model $method $rate repeat $rep"
    fi
  done; done; done; done
  exit 0
fi

if [ "$recollect" = 1 ]; then  # the rows again from the run folders' records (after a change of the collector)
  for f in "$runs"/*/collect.args; do
    [ -f "$f" ] || continue
    mapfile -t cargs < "$f"
    $PY bench/wan_report.py collect --results "$out" "${cargs[@]}"
  done
  [ "$report" = 0 ] || $PY bench/wan_report.py report --results "$out" --doc docs/wan.md --plots docs/wan
  exit 0
fi

[ "$(id -u)" = 0 ] || { echo "wan.sh: needs root (network namespaces)" >&2; exit 2; }
$TB check >/dev/null || { echo "wan.sh: this machine cannot make a testbed ($TB check)" >&2; exit 2; }
[ -x build/deloco ] || { echo "wan.sh: build/deloco is missing (scripts/setup.sh)" >&2; exit 2; }
mkdir -p "$runs" "$(dirname "$out")"
# One binary for the whole matrix, built from the tree as it is now and copied under the build lock (others
# rebuild build/deloco meanwhile); the row's "commit" names that tree (+dirty: with uncommitted changes in src/,
# include/).
BIN=$runs/deloco
if [ "$build" = 1 ]; then
  flock /tmp/deloco-build.lock bash -c "cmake --build build -j2 --target deloco deloco-delayline >/dev/null && cp build/deloco '$BIN'" ||
    { echo "wan.sh: building build/deloco failed (--no-build uses it as it is)" >&2; exit 2; }
else
  flock /tmp/deloco-build.lock cp build/deloco "$BIN"
fi
# A round trip in --rates needs the testbed's delay line (scripts/testbed.sh up --delay).
case " $rates " in *@*) export DELOCO_DELAYLINE=${DELOCO_DELAYLINE:-$PWD/build/deloco-delayline}
  [ -x "$DELOCO_DELAYLINE" ] || { echo "wan.sh: --rates with a round trip needs $DELOCO_DELAYLINE (cmake --build build --target deloco-delayline)" >&2; exit 2; } ;;
esac
commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src include 2>/dev/null || echo "+dirty")

LOCK_FD=""
testbed_down() {
  $TB down >/dev/null 2>&1 || true
  if [ -n "$LOCK_FD" ]; then flock -u "$LOCK_FD"; exec {LOCK_FD}>&-; LOCK_FD=""; fi
}
cleanup() {
  local pids
  pids=$(jobs -p) || true
  [ -z "$pids" ] || kill $pids 2>/dev/null || true
  testbed_down
}
trap cleanup EXIT
trap 'exit 130' INT TERM

testbed_up() {  # rate, optionally with a round trip: 10mbit@50ms (each host link delayed 50 / 4 ms each way)
  local rate=${1%@*} delay=0
  [ "$rate" = "$1" ] || delay=$(awk -v r="${1#*@}" 'BEGIN { sub(/ms$/, "", r); print r / 4 }')
  exec {LOCK_FD}>/tmp/deloco-testbed.lock
  flock "$LOCK_FD"
  $TB down >/dev/null 2>&1 || true   # ours only (TESTBED_NAME), left by a killed earlier run
  $TB up --hosts $((M + 1)) --rate "$rate" --delay "$delay" ${tcp_cc:+--tcp "$tcp_cc"} >/dev/null
}
counters() {  # -> "tx rx" per host, one host per line
  for ((h = 0; h <= M; h++)); do $TB counters "$h" | sed 's/tx_bytes=\([0-9]*\) rx_bytes=\([0-9]*\)/\1 \2/'; done
}
# Each host's TCP counters at the row's end (its namespace is new for the row: counts since the row began), to tell
# what a dropped connection was: retransmission timeouts, connections aborted by net.tcp_timeout (AbortOnTimeout).
tcp_counters() {
  command -v nstat > /dev/null || return 0
  for ((h = 0; h <= M; h++)); do
    echo "host $h"
    $TB exec "$h" nstat -asz TcpRetransSegs TcpExtTCPTimeouts TcpExtTCPAbortOnTimeout TcpExtTCPLostRetransmit \
      TcpExtTCPLossProbes TcpEstabResets 2> /dev/null | grep -v '^#' || true
  done
}

method_sets() {  # method -> deloco --set arguments
  case "$1" in
    sync) echo "sync.quorum=$M sync.fragments=1 sync.overlap=0 sync.wait_for_answer=true sync.grace=false
                merge.preset=diloco sync.weighting=uniform outer.kind=nesterov outer.lr=0.7 outer.momentum=0.9
                net.encoding=fp32 net.broadcast_encoding=fp32" ;;
    streaming) echo "sync.quorum=$M sync.fragments=4 sync.overlap=5 sync.wait_for_answer=true sync.grace=false
                merge.preset=diloco sync.weighting=uniform outer.kind=nesterov outer.lr=0.7 outer.momentum=0.9
                net.encoding=fp32 net.broadcast_encoding=fp32" ;;
    decoupled|dp) echo "sync.quorum=1 sync.fragments=4 sync.overlap=5 sync.wait_for_answer=false sync.grace=true
                merge.preset=decoupled sync.weighting=token sync.apply=rebase outer.kind=nesterov outer.lr=0.7
                outer.momentum=0.6 net.encoding=auto net.error_feedback=true net.broadcast_encoding=auto" ;;
  esac
}

# The --set arguments of a deloco method into SETS: the method's keys, the bench's, then the user's --set.
deloco_sets() {  # method steps
  SETS=()
  for kv in $(method_sets "$1"); do SETS+=(--set "$kv"); done
  SETS+=(--set chaos.enabled=false --set sync.sync_every=40 --set syncer.eval_interval="$eval_s"
         --set syncer.checkpoint_every=0 --set train.log_every=10 --set train.threads=1)
  [ -z "$2" ] || SETS+=(--set train.steps="$2")
  SETS+=("${extra[@]}")
}

run_deloco() {  # model config method rate dir steps [more deloco arguments, after the bench's and the user's --set]
  local cfg=$2 method=$3 dir=$5
  deloco_sets "$method" "$6"
  shift 6
  OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE timeout -s INT -k 30 $((max_s + 15)) "$BIN" run --config "$cfg" \
    --set testbed.name="$TESTBED_NAME" --set sync.learners="$M" --set syncer.out_dir="$dir/run" "${SETS[@]}" "$@" \
    --summary "$dir/summary.json" > "$dir/run.log" 2>&1
}

run_dp() {  # model config method rate dir steps: one learner of M ranks, rank r on host r + 1, its syncer on host 0
  run_deloco "$@" --set sync.learners=1 --set learner.ranks="$M" --set learner.group_timeout="$ddp_timeout"
}

run_ddp() {  # model config method rate dir steps
  local cfg=$2 dir=$5 steps=$6 pids=() rc=0 master
  master=$($TB addr 1):29500
  for ((r = 0; r < M; r++)); do
    timeout -k 10 $((max_s + ddp_timeout + 60)) $TB exec $((r + 1)) env OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE \
      $PY bench/ddp_peer.py --rank "$r" --world "$M" --master "$master" --config "$cfg" ${steps:+--steps "$steps"} \
      --max-seconds "$max_s" --timeout "$ddp_timeout" --eval-seconds "$eval_s" --out "$dir/ddp-$r.jsonl" \
      > "$dir/ddp-$r.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  return $rc
}

total=0; done_rows=0
for model in $models; do for rate in $rates; do for method in $methods; do total=$((total + repeats)); done; done; done
# Model, then method, then rate: each method's unshaped baseline is measured next to its shaped rows, so a change
# of the machine's load (other work on these 2 cores) moves a utilisation less.
for model in $models; do
  cfg=$(config_of "$model")
  for method in $methods; do
    for rate in $rates; do for ((rep = 0; rep < repeats; rep++)); do
      done_rows=$((done_rows + 1))
      msteps=$(steps_of "$model")
      what="$model $method $rate$([ "$repeats" = 1 ] || echo " repeat $rep")"
      if [ "$redo" = 0 ] && has_row "$model" "$method" "$rate" "$cfg" "$msteps" $rep; then
        echo "[$done_rows/$total] $what: in $out already (--redo runs it again)"
        continue
      fi
      dir=$runs/$model-$method-$rate$([ "$rep" = 0 ] || echo "-r$rep")
      rm -rf "$dir" && mkdir -p "$dir"
      echo "[$done_rows/$total] $what: $(date +%H:%M:%S) ..."
      testbed_up "$rate"
      counters > "$dir/counters.before"
      cut -d' ' -f1-3 /proc/loadavg > "$dir/load.before"
      t0=$(date +%s.%N)
      rc=0
      case "$method" in
        ddp) run_ddp "$model" "$cfg" "$method" "$rate" "$dir" "$msteps" || rc=$? ;;
        dp) run_dp "$model" "$cfg" "$method" "$rate" "$dir" "$msteps" || rc=$? ;;
        *) run_deloco "$model" "$cfg" "$method" "$rate" "$dir" "$msteps" || rc=$? ;;
      esac
      t1=$(date +%s.%N)
      counters > "$dir/counters.after"
      tcp_counters > "$dir/tcp.after"
      cut -d' ' -f1-3 /proc/loadavg > "$dir/load.after"
      testbed_down
      # The collector's arguments stay with the run folder: --recollect reads every folder again.
      printf '%s\n' --dir "$dir" --model "$model" --config "$cfg" --method "$method" --rate "$rate" \
        --learners "$M" --t0 "$t0" --t1 "$t1" --rc "$rc" --max-seconds "$max_s" --steps "${msteps:-0}" \
        --commit "$commit" --ddp-timeout "$ddp_timeout" --repeat "$rep" ${tcp_cc:+--tcp-cc "$tcp_cc"} > "$dir/collect.args"
      mapfile -t cargs < "$dir/collect.args"
      $PY bench/wan_report.py collect --results "$out" "${cargs[@]}"
    done; done
  done
done
if [ "$report" = 1 ]; then
  $PY bench/wan_report.py report --results "$out" --doc docs/wan.md --plots docs/wan
fi
