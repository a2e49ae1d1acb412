//! Rotary position embeddings, as Llama applies them: the two halves of each head rotated.

use candle_core::{Result, Tensor, D};
use golden::golden_layer;

/// `rotate_half`: `[x1, x2] -> [-x2, x1]` over the last axis, split in two halves.
pub fn rotate_half(x: &Tensor) -> Result<Tensor> {
    let half = x.dim(D::Minus1)? / 2;
    let x1 = x.narrow(D::Minus1, 0, half)?;
    let x2 = x.narrow(D::Minus1, half, half)?;
    Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)
}

/// `apply_rotary_pos_emb(q, k, cos, sin)` with any rotation of the last axis: `q·cos +
/// rotate(q)·sin`, cos and sin broadcast over the heads.
pub fn apply_with(
    rotate: fn(&Tensor) -> Result<Tensor>,
    q: &Tensor,
    k: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let (cos, sin) = (cos.unsqueeze(1)?, sin.unsqueeze(1)?);
    let embed =
        |x: &Tensor| -> Result<Tensor> { x.broadcast_mul(&cos)? + rotate(x)?.broadcast_mul(&sin)? };
    Ok((embed(q)?, embed(k)?))
}

/// The check: Hugging Face's `apply_rotary_pos_emb` itself (function form), on a head size of
/// `2 * p`, q with `h` heads and k with `g`.
#[golden_layer(
    reference = "transformers.models.llama.modeling_llama.apply_rotary_pos_emb",
    dims(b = 1..=2, h = 1..=4, g = 1..=2, t = 1..=8, p = 1..=8),
    args(
        q = [b, h, t, 2 * p],
        k = [b, g, t, 2 * p],
        cos = [b, t, 2 * p],
        sin = [b, t, 2 * p],
    ),
    grad,
)]
pub fn apply_rotary_pos_emb(
    q: &Tensor,
    k: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
) -> Result<(Tensor, Tensor)> {
    apply_with(rotate_half, q, k, cos, sin)
}
