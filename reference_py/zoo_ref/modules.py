"""Module-form references of the zoo: nn.Modules whose state_dict the Rust ports load."""

import math

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    """Linear -> GELU -> Linear, as in a transformer block."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(d_model, hidden)
        self.fc2 = nn.Linear(hidden, d_model)

    def forward(self, x, approximate: str = "none"):
        return self.fc2(F.gelu(self.fc1(x), approximate=approximate))


class ReluMLP(nn.Module):
    """Linear -> ReLU -> Linear whose first `dead` hidden units have a bias of -100: they never
    fire, which the overfit check's gradient health must flag (tests/overfit.rs)."""

    def __init__(self, d_model: int, hidden: int, dead: int = 0):
        super().__init__()
        self.fc1 = nn.Linear(d_model, hidden)
        self.fc2 = nn.Linear(hidden, d_model)
        with torch.no_grad():
            self.fc1.bias[:dead] = -100.0

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        assert d_model % n_heads == 0
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x, causal: bool = True):
        b, t, d = x.shape
        h = self.n_heads
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // h)
        if causal:
            mask = torch.ones(t, t, dtype=torch.bool).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class TransformerBlock(nn.Module):
    """A pre-norm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, d_model: int, n_heads: int, hidden: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, hidden)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    """Token embedding -> `n_layers` transformer blocks -> final LayerNorm -> vocabulary head: the
    zoo's whole model, checked with `trace` (tests/zoo/model.rs)."""

    def __init__(self, vocab: int, d_model: int, n_heads: int, hidden: int, n_layers: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(TransformerBlock(d_model, n_heads, hidden) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, ids):
        x = self.tok(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))
