#!/usr/bin/python3
"""An ordinary PyTorch training loop that is also a deloco learner (docs/python.md).

The model is the Llama-style decoder of examples/llama (make_model.py), started from the weights of the run's
TorchScript file (model.path), so it begins at the same Θ as every other learner. The loop is plain PyTorch:
its own data sampling, torch.optim.AdamW, warm-up and cosine decay, gradient clipping, bf16 autocast. The deloco
part is three lines: make a deloco.Learner, call learner.step() after each optimizer step, close it.

Under `deloco run` (every address, key and id comes from the environment it sets):
    /usr/bin/python3 examples/llama/make_model.py --out examples/llama/model.pt
    ./build/deloco run --config examples/llama/llama.toml --set sync.learners=2 \\
        --learner-command 1='/usr/bin/python3 examples/pytorch/train.py'

Against a syncer elsewhere: the same environment (DELOCO_CONFIG, DELOCO_LEARNER_ID, DELOCO_SYNCER, DELOCO_SECRET_KEY,
DELOCO_SERVER_KEY) or the flags below.
"""
import argparse
import glob
import math
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "llama"))
from make_model import Llama  # noqa: E402

import deloco  # noqa: E402  (PYTHONPATH=build/python, or `pip install ./python`)


def training_bytes(path, val_fraction):
    """The corpus as deloco splits it: documents sorted by path, every k-th (k = 1 / val_fraction) held out."""
    files = [path] if os.path.isfile(path) else sorted(
        f for f in glob.glob(os.path.join(path, "**", "*"), recursive=True)
        if os.path.isfile(f) and not os.path.basename(f).startswith("."))
    docs = [d for d in (open(f, "rb").read() for f in files) if d]
    if not docs:
        raise SystemExit(f"train.py: no text under {path}")
    if len(docs) == 1:
        held = max(1, round(len(docs[0]) * val_fraction))
        train = docs[0][:-held]
    else:
        k = max(2, round(1 / val_fraction))
        kept = [d for i, d in enumerate(docs) if i % k != k - 1]
        train = b"\n".join(kept if len(kept) < len(docs) else docs[:-1])
    return torch.frombuffer(bytearray(train), dtype=torch.uint8).long()


def llama_like(script_path):
    """The Python model of the run's TorchScript file, with its weights (the run's initial parameters)."""
    scripted = torch.jit.load(script_path)
    sd = scripted.state_dict()
    layers = len({k.split(".")[1] for k in sd if k.startswith("layers.")})
    dim = sd["tok_embeddings.weight"].shape[1]
    model = Llama(scripted.vocab_size, scripted.block_size, layers, dim, getattr(scripted.layers, "0").attention.n_head,
                  hidden=sd["layers.0.feed_forward.w1.weight"].shape[0])
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(sd[name])
    return model


def lr_at(step, cfg):
    t = cfg["train"]
    if step < t["warmup_steps"]:
        return t["lr"] * (step + 1) / t["warmup_steps"]
    progress = (step - t["warmup_steps"]) / max(1, t["steps"] - t["warmup_steps"])
    floor = t["min_lr_ratio"]
    return t["lr"] * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", help="the run's config (default DELOCO_CONFIG)")
    ap.add_argument("--id", type=int, help="learner id (default DELOCO_LEARNER_ID)")
    ap.add_argument("--connect", help="syncer endpoint (default DELOCO_SYNCER, else net.address)")
    ap.add_argument("--secret-key", help="this learner's .key file (default DELOCO_SECRET_KEY)")
    ap.add_argument("--syncer-key", help="the syncer's .pub file (default DELOCO_SERVER_KEY)")
    ap.add_argument("--set", action="append", default=[], help="section.key=value override (repeatable)")
    ap.add_argument("--fp32", action="store_true", help="no bf16 autocast")
    a = ap.parse_args()
    torch.set_num_threads(1)

    # Read the run's config first (the model file, the data, the batch size), then build the model.
    config_path = a.config or os.environ.get("DELOCO_CONFIG")
    probe = deloco.read_config(config_path, a.set)
    model = llama_like(probe["model"]["path"])

    # --- deloco: join the run (the model now holds the global parameters) ---
    learner = deloco.Learner(model, config=a.config, set=a.set, learner_id=a.id, connect=a.connect,
                             secret_key=a.secret_key, syncer_key=a.syncer_key)
    # `deloco run` stops a run with SIGTERM: end the loop at the next step and still say goodbye.
    signal.signal(signal.SIGTERM, lambda *_: learner.stop())
    cfg = learner.config
    t = cfg["train"]
    data = training_bytes(cfg["data"]["path"], cfg["data"]["val_fraction"])
    T, B = model.block_size, t["batch_size"]
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": t["weight_decay"]},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=t["lr"], betas=(t["beta1"], t["beta2"]))
    gen = torch.Generator().manual_seed(t["seed"] * 1000003 + learner.learner_id * 7919 + learner.start_step)
    print(f"train.py: learner {learner.learner_id}, steps {learner.start_step}..{learner.total_steps}, "
          f"{sum(p.numel() for p in model.parameters())} parameters, {'fp32' if a.fp32 else 'bf16 autocast'}",
          flush=True)
    start = time.time()
    step = learner.start_step
    while not learner.done:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        starts = torch.randint(0, data.numel() - T - 1, (B,), generator=gen)
        x = torch.stack([data[s:s + T] for s in starts.tolist()])
        y = torch.stack([data[s + 1:s + T + 1] for s in starts.tolist()])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=not a.fp32):
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if t["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), t["grad_clip"])
        optimizer.step()
        step += 1
        learner.step(tokens=B * T, loss=loss.item())  # --- deloco: may apply a merged fragment in place ---
    summary = learner.close()  # --- deloco: goodbye ---
    print(f"train.py: learner {learner.learner_id} trained {summary['steps_trained']} steps in "
          f"{time.time() - start:.1f} s, {summary['pushes']} pushes, {summary['broadcasts']} merged fragments "
          f"received", flush=True)


if __name__ == "__main__":
    main()
