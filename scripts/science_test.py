#!/usr/bin/python3
"""Tests of scripts/science.py's protocol (issue 33), against the built binary's presets and keys:

    /usr/bin/python3 scripts/science_test.py build/deloco

* no reported run uses the tuning seed, every tuning run is on the dev half and every reported run on the test half,
  at the quick and the full scale; every key a planned run sets is one `deloco sim` knows;
* experiment 1 tunes each method at each M (its own setting per M), the variants are tuned on the fast link,
  experiments 3 and 12 tune every row in the setting it is reported in;
* a grid whose best η lies on its edge grows on that side;
* the seeds of each point are fixed before any result (the same for every point, 5 at the full scale), and only
  the tuning runs of the current grids count; a choice at μ's lower edge gets one probe below it, which moves no choice;
* differences pair by seed; the gap to DP "shrinks with size" only when it shrinks at every M (experiment 12);
* rows of runs a defect spoiled (SUPERSEDED) are set aside unless their build has the fix;
* a partial report labels "pending" every claim that rests on a run still to do, and judges the others;
* experiment 8 names the runs that ended above their initial loss (diverged), with K = 1's staleness per bandwidth;
* a variant's rows are those of its own setting under the current plan: a row of the same name under another setting
  (an older plan, an earlier choice, a setting another point shares) neither enters the report nor adds seeds;
* the section on issue 54's faults reads the labels before from a report's claims table and finds each claim's label
  after (by name, renamed, or its section's pending line).
"""
import importlib.util
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("science", os.path.join(HERE, "science.py"))
sci = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sci)
BINARY = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(HERE), "build", "deloco")


class Args:
    deloco = BINARY


def setting(sets):
    return dict(s.split("=", 1) for s in sets)


def quick_plan():
    """The quick scale with the binary's presets: (S, its points, the methods they tune)."""
    S = sci.scale(True, tempfile.gettempdir())
    sci.METHODS.clear()
    sci.load_methods(Args, S)
    pts = sci.plan(S)
    return S, pts, sorted({m for _, _, m, _ in pts if m is not None})


def tune_diloco(res, S):
    """diloco's tuning grid, every point done, its best η at the grid's centre (inside the grid)."""
    lrs, mus = sci.grid(S, "diloco")
    mid = sorted(lrs)[len(lrs) // 2]
    for lr in lrs:
        for mu in mus:
            res.add(dict(exp="tune", variant="diloco", seed=0, key=sci.key_of(sci.tuning_sets(S, "diloco", lr, mu)),
                         final_val_loss=3.0 + abs(lr - mid) + mu))


class Protocol(unittest.TestCase):
    def scales(self):
        for quick in (True, False):
            S = sci.scale(quick, tempfile.gettempdir())
            sci.METHODS.clear()
            sci.load_methods(Args, S)
            pts = sci.plan(S)
            meths = sorted({m for _, _, m, _ in pts if m is not None})
            yield S, pts, meths

    def test_tuning_and_reporting_never_share_a_run(self):
        for S, pts, meths in self.scales():
            runs = sci.planned_runs(S, pts, meths)
            sci.check_keys(Args, [r["sets"] for r in runs])  # exits on an unknown key
            for r in runs:
                d = setting(r["sets"])
                if r["exp"] == "tune":
                    self.assertEqual((d["data.holdout"], d["train.seed"], d["sim.seed"]), ("dev", "0", "0"), r["variant"])
                else:
                    self.assertEqual(d["data.holdout"], "test", r)
                    self.assertNotEqual(int(d["train.seed"]), sci.TUNE_SEED, r)
                    self.assertEqual(d["train.seed"], d["sim.seed"])

    def test_each_m_and_each_variant_is_tuned_where_it_runs(self):
        for S, pts, meths in self.scales():
            for M in S["ms"]:
                for meth in ("diloco", "isoloco"):
                    d = setting(sci.tuning_sets(S, f"{meth}@sync{M}", 1.0, 0.9))
                    self.assertEqual(d["sync.learners"], str(M))
                    self.assertEqual(d["sync.quorum"], str(M))
            for meth in ("mean_fast", "dn_fast", "stale_fast", "dlu_fast", "rda_fast"):
                d = setting(sci.tuning_sets(S, meth, 1.0, 0.9))
                self.assertEqual((d["sync.quorum"], d["sim.bandwidth"]), ("1", sci.FAST_LINK[0].split("=")[1]), meth)
            self.assertEqual(setting(sci.tuning_sets(S, "dn_fast", 1.0, 0.9))["outer.kind"], "delayed_nesterov")
            small = setting(sci.tuning_sets(S, sci.tuned_at("isoloco", ("small", max(S["many_ms"]))), 1.0, 0.8))
            self.assertEqual(small["model.n_embd"], setting(S.get("many_base", S["small"]))["model.n_embd"])
            # Issue 54: experiment 3's rows (the asynchronous variants among them) and experiment 12's are tuned in
            # the very setting they are reported in; experiment 8's take experiment 3's choice on the fast link.
            for exp, v, meth, sets in pts:
                if (exp in ("e3", "e12") or (exp == "e4" and "base anchor" in v)) and "failures" not in v:
                    # (a row with failures is tuned without them: the failures are what it measures)
                    self.assertEqual(sorted(sci.tuning_setting(S, meth)), sorted(sets), (exp, v))
                if exp == "e8":
                    self.assertTrue(meth.split("@")[1].startswith("e3:K=1"), (v, meth))

    def test_a_grid_grows_past_its_edge(self):
        S, _, _ = next(self.scales())
        with tempfile.TemporaryDirectory() as d:
            res = sci.Results(os.path.join(d, "r.jsonl"))
            lrs, mus = sci.grid(S, "mean_sgd")
            for lr in lrs:  # the lowest η is best: the grid must grow downwards
                res.add(dict(exp="tune", variant="mean_sgd", seed=0, key=sci.key_of(sci.tuning_sets(S, "mean_sgd", lr, 0.0)),
                             final_val_loss=lr))
            points, missing, best, edge = sci.tuning_points(res, S, "mean_sgd")
            self.assertEqual(missing, [(round(min(lrs) * S["lr_factors"][0], 4), 0.0)])
            self.assertEqual(best[1], min(lrs))

    def test_the_seeds_are_fixed_before_any_result(self):
        # Every point's seeds are 1..S["seeds"], the same for every point (5 at the full scale), and no result changes
        # them: point_seeds reads no result, and the jobs are the same before and after results that straddle.
        for S, pts, _ in self.scales():
            self.assertEqual({sci.point_seeds(S, e, v) for e, v, _, _ in pts}, {S["seeds"]})
        self.assertEqual(S["seeds"], 5)  # the full scale's, the last of scales()
        S, pts, _ = quick_plan()
        with tempfile.TemporaryDirectory() as d:
            res = sci.Results(os.path.join(d, "r.jsonl"))
            tune_diloco(res, S)
            best = sci.chosen(res, S, ["diloco"])
            before = sorted(sci.key_of(sets) for _, sets in sci.reported_jobs(S, pts, best))
            jobs = {(j["variant"], j["seed"]): sets for j, sets in sci.reported_jobs(S, pts, best) if j["exp"] == "e5"}
            for v, losses in (("fp32", [3.0, 3.1, 2.9]), ("int2", [3.05, 3.05, 3.2])):
                for seed, x in enumerate(losses, 1):  # intervals that straddle their thresholds
                    res.add(dict(exp="e5", variant=v, seed=seed, key=sci.key_of(jobs[(v, seed)]), final_val_loss=x))
            best = sci.chosen(res, S, ["diloco"])
            self.assertEqual(sorted(sci.key_of(sets) for _, sets in sci.reported_jobs(S, pts, best)), before)

    def test_a_choice_at_the_lower_edge_of_mu_gets_one_probe_below_it(self):
        S, pts, _ = list(self.scales())[-1]  # the full scale: μ's grid has two points
        lrs, mus = sci.grid(S, "diloco")
        mid = sorted(lrs)[len(lrs) // 2]
        for sign, probe in ((+1, (mid, round(min(mus) - sci.MU_PROBE_STEP, 2))), (-1, None)):
            with tempfile.TemporaryDirectory() as d:
                res = sci.Results(os.path.join(d, "r.jsonl"))
                for lr in lrs:
                    for mu in mus:  # sign +1: the smallest μ is best; -1: the largest
                        res.add(dict(exp="tune", variant="diloco", seed=0, key=sci.key_of(sci.tuning_sets(S, "diloco", lr, mu)),
                                     final_val_loss=3.0 + abs(lr - mid) + sign * mu))
                self.assertEqual(sci.probe_point(res, S, "diloco"), probe)
                jobs = sci.probe_jobs(res, S, ["diloco"])
                self.assertEqual(len(jobs), 1 if probe else 0)
                if probe:  # on the dev half with the tuning seed, as the grid's runs; the choice stays
                    self.assertEqual(setting(jobs[0][1])["data.holdout"], "dev")
                    self.assertEqual(setting(jobs[0][1])["outer.momentum"], str(probe[1]))
                    res.add(dict(jobs[0][0], key=sci.key_of(jobs[0][1]), final_val_loss=0.0))
                    self.assertEqual(sci.chosen(res, S, ["diloco"])["diloco"][:2], (mid, min(mus)))
                    self.assertEqual(sci.probe_jobs(res, S, ["diloco"])[0][1], jobs[0][1])  # and it is found done
                    self.assertIn(sci.Results.row_id(dict(jobs[0][0], key=sci.key_of(jobs[0][1]))), res.rows)

    def test_only_the_tuning_runs_of_current_grids_count(self):
        S, pts, _ = quick_plan()
        with tempfile.TemporaryDirectory() as d:
            res = sci.Results(os.path.join(d, "r.jsonl"))
            tune_diloco(res, S)
            # A tuning run of an older protocol: a point no grid has now.
            old = sci.tuning_sets(S, "diloco", 123.0, 0.5)
            res.add(dict(exp="tune", variant="diloco", seed=0, key=sci.key_of(old), final_val_loss=1.0))
            best = sci.chosen(res, S, ["diloco"])
            view = sci.plan_rows(S, pts, best, res)
            keys = {r["key"] for r in view.values() if r["exp"] == "tune"}
            self.assertNotIn(sci.key_of(old), keys)
            lrs, mus = sci.grid(S, "diloco")
            self.assertEqual(len(keys), len(lrs) * len(mus))


class PartialReport(unittest.TestCase):
    def test_a_claim_is_pending_while_a_run_it_rests_on_is_to_do(self):
        with tempfile.TemporaryDirectory() as d:
            res = sci.Results(os.path.join(d, "r.jsonl"))
            for seed, (a, b) in enumerate([(3.0, 2.5), (3.1, 2.6), (2.9, 2.4)], 1):
                res.add(dict(exp="e1", variant="a", seed=seed, key=f"a{seed}", final_val_loss=a))
                res.add(dict(exp="e1", variant="b", seed=seed, key=f"b{seed}", final_val_loss=b))
            claims = sci.Claims({("e1", "b"): 1, ("e9", "c"): 3})
            claims.section("experiment 1")
            sci.seeds_sorted(res, "e1", "a"), sci.seeds_sorted(res, "e1", "b")
            claims.append(("a beats b", "reproduced", "a − b = +0.5."))
            claims.section("experiment 2")
            sci.seeds_sorted(res, "e1", "a")
            claims.append(("a is a", "partly", "why."))
            claims.section("experiment 9")
            sci.seeds_sorted(res, "e9", "c")  # no rows: the section forms no claim
            claims.close()
            self.assertEqual([c[:2] for c in claims], [("a beats b", "pending"), ("a is a", "partly"),
                                                      ("experiment 9: its claims", "pending")])
            self.assertIn("1 run still to do (e1 b); on the rows so far: reproduced, a − b = +0.5.", claims[0][2])
            self.assertIn("3 runs still to do (e9 c)", claims[2][2])

    def test_the_report_judges_complete_points_and_holds_the_rest(self):
        S, pts, meths = quick_plan()
        with tempfile.TemporaryDirectory() as d:
            res = sci.Results(os.path.join(d, "r.jsonl"))
            self.assertTrue(all(sci.pending_points(res, S, pts, meths).get(p[:2]) for p in pts))
            tune_diloco(res, S)
            best = sci.chosen(res, S, meths)
            loss = {"fp32": [3.0, 3.1, 2.9], "bf16": [3.0, 3.1, 2.9], "int8": [3.0, 3.1, 2.9],
                    "int4": [3.0, 3.1, 2.9], "int2": [3.2, 3.31, 3.1]}
            for job, sets in sci.reported_jobs(S, pts, best):
                if job["exp"] == "e5" and job["variant"] in loss:
                    res.add(dict(job, key=sci.key_of(sets), sets=sets, final_val_loss=loss[job["variant"]][job["seed"] - 1]))
            pending = sci.pending_points(res, S, pts, meths)
            self.assertNotIn(("e5", "int2"), pending)
            self.assertNotIn(("tune", "diloco"), pending)
            self.assertEqual(pending[("e1", "diloco M=1")], S["seeds"])
            self.assertIn(("e5", "top-k 3% both ways"), pending)  # mean_sgd is not tuned
            doc = os.path.join(d, "science.md")
            sci.RESULTS_FILE = res.path
            sci.report(res, S, best, True, d, doc, os.path.join(d, "plots"), pending)
            text = open(doc).read()
            self.assertIn("A partial report", text)
            table = dict((c.strip(), l.strip(" *")) for c, l in
                         (line.split("|")[1:3] for line in text.split("## The claims")[1].splitlines() if line.startswith("| ")
                          and not line.startswith("| claim")))
            self.assertEqual(table["int4 stays lossless"], "reproduced")
            self.assertEqual(table["2-bit hurts"], "reproduced")
            self.assertEqual(table["experiment 1: its claims"], "pending")
            self.assertNotIn("*2-bit hurts*", text)  # no shortfall note for a reproduced claim

    def test_a_run_that_ends_above_its_initial_loss_is_reported_as_diverged(self):
        S, pts, meths = quick_plan()
        slow, fast = (f"{bw / 1e6:g} MB/s" for bw in sci.SWEEP_BANDWIDTHS[:2])
        with tempfile.TemporaryDirectory() as d:
            res = sci.Results(os.path.join(d, "r.jsonl"))
            for seed in (1, 2, 3):
                for v, x, st in ((slow, [9.5, 3.0, 3.1][seed - 1], 16.0), (slow + " + grace", 3.0, 15.0),
                                 (fast, 3.0, 2.0), (fast + " + grace", 2.9, 1.5)):
                    res.add(dict(exp="e8", variant=v, seed=seed, key=f"{v}{seed}", final_val_loss=x,
                                 initial_val_loss=5.5, staleness_mean=st, goodput=0.8))
            doc = os.path.join(d, "science.md")
            sci.RESULTS_FILE = res.path
            sci.report(res, S, {}, True, d, doc, os.path.join(d, "plots"), sci.pending_points(res, S, pts, meths))
            e8 = open(doc).read().split("## 8.")[1].split("## 9.")[0]
            self.assertIn(f"Ended above their initial loss (diverged): {slow}: 1 of 3 seeds (final loss 9.50; "
                          "initial about 5.50).", e8)
            self.assertNotIn(fast + ":", e8.split("Ended above")[1])  # the runs that did not diverge are not named
            self.assertIn("| 16.0 ± 0.0 |", e8)  # K = 1's staleness at the slow link


class PlanRows(unittest.TestCase):
    def test_a_variant_reads_only_the_rows_of_its_own_setting(self):
        S, pts, _ = quick_plan()
        with tempfile.TemporaryDirectory() as d:
            res = sci.Results(os.path.join(d, "r.jsonl"))
            tune_diloco(res, S)
            best = sci.chosen(res, S, ["diloco"])
            jobs = {(j["variant"], j["seed"]): (j, sets) for j, sets in sci.reported_jobs(S, pts, best) if j["exp"] == "e5"}
            for v, losses in (("fp32", [3.0, 3.1, 2.9]), ("int4", [3.0, 3.1, 2.9])):
                for seed, x in enumerate(losses, 1):
                    j, sets = jobs[(v, seed)]
                    res.add(dict(j, key=sci.key_of(sets), sets=sets, final_val_loss=x))
            # Rows named like int4's under settings that are not int4's now: fp32's (a setting another point has, as
            # experiment 2's DiLoCo is for experiment 1's name at M = 8) and an older plan's, with a fourth seed.
            for seed, x in enumerate([9.0, 9.0, 9.0, 9.0], 1):
                foreign = jobs[("fp32", seed)][1] if seed <= 3 else jobs[("fp32", 1)][1] + ["model.n_layer=99"]
                res.add(dict(exp="e5", variant="int4", seed=seed, key=sci.key_of(foreign), final_val_loss=x))
            self.assertEqual(len(sci.seeds_sorted(res, "e5", "int4")), 7)  # the file holds them all
            view = res.view(sci.plan_rows(S, pts, best, res))
            self.assertEqual(sci.seeds_sorted(view, "e5", "int4"), [3.0, 3.1, 2.9])
            self.assertEqual(sci.seeds_sorted(view, "e5", "fp32"), [3.0, 3.1, 2.9])
            self.assertEqual(len(res.rows), len(sci.Results(res.path).rows))  # a view leaves the results as they are
            # The stray fourth seed adds nothing: int4's seeds were fixed before any result.
            self.assertEqual(max(j["seed"] for j, _ in sci.reported_jobs(S, pts, best)
                                 if (j["exp"], j["variant"]) == ("e5", "int4")), sci.point_seeds(S, "e5", "int4"))


class BeforeAndAfter(unittest.TestCase):
    """The section on issue 54's faults (scripts/science_before.py): the labels before, parsed from a report's claims
    table, and each claim's label after, found under its name now, a renamed one's, or its section's pending line."""

    TABLE = ("# x\n\n## The claims\n\n| claim | label | why |\n|---|---|---|\n"
             "| IsoLoCo beats DiLoCo averaging | **reproduced** | lower at every M. |\n"
             "| 2-bit hurts | **not reproduced** | int2 − fp32 = -0.0115 ± 0.0104. |\n\nRules of the labels.\n")

    def test_the_claims_table_parses_and_a_broken_row_is_refused(self):
        b = sci.science_before
        self.assertEqual(b.parse_claims(self.TABLE),
                         [("IsoLoCo beats DiLoCo averaging", "reproduced", "lower at every M."),
                          ("2-bit hurts", "not reproduced", "int2 − fp32 = -0.0115 ± 0.0104.")])
        with self.assertRaises(ValueError):
            b.parse_claims(self.TABLE.replace("**reproduced**", "reproduced"))
        with self.assertRaises(ValueError):
            b.parse_claims("# no claims here\n")

    def test_every_claim_the_faults_name_is_a_claim_before(self):
        b = sci.science_before
        before = b.load_before()
        self.assertIsNotNone(before, "docs/science/labels-before.json is missing")
        names = {c for c, _, _ in before[1]}
        for _, _, claims in b.FAULTS:
            for c in claims or []:
                self.assertIn(c, names)
        for claims in b.SECTIONS.values():
            for c in claims:
                self.assertIn(c, names)
        for c in b.RENAMED:
            self.assertIn(c, names)
        # Every claim before has a section, so that a pending section is found for it.
        self.assertEqual(names - {c for cs in b.SECTIONS.values() for c in cs}, set())

    def test_a_claim_after_is_found_by_name_renamed_or_by_its_pending_section(self):
        b = sci.science_before
        now = {"IsoLoCo beats DiLoCo averaging": ("pending", "44 runs still to do (e1 x); on the rows so far: "
                                                             "reproduced, lower."),
               "the 10-step Newton–Schulz Iso-C (fp32) loses no quality against exact Iso-C": ("reproduced", "ok."),
               "experiment 3: its claims": ("pending", "36 runs still to do (e3 K=1); too few rows to judge yet.")}
        self.assertEqual(b.after("IsoLoCo beats DiLoCo averaging", now)[0][1], "pending")
        self.assertEqual(b.short(*now["IsoLoCo beats DiLoCo averaging"]), "**pending** (44 runs to do; so far *reproduced*)")
        renamed = b.after("the fast (Newton–Schulz) Iso-C loses no quality against exact Iso-C", now)
        self.assertEqual([n for n, _, _ in renamed], ["the 10-step Newton–Schulz Iso-C (fp32) loses no quality against exact Iso-C"])
        sec = b.after("the grace window keeps quality close to K = M", now)
        self.assertEqual(sec[0][0], "experiment 3: its claims")
        self.assertEqual(b.short(*sec[0][1:]), "**pending** (36 runs to do)")
        self.assertEqual(b.after("2-bit hurts", now), [])
        # A claim its section has not formed while the section's other claims are pending: pending too.
        now["IsoLoCo beats DiLoCo at 32 outer rounds"] = ("pending", "20 runs still to do (e9 DiLoCo); on the rows so "
                                                                     "far: reproduced, lower.")
        unformed = b.after("Decoupled DiLoCo with failures matches DP without at 32 outer rounds", now)
        self.assertEqual([a for _, a, _ in unformed], ["pending"])
        self.assertEqual(b.faults_of("the IsoLoCo gap keeps widening up to M = 64"), [1, 7, 9])


class PairVerdict(unittest.TestCase):
    """Faults 2 and 4's rule: the worse side diverges in more runs, or ends higher with its interval apart from zero
    somewhere and on the other side nowhere; no verdict while a pair is incomplete or missing."""

    def rows(self, a_minus_b, div_a=0, div_b=0, done=True):
        b = [3.0, 3.1, 2.9, 3.05, 2.95]
        noise = [0.01, -0.012, 0.02, -0.018, 0.0]  # the paired differences' spread across seeds
        return [("e4", f"a{i}", f"b{i}", [x + a_minus_b + e for x, e in zip(b, noise)], b,
                 div_a if i == 0 else 0, div_b if i == 0 else 0, done) for i in range(3)]

    def test_the_verdict_follows_the_rule(self):
        w = sci.science_before.worse
        self.assertEqual(w(self.rows(-0.1), 3), "b")   # a lower, intervals below zero: b is the worse
        self.assertEqual(w(self.rows(+0.1), 3), "a")
        self.assertEqual(w(self.rows(0.0), 3), "neither")  # within the seeds' spread
        self.assertEqual(w(self.rows(+0.1, div_b=2), 3), "b")  # divergence counts first
        self.assertIsNone(w(self.rows(-0.1, done=False), 3))
        self.assertIsNone(w(self.rows(-0.1), 4))  # a pair without rows yet


class Statistics(unittest.TestCase):
    def test_differences_pair_by_seed(self):
        with tempfile.TemporaryDirectory() as d:
            res = sci.Results(os.path.join(d, "r.jsonl"))
            for seed, a, b in ((1, 3.0, 2.0), (2, 3.5, None), (3, 4.0, 3.0), (5, 5.0, 4.0)):  # b lacks seed 2
                res.add(dict(exp="e1", variant="a", seed=seed, key=f"a{seed}", final_val_loss=a))
                if b is not None:
                    res.add(dict(exp="e1", variant="b", seed=seed, key=f"b{seed}", final_val_loss=b))
            a, b = sci.seeds_sorted(res, "e1", "a"), sci.seeds_sorted(res, "e1", "b")
            self.assertEqual(sci.diff_ci(a, b), (1.0, 0.0))  # by position it would pair 3.5 with 3.0
            self.assertEqual(list(sci.rel_gaps(a, b)), [0.5, 1 / 3, 0.25])

    def test_a_gap_widens_by_its_paired_change(self):
        # The gap's intervals at the two ends overlap, but per seed it grows by 0.1 ± 0.001: reproduced.
        lo = sci.BySeed([0.30, 0.50, 0.70, 0.40, 0.60], range(1, 6))
        hi = sci.BySeed([x + 0.1 + 0.001 * i for i, x in enumerate(lo)], range(1, 6))
        zero = sci.BySeed([0.0] * 5, range(1, 6))
        gaps = [(1, *sci.mean_ci(lo), sci.deltas(lo, zero)), (8, *sci.mean_ci(hi), sci.deltas(hi, zero))]
        self.assertLess(gaps[1][1] - gaps[1][2], gaps[0][1] + gaps[0][2])
        self.assertEqual(sci.widens("c", gaps)[1], "reproduced")
        self.assertEqual(sci.widens("c", gaps[::-1])[1], "not reproduced")

    def test_the_gap_to_dp_shrinks_only_when_it_shrinks_at_every_m(self):
        S, _, _ = quick_plan()
        names = [z["name"] for z in sci.sizes(S)]
        for g8, want in ((0.01, "reproduced"), (0.23, "not reproduced")):  # M = 8's gap at the largest size
            with tempfile.TemporaryDirectory() as d:
                res = sci.Results(os.path.join(d, "r.jsonl"))
                for seed, dp in enumerate([2.0, 2.1, 1.9, 2.05, 1.95], 1):
                    for n, gaps in ((names[0], {2: 0.10, 4: 0.12, 8: 0.19}), (names[-1], {2: 0.02, 4: 0.05, 8: g8})):
                        for M, g in gaps.items():
                            for v, x in ((f"DP ×{M}", dp), (f"DiLoCo M={M}", dp * (1 + g + 0.001 * seed))):
                                res.add(dict(exp="e12", variant=f"{n} {v}", seed=seed, key=f"{n}{v}{seed}", final_val_loss=x))
                claims = sci.Claims({})
                sci.e12(res, S, lambda line: None, claims)
                got = {c: lab for c, lab, _ in claims}
                self.assertEqual(got["DiLoCo's relative gap to DP (same global batch) decreases as the model grows, "
                                     "for M ≥ 2 (Charles et al. 2025)"], want)


class SetAside(unittest.TestCase):
    def test_rows_of_a_spoiled_run_are_set_aside_unless_built_with_the_fix(self):
        fix, why, meets = sci.SUPERSEDED[0]
        muon = ["merge.preset=muloco", "model.n_embd=64"]  # V = 256 = 4 × 64
        self.assertTrue(meets(muon))
        self.assertFalse(meets(["merge.preset=muloco", "model.n_embd=48"]))
        self.assertFalse(meets(["merge.preset=diloco", "model.n_embd=64"]))
        self.assertTrue(meets(["merge.preset=diloco", "train.optimizer=muon"]))  # configs/sim-diloco.toml: 4 × 64 = 256
        self.assertFalse(meets(["merge.preset=diloco", "train.optimizer=muon", "model.n_embd=96"]))
        grace = sci.SUPERSEDED[1][2]  # failures under the grace window
        self.assertTrue(grace(["sim.mtbf=100", "sync.grace=true"]))
        self.assertFalse(grace(["sim.mtbf=100", "sync.grace=false"]))
        self.assertFalse(grace(["sim.mtbf=0", "sync.grace=true"]))
        with tempfile.TemporaryDirectory() as d:
            res = sci.Results(os.path.join(d, "r.jsonl"))
            for i, build in enumerate([None, fix + "~1", fix, fix + "+changes", "unknown", "0" * 40]):
                res.add(dict(exp="e12", variant="x", seed=i + 1, key=f"k{i}", sets=muon, final_val_loss=1.0,
                             **({"_build": build} if build else {})))
            res.add(dict(exp="e12", variant="y", seed=1, key="k9", sets=["merge.preset=diloco"], final_val_loss=1.0))
            again = sci.Results(res.path)
            # Kept: the builds with the fix, and those whose ancestry cannot be told (set aside, they would rerun forever).
            self.assertEqual(sorted(r["seed"] for r in again.rows.values() if r["variant"] == "x"), [3, 4, 5, 6])
            self.assertEqual(again.set_aside, {why: 2})
            self.assertEqual(len(again.rows), 5)


class Provenance(unittest.TestCase):
    """Each row records the machine and the build it ran on; the report counts the rows in use by machine."""

    def test_rows_are_counted_by_machine_and_a_build_outside_git_is_unknown(self):
        self.assertIn("cores", sci.machine())
        self.assertEqual(sci.build_of(tempfile.gettempdir()), "unknown")
        with tempfile.TemporaryDirectory() as d:
            res = sci.Results(os.path.join(d, "r.jsonl"))
            for i, m in enumerate(["cpu A; avx2; 2 cores", "cpu A; avx2; 2 cores", None]):
                res.add(dict(exp="e1", variant="x", seed=i + 1, key=f"k{i}", final_val_loss=1.0,
                             **({"_machine": m, "_build": "abc123"} if m else {})))
            line = sci.provenance(res)
            self.assertIn("2 on cpu A; avx2; 2 cores", line)
            self.assertIn("1 whose machine was not recorded", line)
            self.assertIn("builds abc123", line)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=1)
