"""Prints the loss of a deloco checkpoint on a fixed text, computed by PyTorch (used by src/cli/cli_test.cpp)."""
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from deloco_ref import load_checkpoint  # noqa: E402

ckpt, text = sys.argv[1], sys.argv[2].encode()
model, manifest = load_checkpoint(ckpt)
tokens = torch.tensor(list(text), dtype=torch.long).view(1, -1)
with torch.no_grad():
    print(f"{model.loss(tokens[:, :-1], tokens[:, 1:]).item():.8f}")
