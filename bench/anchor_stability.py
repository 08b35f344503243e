#!/usr/bin/python3
"""Linear stability of the outer step when contributions are anchored at the syncer's current Θ
(sync.delta_anchor = global) and every contribution is k versions stale.

Model (no training signal, the worst case): a contribution based on version n-k anchored at Θ_n carries
Δ = Δ̂ + (Θ_n − Θ_{n−k}); with Δ̂ = 0 the outer gradient is g_n = s(k)·(d_n + … + d_{n−k+1}), d_n = Θ_n − Θ_{n−1}:
the updates of the last k merges, fed back, times the staleness scale s(k) of sync.staleness (1 when off). The outer
optimizer (torch.optim.SGD semantics, DESIGN.md §2.6): b ← μb + g; u = g + μb (Nesterov) or b (heavy ball);
Θ ← Θ − ηu. Delayed Nesterov (outer.kind = delayed_nesterov, Liu et al.'s: g/N per merge, the momentum once every
N; and delayed_nesterov_whole, the whole g per merge; deloco/outer.h) is periodic with period N: the figure
is then the N-th root of the radius of the product of one period's N maps. The printed figure is the spectral radius
per merge: above 1, any deviation grows by that factor per merge until the learners' own (bounded) steps can no
longer pull it back.

    /usr/bin/python3 bench/anchor_stability.py
"""
import math

import numpy as np


def radius(eta, mu, k, nesterov=True, scale=1.0, delay=0, share=0.0, whole=False):
    """Growth per merge. delay = 0: Nesterov / heavy ball; delay = N ≥ 1: delayed Nesterov with c = share (whole:
    delayed_nesterov_whole)."""
    period = max(1, delay)

    def step(x, i):
        d, b, a = x[:k], x[k], x[k + 1]
        g = scale * d.sum()
        if delay == 0:
            b1 = mu * b + g
            u = g + mu * b1 if nesterov else b1
            a1 = 0.0
        else:
            a1 = a + g
            gs = g if whole else g / period  # the share of g each merge applies
            if i == period - 1:
                b1 = mu * b + a1 / period
                u = gs + (1.0 if whole else 1 - share * period + share) * mu * b1
                a1 = 0.0
            else:
                b1 = b
                u = gs + share * mu * b
        return np.concatenate([[-eta * u], d[:-1], [b1, a1]])

    n = k + 2
    total = np.eye(n)
    for i in range(period):
        total = np.stack([step(e, i) for e in np.eye(n)], 1) @ total
    return float(max(abs(np.linalg.eigvals(total)))) ** (1.0 / period)


if __name__ == "__main__":
    ks = (1, 2, 3, 4, 8)
    poly = lambda a: (lambda k: (1 + k) ** -a)
    expo = lambda a: (lambda k: math.exp(-a * k))
    rows = [("diloco / decoupled (Nesterov)", dict(eta=0.7, mu=0.9)),
            ("isoloco (Nesterov)", dict(eta=1.8, mu=0.8)),
            ("SGD eta=0.7", dict(eta=0.7, mu=0.0)),
            ("Nesterov eta=0.35", dict(eta=0.35, mu=0.9)),
            ("Nesterov + staleness poly 0.5", dict(eta=0.7, mu=0.9, s=poly(0.5))),
            ("Nesterov + staleness poly 1", dict(eta=0.7, mu=0.9, s=poly(1.0))),
            ("Nesterov + staleness exp 0.5", dict(eta=0.7, mu=0.9, s=expo(0.5))),
            ("delayed Nesterov N=4 c=0", dict(eta=0.7, mu=0.9, delay=4)),
            ("delayed Nesterov N=8 c=0", dict(eta=0.7, mu=0.9, delay=8)),
            ("delayed Nesterov N=4 c=0.25", dict(eta=0.7, mu=0.9, delay=4, share=0.25)),
            ("delayed Nesterov N=4 eta=2.8 c=0", dict(eta=2.8, mu=0.9, delay=4)),
            ("delayed_nesterov_whole N=4 c=0", dict(eta=0.7, mu=0.9, delay=4, whole=True)),
            ("delayed_nesterov_whole N=8 c=0", dict(eta=0.7, mu=0.9, delay=8, whole=True)),
            ("delayed_nesterov_whole N=4 c=0.5", dict(eta=0.7, mu=0.9, delay=4, share=0.5, whole=True))]
    print(f"{'staleness k (versions) ->':34s}", " ".join(f"{k:>6}" for k in ks))
    for name, r in rows:
        s = r.get("s", lambda k: 1.0)
        print(f"{name:34s}", " ".join(f"{radius(r['eta'], r['mu'], k, scale=s(k), delay=r.get('delay', 0), share=r.get('share', 0.0), whole=r.get('whole', False)):6.3f}"
                                      for k in ks))
