"""References for the tests of golden's reach (`tests/trace.rs`, `tests/half_precision.rs`):
modules whose intermediates have dtypes of their own."""

import torch
from torch import nn


class Float32Softmax(nn.Module):
    """A softmax computed and returned in float32, whatever its input's dtype (as eager attention
    computes its probabilities)."""

    def forward(self, x):
        return torch.softmax(x, dim=-1, dtype=torch.float32)


class Argmax(nn.Module):
    """The index of the largest score: an int64 tensor."""

    def forward(self, p):
        return p.argmax(dim=-1)


class ScoresBlock(nn.Module):
    """Scores (the input's dtype), their softmax in float32, the winning index (int64), and the
    probabilities cast back to the input's dtype: a trace with three dtypes in it."""

    def __init__(self, d=8):
        super().__init__()
        self.proj = nn.Linear(d, d, bias=False)
        self.softmax = Float32Softmax()
        self.pick = Argmax()

    def forward(self, x):
        probs = self.softmax(self.proj(x))
        self.pick(probs)
        return probs.to(x.dtype)


def top_k_probs(logits, k=3):
    """A sampler's distribution: the softmax of the `k` largest logits of each row, the others
    zero, renormalised."""
    kth = logits.topk(k, dim=-1).values[..., -1:]
    kept = logits.masked_fill(logits < kth, float("-inf"))
    return torch.softmax(kept, dim=-1)
