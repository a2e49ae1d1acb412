//! Llama's MLP: SwiGLU.

use candle_core::{Module, Result, Tensor};
use candle_nn::{linear_no_bias, Linear, VarBuilder};
use golden::golden_layer;

/// `LlamaMLP`: `down(silu(gate(x)) * up(x))`, no biases.
#[derive(Clone, Debug)]
pub struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Mlp {
    /// The MLP, its weights read from `vb` under Hugging Face's names.
    pub fn new(vb: VarBuilder, hidden: usize, intermediate: usize) -> Result<Self> {
        Ok(Mlp {
            gate: linear_no_bias(hidden, intermediate, vb.pp("gate_proj"))?,
            up: linear_no_bias(hidden, intermediate, vb.pp("up_proj"))?,
            down: linear_no_bias(intermediate, hidden, vb.pp("down_proj"))?,
        })
    }
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let gated = (self.gate.forward(x)?.silu()? * self.up.forward(x)?)?;
        self.down.forward(&gated)
    }
}

/// The check: `LlamaMLP(config)`, the config built from `LlamaConfig` with sizes drawn per case
/// (`hidden_size = 4 * k`: LlamaConfig wants an even size per head, here two heads).
#[golden_layer(
    reference = "transformers.models.llama.modeling_llama.LlamaMLP",
    config = "transformers.LlamaConfig"(
        hidden_size = 4 * k,
        intermediate_size = 6 * k,
        num_attention_heads = 2,
        hidden_act = "silu",
    ),
    dims(b = 1..=2, t = 1..=8, k = 1..=8),
    args(x = [b, t, 4 * k]),
    grad,
    overfit,
)]
pub fn llama_mlp(
    vb: VarBuilder,
    x: &Tensor,
    hidden_size: usize,
    intermediate_size: usize,
) -> Result<Tensor> {
    Mlp::new(vb, hidden_size, intermediate_size)?.forward(x)
}
