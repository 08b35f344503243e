"""Reference Muon steps in PyTorch, written from the papers' description, for src/train/muon_test.cpp.

    muon_steps.py IN.json OUT.json

IN.json: {"params": {name: {"shape": [...], "values": [...]}}, "steps": [{"lr": lr, "grads": {name: [...]}}],
"momentum": mu, "nesterov": bool, "ns_steps": k, "ns_dtype": "fp32" | "bf16", "weight_decay": wd,
"betas": [b1, b2], "eps": e}. OUT.json: {name: [flattened values after the last step]}.

Muon (Jordan et al. 2024; the scale of Liu et al. 2025, "Muon is scalable for LLM training") on every 2-D parameter
that is not an embedding or the output head; torch.optim.AdamW (weight decay on tensors of rank >= 2) on the rest.
Per Muon step: buf = mu*buf + g; u = g + mu*buf (Nesterov) or buf; o = NS5(u), the quintic iteration
X <- aX + (bA + cA^2)X with A = X X^T on the wide orientation, (a, b, c) = (3.4445, -4.7750, 2.0315), after
X /= (||X||_F + 1e-7); p *= 1 - lr*wd; p -= lr * 0.2*sqrt(max(m, n)) * o.
"""
import json
import math
import sys

import torch


def newton_schulz5(g, steps, dtype):
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.float()
    x = x / (x.norm() + 1e-7)
    x = x.to(dtype)
    transposed = x.size(0) > x.size(1)
    if transposed:
        x = x.t()
    for _ in range(steps):
        A = x @ x.t()
        B = b * A + c * (A @ A)
        x = a * x + B @ x
    if transposed:
        x = x.t()
    return x.float()


def is_hidden_matrix(name, p):
    # The Muon and MuLoCo papers' split: the matrices of the transformer blocks; embeddings (token, position) and
    # the output head take AdamW. The test's parameters are named as GPT-2's.
    return p.dim() == 2 and name.split(".")[0] not in ("wte", "wpe", "lm_head")


def main():
    inp, out = sys.argv[1:3]
    torch.set_num_threads(1)
    s = json.load(open(inp))
    params = {n: torch.tensor(v["values"], dtype=torch.float32).view(v["shape"]).requires_grad_(True)
              for n, v in s["params"].items()}
    muon = {n: p for n, p in params.items() if is_hidden_matrix(n, p)}
    rest = [(n, p) for n, p in params.items() if n not in muon]
    adam = torch.optim.AdamW([{"params": [p for _, p in rest if p.dim() >= 2], "weight_decay": s["weight_decay"]},
                              {"params": [p for _, p in rest if p.dim() < 2], "weight_decay": 0.0}],
                             lr=1.0, betas=tuple(s["betas"]), eps=s["eps"])
    bufs = {n: torch.zeros_like(p) for n, p in muon.items()}
    dtype = torch.bfloat16 if s["ns_dtype"] == "bf16" else torch.float32
    mu = s["momentum"]
    for step in s["steps"]:
        lr = step["lr"]
        for n, p in params.items():
            p.grad = torch.tensor(step["grads"][n], dtype=torch.float32).view(p.shape)
        for group in adam.param_groups:
            group["lr"] = lr
        adam.step()
        with torch.no_grad():
            for n, p in muon.items():
                g = p.grad
                bufs[n].mul_(mu).add_(g)
                u = g + mu * bufs[n] if s["nesterov"] else bufs[n]
                o = newton_schulz5(u, s["ns_steps"], dtype)
                p.mul_(1 - lr * s["weight_decay"])
                p.add_(o, alpha=-lr * 0.2 * math.sqrt(max(p.size(0), p.size(1))))
    json.dump({n: p.detach().reshape(-1).tolist() for n, p in params.items()}, open(out, "w"))


if __name__ == "__main__":
    main()
