#!/usr/bin/python3
"""Network faults on the testbed, scheduled by `deloco run`'s chaos (chaos.net): ctest testbed.net_* (docs/testbed.md).

    net_fault_test.py CASE [DELOCO]      CASE: partition-learner | partition-syncer | flap | slow

Each case makes a testbed (20 Mbit/s links, the syncer on host 0, learners 0 and 1 on hosts 1 and 2), runs the tiny
model across it with one network fault in chaos.net, waits (bounded polling of the run's records) until the faulted
learners contribute to a merge again after the heal, stops the run (SIGINT) and checks from the records:
  * the fault happened as scheduled: its net_fault start and end records, the testbed commands succeeded, the
    summary lists it;
  * the other learner kept training and merging during the fault (merges in both halves of it); when the syncer's
    host is cut off nobody can merge, so there every learner kept stepping instead, and no merge happened;
  * the faulted learner was contributing before the fault and contributes again after the heal on its own (nobody
    restarts it): a merge that includes it after its first push sent after the heal (and after its join again, when
    it noticed it had lost the syncer);
  * merge counts never go back; no push is rejected (no reject record);
and prints the time from the heal to the learner's next contribution ("RESULT {json}" at the end).
partition-syncer also leaves two faults on an idle host 3 running when the run ends and checks that `deloco run`
healed them (link up, its own rate back) before exiting.

Skips (77) where no testbed can be made (not root). Takes /tmp/deloco-testbed.lock (one testbed at a time on a
machine: testbeds share 198.18.255.254; it waits up to DELOCO_TESTBED_LOCK_WAIT = 300 s for it) and removes its
testbed on every exit. KEEP=1 keeps the run folder.
"""
import ctypes
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TB = os.path.join(ROOT, "scripts", "testbed.sh")
AT = 12.0          # seconds after the run's start when the fault begins (the learners contribute by then)
DEAD_AFTER = 5     # net.dead_after: a learner gives the syncer up after this long without a word
# Seconds to wait for another testbed on this machine to be done (DELOCO_TESTBED_LOCK_WAIT; within ctest's timeout).
LOCK_WAIT = float(os.environ.get("DELOCO_TESTBED_LOCK_WAIT", "300"))
BACK_WITHIN = 90   # seconds after the heal within which a faulted learner must contribute again

# Per case: testbed hosts, chaos.net, the main fault (kind, host), the faulted and the other learners.
CASES = {
    "partition-learner": dict(hosts=3, net=f"partition learner=1 at={AT:g} for=30", kind="partition", host=2,
                              duration=30, faulted=[1], others=[0]),
    "partition-syncer": dict(hosts=4, net=f"partition host=0 at={AT:g} for=20; "
                                          f"partition host=3 at=2 for=1000; slow host=3 at=2 for=1000",
                             kind="partition", host=0, duration=20, faulted=[0, 1], others=[]),
    "flap": dict(hosts=3, net=f"flap learner=1 at={AT:g} for=20 period=4", kind="flap", host=2, duration=20,
                 faulted=[1], others=[0]),
    "slow": dict(hosts=3, net=f"slow learner=1 at={AT:g} for=60 factor=100", kind="slow", host=2, duration=60,
                 faulted=[1], others=[0]),
}


class Fail(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Fail(what)


sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts"))
from jsonl_records import read as records  # noqa: E402  (a line still being written is left for later)


def tb(*args, env, check_rc=True):
    r = subprocess.run([TB, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    if check_rc and r.returncode != 0:
        raise Fail(f"scripts/testbed.sh {' '.join(args)} failed: {r.stdout.strip()}")
    return r.stdout


def die_with_parent():
    """preexec: `deloco run` gets SIGTERM when this driver dies (it then stops its children and heals the links)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Run:
    """The records of a run folder, read afresh on each load()."""

    def __init__(self, folder):
        self.dir = folder

    def load(self):
        self.events = records(os.path.join(self.dir, "events.jsonl"))
        self.faults = [r for r in self.events if r.get("kind") == "net_fault"]
        self.syncer = records(os.path.join(self.dir, "syncer.jsonl"))
        self.merges = [r for r in self.syncer if r.get("kind") == "merge"]
        self.learner = {n: records(os.path.join(self.dir, f"learner-{n}.jsonl")) for n in (0, 1)}
        return self

    def fault_phase(self, case, phase):
        for r in self.faults:
            if r.get("fault") == case["kind"] and r.get("host") == case["host"] and r.get("phase") == phase:
                return r
        return None

    def of(self, n, kind):
        return [r for r in self.learner[n] if r.get("kind") == kind]

    def merges_with(self, n, lo, hi):
        return [m for m in self.merges if lo < m["t"] < hi and n in m.get("learners", [])]

    def back(self, n, start, heal):
        """Learner n contributing again after the heal: (join, push, merge) records, merge None while not yet."""
        lost = [r for r in self.of(n, "syncer_lost") if start <= r["t"] <= heal]
        joins_before = [r for r in self.of(n, "joined") if lost and lost[-1]["t"] < r["t"] <= heal]
        join = None
        after = heal
        if lost and not joins_before:  # it gave the syncer up and had not joined again when the link healed
            joins = [r for r in self.of(n, "joined") if r["t"] > heal]
            if not joins:
                return None, None, None
            join = joins[0]
            after = join["t"]
        pushes = [r for r in self.of(n, "push") if r["t"] > after]
        if not pushes:
            return join, None, None
        merges = [m for m in self.merges if m["t"] >= pushes[0]["t"] and n in m.get("learners", [])]
        return join, pushes[0], merges[0] if merges else None


def steps_during(run, n, lo, hi):
    steps = [r["step"] for r in run.of(n, "learner") if lo < r["t"] < hi and isinstance(r.get("step"), int)]
    return (max(steps) - min(steps)) if len(steps) >= 2 else 0


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in CASES:
        print(__doc__)
        return 2
    name = sys.argv[1]
    case = CASES[name]
    deloco = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "build", "deloco"))
    os.chdir(ROOT)
    if subprocess.run([TB, "check"]).returncode != 0:
        print("testbed net fault test skipped")
        return 77
    t_begin = time.time()
    # One testbed at a time on this machine (ctest's RESOURCE_LOCK only orders ctest's own tests).
    lock = open("/tmp/deloco-testbed.lock", "w")
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.time() - t_begin > LOCK_WAIT:
                raise Fail(f"another testbed held /tmp/deloco-testbed.lock for {LOCK_WAIT:g} s")
            time.sleep(1)
    waited = time.time() - t_begin
    if waited > 1:
        print(f"waited {waited:.0f} s for /tmp/deloco-testbed.lock")
    env = dict(os.environ, TESTBED_NAME=f"nf{os.getpid() % 10000000}")
    out = tempfile.mkdtemp(prefix=f"deloco-{name}-")
    run_dir = os.path.join(out, "run")
    log_path = os.path.join(out, "run.log")
    print(f"run folder: {run_dir}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # ctest's timeout: clean up below
    proc = None
    try:
        tb("up", "--hosts", str(case["hosts"]), "--rate", "20mbit", env=env)
        cmd = [deloco, "run", "--config", "configs/tiny.toml",
               "--set", f"syncer.out_dir={run_dir}", "--set", f"testbed.name={env['TESTBED_NAME']}",
               "--set", "sync.learners=2", "--set", "sync.quorum=1", "--set", "sync.fragments=2",
               "--set", "sync.sync_every=10", "--set", "train.steps=1000000", "--set", "train.lr=1e-3",
               "--set", "train.threads=1",
               "--set", f"net.dead_after={DEAD_AFTER}", "--set", "chaos.enabled=true", "--set", f"chaos.net={case['net']}"]
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent,
                                    env=dict(env, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE"))
        run = Run(run_dir)

        def wait_for(what, deadline, cond):
            while True:
                run.load()
                got = cond()
                if got:
                    return got
                if proc.poll() is not None:
                    raise Fail(f"deloco run exited ({proc.returncode}) before {what}")
                if time.time() > deadline:
                    raise Fail(f"timed out waiting for {what}")
                time.sleep(0.2)

        t0 = time.time()
        end_rec = wait_for(f"the {case['kind']} of host {case['host']} to end", t0 + AT + case["duration"] + 60,
                           lambda: run.fault_phase(case, "end"))
        heal, cut = end_rec["t"], run.fault_phase(case, "start")["t"]
        wait_for("the faulted learners to contribute again after the heal", heal + BACK_WITHIN,
                 lambda: all(run.back(n, cut, heal)[2] for n in case["faulted"]))
        time.sleep(2)  # a little of the run after the recovery, for the checks of merge order and rejects
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            raise Fail("deloco run did not stop within 60 s of SIGINT")
        result = verify(name, case, run.load(), env)
        result["test_seconds"] = round(time.time() - t_begin, 1)
        print("RESULT " + json.dumps(result))
        print(f"testbed net fault test {name} passed")
        return 0
    except Fail as e:
        print(f"FAIL ({name}): {e}", file=sys.stderr)
        try:
            with open(log_path) as f:
                print("".join(f.readlines()[-30:]), file=sys.stderr)
        except OSError:
            pass
        return 1
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        tb("down", env=env, check_rc=False)
        if not os.environ.get("KEEP"):
            shutil.rmtree(out, ignore_errors=True)


def verify(name, case, run, env):
    start, end = run.fault_phase(case, "start"), run.fault_phase(case, "end")
    check(start and end, f"no net_fault start and end records of the {case['kind']} of host {case['host']}")
    bad = [r for r in run.faults if not r.get("ok")]
    check(not bad, f"testbed commands failed: {bad[:3]}")
    cut, heal = start["t"], end["t"]
    check(abs((heal - cut) - case["duration"]) < 3,
          f"the fault lasted {heal - cut:.1f} s, not {case['duration']} s")
    check(abs(start["at"] - AT) < 1e-6, f"the fault was due at {start['at']} s, not {AT} s")
    expected = {"partition": ("link down", "link up"), "flap": ("link down", "link up"),
                "slow": ("rate 200kbit", "rate 20mbit")}[case["kind"]]
    check((start["action"], end["action"]) == expected,
          f"the fault did {start['action']!r} .. {end['action']!r}, not {expected}")
    if case["kind"] == "flap":
        toggles = [r["phase"] for r in run.faults if r.get("fault") == "flap" and cut <= r["t"] <= heal]
        check(toggles.count("down") >= 3 and toggles.count("up") >= 3, f"the link did not flap: {toggles}")
    try:
        summary = json.load(open(os.path.join(run.dir, "summary.json")))
    except (OSError, ValueError) as e:
        raise Fail(f"no summary.json: {e}")
    check("interrupted" in summary, "the run was not the one this test interrupted")
    listed = [f for f in summary.get("net_faults", []) if f.get("fault") == case["kind"] and f.get("host") == case["host"]]
    check(listed and listed[0]["started"] and listed[0]["ended"], f"summary net_faults: {summary.get('net_faults')}")

    # No merge lost, no honest push rejected.
    counts = [m["merges"] for m in run.merges if isinstance(m.get("merges"), int)]
    check(counts and counts == sorted(counts), "merge counts went back")
    # A heartbeat queued before the cut can reach the syncer on the learner's new connection ahead of its hello; the
    # syncer answers it "not_joined: say hello first" (fragment -1: it carried no push), which is how a reconnected
    # learner learns to say hello. That nudge is part of rejoining, not a refused push.
    rejects = [r for r in run.syncer if r.get("kind") == "reject"
               and not (r.get("reason") == "not_joined" and r.get("fragment", -1) < 0)]
    check(not rejects, f"pushes rejected: {rejects[:3]}")
    check(summary.get("contributions_rejected", 0) == 0, f"summary: {summary.get('contributions_rejected')} rejected")

    result = {"case": name, "fault_seconds": round(heal - cut, 1), "learners": {}}
    mid = (cut + heal) / 2
    for n in case["others"]:  # the others kept training and merging
        first, second = run.merges_with(n, cut, mid), run.merges_with(n, mid, heal)
        check(first and second, f"learner {n} did not keep merging during the fault "
                                f"({len(first)} merges in its first half, {len(second)} in its second)")
        result["learners"][n] = {"merges_during_fault": len(first) + len(second)}
    silent = cut + DEAD_AFTER + 1  # by then a cut-off link has carried its last pushes
    if case["kind"] == "partition":
        for n in case["faulted"]:
            lost = [r for r in run.of(n, "syncer_lost") if cut < r["t"] < heal]
            check(lost, f"learner {n} did not notice the partition (no syncer_lost record during it)")
            stepped = steps_during(run, n, silent, heal)
            check(stepped > 0, f"learner {n} did not train on while cut off")
        alone = [m for m in run.merges if silent < m["t"] < heal and set(m["learners"]) & set(case["faulted"])]
        check(not alone, f"merges took pushes of cut-off learners during the partition: {alone[:2]}")
    if name == "partition-syncer":
        during = [m for m in run.merges if silent < m["t"] < heal]
        check(not during, f"{len(during)} merges while the syncer's host was cut off")
        check_healed_at_exit(run, env, host=3)

    for n in case["faulted"]:
        before = run.merges_with(n, 0, cut)
        check(before, f"learner {n} had not contributed before the fault began (raise AT)")
        join, push, merge = run.back(n, cut, heal)
        check(merge, f"learner {n} did not contribute again after the heal")
        info = {"heal_to_contribution": round(merge["t"] - heal, 1), "heal_to_push": round(push["t"] - heal, 1),
                "merges_during_fault": len(run.merges_with(n, cut, heal)),
                "lost_syncer": bool([r for r in run.of(n, "syncer_lost") if cut < r["t"] < heal])}
        if join:
            info["heal_to_join"] = round(join["t"] - heal, 1)
        result["learners"][n] = info
        print(f"learner {n}: " + (f"joined again {info['heal_to_join']} s after the heal, " if join else "") +
              f"first push after the heal at +{info['heal_to_push']} s, contributed to a merge again "
              f"{info['heal_to_contribution']} s after the heal ({info['merges_during_fault']} merges with it "
              f"during the fault{', it had lost the syncer' if info['lost_syncer'] else ''})")
    for n in case["others"]:
        print(f"learner {n}: {result['learners'][n]['merges_during_fault']} merges during the {case['kind']}")
    print(f"{len(run.merges)} merges, merge counts in order, 0 rejected")
    return result


def check_healed_at_exit(run, env, host):
    """Faults still on when the run ended: healed by `deloco run` (records, the link and the rate as they are now)."""
    ends = [r for r in run.faults if r.get("host") == host and r.get("phase") == "end"]
    check(len(ends) == 2 and all("ended during" in (r.get("detail") or "") for r in ends),
          f"host {host}'s faults were not healed as the run ended: {ends}")
    state = open(f"/run/{env['TESTBED_NAME']}.testbed").read()
    check(f"rate{host}=20mbit\n" in state, f"host {host}'s rate was not restored: {state!r}")
    ns = f"{env['TESTBED_NAME']}-h{host}"
    oper = subprocess.run(["ip", "netns", "exec", ns, "cat", "/sys/class/net/eth0/operstate"],
                          stdout=subprocess.PIPE, text=True).stdout.strip()
    check(oper == "up", f"host {host}'s link is {oper!r} after the run, not up")
    qdisc = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", "eth0"],
                           stdout=subprocess.PIPE, text=True).stdout
    check("20Mbit" in qdisc, f"host {host}'s qdisc after the run: {qdisc.strip()}")
    print(f"host {host}: its partition and slow link, still on when the run ended, were healed (link up, 20mbit)")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Fail as e:
        print(f"FAIL: {e}", file=sys.stderr)
        sys.exit(1)
