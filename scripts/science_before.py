"""Issue 54's faults in the science suite's protocol, and every claim's label before the fixes and after them: the
section "The protocol's faults: before and after" of docs/science.md (science_report.report writes it).

The labels before are the full suite's under issue 33's protocol, the claims table of docs/science.md at BEFORE_REV
(540 runs, every experiment complete). They are kept in docs/science/labels-before.json, which
`scripts/science_before.py` writes again from that revision (parse_claims reads the table); the labels after are the
report's own, pending while a run a claim rests on is still to do."""
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from science_protocol import (ROOT, SWEEP_BANDWIDTHS, diff_ci, grid, method_order, point_seeds, probe_point,  # noqa: E402
                              seeds_sorted, tuning_points, tuning_sets)

BEFORE_REV = "28eb9b2"
BEFORE_FILE = os.path.join(ROOT, "docs", "science", "labels-before.json")

# The faults issue 54 found (its words, shortened), what changed, and the claims (named as before) each bears on.
FAULTS = [
    ("DiLoCo's rows per M kept μ = 0.9 (μ was searched only where a method was first tuned)",
     "μ is searched wherever η is: per setting and per M (experiments 1, 9 and 10 included)",
     ["IsoLoCo beats DiLoCo averaging", "the gap widens as learners multiply", "IsoLoCo beats DiLoCo at 32 outer rounds",
      "the IsoLoCo gap keeps widening up to M = 64"]),
    ("Delayed Nesterov applied the whole outer gradient at every merge",
     "Liu et al. 2024's form (g/N at each merge, the momentum step once every N, with its correction); the old form "
     "kept as a named variant (`dn_whole_fast`) beside it",
     ["some K = 1 configuration is within 0.05 nats of K = M with goodput ≥ 0.8 (issue 33's goal)",
      "under failures Decoupled DiLoCo is ahead of synchronous DiLoCo at equal wall time"]),
    ("the asynchronous variants were tuned in the decoupled setting (4 fragments, equal speeds) but reported in "
     "experiments 3 and 8",
     "each variant is tuned in the setting it is reported in",
     ["the grace window keeps quality close to K = M",
      "some K = 1 configuration is within 0.05 nats of K = M with goodput ≥ 0.8 (issue 33's goal)",
      "where a synchronisation fits inside the overlap, the grace window improves K = 1's quality"]),
    ("every run used sync.delta_anchor = global; base never ran",
     "base beside global in experiments 3, 4 and 8, the slow link included",
     ["the grace window keeps quality close to K = M", "RDA beats the token-weighted mean",
      "where a synchronisation fits inside the overlap, the grace window improves K = 1's quality"]),
    ("experiment 3's goodput claim compared overlapped K = 1 with blocking K = M on the 1 MB/s link only",
     "a K = M row on the fast link",
     ["K = 1 keeps goodput high where K = M waits for the slow half"]),
    ("the top-k rows were not SparseLoCo, and their 'partly' broke the stated rule",
     "SparseLoCo as its paper runs it (chunked top-k, 2-bit values, error feedback with decay, its broadcast) beside "
     "top-k at 32 outer rounds; every label by the stated rule",
     ["top-k 3% both ways: ≤ 1/20 of int4 + bf16 bytes, within 0.02 nats of fp32",
      "top-k 3% both ways within 0.02 nats of fp32 at 32 outer rounds"]),
    ("seeds were added while an interval straddled its threshold (optional stopping); the run count included "
     "tuning runs no choice used",
     "the seeds of every point fixed in advance, 5 for every point alike; counts and hours of the runs in use only",
     None),  # every claim
    ("the Newton–Schulz Iso-C row was the 10-step convergent schedule, not the fast variant",
     "the fast variant (5 steps, bf16) as a row of experiment 2, with its merge time",
     ["the fast (Newton–Schulz) Iso-C loses no quality against exact Iso-C"]),
    ("M = 32 and 64 ran only 2–4 outer rounds",
     "32 outer rounds at every M of experiment 10 (experiment 12's smallest model, H = 10)",
     ["the IsoLoCo gap keeps widening up to M = 64"]),
]

# Claims the fixes renamed or split: the name before → the names after.
RENAMED = {
    "the fast (Newton–Schulz) Iso-C loses no quality against exact Iso-C":
        ["the 10-step Newton–Schulz Iso-C (fp32) loses no quality against exact Iso-C",
         "the fast Newton–Schulz Iso-C (5 steps, bf16) loses no quality against exact Iso-C"],
}

# The report's section of each claim before: while a section has no claim formed yet, the report holds one pending
# line for it ("experiment N: its claims").
SECTIONS = {
    "experiment 1": ["IsoLoCo beats DiLoCo averaging", "the gap widens as learners multiply"],
    "experiment 2": ["Iso-C with plain SGD beats the mean with SGD",
                     "the fast (Newton–Schulz) Iso-C loses no quality against exact Iso-C",
                     "Iso-C with SGD matches or beats DiLoCo with Nesterov"],
    "experiment 3": ["K = 1 keeps goodput high where K = M waits for the slow half",
                     "the grace window keeps quality close to K = M",
                     "some K = 1 configuration is within 0.05 nats of K = M with goodput ≥ 0.8 (issue 33's goal)"],
    "experiment 4": ["RDA beats the token-weighted mean"],
    "experiment 5": ["int4 stays lossless", "2-bit hurts",
                     "top-k 3% both ways: ≤ 1/20 of int4 + bf16 bytes, within 0.02 nats of fp32"],
    "experiment 6": ["under failures Decoupled DiLoCo is ahead of synchronous DiLoCo at equal wall time",
                     "under failures Decoupled DiLoCo keeps its uptime where synchronous training loses it"],
    "experiment 7": ["Decoupled DiLoCo with failures matches DP without"],
    "experiment 8": ["where a synchronisation fits inside the overlap, the grace window improves K = 1's quality"],
    "experiment 9": ["IsoLoCo beats DiLoCo at 32 outer rounds",
                     "top-k 3% both ways within 0.02 nats of fp32 at 32 outer rounds",
                     "Decoupled DiLoCo with failures matches DP without at 32 outer rounds"],
    "experiment 10": ["the IsoLoCo gap keeps widening up to M = 64"],
    "experiment 11": ["MuLoCo beats DiLoCo at M = 8 at equal tokens",
                      "MuLoCo's relative gap to Muon DP is at most half DiLoCo's to AdamW DP at M = 8",
                      "MuLoCo's int2 pushes with error feedback are within 0.01 nats of fp32"],
}


def parse_claims(text):
    """The claims table of a docs/science.md: [(claim, label, why)] in its order. Raises ValueError without one."""
    m = re.search(r"^## The claims\n\n\| claim \| label \| why \|\n\|---\|---\|---\|\n((?:\|.*\|\n)+)", text, re.M)
    if not m:
        raise ValueError("no claims table (a '## The claims' section with | claim | label | why |)")
    out = []
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) != 3 or not re.fullmatch(r"\*\*[a-z ]+\*\*", cells[1]):
            raise ValueError(f"a claims row that does not parse: {line!r}")
        out.append((cells[0], cells[1].strip("*"), cells[2]))
    return out


def load_before(path=BEFORE_FILE):
    """(source, [(claim, label, why)]) from the labels file; None when it is missing."""
    if not os.path.exists(path):
        return None
    d = json.load(open(path))
    return d["source"], [(c["claim"], c["label"], c["why"]) for c in d["claims"]]


def faults_of(claim):
    """The numbers (1-based) of the faults that bear on `claim` (named as before)."""
    return [i + 1 for i, (_, _, claims) in enumerate(FAULTS) if claims is None or claim in claims]


def after(claim, now):
    """[(name now, label, why)] for a claim named as before, from the report's claims `now` (name → (label, why)):
    its own line(s), else its section's pending line, else nothing."""
    names = RENAMED.get(claim, [claim])
    found = [(n, *now[n]) for n in names if n in now]
    if found:
        return found
    for sec, claims in SECTIONS.items():
        if claim not in claims:
            continue
        if f"{sec}: its claims" in now:
            return [(f"{sec}: its claims", *now[f"{sec}: its claims"])]
        # The section judged other claims but not this one yet: the rows it rests on are still to run.
        if any(now.get(n, ("",))[0] == "pending" for c in claims for n in RENAMED.get(c, [c])):
            return [(claim, "pending", "its rows are still to run")]
    return []


def short(label, why):
    """A label after, with the verdict on the rows so far when it is pending."""
    m = re.search(r"on the rows so far: (reproduced|partly|not reproduced)", why)
    runs = re.match(r"(\d+) runs? still to do", why)
    if label == "pending" and runs:
        return f"**pending** ({runs.group(1)} runs to do" + (f"; so far *{m.group(1)}*" if m else "") + ")"
    if label == "pending":
        return f"**pending** ({why})"
    return f"**{label}**"


def section(w, claims, res, S):
    """Writes the section from the report's claims [(claim, label, why)] and rows `res` (scale S); nothing when the
    labels file is missing."""
    before = load_before()
    if before is None:
        return
    source, rows = before
    now = {c: (lab, why) for c, lab, why in claims}
    w("## The protocol's faults: before and after (issue 54)\n")
    w("A review of the suite under issue 33's protocol found these faults; each is fixed as said, and every experiment "
      "runs again under the fixed protocol. The labels before are " + source + "; the labels after are this "
      "report's (the claims table above has their numbers), *pending* until the runs they rest on are done.\n")
    for i, (fault, fix, _) in enumerate(FAULTS, 1):
        w(f"{i}. *{fault}.* Now: {fix}.")
    w("")
    w("| claim (before) | faults | before | why before | after |")
    w("|---|---|---|---|---|")
    changed = 0
    for claim, lab, why in rows:
        got = after(claim, now)
        cell = "; ".join((f"{n}: " if n != claim else "") + short(a, y) for n, a, y in got) or "not in this report"
        changed += any(a not in ("pending", lab) for _, a, _ in got)
        w(f"| {claim} | {', '.join(map(str, faults_of(claim)))} | **{lab}** | {why} | {cell} |")
    judged = sum(1 for claim, _, _ in rows if any(a != "pending" for _, a, _ in after(claim, now)))
    w(f"\nOf the {len(rows)} claims before, {judged} {'is' if judged == 1 else 'are'} judged again so far, "
      f"{changed} with a different label.\n")
    anchor_section(w, res, S)


# Fault 4: each row run with sync.delta_anchor = base beside the same row with the paper's global anchor.
ANCHOR_PAIRS = ([("e3", "K=1 + grace, base anchor", "K=1 + grace"),
                 ("e3", "K=1 + grace, fast link, base anchor", "K=1 + grace, fast link"),
                 ("e4", "rda, base anchor", "rda"), ("e4", "mean_k1, base anchor", "mean_k1"),
                 ("e4", "rda, fast link, base anchor", "rda, fast link")] +
                [("e8", f"{bw / 1e6:g} MB/s + grace, base anchor", f"{bw / 1e6:g} MB/s + grace") for bw in SWEEP_BANDWIDTHS])
# Fault 2: Delayed Nesterov as Liu et al. 2024 define it beside the earlier form (the whole g at every merge).
DN_PAIRS = [("e3", "K=1 + grace + delayed Nesterov, fast link", "K=1 + grace + delayed Nesterov (whole g), fast link"),
            ("e4", "delayed Nesterov, fast link", "delayed Nesterov (whole g), fast link"),
            ("e6", "Decoupled + delayed Nesterov, fast link", "Decoupled + delayed Nesterov (whole g), fast link")]


def pair_rows(res, S, pairs):
    """Per pair (exp, a, b) with rows: (exp, a, b, a's losses, b's losses, a diverged, b diverged, complete);
    diverged = runs that ended above their initial loss, complete = both have every seed fixed for them."""
    out = []
    for exp, a, b in pairs:
        la, lb = seeds_sorted(res, exp, a), seeds_sorted(res, exp, b)
        if not la or not lb:
            continue
        up = [sum(1 for x, x0 in zip(seeds_sorted(res, exp, n), seeds_sorted(res, exp, n, "initial_val_loss"))
                  if x is not None and x0 is not None and x > x0) for n in (a, b)]
        done = len(la) >= point_seeds(S, exp, a) and len(lb) >= point_seeds(S, exp, b)
        out.append((exp, a, b, la, lb, up[0], up[1], done))
    return out


def worse(rows, pairs):
    """Which side of the pairs is the worse, by the stated rule, or None while a pair is incomplete or missing: "b"
    when b diverges in more runs than a, or when a ends lower with its interval below zero in some pair and above
    zero in none; "a" by the mirror rule; else "neither"."""
    if len(rows) < pairs or not all(r[7] for r in rows):
        return None
    diffs = [diff_ci(la, lb) for _, _, _, la, lb, _, _, _ in rows]
    div_a, div_b = sum(r[5] for r in rows), sum(r[6] for r in rows)
    a_better = any(d + h < 0 for d, h in diffs) and not any(d - h > 0 for d, h in diffs)
    b_better = any(d - h > 0 for d, h in diffs) and not any(d + h < 0 for d, h in diffs)
    if div_b > div_a or (div_b == div_a and a_better):
        return "b"
    if div_a > div_b or (div_a == div_b and b_better):
        return "a"
    return "neither"


def pair_section(w, res, S, title, pairs, names, rule, verdicts):
    """One fault's evidence: the rows of `pairs` side by side (columns `names`), the `rule`, and the verdict
    (`verdicts`: "a", "b", "neither" → its sentence) once every pair is complete."""
    rows = pair_rows(res, S, pairs)
    if not rows:
        w(f"**{title}**: its {len(pairs)} pairs of rows (experiments {', '.join(sorted({p[0][1:] for p in pairs}))}) "
          "are still to run; the verdict waits for them.\n")
        return
    w(f"**{title}.** *diverged*: runs that ended above their initial loss.\n")
    w(f"| experiment | {names[0]} | {names[1]} | {names[0]} − {names[1]} (paired) | diverged |")
    w("|---|---|---|---|---|")
    for exp, a, b, la, lb, ua, ub, done in rows:
        d, h = diff_ci(la, lb)
        w(f"| {exp} | {a}: {sum(la) / len(la):.4f} ({len(la)}) | {b}: {sum(lb) / len(lb):.4f} ({len(lb)}) | "
          f"{d:+.4f} ± {h:.4f} | {ua} / {ub} |" + ("" if done else " (seeds to come)"))
    v = worse(rows, len(pairs))
    w("\n" + rule + " " + (f"Pending: {len(pairs) - sum(1 for r in rows if r[7])} of {len(pairs)} pairs are still to "
                           "complete." if v is None else f"**Verdict: {verdicts[v]}**") + "\n")


def anchor_section(w, res, S):
    """Faults 2 and 4: the evidence that decides the anchor's default and which Delayed Nesterov is the better."""
    pair_section(w, res, S, "Fault 4, the anchor (base against global)", ANCHOR_PAIRS, ("base", "global"),
                 "The rule: global is the less stable anchor when it diverges in more runs than base, or when base ends "
                 "lower with its interval below zero in some row and above it in none (base by the mirror rule); the "
                 "less stable one does not stay the default (docs/sim.md says why).",
                 {"b": "the global anchor is the less stable.", "a": "the base anchor is the less stable.",
                  "neither": "neither anchor is the less stable by this rule."})
    pair_section(w, res, S, "Fault 2, Delayed Nesterov (Liu et al.'s form against the whole g)", DN_PAIRS,
                 ("Liu et al.", "whole g"),
                 "The rule, the same: the form that diverges in more runs, or that ends higher with its interval apart "
                 "from zero in some row and on the other side in none, is the worse; both stay, named.",
                 {"b": "Liu et al.'s form is the better.", "a": "the whole-g form is the better (kept as dn_whole_fast).",
                  "neither": "neither form is the better by this rule."})


def mu_probes(w, res, S, best):
    """The probes below μ's grid edge (science_protocol.probe_point): for each choice at its grid's smallest μ, the
    dev loss there and at the same η with MU_PROBE_STEP less μ, and what the report may conclude from them."""
    rows, nesterov = [], [m for m in best if len(grid(S, m)[1]) > 1 and not tuning_points(res, S, m)[1]]  # final
    for meth in sorted(nesterov, key=method_order):
        pp = probe_point(res, S, meth)
        if pp is not None:
            lr, mu, inner = best[meth]
            at, pr = res.get(tuning_sets(S, meth, lr, mu, inner)), res.get(tuning_sets(S, meth, *pp, inner))
            rows.append((meth, lr, mu, pp[1], at["final_val_loss"], pr["final_val_loss"] if pr else None))
    if not rows:
        return
    w(f"μ's grid has two points, and {len(rows)} of the {len(nesterov)} Nesterov choices are its smaller one. Each has one "
      "probe at the same η and μ one step lower (dev half, seed 0). A probe moves no choice: a moved choice would "
      "rerun every reported run of its method, more than the suite's whole budget. It measures the slack the edge "
      "leaves instead.\n")
    w("| method | η | chosen μ: dev loss | probe μ: dev loss | probe − choice |\n|---|---|---|---|---|")
    for meth, lr, mu, pmu, a, p in rows:
        w(f"| {meth} | {lr} | {mu}: {a:.4f} | {pmu}: " + (f"{p:.4f} | {p - a:+.4f} |" if p is not None else "to do | |"))
    done = sorted(p - a for *_, a, p in rows if p is not None and a is not None)
    if done:
        lower = [d for d in done if d < 0]
        w(f"\nThe probe is lower for {len(lower)} of {len(done)} probed choices" +
          (f" (by {-lower[-1]:.4f} to {-lower[0]:.4f} nats, median {-lower[len(lower) // 2]:.4f})" if lower else "") +
          ". Those methods were tuned to the edge of their grid, and the rows reporting them may understate what a "
          "wider μ grid would give.\n")


def extract(rev=BEFORE_REV, path=BEFORE_FILE):
    """Writes the labels file from docs/science.md at git revision `rev`."""
    text = subprocess.run(["git", "-C", ROOT, "show", f"{rev}:docs/science.md"], check=True, capture_output=True,
                          text=True).stdout
    claims = parse_claims(text)
    runs = re.search(r"^\* Runs: (\d+)", text, re.M)
    d = {"source": f"docs/science.md at {rev} (the full suite under issue 33's protocol" +
                   (f", {runs.group(1)} runs" if runs else "") + ", every experiment complete)",
         "rev": rev,
         "claims": [{"claim": c, "label": lab, "why": why} for c, lab, why in claims]}
    with open(path, "w") as f:
        json.dump(d, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"science_before: {len(claims)} claims from {rev} → {os.path.relpath(path, ROOT)}")


if __name__ == "__main__":
    extract(sys.argv[1] if len(sys.argv) > 1 else BEFORE_REV)
