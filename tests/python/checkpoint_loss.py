"""Prints the loss of a deloco checkpoint on a text, computed by PyTorch (used by src/cli/cli_test.cpp).

    checkpoint_loss.py CHECKPOINT_OR_RUN TEXT        the text itself
    checkpoint_loss.py CHECKPOINT_OR_RUN @FILE       the bytes of FILE
"""
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from deloco_ref import load_checkpoint  # noqa: E402

ckpt, arg = sys.argv[1], sys.argv[2]
text = open(arg[1:], "rb").read() if arg.startswith("@") else arg.encode()
model, manifest = load_checkpoint(ckpt)
tokens = torch.tensor(list(text), dtype=torch.long)
# A text longer than the model's context is scored in consecutive windows of block_size + 1 bytes (the mean over
# every predicted byte).
T = int(manifest["config"]["model"].get("block_size", len(tokens) - 1))
total, count = 0.0, 0
with torch.no_grad():
    for start in range(0, max(len(tokens) - 1, 1), T):
        w = tokens[start:start + T + 1].view(1, -1)
        if w.size(1) < 2:
            break
        n = w.size(1) - 1
        total += model.loss(w[:, :-1], w[:, 1:]).item() * n
        count += n
print(f"{total / count:.8f}")
