"""The science suite's report, docs/science.md (scripts/science.py is the driver): every experiment's tables from the
results' rows, each claim labelled reproduced, partly, not reproduced or pending (Claims), the notes on the claims
short of reproduced (shortfalls), and the plots (matplotlib, when it is installed)."""
import math
import os
import statistics
import sys
import tomllib

import science_before
import science_runs

from science_protocol import (sizes, method_order, E5_LINKS_MBIT, FAST_LINK, GOAL_MARGIN, MARGIN, MAX_EXTENSIONS, METHODS,
                              MULOCO_INT2_MARGIN, READ, ROOT, SWEEP_BANDWIDTHS, TOPK_DENSITIES, TUNE_SEED, BySeed, deltas, diff_ci, label, widens,
                              failure_schedule, grid, horizon_total, many_total, mean_ci, per_seed, rel_ci, rel_gaps, seeds_sorted, tuning_points,
                              tuning_sets)


def fmt_opt(res, exp, variant, field, digits):
    """fmt of a field some rows may lack (runs recorded before the field existed): "-" when none has it."""
    v = [x for x in seeds_sorted(res, exp, variant, field) if x is not None]
    return fmt(v, digits) if v else "-"


def fmt(xs, digits=4):
    m, h = mean_ci(xs)
    return f"{m:.{digits}f} ± {h:.{digits}f}" if math.isfinite(h) else f"{m:.{digits}f}"


def fmt_pct(xs):
    return (lambda m, h: f"{m:+.2%} ± {h:.2%}" if math.isfinite(h) else f"{m:+.2%}")(*mean_ci(xs))


# ---- the report ------------------------------------------------------------------------------------------------
def values(res, exp, variant, field="final_val_loss"):
    return [r[field] for r in res.rows.values()
            if r["exp"] == exp and r["variant"] == variant and r.get(field) is not None and math.isfinite(r[field])]


def loss_at(curve, t):
    """The latest evaluation at or before virtual time t of a run's curve ([[t, loss], ...]); NaN without one."""
    if not curve or t is None:
        return float("nan")
    before = [y for x, y in curve if x <= t + 1e-9]
    return before[-1] if before else float("nan")


def e5b(res, S, w, claims):
    """Experiment 5b (issue 35): bytes up and down per element and outer step against test loss; the communication
    time per outer step at E5_LINKS_MBIT in the simulator's link model (latency + bytes / bandwidth each way)."""
    M = S["m_exp"]
    rows = [("fp32", "fp32"), ("int4 up, bf16 down", "fp32"), ("fp32, outer SGD", "fp32, outer SGD")]
    rows += [(f"top-k {d:.0%} {way}", "fp32, outer SGD") for d in TOPK_DENSITIES for way in ("up", "both ways")]
    rows += [("top-k 3% both ways, chunks of 4096", "fp32, outer SGD"), ("top-k 3% both ways, η tuned for it", "fp32, outer SGD")]
    have = [(v, ref) for v, ref in rows if seeds_sorted(res, "e5", v)]
    if not have:
        return
    try:
        import tomllib
        latency = tomllib.load(open(os.path.join(ROOT, "configs/sim-diloco.toml"), "rb"))["sim"]["latency"]
    except Exception:
        latency = 0.5

    def per_element(v, field):
        """Frame bytes per parameter, per learner and outer step (mean over seeds), or None."""
        xs = [r for r in res.rows.values() if r["exp"] == "e5" and r["variant"] == v and r.get(field) is not None
              and r.get("parameters") and r.get("outer_steps")]
        return statistics.fmean(r[field] / (r["outer_steps"] * M * r["parameters"]) for r in xs) if xs else None

    base_up, base_down = per_element("int4 up, bf16 down", "bytes_up"), per_element("int4 up, bf16 down", "bytes_down")
    base = base_up + base_down if base_up is not None and base_down is not None else None
    params = next((r["parameters"] for r in res.rows.values() if r["exp"] == "e5" and r.get("parameters")), None)
    w(f"\n### 5b. Fewer bytes than int4 (synchronous, M = {M}; sparse rows: the mean under outer SGD, `mean_sgd`)\n")
    w("Bytes are frame bytes (header included) per parameter, per learner and outer step, as the simulator sent them. "
      "The communication time per outer step is the simulator's link model, " + f"{latency:g} s latency each way plus "
      "the bytes at the link's rate, for one push and one broadcast" +
      (f" of the {params}-parameter model" if params else "") + ". − ref is paired by seed against the fp32 row "
      "of the same outer optimizer.\n")
    w("| push / broadcast | up B/el | down B/el | total | int4+bf16 ÷ total | comm s @" +
      " | @".join(f"{b} Mbit/s" for b in E5_LINKS_MBIT) + " | test loss | − ref (paired) |")
    w("|---|---|---|---|---|" + "---|" * len(E5_LINKS_MBIT) + "---|---|")
    stats = {}

    def show(x, spec):  # "-": rows recorded before the byte counters existed
        return "-" if x is None or not math.isfinite(x) else format(x, spec)
    for v, ref in have:
        up, down = per_element(v, "bytes_up"), per_element(v, "bytes_down")
        loss, rl = seeds_sorted(res, "e5", v), seeds_sorted(res, "e5", ref)
        g, h = diff_ci(loss, rl) if v != ref and rl else (float("nan"), float("nan"))
        tot = up + down if up is not None and down is not None else None
        stats[v] = (tot, g, h)
        times = [2 * latency + tot * params / (b * 1e6 / 8) if tot is not None and params else float("nan")
                 for b in E5_LINKS_MBIT]
        ratio = base / tot if base and tot else None
        w(f"| {v} | {show(up, '.4f')} | {show(down, '.4f')} | {show(tot, '.4f')} | {show(ratio, '.1f')} | " +
          " | ".join(show(t, ".2f") for t in times) + f" | {fmt(loss)} | " + ("—" if v == ref else f"{g:+.4f} ± {h:.4f}") + " |")
    v3 = "top-k 3% both ways"
    if v3 in stats and base and stats[v3][0]:
        tot, _, _ = stats[v3]
        f32, l3 = seeds_sorted(res, "e5", "fp32"), seeds_sorted(res, "e5", v3)
        g, h = diff_ci(l3, f32)
        small = tot * 20 <= base
        claims.append(("top-k 3% both ways: ≤ 1/20 of int4 + bf16 bytes, within 0.02 nats of fp32",
                       label(small and g + h <= MARGIN, small and g <= MARGIN),  # the rule of a "matches" claim
                       f"bytes {base / tot:.1f}× fewer than int4 up + bf16 down; test loss − fp32 (Nesterov) = "
                       f"{g:+.4f} ± {h:.4f}" + "".join(
                           f"; {v} − fp32 (Nesterov) = {d:+.4f} ± {e:.4f}" for v in ("top-k 3% both ways, η tuned for it",)
                           if seeds_sorted(res, "e5", v) for d, e in [diff_ci(seeds_sorted(res, "e5", v), f32)]) + "."))


E12_ROWS = ["DP ×1", "DP ×2", "DP ×4", "DP ×8", "DiLoCo M=1", "DiLoCo M=2", "DiLoCo M=4", "DiLoCo M=8", "IsoLoCo M=8",
            "Decoupled M=8", "Decoupled M=8, failures", "Muon DP ×1", "Muon DP ×8", "MuLoCo M=1", "MuLoCo M=8"]
E12_MARGIN = 0.01  # the third claim: within 1% (relative) of synchronous DiLoCo


def e12(res, S, w, claims):
    """Experiment 12 (issue 54): DiLoCo against DP at compute-optimal budgets over model sizes, and its three claims."""
    claims.section("experiment 12")
    zs = sizes(S)
    spec = S["sizes_spec"]
    w("## 12. The scaling question: DiLoCo against DP at compute-optimal budgets\n")
    w(f"Charles et al. 2025 (\"Scaling Laws for DiLoCo\", 35M–2.4B parameters) train each size about 20 tokens per "
      f"parameter, the compute-optimal budget, and find, well tuned, DiLoCo with M = 1 better than DP at every size and "
      f"the gap between DiLoCo with more learners and DP shrinking as the model grows. Here: byte-level GPTs (vocabulary "
      f"256, T = {spec['block']}, {spec['precision']}) at {spec['tokens_per_param']} tokens per parameter (the quick "
      f"scale's sizes are a pipeline check, not compute-optimal), each run at equal tokens. Each method with M learners "
      f"is compared with DP at the same global batch (\"DP ×M\": M × 8 sequences per step, as many steps as each "
      f"learner takes), as Charles et al. compare them. At each size every method is tuned in the setting it is reported in (DP: its inner "
      f"learning rate, train.lr, at its batch; the others: outer η and μ), and the learners of DiLoCo, IsoLoCo and "
      f"Decoupled DiLoCo train at the inner learning rate DP chose at one learner's batch (MuLoCo's: Muon-DP's). Decoupled "
      f"DiLoCo: K = 1, 4 fragments, grace window, token weights, int4 pushes with error feedback, without and with the "
      f"failure schedule of experiments 6 and 7. The relative gap is (method − its DP) / its DP, per seed, then averaged.\n")
    w("| size | shape (layers × width) | parameters | steps (8 × " + str(spec["block"]) + " bytes) | tokens | tokens per parameter |")
    w("|---|---|---|---|---|---|")
    for z in zs:
        tok = z["total_steps"] * 8 * spec["block"]
        w(f"| {z['name']} | {z['shape']} | {z['params']:,} | {z['total_steps']} | {tok / 1e6:.2f}M | {tok / z['params']:.1f} |")
    rows = {(z["name"], v): seeds_sorted(res, "e12", f"{z['name']} {v}") for z in zs for v in E12_ROWS}
    w("\n| run | " + " | ".join(z["name"] for z in zs) + " |")
    w("|---|" + "---|" * len(zs))
    for v in E12_ROWS:
        w(f"| {v} | " + " | ".join(fmt(rows[(z['name'], v)]) if rows[(z['name'], v)] else "—" for z in zs) + " |")
    w("\nRelative gap to DP with the same global batch and inner optimizer (95% interval over paired seeds):\n")
    w("| run | " + " | ".join(z["name"] for z in zs) + " |")
    w("|---|" + "---|" * len(zs))
    gaps = {}
    for v in E12_ROWS:
        if "DP" in v:
            continue
        dp = ("Muon DP" if v.startswith("MuLoCo") else "DP") + " ×" + v.split("M=")[1].split(",")[0]
        cells = []
        for z in zs:
            a, b = rows[(z["name"], v)], rows[(z["name"], dp)]
            if a and b:
                gaps[(z["name"], v)] = rel_ci(a, b)
                g, h = gaps[(z["name"], v)]
                cells.append(f"{g:+.2%} ± {h:.2%}")
            else:
                cells.append("—")
        w(f"| {v} | " + " | ".join(cells) + " |")
    w("")
    names = [z["name"] for z in zs]
    have = [n for n in names if (n, "DiLoCo M=1") in gaps]
    if have:
        diffs = {n: diff_ci(rows[(n, "DiLoCo M=1")], rows[(n, "DP ×1")]) for n in have}
        sig = [n for n in have if diffs[n][0] + diffs[n][1] <= 0]
        mean = [n for n in have if diffs[n][0] <= 0]
        claims.append(("DiLoCo with M = 1 is at least as good as DP at every size (Charles et al. 2025)",
                       label(len(sig) == len(have), len(mean) == len(have)),  # pending until every size
                       "DiLoCo M = 1 − DP ×1: " + "; ".join(f"{n} {diffs[n][0]:+.4f} ± {diffs[n][1]:.4f}" for n in have) +
                       (f" (sizes without rows yet: {', '.join(n for n in names if n not in have)})" if len(have) < len(names) else "") + "."))
    ends = []  # per M: the gap at the smallest and at the largest size, and its change between them paired by seed
    for M in (2, 4, 8):
        lo, hi = (names[0], f"DiLoCo M={M}"), (names[-1], f"DiLoCo M={M}")
        if lo in gaps and hi in gaps:
            ends.append((M, gaps[lo][0], gaps[hi][0], diff_ci(rel_gaps(rows[hi], rows[(names[-1], f"DP ×{M}")]),
                                                              rel_gaps(rows[lo], rows[(names[0], f"DP ×{M}")]))))
    if ends:
        sig = [M for M, _, _, (c, h) in ends if c + h < 0]
        down = [M for M, _, _, (c, h) in ends if c < 0]
        claims.append(("DiLoCo's relative gap to DP (same global batch) decreases as the model grows, for M ≥ 2 "
                       "(Charles et al. 2025)", label(len(sig) == len(ends) == 3, len(down) == len(ends) == 3),
                       f"relative gap at {names[0]} → {names[-1]}, and its change (paired by seed): " +
                       "; ".join(f"M = {M} {g0:+.2%} → {g1:+.2%}, {c:+.2%} ± {h:.2%}" for M, g0, g1, (c, h) in ends) +
                       " (reproduced: every M's change below zero with its interval; partly: every M's mean)."))
    big = names[-1]
    a, b = rows[(big, "Decoupled M=8, failures")], rows[(big, "DiLoCo M=8")]
    if a and b:
        g, h = rel_ci(a, b)
        w(f"At {big}: (Decoupled DiLoCo with failures − synchronous DiLoCo without) / DiLoCo = {g:+.2%} ± {h:.2%} "
          f"({len(deltas(a, b))} paired seeds).\n")
        claims.append((f"Decoupled DiLoCo with failures is within {E12_MARGIN:.0%} (relative) of synchronous DiLoCo "
                       f"without failures at M = 8, at the largest size (the Decoupled DiLoCo paper)",
                       label(g + h <= E12_MARGIN, g <= E12_MARGIN), f"{g:+.2%} ± {h:.2%} at {big}."))


class Claims(list):
    """The report's claims, (claim, label, why). A claim rests on every row its section of the report has read so far
    (seeds_sorted records them in READ); while any of those points still has runs to do, it is labelled *pending*,
    and its why keeps the verdict on the rows so far. A section whose claims could not be formed yet for want of rows
    gets one pending line of its own, so that a partial report says what it is still waiting for."""

    def __init__(self, pending):
        super().__init__()
        self.pending = pending
        self.name, self.count = None, 0

    def section(self, name):
        self.close()
        READ.clear()
        self.name, self.count = name, len(self)

    def todo(self):
        """The points read since the section began that still have runs to do."""
        return sorted(p for p in READ if self.pending.get(p))

    def close(self):
        todo = self.todo()
        if self.name and todo and len(self) == self.count:
            super().append((f"{self.name}: its claims", "pending", self.waiting(todo) + "; too few rows to judge yet."))
        self.name = None

    def waiting(self, todo):
        runs = sum(self.pending[p] for p in todo)
        names = [f"{e} {v}" for e, v in todo]
        return (f"{runs} run{'s' if runs != 1 else ''} still to do ({'; '.join(names[:4])}" +
                (f" and {len(names) - 4} more" if len(names) > 4 else "") + ")")

    def append(self, claim):
        c, lab, why = claim
        todo = self.todo()
        if todo:
            lab, why = "pending", self.waiting(todo) + f"; on the rows so far: {lab}, {why}"
        super().append((c, lab, why))


def report(res, S, best, quick, out, doc, plots_dir, pending=None, *, results_file):
    """Writes the report of the rows of `res` (recorded in the results file `results_file`) to `doc`, its plots to
    `plots_dir`; `pending`: pending_points(), the runs still to do."""
    L = []
    w = L.append
    mode = ("smoke (CI: one seed, each method at its preset's η and μ, no tuning runs)" if S["seeds"] == 1 else "quick") if quick else "full"
    w("# The papers' claims, measured in the simulator\n")
    w("Generated by `scripts/science.py" + (" --quick" if quick else "") + "` from `" + os.path.relpath(results_file, ROOT) +
      "` (regenerate with `--report-only`). Every number below is the final validation loss of the global\n"
      "model on the **test** half of the held-out tokens (`data.holdout = test`), mean ± the 95% interval of the mean\n"
      f"over {S['seeds']} seed{'s' if S['seeds'] > 1 else ''} ({', '.join(str(i) for i in range(1, S['seeds'] + 1))}, the same for every point, fixed before any test result; Student's t; train.seed = sim.seed = the seed). Outer learning rates and momenta were\n"
      f"chosen on the **dev** half (`data.holdout = dev`) with seed {TUNE_SEED}, which no reported run uses, from the grids below: no\n"
      "reported number was seen by a choice, not even as the other half of a tuning run. Differences are paired by seed\n"
      "(same initialisation and data order).\n")
    w(f"* Scale: **{mode}**. Model: {S['model']}. Total inner steps per run: {S['total_steps']} (split over the M "
      f"learners: equal total tokens), H = {S['sync_every']}.")
    if quick:
        w("* **This is the quick scale**, the suite's end-to-end check (CI runs its one-seed smoke): a 0.1M-parameter byte model over a few\n"
          "  outer steps, far from the papers' scale. Read its labels as what this small setting shows, nothing more.")
    walls = [r.get("_wall", 0) for r in {r["key"]: r for r in res.rows.values()}.values()]
    if not quick:
        w(f"* **Why not ≥ 10M parameters** (issue 14's aim): a 12.3M model (6 × 384) costs 0.43 s of CPU per learner "
          f"step here against 0.18 s for this one, so the suite would take about 2.4 times the {sum(walls) / 7200:.1f} h "
          f"this one {'has taken so far' if pending else 'took'} on 2 cores (`scale()` in scripts/science_protocol.py has the arithmetic). The token budget per run was "
          "kept instead. It is still small: at M = 8 each learner takes "
          f"{S['total_steps'] // S['m_exp']} inner steps, {S['total_steps'] // S['m_exp'] // S['sync_every']} outer "
          "rounds of H = " + str(S["sync_every"]) + ", far fewer than the papers' runs.")
    todo = {p: n for p, n in (pending or {}).items() if p[0] not in ("tune", "probe")}
    tunes = {p[1]: n for p, n in (pending or {}).items() if p[0] == "tune"}
    if todo or tunes:
        w(f"* **A partial report: the suite is not complete.** {sum(todo.values())} reported runs of "
          f"{len(todo)} points are still to do (their seeds are fixed in advance), " +
          (f"after {sum(tunes.values())} tuning runs known so far for the {len(tunes)} methods whose tuning is "
           "unfinished (extensions of their grids may add more)" if tunes else "and every method's tuning is done") +
          "; every claim that rests on one of them is labelled *pending*, and the tables show the rows so far (a row "
          "with fewer seeds than the others has runs to come). `scripts/science.sh` resumes the suite.")
    kinds = {x: len({r["key"] for r in res.rows.values() if r["exp"] == x}) for x in ("tune", "probe")}
    w(f"* Runs: {len({r['key'] for r in res.rows.values()})} ({kinds['tune']} for tuning, {kinds['probe']} probes of μ's edge), "
      f"{sum(walls) / 3600:.2f} h of run time in all (2 at a time on 2 cores)." + "".join(
          f" Set aside, their runs due again on a fixed binary: {n} rows because {why}." for why, n in res.set_aside.items()))
    w(science_runs.provenance(res) + "\n")
    w(f"## Tuning: the grids and the choices (dev half, seed {TUNE_SEED})\n")
    w("Each method is tuned where it runs: synchronously at M = " + str(S["m_exp"]) + " (RDA, mean_k1 and the `_fast` methods: in "
      "Decoupled DiLoCo's setting at K = 1, the `_fast` ones on the fast link of experiments 3, 4 and 6), and a method "
      "named `meth@syncM` at M learners (experiment 1 tunes both methods at every M), `@smallM` on the small model "
      "(experiment 10), `@horizonM` / `@horizon_k1M` at experiment 9's horizon. That choice serves every row it "
      "appears in. The η grid is the preset's η × " +
      str(S["lr_factors"]) + "; μ is the preset's" + (" and " + str(S["momenta"]) if S["momenta"] else "") +
      " for Nesterov, 0 for SGD. Presets: `diloco` = mean, `rda` = the `decoupled` preset; `mean_k1` = the mean tuned where RDA is; `mean_sgd` = the mean with\n"
      "outer SGD.\n")
    w("| method | η grid | μ grid | chosen η | chosen μ | dev loss of each grid point (η, μ) |")
    w("|---|---|---|---|---|---|")
    edges, unfinished = [], []
    for meth, (lr, mu, inner) in sorted(best.items(), key=lambda b: method_order(b[0])):
        lrs, mus = grid(S, meth)
        points, missing, _, edge = tuning_points(res, S, meth)
        if missing:
            unfinished.append(meth)
        elif edge:
            edges.append(f"{meth} ({edge})")
        rows = {(a, b): res.get(tuning_sets(S, meth, a, b, inner)) for a, b in points}
        pts = sorted((a, b, r["final_val_loss"] if r["final_val_loss"] is not None else float("nan"))
                     for (a, b), r in rows.items() if r is not None)
        added = sorted(a for a, _ in points[len(lrs) * len(mus):] if (a, _) not in missing)
        w(f"| {meth}" + (f" (train.lr {inner})" if inner is not None else "") + f" | {lrs}" +
          (f" + {added}" if added else "") + f" | {mus} | {lr}" + (" (edge)" if edge else "") +
          f" | {mu} | " + ", ".join(f"({a}, {b}): {c:.4f}" for a, b, c in pts) + " |")
    w("")
    w(f"When the best η of a grid was its smallest or largest, the grid was extended on that side by one more factor "
      f"({S['lr_factors'][0]} or {S['lr_factors'][-1]}) at the best μ, up to {MAX_EXTENSIONS} times (the η after the "
      "+). " + ("Still on an edge after that, so their optimum may lie beyond what was tried: " + ", ".join(edges) + ". "
                if edges else "") +
      ("Tuning is not finished for " + ", ".join(unfinished) + ": their choice may still change."
       if unfinished else "" if edges or not best else "Every choice's η is inside its grid.") + "\n")
    science_before.mu_probes(w, res, S, best)

    claims = Claims(pending or {})
    # 1.
    claims.section("experiment 1")
    w("## 1. IsoLoCo against DiLoCo at equal total tokens\n")
    w("| M | DiLoCo | IsoLoCo | DiLoCo − IsoLoCo (paired) |")
    w("|---|---|---|---|")
    gaps = []
    for M in S["ms"]:
        d, i = seeds_sorted(res, "e1", f"diloco M={M}"), seeds_sorted(res, "e1", f"isoloco M={M}")
        if not d or not i:
            continue
        g, h = diff_ci(d, i)
        gaps.append((M, g, h, deltas(d, i)))
        w(f"| {M} | {fmt(d)} | {fmt(i)} | {g:+.4f} ± {h:.4f} |")
    if gaps:
        better = [M for M, g, h, _ in gaps if g - h > 0]
        wins = [M for M, g, h, _ in gaps if g > 0]
        claims.append(("IsoLoCo beats DiLoCo averaging", label(len(better) == len(gaps), len(wins) == len(gaps)),
                       f"IsoLoCo is lower with a 95% interval excluding zero at M = {better or 'none'}; its mean is "
                       f"lower at M = {wins or 'none'} of {[M for M, *_ in gaps]}."))
        claims.append(widens("the gap widens as learners multiply", gaps))
        plot(plots_dir, "e1.png", "IsoLoCo vs DiLoCo (equal total tokens)", "learners M", "test loss",
             {name: [(M, *mean_ci(seeds_sorted(res, "e1", f"{meth} M={M}"))) for M in S["ms"] if seeds_sorted(res, "e1", f"{meth} M={M}")]
              for name, meth in (("DiLoCo", "diloco"), ("IsoLoCo", "isoloco"))}, logx=True)
        w("\n![experiment 1](science/e1.png)\n")
    # 2.
    claims.section("experiment 2")
    w(f"## 2. Merge methods at M = {S['m_exp']}\n")
    w("| method | outer | test loss | − DiLoCo (paired) |")
    w("|---|---|---|---|")
    base = seeds_sorted(res, "e2", "diloco")
    rows2 = {}
    for meth in ("iso_c_sgd", "mean_sgd", "diloco", "iso_cts", "tsv", "ties", "dare", "isoloco", "iso_c_ns",
                 "iso_c_ns_fast"):
        v = seeds_sorted(res, "e2", meth)
        if not v:
            continue
        rows2[meth] = v
        g, h = diff_ci(v, base) if base else (float("nan"), float("nan"))
        outer = "SGD" if METHODS[meth]["sets"][1] == "outer.kind=sgd" else "Nesterov"
        w(f"| {meth} | {outer} | {fmt(v)} | {g:+.4f} ± {h:.4f} |")
    if bars(plots_dir, "e2.png", f"Merge methods, M = {S['m_exp']}", "test loss", list(rows2.items())):
        w("\n![experiment 2](science/e2.png)\n")
    if "iso_c_sgd" in rows2 and "mean_sgd" in rows2:
        g, h = diff_ci(rows2["mean_sgd"], rows2["iso_c_sgd"])
        claims.append(("Iso-C with plain SGD beats the mean with SGD", label(g - h > 0, g > 0),
                       f"mean+SGD − Iso-C+SGD = {g:+.4f} ± {h:.4f}."))
    if "iso_c_ns" in rows2 and "isoloco" in rows2:
        g, h = diff_ci(rows2["iso_c_ns"], rows2["isoloco"])
        Mx = max(S["ms"])
        a, b = seeds_sorted(res, "e1", f"iso_c_ns M={Mx}"), seeds_sorted(res, "e1", f"isoloco M={Mx}")
        g2, h2 = diff_ci(a, b) if a and b else (float("nan"), float("nan"))
        w(f"\nIsoLoCo with the 10-step fp32 Newton–Schulz Iso-C (`merge.method = iso_c_ns`, the schedule that converges to "
          f"Iso-C; each tuned alike) against exact Iso-C: "
          f"{g:+.4f} ± {h:.4f} at M = {S['m_exp']}" + (f", {g2:+.4f} ± {h2:.4f} at M = {Mx} ({fmt(a)} against {fmt(b)})"
                                                       if a and b else "") + ".")
        worst = max(g + h, g2 + h2) if math.isfinite(g2) else g + h
        claims.append(("the 10-step Newton–Schulz Iso-C (fp32) loses no quality against exact Iso-C",
                       label(worst <= MARGIN, g <= MARGIN and (not math.isfinite(g2) or g2 <= MARGIN)),
                       f"iso_c_ns − iso_c = {g:+.4f} ± {h:.4f} at M = {S['m_exp']}" +
                       (f", {g2:+.4f} ± {h2:.4f} at M = {Mx}." if math.isfinite(g2) else ".")))
    if "iso_c_ns_fast" in rows2 and "isoloco" in rows2:
        g, h = diff_ci(rows2["iso_c_ns_fast"], rows2["isoloco"])
        w(f"\nThe SVD-free variant the IsoLoCo paper proposes, fast: `iso_c_ns_fast`, 5 Newton–Schulz steps in bf16 with "
          f"deloco's coefficients (`merge.iso_ns_steps = 5`, `merge.iso_ns_precision = bf16`), against exact Iso-C: "
          f"{g:+.4f} ± {h:.4f} at M = {S['m_exp']}. Its merge is 10× faster than the SVD in the syncer's round "
          f"(0.62 s against 6.33 s at four 1024² matrices, M = 8; docs/merge.md, `bench/syncer_throughput.cpp`).")
        claims.append(("the fast Newton–Schulz Iso-C (5 steps, bf16) loses no quality against exact Iso-C",
                       label(g + h <= MARGIN, g <= MARGIN), f"iso_c_ns_fast − iso_c = {g:+.4f} ± {h:.4f}."))
    if "iso_c_sgd" in rows2 and base:
        g, h = diff_ci(base, rows2["iso_c_sgd"])
        claims.append(("Iso-C with SGD matches or beats DiLoCo with Nesterov", label(g - h >= -MARGIN, g >= -MARGIN),
                       f"DiLoCo − Iso-C+SGD = {g:+.4f} ± {h:.4f}."))
    w("")
    # 3.
    claims.section("experiment 3")
    w("## 3. Heterogeneous learners (half 18% slower, 10% step variance)\n")
    w(f"The first three rows use `configs/sim-diloco.toml`'s 1 MB/s link, where one synchronisation takes longer than "
      f"τ = 5 steps and the grace window is clamped to 0; the `fast link` rows use {FAST_LINK[0].split('=')[1]} bytes/s, where it "
      "opens (experiment 8 sweeps the bandwidth). *merges*: outer steps; *per merge*: contributions per merge; *open*: "
      "the share of merges whose grace window was above 0 (each run's merge records).\n")
    w("| setting | test loss | − K=M on its link (paired) | uptime | goodput | virtual seconds | merges | per merge | open |")
    w("|---|---|---|---|---|---|---|---|---|")
    E3 = ("K=M", "K=M, fast link", "K=1", "K=1 + grace", "K=1 + grace, base anchor", "K=1, fast link",
          "K=1 + grace, fast link", "K=1 + grace, fast link, base anchor",
          "K=1 + grace + delayed Nesterov, fast link", "K=1 + grace + delayed Nesterov (whole g), fast link",
          "K=1 + grace + staleness weights, fast link",
          "K=1 + grace + dynamic local updates, fast link")
    lm = seeds_sorted(res, "e3", "K=M")
    goal = []
    for v in E3:
        l = seeds_sorted(res, "e3", v)
        if not l:
            continue
        ref = seeds_sorted(res, "e3", "K=M, fast link" if "fast link" in v else "K=M")  # K = M on the same link
        g, h = diff_ci(l, ref) if ref else (float("nan"), float("nan"))
        gp = seeds_sorted(res, "e3", v, "goodput")
        if not v.startswith("K=M"):
            goal.append((g + h, g, h, v, statistics.fmean(gp)))
        w(f"| {v} | {fmt(l)} | {g:+.4f} ± {h:.4f} | {fmt(seeds_sorted(res, 'e3', v, 'uptime'), 3)} | {fmt(gp, 3)} | "
          f"{fmt(seeds_sorted(res, 'e3', v, 'virtual_seconds'), 0)} | {fmt_opt(res, 'e3', v, 'outer_steps', 1)} | "
          f"{fmt_opt(res, 'e3', v, 'per_merge', 2)} | {fmt_opt(res, 'e3', v, 'grace_open', 2)} |")
    if bars(plots_dir, "e3.png", "Heterogeneous learners: test loss", "test loss",
            [(v.replace(", fast link", "*").replace("K=1 + grace + ", "").replace("dynamic local updates", "DyLU"),
              seeds_sorted(res, "e3", v)) for v in E3]):
        w("\n![experiment 3 (* = fast link)](science/e3.png)\n")
    km, k1, kg = (seeds_sorted(res, "e3", v, "goodput") for v in ("K=M", "K=1", "K=1 + grace"))
    if km and k1 and kg:
        g1, h1 = diff_ci(k1, km)
        fast = bool(seeds_sorted(res, "e3", "K=1 + grace, fast link") and seeds_sorted(res, "e3", "K=M, fast link"))
        lg = seeds_sorted(res, "e3", "K=1 + grace, fast link") if fast else seeds_sorted(res, "e3", "K=1 + grace")
        gl, hl = diff_ci(lg, seeds_sorted(res, "e3", "K=M, fast link") if fast else lm)
        kmf, k1f = (seeds_sorted(res, "e3", v, "goodput") for v in ("K=M, fast link", "K=1, fast link"))
        gf, hf = diff_ci(k1f, kmf) if kmf and k1f else (float("nan"), float("nan"))
        claims.append(("K = 1 keeps goodput high where K = M waits for the slow half",
                       label(g1 - h1 > 0 and (not math.isfinite(gf) or gf - hf > 0), g1 > 0),
                       f"goodput K=1 − K=M = {g1:+.3f} ± {h1:.3f} on the 1 MB/s link" +
                       (f", {gf:+.3f} ± {hf:.3f} on the fast link (both overlapped there, K = M's blocking costs less)."
                        if math.isfinite(gf) else " (no K = M row on the fast link yet).")))
        claims.append(("the grace window keeps quality close to K = M", label(gl + hl <= MARGIN, gl <= MARGIN),
                       f"loss (K=1 + grace) − (K=M) = {gl:+.4f} ± {hl:.4f}" +
                       (" on the fast link, where the window opens (K = M on the same link)." if fast
                        else " (on the slow link: the window is clamped to 0).")))
    if goal:
        ok = [x for x in goal if x[0] <= GOAL_MARGIN and x[4] >= 0.8]
        near = min(goal)
        claims.append((f"some K = 1 configuration is within {GOAL_MARGIN} nats of K = M with goodput ≥ 0.8 (issue 33's goal)",
                       "reproduced" if ok else ("partly" if any(x[1] <= GOAL_MARGIN and x[4] >= 0.8 for x in goal)
                                                else "not reproduced"),
                       (f"{ok[0][3]}: {ok[0][1]:+.4f} ± {ok[0][2]:.4f}, goodput {ok[0][4]:.3f}." if ok else
                        f"closest: {near[3]}, {near[1]:+.4f} ± {near[2]:.4f} (goodput {near[4]:.3f}).")))
    w("")
    # 4.
    claims.section("experiment 4")
    w(f"## 4. RDA against the token-weighted mean (Decoupled DiLoCo, M = {S['m_exp']}, K = 1)\n")
    r4, k4, m4 = (seeds_sorted(res, "e4", v) for v in ("rda", "mean_k1", "diloco"))
    if r4 and (k4 or m4):
        w("| merge | outer η, μ tuned | test loss | mean − RDA (paired) |\n|---|---|---|---|")
        w(f"| RDA (decoupled preset) | here (K = 1) | {fmt(r4)} | |")
        for v, where in ((k4, "here (K = 1), on RDA's grid"), (m4, "for synchronous DiLoCo (experiment 2's choice)")):
            if v:
                g, h = diff_ci(v, r4)
                w(f"| token-weighted mean | {where} | {fmt(v)} | {g:+.4f} ± {h:.4f} |")
        w("")
        if "rda" in best and "diloco" in best:
            w(f"RDA chose η {best['rda'][0]}, μ {best['rda'][1]}" +
              (f" and the mean tuned alike η {best['mean_k1'][0]}, μ {best['mean_k1'][1]}" if "mean_k1" in best else "") +
              f"; synchronous DiLoCo's choice is η {best['diloco'][0]}, μ {best['diloco'][1]}. The claim is judged "
              "against the mean tuned at K = 1" + ("" if k4 else " (not run yet: against the other until it is)") +
              ". Experiment 3's K = 1 rows use the mean tuned at K = 1 too.\n")
        g, h = diff_ci(k4 or m4, r4)
        claims.append(("RDA beats the token-weighted mean", label(g - h > 0, g > 0), f"mean − RDA = {g:+.4f} ± {h:.4f}" +
                       (", both tuned at K = 1." if k4 else " (the mean's η tuned for synchronous DiLoCo).")))
    fast4 = [(v, seeds_sorted(res, "e4", v)) for v in ("rda, fast link", "rda, fast link, base anchor", "mean, fast link",
                                                         "delayed Nesterov, fast link",
                                                         "delayed Nesterov (whole g), fast link",
                                                         "staleness weights, fast link")]
    anchor4 = [(v, seeds_sorted(res, "e4", v), seeds_sorted(res, "e4", v.replace(", base anchor", "")))
               for v in ("rda, base anchor", "mean_k1, base anchor", "rda, fast link, base anchor")]
    if any(b for _, b, _ in anchor4):
        w("The base anchor (`sync.delta_anchor = base`: a push is its own change, with no feedback of the merges since "
          "its base; docs/sim.md) against the paper's global anchor, each tuned with its anchor:\n")
        w("| run | base anchor | global anchor | base − global (paired) |\n|---|---|---|---|")
        for v, b, g0 in anchor4:
            if b and g0:
                g, h = diff_ci(b, g0)
                w(f"| {v.replace(', base anchor', '')} | {fmt(b)} | {fmt(g0)} | {g:+.4f} ± {h:.4f} |")
        w("")
    rf = seeds_sorted(res, "e4", "rda, fast link")
    if any(v for _, v in fast4):
        w(f"On the fast link ({FAST_LINK[0].split('=')[1]} bytes/s, grace window open), each tuned at K = 1 there:\n")
        w("| merge / outer | test loss | − RDA (paired) | per merge | open |\n|---|---|---|---|---|")
        for v, l in fast4:
            if l:
                g, h = diff_ci(l, rf) if rf else (float("nan"), float("nan"))
                w(f"| {v.replace(', fast link', '')} | {fmt(l)} | {g:+.4f} ± {h:.4f} | "
                  f"{fmt_opt(res, 'e4', v, 'per_merge', 2)} | {fmt_opt(res, 'e4', v, 'grace_open', 2)} |")
        w("")
    # 5.
    claims.section("experiment 5")
    w(f"## 5. Outer-gradient precision (DiLoCo, M = {S['m_exp']}, error feedback on)\n")
    w("| push encoding | bytes/element | test loss | − fp32 (paired) |")
    w("|---|---|---|---|")
    f32 = seeds_sorted(res, "e5", "fp32")
    bpe = {"fp32": 4, "bf16": 2, "int8": 1.0625, "int4": 0.5625, "int2": 0.3125}
    d5 = {}
    for enc in ("fp32", "bf16", "int8", "int4", "int2"):
        v = seeds_sorted(res, "e5", enc)
        if v:
            d5[enc] = diff_ci(v, f32)
            w(f"| {enc} | {bpe[enc]} | {fmt(v)} | {d5[enc][0]:+.4f} ± {d5[enc][1]:.4f} |")
    if bars(plots_dir, "e5.png", "Outer-gradient precision", "test loss",
            [(enc, seeds_sorted(res, "e5", enc)) for enc in ("fp32", "bf16", "int8", "int4", "int2")]):
        w("\n![experiment 5](science/e5.png)\n")
    if "int4" in d5 and "int2" in d5:
        g4, h4 = d5["int4"]
        g2, h2 = d5["int2"]
        claims.append(("int4 stays lossless", label(g4 + h4 <= MARGIN, g4 <= MARGIN),
                       f"int4 − fp32 = {g4:+.4f} ± {h4:.4f}" + ("." if g4 + h4 <= MARGIN else
                       "; the interval reaches past the margin, so losslessness is not shown.")))
        claims.append(("2-bit hurts", label(g2 - h2 > 0, g2 > 0), f"int2 − fp32 = {g2:+.4f} ± {h2:.4f}."))
    # 5b.
    claims.section("experiment 5b")
    e5b(res, S, w, claims)
    w("")
    # 6.
    claims.section("experiment 6")
    w("## 6. One failure schedule under Decoupled DiLoCo, synchronous DiLoCo and DP\n")
    sim = tomllib.load(open(os.path.join(ROOT, "configs/sim-diloco.toml"), "rb"))["sim"]
    mtbf, downtime = failure_schedule(S)
    w(f"Every learner fails on average every {mtbf} virtual seconds and stays down {downtime:g} s (steps take {sim['step_time']:g} s ± 10%; each link carries "
      f"{sim['bandwidth'] / 1e6:g} MB/s with {sim['latency']:g} s latency: `configs/sim-diloco.toml`). DP is one learner that takes the global batch (8 × M sequences) and exchanges the "
      "whole model over the same link after every step; it is simulated with one learner's failure rate, where a "
      "real data-parallel job over M groups would fail M times as often, so its uptime here is a best case. "
      "\"At Decoupled's end\" is each method's test loss at the virtual time when the same seed's Decoupled DiLoCo "
      "run finished (its latest evaluation by then): quality at equal wall time.\n")
    w("| method | test loss | at Decoupled's end | uptime | goodput | virtual seconds | failures |")
    w("|---|---|---|---|---|---|---|")
    dec = seeds_sorted(res, "e6", "Decoupled DiLoCo", "curve")  # per seed: when Decoupled finished, its curve's end
    at_end = {}
    for v in ("Decoupled DiLoCo", "DiLoCo (synchronous)", "DP", "Decoupled DiLoCo, fast link",
              "Decoupled + delayed Nesterov, fast link", "Decoupled + delayed Nesterov (whole g), fast link",
              "DiLoCo (synchronous), fast link", "DP, fast link"):
        l = seeds_sorted(res, "e6", v)
        if l:
            at_end[v] = per_seed(seeds_sorted(res, "e6", v, "curve"), dec, lambda c, d: loss_at(c, d[-1][0] if d else None))
            shown = fmt(at_end[v]) if all(math.isfinite(x) for x in at_end[v]) and at_end[v] else "-"
            w(f"| {v} | {fmt(l)} | {shown} | {fmt(seeds_sorted(res, 'e6', v, 'uptime'), 3)} | "
              f"{fmt(seeds_sorted(res, 'e6', v, 'goodput'), 3)} | "
              f"{fmt(seeds_sorted(res, 'e6', v, 'virtual_seconds'), 0)} | {fmt(seeds_sorted(res, 'e6', v, 'failures'), 1)} |")
    a6, s6 = at_end.get("Decoupled DiLoCo", []), at_end.get("DiLoCo (synchronous)", [])
    if a6 and s6 and all(math.isfinite(x) for x in a6 + s6):
        g, h = diff_ci(s6, a6)
        claims.append(("under failures Decoupled DiLoCo is ahead of synchronous DiLoCo at equal wall time",
                       label(g - h > 0, g > 0),
                       f"at the time Decoupled finishes, synchronous − Decoupled = {g:+.4f} ± {h:.4f}."))
    if bars(plots_dir, "e6.png", "One failure schedule: uptime", "uptime",
            [(v, seeds_sorted(res, "e6", v, "uptime")) for v in ("Decoupled DiLoCo", "DiLoCo (synchronous)", "DP")]):
        w("\n![experiment 6](science/e6.png)\n")
    if curves(plots_dir, "e6-time.png", "One failure schedule: quality against time", "virtual seconds", "test loss",
              [(v, seeds_sorted(res, "e6", v, "curve")) for v in ("Decoupled DiLoCo", "DiLoCo (synchronous)", "DP")]):
        w("\n![experiment 6: test loss against virtual time, one line per seed](science/e6-time.png)\n")
    ud, us = seeds_sorted(res, "e6", "Decoupled DiLoCo", "uptime"), seeds_sorted(res, "e6", "DiLoCo (synchronous)", "uptime")
    if ud and us:
        g, h = diff_ci(ud, us)
        claims.append(("under failures Decoupled DiLoCo keeps its uptime where synchronous training loses it",
                       label(g - h > 0, g > 0), f"uptime Decoupled − synchronous = {g:+.3f} ± {h:.3f}."))
    w("")
    # 7.
    claims.section("experiment 7")
    w("## 7. Quality: Decoupled DiLoCo with failures against DP without, at the same tokens\n")
    w("DP here (and in experiments 6, 9 and 11) trains at the suite's train.lr, untuned (experiment 12 tunes DP's): a "
      "handicap that favours the claims that a method matches DP, not DP.\n")
    a, b = seeds_sorted(res, "e7", "Decoupled DiLoCo, failures"), seeds_sorted(res, "e7", "DP, no failures")
    if a and b:
        g, h = diff_ci(a, b)
        w(f"| run | test loss |\n|---|---|\n| Decoupled DiLoCo, M = {S['m_exp']}, failures | {fmt(a)} |\n"
          f"| DP, no failures | {fmt(b)} |\n\nDecoupled − DP = {g:+.4f} ± {h:.4f}\n")
        claims.append(("Decoupled DiLoCo with failures matches DP without", label(g + h <= MARGIN, g <= MARGIN),
                       f"Decoupled − DP = {g:+.4f} ± {h:.4f}."))
    # 8.
    claims.section("experiment 8")
    w("## 8. Where the grace window works: link bandwidth\n")
    w(f"Experiment 3's learners (M = {S['m_exp']}, half 18% slower), K = 1 with and without the grace window, the mean "
      f"tuned on experiment 3's fast link (64 MB/s; not at each bandwidth), fp32 pushes and answers; the link's latency stays 0.5 s. The window is "
      "γ(τ·ξ_step − ξ_quorum − ξ_sync): it opens once one synchronisation fits inside τ = 5 steps. Staleness: the "
      "merges between a contribution's base version and the merge that takes it (K = 1, without the window).\n")
    w("| bandwidth | K=1 | K=1 + grace | grace − none (paired) | window (s) | open | per merge | goodput (grace) | "
      "staleness | K=1 + grace, base anchor |")
    w("|---|---|---|---|---|---|---|---|---|---|")
    sweep, diverged = [], []
    for bw in SWEEP_BANDWIDTHS:
        v = f"{bw / 1e6:g} MB/s"
        a, b = seeds_sorted(res, "e8", v), seeds_sorted(res, "e8", v + " + grace")
        if not a or not b:
            continue
        g, h = diff_ci(b, a)
        sweep.append((bw, g, h))
        w(f"| {v} | {fmt(a)} | {fmt(b)} | {g:+.4f} ± {h:.4f} | {fmt_opt(res, 'e8', v + ' + grace', 'grace_mean', 2)} | "
          f"{fmt_opt(res, 'e8', v + ' + grace', 'grace_open', 2)} | {fmt_opt(res, 'e8', v + ' + grace', 'per_merge', 2)} | "
          f"{fmt(seeds_sorted(res, 'e8', v + ' + grace', 'goodput'), 3)} | {fmt_opt(res, 'e8', v, 'staleness_mean', 1)} | "
          f"{fmt(seeds_sorted(res, 'e8', v + ' + grace, base anchor')) if seeds_sorted(res, 'e8', v + ' + grace, base anchor') else '—'} |")
        # A run that ends above the loss it started from has diverged: say so, with how stale its merges were.
        for var in (v, v + " + grace", v + " + grace, base anchor"):
            up = [(x, x0) for x, x0 in zip(seeds_sorted(res, "e8", var), seeds_sorted(res, "e8", var, "initial_val_loss"))
                  if x0 is not None and x > x0]
            if up:
                diverged.append(f"{var}: {len(up)} of {len(seeds_sorted(res, 'e8', var))} seeds (final loss "
                                f"{', '.join(f'{x:.2f}' for x, _ in up)}; initial about {up[0][1]:.2f})")
    if diverged:
        w("\nEnded above their initial loss (diverged): " + "; ".join(diverged) + ". The outer step was tuned on the "
          f"fast link, where K = 1's contributions are {fmt_opt(res, 'e3', 'K=1, fast link', 'staleness_mean', 1)} "
          "merges stale (experiment 3); on a slower link each push takes more merges to arrive (the staleness column), "
          "and the same step applied to such stale pseudo-gradients can diverge." +
          "\n")
    if sweep:
        plot(plots_dir, "e8.png", "Grace window against link bandwidth", "bandwidth (MB/s)", "test loss",
             {name: [(bw / 1e6, *mean_ci(seeds_sorted(res, "e8", f"{bw / 1e6:g} MB/s" + suffix))) for bw in SWEEP_BANDWIDTHS
                     if seeds_sorted(res, "e8", f"{bw / 1e6:g} MB/s" + suffix)]
              for name, suffix in (("K=1", ""), ("K=1 + grace", " + grace"))}, logx=True)
        w("\n![experiment 8](science/e8.png)\n")
        helped = [bw / 1e6 for bw, g, h in sweep if g + h < 0]
        claims.append(("where a synchronisation fits inside the overlap, the grace window improves K = 1's quality",
                       label(bool(helped), any(g < 0 for _, g, _ in sweep)),
                       f"grace − none is below zero with its interval at {helped or 'no'} MB/s; at the fastest link "
                       f"{sweep[-1][1]:+.4f} ± {sweep[-1][2]:.4f}."))
    w("")
    # 9.
    HR = S["horizon_rounds"]
    claims.section("experiment 9")
    w(f"## 9. The horizon: {HR} outer rounds per learner (M = {S['m_exp']}, small model)\n")
    w(f"Model: {S['small_model']}; each learner trains {HR} × H = {HR * S['sync_every']} inner steps "
      f"({horizon_total(S, S['m_exp'])} in all, equal tokens for every row; DP takes the same tokens in "
      f"{horizon_total(S, S['m_exp']) // S['m_exp']} steps of the global batch). Every method tuned at this horizon.\n")
    rows9 = {v: seeds_sorted(res, "e9", v) for v in ("DiLoCo", "IsoLoCo", "Decoupled DiLoCo, failures", "DP, no failures",
                                                     "mean, outer SGD", "mean, outer SGD, top-k 3% both ways",
                                                     "SparseLoCo")}
    if any(rows9.values()):
        w("| run | test loss |\n|---|---|")
        for v, l in rows9.items():
            if l:
                w(f"| {v} | {fmt(l)} |")
        w("")
        if rows9["DiLoCo"] and rows9["IsoLoCo"]:
            g, h = diff_ci(rows9["DiLoCo"], rows9["IsoLoCo"])
            w(f"DiLoCo − IsoLoCo = {g:+.4f} ± {h:.4f}.")
            claims.append((f"IsoLoCo beats DiLoCo at {HR} outer rounds", label(g - h > 0, g > 0),
                           f"DiLoCo − IsoLoCo = {g:+.4f} ± {h:.4f}."))
        sp, fp = rows9["mean, outer SGD, top-k 3% both ways"], rows9["mean, outer SGD"]
        if sp and fp:
            g, h = diff_ci(sp, fp)
            w(f"Top-k 3% both ways − fp32 (both under outer SGD, each tuned here) = {g:+.4f} ± {h:.4f}.")
            claims.append((f"top-k 3% both ways within 0.02 nats of fp32 at {HR} outer rounds",
                           label(g + h <= MARGIN, g <= MARGIN), f"top-k 3% − fp32 = {g:+.4f} ± {h:.4f}."))
        sl, dl = rows9["SparseLoCo"], rows9["DiLoCo"]
        if sl and dl:
            g, h = diff_ci(sl, dl)
            w(f"SparseLoCo (top-k 3% per chunk of 4096 in its 2-bit bins, error feedback β = 0.95, outer SGD, every "
              f"changed entry broadcast) − DiLoCo (fp32, Nesterov) = {g:+.4f} ± {h:.4f}" +
              (f"; − today's top-k 3% both ways = {diff_ci(sl, sp)[0]:+.4f} ± {diff_ci(sl, sp)[1]:.4f}" if sp else "") + ".")
            claims.append((f"SparseLoCo matches or beats full-precision DiLoCo at {HR} outer rounds (Sarfi et al. 2025)",
                           label(g + h <= MARGIN, g <= MARGIN), f"SparseLoCo − DiLoCo = {g:+.4f} ± {h:.4f}."))
        if rows9["Decoupled DiLoCo, failures"] and rows9["DP, no failures"]:
            g, h = diff_ci(rows9["Decoupled DiLoCo, failures"], rows9["DP, no failures"])
            w(f"Decoupled (failures) − DP = {g:+.4f} ± {h:.4f}.\n")
            claims.append((f"Decoupled DiLoCo with failures matches DP without at {HR} outer rounds",
                           label(g + h <= MARGIN, g <= MARGIN), f"Decoupled − DP = {g:+.4f} ± {h:.4f}."))
    # 10.
    claims.section("experiment 10")
    w(f"## 10. Many learners: IsoLoCo against DiLoCo up to M = {max(S['many_ms'])}\n")
    w(f"Model: {S.get('many_model', S['small_model'])}. Equal total tokens: {many_total(S)} inner steps in all "
      f"({S['many_rounds']} outer rounds at M = {max(S['many_ms'])}); both methods tuned (η and μ) at every M.\n")
    w("| M | DiLoCo | IsoLoCo | DiLoCo − IsoLoCo (paired) |\n|---|---|---|---|")
    gaps10 = []
    for Mm in S["many_ms"]:
        d, i = seeds_sorted(res, "e10", f"diloco M={Mm}"), seeds_sorted(res, "e10", f"isoloco M={Mm}")
        if d and i:
            g, h = diff_ci(d, i)
            gaps10.append((Mm, g, h, deltas(d, i)))
            w(f"| {Mm} | {fmt(d)} | {fmt(i)} | {g:+.4f} ± {h:.4f} |")
    if len(gaps10) >= 2:
        claims.append(widens(f"the IsoLoCo gap keeps widening up to M = {gaps10[-1][0]}", gaps10))
    w("")
    # 11.
    claims.section("experiment 11")
    w(f"## 11. MuLoCo: Muon as the inner optimizer (M = {S['m_exp']}, equal tokens)\n")
    w("DiLoCo's mean and Nesterov outer step over learners that train with Muon (`merge.preset = muloco`: Muon on the "
      "hidden matrices, AdamW on embeddings, head and vectors; src/train/muon.h) against the same with AdamW, each with "
      "its outer step tuned here, and each against its own DP baseline (one learner with the global batch and the same "
      "inner optimizer, at train.lr). The relative gap is (method − its DP) / its DP.\n")
    rows11 = {v: seeds_sorted(res, "e11", v) for v in ("DiLoCo (AdamW)", "MuLoCo (Muon)", "MuLoCo, int2 + error feedback",
                                                        "DP, AdamW", "DP, Muon")}
    w("| run | test loss |\n|---|---|")
    for v, xs in rows11.items():
        if xs:
            w(f"| {v} | {fmt(xs)} |")
    d11, m11, i11 = rows11["DiLoCo (AdamW)"], rows11["MuLoCo (Muon)"], rows11["MuLoCo, int2 + error feedback"]
    if d11 and m11:
        g, h = diff_ci(m11, d11)
        w(f"\nMuLoCo − DiLoCo = {g:+.4f} ± {h:.4f}")
        claims.append((f"MuLoCo beats DiLoCo at M = {S['m_exp']} at equal tokens", label(g + h < 0, g < 0),
                       f"MuLoCo − DiLoCo = {g:+.4f} ± {h:.4f}."))
    if d11 and m11 and rows11["DP, AdamW"] and rows11["DP, Muon"]:
        ga, gm = rel_gaps(d11, rows11["DP, AdamW"]), rel_gaps(m11, rows11["DP, Muon"])
        g, h = diff_ci(BySeed((x / 2 for x in ga), ga.seeds), gm)  # DiLoCo's half gap − MuLoCo's, per seed
        w(f"\nRelative gap to its DP: DiLoCo {fmt_pct(ga)} (to AdamW DP), MuLoCo {fmt_pct(gm)} (to Muon DP)")
        claims.append((f"MuLoCo's relative gap to Muon DP is at most half DiLoCo's to AdamW DP at M = {S['m_exp']}",
                       label(g - h >= 0, g >= 0), f"MuLoCo {fmt_pct(gm)}, DiLoCo {fmt_pct(ga)}; half DiLoCo's − MuLoCo's "
                       f"= {g:+.2%} ± {h:.2%} (paired by seed; DP at train.lr, untuned here)."))
    if m11 and i11:
        g, h = diff_ci(i11, m11)
        w(f"\nMuLoCo int2 + error feedback − fp32 = {g:+.4f} ± {h:.4f}")
        claims.append((f"MuLoCo's int2 pushes with error feedback are within {MULOCO_INT2_MARGIN} nats of fp32",
                       label(abs(g) + h <= MULOCO_INT2_MARGIN, abs(g) <= MULOCO_INT2_MARGIN),
                       f"int2 − fp32 = {g:+.4f} ± {h:.4f}."))
    w("")
    e12(res, S, w, claims)
    claims.close()
    w("## The claims\n")
    w("| claim | label | why |")
    w("|---|---|---|")
    for c, lab, why in claims:
        w(f"| {c} | **{lab}** | {why} |")
    w("")
    w("Rules of the labels. A claim that one is better: *reproduced* when the 95% interval of the paired difference\n"
      "lies wholly on the claimed side, *partly* when only the mean does. A claim that one matches the other (the grace\n"
      f"window, int4, Decoupled against DP, Iso-C+SGD against DiLoCo): *reproduced* when the interval's worse end is\n"
      f"within a margin of {MARGIN} nats (or the claim's own), *partly* when the mean is. A claim over several M or sizes\n"
      "needs it at every one; a gap that grows or shrinks is judged by its change between the ends, paired by seed.\n"
      "Otherwise *not reproduced*. Negative results stay in. *Pending*: some run the claim's section rests on is still\n"
      "to do (a seed without a row, or a method whose tuning is unfinished); the why gives the verdict on the rows so\n"
      "far, which the missing runs may still change.\n")
    if not quick:
        science_before.section(w, claims, res, S)
    notes = shortfalls(res, S, {c: lab for c, lab, _ in claims})
    if notes:
        w("## Where a claim falls short: what the results themselves show\n")
        w("\n".join(f"* {n}" for n in notes) + "\n")
    w("## Regenerate\n")
    w("```\nscripts/science.sh --quick         # the quick scale, about 400 runs, 15-20 minutes on 2 cores\n"
      "scripts/science.sh --smoke         # the quick scale, one seed, each method at its preset (no tuning runs): 75 runs, about 3 minutes (CI)\n"
      "scripts/science.sh                 # the full suite (runs/science; hours; resumable)\n"
      "scripts/science.py --report-only [--quick] [--out DIR] --doc docs/science.md\n```\n")
    os.makedirs(os.path.dirname(doc) or ".", exist_ok=True)
    open(doc, "w").write("\n".join(L))
    print(f"science: wrote {doc}")


def shortfalls(res, S, labels):
    """One paragraph per claim that is not fully reproduced, from the suite's own numbers (the why behind the label)."""
    notes, M, H = [], S["m_exp"], S["sync_every"]
    labels = {c: ("reproduced" if lab == "pending" else lab) for c, lab in labels.items()}  # judged when complete
    rounds = S["total_steps"] // M // H

    def mean(exp, variant, field="final_val_loss"):
        v = [x for x in seeds_sorted(res, exp, variant, field) if x is not None]
        return statistics.fmean(v) if v else float("nan")

    if labels.get("IsoLoCo beats DiLoCo averaging", "reproduced") != "reproduced":
        d, i = seeds_sorted(res, "e1", "diloco M=1"), seeds_sorted(res, "e1", "isoloco M=1")
        g, h = diff_ci(d, i) if d and i else (float("nan"), float("nan"))
        if g - h <= 0:  # the shortfall is at M = 1
            notes.append(f"*IsoLoCo beats DiLoCo*, at M = 1: with one learner there is nothing to merge, and Iso-C only "
                         f"flattens the singular values of one pseudo-gradient. With both methods' η and μ tuned, that "
                         f"is worth {g:+.4f} ± {h:.4f}: the edge that docs/sim.md's one-seed tables, with the papers' "
                         "untuned outer learning rates, showed at M = 1 does not survive tuning.")
    if labels.get("the grace window keeps quality close to K = M", "reproduced") != "reproduced":
        for v in ("K=1 + grace, fast link", "K=1 + grace"):
            per, op, win = mean("e3", v, "per_merge"), mean("e3", v, "grace_open"), mean("e3", v, "grace_mean")
            a, c = mean("e3", v, "outer_steps"), M * rounds
            if math.isfinite(a):
                notes.append(f"*The grace window* ({v}): the {c} contributions of a run went into {a:.1f} merges "
                             + (f"({per:.2f} per merge; the window was open at {100 * op:.0f}% of them, {win:.2f} s on "
                                f"average). " if math.isfinite(per) else ". ")
                             + ("With about one learner per merge, each merge still moves the model by one learner's "
                                "update, which is what K = 1 costs against averaging M of them."
                                if a > 0.6 * c else "The window gathers several learners per merge here; what remains "
                                "is the staleness of the slow half's pushes."))
                break
    if labels.get("RDA beats the token-weighted mean", "reproduced") != "reproduced":
        r4, k4, m4 = (seeds_sorted(res, "e4", v) for v in ("rda", "mean_k1", "diloco"))
        if r4 and k4 and m4:
            g, h = diff_ci(k4, r4)
            g2, h2 = diff_ci(m4, r4)
            notes.append(f"*RDA against the mean*: tuned alike at K = 1, the token-weighted mean is {g:+.4f} ± {h:.4f} "
                         f"behind RDA. Against the mean run with synchronous DiLoCo's outer step, RDA's edge is "
                         f"{g2:+.4f} ± {h2:.4f}, so nearly all of that edge comes from the outer step size at K = 1, "
                         "not from the merge." if abs(g) < abs(g2) / 4 else
                         f"*RDA against the mean*: tuned alike at K = 1, the token-weighted mean is {g:+.4f} ± {h:.4f} "
                         f"behind RDA, against {g2:+.4f} ± {h2:.4f} with synchronous DiLoCo's outer step.")
    if labels.get("2-bit hurts", "reproduced") != "reproduced":
        f32, i2 = seeds_sorted(res, "e5", "fp32"), seeds_sorted(res, "e5", "int2")
        if f32 and i2:
            g, h = diff_ci(i2, f32)
            notes.append(f"*2-bit hurts*: with error feedback each push carries the rounding error of the earlier ones "
                         f"forward, and over {rounds} outer rounds int2 showed no detectable loss: int2 − fp32 = "
                         f"{g:+.4f} ± {h:.4f}. "
                         "The suite runs 2-bit only with error feedback and only this long; either may be why it "
                         "shows no loss here.")
    if labels.get("Decoupled DiLoCo with failures matches DP without", "reproduced") != "reproduced":
        x7, x4, dp = (mean("e7", "Decoupled DiLoCo, failures"), mean("e4", "rda"), mean("e7", "DP, no failures"))
        if all(math.isfinite(x) for x in (x7, x4, dp)):
            main = "the failures are not the main cost" if x7 - x4 < x4 - dp else "most of the gap is the failures'"
            notes.append(f"*Decoupled DiLoCo against DP*: {main}. The same Decoupled "
                         f"DiLoCo without failures (experiment 4, RDA) ends at {x4:.4f}, so failures cost "
                         f"{x7 - x4:+.4f}. The other {x4 - dp:+.4f} is what {rounds} outer rounds of H = {H} lose "
                         f"against {S['total_steps'] // M} exact data-parallel steps of the same tokens. It is a "
                         "gap of the method at this short horizon. The papers compare over far more outer rounds.")
    return notes


def pyplot(name):
    """matplotlib's pyplot (headless), or None with a message when it is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        print("science: matplotlib is missing (apt-get install python3-matplotlib): no plot " + name, file=sys.stderr)
        return None


def save(plt, fig, ax, path, title, xlabel, ylabel, legend):
    ax.set_title(title)
    if xlabel:
        ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if legend:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot(plots_dir, name, title, xlabel, ylabel, series, logx=False):
    """PNG with error bars (matplotlib when installed; otherwise the report says so)."""
    plt = pyplot(name)
    if plt is None:
        return
    os.makedirs(plots_dir, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    for label_, pts in series.items():
        if pts:
            xs, ms, hs = zip(*pts)
            ax.errorbar(xs, ms, yerr=[h if math.isfinite(h) else 0 for h in hs], marker="o", capsize=3, label=label_)
    if logx:
        ax.set_xscale("log", base=2)
    save(plt, fig, ax, os.path.join(plots_dir, name), title, xlabel, ylabel, legend=True)


def curves(plots_dir, name, title, xlabel, ylabel, items):
    """Line chart, one colour per item and one line per seed: items = [(label, [curve or None per seed])]."""
    plt = pyplot(name)
    if plt is None:
        return False
    items = [(l, [c for c in cs if c]) for l, cs in items]
    if not any(cs for _, cs in items):
        return False
    os.makedirs(plots_dir, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for i, (l, cs) in enumerate(items):
        for j, c in enumerate(cs):
            xs, ys = zip(*c)
            ax.plot(xs, ys, color=f"C{i}", alpha=0.8, linewidth=1.2, label=l if j == 0 else None)
    ys = [y for _, cs in items for c in cs for _, y in c[1:]]
    if ys:  # the first evaluation (the untrained model) would flatten the rest
        lo, hi = min(ys), max(ys)
        ax.set_ylim(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
    xs = [x for _, cs in items for c in cs for x, _ in c]
    if max(xs) > 5 * statistics.median(c[-1][0] for _, cs in items for c in cs):  # one method far slower: log time
        ax.set_xscale("symlog", linthresh=10)
        ax.set_xlim(left=0)
        xlabel += " (logarithmic beyond 10)"
    save(plt, fig, ax, os.path.join(plots_dir, name), title, xlabel, ylabel, legend=True)
    return True


def bars(plots_dir, name, title, ylabel, items):
    """Bar chart with 95% error bars: items = [(label, values)]."""
    plt = pyplot(name)
    if plt is None:
        return False
    items = [(l, v) for l, v in items if v]
    if not items:
        return False
    os.makedirs(plots_dir, exist_ok=True)
    fig, ax = plt.subplots(figsize=(max(4, 1.1 * len(items) + 1), 3.6))
    ms = [mean_ci(v)[0] for _, v in items]
    hs = [mean_ci(v)[1] if math.isfinite(mean_ci(v)[1]) else 0 for _, v in items]
    ax.bar(range(len(items)), ms, yerr=hs, capsize=4, color="#4c78a8")
    ax.set_xticks(range(len(items)))
    ax.set_xticklabels([l for l, _ in items], rotation=20, ha="right")
    lo = min(m - h for m, h in zip(ms, hs))
    hi = max(m + h for m, h in zip(ms, hs))
    pad = 0.1 * (hi - lo) if hi > lo else 0.1
    ax.set_ylim(lo - pad if lo > 0 and ylabel.endswith("loss") else 0, hi + pad)
    save(plt, fig, ax, os.path.join(plots_dir, name), title, None, ylabel, legend=False)
    return True
