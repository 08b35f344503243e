#!/usr/bin/env bash
# scripts/cluster/slurm.sbatch under a real Slurm (ctest slurm.job): a throwaway one-node cluster on this machine
# (munged, slurmctld and slurmd in a temporary folder, nothing global touched), then the real sbatch file submitted
# with 3 tasks of 2 CPUs packed on the node (1 syncer + 2 learners, CURVE over TCP to the node's hostname) on
# configs/tiny.toml. Job 1 is cancelled once both learners pushed (as a time limit ends a job); job 2, the same
# submission on the same run folder, must continue the run and finish it.
# Checks: job 1 CANCELLED and left a syncer checkpoint; job 2 COMPLETED with exit code 0, each of its 3 tasks ran
# (srun's labels 0:, 1:, 2:), srun got --cpus-per-task 2, no task failed and was restarted, the syncer resumed (a
# fresh start then one resume), both learners continued from their state and finished every step, every learner
# contributed to merges after the resume and retired, nothing was rejected, merge counts never went back.
# Job 3 runs a syncer of 2 shards (DELOCO_SHARDS=2) with 2 learners: both shards merge their own fragment with both
# learners, and the script assembles the global model.
# Keys: no secret key is ever in the run folder (the filesystem every node shares), during job 1 nor after any job;
# while job 1 trains, each of its 3 tasks holds its own key in a 0700 folder of its own under DELOCO_KEY_DIR (the
# "node-local" folder here); every job publishes its public keys in a folder of its own (job 2's keys are new, not
# job 1's), and the tasks remove their secret keys when they end.
# Prints the jobs' wall times, the merges, and the merges each learner contributed to.
#
# usage: tests/cluster/slurm_test.sh [DELOCO_BINARY]      (run from anywhere; KEEP=1 keeps the temporary folder)
# Skips (exit 77) when not root or when Slurm or MUNGE is not installed (Debian: apt-get install slurm-wlm munge).
# Every wait is bounded (at most about 4 minutes in all; a pass takes about 35 s on 2 cores); a trap cancels the job
# and stops every daemon and process it started, also on failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
DELOCO=$(realpath "${1:-build/deloco}")
export PATH=$PATH:/usr/sbin:/sbin
# shellcheck disable=SC2046  # one name a word
unset $(compgen -e | grep '^SLURM_') # run inside a Slurm job, its variables would reach our sbatch

skip() { echo "slurm test skipped: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "not root (the daemons run as root here)"
for b in munged slurmctld slurmd sbatch sinfo scontrol squeue scancel srun; do
  command -v "$b" >/dev/null || skip "no $b (Debian 12: apt-get install slurm-wlm munge)"
done
[ -x "$DELOCO" ] || { echo "FAIL: no deloco binary at $DELOCO" >&2; exit 1; }

started=$EPOCHREALTIME
work=$(mktemp -d /tmp/deloco-slurm.XXXXXX)
chmod 755 "$work"   # munged wants its socket's folders searchable by all and writable by root only
mkdir -m 755 "$work/munge"
mkdir -m 700 "$work/munge-key"
mkdir -p "$work/state" "$work/spool" "$work/log" "$work/node-local"
daemon_pids=()
job=""

# Every process this test started, directly or not (deloco tasks, slurmstepd, the daemons): their environment or
# command line names $work (SLURM_CONF, the munge socket, the run folder).
ours() {
  local p
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [ "$p" = $$ ] || [ "$p" = "$BASHPID" ] && continue
    if { tr '\0' '\n' <"/proc/$p/environ" | grep -qF "$work"; } 2>/dev/null ||
       { tr '\0' ' ' <"/proc/$p/cmdline" | grep -qF "$work"; } 2>/dev/null; then
      echo "$p"
    fi
  done
}
# A Slurm client command, bounded (an unreachable controller makes them retry for long).
sl() { timeout 10 "$@"; }
cleanup() {
  local rc=$? p end t=$EPOCHREALTIME
  trap - EXIT
  if [ -n "$job" ] && sl squeue -h -j "$job" 2>/dev/null | grep -q .; then
    sl scancel "$job" 2>/dev/null || true
    end=$((SECONDS + 15))
    while ((SECONDS < end)) && sl squeue -h -j "$job" 2>/dev/null | grep -q .; do sleep 0.5; done
  fi
  for p in "${daemon_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  if [ -f "$work/munged.pid" ]; then kill -TERM "$(cat "$work/munged.pid")" 2>/dev/null || true; fi
  end=$((SECONDS + 10))
  while ((SECONDS < end)); do   # then SIGKILL: slurmd may ignore SIGTERM for a while
    left=$(ours)
    [ -z "$left" ] && break
    sleep 0.5
  done
  left=$(ours)
  # shellcheck disable=SC2086  # one pid a word
  [ -z "$left" ] || kill -KILL $left 2>/dev/null || true
  awk -v a="$t" -v b="$EPOCHREALTIME" -v k="$(wc -w <<<"$left")" \
    'BEGIN { printf "slurm: daemons stopped in %.1f s (%d processes left for SIGKILL)\n", b - a, k }'
  if [ "$rc" != 0 ] && [ "$rc" != 77 ]; then
    for f in "$work"/log/*.log "$work"/job-*.out; do
      [ -f "$f" ] && { echo "--- tail of $f" >&2; tail -25 "$f" >&2; }
    done
  fi
  if [ -n "${KEEP:-}" ]; then echo "kept $work"; else rm -rf "$work"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
fail() { echo "FAIL: $*" >&2; exit 1; }
# Every wait below ends at its own bound or at this deadline (240 s from here), whichever comes first; the stop on
# exit takes at most 25 s more, within ctest's 300 s.
deadline=$((SECONDS + 240))
until_() { local e=$((SECONDS + $1)); echo $((e < deadline ? e : deadline)); }

# Free TCP ports for slurmctld, slurmd and the syncer (not the defaults: a real Slurm may run here too).
read -r ctld_port slurmd_port deloco_port < <(python3 - <<'PY'
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("", 0))
print(*[s.getsockname()[1] for s in socks])
PY
)

# MUNGE: a fresh key and a daemon of our own on a socket in $work.
head -c 1024 /dev/urandom >"$work/munge-key/munge.key"
chmod 400 "$work/munge-key/munge.key"
munged --key-file="$work/munge-key/munge.key" --socket="$work/munge/munge.socket" --pid-file="$work/munged.pid" \
  --log-file="$work/log/munged.log" --seed-file="$work/munge-key/munge.seed" ||
  fail "munged did not start"

# slurm.conf: this machine as its only node, no cgroups, no accounting. The node's memory is what slurmd sees; its
# CPUs at least 6 (config_overrides) so that the job's 3 tasks of 2 CPUs fit on a 2-core machine (no binding:
# task/none, so the tasks share the real cores).
node=$(hostname -s)
hw=$(slurmd -C | head -1)
cpus=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$hw"); cpus=${cpus:-$(nproc)}
real_cpus=$cpus
((cpus >= 6)) || cpus=6
mem=$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<<"$hw"); mem=${mem:-1000}
cat >"$work/slurm.conf" <<EOF
ClusterName=deloco-test
SlurmctldHost=$node
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$work/munge/munge.socket
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool/%n
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$work/log/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
MailProg=/bin/true
MinJobAge=600
SlurmdParameters=config_overrides
NodeName=$node CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
export SLURM_CONF=$work/slurm.conf

slurmctld -D -c -f "$SLURM_CONF" >"$work/log/slurmctld.out" 2>&1 &
daemon_pids+=($!)
slurmd -D -f "$SLURM_CONF" >"$work/log/slurmd.out" 2>&1 &
daemon_pids+=($!)
state=""
end=$(until_ 30)
while ((SECONDS < end)); do
  state=$(sl sinfo -h -N -n "$node" -o '%t' 2>/dev/null || true)
  [ "$state" = idle ] && break
  for p in "${daemon_pids[@]}"; do kill -0 "$p" 2>/dev/null || fail "a Slurm daemon exited (pid $p)"; done
  sleep 0.5
done
[ "$state" = idle ] || fail "node $node not idle within 30 s (sinfo: '${state}')"
awk -v a="$started" -v b="$EPOCHREALTIME" 'BEGIN { printf "slurm: daemons up, node idle after %.1f s\n", b - a }'
echo "slurm: node $node ($cpus CPUs for Slurm, $real_cpus real; $mem MB) idle;" \
  "slurmctld on port $ctld_port, slurmd on $slurmd_port"

# The jobs: the real sbatch file, 3 tasks of 2 CPUs packed on this one node, a short tiny run. The run's settings
# travel in the environment: sbatch exports it to the batch script, srun to every task. Job 1 is cancelled once the
# syncer merged (as a time limit would end it); job 2, submitted again on the same run folder, continues the run
# (the syncer resumes from its checkpoint, each learner from its state) and must finish it.
export DELOCO DELOCO_CONFIG=configs/tiny.toml DELOCO_PORT=$deloco_port DELOCO_RUN_DIR=$work/run
steps=300
export DELOCO_SET="train.steps=$steps
sync.sync_every=10
sync.fragments=2
sync.quorum=1
syncer.eval_interval=0"
export OMP_WAIT_POLICY=PASSIVE SLURM_DEBUG=1
export DELOCO_KEY_DIR=$work/node-local   # each task's own key folder: node-local on a real cluster
# No secret key anywhere in run folder $1 (what every node sees): no *.key file, no file holding a secret-key line.
no_secrets() {
  local found
  found=$(find "$1" \( -name '*.key' -print \) -o \( -type f -exec grep -l 'secret-key' {} + \) 2>/dev/null || true)
  [ -z "$found" ] || fail "$2: secret keys in the shared run folder: $found"
}
# The public keys job $1 published in run folder $2: its one folder RUN/keys/job-<id>.*, holding syncer.pub and
# allow/learner-0.pub, allow/learner-1.pub. Prints the folder.
job_keys() {
  local d
  d=$(compgen -G "$2/keys/job-$1.*") || fail "job $1 made no key folder in $2/keys"
  [ "$(wc -l <<<"$d")" = 1 ] || fail "job $1 made more than one key folder: $d"
  for f in syncer.pub allow/learner-0.pub allow/learner-1.pub; do [ -s "$d/$f" ] || fail "job $1 published no $f"; done
  echo "$d"
}
# submit [TASKS [CPUS_PER_TASK]]: the job id.
submit() {
  local id
  id=$(sl sbatch --parsable --nodes=1 --ntasks-per-node="${1:-3}" --cpus-per-task="${2:-2}" --time=5 \
         --output="$work/job-%j.out" scripts/cluster/slurm.sbatch) || fail "sbatch refused the job"
  echo "${id%%;*}"
}
job_field() { sed -n "s/.* $2=\([^ ]*\).*/\1/p" <<<"$(sl scontrol show job "$1" -o 2>/dev/null)"; }
# Waits (at most $2 s) for job $1 to end; prints its final state.
wait_end() {
  local st="" end
  end=$(until_ "$2")
  while ((SECONDS < end)); do
    st=$(job_field "$1" JobState)
    case $st in PENDING | RUNNING | CONFIGURING | COMPLETING | "") ;; *) break ;; esac
    sleep 0.2
  done
  echo "$st"
}

job=$(submit)
echo "slurm: submitted job $job"
end=$(until_ 60)
until grep -q '"kind":"merge"' "$work/run/syncer.jsonl" 2>/dev/null &&
      grep -q '"kind":"push"' "$work/run/learner-0.jsonl" 2>/dev/null &&
      grep -q '"kind":"push"' "$work/run/learner-1.jsonl" 2>/dev/null; do
  ((SECONDS < end)) || fail "job $job: no merge and pushes from both learners within 60 s"
  jstate=$(job_field "$job" JobState)
  case $jstate in
    PENDING | RUNNING | CONFIGURING | "") ;;
    *) fail "job $job ended ($jstate) before both learners pushed" ;;
  esac
  sleep 0.2
done
# While it trains: no secret key in the run folder; each task holds its own (syncer, learner-0, learner-1), each in a
# 0700 folder of its own.
no_secrets "$work/run" "while job $job trains"
own=$(find "$work/node-local" -name '*.key' | sort)
[ "$(wc -l <<<"$own")" = 3 ] || fail "job $job's tasks hold $(wc -l <<<"$own") secret keys, not 3 (one each): $own"
[ "$(xargs -n1 dirname <<<"$own" | sort -u | wc -l)" = 3 ] || fail "two tasks share a key folder: $own"
[ "$(xargs -n1 basename <<<"$own" | sort | tr '\n' ' ')" = "learner-0.key learner-1.key syncer.key " ] ||
  fail "the tasks' keys are not the syncer's and each learner's own: $own"
for d in $(xargs -n1 dirname <<<"$own"); do
  [ "$(stat -c %a "$d")" = 700 ] || fail "task key folder $d has mode $(stat -c %a "$d"), not 700"
done
sl scancel "$job" || fail "scancel $job"
jstate=$(wait_end "$job" 30)
[ "$jstate" = CANCELLED ] || fail "job 1 ($job) ended '$jstate', not CANCELLED (did it finish before the cancel?)"
[ -e "$work/run/latest" ] || fail "the cancelled job left no syncer checkpoint (run/latest)"
no_secrets "$work/run" "after job $job"
keys1=$(job_keys "$job" "$work/run")
echo "slurm: job $job cancelled once both learners pushed;" \
  "$(grep -c '"kind":"merge"' "$work/run/syncer.jsonl") merges"

first=$job
t0=$(date +%s.%N)
job=$(submit)
echo "slurm: submitted job $job on the same run folder"
jstate=$(wait_end "$job" 120)
t1=$(date +%s.%N)
exitcode=$(job_field "$job" ExitCode)
runtime=$(job_field "$job" RunTime)
out=$work/job-$job.out
[ "$jstate" = COMPLETED ] || fail "job $job ended '$jstate' (exit code $exitcode) or did not end in time"
[ "$exitcode" = 0:0 ] || fail "job $job exit code $exitcode"
for t in 0 1 2; do grep -q "^$t: " "$out" || fail "no output from task $t in $out"; done
# srun's options (SLURM_DEBUG=1): the job's --cpus-per-task reached the step (Slurm 22.05's srun ignores
# SLURM_CPUS_PER_TASK: without -c each task would get 1 CPU, and be bound to it where tasks are bound).
grep -Eq '^srun: cpus-per-task +: 2$' "$out" ||
  fail "the job step did not get --cpus-per-task 2 (srun's options in $out)"
grep -q "^deloco: syncer on $node:$deloco_port, 2 learners" "$out" || fail "the job did not announce its syncer"
if grep -q 'failed (try' "$out"; then fail "a task failed and was started again: $(grep 'failed (try' "$out")"; fi
no_secrets "$work/run" "after job $job"
keys2=$(job_keys "$job" "$work/run")
for f in syncer.pub allow/learner-0.pub allow/learner-1.pub; do
  ! cmp -s "$keys1/$f" "$keys2/$f" || fail "job $job reused job $first's key $f: a job's keys are its own"
done
[ -z "$(ls -A "$work/node-local")" ] || fail "job $job's tasks left their keys behind: $(ls -A "$work/node-local")"
echo "slurm: keys: jobs $first and $job each published their own public keys ($(basename "$keys1")," \
  "$(basename "$keys2")); no secret key in the run folder; the tasks removed theirs"

python3 - "$work/run" "$steps" <<'PY'
import json, sys
run, steps = sys.argv[1], int(sys.argv[2])
def records(name):
    with open(f"{run}/{name}") as f:
        return [json.loads(l) for l in f if l.strip()]
syncer = records("syncer.jsonl")
started = [r for r in syncer if r["kind"] == "started"]
assert [r["resumed"] for r in started] == [False, True], f"expected a fresh start then one resume: {started}"
resume = started[1]
assert resume["merges"] > 0, f"the second job's syncer resumed from no merge: {resume}"
merges = [r for r in syncer if r["kind"] == "merge"]
counts = [m["merges"] for m in merges]
assert counts == sorted(counts), "merge counts went back"
rejects = [r for r in syncer if r["kind"] == "reject"]
assert not rejects, f"contributions rejected: {rejects[:3]}"
s = json.load(open(f"{run}/summary.json"))
after = [m for m in merges if m["t"] >= resume["t"]]
per = {}
for n in (0, 1):
    lrec = records(f"learner-{n}.jsonl")
    done = [r for r in lrec if r["kind"] == "learner_done"]
    assert done and done[-1]["step"] == steps, f"learner {n} did not finish its {steps} steps: {done[-1:]}"
    restored = [r for r in lrec if r["kind"] == "state_restored" and r["t"] >= resume["t"] - 30]
    assert restored and restored[-1]["step"] > 0, f"learner {n} did not continue from its state: {restored}"
    per[n] = (sum(1 for m in merges if n in m["learners"]), sum(1 for m in after if n in m["learners"]))
    assert per[n][1] > 0, f"learner {n} contributed to no merge of the second job"
retired = {r.get("learner") for r in syncer if r["kind"] == "retired" and r["t"] >= resume["t"]}
assert retired >= {0, 1}, f"not every learner retired: {retired}"
print(f"records: {len(merges)} merges, {resume['merges']} in job 1 and {len(after)} after the resume; "
      + ", ".join(f"learner {n} in {a} ({b} after the resume)" for n, (a, b) in per.items())
      + f"; 0 rejected; final val loss {s.get('final_val_loss')}")
PY
awk -v j="$job" -v r="$runtime" -v a="$t0" -v b="$t1" -v f="$first" 'BEGIN {
  printf "slurm: job %s (resumed after job %s) COMPLETED, exit 0:0, run time %s (submit to end %.1f s)\n", j, f, r, b - a
}'

# Job 3: a syncer of 2 shards (DELOCO_SHARDS=2: tasks 0 and 1 on ports PORT and PORT+1 of this node), 2 learners,
# 1 CPU each, a new run folder. Both shards merge their own fragment with both learners; the script assembles the
# global model at the end.
export DELOCO_SHARDS=2 DELOCO_RUN_DIR=$work/run-sharded
t0=$(date +%s.%N)
job=$(submit 4 1)
jstate=$(wait_end "$job" 120)
t1=$(date +%s.%N)
out=$work/job-$job.out
[ "$jstate" = COMPLETED ] || fail "sharded job $job ended '$jstate' (exit code $(job_field "$job" ExitCode))"
[ "$(job_field "$job" ExitCode)" = 0:0 ] || fail "sharded job $job exit code $(job_field "$job" ExitCode)"
grep -q "^deloco: 2 syncer shards on tcp://$node:$deloco_port,tcp://$node:$((deloco_port + 1)), 2 learners" "$out" ||
  fail "the sharded job did not announce its shards"
if grep -q 'failed (try' "$out"; then fail "a task failed and was started again: $(grep 'failed (try' "$out")"; fi
ls -d "$work"/run-sharded/checkpoints/assembled_* >/dev/null 2>&1 || fail "the sharded job assembled no global model"
no_secrets "$work/run-sharded" "after sharded job $job"   # the shards' shared key went through handoff/, emptied
keys3=$(job_keys "$job" "$work/run-sharded")
[ -e "$keys3/handoff/taken-1" ] || fail "shard 1 did not take the shards' key through handoff/"
[ -z "$(ls -A "$work/node-local")" ] || fail "sharded job $job's tasks left their keys behind: $(ls -A "$work/node-local")"
python3 - "$work/run-sharded" "$steps" <<'PY'
import json, sys
run, steps = sys.argv[1], int(sys.argv[2])
def records(name):
    with open(f"{run}/{name}") as f:
        return [json.loads(l) for l in f if l.strip()]
frags, text = set(), []
for shard in (0, 1):
    merges = [r for r in records(f"shard-{shard}/syncer.jsonl") if r["kind"] == "merge"]
    per = [sum(1 for m in merges if n in m["learners"]) for n in (0, 1)]
    assert all(per), f"shard {shard}: a learner contributed to none of its {len(merges)} merges ({per})"
    mine = {m["fragment"] for m in merges}
    assert not mine & frags, f"shard {shard} merged fragments {mine & frags} of another shard"
    frags |= mine
    text.append(f"shard {shard}: {len(merges)} merges of fragment(s) {sorted(mine)}, learner 0 in {per[0]}, "
                f"learner 1 in {per[1]}")
assert frags == {0, 1}, f"fragments merged: {frags}"
for n in (0, 1):
    done = [r for r in records(f"learner-{n}.jsonl") if r["kind"] == "learner_done"]
    assert done and done[-1]["step"] == steps, f"learner {n} did not finish its {steps} steps: {done[-1:]}"
print("records: " + "; ".join(text))
PY
awk -v j="$job" -v r="$(job_field "$job" RunTime)" -v a="$t0" -v b="$t1" 'BEGIN {
  printf "slurm: sharded job %s COMPLETED, exit 0:0, run time %s (submit to end %.1f s)\n", j, r, b - a
}'
echo "slurm test passed"
