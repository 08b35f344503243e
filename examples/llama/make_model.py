#!/usr/bin/python3
"""A small Llama-style decoder for deloco: RMSNorm, rotary position embeddings, SwiGLU, no biases.

Defines the model in PyTorch, scripts it with torch.jit.script and saves it, so that `deloco` can train it
(model.kind = "torchscript", model.path = the file written here). Runs on Debian's python3-torch (1.13):

    /usr/bin/python3 examples/llama/make_model.py --out examples/llama/model.pt

What deloco needs of any module it trains: forward(idx) takes int64 token ids [B, T] and returns logits [B, T, V];
float32 parameters; and, optionally, int attributes vocab_size and block_size (otherwise model.vocab_size and
model.block_size of the config say them). The initial parameters are the ones saved: every learner starts from them.
"""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x, cos, sin):
    """Rotary embedding on the last dimension, pairs (even, odd) rotated by the position's angles."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2)


class Attention(nn.Module):
    def __init__(self, dim: int, n_head: int, block_size: int):
        super().__init__()
        self.n_head = n_head
        self.head_dim = dim // n_head
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.register_buffer("mask", torch.tril(torch.ones(block_size, block_size, dtype=torch.bool)), persistent=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        q = self.wq(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        att = att.masked_fill(~self.mask[:T, :T], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return self.wo(y)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim: int, n_head: int, hidden: int, block_size: int):
        super().__init__()
        self.attention_norm = RMSNorm(dim)
        self.attention = Attention(dim, n_head, block_size)
        self.ffn_norm = RMSNorm(dim)
        self.feed_forward = FeedForward(dim, hidden)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    vocab_size: int
    block_size: int

    def __init__(self, vocab_size=256, block_size=64, n_layer=2, dim=64, n_head=4, hidden=0, rope_base=10000.0):
        super().__init__()
        self.vocab_size = vocab_size
        self.block_size = block_size
        hidden = hidden or 4 * ((int(8 * dim / 3) + 3) // 4)  # SwiGLU's 2/3 of 4·dim, rounded to a multiple of 4
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleList([Block(dim, n_head, hidden, block_size) for _ in range(n_layer)])
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab_size, bias=False)
        head_dim = dim // n_head
        inv = 1.0 / (rope_base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        angles = torch.outer(torch.arange(block_size, dtype=torch.float32), inv)  # [T, head_dim / 2]
        self.register_buffer("rope_cos", angles.cos(), persistent=False)
        self.register_buffer("rope_sin", angles.sin(), persistent=False)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith(("wo.weight", "w2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx):
        T = idx.size(1)
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.output(self.norm(x))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the TorchScript file to write (e.g. examples/llama/model.pt)")
    ap.add_argument("--vocab", type=int, default=256, help="vocabulary size (256: bytes)")
    ap.add_argument("--block", type=int, default=64, help="context length T")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1337)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    model = Llama(a.vocab, a.block, a.layers, a.dim, a.heads)
    scripted = torch.jit.script(model)
    scripted.save(a.out)
    n = sum(p.numel() for p in model.parameters())
    print(f"{a.out}: Llama-style decoder, {n} parameters, V={a.vocab}, T={a.block}, {a.layers} layers, dim {a.dim}")


if __name__ == "__main__":
    main()
