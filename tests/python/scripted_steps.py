"""Reference inner steps of a TorchScript model in PyTorch, for src/model/language_model_test.cpp.

    scripted_steps.py MODEL.pt STEPS.json OUT.json

STEPS.json: {"batches": [[[token, ...] x B] per step] (each row T + 1 tokens), "lrs": [lr per step],
"grad_clip": c, "betas": [b1, b2], "eps": e, "weight_decay": wd}. Each step: logits = model(x), mean cross-entropy
against the next tokens, backward, clip_grad_norm_, torch.optim.AdamW (weight decay on tensors of rank >= 2
only). Writes {"losses": [...], "params": {name: [flattened values]}} after the last step.
"""
import json
import sys

import torch
import torch.nn.functional as F


def main():
    model_path, steps_path, out_path = sys.argv[1:4]
    torch.set_num_threads(1)
    s = json.load(open(steps_path))
    model = torch.jit.load(model_path)
    model.train()
    params = list(model.named_parameters())
    decay = [p for _, p in params if p.dim() >= 2]
    no_decay = [p for _, p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": s["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=s["lrs"][0], betas=tuple(s["betas"]), eps=s["eps"])
    losses = []
    for batch, lr in zip(s["batches"], s["lrs"]):
        b = torch.tensor(batch, dtype=torch.long)
        x, y = b[:, :-1], b[:, 1:]
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for _, p in params], s["grad_clip"])
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        losses.append(loss.item())
    json.dump({"losses": losses, "params": {n: p.detach().reshape(-1).tolist() for n, p in params}}, open(out_path, "w"))


if __name__ == "__main__":
    main()
