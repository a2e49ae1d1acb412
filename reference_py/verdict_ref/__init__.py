"""References for tests/verdicts.rs: situations in which a naive differential test passes a wrong
port or fails a right one. Each is ordinary code a porter meets (Hugging Face's init, its masking
and upcasting idioms, in-place updates), not a contrivance."""

import math
import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# --- Parameters whose default init hides bugs ---------------------------------------------------


class Norm(nn.Module):
    """nn.LayerNorm starts at weight 1 and bias 0."""

    def __init__(self, d=16):
        super().__init__()
        self.ln = nn.LayerNorm(d)

    def forward(self, x):
        return self.ln(x)


class ZeroBiasDense(nn.Module):
    """A Linear initialised the way Hugging Face's `_init_weights` does: normal(0, 0.02), bias 0."""

    def __init__(self, d=8, out=6):
        super().__init__()
        self.dense = nn.Linear(d, out)
        nn.init.normal_(self.dense.weight, std=0.02)
        nn.init.zeros_(self.dense.bias)

    def forward(self, x):
        return self.dense(x)


class EvalBatchNorm(nn.Module):
    """BatchNorm in eval mode normalises with its running statistics, which start at 0 and 1."""

    def __init__(self, c=4):
        super().__init__()
        self.bn = nn.BatchNorm1d(c)

    def forward(self, x):
        return self.bn(x)


class TiedLM(nn.Module):
    """An LM head tied to the embedding: both names are in the state_dict, one tensor."""

    def __init__(self, vocab=11, d=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(self.emb(ids))


class Renamed(nn.Module):
    """A module named the transformers-5 way (`layers.0.attention.q_proj`) where candle ports keep
    the checkpoint's older names."""

    def __init__(self, d=8):
        super().__init__()
        self.layers = nn.ModuleList([nn.ModuleDict({"attention": nn.ModuleDict({"q_proj": nn.Linear(d, d)})})])

    def forward(self, x):
        return self.layers[0]["attention"]["q_proj"](x)


# --- References that change their own inputs or depend on the dtype --------------------------------


def add_one_inplace(x):
    x.add_(1.0)
    return x


def masked_fill_min(x, mask):
    """Hugging Face's masking idiom: the most negative value of the computation's dtype."""
    return x.masked_fill(mask, torch.finfo(x.dtype).min)


def plus_dtype_eps(x):
    """A constant that depends on the dtype: 0.12 in float32, 2e-11 in float64."""
    return x + torch.finfo(x.dtype).eps * 1e6


# --- References that are not deterministic -------------------------------------------------------


def noisy_numpy(x):
    """Noise from NumPy's global generator, which golden does not seed."""
    return x + torch.from_numpy(np.random.standard_normal(tuple(x.shape))).to(x.dtype) * 1e-3


def noisy_random(x):
    return x * (1.0 + 1e-3 * random.random())


# --- Parameters a module leaves uninitialised, keeps frozen or computes at init -------------------


def mixtral_moe(hidden=8, intermediate=16, experts=4, top_k=2):
    """transformers 5's Mixtral MoE block, bare: its router and experts are `torch.empty` memory."""
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    config = MixtralConfig(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_local_experts=experts,
        num_experts_per_tok=top_k,
    )
    return MixtralSparseMoeBlock(config)


class MixtralMoE(nn.Module):
    def __init__(self, hidden=8, intermediate=16, experts=4, top_k=2):
        super().__init__()
        self.moe = mixtral_moe(hidden, intermediate, experts, top_k)

    def forward(self, x):
        return self.moe(x)


def sinusoids(length, channels):
    """Whisper's positional table (`transformers`' `sinusoids`): sines then cosines."""
    increment = math.log(10000) / (channels // 2 - 1)
    inv = torch.exp(-increment * torch.arange(channels // 2))
    scaled = torch.arange(length)[:, None] * inv[None, :]
    return torch.cat([scaled.sin(), scaled.cos()], dim=1)


class SinusoidalPositions(nn.Module):
    """Whisper's encoder keeps its sinusoidal positions in a frozen parameter (`requires_grad=False`)
    that ports compute themselves; a persistent buffer is computed at init from a formula."""

    def __init__(self, n=8, d=8):
        super().__init__()
        self.pos = nn.Embedding(n, d)
        self.pos.requires_grad_(False)
        with torch.no_grad():
            self.pos.weight.copy_(sinusoids(n, d))
        self.register_buffer("ramp", torch.linspace(0.5, 1.5, d))
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        return self.proj(x + self.pos.weight[: x.shape[1]]) * self.ramp


class ClipEncoderLayer(nn.Module):
    """transformers' CLIPEncoderLayer (eager attention, no mask): its attention's key projection
    has a bias of its own, whose gradient softmax cancels (rounding noise only)."""

    def __init__(self, hidden=16, heads=2, intermediate=32):
        super().__init__()
        from transformers import CLIPTextConfig
        from transformers.models.clip.modeling_clip import CLIPEncoderLayer

        config = CLIPTextConfig(
            hidden_size=hidden, intermediate_size=intermediate, num_attention_heads=heads
        )
        config._attn_implementation = "eager"
        self.layer = CLIPEncoderLayer(config)

    def forward(self, x):
        return self.layer(x, attention_mask=None)


def nan_where_float64_is_not(x):
    """inf - inf in float32 (exp(100) overflows it), 0 in float64: NaN only in the case dtype."""
    big = torch.exp(torch.full_like(x, 100.0))
    return x + (big - big)


# --- References whose answers change with the number of calls, or under golden's float64 pass ---

_CALLS = {}


def _count(name: str) -> int:
    _CALLS[name] = _CALLS.get(name, 0) + 1
    return _CALLS[name]


def drifts_after_two_calls(x):
    """Exact for its first two calls, then off by 0.25 more at every call: a counter, a cache, a
    buffer that accumulates."""
    return x + 0.25 * max(0, _count("drift") - 2)


def noisy_after_two_calls(x):
    """Unseeded noise that begins at the third call."""
    if _count("noise") <= 2:
        return x.clone()
    return x + torch.from_numpy(np.random.standard_normal(tuple(x.shape))).to(x.dtype) * 1e-2


def gelu_tanh_when_watched(x):
    """Exact GELU, but the tanh approximation whenever a TorchFunctionMode is active, as in golden's
    float64 pass (contrived: any reference that computes something else in float64 only)."""
    from torch.overrides import _get_current_function_mode_stack

    if _get_current_function_mode_stack():
        return F.gelu(x, approximate="tanh")
    return F.gelu(x)


_BUFFERS = {}


def noise_into_a_buffer(x):
    """Returns a persistent buffer of its own, into which it writes unseeded noise at every call."""
    key = (tuple(x.shape), x.dtype)
    if key not in _BUFFERS:
        _BUFFERS[key] = torch.empty_like(x)
    noise = torch.from_numpy(np.random.standard_normal(tuple(x.shape))).to(x.dtype)
    return _BUFFERS[key].copy_(x + 1e-3 * noise)


# --- Gradients PyTorch defines by convention, and ports that mirror Hugging Face's upcasts -------


class PaddedEmbedding(nn.Module):
    """Row `padding_idx` gets a zero gradient by convention, not by calculus."""

    def __init__(self, vocab=7, d=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, d, padding_idx=0)

    def forward(self, ids):
        return self.emb(ids)


class UpcastRMSNorm(nn.Module):
    """Hugging Face's LlamaRMSNorm: computes in float32 whatever the input's dtype."""

    def __init__(self, d=16, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.variance_epsilon = eps

    def forward(self, x):
        dtype = x.dtype
        h = x.to(torch.float32)
        variance = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * h.to(dtype)


class TwoRMSNorms(nn.Module):
    """Two stacked RMSNorms with eps 1e-6: on near-zero inputs the loss curves at the scale of
    finite differences' ε."""

    def __init__(self, d=8, eps=1e-6):
        super().__init__()
        self.a = UpcastRMSNorm(d, eps)
        self.b = UpcastRMSNorm(d, eps)

    def forward(self, x):
        return self.b(self.a(x))


def softmax_float32(x):
    """Eager attention's `softmax(..., dtype=torch.float32)`, then back to the input's dtype."""
    return F.softmax(x, dim=-1, dtype=torch.float32).to(x.dtype)


class LlamaAttentionBlock(nn.Module):
    """Hugging Face's own LlamaAttention (eager: softmax in float32), with its rotary embedding
    and a causal mask the way LlamaModel builds them."""

    def __init__(self, hidden=16, heads=4, kv_heads=2, theta=10000.0):
        super().__init__()
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

        config = LlamaConfig(
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            rope_theta=theta,
            max_position_embeddings=64,
        )
        config._attn_implementation = "eager"
        self.attn = LlamaAttention(config, layer_idx=0)
        self.rotary = LlamaRotaryEmbedding(config)

    def forward(self, x):
        b, t, _ = x.shape
        positions = torch.arange(t)[None].expand(b, t)
        cos, sin = self.rotary(x, positions)
        mask = torch.full((t, t), torch.finfo(x.dtype).min, dtype=x.dtype).triu(1)[None, None]
        out, _ = self.attn(x, position_embeddings=(cos, sin), attention_mask=mask)
        return out
