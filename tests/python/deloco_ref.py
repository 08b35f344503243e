"""Reference pieces of deloco written in Python with PyTorch (Debian's /usr/bin/python3 has python3-torch).

Used by the test suite (a deloco checkpoint must load in PyTorch and give the same outputs) and by
bench/train_vs_pytorch.py (the same architecture trained by PyTorch, side by side with `deloco train`).
Nothing here is imported by deloco itself.
"""
import json
import os
import math
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


def load_safetensors(path):
    """The few lines docs/checkpoints.md shows: a safetensors file without the safetensors package."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, en = e["data_offsets"]
        buf = bytearray(data[base + b:base + en])
        t = torch.frombuffer(buf, dtype=_DTYPES[e["dtype"]]) if en > b else torch.empty(0, dtype=_DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"])
    return out


class Block(nn.Module):
    def __init__(self, C, nh):
        super().__init__()
        self.nh = nh
        self.ln_1 = nn.LayerNorm(C)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(C, 3 * C)
        self.attn.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(C, 4 * C)
        self.mlp.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.nh
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.nh, hs).transpose(1, 2)
        k = k.view(B, T, self.nh, hs).transpose(1, 2)
        v = v.view(B, T, self.nh, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        att = torch.softmax(att.masked_fill(future, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        h = x + self.attn.c_proj(y)
        return h + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(h))))


class GPT(nn.Module):
    """The same architecture and parameter names as deloco's src/model/gpt.cpp."""

    def __init__(self, vocab_size=256, block_size=128, n_layer=4, n_head=4, n_embd=256, tie_embeddings=True):
        super().__init__()
        self.tie = tie_embeddings
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        if not tie_embeddings:
            self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                nn.init.zeros_(p)
            elif "ln_" in name:
                nn.init.ones_(p)
            elif name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer))
            else:
                nn.init.normal_(p, 0.0, 0.02)

    @staticmethod
    def from_config(model_cfg):
        return GPT(**{k: model_cfg[k] for k in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd",
                                               "tie_embeddings")})

    def forward(self, idx):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x)
        x = self.ln_f(x)
        return F.linear(x, self.wte.weight) if self.tie else self.lm_head(x)

    def loss(self, idx, targets):
        logits = self(idx)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def newest_checkpoint(path):
    """A checkpoint folder as is; a run folder (deloco train, syncer or run) -> its newest committed checkpoint,
    the one with the largest manifest "sequence" under checkpoints/ (temporaries, dot-named, are skipped)."""
    if os.path.exists(os.path.join(path, "manifest.json")):
        return path
    best, best_seq = None, -1
    root = os.path.join(path, "checkpoints")
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        manifest = os.path.join(root, name, "manifest.json")
        if name.startswith(".") or not os.path.exists(manifest):
            continue
        with open(manifest) as f:
            seq = json.load(f).get("sequence", 0)
        if seq >= best_seq:
            best, best_seq = os.path.join(root, name), seq
    if best is None:
        raise FileNotFoundError(f"{path}: neither a checkpoint folder nor a run folder with checkpoints")
    return best


class ScriptedLM(nn.Module):
    """A user's TorchScript module (model.kind = "torchscript") with the same loss() as GPT."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, idx):
        return self.module(idx)

    def loss(self, idx, targets):
        logits = self(idx)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))


def load_checkpoint(ckpt_dir):
    """A deloco checkpoint folder, or a run folder (its newest checkpoint) -> (model with its weights, manifest).
    The built-in GPT is rebuilt from the manifest's config; a TorchScript model is loaded from its model.path (as
    recorded, relative to the working directory) and given the checkpoint's weights by parameter name."""
    ckpt_dir = newest_checkpoint(ckpt_dir)
    with open(f"{ckpt_dir}/manifest.json") as f:
        manifest = json.load(f)
    cfg = manifest["config"]["model"]
    state = load_safetensors(f"{ckpt_dir}/model.safetensors")
    if cfg.get("kind", "gpt") == "torchscript":
        module = torch.jit.load(cfg["path"])
        names = {n for n, _ in module.named_parameters()}
        if names != set(state):  # buffers (masks, rotary tables) are the module's own, not in checkpoints
            raise ValueError(f"{ckpt_dir}: parameters {sorted(names ^ set(state))[:5]} differ from {cfg['path']}")
        module.load_state_dict(state, strict=False)
        model = ScriptedLM(module)
    else:
        model = GPT.from_config(cfg)
        model.load_state_dict(state)
    model.eval()
    return model, manifest
