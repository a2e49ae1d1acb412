"""Known variants of the zoo's references: for each, the mistakes its port most often makes.

golden evaluates these when a port does not match, and names the one it matches with the fix
(`golden_ref.variants` explains how to declare your own).
"""

import math

import torch
import torch.nn.functional as F

from golden_ref.variants import variant

from . import functional as f
from .modules import MLP, TransformerBlock

# --- activations -----------------------------------------------------------------------------


@variant(of=f.gelu, name="gelu(approximate='tanh')",
         fix="use Tensor::gelu_erf: candle's Tensor::gelu is the tanh approximation")
def _gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


@variant(of=f.gelu_tanh, name="gelu (exact erf form)",
         fix="this reference is the tanh approximation: use Tensor::gelu, not gelu_erf")
def _gelu_erf(x):
    return F.gelu(x)


@variant(of=f.silu, name="sigmoid(x)", fix="silu is x·sigmoid(x): the factor x is missing")
def _sigmoid(x):
    return torch.sigmoid(x)


@variant(of=f.silu, name="gelu", fix="the reference is silu (x·sigmoid(x)), not gelu")
def _gelu_for_silu(x):
    return F.gelu(x)


def _softmax_over(dim):
    @variant(of=f.softmax, name=f"softmax(dim={dim})",
             fix=f"the reference normalises over the last dim, not dim {dim}")
    def _(x):
        if dim >= x.dim() - 1:
            raise ValueError("that is the last dim")
        return torch.softmax(x, dim=dim)


for _dim in range(3):
    _softmax_over(_dim)


@variant(of=f.softmax, name="log_softmax", fix="the reference is softmax, not log_softmax")
def _log_softmax(x):
    return torch.log_softmax(x, dim=-1)


# --- norms -----------------------------------------------------------------------------------


def _layer_norm_eps(eps):
    @variant(of=f.layer_norm, name=f"layer_norm(eps={eps:g})",
             fix=f"use the reference's eps (the `eps` const), not {eps:g}")
    def _(x, weight, bias, eps_ref=None, **kwargs):
        return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


for _eps in (1e-3, 1e-6, 1e-12):
    _layer_norm_eps(_eps)


@variant(of=f.layer_norm, name="unbiased variance (N-1)",
         fix="layer norm divides by the biased variance (mean over N), not the unbiased one (N-1)")
def _layer_norm_unbiased(x, weight, bias, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, unbiased=True, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


@variant(of=f.layer_norm, name="eps outside the square root",
         fix="divide by sqrt(var + eps), not sqrt(var) + eps")
def _layer_norm_eps_outside(x, weight, bias, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, unbiased=False, keepdim=True)
    return (x - mean) / (torch.sqrt(var) + eps) * weight + bias


@variant(of=f.rms_norm, name="rms_norm(eps=1e-5)", fix="use the reference's eps (1e-6 here), not 1e-5")
def _rms_norm_eps(x, weight, eps=1e-6):
    return f.rms_norm(x, weight, 1e-5)


@variant(of=f.rms_norm, name="mean subtracted (layer norm)",
         fix="RMS norm does not subtract the mean")
def _rms_norm_centered(x, weight, eps=1e-6):
    return f.rms_norm(x - x.mean(-1, keepdim=True), weight, eps)


@variant(of=f.rms_norm, name="scaled by (1 + weight)",
         fix="this reference multiplies by weight, not (1 + weight) (that is Gemma's convention)")
def _rms_norm_one_plus(x, weight, eps=1e-6):
    return f.rms_norm(x, 1 + weight, eps)


# --- linear maps -----------------------------------------------------------------------------


@variant(of=f.linear, name="no bias", fix="add the bias (candle_nn::Linear::new(w, Some(b)))")
def _linear_no_bias(x, weight, bias):
    return F.linear(x, weight)


@variant(of=f.linear, name="x @ weight (weight not transposed)",
         fix="PyTorch stores weight as [out, in]: compute x @ weight.t()")
def _linear_untransposed(x, weight, bias):
    return x @ weight + bias


@variant(of=f.embedding, name="rows scaled by √d",
         fix="this reference does not scale embeddings by √d_model (some models do; this one does not)")
def _embedding_scaled(ids, weight):
    return F.embedding(ids, weight) * math.sqrt(weight.shape[1])


@variant(of=f.conv1d, name="no bias", fix="add the bias, broadcast over [batch, channel, length]")
def _conv1d_no_bias(x, weight, bias, stride=1, padding=0):
    return F.conv1d(x, weight, None, stride=stride, padding=padding)


@variant(of=f.conv1d, name="kernel flipped (a true convolution)",
         fix="PyTorch's conv1d is a cross-correlation: do not flip the kernel")
def _conv1d_flipped(x, weight, bias, stride=1, padding=0):
    return F.conv1d(x, weight.flip(-1), bias, stride=stride, padding=padding)


@variant(of=f.conv1d, name="padding=0", fix="pad the input by `padding` on both sides")
def _conv1d_unpadded(x, weight, bias, stride=1, padding=0):
    return F.conv1d(x, weight, bias, stride=stride, padding=0)


@variant(of=f.conv1d, name="stride=1", fix="use the `stride` const")
def _conv1d_unstrided(x, weight, bias, stride=1, padding=0):
    return F.conv1d(x, weight, bias, stride=1, padding=padding)


# --- attention and blocks --------------------------------------------------------------------


@variant(of=f.causal_attention, name="scale 1/d instead of 1/√d",
         fix="scale the scores by 1/√head_dim")
def _attention_one_over_d(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / q.shape[-1])


@variant(of=f.causal_attention, name="no causal mask", fix="mask the scores above the diagonal with -inf")
def _attention_unmasked(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=False)


@variant(of=f.causal_attention, name="scores not scaled", fix="scale the scores by 1/√head_dim")
def _attention_unscaled(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0)


@variant(of=MLP, name="gelu(approximate='tanh')",
         fix="use gelu_erf after fc1: candle's Tensor::gelu is the tanh approximation")
def _mlp_gelu_tanh(module, x):
    return module(x, approximate="tanh")


@variant(of=MLP, name="biases dropped", fix="load fc1.bias and fc2.bias (candle_nn::linear, not linear_no_bias)")
def _mlp_no_bias(module, x):
    return F.linear(F.gelu(F.linear(x, module.fc1.weight)), module.fc2.weight)


@variant(of=TransformerBlock, name="post-norm (x = ln(x + f(x)))",
         fix="this block is pre-norm: x + attn(ln1(x)), then x + mlp(ln2(x))")
def _block_post_norm(module, x):
    x = module.ln1(x + module.attn(x))
    return module.ln2(x + module.mlp(x))


@variant(of=TransformerBlock, name="MLP with gelu(approximate='tanh')",
         fix="use gelu_erf in the MLP: candle's Tensor::gelu is the tanh approximation")
def _block_gelu_tanh(module, x):
    x = x + module.attn(module.ln1(x))
    return x + module.mlp(module.ln2(x), approximate="tanh")


@variant(of=TransformerBlock, name="attention without the causal mask",
         fix="mask the attention scores above the diagonal with -inf")
def _block_unmasked(module, x):
    x = x + module.attn(module.ln1(x), causal=False)
    return x + module.mlp(module.ln2(x))
