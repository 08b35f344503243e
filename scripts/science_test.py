#!/usr/bin/python3
"""Tests of scripts/science.py's protocol (issue 33), against the built binary's presets and keys:

    /usr/bin/python3 scripts/science_test.py build/deloco

* no reported run uses the tuning seed, every tuning run is on the dev half and every reported run on the test half,
  at the quick and the full scale; every key a planned run sets is one `deloco sim` knows;
* experiment 1 tunes each method at each M (its own setting per M), the variants are tuned on the fast link;
* a grid whose best η lies on its edge grows on that side;
* more seeds only where a decisive comparison's interval contains its threshold, and seeds once added stay reported.
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
            self.assertEqual(small["model.n_embd"], setting(S["small"])["model.n_embd"])

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

    def test_more_seeds_only_where_an_interval_is_too_wide(self):
        S, _, _ = next(self.scales())
        with tempfile.TemporaryDirectory() as d:
            res = sci.Results(os.path.join(d, "r.jsonl"))

            def put(exp, variant, losses):
                for seed, x in enumerate(losses, 1):
                    res.add(dict(exp=exp, variant=variant, seed=seed, key=f"{exp}{variant}{seed}", final_val_loss=x))
            put("e5", "fp32", [3.0, 3.1, 2.9])
            put("e5", "int4", [3.0, 3.1, 2.9])        # int4 − fp32 = 0 ± 0: wholly below the 0.02 margin
            put("e5", "int2", [3.05, 3.05, 3.05])     # int2 − fp32 = +0.05 ± 0.25: contains 0
            c = sci.seed_counts(S, res)
            self.assertNotIn(("e5", "int4"), c)
            self.assertEqual((c[("e5", "int2")], c[("e5", "fp32")]), (4, 4))
            put("e5", "int2", [3.05, 3.05, 3.05, 3.2])
            put("e5", "fp32", [3.0, 3.1, 2.9, 3.0])
            self.assertEqual(sci.seed_counts(S, res)[("e5", "int2")], 5)
            put("e5", "int2", [3.05, 3.05, 3.05, 3.2, 3.0])
            put("e5", "fp32", [3.0, 3.1, 2.9, 3.0, 3.0])
            self.assertEqual(sci.seed_counts(S, res)[("e5", "int2")], 5)  # at MAX_SEEDS: no more, the 5 stay


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=1)
