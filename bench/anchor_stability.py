#!/usr/bin/python3
"""Linear stability of the outer step when contributions are anchored at the syncer's current Θ
(sync.delta_anchor = global) and every contribution is k versions stale.

Model (no training signal, the worst case): a contribution based on version n-k anchored at Θ_n carries
Δ = Δ̂ + (Θ_n − Θ_{n−k}); with Δ̂ = 0 the outer gradient is g_n = d_n + … + d_{n−k+1}, d_n = Θ_n − Θ_{n−1}: the
updates of the last k merges, fed back. The outer optimizer (torch.optim.SGD semantics, DESIGN.md §2.6):
b ← μb + g; u = g + μb (Nesterov) or b (heavy ball); Θ ← Θ − ηu. The printed figure is the spectral radius of that
linear recurrence: above 1, any deviation grows by that factor per merge until the learners' own (bounded) steps
can no longer pull it back.

    /usr/bin/python3 bench/anchor_stability.py
"""
import numpy as np


def radius(eta, mu, k, nesterov=True):
    def step(x):
        d, b = x[:k], x[k]
        g = d.sum()
        b1 = mu * b + g
        u = g + mu * b1 if nesterov else b1
        return np.concatenate([[-eta * u], d[:-1], [b1]])
    a = np.stack([step(e) for e in np.eye(k + 1)], 1)
    return float(max(abs(np.linalg.eigvals(a))))


if __name__ == "__main__":
    ks = (1, 2, 3, 4, 8)
    print("staleness k (versions) ->", " ".join(f"{k:>6}" for k in ks))
    for name, eta, mu in [("diloco / decoupled (Nesterov)", 0.7, 0.9), ("isoloco (Nesterov)", 1.8, 0.8),
                          ("SGD eta=0.7", 0.7, 0.0), ("Nesterov eta=0.35", 0.35, 0.9)]:
        print(f"{name:30s}", " ".join(f"{radius(eta, mu, k):6.3f}" for k in ks))
