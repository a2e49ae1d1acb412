"""References of golden's example zoo: the PyTorch originals of the Rust ports in `zoo/src/`."""

from .functional import (  # noqa: F401
    causal_attention,
    conv1d,
    embedding,
    gelu,
    gelu_tanh,
    layer_norm,
    linear,
    rms_norm,
    silu,
    softmax,
)
from .logits import capped_logits  # noqa: F401
from .modules import MLP, CausalSelfAttention, ReluMLP, TinyLM, TransformerBlock  # noqa: F401
from . import variants  # noqa: F401  (registers the known variants of these references)
