#!/usr/bin/env python3
"""The papers' claims in the deterministic simulator, with seeds, tuning and 95% intervals (issue 14).

    scripts/science.py [--quick] [--out DIR] [--jobs N] [--deloco PATH] [--only e1,e3] [--report-only] [--plan]
                       [--doc FILE]

Every point is one `deloco sim` run (the algorithm core under a virtual clock). A point's result is one JSON line
in the results file (--quick: DIR/results.jsonl; the full suite: docs/science/results-full.jsonl, kept in the
repository so that its hours add up across sessions); a point already there is not run again, so an interrupted
suite continues where it stopped and the report can be regenerated from the results alone (--report-only).

Rules (issues 14 and 33):
  * seeds: every reported point runs seeds 1..`seeds` (train.seed and sim.seed both = the seed; 5 at the full scale),
    fixed before any result and alike for every point (issue 54); the tables give the mean and the 95% interval of
    the mean (Student's t over the seeds; differences over the seeds both points have, paired by seed);
  * tuning: each method's outer learning rate (and momentum, for Nesterov, where the method is first tuned) is chosen
    on a small grid by the final loss on data.holdout = dev, the first half of the held-out tokens, with seed
    TUNE_SEED = 0, which no reported run uses; a method is tuned in every setting it is reported in that changes its
    step (experiment 1: at every M; 9 and 10: on their model and horizon; the K = 1 methods in Decoupled DiLoCo's
    setting, on the fast link for the variants); a grid whose best η is its smallest or largest grows on that side
    (MAX_EXTENSIONS), and a choice still on an edge is reported as such; a choice at μ's smaller value gets one
    probe a step below it (probe_jobs), which moves no choice and gives the slack the edge leaves; every reported
    number is measured on data.holdout = test, the second half, which no choice saw;
  * rows of runs a defect spoiled (SUPERSEDED) are set aside when read, and their runs are due again;
  * records: every run's merge records give the grace window of each merge, the contributions per merge and their
    staleness (merge_stats), reported with experiments 3, 4 and 8;
  * labels: every claim is marked reproduced, partly or not reproduced by a stated rule, with a sentence of why.

Experiments: 1 IsoLoCo vs DiLoCo over M (plus the fast Newton–Schulz Iso-C at the largest M); 2 merge methods;
3 heterogeneous learners, K = M against K = 1 with and without the grace window, on the slow link and on FAST_LINK
where the window opens, with the asynchronous outer variants (delayed Nesterov, staleness-aware weights, dynamic
local updates); 4 RDA vs the mean at K = 1 (and the variants on the fast link); 5 push precision; 6 one failure
schedule (also on the fast link); 7 Decoupled with failures vs DP; 8 the grace window over link bandwidths; 9 the
horizon (32 outer rounds per learner, small model); 10 many learners (up to M = 64, small model); 11 MuLoCo
(Muon as the inner optimizer) against DiLoCo, each against its own DP, and MuLoCo's int2 pushes (issue 53).

The binary is the authority on the configuration: the presets' outer optimizers (kind, η, μ) come from
`deloco config presets --json`, and every key a planned run sets is checked against `deloco config keys --for sim
--json` before anything runs. --plan prints the planned runs (JSON lines) without running them.

The scale: --quick is the byte-level tiny model (about 0.1M parameters) for CI; the full suite is a bf16 model of
4.24M parameters on SentencePiece tokens (made by `deloco tokenize` into DIR/tokens when missing), and a 2 × 128
model for experiments 9 and 10. Planned cost of the full suite: 321 runs before grid extensions and extra seeds
(`--plan` lists them); a 1600-step run of the 4 × 256 model took 215 s here (0.134 s per learner step), which puts
the whole at about 10–11 h on 2 cores.

The code: this driver (main), scripts/science_protocol.py (the scale, the methods, the plan, the results file, tuning
and seeds), scripts/science_runs.py (running the points) and scripts/science_report.py (the report and its plots).
"""
import argparse
import json
import os
import sys

# The suite's modules lie beside this file, which is run as a script and loaded by its path (scripts/science_test.py)
# from any folder.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import science_report  # noqa: E402
from science_protocol import (ROOT, Results, check_keys, chosen, load_methods, methods_of, pending_points,  # noqa: E402
                              plan, plan_rows, planned_runs, scale)
from science_runs import ensure_tokens, run_suite, snapshot_binary  # noqa: E402
# Every name of the three modules is this module's too, as when they were one file (the tests read them as sci.NAME).
from science_protocol import *  # noqa: E402,F401,F403
from science_runs import *  # noqa: E402,F401,F403
from science_report import *  # noqa: E402,F401,F403

RESULTS_FILE = None  # set by main(): where results.jsonl lives


def report(res, S, best, quick, out, doc, plots_dir, pending=None):
    """science_report.report, naming RESULTS_FILE as the file the rows come from (main() sets it, and so may a caller
    of report(): the tests do)."""
    science_report.report(res, S, best, quick, out, doc, plots_dir, pending, results_file=RESULTS_FILE)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the reduced suite (tiny model)")
    ap.add_argument("--smoke", action="store_true",
                    help="the quick scale with one seed, each method at its preset's η and μ without tuning runs: "
                         "every experiment end to end in a few minutes, for CI; implies --quick (default --out "
                         "runs/science-smoke). Its numbers are a pipeline check, not results")
    ap.add_argument("--out", default=None, help="results folder (default runs/science or runs/science-quick)")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (one thread each)")
    ap.add_argument("--deloco", default=os.path.join(ROOT, "build/deloco"))
    ap.add_argument("--only", default="", help="experiments to run, e.g. e1,e5 (default: all)")
    ap.add_argument("--report-only", action="store_true", help="write the report from the results without running")
    ap.add_argument("--doc", default=None, help="report file (default docs/science.md; --quick: OUT/science.md)")
    ap.add_argument("--results", default=None,
                    help="the results file (default: the full suite's docs/science/results-full.jsonl, which is kept "
                         "in the repository so that the hours of the full suite add up across sessions; --quick: "
                         "OUT/results.jsonl)")
    ap.add_argument("--plan", action="store_true",
                    help="print the runs the suite would start (tuning grids, then the reported runs at each grid's "
                         "centre) as JSON lines, and exit: nothing is run or written")
    args = ap.parse_args()
    if args.smoke:
        args.quick = True
    out = os.path.abspath(args.out or os.path.join(ROOT, "runs", "science-smoke" if args.smoke else
                                                   "science-quick" if args.quick else "science"))
    global RESULTS_FILE
    RESULTS_FILE = os.path.abspath(args.results or (os.path.join(out, "results.jsonl") if args.quick else
                                                    os.path.join(ROOT, "docs", "science", "results-full.jsonl")))
    S = scale(args.quick, out)
    if args.smoke:  # one seed, each method at its grid's centre only, taken as it is (no tuning runs: CI's time),
        # and a quarter of the quick scale's steps at half its outer period, experiment 9's horizon at 8 rounds (CI's
        # time: every experiment still runs end to end, over fewer rounds)
        S = dict(S, seeds=1, lr_factors=[1.0], momenta=[], untuned=True, total_steps=S["total_steps"] // 4,
                 sync_every=S["sync_every"] // 2, horizon_rounds=8)
    load_methods(args, S)
    pts = plan(S)
    if args.only:
        keep = set(args.only.split(","))
        pts = [p for p in pts if p[0] in keep]
    tuned = methods_of(pts)  # with the DP choices they take their inner learning rate from
    planned = planned_runs(S, pts, tuned)
    check_keys(args, [r["sets"] for r in planned])
    if args.plan:
        for r in planned:
            print(json.dumps(r))
        return
    os.makedirs(out, exist_ok=True)
    if not args.report_only:
        snapshot_binary(args, out)
    if not args.quick and not args.report_only:
        ensure_tokens(args, out)
    res = Results(RESULTS_FILE) if args.report_only else run_suite(args, out, S, pts, tuned, RESULTS_FILE)
    best = chosen(res, S, tuned)
    res = res.view(plan_rows(S, pts, best, res))
    doc = args.doc or (os.path.join(out, "science.md") if args.quick else os.path.join(ROOT, "docs", "science.md"))
    plots = os.path.join(os.path.dirname(doc), "science")
    report(res, S, best, args.quick, out, doc, plots, pending_points(res, S, pts, tuned))


if __name__ == "__main__":
    main()
