#!/usr/bin/python3
"""The data-parallel peer of bench/wan.sh: PyTorch DistributedDataParallel over Gloo, one rank per testbed host.

Trains the same GPT as deloco (tests/python/deloco_ref.py: same architecture and parameter names) on the same data
as deloco's learners: the corpus folder read as deloco reads it (files sorted by path, hidden ones skipped, every
k-th document held out for validation, k = round(1 / data.val_fraction)), the training stream cut into W contiguous
shards, rank r drawing windows of T+1 bytes from shard r with deloco's own splitmix64 sampler (so rank r sees exactly
the batches deloco's learner r of W would see at the same step). The same inner optimizer as deloco's learners and
bench/train_vs_pytorch.py: AdamW (betas 0.9/0.95, eps 1e-8, weight decay 0.1 on tensors of rank >= 2, none on
the rest), gradient clipping at 1.0 after the all-reduce, linear warm-up then cosine decay to train.min_lr_ratio of
the peak over train.steps. Each rank trains train.batch_size sequences per step (as one deloco learner does), so
tokens per rank per step equal tokens per learner per step; DDP averages the gradients of the W ranks every step.

Run one process per host, rank 0 first or not (the rendezvous waits):

    scripts/testbed.sh exec 1 /usr/bin/python3 bench/ddp_peer.py --rank 0 --world 2 --master 198.18.0.2:29500 \\
        --config configs/demo.toml --steps 400 --max-seconds 120 --out /tmp/ddp-0.jsonl
    scripts/testbed.sh exec 2 /usr/bin/python3 bench/ddp_peer.py --rank 1 --world 2 --master 198.18.0.2:29500 ...

Bounded: it stops after --steps or once --max-seconds of training have passed (the ranks agree after every step,
through an all-reduce of 8 bytes, so none is left waiting in a collective), and every Gloo collective and the
rendezvous fail after --timeout seconds (torch.distributed's timeout, given explicitly) instead of hanging: a
starved link ends the run with a "broke" record that says where (rendezvous, step N) and why, exit status 3.

Output: JSON lines (--out, default stdout), "t" unix seconds on every record, "wall" seconds since training began:
  start  {rank, world, master, params, batch_size, block_size, steps, timeout}
  train  {step, tokens, wall, eval_s, loss}              every --log-every steps and at least every 5 s (tokens:
                                                         this rank's, cumulative; loss: mean since the last record)
  eval   {step, tokens, wall, eval_s, val_loss, val_bpb} rank 0, every --eval-seconds of training and at the end
  done   {steps, tokens, wall, tokens_per_s, eval_s, val_loss, val_bpb, stopped_by}
  broke  {step, wall, where, detail}
Evaluations pause training (every rank waits in the next collective); "eval_s" is the time spent in them so far,
so wall - eval_s is training time. Validation: the held-out split, deloco's evaluation windows (train.eval_tokens
evenly spaced, non-overlapping windows of block_size + 1 bytes), the mean next-byte loss in nats (bits per byte =
loss / ln 2), the same figure deloco's syncer writes in its eval records.

Must run under Debian's /usr/bin/python3 (python3-torch).
"""
import argparse
import datetime
import json
import math
import os
import sys
import time
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MASK = (1 << 64) - 1


def splitmix64(x):
    """deloco's src/data/corpus.cpp splitmix64, on Python integers kept to 64 bits."""
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def load_corpus(path, val_fraction):
    """(train bytes, validation bytes) split as deloco's Corpus::load does for byte-level text."""
    files = []
    if os.path.isdir(path):
        for d, _, names in os.walk(path):
            files += [os.path.join(d, n) for n in names if not n.startswith(".") and os.path.isfile(os.path.join(d, n))]
        files.sort()
    else:
        files = [path]
    docs = [d for d in (open(f, "rb").read() for f in files) if d]
    if not docs:
        sys.exit(f"ddp_peer: corpus '{path}' holds no text (scripts/setup.sh fetches data/sotu)")
    if len(docs) == 1:
        held = max(1, int(math.floor(len(docs[0]) * val_fraction + 0.5)))
        cut = max(0, len(docs[0]) - held)
        return docs[0][:cut], docs[0][cut:]
    k = max(2, int(math.floor(1.0 / val_fraction + 0.5)))
    train = b"\n".join(d for i, d in enumerate(docs) if i % k != k - 1)
    val = b"\n".join(d for i, d in enumerate(docs) if i % k == k - 1)
    if not val:
        return b"\n".join(docs[:-1]), docs[-1]
    return train, val


class ShardSampler:
    """deloco's ShardSampler: shard `rank` of `world` contiguous ranges; windows of T+1 drawn by (seed, rank, step)."""

    def __init__(self, size, rank, world, block_size, seed):
        base, extra = divmod(size, world)
        self.begin = rank * base + min(rank, extra)
        self.end = self.begin + base + (1 if rank < extra else 0)
        self.T, self.rank, self.seed = block_size, rank, seed & MASK
        if self.end - self.begin < block_size + 1:
            sys.exit(f"ddp_peer: rank {rank} of {world} gets a shard of {self.end - self.begin} bytes, "
                     "fewer than one window")

    def offsets(self, step, batch_size):
        choices = self.end - self.begin - self.T
        h = splitmix64(self.seed ^ splitmix64((self.rank + 0x51ED27) & MASK))
        h = splitmix64(h ^ (step & MASK))
        out = []
        for _ in range(batch_size):
            h = splitmix64(h)
            out.append(self.begin + h % choices)
        return out


def lr_at(step, total, warmup, peak, min_ratio):
    """deloco's src/train/adamw.cpp lr_at: linear warm-up, then cosine to min_ratio of the peak."""
    if warmup > 0 and step < warmup:
        return peak * (step + 1) / warmup
    decay = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / decay)
    return peak * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def evaluation_windows(torch, val, block_size, max_tokens):
    """deloco's evaluation_windows: evenly spaced, non-overlapping windows of block_size + 1 tokens."""
    n_avail = (len(val) - 1) // block_size
    if n_avail < 1:
        sys.exit(f"ddp_peer: validation data has {len(val)} bytes, fewer than one window")
    n = max(1, min(n_avail, max_tokens // block_size))
    stream = torch.frombuffer(bytearray(val), dtype=torch.uint8)
    return torch.stack([stream[(i * n_avail // n) * block_size:][:block_size + 1] for i in range(n)]).long()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--master", required=True, help="ADDRESS:PORT of rank 0 (its testbed address)")
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "demo.toml"), help="a deloco TOML config")
    ap.add_argument("--data", default="", help="corpus folder (default: the config's data.path, under the repository)")
    ap.add_argument("--steps", type=int, default=0, help="inner steps (default: the config's train.steps)")
    ap.add_argument("--max-seconds", type=float, default=600.0, help="stop after this much training time")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds a Gloo collective or the rendezvous may take")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--eval-seconds", type=float, default=25.0,
                    help="evaluate every this many training seconds (0: end only)")
    ap.add_argument("--eval-tokens", type=int, default=0, help="default: the config's train.eval_tokens")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ifname", default="",
                    help="Gloo's interface (default: eth0 when this host has one, as on a testbed)")
    ap.add_argument("--out", default="", help="JSON-lines output (default: stdout)")
    args = ap.parse_args()

    out = open(args.out, "a", buffering=1) if args.out else sys.stdout

    def emit(kind, **fields):
        out.write(json.dumps({"kind": kind, "t": round(time.time(), 3), "rank": args.rank, **fields}) + "\n")
        out.flush()

    ifname = args.ifname or ("eth0" if os.path.exists("/sys/class/net/eth0") else "")
    if ifname:
        os.environ["GLOO_SOCKET_IFNAME"] = ifname
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
    from deloco_ref import GPT

    torch.set_num_threads(args.threads)
    cfg = tomllib.load(open(args.config, "rb"))
    m, t, d = cfg["model"], cfg.get("train", {}), cfg.get("data", {})
    steps = args.steps or t.get("steps", 1500)
    B, T = t.get("batch_size", 16), m["block_size"]
    peak, warmup, min_ratio = t.get("lr", 2e-3), t.get("warmup_steps", 100), t.get("min_lr_ratio", 0.1)
    data_path = args.data or d.get("path", "data/sotu")
    if not os.path.isabs(data_path) and not os.path.exists(data_path):
        data_path = os.path.join(ROOT, data_path)
    train_bytes, val_bytes = load_corpus(data_path, d.get("val_fraction", 0.05))
    sampler = ShardSampler(len(train_bytes), args.rank, args.world, T, t.get("seed", 1337))
    stream = torch.frombuffer(bytearray(train_bytes), dtype=torch.uint8)
    val_windows = evaluation_windows(torch, val_bytes, T, args.eval_tokens or t.get("eval_tokens", 131072))

    torch.manual_seed(t.get("seed", 1337))  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    model = GPT(vocab_size=m.get("vocab_size", 256), block_size=T, n_layer=m["n_layer"], n_head=m["n_head"],
                n_embd=m["n_embd"], tie_embeddings=m.get("tie_embeddings", True))
    params = sum(p.numel() for p in model.parameters())
    emit("start", world=args.world, master=args.master, params=params, batch_size=B, block_size=T, steps=steps,
         timeout=args.timeout, max_seconds=args.max_seconds, ifname=ifname, config=os.path.relpath(args.config, ROOT))

    wall0 = time.perf_counter()
    step, tokens, eval_s = 0, 0, 0.0

    def broke(where, e):
        detail = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:500]
        emit("broke", step=step, tokens=tokens, wall=round(time.perf_counter() - wall0, 3), where=where, detail=detail,
             timeout=args.timeout)
        print(f"ddp_peer rank {args.rank}: broke at {where}: {detail}", file=sys.stderr)
        out.flush()
        os._exit(3)  # a process group in a failed collective cannot be torn down cleanly

    try:
        dist.init_process_group("gloo", init_method=f"tcp://{args.master}", rank=args.rank, world_size=args.world,
                                timeout=datetime.timedelta(seconds=args.timeout))
        ddp = DDP(model)  # broadcasts rank 0's parameters: a collective over the link too
    except Exception as e:  # noqa: BLE001 — any failure of the rendezvous is reported the same way
        broke("rendezvous", e)

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t.get("weight_decay", 0.1)},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=peak, betas=(t.get("beta1", 0.9), t.get("beta2", 0.95)), eps=1e-8)
    clip = t.get("grad_clip", 1.0)

    def evaluate():
        model.eval()
        with torch.no_grad():
            losses = [model.loss(w[:, :-1], w[:, 1:]).item() * len(w) for w in val_windows.split(64)]
        model.train()
        return sum(losses) / len(val_windows)

    last_eval = {}

    def record_eval(barrier=True):
        """Rank 0 evaluates while the others wait at a barrier; every rank counts the pause as eval_s."""
        nonlocal eval_s
        e0 = time.perf_counter()
        v = None
        if args.rank == 0:
            v = evaluate()
            last_eval.update(step=step, val_loss=v)
            emit("eval", step=step, tokens=tokens, wall=round(time.perf_counter() - wall0, 3),
                 eval_s=round(eval_s + time.perf_counter() - e0, 3), val_loss=v, val_bpb=v / math.log(2))
        if barrier:
            dist.barrier()
        eval_s += time.perf_counter() - e0
        return v

    wall0 = time.perf_counter()  # training time starts once the group is formed
    try:
        record_eval()
    except Exception as e:  # noqa: BLE001
        broke("first evaluation", e)
    next_eval = args.eval_seconds if args.eval_seconds > 0 else float("inf")
    stopped_by = "steps"
    loss_sum, loss_n, last_record = 0.0, 0, 0.0
    while step < steps:
        try:
            offs = sampler.offsets(step, B)
            batch = torch.stack([stream[o:o + T + 1] for o in offs]).long()
            for g in opt.param_groups:
                g["lr"] = lr_at(step, steps, warmup, peak, min_ratio)
            logits = ddp(batch[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=False)
            loss.backward()  # the gradient all-reduce runs in DDP's hooks and is waited for here
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            step += 1
            tokens += B * T
            loss_sum += loss.item()
            loss_n += 1
            wall = time.perf_counter() - wall0
            # A progress record every --log-every steps, and at least every 5 s on a slow link.
            if step % args.log_every == 0 or step == steps or wall - last_record >= 5.0:
                emit("train", step=step, tokens=tokens, wall=round(wall, 3), eval_s=round(eval_s, 3),
                     loss=loss_sum / loss_n)
                loss_sum, loss_n, last_record = 0.0, 0, wall
            # After every step the ranks agree on stopping and evaluating (8 bytes, after the step's all-reduce):
            # rank 0's clock decides for the evaluation, any rank's for the time limit.
            flags = torch.tensor([float(wall - eval_s >= args.max_seconds),
                                  float(args.rank == 0 and wall - eval_s >= next_eval)])
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            if flags[1] > 0:
                record_eval()
                next_eval += args.eval_seconds
            if flags[0] > 0 and step < steps:
                stopped_by = "max_seconds"
                break
        except Exception as e:  # noqa: BLE001 — a Gloo timeout, a peer gone: the run is over
            broke(f"step {step + 1}", e)
    wall = time.perf_counter() - wall0
    train_s = wall - eval_s
    try:
        dist.barrier()
    except Exception as e:  # noqa: BLE001
        broke("final barrier", e)
    v = None
    if args.rank == 0:
        v = last_eval["val_loss"] if last_eval.get("step") == step else record_eval(barrier=False)
    emit("done", steps=step, tokens=tokens, wall=round(time.perf_counter() - wall0, 3), train_seconds=round(train_s, 3),
         eval_s=round(eval_s, 3), tokens_per_s=tokens / train_s if train_s > 0 else 0.0, val_loss=v,
         val_bpb=None if v is None else v / math.log(2), stopped_by=stopped_by, params=params)
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 — the run is recorded; teardown is best effort
        pass


if __name__ == "__main__":
    main()
