//! Causal scaled-dot-product attention, written out (candle's fused `ops::sdpa` is Metal-only and
//! has no backward).

use candle_core::{DType, Result, Tensor, D};
use golden::golden_layer;

#[golden_layer(
    grad,
    reference = "zoo_ref.causal_attention",
    dims(b = 1..=2, h = 1..=4, t = 1..=32, d = 1..=64),
    args(q = [b, h, t, d], k = [b, h, t, d], v = [b, h, t, d]),
)]
/// `t` and `d` are dims: each call gets the case's sizes.
pub fn causal_attention(q: &Tensor, k: &Tensor, v: &Tensor, t: usize, d: usize) -> Result<Tensor> {
    let scores = (q.matmul(&k.t()?)? / (d as f64).sqrt())?;
    let mask = Tensor::tril2(t, DType::U8, q.device())?;
    let neg_inf = Tensor::new(f32::NEG_INFINITY, q.device())?
        .to_dtype(scores.dtype())?
        .broadcast_as(scores.shape())?;
    let scores = mask
        .broadcast_as(scores.shape())?
        .where_cond(&scores, &neg_inf)?;
    candle_nn::ops::softmax(&scores, D::Minus1)?.matmul(v)
}
