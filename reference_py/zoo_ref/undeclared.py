"""References that declare no variants, written the way model code is: the test-bed of the mutation
diagnosis (`tests/mutations.rs`), which must name each wrong port's mistake from the reference's own
torch calls. Not imported by `zoo_ref` itself.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn


def attention(q, k, v):
    """Causal attention written out, as nanoGPT's slow path does: (batch, heads, seq, head_dim)."""
    t, d = q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    causal = torch.tril(torch.ones(t, t, dtype=torch.bool))
    scores = scores.masked_fill(~causal, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def attention_additive(q, k, v):
    """Causal attention with an additive mask, as Hugging Face's eager attention does."""
    t = q.shape[-2]
    mask = torch.full((t, t), float("-inf")).triu(1)
    scores = torch.matmul(q, k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    scores = scores + mask
    return F.softmax(scores, dim=-1) @ v


def masked_softmax(scores, keep):
    """Softmax over the kept positions; a row with none kept stays finite (uniform)."""
    return torch.softmax(scores.masked_fill(~keep, -1e4), dim=-1)


def layer_norm(x, weight, bias, eps=1e-5):
    """A layer norm written out."""
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, unbiased=False, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def l2_normalize(x):
    """Rows scaled to unit norm, with a small epsilon against a zero row."""
    return x / (x.norm(dim=-1, keepdim=True) + 1e-6)


def bilinear(x, w):
    """x @ w, with w as given (not a Linear's [out, in] weight)."""
    return x @ w


def expand_heads(kv, n_rep=2):
    """Grouped-query attention's key/value heads, each repeated in place (h0, h0, h1, h1)."""
    return kv.repeat_interleave(n_rep, dim=1)


def upsample(x):
    """Bilinear 2× upsampling, corners not aligned."""
    return F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)


def causal_conv1d(x, weight, bias):
    """A causal convolution: the input padded on the left only."""
    k = weight.shape[-1]
    return F.conv1d(F.pad(x, (k - 1, 0)), weight, bias)


# --- a LLaMA-style block -------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(d))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x, n_rep: int):
    b, h, t, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, h, n_rep, t, d).reshape(b, h * n_rep, t, d)


class Rotary(nn.Module):
    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, t: int, dtype):
        positions = torch.arange(t, dtype=torch.float32)
        freqs = torch.outer(positions, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


class Attention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, rope_theta: float):
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=False)
        self.rotary = Rotary(self.head_dim, rope_theta)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.rotary(t, x.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        n_rep = self.n_heads // self.n_kv_heads
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, hidden, bias=False)
        self.up_proj = nn.Linear(d_model, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    """Pre-norm: x + attn(norm(x)), then x + mlp(norm(x)); RMSNorm, rotary embeddings on the two
    halves, grouped-query attention, SwiGLU."""

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, hidden: int,
                 rope_theta: float = 500000.0, eps: float = 1e-5):
        super().__init__()
        self.input_layernorm = RMSNorm(d_model, eps)
        self.self_attn = Attention(d_model, n_heads, n_kv_heads, rope_theta)
        self.post_attention_layernorm = RMSNorm(d_model, eps)
        self.mlp = SwiGLU(d_model, hidden)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


# --- a long reference ----------------------------------------------------------------------------

def _long_chain_source(steps: int = 1000) -> str:
    """`long_chain`: 3,000 torch calls at 3,000 distinct sites, a tanh after an affine map with
    constants that change from line to line (the mutation diagnosis must keep to its budget)."""
    lines = ["def long_chain(x):"]
    for k in range(steps):
        lines.append(f"    x = torch.tanh(x * {1 + (k % 7) / 50!r} + {(k % 5 - 2) / 100!r})")
    lines.append("    return x")
    return "\n".join(lines) + "\n"


exec(compile(_long_chain_source(), "<zoo_ref.undeclared.long_chain>", "exec"), globals())
