"""Function-form references of the zoo: plain PyTorch, exactly as a model's Python code calls it."""

import torch
import torch.nn.functional as F


def gelu(x):
    """GELU as PyTorch defines it by default: the exact (erf) form."""
    return F.gelu(x)


def gelu_tanh(x):
    """GELU's tanh approximation (GPT-2, BERT-original)."""
    return F.gelu(x, approximate="tanh")


def silu(x):
    return F.silu(x)


def softmax(x):
    """Softmax over the last dim."""
    return torch.softmax(x, dim=-1)


def layer_norm(x, weight, bias, eps=1e-5):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def rms_norm(x, weight, eps=1e-6):
    """RMSNorm as LLaMA writes it: computed in float32, scaled, then cast back."""
    dtype = x.dtype
    x32 = x.to(torch.float32) if dtype in (torch.float16, torch.bfloat16) else x
    variance = x32.pow(2).mean(-1, keepdim=True)
    return weight * (x32 * torch.rsqrt(variance + eps)).to(dtype)


def linear(x, weight, bias):
    return F.linear(x, weight, bias)


def embedding(ids, weight):
    return F.embedding(ids, weight)


def conv1d(x, weight, bias, stride=1, padding=0):
    return F.conv1d(x, weight, bias, stride=stride, padding=padding)


def causal_attention(q, k, v):
    """Scaled dot-product attention with a causal mask, (batch, heads, seq, head_dim)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
