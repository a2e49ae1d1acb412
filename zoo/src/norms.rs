//! Normalisation layers, written out with differentiable ops (candle's fused `ops::layer_norm` and
//! `ops::rms_norm` have no backward).

use candle_core::{DType, Result, Tensor, D};
use golden::golden_layer;

#[golden_layer(
    grad,
    reference = "zoo_ref.layer_norm",
    dims(b = 1..=4, t = 1..=16, d = 1..=64),
    args(x = [b, t, d], weight = [d] ~ normal(1.0, 0.1), bias = [d] ~ normal(0.0, 0.1)),
    consts(eps = 1e-5),
)]
pub fn layer_norm(x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f64) -> Result<Tensor> {
    let mean = x.mean_keepdim(D::Minus1)?;
    let centered = x.broadcast_sub(&mean)?;
    let var = centered.sqr()?.mean_keepdim(D::Minus1)?;
    let normed = centered.broadcast_div(&(var + eps)?.sqrt()?)?;
    normed.broadcast_mul(weight)?.broadcast_add(bias)
}

/// LLaMA's RMSNorm: computed in f32 for half-precision inputs, like the reference (and in the
/// input's own dtype otherwise: a port that always casts to f32 would lose float64's precision,
/// which the gradient check's finite differences need).
#[golden_layer(
    grad,
    reference = "zoo_ref.rms_norm",
    dims(b = 1..=4, t = 1..=16, d = 1..=64),
    args(x = [b, t, d], weight = [d] ~ normal(1.0, 0.1)),
    consts(eps = 1e-6),
    dtypes = [f32, bf16],
)]
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let dtype = x.dtype();
    let x32 = match dtype {
        DType::F16 | DType::BF16 => x.to_dtype(DType::F32)?,
        _ => x.clone(),
    };
    let inv_rms = (x32.sqr()?.mean_keepdim(D::Minus1)? + eps)?
        .sqrt()?
        .recip()?;
    let normed = x32.broadcast_mul(&inv_rms)?.to_dtype(dtype)?;
    normed.broadcast_mul(weight)
}
