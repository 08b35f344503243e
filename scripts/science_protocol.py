"""The science suite's protocol (scripts/science.py is the driver): the scale, the methods (the binary's presets),
the planned experiments, the results file (Results), the tuning grids, the seeds each point is reported with and the
jobs that follow, with the statistics they are judged by. Running: science_runs.py; the report: science_report.py."""
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import tomllib

import jsonl_records  # scripts/science.py puts this folder on sys.path first

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# A "matches" claim holds within this many nats (per byte or token) of validation loss.
MARGIN = 0.02
# Issue 33's goal for a K = 1 configuration against K = M (interval included).
GOAL_MARGIN = 0.05


# ---- the statistics ----------------------------------------------------------------------------------------------
# Student's t, two-sided 95%, by degrees of freedom.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def mean_ci(xs):
    """(mean, half-width of the 95% interval of the mean); half-width NaN for one value."""
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, float("nan")
    return m, T95.get(len(xs) - 1, 1.96) * statistics.stdev(xs) / math.sqrt(len(xs))


def matched(a, b):
    """(seeds, pairs): the values (x, y) of a and b with the same seed (same initialisation and data order), and
    those seeds, where both came from seeds_sorted (BySeed); else by position, seeds None."""
    if hasattr(a, "seeds") and hasattr(b, "seeds"):
        yb = dict(zip(b.seeds, b))
        ks = [k for k in a.seeds if k in yb]
        xa = dict(zip(a.seeds, a))
        return ks, [(xa[k], yb[k]) for k in ks]
    return None, list(zip(a, b))


def per_seed(a, b, f):
    """f(x, y) for each pair of matched(a, b), as a BySeed where the pairs have seeds."""
    ks, pairs = matched(a, b)
    vals = [f(x, y) for x, y in pairs]
    return vals if ks is None else BySeed(vals, ks)


def diff_ci(a, b):
    """Mean and 95% half-width of a − b over paired seeds."""
    d = deltas(a, b)
    return mean_ci(d) if d else (float("nan"), float("nan"))


def rel_gaps(a, b):
    """(x − y) / y per seed: a relative gap per seed."""
    return per_seed(a, b, lambda x, y: (x - y) / y)


def deltas(a, b):
    """x − y per seed, for a change between two differences to pair by seed too."""
    return per_seed(a, b, lambda x, y: x - y)


def rel_ci(a, b):
    """Mean and 95% half-width of (a − b) / b over paired seeds: a relative gap."""
    g = rel_gaps(a, b)
    return mean_ci(g) if g else (float("nan"), float("nan"))


class BySeed(list):
    """A point's values in seed order, with .seeds, the seed of each (matched() pairs them by it)."""

    def __init__(self, values, seeds):
        super().__init__(values)
        self.seeds = list(seeds)


def label(cond_all, cond_some):
    return "reproduced" if cond_all else ("partly" if cond_some else "not reproduced")


def widens(claim, gaps):
    """The claim that a gap (M, mean, half-width, per-seed gaps) grows from the smallest M to the largest, by the
    paired change of the gap between them."""
    (m0, g0, h0, d0), (m1, g1, h1, d1) = gaps[0], gaps[-1]
    c, hc = diff_ci(d1, d0) if len(gaps) >= 2 else (float("nan"), float("nan"))
    return (claim, label(c - hc > 0, c > 0), f"the gap is {g0:+.4f} ± {h0:.4f} at M = {m0} and {g1:+.4f} ± {h1:.4f} at "
            f"M = {m1}; its change, paired by seed, {c:+.4f} ± {hc:.4f}.")


READ = set()  # every (experiment, variant) seeds_sorted was asked for: what the report's claims rest on (Claims)


def seeds_sorted(res, exp, variant, field="final_val_loss"):
    READ.add((exp, variant))
    rows = sorted((r for r in res.rows.values() if r["exp"] == exp and r["variant"] == variant), key=lambda r: r["seed"])
    return BySeed((r.get(field) for r in rows), (r["seed"] for r in rows))


# ---- the scale ---------------------------------------------------------------------------------------------------
def scale(quick, out):
    """Base --set overrides of every run, the learner counts of experiment 1, seeds, grids, inner steps."""
    if quick:
        base = ["model.block_size=32", "model.n_layer=2", "model.n_head=2", "model.n_embd=48", "train.batch_size=8",
                "train.lr=3e-3", "train.eval_tokens=4096", "train.threads=1", "data.path=" + os.path.join(ROOT, "data/sotu"),
                "data.val_fraction=0.05", "train.precision=fp32"]
        # fp32, named: the tiny model's bf16 and fp32 matmuls run at about the same speed here, and libtorch's bf16
        # matmuls are slow on CPUs without AVX-512 (not measured here; CI's machines vary). Until the simulator took train.precision = auto as fp32
        # (deloco/sim.h), auto timed the two at each run's start and chose bf16 in about 149 of 150 runs here.
        S = dict(base=base, ms=[1, 2, 4, 8], seeds=3, total_steps=800, sync_every=20, m_exp=4,
                 lr_factors=[0.6, 1.0, 1.5], momenta=[], model="tiny byte-level GPT (2 × 48, T = 32)",
                 small=base, small_model="the same tiny model", many_ms=[4, 16, 32], many_rounds=2,
                 horizon_rounds=32)
        # Experiment 12's sizes at the quick scale: pipeline sizes at 2 tokens per parameter, not a result.
        return dict(S, sizes_spec=dict(shapes=[(1, 1, 16), (1, 2, 32), (2, 2, 32)], block=32, tokens_per_param=2,
                                       inner_lr=3e-3, precision="fp32", eval_tokens=4096))
    # The full scale is sized to the budget, about 8 hours on 2 cores, by measurement (bf16 inner steps of
    # 8 × 128 tokens, single-threaded, one `deloco sim` run per core, on this machine). With deloco's kept-memory
    # malloc (util/malloc_tuning.h; before it, page faults doubled these): 6 × 384 (12.3M parameters) costs 0.43 s
    # of CPU per learner step and 4 × 256 (4.24M) 0.18 s (80-step runs, measured side by side). The plan is about
    # 150 runs of 1600 steps (the grids, their extensions, 3 seeds per reported point), so 12.3M would take about
    # 150 × 1600 × 0.43 s / 2 cores ≈ 14 h and 4.24M about 6 h; tuning runs took 260-290 s each, two at a time.
    # The aim of ≥ 10M parameters does not fit its 8 hours with 3 seeds and a tuned grid per method on
    # this machine; the token budget per run was kept instead (M = 16 still gets 4 outer rounds).
    tokens = os.path.join(out, "tokens")
    base = ["model.block_size=128", "model.n_layer=4", "model.n_head=4", "model.n_embd=256", "model.vocab_size=4096",
            "train.batch_size=8", "train.lr=2e-3", "train.precision=bf16", "train.eval_tokens=16384", "train.threads=1",
            "data.format=tokens", "data.path=" + tokens]
    # Experiments 9 and 10 (32 outer rounds per learner; 64 learners) do not fit at 4 × 256: they run a 2 × 128 model
    # on the same tokens (about a quarter of the step cost).
    small = ["model.block_size=128", "model.n_layer=2", "model.n_head=2", "model.n_embd=128", "model.vocab_size=4096",
             "train.batch_size=8", "train.lr=2e-3", "train.precision=bf16", "train.eval_tokens=16384",
             "train.threads=1", "data.format=tokens", "data.path=" + tokens]
    # Experiment 12's sizes (issue 54): byte-level models (vocabulary 256, so that the embeddings do not dominate
    # the parameters of a small model), each trained about 20 tokens per parameter, the compute-optimal budget of
    # Hoffmann et al. 2022 that Charles et al. 2025 train DiLoCo at. 0.075M, 0.125M and 0.373M parameters (5×) cost
    # about 25 s, 55 s and 340 s a run (bf16, one core; 46k, 22k tokens/s at the two larger, measured); the corpus has
    # 10.3M training bytes, so the largest sees 0.7 of it once. Its 95 runs (the tuning grids and 3 seeds) take about
    # 9 core-hours; a 0.84M size would take 4 times that.
    # Every reported point has 5 seeds (issue 54: fixed in advance for every point alike; 3 left claims that compare
    # a point outside a list of "decisive" pairs resting on 3).
    S = dict(base=base, ms=[1, 2, 4, 8, 16], seeds=5, total_steps=1600, sync_every=25, m_exp=8,
             lr_factors=[0.6, 1.0, 1.5], momenta=[0.8, 0.9],
             model="bf16 GPT, 4 × 256, T = 128, SentencePiece vocabulary 4096 (4.24M parameters)",
             small=small, small_model="bf16 GPT, 2 × 128, T = 128, SentencePiece vocabulary 4096",
             many_ms=[8, 32, 64], many_rounds=2, horizon_rounds=32)
    S = dict(S, sizes_spec=dict(shapes=[(2, 2, 48), (2, 2, 64), (3, 3, 96)], block=128, tokens_per_param=20,
                                inner_lr=4e-3, precision="bf16", eval_tokens=65536))
    # Experiment 10 at 32 outer rounds at its largest M (issue 54; it ran 2): 64 × 10 × 32 = 20,480 inner steps a
    # run, so on experiment 12's smallest model (2 × 48 bytes, 0.075M parameters, about 7 minutes a run) with H = 10.
    return dict(S, many_rounds=32, many_sync_every=10, many_base=sizes(S)[0]["base"],
                many_model="byte-level bf16 GPT, 2 × 48, T = 128 (experiment 12's smallest, 0.075M parameters), H = 10")


def gpt_parameters(n_layer, n_embd, vocab, block):
    """Parameters of deloco's built-in GPT with tied embeddings (include/deloco/gpt/config.h): per block the
    attention's 4 d×d matrices and the MLP's 2 d×4d ones with their biases (12d² + 9d) and two layer norms (4d); the
    token and position embeddings; the final layer norm (2d). 124,672 at 2 × 64, T = 128 (a run's summary agrees)."""
    return n_layer * (12 * n_embd * n_embd + 13 * n_embd) + (vocab + block) * n_embd + 2 * n_embd


def sizes(S):
    """Experiment 12's model sizes, smallest first: dict(name, params, total_steps, base) where total_steps (of
    `batch_size` sequences of `block` bytes) is the size's token budget, tokens_per_param × params, rounded to whole
    outer rounds of the largest M (8 learners × sync_every steps)."""
    spec, out = S["sizes_spec"], []
    for L, H, d in spec["shapes"]:
        n = gpt_parameters(L, d, 256, spec["block"])
        per_step, unit = 8 * spec["block"], 8 * S["sync_every"]
        steps = max(1, round(spec["tokens_per_param"] * n / per_step / unit)) * unit
        base = [f"model.block_size={spec['block']}", f"model.n_layer={L}", f"model.n_head={H}", f"model.n_embd={d}",
                "train.batch_size=8", f"train.lr={spec['inner_lr']}", f"train.precision={spec['precision']}",
                f"train.eval_tokens={spec['eval_tokens']}", "train.threads=1", "data.path=" + os.path.join(ROOT, "data/sotu"),
                "data.val_fraction=0.05"]
        out.append(dict(name=f"{n / 1e6:.3f}M", shape=f"{L} × {d}", params=n, total_steps=steps, base=base))
    return out


def size(S, name):
    return next(z for z in sizes(S) if z["name"] == name)


# ---- the experiments -------------------------------------------------------------------------------------------
# A method: the merge preset it runs and where it departs from that preset's outer optimizer. Its grid lies around
# its η and μ: η × the scale's lr_factors, and μ from the scale's momenta (Nesterov) or 0 (SGD). The presets' own
# kind, η and μ are read from the binary (`deloco config presets --json`, the table of deloco/algorithm.h) by
# load_methods(), never copied here.
METHOD_SPECS = {
    "diloco": dict(preset="diloco"),
    "isoloco": dict(preset="isoloco"),
    "mean_sgd": dict(preset="diloco", kind="sgd", lr=1.0, mu=0.0),  # the mean under plain SGD at η = 1
    # The same method tuned for top-k 3% pushes and broadcasts (experiment 9; issue 35): its own η.
    "mean_sgd_topk3": dict(preset="diloco", kind="sgd", lr=1.0, mu=0.0,
                           extra=["net.encoding=topk", "net.topk_bits=2", "net.topk_density=0.03",
                                  "net.broadcast_encoding=topk"]),
    # SparseLoCo as Sarfi et al. 2025 run it (issue 54): top-k 3% of every chunk of 4096 entries in their 2-bit code
    # (four bins per block of kept values, each decoded as its values' mean: net.topk_values = bins), error
    # feedback with decay β = 0.95 (the accumulator that takes the outer momentum's place), outer SGD on the mean, and
    # its exchange: every learner gets every entry the merge changed (a top-k broadcast at M × 3%, 8-bit values, the
    # rounding kept at the syncer, which at η = 1 under sync.delta_anchor = global never reaches the learners: the
    # merged model is then the learners' mean, docs/wire.md) instead of a re-sparsified 3%.
    "sparseloco": dict(preset="diloco", kind="sgd", lr=1.0, mu=0.0,
                       extra=lambda S: ["net.encoding=topk", "net.topk_bits=2", "net.topk_values=bins",
                                        "net.topk_density=0.03", "net.topk_chunk=4096", "net.error_feedback=true",
                                        "net.error_feedback_decay=0.95",
                                        "net.broadcast_encoding=topk", "net.broadcast_topk_bits=8",
                                        f"net.broadcast_topk_density={min(1.0, 0.03 * S['m_exp']):g}"]),
    "iso_c_sgd": dict(preset="iso_c_sgd"),
    "iso_cts": dict(preset="iso_cts"),
    "tsv": dict(preset="tsv"),
    "ties": dict(preset="ties"),
    "dare": dict(preset="dare"),
    "rda": dict(preset="decoupled"),
    # The token-weighted mean, tuned where RDA is (Decoupled DiLoCo, K = 1) on RDA's grid: experiment 4's fair peer.
    "mean_k1": dict(preset="diloco"),
    # IsoLoCo with the Newton–Schulz Iso-C (matrix products only): the 10-step fp32 schedule that converges to Iso-C
    # (a numerical-equality check), and the fast variant the IsoLoCo paper proposes (5 steps in bf16).
    "iso_c_ns": dict(preset="isoloco", extra=["merge.method=iso_c_ns"]),
    "iso_c_ns_fast": dict(preset="isoloco", extra=["merge.method=iso_c_ns", "merge.iso_ns_steps=5",
                                                   "merge.iso_ns_precision=bf16"]),
    # Where the grace window can work (FAST_LINK) and the asynchronous outer variants (issue 33), all at K = 1.
    "mean_fast": dict(preset="diloco", link="fast"),
    # Delayed Nesterov as Liu et al. 2024 define it (g/N per merge, the momentum once every N merges), and deloco's
    # earlier reading (the whole g per merge), kept as a variant: issue 54.
    "dn_fast": dict(preset="diloco", kind="delayed_nesterov", extra=lambda S: [f"outer.delay={S['m_exp']}"], link="fast"),
    "dn_whole_fast": dict(preset="diloco", kind="delayed_nesterov_whole", extra=lambda S: [f"outer.delay={S['m_exp']}"],
                          link="fast"),
    "stale_fast": dict(preset="diloco", extra=["sync.staleness=poly", "sync.staleness_exponent=1"], link="fast"),
    "dlu_fast": dict(preset="diloco", extra=["sync.dynamic_local_updates=true"], link="fast"),
    "rda_fast": dict(preset="decoupled", link="fast"),
    # MuLoCo (issue 53): DiLoCo's mean and Nesterov outer step over learners that train with Muon (the preset sets
    # train.optimizer = muon); its outer step tuned like DiLoCo's.
    "muloco": dict(preset="muloco"),
    # DP (experiment 12): one learner taking the global batch, its own inner learning rate (train.lr) tuned at each
    # size and batch; with AdamW and with Muon. The learners of the DiLoCo methods there train at the inner learning
    # rate DP chose at their own batch (one learner's, 8 sequences) and size.
    "dp": dict(dp="adamw"),
    "dp_muon": dict(dp="muon"),
}
METHODS = {}  # method -> dict(sets=["merge.preset=P", "outer.kind=K"], lr=η, mu=μ), filled by load_methods()


_JSON = {}  # (binary, argv) -> what it printed: a process asks each once (starting deloco takes about a second)


def deloco_json(args, *argv):
    """The JSON a `deloco` command prints (`config presets --json`, `config keys --json`), asked once per process."""
    if (args.deloco, argv) in _JSON:
        return _JSON[(args.deloco, argv)]
    _JSON[(args.deloco, argv)] = _deloco_json(args, *argv)
    return _JSON[(args.deloco, argv)]


def _deloco_json(args, *argv):
    try:
        r = subprocess.run([args.deloco, *argv], capture_output=True, text=True)
    except OSError as e:
        sys.exit(f"science: cannot run {args.deloco} ({e}); build it (cmake --build build) or pass --deloco PATH")
    if r.returncode != 0:
        sys.exit(f"science: {args.deloco} {' '.join(argv)} failed: {r.stderr.strip()}")
    return json.loads(r.stdout)


def load_methods(args, S):
    presets = {p["name"]: p["outer"] for p in deloco_json(args, "config", "presets", "--json")["presets"]}
    for meth, spec in METHOD_SPECS.items():
        if "dp" in spec:
            METHODS[meth] = dict(sets=[f"train.optimizer={spec['dp']}"], lr=S["sizes_spec"]["inner_lr"], mu=0.0,
                                 link="slow", base=meth, at=None, dp=True)
            continue
        outer = presets[spec["preset"]]
        extra = spec.get("extra", [])
        extra = extra(S) if callable(extra) else extra
        METHODS[meth] = dict(sets=[f"merge.preset={spec['preset']}", f"outer.kind={spec.get('kind', outer['kind'])}"] + extra,
                             lr=spec.get("lr", outer["lr"]), mu=spec.get("mu", outer["momentum"]),
                             link=spec.get("link", "slow"), base=meth, at=None)


def tuned_at(meth, where):
    """The method `meth` tuned in another setting: where = ("sync", M) for synchronous DiLoCo of M learners on the main
    model (experiment 1 tunes every method at every M), ("small", M) on the small model at experiment 10's token
    budget, ("horizon", M) on the small model at 32 outer rounds, ("horizon_k1", M) in Decoupled DiLoCo's setting
    there; experiment 12's ("size", M, name) for synchronous DiLoCo at a model size's token budget, ("size_k1", M,
    name) for Decoupled DiLoCo's setting there (int4 pushes), ("size_dp", M, name) for DP with M learners' batch.
    Returns its id (registered in METHODS)."""
    mid = f"{meth}@{where[0]}{where[1]}" + (f"/{where[2]}" if len(where) > 2 else "")
    if mid not in METHODS:
        METHODS[mid] = dict(METHODS[meth], at=where)
        if len(where) > 2 and where[0] != "size_dp":  # its learners train at DP's inner learning rate there
            METHODS[mid]["inner_from"] = tuned_at("dp_muon" if meth == "muloco" else "dp", ("size_dp", 1, where[2]))
    return mid


def tuned_here(meth, tag, sets):
    """The method `meth` tuned in the very setting `sets` of the point it is reported in (issue 54: the asynchronous
    variants were tuned in Decoupled DiLoCo's setting and reported in experiment 3's heterogeneous one). `tag` names
    the setting in the id, which is `meth@tag`."""
    mid = f"{meth}@{tag}"
    if mid not in METHODS:
        METHODS[mid] = dict(METHODS[meth], at=("here", tag), setting=list(sets))
    return mid


def method_order(meth):
    """Tuning order: experiment 12's smaller sizes first (their runs are the cheapest), then the rest by name."""
    at = METHODS[meth]["at"]
    return (at[2] if at is not None and len(at) > 2 else "", meth)


def methods_of(pts):
    """The method ids the points tune, with those whose choices they take (DP's inner learning rate), in tuning order."""
    out = set()
    todo = [m for _, _, m, _ in pts if m is not None]
    while todo:
        m = todo.pop()
        if m not in out:
            out.add(m)
            todo += [METHODS[m]["inner_from"]] if "inner_from" in METHODS[m] else []
    return sorted(out, key=method_order)


def check_keys(args, runs):
    """Stops before anything runs when a planned run sets a key `deloco sim` does not have (the keys are the
    experiments' own text; the binary's list, `deloco config keys --for sim --json`, is the authority)."""
    known = {k["key"] for k in deloco_json(args, "config", "keys", "--for", "sim", "--json")}
    unknown = sorted({s.split("=", 1)[0] for sets in runs for s in sets} - known)
    if unknown:
        sys.exit(f"science: keys that `{args.deloco} sim` does not know: {', '.join(unknown)}")


# Tuned in Decoupled DiLoCo's setting; every other method in synchronous DiLoCo's (the variants on FAST_LINK).
TUNED_AT_K1 = ("rda", "mean_k1", "mean_fast", "dn_fast", "dn_whole_fast", "stale_fast", "dlu_fast", "rda_fast")
# Tuning runs use this seed, which no reported run uses (reported seeds are 1..seeds): a reported number is never the
# run that won a choice.
TUNE_SEED = 0
# Where the grace window can work: a link on which one push, the merge and the answer (ξ_sync, about 2 s for the
# full-scale model's fp32 fragments with 0.5 s latency each way) fit inside τ inner steps (5 s), so the window
# γ(τ·ξ_step − ξ_quorum − ξ_sync) opens. configs/sim-diloco.toml's 1 MB/s link makes ξ_sync 10–35 s: the window is 0.
FAST_LINK = ["sim.bandwidth=6.4e7"]  # 64 MB/s (512 Mbit/s)
# Experiment 5b: the densities of the sparse pushes and broadcasts; the links its communication time is given at.
TOPK_DENSITIES = [0.01, 0.03, 0.1]
E5_LINKS_MBIT = [10, 100]
# Experiment 11: MuLoCo's int2 pushes with error feedback hold within this many nats of its fp32 pushes (issue 53).
MULOCO_INT2_MARGIN = 0.01
# Experiment 8: link bandwidths (bytes/s) swept with and without the grace window.
SWEEP_BANDWIDTHS = [5e5, 4e6, 3.2e7, 1.28e8]


def grid(S, meth):
    """(η values, μ values) of a method's tuning grid."""
    m = METHODS[meth]
    if m.get("dp"):  # DP: the inner learning rate (train.lr), no outer step
        return [round_lr(m, m["lr"] * f) for f in S["lr_factors"]], [0.0]
    lrs = [round(m["lr"] * f, 3) for f in S["lr_factors"]]
    # μ is searched wherever η is (issue 54: each M of experiments 1 and 10, the horizon and the asynchronous variants
    # used to keep the preset's μ, and at M = 8 DiLoCo's own tuning preferred another).
    mus = [0.0] if m["sets"][1] == "outer.kind=sgd" else sorted(set(S["momenta"]) | {m["mu"]})
    return lrs, mus


def round_lr(m, lr, digits=3):
    """An η of method m's grid, rounded: outer η to `digits` decimals, an inner learning rate to 3 significant digits."""
    return float(f"{lr:.3g}") if m.get("dp") else round(lr, digits)


def no_curve(sets):
    """A run's sets without evaluations during it (experiment 12 reads only the final loss)."""
    return [s for s in sets if not s.startswith("sim.eval_interval=")] + ["sim.eval_interval=0"]


def sync_run(S, M, steps_total):
    """Synchronous DiLoCo of M learners at equal total tokens: each trains total/M inner steps."""
    steps = max(S["sync_every"], steps_total // M)
    return [f"sync.learners={M}", f"sync.quorum={M}", "sync.fragments=1", f"sync.sync_every={S['sync_every']}",
            "sync.overlap=0", "sync.wait_for_answer=true", "sync.grace=false", f"train.steps={steps}",
            f"train.warmup_steps={max(1, steps // 10)}", "sim.eval_interval=0", "sim.mtbf=0", "sim.jitter=0.1"]


def decoupled(S, M=None, T=None):
    """Decoupled DiLoCo of M (default m_exp) learners at equal total tokens T (default total_steps): K = 1, P = 4,
    τ = 5, grace, token weights."""
    M, T = M or S["m_exp"], T or S["total_steps"]
    return [f"sync.learners={M}", "sync.quorum=1", "sync.fragments=4", f"sync.sync_every={S['sync_every']}",
            "sync.overlap=5", "sync.wait_for_answer=false", "sync.grace=true", "sync.weighting=token",
            f"train.steps={T // M}", f"train.warmup_steps={max(1, T // M // 10)}", "sim.jitter=0.1",
            "sim.eval_interval=" + str(S["sync_every"])]


def many_total(S):
    """Experiment 10's total inner steps: `many_rounds` outer rounds at its largest M (equal tokens at every M)."""
    return max(S["many_ms"]) * S.get("many_sync_every", S["sync_every"]) * S["many_rounds"]


def many_run(S, M):
    """Experiment 10's synchronous run of M learners: its own H (many_sync_every) and token budget."""
    return sync_run(dict(S, sync_every=S.get("many_sync_every", S["sync_every"])), M, many_total(S))


def horizon_total(S, M):
    """Experiment 9's total inner steps: `horizon_rounds` outer rounds for each of M learners."""
    return M * S["sync_every"] * S["horizon_rounds"]


def failure_schedule(S):
    """Experiments 6 and 7: (mean virtual seconds between a learner's failures, seconds down): every ~4 outer rounds,
    down for 80% of one."""
    return 4 * S["sync_every"], S["sync_every"] * 0.8


def dp_run(S, M, total):
    """DP: one learner taking the global batch (8 × M sequences), exchanging the whole model after every step."""
    return ["sync.learners=1", "sync.quorum=1", "sync.fragments=1", "sync.sync_every=1", "sync.weighting=uniform",
            "outer.kind=sgd", "outer.lr=1.0", "outer.momentum=0", "sync.wait_for_answer=true",
            f"train.batch_size={8 * M}", f"train.steps={total // M}", f"train.warmup_steps={max(1, total // M // 10)}",
            "sim.eval_interval=" + str(S["sync_every"])]


def plan(S):
    """Every point: (experiment, variant, method id or None, extra sets). Tuning happens per method id first."""
    pts = []
    T = S["total_steps"]
    for M in S["ms"]:  # 1. IsoLoCo vs DiLoCo at equal total tokens, each method tuned at each M
        for meth in ("diloco", "isoloco"):
            pts.append(("e1", f"{meth} M={M}", tuned_at(meth, ("sync", M)), sync_run(S, M, T)))
    Mx = max(S["ms"])
    pts.append(("e1", f"iso_c_ns M={Mx}", tuned_at("iso_c_ns", ("sync", Mx)), sync_run(S, Mx, T)))
    M = S["m_exp"]
    for meth in ("iso_c_sgd", "mean_sgd", "diloco", "iso_cts", "tsv", "ties", "dare", "isoloco", "iso_c_ns",  # 2.
                 "iso_c_ns_fast"):
        pts.append(("e2", meth, meth, sync_run(S, M, T)))
    het = ["sim.slow_fraction=0.5", "sim.slow_factor=1.18", "sim.jitter=0.1", "sim.mtbf=0", "sync.fragments=1",
           f"sync.learners={M}", f"sync.sync_every={S['sync_every']}", f"train.steps={T // M}",
           f"train.warmup_steps={max(1, T // M // 10)}", "sim.eval_interval=0"]
    k1 = ["sync.quorum=1", "sync.wait_for_answer=false", "sync.overlap=5"]
    km = [f"sync.quorum={M}", "sync.wait_for_answer=true", "sync.overlap=0", "sync.grace=false"]
    # Every row of experiment 3 is tuned in its own setting (issue 54): K = M with synchronous DiLoCo's method, K = 1
    # with the mean (mean_k1) or its asynchronous variants, each on its link, with its anchor.
    e3 = [("K=M", "diloco", het + km), ("K=M, fast link", "diloco", het + km + FAST_LINK),
          ("K=1", "mean_k1", het + k1 + ["sync.grace=false"]), ("K=1 + grace", "mean_k1", het + k1 + ["sync.grace=true"]),
          ("K=1 + grace, base anchor", "mean_k1", het + k1 + ["sync.grace=true", "sync.delta_anchor=base"])]
    # The grace window where it can work (FAST_LINK), and the asynchronous variants there.
    e3 += [(v, meth, het + k1 + [f"sync.grace={g}"] + FAST_LINK + extra)
           for v, meth, g, extra in (("K=1, fast link", "mean_fast", "false", []),
                                     ("K=1 + grace, fast link", "mean_fast", "true", []),
                                     ("K=1 + grace, fast link, base anchor", "mean_fast", "true", ["sync.delta_anchor=base"]),
                                     ("K=1 + grace + delayed Nesterov, fast link", "dn_fast", "true", []),
                                     ("K=1 + grace + delayed Nesterov (whole g), fast link", "dn_whole_fast", "true", []),
                                     ("K=1 + grace + staleness weights, fast link", "stale_fast", "true", []),
                                     ("K=1 + grace + dynamic local updates, fast link", "dlu_fast", "true", []))]
    tuned3 = {}
    for v, meth, sets in e3:
        tuned3[v] = tuned_here(meth, "e3:" + v, sets)
        pts.append(("e3", v, tuned3[v], sets))
    for meth in ("rda", "mean_k1", "diloco"):  # 4. RDA vs the token-weighted mean (Decoupled DiLoCo, K = 1)
        pts.append(("e4", meth, meth, decoupled(S) + ["sim.mtbf=0"]))
    # The base anchor (Δ = Δ̂, no feedback loop; docs/sim.md) against the paper's global one, each tuned with it.
    for v, meth, extra in (("rda, base anchor", "rda", []), ("mean_k1, base anchor", "mean_k1", []),
                           ("rda, fast link, base anchor", "rda_fast", FAST_LINK)):
        sets = decoupled(S) + ["sim.mtbf=0"] + extra + ["sync.delta_anchor=base"]
        pts.append(("e4", v, tuned_here(meth, "e4:" + v, sets), sets))
    for v, meth in (("rda, fast link", "rda_fast"), ("mean, fast link", "mean_fast"),
                    ("delayed Nesterov, fast link", "dn_fast"), ("delayed Nesterov (whole g), fast link", "dn_whole_fast"),
                    ("staleness weights, fast link", "stale_fast")):
        pts.append(("e4", v, meth, decoupled(S) + ["sim.mtbf=0"] + FAST_LINK))
    for enc in ("fp32", "bf16", "int8", "int4", "int2"):  # 5. outer-gradient precision
        pts.append(("e5", enc, "diloco", sync_run(S, M, T) + [f"net.encoding={enc}", "net.error_feedback=true"]))
    # 5b. Fewer bytes than int4 (issue 35): today's smallest pair (int4 up, bf16 down), then sparse top-k pushes
    # (2-bit values, error feedback) with the whole fp32 fragment down, and both ways (the broadcast as a top-k delta
    # of the same density, its residual kept by the syncer; at η = 1 under sync.delta_anchor = global the merged
    # model is the learners' mean, so what the broadcast left out never reaches them: docs/wire.md). The sparse rows
    # run the mean under outer SGD
    # (mean_sgd, tuned in experiment 2): top-k with error feedback replaces the outer momentum, as in SparseLoCo; a
    # delta broadcast under Nesterov is anchored at what the syncer has merged, and the momentum then integrates the
    # residual (docs/wire.md). Its fp32 row is the paired reference.
    pts.append(("e5", "int4 up, bf16 down", "diloco",
                sync_run(S, M, T) + ["net.encoding=int4", "net.broadcast_encoding=bf16", "net.error_feedback=true"]))
    pts.append(("e5", "fp32, outer SGD", "mean_sgd", sync_run(S, M, T) + ["net.encoding=fp32"]))
    for d in TOPK_DENSITIES:
        topk = ["net.encoding=topk", "net.topk_bits=2", f"net.topk_density={d:g}", "net.error_feedback=true"]
        pts.append(("e5", f"top-k {d:.0%} up", "mean_sgd", sync_run(S, M, T) + topk))
        pts.append(("e5", f"top-k {d:.0%} both ways", "mean_sgd", sync_run(S, M, T) + topk + ["net.broadcast_encoding=topk"]))
    # Chunked top-k (the same share of every chunk of 4096 elements) against whole-fragment top-k, at 3%.
    pts.append(("e5", "top-k 3% both ways, chunks of 4096", "mean_sgd",
                sync_run(S, M, T) + ["net.encoding=topk", "net.topk_bits=2", "net.topk_density=0.03",
                                     "net.topk_chunk=4096", "net.error_feedback=true", "net.broadcast_encoding=topk"]))
    # The goal's row with its own outer step: the mean under outer SGD tuned with top-k 3% both ways (mean_sgd_topk3;
    # the rows above take mean_sgd's η, tuned on fp32 pushes, as the precision rows take DiLoCo's).
    pts.append(("e5", "top-k 3% both ways, η tuned for it", "mean_sgd_topk3",
                sync_run(S, M, T) + ["net.error_feedback=true"]))  # the method's own keys carry the codec
    # 6 and 7. One failure schedule (every learner fails every ~4 outer rounds on average, down 20 steps' time).
    mtbf, downtime = failure_schedule(S)
    fail = ["sim.mtbf=" + str(mtbf), "sim.downtime=" + str(downtime), "sim.jitter=0.1"]
    dec = decoupled(S)
    syn = sync_run(S, M, T)[:-3] + ["sim.eval_interval=" + str(S["sync_every"])]
    dp = dp_run(S, M, T)
    pts.append(("e6", "Decoupled DiLoCo", "rda", dec + fail))
    pts.append(("e6", "DiLoCo (synchronous)", "diloco", syn + fail))
    pts.append(("e6", "DP", None, dp + fail[:-1] + ["sim.jitter=0.1"]))
    pts.append(("e6", "Decoupled DiLoCo, fast link", "rda_fast", dec + fail + FAST_LINK))
    pts.append(("e6", "Decoupled + delayed Nesterov, fast link", "dn_fast", dec + fail + FAST_LINK))
    pts.append(("e6", "Decoupled + delayed Nesterov (whole g), fast link", "dn_whole_fast", dec + fail + FAST_LINK))
    pts.append(("e6", "DiLoCo (synchronous), fast link", "diloco", syn + fail + FAST_LINK))
    pts.append(("e6", "DP, fast link", None, dp + fail[:-1] + ["sim.jitter=0.1"] + FAST_LINK))
    pts.append(("e7", "Decoupled DiLoCo, failures", "rda", dec + fail))
    pts.append(("e7", "DP, no failures", None, dp + ["sim.mtbf=0", "sim.jitter=0.1"]))
    # 8. The grace window's regime: K = 1 with and without it over link bandwidths (experiment 3's learners).
    # Each row at the η and μ experiment 3 tuned for it in the same heterogeneous setting on the fast link (with the
    # grace window or without; with the base anchor), here at each bandwidth.
    for bw in SWEEP_BANDWIDTHS:
        for g, v, anchor in (("false", "", []), ("true", " + grace", []),
                             ("true", " + grace, base anchor", ["sync.delta_anchor=base"])):
            meth = tuned3[("K=1 + grace, fast link" + (", base anchor" if anchor else "")) if g == "true" else "K=1, fast link"]
            pts.append(("e8", f"{bw / 1e6:g} MB/s{v}", meth, het + k1 + [f"sync.grace={g}", f"sim.bandwidth={bw:g}"] + anchor))
    # 9. The horizon: horizon_rounds outer rounds per learner at M = m_exp, on the small model.
    HT = horizon_total(S, M)
    for v, meth in (("DiLoCo", "diloco"), ("IsoLoCo", "isoloco")):
        pts.append(("e9", v, tuned_at(meth, ("horizon", M)), sync_run(S, M, HT)))
    pts.append(("e9", "Decoupled DiLoCo, failures", tuned_at("rda", ("horizon_k1", M)), decoupled(S, M, HT) + fail))
    # Issue 35: the sparse codec at this horizon (its error feedback needs rounds to deliver): the mean under outer
    # SGD with fp32 both ways and with top-k 3% both ways, each tuned here.
    pts.append(("e9", "mean, outer SGD", tuned_at("mean_sgd", ("horizon", M)), sync_run(S, M, HT)))
    pts.append(("e9", "mean, outer SGD, top-k 3% both ways", tuned_at("mean_sgd_topk3", ("horizon", M)),
                sync_run(S, M, HT)))  # the method's own keys carry the codec
    pts.append(("e9", "SparseLoCo", tuned_at("sparseloco", ("horizon", M)), sync_run(S, M, HT)))
    pts.append(("e9", "DP, no failures", None, dp_run(S, M, HT) + ["sim.mtbf=0", "sim.jitter=0.1"]))
    # 11. MuLoCo (issue 53): Muon as the inner optimizer against AdamW, at M = m_exp and equal tokens, each against
    # its own DP baseline (one learner with the global batch and the same inner optimizer), and MuLoCo's pushes at
    # int2 with error feedback. DiLoCo's row is experiment 1's run at M = m_exp (same settings: run once).
    pts.append(("e11", "DiLoCo (AdamW)", tuned_at("diloco", ("sync", M)), sync_run(S, M, T)))
    pts.append(("e11", "MuLoCo (Muon)", tuned_at("muloco", ("sync", M)), sync_run(S, M, T)))
    pts.append(("e11", "MuLoCo, int2 + error feedback", tuned_at("muloco", ("sync", M)),
                sync_run(S, M, T) + ["net.encoding=int2", "net.error_feedback=true"]))
    pts.append(("e11", "DP, AdamW", None, dp_run(S, M, T) + ["sim.mtbf=0", "sim.jitter=0.1"]))  # experiment 7's run
    pts.append(("e11", "DP, Muon", None, dp_run(S, M, T) + ["sim.mtbf=0", "sim.jitter=0.1", "train.optimizer=muon"]))
    # 10. Many learners: IsoLoCo against DiLoCo up to M = 64 at equal total tokens, on the small model.
    for Mm in S["many_ms"]:
        for meth in ("diloco", "isoloco"):
            pts.append(("e10", f"{meth} M={Mm}", tuned_at(meth, ("small", Mm)), many_run(S, Mm)))
    pts += e12_points(S, fail)
    return pts


E12_MS = [1, 2, 4, 8]  # experiment 12's DiLoCo learner counts; the other methods run at the largest


def e12_points(S, fail):
    """Experiment 12 (issue 54): the scaling question at compute-optimal budgets. At each size, at equal tokens:
    DiLoCo at each M of E12_MS against DP with the same global batch (M learners' batch: "DP ×M", as many steps as each
    learner takes), IsoLoCo and Decoupled DiLoCo (K = 1, grace, int4) with and without the failure schedule at M = 8,
    and with Muon: DP ×1 and ×8 and MuLoCo at M = 1 and 8. Every method is tuned at each size in the setting it is
    reported in; its learners train at the inner learning rate DP ×1 chose there (one learner's batch)."""
    pts, M = [], max(E12_MS)
    for z in sizes(S):
        n, T = z["name"], z["total_steps"]
        for m in E12_MS:
            pts.append(("e12", f"{n} DP ×{m}", tuned_at("dp", ("size_dp", m, n)), size_setting(S, "size_dp", m, T)))
        for m in E12_MS:
            pts.append(("e12", f"{n} DiLoCo M={m}", tuned_at("diloco", ("size", m, n)), size_setting(S, "size", m, T)))
        pts.append(("e12", f"{n} IsoLoCo M={M}", tuned_at("isoloco", ("size", M, n)), size_setting(S, "size", M, T)))
        k1 = size_setting(S, "size_k1", M, T)
        rda = tuned_at("rda", ("size_k1", M, n))
        pts.append(("e12", f"{n} Decoupled M={M}", rda, k1))
        pts.append(("e12", f"{n} Decoupled M={M}, failures", rda, [x for x in k1 if x != "sim.mtbf=0"] + fail))
        for m in (1, M):
            pts.append(("e12", f"{n} Muon DP ×{m}", tuned_at("dp_muon", ("size_dp", m, n)), size_setting(S, "size_dp", m, T)))
        for m in (1, M):
            pts.append(("e12", f"{n} MuLoCo M={m}", tuned_at("muloco", ("size", m, n)), size_setting(S, "size", m, T)))
    return pts


# ---- the results file --------------------------------------------------------------------------------------------
def key_of(sets):
    # Paths inside the checkout count relative to it, so results stay valid in another clone (or session).
    return hashlib.sha1("\n".join(sorted(s.replace(ROOT, "<root>") for s in sets)).encode()).hexdigest()[:16]


_SIM_CONFIG = {}  # "base": configs/sim-diloco.toml's keys, read once


def run_setting(sets):
    """A run's settings as `deloco sim` reads them: configs/sim-diloco.toml (every run starts from it), then the sets
    (a key set twice: the last wins); keys as "table.key"."""
    if "base" not in _SIM_CONFIG:
        with open(os.path.join(ROOT, "configs", "sim-diloco.toml"), "rb") as f:
            _SIM_CONFIG["base"] = {f"{t}.{k}": str(v).lower() if isinstance(v, bool) else str(v)
                                   for t, tab in tomllib.load(f).items() if isinstance(tab, dict) for k, v in tab.items()}
    return dict(_SIM_CONFIG["base"], **dict(x.split("=", 1) for x in sets if "=" in x))


def _muon_as_wide_as_the_vocabulary(sets):
    """Whether a run trained the built-in GPT with Muon where a hidden matrix is as wide as the vocabulary (V = d,
    3d or 4d; a key neither the sets nor the config give: the built-in defaults, V = d = 256)."""
    s = run_setting(sets)
    opt = s.get("train.optimizer", "auto")
    muon = opt == "muon" or (opt == "auto" and s.get("merge.preset") == "muloco")
    d, v = int(s.get("model.n_embd", 256)), int(s.get("model.vocab_size", 256))
    return muon and s.get("model.kind", "gpt") == "gpt" and v in (d, 3 * d, 4 * d)


def _failures_under_grace(sets):
    """Whether a run had failures (sim.mtbf > 0) with the grace window on."""
    s = run_setting(sets)
    return float(s.get("sim.mtbf", 0)) > 0 and s.get("sync.grace") == "true"


# Rows of runs that a defect spoiled, set aside when the results are read (they stay in the file; their runs are due
# again): (the fix's commit, what it fixed, whether a run's sets meet the defect). A row is set aside when it meets
# the defect and its binary was built from a commit without the fix (rows from before builds were recorded: all).
SUPERSEDED = [("ac75426", "Muon sent the built-in GPT's hidden matrices as wide as the vocabulary to AdamW "
                          "(experiment 12's 0.125M model, 4 × 64 = 256: the MLP)", _muon_as_wide_as_the_vocabulary),
              ("146c715", "the simulator let a round wait out its grace window for a learner that had failed",
               _failures_under_grace)]
_HAS_FIX = {}  # (fix, build) -> whether the build's commit contains the fix


def has_fix(fix, build):
    """Whether the binary of a row's `_build` ("<commit>" or "<commit>+changes") was built from a commit that contains
    `fix`, by git's ancestry: True or False; False for a row from before builds were recorded (no `_build`: all
    older than any fix here); None when it cannot be told (a build recorded as "unknown", a commit git does not know,
    no git), and such a row is kept: setting it aside would run it again at every resume."""
    if build is None:
        return False
    if not isinstance(build, str) or not build or build == "unknown":
        return None
    if (fix, build) not in _HAS_FIX:
        try:
            r = subprocess.run(["git", "-C", ROOT, "merge-base", "--is-ancestor", fix, build.split("+")[0]],
                               capture_output=True)
            _HAS_FIX[(fix, build)] = {0: True, 1: False}.get(r.returncode)
        except OSError:
            _HAS_FIX[(fix, build)] = None
    return _HAS_FIX[(fix, build)]


class Results:
    """results.jsonl: one row per (point, experiment, variant, seed). Points with identical settings (e.g. DiLoCo
    at M = m_exp in experiments 1 and 2) run once and are recorded for each. Rows of SUPERSEDED runs are set aside
    (`set_aside`: what each fixed -> how many rows)."""

    def __init__(self, path):
        self.path = path
        self.rows = {}
        self.by_key = {}
        self.set_aside = {}
        for r in jsonl_records.read(path):  # none when the file is missing; a line cut by a kill is skipped
            why = next((w for fix, w, meets in SUPERSEDED
                        if meets(r.get("sets", [])) and has_fix(fix, r.get("_build")) is False), None)
            if why:
                self.set_aside[why] = self.set_aside.get(why, 0) + 1
                continue
            self.rows[self.row_id(r)] = r
            self.by_key[r["key"]] = r

    @staticmethod
    def row_id(r):
        return f"{r['key']}|{r['exp']}|{r['variant']}|{r['seed']}"

    def view(self, rows):
        """The same results with only `rows` (a dict like self.rows) to read; lookups by setting still see every row."""
        v = Results.__new__(Results)
        v.path, v.rows, v.by_key, v.set_aside = self.path, rows, self.by_key, self.set_aside
        return v

    def get(self, sets):
        return self.by_key.get(key_of(sets))

    def add(self, row):
        self.rows[self.row_id(row)] = row
        self.by_key[row["key"]] = row
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")


# ---- tuning, seeds and the jobs ----------------------------------------------------------------------------------
def tuning_setting(S, meth):
    """Where a method is tuned: synchronous DiLoCo's setting at M = m_exp, or Decoupled DiLoCo's for the K = 1 methods
    (on FAST_LINK for the variants), or the setting its id names (tuned_at). One choice per id serves every
    experiment it appears in."""
    m = METHODS[meth]
    at = m["at"]
    if at is None:
        if m["base"] in TUNED_AT_K1:
            return decoupled(S) + ["sim.mtbf=0"] + (FAST_LINK if m["link"] == "fast" else [])
        return sync_run(S, S["m_exp"], S["total_steps"])
    kind, M = at[0], at[1]
    if kind == "here":
        return list(m["setting"])
    if kind in ("size", "size_k1", "size_dp"):
        return size_setting(S, kind, M, size(S, at[2])["total_steps"])
    if kind == "sync":
        return sync_run(S, M, S["total_steps"])
    if kind == "small":
        return many_run(S, M)
    if kind == "horizon":
        return sync_run(S, M, horizon_total(S, M))
    if kind == "horizon_k1":
        return decoupled(S, M, horizon_total(S, M)) + ["sim.mtbf=0"]
    raise ValueError(at)


def size_setting(S, kind, M, total):
    """Experiment 12's settings at a size's token budget `total`: synchronous DiLoCo ("size"), Decoupled DiLoCo with
    int4 pushes and no failures ("size_k1"), DP with M learners' global batch ("size_dp")."""
    if kind == "size":
        return no_curve(sync_run(S, M, total))
    if kind == "size_k1":
        return no_curve(decoupled(S, M, total)) + ["sim.mtbf=0", "net.encoding=int4", "net.error_feedback=true"]
    return no_curve(dp_run(S, M, total)) + ["sim.mtbf=0", "sim.jitter=0.1"]


def method_base(S, meth):
    """The model sets a method id runs on: the small model for experiments 9 and 10, a size's for experiment 12, else
    the main one."""
    at = METHODS[meth]["at"] if meth is not None else None
    if at is not None and len(at) > 2:
        return size(S, at[2])["base"]
    if at is not None and at[0] == "small":
        return S.get("many_base", S["small"])
    return S["small"] if at is not None and at[0] in ("horizon", "horizon_k1") else S["base"]


def step_sets(meth, lr, mu, inner=None):
    """The sets that put method `meth` at η = lr, μ = mu (DP: its inner learning rate lr), and its learners at the
    inner learning rate `inner` where it takes one from DP (experiment 12)."""
    if METHODS[meth].get("dp"):
        return METHODS[meth]["sets"] + [f"train.lr={lr}"]
    return (METHODS[meth]["sets"] + [f"outer.lr={lr}", f"outer.momentum={mu}"] +
            ([f"train.lr={inner}"] if inner is not None else []))


def tuning_sets(S, meth, lr, mu, inner=None):
    # A run's key (key_of) sorts its sets; no setting sets a key that step_sets does, so their order is free.
    return (method_base(S, meth) + step_sets(meth, lr, mu, inner) + tuning_setting(S, meth) +
            ["data.holdout=dev", f"train.seed={TUNE_SEED}", f"sim.seed={TUNE_SEED}"])


class NotReady(Exception):
    """A method whose learners take DP's inner learning rate, asked for before DP's tuning is final."""


def inner_lr(res, S, meth):
    """The inner learning rate method `meth` trains at when it takes DP's (experiment 12), else None. Raises NotReady
    while that DP's tuning has runs to do."""
    dep = METHODS[meth].get("inner_from")
    if dep is None:
        return None
    _, missing, best, _ = tuning_points(res, S, dep)
    if missing or best is None:
        raise NotReady(dep)
    return best[1]


# How far a grid grows when its best η lies on an edge: at most this many more points on each side, each the
# previous edge × the first (low side) or last (high side) of the scale's lr_factors, at the best point's μ.
MAX_EXTENSIONS = 6


def tuning_points(res, S, meth):
    """A method's tuning as far as the results go: (points, missing, best, edge).

    points: the (η, μ) pairs of its grid, extended while the best dev loss is at the lowest or highest η (at most
    MAX_EXTENSIONS more on each side); missing: the points with no result yet (run them, then ask again); best:
    (loss, η, μ) of the lowest finite dev loss among the points, or None; edge: "low" or "high" when the best is
    still the smallest or largest η after every extension (the optimum may lie beyond the grid), else ""."""
    lrs, mus = grid(S, meth)
    if S.get("untuned"):  # the smoke: its grid's one point (the preset's η and μ), chosen without tuning runs
        return [(lrs[0], mus[0])], [], (float("nan"), lrs[0], mus[0]), ""
    points = [(lr, mu) for lr in lrs for mu in mus]
    try:
        inner = inner_lr(res, S, meth)
    except NotReady:  # nothing to run yet: the grid waits for DP's choice
        return points, [], None, ""
    grown = {"low": 0, "high": 0}
    while True:
        missing, cand = [], []
        for lr, mu in points:
            r = res.get(tuning_sets(S, meth, lr, mu, inner))
            if r is None:
                missing.append((lr, mu))
            elif r["final_val_loss"] is not None and math.isfinite(r["final_val_loss"]):
                cand.append((r["final_val_loss"], lr, mu))
        best = min(cand) if cand else None
        if missing or best is None:
            return points, missing, best, ""
        _, lr, mu = best
        explored = sorted({p[0] for p in points})
        side = "low" if lr == explored[0] else ("high" if lr == explored[-1] else "")
        if not side:
            return points, [], best, ""
        if grown[side] == MAX_EXTENSIONS:
            return points, [], best, side
        grown[side] += 1
        factor = S["lr_factors"][0] if side == "low" else S["lr_factors"][-1]
        points.append((round_lr(METHODS[meth], lr * factor, 4), mu))


def tuning_jobs(res, S, meths):
    """The tuning runs still to do, for every method: its grid (and any extension) on the dev half, TUNE_SEED."""
    jobs = []
    for meth in meths:
        missing = tuning_points(res, S, meth)[1]
        for lr, mu in missing:
            jobs.append((dict(exp="tune", variant=meth, method=meth, lr=lr, mu=mu, seed=TUNE_SEED, holdout="dev"),
                         tuning_sets(S, meth, lr, mu, inner_lr(res, S, meth))))
    return jobs


# μ's grid has two points (the scale's momenta); where a method chose the smaller, one probe on the dev half at its
# chosen η and MU_PROBE_STEP less μ (issue 54's review: 46 of 58 Nesterov choices were μ = 0.8, the grid's lower
# edge). A probe is no grid point and changes no choice (a moved choice would rerun every reported run of its method,
# more than the suite's whole budget); the report sets each probe's dev loss beside its choice's: the slack the edge
# leaves.
MU_PROBE_STEP = 0.1


def probe_point(res, S, meth):
    """(η, μ) of method meth's probe below its μ grid's lower edge, or None: its tuning unfinished, its μ inside the
    grid, or a grid of one μ (SGD, DP, the quick scale)."""
    _, missing, best, _ = tuning_points(res, S, meth)
    mus = grid(S, meth)[1]
    if missing or best is None or len(mus) < 2 or best[2] != min(mus):
        return None
    return best[1], round(best[2] - MU_PROBE_STEP, 2)


def probe_jobs(res, S, meths):
    """The probes below μ's edge still to do, as tuning_jobs gives runs (exp "probe")."""
    jobs = []
    for meth in meths:
        pp = probe_point(res, S, meth)
        if pp is not None:
            jobs.append((dict(exp="probe", variant=meth, method=meth, lr=pp[0], mu=pp[1], seed=TUNE_SEED, holdout="dev"),
                         tuning_sets(S, meth, *pp, inner_lr(res, S, meth))))
    return jobs


def chosen(res, S, meths):
    """method -> (lr, mu, inner) with the lowest dev loss over its (extended) grid; inner: the inner learning rate its
    learners take from DP (experiment 12), else None."""
    best = {}
    for meth in meths:
        b = tuning_points(res, S, meth)[2]
        if b is not None:
            best[meth] = (b[1], b[2], inner_lr(res, S, meth))
    return best


def point_seeds(S, exp, variant):
    """The seeds a point is reported with, 1..S["seeds"], fixed before any test result and alike for every point
    (issue 54: the suite used to add seeds while an interval straddled its threshold, which made the intervals not
    nominal; then it gave 5 only to a list of decisive pairs, which missed comparisons that claims make)."""
    return S["seeds"]


def job_sets(S, exp, meth, sets, best, seed):
    """The settings of one reported run: the point's, its method's with the chosen η and μ, the test half, the seed."""
    extra = [] if meth is None else step_sets(meth, *best[meth])
    base = S["small"] if exp == "e9" and meth is None else method_base(S, meth)
    return base + extra + sets + ["data.holdout=test", f"train.seed={seed}", f"sim.seed={seed}"]


def plan_rows(S, pts, best, res):
    """The rows of res the current plan reports, and the tuning rows. Each (experiment, variant, seed) has one setting
    under the plan and the current choices of η and μ; a row of the same name under another setting is not its
    (an older plan's run, or a run under an earlier choice, or a setting another point shares: experiment 2's DiLoCo
    is synchronous DiLoCo at M = 8 tuned over μ, experiment 1's is tuned at the preset's μ). Such rows stay in the
    file and count again if the plan returns to their setting. Likewise a seed beyond the point's (point_seeds), and
    a tuning run that is no point of a current grid (an older protocol's): the report counts only the runs in use."""
    want = {}
    for exp, variant, meth, sets in pts:
        if meth is None or meth in best:
            for seed in range(1, point_seeds(S, exp, variant) + 1):
                want[(exp, variant, seed)] = key_of(job_sets(S, exp, meth, sets, best, seed))
    tuning, probes = set(), {}
    for m in methods_of(pts):
        try:
            inner = inner_lr(res, S, m)
        except NotReady:
            continue
        tuning |= {key_of(tuning_sets(S, m, lr, mu, inner)) for lr, mu in tuning_points(res, S, m)[0]}
        pp = probe_point(res, S, m)
        if pp is not None:
            probes[m] = key_of(tuning_sets(S, m, *pp, inner))
    return {i: r for i, r in res.rows.items()
            if (r["key"] in tuning if r["exp"] == "tune" else probes.get(r["variant"]) == r["key"] if r["exp"] == "probe"
                else want.get((r["exp"], r["variant"], r["seed"])) == r["key"])}


def reported_jobs(S, pts, best):
    """The reported runs of the points whose method is chosen: each seed of point_seeds (fixed in advance: no result
    changes them)."""
    jobs = []
    for exp, variant, meth, sets in pts:
        if meth is not None and meth not in best:
            continue
        for seed in range(1, point_seeds(S, exp, variant) + 1):
            jobs.append((dict(exp=exp, variant=variant, method=meth, seed=seed, holdout="test"),
                         job_sets(S, exp, meth, sets, best, seed)))
    return jobs


def planned_runs(S, pts, meths):
    """Every run the suite would start before any result is in: each method's tuning grid (no extensions), then the
    reported runs with each method at the centre of its grid (its preset's η and μ). One dict per run, with the
    sets and their key (the results file's identity of a setting): what --plan prints."""
    centre = {m: (METHODS[m]["lr"], METHODS[m]["mu"],
                  METHODS[METHODS[m]["inner_from"]]["lr"] if "inner_from" in METHODS[m] else None) for m in meths}
    runs = []
    for m in meths:  # the grids; a method that takes DP's inner learning rate at DP's grid centre
        lrs, mus = grid(S, m)
        pts_m = tuning_points(Results(os.devnull), S, m)[0] if S.get("untuned") else [(a, b) for a in lrs for b in mus]
        for lr, mu in ([] if S.get("untuned") else pts_m):
            sets = tuning_sets(S, m, lr, mu, centre[m][2])
            runs.append(dict(exp="tune", variant=m, method=m, lr=lr, mu=mu, seed=TUNE_SEED, holdout="dev",
                             key=key_of(sets), sets=sets))
    runs += [dict(job, key=key_of(sets), sets=sets) for job, sets in reported_jobs(S, pts, centre)]
    return runs


def pending_points(res, S, pts, meths):
    """(experiment, variant) -> how many of its reported runs are still to do: the seeds with no row yet, or every
    seed while its method's tuning is unfinished (its η, μ may still change); ("tune", method) -> its tuning runs
    known to be missing (an extension of its grid may add more); ("probe", method) -> 1 while its probe below μ's edge
    is to do. Empty when the suite is complete."""
    unfinished, todo = set(), {}
    for m in meths:
        _, missing, b, _ = tuning_points(res, S, m)
        if missing or b is None:
            unfinished.add(m)
            todo[("tune", m)] = len(missing)
    best = chosen(res, S, meths)
    for exp, variant, meth, _ in pts:  # no tuning result at all yet: reported_jobs skips the point
        if meth is not None and meth not in best:
            todo[(exp, variant)] = todo.get((exp, variant), 0) + point_seeds(S, exp, variant)
    for job, sets in reported_jobs(S, pts, best) + probe_jobs(res, S, sorted(best)):
        if job["method"] in unfinished or Results.row_id(dict(job, key=key_of(sets))) not in res.rows:
            k = (job["exp"], job["variant"])
            todo[k] = todo.get(k, 0) + 1
    return todo
