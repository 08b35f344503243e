"""TorchScript fixtures for src/model/language_model_test.cpp (run with /usr/bin/python3, Debian's python3-torch).

    scripted_fixtures.py OUT_DIR

Writes into OUT_DIR:
  llama.pt          the Llama-style example (examples/llama/make_model.py), 2 layers, dim 32, V 256, T 16
  no_attrs.pt       a tiny decoder without vocab_size / block_size attributes (V 300, any T)
  two_args.pt       forward(self, idx, mask): the wrong signature
  flat_logits.pt    forward returns [B, T] instead of [B, T, V]
  float64.pt        a float64 parameter
  fixed_batch.pt    forward reshapes to a batch of 2: passes the trial forward ([2, T]), fails on any other batch
  nan_on_data.pt    forward returns NaN logits for ids that are not all zero (finite on the trial forward's zeros)
  nan_always.pt     forward returns NaN logits for every input
  not_a_module.pt   a text file
"""
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "llama"))
from make_model import Llama  # noqa: E402


class NoAttrs(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(300, 8)
        self.head = nn.Linear(8, 300)

    def forward(self, idx):
        return self.head(self.emb(idx))


class TwoArgs(NoAttrs):
    def forward(self, idx, mask):
        return self.head(self.emb(idx)) * mask


class FlatLogits(NoAttrs):
    def forward(self, idx):
        return self.head(self.emb(idx)).sum(-1)


class Float64(NoAttrs):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1, dtype=torch.float64))

    def forward(self, idx):
        return self.head(self.emb(idx)) * self.scale.float()


class FixedBatch(NoAttrs):
    def forward(self, idx):
        return self.head(self.emb(idx)).view(2, idx.size(1), 300)


class NanOnData(NoAttrs):
    def forward(self, idx):
        y = self.head(self.emb(idx))
        if bool(idx.max() > 0):
            y = y * float("nan")
        return y


class NanAlways(NoAttrs):
    def forward(self, idx):
        return self.head(self.emb(idx)) * float("nan")


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(7)
    torch.jit.script(Llama(vocab_size=256, block_size=16, n_layer=2, dim=32, n_head=4)).save(os.path.join(out, "llama.pt"))
    torch.jit.script(NoAttrs()).save(os.path.join(out, "no_attrs.pt"))
    torch.jit.script(TwoArgs()).save(os.path.join(out, "two_args.pt"))
    torch.jit.script(FlatLogits()).save(os.path.join(out, "flat_logits.pt"))
    torch.jit.script(Float64()).save(os.path.join(out, "float64.pt"))
    torch.jit.script(FixedBatch()).save(os.path.join(out, "fixed_batch.pt"))
    torch.jit.script(NanOnData()).save(os.path.join(out, "nan_on_data.pt"))
    torch.jit.script(NanAlways()).save(os.path.join(out, "nan_always.pt"))
    with open(os.path.join(out, "not_a_module.pt"), "w") as f:
        f.write("not a module\n")


if __name__ == "__main__":
    main()
