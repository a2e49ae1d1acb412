"""Hugging Face's Llama decoder layer, built from a small LlamaConfig, as a golden reference: the
tests of traces (`tests/trace.rs`) and of gradient failures (`tests/gradients.rs`) check candle
ports of it as a user porting Llama would.

`DecoderLayer` is `transformers`' own LlamaDecoderLayer (RMSNorm, attention with rotary embeddings
and grouped key/value heads, SwiGLU MLP), run with its rotary embedding and a causal mask the way
LlamaModel builds them. Its trace points are the layer's submodules (`layer.input_layernorm`,
`layer.self_attn.0`, …) and two intermediates no submodule returns, the queries and keys after the
rotary embedding, which it taps itself with `golden_ref.tap` (`q_rot`, `k_rot`): transformers'
code stays as it is, the wrapper only observes `apply_rotary_pos_emb`'s result.
"""

import contextlib

import torch
from torch import nn

from golden_ref import tap


def _config(hidden, heads, kv_heads, intermediate):
    from transformers import LlamaConfig

    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
    )
    config._attn_implementation = "eager"
    return config


@contextlib.contextmanager
def _tapping_rotary():
    """While the block runs, the queries and keys that LlamaAttention rotates are tapped as `q_rot`
    and `k_rot` (`modeling_llama.apply_rotary_pos_emb` is looked up at each call)."""
    from transformers.models.llama import modeling_llama

    original = modeling_llama.apply_rotary_pos_emb

    def tapped(q, k, cos, sin, *args, **kwargs):
        q, k = original(q, k, cos, sin, *args, **kwargs)
        tap("q_rot", q)
        tap("k_rot", k)
        return q, k

    modeling_llama.apply_rotary_pos_emb = tapped
    try:
        yield
    finally:
        modeling_llama.apply_rotary_pos_emb = original


class DecoderLayer(nn.Module):
    """LlamaDecoderLayer with its rotary embedding and a causal mask; returns the hidden states."""

    def __init__(self, hidden=16, heads=4, kv_heads=2, intermediate=32):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

        config = _config(hidden, heads, kv_heads, intermediate)
        self.layer = LlamaDecoderLayer(config, layer_idx=0)
        self.rotary = LlamaRotaryEmbedding(config)

    def forward(self, x):
        b, t, _ = x.shape
        positions = torch.arange(t)[None].expand(b, t)
        cos, sin = self.rotary(x, positions)
        mask = torch.full((t, t), torch.finfo(x.dtype).min, dtype=x.dtype).triu(1)[None, None]
        with _tapping_rotary():
            return self.layer(x, attention_mask=mask, position_embeddings=(cos, sin))
