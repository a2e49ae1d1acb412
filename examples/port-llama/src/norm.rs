//! Llama's RMS norm.

use candle_core::{DType, Result, Tensor, D};
use candle_nn::VarBuilder;
use golden::golden_layer;

/// `LlamaRMSNorm`: in float32 whatever the input's dtype, then back, times the weight.
#[derive(Clone, Debug)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    /// The norm over the last axis of size `size`, its weight read from `vb`.
    pub fn new(vb: VarBuilder, size: usize, eps: f64) -> Result<Self> {
        Ok(RmsNorm {
            weight: vb.get(size, "weight")?,
            eps,
        })
    }

    /// `weight * x / sqrt(mean(x²) + eps)`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dtype = x.dtype();
        let x = x.to_dtype(DType::F32)?;
        let variance = x.sqr()?.mean_keepdim(D::Minus1)?;
        let normed = x.broadcast_div(&(variance + self.eps)?.sqrt()?)?;
        normed.to_dtype(dtype)?.broadcast_mul(&self.weight)
    }
}

/// The check: `LlamaRMSNorm(hidden_size, eps)` with the hidden size drawn per case.
#[golden_layer(
    reference = "transformers.models.llama.modeling_llama.LlamaRMSNorm",
    dims(b = 1..=2, t = 1..=8, d = 1..=64),
    args(x = [b, t, d]),
    init(hidden_size = d, eps = 1e-6),
    grad,
)]
pub fn rms_norm(vb: VarBuilder, x: &Tensor, hidden_size: usize, eps: f64) -> Result<Tensor> {
    RmsNorm::new(vb, hidden_size, eps)?.forward(x)
}
